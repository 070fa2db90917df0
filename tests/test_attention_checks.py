"""Stage 2's checks on their own: the readings that say what wrong attention, masks and heads do (each case a
formula, not a cataloged notebook edit), the look-ahead mask's device test on honest and on wrong code, and
one notebook graded as the grader does, whose own attention and split_heads are wrong but whose forward is
right: forward's checks pass (one defect, one charge) and nothing is flagged for review."""

import math

import numpy as np
import pytest
import torch

from conftest import read, solution_path
from quality.inprocess import run_grade_cells
from quality.mistakes import Edit
from quality.mistakes import attention as catalog
from transformer_course.checks import attention
from transformer_course.checks.framework import run_check

GENERATOR = torch.Generator().manual_seed(7)
Q, K, V = (torch.randn(2, 3, 4, 5, generator=GENERATOR, dtype=torch.float64) * 1.5,
           torch.randn(2, 3, 6, 5, generator=GENERATOR, dtype=torch.float64) * 1.5,
           torch.randn(2, 3, 6, 7, generator=GENERATOR, dtype=torch.float64))
MASK = torch.rand(2, 1, 4, 6, generator=GENERATOR) > 0.4
MASK[..., 0] = True
SCORES = Q @ K.transpose(-2, -1)  # not yet divided by √d_k


@pytest.mark.parametrize(("divisor", "says"), [
    (1.0, "not divided by √d_k"), (5.0, "divided by d_k = 5"), (2.0, "divided by √q_len = 2"),
    (1 / math.sqrt(5), "multiplied by √d_k"),
])
def test_the_divisor_of_the_scores_is_read_from_the_weights(divisor, says):
    diagnosis = attention.diagnose_weights(Q, K, V, None, torch.softmax(SCORES / divisor, dim=-1))
    assert diagnosis is not None and says in diagnosis.cause, diagnosis


def test_other_scores_a_wrong_axis_and_rows_that_do_not_sum_to_1_are_named():
    right = SCORES / math.sqrt(5)
    other = torch.softmax(right + torch.randn(right.shape, generator=GENERATOR, dtype=torch.float64), dim=-1)
    assert "not Q K^T / √d_k, nor a multiple" in attention.diagnose_weights(Q, K, V, None, other).where
    assert "over the head axis" in attention.diagnose_weights(Q, K, V, None, torch.softmax(right, dim=1)).where
    rows = attention.diagnose_weights(Q, K, V, None, torch.softmax(right, dim=-1) * 1.0001)
    assert "every row sums to 1.0001" in rows.where


def _masked(scores, fill):
    return torch.softmax(scores.masked_fill(MASK == 0, fill), dim=-1)


@pytest.mark.parametrize(("weights_of", "says"), [
    (lambda s: torch.softmax(s.masked_fill(MASK != 0, -1e9), dim=-1), "the mask is inverted"),
    (lambda s: torch.softmax(s, dim=-1).masked_fill(MASK == 0, 0.0), "applied after the softmax"),
    (lambda s: _masked(s, 0.0), "hidden scores are set to 0"),
    (lambda s: _masked(s, -3.0), "set to -3, which is not negative enough"),
    (lambda s: torch.softmax(s, dim=-1), "the mask is not applied"),
])
def test_what_a_mask_hides_is_read_from_the_weights(weights_of, says):
    scores = SCORES / math.sqrt(5)
    diagnosis = attention.diagnose_weights(Q, K, V, MASK, weights_of(scores), torch.softmax(scores, dim=-1))
    assert diagnosis is not None and says in diagnosis.cause, diagnosis


def test_where_each_value_of_the_heads_comes_from():
    x = torch.randn(2, 5, 12, generator=GENERATOR, dtype=torch.float64)
    heads = torch.randn(2, 3, 5, 4, generator=GENERATOR, dtype=torch.float64)
    assert "tokens are mixed" in attention._read_split(x.reshape(2, 3, 5, 4), x, 3).where
    assert "every num_heads-th feature" in attention._read_split(x.view(2, 5, 4, 3).permute(0, 3, 1, 2), x, 3).cause
    assert "positions are mixed" in attention._read_combine(heads.reshape(2, 5, 12), heads).where
    assert "interleaved" in attention._read_combine(heads.permute(0, 2, 3, 1).reshape(2, 5, 12), heads).where


def test_what_a_wrong_mask_hides_is_told_in_the_lessons_words():
    tokens = torch.tensor([[0, 4, 5, 1, 1], [0, 7, 1, 1, 1]])
    read_padding = attention._read_padding
    assert "uses 0 instead of pad_idx" in read_padding((tokens != 0)[:, None, None], tokens, 1).cause
    assert "inverted" in read_padding((tokens == 1)[:, None, None], tokens, 1).cause
    ones = torch.ones(5, 5, dtype=torch.bool)
    for mask, says in ((ones.tril(-1), "the diagonal is hidden"), (ones.triu(1), "the mask is inverted"),
                       (ones.triu(), "the mask is transposed"), (ones, "True everywhere")):
        diagnosis = attention._read_triangle(mask, 5)
        assert diagnosis is not None and says in diagnosis.where + diagnosis.cause, (says, diagnosis)


def on_device(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).tril().unsqueeze(0).unsqueeze(0)


def moved_there(size, device=None):
    return torch.ones(size, size).tril().bool().to(device).view(1, 1, size, size)


def from_numpy(size, device=None):
    return torch.from_numpy(np.tril(np.ones((size, size), dtype=bool))).to(device)[None, None]


def filled_in_a_loop(size, device=None):
    mask = torch.zeros(1, 1, size, size, dtype=torch.int32, device=device)
    for row in range(size):
        mask[0, 0, row, : row + 1] = 1
    return mask


def on_the_cpu(size, device=None):
    return torch.ones(size, size, dtype=torch.bool).tril().view(1, 1, size, size)


@pytest.mark.parametrize("honest", [on_device, moved_there, from_numpy, filled_in_a_loop])
def test_a_look_ahead_mask_made_on_the_device_asked_for_passes(honest):
    check = attention.look_ahead_mask_values
    result = run_check(check.__wrapped__, check.check_title, (honest,), {"size": 7})
    assert result.passed, result.message


def test_a_look_ahead_mask_made_on_the_cpu_whatever_the_device_fails():
    check = attention.look_ahead_mask_values
    result = run_check(check.__wrapped__, check.check_title, (on_the_cpu,), {"size": 7})
    assert not result.passed and "not made on the device it is asked for" in result.message, result.message


WRONG_PARTS = [  # the renaming first: the other two edit text inside the renamed region
    Edit(catalog.STAGE, "renamed", catalog._RENAMED_FROM, catalog._RENAMED_FROM.replace("self.W_q", "self.query")
         .replace("self.W_k", "self.key").replace("self.W_v", "self.value").replace("self.W_o", "self.out")),
    Edit(catalog.STAGE, "unscaled", catalog._SCORES, "scores = Q @ K.transpose(-2, -1)"),
    Edit(catalog.STAGE, "split without transpose", catalog._SPLIT_VIEW + "\n        " + catalog._SPLIT_RETURN,
         "return x.view(batch_size, self.num_heads, seq_length, self.d_k)"),
]
KEPT = {"attn_sdpa_values", "attn_split_heads_values", "attn_mha_values", "attn_mha_attention_weights",
        "attn_mha_cross_attention", "attn_mha_matches_pytorch_causal", "attn_mha_hidden"}


@pytest.mark.slow
def test_forward_is_graded_once_with_the_reference_parts_and_nothing_is_flagged():
    """The notebook's setup and exercise cells with wrong attention and split_heads and renamed layers, and a
    few grade cells: the two wrong parts fail their own cells, forward's cells pass with the reference's parts
    plugged in (found by role: the layers have other names), and the grader flags nothing."""
    notebook = read(solution_path("02_attention"))
    for edit in WRONG_PARTS:
        notebook = edit.apply(notebook)
    notebook.cells = [cell for cell in notebook.cells if cell.cell_type == "code" and (
        cell.metadata.get("nbgrader", {}).get("grade_id") in KEPT | {"setup"} or cell.source.startswith("import")
        or cell.metadata.get("nbgrader", {}).get("solution"))]
    outcomes = run_grade_cells(notebook, solution_path("02_attention").parent)
    assert set(outcomes) == KEPT
    failing = {grade_id for grade_id, outcome in outcomes.items() if not outcome.passed}
    assert failing == {"attn_sdpa_values", "attn_split_heads_values"}, {g: outcomes[g].message for g in failing}
    assert "not divided by √d_k" in outcomes["attn_sdpa_values"].message
    assert all(not outcome.findings for outcome in outcomes.values()), outcomes["attn_mha_values"].findings
