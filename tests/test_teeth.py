"""Tests with teeth: the solutions pass every grade cell, the blank student notebooks fail every
visible one, and in both every other cell runs (a student sees only graded cells fail)."""

import pytest

from conftest import ASSIGNMENTS, solution_path, student_path
from transformer_course.grading.execution import execute

pytestmark = pytest.mark.slow


def describe(outcomes):
    return "\n".join(f"[{o.index}] {o.cell_id}: {o.message[:400]}" for o in outcomes)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_passes_every_grade_cell(assignment):
    outcomes = execute(solution_path(assignment), environment={"NBGRADER_EXECUTION": "autograde"})
    failed = [o for o in outcomes if o.failed]
    assert not failed, "cells failed in the solution notebook:\n" + describe(failed)
    alarms = [o.printed for o in outcomes if "⚠" in o.printed]
    assert not alarms, f"the checks' tamper defence warns on the untouched solution: {alarms[:2]}"
    assert sum(o.grade for o in outcomes) >= 4


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_blank_student_notebook_fails_every_visible_grade_cell_and_nothing_else(assignment):
    outcomes = execute(student_path(assignment))
    visible = [o for o in outcomes if o.grade and o.source.strip()]
    passing = [o for o in visible if not o.failed]
    assert not passing, "grade cells pass on a blank notebook (tests without teeth):\n" + describe(passing)
    broken = [o for o in outcomes if not o.grade and o.failed]
    assert not broken, "non-grade cells fail in the blank student notebook:\n" + describe(broken)
    for outcome in visible:
        assert "not implemented yet" in outcome.message, outcome.message
