"""Stages 3 and 4 under the real grader, beyond the mistake catalog: honest work gets every point and no flag,
one requirement is charged once, and a wrong target mask is read by its structure."""

import pytest
import torch

from conftest import read, solution_path
from quality.inprocess import run_grade_cells
from quality.mistakes import model as model_mistakes
from transformer_course.checks import model as check
from transformer_course.checks.framework import run_check


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["03_blocks", "04_transformer"])
def test_solution_gets_every_point_and_no_flag_under_grading(stage):
    """The checks plug reference parts (attention and feed-forward into the blocks, the reference Encoder and
    Decoder into the Transformer) and declare them: their running is never counted as the student's."""
    path = solution_path(stage)
    outcomes = run_grade_cells(read(path), path.parent)
    assert outcomes and all(outcome.passed for outcome in outcomes.values()), {
        grade_id: outcome.message[:300] for grade_id, outcome in outcomes.items() if not outcome.passed}
    assert all(outcome.findings == () for outcome in outcomes.values()), next(iter(outcomes.values())).findings


PARTS_THE_PAPER_HAS_NOT = [mistake for mistake in model_mistakes.MISTAKES
                           if mistake.description in ("Encoder adds a LayerNorm after its last block",
                                                      "Encoder adds a learned position table instead of the "
                                                      "sinusoidal encoding")]


@pytest.mark.slow
@pytest.mark.parametrize("mistake", PARTS_THE_PAPER_HAS_NOT, ids=lambda mistake: mistake.description)
def test_an_extra_part_costs_the_values_check_not_the_registration_check(mistake):
    path = solution_path("04_transformer")
    outcomes = run_grade_cells(mistake.apply(read(path)), path.parent, stop_after="model_encoder_layers")
    assert not outcomes["model_encoder_values"].passed
    assert outcomes["model_encoder_layers"].passed, outcomes["model_encoder_layers"].message


def make_padding_mask(tgt: torch.Tensor, pad: int) -> torch.Tensor:
    """The padding rule written here, as a student would: the checks refuse the course's own helper."""
    return (tgt != pad)[:, None, None, :]  # (batch, 1, 1, tgt_len)


def make_look_ahead_mask(size: int) -> torch.Tensor:
    """The look-ahead rule written here (1, 1, size, size), for the same reason."""
    return torch.ones(size, size, dtype=torch.bool).tril()[None, None]


MASKS = {
    "this is the padding mask alone": lambda tgt, pad: make_padding_mask(tgt, pad),
    "this is the look-ahead mask alone": lambda tgt, pad: make_look_ahead_mask(tgt.size(1)).expand(
        tgt.size(0), 1, -1, -1),
    "combined with `|`": lambda tgt, pad: make_padding_mask(tgt, pad) | make_look_ahead_mask(tgt.size(1)),
    "the mask is inverted": lambda tgt, pad: ~(make_padding_mask(tgt, pad) & make_look_ahead_mask(tgt.size(1))),
    "the diagonal is hidden": lambda tgt, pad: make_padding_mask(tgt, pad) & torch.ones(
        tgt.size(1), tgt.size(1), dtype=torch.bool).tril(-1),
    "the triangle is the upper one": lambda tgt, pad: make_padding_mask(tgt, pad) & make_look_ahead_mask(
        tgt.size(1)).transpose(-2, -1),
    "padding hides query rows": lambda tgt, pad: make_padding_mask(tgt, pad).transpose(-2, -1)
    & make_look_ahead_mask(tgt.size(1)),
    "token id 0, not pad_idx=1": lambda tgt, pad: make_padding_mask(tgt, 0) & make_look_ahead_mask(tgt.size(1)),
}


@pytest.mark.parametrize("cause", list(MASKS))
def test_a_wrong_target_mask_is_read_by_its_structure(cause):
    result = run_check(check.target_mask_values.__wrapped__, "target mask", (MASKS[cause],),
                       {"batch": 3, "tgt_len": 6, "pad_idx": 1})
    assert not result.passed and cause in result.message, result.message
