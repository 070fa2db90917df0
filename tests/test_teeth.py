"""Tests with teeth, run the way a student runs a notebook: top to bottom ("Run all") in a fresh kernel,
outside grading, with an error in any cell stopping the run (nbclient's allow_errors=False).

- A blank student notebook runs to its last cell: every visible check shows a red ✘ block (the stubs
  are not implemented) and the summary lists every visible check failing with its points.
- A solution notebook runs to its last cell with no ✘ anywhere and a summary of all ✔, but for the predictions,
  which outside grading are noted (○) and scored only when the notebook is graded; no cell's output gives away a
  graded prediction's truth (the cells that reveal the truth for another configuration least of all); notebook 6
  translates with "your" checkpoint, found in the checkpoints folder as notebook 5 leaves it.
- Under grading (in-process, as the mistake catalog grades) a failing check fails its cell: every
  visible grade cell of a blank notebook fails. Real nbgrader's zero for the same notebooks is in
  test_autograde_end_to_end.py.

The long demos (training, BLEU on 1,000 sentences) take their short path (TRANSFORMER_COURSE_SHORT_RUN).
"""

import re
import shutil

import nbformat
import pytest
from test_predictions import predictions

from conftest import (
    ASSIGNMENTS,
    DATA_ASSIGNMENTS,
    ROOT,
    bug_hunt_grade_cells,
    read,
    require_multi30k,
    solution_path,
    student_path,
)
from quality.execution import execute
from quality.inprocess import run_grade_cells
from transformer_course.checks._grade_cells import GRADE_CELLS
from transformer_course.checks.predictions import distinctive, leaked
from transformer_course.reference import checkpoint as checkpoint_io

pytestmark = pytest.mark.slow
SHORT = {"TRANSFORMER_COURSE_SHORT_RUN": "1"}


def describe(outcomes):
    return "\n".join(f"[{o.index}] {o.cell_id}: {o.message[:400]}" for o in outcomes)


def _visible(assignment):
    code = "\n".join(cell.source for cell in read(solution_path(assignment)).cells)
    stage = re.search(r"^from transformer_course\.checks import (\w+) as check$", code, re.MULTILINE).group(1)
    return [(grade_id, points, names) for grade_id, points, names in GRADE_CELLS[f"transformer_course.checks.{stage}"]
            if names]


def visible_cells(assignment):
    """(grade_id, points) of every grade cell without hidden tests, from the table the summary reads."""
    return [(grade_id, points) for grade_id, points, _ in _visible(assignment)]


def prediction_cells(assignment):
    """The grade ids of the visible cells that score a prediction (noted, not judged, outside grading)."""
    return {grade_id for grade_id, _, names in _visible(assignment) if all(name.startswith("predicted_")
                                                                            for name in names)}


def summary_lines(outcomes):
    last = outcomes[-1]
    assert "summary()" in last.source, "the last cell of a notebook is the summary"
    return [line for line in last.displayed.splitlines() if line and line[0] in "✔✘·○"]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_blank_student_notebook_runs_all_and_its_summary_lists_every_check_failing(assignment):
    if assignment in DATA_ASSIGNMENTS:
        require_multi30k()
    outcomes = execute(student_path(assignment), environment=SHORT, allow_errors=False)  # raises at a stop
    grade = {o.cell_id: o for o in outcomes if o.grade}
    visible = visible_cells(assignment)
    assert {grade_id for grade_id, _ in visible} <= set(grade)
    for grade_id, _ in visible:
        shown = grade[grade_id].displayed  # what was observed; the likely cause is the first folded hint
        assert shown.startswith("✘") and "Hint 1: the likely cause" in grade[grade_id].html, (grade_id, shown)
        assert "likely cause" not in shown, (grade_id, shown)
        # a stub says it is not written yet; a bug hunt's broken code fails on its bug, with the check's diagnosis
        assert ("not implemented yet" in shown) != (grade_id in bug_hunt_grade_cells(assignment)), (grade_id, shown)
        assert "✔" not in grade[grade_id].printed or grade_id in bug_hunt_grade_cells(assignment), grade_id
    lines = summary_lines(outcomes)
    assert len(lines) == len(visible) and all(line.startswith("✘") for line in lines), lines
    for line, (_, points) in zip(lines, visible, strict=True):
        assert f"({points:g} point" in line, line
    total = sum(points for _, points in visible)
    assert f"0 of {total:g} points from the visible checks" in outcomes[-1].displayed


@pytest.fixture(scope="module")
def runs_folder(tmp_path_factory):
    """A checkpoints folder holding a model as notebook 5 saves it (the shipped weights stand in)."""
    folder = tmp_path_factory.mktemp("runs")
    shutil.copy(ROOT / "assets" / "checkpoint" / checkpoint_io.PRETRAINED_NAME, folder / checkpoint_io.PRETRAINED_NAME)
    return folder


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_runs_all_with_every_check_green(assignment, runs_folder, tmp_path):
    if assignment in DATA_ASSIGNMENTS:
        require_multi30k()
    path = solution_path(assignment)
    if assignment.startswith("06"):  # the student's choice: translate with the model notebook 5 saved
        notebook = read(path)
        for cell in notebook.cells:
            cell.source = cell.source.replace('MODEL = "shipped"', 'MODEL = "mine"')
        path = tmp_path / path.name
        nbformat.write(notebook, path)
    folder = runs_folder if assignment.startswith("06") else tmp_path / "runs"
    outcomes = execute(path, environment={**SHORT, "TRANSFORMER_COURSE_RUNS": str(folder)})
    failed = [o for o in outcomes if o.failed or "✘" in o.displayed + o.printed]
    assert not failed, "cells fail (or show a ✘) in the solution notebook:\n" + describe(failed)
    alarms = [o.printed for o in outcomes if "⚠" in o.printed]
    assert not alarms, f"the checks' tamper defence warns on the untouched solution: {alarms[:2]}"
    lines = summary_lines(outcomes)
    noted = prediction_cells(assignment)
    assert len(lines) == len(visible_cells(assignment)), lines
    for line, (grade_id, _) in zip(lines, visible_cells(assignment), strict=True):
        assert line.startswith("○" if grade_id in noted else "✔"), (grade_id, line)
    assert "all green" in outcomes[-1].displayed and f"Predictions: {len(noted)} noted" in outcomes[-1].displayed
    for name, graded, _, reveal in predictions(assignment):  # no output gives a graded truth away
        shown = [(o.index, leaked(graded, o.printed + o.displayed)) for o in outcomes
                 if o.index == reveal or distinctive(graded)]
        assert not [found for found in shown if found[1]], f"{name}: the truth shown in cells {shown}"
    if assignment.startswith("05"):  # the run saved its training state and its model where notebook 6 looks
        assert {p.name for p in (tmp_path / "runs").iterdir()} >= {"training_state.pt", checkpoint_io.PRETRAINED_NAME}
    if assignment.startswith("06"):
        printed = "".join(o.printed for o in outcomes)
        assert "translating with your checkpoint from notebook 5" in printed
        assert "BLEU of your model, measured now" in printed
        assert "BLEU of the course checkpoint, stored in it: 37.71" in printed


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_under_grading_every_visible_check_of_a_blank_notebook_fails_its_cell(assignment):
    if assignment in DATA_ASSIGNMENTS:
        require_multi30k()
    outcomes = run_grade_cells(read(student_path(assignment)), student_path(assignment).parent)
    for grade_id, _ in visible_cells(assignment):
        outcome = outcomes[grade_id]
        assert not outcome.passed, (grade_id, outcome)
        assert ("not implemented yet" in outcome.message) != (grade_id in bug_hunt_grade_cells(assignment)), outcome
