from __future__ import annotations

import functools
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


# Without that copy, tests that read Multi30k download it (into the user cache); with no network either,
# they skip with one line saying how to get the data, except in CI, where missing data is a failure.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
DATA_ASSIGNMENTS = frozenset({"05_training", "06_decoding"})  # the notebooks that read Multi30k


@functools.cache
def multi30k_problem() -> str | None:
    """None when all six Multi30k files are here or can be downloaded, else the first line of why not."""
    from transformer_course.data import multi30k

    try:
        for split in multi30k.SPLITS:
            for language in multi30k.LANGUAGES:
                multi30k.file_path(split, language, timeout=15)
    except multi30k.DataUnavailable as error:
        return str(error).splitlines()[0][:200]
    return None


def require_multi30k() -> None:
    problem = multi30k_problem()
    if problem is None:
        return
    if IN_CI:
        pytest.fail(f"Multi30k is missing in CI: {problem}")
    pytest.skip("needs Multi30k, offline and not here: put its six .gz files in ../shared/data/multi30k "
                "beside the checkout or set MULTI30K_DIR (README, Data)")


@pytest.fixture
def multi30k() -> None:
    """Use in tests that read Multi30k (see require_multi30k)."""
    require_multi30k()


@pytest.fixture
def multi30k_folder() -> Path:
    """A folder holding the six Multi30k files: the copy beside the checkout, or the download cache."""
    require_multi30k()
    from transformer_course.data import multi30k

    return Path(os.environ.get(multi30k.ENVIRONMENT_VARIABLE) or multi30k.cache_directory())


def solution_path(assignment: str) -> Path:
    return ROOT / "solutions" / assignment / f"{assignment}.ipynb"


def student_path(assignment: str) -> Path:
    return ROOT / "notebooks" / assignment / f"{assignment}.ipynb"


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
