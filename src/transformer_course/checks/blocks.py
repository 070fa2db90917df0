"""Stage 3 checks: PositionWiseFeedForward, EncoderBlock and DecoderBlock (post-LN, as in the paper), and
PreLNEncoderBlock (the pre-LN arrangement, checked by its properties: the stream passes the block untouched when
the sublayers are silent, and PyTorch's own pre-LN layer, `norm_first=True`, computes the same values).

Every block check plugs the reference MultiHeadAttention and PositionWiseFeedForward into the student's
block, so only the `forward` written for that block is graded (a feed-forward mistake costs points once, in
the feed-forward checks). The parts are found by role (`parts.pair`: the given names, else by kind in the
constructor's order), and dropout by what it does, whatever it is called. Expected values come from the
reference blocks with the same random weights (LayerNorm gains and biases included, so norm1, norm2 and norm3
differ), in float64 and eval mode unless a check is about dropout.

Building, running and recording the student's block are experiments (`boundary.on_student_side`); the
comparisons and the messages are made here. When a value differs, the recorded calls of the block's parts are
replayed along the paper's computation (`parts.Replay`) to name the first place the student's `forward`
departs, with the student's line; the differential engine speaks when that replay finds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks import differential, parts
from transformer_course.checks.boundary import on_student_side, supplied
from transformer_course.checks.framework import (
    REFERENCE_VALUES,
    Diagnosis,
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
from transformer_course.checks.predictions import expect_number, parameters_of
from transformer_course.reference import DecoderBlock as ReferenceDecoderBlock
from transformer_course.reference import EncoderBlock as ReferenceEncoderBlock
from transformer_course.reference import PositionWiseFeedForward as ReferenceFeedForward
from transformer_course.reference import PreLNEncoderBlock as ReferencePreLNEncoderBlock
from transformer_course.reference import make_look_ahead_mask

# the parts of PyTorch this stage's grade cells meet, used once before any notebook code (runner.warm_up_torch):
# tests/test_grading_speed.py fails when a grade cell imports a module
WARM_UP: tuple[str, ...] = ()

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
    "predicted_decoder_parameters",
    "predicted_encoder_parameters",
    "predicted_feed_forward_share",
    "pre_ln_dropout_placement",
    "pre_ln_matches_torch",
    "pre_ln_shape",
    "pre_ln_stream",
    "summary",
]

Tensor = torch.Tensor
AXES = ("batch", "position", "feature")


def _randomise(module: nn.Module, seed: int) -> nn.Module:
    """Reproducible random values for every parameter, LayerNorm gains and biases included (with the default
    gain 1 and bias 0 every LayerNorm is the same, and a block that used norm1 twice would look right)."""
    with torch.no_grad():
        for index, (name, parameter) in enumerate(sorted(module.named_parameters())):
            noise = randn(*parameter.shape, seed=seed + index)
            if parameter.dim() > 1:
                parameter.copy_(noise / math.sqrt(parameter.shape[1]))  # keeps activations of order 1
            elif "norm" in name and name.endswith("weight"):
                parameter.copy_(1.0 + 0.3 * noise)
            else:
                parameter.copy_(0.3 * noise)
    return module


def _reference(cls: type[nn.Module], *args: Any, seed: int) -> nn.Module:
    with parts.seeded():
        module = cls(*args)
    return _randomise(module.double(), seed).eval()


def _deterministic(run: parts.Run, what: str) -> Any:
    """Two eval-mode outputs of the same input must agree: dropout is off in eval mode."""
    first, second = run.outputs[0], run.outputs[-1]
    if isinstance(first, Tensor) and isinstance(second, Tensor) and first.shape == second.shape \
            and not tensors_close(first, second, 1e-12, 0.0):
        fail(f"in eval mode two calls of {what} gave different outputs.",
             expected="a deterministic output: dropout does nothing in eval mode",
             got="outputs that change from call to call",
             cause="something random still runs in eval mode: a dropout that is told it is training, or drawn by "
                   "hand, keeps dropping, while a dropout module switches itself off in eval mode. Use an nn.Dropout "
                   "module such as self.dropout (F.dropout(..., training=True) and torch.bernoulli keep dropping).")
    return first


def _padding_mask(lengths: list[int], seq_len: int, int_mask: bool = False) -> Tensor:
    """(batch, 1, 1, seq_len): True (or 1) at the first `length` positions of each row."""
    mask = (torch.arange(seq_len).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).unsqueeze(1).unsqueeze(2)
    return mask.int() if int_mask else mask


def _lengths(batch: int, seq_len: int) -> list[int]:
    """Sequence lengths with padding in most rows: seq_len, seq_len - 2, seq_len - 1, ..."""
    return [max(1, seq_len - (2 * index) % 3) if index else seq_len for index in range(batch)]


def _engine(module: Any, reference: nn.Module, inputs: tuple, names: tuple[str, ...], got: Tensor,
            expected: Tensor, sizes: Mapping[str, int]) -> Callable[[], Any]:
    """The differential engine's reading, when it is asked for: the student's and the reference's forward
    recorded operation by operation, axes told apart by their sizes, d_model a known factor."""
    context = differential.Context(sizes=sizes, quantities={"d_model": inputs[0].size(-1)},
                                   words={f"input:{names[0]}": f"the input {names[0]}"})
    return lambda: parts.engine(module, reference, inputs, names, got, expected, context, AXES)


# --- PositionWiseFeedForward ------------------------------------------------------------------------
#
# No names are needed here: the two linear layers are found by their sizes (d_model -> d_ff widens,
# d_ff -> d_model narrows; in the order they were created when the two sizes are equal).


@on_student_side
def _feed_forward(PositionWiseFeedForward: type[nn.Module], d_model: int, d_ff: int,
                  state: dict[str, Tensor]) -> tuple[nn.Module, dict[str, str]]:
    """The student's network with the reference weights in its two linear layers; their paths by role."""
    with parts.seeded(), student_code():
        module = PositionWiseFeedForward(d_model, d_ff)
    reject_builtin_modules(module, "PositionWiseFeedForward")
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
    first, second = (linears[0][0], linears[1][0]) if d_model == d_ff else (widen[0], narrow[0])
    module.double()  # before the weights are copied, so that they keep every digit
    named = dict(module.named_modules())
    with torch.no_grad():
        for path, role in ((first, "fc1"), (second, "fc2")):
            named[path].weight.copy_(state[f"{role}.weight"])
            named[path].bias.copy_(state[f"{role}.bias"])
    return module.eval(), {first: "fc1", second: "fc2"}


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "the identity (no activation)": lambda z: z, "GELU": F.gelu, "a sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "SiLU": F.silu, "a leaky ReLU": F.leaky_relu,
}


def _activation(before: Tensor, after: Any) -> str | None:
    """Which elementwise function turns `before` into `after`: 'the ReLU', another named one, or None."""
    for name, function in {"the ReLU": F.relu, **ACTIVATIONS}.items():
        if parts._close(after, function(before)):
            return name
    return None


def _feed_forward_reading(calls: list[parts.Call], output: Any, roles: dict[str, str]) -> str | None:
    """What the network does with its two layers, read from the values they received and returned."""
    paths = {role: path for path, role in roles.items()}
    fc1, fc2 = (parts.words(paths[role]) for role in ("fc1", "fc2"))
    first = next((call for call in calls if call.role == "fc1" and call.returned), None)
    second = next((call for call in calls if call.role == "fc2" and call.returned), None)
    if calls and calls[0].role == "fc2":
        return (f"{fc2} (d_ff -> d_model) is applied before {fc1} (d_model -> d_ff): the network first widens "
                f"each position with {fc1}, then the ReLU, then {fc2} brings it back to d_model.")
    if first is None or second is None:
        return None
    hidden = _activation(first.output, second.args.get("input"))
    after = _activation(second.output, output)
    line = parts.at(second.line)
    if hidden == "the ReLU" and after not in (None, "the identity (no activation)"):
        return (f"{line}the output goes through {after} as well: only the hidden layer goes through the ReLU; "
                f"the network's output must be allowed to be negative, so return what {fc2} gives.")
    if hidden == "the identity (no activation)" and after == "the ReLU":
        return (f"{line}the ReLU is applied after {fc2} instead of between the two layers: {fc2} must receive "
                f"torch.relu({fc1}(x)).")
    if hidden == "the identity (no activation)":
        return (f"{line}there is no ReLU between the two layers: {fc2} receives the output of {fc1} unchanged "
                f"(two linear layers in a row are one linear layer); compute {fc2}(torch.relu({fc1}(x))).")
    if hidden is not None and hidden != "the ReLU":
        return (f"{line}the hidden layer goes through {hidden} where the paper applies the ReLU; "
                f"{fc2} must receive torch.relu({fc1}(x)).")
    return None


def _run_feed_forward(PositionWiseFeedForward: type[nn.Module], d_model: int, d_ff: int,
                      x: Tensor) -> tuple[parts.Run, nn.Module, Any, dict[str, str]]:
    reference = _reference(ReferenceFeedForward, d_model, d_ff, seed=10)
    module, roles = _feed_forward(PositionWiseFeedForward, d_model, d_ff, reference.state_dict())
    run = parts.observe(module, (x,), "PositionWiseFeedForward", roles,
                   lambda calls: _feed_forward_reading(calls, None, roles))
    _deterministic(run, "PositionWiseFeedForward")
    return run, reference, module, roles


@check("PositionWiseFeedForward keeps the shape (batch, seq_len, d_model)")
def feed_forward_shape(PositionWiseFeedForward: type[nn.Module], d_model: int = 16, d_ff: int = 64,
                       batch: int = 2, seq_len: int = 5) -> None:
    run, *_ = _run_feed_forward(PositionWiseFeedForward, d_model, d_ff, randn(batch, seq_len, d_model, seed=11))
    cause = "fc1 widens each position to d_ff, fc2 brings it back to d_model: return fc2's output."
    out = run.outputs[0]
    if isinstance(out, Tensor) and d_ff != d_model and tuple(out.shape) == (batch, seq_len, d_ff):
        # the hidden layer returned: say so, not only the generic "times the expected" of a multiple
        fail("PositionWiseFeedForward(x) has the wrong shape.", expected=(batch, seq_len, d_model),
             got=f"{(batch, seq_len, d_ff)}: every position has d_ff = {d_ff} features, the width of the hidden "
                 f"layer, where d_model = {d_model} is expected",
             cause="the output is the hidden layer: " + cause)
    expect_shape("PositionWiseFeedForward(x)", out, (batch, seq_len, d_model), cause=cause)


@check("PositionWiseFeedForward computes max(0, x W1 + b1) W2 + b2")
def feed_forward_values(PositionWiseFeedForward: type[nn.Module], d_model: int = 16, d_ff: int = 64,
                        batch: int = 3, seq_len: int = 7) -> None:
    x = randn(batch, seq_len, d_model, seed=12)
    run, reference, module, roles = _run_feed_forward(PositionWiseFeedForward, d_model, d_ff, x)
    with torch.no_grad():
        expected = reference(x)

    def diagnose(got: Tensor) -> Diagnosis | None:
        return parts.diagnosis(_feed_forward_reading(run.calls, got, roles), got, expected, _engine(
            module, reference, (x,), ("x",), got, expected,
            {"batch": batch, "position": seq_len, "d_model": d_model, "d_ff": d_ff}), AXES)

    expect_close("PositionWiseFeedForward(x)", run.outputs[0], expected, atol=1e-8, rtol=1e-6, diagnose=diagnose,
                 axes=AXES, cause="return self.fc2(self.relu(self.fc1(x))), the formula max(0, x W1 + b1) W2 + b2.")


# --- the blocks: building them with reference parts -----------------------------------------------------------

BLOCKS = {"encoder": ReferenceEncoderBlock, "decoder": ReferenceDecoderBlock, "pre_ln": ReferencePreLNEncoderBlock}
NAMES = {"encoder": "EncoderBlock", "decoder": "DecoderBlock", "pre_ln": "PreLNEncoderBlock"}
SUBLAYERS = {"encoder": ("self_attn", "feed_forward"), "decoder": ("self_attn", "cross_attn", "feed_forward"),
             "pre_ln": ("self_attn", "feed_forward")}
ENCODER_LIKE = ("encoder", "pre_ln")  # the blocks with the encoder's inputs, (x, mask)
PLUGGED = ("self_attn", "cross_attn", "feed_forward")  # replaced by the reference's modules
PART_WORDS = {"self_attn": "self-attention (a MultiHeadAttention)", "cross_attn": "cross-attention (a second "
              "MultiHeadAttention)", "feed_forward": "the feed-forward network", "norm1": "the first LayerNorm",
              "norm2": "the second LayerNorm", "norm3": "the third LayerNorm"}


def _feed_forward_stand_in(self: nn.Module, x: Tensor) -> Tensor:
    """The reference PositionWiseFeedForward's values, fc2(relu(fc1(x))), as `F.linear` calls on the module's own
    weights (tests/test_grading_build.py: equal to the reference's). x (batch, seq_len, d_model) -> the same."""
    hidden = F.linear(x, self.fc1.weight, self.fc1.bias).clamp_min(0)  # (batch, seq_len, d_ff)
    return F.linear(hidden, self.fc2.weight, self.fc2.bias)


@on_student_side
def _block(Block: type[nn.Module], kind: str, args: tuple, state: dict[str, Tensor] | None,
           seed: int = 0) -> tuple[nn.Module, dict[str, str]]:
    """The student's block with the reference attention and feed-forward network plugged in where it keeps
    them, and, with `state`, the reference's weights in its LayerNorms; float64, eval mode. Returns the block
    and the student's path for every role ('self_attn' -> 'self_attn', or the name it uses)."""
    what = NAMES[kind]
    with parts.seeded(seed), student_code():
        block = Block(*args)
    reject_builtin_modules(block, what)
    block.double()  # before the weights are copied, so that they keep every digit
    with parts.seeded(seed):
        template = BLOCKS[kind](*args).double()
    if state is not None:
        template.load_state_dict(state)
    # the reference feed-forward network's values without its forward (not in stage 3's grading build)
    template.feed_forward.forward = MethodType(_feed_forward_stand_in, template.feed_forward)
    paths = parts.pair(template, block)
    missing = [role for role in paths if not paths[role] and role != "dropout"]
    if missing:
        given = ", ".join(f"self.{role}" for role in PART_WORDS if role in paths)
        fail(f"{what} has no part for {PART_WORDS.get(missing[0], missing[0])}.",
             expected=f"the parts of the given constructor: {given}",
             got=f"the parts {', '.join(f'self.{path}' for path, _ in parts.candidates(block)) or 'none'}",
             cause="keep the given constructor: the checks plug the reference attention and feed-forward network "
                   "into your block and give its LayerNorms the reference's weights, so that only your forward is "
                   "graded.")
    for role, path in paths.items():
        if role in PLUGGED:
            parts.put(block, path, getattr(template, role))
        elif state is not None and role.startswith("norm"):
            parts.load(parts.locate(block, path), getattr(template, role), f"{what}.{path}")
    supplied(template)
    return block.double().eval(), {role: path for role, path in paths.items() if path} | parts.extras(block, paths)


def _encoder_inputs(batch: int, seq_len: int, d_model: int, int_mask: bool = False,
                    seed: int = 21) -> tuple[Tensor, Tensor]:
    mask = _padding_mask(_lengths(batch, seq_len), seq_len, int_mask)  # (batch, 1, 1, seq_len)
    return randn(batch, seq_len, d_model, seed=seed), mask


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


# --- the paper's computation, and where the student's block departs from it ---------------------------------
#
# The reference parts plugged into the student's block are recorded call by call (their arguments, outputs
# and the student's line), then replayed along the paper's computation: for each sublayer in turn,
# x = norm_i(x + dropout(sublayer_i(...))). The first argument that is not what it should be is named.

ARGUMENTS = {"self_attn": {"q": "stream", "k": "stream", "v": "stream", "mask": "self mask"},
             "cross_attn": {"q": "stream", "k": "enc_out", "v": "enc_out", "mask": "enc_mask"},
             "feed_forward": {"x": "stream"}}
INPUT_WORDS = {"x": "the block's input x", "mask": "`mask` (the padding mask)", "enc_out": "`enc_out`",
               "enc_mask": "`enc_mask`", "dec_mask": "`dec_mask`"}


def _steps(kind: str, train: bool) -> tuple[list[parts.Step], str]:
    """The paper's calls of a post-LN block; with `train`, the dropout calls too (in eval mode dropout is the
    identity, so whether and where it is called cannot be seen)."""
    steps, stream = [], "x"
    for index, name in enumerate(SUBLAYERS[kind], start=1):
        keys = {"stream": stream, "self mask": "mask" if kind in ENCODER_LIKE else "dec_mask"}
        steps.append(parts.Step(name, {argument: parts.terms(keys.get(key, key))
                                       for argument, key in ARGUMENTS[name].items()}, name))
        added = name
        if train:
            added = f"dropout{index}"
            steps.append(parts.Step("dropout", {"input": parts.terms(name)}, added, "the dropped-out output"))
        steps.append(parts.Step(f"norm{index}", {"input": parts.terms(stream, added)}, f"norm{index}"))
        stream = f"norm{index}"
    return steps, stream


def _values(kind: str, inputs: tuple) -> parts.Values:
    values = parts.Values()
    names = ("x", "mask") if kind in ENCODER_LIKE else ("x", "enc_out", "enc_mask", "dec_mask")
    for name, value in zip(names, inputs, strict=True):
        values.add(name, INPUT_WORDS[name], value, mask=name.endswith("mask"))
    return values


def _replay(kind: str, calls: list[parts.Call], inputs: tuple, paths: Mapping[str, str],
            train: bool) -> tuple[parts.Replay, str]:
    steps, last = _steps(kind, train)
    return parts.Replay(calls, steps, _values(kind, inputs), paths), last


def _block_reading(kind: str, calls: list[parts.Call], inputs: tuple, paths: Mapping[str, str], result: Any,
                   train: bool = False, complete: bool = True) -> str | None:
    """The first place the student's block departs from the paper's computation, in words, with its line."""
    if kind == "pre_ln":
        return _pre_ln_reading(calls, inputs, paths, result, train, complete)
    replay, last = _replay(kind, calls, inputs, paths, train)
    norms = [f"norm{index}" for index in range(1, len(SUBLAYERS[kind]) + 1)]
    reading = replay.departure(result=result, result_key=last if complete else None,
                               ordered=[SUBLAYERS[kind], norms], complete=complete)
    if reading is None:
        return None
    text = reading.cause()
    pre_ln = _pre_ln(kind, calls, replay)
    if pre_ln:
        return f"{text}; {pre_ln}"
    residual = _residual(kind, reading, calls, replay, result) if reading.kind == "argument" else ""
    return f"{text}; {residual}" if residual else text


def _pre_ln(kind: str, calls: list[parts.Call], replay: parts.Replay) -> str:
    """A LayerNorm whose output feeds a sublayer: the pre-LN order."""
    norms = [call for call in calls if call.role.startswith("norm") and call.returned]
    for call in calls:
        fed = call.args.get("q", call.args.get("x", call.args.get("input"))) if call.role in SUBLAYERS[kind] else None
        norm = next((n for n in norms if parts._close(fed, n.output) and calls.index(n) < calls.index(call)), None)
        if norm is not None and parts._close(norm.args.get("input"), replay.values.tensors["x"]):
            return (f"{replay.part(norm)} normalises the sublayer's input: this is the pre-LN order (x + "
                    "sublayer(LayerNorm(x))); the paper's block (and this exercise) is post-LN, the LayerNorm after "
                    "the residual sum (LayerNorm(x + dropout(sublayer(x))))")
    return ""


def _residual(kind: str, reading: parts.Reading, calls: list[parts.Call], replay: parts.Replay, result: Any) -> str:
    """A LayerNorm that receives its sublayer's output alone: the residual is missing, or (when its output is
    added to x afterwards) the LayerNorm normalises the sublayer's output instead of the sum."""
    if not reading.role.startswith("norm"):
        return ""
    index = int(reading.role[-1])
    sublayer = SUBLAYERS[kind][index - 1]
    stream = replay.values.tensors["x" if index == 1 else f"norm{index - 1}"]
    norm = next(call for call in calls if call.role == reading.role)
    made = next((call for call in calls if call.role == sublayer and call.returned), None)
    if made is None or not parts._close(norm.args.get("input"), made.output):
        return ""
    following = SUBLAYERS[kind][index] if index < len(SUBLAYERS[kind]) else None
    later = next((call for call in calls if call.role == following), None) if following else None
    after = (later.args.get("q", later.args.get("x", later.args.get("input"))) if later else result)
    formula = f"{replay.part(reading.role)}(x + dropout({replay.part(sublayer)}(...)))"
    if isinstance(after, Tensor) and isinstance(stream, Tensor) and norm.returned \
            and parts._close(after, stream.double() + norm.output.double()):
        return f"LayerNorm is applied to the sublayer output only, x + norm(sublayer(x)): normalise the sum, {formula}"
    return (f"the residual connection around {replay.part(sublayer)} is missing: add the sublayer's input back "
            f"before the LayerNorm, {formula}")


DROPOUT_ADVICE = ("the paper (section 5.4) applies dropout to the output of each sublayer, once, before adding it "
                  "to the sublayer's input (norm(x + dropout(sublayer(x))))")
PRE_LN_DROPOUT_ADVICE = ("the pre-LN block keeps the paper's rule (section 5.4): dropout once on the output of each "
                         "sublayer, before it is added to the stream (x + dropout(sublayer(norm(x))))")


def _dropout_advice(kind: str) -> str:
    return PRE_LN_DROPOUT_ADVICE if kind == "pre_ln" else DROPOUT_ADVICE


def _dropout_reading(kind: str, calls: list[parts.Call], inputs: tuple,
                     paths: Mapping[str, str]) -> parts.Reading | None:
    """Where the block's dropouts act, when that is not once on each sublayer's output (None when it is)."""
    words = {role: parts.words(paths[role]) for role in SUBLAYERS[kind] if role in paths}
    values = _values(kind, inputs)
    for call in calls:
        if call.role.startswith("norm") and call.returned:
            values.add(f"after {call.role}", f"the output of {parts.words(call.path)}, after the LayerNorm",
                       call.output)
    return parts.dropout_reading(calls, words, values)


def _crash_reading(kind: str, inputs: tuple, paths: Mapping[str, str]) -> Callable[[list[parts.Call]], str | None]:
    def explain(calls: list[parts.Call]) -> str | None:
        return _block_reading(kind, calls, inputs, paths, None, complete=False)
    return explain


def _expect_block(kind: str, block: Any, paths: dict[str, str], run: parts.Run, expected: Tensor, inputs: tuple,
                  reference: nn.Module, *, cause: str, atol: float = 1e-8, rtol: float = 1e-6,
                  train: bool = False, expected_words: str = REFERENCE_VALUES) -> None:
    """expect_close, with the block's departure from the paper (or the engine's reading) as the cause."""
    names = ("x", "mask") if kind in ENCODER_LIKE else ("x", "enc_out", "enc_mask", "dec_mask")
    sizes = {"batch": inputs[0].size(0), "position": inputs[0].size(1), "d_model": inputs[0].size(-1)}

    def diagnose(got: Tensor) -> Diagnosis | None:
        dropout = _dropout_reading(kind, run.calls, inputs, paths) if train else None
        reading = f"{dropout.text}: {_dropout_advice(kind)}" if dropout else _block_reading(kind, run.calls, inputs,
                                                                                      paths, got, train)
        engine = None if train else _engine(block, reference, inputs, names, got, expected, sizes)
        return parts.diagnosis(reading, got, expected, engine, AXES, atol, rtol)

    expect_close(f"{NAMES[kind]}({', '.join(names)})" + (" in train mode" if train else ""), run.outputs[0],
                 expected, atol=atol, rtol=rtol, axes=AXES, diagnose=diagnose, cause=cause,
                 expected_words=expected_words)


def _case(Block: type[nn.Module], kind: str, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1,
          seed: int = 20, weights: bool = True) -> tuple[nn.Module, Any, dict[str, str]]:
    """(reference with random weights, the student's block with the reference parts and weights, its paths)."""
    reference = _reference(BLOCKS[kind], d_model, num_heads, d_ff, dropout, seed=seed)
    block, paths = _block(Block, kind, (d_model, num_heads, d_ff, dropout), reference.state_dict() if weights
                          else None)
    return reference, block, paths


def _eval_run(kind: str, block: Any, paths: dict[str, str], inputs: tuple, deterministic: bool = True) -> parts.Run:
    """The block run in eval mode; with `deterministic`, two eval-mode calls must agree (the shape checks do not
    ask it: a dropout left on in eval mode costs the value and dropout checks, not the shape's point)."""
    run = parts.observe(block, inputs, NAMES[kind], paths_roles(paths), _crash_reading(kind, inputs, paths))
    if deterministic:
        _deterministic(run, NAMES[kind])
    return run


@on_student_side
def _trained_through(block: nn.Module, inputs: tuple) -> tuple[float, str]:
    """One eval-mode call of the block on an x that needs gradients, then a backward pass from its output, as
    training does: (how far the caller's x moved during the call, 0.0 when untouched; the first line of the
    backward pass's error, '' when it ran)."""
    for each in parts.everything(block):
        each.train(False)
    x = inputs[0].detach().clone().requires_grad_(True) * 1.0  # not a leaf: autograd lets forward write into it
    before = x.detach().clone()
    rest = parts.copies(inputs[1:])
    with parts.seeded(7), student_code():
        out = block(x, *rest)
    moved = float((x.detach() - before).abs().max())
    if not isinstance(out, Tensor) or not out.requires_grad:
        return moved, ""
    try:
        with student_code():
            out.sum().backward()
    except RuntimeError as error:
        return moved, str(error).strip().splitlines()[0][:200]
    return moved, ""


IN_PLACE = ("an in-place operation (`x += ...`, `x.add_(...)`) writes into a tensor that the backward pass needs, "
            "or into the x the caller passed in, so training stops with \"modified by an inplace operation\". "
            "Make every step a new tensor: x = x + ... .")


def _expect_new_shape(kind: str, run: parts.Run, inputs: tuple, cause: str, block: Any) -> None:
    """The block's output has the shape of x, and it is not x itself (a forward that computes nothing returns its
    input unchanged through the given `return x`: right shape, no work); the block leaves the caller's x as it
    was, and a backward pass runs through it (an in-place `+=` passes every check of values, then stops
    training)."""
    names = ("x", "mask") if kind in ENCODER_LIKE else ("x", "enc_out", "enc_mask", "dec_mask")
    what = f"{NAMES[kind]}({', '.join(names)})"
    out = expect_shape(what, run.outputs[0], tuple(inputs[0].shape), cause=cause)
    if torch.equal(out, inputs[0]):
        fail(f"{what} returned its input x unchanged.",
             expected=f"a new tensor of shape {tuple(inputs[0].shape)}, computed by the block's sublayers",
             got="the input x itself, every value the same",
             cause="forward leaves x as it was: the given last line returns x, so each sublayer's result must be "
                   "written back to x.")
    moved, error = _trained_through(block, inputs)
    if moved:
        fail(f"{what} changed the caller's tensor x during the call.",
             expected="x as it was before the call: the block's result is a new tensor",
             got=f"x changed by up to {moved:.3g}", cause=IN_PLACE)
    if error:
        fail(f"the backward pass from {what}'s output failed, as it would in training.",
             expected="gradients for x and for the block's weights", got=f"RuntimeError: {error}", cause=IN_PLACE)


def paths_roles(paths: Mapping[str, str]) -> dict[str, str]:
    """The recorder's view: the student's path -> role (dropout is found by what it does, not by name)."""
    return {path: role for role, path in paths.items() if role != "dropout"}


# --- EncoderBlock -----------------------------------------------------------------------------------------


@check("EncoderBlock returns a new tensor of shape (batch, src_len, d_model), and training can run through it")
def encoder_shape(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                  batch: int = 2, seq_len: int = 7) -> None:
    _, block, paths = _case(EncoderBlock, "encoder", d_model, num_heads, d_ff, weights=False)
    inputs = _encoder_inputs(batch, seq_len, d_model)
    run = _eval_run("encoder", block, paths, inputs, deterministic=False)
    _expect_new_shape("encoder", run, inputs, "both sublayers map (batch, src_len, d_model) to the same shape, "
                                              "and the block returns what its last step computes.", block)


@check("EncoderBlock: self-attention, then feed-forward, each post-LN as in the paper")
def encoder_values(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                   batch: int = 3, seq_len: int = 6, int_mask: bool = False) -> None:
    reference, block, paths = _case(EncoderBlock, "encoder", d_model, num_heads, d_ff)
    inputs = _encoder_inputs(batch, seq_len, d_model, int_mask)
    run = _eval_run("encoder", block, paths, inputs)
    with torch.no_grad():
        expected = reference(*inputs)
    _expect_block("encoder", block, paths, run, expected, inputs, reference,
                  cause="each sublayer is x = norm(x + self.dropout(sublayer(x))): self-attention with norm1 "
                        "first, then the feed-forward network with norm2.")


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


TORCH_WORDS = "the output of PyTorch's {} with the same weights (same inputs)"  # the expected values' words


@check("EncoderBlock gives the same output as torch.nn.TransformerEncoderLayer with the same weights")
def encoder_matches_torch(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 3, seq_len: int = 6) -> None:
    reference, block, paths = _case(EncoderBlock, "encoder", d_model, num_heads, d_ff)
    inputs = _encoder_inputs(batch, seq_len, d_model)
    x, mask = inputs
    with parts.seeded():
        layer = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, 0.1, batch_first=True).double().eval()
    _load_attention(layer.self_attn, reference.self_attn)
    _load_common(layer, reference, ("norm1", "norm2"))
    padding = ~mask[:, 0, 0, :].bool()  # (batch, seq_len), True at padding: the built-in's convention
    expected = layer(x, src_key_padding_mask=padding).detach()  # grad enabled keeps the plain code path
    run = _eval_run("encoder", block, paths, inputs)
    _expect_block("encoder", block, paths, run, expected, inputs, reference, atol=1e-7,
                  expected_words=TORCH_WORDS.format("nn.TransformerEncoderLayer"),
                  cause="in eval mode PyTorch's layer (norm_first=False, ReLU) computes the paper's post-LN "
                        "block: norm1(x + dropout(self_attn(x))), then norm2(x + dropout(feed_forward(x))).")


@check("EncoderBlock: extra padding tokens change no real position's output")
def encoder_padding_invariance(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                               d_ff: int = 32, batch: int = 3, seq_len: int = 6, extra: int = 3) -> None:
    _, block, paths = _case(EncoderBlock, "encoder", d_model, num_heads, d_ff, weights=False)
    lengths = _lengths(batch, seq_len)
    x = randn(batch, seq_len, d_model, seed=22)
    longer = torch.cat([x, 5.0 * randn(batch, extra, d_model, seed=23)], dim=1)  # loud padding vectors
    short = _eval_run("encoder", block, paths, (x, _padding_mask(lengths, seq_len))).outputs[0]
    inputs = (longer, _padding_mask(lengths, seq_len + extra))
    run = _eval_run("encoder", block, paths, inputs)
    long = expect_shape("EncoderBlock(x, mask)", run.outputs[0], (batch, seq_len + extra, d_model),
                        cause="return a tensor shaped like x.")
    for row, length in enumerate(lengths):
        if not tensors_close(long[row, :length], short[row, :length], 1e-8, 1e-6):
            fail("appending padding tokens changed the output at real positions.",
                 expected=f"row {row}: positions 0..{length - 1} identical with {extra} extra padding tokens",
                 got="different values",
                 cause=parts.safely(_block_reading, "encoder", run.calls, inputs, paths, None, complete=False)
                 or "the padding mask must reach self-attention: self.self_attn(x, x, x, mask), so that no real "
                    "token attends to padding.")


@on_student_side
def _same_weights(source: nn.Module, target: nn.Module) -> None:
    """Give the student's block `target` the weights of `source` (two blocks of the same class)."""
    target.load_state_dict(source.state_dict())


def _dropout_modes(Block: type[nn.Module], kind: str, sizes: tuple[int, int, int], inputs: tuple) -> None:
    """Train mode: two calls differ. Eval mode: two calls agree and equal the student's own block built with
    dropout=0 and the same weights (so only dropout is judged here, not the rest of the block)."""
    what = f"{NAMES[kind]}(...)"
    _, block, paths = _case(Block, kind, *sizes, dropout=0.5, weights=False)
    _, still, _ = _case(Block, kind, *sizes, dropout=0.0, weights=False)
    _same_weights(block, still)
    roles = paths_roles(paths)
    explain = _crash_reading(kind, inputs, paths)
    trained = parts.observe(block, inputs, NAMES[kind], roles, explain, train=True, seeds=(1, 2))
    first, second = trained.outputs
    expect_shape(what, first, tuple(inputs[0].shape), cause="return a tensor shaped like x.")
    if tensors_close(first, second, 1e-12, 0.0):
        reading = _dropout_reading(kind, trained.calls, inputs, paths)
        fail("in train mode two calls gave exactly the same output.",
             expected="different outputs: dropout (p=0.5) zeroes different elements on every call",
             got="identical outputs", cause=(reading.text if reading else "no dropout acts in train mode")
             + f": {_dropout_advice(kind)}.")
    evaluated = _deterministic(parts.observe(block, inputs, NAMES[kind], roles, explain), NAMES[kind])  # seeds 7, 8
    without = parts.observe(still, inputs, NAMES[kind], roles, explain).outputs[0]
    expect_close(f"{what} in eval mode", evaluated, without, atol=1e-10, rtol=1e-8,
                 cause="in eval mode the block must equal the same block built with dropout=0: something still "
                       "depends on the dropout rate (F.dropout(..., training=True), or scaling by 1 - p by hand).")


def _dropout_placement(Block: type[nn.Module], kind: str, sizes: tuple[int, int, int], inputs: tuple,
                       seed: int) -> None:
    """Where dropout acts. When the block computes the right values in eval mode, its train-mode output must
    equal the reference's with the same random draws; when it does not (a mistake the value checks grade),
    only its dropouts are judged: once on each sublayer's output, feeding the residual sum."""
    reference, block, paths = _case(Block, kind, *sizes, dropout=0.3)
    with torch.no_grad():
        right = _eval_run(kind, block, paths, inputs).outputs[0]
        structure_right = isinstance(right, Tensor) and tensors_close(right, reference(*inputs), 1e-8, 1e-6)
    roles = paths_roles(paths)
    run = parts.observe(block, inputs, NAMES[kind], roles, _crash_reading(kind, inputs, paths), train=True,
                        seeds=(seed,))
    if structure_right or not any(call.role == "dropout" for call in run.calls):
        reference.train()  # the same seed gives the same dropout masks, call by call
        with parts.seeded(seed), torch.no_grad():
            expected = reference(*inputs)
        _expect_block(kind, block, paths, run, expected, inputs, reference, train=True,
                      cause=f"apply dropout once per sublayer, on the sublayer's output: {_dropout_advice(kind)}.")
        return
    reading = _dropout_reading(kind, run.calls, inputs, paths)
    if reading is not None:
        where = "the exercise puts it (the paper's rule, section 5.4)" if kind == "pre_ln" else "the paper puts it"
        fail(f"{NAMES[kind]}(...) in train mode: dropout is not where {where}.",
             expected="dropout once on each sublayer's output", got=reading.got,
             cause=f"{reading.text}: {_dropout_advice(kind)}.")


@check("EncoderBlock: dropout is active in train mode and switched off in eval mode")
def encoder_dropout_modes(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 2, seq_len: int = 6) -> None:
    _dropout_modes(EncoderBlock, "encoder", (d_model, num_heads, d_ff), _encoder_inputs(batch, seq_len, d_model))


@check("EncoderBlock: dropout acts on each sublayer's output, before the residual addition")
def encoder_dropout_placement(EncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                              d_ff: int = 32, batch: int = 2, seq_len: int = 6) -> None:
    _dropout_placement(EncoderBlock, "encoder", (d_model, num_heads, d_ff), _encoder_inputs(batch, seq_len, d_model),
                       seed=5)


# --- DecoderBlock -----------------------------------------------------------------------------------------


@check("DecoderBlock returns a new tensor of shape (batch, tgt_len, d_model), also when src_len differs from tgt_len, "
       "and training can run through it")
def decoder_shape(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                  batch: int = 2, tgt_len: int = 5, src_len: int = 8) -> None:
    _, block, paths = _case(DecoderBlock, "decoder", d_model, num_heads, d_ff, seed=30, weights=False)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model)
    run = _eval_run("decoder", block, paths, inputs, deterministic=False)
    _expect_new_shape("decoder", run, inputs, "every sublayer keeps the decoder's shape (batch, tgt_len, d_model); "
                                              "cross-attention's query is the decoder's x.", block)


@check("DecoderBlock: masked self-attention, cross-attention on enc_out, feed-forward, each post-LN")
def decoder_values(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                   batch: int = 3, tgt_len: int = 6, src_len: int = 6, int_mask: bool = False) -> None:
    reference, block, paths = _case(DecoderBlock, "decoder", d_model, num_heads, d_ff, seed=30)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model, int_mask)
    run = _eval_run("decoder", block, paths, inputs)
    with torch.no_grad():
        expected = reference(*inputs)
    _expect_block("decoder", block, paths, run, expected, inputs, reference,
                  cause="three sublayers, each x = norm(x + self.dropout(sublayer)): self_attn(x, x, x, dec_mask) "
                        "with norm1, cross_attn(x, enc_out, enc_out, enc_mask) with norm2, feed_forward(x) with "
                        "norm3.")


@check("DecoderBlock gives the same output as torch.nn.TransformerDecoderLayer with the same weights")
def decoder_matches_torch(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 3, tgt_len: int = 6, src_len: int = 6) -> None:
    reference, block, paths = _case(DecoderBlock, "decoder", d_model, num_heads, d_ff, seed=30)
    inputs = _decoder_inputs(batch, tgt_len, src_len, d_model, target_padding=True)
    x, enc_out, enc_mask, dec_mask = inputs
    with parts.seeded():
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
    run = _eval_run("decoder", block, paths, inputs)
    _expect_block("decoder", block, paths, run, expected, inputs, reference, atol=1e-7,
                  expected_words=TORCH_WORDS.format("nn.TransformerDecoderLayer"),
                  cause="in eval mode PyTorch's layer (norm_first=False, ReLU) computes the paper's post-LN "
                        "decoder block: self-attention (dec_mask), cross-attention on enc_out (enc_mask), "
                        "feed-forward, each norm(x + dropout(...)).")


@check("DecoderBlock is causal: changing positions after t never changes the outputs up to t")
def decoder_causality(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                      batch: int = 2, tgt_len: int = 6, src_len: int = 7) -> None:
    _, block, paths = _case(DecoderBlock, "decoder", d_model, num_heads, d_ff, seed=30, weights=False)
    x, enc_out, enc_mask, dec_mask = _decoder_inputs(batch, tgt_len, src_len, d_model, target_padding=False)
    first = _eval_run("decoder", block, paths, (x, enc_out, enc_mask, dec_mask))
    base = expect_shape("DecoderBlock(x, enc_out, enc_mask, dec_mask)", first.outputs[0], (batch, tgt_len, d_model),
                        cause="return a tensor shaped like x.")
    for t in range(tgt_len - 1):
        changed = x.clone()
        changed[:, t + 1:] = randn(batch, tgt_len - t - 1, d_model, seed=40 + t)  # new "future" tokens
        out = _eval_run("decoder", block, paths, (changed, enc_out, enc_mask, dec_mask)).outputs[0]
        if not tensors_close(out[:, : t + 1], base[:, : t + 1], 1e-8, 1e-6):
            fail(f"changing the inputs at positions {t + 1}..{tgt_len - 1} changed the output at positions 0..{t}.",
                 expected="outputs at positions <= t that depend only on inputs at positions <= t",
                 got="outputs that see the future",
                 cause=parts.safely(_block_reading, "decoder", first.calls, (x, enc_out, enc_mask, dec_mask),
                                    paths, None, complete=False)
                 or "self-attention must get the look-ahead mask: self.self_attn(x, x, x, dec_mask) (not enc_mask, "
                    "not None).")


@check("DecoderBlock: dropout is active in train mode and switched off in eval mode")
def decoder_dropout_modes(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                          d_ff: int = 32, batch: int = 2, tgt_len: int = 6, src_len: int = 6) -> None:
    _dropout_modes(DecoderBlock, "decoder", (d_model, num_heads, d_ff),
                   _decoder_inputs(batch, tgt_len, src_len, d_model))


@check("DecoderBlock: dropout acts on each sublayer's output, before the residual addition")
def decoder_dropout_placement(DecoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                              d_ff: int = 32, batch: int = 2, tgt_len: int = 6, src_len: int = 6) -> None:
    _dropout_placement(DecoderBlock, "decoder", (d_model, num_heads, d_ff),
                       _decoder_inputs(batch, tgt_len, src_len, d_model), seed=6)


# --- PreLNEncoderBlock: the pre-LN arrangement, checked by its properties ---------------------------------------
#
# The paper's block is post-LN; the pre-LN block (section 11 of the lesson) has the same parts in another
# arrangement. It is checked by what defines it: with silent sublayers the stream passes through untouched (it is
# never normalised inside the block), and PyTorch's own pre-LN layer (`norm_first=True`) computes the same values
# with the same weights. The reference pre-LN block only explains a difference and gives the dropout draws.


def _pre_ln_steps(train: bool) -> tuple[list[parts.Step], tuple[parts.Term, ...]]:
    """The calls of the pre-LN block, and the terms of its result: each sublayer reads its own LayerNorm's output of
    the stream so far, and the stream is the input x plus each sublayer's (dropped-out) output."""
    steps: list[parts.Step] = []
    stream: list[str] = ["x"]
    for index, name in enumerate(SUBLAYERS["pre_ln"], start=1):
        norm = f"norm{index}"
        steps.append(parts.Step(norm, {"input": parts.terms(*stream)}, norm))
        reads = {"q": norm, "k": norm, "v": norm, "mask": "mask"} if name == "self_attn" else {"x": norm}
        steps.append(parts.Step(name, {argument: parts.terms(key) for argument, key in reads.items()}, name))
        added = name
        if train:
            added = f"dropout{index}"
            steps.append(parts.Step("dropout", {"input": parts.terms(name)}, added, "the dropped-out output"))
        stream.append(added)
    return steps, parts.terms(*stream)


def _post_ln_sum(calls: list[parts.Call], replay: parts.Replay) -> str:
    """The first LayerNorm normalising the block's input plus self-attention's output, where the pre-LN block
    normalises the input alone: the post-LN arrangement where the pre-LN one is asked for."""
    x = replay.values.tensors["x"]
    first = next((call for call in calls if call.role == "norm1"), None)
    attended = next((call for call in calls if call.role == "self_attn" and call.returned), None)
    if first is None or attended is None or not isinstance(attended.output, Tensor) \
            or attended.output.shape != x.shape or not isinstance(first.args.get("input"), Tensor):
        return ""
    if not parts._close(first.args["input"], x.double() + attended.output.double()):
        return ""
    return (f"{parts.at(first.line)}{replay.part(first)} normalises the residual sum, the block's input x + the output "
            f"of {replay.part(attended)}: that is the paper's post-LN arrangement. In the pre-LN arrangement a "
            "LayerNorm normalises only the copy its sublayer reads, and the sublayer's output is added to the stream "
            "as it is")


def _pre_ln_reading(calls: list[parts.Call], inputs: tuple, paths: Mapping[str, str], result: Any,
                    train: bool = False, complete: bool = True) -> str | None:
    """The first place the student's pre-LN block departs from the pre-LN computation, in words, with its line."""
    steps, total = _pre_ln_steps(train)
    replay = parts.Replay(calls, steps, _values("pre_ln", inputs), paths, authority="the pre-LN block")
    post_ln = _post_ln_sum(calls, replay)
    if post_ln:
        return post_ln
    reading = replay.departure(ordered=[SUBLAYERS["pre_ln"], ("norm1", "norm2")], complete=complete)
    if reading is not None:
        return reading.cause()
    if not complete or not isinstance(result, Tensor) or replay.values.matches(result, total):
        return None
    got = replay.values.name(result) or parts.UNNAMED
    return (f"forward returns {got} where the pre-LN block returns {replay.values.words(total)}: the stream, "
            "never normalised inside the block")


def _stream_words(out: Tensor, x: Tensor, added: Tensor) -> str:
    """What a block did to its stream besides adding its sublayers' outputs, read from the values."""
    mean, std = out.mean(dim=-1), out.std(dim=-1, correction=0)
    if bool((mean.abs() < 1e-6).all()) and bool(((std - 1).abs() < 1e-3).all()):
        return ("an output normalised at every position (mean 0, standard deviation 1), while the input x has mean "
                f"{float(x.mean()):.2f} and standard deviation {float(x.std()):.2f}")
    return (f"an output that differs from x + (what the sublayers returned) by up to "
            f"{float((out - x - added).abs().max()):.3g}")


@check("PreLNEncoderBlock returns a new tensor of shape (batch, src_len, d_model), and training can run through it")
def pre_ln_shape(PreLNEncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                 batch: int = 2, seq_len: int = 7) -> None:
    _, block, paths = _case(PreLNEncoderBlock, "pre_ln", d_model, num_heads, d_ff, weights=False)
    inputs = _encoder_inputs(batch, seq_len, d_model)
    run = _eval_run("pre_ln", block, paths, inputs, deterministic=False)
    _expect_new_shape("pre_ln", run, inputs, "each sublayer returns a tensor shaped like x, and the block returns "
                                             "the stream, shaped like its input.", block)


@check("PreLNEncoderBlock adds each sublayer's output to its input and does nothing else to the stream")
def pre_ln_stream(PreLNEncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                  batch: int = 2, seq_len: int = 6) -> None:
    _, block, paths = _case(PreLNEncoderBlock, "pre_ln", d_model, num_heads, d_ff, weights=False)
    x, mask = _encoder_inputs(batch, seq_len, d_model, seed=24)
    inputs = (2.0 + 3.0 * x, mask)  # far from mean 0 and spread 1: a normalised output cannot pass for the input
    run = _eval_run("pre_ln", block, paths, inputs)
    out = expect_shape("PreLNEncoderBlock(x, mask)", run.outputs[0], tuple(inputs[0].shape),
                       cause="return the stream, shaped like x.")
    made = [call for call in run.calls if call.role in SUBLAYERS["pre_ln"] and call.returned]
    if not made:
        fail("no call of either sublayer was seen.", expected="the stream x plus what self-attention and the "
             "feed-forward network return", got="an output made without calling self.self_attn(...) or "
             "self.feed_forward(...)",
             cause="each sublayer reads its LayerNorm's copy of the stream, and what it returns is added to x.")
    added = sum(call.output.double() for call in made if isinstance(call.output, Tensor)
                and call.output.shape == out.shape)
    if isinstance(added, Tensor) and tensors_close(out, inputs[0] + added, 1e-9, 1e-9):
        return
    fail("the block's output is not its input plus what its sublayers returned.",
         expected="x + (self-attention's output) + (the feed-forward network's output), in eval mode: nothing "
                  "else happens to the stream",
         got=_stream_words(out, inputs[0], added if isinstance(added, Tensor) else torch.zeros_like(out)),
         cause=parts.safely(_pre_ln_reading, run.calls, inputs, paths, run.outputs[0])
         or "something in forward changes the stream itself: in the pre-LN arrangement a LayerNorm normalises only "
            "the copy a sublayer reads, and each sublayer's output is added to the stream as it is.")


@check("PreLNEncoderBlock gives the same output as torch.nn.TransformerEncoderLayer(norm_first=True), same weights")
def pre_ln_matches_torch(PreLNEncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4, d_ff: int = 32,
                         batch: int = 3, seq_len: int = 6) -> None:
    reference, block, paths = _case(PreLNEncoderBlock, "pre_ln", d_model, num_heads, d_ff, seed=25)
    inputs = _encoder_inputs(batch, seq_len, d_model, seed=26)
    x, mask = inputs
    with parts.seeded():
        layer = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, 0.1, batch_first=True,
                                           norm_first=True).double().eval()
    _load_attention(layer.self_attn, reference.self_attn)
    _load_common(layer, reference, ("norm1", "norm2"))
    padding = ~mask[:, 0, 0, :].bool()  # (batch, seq_len), True at padding: the built-in's convention
    expected = layer(x, src_key_padding_mask=padding).detach()  # grad enabled keeps the plain code path
    run = _eval_run("pre_ln", block, paths, inputs)
    _expect_block("pre_ln", block, paths, run, expected, inputs, reference, atol=1e-7,
                  expected_words=TORCH_WORDS.format("nn.TransformerEncoderLayer(norm_first=True)"),
                  cause="PyTorch's layer with norm_first=True is the pre-LN block: norm1 normalises what "
                        "self-attention reads, norm2 what the feed-forward network reads, and each sublayer's output "
                        "is added to the unnormalised stream: x + dropout(sublayer(norm(x))).")


@check("PreLNEncoderBlock: dropout acts on each sublayer's output, before it is added to the stream")
def pre_ln_dropout_placement(PreLNEncoderBlock: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                             d_ff: int = 32, batch: int = 2, seq_len: int = 6) -> None:
    _dropout_placement(PreLNEncoderBlock, "pre_ln", (d_model, num_heads, d_ff),
                       _encoder_inputs(batch, seq_len, d_model, seed=27), seed=8)


# --- predict, then run ------------------------------------------------------------------------------


def _counts(build: Callable[[], nn.Module]) -> tuple[int, int]:
    """A block's parameters with the biases of its attention projections (as the course builds it) and without
    them (the paper's formulas have none; a count from them is as right)."""
    return parameters_of(build), parameters_of(build, attention_biases=False)


@check("your prediction: the parameters of EncoderBlock(512, 8, 2048, 0.1)")
def predicted_encoder_parameters(predict: Any) -> None:
    expect_number(predict, truths=lambda: _counts(lambda: ReferenceEncoderBlock(512, 8, 2048, 0.1)),
                  what="the parameters of EncoderBlock(512, 8, 2048, 0.1)",
                  cause="list every part of the block that holds parameters: the attention, the feed-forward "
                        "network and each LayerNorm (what does one hold?); dropout has none.")


@check("your prediction: the parameters of DecoderBlock(512, 8, 2048, 0.1)")
def predicted_decoder_parameters(predict: Any) -> None:
    expect_number(predict, truths=lambda: _counts(lambda: ReferenceDecoderBlock(512, 8, 2048, 0.1)),
                  what="the parameters of DecoderBlock(512, 8, 2048, 0.1)",
                  cause="compare the decoder block's parts with the encoder block's: which modules does it have "
                        "that the encoder block has not, and does cross-attention share weights with "
                        "self-attention?")


def _feed_forward_shares() -> tuple[float, float]:
    feed_forward = parameters_of(lambda: ReferenceFeedForward(512, 1024))
    return tuple(100 * feed_forward / total  # type: ignore[return-value]
                 for total in _counts(lambda: ReferenceDecoderBlock(512, 8, 1024, 0.1)))


@check("your prediction: the feed-forward network's share of DecoderBlock(512, 8, 1024, 0.1), in percent")
def predicted_feed_forward_share(predict: Any) -> None:
    expect_number(predict, truths=_feed_forward_shares, absolute=1.0,
                  what="the feed-forward network's share of DecoderBlock(512, 8, 1024, 0.1)'s parameters (percent)",
                  cause="with d_ff = 1024 the feed-forward network is half as wide as at the paper's sizes: count "
                        "it again, then the whole block, and divide.")
