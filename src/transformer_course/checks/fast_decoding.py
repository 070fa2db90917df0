"""Stage 7 checks: the key/value cache (start_cache, decoder_step, cached_greedy_decode) and beam search
(select_beams, beam_search).

How they are tested:
- on small Transformers with random float64 weights from a fixed seed, made here and rebuilt from their
  weights on the student's side: a cached step against the full decoder on the same prefix, the cache against
  the keys and values the full decoder computes, cached greedy decoding against stage 6's greedy decoding
  token for token on a padded batch, beam search against the reference and, with beam size 1, against greedy
  decoding. The models of the cache and step checks have LayerNorms with random weights and biases, so that
  one LayerNorm used for another changes the result;
- by counting what runs: forward hooks on the projections W_q, W_k, W_v of every decoder layer show whether
  cross-attention keys and values are computed once and whether a step feeds only the newest position;
- select_beams on hand-made scores, where the surviving candidates are known;
- beam search on a hand-made *bigram* model: a Transformer without blocks whose next-token distribution is
  a table indexed by the previous token, so the best sentence (which greedy decoding misses) is known.

Everything that touches the student's functions is an experiment (`@on_student_side`) that returns what it
observed; the verdicts are decided here. One property, one place: the loops (cached_greedy_decode,
beam_search) run with the checks' own start_cache, decoder_step and select_beams in place of the student's
(`_plugged`, declared with `supplied`), so a bug in a part costs only the checks of that part. Those parts
record every call, and a loop is judged by what it did, step by step, against what it should have done with
what it was given (`_greedy_departure`, `_beam_departure`): the tokens each step was fed, the cache it began
with (one cache, its rows following the parents), the log-probabilities, scores, `finished` and `lengths`
handed to select_beams, the tokens appended, when the loop stopped, and which hypothesis came out. A wrong
step is explained by the engine (`differential`) on that step alone, started from the right cache; a wrong
cache entry or selection by what its values are (`_named_value`, `_selection_reading`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from transformer_course.checks import differential, lively, runs
from transformer_course.checks.boundary import on_student_side, shown_in_the_notebook, supplied
from transformer_course.checks.framework import (
    RECIPE,
    CheckFailed,
    Diagnosis,
    check,
    crash_explained,
    describe,
    expect_close,
    expect_shape,
    expect_tensor,
    fail,
    generator,
    student_code,
    summary,
)
from transformer_course.checks.predictions import expect_choice, expect_number
from transformer_course.checks.salt import salted_seed
from transformer_course.reference import Transformer, make_source_mask, make_target_mask
from transformer_course.reference.beam_search import beam_search as reference_beam_search
from transformer_course.reference.beam_search import length_penalty
from transformer_course.reference.beam_search import select_beams as reference_select_beams
from transformer_course.reference.decoding import greedy_decode as reference_greedy_decode
from transformer_course.reference.kv_cache import KVCache, attend, project_keys_values
from transformer_course.reference.kv_cache import cached_greedy_decode as reference_cached_greedy_decode
from transformer_course.reference.kv_cache import decoder_step as reference_decoder_step
from transformer_course.reference.kv_cache import start_cache as reference_start_cache

# the parts of PyTorch this stage's grade cells meet, used once before any notebook code (runner.warm_up_torch):
# tests/test_grading_speed.py fails when a grade cell imports a module
WARM_UP: tuple[str, ...] = ()

__all__ = [
    "beam_handles_eos_per_hypothesis",
    "beam_final_choice_uses_length_penalty",
    "beam_finds_what_greedy_misses",
    "beam_matches_reference",
    "beam_size_one_is_greedy",
    "cache_cross_keys_values",
    "cache_starts_empty",
    "cached_greedy_matches_greedy",
    "cached_greedy_matches_greedy_padded",
    "cached_greedy_uses_the_cache",
    "predicted_cached_vectors",
    "predicted_flat_index_token",
    "predicted_penalty_choice",
    "select_beams_keeps_finished",
    "select_beams_length_penalty",
    "select_beams_top_candidates",
    "step_cache_grows_by_one",
    "step_matches_full_decoder",
    "step_returns_logits",
    "step_reuses_cross_keys_values",
    "summary",
    "with_course_parts",
]

PAD, BOS, EOS = 3, 1, 2  # the course's Vocab ids
NAMES = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}


def _word(token: int) -> str:
    return NAMES.get(int(token), str(int(token)))


def _words(tokens: torch.Tensor) -> str:
    return "[" + " ".join(_word(token) for token in tokens) + "]"


def _show(rows: torch.Tensor, names: Mapping[int, str] = NAMES) -> str:
    return "".join(f"\n      sentence {index}: " + " ".join(names.get(int(t), str(int(t))) for t in row)
                   for index, row in enumerate(rows))


# --- small Transformers with random weights ----------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """A small Transformer with random float64 weights, and the padded batch it translates."""

    src_vocab: int = 19
    tgt_vocab: int = 17
    d_model: int = 16
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 32
    max_seq_length: int = 40
    batch: int = 5
    src_len: int = 7
    max_len: int = 10
    seed: int = 2
    eos_bias: float = 0.0  # added to the <eos> logit: larger means sentences end sooner


@dataclass
class _Model:
    """A model of the checks, here, and what rebuilds it on the student's side: its constructor's arguments
    and its weights."""

    module: nn.Module
    arguments: tuple
    state: dict[str, torch.Tensor]


def _model(arguments: tuple, prepare: Callable[[nn.Module], None], seed: int = 0) -> _Model:
    """The course's Transformer(*arguments) from a fixed seed, changed by `prepare`, in float64 and eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(salted_seed(seed))
        module = Transformer(*arguments)
    with torch.no_grad():
        prepare(module)
    module = module.double().eval()
    return _Model(module, arguments, {name: value.detach().clone() for name, value in module.state_dict().items()})


def _random_model(sizes: Sizes, distinct_norms: bool = False) -> _Model:
    """The course's Transformer with random weights; <pad> is never predicted (as in a trained model). With
    `distinct_norms`, every LayerNorm gets random weights and biases of its own (fresh ones are all alike)."""

    def prepare(model: nn.Module) -> None:
        model.decoder.pred_layer.bias[PAD] = -1e4
        model.decoder.pred_layer.bias[EOS] += sizes.eos_bias
        if distinct_norms:
            norms = [module for module in model.modules() if isinstance(module, nn.LayerNorm)]
            for index, norm in enumerate(norms):
                draw = torch.randn(2, norm.weight.numel(), generator=generator(sizes.seed + 300 + index))
                norm.weight.copy_(1.0 + 0.5 * draw[0])
                norm.bias.copy_(0.5 * draw[1])

    arguments = (sizes.src_vocab, sizes.tgt_vocab, sizes.d_model, sizes.num_heads, sizes.num_layers, sizes.d_ff,
                 sizes.max_seq_length, 0.1)
    return _model(arguments, prepare, sizes.seed)


def _rebuilt(arguments: tuple, state: dict[str, torch.Tensor]) -> nn.Module:
    """On the student's side: the checks' model, from its constructor's arguments and its weights."""
    with torch.random.fork_rng(devices=[]):
        model = Transformer(*arguments).double()
    model.load_state_dict(state)
    supplied(model)  # handed to the student's code by the check
    return model.eval()


def _random_source(sizes: Sizes, padded: bool = True) -> torch.Tensor:
    """(batch, src_len) ids without special tokens inside; with `padded`, later sentences are shorter."""
    src = torch.randint(4, sizes.src_vocab, (sizes.batch, sizes.src_len), generator=generator(sizes.seed + 100))
    if padded:
        for row in range(1, sizes.batch):
            src[row, max(2, sizes.src_len - 2 * row):] = PAD
    return src


def _random_target(sizes: Sizes, length: int) -> torch.Tensor:
    """(batch, length) decoder input: <bos>, then random words (no padding)."""
    tgt = torch.randint(4, sizes.tgt_vocab, (sizes.batch, length), generator=generator(sizes.seed + 200))
    tgt[:, 0] = BOS
    return tgt


def _encode(model: nn.Module, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    src_mask = make_source_mask(src, PAD)  # (batch, 1, 1, src_len)
    with torch.no_grad():
        return model.encoder(src, src_mask), src_mask


def _entry_shape(sizes: Sizes, length: int) -> tuple[int, int, int, int]:
    return sizes.batch, sizes.num_heads, length, sizes.d_model // sizes.num_heads


def _plain(value: Any) -> Any:
    """A tensor (detached) as it is, anything else of the student's described in words."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else describe(value)


def _entries(entries: Any) -> list[Any] | str:
    """A cache's list of per-layer tensors as plain values; what is not a list described in words."""
    return [_plain(entry) for entry in entries] if isinstance(entries, list | tuple) else describe(entries)


class _Counter:
    """Forward hooks on the attention projections of every decoder layer (and on the decoder itself):
    how often cross-attention's W_k / W_v ran, and the sequence lengths self-attention's W_q / W_k saw."""

    def __init__(self, model: nn.Module) -> None:
        self.cross_calls = 0
        self.self_lengths: list[int] = []
        self.decoder_calls = 0
        self.handles = []
        for layer in model.decoder.layers:
            for linear in (layer.cross_attn.W_k, layer.cross_attn.W_v):
                self.handles.append(linear.register_forward_hook(self._cross))
            for linear in (layer.self_attn.W_q, layer.self_attn.W_k, layer.self_attn.W_v):
                self.handles.append(linear.register_forward_hook(self._self))
        self.handles.append(model.decoder.register_forward_pre_hook(self._decoder))

    def _cross(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.cross_calls += 1

    def _self(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self.self_lengths.append(inputs[0].size(-2) if inputs[0].dim() >= 2 else 1)

    def _decoder(self, module: nn.Module, inputs: tuple) -> None:
        self.decoder_calls += 1

    def remove(self) -> _Counted:
        """The hooks taken off; what they counted."""
        for handle in self.handles:
            handle.remove()
        return _Counted(self.cross_calls, self.self_lengths, self.decoder_calls)


@dataclass
class _Counted:
    """What ran while a student's function ran: the cross-attention projections, the lengths self-attention's
    projections saw, the calls of the whole decoder."""

    cross_calls: int
    self_lengths: list[int]
    decoder_calls: int


def _named_value(got: torch.Tensor, named: Mapping[str, torch.Tensor]) -> str:
    """Which value of the computation `got` is (the first of `named`, words -> tensor, with the same values)."""
    return next((words for words, value in named.items()
                 if value.shape == got.shape and torch.allclose(got.double(), value.double(), atol=1e-9)), "")


# --- start_cache ------------------------------------------------------------------------------------------


@dataclass
class _Started:
    """What the student's start_cache returned: its four lists (per layer) and how many positions it says it
    holds."""

    cross_keys: Any
    cross_values: Any
    self_keys: Any
    steps: Any


@on_student_side
def _start_there(start_cache: Callable, arguments: tuple, state: dict[str, torch.Tensor], src: torch.Tensor
                 ) -> _Started:
    """The student's start_cache on the encoder output of `src`."""
    model = _rebuilt(arguments, state)
    enc_out, src_mask = _encode(model, src)
    with torch.no_grad(), student_code():
        cache = start_cache(model, enc_out, src_mask)
    fields = ("src_mask", "self_keys", "self_values", "cross_keys", "cross_values", "steps")
    if not all(hasattr(cache, name) for name in fields):  # the notebook's own KVCache class is fine
        fail("start_cache did not return the cache.", expected="a KVCache", got=describe(cache),
             cause="keep the given `return cache` at the end of start_cache.")
    steps = cache.steps
    return _Started(_entries(cache.cross_keys), _entries(cache.cross_values), _entries(cache.self_keys),
                    steps if isinstance(steps, int) else describe(steps))


def _entry_shape_cause(entry: object, sizes: Sizes) -> str:
    """What a cross-attention cache entry of the wrong shape holds, read from its shape."""
    shape = tuple(entry.shape) if isinstance(entry, torch.Tensor) else None
    d_k = sizes.d_model // sizes.num_heads
    recipe = "project_keys_values(layer.cross_attn, enc_out) gives (batch, heads, src_len, d_k)."
    if shape == (sizes.batch, sizes.src_len, sizes.d_model):
        return f"the keys and values are not split into heads: {shape} is W_k(enc_out) itself; {recipe}"
    if shape == (sizes.batch, sizes.src_len, sizes.num_heads, d_k):
        return f"the heads are split without moving the heads axis forward (transpose(1, 2)): {recipe}"
    return f"each entry is one layer's keys (or values), split into heads: {recipe}"


def _entry_list(started: _Started, name: str, layers: int) -> list[Any]:
    entries = getattr(started, name)
    if isinstance(entries, str):
        fail(f"cache.{name} is not a list.", expected=f"a list of {layers} tensors, one per decoder layer",
             got=entries, cause=f"keep the given KVCache and append to cache.{name}.")
    if len(entries) != layers:
        fail(f"cache.{name} has {len(entries)} entries.", expected=f"{layers}, one per decoder layer",
             got=len(entries), cause=_count_cause(name, len(entries), layers))
    return entries


def _count_cause(name: str, count: int, layers: int) -> str:
    """What a wrong number of cache entries says about the loop that fills them."""
    recipe = f"append one tensor to cache.{name} inside the loop over the layers."
    if count == 0:
        return f"nothing is ever appended to cache.{name}: the append is missing; {recipe}"
    if count == 1 and layers > 1:
        return f"cache.{name} is appended to once, not once per layer (outside the loop?); {recipe}"
    if layers and count % layers == 0:
        return f"cache.{name} gets {count // layers} entries per layer: it is appended to more than once; {recipe}"
    return recipe


@check("start_cache: one (batch, heads, src_len, d_k) cross-attention key and value per layer; no position cached")
def cache_starts_empty(start_cache: Callable, **sizes: int) -> None:
    config = replace(Sizes(), **sizes)
    model = _random_model(config, distinct_norms=True)
    got = _start_there(start_cache, model.arguments, model.state, _random_source(config))
    for name in ("cross_keys", "cross_values"):
        for index, entry in enumerate(_entry_list(got, name, config.num_layers)):
            expect_shape(f"cache.{name}[{index}]", entry, _entry_shape(config, config.src_len),
                         cause=_entry_shape_cause(entry, config))
    if got.steps != 0 or any(not isinstance(keys, torch.Tensor) or keys.size(2) != 0 for keys in got.self_keys):
        fail("the new cache already holds decoded positions.", expected="cache.steps == 0",
             got=f"cache.steps == {got.steps}",
             cause="keep the given empty self-attention entries: nothing has been decoded before the first step.")


@check("start_cache: each layer's cross-attention keys and values are the ones the full decoder uses")
def cache_cross_keys_values(start_cache: Callable, **sizes: int) -> None:
    config = replace(Sizes(), **sizes)
    model = _random_model(config, distinct_norms=True)
    src = _random_source(config)
    got = _start_there(start_cache, model.arguments, model.state, src)
    enc_out, src_mask = _encode(model.module, src)
    layers = model.module.decoder.layers
    named: dict[str, torch.Tensor] = {}  # every key, value and query of enc_out, in the lesson's words
    with torch.no_grad():
        expected = reference_start_cache(model.module, enc_out, src_mask)
        for index, layer in enumerate(layers):
            for attention, kind in ((layer.cross_attn, "cross_attn"), (layer.self_attn, "self_attn")):
                keys, values = project_keys_values(attention, enc_out)
                named[f"the keys of layer {index}'s {kind} (W_k)"] = keys
                named[f"the values of layer {index}'s {kind} (W_v)"] = values
                named[f"the queries of layer {index}'s {kind} (W_q)"] = attention.split_heads(attention.W_q(enc_out))
    for name, kind in (("cross_keys", "keys"), ("cross_values", "values")):
        entries = _entry_list(got, name, len(layers))
        for index in range(len(layers)):
            wanted = f"the {kind} of layer {index}'s cross_attn"

            def diagnose(entry: torch.Tensor, wanted: str = wanted) -> Diagnosis | None:
                holds = _named_value(entry, named)
                return Diagnosis("", f"this entry holds {holds}, where {wanted} belong.") if holds else None

            expect_close(f"cache.{name}[{index}]", entries[index], getattr(expected, name)[index],
                         atol=1e-10, rtol=1e-8, diagnose=diagnose,
                         cause=f"cache.{name}[i] = the cross-attention {kind} of enc_out: "
                               "project_keys_values(layer.cross_attn, enc_out), with each layer's own cross_attn.")


# --- decoder_step ------------------------------------------------------------------------------------------


def _own_start_cache(model: nn.Module, enc_out: torch.Tensor, src_mask: torch.Tensor) -> KVCache:
    """start_cache, the checks' copy: empty self-attention entries, cross-attention keys and values of enc_out."""
    cache = KVCache(src_mask)
    for layer in model.decoder.layers:
        empty = enc_out.new_zeros(enc_out.size(0), layer.self_attn.num_heads, 0, layer.self_attn.d_k)
        cross_keys, cross_values = project_keys_values(layer.cross_attn, enc_out)  # (batch, heads, src_len, d_k)
        cache.self_keys.append(empty)
        cache.self_values.append(empty)
        cache.cross_keys.append(cross_keys)
        cache.cross_values.append(cross_values)
    return cache


def _step(model: nn.Module, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
    """decoder_step, the checks' copy: one new position per row, the cache extended; (rows, vocab) logits."""
    decoder = model.decoder
    position = cache.steps
    x = decoder.embedding(tokens) * math.sqrt(decoder.d_model)
    x = x + decoder.positional_encoding.pe[:, position:position + 1]
    for i, layer in enumerate(decoder.layers):
        keys, values = project_keys_values(layer.self_attn, x)  # (rows, heads, 1, d_k)
        cache.self_keys[i] = torch.cat([cache.self_keys[i], keys], dim=2)
        cache.self_values[i] = torch.cat([cache.self_values[i], values], dim=2)
        x = layer.norm1(x + attend(layer.self_attn, x, cache.self_keys[i], cache.self_values[i]))
        x = layer.norm2(x + attend(layer.cross_attn, x, cache.cross_keys[i], cache.cross_values[i], cache.src_mask))
        x = layer.norm3(x + layer.feed_forward(x))
    return decoder.pred_layer(x[:, -1])  # (rows, vocab)


def _prefilled(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, steps: int) -> KVCache:
    """The cache as `steps` right steps on tgt leave it."""
    enc_out, src_mask = _encode(model, src)
    with torch.no_grad():
        cache = _own_start_cache(model, enc_out, src_mask)
        for t in range(steps):
            _step(model, cache, tgt[:, t:t + 1])
    return cache


@dataclass
class _StepRun:
    """The student's steps on a teacher-forced prefix: the logits of each step (as returned), the cache after
    each (its `steps`, self-attention keys and values per layer), and what ran."""

    logits: list[Any]
    caches: list[tuple[Any, Any, Any]]
    ran: _Counted


@on_student_side
def _steps_there(decoder_step: Callable, arguments: tuple, state: dict[str, torch.Tensor], src: torch.Tensor,
                 tgt: torch.Tensor, steps: int) -> _StepRun:
    """The student's decoder_step `steps` times on tgt, from the checks' own start of the cache."""
    model = _rebuilt(arguments, state)
    cache = _prefilled(model, src, tgt, 0)
    counter = _Counter(model)
    logits, caches = [], []
    try:
        for t in range(steps):
            shape = tuple(cache.self_keys[0].shape) if cache.self_keys else ()
            with torch.no_grad(), student_code(), crash_explained(
                    f"decoder_step crashed at step {t} while extending the cache.",
                    expected=f"cache.self_keys[i] of shape {shape} becomes "
                             f"{(*shape[:2], shape[2] + 1, *shape[3:]) if len(shape) == 4 else 'one position longer'}",
                    cause="the new keys are joined to the cache along an axis where the two differ in size: the cache "
                          "is (batch, heads, steps, d_k) and the new keys (batch, heads, 1, d_k), so only the steps "
                          "axis may grow; torch.cat([cache.self_keys[i], keys], dim=2).",
                    when=lambda error: "Sizes of tensors must match" in str(error)):
                got = decoder_step(model, cache, tgt[:, t:t + 1])
            steps_now = getattr(cache, "steps", None)
            caches.append((steps_now if isinstance(steps_now, int) else describe(steps_now),
                           _entries(cache.self_keys), _entries(cache.self_values)))
            logits.append(_plain(got))
    finally:
        ran = counter.remove()
    return _StepRun(logits, caches, ran)


@on_student_side
def _traced_step(decoder_step: Callable, arguments: tuple, state: dict[str, torch.Tensor], src: torch.Tensor,
                 tgt: torch.Tensor, t: int) -> tuple[differential.Trace, runs.Run]:
    """The student's decoder_step at step t, started from the cache t right steps leave: recorded operation by
    operation, and the calls it made of the notebook's `attend` (run as it is; the attention module kept as its
    name in the model, the tensors as they are, so that keeping them adds no operation to the record)."""
    model = _rebuilt(arguments, state)
    cache = _prefilled(model, src, tgt, t)
    names = {id(module): name for name, module in model.named_modules()}
    attended = runs.Run()
    with runs.plugged(decoder_step, {"attend": None}, attended,
                      lambda value: names.get(id(value), "?") if isinstance(value, nn.Module) else value), \
            torch.no_grad(), student_code():
        trace = differential.traced_call(decoder_step, model, cache, tgt[:, t:t + 1], modules=model,
                                         names=("model", "cache", "tokens"))
    return trace, attended


def _attended_reading(attended: runs.Run, cache: KVCache, t: int) -> str:
    """What the step handed to `attend` (attention, x, K, V, mask), against what the right step hands it:
    self-attention over the cache with the new position appended (t + 1 positions), cross-attention over the
    cached keys and values with the source mask."""
    for call in attended.calls:
        module, _, keys, _, mask = (list(call.args.values()) + [None] * 5)[:5]
        parts = module.split(".") if isinstance(module, str) else []
        if len(parts) < 4 or not parts[2].isdigit() or not isinstance(keys, torch.Tensor):
            continue
        layer, kind = int(parts[2]), parts[3]
        if kind == "self_attn":
            cached, positions = cache.self_keys[layer], keys.size(2)
            if positions == 0 or (positions == t and runs.same(keys, cached, 1e-8)):
                return (f"at step {t} layer {layer}'s self-attention attends over {positions} position(s), the ones "
                        "cached before this step: the new position does not attend to itself. Append its key and "
                        "value to the cache BEFORE attending (position t attends to positions 0..t)")
            if positions == 1 and t > 0:
                return (f"at step {t} layer {layer}'s self-attention sees only the new position: attend over the whole "
                        "cache, cache.self_keys[i] and cache.self_values[i] after appending")
        elif kind == "cross_attn":
            if mask is None:
                return (f"at step {t} layer {layer}'s cross-attention is given no mask: it ignores the source mask, so "
                        "padded source positions get attention; pass cache.src_mask")
            if not runs.same(keys, cache.cross_keys[layer], 1e-8):
                return (f"at step {t} layer {layer}'s cross-attention is given other keys than the cached ones: read "
                        "cache.cross_keys[i] and cache.cross_values[i]")
    return ""


@dataclass
class _Expected:
    """What the full decoder computes on the prefix: logits (batch, steps, vocab), per layer the self-attention
    keys and values of that layer's input (batch, heads, steps, d_k), and, in words, those of every layer's input
    and output (what a cache entry may hold instead)."""

    logits: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    named: dict[str, torch.Tensor]


def _expected_steps(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor) -> _Expected:
    enc_out, src_mask = _encode(model, src)
    layers = list(model.decoder.layers)
    inputs: list[torch.Tensor] = []
    outputs: list[torch.Tensor] = []

    def keep(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        inputs.append(args[0])
        outputs.append(output)

    handles = [layer.register_forward_hook(keep) for layer in layers]
    try:
        with torch.no_grad():
            logits = model.decoder(tgt, enc_out, src_mask, make_target_mask(tgt, PAD))
    finally:
        for handle in handles:
            handle.remove()
    keys, values, named = [], [], {}
    with torch.no_grad():
        for index, layer in enumerate(layers):
            for x, whose in ((inputs[index], "input"), (outputs[index], "output")):
                k, v = project_keys_values(layer.self_attn, x)
                named[f"the self-attention keys of layer {index}'s {whose}"] = k
                named[f"the self-attention values of layer {index}'s {whose}"] = v
                if whose == "input":
                    keys.append(k)
                    values.append(v)
    return _Expected(logits, keys, values, named)


class _StepCase:
    """One step check's model (distinct LayerNorms), prefix, what the student's steps did and what is expected."""

    def __init__(self, decoder_step: Callable, sizes: Sizes, steps: int) -> None:
        self.decoder_step, self.sizes = decoder_step, sizes
        self.model = _random_model(sizes, distinct_norms=True)
        self.src, self.tgt = _random_source(sizes), _random_target(sizes, steps)
        self.run = _steps_there(decoder_step, self.model.arguments, self.model.state, self.src, self.tgt, steps)
        self.expected = _expected_steps(self.model.module, self.src, self.tgt)

    def context(self) -> differential.Context:
        sizes = self.sizes
        return differential.Context(
            sizes={"batch": sizes.batch, "vocab": sizes.tgt_vocab, "d_model": sizes.d_model,
                   "source position": sizes.src_len, "heads": sizes.num_heads},
            quantities={"d_model": sizes.d_model, "d_k": sizes.d_model // sizes.num_heads})

    def _at_position_zero(self, t: int, got: torch.Tensor) -> bool:
        """Whether step t's logits are the course's step with position 0's encoding added to the new token."""
        table = self.model.module.decoder.positional_encoding.pe
        kept = table[:, t].clone()
        try:
            with torch.no_grad():
                table[:, t] = table[:, 0]  # row t read as row 0; the cache's rows 0..t-1 are computed before
                cache = _prefilled(self.model.module, self.src, self.tgt, t)
                zero = reference_decoder_step(self.model.module, cache, self.tgt[:, t:t + 1])
        finally:
            with torch.no_grad():
                table[:, t] = kept
        return zero.shape == got.shape and torch.allclose(got, zero, atol=1e-8, rtol=1e-6)

    def diagnose(self, t: int, got: torch.Tensor) -> Diagnosis | None:
        """Step t alone, started from the cache the right steps leave: what it handed to `attend`, which sentences
        differ, and the engine's reading of the student's step against the course's; or, when that step is right,
        that the earlier steps left another cache."""
        expected = self.expected.logits[:, t]
        student, calls = _traced_step(self.decoder_step, self.model.arguments, self.model.state, self.src, self.tgt, t)
        alone = student.output if isinstance(student.output, torch.Tensor) else None
        if alone is not None and alone.shape == expected.shape and torch.allclose(alone, expected, atol=1e-8):
            return Diagnosis("", f"started from the cache that steps 0 to {t - 1} should leave, your step {t} gives "
                                 "the right logits: your earlier steps left something else in the cache (what they "
                                 "append, or where: see the check of the cache).")
        cache = _prefilled(self.model.module, self.src, self.tgt, t)
        attended = _attended_reading(calls, cache, t)
        if attended:
            return Diagnosis("", attended + ".")
        if alone is not None and t > 0 and self._at_position_zero(t, alone):
            return Diagnosis("", f"step {t}'s token got the positional encoding of position 0 where position {t}'s "
                                 "belongs: the positional-encoding module numbers the positions of the input it is "
                                 "given from 0, and a step gives it one token; the new token's position is "
                                 "cache.steps.")
        wrong = {int(row) for row in (~torch.isclose(got, expected, atol=1e-8)).any(dim=-1).nonzero()}
        padded = {int(row) for row in (self.src == PAD).any(dim=-1).nonzero()}
        if wrong and wrong <= padded and len(padded) < self.src.size(0):
            return Diagnosis("", "only sentences whose source has padding get other logits: padded source positions "
                                 "get attention. Cross-attention needs the source mask, cache.src_mask.")
        reference = differential.traced_call(reference_decoder_step, self.model.module, cache,
                                             self.tgt[:, t:t + 1], modules=self.model.module,
                                             names=("model", "cache", "tokens"))
        return differential.explain(student, reference, got if alone is None else alone, expected, self.context(),
                                    ("sentence", "token"))


@check("decoder_step returns the logits of the new position only: a (batch, vocab) tensor")
def step_returns_logits(decoder_step: Callable) -> None:
    config = Sizes()
    model = _random_model(config)
    run = _steps_there(decoder_step, model.arguments, model.state, _random_source(config),
                       _random_target(config, 1), 1)
    got = run.logits[0]
    kept = isinstance(got, torch.Tensor) and tuple(got.shape) == (config.batch, 1, config.tgt_vocab)
    expect_shape("decoder_step(model, cache, tokens)", got, (config.batch, config.tgt_vocab),
                 cause=("the logits keep the length axis of the one new position: " if kept else "")
                 + "one position goes in, so take it out: decoder.pred_layer(x[:, -1]) (or x.squeeze(1)) gives "
                   "(batch, vocab).")


@check("step by step, decoder_step gives the full decoder's logits at the last position (padded batch)")
def step_matches_full_decoder(decoder_step: Callable, steps: int = 6, **sizes: int) -> None:
    config = replace(Sizes(), **sizes)
    case = _StepCase(decoder_step, config, steps)
    for t, got in enumerate(case.run.logits):
        expect_shape(f"decoder_step at step {t}", got, (config.batch, config.tgt_vocab),
                     cause="return decoder.pred_layer(x[:, -1]), (batch, vocab).")
        expect_close(f"the logits of step {t} (token at position {t})", got, case.expected.logits[:, t],
                     atol=1e-8, rtol=1e-6, axes=("sentence", "token"),
                     diagnose=lambda logits, t=t: case.diagnose(t, logits),
                     cause="each layer: append the new K, V; self-attention over the cache; residual + norm1; "
                           "cross-attention with the cached K, V and src_mask; norm2; feed-forward; norm3 — "
                           "the same sublayers as DecoderBlock.forward, for one position.")


def _upstream(case: _StepCase, t: int, kind: str, index: int) -> Diagnosis | None:
    """A cache entry that differs because the step computes the layer's input differently: the step's own
    departure (its logits differ too), read by the engine, is the cause; the cache is only its first witness."""
    logits = case.run.logits[t] if t < len(case.run.logits) else None
    expected = case.expected.logits[:, t]
    if not isinstance(logits, torch.Tensor) or logits.shape != expected.shape \
            or torch.allclose(logits, expected, atol=1e-8, rtol=1e-6):
        return None
    found = case.diagnose(t, logits)
    if found is None or not found.cause:
        return None
    return Diagnosis("", f"step {t} computes layer {index}'s input differently, so it appends other {kind} (its "
                         f"logits differ too; see the check against the full decoder): {found.cause}")


@check("every decoder_step appends exactly one position to each layer's self-attention keys and values")
def step_cache_grows_by_one(decoder_step: Callable, steps: int = 4, **sizes: int) -> None:
    config = replace(Sizes(), **sizes)
    case = _StepCase(decoder_step, config, steps)
    for t, (cached_steps, keys, values) in enumerate(case.run.caches):
        for index in range(config.num_layers):
            for name, entries, full in (("self_keys", keys, case.expected.keys),
                                        ("self_values", values, case.expected.values)):
                entry = entries[index] if isinstance(entries, list) else entries
                entry = expect_tensor(f"cache.{name}[{index}]", entry,
                                      cause=f"store the concatenated tensor back: cache.{name}[i] = torch.cat(...).")
                wanted = _entry_shape(config, t + 1)
                if tuple(entry.shape) != wanted:
                    grew = (f"cache.{name} did not grow: the concatenation's result is never stored back into the "
                            f"cache: cache.{name}[i] = torch.cat([cache.{name}[i], new], dim=2)."
                            if tuple(entry.shape) == _entry_shape(config, 0) else
                            "grew along the wrong axis or by more than one position: append the new position "
                            "along axis 2 (batch, heads, steps, d_k) with torch.cat(..., dim=2).")
                    fail(f"after step {t}, cache.{name}[{index}] has the wrong shape.", expected=wanted,
                         got=tuple(entry.shape), cause=grew)
                named = {words: value[:, :, :t + 1] for words, value in case.expected.named.items()}

                def diagnose(entry: torch.Tensor, name: str = name, index: int = index, named: dict = named, t: int = t
                             ) -> Diagnosis | None:
                    holds = _named_value(entry, named)
                    kind = "keys" if name == "self_keys" else "values"
                    if holds:
                        return Diagnosis("", f"the cache holds {holds}, where the self-attention {kind} of layer "
                                             f"{index}'s input belong.")
                    return _upstream(case, t, kind, index)

                expect_close(f"cache.{name}[{index}] after step {t}", entry, full[index][:, :, :t + 1],
                             atol=1e-8, rtol=1e-6, diagnose=diagnose,
                             cause="append project_keys_values(layer.self_attn, x) of the layer's INPUT x (the "
                                   "new position's vector before that layer), not of its output.")
        if cached_steps != t + 1:
            fail(f"after step {t}, cache.steps is {cached_steps}.", expected=t + 1, got=cached_steps,
                 cause="cache.steps counts the positions in cache.self_keys[0]: append to it at every step.")


@check("decoder_step reads cross-attention keys and values from the cache and feeds only the new position")
def step_reuses_cross_keys_values(decoder_step: Callable, steps: int = 4, **sizes: int) -> None:
    config = replace(Sizes(), **sizes)
    model = _random_model(config)
    run = _steps_there(decoder_step, model.arguments, model.state, _random_source(config),
                       _random_target(config, steps), steps)
    if not run.ran.self_lengths:  # reusing the cache means nothing when the step computes nothing at all
        fail("decoder_step ran no self-attention projection in its steps.",
             expected="every step projects the new position with self_attn.W_q / W_k / W_v of each layer",
             got=f"no call of them in {steps} steps",
             cause="a step embeds the new token, runs each decoder layer on it (self-attention over the cached keys "
                   "and values, cross-attention, feed-forward) and returns the logits of that one position.")
    if run.ran.decoder_calls:
        fail("decoder_step calls the whole decoder.", expected="no call of model.decoder(...)",
             got=f"{run.ran.decoder_calls} calls",
             cause="a step runs the decoder's pieces by hand for one position; model.decoder recomputes the prefix.")
    if run.ran.cross_calls:
        fail("cross-attention keys or values were recomputed during the steps.",
             expected="0 calls of cross_attn.W_k or W_v (start_cache computed them once)",
             got=f"{run.ran.cross_calls} calls in {steps} steps",
             cause="read cache.cross_keys[i] and cache.cross_values[i] with attend(...) instead of calling "
                   "layer.cross_attn(...), which projects the encoder output again.")
    longer = sorted({length for length in run.ran.self_lengths if length != 1})
    if longer:
        fail("self-attention projections ran on more than the new position.",
             expected="every call of self_attn.W_q / W_k / W_v on 1 position", got=f"calls on {longer} positions",
             cause="project only the new token's vector; the keys and values of earlier positions are in the "
                   "cache already (that is what makes a step cheap).")


# --- the checks' own parts, plugged into the student's loops --------------------------------------------------
#
# cached_greedy_decode and beam_search call start_cache, decoder_step (and select_beams) by name. While their
# checks run, those names in the student's notebook point to the checks' own versions (`runs.plugged`), which
# are recorded call by call: the tokens each step was fed, the cache before and after it, what select_beams was
# given and chose. A mistake in the student's decoder_step or select_beams then costs only the checks about
# them. The reference loop runs with the same parts, and the first call where the two runs part is where the
# student's loop departs (`runs.departure`); the readings below name its cause.

PLUGGED = ("start_cache", "decoder_step", "select_beams")


def _self_keys(cache: object) -> list[torch.Tensor]:
    keys = getattr(cache, "self_keys", None)
    return [entry.detach().clone() for entry in keys if isinstance(entry, torch.Tensor)] if keys else []


def _parts(rows: int, beams: tuple[int, int] | None) -> tuple[dict[str, Callable], Callable[[Any], Any]]:
    """start_cache, decoder_step and select_beams with the notebook's signatures (`rows`: the rows the decoder
    works on; `beams`: (batch, beam_size) of beam search), and how a run keeps a value: a cache as [its number
    among the caches start_cache made (-1 for another), its self-attention keys per layer]."""
    caches: list[object] = []
    counts = {"decoder_step": 0, "select_beams": 0}

    def keep(value: Any) -> Any:
        if hasattr(value, "self_keys") and hasattr(value, "cross_keys"):  # the notebook's own KVCache is fine
            return [next((i for i, made in enumerate(caches) if made is value), -1), _self_keys(value)]
        return None if isinstance(value, nn.Module) else runs.kept(value)

    def start_cache(model: nn.Module, enc_out: torch.Tensor, src_mask: torch.Tensor) -> KVCache:
        cache = _own_start_cache(model, enc_out, src_mask)
        caches.append(cache)
        return cache

    def decoder_step(model: nn.Module, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        step, wanted = counts["decoder_step"], f"({rows}, 1)"
        counts["decoder_step"] += 1
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            fail(f"at step {step} decoder_step was fed {describe(tokens)}.", expected=f"token ids of shape {wanted}",
                 got=describe(tokens),
                 cause="feed the newest token of every row with its length axis kept: ys[:, -1:] is (rows, 1); "
                       "ys[:, -1] (rows,) has lost it.")
        table = model.decoder.positional_encoding.pe.size(1)
        if isinstance(cache, KVCache) and cache.steps >= table:  # the step would have no position left to add
            fail(f"decoding stopped at step {step}: the cache already holds {cache.steps} positions, and the model's "
                 f"positional-encoding table has only {table} rows, so no position is left for the new token.",
                 expected=f"{step} cached positions at step {step}, one per token generated before it",
                 got=f"{cache.steps} cached positions",
                 cause="feed decoder_step only the newest token of every row, ys[:, -1:], (rows, 1): the earlier "
                       "tokens are in the cache already, and feeding them again appends them to it again.")
        return _step(model, cache, tokens)  # a step fed several tokens runs as the course's step would run it

    def select_beams(scores: torch.Tensor, log_probs: torch.Tensor, finished: torch.Tensor, lengths: torch.Tensor,
                     beam_size: int, alpha: float, pad_idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, beam = beams or (0, 0)
        for name, value, shape in (("scores", scores, (batch, beam)), ("finished", finished, (batch, beam)),
                                   ("lengths", lengths, (batch, beam)), ("log_probs", log_probs, (batch, beam, None))):
            if not isinstance(value, torch.Tensor) or value.dim() != len(shape) or \
                    tuple(value.shape[:2]) != shape[:2]:
                fail(f"at step {counts['select_beams']} select_beams was given {name} of "
                     f"{describe(value)}.", expected=f"{name} of shape ({batch}, {beam}"
                     + (", vocab)" if name == "log_probs" else ")"), got=describe(value),
                     cause="select_beams works on (batch, beam) tensors: view the decoder's (batch * beam, vocab) "
                           "log-probabilities as log_probs.view(batch, beam_size, -1)." if name == "log_probs" else
                           f"hand select_beams the (batch, beam_size) tensor {name} that beam search keeps (the "
                           "given lines make it; update it from the parents at every step).")
        counts["select_beams"] += 1
        return _select(scores.double(), log_probs.double(), finished.bool(), lengths.long(), beam_size, alpha,
                       pad_idx)

    return {"start_cache": start_cache, "decoder_step": decoder_step, "select_beams": select_beams}, keep


def _token_ids(name: str, got: object, batch: int) -> torch.Tensor:
    ys = expect_tensor(f"{name}(...)", got, cause="return ys, the (batch, out_len) tensor of token ids.")
    if ys.is_floating_point() or ys.dim() != 2 or ys.size(0) != batch:
        fail(f"{name} returned {describe(ys)}.", expected=f"token ids (torch.long) of shape ({batch}, out_len)",
             got=describe(ys), cause="append one column of argmax ids per step: torch.cat([ys, ...], dim=1).")
    return ys.detach().cpu().long()


def _looped(function: Callable, model: nn.Module, src: torch.Tensor, max_len: int,
            beam: tuple[int, float] | None = None) -> runs.Run:
    """A loop `function` (cached_greedy_decode, or beam_search with `beam` = (beam_size, alpha)) on src, with the
    checks' parts plugged in; the run holds its calls and, as its result, its ids."""
    parts, keep = _parts(src.size(0) * (beam[0] if beam else 1), (src.size(0), beam[0]) if beam else None)
    run = runs.Run()
    with torch.no_grad(), runs.plugged(function, parts, run, keep, after=True):
        if beam:
            got = function(model, src, PAD, BOS, EOS, max_len, beam_size=beam[0], alpha=beam[1])
        else:
            got = function(model, src, PAD, BOS, EOS, max_len)
    run.result = got
    return run


@on_student_side
def _run_there(function: Callable, name: str, arguments: tuple, state: dict[str, torch.Tensor], src: torch.Tensor,
               max_len: int, beam: tuple[int, float] | None = None) -> tuple[runs.Run, _Counted]:
    """The student's loop on src (see `_looped`), with hooks counting what ran."""
    model = _rebuilt(arguments, state)
    counter = _Counter(model)
    try:
        with student_code():
            run = _looped(function, model, src, max_len, beam)
    finally:
        counted = counter.remove()
    run.result = _token_ids(name, run.result, src.size(0))
    return run, counted


def _cache_departure(run: runs.Run, index: int) -> str | None:
    """How step `index` was given its cache, if not as the cache of the same decoding: one cache, started once,
    holding `index` positions when step `index` begins."""
    starts = len(run.of("start_cache"))
    if starts > 1:
        return (f"start_cache ran {starts} times for one batch: a new cache knows nothing of the "
                "positions decoded so far. Start the cache once, before the loop, and hand the same cache to every "
                "decoder_step.")
    cache = run.of("decoder_step")[index].args.get("cache")
    number, before = cache if isinstance(cache, list) else (-1, [])
    if starts and number != 0:
        return (f"step {index} was given another cache than the one start_cache made: hand the same cache object "
                "to every decoder_step (it grows by one position per step).")
    cached = before[0].size(2) if before else index
    if cached != index:
        return (f"when step {index} began, the cache held {cached} positions instead of {index}: call decoder_step "
                "once per generated token, with the newest token only.")
    return None


def _expect_ids(got: torch.Tensor, expected: torch.Tensor, *, problem: str, cause: str,
                departure: Callable[[], str | None], show: Callable[[torch.Tensor], str] = _show) -> None:
    """Exact comparison of token ids. On a difference the cause is the first place where the student's loop
    departs from what the reference loop does with the same parts (`departure`), else the recipe, said to be
    one (nothing was diagnosed)."""
    if got.shape == expected.shape and torch.equal(got, expected):
        return
    try:
        found = departure()
    except CheckFailed:
        raise
    except Exception:  # a run too odd to read says nothing
        found = None
    fail(problem, expected=f"shape {tuple(expected.shape)}{show(expected)}", got=f"shape {tuple(got.shape)}{show(got)}",
         cause=found or f"not one of the mistakes the checks recognise; {RECIPE} {cause}")


# --- cached_greedy_decode ----------------------------------------------------------------------------------


@shown_in_the_notebook
def with_course_parts(loop: Callable) -> Callable:
    """`loop` (the notebook's cached_greedy_decode or beam_search) made to call the course's own start_cache and
    decoder_step in place of the notebook's while it runs, as the checks run it (`runs.plugged`): what it then
    does is the loop's own doing, whatever the notebook's parts are (unfinished, or written another correct way).
    While the notebook is graded, `loop` as it is (the grading build: `boundary.shown_in_the_notebook`)."""
    parts = {"start_cache": reference_start_cache, "decoder_step": reference_decoder_step}

    def run(*args: Any, **kwargs: Any) -> Any:
        with runs.plugged(loop, parts, runs.Run(), keep=lambda _value: None):  # nothing recorded: only swapped
            return loop(*args, **kwargs)

    return run


def _ended(row: torch.Tensor, column: int) -> int | None:
    """The column of the first <eos> among the generated columns 1 .. column of a row, or None."""
    found = (row[1:column + 1] == EOS).nonzero()
    return int(found[0]) + 1 if len(found) else None


def _after_eos(got: torch.Tensor, steps: Sequence[runs.Call]) -> str | None:
    """Why sentences that had said <eos> get other tokens than <pad> later, from every such token of the run."""
    wrong = []  # (sentence, column, token, the argmax of its step's logits), in step order
    for column in range(2, min(got.size(1), len(steps) + 1)):
        best = steps[column - 1].output.argmax(dim=-1).cpu()
        wrong += [(sentence, column, int(got[sentence, column]), int(best[sentence])) for sentence in range(got.size(0))
                  if _ended(got[sentence], column - 1) is not None and int(got[sentence, column]) != PAD]
    if not wrong:
        return None
    sentence, column, token, best = wrong[0]
    row, end = got[sentence], _ended(got[sentence], column - 1)
    head = (f"sentence {sentence} said <eos> at step {end - 1}, but at step {column - 1} it gets {_word(token)} "
            "instead of <pad>")
    if bool((row[end + 1:column] == PAD).any()):
        return (f"`finished` forgets earlier sentences: {head}, after a <pad>: the sentence counted as finished for "
                "one step only. Accumulate it, finished |= next_token == eos_idx, instead of overwriting it.")
    if all(token == EOS for _, _, token, _ in wrong) and any(best != EOS for *_, best in wrong):
        return f"finished sentences are filled with <eos> instead of <pad>: {head}. Fill them with pad_idx."
    if all(token == best for *_, token, best in wrong):
        return (f"finished sentences keep producing words after their <eos>: {head}, the argmax of its logits"
                + (" (here <eos> again)" if token == EOS else "") + ". Replace the new token of finished sentences "
                "with pad_idx, next_token.masked_fill(finished, pad_idx), with `finished` updated after each step.")
    return f"{head}: once a sentence has said <eos>, every later token is pad_idx."


def _stopped_early(t: int, done: Sequence[bool], first_end: int | None, max_len: int, what: str) -> str:
    """Why a loop that stopped after step t, with `done` per sentence, stopped too early (`first_end`: the first
    step after which some sentence had ended)."""
    waiting = [sentence for sentence, ended in enumerate(done) if not ended]
    if first_end == t:
        return (f"{what} stops as soon as ONE sentence is finished: it stopped after step {t}, the first step at which "
                f"one had said <eos>, while sentence(s) {waiting} had not (max_len is {max_len}). Break only when "
                "finished.all().")
    return (f"{what} stopped after {t + 1} step(s), while sentence(s) {waiting} had not said <eos>: a sentence that "
            f"never says <eos> gets max_len = {max_len} tokens. Loop for _ in range(max_len) and break once "
            "finished.all().")


def _choice(got: torch.Tensor, steps: Sequence[runs.Call], t: int) -> str:
    """Why the tokens appended after step t are not the argmax of that step's logits (<pad> for finished
    sentences); '' when they are."""
    if t + 1 >= got.size(1):
        return (f"decoder_step ran {len(steps)} times, but ys has {got.size(1) - 1} generated columns: append "
                "the new tokens to ys at every step, torch.cat([ys, next_token.unsqueeze(1)], dim=1).")
    best = steps[t].output.argmax(dim=-1).cpu()  # (batch,)
    ended = torch.tensor([_ended(got[sentence], t) is not None for sentence in range(got.size(0))])
    chosen = got[:, t + 1]
    if best.shape != chosen.shape or torch.equal(chosen, best.masked_fill(ended, PAD)):
        return ""
    if bool((chosen[ended] != PAD).any()):
        return _after_eos(got, steps) or ""
    sentence = int((chosen != best.masked_fill(ended, PAD)).nonzero()[0])
    head = (f"sentence {sentence}, step {t}: your token is {_word(int(chosen[sentence]))}, but the argmax "
            f"of decoder_step's logits is {_word(int(best[sentence]))}")
    if torch.equal(chosen, best.masked_fill(ended | (best == EOS), PAD)):
        return (f"{head}: the <eos> itself was replaced by <pad>. Pad only the sentences that had finished "
                "before this step: mask the new tokens first, then update `finished` from them.")
    return f"{head}: next_token = logits.argmax(dim=-1), over the vocabulary."


def _cached(call: runs.Call) -> int | None:
    """The positions a decoder_step call left in the cache (None: not known)."""
    cache = (call.after or {}).get("cache")
    entries = cache[1] if isinstance(cache, list) and len(cache) == 2 else []
    return int(entries[0].size(2)) if entries and isinstance(entries[0], torch.Tensor) else None


def _greedy_readings(max_len: int) -> dict[str, runs.Reading]:
    """What a departure of a cached greedy loop means: the cache a step was given, the tokens it was fed (the
    newest of the student's ys, the tokens chosen after the step before), when the loop stopped."""

    def cache(found: runs.Departure) -> str:
        return _cache_departure(found.student, found.step) or ""

    def tokens(found: runs.Departure) -> str:
        got, steps, t = found.student.result, found.student.of("decoder_step"), found.step
        given = found.mine.args["tokens"]
        if isinstance(given, torch.Tensor) and given.dim() == 2 and given.size(1) > 1:
            held = [_cached(call) for call in steps]
            return (f"at step {t} decoder_step was fed {given.size(1)} tokens per sentence, "
                    f"{_words(given[0])} for sentence 0, where only the newest token belongs: the earlier ones "
                    "are in the cache already, so each step appends them to it again (after the steps the cache "
                    f"held {', '.join(map(str, held[:6]))} positions) and attends over copies of them. Feed the "
                    "newest token, ys[:, -1:].")
        fed = given.view(-1)
        if fed.size(0) != got.size(0):
            return ""  # a loop that decodes only some rows: said as it is
        if t < got.size(1) and not torch.equal(fed, got[:, t]):
            if t > 0 and bool((fed == BOS).all()):
                every = all(bool((later.args["tokens"] == BOS).all()) for later in steps[1:])
                return (f"{'every step feeds' if every else f'step {t} feeds'} <bos>: at step {t} decoder_step was "
                        f"fed {_words(fed)} instead of the newest token of each sentence, "
                        f"{_words(got[:, t])}. Feed the newest token, ys[:, -1:].")
            return (f"at step {t} decoder_step was fed {_words(fed)} instead of the newest token of each "
                    f"sentence in your ys, {_words(got[:, t])}: feed ys[:, -1:].")
        return _choice(got, steps, t - 1) if t > 0 else ""

    def stopped(found: runs.Departure) -> str:
        got, steps = found.student.result, found.student.of("decoder_step")
        t = len(steps) - 1
        chosen = _choice(got, steps, t) if t >= 0 else ""
        if t < 0 or chosen:
            return chosen
        done = [_ended(row, t + 1) is not None for row in got]
        first_end = next((step for step in range(t + 1) if any(_ended(row, step + 1) is not None for row in got)),
                         None)
        return _stopped_early(t, done, first_end, max_len, "decoding")

    def went_on(found: runs.Departure) -> str:
        got, steps = found.student.result, found.student.of("decoder_step")
        t = len(found.reference.of("decoder_step"))
        chosen = _choice(got, steps, t - 1)
        if chosen:
            return chosen
        if t >= max_len:
            return f"decoder_step ran {len(steps)} times, more than max_len = {max_len}: loop for _ in range(max_len)."
        return (f"decoding never stops early: every sentence had said <eos> after step {t - 1}, yet decoder_step "
                f"ran {len(steps) - t} more time(s). Once every sentence is finished, break out of the loop "
                "(if finished.all(): break).")

    def result(found: runs.Departure) -> str:
        got, steps = found.student.result, found.student.of("decoder_step")
        return _choice(got, steps, len(steps) - 1) or (
            f"ys has {got.size(1)} columns after {len(steps)} steps: <bos>, then one column per step (append each "
            "step's tokens once).")

    return {"decoder_step.cache": cache, "decoder_step.tokens": tokens, "stopped": stopped, "went on": went_on,
            "result": result, "part": lambda found: _cache_departure(found.student, 0) or ""}


def _lively(sizes: Sizes, padded: bool = True, beam: tuple[int, float] | None = None, tries: int = 80,
            feeding: bool = True) -> Sizes:
    """`sizes` with the seed of the first of `tries` random models (`lively.seeds`) whose
    reference greedy decoding shows what these checks compare: at least two different generated tokens and, for
    a batch, a sentence ending with <eos> while another goes on (else a loop that never pads, or stops at the
    first <eos>, agrees); with `beam` (beam_size, alpha), also a reference beam search whose result changes when
    its cache is not reordered, or reordered twice (else a beam search that mishandles its cache agrees); without
    `feeding`, neither that nor `_feeding_matters` (a check that compares no cached tokens with greedy ones). The
    seeds the course writes pass at once; the hidden tests' seeds, drawn from the class's secret, are random,
    and most random models show none of it."""
    for seed in lively.seeds(sizes.seed, tries):
        candidate = replace(sizes, seed=seed)
        model, src = _random_model(candidate).module, _random_source(candidate, padded)
        with torch.no_grad():
            greedy = reference_greedy_decode(model, src, PAD, BOS, EOS, candidate.max_len)[:, 1:]
        if not lively.shows_decoding(greedy, EOS, PAD):
            continue
        if not feeding or (_feeding_matters(model, src, candidate.max_len, greedy) if beam is None
                           else _cache_order_matters(model, src, candidate.max_len, beam)):
            return candidate
    return sizes


def _feeding_matters(model: nn.Module, src: torch.Tensor, max_len: int, greedy: torch.Tensor) -> bool:
    """Whether cached greedy decoding gives other tokens than `greedy` (the reference's, without <bos>) when every
    step is fed the whole prefix instead of the newest token, and when it is fed <bos> at every step (the
    course's own start_cache and decoder_step, on the check's model): else a loop that hands decoder_step the
    wrong tokens agrees with a right one on this model."""
    for feed in (lambda ys: ys, lambda ys: ys[:, :1]):
        with torch.no_grad():
            src_mask = make_source_mask(src, PAD)
            cache = reference_start_cache(model, model.encoder(src, src_mask), src_mask)
            ys = torch.full((src.size(0), 1), BOS, dtype=torch.long)
            finished = torch.zeros(src.size(0), dtype=torch.bool)
            try:
                for _ in range(max_len):
                    if cache.steps >= model.decoder.positional_encoding.pe.size(1):  # as the checks' step says
                        raise IndexError("no position left in the table")
                    token = reference_decoder_step(model, cache, feed(ys)).argmax(dim=-1).masked_fill(finished, PAD)
                    ys = torch.cat([ys, token.unsqueeze(1)], dim=1)
                    finished |= token == EOS
                    if finished.all():
                        break
            except (IndexError, RuntimeError):  # the wrong feeding ran out of positions: it shows
                continue
        if ys[:, 1:].shape == greedy.shape and torch.equal(ys[:, 1:], greedy):
            return False
    return True


def _cache_order_matters(model: nn.Module, src: torch.Tensor, max_len: int, beam: tuple[int, float]) -> bool:
    """Whether the reference beam search gives another result when its cache is not reordered and when it is
    reordered twice (the reference's KVCache.reorder replaced for the two runs, on the check's own model)."""
    reorder = KVCache.reorder

    def twice(cache: KVCache, rows: torch.Tensor) -> None:
        reorder(cache, rows)
        reorder(cache, rows)

    with torch.no_grad():
        expected = reference_beam_search(model, src, PAD, BOS, EOS, max_len, *beam)
        results = []
        for replacement in (lambda cache, rows: None, twice):
            KVCache.reorder = replacement
            try:
                results.append(reference_beam_search(model, src, PAD, BOS, EOS, max_len, *beam))
            finally:
                KVCache.reorder = reorder
    return all(got.shape != expected.shape or not torch.equal(got, expected) for got in results)


def _greedy_case(cached_greedy_decode: Callable, sizes: Sizes, padded: bool) -> None:
    sizes = _lively(sizes, padded)
    model = _random_model(sizes)
    src = _random_source(sizes, padded)
    run, _ = _run_there(cached_greedy_decode, "cached_greedy_decode", model.arguments, model.state, src,
                        sizes.max_len)
    with torch.no_grad():
        expected = reference_greedy_decode(model.module, src, PAD, BOS, EOS, sizes.max_len)
    _expect_ids(run.result, expected,
                departure=lambda: runs.departure(run, _looped(reference_cached_greedy_decode, model.module, src,
                                                              sizes.max_len), _greedy_readings(sizes.max_len)),
                problem=f"cached greedy decoding of {'a padded' if padded else 'a'} batch (random weights, seed "
                        f"{sizes.seed}) differs from stage 6's greedy decoding.",
                cause="each step: logits = decoder_step(model, cache, ys[:, -1:]); argmax; pad finished "
                      "sentences; append; stop when all are finished.")


@check("cached_greedy_decode gives exactly the token ids of stage 6's greedy_decode")
def cached_greedy_matches_greedy(cached_greedy_decode: Callable, **sizes: int) -> None:
    _greedy_case(cached_greedy_decode, replace(Sizes(batch=3, seed=0), **sizes), padded=False)


@check("on a padded batch whose sentences end at different steps, cached and uncached greedy agree exactly")
def cached_greedy_matches_greedy_padded(cached_greedy_decode: Callable, **sizes: int) -> None:
    _greedy_case(cached_greedy_decode, replace(Sizes(), **sizes), padded=True)


@check("cached_greedy_decode's calls and cache sizes are those of a cached decoding")
def cached_greedy_uses_the_cache(cached_greedy_decode: Callable, **sizes: int) -> None:
    config = _lively(replace(Sizes(), **sizes), feeding=False)  # sentences that run on past step 0
    model = _random_model(config)
    run, counted = _run_there(cached_greedy_decode, "cached_greedy_decode", model.arguments, model.state,
                              _random_source(config), config.max_len)
    steps, starts = run.result.size(1) - 1, len(run.of("start_cache"))
    if counted.decoder_calls:
        fail("the whole decoder ran during cached decoding.", expected="no call of model.decoder(...)",
             got=f"{counted.decoder_calls} calls", cause="call decoder_step(model, cache, ys[:, -1:]) in the loop.")
    if "decoder_step" in run.plugged and not run.of("decoder_step"):
        fail("cached_greedy_decode never called decoder_step.", expected="one decoder_step call per generated token",
             got=f"0 calls for {steps} generated tokens",
             cause="each step: logits = decoder_step(model, cache, ys[:, -1:]).")
    layers = config.num_layers
    if starts > 1 or counted.cross_calls != 2 * layers:
        fail("cross-attention keys and values were not computed exactly once.",
             expected=f"{2 * layers} projections (W_k and W_v of {layers} layers), once for the sentence batch",
             got=f"{counted.cross_calls} projections for {steps} steps"
                 + (f" (start_cache ran {starts} times)" if starts > 1 else ""),
             cause="start the cache once, before the loop, and pass the same cache to every decoder_step.")
    calls = run.of("decoder_step")
    held = [_cached(call) for call in calls]
    if starts <= 1 and None not in held and held != list(range(1, len(calls) + 1)):
        shown = min(len(held), 8)
        fail("the cache does not grow by one position per step.",
             expected="after steps 0, 1, 2, ...: " + ", ".join(map(str, range(1, shown + 1))) + " positions",
             got="after steps 0, 1, 2, ...: " + ", ".join(map(str, held[:shown])) + " positions",
             cause=next((reason for index in range(len(calls)) if (reason := _cache_departure(run, index))),
                        "call decoder_step once per generated token, with the newest token only."))
    for index in range(len(calls)):
        departure = _cache_departure(run, index)
        if departure:
            fail(f"step {index} did not continue the cache of the steps before it.",
                 expected="one cache, one more position per step", got=departure.split(":")[0], cause=departure)
    longer = sorted({length for length in counted.self_lengths if length != 1})
    if longer:
        fail("within one step, self-attention projected more than one position.",
             expected="W_q, W_k, W_v of self-attention on 1 position per step", got=f"on {longer} positions",
             cause="feed only the newest token, ys[:, -1:], (batch, 1): earlier ones are in the cache.")

# --- select_beams ------------------------------------------------------------------------------------------


def _select(scores: torch.Tensor, log_probs: torch.Tensor, finished: torch.Tensor, lengths: torch.Tensor,
            beam_size: int, alpha: float, pad_idx: int = PAD) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """select_beams, the checks' copy (plugged into the student's beam search)."""
    stay = torch.full_like(log_probs, float("-inf"))
    stay[..., pad_idx] = 0.0
    candidates = scores.unsqueeze(-1) + torch.where(finished.unsqueeze(-1), stay, log_probs)
    ranking = candidates / length_penalty(lengths + (~finished).long(), alpha).unsqueeze(-1)
    best = ranking.flatten(1).topk(beam_size, dim=-1).indices
    vocab = log_probs.size(-1)
    return candidates.flatten(1).gather(1, best), best // vocab, best % vocab


# Hand-made inputs of one select_beams step: a batch of 2 sentences, 3 hypotheses each, a vocabulary of 8.
# (scores so far, finished, lengths, alpha, seed of the random log-probabilities)
TOP_STATE = (((-1.0, -1.4, -3.0), (-0.6, -2.5, -2.6)), ((False,) * 3, (False,) * 3), ((2, 2, 2), (2, 2, 2)), 0.0, 1)
FINISHED_STATE = (((-0.9, -1.2, -6.0), (-3.0, -0.8, -1.1)), ((True, False, True), (False, True, False)),
                  ((2, 3, 1), (3, 2, 3)), 0.0, 2)
PENALTY_STATE = (((-1.2, -2.5, -1.9), (-0.9, -2.0, -1.8)), ((False, False, True), (True, False, True)),
                 ((1, 8, 2), (6, 1, 5)), 1.0, 8)
GNMT_ALPHA = 0.6  # the length penalty's exponent in Wu et al. (2016): with alpha = 1, `* alpha` and `** alpha` agree


def _select_inputs(scores: Sequence, finished: Sequence, lengths: Sequence, seed: int, vocab: int = 8,
                   ) -> tuple[torch.Tensor, ...]:
    """(scores, log_probs, finished, lengths) tensors; log_probs (batch, beam, vocab) random from `seed`."""
    score_tensor = torch.tensor(scores, dtype=torch.float64)  # (batch, beam)
    raw = torch.randn(*score_tensor.shape, vocab, generator=generator(seed), dtype=torch.float64)
    raw[..., PAD] = -30.0  # a live hypothesis (almost) never picks <pad>, as in a trained model
    log_probs = torch.log_softmax(2.0 * raw, dim=-1)
    return score_tensor, log_probs, torch.tensor(finished, dtype=torch.bool), torch.tensor(lengths, dtype=torch.long)


def _index(value: torch.Tensor) -> str:
    """A beam or token index as returned: '3', or '0.875' when it is not a whole number."""
    number = float(value)
    return str(int(number)) if math.isfinite(number) and number == int(number) else f"{number:.4g}"


def _show_selection(scores: torch.Tensor, parents: torch.Tensor, tokens: torch.Tensor) -> str:
    lines = []
    for sentence in range(scores.size(0)):
        kept = ", ".join(f"beam {_index(p)} + token {_index(t)} ({float(s):.3f})"
                         for s, p, t in zip(scores[sentence], parents[sentence], tokens[sentence], strict=True))
        lines.append(f"\n      sentence {sentence}: {kept}")
    return "".join(lines)


@on_student_side
def _select_there(select_beams: Callable, inputs: tuple[torch.Tensor, ...], beam_size: int, alpha: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The student's select_beams on clones of `inputs` (scores, log_probs, finished, lengths)."""
    with torch.no_grad(), student_code():
        got = select_beams(*(value.clone() for value in inputs), beam_size, alpha, PAD)
    if not isinstance(got, tuple | list) or len(got) != 3:
        fail("select_beams did not return three tensors.", expected="(new scores, parents, tokens)",
             got=describe(got), cause="keep the given `return new_scores, parents, tokens`.")
    for name, value in zip(("new scores", "parents", "tokens"), got, strict=True):
        if not isinstance(value, torch.Tensor):
            fail(f"select_beams' {name} is not a tensor.", expected="a (batch, beam_size) tensor", got=describe(value),
                 cause="keep the given `return new_scores, parents, tokens`.")
    return tuple(value.detach().clone() for value in got)


def _sentence_list(items: list[str]) -> str:
    return ", ".join(items[:4]) + (", ..." if len(items) > 4 else "")


def _selection_reading(inputs: tuple[torch.Tensor, ...], got: Sequence[torch.Tensor],
                       expected: Sequence[torch.Tensor], alpha: float) -> str:
    """What the student's selection is, read from its values: indices split another way, a finished hypothesis
    extended or dropped, one child per hypothesis, returned scores that are another quantity of the candidates,
    or the rule that orders the kept candidates."""
    scores, log_probs, finished, lengths = inputs
    batch, beam, vocab = log_probs.shape
    new_scores, parents, tokens = got[0].double(), got[1].long(), got[2].long()
    _, wanted_parents, wanted_tokens = expected
    flat = wanted_parents * vocab + wanted_tokens  # the expected candidates' index in (beam * vocab)
    if torch.equal(parents, wanted_tokens) and torch.equal(tokens, wanted_parents):
        return ("your parents are the tokens of the best candidates and your tokens their parents: in the "
                "flattened (beam * vocab) index, parent = index // vocab and token = index % vocab")
    for size, words in ((beam, "the beam size"), (batch, "the batch size")):
        if size != vocab and torch.equal(parents, flat // size) and torch.equal(tokens, flat % size):
            return (f"the flat index of the best candidates is split by {words} ({size}): each parent owns vocab = "
                    f"{vocab} consecutive candidates, so parent = index // vocab and token = index % vocab")
    if (parents < 0).any() or (parents >= beam).any() or (tokens < 0).any() or (tokens >= vocab).any():
        return (f"your parents or tokens are out of range: parents must lie in 0..{beam - 1} (the beam) and tokens "
                f"in 0..{vocab - 1} (the vocabulary); index // vocab and index % vocab give them")
    rows = torch.arange(batch).unsqueeze(1)
    if (new_scores.isneginf() & ~expected[0].isneginf()).any():
        return ""  # impossible candidates kept over possible ones: the ranking itself is broken (the engine reads it)
    extended = [f"sentence {b}, beam {int(parents[b, j])} + token {int(tokens[b, j])}"
                for b in range(batch) for j in range(beam)
                if finished[b, parents[b, j]] and tokens[b, j] != PAD]
    if extended:
        return (f"a finished hypothesis was extended by a word ({_sentence_list(extended)}): after <eos> the only "
                "candidate is pad_idx, at no cost (log-probability 0); every other token gets -inf")
    dropped = [f"sentence {b}, beam {int(p)}" for b in range(batch) for p in wanted_parents[b].tolist()
               if finished[b, p] and p not in parents[b].tolist()]
    if dropped:
        return (f"finished hypotheses disappear from the beam ({_sentence_list(dropped)} should stay): a finished "
                "hypothesis stays a candidate, extended by pad_idx with log-probability 0, its score unchanged")
    stay = torch.full_like(log_probs, float("-inf"))
    stay[..., PAD] = 0.0
    step = torch.where(finished.unsqueeze(-1), stay, log_probs)  # (batch, beam, vocab)
    candidates = scores.unsqueeze(-1) + step
    grown = lengths + (~finished).long()
    penalty = length_penalty(grown, alpha).unsqueeze(-1)
    own = candidates[rows, parents, tokens]  # the candidates the student kept, their total log-probabilities
    quantities = {
        "divided by the length penalty: rank with the penalty, but return the plain total log-probabilities (the "
        "penalty is applied again at the next step)": (candidates / penalty)[rows, parents, tokens],
        "the new token's log-probability alone: a candidate's score is its parent's score plus the new "
        "log-probability, scores.unsqueeze(-1) + log_probs": step[rows, parents, tokens],
    }
    if not torch.allclose(new_scores, own, atol=1e-9):
        for words, value in quantities.items():
            if torch.allclose(new_scores, value, atol=1e-9):
                return f"the scores you return are {words}"
        return ("the scores you return are not the total log-probabilities of the candidates you keep: each is its "
                "parent's score plus the new token's log-probability, scores.unsqueeze(-1) + log_probs")
    ranking = candidates / penalty
    chosen = (parents * vocab + tokens)  # (batch, beam): the student's picks as flat indices, best first

    def picks(order: torch.Tensor) -> torch.Tensor:
        return order.flatten(1).topk(beam, dim=-1).indices  # (batch, beam)

    multiplied = {  # alpha used as a factor, where the penalty raises to its power
        "the length penalty multiplies by alpha where it raises to the power alpha: lp(n) = ((5 + n) / 6) ** alpha":
            candidates / (((5.0 + grown) / 6.0) * alpha).unsqueeze(-1),
    }
    if alpha not in (0.0, 1.0):  # times 1 is no penalty at all (read below); times 0 ranks nothing
        multiplied["the candidates are multiplied by alpha, where they are divided by the length penalty of their "
                   "new length"] = candidates * alpha
    for words, order in multiplied.items():
        with torch.no_grad():
            if torch.equal(picks(order), chosen) and not torch.equal(picks(ranking), chosen):
                return words
    if beam > 1 and all(sorted(parents[b].tolist()) == list(range(beam)) for b in range(batch)) and \
            torch.equal(tokens, ranking.argmax(dim=-1)[rows, parents]) and \
            any(len(set(wanted_parents[b].tolist())) < beam for b in range(batch)):
        return ("each hypothesis keeps exactly one child, its best, but the best candidates of a sentence may come "
                "from any parents (here one hypothesis has two among the best): rank all beam * vocab candidates of "
                "a sentence together, flatten(1), then topk(beam_size)")
    return _ranking_reading(candidates, step, lengths, finished, alpha, parents, tokens)


def _same_candidates(got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> bool:
    """Whether the student keeps the expected candidates of every sentence, in whatever order."""
    def kept(parents: torch.Tensor, tokens: torch.Tensor) -> list[list[tuple[int, int]]]:
        return [sorted(zip(p.tolist(), t.tolist(), strict=True)) for p, t in zip(parents, tokens, strict=True)]
    return kept(got[1].long(), got[2].long()) == kept(expected[1], expected[2])


def _ranking_reading(candidates: torch.Tensor, step: torch.Tensor, lengths: torch.Tensor, finished: torch.Tensor,
                     alpha: float, parents: torch.Tensor, tokens: torch.Tensor) -> str:
    """The part of the ranking formula, the best beam_size of score / lp(new length), that the student's choice
    leaves out or changes: the formula is tried with each part changed (score so far left out, live hypotheses
    not grown, finished ones grown, no length penalty, the lowest ranked kept), and a change is named when every
    variant that picks the student's candidates, in the student's order, has it."""
    vocab = step.size(-1)
    formula = (True, 1, 0, True, True)  # with the score so far; live + 1; finished + 0; the penalty; the best
    words = ("leaves out each hypothesis's score so far: a candidate's score is its parent's score plus the new "
             "token's log-probability",
             "uses the length before this step: a live hypothesis grows by one token, lengths + 1",
             "lets finished hypotheses grow: a finished hypothesis keeps its length, lengths + (~finished).long()",
             "ranks the candidates by their scores alone, as if there were no length penalty: divide each candidate by "
             "length_penalty(new length, alpha)",
             "keeps the lowest-ranked candidates instead of the best: topk keeps the largest values (largest=True)")
    matching = []
    for variant in itertools.product((True, False), (1, 0), (0, 1), (True, False), (True, False)):
        history, live, done, penalised, largest = variant
        grown = lengths + live * (~finished).long() + done * finished.long()
        ranking = (candidates if history else step) / length_penalty(grown, alpha if penalised else 0.0).unsqueeze(-1)
        best = ranking.flatten(1).topk(parents.size(1), dim=-1, largest=largest).indices
        if torch.equal(best // vocab, parents) and torch.equal(best % vocab, tokens):
            matching.append(variant)
    if not matching or formula in matching:
        return ""
    changed = [words[part] for part in range(5) if all(variant[part] != formula[part] for variant in matching)]
    if not changed and all(variant[1] == variant[2] for variant in matching):
        changed = ["gives finished and live hypotheses the same new length: a live hypothesis grows by one token, a "
                   "finished one keeps its length, lengths + (~finished).long()"]
    return ("the ranking of your candidates " + "; it also ".join(changed)) if changed else ""


def _select_case(select_beams: Callable, state: tuple, problem: str, cause: str) -> None:
    *values, alpha, seed = state
    inputs = _select_inputs(*values, seed)
    beam_size = inputs[0].size(1)
    got = _select_there(select_beams, inputs, beam_size, alpha)
    names = ("new scores", "parents", "tokens")
    got = [expect_shape(f"select_beams' {name}", value, tuple(inputs[0].shape),
                        cause="take the best beam_size of the beam * vocab candidates of each sentence: "
                              "topk(beam_size, dim=-1) on the flattened (batch, beam * vocab) ranking.")
           for name, value in zip(names, got, strict=True)]
    expected = reference_select_beams(*inputs, beam_size, alpha, PAD)
    same_ids = all(torch.equal(g.double().cpu(), e.double()) for g, e in zip(got[1:], expected[1:], strict=True))
    if same_ids and torch.allclose(got[0].double().cpu(), expected[0], atol=1e-9):
        return
    found = _fractional_indices(got) or _selection_reading(inputs, got, expected, alpha)
    if not found:
        try:
            engine = _select_engine(select_beams, inputs, beam_size, alpha, got, expected)
        except Exception:  # a run that cannot be recorded says nothing
            engine = None
        found = engine.cause if engine is not None else ""
    impossible = got[0].double().cpu().isneginf() & ~expected[0].isneginf()
    if not found and _same_candidates(got, expected):
        found = ("you keep the right candidates but in another order than best first by score / "
                 "length_penalty(new length): the checks could not tell from your values whether the order or the "
                 "ranking differs; print your ranking for this input")
    elif not found and impossible.any():
        found = (f"{int(impossible.sum())} of the candidates you keep have score -inf (impossible extensions) while "
                 "candidates with a finite score were left out: the values you pass to topk do not rank the "
                 "candidates (are they -inf or nan?); print them for this input")
    fail(f"{problem}: {_what_survives(got, expected, same_ids)}.", expected=_show_selection(*expected),
         got=_show_selection(*got), cause=found or f"not one of the mistakes the checks recognise; {RECIPE} {cause}")


def _what_survives(got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], same_ids: bool) -> str:
    """How the student's selection departs from the expected one, in what it shows (`same_ids`: its parents and
    tokens are the expected ones, in order)."""
    if _fractional_indices(got):
        return "some parents or tokens are not whole numbers"
    if same_ids:
        return "the expected candidates survive, with other scores"
    if _same_candidates(got, expected):
        return "the expected candidates survive, in another order"
    return "other candidates survive"


def _fractional_indices(got: Sequence[torch.Tensor]) -> str:
    """Parents or tokens that are not whole numbers: indices made by a true division."""
    for name, value in zip(("parents", "tokens"), got[1:], strict=True):
        values = value.detach().double().cpu()
        broken = values != values.floor()
        if broken.any():
            example = float(values[broken][0])
            return (f"your {name} are not whole numbers (e.g. {example:g}, where a beam or token index belongs): "
                    f"they come from a true division `/`, which gives fractions, instead of the floor division "
                    f"`//` (index // vocab is the parent, index % vocab the token)")
    return ""


def _select_engine(select_beams: Callable, inputs: tuple[torch.Tensor, ...], beam_size: int, alpha: float,
                   got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> Diagnosis | None:
    """The engine's reading of the first output that differs."""
    names = ("scores", "log_probs", "finished", "lengths")
    arguments = (*(value.clone() for value in inputs), beam_size, alpha, PAD)
    student = differential.traced(select_beams, *arguments, names=names)
    reference = differential.traced_call(reference_select_beams, *arguments, names=names)
    part = 0 if not torch.allclose(got[0].double(), expected[0], atol=1e-9) else (
        1 if not torch.equal(got[1].long(), expected[1]) else 2)
    batch, beam, vocab = inputs[1].shape
    context = differential.Context(sizes={"batch": batch, "beam": beam, "vocab": vocab},
                                   quantities={"alpha": alpha} if alpha else {})
    return differential.explain(student, reference, got[part], expected[part], context, ("sentence", "beam"))


@check("select_beams keeps the beam_size best extensions of each sentence, across all its hypotheses")
def select_beams_top_candidates(select_beams: Callable, state: tuple = TOP_STATE) -> None:
    _select_case(select_beams, state, problem="hand-made scores",
                 cause="candidates = scores.unsqueeze(-1) + log_probs, (batch, beam, vocab); flatten to (batch, "
                       "beam * vocab); topk(beam_size); parent = index // vocab, token = index % vocab.")


@check("a finished hypothesis stays a candidate, extended only by <pad>, with its score unchanged")
def select_beams_keeps_finished(select_beams: Callable, state: tuple = FINISHED_STATE) -> None:
    _select_case(select_beams, state, problem="hand-made scores with finished hypotheses",
                 cause="for finished hypotheses replace log_probs by -inf everywhere except 0 at pad_idx, "
                       "e.g. with torch.where(finished.unsqueeze(-1), stay, log_probs).")


def _chosen(candidates: torch.Tensor, penalty: torch.Tensor, beam_size: int) -> torch.Tensor:
    """The flat indices of the beam_size best candidates of each sentence ranked by candidates / penalty."""
    return (candidates / penalty.unsqueeze(-1)).flatten(1).topk(beam_size, dim=-1).indices


def _penalty_matters(state: tuple) -> bool:
    """Whether, for the hand-made `state` (with its seed's random log-probabilities), ranking by score /
    lp(new length) keeps other candidates than ranking by the plain score, by lp of the length before the step,
    and (where alpha is neither 0 nor 1, the values at which the two agree) by ((5 + n) / 6) times alpha instead
    of to the power alpha: else the property's input cannot tell a penalty left out or misapplied from a right one."""
    *values, alpha, seed = state
    scores, log_probs, finished, lengths = _select_inputs(*values, seed)
    stay = torch.full_like(log_probs, float("-inf"))
    stay[..., PAD] = 0.0
    candidates = scores.unsqueeze(-1) + torch.where(finished.unsqueeze(-1), stay, log_probs)
    new_lengths, beam_size = lengths + (~finished).long(), scores.size(1)
    right = _chosen(candidates, length_penalty(new_lengths, alpha), beam_size)
    wrong = [torch.ones_like(scores), length_penalty(lengths, alpha)]
    if alpha not in (0.0, 1.0):
        wrong.append((5.0 + new_lengths) / 6.0 * alpha)
    return all(not torch.equal(_chosen(candidates, penalty, beam_size), right) for penalty in wrong)


def _penalty_state(state: tuple, tries: int = 80) -> tuple:
    """`state` with the seed of the first of `tries` (`lively.seeds`) whose random log-probabilities
    make the length penalty matter (`_penalty_matters`). The seeds the course writes pass at once; inside the
    hidden tests every seed is salted from the class's secret, and some salted ones would not."""
    for seed in lively.seeds(state[4], tries):
        candidate = (*state[:4], seed)
        if _penalty_matters(candidate):
            return candidate
    return state


@check("select_beams ranks the candidates as the length penalty of section 6 does")
def select_beams_length_penalty(select_beams: Callable, state: tuple = PENALTY_STATE) -> None:
    cause = ("rank by candidates / length_penalty(lengths + (~finished).long(), alpha).unsqueeze(-1), and return the "
             "candidates' plain scores.")
    for alpha in dict.fromkeys((state[3], GNMT_ALPHA)):  # then the exponent itself: lp = ((5 + n) / 6) ** alpha
        _select_case(select_beams, _penalty_state((*state[:3], alpha, state[4])),
                     problem=f"hand-made scores with alpha={alpha}", cause=cause)


# --- beam_search -------------------------------------------------------------------------------------------


def _rows(values: torch.Tensor) -> str:
    return "[" + ", ".join(str(int(value)) for value in values) + "]"


def _follow_departure(t: int, call: runs.Call, previous: runs.Call) -> str | None:
    """Whether the `finished` and `lengths` handed to select_beams at step t follow the parents chosen at step
    t - 1 (`previous`)."""
    _, parents, tokens = previous.output
    finished, lengths = _followed(previous)
    given, before = call.args["finished"].bool(), previous.args["finished"].bool()
    if not runs.same(given, finished):
        if runs.same(given, before | (tokens == EOS)):
            return (f"`finished` is not taken from the parents: at step {t} select_beams was given the finished flags "
                    f"{given.int().tolist()}, the previous flags of each beam position, while the "
                    f"hypotheses there now continue parents {parents.tolist()}, so they should be "
                    f"{finished.int().tolist()}: finished.gather(1, parents) | (tokens == eos_idx).")
        return (f"at step {t} select_beams was given the finished flags {given.int().tolist()} instead of "
                f"{finished.int().tolist()}: a hypothesis is finished if its parent was, or if its new token is "
                "<eos>: finished.gather(1, parents) | (tokens == eos_idx).")
    given, grown = call.args["lengths"].long(), previous.args["lengths"].long()
    if not runs.same(given, lengths):
        unfollowed = (grown + (~before.gather(1, parents)).long(), grown + (~before).long())
        if any(runs.same(given, wrong) for wrong in unfollowed):
            return (f"`lengths` is not taken from the parents: at step {t} select_beams was given the lengths "
                    f"{given.tolist()}, grown from the previous lengths of each beam position, while the "
                    f"hypotheses there continue parents {parents.tolist()}, so they should be {lengths.tolist()}: "
                    "lengths.gather(1, parents) + (~finished_before).long().")
        if runs.same(given, grown.gather(1, parents) + 1):
            return (f"finished hypotheses keep growing: at step {t} select_beams was given the lengths "
                    f"{given.tolist()} instead of {lengths.tolist()}; a hypothesis whose parent had finished "
                    "keeps its length: lengths.gather(1, parents) + (~finished_before).long().")
        return (f"at step {t} select_beams was given the lengths {given.tolist()} instead of "
                f"{lengths.tolist()}: lengths.gather(1, parents), plus one where the parent had not finished.")
    return None


def _log_probs_departure(t: int, given: torch.Tensor, logits: torch.Tensor, batch: int, beam_size: int
                         ) -> str | None:
    """Whether select_beams was given log_softmax of the logits that step t's decoder_step returned."""
    logits, given = logits.double().cpu(), given.double().cpu()
    if logits.size(0) != batch * beam_size:
        return None
    wanted = torch.log_softmax(logits, dim=-1).view(batch, beam_size, -1)
    if runs.same(given, wanted, atol=1e-6):
        return None
    if runs.same(given, logits.view(batch, beam_size, -1), atol=1e-6):
        return (f"raw logits are used as log-probabilities: at step {t} select_beams was given decoder_step's "
                "logits as they are. Scores add up log-probabilities, which are at most 0 and comparable between "
                "hypotheses: torch.log_softmax(logits, dim=-1).")
    if runs.same(given, torch.softmax(logits, dim=-1).view(batch, beam_size, -1), atol=1e-6):
        return (f"probabilities are used as log-probabilities: at step {t} select_beams was given softmax(logits); "
                "scores add up log-probabilities: torch.log_softmax(logits, dim=-1).")
    if given.shape == wanted.shape:
        swapped = torch.log_softmax(logits, dim=-1).view(beam_size, batch, -1).transpose(0, 1)
        if runs.same(given, swapped, atol=1e-6):
            return (f"the batch and beam axes are swapped: at step {t} select_beams' log_probs[b, j] holds row "
                    f"j * batch + b of decoder_step's output, where the hypotheses are stored as row "
                    f"b * beam_size + j (repeat_interleave): view it as (batch, beam_size, vocab).")
        rows = wanted.reshape(batch * beam_size, -1)
        if all(any(runs.same(row, other, atol=1e-6) for other in rows)
               for row in given.reshape(batch * beam_size, -1)):
            return (f"at step {t} select_beams was given the right log-probabilities with the hypotheses' rows in "
                    "another order: log_probs[b, j] must be row b * beam_size + j of decoder_step's output.")
    return (f"at step {t} select_beams was given values that are not log_softmax(logits) of decoder_step's output in "
            f"any order of its rows; {RECIPE} torch.log_softmax(logits, dim=-1).view(batch, beam_size, -1).")


def _reorder_departure(t: int, before: list[torch.Tensor], after: list[torch.Tensor], parents: torch.Tensor,
                       beam_size: int) -> str | None:
    """Whether the cache that step t began with (`before`) holds, in row j, the history of hypothesis j's parent
    (`after`: the cache as step t - 1 left it)."""
    batch = parents.size(0)
    rows = (torch.arange(batch).unsqueeze(1) * beam_size + parents).flatten()
    if runs.same(before, [keys.index_select(0, rows) for keys in after], atol=1e-10):
        return None
    if runs.same(before, after, atol=1e-10):
        return (f"the cache is not reordered: when step {t} began, row j of the cache still held the keys and "
                f"values of beam position j before the step, while the new hypotheses continue the rows "
                f"{_rows(rows)}. After choosing the parents, cache.reorder(rows) with rows = (first_row + "
                "parents).flatten(), so every hypothesis continues its parent's history.")
    plain = parents.flatten()
    if plain.max() < after[0].size(0) and \
            runs.same(before, [keys.index_select(0, plain) for keys in after], atol=1e-10):
        return (f"the rows of the parents ignore the sentence: the cache was reordered with rows = "
                f"parents.flatten() = {_rows(plain)}, which are rows of the first sentence; hypothesis j of sentence "
                f"b continues row b * beam_size + parent, (first_row + parents).flatten() = {_rows(rows)}.")
    twice = rows[rows]  # the rows that reordering with `rows` twice picks
    if runs.same(before, [keys.index_select(0, twice) for keys in after], atol=1e-10):
        return (f"when step {t} began, the cache's rows were not those of the parents: its rows held the histories "
                f"of the rows {_rows(twice)} where the parents' rows {_rows(rows)} belong, as if the cache were "
                "reordered twice in one step. Reorder it once per step, after select_beams.")
    return (f"when step {t} began, the cache's rows were not those of the parents: reorder it with rows = (first_row "
            f"+ parents).flatten() = {_rows(rows)}, once per step, after select_beams.")


def _followed(call: runs.Call) -> tuple[torch.Tensor, torch.Tensor]:
    """(finished, lengths), each (batch, beam), as they follow a select_beams call: from its input and its
    choice."""
    _, parents, tokens = call.output
    was_finished = call.args["finished"].bool().gather(1, parents)
    return was_finished | (tokens == EOS), call.args["lengths"].long().gather(1, parents) + (~was_finished).long()


def _winners(got: torch.Tensor, selects: Sequence[runs.Call], beam_size: int, alpha: float,
             show: Callable[[torch.Tensor], str]) -> str:
    """Why the returned sentences are not the winners of the search the calls show: ys kept its rows while the
    hypotheses followed their parents, another hypothesis than the best, or no hypothesis of the search."""
    batch = got.size(0)
    first_row = torch.arange(batch).unsqueeze(1) * beam_size  # (batch, 1)
    history = torch.full((batch * beam_size, 1), BOS, dtype=torch.long)  # what ys should be
    appended = history.clone()  # ys if its rows never followed the parents
    for call in selects:
        _, parents, tokens = call.output
        history = torch.cat([history[(first_row + parents).flatten()], tokens.view(-1, 1)], dim=1)
        appended = torch.cat([appended, tokens.view(-1, 1)], dim=1)
    best = (selects[-1].output[0] / length_penalty(_followed(selects[-1])[1], alpha)).argmax(dim=-1)  # (batch,)
    winners = history.view(batch, beam_size, -1)[torch.arange(batch), best]
    if winners.shape == got.shape and torch.equal(winners, got):
        return ""
    unfollowed = appended.view(batch, beam_size, -1)[torch.arange(batch), best]
    if unfollowed.shape == got.shape and torch.equal(unfollowed, got):
        return ("ys is not reordered: each row of ys kept its own earlier tokens while the hypothesis in that row "
                "continued another parent, so the returned sentence is pieced together from several hypotheses. "
                "Take the parents' rows, ys[rows], before appending the new tokens.")
    built = history.view(batch, beam_size, -1)
    if got.shape == winners.shape and all(bool((built[sentence] == got[sentence]).all(dim=1).any())
                                          for sentence in range(batch)):
        return ("each returned sentence is one of its hypotheses, but not the best one: keep the given last lines, "
                "the winner of each sentence is the argmax of scores / length_penalty(lengths, alpha), taken from "
                f"ys.view(batch, beam_size, -1). Here the winners are:{show(winners)}")
    return ("the returned sentences are not hypotheses your search built: their tokens do not follow the chain of "
            "parents select_beams chose, so the rows of ys do not follow the parents. Take the parents' rows, "
            f"ys[(first_row + parents).flatten()], before appending the new tokens. The winners would be:"
            f"{show(winners)}")


def _beam_readings(batch: int, beam_size: int, alpha: float, max_len: int, show: Callable[[torch.Tensor], str]
                   ) -> dict[str, runs.Reading]:
    """What a departure of a beam search means: the tokens a step was fed, the cache it began with (one cache,
    its rows following the parents), the log-probabilities, scores, `finished` and `lengths` handed to
    select_beams, when the search stopped, and which hypothesis came out."""

    def cache(found: runs.Departure) -> str:
        t = found.step
        said = _cache_departure(found.student, t)
        if said or t == 0:
            return said or ""
        after = found.student.of("decoder_step")[t - 1].after["cache"][1]
        parents = found.student.of("select_beams")[t - 1].output[1]
        return _reorder_departure(t, found.mine.args["cache"][1], after, parents, beam_size) or ""

    def tokens(found: runs.Departure) -> str:
        t = found.step
        fed, newest = found.mine.args["tokens"].view(-1), found.theirs.args["tokens"].view(-1)
        if fed.shape != newest.shape:
            return ""
        if t > 0 and bool((fed == BOS).all()):
            return (f"step {t} feeds <bos>: decoder_step was fed <bos> for every hypothesis instead of its "
                    f"newest token {_words(newest)}: feed ys[:, -1:].")
        return (f"at step {t} decoder_step was fed {_words(fed)} instead of the newest token of every "
                f"hypothesis, {_words(newest)}: feed ys[:, -1:], after ys was extended.")

    def log_probs(found: runs.Departure) -> str:
        t = found.step
        logits = found.student.of("decoder_step")[t].output
        return _log_probs_departure(t, found.mine.args["log_probs"], logits, batch, beam_size) or ""

    def scores(found: runs.Departure) -> str:
        t = found.step
        if t == 0:
            return (f"the first select_beams was given scores {found.mine.args['scores'].tolist()} instead of the "
                    "given start (0 for hypothesis 0, -inf for the others): keep the given lines before the loop.")
        return (f"at step {t} select_beams was given scores {found.mine.args['scores'].tolist()}, not the scores it "
                f"returned at step {t - 1}, {found.theirs.args['scores'].tolist()}: scores, parents, tokens = "
                "select_beams(scores, ...).")

    def follow(found: runs.Departure) -> str:
        t = found.step
        if t == 0:
            return ""
        return _follow_departure(t, found.mine, found.student.of("select_beams")[t - 1]) or ""

    def stopped(found: runs.Departure) -> str:
        selects = found.student.of("select_beams")
        if not selects or len(found.student.of("decoder_step")) != len(selects):
            return ""
        t, after = len(selects) - 1, [_followed(call)[0] for call in selects]
        live = int((~after[-1]).sum())
        if next((step for step, done in enumerate(after) if bool(done.any())), None) == t:
            return (f"the search stops when ONE hypothesis is finished: it stopped after step {t}, the first step "
                    f"at which one had said <eos>, with {live} hypotheses still live (max_len is {max_len}). Break "
                    "only when finished.all(): a hypothesis that has ended waits in the beam for the others.")
        return (f"the search stopped after {t + 1} step(s) with {live} hypotheses still live: a hypothesis that "
                f"never says <eos> gets max_len = {max_len} tokens. Loop for _ in range(max_len) and break once "
                "finished.all().")

    def went_on(found: runs.Departure) -> str:
        t, selects = len(found.reference.of("select_beams")), found.student.of("select_beams")
        followed = _follow_departure(t, selects[t], selects[t - 1]) if 0 < t < len(selects) else None
        if followed or t >= max_len:
            return followed or ""
        return (f"the search never stops early: after step {t - 1} every hypothesis of every sentence had "
                f"finished, yet it ran {len(selects) - t} more step(s). Break once finished.all().")

    def result(found: runs.Departure) -> str:
        selects = found.student.of("select_beams")
        return _winners(found.student.result, selects, beam_size, alpha, show) if selects else ""

    return {"decoder_step.cache": cache, "decoder_step.tokens": tokens, "select_beams.log_probs": log_probs,
            "select_beams.scores": scores, "select_beams.finished": follow, "select_beams.lengths": follow,
            "stopped": stopped, "went on": went_on, "result": result}


def _beam_case(beam_search: Callable, model: _Model, src: torch.Tensor, max_len: int, beam_size: int,
               alpha: float, expected: torch.Tensor, problem: str, cause: str,
               show: Callable[[torch.Tensor], str] = _show) -> None:
    run, _ = _run_there(beam_search, "beam_search", model.arguments, model.state, src, max_len, (beam_size, alpha))

    def departure() -> str:
        reference = _looped(reference_beam_search, model.module, src, max_len, (beam_size, alpha))
        return runs.departure(run, reference, _beam_readings(src.size(0), beam_size, alpha, max_len, show))

    _expect_ids(run.result, expected, problem=problem, cause=cause, show=show, departure=departure)


@check("beam_search with beam_size=1 gives exactly the token ids of greedy decoding (padded batch)")
def beam_size_one_is_greedy(beam_search: Callable, alpha: float = 0.6, **sizes: int) -> None:
    config = _lively(replace(Sizes(seed=3, eos_bias=2.0), **sizes), feeding=False)  # sentences end apart
    model, src = _random_model(config), _random_source(config)
    with torch.no_grad():
        expected = reference_greedy_decode(model.module, src, PAD, BOS, EOS, config.max_len)
    _beam_case(beam_search, model, src, config.max_len, 1, alpha, expected,
               problem="with one hypothesis per sentence, beam search must be greedy decoding, but differs.",
               cause="with beam_size=1 the best extension is the argmax; check the start (one live hypothesis, "
                     "score 0), that finished hypotheses only get <pad>, and the stopping rule.")


# --- a hand-made bigram model -------------------------------------------------------------------------------
WORDS = {4: "the", 5: "a", 6: "dog", 7: "cat", 8: "runs", 9: "big", 10: "white", 11: "fast"}
VOCAB = 12
# next-word probabilities after each word: greedy takes "the" (0.5) and ends with "the dog" (0.5 * 0.45 * 0.7 =
# 0.158); the best sentence is "a cat" (0.4 * 0.9 * 0.8 = 0.288).
MISSED_TABLE = {BOS: {4: 0.5, 5: 0.4, EOS: 0.1}, 4: {6: 0.45, 7: 0.4, EOS: 0.15}, 5: {7: 0.9, 6: 0.1},
                6: {EOS: 0.7, 8: 0.3}, 7: {EOS: 0.8, 8: 0.2}, 8: {EOS: 1.0}}
# one hypothesis finishes after two tokens ("the <eos>": 0.55 * 0.6 = 0.33) while another runs on to four
# ("a big white <eos>": 0.45 * 0.9 * 0.9 * 0.9 = 0.328): without a length penalty the short one wins, with
# alpha = 1 the long one (log 0.328 / lp(4) > log 0.33 / lp(2)).
LENGTH_TABLE = {BOS: {4: 0.55, 5: 0.45}, 4: {EOS: 0.6, 6: 0.4}, 5: {9: 0.9, EOS: 0.1}, 9: {10: 0.9, 11: 0.1},
                10: {EOS: 0.9, 6: 0.1}, 6: {EOS: 1.0}, 11: {EOS: 1.0}}
# "the <eos>" (0.6 * 0.8 = 0.48) ends first and leads for a while; "a big white fast cat <eos>" (0.4 * 0.98 ** 5
# = 0.362) overtakes it with alpha = 1 only later (log 0.362 / lp(6) = -0.555 > log 0.48 / lp(2) = -0.629), so
# the two swap places in the beam after one of them has stopped growing.
PATIENT_TABLE = {BOS: {4: 0.6, 5: 0.4}, 4: {EOS: 0.8, 6: 0.2}, 5: {9: 0.98, EOS: 0.02}, 9: {10: 0.98, EOS: 0.02},
                 10: {11: 0.98, EOS: 0.02}, 11: {7: 0.98, EOS: 0.02}, 7: {EOS: 0.98, 8: 0.02}, 6: {EOS: 1.0},
                 8: {EOS: 1.0}}
CHATTER = 8  # after <eos> the table says "runs": a search that extends finished hypotheses shows it


def bigram_model(table: Mapping[int, Mapping[int, float]], vocab: int = VOCAB) -> nn.Module:
    """A course Transformer with no blocks whose next-token distribution depends only on the previous token.

    With num_layers=0 the decoder is embedding -> positional encoding -> pred_layer. The embedding is one-hot
    (times 1/sqrt(d_model), undoing the scaling), the positional table is zero and pred_layer holds
    log P(next | previous) from `table`, so log_softmax of the logits is exactly the table's log-probabilities.
    Rows missing from `table` (e.g. after <eos>) say CHATTER with probability 1.
    """
    d_model = vocab
    model = Transformer(5, vocab, d_model, 1, 0, 4, 32, 0.0).double()
    log_table = torch.full((vocab, vocab), math.log(1e-6), dtype=torch.float64)  # [previous, next]
    for previous in range(vocab):
        row = table.get(previous, {CHATTER: 1.0})
        for word, probability in row.items():
            log_table[previous, word] = math.log(probability)
        log_table[previous] = torch.log_softmax(log_table[previous], dim=-1)
    with torch.no_grad():
        model.decoder.embedding.weight.copy_(torch.eye(vocab, dtype=torch.float64) / math.sqrt(d_model))
        model.decoder.positional_encoding.pe.zero_()
        model.decoder.pred_layer.weight.copy_(log_table.T)  # logits = log_table[previous]
        model.decoder.pred_layer.bias.zero_()
    return model.eval()


def _show_words(rows: torch.Tensor) -> str:
    return _show(rows, {**NAMES, **WORDS})


def _bigram(table: Mapping[int, Mapping[int, float]]) -> _Model:
    model = bigram_model(table)
    return _Model(model, (5, VOCAB, VOCAB, 1, 0, 4, 32, 0.0),
                  {name: value.detach().clone() for name, value in model.state_dict().items()})


def _bigram_case(beam_search: Callable, table: Mapping, beam_size: int, alpha: float, max_len: int, problem: str,
                 cause: str, batch: int = 2) -> None:
    model = _bigram(table)
    src = torch.full((batch, 3), 4, dtype=torch.long)  # the source is not read: any ids will do
    with torch.no_grad():
        expected = reference_beam_search(model.module, src, PAD, BOS, EOS, max_len, beam_size, alpha)
    _beam_case(beam_search, model, src, max_len, beam_size, alpha, expected, problem, cause, _show_words)


@check("on a bigram model whose best sentence greedy misses, beam_search with 2 beams finds it")
def beam_finds_what_greedy_misses(beam_search: Callable, beam_size: int = 2, max_len: int = 6) -> None:
    _bigram_case(beam_search, MISSED_TABLE, beam_size, 0.0, max_len,
                 problem="greedy decoding writes 'the dog' (probability 0.158); the most likely sentence is "
                         "'a cat' (0.288), which a beam of 2 keeps, but beam_search returned something else.",
                 cause="every step: log_softmax of decoder_step's logits, select_beams, continue ys and the cache "
                       "from the parents' rows, update finished and lengths from the parents.")


@check("a hypothesis that ends early waits in the beam, padded with <pad>, until every hypothesis has ended")
def beam_handles_eos_per_hypothesis(beam_search: Callable, beam_size: int = 2, max_len: int = 8) -> None:
    _bigram_case(beam_search, LENGTH_TABLE, beam_size, 0.0, max_len,
                 problem="one hypothesis ends after 2 tokens ('the <eos>', probability 0.330), another after 4 ('a "
                         "big white <eos>', 0.328); without a length penalty the short one wins, padded after its "
                         "<eos>, and the search stops when both have ended.",
                 cause="a finished hypothesis keeps its score and length and only gets <pad>; follow `finished` "
                       "from the parents; stop when finished.all().")


@check("with alpha = 1 the final choice is the best penalised score, each hypothesis counted at its own length")
def beam_final_choice_uses_length_penalty(beam_search: Callable, beam_size: int = 2, max_len: int = 8) -> None:
    _bigram_case(beam_search, PATIENT_TABLE, beam_size, 1.0, max_len,
                 problem="'the <eos>' (probability 0.48) ends first; with alpha=1 the longer 'a big white fast cat "
                         "<eos>' (0.362) wins: log 0.362 / lp(6) = -0.555 beats log 0.48 / lp(2) = -0.629.",
                 cause="keep the given last lines: the winner is the argmax of scores / length_penalty(lengths, "
                       "alpha), with `lengths` following the parents (a finished hypothesis stops growing).")


@check("on a padded batch, beam_search (3 beams, alpha 0.6) gives exactly the reference token ids")
def beam_matches_reference(beam_search: Callable, beam_size: int = 3, alpha: float = 0.6, **sizes: int) -> None:
    config = _lively(replace(Sizes(seed=1, eos_bias=0.5), **sizes), beam=(beam_size, alpha))  # sentences end
    model, src = _random_model(config), _random_source(config)  # after 1, 2 or no step: a cache reordered twice
    # changes the result
    with torch.no_grad():
        expected = reference_beam_search(model.module, src, PAD, BOS, EOS, config.max_len, beam_size, alpha)
    _beam_case(beam_search, model, src, config.max_len, beam_size, alpha, expected,
               problem=f"beam search with {beam_size} beams on a padded batch (random weights, seed {config.seed}) "
                       "differs from the reference.",
               cause="rows of sentence b are b * beam_size .. b * beam_size + beam_size - 1; after select_beams, "
                     "follow the parents in ys, the cache, finished and lengths.")


# --- predict, then run ------------------------------------------------------------------------------


def _penalised_first() -> str:
    hypotheses = {"A": (10, -5.0), "B": (4, -3.5)}  # name: (tokens, log-probability)
    ranks = {name: log_p / float(length_penalty(torch.tensor(float(n)), 1.0))
             for name, (n, log_p) in hypotheses.items()}
    return max(ranks, key=ranks.get)  # type: ignore[arg-type]


@check("your prediction: which hypothesis alpha = 1 puts first (10 tokens, -5.0 or 4 tokens, -3.5)")
def predicted_penalty_choice(predict: Any) -> None:
    expect_choice(predict, truth=_penalised_first, choices=("A", "B"),
                  what="which hypothesis the length-penalised ranking puts first with alpha = 1",
                  cause="compute lp(n) for each hypothesis's own length, divide each log-probability by it, and "
                        "remember that the ranking values are negative: which one is larger?")


def _cached_vectors() -> float:
    model = Transformer(20, 20, 16, 8, 3, 32, 40, 0.0).eval()  # 3 decoder layers of 8 heads
    src = torch.full((1, 9), 5, dtype=torch.long)  # one sentence of 9 tokens
    with torch.no_grad():
        src_mask = make_source_mask(src, PAD)
        cache = reference_start_cache(model, model.encoder(src, src_mask), src_mask)
        for _ in range(5):
            reference_decoder_step(model, cache, torch.full((1, 1), BOS, dtype=torch.long))
    return float(sum(t.shape[0] * t.shape[1] * t.shape[2] for t in (*cache.self_keys, *cache.self_values)))


@check("your prediction: the self-attention key and value vectors cached after 5 steps (3 layers, 8 heads)")
def predicted_cached_vectors(predict: Any) -> None:
    expect_number(predict, truths=_cached_vectors, what="the self-attention key and value vectors in the cache",
                  cause="what does one step add to the self-attention cache, per layer and per head? Does the "
                        "source length enter the self-attention part?")


def _flat_index_token() -> float:
    beam, vocab, flat_index = 4, 6000, 13_217
    log_probs = torch.full((1, beam * vocab), -20.0)  # one sentence, its beam * vocab candidates in one row
    log_probs[0, flat_index] = -0.1  # the best candidate sits at that flat index
    with torch.no_grad():
        _, _, tokens = reference_select_beams(torch.zeros(1, beam), log_probs.view(1, beam, vocab),
                                              torch.zeros(1, beam, dtype=torch.bool),
                                              torch.zeros(1, beam, dtype=torch.long), beam, 0.6, PAD)
    return float(tokens[0, 0])


@check("your prediction: the token that flat index 13,217 stands for (beam 4, vocabulary 6,000)")
def predicted_flat_index_token(predict: Any) -> None:
    expect_number(predict, truths=_flat_index_token,
                  what="the token that flat index 13,217 stands for (beam 4, vocabulary 6,000)",
                  cause="which entry (row, column) of a table with as many columns as the vocabulary sits at "
                        "that flat index? A row is a hypothesis, a column a token.")
