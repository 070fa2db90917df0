"""The held-out mistakes of stages 3-6 (quality/mistakes/<stage>.HELD_OUT) stay applicable to the current
solutions. They are measured, not pinned: `python scripts/measure_held_out.py` reports the share rejected and
the share whose message names the cause (README, "The mistake catalog")."""

import importlib

import pytest

from conftest import read, solution_path

STAGES = {"03_blocks": "blocks", "04_transformer": "model", "05_training": "training", "06_decoding": "decoding"}
HELD_OUT = [(stage, mistake) for stage, module in STAGES.items()
            for mistake in importlib.import_module(f"quality.mistakes.{module}").HELD_OUT]


def test_held_out_set_is_sizeable_and_distinct_from_the_catalog():
    from quality.mistakes import catalog

    mistakes, _ = catalog()
    catalogued = {(m.assignment, m.find, m.replace) for m in mistakes}
    assert len(HELD_OUT) >= 30
    assert not [m.description for _, m in HELD_OUT if (m.assignment, m.find, m.replace) in catalogued]


@pytest.mark.parametrize(("stage", "mistake"), HELD_OUT, ids=lambda value: getattr(value, "description", value))
def test_held_out_mistake_applies_to_the_solution(stage, mistake):
    assert mistake.assignment == stage
    mistake.apply(read(solution_path(stage)))  # raises when the text it edits is gone
