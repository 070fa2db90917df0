from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from transformer_course.authoring import assignments

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = assignments(ROOT)


def solution_path(assignment: str) -> Path:
    return ROOT / "solutions" / assignment / f"{assignment}.ipynb"


def student_path(assignment: str) -> Path:
    return ROOT / "notebooks" / assignment / f"{assignment}.ipynb"


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
