"""Stage 4 checks: the target mask, the Encoder and Decoder stacks and the full Transformer.

Each component is checked with reference parts for everything else, so a mistake costs the points of
the checks about it once: the stacks run the reference blocks (imported by the notebook), and the
Transformer checks plug the reference Encoder and Decoder into the student's Transformer (at
`self.encoder` and `self.decoder`), so they grade only its wiring, with reference masks. Expected
values come from the reference modules with the same weights, in float64 and eval mode, on token
batches drawn from private generators. Only the value checks of the stacks copy weights, by the
given constructor's names; when a value differs, the calls of the reference parts are replayed to
name the first place the student's forward departs from the intended computation.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from transformer_course.checks.framework import (
    CheckFailed,
    check,
    expect_close,
    expect_shape,
    expect_tensor,
    fail,
    generator,
    randn,
    reject_builtin_modules,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.checks.localise import Call, Step, Values, copy_by_name, first_departure, recorded_calls, terms
from transformer_course.reference import Decoder as ReferenceDecoder
from transformer_course.reference import Encoder as ReferenceEncoder
from transformer_course.reference import Transformer as ReferenceTransformer
from transformer_course.reference import (
    count_parameters,
    make_look_ahead_mask,
    make_padding_mask,
    make_source_mask,
)
from transformer_course.reference import make_target_mask as reference_target_mask

__all__ = [
    "decoder_layers_registered",
    "decoder_output_shape",
    "decoder_values",
    "embedding_dropout",
    "encoder_layers_registered",
    "encoder_output_shape",
    "encoder_values",
    "matches_torch_transformer",
    "no_builtin_modules",
    "source_padding_invariance",
    "summary",
    "target_mask_device",
    "target_mask_shape",
    "target_mask_values",
    "target_padding_invariance",
    "transformer_causality",
    "transformer_gradients",
    "transformer_output_shape",
    "transformer_values",
]

TOLERANCE = {"atol": 1e-7, "rtol": 1e-6}  # float64 on both sides: only rounding differs


# --- sizes, tokens and module pairs -----------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """One model configuration and one batch shape for a check."""

    src_vocab: int = 13
    tgt_vocab: int = 11
    d_model: int = 16
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 32
    max_seq_length: int = 40
    dropout: float = 0.1
    pad_idx: int = 1
    batch: int = 3
    src_len: int = 7
    tgt_len: int = 7

    def stack_args(self, vocab: int) -> tuple:
        return (vocab, self.d_model, self.num_heads, self.num_layers, self.d_ff, self.max_seq_length,
                self.dropout)

    def transformer_args(self) -> tuple:
        return (self.src_vocab, self.tgt_vocab, self.d_model, self.num_heads, self.num_layers, self.d_ff,
                self.max_seq_length, self.dropout)


def _sizes(**overrides: float) -> Sizes:
    return replace(Sizes(), **overrides)


def _lengths(batch: int, length: int) -> list[int]:
    """Real lengths for a padded batch: the first sentence is full, later ones are shorter."""
    options = [length, max(2, length - 3), 2, max(2, length - 1), max(2, length // 2)]
    return [options[row % len(options)] for row in range(batch)]


def _tokens(batch: int, length: int, vocab: int, pad_idx: int, seed: int, padded: bool = True) -> torch.Tensor:
    """Token ids (batch, length): no pad id among the real tokens, pad_idx after each real length."""
    draws = torch.randint(0, vocab - 1, (batch, length), generator=generator(seed))
    tokens = draws + (draws >= pad_idx).long()  # skip the pad id: values 0..vocab-1 without pad_idx
    tokens[0, 0] = 0 if pad_idx != 0 else 1  # a low real id, so a hard-coded pad id of 0 shows up
    if padded:
        for row, real in enumerate(_lengths(batch, length)):
            tokens[row, real:] = pad_idx
    return tokens


def _other_tokens(tokens: torch.Tensor, vocab: int, pad_idx: int, seed: int) -> torch.Tensor:
    """Real (non-pad) token ids that differ from `tokens` at every position."""
    real = torch.tensor([token for token in range(vocab) if token != pad_idx])  # (vocab - 1,)
    rank = (real.unsqueeze(0).unsqueeze(0) == tokens.unsqueeze(-1)).long().argmax(-1)  # index of each token
    offset = torch.randint(1, vocab - 1, tokens.shape, generator=generator(seed))  # 1 .. vocab - 2
    return real[(rank + offset) % (vocab - 1)]


def _xavier(module: nn.Module) -> None:
    for parameter in module.parameters():
        if parameter.dim() > 1:
            nn.init.xavier_uniform_(parameter)


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Build modules from a fixed seed without disturbing the notebook's own random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _construct(Student: type[nn.Module], args: tuple, what: str) -> nn.Module:
    with student_code():
        module = Student(*args)
    reject_builtin_modules(module, what)
    return module


PLAIN_LIST = ("a plain Python list hides the blocks from PyTorch: their parameters are not trained, not saved "
              "and not moved by .to(device). Wrap the list in nn.ModuleList, as the given constructor does.")


def _plain_module_lists(module: nn.Module) -> list[str]:
    """Attributes anywhere in `module` that hold a plain list or tuple of modules (invisible to PyTorch)."""
    found = []
    for owner_name, owner in module.named_modules():
        for attribute, value in vars(owner).items():
            if (isinstance(value, list | tuple) and value
                    and all(isinstance(item, nn.Module) for item in value)):
                found.append(f"{owner_name}.{attribute}" if owner_name else attribute)
    return found


def _pair(Student: type[nn.Module], Reference: type[nn.Module], args: tuple, what: str,
          seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """(student, reference) with identical weights (copied by name), float64, eval mode."""
    with _seeded(seed):
        reference = Reference(*args)
        _xavier(reference)
        student = _construct(Student, args, what)
    hidden = _plain_module_lists(student)
    if hidden and set(student.state_dict()) != set(reference.state_dict()):
        fail(f"{what}.{hidden[0]} is a plain Python list of blocks.", expected="an nn.ModuleList of blocks",
             got=f"{what} has no parameters named {hidden[0]}.0.…", cause=PLAIN_LIST)
    copy_by_name(reference, student, what)
    return student.double().eval(), reference.double().eval()


def _alone(Student: type[nn.Module], args: tuple, what: str, seed: int = 0) -> nn.Module:
    """The student's module as its constructor builds it (no weights copied, so no names needed), eval mode."""
    with _seeded(seed):
        return _construct(Student, args, what).eval()


@dataclass
class _Trace:
    """One run of a student's module: what it returned and the calls of its parts."""

    output: Any
    calls: list[Call]


def _traced(module: nn.Module, inputs: tuple, parts: Sequence[str], explain: Callable[[_Trace], str | None],
            what: str, grad: bool = False) -> _Trace:
    """Run the student's module recording the calls of `parts`; explain a crash by its first departure."""
    trace = _Trace(None, [])
    try:
        with torch.set_grad_enabled(grad), student_code(), recorded_calls(module, parts) as calls:
            trace.calls = calls
            trace.output = module(*inputs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as error:
        cause = explain(trace)
        if cause is None:
            raise
        fail(f"{what} crashed.", expected=f"{what} to run on these inputs",
             got=f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}", cause=cause)
    return trace


def _run(module: nn.Module, *inputs: torch.Tensor | None) -> object:
    with torch.no_grad(), student_code():
        return module(*inputs)


# --- the target mask ---------------------------------------------------------------------------------


def _allowed(name: str, got: object, shape: tuple[int, ...]) -> torch.Tensor:
    """The student's mask as a bool tensor of `shape` (True = may attend), or a clear failure."""
    mask = expect_tensor(name, got, cause="return the mask tensor (bool, True where attention is allowed).")
    try:
        mask = mask.expand(shape)
    except RuntimeError:
        fail(f"{name} does not broadcast to {shape}.", expected=shape, got=tuple(mask.shape),
             cause="combine the padding mask (batch, 1, 1, tgt_len) with the look-ahead mask (1, 1, tgt_len, tgt_len).")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        fail(f"{name} holds values other than 0 and 1.", expected="bool (or 0/1) entries, True = may attend",
             got=f"values such as {mask.flatten()[~((mask == 0) | (mask == 1)).flatten()][:3].tolist()}",
             cause="the course's masks say *where* attention is allowed; the -1e9 is added inside attention.")
    return mask != 0


def _target_mask_suspects(tokens: torch.Tensor, pad_idx: int) -> dict[str, torch.Tensor]:
    length = tokens.size(1)
    padding = make_padding_mask(tokens, pad_idx)  # (batch, 1, 1, tgt_len)
    look_ahead = make_look_ahead_mask(length)  # (1, 1, tgt_len, tgt_len)
    strict = torch.ones(length, length, dtype=torch.bool).tril(-1)  # diagonal hidden
    shape = (tokens.size(0), 1, length, length)
    suspects = {
        "only the padding mask: a position can still see later tokens; combine it with the "
        "look-ahead mask using `&`.": padding,
        "only the look-ahead mask: padding keys are not hidden; combine it with the padding mask "
        "using `&`.": look_ahead,
        "the mask is inverted: True must mean *may attend* (the course's convention), so real earlier "
        "tokens are True and padding / future tokens False.": ~(padding & look_ahead),
        "the diagonal is hidden: a position may attend to itself, use tril() (diagonal included), "
        "not tril(-1) or triu(1) == 0 shifted by one.": padding & strict,
        "the upper triangle is allowed instead of the lower: position i may attend to j <= i "
        "(tril, or triu(diagonal=1) == 0).": padding & look_ahead.transpose(-2, -1),
        "combined with `|` instead of `&`: a key is allowed only when it is both earlier and not "
        "padding.": padding | look_ahead,
        "padding hides query rows instead of key columns: the padding mask must have shape "
        "(batch, 1, 1, tgt_len), so it masks the *keys* (last axis).": padding.transpose(-2, -1) & look_ahead,
    }
    if pad_idx != 0:
        suspects["the pad id is hard-coded as 0: compare the tokens with the `pad_idx` argument."] = (
            make_padding_mask(tokens, 0) & look_ahead
        )
    return {cause: mask.expand(shape) for cause, mask in suspects.items()}


def _student_mask(make_target_mask: Callable, tokens: torch.Tensor, pad_idx: int) -> object:
    """The student's mask; a crash that combines a float tensor with & or | is explained."""
    try:
        with student_code():
            return make_target_mask(tokens, pad_idx)
    except RuntimeError as error:
        if "not implemented for" in str(error) and any(kind in str(error) for kind in ("'Float'", "'Double'")):
            fail("make_target_mask crashed while combining its two masks.",
                 expected="padding & look_ahead, two bool tensors",
                 got=f"RuntimeError: {str(error).splitlines()[0][:120]}",
                 cause="one of the masks is a float tensor (torch.ones and torch.tril give floats): & and | "
                       "work on bool or integer tensors only. Build it as bool, torch.ones(..., dtype=torch.bool)"
                       ".tril(), or convert it with .bool().")
        raise


DEVICE = ("a tensor made inside make_target_mask (the look-ahead part: torch.ones, torch.tril, "
          "make_look_ahead_mask) is created on the CPU whatever the device of tgt, so a batch on a GPU "
          "fails: create it on tgt's device, make_look_ahead_mask(size, device=tgt.device) or "
          "torch.ones(..., device=tgt.device).")


@check("make_target_mask returns one (tgt_len, tgt_len) mask per sentence: shape (batch, 1, tgt_len, tgt_len)")
def target_mask_shape(make_target_mask: Callable, batch: int = 3, tgt_len: int = 6, pad_idx: int = 1) -> None:
    tokens = _tokens(batch, tgt_len, 11, pad_idx, seed=10)
    got = _student_mask(make_target_mask, tokens, pad_idx)
    expected = (batch, 1, tgt_len, tgt_len)
    mask = expect_tensor("make_target_mask(tgt, pad_idx)", got, cause="return the combined mask tensor.")
    causes = {
        (batch, 1, 1, tgt_len): "this is the shape of the padding mask alone: combine it with the look-ahead mask.",
        (1, 1, tgt_len, tgt_len): "this is the shape of the look-ahead mask alone: combine it with the "
        "padding mask (padding & look_ahead broadcasts to (batch, 1, tgt_len, tgt_len)).",
        (batch, tgt_len, tgt_len): "the head axis is missing: keep the 1 in position 1 so the mask broadcasts "
        "over the heads.",
    }
    expect_shape("make_target_mask(tgt, pad_idx)", mask, expected,
                 cause=causes.get(tuple(mask.shape), "padding (batch, 1, 1, tgt_len) & look-ahead "
                                  "(1, 1, tgt_len, tgt_len) broadcasts to (batch, 1, tgt_len, tgt_len)."))


@check("make_target_mask allows key j for query i exactly when j <= i and token j is not padding")
def target_mask_values(make_target_mask: Callable, batch: int = 3, tgt_len: int = 6, pad_idx: int = 1) -> None:
    tokens = _tokens(batch, tgt_len, 11, pad_idx, seed=11)
    got = _student_mask(make_target_mask, tokens, pad_idx)
    shape = (batch, 1, tgt_len, tgt_len)
    allowed = _allowed("make_target_mask(tgt, pad_idx)", got, shape)
    expected = reference_target_mask(tokens, pad_idx)
    if torch.equal(allowed, expected):
        return
    cause = "query i may attend to key j when j <= i (look-ahead) and tokens[j] != pad_idx (padding)."
    for suspected_cause, wrong in _target_mask_suspects(tokens, pad_idx).items():
        if torch.equal(allowed, wrong):
            cause = suspected_cause
            break
    row, _, query, key = (int(i) for i in (allowed != expected).nonzero()[0])
    word = "allowed" if expected[row, 0, query, key] else "hidden"
    reason = "padding" if tokens[row, key] == pad_idx else ("a later position" if key > query else "a real token")
    fail("make_target_mask has wrong entries.",
         expected=f"sentence {row}, query {query}, key {key} {word} (key {key} is {reason}; "
                  f"tokens {tokens[row].tolist()}, pad_idx={pad_idx})",
         got="allowed" if allowed[row, 0, query, key] else "hidden", cause=cause)


@check("make_target_mask builds the mask on the device of tgt (a batch on a GPU gets a GPU mask)")
def target_mask_device(make_target_mask: Callable, batch: int = 2, tgt_len: int = 5, pad_idx: int = 1) -> None:
    """tgt on PyTorch's `meta` device stands for any device other than the CPU (a GPU, say)."""
    tokens = _tokens(batch, tgt_len, 11, pad_idx, seed=12).to("meta")
    try:
        with student_code():
            got = make_target_mask(tokens, pad_idx)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as error:  # noqa: BLE001  (only a device clash is this check's business)
        if "device" not in str(error):
            return  # the code reads the ids' values, which a meta tensor has not: nothing to say about devices
        fail("make_target_mask mixes devices.", expected="every part of the mask on the device of tgt",
             got=f"{type(error).__name__}: {str(error).splitlines()[0][:120]} (tgt was on another device "
                 "than the CPU)", cause=DEVICE)
    mask = expect_tensor("make_target_mask(tgt, pad_idx)", got, cause="return the mask tensor.")
    if mask.device != tokens.device:
        fail("make_target_mask returns its mask on another device than tgt.",
             expected="the device of tgt", got=f"a mask on {mask.device}", cause=DEVICE)


# --- Encoder -----------------------------------------------------------------------------------------


def _embed(stack: nn.Module, tokens: torch.Tensor, scale: str = "sqrt") -> torch.Tensor:
    """Embedding, scaling and positional encoding of a reference stack, optionally with a known mistake."""
    root = math.sqrt(stack.d_model)
    x = stack.embedding(tokens)  # (batch, seq_len, d_model)
    x = {"sqrt": x * root, "none": x, "after": x, "divide": x / root, "d_model": x * stack.d_model,
         "no_pe": x * root}[scale]
    if scale == "no_pe":
        return x
    x = stack.positional_encoding(x)
    return x * root if scale == "after" else x


def _layers(stack: nn.Module, which: str) -> list[nn.Module]:
    layers = list(stack.layers)
    return {"all": layers, "first": layers[:1], "last": layers[-1:], "repeat": layers[-1:] * len(layers)}[which]


def _encode(encoder: nn.Module, tokens: torch.Tensor, mask: torch.Tensor | None, scale: str = "sqrt",
            which: str = "all") -> torch.Tensor:
    x = _embed(encoder, tokens, scale)
    for layer in _layers(encoder, which):
        x = layer(x, mask)
    return x


SCALE_SUSPECTS = {
    "none": "the embeddings are not multiplied by sqrt(d_model) before the positional encoding is added.",
    "after": "sqrt(d_model) multiplies the sum embedding + PE: scale the embeddings *before* adding PE.",
    "divide": "the embeddings are divided by sqrt(d_model): multiply them.",
    "d_model": "the embeddings are multiplied by d_model: the factor is its square root, sqrt(d_model).",
    "no_pe": "the positional encoding is never added: call self.positional_encoding(x) after scaling.",
}


REPEATED_BLOCK = ("one block object is repeated num_layers times (all layers share its weights): create a new "
                  "block for every layer, [Block(...) for _ in range(num_layers)], as the given constructor does.")


def _stack_parts(stack: nn.Module) -> list[str]:
    layers = getattr(stack, "layers", None)
    count = len(layers) if isinstance(layers, nn.ModuleList) else 0
    return ["embedding", "positional_encoding", *(f"layers.{index}" for index in range(count)), "pred_layer"]


def _stack_departure(trace: _Trace, stack: nn.Module, inputs: tuple, what: str, complete: bool) -> str | None:
    """The first place the student's Encoder or Decoder departs from: embedding -> × sqrt(d_model) ->
    positional_encoding -> every layer in turn (with the masks) [-> pred_layer]."""
    decoder = what == "Decoder"
    values = Values()
    values.add("tokens", "the token ids", inputs[0])
    if decoder:
        values.add("enc_out", "enc_out", inputs[1])
        values.add("enc_mask", "enc_mask", inputs[2], mask=True)
        values.add("dec_mask", "dec_mask", inputs[3], mask=True)
    else:
        values.add("mask", "mask", inputs[1], mask=True)
    root = math.sqrt(getattr(stack, "d_model", 0) or stack.embedding.embedding_dim)
    steps = [Step("embedding", {"input": terms("tokens")}, "embedding"),
             Step("positional_encoding", {"x": terms((root, "embedding"))}, "positional_encoding")]
    previous = "positional_encoding"
    layers = [name for name in _stack_parts(stack) if name.startswith("layers.")]
    for name in layers:
        arguments = {"x": terms(previous)} | (
            {"enc_out": terms("enc_out"), "enc_mask": terms("enc_mask"), "dec_mask": terms("dec_mask")}
            if decoder else {"mask": terms("mask")})
        steps.append(Step(name, arguments, name, words=f"{name}'s output"))
        previous = name
    if decoder:
        steps.append(Step("pred_layer", {"input": terms(previous)}, "pred_layer"))
        previous = "pred_layer"
    return first_departure(trace.calls, steps, values, where=f"{what}.forward", result=trace.output,
                           result_key=previous if complete else None, ordered=[layers], complete=complete)


def _run_stack(stack: nn.Module, inputs: tuple, what: str) -> _Trace:
    return _traced(stack, inputs, _stack_parts(stack), what=what,
                   explain=lambda trace: _stack_departure(trace, stack, inputs, what, complete=False))


def _expect_stack(what: str, trace: _Trace, expected: torch.Tensor, stack: nn.Module, inputs: tuple, *,
                  suspects: dict[str, Callable[[], torch.Tensor]], cause: str) -> None:
    """expect_close, with the first departure of the traced run as the cause when no known mistake fits."""
    got = trace.output
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and not tensors_close(got, expected, **TOLERANCE):
        cause = _stack_departure(trace, stack, inputs, what.split("(")[0], complete=True) or cause
    expect_close(what, got, expected, suspects=suspects, cause=cause, **TOLERANCE)


def _encoder_case(Encoder: type[nn.Module], sizes: Sizes, seed: int, weights: bool = True) -> tuple:
    args = sizes.stack_args(sizes.src_vocab)
    student, reference = _pair(Encoder, ReferenceEncoder, args, "Encoder", seed) if weights else (
        _alone(Encoder, args, "Encoder", seed), None)
    tokens = _tokens(sizes.batch, sizes.src_len, sizes.src_vocab, sizes.pad_idx, seed=seed + 1)
    return student, reference, tokens, make_source_mask(tokens, sizes.pad_idx)


@check("Encoder maps token ids (batch, src_len) to vectors (batch, src_len, d_model)")
def encoder_output_shape(Encoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    student, _, tokens, mask = _encoder_case(Encoder, config, seed=20, weights=False)
    expect_shape("Encoder(src, src_mask)", _run_stack(student, (tokens, mask), "Encoder").output,
                 (config.batch, config.src_len, config.d_model),
                 cause="embed, scale, add PE, then apply every layer as x = layer(x, mask); return x.")


@check("Encoder gives the reference output: embedding * sqrt(d_model) + PE, then every layer with the mask")
def encoder_values(Encoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    student, reference, tokens, mask = _encoder_case(Encoder, config, seed=21)
    trace = _run_stack(student, (tokens, mask), "Encoder")
    with torch.no_grad():
        expected = _encode(reference, tokens, mask)
        suspects = {cause: (lambda scale=scale: _encode(reference, tokens, mask, scale=scale))
                    for scale, cause in SCALE_SUSPECTS.items()}
        suspects |= {
            "the mask is not passed to the layers: call layer(x, mask), otherwise padding tokens are "
            "attended to.": lambda: _encode(reference, tokens, None),
            "only the first layer is applied: loop over all of self.layers.": (
                lambda: _encode(reference, tokens, mask, which="first")
            ),
            "every layer gets the embeddings and only the last result is kept: feed each layer's output "
            "into the next, x = layer(x, mask).": lambda: _encode(reference, tokens, mask, which="last"),
            REPEATED_BLOCK: lambda: _encode(reference, tokens, mask, which="repeat"),
        }
        _expect_stack("Encoder(src, src_mask)", trace, expected, student, (tokens, mask), suspects=suspects,
                      cause="x = embedding(src) * sqrt(d_model); x = positional_encoding(x); "
                            "then x = layer(x, mask) for every layer.")


def _layers_registered(Student: type[nn.Module], Reference: type[nn.Module], what: str, sizes: Sizes,
                       inputs: Callable[[], tuple]) -> None:
    vocab = sizes.src_vocab if what == "Encoder" else sizes.tgt_vocab
    with _seeded(30):
        reference = Reference(*sizes.stack_args(vocab))
        student = _construct(Student, sizes.stack_args(vocab), what)
    layers = getattr(student, "layers", None)
    if not isinstance(layers, nn.Module):
        fail(f"{what}.layers is not a registered module.", expected="an nn.ModuleList of blocks",
             got=type(layers).__name__, cause=PLAIN_LIST)
    blocks = list(layers)  # iterating a ModuleList keeps repeats; .children() would drop them
    if len(blocks) != sizes.num_layers:
        fail(f"{what}.layers has the wrong number of blocks.", expected=sizes.num_layers, got=len(blocks),
             cause="build num_layers blocks, as the given constructor does.")
    if len({id(block) for block in blocks}) != len(blocks):
        fail(f"{what}.layers repeats the same block object.", expected=f"{sizes.num_layers} distinct blocks",
             got=f"{len({id(block) for block in blocks})} distinct object(s)", cause=REPEATED_BLOCK)
    expected, got = count_parameters(reference), count_parameters(student)
    if got != expected:
        fail(f"{what} has the wrong number of trainable parameters.", expected=expected, got=got,
             cause="keep the given constructor: embedding, positional encoding, the ModuleList of blocks"
                   + (" and pred_layer." if what == "Decoder" else "."))
    student.double().eval()  # .double() reaches a block only when the block is registered
    got_output = expect_tensor(f"{what} output", _run_stack(student, inputs(), what).output,
                               cause="return the output tensor.")
    if got_output.dtype != torch.float64:
        fail(f"after {what}.double() the output is not float64.", expected="torch.float64",
             got=got_output.dtype, cause="some computation creates its own float32 tensor; scale with a Python "
             "float such as math.sqrt(self.d_model).")


@check("Encoder registers num_layers distinct blocks: they are counted, trained and moved by .to()/.double()")
def encoder_layers_registered(Encoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    tokens = _tokens(config.batch, config.src_len, config.src_vocab, config.pad_idx, seed=31)
    _layers_registered(Encoder, ReferenceEncoder, "Encoder", config,
                       lambda: (tokens, make_source_mask(tokens, config.pad_idx)))


# --- Decoder -----------------------------------------------------------------------------------------


def _decode(decoder: nn.Module, tokens: torch.Tensor, memory: torch.Tensor, enc_mask: torch.Tensor | None,
            dec_mask: torch.Tensor | None, scale: str = "sqrt", swap: bool = False, self_memory: bool = False,
            which: str = "all", head: str = "logits") -> torch.Tensor:
    """The reference decoder step by step, optionally with a known mistake."""
    x = _embed(decoder, tokens, scale)
    if swap:
        enc_mask, dec_mask = dec_mask, enc_mask
    for layer in _layers(decoder, which):
        x = layer(x, x if self_memory else memory, enc_mask, dec_mask)
    if head == "none":
        return x
    logits = decoder.pred_layer(x)  # (batch, tgt_len, vocab_size)
    return {"logits": logits, "softmax": logits.softmax(-1), "log_softmax": logits.log_softmax(-1)}[head]


def _decoder_case(Decoder: type[nn.Module], sizes: Sizes, seed: int, weights: bool = True) -> tuple:
    """(student, reference, target, memory, enc_mask, dec_mask); float64 with the reference weights, or the
    student's decoder as built (float32, no names needed) when `weights` is False."""
    args = sizes.stack_args(sizes.tgt_vocab)
    student, reference = _pair(Decoder, ReferenceDecoder, args, "Decoder", seed) if weights else (
        _alone(Decoder, args, "Decoder", seed), None)
    source = _tokens(sizes.batch, sizes.src_len, sizes.src_vocab, sizes.pad_idx, seed=seed + 1)
    target = _tokens(sizes.batch, sizes.tgt_len, sizes.tgt_vocab, sizes.pad_idx, seed=seed + 2)
    memory = randn(sizes.batch, sizes.src_len, sizes.d_model, seed=seed + 3,  # stands in for enc_out
                   dtype=torch.float64 if weights else torch.float32)
    enc_mask = make_source_mask(source, sizes.pad_idx)
    dec_mask = reference_target_mask(target, sizes.pad_idx)
    return student, reference, target, memory, enc_mask, dec_mask


def _missing_prediction(got: object, sizes: Sizes) -> str | None:
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (sizes.batch, sizes.tgt_len, sizes.d_model):
        return "the prediction layer is missing: return self.pred_layer(x), the logits over the target vocabulary."
    return None


@check("Decoder returns logits over the target vocabulary: shape (batch, tgt_len, vocab_size)")
def decoder_output_shape(Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"src_len": 9, "tgt_len": 6} | sizes))
    student, _, target, memory, enc_mask, dec_mask = _decoder_case(Decoder, config, seed=40, weights=False)
    inputs = (target, memory, enc_mask, dec_mask)
    try:
        got = _run_stack(student, inputs, "Decoder").output
    except RuntimeError as error:  # source and target lengths differ here, so swapped masks cannot broadcast
        crash = error
    else:
        crash = None
    if crash is not None:
        try:
            _run(student, target, memory, dec_mask, enc_mask)
        except Exception:
            raise crash from None
        fail("Decoder crashes with (enc_mask, dec_mask) but runs when the two masks are exchanged.",
             expected="Decoder(tgt, enc_out, enc_mask, dec_mask) to run",
             got=f"{type(crash).__name__}: {str(crash).splitlines()[0][:120]}",
             cause="enc_mask and dec_mask are swapped: the block's signature is layer(x, enc_out, enc_mask, "
                   "dec_mask); self-attention needs the target mask, cross-attention the source mask.")
    cause = _missing_prediction(got, config) or (
        "embed, scale, add PE, apply every layer, then self.pred_layer maps d_model to vocab_size.")
    expect_shape("Decoder(tgt, enc_out, enc_mask, dec_mask)", got,
                 (config.batch, config.tgt_len, config.tgt_vocab), cause=cause)


@check("Decoder gives the reference logits: scaled embedding + PE, every layer with enc_out and both masks, "
       "then pred_layer")
def decoder_values(Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    student, reference, target, memory, enc_mask, dec_mask = _decoder_case(Decoder, config, seed=41)
    inputs = (target, memory, enc_mask, dec_mask)
    trace = _run_stack(student, inputs, "Decoder")
    arguments = (reference, target, memory, enc_mask, dec_mask)
    with torch.no_grad():
        expected = _decode(*arguments)
        suspects = {cause: (lambda scale=scale: _decode(*arguments, scale=scale))
                    for scale, cause in SCALE_SUSPECTS.items()}
        suspects |= {
            "enc_mask and dec_mask are swapped: the block's signature is layer(x, enc_out, enc_mask, dec_mask); "
            "self-attention needs the target mask, cross-attention the source mask.": (
                lambda: _decode(*arguments, swap=True)
            ),
            "the layers attend to the decoder's own states instead of the encoder output: pass enc_out as the "
            "second argument, layer(x, enc_out, enc_mask, dec_mask).": lambda: _decode(*arguments, self_memory=True),
            "dec_mask is not passed: without it every position sees later target tokens.": (
                lambda: _decode(reference, target, memory, enc_mask, None)
            ),
            "enc_mask is not passed: cross-attention then looks at source padding.": (
                lambda: _decode(reference, target, memory, None, dec_mask)
            ),
            "only the first layer is applied: loop over all of self.layers.": (
                lambda: _decode(*arguments, which="first")
            ),
            "every layer gets the embeddings and only the last result is kept: feed each layer's output into "
            "the next.": lambda: _decode(*arguments, which="last"),
            REPEATED_BLOCK: lambda: _decode(*arguments, which="repeat"),
            "softmax is applied: return the raw logits; the loss (cross-entropy) applies log-softmax itself.": (
                lambda: _decode(*arguments, head="softmax")
            ),
            "log-softmax is applied: return the raw logits; nn.CrossEntropyLoss applies log-softmax itself.": (
                lambda: _decode(*arguments, head="log_softmax")
            ),
        }
        _expect_stack("Decoder(tgt, enc_out, enc_mask, dec_mask)", trace, expected, student, inputs,
                      suspects=suspects, cause=_missing_prediction(trace.output, config)
                      or "x = embedding * sqrt(d_model) -> PE -> x = layer(x, enc_out, enc_mask, dec_mask) "
                         "for every layer -> pred_layer(x).")


@check("Decoder registers num_layers distinct blocks: they are counted, trained and moved by .to()/.double()")
def decoder_layers_registered(Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    source = _tokens(config.batch, config.src_len, config.src_vocab, config.pad_idx, seed=50)
    target = _tokens(config.batch, config.tgt_len, config.tgt_vocab, config.pad_idx, seed=51)
    memory = randn(config.batch, config.src_len, config.d_model, seed=52)
    _layers_registered(Decoder, ReferenceDecoder, "Decoder", config, lambda: (
        target, memory, make_source_mask(source, config.pad_idx), reference_target_mask(target, config.pad_idx)))


# --- the stacks' dropout -------------------------------------------------------------------------------


@check("Encoder and Decoder drop out their embeddings in train mode (self.positional_encoding); eval mode is "
       "deterministic")
def embedding_dropout(Encoder: type[nn.Module], Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"dropout": 0.5} | sizes))
    source = _tokens(config.batch, config.src_len, config.src_vocab, config.pad_idx, seed=111)
    target = _tokens(config.batch, config.tgt_len, config.tgt_vocab, config.pad_idx, seed=112)
    memory = randn(config.batch, config.src_len, config.d_model, seed=113, dtype=torch.float32)
    enc_mask, dec_mask = make_source_mask(source, config.pad_idx), reference_target_mask(target, config.pad_idx)
    for what, Student, vocab, inputs in (("Encoder", Encoder, config.src_vocab, (source, enc_mask)),
                                         ("Decoder", Decoder, config.tgt_vocab, (target, memory, enc_mask, dec_mask))):
        stack = _alone(Student, config.stack_args(vocab), what, seed=110)
        with _seeded(0):
            first = _run_stack(stack.train(), inputs, what)
            second = _run_stack(stack, inputs, what).output
            evaluated = [_run_stack(stack.eval(), inputs, what).output for _ in range(2)]
        if not any(call.name == "positional_encoding" for call in first.calls):
            fail(f"the {what}'s embeddings are never dropped out.",
                 expected="self.positional_encoding(x) called (it adds PE and applies dropout)",
                 got="self.positional_encoding is never called",
                 cause="call self.positional_encoding(x) rather than adding the table by hand: the module also "
                       "applies dropout to the embeddings in train mode.")
        output = expect_tensor(f"{what} output", first.output, cause="return the output tensor.")
        if isinstance(second, torch.Tensor) and torch.equal(output, second):
            fail(f"two forward passes of the {what} in train mode gave identical outputs.",
                 expected="different dropout masks", got="identical outputs",
                 cause="use the modules' dropout (nn.Dropout follows .train()/.eval()) and do not switch to eval "
                       "mode inside forward.")
        expect_close(f"{what} output in eval mode (second pass)", evaluated[1], evaluated[0], atol=0, rtol=0,
                     cause="in eval mode nothing may be random: use nn.Dropout modules, not F.dropout(training=True).")


# --- Transformer -------------------------------------------------------------------------------------
#
# The reference Encoder and Decoder (with the reference's weights) are plugged into the student's
# Transformer, and the masks are the reference's: only the Transformer's own forward is graded here.

STACK_CLASSES = (("encoder", "Encoder"), ("decoder", "Decoder"))


@dataclass
class _Model:
    student: nn.Module
    reference: nn.Module
    parts: tuple[str, str]  # where the encoder and the decoder sit in the student's Transformer


def _plugged(Transformer: type[nn.Module], sizes: Sizes, seed: int) -> _Model:
    """The student's Transformer with the reference Encoder and Decoder plugged in, float64, eval mode."""
    with _seeded(seed):
        reference = ReferenceTransformer(*sizes.transformer_args())
        student = _construct(Transformer, sizes.transformer_args(), "Transformer")
    parts = []
    for name, kind in STACK_CLASSES:
        found = name if isinstance(getattr(student, name, None), nn.Module) else next(
            (child for child, module in student.named_children() if type(module).__name__ == kind), None)
        if found is None:
            fail(f"Transformer has no {name} to plug the reference {kind} into.",
                 expected=f"self.{name} = {kind}(...), as in the given constructor",
                 got=f"children {[child for child, _ in student.named_children()]}",
                 cause="keep the given constructor: these checks grade the Transformer's own forward with the "
                       "reference Encoder and Decoder plugged in at self.encoder and self.decoder.")
        setattr(student, found, copy.deepcopy(getattr(reference, name)))
        parts.append(found)
    return _Model(student.double().eval(), reference.double().eval(), (parts[0], parts[1]))


def _transformer_departure(trace: _Trace, inputs: tuple, parts: tuple[str, str], complete: bool) -> str | None:
    source, target, enc_mask, dec_mask = inputs
    values = Values()
    values.add("src", "enc_in (the source ids)", source)
    values.add("tgt", "dec_in (the target ids)", target)
    values.add("src_mask", "enc_mask (the source mask)", enc_mask, mask=True)
    values.add("tgt_mask", "dec_mask (the target mask)", dec_mask, mask=True)
    encoder, decoder = parts
    steps = [Step(encoder, {"x": terms("src"), "mask": terms("src_mask")}, "encoder", words="the encoder's output"),
             Step(decoder, {"x": terms("tgt"), "enc_out": terms("encoder"), "enc_mask": terms("src_mask"),
                            "dec_mask": terms("tgt_mask")}, "decoder", words="the decoder's output")]
    return first_departure(trace.calls, steps, values, where="Transformer.forward", result=trace.output,
                           result_key="decoder" if complete else None, ordered=[parts], complete=complete)


def _run_model(model: _Model, inputs: tuple, grad: bool = False) -> _Trace:
    return _traced(model.student, inputs, model.parts, what="Transformer", grad=grad,
                   explain=lambda trace: _transformer_departure(trace, inputs, model.parts, complete=False))


def _transformer_case(Transformer: type[nn.Module], sizes: Sizes, seed: int) -> tuple:
    model = _plugged(Transformer, sizes, seed)
    source = _tokens(sizes.batch, sizes.src_len, sizes.src_vocab, sizes.pad_idx, seed=seed + 1)
    target = _tokens(sizes.batch, sizes.tgt_len, sizes.tgt_vocab, sizes.pad_idx, seed=seed + 2)
    return model, source, target


def _masks(source: torch.Tensor, target: torch.Tensor, pad_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    return make_source_mask(source, pad_idx), reference_target_mask(target, pad_idx)


def _wiring(model: _Model, inputs: tuple, default: str) -> str:
    """The first place the Transformer's forward departs from encoder -> decoder, or `default`."""
    return _transformer_departure(_run_model(model, inputs), inputs, model.parts, complete=True) or default


WIRING = ("enc_out = self.encoder(enc_in, enc_mask); logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask); "
          "return logits.")


@check("Transformer maps (src, tgt) to logits of shape (batch, tgt_len, tgt_vocab)")
def transformer_output_shape(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"src_len": 9, "tgt_len": 6} | sizes))
    model, source, target = _transformer_case(Transformer, config, seed=60)
    inputs = (source, target, *_masks(source, target, config.pad_idx))
    trace = _run_model(model, inputs)
    expect_shape("Transformer(src, tgt, src_mask, tgt_mask)", trace.output,
                 (config.batch, config.tgt_len, config.tgt_vocab),
                 cause=_transformer_departure(trace, inputs, model.parts, complete=True) or WIRING)


@check("Transformer gives the reference logits: encoder output feeds the decoder, each mask where it belongs")
def transformer_values(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    model, source, target = _transformer_case(Transformer, config, seed=61)
    enc_mask, dec_mask = _masks(source, target, config.pad_idx)
    inputs = (source, target, enc_mask, dec_mask)
    trace = _run_model(model, inputs)
    encoder, decoder = model.reference.encoder, model.reference.decoder
    with torch.no_grad():
        expected = model.reference(*inputs)
        suspects = {
            "the masks are swapped in the decoder call: decoder(dec_in, enc_out, enc_mask, dec_mask).": (
                lambda: decoder(target, encoder(source, enc_mask), dec_mask, enc_mask)
            ),
            "the encoder runs without the source mask: encoder(enc_in, enc_mask).": (
                lambda: decoder(target, encoder(source, None), enc_mask, dec_mask)
            ),
            "the decoder gets no source mask: cross-attention needs enc_mask to skip source padding.": (
                lambda: decoder(target, encoder(source, enc_mask), None, dec_mask)
            ),
            "the decoder gets no target mask: pass dec_mask, or every position sees later tokens.": (
                lambda: decoder(target, encoder(source, enc_mask), enc_mask, None)
            ),
            "the target mask is given to the encoder: the encoder uses the source mask.": (
                lambda: decoder(target, encoder(source, dec_mask), enc_mask, dec_mask)
            ),
        }
        got = trace.output
        cause = WIRING
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not tensors_close(got, expected,
                                                                                                 **TOLERANCE):
            cause = _transformer_departure(trace, inputs, model.parts, complete=True) or WIRING
        expect_close("Transformer(src, tgt, src_mask, tgt_mask)", got, expected, suspects=suspects, cause=cause,
                     **TOLERANCE)


def _copy_attention(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
    theirs.out_proj.weight.copy_(ours.W_o.weight)
    theirs.out_proj.bias.copy_(ours.W_o.bias)


def _copy_linear(ours: nn.Module, theirs: nn.Module) -> None:
    theirs.weight.copy_(ours.weight)
    theirs.bias.copy_(ours.bias)


def torch_transformer_like(reference: nn.Module, sizes: Sizes) -> nn.Transformer:
    """PyTorch's nn.Transformer holding the reference's block weights (post-LN, no final stack norms)."""
    with _seeded(0):
        builtin = nn.Transformer(sizes.d_model, sizes.num_heads, sizes.num_layers, sizes.num_layers, sizes.d_ff,
                                 dropout=0.0, activation="relu", batch_first=True, norm_first=False,
                                 dtype=torch.float64)
    builtin.encoder.norm = None  # nn.Transformer adds a LayerNorm after each stack; the paper's model has none
    builtin.decoder.norm = None
    with torch.no_grad():
        for ours, theirs in zip(reference.encoder.layers, builtin.encoder.layers, strict=True):
            _copy_attention(ours.self_attn, theirs.self_attn)
            for a, b in [(ours.feed_forward.fc1, theirs.linear1), (ours.feed_forward.fc2, theirs.linear2),
                         (ours.norm1, theirs.norm1), (ours.norm2, theirs.norm2)]:
                _copy_linear(a, b)
        for ours, theirs in zip(reference.decoder.layers, builtin.decoder.layers, strict=True):
            _copy_attention(ours.self_attn, theirs.self_attn)
            _copy_attention(ours.cross_attn, theirs.multihead_attn)
            for a, b in [(ours.feed_forward.fc1, theirs.linear1), (ours.feed_forward.fc2, theirs.linear2),
                         (ours.norm1, theirs.norm1), (ours.norm2, theirs.norm2), (ours.norm3, theirs.norm3)]:
                _copy_linear(a, b)
    return builtin.eval()


def torch_transformer_logits(builtin: nn.Transformer, reference: nn.Module, source: torch.Tensor,
                             target: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """Our embeddings * sqrt(d_model) + PE around nn.Transformer, then our pred_layer.

    nn.Transformer's bool masks mean True = NOT allowed, the opposite of the course's masks.
    """
    source_x = _embed(reference.encoder, source)  # (batch, src_len, d_model)
    target_x = _embed(reference.decoder, target)  # (batch, tgt_len, d_model)
    future = ~torch.ones(target.size(1), target.size(1), dtype=torch.bool).tril()  # True above the diagonal
    hidden_states = builtin(source_x, target_x, tgt_mask=future, src_key_padding_mask=source == pad_idx,
                            tgt_key_padding_mask=target == pad_idx, memory_key_padding_mask=source == pad_idx)
    return reference.decoder.pred_layer(hidden_states)  # (batch, tgt_len, tgt_vocab)


@check("Transformer equals PyTorch's nn.Transformer with the same weights (plus our embeddings, PE, pred_layer)")
def matches_torch_transformer(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"src_len": 8, "tgt_len": 6} | sizes))
    model, source, target = _transformer_case(Transformer, config, seed=70)
    inputs = (source, target, *_masks(source, target, config.pad_idx))
    got = _run_model(model, inputs).output
    builtin = torch_transformer_like(model.reference, config)
    with torch.no_grad():
        expected = torch_transformer_logits(builtin, model.reference, source, target, config.pad_idx)
    cause = "your model differs from nn.Transformer (post-LN, ReLU, no final stack LayerNorm)."
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and not tensors_close(got, expected, 1e-5, 1e-5):
        cause = _wiring(model, inputs, cause)
    expect_close("Transformer(src, tgt, src_mask, tgt_mask)", got, expected, atol=1e-5, rtol=1e-5, cause=cause)


@check("the full model is causal: changing target tokens after position t never changes the logits at <= t")
def transformer_causality(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    model = _plugged(Transformer, config, seed=80)
    source = _tokens(config.batch, config.src_len, config.src_vocab, config.pad_idx, seed=81)
    target = _tokens(config.batch, config.tgt_len, config.tgt_vocab, config.pad_idx, seed=82, padded=False)
    enc_mask = make_source_mask(source, config.pad_idx)

    def logits(tokens: torch.Tensor) -> tuple[tuple, torch.Tensor]:
        inputs = (source, tokens, enc_mask, reference_target_mask(tokens, config.pad_idx))
        return inputs, expect_shape("Transformer(...)", _run_model(model, inputs).output,
                                    (config.batch, config.tgt_len, config.tgt_vocab), cause="return the logits.")

    _, original = logits(target)
    for position in range(config.tgt_len - 1):
        changed = target.clone()
        changed[:, position + 1:] = _other_tokens(target, config.tgt_vocab, config.pad_idx,
                                                  seed=83 + position)[:, position + 1:]
        inputs, new = logits(changed)
        difference = (new[:, : position + 1] - original[:, : position + 1]).abs().max().item()
        if difference > 1e-8:
            fail(f"changing the target tokens after position {position} changed the logits at positions "
                 f"0..{position}.", expected="identical logits at positions <= t",
                 got=f"largest change {difference:.3g}",
                 cause=_wiring(model, inputs, "the decoder's self-attention must receive dec_mask: "
                                              "self.decoder(dec_in, enc_out, enc_mask, dec_mask)."))


@check("source padding changes nothing: extra pad tokens on the source, with the source mask, keep every logit")
def source_padding_invariance(Transformer: type[nn.Module], extra: int = 3, **sizes: float) -> None:
    config = _sizes(**sizes)
    model = _plugged(Transformer, config, seed=90)
    source = _tokens(config.batch, config.src_len, config.src_vocab, config.pad_idx, seed=91)
    target = _tokens(config.batch, config.tgt_len, config.tgt_vocab, config.pad_idx, seed=92)
    longer = torch.cat([source, torch.full((config.batch, extra), config.pad_idx)], dim=1)
    dec_mask = reference_target_mask(target, config.pad_idx)
    short = _run_model(model, (source, target, make_source_mask(source, config.pad_idx), dec_mask)).output
    inputs = (longer, target, make_source_mask(longer, config.pad_idx), dec_mask)
    long = _run_model(model, inputs).output
    short = expect_tensor("logits", short, cause="return the logits.")
    if isinstance(long, torch.Tensor) and long.shape == short.shape and tensors_close(long, short, 1e-8, 1e-8):
        return
    expect_close(f"logits with {extra} extra source pad tokens", long, short, atol=1e-8, rtol=1e-8,
                 cause=_wiring(model, inputs, "the source padding is seen: the encoder needs enc_mask, and the "
                                              "decoder needs it too for cross-attention."))


@check("target padding changes nothing: extra pad tokens at the end of the target keep the real positions' logits")
def target_padding_invariance(Transformer: type[nn.Module], extra: int = 3, **sizes: float) -> None:
    config = _sizes(**sizes)
    model = _plugged(Transformer, config, seed=100)
    source = _tokens(config.batch, config.src_len, config.src_vocab, config.pad_idx, seed=101)
    target = _tokens(config.batch, config.tgt_len, config.tgt_vocab, config.pad_idx, seed=102, padded=False)
    longer = torch.cat([target, torch.full((config.batch, extra), config.pad_idx)], dim=1)
    enc_mask = make_source_mask(source, config.pad_idx)
    short = _run_model(model, (source, target, enc_mask, reference_target_mask(target, config.pad_idx))).output
    inputs = (source, longer, enc_mask, reference_target_mask(longer, config.pad_idx))
    long = expect_tensor("logits", _run_model(model, inputs).output, cause="return the logits.")
    short = expect_tensor("logits", short, cause="return the logits.")
    expect_close(f"logits at the real positions with {extra} extra target pad tokens", long[:, : config.tgt_len],
                 short, atol=1e-8, rtol=1e-8,
                 cause=_wiring(model, inputs, "real positions see the pad tokens after them: the decoder must "
                                              "receive dec_mask, self.decoder(dec_in, enc_out, enc_mask, dec_mask)."))


@check("gradients flow through the Transformer to every weight of the encoder and the decoder")
def transformer_gradients(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    model, source, target = _transformer_case(Transformer, config, seed=130)
    inputs = (source, target, *_masks(source, target, config.pad_idx))
    trace = _run_model(model, inputs, grad=True)
    logits = expect_tensor("logits", trace.output, cause="return the logits.")
    if logits.requires_grad:
        (logits * randn(*logits.shape, seed=131)).sum().backward()
    for part in model.parts:
        stack = getattr(model.student, part)
        starved = [name for name, parameter in stack.named_parameters()
                   if parameter.grad is None or not bool(parameter.grad.abs().sum() > 0)]
        if not starved:
            continue
        calls = {call.name: call for call in trace.calls}
        encoder, decoder = calls.get(model.parts[0]), calls.get(model.parts[1])
        memory = decoder.args.get("enc_out") if decoder else None
        if part == model.parts[0] and encoder and encoder.returned and isinstance(encoder.output, torch.Tensor) \
                and not encoder.output.requires_grad:
            cause = "the encoder runs under torch.no_grad() (or its output is detached): it can never learn."
        elif part == model.parts[0] and isinstance(memory, torch.Tensor) and not memory.requires_grad:
            cause = ("the decoder receives the encoder's output cut off from the graph (.detach(), .data or "
                     "torch.no_grad()): no gradient reaches the encoder, so it never learns.")
        elif not logits.requires_grad:
            cause = "the logits are not connected to the weights: no torch.no_grad() or .detach() inside forward."
        else:
            cause = f"the {part}'s output must be part of the computation of the logits: " + WIRING
        fail(f"no gradient reaches the {part}.", expected="every weight gets a gradient from the logits",
             got=f"no gradient for {len(starved)} of its parameters, e.g. {starved[0]}", cause=cause)


@check("no PyTorch built-in attention or Transformer layers inside your model")
def no_builtin_modules(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    with _seeded(120):
        model = _construct(Transformer, config.transformer_args(), "Transformer")
    source = _tokens(config.batch, config.src_len, config.src_vocab, config.pad_idx, seed=121)
    target = _tokens(config.batch, config.tgt_len, config.tgt_vocab, config.pad_idx, seed=122)
    model.train()  # the training path of nn.MultiheadAttention goes through the guarded functions
    try:
        with student_code():
            model(source, target, *_masks(source, target, config.pad_idx))
    except (NotImplementedError, CheckFailed):
        raise
    except Exception:  # noqa: BLE001  (a crash is graded by the checks of the part that crashes, not here)
        pass
    reject_builtin_modules(model, "Transformer")
