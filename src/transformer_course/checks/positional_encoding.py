"""Stage 1 checks: the sinusoidal table and PositionalEncoding.forward."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from transformer_course.checks import declared, differential
from transformer_course.checks.boundary import on_student_side
from transformer_course.checks.compare import index_ranges
from transformer_course.checks.framework import (
    RECIPE,
    Diagnosis,
    check,
    crash_explained,
    describe,
    expect_close,
    expect_shape,
    fail,
    generator,
    randn,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.checks.predictions import expect_number, parameters_of
from transformer_course.checks.salt import salted_seed

__all__ = ["buffer_shape", "dropout_behaviour", "forward_adds_encoding", "offset_error_offsets", "offset_error_values",
           "offset_matrix_any_offset", "offset_matrix_moves_every_position", "offset_matrix_shape",
           "predicted_parameter_count", "predicted_self_dot_product", "summary", "table_values"]
from transformer_course.reference import PositionalEncoding as ReferencePositionalEncoding
from transformer_course.reference.positional_encoding import offset_matrix as reference_offset_matrix

# the parts of PyTorch this stage's grade cells meet, used once before any notebook code (runner.warm_up_torch):
# tests/test_grading_speed.py fails when a grade cell imports a module
WARM_UP: tuple[str, ...] = ()


def _table(d_model: int, max_seq_length: int) -> torch.Tensor:
    """The paper's sinusoid table (max_seq_length, d_model) in float64."""
    return _PAPER.table(d_model, max_seq_length)


@on_student_side
def _pe_buffer(module: nn.Module) -> torch.Tensor:
    buffers = dict(module.named_buffers())
    if "pe" not in buffers:
        where = "a parameter" if "pe" in dict(module.named_parameters()) else "missing"
        fail(
            "PositionalEncoding has no buffer named `pe`.",
            expected="`pe` among the module's buffers (named_buffers())",
            got=f"`pe` is {where}" if where != "missing" else "`pe` is not among them (a plain attribute, or missing)",
            cause="the table must be a buffer: a buffer moves with the module to another device and is saved with "
                  "it, but is not trained; keep the given `register_buffer` line.",
        )
    return buffers["pe"]


def _size_mismatch(error: RuntimeError) -> bool:
    """A broadcasting error: two sizes that should agree do not."""
    return "must match" in str(error)


def _build_crash_cause(d_model: int, max_seq_length: int) -> Callable[[RuntimeError], str]:
    """Which size went wrong, told from the sizes the error names."""
    def cause(error: RuntimeError) -> str:
        sizes = {int(number) for number in re.findall(r"\((\d+)\)", str(error))}
        half = d_model // 2
        if max_seq_length != half and {max_seq_length, half} <= sizes:  # a row of positions times the frequencies
            return ("the positions must be a column: torch.arange(max_seq_length).unsqueeze(1) has shape "
                    "(max_seq_length, 1), so times the (d_model / 2,) frequencies it broadcasts to the "
                    "(max_seq_length, d_model / 2) angle table; a flat (max_seq_length,) row cannot.")
        if half in sizes and sizes & {d_model, d_model - 1, half + 1, half - 1}:
            return ("the frequencies have the wrong length: there must be d_model / 2 of them, one per (sin, cos) "
                    "column pair; take the values 2i from torch.arange(0, d_model, 2) (step 2), not "
                    "torch.arange(0, d_model).")
        if max_seq_length in sizes or sizes & {max_seq_length - 1, max_seq_length + 1}:
            return ("the positions have the wrong length or orientation: a column of max_seq_length positions, "
                    "torch.arange(max_seq_length).unsqueeze(1), shape (max_seq_length, 1).")
        return ("one of these sizes differs in the line shown: the positions are a column, "
                "torch.arange(max_seq_length).unsqueeze(1); there are d_model / 2 frequencies, one per (sin, cos) "
                "column pair, from torch.arange(0, d_model, 2); pe is (max_seq_length, d_model).")
    return cause


@on_student_side
def _build(PositionalEncoding: type[nn.Module], d_model: int, max_seq_length: int, dropout: float) -> nn.Module:
    with crash_explained(
        f"building the table crashed on a size mismatch (d_model={d_model}, max_seq_length={max_seq_length}).",
        expected=f"a table pe of shape ({max_seq_length}, {d_model}), whose even columns and whose odd columns are "
                 f"({max_seq_length}, {d_model // 2}) each",
        cause=_build_crash_cause(d_model, max_seq_length),
        when=_size_mismatch,
    ), student_code():
        return PositionalEncoding(d_model, max_seq_length, dropout)


# --- what a wrong table does ------------------------------------------------------------------------
#
# A wrong table is described by what it does, in the terms of the paper's formula. The columns whose
# frequency can be measured at these positions (the angle turns by more than 1.5 radians) are fitted
# as y = A sin(w p + phi) + c, with w searched on a grid of exponents (w = 10000^(-e / d_model)) and
# refined. From them: which function each parity holds (sin, cos, -sin, -cos), by how many positions
# the rows are shifted, the scale A and offset c, and the law of the exponents, e = alpha * 2i + beta
# (the paper: alpha = 1, beta = 0). That formula is rebuilt for every column and must reproduce the
# whole table; then the parameters that differ from the paper's are the diagnosis (alpha = 2: the
# exponent is doubled; a cos in the even columns; rows shifted by one position; ...).


@dataclass(frozen=True)
class _Formula:
    alpha: float  # exponent of pair i = (alpha * 2i + beta) / d_model
    beta: float
    even: str  # "sin", "cos", "-sin" or "-cos"
    odd: str
    shift: int  # row p holds position p + shift
    amplitude: float
    offset: float

    def table(self, d_model: int, max_seq_length: int) -> torch.Tensor:
        position = torch.arange(max_seq_length, dtype=torch.float64).unsqueeze(1) + self.shift
        two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
        angle = position * 10000.0 ** (-(self.alpha * two_i + self.beta) / d_model)
        table = torch.zeros(max_seq_length, d_model, dtype=torch.float64)
        table[:, 0::2], table[:, 1::2] = _FUNCTIONS[self.even](angle), _FUNCTIONS[self.odd](angle)
        return self.amplitude * table + self.offset


_FUNCTIONS = {"sin": torch.sin, "cos": torch.cos, "-sin": lambda a: -torch.sin(a), "-cos": lambda a: -torch.cos(a)}
_PAPER = _Formula(alpha=1.0, beta=0.0, even="sin", odd="cos", shift=0, amplitude=1.0, offset=0.0)
_PHASES = {"sin": 0.0, "cos": math.pi / 2, "-sin": math.pi, "-cos": -math.pi / 2}


def _fit(values: torch.Tensor, omegas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Least squares of each column of values (n, m) by a sin(wp) + b cos(wp) + c for each w of omegas
    (k, m): coefficients (k, m, 3) and largest residuals (k, m)."""
    p = torch.arange(values.size(0), dtype=torch.float64)
    angle = omegas[..., None] * p  # (k, m, n)
    basis = torch.stack([angle.sin(), angle.cos(), torch.ones_like(angle)], dim=-1)  # (k, m, n, 3)
    target = values.T.expand(omegas.size(0), -1, -1).unsqueeze(-1)  # (k, m, n, 1)
    solution = torch.linalg.lstsq(basis, target).solution  # (k, m, 3, 1)
    residual = ((basis @ solution) - target).squeeze(-1).abs().amax(dim=-1)
    return solution.squeeze(-1), residual


def _sinusoids(values: torch.Tensor, d_model: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best frequency, coefficients (a, b, c) and residual of every column of values (n, m) whose frequency
    can be measured here (it turns by more than 1.5 radians); the others get frequency 0."""
    n, columns = values.shape
    exponents = torch.arange(-2 * d_model, 4 * d_model + 0.5, 0.5, dtype=torch.float64)
    grid = 10000.0 ** (-exponents / d_model)
    grid = grid[(grid <= math.pi) & (grid * (n - 1) > 1.0)]  # higher frequencies alias onto these
    omega = torch.zeros(columns, dtype=torch.float64)
    coefficients = torch.zeros(columns, 3, dtype=torch.float64)
    residual = torch.full((columns,), math.inf, dtype=torch.float64)
    if not len(grid):
        return omega, coefficients, residual
    fitted, residuals = _fit(values, grid[:, None].expand(-1, columns))
    best = residuals.argmin(dim=0)  # (m,)
    swing = fitted[best, torch.arange(columns), :2].norm(dim=-1)
    measurable = (swing > 0.1).nonzero().flatten()
    if not len(measurable):
        return omega, coefficients, residual
    chosen = values[:, measurable]
    low = grid[(best[measurable] - 1).clamp(min=0)].log()
    high = grid[(best[measurable] + 1).clamp(max=len(grid) - 1)].log()
    for _ in range(32):  # golden-section search between the neighbours of the best grid point
        first, second = low + 0.382 * (high - low), low + 0.618 * (high - low)
        _, pair = _fit(chosen, torch.stack([first.exp(), second.exp()]))
        keep_low = pair[0] <= pair[1]
        low, high = torch.where(keep_low, low, first), torch.where(keep_low, second, high)
    refined_omega = ((low + high) / 2).exp()
    refined, refined_residual = _fit(chosen, refined_omega[None])
    omega[measurable], coefficients[measurable], residual[measurable] = refined_omega, refined[0], refined_residual[0]
    return omega, coefficients, residual


def _function_and_shift(phase: float, omega: float) -> tuple[str, int] | None:
    for shift in (0, 1, -1, 2, -2, 3, -3):
        for name, target in _PHASES.items():
            if abs(math.remainder(phase - target - shift * omega, 2 * math.pi)) < 2e-3:
                return name, shift
    return None


def _snap(value: float, candidates: list[float]) -> float:
    near = min(candidates, key=lambda candidate: abs(candidate - value))
    return near if abs(near - value) < 0.02 * max(1.0, abs(near)) else value


def _formula(got: torch.Tensor, d_model: int, tolerance: float) -> _Formula | None:
    """The paper's formula with changed parameters that reproduces got (n, d_model), if there is one."""
    n = got.size(0)
    omega, coefficients, residual = _sinusoids(got, d_model)
    swing = coefficients[:, :2].norm(dim=-1)  # the amplitude of each column's oscillation
    trusted = [c for c in range(d_model) if omega[c] * (n - 1) > 1.5 and residual[c] <= tolerance and swing[c] > 0.1]
    if not trusted:
        return None
    described = {}
    for column in trusted:
        a, b, c = coefficients[column].tolist()
        found = _function_and_shift(math.atan2(b, a), omega[column].item())
        if found is None:
            return None
        described[column] = (*found, math.hypot(a, b), c)
    functions = {}
    for parity in (0, 1):
        names = [described[c][0] for c in trusted if c % 2 == parity]
        functions[parity] = max(set(names), key=names.count) if names else ("sin" if parity == 0 else "cos")
    shifts = [described[c][1] for c in trusted]
    shift = max(set(shifts), key=shifts.count)
    amplitude = _snap(sorted(described[c][2] for c in trusted)[len(trusted) // 2], [1.0, 2.0, 0.5])
    offset = _snap(sorted(described[c][3] for c in trusted)[len(trusted) // 2], [0.0])
    pairs = sorted({c // 2 for c in trusted})
    exponents = {pair: -math.log(omega[next(c for c in trusted if c // 2 == pair)].item()) * d_model
                 / math.log(10000.0) for pair in pairs}
    if len(pairs) >= 2:
        x = torch.tensor([2.0 * pair for pair in pairs], dtype=torch.float64)
        y = torch.tensor([exponents[pair] for pair in pairs], dtype=torch.float64)
        design = torch.stack([x, torch.ones_like(x)], dim=-1)
        alpha, beta = torch.linalg.lstsq(design, y[:, None]).solution[:, 0].tolist()
    else:
        alpha, beta = 1.0, exponents[pairs[0]] - 2.0 * pairs[0]
    nice = [k / 4 for k in range(-16, 17)] + [d_model / n, -1.0]
    formula = _Formula(_snap(alpha, nice), _snap(beta, [k / 4 for k in range(-4 * d_model, 4 * d_model + 1)]),
                       functions[0], functions[1], shift, amplitude, offset)
    if tensors_close(formula.table(d_model, n), got, tolerance, tolerance):
        return formula
    return None


def _pace(alpha: float) -> str:
    """What a table whose pair i has the frequency of pair alpha × i looks like, said without the exponent."""
    if alpha == 0:
        return "every column pair oscillates at the frequency of pair 0 (one turn in about 6.3 positions)"
    return (f"column pair 0 is right, and the later pairs oscillate {'more slowly' if alpha > 1 else 'faster'} "
            "than the paper's, by a factor that grows from pair to pair")


def _describe_formula(formula: _Formula, d_model: int, max_seq_length: int) -> Diagnosis:
    findings, causes = [], []
    alpha, beta = formula.alpha, formula.beta
    if abs(alpha - 2) < 1e-9 and beta == 0:
        findings.append(_pace(alpha))
        causes.append("column pair i (columns 2i, 2i+1) has the frequency of pair 2i: the exponent is doubled (4i / "
                      "d_model): `torch.arange(0, d_model, 2)` already gives 2i, so do not multiply it by 2 again.")
    elif abs(alpha - 0.5) < 1e-9 and beta == 0:
        findings.append(_pace(alpha))
        causes.append("column pair i has the frequency of pair i/2: the exponent is i / d_model, half of 2i / "
                      "d_model; it uses i instead of 2i. Divide by 10000^(2i / d_model), where 2i is the even column "
                      "index, as `torch.arange(0, d_model, 2)` gives it.")
    elif alpha < 0 and beta == 0:
        findings.append("the frequencies grow with the column pair instead of shrinking")
        causes.append("the exponent has the other sign: the frequencies are 1 / 10000^(2i / d_model) = "
                      "exp(-2i * ln(10000) / d_model), with the minus sign.")
    elif abs(alpha - d_model / max_seq_length) < 1e-9 and beta == 0 and alpha != 1:
        findings.append(_pace(alpha))
        causes.append(f"column pair i has the frequency of pair {alpha:.3g} × i: the exponents are divided by "
                      "max_seq_length instead of d_model; the exponent is 2i / d_model: divide by d_model, not by "
                      "the table's length.")
    elif alpha != 1 and beta == 0:
        findings.append(_pace(alpha))
        causes.append((f"column pair i has the frequency of pair {alpha:.3g} × i: " if alpha else "")
                      + f"the exponents are {alpha:.3g} × the paper's 2i / d_model, as if the base were "
                      f"10000^{alpha:.3g} {'=' if alpha == 0 else '≈'} {10000 ** alpha:.4g} instead of 10000.")
        if abs(alpha - 1 / math.log(10)) < 1e-3:  # log10 where the natural log belongs
            causes.append("the factor 0.434 is log₁₀ e: a base-10 logarithm where the natural one belongs.")
        elif abs(alpha - math.log(10)) < 1e-3:
            causes.append("the factor 2.30 is ln 10: a natural logarithm where a base-10 one belongs.")
        causes.append("the frequencies are 1 / 10000^(2i / d_model): check the base 10000, the log and the "
                      "division by d_model.")
    elif beta != 0:
        findings.append("the frequency of each column pair is not the one the formula gives it")
        causes.append(f"column pair i has the exponent ({alpha:.3g} * 2i {beta:+.3g}) / d_model instead of 2i / "
                      "d_model; the exponent of pair i is 2i / d_model: `torch.arange(0, d_model, 2)` starts at 0 and "
                      "steps by 2.")
    even_wrong, odd_wrong = formula.even != "sin", formula.odd != "cos"
    if even_wrong and odd_wrong and (formula.even, formula.odd) == ("cos", "sin"):
        findings.append("the even columns hold cos of the angle and the odd columns sin" if formula.shift
                        else "row 0 (position 0) reads 1, 0, 1, 0, ... where 0, 1, 0, 1, ... is expected")
        causes.append("sin and cos are swapped: sin belongs in the even columns 0, 2, 4, ... and cos in the odd "
                      "ones.")
    else:
        if even_wrong:
            findings.append(f"the even columns hold {formula.even} of the angle")
        if odd_wrong:
            findings.append(f"the odd columns hold {formula.odd} of the angle")
        if formula.even == "cos":
            causes.append("cos is in the even columns too: the even columns 0, 2, 4, ... hold sin.")
        if formula.odd == "sin":
            causes.append("sin is in the odd columns too: the odd columns 1, 3, 5, ... must hold cos of the same "
                          "angle.")
        if formula.even.startswith("-") or formula.odd.startswith("-"):
            causes.append("a sign is flipped: the angle (position × frequency) and the functions are positive.")
    if formula.shift:
        findings.append(f"row p holds the values of position p{formula.shift:+d}")
        causes.append(f"positions start at {formula.shift} instead of 0: the first token of a sentence is position "
                      "0, so row 0 of the table holds sin 0 = 0 and cos 0 = 1; torch.arange(max_seq_length)."
                      if formula.shift > 0 else
                      "the positions are shifted: row p is position p, torch.arange(max_seq_length).")
    if formula.amplitude != 1:
        findings.append(f"the values swing between ±{formula.amplitude:.3g} instead of ±1")
        causes.append("sin and cos take values in [-1, 1]: do not scale the table.")
    if formula.offset:
        findings.append(f"every value is shifted by {formula.offset:+.3g}")
        causes.append("add nothing to the sinusoids.")
    return Diagnosis("; ".join(findings) or "the table differs", " ".join(causes))


def diagnose_table(table: torch.Tensor, d_model: int, max_seq_length: int) -> Diagnosis | None:
    """What the student's (max_seq_length, d_model) table does differently from the paper's."""
    got = table.detach().to(torch.float64).cpu().reshape(max_seq_length, d_model)
    expected = _table(d_model, max_seq_length)
    tolerance = 1e-4
    if not torch.isfinite(got).all():
        columns = sorted({int(c) for c in (~torch.isfinite(got)).nonzero()[:, 1]})
        return Diagnosis(f"{_columns_text(columns, d_model)} hold NaN or inf",
                         "a division by zero or the log of a non-positive number in the frequencies.")
    zero_rows = [row for row in range(max_seq_length) if not got[row].any() and expected[row].any()]
    if len(zero_rows) >= 2:
        return Diagnosis(f"rows {index_ranges(zero_rows)} (positions) are 0: nothing was written there",
                         "fill every position 0 .. max_seq_length - 1: the position column is "
                         "torch.arange(max_seq_length).unsqueeze(1), shape (max_seq_length, 1).")
    wrong = [c for c in range(d_model) if not tensors_close(got[:, c], expected[:, c], tolerance, tolerance)]
    if not wrong:
        return None
    still = [pair for pair in range(d_model // 2) if not got[:, 2 * pair].any()
             and bool((got[:, 2 * pair + 1] == 1).all()) and (2 * pair in wrong or 2 * pair + 1 in wrong)]
    if still:
        return Diagnosis(f"column {_pairs_text(still)} do not change with the position (sin = 0, cos = 1): their "
                         "angle is 0 at every position, so their frequency is 0",
                         "the frequencies are 1 / 10000^(2i / d_model) = exp(-2i * ln(10000) / d_model); check "
                         "how yours are computed: a missing log makes exp(-2i * 10000 / d_model) underflow to 0.")
    zero = [c for c in wrong if not got[:, c].any()]
    if zero:
        if zero == list(range(3, d_model, 2)):
            return Diagnosis("only column 1 holds cos; the other odd columns 3, 5, ... are 0",
                             "cos is written to column 1 only: use the slice `pe[:, 1::2]` for every odd column.")
        return Diagnosis(f"{_columns_text(zero, d_model)} {_are(zero, d_model)} 0: nothing was written there",
                         "the sin line fills the even columns, pe[:, 0::2], and the cos line the odd ones, "
                         "pe[:, 1::2]: check the slices.")
    beyond = [c for c in wrong if got[:, c].abs().max() > 1 + tolerance]
    if beyond:
        p = torch.arange(max_seq_length, dtype=torch.float64)
        design = torch.stack([p, torch.ones_like(p)], dim=-1)
        line = torch.linalg.lstsq(design, got[:, beyond]).solution
        straight = ((design @ line) - got[:, beyond]).abs().amax(dim=0) <= tolerance
        if straight.all():
            return Diagnosis(f"{_columns_text(beyond, d_model)} {_verb(beyond, 'grow', d_model)} in a straight "
                             "line with the position: the angle itself, not its sin or cos",
                             "apply sin (even columns) and cos (odd columns) to the angle, position × "
                             "frequency.")
    formula = _formula(got, d_model, tolerance)
    if formula is not None:
        return _describe_formula(formula, d_model, max_seq_length)
    if beyond:
        return Diagnosis(f"{_columns_text(beyond, d_model)} {_verb(beyond, 'hold', d_model)} values beyond ±1, "
                         "which no sin or cos takes",
                         "each column is sin or cos of position × one frequency; nothing multiplies or adds to "
                         "them.")
    return Diagnosis(f"{_columns_text(wrong, d_model)} {_verb(wrong, 'differ', d_model)} in a way that no single "
                     "change of the paper's formula explains",
                     "each column pair i holds sin (even column) and cos (odd column) of position × "
                     "1 / 10000^(2i / d_model); compare your angle table, shape (max_seq_length, d_model / 2), with "
                     "that.")


def _are(columns: list[int], d_model: int) -> str:
    return "is" if len(columns) in (1, d_model) else "are"


def _pairs_text(pairs: list[int]) -> str:
    return ("pair " if len(pairs) == 1 else "pairs ") + index_ranges(pairs)


def _verb(columns: list[int], verb: str, d_model: int = 0) -> str:
    """The verb for _columns_text(columns): singular for one column and for "every column"."""
    return verb + "s" if len(columns) == 1 or len(columns) == d_model else verb


def _columns_text(columns: list[int], d_model: int) -> str:
    if columns == list(range(0, d_model, 2)):
        return "the even columns"
    if columns == list(range(1, d_model, 2)):
        return "the odd columns"
    if columns == list(range(d_model)):
        return "every column"
    return ("column " if len(columns) == 1 else "columns ") + index_ranges(columns)


def _unchanged(got: torch.Tensor, x: torch.Tensor) -> str:
    """forward(x) that returns x itself: nothing was added (the engine sees no departure in such a forward)."""
    if got.shape != x.shape or not tensors_close(got.detach().to(torch.float64), x, 1e-4, 0.0):
        return ""
    return ("forward returns x unchanged: add the positional table, x = x + self.pe[:, :x.size(1)] (an expression "
            "that is not assigned changes nothing)")


def _put_table(module: nn.Module, table: torch.Tensor) -> str | None:
    """Put `table` (1, max_seq_length, d_model) into the module's table buffer, found by its role and shape: `pe`
    when it has that shape, else the only buffer of that shape. Its name (None: no such buffer), so that forward
    is judged on whether its output follows the table, not only on agreeing with it."""
    shaped = [(name, buffer) for name, buffer in module.named_buffers()
              if tuple(buffer.shape) == (1, table.size(1), table.size(2)) and buffer.is_floating_point()]
    found = [(name, buffer) for name, buffer in shaped if name == "pe"] or (shaped if len(shaped) == 1 else [])
    if not found:
        return None
    with torch.no_grad():
        found[0][1].copy_(table)
    return found[0][0]


@on_student_side
def _forward_twice(module: nn.Module, x: torch.Tensor, table: torch.Tensor) -> tuple[Any, Any, str | None]:
    """The student's forward on x, twice, in eval mode and float64, with `table` in its table buffer; the
    buffer's name (None: forward ran on no table of the check's)."""
    module = module.double().eval()
    held = _put_table(module, table)
    max_seq_length, seq_len, d_model = table.size(1), x.size(1), x.size(2)
    with crash_explained(
        f"forward crashed on x of shape {tuple(x.shape)} (batch, seq_len, d_model), "
        f"max_seq_length={max_seq_length}.",
        expected=f"x plus an encoding of shape (1, {seq_len}, {d_model}): one row for each of x's {seq_len} positions, "
                 "the same for every sentence of the batch",
        cause="a wrong slice of pe: pe is (1, max_seq_length, d_model), so its positions lie along axis 1, and x "
              "has as many positions as its own axis 1 says: keep that many rows of pe, self.pe[:, :x.size(1)] "
              "(x.size(0) is the batch, x.size(2) is d_model).",
        when=_size_mismatch,
    ), torch.no_grad(), student_code():
        return module(x.clone()), module(x.clone()), held


@on_student_side
def _train_then_eval(module: nn.Module, x: torch.Tensor, seed: int, table: torch.Tensor
                     ) -> tuple[Any, Any, str | None]:
    """The student's forward on x in train mode (torch seeded with `seed`), then in eval mode, with `table` in its
    table buffer; the buffer's name (None: there is none). Each call gets a copy of x: a forward that adds in place
    (`x += ...`) is judged on its dropout, not on the input the first call left changed."""
    module = module.double()
    held = _put_table(module, table)
    with torch.random.fork_rng(devices=[]), torch.no_grad(), student_code():
        torch.manual_seed(salted_seed(seed))
        module.train()
        trained = module(x.clone())
        module.eval()
        return trained, module(x.clone()), held


def _no_table_buffer(max_seq_length: int, d_model: int) -> None:
    fail("forward could not be given a table: PositionalEncoding holds no buffer of shape "
         f"(1, {max_seq_length}, {d_model}).",
         expected=f"the table in self.pe, a buffer of shape (1, {max_seq_length}, {d_model})",
         got="no such buffer",
         cause="keep the given `self.register_buffer('pe', pe.unsqueeze(0))` line: this check puts its own table "
               "into that buffer and requires forward to add it.")


def _random_table(max_seq_length: int, d_model: int, seed: int) -> torch.Tensor:
    """A table the student's code cannot have computed: forward must follow whatever its buffer holds."""
    return randn(1, max_seq_length, d_model, seed=seed).to(torch.float64)


def _context(d_model: int, max_seq_length: int, seq_len: int | None = None) -> differential.Context:
    sizes = {"position": max_seq_length, "d_model": d_model, "column pair": d_model // 2} if seq_len is None \
        else {"position": seq_len, "d_model": d_model}
    return differential.Context(sizes=sizes, quantities={"d_model": d_model, "max_seq_length": max_seq_length})


@check("PositionalEncoding stores a float32 `pe` buffer of shape (1, max_seq_length, d_model)")
def buffer_shape(PositionalEncoding: type[nn.Module], d_model: int = 16, max_seq_length: int = 50) -> None:
    module = _build(PositionalEncoding, d_model, max_seq_length, 0.0)
    pe = _pe_buffer(module)
    expect_shape(
        "pe",
        pe,
        (1, max_seq_length, d_model),
        cause="build a (max_seq_length, d_model) table and keep the given `.unsqueeze(0)` for the batch axis.",
    )
    if pe.dtype != torch.float32:
        fail("the table `pe` is not float32.",
             expected="dtype torch.float32 (PyTorch's default, the dtype of the model's weights)",
             got=f"dtype {pe.dtype}",
             cause="the table is built in another dtype. Added to float32 embeddings it makes the sum "
                   f"{pe.dtype}, and the next float32 layer (a linear map of attention) then fails: build the "
                   "table in PyTorch's default dtype, or convert it with .float().")


@check("pe holds sin in even columns and cos in odd columns, as in the paper")
def table_values(PositionalEncoding: type[nn.Module], d_model: int = 16, max_seq_length: int = 60) -> None:
    got = _pe_buffer(_build(PositionalEncoding, d_model, max_seq_length, 0.0))
    expected = _table(d_model, max_seq_length).unsqueeze(0)

    def diagnose(table: torch.Tensor) -> Diagnosis | None:
        """What the table does (its formula, fitted to its values) and the line that first computes something
        else than the reference (the two constructors recorded operation by operation)."""
        described = diagnose_table(table, d_model, max_seq_length)
        if described is not None and described.cause:  # the formula fitted to the table says it in the lesson's
            return described  # terms; the engine would name intermediate values the student may not have
        student = differential.traced(PositionalEncoding, d_model, max_seq_length, 0.0)
        reference = differential.traced_call(ReferencePositionalEncoding, d_model, max_seq_length, 0.0)
        engine = differential.explain(student, reference, table, reference.output.pe,
                                      _context(d_model, max_seq_length), ("batch", "position", "column"))
        return differential.combined(described, engine)

    expect_close(
        "pe", got, expected, atol=1e-4, rtol=1e-4, axes=("batch", "position", "column"), diagnose=diagnose,
        cause="check the formula PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same angle).",
    )


@check("forward adds the first seq_len rows of the table to the input (eval mode, so no dropout)")
def forward_adds_encoding(PositionalEncoding: type[nn.Module], d_model: int = 16, max_seq_length: int = 40,
                          seq_len: int = 7) -> None:
    module = _build(PositionalEncoding, d_model, max_seq_length, 0.1)
    x = randn(3 if seq_len != 3 else 4, seq_len, d_model, seed=1)  # a batch never seq_len long: x.size(0) != x.size(1)
    # a random table in the module's buffer: forward must add what the buffer holds (a forward that ignores its
    # table would agree with a table of zeros)
    table = _random_table(max_seq_length, d_model, seed=3)
    got, again, held = _forward_twice(module, x, table)
    if held is None:
        _no_table_buffer(max_seq_length, d_model)
    if isinstance(got, torch.Tensor) and isinstance(again, torch.Tensor) and got.shape == again.shape \
            and not torch.equal(got, again):
        fail(
            "in eval mode two calls of forward gave different outputs.",
            expected="a deterministic output: dropout does nothing in eval mode",
            got="outputs that change from call to call",
            cause="dropout is still active in eval mode: use the module self.dropout (nn.Dropout), which switches "
                  "itself off in eval mode, not F.dropout(..., training=True).",
        )
    reference = ReferencePositionalEncoding(d_model, max_seq_length, 0.1).double().eval()
    with torch.no_grad():
        reference.pe.copy_(table)  # x + the table the student's buffer held
        expected = reference(x)
    declared.values("forward(x)", got, expected, context=_context(d_model, max_seq_length, seq_len),
                    traces=lambda: (differential.traced(module, x, names=("x",)),
                                    differential.traced_call(reference, x, names=("x",))),
                    axes=("batch", "position", "feature"), own=[lambda output: _unchanged(output, x)], atol=1e-4,
                    rtol=1e-4, steps=False,
                    recipe="return x + self.pe[:, :x.size(1)] (the slice keeps only the first seq_len positions); "
                           "this check puts random values into self.pe, so forward must add the table its buffer "
                           "holds.")


def _kept_values(trained: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, p: float, zeros: torch.Tensor) -> str:
    """One element that is neither 0 nor (x + pe) / (1 - p), with what it should be."""
    wrong = (~zeros & ((trained - (x + rows) / (1 - p)).abs() >= 1e-4)).nonzero()[0]
    index = tuple(int(i) for i in wrong)
    return (f"at index {index}: {float(trained[index]):.6g}, where (x + pe) / (1 - p) = "
            f"{float((x + rows)[index] / (1 - p)):.6g}")


def _kept_reading(trained: torch.Tensor, x: torch.Tensor, rows: torch.Tensor, p: float, zeros: torch.Tensor) -> str:
    """What the kept elements are, read from their values: the table dropped out too, dropout applied twice,
    another rescaling; else what was seen, with the recipe."""
    kept = ~zeros
    scale = 1 / (1 - p)

    def every(*forms: torch.Tensor) -> bool:
        return bool(torch.stack([(trained - form).abs() < 1e-4 for form in forms]).any(0)[kept].all())

    if every(x * scale, (x + rows * scale) * scale):
        return ("the table is dropped out as well as the sum: some kept elements hold x / (1 - p) (pe was dropped) "
                "and the others (x + pe / (1 - p)) / (1 - p). Add the table as it is; the only dropout is the "
                "one on the sum.")
    if every((x + rows) * scale * scale):
        return "dropout is applied twice to the sum: every kept element is (x + pe) / (1 - p)². Apply it once."
    ratio = (trained[kept] / (x + rows)[kept])
    if bool(((ratio - ratio.mean()).abs() < 1e-4).all()) and float(ratio.mean()) > 0:
        return (f"every kept element is (x + pe) × {float(ratio.mean()):.4g}, where dropout with p = {p} rescales by "
                f"1 / (1 - p) = {scale:.4g}: is the dropout's p the constructor's `dropout`?")
    return f"{RECIPE} one dropout, on the sum x + pe (the given `return self.dropout(x)`), and none elsewhere."


@check("dropout is applied after the addition in train mode and switched off in eval mode")
def dropout_behaviour(PositionalEncoding: type[nn.Module], d_model: int = 16, max_seq_length: int = 40) -> None:
    p = 0.5
    module = _build(PositionalEncoding, d_model, max_seq_length, p)
    x = randn(4, 10, d_model, seed=2)
    table = _random_table(max_seq_length, d_model, seed=4)  # forward must add what its buffer holds
    rows = table[0, :10]  # dropout on x alone leaves the table's values where x was dropped
    summed = x + rows
    trained, evaluated, held = _train_then_eval(module, x, 0, table)
    if held is None:
        _no_table_buffer(max_seq_length, d_model)
    if not isinstance(trained, torch.Tensor) or trained.shape != x.shape:
        fail("forward returned the wrong thing.", expected=f"shape {tuple(x.shape)}",
             got=getattr(trained, "shape", type(trained).__name__), cause="return a tensor shaped like x.")
    zeros = trained.abs() < 1e-12
    if not zeros.any():  # dropout on x before the addition leaves pe where x was dropped, and no zeros
        before = bool((((trained - rows).abs() < 1e-4) | ((trained - rows - x / (1 - p)).abs() < 1e-4)).all())
        fail("in train mode no element of the output is 0.",
             expected=f"about {p:.0%} of the elements set to 0 (dropout p={p})",
             got="pe where x was dropped, x / (1 - p) + pe elsewhere" if before else "no zeros at all",
             cause="dropout was applied to x before adding pe, so pe is left where x was dropped: apply dropout "
                   "once, after adding pe." if before else
                   "no dropout reaches the output: apply self.dropout to the sum (the given `return self.dropout(x)` "
                   "line does it).")
    kept_ok = ((trained - summed / (1 - p)).abs() < 1e-4) | zeros
    if not kept_ok.all():
        fail("in train mode the kept elements are not (x + pe) / (1 - p).",
             expected="each element either 0 or (x + pe) / (1 - p)", got=_kept_values(trained, x, rows, p, zeros),
             cause=_kept_reading(trained, x, rows, p, zeros))
    expect_close("forward(x) in eval mode", evaluated, summed, atol=1e-4, rtol=1e-4,
                 cause="in eval mode dropout must do nothing: use nn.Dropout (self.dropout), not F.dropout "
                       "with training=True.")


# --- an offset as a matrix ---------------------------------------------------------------------------------
#
# offset_matrix(k, d_model) is judged by what it must do: M @ PE_p = PE_(p+k) for every position p (the paper's
# rows in float64, at any whole position, so that the check needs no table of the student's). A wrong matrix is
# described in the lesson's terms: it moves the other way, by another offset, not at all, mixes column pairs,
# turns some pairs with another frequency; else the first 2x2 block that differs, with its numbers.
# largest_offset_error(table, matrix, k) is judged on tables whose largest error sits at the first or the last
# position p that has a row p + k: a loop or a slice that leaves out either gives another number.

_OFFSET_TOLERANCE = 1e-4  # a float32 matrix is accurate to about 1e-6 here; a wrong one is off by far more


def _rows(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """The paper's PE at whole positions (negative ones included), float64: (len(positions), d_model)."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = positions.to(torch.float64).unsqueeze(1) * 10000.0 ** (-two_i / d_model)  # (positions, d_model / 2)
    rows = torch.zeros(len(positions), d_model, dtype=torch.float64)
    rows[:, 0::2], rows[:, 1::2] = angle.sin(), angle.cos()
    return rows


@on_student_side
def _offset_matrix(offset_matrix: Callable[..., Any], k: int, d_model: int) -> Any:
    """What the student's offset_matrix returns for (k, d_model)."""
    with torch.no_grad(), student_code():
        return offset_matrix(k, d_model)


def _matrix_of(offset_matrix: Callable[..., Any], k: int, d_model: int) -> torch.Tensor:
    """The student's matrix for (k, d_model) in float64, or a failure that says what came instead."""
    got = _offset_matrix(offset_matrix, k, d_model)
    call = f"offset_matrix({k}, {d_model})"
    if not isinstance(got, torch.Tensor):
        fail(f"{call} did not return a tensor.", expected=f"a tensor of shape ({d_model}, {d_model})",
             got=describe(got), cause="return the matrix itself, a (d_model, d_model) tensor of floats.")
    expect_shape(call, got, (d_model, d_model),
                 cause="the matrix acts on a whole row of the table, PE_p, which has d_model entries, and returns "
                       "a row of d_model entries: (d_model, d_model).")
    if not got.is_floating_point():
        fail(f"{call} holds whole numbers.", expected="a floating-point tensor (float64 or float32)",
             got=f"dtype {got.dtype}",
             cause="its entries are sines and cosines: make the matrix a tensor of floats (float64 keeps it "
                   "exact to about 1e-15).")
    return got.detach().to(torch.float64).cpu()


def _block_mask(d_model: int) -> torch.Tensor:
    """True on the 2x2 blocks on the diagonal (rows and columns 2i, 2i+1), (d_model, d_model)."""
    pair = torch.arange(d_model) // 2
    return pair.unsqueeze(1) == pair.unsqueeze(0)


def _turns(matrix: torch.Tensor) -> torch.Tensor | None:
    """The angle each column pair's block turns by, when every block has the form [[c, s], [-s, c]]; else None."""
    c, s = matrix[0::2, 0::2].diagonal(), matrix[0::2, 1::2].diagonal()
    if not (tensors_close(matrix[1::2, 1::2].diagonal(), c, _OFFSET_TOLERANCE, 0.0)
            and tensors_close(matrix[1::2, 0::2].diagonal(), -s, _OFFSET_TOLERANCE, 0.0)
            and tensors_close(c * c + s * s, torch.ones_like(c), 1e-3, 0.0)):
        return None
    return torch.atan2(s, c)


def _same_turn(angles: torch.Tensor, wanted: torch.Tensor) -> bool:
    """Whether two tensors of angles agree up to whole turns."""
    return tensors_close(torch.stack([angles.cos(), angles.sin()]), torch.stack([wanted.cos(), wanted.sin()]),
                         _OFFSET_TOLERANCE, 0.0)


def _read_offset_matrix(matrix: torch.Tensor, k: int, d_model: int) -> Diagnosis | None:
    """What the student's matrix does to the positions, told in the lesson's terms."""
    if not torch.isfinite(matrix).all():
        return Diagnosis("the matrix holds NaN or inf", "a division by zero in the frequencies, or the log of 0.")
    for other in dict.fromkeys((-k, 0, k + 1, k - 1, 2 * k, 1)):
        if other != k and tensors_close(matrix, reference_offset_matrix(other, d_model), _OFFSET_TOLERANCE, 0.0):
            if other == 0:
                return Diagnosis("your matrix is the identity: M @ PE_p = PE_p, the position does not move",
                                 "each column pair must turn by the angle it gains over k positions.")
            if other == -k:
                return Diagnosis(f"your matrix moves every position {abs(k)} {'back' if k > 0 else 'forward'}: "
                                 f"M @ PE_p = PE_(p{-k:+d}), not PE_(p{k:+d})",
                                 "every 2×2 block turns its column pair the wrong way: the two sine entries have "
                                 "each other's sign (the block is transposed). Work out sin(a + b) and cos(a + b) "
                                 "again, with a the pair's angle at p and b the angle that k positions add.")
            return Diagnosis(f"your matrix moves every position by {other}: M @ PE_p = PE_(p{other:+d}), "
                             f"not PE_(p{k:+d})",
                             "the angle of column pair i over k positions is k × its frequency, k / 10000^(2i / "
                             "d_model).")
    outside = matrix.abs() * ~_block_mask(d_model)
    if outside.max() > _OFFSET_TOLERANCE:
        row, column = (int(i) for i in (outside == outside.max()).nonzero()[0])
        return Diagnosis(f"your matrix mixes column pairs: entry ({row}, {column}) is {matrix[row, column]:.4g}, so "
                         f"column {row} (pair {row // 2}) of M @ PE_p takes in column {column} (pair {column // 2})",
                         "each column pair turns at its own frequency, so pair i of PE_(p+k) depends on pair i of "
                         "PE_p alone: outside the 2×2 blocks on the diagonal every entry is 0.")
    angles = _turns(matrix)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    if angles is not None:
        laws = {
            2.0: ("pair i turns as if its exponent were 4i / d_model, twice 2i / d_model: the exponent is doubled; "
                  "2i is the even column index itself, do not double it again."),
            0.5: ("pair i turns as if its exponent were i / d_model, half of 2i / d_model: the exponent of pair i "
                  "is 2i / d_model, with 2i the even column index."),
            -1.0: ("the exponent has the wrong sign: the frequency of pair i is 1 / 10000^(2i / d_model), which "
                   "shrinks as i grows."),
        }
        for factor, cause in laws.items():
            if _same_turn(angles, k * 10000.0 ** (-factor * two_i / d_model)):
                seen = ("the turns grow from pair to pair instead of shrinking" if factor < 0 else
                        f"column pair 0 turns by the right angle, and the later pairs by "
                        f"{'less' if factor > 1 else 'more'} than PE moves them in {k} positions")
                return Diagnosis(seen, cause)
        if k and _same_turn(angles, k * 10000.0 ** (two_i / d_model)):
            return Diagnosis("pair i turns by k × 10000^(2i / d_model): the angle is divided by the frequency "
                             "instead of multiplied", "the angle of pair i over k positions is k × its frequency "
                             "1 / 10000^(2i / d_model).")
    reference = reference_offset_matrix(k, d_model)
    for pair in range(d_model // 2):
        rows = slice(2 * pair, 2 * pair + 2)
        if not tensors_close(matrix[rows, rows], reference[rows, rows], _OFFSET_TOLERANCE, 0.0):
            got = [[round(float(v), 4) for v in row] for row in matrix[rows, rows]]
            wanted = [[round(float(v), 4) for v in row] for row in reference[rows, rows]]
            return Diagnosis(f"the 2×2 block of column pair {pair} (rows and columns {2 * pair}, {2 * pair + 1}) is "
                             f"{got}: it does not move that pair of PE_p to PE_(p{k:+d})",
                             "each block turns its pair by the angle that k positions add (k times the pair's "
                             "frequency): its entries are the cosine and the sine of that angle, with the signs the "
                             "angle-addition formulas give for the sine and the cosine of a sum of two angles; for "
                             f"this pair, M[{2 * pair}:{2 * pair + 2}, {2 * pair}:{2 * pair + 2}] = {wanted}.")
    return None


def _expect_moves(matrix: torch.Tensor, k: int, d_model: int, positions: torch.Tensor) -> None:
    """M @ PE_p == PE_(p+k) for every p of `positions`, or a failure that says how M moves them instead."""
    moved = _rows(positions, d_model) @ matrix.T  # row p holds M @ PE_p
    first, last = int(positions[0]), int(positions[-1])
    expect_close(f"offset_matrix({k}, {d_model}) @ PE_p (row p, for p = {first}..{last})", moved,
                 _rows(positions + k, d_model), atol=_OFFSET_TOLERANCE, rtol=0.0, axes=("position", "column"),
                 diagnose=lambda _: _read_offset_matrix(matrix, k, d_model),
                 cause="M @ PE_p must equal PE_(p+k) for every p: one 2×2 block per column pair, each derived "
                       "from the angle-addition formulas.")


@check("offset_matrix(k, d_model) returns a (d_model, d_model) tensor of floats")
def offset_matrix_shape(offset_matrix: Callable[..., Any], d_model: int = 8, offset: int = 3) -> None:
    _matrix_of(offset_matrix, offset, d_model)


@check("offset_matrix(k, d_model) @ PE_p gives PE_(p+k) at every position p")
def offset_matrix_moves_every_position(offset_matrix: Callable[..., Any], d_model: int = 16, offset: int = 3,
                                       max_seq_length: int = 60) -> None:
    matrix = _matrix_of(offset_matrix, offset, d_model)
    _expect_moves(matrix, offset, d_model, torch.arange(max_seq_length))


@check("offset_matrix works for every whole offset k: 0, negative, and beyond a table's length")
def offset_matrix_any_offset(offset_matrix: Callable[..., Any], d_model: int = 12, max_seq_length: int = 30) -> None:
    for k in (0, -4, max_seq_length + 17):
        matrix = _matrix_of(offset_matrix, k, d_model)
        _expect_moves(matrix, k, d_model, torch.arange(max(0, -k), max_seq_length))


@on_student_side
def _offset_error(largest_offset_error: Callable[..., Any], table: torch.Tensor, matrix: torch.Tensor,
                  k: int) -> Any:
    """What the student's largest_offset_error returns for copies of these inputs (a crash is said with k)."""
    rows = table.size(0)
    first, last = max(0, -k), min(rows, rows - k) - 1
    partners = (f"for k = {k} every position is compared with itself: p and p + k run over the same {rows} rows"
                if k == 0 else
                f"for k = {k} the partner p + k lies before p: the positions p = {first}..{last} have one, the first "
                f"{-k} do not" if k < 0 else
                f"for k = {k} the positions p = {first}..{last} have a partner p + k in the table")
    with crash_explained(f"largest_offset_error(table, M, {k}) crashed on a table of {rows} rows.",
                         expected=f"a number: the largest difference over p = {first}..{last}",
                         cause=f"{partners}; slices written for a positive k alone (counted with -k from the end) "
                               "select other rows, or none, for this k."), torch.no_grad(), student_code():
        return largest_offset_error(table.clone(), matrix.clone(), k)


def _error_case(d_model: int, rows: int, k: int, bumped: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A table (rows, d_model) of entries in [1, 2] and a matrix (d_model, d_model) near -I, not symmetric,
    float64, with row `bumped` of the table far from the others: the largest error then belongs to the one
    position p whose p or p + k is that row. Every difference M @ table[p] - table[p + k] is negative but a few
    at the bumped row, so each wrong variant (a position left out, no absolute value, the matrix from the right,
    a mean) gives a number of its own."""
    table = 1.0 + torch.rand(rows, d_model, generator=generator(seed), dtype=torch.float64)
    table[bumped, 0] += 25.0
    return table, -torch.eye(d_model, dtype=torch.float64) + 0.1 * randn(d_model, d_model, seed=seed + 1)


def _number(got: Any) -> float | None:
    """The student's result as a number (a Python number or a one-element tensor); None for anything else."""
    if isinstance(got, bool):
        return None
    if isinstance(got, int | float):
        return float(got)
    if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.is_complex():
        return float(got.detach().cpu().reshape(()))
    return None


def _errors(table: torch.Tensor, matrix: torch.Tensor, k: int, positions: range,
            moved: Callable[[torch.Tensor], torch.Tensor] | None = None, shift: int | None = None) -> torch.Tensor:
    """|matrix @ table[p] - table[p + shift]| for the positions p, (len(positions), d_model); `moved` replaces the
    product (a reading of a wrong variant), `shift` the offset."""
    rows = table[list(positions)]
    product = moved(rows) if moved is not None else rows @ matrix.T
    return (product - table[[p + (k if shift is None else shift) for p in positions]]).abs()


def _read_offset_error(got: float, table: torch.Tensor, matrix: torch.Tensor, k: int) -> str:
    """The likely cause: what the student's number is, when it is one of the usual wrong variants, and what the
    comparison should be."""
    n = table.size(0)
    first, last = max(0, -k), min(n, n - k) - 1
    every = range(first, last + 1)
    readings: list[tuple[str, str, Callable[[], float]]] = [
        (f"the largest difference without the last position p = {last}",
         f"p = {last} has a row p + k = {last + k} in the table too: it belongs to the comparison.",
         lambda: float(_errors(table, matrix, k, range(first, last)).max())),
        (f"the largest difference without the first position p = {first}",
         f"p = {first} has a row p + k = {first + k} in the table too: it belongs to the comparison.",
         lambda: float(_errors(table, matrix, k, range(first + 1, last + 1)).max())),
        ("the largest difference with each row multiplied by the matrix from the right (table[p] @ M, which is "
         "Mᵀ @ table[p])",
         "the matrix acts on a column vector: M @ PE_p. On rows of a table that is each row times Mᵀ.",
         lambda: float(_errors(table, matrix, k, every, moved=lambda rows: rows @ matrix).max())),
        ("the largest difference between M @ table[p] and table[p − k], the offset the other way",
         "compare M @ table[p] with the row k positions further on, table[p + k].",
         lambda: float(_errors(table, matrix, k, range(max(0, k), min(n, n + k)), shift=-k).max())),
        ("the mean difference, not the largest", "take the largest absolute difference over every entry.",
         lambda: float(_errors(table, matrix, k, every).mean())),
        ("the largest sum of a row's differences", "take the largest single entry, not a sum over a row.",
         lambda: float(_errors(table, matrix, k, every).sum(dim=1).max())),
        ("the largest length (Euclidean norm) of a row's difference",
         "take the largest single entry, not the length of a row's difference.",
         lambda: float(_errors(table, matrix, k, every).norm(dim=1).max())),
        ("the largest signed difference (without the absolute value)",
         "take the absolute value of each difference first: a large negative difference is a large error too.",
         lambda: float((table[list(every)] @ matrix.T - table[[p + k for p in every]]).max())),
    ]
    matching = []
    for seen, cause, value in readings:
        try:
            candidate = value()
        except (IndexError, RuntimeError):  # a variant that does not exist for these sizes
            continue
        if math.isfinite(candidate) and abs(candidate - got) <= 1e-6 * max(1.0, abs(candidate)):
            matching.append(f"{got:.6g} is {seen}: {cause}")
    if len(matching) == 1:  # two variants that give the same number here: neither is named
        return matching[0]
    return f"{RECIPE} the largest |M @ table[p] − table[p + k]| over every entry and every p with 0 <= p < n and " \
        "0 <= p + k < n."


def _expect_offset_error(largest_offset_error: Callable[..., Any], d_model: int, rows: int, k: int, bumped: int,
                         seed: int) -> None:
    table, matrix = _error_case(d_model, rows, k, bumped, seed)
    got = _offset_error(largest_offset_error, table, matrix, k)
    number = _number(got)
    call = f"largest_offset_error(table, M, {k}) on a table of {rows} rows"
    if number is None:
        fail(f"{call} did not return a number.", expected="a float (a one-element tensor works too)",
             got=describe(got), cause="return the one largest difference, as a number.")
    first, last = max(0, -k), min(rows, rows - k) - 1
    errors = _errors(table, matrix, k, range(first, last + 1))
    expected = float(errors.max())
    if abs(number - expected) <= 1e-6 * max(1.0, expected):
        return
    at = first + int(errors.amax(dim=1).argmax())
    fail(f"{call} returned {number:.6g}.",
         expected=f"{expected:.6g}, the largest |M @ table[p] − table[p + k]| over p = {first}..{last}, reached at "
                  f"p = {at}",
         got=f"{number:.6g}", cause=_read_offset_error(number, table, matrix, k))


@check("largest_offset_error compares M @ table[p] with table[p + k] at every p, the first and the last included")
def offset_error_values(largest_offset_error: Callable[..., Any], d_model: int = 6, max_seq_length: int = 10,
                        offset: int = 3) -> None:
    for bumped, seed in ((max_seq_length - 1, 200), (0, 210)):  # the largest error at the last p, then the first
        _expect_offset_error(largest_offset_error, d_model, max_seq_length, offset, bumped, seed)


@check("largest_offset_error works for k = 0 and for a negative k")
def offset_error_offsets(largest_offset_error: Callable[..., Any], d_model: int = 6, max_seq_length: int = 9) -> None:
    for k, bumped, seed in ((0, max_seq_length - 1, 220), (-2, 0, 230), (-2, max_seq_length - 1, 240)):
        _expect_offset_error(largest_offset_error, d_model, max_seq_length, k, bumped, seed)



# --- predict, then run ------------------------------------------------------------------------------


@check("your prediction: PE[pos] · PE[pos] for d_model = 512")
def predicted_self_dot_product(predict: Any) -> None:
    expect_number(predict, truths=lambda: float(_table(512, 40)[17] @ _table(512, 40)[17]), tolerance=0.01,
                  what="PE[pos] · PE[pos] for d_model = 512",
                  cause="group the columns in (sin, cos) pairs of one angle each: what does one pair add to the "
                        "dot product, and how many pairs are there?")


@check("your prediction: the trainable parameters of an embedding of 1,000 × 512 followed by "
       "PositionalEncoding(512, 5000, 0.1)")
def predicted_parameter_count(predict: Any) -> None:
    expect_number(predict, truths=lambda: parameters_of(lambda: nn.Sequential(
        nn.Embedding(1000, 512), ReferencePositionalEncoding(512, 5000, 0.1))),
                  what="the trainable parameters of nn.Sequential(nn.Embedding(1000, 512), "
                       "PositionalEncoding(512, 5000, 0.1))",
                  cause="which tensors does the optimiser find in model.parameters()? A registered buffer and "
                        "dropout are parts of the module too: are they trained?")
