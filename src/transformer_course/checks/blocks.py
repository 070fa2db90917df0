"""Stage 3 checks: PositionWiseFeedForward, EncoderBlock and DecoderBlock (post-LN, as in the paper).

Every block check plugs the reference MultiHeadAttention and PositionWiseFeedForward into the
student's block, so only the `forward` written for that block is graded (a feed-forward mistake
costs points once, in the feed-forward checks). Expected values come from the reference blocks
with the same randomised weights, in float64 and eval mode unless a check is about dropout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks.framework import (
    check,
    copy_weights,
    crash_explained,
    expect_close,
    expect_shape,
    fail,
    protect,
    randn,
    reject_builtin_modules,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.reference import DecoderBlock as ReferenceDecoderBlock
from transformer_course.reference import EncoderBlock as ReferenceEncoderBlock
from transformer_course.reference import MultiHeadAttention as ReferenceMultiHeadAttention
from transformer_course.reference import PositionWiseFeedForward as ReferenceFeedForward
from transformer_course.reference import make_look_ahead_mask

__all__ = [
    "decoder_causality",
    "decoder_dropout_modes",
    "decoder_dropout_placement",
    "decoder_matches_torch",
    "decoder_shape",
    "decoder_values",
    "encoder_dropout_modes",
    "encoder_dropout_placement",
    "encoder_matches_torch",
    "encoder_padding_invariance",
    "encoder_shape",
    "encoder_values",
    "feed_forward_shape",
    "feed_forward_values",
    "summary",
]

Tensor = torch.Tensor


# --- building modules and inputs ------------------------------------------------------------------


@contextmanager
def _private_random_state(seed: int | None = None) -> Iterator[None]:
    """Leave the notebook's global random stream as it was; optionally reseed it inside."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def _randomise(module: nn.Module, seed: int) -> nn.Module:
    """Give every parameter reproducible random values, LayerNorm gains and biases included.

    With the default initialisation every LayerNorm is the same (gain 1, bias 0), so a block that used
    norm1 twice would be indistinguishable from a correct one; random gains tell them apart.
    """
    with torch.no_grad():
        for index, (name, parameter) in enumerate(sorted(module.named_parameters())):
            noise = randn(*parameter.shape, seed=seed + index)
            if parameter.dim() > 1:
                value = noise / math.sqrt(parameter.shape[1])  # keeps activations of order 1
            elif "norm" in name and name.endswith("weight"):
                value = 1.0 + 0.3 * noise
            else:
                value = 0.3 * noise
            parameter.copy_(value)
    return module


def _reference(cls: type[nn.Module], *args: Any, seed: int) -> nn.Module:
    with _private_random_state():
        module = cls(*args)
    return _randomise(module.double(), seed)


def _student(cls: type[nn.Module], args: tuple, what: str, reference: nn.Module,
             sublayers: dict[str, Callable[[], nn.Module]] | None = None) -> nn.Module:
    """Build the student's module, plug in the reference sublayers, copy the reference weights."""
    with _private_random_state(), student_code():
        module = cls(*args)
    reject_builtin_modules(module, what)
    with _private_random_state():
        for name, make in (sublayers or {}).items():
            if isinstance(getattr(module, name, None), nn.Module):
                setattr(module, name, make())
    module = module.double()
    copy_weights(reference, module, what)
    return module


def _run(module: nn.Module, *inputs: Tensor | None, seed: int | None = None) -> Any:
    """Call the student's module on copies of the inputs (an in-place `+=` must not spoil them)."""
    copies = [t.clone() if isinstance(t, Tensor) else t for t in inputs]
    with _private_random_state(seed), torch.no_grad(), student_code():
        return module(*copies)


def _run_eval(module: nn.Module, *inputs: Tensor | None, what: str) -> Any:
    """Run the student's module in eval mode twice; the two outputs must agree (dropout is off in eval)."""
    module.eval()
    first, second = _run(module, *inputs, seed=7), _run(module, *inputs, seed=8)
    if isinstance(first, Tensor) and isinstance(second, Tensor) and first.shape == second.shape \
            and not tensors_close(first, second, 1e-12, 0.0):
        fail(
            f"in eval mode two calls of {what} gave different outputs.",
            expected="a deterministic output: dropout does nothing in eval mode",
            got="outputs that change from call to call",
            cause="use the module self.dropout, which switches itself off in eval mode; F.dropout(..., "
                  "training=True) or torch.bernoulli keep dropping.",
        )
    return first


def _expected(module: nn.Module, *inputs: Tensor | None, seed: int | None = None) -> Tensor:
    with _private_random_state(seed), torch.no_grad():
        return module(*inputs)


def _padding_mask(lengths: list[int], seq_len: int, int_mask: bool = False) -> Tensor:
    """(batch, 1, 1, seq_len): True (or 1) at the first `length` positions of each row."""
    mask = torch.arange(seq_len).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # (batch, seq_len)
    mask = mask.unsqueeze(1).unsqueeze(2)
    return mask.int() if int_mask else mask


def _lengths(batch: int, seq_len: int) -> list[int]:
    """Sequence lengths with padding in most rows: seq_len, seq_len - 2, seq_len - 1, ..."""
    return [max(1, seq_len - (2 * index) % 3) if index else seq_len for index in range(batch)]


# --- PositionWiseFeedForward ------------------------------------------------------------------------


def _feed_forward_pair(PositionWiseFeedForward: type[nn.Module], d_model: int, d_ff: int,
                       seed: int = 10) -> tuple[nn.Module, nn.Module]:
    reference = _reference(ReferenceFeedForward, d_model, d_ff, seed=seed)
    module = _student(PositionWiseFeedForward, (d_model, d_ff), "PositionWiseFeedForward", reference)
    return reference, module


@check("PositionWiseFeedForward keeps the shape (batch, seq_len, d_model)")
def feed_forward_shape(PositionWiseFeedForward: type[nn.Module], d_model: int = 16, d_ff: int = 64,
                       batch: int = 2, seq_len: int = 5) -> None:
    _, module = _feed_forward_pair(PositionWiseFeedForward, d_model, d_ff)
    got = _run(module.eval(), randn(batch, seq_len, d_model, seed=11))
    expect_shape("PositionWiseFeedForward(x)", got, (batch, seq_len, d_model),
                 cause="fc1 widens each position to d_ff, fc2 brings it back to d_model: "
                       "return fc2's output.")


@check("PositionWiseFeedForward computes max(0, x W1 + b1) W2 + b2")
def feed_forward_values(PositionWiseFeedForward: type[nn.Module], d_model: int = 16, d_ff: int = 64,
                        batch: int = 3, seq_len: int = 7) -> None:
    reference, module = _feed_forward_pair(PositionWiseFeedForward, d_model, d_ff)
    x = randn(batch, seq_len, d_model, seed=12)
    got = _run(module.eval(), x)
    fc1, fc2 = reference.fc1, reference.fc2
    with torch.no_grad():
        expect_close(
            "PositionWiseFeedForward(x)", got, reference(x), atol=1e-8, rtol=1e-6,
            suspects={
                "there is no ReLU between the two linear layers: compute fc2(relu(fc1(x))).":
                    lambda: fc2(fc1(x)),
                "ReLU is applied after fc2 as well: the output of the network must be allowed to be "
                "negative, so only the hidden layer goes through the ReLU.":
                    lambda: F.relu(fc2(F.relu(fc1(x)))),
                "ReLU is applied after fc2 instead of after fc1: the ReLU sits between the two layers.":
                    lambda: F.relu(fc2(fc1(x))),
                "GELU is used instead of ReLU: the paper's network uses max(0, z), which is self.relu.":
                    lambda: fc2(F.gelu(fc1(x))),
            },
            cause="return self.fc2(self.relu(self.fc1(x))), the formula max(0, x W1 + b1) W2 + b2.",
        )


# --- the sublayer pattern and its known mistakes --------------------------------------------------------


def _sublayer(x: Tensor, function: Callable[[Tensor], Tensor], norm: nn.Module, dropout: nn.Module, *,
              residual: bool = True, pre_ln: bool = False, norm_of_sum: bool = True,
              dropout_at: str = "output") -> Tensor:
    """LayerNorm(x + Dropout(function(x))) by default; the options rebuild a known mistake.

    dropout_at: "output" (the paper), "none", "input" (before the sublayer), "sum" (on x + sublayer(x)),
    "after_norm" (on the normalised result).
    """
    inner = norm(x) if pre_ln else x
    if dropout_at == "input":
        inner = dropout(inner)
    out = function(inner)  # (batch, seq_len, d_model)
    if dropout_at == "output":
        out = dropout(out)
    if pre_ln:
        return x + out if residual else out
    if not norm_of_sum:
        return x + norm(out)
    total = x + out if residual else out
    if dropout_at == "sum":
        total = dropout(total)
    result = norm(total)
    return dropout(result) if dropout_at == "after_norm" else result


def _encoder_variant(block: nn.Module, x: Tensor, mask: Tensor | None, *,
                     residual: tuple[bool, bool] = (True, True), norms: tuple[str, str] = ("norm1", "norm2"),
                     mask_used: bool = True, attention_first: bool = True,
                     dropout_at: tuple[str, str] = ("output", "output"), **options: bool) -> Tensor:
    """The reference encoder block's computation, optionally with one known mistake."""

    def attention(t: Tensor) -> Tensor:
        return block.self_attn(t, t, t, mask if mask_used else None)

    steps = [(attention, residual[0], dropout_at[0]), (block.feed_forward, residual[1], dropout_at[1])]
    if not attention_first:
        steps.reverse()
    for (function, keep_residual, where), norm in zip(steps, norms, strict=True):
        x = _sublayer(x, function, getattr(block, norm), block.dropout, residual=keep_residual,
                      dropout_at=where, **options)
    return x


ENCODER_SUSPECTS: dict[str, dict[str, Any]] = {
    "the residual around self-attention is missing: the first sublayer is "
    "norm1(x + dropout(self_attn(x, x, x, mask))), with x added back.": {"residual": (False, True)},
    "the residual around the feed-forward network is missing: the second sublayer is "
    "norm2(x + dropout(feed_forward(x))).": {"residual": (True, False)},
    "both residual connections are missing: each sublayer's output is added to its input before the "
    "LayerNorm.": {"residual": (False, False)},
    "this is the pre-LN order x + sublayer(LayerNorm(x)); the paper's block (and this exercise) is post-LN: "
    "LayerNorm(x + dropout(sublayer(x))).": {"pre_ln": True},
    "LayerNorm is applied to the sublayer output only (x + norm(sublayer(x))): normalise the sum, "
    "norm(x + dropout(sublayer(x))).": {"norm_of_sum": False},
    "norm1 is used for both sublayers: the feed-forward sublayer has its own LayerNorm, self.norm2.":
        {"norms": ("norm1", "norm1")},
    "norm2 is used for both sublayers: the self-attention sublayer uses self.norm1.":
        {"norms": ("norm2", "norm2")},
    "norm1 and norm2 are swapped: norm1 belongs to self-attention, norm2 to the feed-forward network.":
        {"norms": ("norm2", "norm1")},
    "the mask is ignored: pass it on, self.self_attn(x, x, x, mask).": {"mask_used": False},
    "the feed-forward network runs before self-attention: attention comes first.": {"attention_first": False},
}

ENCODER_DROPOUT_SUSPECTS: dict[str, dict[str, Any]] = {
    "there is no dropout at all: apply self.dropout to each sublayer's output.":
        {"dropout_at": ("none", "none")},
    "the self-attention output is not dropped out: x + self.dropout(self.self_attn(...)).":
        {"dropout_at": ("none", "output")},
    "the feed-forward output is not dropped out: x + self.dropout(self.feed_forward(x)).":
        {"dropout_at": ("output", "none")},
    "dropout is applied after the LayerNorm: it belongs on the sublayer output, before the addition.":
        {"dropout_at": ("after_norm", "after_norm")},
    "dropout is applied to the sum x + sublayer(x): drop out only the sublayer output, then add x.":
        {"dropout_at": ("sum", "sum")},
    "dropout is applied to the sublayer's input: it belongs on the sublayer's output.":
        {"dropout_at": ("input", "input")},
}


def _suspects(variant: Callable[..., Tensor], block: nn.Module, inputs: tuple,
              table: dict[str, dict[str, Any]], seed: int | None = None) -> dict[str, Callable[[], Tensor]]:
    """Turn a table of known mistakes into the lazy `suspects` of expect_close."""

    def make(options: dict[str, Any]) -> Callable[[], Tensor]:
        def wrong() -> Tensor:
            with _private_random_state(seed), torch.no_grad():
                return variant(block, *inputs, **options)

        return wrong

    return {cause: make(options) for cause, options in table.items()}


# --- EncoderBlock -----------------------------------------------------------------------------------------


def _encoder_pair(EncoderBlock: type[nn.Module], d_model: int, num_heads: int, d_ff: int,
                  dropout: float = 0.1, seed: int = 20) -> tuple[nn.Module, nn.Module]:
    reference = _reference(ReferenceEncoderBlock, d_model, num_heads, d_ff, dropout, seed=seed)
    block = _student(
        EncoderBlock, (d_model, num_heads, d_ff, dropout), "EncoderBlock", reference,
        sublayers={"self_attn": lambda: ReferenceMultiHeadAttention(d_model, num_heads),
                   "feed_forward": lambda: ReferenceFeedForward(d_model, d_ff)},
    )
    return reference, block


def _encoder_inputs(batch: int, seq_len: int, d_model: int, int_mask: bool = False,
                    seed: int = 21) -> tuple[Tensor, Tensor]:
    mask = _padding_mask(_lengths(batch, seq_len), seq_len, int_mask)  # (batch, 1, 1, seq_len)
    return randn(batch, seq_len, d_model, seed=seed), mask


@check("EncoderBlock keeps the shape (batch, src_len, d_model)")
def encoder_shape(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                  batch: int = 2, seq_len: int = 7) -> None:
    _, block = _encoder_pair(EncoderBlock, d_model, num_heads, d_ff)
    x, mask = _encoder_inputs(batch, seq_len, d_model)
    expect_shape("EncoderBlock(x, mask)", _run(block.eval(), x, mask), (batch, seq_len, d_model),
                 cause="both sublayers map (batch, src_len, d_model) to the same shape; return the output "
                       "of the second LayerNorm.")


@check("EncoderBlock computes norm2(h + FFN(h)) with h = norm1(x + SelfAttention(x)), as in the paper")
def encoder_values(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                   batch: int = 3, seq_len: int = 6, int_mask: bool = False) -> None:
    reference, block = _encoder_pair(EncoderBlock, d_model, num_heads, d_ff)
    x, mask = _encoder_inputs(batch, seq_len, d_model, int_mask)
    got = _run_eval(block, x, mask, what="EncoderBlock")
    reference.eval()
    expect_close(
        "EncoderBlock(x, mask)", got, _expected(reference, x, mask), atol=1e-8, rtol=1e-6,
        suspects=_suspects(_encoder_variant, reference, (x, mask), ENCODER_SUSPECTS),
        cause="each sublayer is x = norm(x + self.dropout(sublayer(x))): self-attention with norm1 first, "
              "then the feed-forward network with norm2.",
    )


def _load_attention(builtin: nn.MultiheadAttention, ours: nn.Module) -> None:
    """Copy our W_q, W_k, W_v, W_o into nn.MultiheadAttention's packed in_proj and out_proj."""
    with torch.no_grad():
        builtin.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        builtin.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
        builtin.out_proj.weight.copy_(ours.W_o.weight)
        builtin.out_proj.bias.copy_(ours.W_o.bias)


def _load_common(layer: nn.Module, reference: nn.Module, norms: tuple[str, ...]) -> None:
    layer.linear1.load_state_dict(reference.feed_forward.fc1.state_dict())
    layer.linear2.load_state_dict(reference.feed_forward.fc2.state_dict())
    for name in norms:
        getattr(layer, name).load_state_dict(getattr(reference, name).state_dict())


@check("EncoderBlock gives the same output as torch.nn.TransformerEncoderLayer with the same weights")
def encoder_matches_torch(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 3, seq_len: int = 6) -> None:
    reference, block = _encoder_pair(EncoderBlock, d_model, num_heads, d_ff)
    x, mask = _encoder_inputs(batch, seq_len, d_model)
    with _private_random_state():
        layer = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, 0.1, batch_first=True).double().eval()
    _load_attention(layer.self_attn, reference.self_attn)
    _load_common(layer, reference, ("norm1", "norm2"))
    padding = ~mask[:, 0, 0, :].bool()  # (batch, seq_len), True at padding: the built-in's convention
    expected = layer(x, src_key_padding_mask=padding).detach()  # grad enabled keeps the plain code path
    got = _run_eval(block, x, mask, what="EncoderBlock")
    reference.eval()
    expect_close(
        "EncoderBlock(x, mask)", got, expected, atol=1e-7, rtol=1e-6,
        suspects=_suspects(_encoder_variant, reference, (x, mask), ENCODER_SUSPECTS),
        cause="PyTorch's layer (norm_first=False, ReLU) is the paper's post-LN block: "
              "norm1(x + dropout(self_attn(x))), then norm2(x + dropout(feed_forward(x))).",
    )


@check("EncoderBlock: extra padding tokens change no real position's output")
def encoder_padding_invariance(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                               d_ff: int = 32, batch: int = 3, seq_len: int = 6, extra: int = 3) -> None:
    _, block = _encoder_pair(EncoderBlock, d_model, num_heads, d_ff)
    block.eval()
    lengths = _lengths(batch, seq_len)
    x = randn(batch, seq_len, d_model, seed=22)
    longer = torch.cat([x, 5.0 * randn(batch, extra, d_model, seed=23)], dim=1)  # loud padding vectors
    short = _run_eval(block, x, _padding_mask(lengths, seq_len), what="EncoderBlock")
    long = _run_eval(block, longer, _padding_mask(lengths, seq_len + extra), what="EncoderBlock")
    expect_shape("EncoderBlock(x, mask)", long, (batch, seq_len + extra, d_model),
                 cause="return a tensor shaped like x.")
    for row, length in enumerate(lengths):
        if not tensors_close(long[row, :length], short[row, :length], 1e-8, 1e-6):
            fail(
                "appending padding tokens changed the output at real positions.",
                expected=f"row {row}: positions 0..{length - 1} identical with {extra} extra padding tokens",
                got="different values",
                cause="the padding mask must reach self-attention: self.self_attn(x, x, x, mask), so that no "
                      "real token attends to padding.",
            )


def _dropout_modes(block: nn.Module, reference: nn.Module, inputs: tuple, what: str,
                   suspects: dict[str, Callable[[], Tensor]]) -> None:
    """Train mode: two calls differ. Eval mode: two calls agree and match the dropout-free reference."""
    block.train()
    first, second = _run(block, *inputs, seed=1), _run(block, *inputs, seed=2)
    expect_shape(what, first, tuple(inputs[0].shape), cause="return a tensor shaped like x.")
    if tensors_close(first, second, 1e-12, 0.0):
        fail(
            "in train mode two calls gave exactly the same output.",
            expected="different outputs: dropout (p=0.5) zeroes different elements on every call",
            got="identical outputs",
            cause="apply self.dropout to the output of each sublayer, before adding the residual.",
        )
    got = _run_eval(block, *inputs, what=what)
    expect_close(f"{what} in eval mode", got, _expected(reference.eval(), *inputs), atol=1e-8, rtol=1e-6,
                 suspects=suspects, cause="in eval mode the block must equal the same block with dropout=0.")


@check("EncoderBlock: dropout is active in train mode and switched off in eval mode")
def encoder_dropout_modes(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 2, seq_len: int = 6) -> None:
    _, block = _encoder_pair(EncoderBlock, d_model, num_heads, d_ff, dropout=0.5)
    without_dropout = _reference(ReferenceEncoderBlock, d_model, num_heads, d_ff, 0.0, seed=20)
    inputs = _encoder_inputs(batch, seq_len, d_model)
    _dropout_modes(block, without_dropout, inputs, "EncoderBlock(x, mask)",
                   _suspects(_encoder_variant, without_dropout, inputs, ENCODER_SUSPECTS))


@check("EncoderBlock: dropout acts on each sublayer's output, before the residual addition")
def encoder_dropout_placement(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                              d_ff: int = 32, batch: int = 2, seq_len: int = 6) -> None:
    reference, block = _encoder_pair(EncoderBlock, d_model, num_heads, d_ff, dropout=0.3)
    inputs = _encoder_inputs(batch, seq_len, d_model)
    got = _run(block.train(), *inputs, seed=5)
    reference.train()  # the same random seed gives the same dropout masks, call by call
    expect_close(
        "EncoderBlock(x, mask) in train mode", got, _expected(reference, *inputs, seed=5),
        atol=1e-8, rtol=1e-6,
        suspects=_suspects(_encoder_variant, reference, inputs,
                           {**ENCODER_DROPOUT_SUSPECTS, **ENCODER_SUSPECTS}, seed=5),
        cause="call self.dropout exactly once per sublayer, on the sublayer's output: "
              "norm(x + self.dropout(sublayer(x))) (the paper, section 5.4).",
    )


# --- DecoderBlock -----------------------------------------------------------------------------------------


def _decoder_variant(block: nn.Module, x: Tensor, enc_out: Tensor, enc_mask: Tensor | None,
                     dec_mask: Tensor | None, *, residual: tuple[bool, bool, bool] = (True, True, True),
                     norms: tuple[str, str, str] = ("norm1", "norm2", "norm3"), self_mask: str | None = "dec",
                     cross_mask: str | None = "enc", memory_from_decoder: bool = False,
                     query_from_encoder: bool = False, cross_module: str = "cross_attn",
                     with_cross: bool = True, self_first: bool = True,
                     dropout_at: tuple[str, str, str] = ("output",) * 3,
                     **options: bool) -> Tensor:
    """The reference decoder block's computation, optionally with one known mistake."""
    masks = {"dec": dec_mask, "enc": enc_mask, None: None}

    def self_attention(t: Tensor) -> Tensor:
        return block.self_attn(t, t, t, masks[self_mask])

    def cross_attention(t: Tensor) -> Tensor:
        attention = getattr(block, cross_module)
        if query_from_encoder:
            return attention(enc_out, t, t, masks[cross_mask])
        memory = t if memory_from_decoder else enc_out
        return attention(t, memory, memory, masks[cross_mask])

    steps = [(self_attention, residual[0], dropout_at[0]), (cross_attention, residual[1], dropout_at[1]),
             (block.feed_forward, residual[2], dropout_at[2])]
    if not self_first:
        steps[0], steps[1] = steps[1], steps[0]
    if not with_cross:
        del steps[1]
        norms = (norms[0], norms[2])
    for (function, keep_residual, where), norm in zip(steps, norms, strict=True):
        x = _sublayer(x, function, getattr(block, norm), block.dropout, residual=keep_residual,
                      dropout_at=where, **options)
    return x


DECODER_SUSPECTS: dict[str, dict[str, Any]] = {
    "cross-attention takes its keys and values from the decoder: they come from the encoder output, "
    "self.cross_attn(x, enc_out, enc_out, enc_mask).": {"memory_from_decoder": True},
    "cross-attention takes its query from the encoder output: the query is the decoder's x, "
    "self.cross_attn(x, enc_out, enc_out, enc_mask).": {"query_from_encoder": True},
    "enc_mask and dec_mask are swapped: self-attention gets dec_mask (look-ahead), cross-attention gets "
    "enc_mask (source padding).": {"self_mask": "enc", "cross_mask": "dec"},
    "self-attention gets enc_mask, the source padding mask: the decoder's self-attention needs dec_mask "
    "(look-ahead and target padding), self.self_attn(x, x, x, dec_mask).": {"self_mask": "enc"},
    "cross-attention gets dec_mask: its keys are the encoder positions, so it needs the source padding mask, "
    "self.cross_attn(x, enc_out, enc_out, enc_mask).": {"cross_mask": "dec"},
    "self-attention ignores dec_mask: without the look-ahead mask each position sees the future, "
    "use self.self_attn(x, x, x, dec_mask).": {"self_mask": None},
    "cross-attention ignores enc_mask: decoder positions then attend to source padding, "
    "use self.cross_attn(x, enc_out, enc_out, enc_mask).": {"cross_mask": None},
    "both masks are ignored: self-attention needs dec_mask and cross-attention enc_mask.":
        {"self_mask": None, "cross_mask": None},
    "cross-attention uses the self-attention weights (self.self_attn): the second sublayer has its own "
    "module, self.cross_attn.": {"cross_module": "self_attn"},
    "cross-attention is missing: the decoder block has three sublayers, the second one attends to enc_out.":
        {"with_cross": False},
    "cross-attention runs before masked self-attention: the order is self-attention, cross-attention, "
    "feed-forward.": {"self_first": False},
    "the residual around self-attention is missing: norm1(x + dropout(self_attn(x, x, x, dec_mask))).":
        {"residual": (False, True, True)},
    "the residual around cross-attention is missing: norm2(x + dropout(cross_attn(x, enc_out, enc_out, "
    "enc_mask))).": {"residual": (True, False, True)},
    "the residual around the feed-forward network is missing: norm3(x + dropout(feed_forward(x))).":
        {"residual": (True, True, False)},
    "this is the pre-LN order x + sublayer(LayerNorm(x)); the paper's block (and this exercise) is post-LN: "
    "LayerNorm(x + dropout(sublayer(x))).": {"pre_ln": True},
    "LayerNorm is applied to the sublayer output only (x + norm(sublayer(x))): normalise the sum.":
        {"norm_of_sum": False},
    "one LayerNorm (norm1) is used for all three sublayers: use norm1, norm2, norm3 in turn.":
        {"norms": ("norm1", "norm1", "norm1")},
    "norm3 is never used: the feed-forward sublayer is normalised by self.norm3.":
        {"norms": ("norm1", "norm2", "norm2")},
}

DECODER_DROPOUT_SUSPECTS: dict[str, dict[str, Any]] = {
    "there is no dropout at all: apply self.dropout to each sublayer's output.":
        {"dropout_at": ("none", "none", "none")},
    "the self-attention output is not dropped out.": {"dropout_at": ("none", "output", "output")},
    "the cross-attention output is not dropped out: x + self.dropout(self.cross_attn(...)).":
        {"dropout_at": ("output", "none", "output")},
    "the feed-forward output is not dropped out.": {"dropout_at": ("output", "output", "none")},
    "dropout is applied after the LayerNorm: it belongs on the sublayer output, before the addition.":
        {"dropout_at": ("after_norm",) * 3},
    "dropout is applied to the sum x + sublayer(x): drop out only the sublayer output, then add x.":
        {"dropout_at": ("sum",) * 3},
    "dropout is applied to the sublayer's input: it belongs on the sublayer's output.":
        {"dropout_at": ("input",) * 3},
}


def _decoder_pair(DecoderBlock: type[nn.Module], d_model: int, num_heads: int, d_ff: int,
                  dropout: float = 0.1, seed: int = 30) -> tuple[nn.Module, nn.Module]:
    reference = _reference(ReferenceDecoderBlock, d_model, num_heads, d_ff, dropout, seed=seed)
    block = _student(
        DecoderBlock, (d_model, num_heads, d_ff, dropout), "DecoderBlock", reference,
        sublayers={"self_attn": lambda: ReferenceMultiHeadAttention(d_model, num_heads),
                   "cross_attn": lambda: ReferenceMultiHeadAttention(d_model, num_heads),
                   "feed_forward": lambda: ReferenceFeedForward(d_model, d_ff)},
    )
    return reference, block


def _decoder_inputs(batch: int, tgt_len: int, src_len: int, d_model: int, int_mask: bool = False,
                    target_padding: bool = True, seed: int = 31) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """x (batch, tgt_len, d_model), enc_out (batch, src_len, d_model), enc_mask (batch, 1, 1, src_len),
    dec_mask (batch, 1, tgt_len, tgt_len) = target padding & look-ahead."""
    x = randn(batch, tgt_len, d_model, seed=seed)
    enc_out = randn(batch, src_len, d_model, seed=seed + 1)
    enc_mask = _padding_mask(_lengths(batch, src_len), src_len)
    dec_mask = make_look_ahead_mask(tgt_len)  # (1, 1, tgt_len, tgt_len)
    if target_padding:
        dec_mask = dec_mask & _padding_mask(list(reversed(_lengths(batch, tgt_len))), tgt_len)
    if int_mask:
        enc_mask, dec_mask = enc_mask.int(), dec_mask.int()
    return x, enc_out, enc_mask, dec_mask


@contextmanager
def _attention_calls(block: nn.Module) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Record each call of block.self_attn and block.cross_attn as (name, {"q": ..., "k": ..., "mask": ...})."""
    calls: list[tuple[str, dict[str, Any]]] = []
    handles = []
    for name in ("self_attn", "cross_attn"):
        module = getattr(block, name, None)
        if not isinstance(module, nn.Module):
            continue

        def record(_module: nn.Module, args: tuple, kwargs: dict[str, Any], name: str = name) -> None:
            calls.append((name, {**dict(zip(("q", "k", "v", "mask"), args, strict=False)), **kwargs}))

        handles.append(module.register_forward_pre_hook(record, with_kwargs=True))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def _crash_cause(calls: list[tuple[str, dict[str, Any]]], tgt_len: int, src_len: int) -> str | None:
    """Name the mistake behind a crash from the last attention call before it (tgt_len != src_len)."""
    if not calls:
        return None
    name, arguments = calls[-1]

    def size(key: str, axis: int) -> int | None:
        value = arguments.get(key)
        in_range = isinstance(value, Tensor) and -value.dim() <= axis < value.dim()
        return value.size(axis) if in_range else None

    q_len, k_len, mask_keys, mask_queries = size("q", 1), size("k", 1), size("mask", -1), size("mask", -2)
    if name == "self_attn" and q_len == k_len == tgt_len and mask_keys == src_len:
        return ("self-attention gets enc_mask, the source padding mask: the decoder's self-attention needs "
                "dec_mask (look-ahead and target padding), self.self_attn(x, x, x, dec_mask).")
    if name != "cross_attn":
        return None
    if q_len == src_len:
        return ("cross-attention takes its query from the encoder output: the query is the decoder's x, "
                "self.cross_attn(x, enc_out, enc_out, enc_mask).")
    if k_len == tgt_len:
        return ("cross-attention takes its keys and values from the decoder: they come from the encoder "
                "output, self.cross_attn(x, enc_out, enc_out, enc_mask).")
    if mask_keys == tgt_len and mask_queries == tgt_len:
        return ("cross-attention gets dec_mask: its keys are the encoder positions, so it needs the source "
                "padding mask, self.cross_attn(x, enc_out, enc_out, enc_mask).")
    return None


def _run_decoder(block: nn.Module, inputs: tuple, seed: int | None = None) -> Any:
    """Run the student's decoder block; explain a shape crash when src_len differs from tgt_len."""
    x, enc_out = inputs[0], inputs[1]
    tgt_len, src_len = x.size(1), enc_out.size(1)
    with _attention_calls(block) as calls, crash_explained(
        f"DecoderBlock crashed with target length {tgt_len} and source length {src_len}.",
        expected="an output of shape (batch, tgt_len, d_model) whatever the two lengths",
        cause=lambda: _crash_cause(calls, tgt_len, src_len)
        or "a tensor or mask of the wrong length reaches an attention call. Self-attention: "
           "self.self_attn(x, x, x, dec_mask); cross-attention: query from the decoder, keys and "
           "values from the encoder, self.cross_attn(x, enc_out, enc_out, enc_mask).",
        when=lambda error: tgt_len != src_len,
    ):
        if block.training:
            return _run(block, *inputs, seed=seed)
        return _run_eval(block, *inputs, what="DecoderBlock")


@check("DecoderBlock keeps the shape (batch, tgt_len, d_model), also when src_len differs from tgt_len")
def decoder_shape(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                  batch: int = 2, tgt_len: int = 5, src_len: int = 8) -> None:
    _, block = _decoder_pair(DecoderBlock, d_model, num_heads, d_ff)
    got = _run_decoder(block.eval(), _decoder_inputs(batch, tgt_len, src_len, d_model))
    expect_shape("DecoderBlock(x, enc_out, enc_mask, dec_mask)", got, (batch, tgt_len, d_model),
                 cause="every sublayer keeps the decoder's shape (batch, tgt_len, d_model); "
                       "cross-attention's query is the decoder's x.")


@check("DecoderBlock: masked self-attention, cross-attention on enc_out, feed-forward, each post-LN")
def decoder_values(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                   batch: int = 3, tgt_len: int = 6, src_len: int = 6, int_mask: bool = False) -> None:
    reference, block = _decoder_pair(DecoderBlock, d_model, num_heads, d_ff)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model, int_mask)
    got = _run_decoder(block.eval(), inputs)
    reference.eval()
    expect_close(
        "DecoderBlock(x, enc_out, enc_mask, dec_mask)", got, _expected(reference, *inputs),
        atol=1e-8, rtol=1e-6,
        suspects=_suspects(_decoder_variant, reference, inputs, DECODER_SUSPECTS),
        cause="three sublayers, each x = norm(x + self.dropout(sublayer)): self_attn(x, x, x, dec_mask) with "
              "norm1, cross_attn(x, enc_out, enc_out, enc_mask) with norm2, feed_forward(x) with norm3.",
    )


@check("DecoderBlock gives the same output as torch.nn.TransformerDecoderLayer with the same weights")
def decoder_matches_torch(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 3, tgt_len: int = 6, src_len: int = 6) -> None:
    reference, block = _decoder_pair(DecoderBlock, d_model, num_heads, d_ff)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model, target_padding=True)
    x, enc_out, enc_mask, dec_mask = inputs
    with _private_random_state():
        layer = nn.TransformerDecoderLayer(d_model, num_heads, d_ff, 0.1, batch_first=True).double().eval()
    _load_attention(layer.self_attn, reference.self_attn)
    _load_attention(layer.multihead_attn, reference.cross_attn)
    _load_common(layer, reference, ("norm1", "norm2", "norm3"))
    # The built-in's boolean masks say True where attention is NOT allowed, the opposite of ours.
    look_ahead = ~make_look_ahead_mask(tgt_len)[0, 0]  # (tgt_len, tgt_len)
    target_padding = ~dec_mask[:, 0, -1, :].bool()  # (batch, tgt_len): the last row sees every real token
    source_padding = ~enc_mask[:, 0, 0, :].bool()  # (batch, src_len)
    expected = layer(x, enc_out, tgt_mask=look_ahead, tgt_key_padding_mask=target_padding,
                     memory_key_padding_mask=source_padding).detach()
    got = _run_decoder(block.eval(), inputs)
    reference.eval()
    expect_close(
        "DecoderBlock(x, enc_out, enc_mask, dec_mask)", got, expected, atol=1e-7, rtol=1e-6,
        suspects=_suspects(_decoder_variant, reference, inputs, DECODER_SUSPECTS),
        cause="PyTorch's layer (norm_first=False, ReLU) is the paper's post-LN decoder block: self-attention "
              "(dec_mask), cross-attention on enc_out (enc_mask), feed-forward, each norm(x + dropout(...)).",
    )


@check("DecoderBlock is causal: changing positions after t never changes the outputs up to t")
def decoder_causality(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                      batch: int = 2, tgt_len: int = 6, src_len: int = 7) -> None:
    _, block = _decoder_pair(DecoderBlock, d_model, num_heads, d_ff)
    block.eval()
    x, enc_out, enc_mask, dec_mask = _decoder_inputs(batch, tgt_len, src_len, d_model, target_padding=False)
    base = _run_decoder(block, (x, enc_out, enc_mask, dec_mask))
    expect_shape("DecoderBlock(x, enc_out, enc_mask, dec_mask)", base, (batch, tgt_len, d_model),
                 cause="return a tensor shaped like x.")
    for t in range(tgt_len - 1):
        changed = x.clone()
        changed[:, t + 1:] = randn(batch, tgt_len - t - 1, d_model, seed=40 + t)  # new "future" tokens
        out = _run_decoder(block, (changed, enc_out, enc_mask, dec_mask))
        if not tensors_close(out[:, : t + 1], base[:, : t + 1], 1e-8, 1e-6):
            fail(
                f"changing the inputs at positions {t + 1}..{tgt_len - 1} changed the output at positions "
                f"0..{t}.",
                expected="outputs at positions <= t that depend only on inputs at positions <= t",
                got="outputs that see the future",
                cause="self-attention must get the look-ahead mask: self.self_attn(x, x, x, dec_mask) "
                      "(not enc_mask, not None).",
            )


@check("DecoderBlock: dropout is active in train mode and switched off in eval mode")
def decoder_dropout_modes(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 2, tgt_len: int = 6, src_len: int = 6) -> None:
    _, block = _decoder_pair(DecoderBlock, d_model, num_heads, d_ff, dropout=0.5)
    without_dropout = _reference(ReferenceDecoderBlock, d_model, num_heads, d_ff, 0.0, seed=30)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model)
    _dropout_modes(block, without_dropout, inputs, "DecoderBlock(x, enc_out, enc_mask, dec_mask)",
                   _suspects(_decoder_variant, without_dropout, inputs, DECODER_SUSPECTS))


@check("DecoderBlock: dropout acts on each sublayer's output, before the residual addition")
def decoder_dropout_placement(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                              d_ff: int = 32, batch: int = 2, tgt_len: int = 6, src_len: int = 6) -> None:
    reference, block = _decoder_pair(DecoderBlock, d_model, num_heads, d_ff, dropout=0.3)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model)
    got = _run_decoder(block.train(), inputs, seed=6)
    reference.train()  # the same random seed gives the same dropout masks, call by call
    expect_close(
        "DecoderBlock(...) in train mode", got, _expected(reference, *inputs, seed=6), atol=1e-8, rtol=1e-6,
        suspects=_suspects(_decoder_variant, reference, inputs,
                           {**DECODER_DROPOUT_SUSPECTS, **DECODER_SUSPECTS}, seed=6),
        cause="call self.dropout exactly once per sublayer (three times in all), on the sublayer's output: "
              "norm(x + self.dropout(sublayer(...))).",
    )


protect(__name__)  # snapshot the tools these checks use (see framework.protect)
