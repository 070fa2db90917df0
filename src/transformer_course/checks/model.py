"""Stage 4 checks: the target mask, the Encoder and Decoder stacks and the full Transformer.

Each component is checked with reference parts for everything else, so a mistake costs the points of the
checks about it once: the stacks run the reference blocks (imported by the notebook), and the Transformer
checks plug the reference Encoder and Decoder into the student's Transformer (where it keeps its encoder and
decoder), so they grade only its wiring, with reference masks. Expected values come from the reference
modules with the same weights, in float64 and eval mode, on token batches drawn from private generators.

Building and running the student's modules are experiments (`boundary.on_student_side`): the reference parts
they plug in are declared with `boundary.supplied`. Parts are found by role (`parts.pair`), so a renamed
attribute, an extra final LayerNorm or blocks kept in a plain list change nothing but what they change.
When a value differs, the recorded calls of the parts are replayed along the paper's computation to name the
first place the student's forward departs, with the student's line; the differential engine speaks when the
replay finds nothing. A wrong mask is read as a function of where each key lies (earlier, the same position,
later; a real token or padding).
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from types import MethodType
from typing import Any

import torch
from torch import nn

from transformer_course.checks import differential, parts
from transformer_course.checks.boundary import on_student_side, supplied
from transformer_course.checks.framework import (
    REFERENCE_VALUES,
    CheckFailed,
    Diagnosis,
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
from transformer_course.checks.predictions import expect_number, parameters_of
from transformer_course.reference import Decoder as ReferenceDecoder
from transformer_course.reference import Encoder as ReferenceEncoder
from transformer_course.reference import Transformer as ReferenceTransformer
from transformer_course.reference import count_parameters, make_source_mask
from transformer_course.reference import make_target_mask as reference_target_mask

# the parts of PyTorch this stage's grade cells meet, used once before any notebook code (runner.warm_up_torch):
# tests/test_grading_speed.py fails when a grade cell imports a module
WARM_UP: tuple[str, ...] = ("shape checks", "optimiser step")

__all__ = [
    "predicted_parameter_count",
    "predicted_tying_saving",
    "decoder_every_part_learns",
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
    "transformer_own_embeddings",
    "transformer_output_shape",
    "transformer_values",
]

Tensor = torch.Tensor
TOLERANCE = {"atol": 1e-7, "rtol": 1e-6}  # float64 on both sides: only rounding differs
AXES = ("batch", "position", "feature")


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

    def stack_args(self, what: str) -> tuple:
        """The arguments of the Encoder (`what`, with the source vocabulary) or the Decoder (the target's)."""
        vocab = self.src_vocab if what == "Encoder" else self.tgt_vocab
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


def _tokens(batch: int, length: int, vocab: int, pad_idx: int, seed: int, padded: bool = True) -> Tensor:
    """Token ids (batch, length): no pad id among the real tokens, pad_idx after each real length."""
    draws = torch.randint(0, vocab - 1, (batch, length), generator=generator(seed))
    tokens = draws + (draws >= pad_idx).long()  # skip the pad id: values 0..vocab-1 without pad_idx
    tokens[0, 0] = 0 if pad_idx != 0 else 1  # a low real id, so a hard-coded pad id of 0 shows up
    if padded:
        for row, real in enumerate(_lengths(batch, length)):
            tokens[row, real:] = pad_idx
    return tokens


def _other_tokens(tokens: Tensor, vocab: int, pad_idx: int, seed: int) -> Tensor:
    """Real (non-pad) token ids that differ from `tokens` at every position."""
    real = torch.tensor([token for token in range(vocab) if token != pad_idx])  # (vocab - 1,)
    rank = (real.unsqueeze(0).unsqueeze(0) == tokens.unsqueeze(-1)).long().argmax(-1)  # index of each token
    offset = torch.randint(1, vocab - 1, tokens.shape, generator=generator(seed))  # 1 .. vs - 2
    return real[(rank + offset) % (vocab - 1)]


def _token_pair(sizes: Sizes, seed: int, padded: bool = True) -> tuple[Tensor, Tensor]:
    """Source ids (batch, src_len) drawn with `seed`, target ids (batch, tgt_len) with `seed + 1`, the target
    without padding unless `padded`."""
    return (_tokens(sizes.batch, sizes.src_len, sizes.src_vocab, sizes.pad_idx, seed=seed),
            _tokens(sizes.batch, sizes.tgt_len, sizes.tgt_vocab, sizes.pad_idx, seed=seed + 1, padded=padded))


def _xavier(module: nn.Module) -> nn.Module:
    for parameter in module.parameters():
        if parameter.dim() > 1:
            nn.init.xavier_uniform_(parameter)
    return module


# --- the target mask ---------------------------------------------------------------------------------


# The course's own mask functions, which would do this exercise's work: the student builds the mask from `tgt`.
# (Not PyTorch built-ins, so `framework.Builtins` cannot name them: a call is seen by its function's name and
# the course module that defines it, so a helper the student writes in the notebook under the same name is theirs.)
DELEGATES = ("make_padding_mask", "make_look_ahead_mask", "make_source_mask", "make_target_mask")


@contextlib.contextmanager
def _course_masks_watched(called: list[str]) -> Iterator[None]:
    """Inside: the first of the course's `DELEGATES` that runs is appended to `called`."""
    previous = sys.getprofile()

    def watch(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and not called and frame.f_code.co_name in DELEGATES \
                and str(frame.f_globals.get("__name__", "")).startswith("transformer_course"):
            called.append(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        yield
    finally:
        sys.setprofile(previous)


def _refuse_delegation(called: list[str]) -> None:
    if called:
        fail(f"make_target_mask calls the course's {called[0]}, which does part of this exercise's work.",
             expected="a mask built from tgt by your own tensor operations",
             got=f"a call to {called[0]}",
             cause="this exercise asks you to build the mask from the tokens yourself, broadcasting included: "
                   "stage 2's make_padding_mask and make_look_ahead_mask (and make_source_mask, which calls the "
                   "first) are not to be used here.")


@on_student_side
def _mask(make_target_mask: Callable, tokens: Tensor, pad_idx: int, crash_as_text: bool = False) -> Any:
    """The student's mask; a call of the course's mask functions fails (`DELEGATES`), and a crash that combines a
    float tensor with & or | is explained. With `crash_as_text` (tgt on another device): ('', the mask), or (the
    error's text, None) when it crashes."""
    called: list[str] = []
    try:
        with student_code(), _course_masks_watched(called):
            mask = make_target_mask(tokens.clone(), pad_idx)
        _refuse_delegation(called)
        return ("", mask) if crash_as_text else mask
    except CheckFailed:
        raise
    except Exception as error:  # noqa: BLE001  (read here, or let through for the check to explain)
        _refuse_delegation(called)
        if crash_as_text and not isinstance(error, NotImplementedError):
            return f"{type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}", None
        if not crash_as_text and isinstance(error, RuntimeError) and "not implemented for" in str(error) \
                and any(kind in str(error) for kind in ("'Float'", "'Double'")):
            fail("make_target_mask crashed while combining its two masks.",
                 expected="two masks of bool (or integer) entries, combined into one",
                 got=f"RuntimeError: {str(error).splitlines()[0][:120]}",
                 cause="one of the masks is a float tensor (torch.ones makes floats unless told otherwise, and "
                       "torch.tril keeps its input's dtype): & and | "
                       "work on bool or integer tensors only. Build it as bool, torch.ones(..., dtype=torch.bool)"
                       ".tril(), or convert it with .bool().")
        raise


def _allowed(name: str, got: object, shape: tuple[int, ...]) -> Tensor:
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
             cause="the course's masks say *where* attention is allowed; attention itself puts -1e9 at the hidden "
                   "scores.")
    return mask != 0


def _mask_reading(allowed: Tensor, tokens: Tensor, pad_idx: int) -> str:
    """The student's mask read as a function of where each key lies for its query (earlier, the same position,
    later) and whether the key is a real token or padding; then named: one of the two masks alone, | instead of
    &, inverted, the diagonal, the triangle, padding on the query rows, another pad id."""
    batch, _, length, _ = allowed.shape
    query = torch.arange(length).view(1, 1, length, 1)
    key = torch.arange(length).view(1, 1, 1, length)
    place = ((key > query).long() + (key >= query).long()).expand_as(allowed)  # 0 earlier, 1 same, 2 later
    pad_key = (tokens == pad_idx).view(batch, 1, 1, length).expand_as(allowed)
    pad_query = (tokens == pad_idx).view(batch, 1, length, 1).expand_as(allowed)
    table: dict[tuple[int, bool], set[bool]] = {}
    for where in range(3):
        for padding in (False, True):
            cell = allowed[(place == where) & (pad_key == padding)]
            if cell.numel():
                table[where, padding] = set(cell.tolist())
    expected = {cell: {cell[0] < 2 and not cell[1]} for cell in table}
    if all(len(values) == 1 for values in table.values()):
        got = {cell: next(iter(values)) for cell, values in table.items()}
        want = {cell: next(iter(values)) for cell, values in expected.items()}
        if all(got[cell] != want[cell] for cell in got):
            return ("the mask is inverted: True must mean *may attend* (the course's convention), so earlier real "
                    "tokens are True and padding and later tokens False; flip the comparison or drop the `~`.")
        if all(got[cell] == (not cell[1]) for cell in got):
            return ("this is the padding mask alone: every position can see later tokens; combine it with the "
                    "look-ahead mask using `&`.")
        if all(got[cell] == (cell[0] < 2) for cell in got):
            return ("this is the look-ahead mask alone: padding keys are not hidden; combine it with the padding "
                    "mask using `&`.")
        if all(got[cell] == (cell[0] < 2 or not cell[1]) for cell in got):
            return ("the two masks are combined with `|` (or): a key is allowed when it is earlier *or* a real "
                    "token; it must be both, padding & look_ahead.")
        said = []
        real = {where: got.get((where, False)) for where in range(3)}  # None: no such cell in this input
        if all(value is not None and value != (where < 2) for where, value in real.items()):
            said.append("for real tokens the look-ahead part is the exact opposite of j <= i: the key itself and "
                        "earlier keys are hidden and later keys allowed (the look-ahead mask is negated with `~`, "
                        "or built as triu() where tril() belongs)")
        else:
            if real[1] is False:
                said.append("your mask lets no position attend to itself (the diagonal is hidden): the look-ahead "
                            "mask must keep the diagonal, as tril() does (tril(-1), and triu() == 0 without "
                            "diagonal=1, drop it)")
            if real[2] and real[0] is False:
                said.append("later keys are allowed and earlier ones hidden: the triangle is the upper one; "
                            "position i may attend to j <= i (tril, or triu(diagonal=1) == 0)")
            elif real[2]:
                said.append("later real tokens are allowed: the look-ahead part is missing")
        if got.get((0, True)) or got.get((1, True)):
            said.append("padding keys are allowed: the padding part is missing")
        if said:
            return "; ".join(said) + "."
    hidden_rows = (~allowed & ~pad_key & (place < 2)).any(dim=-1).squeeze(1)  # real earlier keys hidden, per query
    if bool(hidden_rows.any()) and bool((hidden_rows == pad_query[:, 0, :, 0]).all()):
        return ("padding hides query rows (instead of, or as well as, key columns): the padding mask must have shape "
                "(batch, 1, 1, tgt_len), so that it masks the keys (the last axis).")
    hidden_keys = ((~allowed) | (place == 2)).all(dim=2).squeeze(1)  # (batch, tgt_len): hidden from every query
    treated = sorted({int(token) for token in tokens[hidden_keys].tolist()})
    if treated and pad_idx not in treated:
        return (f"the keys hidden as padding hold token id {', '.join(map(str, treated))}, not pad_idx={pad_idx}: "
                "compare the tokens with the `pad_idx` argument, not a fixed id.")
    return ""


@check("make_target_mask returns one (tgt_len, tgt_len) mask per sentence: shape (batch, 1, tgt_len, tgt_len)")
def target_mask_shape(make_target_mask: Callable, batch: int = 3, tgt_len: int = 6, pad_idx: int = 1) -> None:
    tokens = _tokens(batch, tgt_len, 11, pad_idx, seed=10)
    mask = expect_tensor("make_target_mask(tgt, pad_idx)", _mask(make_target_mask, tokens, pad_idx),
                         cause="return the combined mask tensor.")
    causes = {
        (batch, 1, 1, tgt_len): "this is the shape of the padding rule alone (one row of keys per sentence): "
        "the look-ahead rule, a (tgt_len, tgt_len) table of positions, is missing.",
        (1, 1, tgt_len, tgt_len): "this is the shape of the look-ahead rule alone, the same for every sentence: "
        "the padding rule, one (1, tgt_len) row of keys per sentence, is missing.",
        (batch, tgt_len, tgt_len): "the head axis is missing: keep the 1 in position 1 so the mask broadcasts "
        "over the heads.",
    }
    expect_shape("make_target_mask(tgt, pad_idx)", mask, (batch, 1, tgt_len, tgt_len),
                 cause=causes.get(tuple(mask.shape), "a padding rule shaped (batch, 1, 1, tgt_len) and a look-ahead "
                                  "rule shaped (1, 1, tgt_len, tgt_len) broadcast to (batch, 1, tgt_len, tgt_len)."))


@check("make_target_mask allows key j for query i exactly when j <= i and token j is not padding")
def target_mask_values(make_target_mask: Callable, batch: int = 3, tgt_len: int = 6, pad_idx: int = 1) -> None:
    tokens = _tokens(batch, tgt_len, 11, pad_idx, seed=11)
    allowed = _allowed("make_target_mask(tgt, pad_idx)", _mask(make_target_mask, tokens, pad_idx),
                       (batch, 1, tgt_len, tgt_len))
    expected = reference_target_mask(tokens, pad_idx)
    if torch.equal(allowed, expected):
        return
    row, _, query, key = (int(i) for i in (allowed != expected).nonzero()[0])
    word = "allowed" if expected[row, 0, query, key] else "hidden"
    reason = "padding" if tokens[row, key] == pad_idx else ("a later position" if key > query else "a real token")
    fail("make_target_mask has wrong entries.",
         expected=f"sentence {row}, query {query}, key {key} {word} (key {key} is {reason}; "
                  f"tokens {tokens[row].tolist()}, pad_idx={pad_idx})",
         got="allowed" if allowed[row, 0, query, key] else "hidden",
         cause=_fixed_pad_id(make_target_mask, pad_idx) or _mask_reading(allowed, tokens, pad_idx)
         or "query i may attend to key j when j <= i (look-ahead) and tokens[j] != pad_idx (padding).")


def _fixed_pad_id(make_target_mask: Callable, pad_idx: int) -> str:
    """Whether the student's mask hides real tokens of some other id as if they were padding: two sentences holding
    every id from 0 to 11 once (pad_idx excepted), in opposite orders, read from the last query's row (which the
    look-ahead mask lets see every key, its own included). The same one or two ids hidden in both orders, whatever
    their position, are taken for a pad id; '' otherwise."""
    forward = [token for token in range(12) if token != pad_idx]
    ids = torch.tensor([forward, forward[::-1]])  # (2, 11), no padding at all
    try:
        got = _mask(make_target_mask, ids, pad_idx)
        rows = got.expand(2, 1, ids.size(1), ids.size(1))[:, 0, -1, :] != 0 if isinstance(got, Tensor) else None
    except Exception:  # noqa: BLE001  (a crash here is the other readings' business)
        return ""
    if rows is None:
        return ""
    hidden = [sorted(int(token) for token in ids[row][~rows[row]]) for row in range(2)]
    if not hidden[0] or hidden[0] != hidden[1] or len(hidden[0]) > 2:
        return ""
    return (f"the keys hidden as padding hold token id {', '.join(map(str, hidden[0]))}, not pad_idx={pad_idx}: "
            "the mask hides real tokens of that id as if they were padding; compare the tokens with the `pad_idx` "
            "argument, not a fixed id.")


DEVICE = ("a tensor made inside make_target_mask (by torch.arange, torch.ones or torch.tril, say) is created on "
          "the CPU whatever the device of tgt, so a batch on a GPU fails: create it on tgt's device, with the "
          "`device=` argument of the function that makes it, torch.arange(..., device=tgt.device).")


@check("make_target_mask builds the mask on the device of tgt (a batch on a GPU gets a GPU mask)")
def target_mask_device(make_target_mask: Callable, batch: int = 2, tgt_len: int = 5, pad_idx: int = 1) -> None:
    """tgt on PyTorch's `meta` device stands for any device other than the CPU (a GPU, say)."""
    on_cpu = _tokens(batch, tgt_len, 11, pad_idx, seed=12)
    _mask(make_target_mask, on_cpu, pad_idx)  # code that fails on the CPU builds no mask on any device
    tokens = on_cpu.to("meta")
    error, got = _mask(make_target_mask, tokens, pad_idx, crash_as_text=True)
    if error:
        if "device" in error:
            fail("make_target_mask mixes devices.", expected="every part of the mask on the device of tgt",
                 got=f"{error} (tgt was on another device than the CPU)", cause=DEVICE)
        return  # the code reads the ids' values, which a meta tensor has not: nothing to say about devices
    mask = expect_tensor("make_target_mask(tgt, pad_idx)", got, cause="return the mask tensor.")
    if mask.dim() < 3:  # the ids themselves, or anything shaped like them: no (query, key) table to place
        fail("make_target_mask returns no (query, key) table for tgt on another device.",
             expected=f"a mask of shape {(batch, 1, tgt_len, tgt_len)} on the device of tgt",
             got=f"a tensor of shape {tuple(mask.shape)} ({mask.dtype})",
             cause="the mask has one (tgt_len, tgt_len) table per sentence, whatever the device of tgt.")
    if mask.device != tokens.device:
        fail("make_target_mask returns its mask on another device than tgt.",
             expected="the device of tgt", got=f"a mask on {mask.device}", cause=DEVICE)


# --- the stacks: built with the reference weights, recorded part by part ------------------------------------

STACKS = {"Encoder": ReferenceEncoder, "Decoder": ReferenceDecoder}
PLAIN_LIST = ("a plain Python list hides the blocks from PyTorch: their parameters are not trained, not saved "
              "and not moved to another device with the model. Wrap the list in nn.ModuleList, as the given "
              "constructor does.")
REPEATED_BLOCK = ("one block object is repeated num_layers times (all layers share its weights): create a new "
                  "block for every layer, [Block(...) for _ in range(num_layers)], as the given constructor does.")


@dataclass
class Stack:
    """The student's Encoder or Decoder as an experiment built it: the student's path for every role
    ('embedding', 'positional_encoding', 'layers', 'pred_layer', and 'extra:<path>' for parts the paper's
    stack has not), its blocks' paths in order, and which of them are one and the same object."""

    paths: dict[str, str]
    blocks: list[str]
    repeated: list[str]
    planned: list[str]  # the paths the paper's num_layers blocks would have


def _roles(stack: Stack) -> dict[str, str]:
    """The recorder's view: the student's path -> role (a block's role is its path)."""
    roles = {path: role for role, path in stack.paths.items() if role != "layers"}
    return roles | {path: path for path in stack.blocks}


@on_student_side
def _stack(Student: type[nn.Module], what: str, args: tuple, state: dict[str, Tensor] | None,
           seed: int) -> tuple[nn.Module, Stack]:
    """The student's stack built from `seed`; with `state`, the reference's weights loaded into its parts by role
    (float64). Blocks kept in a plain list are loaded and converted too: the value checks grade values, and
    `layers_registered` grades registration."""
    with parts.seeded(seed), student_code():
        module = Student(*args)
    reject_builtin_modules(module, what)
    with parts.seeded(seed):
        template = STACKS[what](*args)
    paths = parts.pair(template, module)
    blocks: list[str] = []
    if paths.get("layers"):
        held = parts.locate(module, paths["layers"])
        blocks = [f"{paths['layers']}.{index}" for index in range(len(held))]
    repeated = [path for index, path in enumerate(blocks)
                if any(parts.locate(module, other) is parts.locate(module, path) for other in blocks[:index])]
    if state is not None:
        template.double().load_state_dict(state)
        for each in parts.everything(module):
            each.double()
        for role, path in paths.items():
            reference = getattr(template, role)
            if not any(True for _ in reference.parameters()):
                continue  # the positional table (a fixed buffer) and dropout: nothing to give
            if not path:
                given = ", ".join(name for name, _ in template.named_children())
                fail(f"{what} has no part for its {role.replace('_', ' ')}.",
                     expected=f"the parts of the given constructor: {given}",
                     got=f"the parts {', '.join(name for name, _ in parts.candidates(module)) or 'none'}",
                     cause="keep the given constructor: this check gives your stack's parts the reference's weights "
                           "(by name, else by kind) and compares the numbers.")
            pairs = zip(reference, blocks, strict=False) if role == "layers" else [(reference, path)]
            for source, target in pairs:
                parts.load(parts.locate(module, target), source, f"{what}.{target}")
    paths = {role: path for role, path in paths.items() if path}
    planned = [f"{paths.get('layers') or 'layers'}.{index}" for index in range(len(template.layers))]
    return module, Stack(paths | parts.extras(module, paths), blocks, repeated, planned)


def _reference_stack(what: str, args: tuple, seed: int) -> nn.Module:
    """The reference stack with Xavier matrices and random LayerNorm gains and biases (with gain 1 and bias 0
    a LayerNorm added after the last block would change almost nothing)."""
    with parts.seeded(seed):
        stack = _xavier(STACKS[what](*args)).double().eval()
    with torch.no_grad():
        norms = [module for module in stack.modules() if isinstance(module, nn.LayerNorm)]
        for index, norm in enumerate(norms):
            norm.weight.copy_(1.0 + 0.3 * randn(*norm.weight.shape, seed=seed + 2 * index))
            norm.bias.copy_(0.3 * randn(*norm.bias.shape, seed=seed + 2 * index + 1))
    return stack


def _stack_values(what: str, inputs: tuple) -> parts.Values:
    values = parts.Values()
    values.add("tokens", "the token ids", inputs[0])
    names = ("mask",) if what == "Encoder" else ("enc_out", "enc_mask", "dec_mask")
    for name, value in zip(names, inputs[1:], strict=True):
        values.add(name, f"`{name}`", value, mask=name.endswith("mask"))
    return values


def _stack_steps(what: str, stack: Stack, d_model: int) -> tuple[list[parts.Step], str]:
    """embedding -> × sqrt(d_model) -> positional_encoding -> every block in turn (with the masks) [-> pred_layer]."""
    steps = [parts.Step("embedding", {"input": parts.terms("tokens")}, "embedding"),
             parts.Step("positional_encoding", {"x": parts.terms((math.sqrt(d_model), "embedding"))},
                        "positional_encoding")]
    previous = "positional_encoding"
    extra = {"mask": parts.terms("mask")} if what == "Encoder" else {
        "enc_out": parts.terms("enc_out"), "enc_mask": parts.terms("enc_mask"), "dec_mask": parts.terms("dec_mask")}
    for path in stack.planned:
        steps.append(parts.Step(path, {"x": parts.terms(previous)} | extra, path))
        previous = path
    if what == "Decoder":
        steps.append(parts.Step("pred_layer", {"input": parts.terms(previous)}, "pred_layer"))
        previous = "pred_layer"
    return steps, previous


SCALES = {0.0: "are not multiplied by sqrt(d_model)", -1.0: "are divided by sqrt(d_model) instead of multiplied",
          2.0: "are multiplied by d_model instead of sqrt(d_model)"}  # by the power of sqrt(d_model) they get


def _stack_reading(what: str, stack: Stack, calls: list[parts.Call], inputs: tuple, d_model: int, result: Any,
                   complete: bool = True) -> str | None:
    """Where the student's stack departs from the paper's computation, in words, with the student's line."""
    if stack.repeated:
        return (f"{parts.words(stack.repeated[0])} is the same object as an earlier block: {REPEATED_BLOCK}")
    steps, last = _stack_steps(what, stack, d_model)
    replay = parts.Replay(calls, steps, _stack_values(what, inputs),
                          stack.paths | {path: path for path in [*stack.blocks, *stack.planned]})
    reading = replay.departure(result=result, result_key=last if complete else None, ordered=[stack.planned],
                               complete=complete)
    if reading is None:
        return None
    text = reading.cause()
    if reading.role == "positional_encoding" and reading.argument == "x":
        text += _scale(calls, replay, d_model)
    elif reading.role in stack.planned[1:] and reading.argument == "x":
        text += "; each block must receive the previous block's output: update x in the loop, x = layer(x, ...)"
    elif reading.role == "embedding" and "×" in reading.got:
        text += "; the factor sqrt(d_model) multiplies the embedding vectors, not the token ids"
    elif complete and (after := _unnamed_result(reading, result, replay, last)):
        text = after
    return text


def _unnamed_result(reading: parts.Reading, result: Any, replay: parts.Replay, last: str) -> str:
    """When the reading says forward returns a value none of its parts made: what forward did to the output of
    part `last` before returning it (`_after_last`); '' otherwise."""
    if reading.kind != "result" or reading.got != parts.UNNAMED:
        return ""
    return _after_last(result, replay.values.tensors.get(last), replay.values.names.get(last, ""))


def _scale(calls: list[parts.Call], replay: parts.Replay, d_model: int) -> str:
    """How the embeddings were scaled before the positional encoding, read as a power of sqrt(d_model)."""
    call = next(c for c in calls if c.role == "positional_encoding")
    embedded = replay.values.tensors.get("embedding")
    got = call.args.get("x", call.args.get("input"))
    if not (isinstance(got, Tensor) and isinstance(embedded, Tensor) and got.shape == embedded.shape):
        return ""
    norm = float((embedded.double() ** 2).sum())
    factor = float((got.double() * embedded.double()).sum()) / norm if norm else 0.0
    if not parts._close(got, factor * embedded.double()) or factor <= 0:
        return ""
    power = round(math.log(factor) / math.log(math.sqrt(d_model)), 6)
    after = next((c for c in calls if c.role != "positional_encoding" and c.role not in ("embedding", "dropout")
                  and c.returned), None)
    pe = next((c for c in calls if c.role == "positional_encoding" and c.returned), None)
    if power == 0.0 and after is not None and pe is not None:
        fed = after.args.get("x", after.args.get("input"))
        if parts._close(fed, math.sqrt(d_model) * pe.output.double()):
            return ("; sqrt(d_model) multiplies the sum embedding + PE: scale the embeddings *before* adding PE, "
                    "self.positional_encoding(self.embedding(x) * sqrt(d_model))")
    words = SCALES.get(power)
    return f"; the embeddings {words}" if words else ""


def _after_last(result: Any, last: Any, words: str) -> str:
    """What forward did to the last part's output (`words`) before returning it: a softmax, a log-softmax, or
    another relation the values show ('' when none)."""
    if not (isinstance(result, Tensor) and isinstance(last, Tensor) and result.shape == last.shape):
        return ""
    for name, function in (("a softmax", torch.softmax), ("a log-softmax", torch.log_softmax)):
        if parts._close(result, function(last.double(), -1)):
            return (f"forward returns {name} of {words} where the reference returns the raw logits: the loss "
                    "(cross-entropy) applies log-softmax itself")
    how = differential.relation(result, last, differential.Context(), None)
    return f"forward returns {words} changed: {how}" if how and not how.startswith("1 ×") else ""


def _stack_run(what: str, module: Any, stack: Stack, inputs: tuple, d_model: int, train: bool = False,
               seeds: tuple[int, ...] = (7,)) -> parts.Run:
    return parts.observe(module, inputs, what, _roles(stack),
                         lambda calls: _stack_reading(what, stack, calls, inputs, d_model, None, complete=False),
                         train=train, seeds=seeds)


def _encoder_inputs(sizes: Sizes, seed: int) -> tuple[Tensor, Tensor]:
    tokens = _tokens(sizes.batch, sizes.src_len, sizes.src_vocab, sizes.pad_idx, seed=seed)
    return tokens, make_source_mask(tokens, sizes.pad_idx)


def _decoder_inputs(sizes: Sizes, seed: int, dtype: torch.dtype = torch.float64) -> tuple:
    """(target, memory, enc_mask, dec_mask); the memory stands in for enc_out."""
    source, target = _token_pair(sizes, seed)
    memory = randn(sizes.batch, sizes.src_len, sizes.d_model, seed=seed + 2, dtype=dtype)
    return target, memory, make_source_mask(source, sizes.pad_idx), reference_target_mask(target, sizes.pad_idx)


def _shape_check(what: str, Student: type[nn.Module], sizes: Sizes, inputs: tuple, shape: tuple[int, ...],
                 name: str, cause: str, seed: int) -> None:
    module, stack = _stack(Student, what, sizes.stack_args(what), None, seed)
    run = _stack_run(what, module, stack, inputs, sizes.d_model)
    got = run.outputs[0]
    if isinstance(got, Tensor) and tuple(got.shape) != shape:
        cause = parts.safely(_stack_reading, what, stack, run.calls, inputs, sizes.d_model, got) or cause
    expect_shape(name, got, shape, cause=cause)


def _values_check(what: str, Student: type[nn.Module], sizes: Sizes, inputs: tuple, name: str, cause: str,
                  seed: int) -> None:
    """The student's stack, holding the reference's weights, against the reference: expect_close, with the
    stack's departure from the paper (or the engine's reading) as the cause."""
    args = sizes.stack_args(what)
    reference = _reference_stack(what, args, seed)
    module, stack = _stack(Student, what, args, reference.state_dict(), seed)
    run = _stack_run(what, module, stack, inputs, sizes.d_model)
    with torch.no_grad():
        expected = reference(*inputs)
    names = ("tokens", "mask") if what == "Encoder" else ("tokens", "enc_out", "enc_mask", "dec_mask")
    context = differential.Context(sizes={"batch": inputs[0].size(0), "position": inputs[0].size(1),
                                          "d_model": sizes.d_model}, quantities={"d_model": sizes.d_model})

    def diagnose(got: Tensor) -> Diagnosis | None:
        return parts.diagnosis(_stack_reading(what, stack, run.calls, inputs, sizes.d_model, got), got, expected,
                               lambda: parts.engine(module, reference, inputs, names, got, expected, context, AXES),
                               AXES, **TOLERANCE)

    expect_close(name, run.outputs[0], expected, diagnose=diagnose, cause=cause, axes=AXES, **TOLERANCE)


@on_student_side
def _registration(Student: type[nn.Module], what: str, args: tuple, inputs: tuple) -> dict[str, Any]:
    """Where the student's stack keeps its blocks: in what (a ModuleList, a plain list), how many, how many
    distinct objects; and, after one forward pass, which of the blocks it holds or calls PyTorch does not see
    (their parameters not among the stack's)."""
    with parts.seeded(0), student_code():
        module = Student(*args)
    with parts.seeded(0):
        template = STACKS[what](*args)
    path = parts.pair(template, module).get("layers", "")
    held = list(parts.locate(module, path)) if path else []
    called: list[nn.Module] = []
    kind = type(template.layers[0])
    hook = nn.modules.module.register_module_forward_pre_hook(
        lambda block, _args: called.append(block) if isinstance(block, kind) else None)
    try:
        with parts.seeded(0), torch.no_grad(), student_code():
            module.eval()(*inputs)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001  (a crash is the business of the checks that compare values)
        pass
    finally:
        hook.remove()
    registered = {id(parameter) for parameter in module.parameters()}
    unseen = [block for block in [*held, *called] if any(id(p) not in registered for p in block.parameters())]
    return {"path": path, "registered_list": isinstance(parts.locate(module, path), nn.ModuleList) if path else False,
            "count": len(held), "distinct": len({id(block) for block in held}),
            "hidden": [index for index, block in enumerate(held) if block in unseen],
            "made_in_forward": sum(1 for block in called if all(block is not other for other in held))}


def _layers_registered(Student: type[nn.Module], what: str, sizes: Sizes, inputs: tuple) -> None:
    found = _registration(Student, what, sizes.stack_args(what), inputs)
    block = "EncoderBlock" if what == "Encoder" else "DecoderBlock"
    if not found["path"]:
        fail(f"{what} keeps no list of {block}s.",
             expected=f"{sizes.num_layers} {block}s held by the {what}, their parameters among its parameters",
             got="no nn.ModuleList or list of blocks among its attributes", cause=PLAIN_LIST)
    where = parts.words(found["path"])
    if found["count"] != sizes.num_layers:
        fail(f"{where} holds the wrong number of blocks.", expected=sizes.num_layers, got=found["count"],
             cause="build num_layers blocks, as the given constructor does.")
    if found["distinct"] != found["count"]:
        fail(f"{where} repeats the same block object.", expected=f"{sizes.num_layers} distinct blocks",
             got=f"{found['distinct']} distinct object(s)", cause=REPEATED_BLOCK)
    if found["hidden"]:
        fail(f"{where} is a plain Python list of blocks." if not found["registered_list"] else
             f"the blocks of {where} are not registered.",
             expected=f"blocks whose parameters are among {what}.parameters()",
             got=f"the parameters of block{'s' if len(found['hidden']) > 1 else ''} "
                 f"{', '.join(map(str, found['hidden']))} are not among {what}.parameters()", cause=PLAIN_LIST)
    if found["made_in_forward"]:
        fail(f"{what}.forward runs blocks that the {what} does not hold.",
             expected=f"forward runs the blocks of {where}", got=f"{found['made_in_forward']} block call(s) on new "
             "blocks made inside forward", cause="build the blocks once, in the constructor, and loop over "
             f"{where} in forward: blocks made in forward are new untrained blocks at every call.")


# --- Encoder -----------------------------------------------------------------------------------------


@check("Encoder maps token ids (batch, src_len) to vectors (batch, src_len, d_model)")
def encoder_output_shape(Encoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    _shape_check("Encoder", Encoder, config, _encoder_inputs(config, seed=21), (config.batch, config.src_len,
                 config.d_model), "Encoder(src, src_mask)",
                 "embed, scale, add PE, then apply every layer as x = layer(x, mask); return x.", seed=20)


@check("Encoder gives the reference output (same weights, a padded batch)")
def encoder_values(Encoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    _values_check("Encoder", Encoder, config, _encoder_inputs(config, seed=22), "Encoder(src, src_mask)",
                  "x = embedding(src) * sqrt(d_model); x = positional_encoding(x); then x = layer(x, mask) for every "
                  "layer.", seed=21)


@check("Encoder registers num_layers distinct blocks: they are counted, trained and moved by .to()/.double()")
def encoder_layers_registered(Encoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    _layers_registered(Encoder, "Encoder", config, _encoder_inputs(config, seed=31))


# --- Decoder -----------------------------------------------------------------------------------------


@check("Decoder returns logits over the target vocabulary: shape (batch, tgt_len, vocab_size)")
def decoder_output_shape(Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"src_len": 9, "tgt_len": 6} | sizes))
    _shape_check("Decoder", Decoder, config, _decoder_inputs(config, seed=41, dtype=torch.float32),
                 (config.batch, config.tgt_len, config.tgt_vocab), "Decoder(tgt, enc_out, enc_mask, dec_mask)",
                 "embed, scale, add PE, apply every layer, then self.pred_layer maps d_model to vocab_size.", seed=40)


@check("Decoder gives the reference logits (same weights, a padded batch)")
def decoder_values(Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    _values_check("Decoder", Decoder, config, _decoder_inputs(config, seed=42),
                  "Decoder(tgt, enc_out, enc_mask, dec_mask)",
                  "x = embedding * sqrt(d_model) -> PE -> x = layer(x, enc_out, enc_mask, dec_mask) for every layer "
                  "-> pred_layer(x).", seed=41)


@check("Decoder registers num_layers distinct blocks: they are counted, trained and moved by .to()/.double()")
def decoder_layers_registered(Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    _layers_registered(Decoder, "Decoder", config, _decoder_inputs(config, seed=51, dtype=torch.float32))


@on_student_side
def _block_gradients(module: nn.Module, blocks: list[str], inputs: tuple, seed: int) -> dict[str, Any]:
    """Backpropagate (output * random weights).sum() through the student's stack in eval mode: the norm of the
    gradient that reaches each block's parameters (0.0 where none does), in the order of `blocks`."""
    for each in parts.everything(module):
        each.eval()
    with torch.enable_grad(), student_code():
        output = module(*inputs)
    if not isinstance(output, Tensor) or not output.requires_grad:
        return {"output": isinstance(output, Tensor), "norms": None}
    held = [parts.locate(module, path) for path in blocks]
    parameters = [list(block.parameters()) for block in held]
    weights = randn(*output.shape, seed=seed, dtype=output.dtype)
    flat = [parameter for group in parameters for parameter in group]
    gradients = iter(torch.autograd.grad((output * weights).sum(), flat, allow_unused=True))
    norms = []
    for group in parameters:
        reached = [gradient for gradient in (next(gradients) for _ in group) if gradient is not None]
        norms.append(float(torch.sqrt(sum(gradient.double().pow(2).sum() for gradient in reached)))
                     if reached else 0.0)
    return {"output": True, "norms": norms}


@check("Decoder: every part of it gets a gradient from the logits, so training can change it")
def decoder_every_part_learns(Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    args = config.stack_args("Decoder")
    reference = _reference_stack("Decoder", args, seed=45)
    module, stack = _stack(Decoder, "Decoder", args, reference.state_dict(), seed=45)
    inputs = _decoder_inputs(config, seed=46)
    if not stack.blocks:
        fail("Decoder keeps no list of DecoderBlocks.", expected=f"{config.num_layers} blocks in self.layers",
             got="no nn.ModuleList or list of blocks among its attributes", cause=PLAIN_LIST)
    found = _block_gradients(module, stack.blocks, inputs, seed=47)
    if found["norms"] is None:
        fail("the Decoder's output is not connected to its weights.",
             expected="logits computed from the blocks' weights (they need gradients to learn)",
             got="no tensor" if not found["output"] else "an output that does not require a gradient",
             cause="forward must return the logits it computes, without torch.no_grad() or .detach().")
    norms = found["norms"]
    silent = [index for index, norm in enumerate(norms) if norm == 0.0]
    if not silent:
        return
    run = _stack_run("Decoder", module, stack, inputs, config.d_model)
    fail(f"{len(silent)} of the decoder's {len(norms)} blocks {'gets' if len(silent) == 1 else 'get'} no gradient "
         f"from the logits: no change of {'its' if len(silent) == 1 else 'their'} weights changes the output.",
         expected="a gradient for every block",
         got="gradient norm per block: " + ", ".join(f"{parts.words(path)}: {norm:.3g}"
                                                     for path, norm in zip(stack.blocks, norms, strict=True)),
         cause=parts.safely(_stack_reading, "Decoder", stack, run.calls, inputs, config.d_model, run.outputs[0])
         or "the output of every block must reach the logits: each block reads the previous block's output, and "
            "pred_layer reads the last one's.")


# --- the stacks' dropout -------------------------------------------------------------------------------


@check("Encoder and Decoder drop out their embeddings in train mode (self.positional_encoding); eval mode is "
       "deterministic")
def embedding_dropout(Encoder: type[nn.Module], Decoder: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"dropout": 0.5} | sizes))
    encoder_inputs = _encoder_inputs(config, seed=111)
    decoder_inputs = _decoder_inputs(config, seed=111, dtype=torch.float32)
    for what, Student, inputs in (("Encoder", Encoder, encoder_inputs), ("Decoder", Decoder, decoder_inputs)):
        module, stack = _stack(Student, what, config.stack_args(what), None, seed=110)
        trained = _stack_run(what, module, stack, inputs, config.d_model, train=True, seeds=(0, 1))
        evaluated = _stack_run(what, module, stack, inputs, config.d_model, seeds=(0, 1))
        first = next((call for call in trained.calls if call.role == (stack.blocks or [""])[0]), None)
        plain = next((call for call in evaluated.calls if call.role == (stack.blocks or [""])[0]), None)
        if first is not None and plain is not None and parts._close(first.args.get("x"), plain.args.get("x")):
            called = any(call.role == "positional_encoding" for call in trained.calls)
            fail(f"the {what}'s embeddings are never dropped out.",
                 expected="the first block's input dropped out in train mode (elements 0 or scaled by 1 / (1 - p))",
                 got="the first block receives the same input in train mode as in eval mode",
                 cause="call self.positional_encoding(x) rather than adding the table by hand: the module also "
                       "applies dropout to the embeddings in train mode." if not called else
                       "the output of self.positional_encoding must reach the first block as it is: it applies "
                       "dropout in train mode.")
        output = expect_tensor(f"{what} output", trained.outputs[0], cause="return the output tensor.")
        if isinstance(trained.outputs[1], Tensor) and torch.equal(output, trained.outputs[1]):
            fail(f"two forward passes of the {what} in train mode gave identical outputs.",
                 expected="different dropout masks", got="identical outputs",
                 cause="use the modules' dropout (nn.Dropout follows .train()/.eval()) and do not switch to eval "
                       "mode inside forward.")
        expect_close(f"{what} output in eval mode (second pass)", evaluated.outputs[1], evaluated.outputs[0],
                     atol=0, rtol=0,
                     cause="in eval mode nothing may be random: use nn.Dropout modules, not F.dropout(training=True).")


# --- Transformer -------------------------------------------------------------------------------------
#
# The reference Encoder and Decoder (with the reference's weights) are plugged into the student's
# Transformer, and the masks are the reference's: only the Transformer's own forward is graded here.

WIRING = ("enc_out = self.encoder(enc_in, enc_mask); logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask); "
          "return logits.")


def _embedded(stack: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The stack's embeddings of `ids` (batch, len), scaled by sqrt(d_model), with the positions added by its own
    positional encoding: (batch, len, d_model)."""
    scaled = stack.embedding(ids) * math.sqrt(stack.d_model)
    return stack.positional_encoding(scaled)


def _encoder_stand_in(self: nn.Module, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The reference Encoder's values, written here (tests/test_grading_build.py: equal to the reference's): ids
    (batch, src_len) -> (batch, src_len, d_model), every block in turn."""
    hidden = _embedded(self, x)
    for index in range(len(self.layers)):
        hidden = self.layers[index](hidden, mask)
    return hidden


def _decoder_stand_in(self: nn.Module, x: torch.Tensor, enc_out: torch.Tensor, enc_mask: torch.Tensor | None,
                      dec_mask: torch.Tensor | None) -> torch.Tensor:
    """The reference Decoder's values: ids (batch, tgt_len) and the encoder's output (batch, src_len, d_model) ->
    logits (batch, tgt_len, vocab_size), every block in turn, then the prediction layer."""
    hidden = _embedded(self, x)
    for index in range(len(self.layers)):
        hidden = self.layers[index](hidden, enc_out, enc_mask, dec_mask)
    return self.pred_layer(hidden)


@on_student_side
def _plugged(Transformer: type[nn.Module], args: tuple, state: dict[str, Tensor],
             seed: int) -> tuple[nn.Module, dict[str, str]]:
    """The student's Transformer with the reference Encoder and Decoder (the reference's weights) plugged in
    where it keeps its encoder and decoder; float64, eval mode. Returns it and their paths."""
    with parts.seeded(seed), student_code():
        model = Transformer(*args)
    reject_builtin_modules(model, "Transformer")
    with parts.seeded(seed):
        template = ReferenceTransformer(*args).double()
    template.load_state_dict(state)
    # the reference stacks' values without their forward (not in stage 4's grading build)
    template.encoder.forward = MethodType(_encoder_stand_in, template.encoder)
    template.decoder.forward = MethodType(_decoder_stand_in, template.decoder)
    paths = parts.pair(template, model)
    for role in ("encoder", "decoder"):
        if not paths.get(role):
            kind = role.capitalize()
            fail(f"Transformer has no {role} to plug the reference {kind} into.",
                 expected=f"self.{role} = {kind}(...), as in the given constructor",
                 got=f"the parts {', '.join(name for name, _ in parts.candidates(model)) or 'none'}",
                 cause="keep the given constructor: these checks grade the Transformer's own forward with the "
                       "reference Encoder and Decoder plugged in where it keeps them.")
        parts.put(model, paths[role], getattr(template, role))
    supplied(template)
    return model.double().eval(), {role: paths[role] for role in ("encoder", "decoder")}


@dataclass
class _Model:
    student: Any  # the student's Transformer, with the reference stacks plugged in
    reference: nn.Module
    paths: dict[str, str]  # role -> where the student keeps it


def _model(Transformer: type[nn.Module], sizes: Sizes, seed: int) -> _Model:
    with parts.seeded(seed):
        reference = ReferenceTransformer(*sizes.transformer_args()).double().eval()
    student, paths = _plugged(Transformer, sizes.transformer_args(), reference.state_dict(), seed)
    return _Model(student, reference, paths)


def _model_reading(model: _Model, calls: list[parts.Call], inputs: tuple, result: Any,
                   complete: bool = True) -> str | None:
    source, target, enc_mask, dec_mask = inputs
    values = parts.Values()
    values.add("src", "enc_in (the source ids)", source)
    values.add("tgt", "dec_in (the target ids)", target)
    values.add("src_mask", "`enc_mask` (the source mask)", enc_mask, mask=True)
    values.add("tgt_mask", "`dec_mask` (the target mask)", dec_mask, mask=True)
    steps = [parts.Step("encoder", {"x": parts.terms("src"), "mask": parts.terms("src_mask")}, "encoder"),
             parts.Step("decoder", {"x": parts.terms("tgt"), "enc_out": parts.terms("encoder"),
                                    "enc_mask": parts.terms("src_mask"), "dec_mask": parts.terms("tgt_mask")},
                        "decoder")]
    replay = parts.Replay(calls, steps, values, model.paths)
    reading = replay.departure(result=result, result_key="decoder" if complete else None,
                               ordered=[("encoder", "decoder")], complete=complete)
    if reading is None:
        return None
    return (complete and _unnamed_result(reading, result, replay, "decoder")) or reading.cause()


def _model_run(model: _Model, inputs: tuple) -> parts.Run:
    roles = {path: role for role, path in model.paths.items()}
    return parts.observe(model.student, inputs, "Transformer", roles,
                         lambda calls: _model_reading(model, calls, inputs, None, complete=False), seeds=(7,))


def _wiring(model: _Model, inputs: tuple, default: str) -> str:
    """The first place the Transformer's forward departs from encoder -> decoder, or `default`."""
    run = _model_run(model, inputs)
    return parts.safely(_model_reading, model, run.calls, inputs, run.outputs[0]) or default


def _inputs(source: Tensor, target: Tensor, pad_idx: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(src, tgt, enc_mask, dec_mask): the Transformer's inputs, with the reference's masks."""
    return source, target, make_source_mask(source, pad_idx), reference_target_mask(target, pad_idx)


def _unchanged(name: str, model: _Model, inputs: tuple, got: Any, expected: Any, default: str) -> None:
    """The logits `got` (on `inputs`) equal `expected`; otherwise the first place the Transformer's forward
    departs from encoder -> decoder, or `default`, is the cause."""
    expected = expect_tensor("logits", expected, cause="return the logits.")
    if not (isinstance(got, Tensor) and got.shape == expected.shape and tensors_close(got, expected, 1e-8, 1e-8)):
        cause = _wiring(model, inputs, default)  # the forward's wiring read, or what padding shows by default
        expect_close(name, got, expected, atol=1e-8, rtol=1e-8, axes=("batch", "position", "word"),
                     diagnose=lambda _got: Diagnosis("", cause), cause=default,
                     expected_words="your model's own logits on the same sentences without the extra pad tokens")


def _transformer_case(Transformer: type[nn.Module], sizes: Sizes, seed: int) -> tuple[_Model, tuple]:
    model = _model(Transformer, sizes, seed)
    source, target = _token_pair(sizes, seed=seed + 1)
    return model, _inputs(source, target, sizes.pad_idx)


def _expect_model(model: _Model, inputs: tuple, expected: Tensor, *, cause: str, atol: float, rtol: float,
                  expected_words: str = REFERENCE_VALUES) -> parts.Run:
    """The Transformer's logits on `inputs` against `expected`: where its forward departs from encoder -> decoder
    (or the engine's reading) as the cause. Returns the run (its outputs and the calls of its parts)."""
    run = _model_run(model, inputs)
    names = ("enc_in", "dec_in", "enc_mask", "dec_mask")
    context = differential.Context(sizes={"batch": inputs[0].size(0), "target position": inputs[1].size(1)})

    def diagnose(got: Tensor) -> Diagnosis | None:
        return parts.diagnosis(_model_reading(model, run.calls, inputs, got), got, expected, lambda: parts.engine(
            model.student, model.reference, inputs, names, got, expected, context, AXES), AXES, atol, rtol)

    expect_close("Transformer(src, tgt, src_mask, tgt_mask)", run.outputs[0], expected, atol=atol, rtol=rtol,
                 axes=AXES, diagnose=diagnose, cause=cause, expected_words=expected_words)
    return run


@check("Transformer maps (src, tgt) to logits of shape (batch, tgt_len, tgt_vocab)")
def transformer_output_shape(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"src_len": 9, "tgt_len": 6} | sizes))
    model, inputs = _transformer_case(Transformer, config, seed=60)
    run = _model_run(model, inputs)
    expect_shape("Transformer(src, tgt, src_mask, tgt_mask)", run.outputs[0],
                 (config.batch, config.tgt_len, config.tgt_vocab),
                 cause=parts.safely(_model_reading, model, run.calls, inputs, run.outputs[0]) or WIRING)


@check("Transformer gives the reference logits (same weights, a padded batch)")
def transformer_values(Transformer: type[nn.Module], **sizes: float) -> None:
    model, inputs = _transformer_case(Transformer, _sizes(**sizes), seed=61)
    with torch.no_grad():
        expected = model.reference(*inputs)
    run = _expect_model(model, inputs, expected, cause=WIRING, **TOLERANCE)
    encoder = parts.words(model.paths["encoder"])
    runs = sum(1 for call in run.calls if call.role == "encoder")
    if runs > 1:
        fail(f"Transformer's forward runs {encoder} {runs} times for one batch.",
             expected=f"{encoder} run once per batch", got=f"{runs} calls of {encoder}",
             cause="the source is encoded more than once: its encoding is the same for every decoder block and "
                   "every call, so the extra runs cost time and give nothing. Encode once and hand that one "
                   "enc_out to the decoder.")


NN_TRANSFORMER_NAMES = {"cross_attn.": "multihead_attn.", "feed_forward.fc1.": "linear1.",
                        "feed_forward.fc2.": "linear2.", "W_o.": "out_proj."}  # the reference's -> PyTorch's


def _torch_transformer_logits(reference: nn.Module, sizes: Sizes, source: Tensor, target: Tensor) -> Tensor:
    """Our embeddings * sqrt(d_model) + PE around PyTorch's nn.Transformer holding the reference's block weights
    (post-LN, no final stack norms; each weight under PyTorch's name, W_q, W_k and W_v stacked into in_proj),
    then our pred_layer.

    nn.Transformer's bool masks mean True = NOT allowed, the opposite of the course's masks.
    """
    with parts.seeded(0):
        builtin = nn.Transformer(sizes.d_model, sizes.num_heads, sizes.num_layers, sizes.num_layers, sizes.d_ff,
                                 dropout=0.0, activation="relu", batch_first=True, norm_first=False,
                                 dtype=torch.float64)
    builtin.encoder.norm = None  # nn.Transformer adds a LayerNorm after each stack; the paper's model has none
    builtin.decoder.norm = None
    state: dict[str, list[Tensor]] = {}
    for key, value in reference.state_dict().items():
        for ours, theirs in NN_TRANSFORMER_NAMES.items():
            key = key.replace(ours, theirs)
        attention, projection, kind = key.rsplit(".", 2)  # 'decoder.layers.0.self_attn', 'W_q', 'weight'
        in_proj = projection in ("W_q", "W_k", "W_v")  # in this order in the state dict
        state.setdefault(f"{attention}.in_proj_{kind}" if in_proj else key, []).append(value)
    builtin.load_state_dict({key: torch.cat(values) for key, values in state.items() if ".layers." in key})
    pad_idx = sizes.pad_idx
    future = ~torch.ones(target.size(1), target.size(1), dtype=torch.bool).tril()  # True above the diagonal
    hidden_states = builtin.eval()(_embedded(reference.encoder, source), _embedded(reference.decoder, target),
                                   tgt_mask=future, src_key_padding_mask=source == pad_idx,
                                   tgt_key_padding_mask=target == pad_idx, memory_key_padding_mask=source == pad_idx)
    return reference.decoder.pred_layer(hidden_states)  # (batch, tgt_len, tgt_vocab)


@check("Transformer equals PyTorch's nn.Transformer with the same weights (plus our embeddings, PE, pred_layer)")
def matches_torch_transformer(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"src_len": 8, "tgt_len": 6} | sizes))
    model, inputs = _transformer_case(Transformer, config, seed=70)
    with torch.no_grad():
        expected = _torch_transformer_logits(model.reference, config, inputs[0], inputs[1])
    _expect_model(model, inputs, expected, atol=1e-5, rtol=1e-5,
                  expected_words="the logits of PyTorch's nn.Transformer with the same weights (same inputs)",
                  cause="your model differs from nn.Transformer (post-LN, ReLU, no final stack LayerNorm).")


@check("the full model is causal: changing target tokens after position t never changes the logits at <= t")
def transformer_causality(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    model = _model(Transformer, config, seed=80)
    source, target = _token_pair(config, seed=81, padded=False)

    def logits(tokens: Tensor) -> tuple[tuple, Tensor]:
        inputs = _inputs(source, tokens, config.pad_idx)
        return inputs, expect_shape("Transformer(...)", _model_run(model, inputs).outputs[0],
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
    model = _model(Transformer, config, seed=90)
    source, target = _token_pair(config, seed=91)
    longer = torch.cat([source, torch.full((config.batch, extra), config.pad_idx)], dim=1)
    short = _model_run(model, _inputs(source, target, config.pad_idx)).outputs[0]
    inputs = _inputs(longer, target, config.pad_idx)
    _unchanged(f"logits with {extra} extra source pad tokens", model, inputs, _model_run(model, inputs).outputs[0],
               short, "the source padding is seen: the encoder needs enc_mask, and the decoder needs it too for "
                      "cross-attention.")


@check("target padding changes nothing: extra pad tokens at the end of the target keep the real positions' logits")
def target_padding_invariance(Transformer: type[nn.Module], extra: int = 3, **sizes: float) -> None:
    config = _sizes(**sizes)
    model = _model(Transformer, config, seed=100)
    source, target = _token_pair(config, seed=101, padded=False)
    longer = torch.cat([target, torch.full((config.batch, extra), config.pad_idx)], dim=1)
    short = _model_run(model, _inputs(source, target, config.pad_idx)).outputs[0]
    inputs = _inputs(source, longer, config.pad_idx)
    long = expect_tensor("logits", _model_run(model, inputs).outputs[0], cause="return the logits.")
    _unchanged(f"logits at the real positions with {extra} extra target pad tokens", model, inputs,
               long[:, : config.tgt_len], short, "real positions see the pad tokens after them: the decoder must "
                                                 "receive dec_mask, self.decoder(dec_in, enc_out, enc_mask, dec_mask).")


@on_student_side
def _gradients(model: nn.Module, paths: dict[str, str], inputs: tuple, weights: Tensor) -> dict[str, Any]:
    """Backpropagate (logits * weights).sum() through the student's Transformer; what reached each stack, and
    whether the encoder's output and what the decoder received as enc_out were still part of the graph."""
    seen: dict[str, Any] = {}

    def encoded(_module: nn.Module, _args: tuple, output: Any) -> None:
        seen.setdefault("encoder_graph", bool(getattr(output, "requires_grad", False)))

    def decoding(_module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        memory = kwargs.get("enc_out", args[1] if len(args) > 1 else None)
        seen.setdefault("memory_graph", bool(getattr(memory, "requires_grad", False)))

    encoder, decoder = (parts.locate(model, paths[role]) for role in ("encoder", "decoder"))
    hooks = [encoder.register_forward_hook(encoded), decoder.register_forward_pre_hook(decoding, with_kwargs=True)]
    model.eval()
    try:
        with torch.enable_grad(), student_code():
            logits = model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    if not isinstance(logits, Tensor):
        return {"logits": None}
    if logits.requires_grad:
        (logits * weights.to(logits.dtype)).sum().backward()
    starved = {role: [name for name, parameter in parts.locate(model, paths[role]).named_parameters()
                      if parameter.grad is None or not bool(parameter.grad.abs().sum() > 0)]
               for role in ("encoder", "decoder")}
    return {"logits": logits.detach(), "graph": logits.requires_grad, "starved": starved} | seen


@check("gradients flow through the Transformer to every weight of the encoder and the decoder")
def transformer_gradients(Transformer: type[nn.Module], **sizes: float) -> None:
    model, inputs = _transformer_case(Transformer, _sizes(**sizes), seed=130)
    logits = expect_tensor("logits", _model_run(model, inputs).outputs[0], cause="return the logits.")
    found = _gradients(model.student, model.paths, inputs, randn(*logits.shape, seed=131))
    for part in ("encoder", "decoder"):
        starved = found["starved"][part]
        if not starved:
            continue
        if part == "encoder" and found.get("encoder_graph") is False:
            cause = "the encoder runs under torch.no_grad() (or its output is detached): it can never learn."
        elif part == "encoder" and found.get("memory_graph") is False:
            cause = ("the decoder receives the encoder's output cut off from the graph (.detach(), .data or "
                     "torch.no_grad()): no gradient reaches the encoder, so it never learns.")
        elif not found["graph"]:
            cause = "the logits are not connected to the weights: no torch.no_grad() or .detach() inside forward."
        else:
            cause = f"the {part}'s output must be part of the computation of the logits: " + WIRING
        fail(f"no gradient reaches the {part}.", expected="every weight gets a gradient from the logits",
             got=f"no gradient for {len(starved)} of its parameters, e.g. {starved[0]}", cause=cause)


@on_student_side
def _embedding_lookups(Transformer: type[nn.Module], args: tuple, inputs: tuple) -> list[dict[str, Any]]:
    """Build the student's Transformer as written (its own encoder and decoder, nothing plugged in), run it once
    in eval mode and note every embedding lookup: which table (its path; a table kept at two places is one
    module, listed once), its rows, and whether it received the source ids, the target ids or something else. A
    crash after both the source and the target ids were looked up is another property's failure (a mask passed
    to the wrong place, say) and is left to its checks; an earlier crash is explained as one."""
    with parts.seeded(140), student_code():
        model = Transformer(*args)
    tables = {path: module for path, module in model.named_modules() if isinstance(module, nn.Embedding)}

    def kind(ids: Any) -> str:
        return next((name for name, given in (("source", inputs[0]), ("target", inputs[1]))
                     if isinstance(ids, Tensor) and ids.shape == given.shape and torch.equal(ids.cpu(), given)),
                    "other")

    with torch.no_grad(), parts.recorded(model.eval(), {path: path for path in tables}, False) as calls:
        try:
            with student_code():
                model(*inputs)
        except (NotImplementedError, CheckFailed):
            raise
        except Exception:
            if not {"source", "target"} <= {kind(call.args.get("input")) for call in calls}:
                raise
    return [{"path": call.path, "rows": tables[call.path].num_embeddings, "ids": kind(call.args.get("input"))}
            for call in calls]


@check("the encoder and the decoder each look their ids up in a table of their own vocabulary")
def transformer_own_embeddings(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**({"src_vocab": 19, "tgt_vocab": 11, "src_len": 9, "tgt_len": 6} | sizes))
    source, target = _token_pair(config, seed=141)
    lookups = _embedding_lookups(Transformer, config.transformer_args(), _inputs(source, target, config.pad_idx))
    by_ids = {kind: [entry for entry in lookups if entry["ids"] == kind] for kind in ("source", "target")}
    for kind, vocabulary in (("source", "src_vocab"), ("target", "tgt_vocab")):
        if not by_ids[kind]:
            fail(f"no embedding table looked up the {kind} ids.",
                 expected=f"the {kind} ids looked up in an nn.Embedding of {vocabulary} rows",
                 got="tables looked up: " + (", ".join(f"self.{entry['path']} ({entry['ids']} ids)"
                                                       for entry in lookups) or "none"),
                 cause=f"forward must hand the {kind} ids to the {'encoder' if kind == 'source' else 'decoder'}, "
                       "whose embedding turns them into vectors.")
    shared = {entry["path"] for entry in by_ids["source"]} & {entry["path"] for entry in by_ids["target"]}
    if shared:
        entry = next(entry for entry in by_ids["target"] if entry["path"] in shared)
        fail("the target ids are looked up in the same embedding table as the source ids.",
             expected=f"two tables: the source's with src_vocab = {config.src_vocab} rows, the target's with "
                      f"tgt_vocab = {config.tgt_vocab} rows",
             got=f"one table, self.{entry['path']} ({entry['rows']} rows), for both",
             cause="source and target are two languages with two vocabularies: id 5 is one German word and "
                   "another English one, so each stack needs its own table; keep the decoder's own embedding "
                   "(nothing in the constructor should hand it the encoder's).")
    for entry in by_ids["target"]:
        if entry["rows"] != config.tgt_vocab:
            fail("the target ids are looked up in a table of the wrong size.",
                 expected=f"tgt_vocab = {config.tgt_vocab} rows", got=f"self.{entry['path']}: {entry['rows']} rows",
                 cause="the decoder's embedding has one row per target word: nn.Embedding(tgt_vocab, d_model).")


@on_student_side
def _builtins(Transformer: type[nn.Module], args: tuple, inputs: tuple) -> None:
    """Build and run the student's Transformer in train mode (the training path of nn.MultiheadAttention goes
    through the guarded functions); fail on PyTorch's built-in attention or Transformer layers."""
    with parts.seeded(120), student_code():
        model = Transformer(*args)
    model.train()
    try:
        with student_code():
            model(*inputs)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception:  # noqa: BLE001  (a crash is graded by the checks of the part that crashes, not here)
        pass
    reject_builtin_modules(model, "Transformer")
    if not any(True for _ in model.parameters()):  # a model with no layers uses no built-in one either
        fail("your Transformer holds no layers.", expected="the course's encoder, decoder and output layer, with "
             "their parameters", got="a module without parameters",
             cause="build the encoder, the decoder and the final linear layer in __init__, as the exercise asks.")


@check("no PyTorch built-in attention or Transformer layers inside your model")
def no_builtin_modules(Transformer: type[nn.Module], **sizes: float) -> None:
    config = _sizes(**sizes)
    source, target = _token_pair(config, seed=121)
    _builtins(Transformer, config.transformer_args(), _inputs(source, target, config.pad_idx))


# --- predict, then run ------------------------------------------------------------------------------------------

PREDICTED_CONFIG = dict(src_vocab=1000, tgt_vocab=800, d_model=64, num_heads=4, num_layers=2, d_ff=128,
                        max_seq_length=50, dropout=0.1)  # the configuration the notebook's predictions ask about


def _predicted_model() -> nn.Module:
    with torch.device("meta"):  # shapes only: no memory, and the student's random generator is left alone
        return ReferenceTransformer(*PREDICTED_CONFIG.values())


@check("your prediction: the parameters of Transformer(1000, 800, 64, 4, 2, 128, 50, 0.1)")
def predicted_parameter_count(predict: Any) -> None:
    expect_number(predict, truths=lambda: (parameters_of(_predicted_model),
                                           parameters_of(_predicted_model, attention_biases=False)),
                  what="the parameters of Transformer(1000, 800, 64, 4, 2, 128, 50, 0.1)",
                  cause="go through the model's parts one by one: the two embeddings, the encoder blocks, the "
                        "decoder blocks (what does a decoder block have that an encoder block has not?), "
                        "pred_layer with its bias, and the positional encoding.")


def _tying_saving() -> int:
    model = _predicted_model()
    separate = count_parameters(model)
    model.decoder.pred_layer.weight = model.decoder.embedding.weight
    return separate - count_parameters(model)


@check("your prediction: the parameters saved by sharing the target embedding with pred_layer")
def predicted_tying_saving(predict: Any) -> None:
    expect_number(predict, truths=_tying_saving,
                  what="the parameters saved by sharing the target embedding with pred_layer",
                  cause="which tensor is counted once instead of twice once it is shared, and what shape has "
                        "it? pred_layer's bias has no counterpart in the embedding.")
