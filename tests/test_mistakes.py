"""The mistake catalog with teeth: every cataloged bug fails the grade cell that covers it, with a
message naming the cause; every alternative correct solution passes every grade cell. What a student reads
of each failing cell before opening a hint (the visible part of its ladder) holds no solution code."""

from collections import Counter

import pytest

from conftest import ASSIGNMENTS, graded_part, read, solution_path
from quality.dictation import in_message
from quality.inprocess import run_grade_cells
from quality.mistakes import catalog

MISTAKES, ALTERNATIVES = catalog()


def test_catalog_covers_every_stage():
    per_stage = Counter(mistake.assignment for mistake in MISTAKES)
    assert len(MISTAKES) >= 40 and len(ALTERNATIVES) >= 8, (len(MISTAKES), len(ALTERNATIVES))
    assert set(per_stage) == set(ASSIGNMENTS), per_stage
    assert len({mistake.description for mistake in MISTAKES}) == len(MISTAKES), "duplicate descriptions"


@pytest.mark.slow
@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: f"{m.assignment[:2]}-{m.description}")
def test_mistake_fails_its_cell_and_names_the_cause(mistake):
    path = solution_path(mistake.assignment)
    # only what the grade cells depend on (setup, imports, definitions, exercises): the demos cannot change them
    notebook = graded_part(mistake.apply(read(path)))
    outcomes = run_grade_cells(notebook, path.parent, stop_after=mistake.fails)
    assert mistake.fails in outcomes, f"grade cell {mistake.fails} was not reached"
    outcome = outcomes[mistake.fails]
    assert not outcome.passed, f"{mistake.fails} passes with the bug: {mistake.description}"
    assert mistake.cause.lower() in outcome.message.lower(), (
        f"{mistake.fails} fails but its message does not name the cause ({mistake.cause!r}):\n{outcome.message}")
    assert "likely cause" in outcome.message
    shown = {grade_id: found for grade_id, other in outcomes.items() if not other.passed
             and (found := in_message(mistake.assignment, other.message))}
    assert not shown, f"solution code in the open part of a message (quality.dictation.in_message): {shown}"


@pytest.mark.slow
@pytest.mark.parametrize("alternative", ALTERNATIVES, ids=lambda a: f"{a.assignment[:2]}-{a.description}")
def test_alternative_solution_passes_every_grade_cell(alternative):
    path = solution_path(alternative.assignment)
    notebook = graded_part(alternative.apply(read(path)))
    expected = [c.metadata["nbgrader"]["grade_id"] for c in notebook.cells
                if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
    outcomes = run_grade_cells(notebook, path.parent, stop_after=expected[-1])  # later cells change no grade
    failed = {grade_id: o.message[:300] for grade_id, o in outcomes.items() if not o.passed}
    assert not failed, failed
    assert list(outcomes) == expected
