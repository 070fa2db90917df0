"""Stage 1 checks: the sinusoidal table and PositionalEncoding.forward."""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from transformer_course.checks.framework import (
    check,
    crash_explained,
    expect_close,
    expect_shape,
    fail,
    protect,
    randn,
    student_code,
    summary,
    tensors_close,
)

__all__ = ["buffer_shape", "dropout_behaviour", "forward_adds_encoding", "summary", "table_values"]
from transformer_course.reference import PositionalEncoding as ReferencePositionalEncoding


def _table(d_model: int, max_seq_length: int, *, swap: bool = False, exponent_scale: float = 2.0,
           use_index_i: bool = False, cos_first_odd_only: bool = False, start: int = 0,
           cos_everywhere: bool = False, sin_everywhere: bool = False) -> torch.Tensor:
    """The sinusoid table (max_seq_length, d_model) in float64, optionally with a known mistake."""
    position = torch.arange(start, start + max_seq_length, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(d_model // 2, dtype=torch.float64)  # (d_model / 2,)
    exponent = (i if use_index_i else exponent_scale * i) / d_model
    angle = position / torch.pow(10000.0, exponent)  # (max_seq_length, d_model / 2)
    even, odd = (torch.cos(angle), torch.sin(angle)) if swap else (torch.sin(angle), torch.cos(angle))
    if cos_everywhere:
        even = torch.cos(angle)
    if sin_everywhere:
        odd = torch.sin(angle)
    table = torch.zeros(max_seq_length, d_model, dtype=torch.float64)
    table[:, 0::2] = even
    if cos_first_odd_only:
        table[:, 1] = odd[:, 0]
    else:
        table[:, 1::2] = odd
    return table


def _pe_buffer(module: nn.Module) -> torch.Tensor:
    buffers = dict(module.named_buffers())
    if "pe" not in buffers:
        where = "a parameter" if "pe" in dict(module.named_parameters()) else "missing"
        fail(
            "PositionalEncoding has no buffer named `pe`.",
            expected="self.pe registered with self.register_buffer('pe', ...)",
            got=f"`pe` is {where}",
            cause="keep the given `register_buffer` line; a buffer moves with .to(device) but is not trained.",
        )
    return buffers["pe"]


def _size_mismatch(error: RuntimeError) -> bool:
    """A broadcasting error: two sizes that should agree do not."""
    return "must match" in str(error)


def _build(PositionalEncoding: type[nn.Module], d_model: int, max_seq_length: int, dropout: float) -> nn.Module:
    seen: list[str] = []

    def mismatch(error: RuntimeError) -> bool:
        seen.append(str(error))
        return _size_mismatch(error)

    def cause() -> str:
        sizes = {int(size) for size in re.findall(r"\((\d+)\)", seen[-1] if seen else "")}
        if max_seq_length != d_model // 2 and {max_seq_length, d_model // 2} <= sizes:
            return ("the positions must be a column: torch.arange(max_seq_length).unsqueeze(1) has shape "
                    "(max_seq_length, 1), so times the (d_model / 2,) frequencies it broadcasts to the "
                    "(max_seq_length, d_model / 2) angle table; a flat (max_seq_length,) row cannot.")
        return ("there must be d_model / 2 frequencies, one per (sin, cos) column pair: take the values 2i "
                "from torch.arange(0, d_model, 2) (step 2), not torch.arange(0, d_model).")

    with crash_explained(
        f"building the table crashed (d_model={d_model}, max_seq_length={max_seq_length}).",
        expected=f"an angle table (max_seq_length, d_model / 2) = ({max_seq_length}, {d_model // 2}) "
                 "that fills the even and the odd columns",
        cause=cause, when=mismatch,
    ), student_code():
        return PositionalEncoding(d_model, max_seq_length, dropout)


TABLE_SUSPECTS = {
    "sin and cos are swapped: sin belongs in the even columns 0, 2, 4, ... and cos in the odd ones.": (
        lambda d, n: _table(d, n, swap=True)
    ),
    "the exponent uses i instead of 2i: divide by 10000^(2i / d_model), where 2i is the even column index.": (
        lambda d, n: _table(d, n, use_index_i=True)
    ),
    "the exponent is doubled (4i / d_model): `torch.arange(0, d_model, 2)` already gives 2i, "
    "so do not multiply it by 2 again.": lambda d, n: _table(d, n, exponent_scale=4.0),
    "cos is written to column 1 only: use the slice `pe[:, 1::2]` for every odd column.": (
        lambda d, n: _table(d, n, cos_first_odd_only=True)
    ),
    "positions start at 1: the first token has position 0.": lambda d, n: _table(d, n, start=1),
    "cos is in the even columns too: the even columns 0, 2, 4, ... hold sin.": (
        lambda d, n: _table(d, n, cos_everywhere=True)
    ),
    "sin is in the odd columns too: the odd columns 1, 3, 5, ... hold cos of the same angle.": (
        lambda d, n: _table(d, n, sin_everywhere=True)
    ),
}


@check("PositionalEncoding stores a `pe` buffer of shape (1, max_seq_length, d_model)")
def buffer_shape(PositionalEncoding: type[nn.Module], d_model: int = 16, max_seq_length: int = 50) -> None:
    module = _build(PositionalEncoding, d_model, max_seq_length, 0.0)
    expect_shape(
        "pe",
        _pe_buffer(module),
        (1, max_seq_length, d_model),
        cause="build a (max_seq_length, d_model) table and keep the given `.unsqueeze(0)` for the batch axis.",
    )


@check("pe holds sin in even columns and cos in odd columns, as in the paper")
def table_values(PositionalEncoding: type[nn.Module], d_model: int = 16, max_seq_length: int = 60) -> None:
    got = _pe_buffer(_build(PositionalEncoding, d_model, max_seq_length, 0.0))
    expected = _table(d_model, max_seq_length).unsqueeze(0)
    suspects = {cause: (lambda make=make: make(d_model, max_seq_length).unsqueeze(0))
                for cause, make in TABLE_SUSPECTS.items()}
    expect_close(
        "pe", got, expected, atol=1e-4, rtol=1e-4, suspects=suspects,
        cause="check the formula PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same angle).",
    )


@check("forward adds pe[:, :seq_len] to the input (eval mode, so no dropout)")
def forward_adds_encoding(PositionalEncoding: type[nn.Module], d_model: int = 16, max_seq_length: int = 40,
                          seq_len: int = 7) -> None:
    module = _build(PositionalEncoding, d_model, max_seq_length, 0.1).double().eval()
    x = randn(3, seq_len, d_model, seed=1)
    with crash_explained(
        f"forward crashed on x of shape {tuple(x.shape)} (batch, seq_len, d_model), "
        f"max_seq_length={max_seq_length}.",
        expected=f"pe sliced to (1, seq_len, d_model) = (1, {seq_len}, {d_model}), which broadcasts over x",
        cause="a wrong slice of pe: axis 1 of pe is the position, so keep its first x.size(1) rows, "
              "self.pe[:, :x.size(1)] (x.size(0) is the batch, x.size(2) is d_model).",
        when=_size_mismatch,
    ), torch.no_grad(), student_code():
        got, again = module(x.clone()), module(x.clone())
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
        expected = reference(x)
    pe = reference.pe[:, :seq_len]
    if isinstance(got, torch.Tensor) and tensors_close(got, pe, 1e-4, 1e-4):
        fail("forward(x) is the positional table alone.", expected=f"x + pe, shape {tuple(x.shape)}",
             got=f"pe[:, :seq_len], shape {tuple(got.shape)}",
             cause="forward returns only the table: add it to x, do not replace x.")
    expect_close(
        "forward(x)", got, expected, atol=1e-4, rtol=1e-4,
        suspects={
            "forward returns x unchanged: add the positional table.": lambda: x,
            "forward returns only the table: add it to x, do not replace x.": lambda: pe.expand_as(x),
            "a single row of pe, pe[:, seq_len], is added to every position: slice with a colon, "
            "self.pe[:, :x.size(1)], to get one row per position.": lambda: x + reference.pe[:, seq_len],
            "the embeddings are scaled by sqrt(d_model) here: that scaling belongs to the Encoder/Decoder "
            "(stage 4), not to PositionalEncoding.": lambda: x * math.sqrt(d_model) + pe,
        },
        cause="return x + self.pe[:, :x.size(1)] (the slice keeps only the first seq_len positions).",
    )


@check("dropout is applied after the addition in train mode and switched off in eval mode")
def dropout_behaviour(PositionalEncoding: type[nn.Module], d_model: int = 16, max_seq_length: int = 40) -> None:
    p = 0.5
    module = _build(PositionalEncoding, d_model, max_seq_length, p).double()
    x = randn(4, 10, d_model, seed=2)
    summed = x + _table(d_model, max_seq_length)[:10]
    torch.manual_seed(0)
    with torch.no_grad(), student_code():
        module.train()
        trained = module(x)
        module.eval()
        evaluated = module(x)
    if not isinstance(trained, torch.Tensor) or trained.shape != x.shape:
        fail("forward returned the wrong thing.", expected=f"shape {tuple(x.shape)}",
             got=getattr(trained, "shape", type(trained).__name__), cause="return a tensor shaped like x.")
    zeros = trained.abs() < 1e-12
    if not zeros.any():
        fail(
            "in train mode no element was dropped.",
            expected=f"about {p:.0%} of the elements set to 0 (dropout p={p})",
            got="no zeros at all",
            cause="apply self.dropout to the sum (the given `return self.dropout(x)` line does it).",
        )
    kept_ok = ((trained - summed / (1 - p)).abs() < 1e-4) | zeros
    if not kept_ok.all():
        fail(
            "in train mode the kept elements are not (x + pe) / (1 - p).",
            expected="each element either 0 or (x + pe) / (1 - p)",
            got="other values",
            cause="apply dropout once, after adding pe (dropout on x before the addition leaves pe undropped).",
        )
    expect_close("forward(x) in eval mode", evaluated, summed, atol=1e-4, rtol=1e-4,
                 cause="in eval mode dropout must do nothing: use nn.Dropout (self.dropout), not F.dropout "
                       "with training=True.")


protect(__name__)  # snapshot the tools these checks use (see framework.protect)
