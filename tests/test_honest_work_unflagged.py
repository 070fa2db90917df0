"""A flag is a promise: stages 0 and 7, graded as the grader grades them, flag nothing on honest work.

Their checks hand the course's own parts to the student's code (stage 0 binds the course's `score` into the
student's `AdditiveAttention`; stage 7 plugs its own `start_cache`, `decoder_step` and `select_beams` into the
student's loops and builds the models the student's code runs), and declare them with `boundary.supplied`.
The grader flags the reference solution running inside a student's code; here the solution notebook, the
blank notebook and every correct alternative of the catalog must come out with no finding.

To stay cheap, each notebook keeps only what the grade cells need: its imports and definitions, the exercise
cells and the grade cells (an alternative only those of its own exercise); the demos are left out.
"""


import pytest

from conftest import definitions_only, read, solution_path, student_path
from quality.inprocess import run_grade_cells
from quality.mistakes import catalog, is_solution

pytestmark = pytest.mark.slow
STAGES = ("00_why_attention", "07_fast_and_better_decoding")
_, ALTERNATIVES = catalog()


def _grade_id(cell) -> str | None:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return nbgrader.get("grade_id") if nbgrader.get("grade") and cell.cell_type == "code" else None


def _trimmed(notebook, exercise: str | None = None):
    """The notebook with its definitions, exercise cells and grade cells only; with `exercise` (a solution
    cell's text), only the grade cells that follow that exercise, up to the next one."""
    kept, current = [], None
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        if is_solution(cell):
            current = cell.source
            kept.append(cell)
        elif _grade_id(cell):
            if exercise is None or current == exercise:
                kept.append(cell)
        elif definitions_only(cell.source):
            kept.append(cell)
    notebook.cells = kept
    return notebook


def _cases():
    for stage in STAGES:
        yield pytest.param(stage, None, id=f"{stage[:2]}-solution")
        yield pytest.param(stage, "blank", id=f"{stage[:2]}-blank")
        for alternative in ALTERNATIVES:
            if alternative.assignment == stage:
                yield pytest.param(stage, alternative, id=f"{stage[:2]}-{alternative.description}")


@pytest.mark.parametrize(("stage", "variant"), list(_cases()))
def test_honest_work_gets_no_flag(stage, variant):
    path = student_path(stage) if variant == "blank" else solution_path(stage)
    notebook = read(path)
    exercise = None
    if variant not in (None, "blank"):
        notebook = variant.apply(notebook)
        exercise = next(cell.source for cell in notebook.cells if is_solution(cell) and variant.replace in cell.source)
    outcomes = run_grade_cells(_trimmed(notebook, exercise), path.parent)
    assert outcomes, "no grade cell ran"
    findings = {finding for outcome in outcomes.values() for finding in outcome.findings}
    assert not findings, f"honest work flagged for review: {sorted(findings)}"
    if variant != "blank":
        failed = {grade_id: outcome.message[:300] for grade_id, outcome in outcomes.items() if not outcome.passed}
        assert not failed, failed
