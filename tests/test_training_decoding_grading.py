"""Stages 5 and 6 under grading: no flag on honest work.

The checks of stages 5 and 6 hand the student's code things of the course's own: the reference
`compute_loss` plugged into `train_epoch`, a spying optimiser and scheduler, reference models to decode
with. Each is declared to the grader (`boundary.supplied`), so its running is never taken for the student
running the reference solution. Here the solution notebooks, the blank student notebooks and the correct
alternatives of train_epoch in the mistake catalog are graded as the batch grader grades them
(`run_grade_cells`), and none may carry a finding. Only the cells the grade cells need are kept (imports,
definitions, exercises, grade cells; for an alternative, only the grade cells of the function it
rewrites): the demos and the training run cannot change a grade cell, and leaving them out keeps this
test cheap.
"""

import ast

import pytest

from conftest import graded_part, read, solution_path, student_path
from quality.inprocess import run_grade_cells
from quality.mistakes import decoding, training

pytestmark = pytest.mark.slow
STAGES = ("05_training", "06_decoding")


def exercise_of(alternative) -> str:
    """The function an alternative rewrites: the one defined in the solution cell it edits."""
    cell = next(cell for cell in read(solution_path(alternative.assignment)).cells
                if alternative.find in cell.source and cell.metadata.get("nbgrader", {}).get("solution"))
    return next(node.name for node in ast.parse(cell.source).body if isinstance(node, ast.FunctionDef))


def findings(outcomes):
    return sorted({finding for outcome in outcomes.values() for finding in outcome.findings})


@pytest.mark.parametrize("stage", STAGES)
def test_the_solution_passes_every_grade_cell_without_a_flag(stage):
    path = solution_path(stage)
    outcomes = run_grade_cells(graded_part(read(path)), path.parent)
    assert outcomes and all(outcome.passed for outcome in outcomes.values()), {
        grade_id: outcome.message[:300] for grade_id, outcome in outcomes.items() if not outcome.passed}
    assert findings(outcomes) == []


@pytest.mark.parametrize("stage", STAGES)
def test_a_blank_notebook_fails_without_a_flag(stage):
    path = student_path(stage)
    notebook = graded_part(read(path))
    visible = {cell.metadata["nbgrader"]["grade_id"] for cell in notebook.cells
               if cell.metadata.get("nbgrader", {}).get("grade") and "assert check." in cell.source}
    outcomes = run_grade_cells(notebook, path.parent)
    assert visible and not any(outcomes[grade_id].passed for grade_id in visible)
    assert findings(outcomes) == []


# The alternatives whose code runs something a check supplied that the grader would otherwise take for the
# reference solution: the reference compute_loss that train_epoch calls. (The other alternatives hand nothing
# of this notebook's exercises to the reference; test_mistakes.py grades them all.)
ALTERNATIVES = [alternative for alternative in [*training.ALTERNATIVES, *decoding.ALTERNATIVES]
                if "compute_loss(model, batch, criterion)" in alternative.replace]


@pytest.mark.parametrize("alternative", ALTERNATIVES, ids=lambda a: f"{a.assignment[:2]}-{a.description}")
def test_a_correct_alternative_carries_no_flag(alternative):
    path = solution_path(alternative.assignment)
    notebook = graded_part(alternative.apply(read(path)), exercise_of(alternative))
    outcomes = run_grade_cells(notebook, path.parent)
    assert outcomes and all(outcome.passed for outcome in outcomes.values())
    assert findings(outcomes) == []
