"""Lint of every grade cell, so nbgrader's traps can't bite (bare expressions, missing points...)."""

import ast
import re

import pytest

from conftest import ASSIGNMENTS, ROOT, read, solution_path, student_path
from transformer_course.authoring import (
    HIDDEN_TESTS_LINE,
    KEEP_AND_HAND_IN,
    SETTINGS_TEMPLATE,
    broken_version,
    bug_edits,
)


def grade_cells(notebook):
    """The autograded test cells (written answers, graded by hand, are linted in test_written_answers)."""
    return [cell for cell in notebook.cells if cell.metadata.get("nbgrader", {}).get("grade")
            and not cell.metadata["nbgrader"].get("solution")]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_grade_cell_has_points_and_schema_v3(assignment):
    for cell in grade_cells(read(solution_path(assignment))):
        metadata = cell.metadata["nbgrader"]
        assert metadata["schema_version"] == 3, cell.id
        assert metadata["points"] > 0, f"{cell.id} has no points"
        assert metadata["locked"] and not metadata["solution"], cell.id


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_grade_cell_ends_in_a_bare_expression(assignment):
    """nbgrader scores a final bare value (False gives full marks): every cell ends in a statement."""
    for cell in grade_cells(read(solution_path(assignment))):
        body = ast.parse(cell.source).body
        assert body, f"{cell.id} is empty"
        assert not isinstance(body[-1], ast.Expr), f"{cell.id} ends in a bare expression"
        assert all(isinstance(node, ast.Assert) for node in body), f"{cell.id}: grade cells hold only asserts"


def test_grade_ids_are_unique_across_the_course():
    ids = [cell.metadata["nbgrader"]["grade_id"] for assignment in ASSIGNMENTS
           for cell in grade_cells(read(solution_path(assignment)))]
    duplicates = {grade_id for grade_id in ids if ids.count(grade_id) > 1}
    assert not duplicates


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_nbgrader_ids_are_unique_within_each_notebook(assignment):
    ids = [cell.metadata["nbgrader"]["grade_id"] for cell in read(solution_path(assignment)).cells
           if "nbgrader" in cell.metadata]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_hidden_tests_sit_in_cells_of_their_own_under_a_visible_line(assignment):
    """The region is removed from the student notebook; the line above it stays, so students see that
    hidden tests run at grading (and where)."""
    hidden = 0
    for cell in grade_cells(read(solution_path(assignment))):
        if "### BEGIN HIDDEN TESTS" not in cell.source:
            continue
        hidden += 1
        lines = cell.source.strip().splitlines()
        assert lines[0] == HIDDEN_TESTS_LINE, cell.id
        assert lines[1] == "### BEGIN HIDDEN TESTS" and lines[-1] == "### END HIDDEN TESTS", cell.id
    assert hidden, f"{assignment} has no hidden tests"
    released = [cell.source for cell in grade_cells(read(student_path(assignment))) if HIDDEN_TESTS_LINE in cell.source]
    assert len(released) == hidden and all(source.strip() == HIDDEN_TESTS_LINE for source in released)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebook_has_stubs_not_solutions(assignment):
    student = read(student_path(assignment))
    text = "\n".join(cell.source for cell in student.cells)
    assert "### BEGIN SOLUTION" not in text and "### BEGIN HIDDEN TESTS" not in text
    stubs = [cell for cell in student.cells if cell.metadata.get("nbgrader", {}).get("solution")
             and cell.cell_type == "code"]
    bugs = bug_edits(ROOT, assignment)  # a bug hunt gives the broken code instead of a stub
    assert stubs and all("raise NotImplementedError()" in cell.source for cell in stubs if cell.id not in bugs)
    solutions = {cell.id: cell.source for cell in read(solution_path(assignment)).cells}
    for cell in stubs:
        if cell.id in bugs:
            assert all(replace in cell.source for _, replace in bugs[cell.id]) and cell.source != solutions[cell.id]
            assert broken_version(solutions[cell.id], bugs[cell.id], cell.id) == cell.source


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_notebook_starts_with_badge_and_setup(assignment):
    cells = read(student_path(assignment)).cells
    assert "colab.research.google.com" in cells[0].source and f"notebooks/{assignment}/" in cells[0].source
    setup = cells[1]
    assert setup.metadata["nbgrader"]["locked"] and "pick_device" in setup.source
    assert "find_spec(\"transformer_course\") is None" in setup.source


def stage_table(assignment):
    """The rows of a notebook's "| stage | notebook |" table, as (stage, notebook) cells."""
    header = read(student_path(assignment)).cells[0].source
    rows = re.findall(r"^\| (.+?) \| (.+?) \|$", header, re.MULTILINE)
    return [row for row in rows if row != ("stage", "notebook") and not set(row[0]) <= set("-")]


def unmarked(rows):
    """The rows without the bold and the "(this one)" of the current stage."""
    return [(stage.replace("**", ""), notebook.replace("**", "").removesuffix(" (this one)"))
            for stage, notebook in rows]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_notebook_opens_and_ends_the_same_way(assignment):
    """The header tells the working time, that Run all reaches the end with red ✘ blocks and a summary,
    how to stop at the first failure, and how to keep and hand in the work; the settings cell follows
    the setup cell; the written questions come before the summary; the stage table lists every stage,
    the same in every notebook (0 and 7 optional), this one in bold."""
    cells = read(student_path(assignment)).cells
    words = " ".join(cells[0].source.split())
    assert "**Working time:** about" in words and "scripts/working_time.py" in words
    for phrase in ("a red `✘` block", "*Run all* always reaches the end", "every check with its points",
                   "`STOP_AT_FIRST_FAILURE = True` in the settings cell"):
        assert phrase in words, (assignment, phrase)
    assert KEEP_AND_HAND_IN in cells[0].source
    assert cells[2].cell_type == "code" and cells[2].source == SETTINGS_TEMPLATE
    assert "## Questions: explain your reasoning" in "\n".join(cell.source for cell in cells[-8:])
    assert cells[-1].source.strip() == "check.summary()"
    rows, first = stage_table(assignment), unmarked(stage_table(ASSIGNMENTS[0]))
    assert unmarked(rows) == first, f"{assignment}: the stage table differs from {ASSIGNMENTS[0]}'s"
    assert [stage.split()[0] for stage, _ in first] == [str(int(a[:2])) for a in ASSIGNMENTS]
    assert {stage.split()[0] for stage, _ in first if stage.endswith(" (optional)")} == {"0", "7"}
    bold = [(stage, notebook) for stage, notebook in rows if "**" in stage + notebook]
    assert len(bold) == 1 and bold[0][0].startswith(f"**{int(assignment[:2])}**"), bold
    assert bold[0][1].startswith("**") and bold[0][1].endswith("** (this one)"), bold


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_code_cells_are_short(assignment):
    """House style: cells under ~25 lines (spliced reference classes are the exercise itself)."""
    for cell in read(solution_path(assignment)).cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and not nbgrader.get("solution") and not nbgrader.get("locked"):
            assert len(cell.source.splitlines()) <= 30, f"{assignment} cell {cell.id} is too long"
