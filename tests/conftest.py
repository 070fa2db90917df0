from __future__ import annotations

import ast
import csv
import functools
import os
from pathlib import Path

# One torch (OpenMP) thread per process. The suite runs on two pytest-xdist workers, each running notebooks,
# kernels and graders of its own: with PyTorch's default of one thread per core, more threads than cores spin
# against each other, and a notebook that runs in 12 s alone took 107 s (tests/test_teeth.py, stage 6).
# Set before anything imports torch; every kernel and grader the tests start inherits it.
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import nbformat  # noqa: E402
import pytest  # noqa: E402

from transformer_course.authoring import assignments  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = assignments(ROOT)

# A local copy of Multi30k next to the checkout (the six .gz files) lets executed notebooks and
# The class's secret the batch grader draws hidden inputs from: one per test process, never ~/.config's.
os.environ.setdefault("TRANSFORMER_COURSE_SECRET_FILE",
                      str(Path(__import__("tempfile").gettempdir()) / f"transformer-course-test-{os.getpid()}.key"))
# nbgrader's kernels, which inherit this environment, run offline.
MULTI30K_COPY = ROOT.parent / "shared" / "data" / "multi30k"
if MULTI30K_COPY.is_dir():
    os.environ.setdefault("MULTI30K_DIR", str(MULTI30K_COPY))


# Without that copy, tests that read Multi30k download it (into the user cache); with no network either,
# they skip with one line saying how to get the data, except in CI, where missing data is a failure.
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
DATA_ASSIGNMENTS = frozenset({"00_why_attention", "05_training", "06_decoding", "07_fast_and_better_decoding"})


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
                "beside the checkout or set MULTI30K_DIR (website/authors/data.md)")


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


@functools.cache
def bug_hunt_names(assignment: str) -> frozenset[str]:
    """What the bug hunts of a stage define (exercises given broken, `#| bug:` in the lesson) whose given code is
    whole. A bug hunt that also leaves a step to the student (a stub in its cell) fails on the stub first, as an
    exercise does."""
    from transformer_course.authoring import bug_edits

    bugs = bug_edits(ROOT, assignment)
    notebook = nbformat.read(student_path(assignment), as_version=4)
    return frozenset(node.name for cell in notebook.cells
                     if cell.get("id") in bugs and "raise NotImplementedError" not in cell.source
                     for node in ast.parse(cell.source).body if isinstance(node, ast.FunctionDef | ast.ClassDef))


@functools.cache
def bug_hunt_grade_cells(assignment: str) -> frozenset[str]:
    """The visible grade cells of the bug hunts: those whose checks are called on a name a bug-hunt cell defines.
    On the blank notebook they fail on the bug, not on a stub."""
    notebook = nbformat.read(student_path(assignment), as_version=4)
    return frozenset(cell.metadata["nbgrader"]["grade_id"] for cell in notebook.cells
                     if cell.metadata.get("nbgrader", {}).get("grade") and cell.cell_type == "code"
                     and any(f"({name}" in cell.source for name in bug_hunt_names(assignment)))


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
    from quality.examples import write_example_class
    from transformer_course.grading.classroom.batch import BatchGrader
    from transformer_course.grading.sandbox.isolation import bubblewrap_problem

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
    with open(class_dir / "scores.csv", encoding="utf-8-sig") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    return grader, students, rows, originals


# --- the part of a notebook its grade cells depend on ---------------------------------------------------


def definitions_only(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return bool(tree.body) and all(isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)
                                   for node in tree.body)


def graded_part(notebook: nbformat.NotebookNode, exercise: str | None = None) -> nbformat.NotebookNode:
    """The notebook without the cells no grade cell depends on: the setup and settings cells, imports,
    definitions, exercise cells and grade cells stay, in order (with `exercise`, only its grade cells)."""
    kept, code_cells = [], 0
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        code_cells += 1
        nbgrader = cell.metadata.get("nbgrader", {})
        if nbgrader.get("grade"):
            if exercise is None or f"({exercise}" in cell.source:
                kept.append(cell)
        elif code_cells <= 2 or nbgrader.get("solution") or definitions_only(cell.source):
            kept.append(cell)
    notebook.cells = kept
    return notebook
