from __future__ import annotations

import csv
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


EXAMPLE_ASSIGNMENT = "02_attention"


@pytest.fixture(scope="session")
def graded_example_class(tmp_path_factory):
    """The built-in example class (`grading.examples`: correct, blank, buggy, stripped, cell-deleted,
    broken, looping and hostile students) of stage 2, graded once by the batch command for every test
    module that reads it (test_batch, test_class_report, test_written_answers): a few minutes here.

    Returns (grader, students, scores.csv rows by student, the submissions' original bytes)."""
    from transformer_course.grading.batch import BatchGrader
    from transformer_course.grading.examples import write_example_class
    from transformer_course.grading.isolation import bubblewrap_problem

    base = tmp_path_factory.mktemp("example-class")
    submissions, class_dir = base / "downloads", base / "class"
    write_example_class(ROOT, submissions, EXAMPLE_ASSIGNMENT, class_dir, submissions)
    originals = {path: path.read_bytes() for path in submissions.rglob("*.ipynb")}
    grader = BatchGrader(ROOT, class_dir, submissions, jobs=2, timeout=30, assignment_ids=[EXAMPLE_ASSIGNMENT],
                         sandbox=bubblewrap_problem() is None)
    os.environ["GRADER_SECRET_TOKEN"] = "do-not-leak"  # the grader's environment must not reach a notebook
    try:
        students = grader.run()
    finally:
        del os.environ["GRADER_SECRET_TOKEN"]
    with open(class_dir / "scores.csv", encoding="utf-8") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    return grader, students, rows, originals
