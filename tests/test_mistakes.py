"""The mistake catalog with teeth: every cataloged bug fails the grade cell that covers it, with a
message naming the cause; every alternative correct solution passes every grade cell. What a student reads
of each failing cell before opening a hint (the visible part of its ladder) holds no solution code.

The notebooks are run once for these tests and test_hidden_teeth's (the same xdist group, so the same
process): each grade cell's visible calls run there one per cell, and a grade cell says what its first failing
call says (`judge` stops at it), so the message read here is the one the whole grade cell shows."""

from collections import Counter

import pytest
from test_hidden_teeth import alternative_verdicts, mistake_verdicts

from conftest import ASSIGNMENTS
from quality.dictation import in_message
from quality.mistakes import Edit, catalog

pytestmark = pytest.mark.xdist_group("boundary")
MISTAKES, ALTERNATIVES = catalog()


def test_catalog_covers_every_stage():
    per_stage = Counter(mistake.assignment for mistake in MISTAKES)
    assert len(MISTAKES) >= 40 and len(ALTERNATIVES) >= 8, (len(MISTAKES), len(ALTERNATIVES))
    assert set(per_stage) == set(ASSIGNMENTS), per_stage
    assert len({mistake.description for mistake in MISTAKES}) == len(MISTAKES), "duplicate descriptions"


@pytest.mark.slow
@pytest.mark.parametrize("number,mistake", list(enumerate(MISTAKES)),
                         ids=lambda item: f"{item.assignment[:2]}-{item.description}" if isinstance(item, Edit) else "")
def test_mistake_fails_its_cell_and_names_the_cause(number, mistake, tmp_path_factory):
    found = mistake_verdicts(number, tmp_path_factory)
    assert mistake.fails in found.visible, f"grade cell {mistake.fails} was not reached"
    assert any(found.visible[mistake.fails].values()), f"{mistake.fails} passes with the bug: {mistake.description}"
    message = found.messages[mistake.fails]
    assert mistake.cause.lower() in message.lower(), (
        f"{mistake.fails} fails but its message does not name the cause ({mistake.cause!r}):\n{message}")
    assert "likely cause" in message
    shown = {grade_id: text for grade_id, other in found.messages.items()
             if (text := in_message(mistake.assignment, other))}
    assert not shown, f"solution code in the open part of a message (quality.dictation.in_message): {shown}"


@pytest.mark.slow
@pytest.mark.parametrize("number,alternative", list(enumerate(ALTERNATIVES)),
                         ids=lambda item: f"{item.assignment[:2]}-{item.description}" if isinstance(item, Edit) else "")
def test_alternative_solution_passes_every_grade_cell(number, alternative, tmp_path_factory):
    found = alternative_verdicts(number, tmp_path_factory)
    failed = {cell: found.messages.get(cell, "")[:300] for cell in found.failed_properties()}
    assert not failed, failed
