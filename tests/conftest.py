from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from transformer_course.authoring import assignments

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = assignments(ROOT)

# A local copy of Multi30k next to the checkout (the six .gz files) lets executed notebooks and
# nbgrader's kernels, which inherit this environment, run offline.
MULTI30K_COPY = ROOT.parent / "shared" / "data" / "multi30k"
if MULTI30K_COPY.is_dir():
    os.environ.setdefault("MULTI30K_DIR", str(MULTI30K_COPY))


def solution_path(assignment: str) -> Path:
    return ROOT / "solutions" / assignment / f"{assignment}.ipynb"


def student_path(assignment: str) -> Path:
    return ROOT / "notebooks" / assignment / f"{assignment}.ipynb"


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
