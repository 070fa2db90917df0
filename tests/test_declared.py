"""Declared checks of a module exercise (`checks.declared.ModuleCase`) and the engine's honesty about them.

The module is an RMSNorm written here, with the realistic wrong versions a course author met when adding it
(issue 41): it is not a graded exercise, only a small module to hold the engine to what it saw. Each wrong
version is one omission; the three grade cells an author would write (the values with the gain set to 1, the
gain against the student's own output, eps on a vector of zeros) charge it once, and no message claims what the
edit did not do (above all: a final step left out is not "computed, but nothing uses the result")."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks import declared
from transformer_course.checks.framework import ATTENTION, Builtins, CheckFailed, randn, student_code

BUILTINS = Builtins.of(F.rms_norm, nn.RMSNorm, work="RMS normalisation")
AXES = ("batch", "position", "feature")
RECIPE = "each vector divided by the square root of (the mean of its squares + eps), then times the gain."


class RMSNorm(nn.Module):
    """The reference: x / sqrt(mean(x²) + eps) * gain, over the last axis. x: (..., d_model)."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x / rms * self.gain


class Einsum(RMSNorm):  # right, written otherwise
    def forward(self, x):
        rms = torch.rsqrt(torch.einsum("bpd,bpd->bp", x, x)[..., None] / x.shape[-1] + self.eps)
        return self.gain * (x * rms)


class NoGain(RMSNorm):  # the last step left out: the division is returned
    def forward(self, x):
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x / rms


class GainAdded(RMSNorm):
    def forward(self, x):
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x / rms + self.gain


class NoSquareRoot(RMSNorm):
    def forward(self, x):
        mean_square = x.pow(2).mean(dim=-1, keepdim=True) + self.eps
        return x / mean_square * self.gain


class NoEps(RMSNorm):
    def forward(self, x):
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True))
        return x / rms * self.gain


class Centred(RMSNorm):  # LayerNorm's centring kept
    def forward(self, x):
        x = x - x.mean(dim=-1, keepdim=True)
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x / rms * self.gain


class SumNotMean(RMSNorm):
    def forward(self, x):
        rms = torch.sqrt(x.pow(2).sum(dim=-1, keepdim=True) + self.eps)
        return x / rms * self.gain


class WrongAxis(RMSNorm):
    def forward(self, x):
        rms = torch.sqrt(x.pow(2).mean(dim=1, keepdim=True) + self.eps)
        return x / rms * self.gain


class Delegates(RMSNorm):
    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.gain, self.eps)


class DelegatesModule(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d_model, eps=eps)

    def forward(self, x):
        return self.norm(x)


def _case(student: type[nn.Module], seed: int, **parameters: float) -> declared.ModuleCase:
    x = randn(2, 3, 8, seed=seed)  # (batch, position, feature)
    size = 1.5 + randn(2, 3, 1, seed=seed + 1).tanh()  # each vector's root mean square, 0.5 to 2.5: eps invisible
    x = x / x.pow(2).mean(dim=-1, keepdim=True).sqrt() * size
    return declared.ModuleCase(student, RMSNorm, 8, inputs={"x": x}, seed=seed, axes=AXES, builtins=BUILTINS,
                               parameters=parameters, sizes={"batch": 2, "position": 3, "feature": 8})


def values(student):  # the gain set to 1 on both sides: a gain left out is the next cell's
    _case(student, 400, gain=1.0).values(recipe=RECIPE)


def gain(student):
    _case(student, 410).scales_with("gain", recipe=RECIPE)


def epsilon(student):
    case = _case(student, 420)
    x = case.inputs["x"].clone()
    x[:, 0] = 0.0  # the first position of each sentence: a vector of zeros
    case.finite({"x": x}, inputs_words="a vector of zeros", recipe="eps keeps the divisor above 0.")


def full(student):  # all parameters random: what a single values cell would say
    _case(student, 430).values(recipe=RECIPE)


CELLS = (values, gain, epsilon)


def _failures(student, cells=CELLS) -> dict[str, str]:
    found = {}
    for cell in cells:
        try:
            cell(student)
        except CheckFailed as failure:
            found[cell.__name__] = str(failure)
    return found


# which cell each omission costs: one each
CHARGED = {Einsum: set(), RMSNorm: set(), NoGain: {"gain"}, NoEps: {"epsilon"}, NoSquareRoot: {"values"},
           Centred: {"values"}, SumNotMean: {"values"}, WrongAxis: {"values"}}


@pytest.mark.parametrize("student", list(CHARGED), ids=lambda student: student.__name__)
def test_one_omission_costs_one_cell(student):
    assert set(_failures(student)) == CHARGED[student]


@pytest.mark.parametrize("student", [NoGain, GainAdded, NoSquareRoot, NoEps, Centred, SumNotMean, WrongAxis],
                         ids=lambda student: student.__name__)
def test_no_mistake_is_read_as_an_unused_value(student):
    """None of these edits leaves a computed value unused, so no message may say one is."""
    for message in _failures(student, (*CELLS, full)).values():
        assert "nothing uses the result" not in message, message
        assert "is never used" not in message, message


def test_a_missing_last_step_is_read_as_missing():
    message = _failures(NoGain, (full,))["full"]
    assert "a step is missing at the end" in message and "returns the division" in message, message
    assert "product with `gain`" in message, message


def test_a_gain_that_does_not_reach_the_output_is_said_as_seen():
    message = _failures(NoGain)["gain"]
    assert "your output is the same whatever `gain` holds" in message, message
    assert "the reference values" not in message, message  # the expected line says what the student's own outputs say
    assert "your own output with `gain` set to 1" in message, message


def test_a_gain_added_is_read_as_added():
    assert "`gain` is added to it, not multiplied" in _failures(GainAdded)["gain"]


def test_eps_left_out_names_the_division_and_its_zero_divisor():
    message = _failures(NoEps)["epsilon"]
    assert "inf or nan for a vector of zeros" in message and "the division" in message, message


def test_scale_invariance_is_checked_against_the_students_own_output():
    def scaled(student):
        _case(student, 440).unchanged(lambda x: 3 * x, change_words="every vector scaled by 3", recipe=RECIPE)

    scaled(RMSNorm)
    message = _failures(NoSquareRoot, (scaled,))["scaled"]
    assert "every vector scaled by 3 must not change it" in message, message


@pytest.mark.parametrize(("student", "named"), [(Delegates, "torch.nn.functional.rms_norm"),
                                                (DelegatesModule, "torch.nn.RMSNorm")])
def test_delegating_to_a_declared_builtin_is_told_and_names_it(student, named):
    failures = _failures(student)
    assert set(failures) == {"values", "gain", "epsilon"}
    for message in failures.values():
        assert named.rsplit(".", 1)[1] in message and "RMS normalisation" in message, message
        assert "attention" not in message, message


def test_any_builtin_can_be_declared():
    layer_norm = Builtins.of(F.layer_norm, nn.LayerNorm, work="layer normalisation")
    assert layer_norm.functions == ("torch.nn.functional.layer_norm",)
    assert layer_norm.modules == ("torch.nn.LayerNorm",)
    with pytest.raises(CheckFailed, match=r"torch\.nn\.functional\.layer_norm"), student_code(layer_norm):
        F.layer_norm(torch.randn(2, 4), (4,))
    with student_code(layer_norm):  # what another exercise declares is not this one's
        F.scaled_dot_product_attention(torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4))


def test_attention_guard_keeps_its_words():
    with pytest.raises(CheckFailed, match="built-in attention"), student_code():
        F.scaled_dot_product_attention(torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.randn(1, 2, 4))
    assert "torch.nn.MultiheadAttention" in ATTENTION.modules


class RenamedGain(RMSNorm):  # right, the gain under another name
    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


class LearnedTable(nn.Module):
    """A learned positional table: x (batch, seq_len, d_model) plus the table's first seq_len rows."""

    def __init__(self, max_seq_length: int, d_model: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.zeros(max_seq_length, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.size(1)]  # (batch, seq_len, d_model)


class EmbeddingTable(nn.Module):  # right, the table held by an nn.Embedding (`positions.weight`)
    def __init__(self, max_seq_length: int, d_model: int) -> None:
        super().__init__()
        self.positions = nn.Embedding(max_seq_length, d_model)

    def forward(self, x):
        return x + self.positions(torch.arange(x.size(1)))


class TransposedTable(LearnedTable):  # the table stored (d_model, max_seq_length)
    def __init__(self, max_seq_length: int, d_model: int) -> None:
        nn.Module.__init__(self)
        self.table = nn.Parameter(torch.zeros(d_model, max_seq_length))

    def forward(self, x):
        return x + self.table[:, : x.size(1)].T


class TwoGains(RMSNorm):  # two vectors of one shape under other names: which is the gain cannot be told by shape
    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        nn.Module.__init__(self)
        self.weight, self.spare = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.ones(d_model))
        self.eps = eps


def _table_case(student: type[nn.Module]) -> declared.ModuleCase:
    return declared.ModuleCase(student, LearnedTable, 6, 4, inputs={"x": randn(2, 3, 4, seed=450)}, seed=450,
                               axes=AXES, builtins=Builtins(work="a learned positional table"),
                               sizes={"batch": 2, "position": 3, "feature": 4})


@pytest.mark.parametrize("student", [RenamedGain], ids=lambda student: student.__name__)
def test_a_parameter_under_another_name_is_found_by_its_shape(student):
    assert _failures(student) == {}


def test_an_embedding_layout_gets_the_reference_parameter_table():
    """nn.Embedding (`positions.weight`) against nn.Parameter (`table`): one entry of each shape, copied across."""
    _table_case(EmbeddingTable).values(recipe="x plus the table's first seq_len rows.")


def test_a_layout_that_matches_neither_by_name_nor_by_shape_is_told_with_both_sides():
    message = _failures(TwoGains)["values"]
    assert "by name or else by shape" in message, message
    assert "`gain` (8,)" in message and "`weight` (8,)" in message and "`spare` (8,)" in message, message


def test_a_transposed_table_is_told_its_shape():
    with pytest.raises(CheckFailed, match=r"another shape(.|\n)*expected: \(6, 4\)(.|\n)*got: +\(4, 6\)"):
        _table_case(TransposedTable).values(recipe="x plus the table's first seq_len rows.")
