"""Readings derived from values: what a wrong shape is, which operand of a crash does not fit and what would,
and a crash inside a part a check plugged in (said as such, never blamed on the student's own line)."""

import pytest
import torch
from torch import nn

from conftest import graded_part, read, solution_path
from quality.inprocess import run_grade_cells
from quality.mistakes import Edit
from transformer_course.checks import attention
from transformer_course.checks.compare import describe_shape


@pytest.mark.parametrize(("got", "expected", "words"), [
    ((2, 4, 3, 6), (2, 3, 4, 6), "axes 1 and 2 hold each other's sizes"),
    ((1, 2, 3, 4, 5), (2, 2, 3, 4, 5), "axis 0 holds 1 of the expected 2"),
    ((4, 2, 3), (2, 2, 3), "axis 0 is 2 times the expected 2"),
    ((2, 1, 3), (2, 3), "an extra axis of size 1 at position 1"),
    ((2, 3), (2, 1, 3), "the axis of size 1 at position 1 is missing"),
    ((2, 12), (2, 3, 4), "axes 1 and 2 of the expected shape are merged into one of 12"),
    ((2, 3, 4), (2, 12), "axis 1 of the expected shape is split in two (3 × 4)"),
    ((3, 4, 5), (2, 3, 4, 5), "the leading axis (of 2) is missing"),
    ((2, 3, 4, 5), (3, 4, 5), "an extra leading axis (of 2)"),
])
def test_a_wrong_shape_is_named_by_how_it_relates_to_the_expected_one(got, expected, words):
    assert words in describe_shape(got, expected)


def test_shapes_without_a_simple_relation_get_no_words():
    assert describe_shape((2, 3), (2, 3)) == ""
    assert describe_shape((7, 5, 2), (2, 3)) == ""


def _sdpa(Q, K, V, mask=None):
    weights = torch.softmax(Q @ K.transpose(-2, -1) / Q.size(-1) ** 0.5, dim=-1)
    return weights @ V, weights


class _Heads(nn.Module):
    """A MultiHeadAttention that hands the plugged-in combine_heads a tensor with one axis too many."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.d_model, self.num_heads, self.d_k = d_model, num_heads, d_model // num_heads
        self.W_q, self.W_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_v, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.attn_weights = None

    def split_heads(self, x):
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.d_k).transpose(1, 2)

    def combine_heads(self, x):
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).contiguous().view(batch, length, self.d_model)

    def forward(self, q, k, v, mask=None):
        Q, K, V = self.split_heads(self.W_q(q)), self.split_heads(self.W_k(k)), self.split_heads(self.W_v(v))
        heads, weights = _sdpa(Q, K, V, mask)
        self.attn_weights = weights
        return self.W_o(self.combine_heads(heads.unsqueeze(1)))


def test_a_crash_inside_a_plugged_in_part_says_so_and_blames_the_line_that_called_it(capsys):
    attention.mha_output_shape(_Heads)  # in a notebook a check prints its failure and lets the notebook go on
    text = capsys.readouterr().out
    assert "the check raised ValueError" in text and "your code raised" not in text
    assert "inside the course's own `combine_heads`" in text
    assert "self.combine_heads(heads.unsqueeze(1))" in text  # the student's line that handed it the value
    assert "(2, 1, 4, 5, 4)" in text  # what it was handed


def test_a_crash_in_the_students_own_code_is_still_theirs(capsys):
    class Own(_Heads):
        def forward(self, q, k, v, mask=None):
            batch, length, _, _ = q.shape  # three axes unpacked into four names
            return q

    attention.mha_output_shape(Own)
    text = capsys.readouterr().out
    assert "your code raised ValueError" in text and "plugged" not in text and "course's own" not in text


@pytest.mark.slow
def test_one_omission_costs_one_requirement_a_missing_scheduler_step():
    """Leaving out scheduler.step() fails the scheduler's cell (and its hidden twin), not the end-to-end
    learning cell as well: that one trains at a constant rate, where an unstepped scheduler changes nothing."""
    path = solution_path("05_training")
    notebook = Edit("05_training", "no scheduler step", "        if scheduler is not None:\n"
                    "            scheduler.step()\n", "").apply(read(path))
    outcomes = run_grade_cells(graded_part(notebook), path.parent, stop_after="train_epoch_hidden")
    failed = {grade_id for grade_id, outcome in outcomes.items() if not outcome.passed}
    assert failed == {"train_epoch_scheduler", "train_epoch_hidden"}, failed
