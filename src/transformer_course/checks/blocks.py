"""Stage 3 checks: PositionWiseFeedForward, EncoderBlock and DecoderBlock (post-LN, as in the paper).

Every block check plugs the reference MultiHeadAttention and PositionWiseFeedForward into the
student's block, so only the `forward` written for that block is graded (a feed-forward mistake
costs points once, in the feed-forward checks). Expected values come from the reference blocks
with the same randomised weights, in float64 and eval mode unless a check is about dropout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks.framework import (
    CheckFailed,
    check,
    expect_close,
    expect_shape,
    fail,
    randn,
    reject_builtin_modules,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.checks.localise import (
    Call,
    Step,
    Values,
    copy_by_name,
    explain_dropout,
    first_departure,
    recorded_calls,
    terms,
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


def _student(cls: type[nn.Module], args: tuple, what: str, reference: nn.Module | None,
             sublayers: dict[str, Callable[[], nn.Module]] | None = None) -> nn.Module:
    """Build the student's module and plug in the reference sublayers (found by their given names);
    copy the reference weights by name only when a `reference` is given (checks that compare values)."""
    with _private_random_state(), student_code():
        module = cls(*args)
    reject_builtin_modules(module, what)
    with _private_random_state():
        for name, make in (sublayers or {}).items():
            if isinstance(getattr(module, name, None), nn.Module):
                setattr(module, name, make())
    module = module.double()
    if reference is not None:
        copy_by_name(reference, module, what)
    return module


BLOCK_PARTS = ("self_attn", "cross_attn", "feed_forward", "norm1", "norm2", "norm3", "dropout")


@dataclass
class _Trace:
    """One run of the student's module: what it returned, the calls of its parts, the inputs it got."""

    output: Any
    calls: list[Call]
    inputs: tuple
    train: bool = False


def _traced(module: nn.Module, inputs: tuple, *, seed: int | None = None, parts: Sequence[str] = BLOCK_PARTS,
            what: str = "", explain: Callable[[_Trace], str | None] | None = None) -> _Trace:
    """Run the student's module on copies of the inputs (an in-place `+=` must not spoil them), recording
    every call of its parts. A crash is explained by `explain(trace)` when it can name the place."""
    trace = _Trace(None, [], tuple(t.clone() if isinstance(t, Tensor) else t for t in inputs), module.training)
    try:
        with _private_random_state(seed), torch.no_grad(), student_code(), \
                recorded_calls(module, parts) as calls:
            trace.calls = calls
            trace.output = module(*trace.inputs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as error:
        cause = explain(trace) if explain else None
        if cause is None:
            raise
        fail(f"{what} crashed.", expected=f"{what} to run on these inputs",
             got=f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}", cause=cause)
    return trace


def _run(module: nn.Module, *inputs: Tensor | None, seed: int | None = None) -> Any:
    return _traced(module, inputs, seed=seed, parts=()).output


def _deterministic(first: Any, second: Any, what: str) -> None:
    """Two eval-mode outputs of the same input must agree: dropout is off in eval mode."""
    if isinstance(first, Tensor) and isinstance(second, Tensor) and first.shape == second.shape \
            and not tensors_close(first, second, 1e-12, 0.0):
        fail(
            f"in eval mode two calls of {what} gave different outputs.",
            expected="a deterministic output: dropout does nothing in eval mode",
            got="outputs that change from call to call",
            cause="something random runs in eval mode: dropout written as F.dropout(..., training=True) (its "
                  "default) or torch.bernoulli keeps dropping. Use an nn.Dropout module such as self.dropout, "
                  "which switches itself off in eval mode.",
        )


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
#
# No names are needed here: the two linear layers are found by their sizes (d_model -> d_ff widens,
# d_ff -> d_model narrows; in the order they were created when the two sizes are equal).


def _linear_layers(module: nn.Module, d_model: int, d_ff: int) -> tuple[str, str]:
    linears = [(name, child) for name, child in module.named_modules() if isinstance(child, nn.Linear)]
    widen = [name for name, child in linears if (child.in_features, child.out_features) == (d_model, d_ff)]
    narrow = [name for name, child in linears if (child.in_features, child.out_features) == (d_ff, d_model)]
    if len(linears) != 2 or not widen or not narrow or any(child.bias is None for _, child in linears):
        fail("PositionWiseFeedForward does not have the two linear layers this check copies weights into.",
             expected=f"two nn.Linear layers with biases: d_model -> d_ff ({d_model} -> {d_ff}) and d_ff -> d_model "
                      "(any names; the given constructor calls them fc1 and fc2)",
             got=", ".join(f"{name}: {child.in_features} -> {child.out_features}"
                           + ("" if child.bias is not None else " without bias") for name, child in linears)
             or "no nn.Linear layer",
             cause="keep the given constructor: fc1 = nn.Linear(d_model, d_ff), fc2 = nn.Linear(d_ff, d_model).")
    if d_model == d_ff:
        return linears[0][0], linears[1][0]
    return widen[0], narrow[0]


def _feed_forward_pair(PositionWiseFeedForward: type[nn.Module], d_model: int, d_ff: int,
                       seed: int = 10) -> tuple[nn.Module, nn.Module, tuple[str, str]]:
    reference = _reference(ReferenceFeedForward, d_model, d_ff, seed=seed)
    module = _student(PositionWiseFeedForward, (d_model, d_ff), "PositionWiseFeedForward", None)
    layers = _linear_layers(module, d_model, d_ff)
    named = dict(module.named_modules())
    with torch.no_grad():
        for name, source in zip(layers, (reference.fc1, reference.fc2), strict=True):
            named[name].weight.copy_(source.weight)
            named[name].bias.copy_(source.bias)
    return reference, module, layers


def _feed_forward_run(module: nn.Module, x: Tensor, layers: tuple[str, str]) -> Any:
    """Run the student's network twice in eval mode (it must be deterministic); explain a crash by the
    order in which its two linear layers were called."""
    first, second = layers

    def explain(trace: _Trace) -> str | None:
        called = [call.name for call in trace.calls]
        if called[:1] == [second]:
            return (f"{second} (d_ff -> d_model) is applied before {first} (d_model -> d_ff): the network first "
                    f"widens each position with {first}, then the ReLU, then {second} brings it back to d_model.")
        return None

    module.eval()
    runs = [_traced(module, (x,), seed=seed, parts=layers, what="PositionWiseFeedForward", explain=explain).output
            for seed in (7, 8)]
    _deterministic(*runs, "PositionWiseFeedForward")
    return runs[0]


@check("PositionWiseFeedForward keeps the shape (batch, seq_len, d_model)")
def feed_forward_shape(PositionWiseFeedForward: type[nn.Module], d_model: int = 16, d_ff: int = 64,
                       batch: int = 2, seq_len: int = 5) -> None:
    _, module, layers = _feed_forward_pair(PositionWiseFeedForward, d_model, d_ff)
    got = _feed_forward_run(module, randn(batch, seq_len, d_model, seed=11), layers)
    expect_shape("PositionWiseFeedForward(x)", got, (batch, seq_len, d_model),
                 cause="fc1 widens each position to d_ff, fc2 brings it back to d_model: "
                       "return fc2's output.")


@check("PositionWiseFeedForward computes max(0, x W1 + b1) W2 + b2")
def feed_forward_values(PositionWiseFeedForward: type[nn.Module], d_model: int = 16, d_ff: int = 64,
                        batch: int = 3, seq_len: int = 7) -> None:
    reference, module, layers = _feed_forward_pair(PositionWiseFeedForward, d_model, d_ff)
    x = randn(batch, seq_len, d_model, seed=12)
    got = _feed_forward_run(module, x, layers)
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


# --- tracing a block: where it departs from the paper's computation ------------------------------------------
#
# The reference sublayers plugged into the student's block are recorded call by call (their arguments
# and outputs), then replayed against the intended computation: for each sublayer in turn,
# x = norm_i(x + dropout(sublayer_i(...))). The first argument that is not what it should be is named.

ENCODER_PLAN = (("self_attn", {"q": "stream", "k": "stream", "v": "stream", "mask": "mask"}),
                ("feed_forward", {"x": "stream"}))
DECODER_PLAN = (("self_attn", {"q": "stream", "k": "stream", "v": "stream", "mask": "dec_mask"}),
                ("cross_attn", {"q": "stream", "k": "enc_out", "v": "enc_out", "mask": "enc_mask"}),
                ("feed_forward", {"x": "stream"}))


def _plan(kind: str) -> tuple:
    return ENCODER_PLAN if kind == "encoder" else DECODER_PLAN


def _block_steps(kind: str, train: bool) -> tuple[list[Step], str]:
    """The intended calls of a post-LN block; with `train`, the dropout calls too (in eval mode dropout is
    the identity, so whether and where it is called cannot be seen)."""
    steps, stream = [], "x"
    for index, (name, arguments) in enumerate(_plan(kind), start=1):
        steps.append(Step(name, {argument: terms(stream if key == "stream" else key)
                                 for argument, key in arguments.items()}, name))
        added = name
        if train:
            added = f"dropout{index}"
            steps.append(Step("dropout", {"input": terms(name)}, added, words=f"dropout({name}'s output)"))
        steps.append(Step(f"norm{index}", {"input": terms(stream, added)}, f"norm{index}"))
        stream = f"norm{index}"
    return steps, stream


def _block_values(kind: str, inputs: tuple) -> Values:
    values = Values()
    values.add("x", "the block's input x", inputs[0])
    if kind == "encoder":
        values.add("mask", "mask", inputs[1], mask=True)
    else:
        values.add("enc_out", "enc_out", inputs[1])
        values.add("enc_mask", "enc_mask", inputs[2], mask=True)
        values.add("dec_mask", "dec_mask", inputs[3], mask=True)
    return values


def _departure(trace: _Trace, kind: str, train: bool, complete: bool = True) -> str | None:
    """The first place the student's block departs from the intended computation, in words."""
    sublayers = [name for name, _ in _plan(kind)]
    values = _block_values(kind, trace.inputs)
    if train and complete:
        dropout = explain_dropout(trace.calls, sublayers, values)
        if dropout is not None:
            return dropout[1]
    steps, last = _block_steps(kind, train)
    norms = [f"norm{index}" for index in range(1, len(sublayers) + 1)]
    return first_departure(trace.calls, steps, values, where=f"{kind.capitalize()}Block.forward",
                           result=trace.output, result_key=last if complete else None,
                           ordered=[sublayers, norms], complete=complete)


def _run_block(block: nn.Module, inputs: tuple, kind: str, seed: int | None = None) -> _Trace:
    """Run the student's block: in eval mode twice (the outputs must agree), in train mode once with `seed`.
    A crash is explained by the first departure before it (and, for the decoder, by the lengths involved)."""
    what = f"{kind.capitalize()}Block"

    def explain(trace: _Trace) -> str | None:
        return (_crash_cause(trace.calls, inputs) if kind == "decoder" else None) or _departure(
            trace, kind, block.training, complete=False)

    if block.training:
        return _traced(block, inputs, seed=seed, what=what, explain=explain)
    first = _traced(block, inputs, seed=7, what=what, explain=explain)
    _deterministic(first.output, _traced(block, inputs, seed=8, what=what).output, what)
    return first


def _expect_block(what: str, trace: _Trace, expected: Tensor, kind: str, *, suspects: dict[str, Callable[[], Tensor]],
                  cause: str, atol: float = 1e-8, rtol: float = 1e-6) -> None:
    """expect_close, with the first departure of the traced run as the cause when no known mistake fits."""
    got = trace.output
    if isinstance(got, Tensor) and got.shape == expected.shape and not tensors_close(got, expected, atol, rtol):
        cause = _departure(trace, kind, train=trace.train) or cause
    expect_close(what, got, expected, atol=atol, rtol=rtol, suspects=suspects, cause=cause)


# --- EncoderBlock -----------------------------------------------------------------------------------------
#
# Checks that compare values copy the reference weights into the block by name (self_attn.*,
# feed_forward.*, norm1, norm2: the given constructor's names); the shape and padding checks need no names.


def _encoder_block(EncoderBlock: type[nn.Module], d_model: int, num_heads: int, d_ff: int,
                   dropout: float = 0.1, seed: int = 20, copy: bool = True) -> tuple[nn.Module | None, nn.Module]:
    reference = _reference(ReferenceEncoderBlock, d_model, num_heads, d_ff, dropout, seed=seed) if copy else None
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
    _, block = _encoder_block(EncoderBlock, d_model, num_heads, d_ff, copy=False)
    trace = _run_block(block.eval(), _encoder_inputs(batch, seq_len, d_model), "encoder")
    expect_shape("EncoderBlock(x, mask)", trace.output, (batch, seq_len, d_model),
                 cause="both sublayers map (batch, src_len, d_model) to the same shape; return the output "
                       "of the second LayerNorm.")


@check("EncoderBlock computes norm2(h + FFN(h)) with h = norm1(x + SelfAttention(x)), as in the paper")
def encoder_values(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                   batch: int = 3, seq_len: int = 6, int_mask: bool = False) -> None:
    reference, block = _encoder_block(EncoderBlock, d_model, num_heads, d_ff)
    inputs = _encoder_inputs(batch, seq_len, d_model, int_mask)
    trace = _run_block(block.eval(), inputs, "encoder")
    reference.eval()
    _expect_block(
        "EncoderBlock(x, mask)", trace, _expected(reference, *inputs), "encoder",
        suspects=_suspects(_encoder_variant, reference, inputs, ENCODER_SUSPECTS),
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
    reference, block = _encoder_block(EncoderBlock, d_model, num_heads, d_ff)
    inputs = _encoder_inputs(batch, seq_len, d_model)
    x, mask = inputs
    with _private_random_state():
        layer = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, 0.1, batch_first=True).double().eval()
    _load_attention(layer.self_attn, reference.self_attn)
    _load_common(layer, reference, ("norm1", "norm2"))
    padding = ~mask[:, 0, 0, :].bool()  # (batch, seq_len), True at padding: the built-in's convention
    expected = layer(x, src_key_padding_mask=padding).detach()  # grad enabled keeps the plain code path
    trace = _run_block(block.eval(), inputs, "encoder")
    reference.eval()
    _expect_block(
        "EncoderBlock(x, mask)", trace, expected, "encoder", atol=1e-7,
        suspects=_suspects(_encoder_variant, reference, inputs, ENCODER_SUSPECTS),
        cause="PyTorch's layer (norm_first=False, ReLU) is the paper's post-LN block: "
              "norm1(x + dropout(self_attn(x))), then norm2(x + dropout(feed_forward(x))).",
    )


@check("EncoderBlock: extra padding tokens change no real position's output")
def encoder_padding_invariance(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                               d_ff: int = 32, batch: int = 3, seq_len: int = 6, extra: int = 3) -> None:
    _, block = _encoder_block(EncoderBlock, d_model, num_heads, d_ff, copy=False)
    block.eval()
    lengths = _lengths(batch, seq_len)
    x = randn(batch, seq_len, d_model, seed=22)
    longer = torch.cat([x, 5.0 * randn(batch, extra, d_model, seed=23)], dim=1)  # loud padding vectors
    short = _run_block(block, (x, _padding_mask(lengths, seq_len)), "encoder").output
    long = _run_block(block, (longer, _padding_mask(lengths, seq_len + extra)), "encoder").output
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


def _dropout_modes(make: Callable[[float], nn.Module], inputs: tuple, kind: str, what: str) -> None:
    """Train mode: two calls differ. Eval mode: two calls agree and equal the student's own block built
    with dropout=0 and the same weights (so only dropout is judged here, not the rest of the block)."""
    block = _randomise(make(0.5), seed=20)
    still = make(0.0)
    still.load_state_dict(block.state_dict())
    block.train()
    trace = _run_block(block, inputs, kind, seed=1)
    first, second = trace.output, _run_block(block, inputs, kind, seed=2).output
    expect_shape(what, first, tuple(inputs[0].shape), cause="return a tensor shaped like x.")
    if tensors_close(first, second, 1e-12, 0.0):
        fail(
            "in train mode two calls gave exactly the same output.",
            expected="different outputs: dropout (p=0.5) zeroes different elements on every call",
            got="identical outputs",
            cause=_departure(trace, kind, train=True)
            or "apply self.dropout to the output of each sublayer, before adding the residual.",
        )
    got = _run_block(block.eval(), inputs, kind).output
    expect_close(f"{what} in eval mode", got, _run_block(still.eval(), inputs, kind).output, atol=1e-10, rtol=1e-8,
                 cause="in eval mode the block must equal the same block built with dropout=0: something still "
                       "depends on the dropout rate (F.dropout(..., training=True), or scaling by 1 - p by hand).")


def _dropout_placement(block: nn.Module, reference: nn.Module, inputs: tuple, kind: str, what: str,
                       suspects: dict[str, Callable[[], Tensor]], cause: str, seed: int) -> None:
    """Where dropout acts. When the block computes the right values in eval mode, its train-mode output must
    equal the reference's with the same random draws; when it does not (a mistake the value checks grade),
    only its calls of self.dropout are judged: once on each sublayer's output, feeding the residual sum."""
    structure = _run_block(block.eval(), inputs, kind).output
    structure_right = isinstance(structure, Tensor) and structure.shape == inputs[0].shape and tensors_close(
        structure, _expected(reference.eval(), *inputs), 1e-8, 1e-6)
    trace = _run_block(block.train(), inputs, kind, seed=seed)
    if structure_right or not any(call.name == "dropout" for call in trace.calls):
        reference.train()  # the same random seed gives the same dropout masks, call by call
        _expect_block(what, trace, _expected(reference, *inputs, seed=seed), kind, suspects=suspects, cause=cause)
        return
    problem = explain_dropout(trace.calls, [name for name, _ in _plan(kind)], _block_values(kind, trace.inputs))
    if problem is not None:
        fail(f"{what}: self.dropout is not where the paper puts it.",
             expected="self.dropout once on each sublayer's output", got=problem[0], cause=problem[1])


@check("EncoderBlock: dropout is active in train mode and switched off in eval mode")
def encoder_dropout_modes(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 2, seq_len: int = 6) -> None:
    _dropout_modes(lambda p: _encoder_block(EncoderBlock, d_model, num_heads, d_ff, dropout=p, copy=False)[1],
                   _encoder_inputs(batch, seq_len, d_model), "encoder", "EncoderBlock(x, mask)")


@check("EncoderBlock: dropout acts on each sublayer's output, before the residual addition")
def encoder_dropout_placement(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                              d_ff: int = 32, batch: int = 2, seq_len: int = 6) -> None:
    reference, block = _encoder_block(EncoderBlock, d_model, num_heads, d_ff, dropout=0.3)
    inputs = _encoder_inputs(batch, seq_len, d_model)
    _dropout_placement(block, reference, inputs, "encoder", "EncoderBlock(x, mask) in train mode",
                       _suspects(_encoder_variant, reference, inputs,
                                 {**ENCODER_DROPOUT_SUSPECTS, **ENCODER_SUSPECTS}, seed=5),
                       cause="call self.dropout exactly once per sublayer, on the sublayer's output: "
                             "norm(x + self.dropout(sublayer(x))) (the paper, section 5.4).", seed=5)


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


def _decoder_block(DecoderBlock: type[nn.Module], d_model: int, num_heads: int, d_ff: int,
                   dropout: float = 0.1, seed: int = 30, copy: bool = True) -> tuple[nn.Module | None, nn.Module]:
    reference = _reference(ReferenceDecoderBlock, d_model, num_heads, d_ff, dropout, seed=seed) if copy else None
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


def _crash_cause(calls: list[Call], inputs: tuple) -> str | None:
    """Name the mistake behind a crash from the last attention call before it (tgt_len != src_len)."""
    attention = [call for call in calls if call.name in ("self_attn", "cross_attn")]
    tgt_len, src_len = inputs[0].size(1), inputs[1].size(1)
    if not attention or tgt_len == src_len:
        return None
    name, arguments = attention[-1].name, attention[-1].args

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


@check("DecoderBlock keeps the shape (batch, tgt_len, d_model), also when src_len differs from tgt_len")
def decoder_shape(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                  batch: int = 2, tgt_len: int = 5, src_len: int = 8) -> None:
    _, block = _decoder_block(DecoderBlock, d_model, num_heads, d_ff, copy=False)
    trace = _run_block(block.eval(), _decoder_inputs(batch, tgt_len, src_len, d_model), "decoder")
    expect_shape("DecoderBlock(x, enc_out, enc_mask, dec_mask)", trace.output, (batch, tgt_len, d_model),
                 cause="every sublayer keeps the decoder's shape (batch, tgt_len, d_model); "
                       "cross-attention's query is the decoder's x.")


@check("DecoderBlock: masked self-attention, cross-attention on enc_out, feed-forward, each post-LN")
def decoder_values(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                   batch: int = 3, tgt_len: int = 6, src_len: int = 6, int_mask: bool = False) -> None:
    reference, block = _decoder_block(DecoderBlock, d_model, num_heads, d_ff)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model, int_mask)
    trace = _run_block(block.eval(), inputs, "decoder")
    reference.eval()
    _expect_block(
        "DecoderBlock(x, enc_out, enc_mask, dec_mask)", trace, _expected(reference, *inputs), "decoder",
        suspects=_suspects(_decoder_variant, reference, inputs, DECODER_SUSPECTS),
        cause="three sublayers, each x = norm(x + self.dropout(sublayer)): self_attn(x, x, x, dec_mask) with "
              "norm1, cross_attn(x, enc_out, enc_out, enc_mask) with norm2, feed_forward(x) with norm3.",
    )


@check("DecoderBlock gives the same output as torch.nn.TransformerDecoderLayer with the same weights")
def decoder_matches_torch(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 3, tgt_len: int = 6, src_len: int = 6) -> None:
    reference, block = _decoder_block(DecoderBlock, d_model, num_heads, d_ff)
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
    trace = _run_block(block.eval(), inputs, "decoder")
    reference.eval()
    _expect_block(
        "DecoderBlock(x, enc_out, enc_mask, dec_mask)", trace, expected, "decoder", atol=1e-7,
        suspects=_suspects(_decoder_variant, reference, inputs, DECODER_SUSPECTS),
        cause="PyTorch's layer (norm_first=False, ReLU) is the paper's post-LN decoder block: self-attention "
              "(dec_mask), cross-attention on enc_out (enc_mask), feed-forward, each norm(x + dropout(...)).",
    )


@check("DecoderBlock is causal: changing positions after t never changes the outputs up to t")
def decoder_causality(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                      batch: int = 2, tgt_len: int = 6, src_len: int = 7) -> None:
    _, block = _decoder_block(DecoderBlock, d_model, num_heads, d_ff, copy=False)
    block.eval()
    x, enc_out, enc_mask, dec_mask = _decoder_inputs(batch, tgt_len, src_len, d_model, target_padding=False)
    base = _run_block(block, (x, enc_out, enc_mask, dec_mask), "decoder").output
    expect_shape("DecoderBlock(x, enc_out, enc_mask, dec_mask)", base, (batch, tgt_len, d_model),
                 cause="return a tensor shaped like x.")
    for t in range(tgt_len - 1):
        changed = x.clone()
        changed[:, t + 1:] = randn(batch, tgt_len - t - 1, d_model, seed=40 + t)  # new "future" tokens
        out = _run_block(block, (changed, enc_out, enc_mask, dec_mask), "decoder").output
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
    _dropout_modes(lambda p: _decoder_block(DecoderBlock, d_model, num_heads, d_ff, dropout=p, copy=False)[1],
                   _decoder_inputs(batch, tgt_len, src_len, d_model), "decoder",
                   "DecoderBlock(x, enc_out, enc_mask, dec_mask)")


@check("DecoderBlock: dropout acts on each sublayer's output, before the residual addition")
def decoder_dropout_placement(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                              d_ff: int = 32, batch: int = 2, tgt_len: int = 6, src_len: int = 6) -> None:
    reference, block = _decoder_block(DecoderBlock, d_model, num_heads, d_ff, dropout=0.3)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model)
    _dropout_placement(block, reference, inputs, "decoder", "DecoderBlock(...) in train mode",
                       _suspects(_decoder_variant, reference, inputs,
                                 {**DECODER_DROPOUT_SUSPECTS, **DECODER_SUSPECTS}, seed=6),
                       cause="call self.dropout exactly once per sublayer (three times in all), on the sublayer's "
                             "output: norm(x + self.dropout(sublayer(...))).", seed=6)
