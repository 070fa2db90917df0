"""Real nbgrader, end to end, through the instructors' batch command: generate, submit every stage
(solutions, blank notebooks, one known bug per stage), autograde, feedback. Full marks, zero and
partial credit; no hidden source in feedback."""

import html as html_module
import re

import nbformat
import pytest

from conftest import ASSIGNMENTS, DATA_ASSIGNMENTS, IN_CI, ROOT, multi30k_problem, read, require_multi30k, solution_path
from quality.examples import KNOWN_BUGS, student_submissions
from transformer_course.grading.classroom.batch import BatchGrader
from transformer_course.grading.outputs.answers import score_rows
from transformer_course.grading.sandbox.isolation import bubblewrap_problem

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("end_to_end")]  # one worker: shared fixtures
# Stages 5 and 6 read Multi30k: without it (offline, outside CI) they are not graded and their tests skip.
GRADED = [assignment for assignment in ASSIGNMENTS
          if assignment not in DATA_ASSIGNMENTS or IN_CI or multi30k_problem() is None]


@pytest.fixture(autouse=True)
def data_for_the_stage(request):
    assignment = getattr(request.node, "callspec", None) and request.node.callspec.params.get("assignment")
    if assignment in DATA_ASSIGNMENTS:
        require_multi30k()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("end-to-end")
    for student, notebooks in student_submissions(ROOT, GRADED).items():
        (base / "downloads" / student).mkdir(parents=True)
        for assignment, notebook in notebooks.items():
            nbformat.write(notebook, base / "downloads" / student / f"{assignment}.ipynb")
    # three students at once on two cores: the wall time is the CPU time shared out
    grader = BatchGrader(ROOT, base / "class", base / "downloads", jobs=3, sandbox=bubblewrap_problem() is None)
    students = grader.run()
    assert {name: result.status for name, result in students.items()} == dict.fromkeys(("ada", "blake", "chen"),
                                                                                       "graded")
    classroom = grader.classroom
    # scores with the written answers apart: they wait for a person (test_written_answers grades them)
    return classroom, {(row["student"], row["assignment"]): row for row in score_rows(classroom.db_url)}


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_reference_solution_gets_full_marks_and_every_cell_runs(graded, assignment):
    classroom, rows = graded
    row = rows["ada", assignment]
    assert row["autograded_max"] > 0 and row["autograded"] == row["autograded_max"], row
    autograded = nbformat.read(
        classroom.folder / "autograded" / "ada" / assignment / f"{assignment}.ipynb", as_version=4)
    errors = [f"{cell.get('id')}: {output.ename}: {output.evalue[:200]}" for cell in autograded.cells
              for output in cell.get("outputs", []) if output.output_type == "error"]
    assert not errors, "cells fail when nbgrader runs the reference solution in a class folder:\n" + "\n".join(errors)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_blank_notebook_gets_zero(graded, assignment):
    """Under nbgrader a failing check still fails its cell (outside grading it only shows a red block)."""
    classroom, rows = graded
    assert rows["blake", assignment]["total"] == 0, rows["blake", assignment]
    autograded = nbformat.read(
        classroom.folder / "autograded" / "blake" / assignment / f"{assignment}.ipynb", as_version=4)
    visible = [cell for cell in autograded.cells if cell.metadata.get("nbgrader", {}).get("grade")
               and "check." in cell.source and "BEGIN HIDDEN TESTS" not in cell.source]
    assert visible and all(any(output.output_type == "error" for output in cell.get("outputs", []))
                           for cell in visible), "a failing check did not fail its cell under nbgrader"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_one_bug_gets_partial_credit_and_a_hint_naming_it(graded, assignment):
    classroom, rows = graded
    row = rows["chen", assignment]
    assert 0 < row["autograded"] < row["autograded_max"], row
    autograded = nbformat.read(
        classroom.folder / "autograded" / "chen" / assignment / f"{assignment}.ipynb", as_version=4)
    errors = [output.evalue for cell in autograded.cells for output in cell.get("outputs", [])
              if output.output_type == "error"]
    visible = [error for error in errors if "(hidden test)" not in error]
    hidden = [error for error in errors if "(hidden test)" in error]
    # a visible check says what was expected, what came out and the likely cause; a hidden one keeps its
    # inputs to itself and sends the student to the visible checks first
    assert visible and all("likely cause" in error for error in visible), visible
    assert all("Fix what the visible checks of these properties say first" in error for error in hidden), hidden
    assert KNOWN_BUGS[assignment].description


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_feedback_shows_no_hidden_test_source(graded, assignment):
    classroom, _ = graded
    hidden_lines = [line.strip() for cell in read(solution_path(assignment)).cells
                    for line in re.findall(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", cell.source, re.S)
                    for line in line.splitlines() if line.strip()]
    assert hidden_lines
    for student in ("ada", "blake", "chen"):
        html = (classroom.folder / "feedback" / student / assignment / f"{assignment}.html").read_text()
        text = html_module.unescape(re.sub(r"<[^>]+>", "", html))
        for line in hidden_lines:
            assert line not in text, f"hidden test source leaked into {student}'s feedback: {line}"


def test_scores_csv_has_a_row_per_submission(graded):
    classroom, rows = graded
    lines = classroom.write_csv().read_text(encoding="utf-8-sig").strip().splitlines()
    assert len(lines) == 1 + len(rows) == 1 + 3 * len(GRADED)
    assert lines[0].startswith("student,assignment,") and lines[0].endswith(",total,max")
