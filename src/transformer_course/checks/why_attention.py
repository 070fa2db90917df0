"""Stage 0 checks: additive attention, its score, the masked softmax over the source positions and the
context vector.

Expected values come from the reference `AdditiveAttention` in float64, computed here; the student's module
is built on the student's side (`_build`, an experiment) with the same weights. The checks of `forward` run
it with the course's `score` bound in place of the student's (declared with `supplied`), so a mistake in
`score` costs its points once, in the score cells.

A wrong value is explained from what the values and the two recorded computations say: the engine's
departure (`differential.explain`), the order of the steps each computation takes (`_steps_reading`: a step
replaced by another, two steps swapped), a step added after the expected value (`_extra_step`), and what the
weights show about the mask (padding that gets weight, real positions that get none, a mask with no effect).
"""

from __future__ import annotations

import math
from types import MethodType, SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks import declared, differential
from transformer_course.checks.boundary import on_student_side, supplied
from transformer_course.checks.framework import (
    RECIPE,
    check,
    copy_weights,
    crash_explained,
    describe,
    expect_shape,
    fail,
    randn,
    reject_builtin_modules,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.checks.predictions import expect_number, parameters_of
from transformer_course.reference.additive_attention import AdditiveAttention as ReferenceAdditiveAttention

# the parts of PyTorch this stage's grade cells meet, used once before any notebook code (runner.warm_up_torch):
# tests/test_grading_speed.py fails when a grade cell imports a module
WARM_UP: tuple[str, ...] = ()

__all__ = [
    "context_values",
    "forward_shapes",
    "masked_padding_gets_zero",
    "predicted_parameter_count",
    "predicted_weight_with_zero_v",
    "score_shape",
    "score_values",
    "sentences_are_independent",
    "summary",
    "weights_values",
]

AttentionClass = type[nn.Module]
FIX_SCORE_FIRST = " These checks use the course's score, so only forward is being tested here."


# --- the reference, the inputs ----------------------------------------------------------------------------


def _reference_module(query_size: int, key_size: int, attention_size: int, seed: int,
                      v_scale: float = 2.0) -> nn.Module:
    """The reference module in float64, weights from a private generator; v scaled so the softmax is not flat."""
    with torch.random.fork_rng(devices=[]):
        module = ReferenceAdditiveAttention(query_size, key_size, attention_size).double().eval()
    with torch.no_grad():
        for index, (name, parameter) in enumerate(sorted(module.named_parameters())):
            scale = v_scale if name.startswith("v.") else 1.0
            parameter.copy_(randn(*parameter.shape, seed=seed + index) * scale / math.sqrt(parameter.shape[-1]))
    return module


def _inputs(batch: int, q_len: int, k_len: int, query_size: int, key_size: int, seed: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query (batch, q_len, query_size), keys (batch, k_len, key_size), a padding mask (batch, k_len).

    Sentence 0 has no padding; the others end in 2, 3, 1, ... padded positions (at least one real key)."""
    query = randn(batch, q_len, query_size, seed=seed)
    keys = randn(batch, k_len, key_size, seed=seed + 1)
    padding = torch.tensor([0, 2, 3, 1] * batch)[:batch].clamp(max=k_len - 1)  # (batch,)
    mask = torch.arange(k_len) < (k_len - padding)[:, None]  # (batch, k_len), True = real token
    return query, keys, mask


def _context(batch: int, q_len: int, k_len: int, query_size: int, key_size: int, attention_size: int
             ) -> differential.Context:
    """Names of the axes (by size) and the quantities a wrong factor may equal."""
    sizes = {"batch": batch, "query": q_len, "key": k_len, "attention": attention_size}
    quantities = {"attention_size": attention_size, "key_size": key_size, "query_size": query_size, "k_len": k_len}
    if q_len > 1:
        quantities["q_len"] = q_len
    return differential.Context(sizes=sizes, quantities=quantities)


# --- on the student's side ----------------------------------------------------------------------------------


@on_student_side
def _build(AdditiveAttention: AttentionClass, sizes: tuple[int, int, int], state: dict[str, torch.Tensor],
           reference_score: bool) -> nn.Module:
    """The student's module in float64 and eval mode, holding the reference weights `state`; with
    `reference_score`, the course's score bound in place of the student's."""
    query_size, key_size, attention_size = sizes
    with torch.random.fork_rng(devices=[]), student_code():
        module = AdditiveAttention(query_size, key_size, attention_size)
    reject_builtin_modules(module, "AdditiveAttention")
    module = module.double()
    copy_weights(SimpleNamespace(state_dict=lambda: state), module, "AdditiveAttention")
    if reference_score:
        supplied(_score_stand_in)  # the check's doing, not the student's
        module.score = MethodType(_score_stand_in, module)
    return module.eval()


def _score_stand_in(self: nn.Module, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The reference score's values, v^T tanh(W_q s + W_k h), computed from the module's own weights with
    `F.linear` (tests/test_grading_build.py: equal to the reference's): the experiment plugs this in, so the
    reference solution of `score` need not be in stage 0's grading build. query (batch, q_len, query_size),
    keys (batch, k_len, key_size) -> (batch, q_len, k_len)."""
    queries = F.linear(query, self.W_q.weight, self.W_q.bias)  # (batch, q_len, attention_size)
    projected = F.linear(keys, self.W_k.weight, self.W_k.bias)  # (batch, k_len, attention_size)
    pairs = torch.tanh(queries[:, :, None, :] + projected[:, None, :, :])  # (batch, q_len, k_len, attention_size)
    return F.linear(pairs, self.v.weight, self.v.bias)[..., 0]


def _tensor(value: Any, name: str, cause: str) -> torch.Tensor:
    """The student's result when it is a tensor; a failure that says what it is otherwise."""
    if not isinstance(value, torch.Tensor):
        fail(f"{name} is not a tensor.", expected="a torch.Tensor", got=describe(value), cause=cause)
    return value.detach()


def _score_crash_cause(error: RuntimeError) -> str:
    if "cannot be multiplied" in str(error):
        return ("a projection gets the wrong input: W_q takes the query (query_size wide) and W_k the keys "
                "(key_size wide).")
    if "must match the size of tensor" not in str(error):
        return ("a shape mismatch on the line shown: compare the shapes that meet there with the contract, query "
                "(batch, q_len, query_size), keys (batch, k_len, key_size), scores (batch, q_len, k_len).")
    return ("every query must meet every key: give the projected query a key axis and the projected keys a query "
            "axis, W_q(query).unsqueeze(2) + W_k(keys).unsqueeze(1) -> (batch, q_len, k_len, attention_size).")


@on_student_side
def _scores(module: nn.Module, query: torch.Tensor, keys: torch.Tensor) -> Any:
    """The student's score(query, keys)."""
    with torch.no_grad(), student_code(), crash_explained(
        f"score crashed on query {tuple(query.shape)} and keys {tuple(keys.shape)}.",
        expected="scores of shape (batch, q_len, k_len)", cause=_score_crash_cause,
    ):
        scores = module.score(query, keys)
    return _tensor(scores, "scores", "score returns the tensor of scores, (batch, q_len, k_len): keep the given "
                                     "`return scores`.")


def _forward_crash_cause(module: nn.Module, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> str:
    try:  # does the same code run once the mask has its query axis?
        with torch.no_grad(), student_code():
            module(query, keys, mask.unsqueeze(1))
    except Exception:
        return ("a shape mismatch on the line shown, and it stays when the mask is given its query axis, so the "
                "mask alone does not explain it: compare the shapes that meet there with the contract, scores and "
                "weights (batch, q_len, k_len), keys (batch, k_len, key_size), context (batch, q_len, key_size).")
    return ("the mask (batch, k_len) has no query axis, so it cannot line up with the scores (batch, q_len, k_len): "
            "use mask.unsqueeze(1) -> (batch, 1, k_len) in masked_fill.")


@on_student_side
def _forward(module: nn.Module, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> tuple[Any, Any]:
    """The student's forward(query, keys, mask): (context, weights)."""
    with torch.no_grad(), student_code(), crash_explained(
        f"forward crashed on query {tuple(query.shape)}, keys {tuple(keys.shape)} and mask {tuple(mask.shape)}.",
        expected="context (batch, q_len, key_size) and weights (batch, q_len, k_len)",
        cause=lambda: _forward_crash_cause(module, query, keys, mask),
    ):
        result = module(query, keys, mask)
    if not (isinstance(result, tuple) and len(result) == 2):
        fail("forward returned the wrong thing.", expected="a pair (context, weights)", got=type(result).__name__,
             cause="keep the given `return context, weights` line.")
    return (_tensor(result[0], "context", "the context is weights @ keys, (batch, q_len, key_size)."),
            _tensor(result[1], "weights", "the weights are the softmax of the scores, (batch, q_len, k_len)."))


class _Case:
    """One check's sizes, the reference module, the inputs and the student's module (on the student's side)."""

    def __init__(self, AdditiveAttention: AttentionClass, batch: int, q_len: int, k_len: int, query_size: int,
                 key_size: int, attention_size: int, seed: int, reference_score: bool = True,
                 v_scale: float = 2.0) -> None:
        self.reference = _reference_module(query_size, key_size, attention_size, seed, v_scale)
        self.query, self.keys, self.mask = _inputs(batch, q_len, k_len, query_size, key_size, seed + 50)
        self.context = _context(batch, q_len, k_len, query_size, key_size, attention_size)
        self.module = _build(AdditiveAttention, (query_size, key_size, attention_size),
                             self.reference.state_dict(), reference_score)

    def forward(self) -> tuple[Any, Any]:
        return _forward(self.module, self.query, self.keys, self.mask)

    def trace_forward(self) -> tuple[differential.Trace, differential.Trace]:
        """(the student's forward, the reference's), recorded on the same inputs."""
        names = ("query", "keys", "mask")
        student = differential.traced(self.module, self.query, self.keys, self.mask, names=names)
        reference = differential.traced_call(self.reference, self.query, self.keys, self.mask, names=names)
        return student, reference


# --- readings of a wrong value (the generic ones are `checks.declared`'s) ---------------------------------


def _fill_value(weights: torch.Tensor, scores: torch.Tensor, padded: torch.Tensor) -> float | None:
    """The one score the padded positions were given before the softmax, read from the weights: in a row, a
    padded key's weight over a real key's is exp(fill - that real key's score). None when the rows disagree."""
    w, s = weights.detach().to(torch.float64), scores.detach().to(torch.float64)
    real_best = torch.where(padded, torch.zeros_like(w), w).argmax(dim=-1, keepdim=True)  # (batch, q_len, 1)
    w_best, s_best = w.gather(-1, real_best), s.gather(-1, real_best)  # the most-weighted real key of each row
    readable = padded & (w > 0) & (w_best > 0)
    if not readable.any():
        return None
    fills = (s_best + torch.log(w) - torch.log(w_best))[readable]
    if (fills.max() - fills.min()).item() > 1e-3 * max(1.0, fills.abs().max().item()):
        return None
    fill = fills.mean().item()
    return 0.0 if abs(fill) < 1e-6 else fill


def _weights_reading(weights: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor) -> str:
    """What the weights show about the mask: padding that gets weight, real positions that get none, or weights
    that are the softmax of the scores with nothing hidden."""
    padded = (~mask).unsqueeze(1).expand_as(weights)  # (batch, q_len, k_len)
    if not padded.any():
        return ""
    leaked = weights[padded].abs().max().item()
    starved = weights[~padded].abs().min().item()
    rows = mask.sum(dim=-1) < mask.size(-1)  # sentences with padding
    real_zero = bool((weights[rows][~padded[rows]] == 0).all())
    if real_zero and leaked > 0:
        return ("in the sentences with padding the real source positions get no weight and the padded ones do: the "
                "mask is inverted, the positions hidden are those where `mask` is True, and `mask` is True at the "
                "real tokens: hide the positions where mask == 0")
    if torch.allclose(weights, torch.softmax(scores, dim=-1), atol=1e-9):
        return ("your weights are the softmax of the scores with nothing hidden: the mask has no effect on them "
                "(masked_fill returns a new tensor, keep its result)")
    after = torch.softmax(scores, dim=-1) * (~padded)
    if leaked == 0 and weights.shape == after.shape and torch.allclose(weights, after, atol=1e-9):
        return ("the padded positions get 0, but each query's weights on the real positions are those of a softmax "
                "over every position, padding included, so they sum to less than 1: the mask is applied to the "
                "weights after the softmax; hide the padding in the scores, before the softmax")
    sums_to_one = torch.allclose(weights.sum(dim=-1), torch.ones(()).double(), atol=1e-6)
    if leaked > 1e-6 and starved > 0 and sums_to_one:
        return f"padded source positions get weight (up to {leaked:.3g}): they must get exactly 0"
    return ""


# --- the score ---------------------------------------------------------------------------------------


@check("score returns one score per (query, key) pair: (batch, q_len, k_len), also for a single query")
def score_shape(AdditiveAttention: AttentionClass, batch: int = 2, q_len: int = 3, k_len: int = 5,
                query_size: int = 4, key_size: int = 6, attention_size: int = 7) -> None:
    """With q_len queries and with one query (q_len = 1: translating one word at a time)."""
    case = _Case(AdditiveAttention, batch, q_len, k_len, query_size, key_size, attention_size, seed=10,
                 reference_score=False)
    for queries in (case.query, case.query[:, :1]):
        length = queries.size(1)
        known = {(batch, length, k_len, 1): "v maps each attention_size-wide vector to a single number and leaves an "
                                            "axis of size 1: remove it with .squeeze(-1)."}
        if length > 1:
            known[(batch, k_len, length)] = ("the scores are transposed, one row per key where each row must be a "
                                             "query's: in the sum of the projections the query positions must lie "
                                             "along axis 1 and the key positions along axis 2; "
                                             "W_q(query).unsqueeze(2) + W_k(keys).unsqueeze(1).")
        else:  # what .squeeze() without an axis leaves of (batch, 1, k_len, 1)
            known |= dict.fromkeys({(batch, k_len), (k_len,) if batch == 1 else (batch, k_len)},
                                   "squeezing without an axis also removes the q_len axis when there is one query "
                                   "(and the batch axis for one sentence): squeeze only the last axis, .squeeze(-1).")
        declared.shape("scores", _scores(case.module, queries, case.keys), (batch, length, k_len), known=known,
                       recipe="project the query with W_q and the keys with W_k, add them with broadcasting to "
                              "(batch, q_len, k_len, attention_size), apply tanh, then v and .squeeze(-1).")


@check("score computes v^T tanh(W_q s + W_k h) for every query s and key h")
def score_values(AdditiveAttention: AttentionClass, batch: int = 2, q_len: int = 3, k_len: int = 5,
                 query_size: int = 4, key_size: int = 6, attention_size: int = 7) -> None:
    case = _Case(AdditiveAttention, batch, q_len, k_len, query_size, key_size, attention_size, seed=20,
                 reference_score=False)
    names = ("query", "keys")
    reference = differential.traced_call(case.reference, case.query, case.keys, method="score", names=names)

    def softmax_applied(got: torch.Tensor) -> str:
        if not torch.allclose(got.sum(dim=-1), torch.ones(()).double(), atol=1e-6):
            return ""
        return ("every query's scores sum to 1 over the keys: your score already applies the softmax; score must "
                "return the raw scores e, and the mask and the softmax belong in forward")

    def tanh_misplaced(got: torch.Tensor) -> str:
        """tanh applied to each projection before they are added, or not at all (the score is then linear)."""
        module = case.reference
        with torch.no_grad():
            projected_query, projected_keys = module.W_q(case.query), module.W_k(case.keys)
            each_first = module.v(torch.tanh(projected_query).unsqueeze(2)
                                  + torch.tanh(projected_keys).unsqueeze(1)).squeeze(-1)
            linear = module.v(projected_query.unsqueeze(2) + projected_keys.unsqueeze(1)).squeeze(-1)
        if got.shape == each_first.shape and torch.allclose(got.double(), each_first.double(), atol=1e-6):
            return ("tanh is applied to each projection on its own, before they are added: the paper applies it to "
                    "their sum, which is what makes the score a small network of the pair. Apart, the query's part "
                    "is the same for every key, the softmax cancels it, and every query gets the same weights")
        if got.shape == linear.shape and torch.allclose(got.double(), linear.double(), atol=1e-6):
            return ("there is no tanh between the sum of the projections and v: the score is then a linear function, "
                    "the query's part plus the key's part; the query's part is the same for every key, the softmax "
                    "cancels it, and every query gets the same weights")
        return ""

    declared.values("scores", _scores(case.module, case.query, case.keys), reference.output.detach(),
                    traces=lambda: (differential.traced(case.module, case.query, case.keys, method="score",
                                                        names=names), reference),
                    context=case.context, axes=("batch", "query", "key"), own=[softmax_applied, tanh_misplaced],
                    recipe="scores = v(tanh(W_q(query).unsqueeze(2) + W_k(keys).unsqueeze(1))).squeeze(-1).")


# --- forward: weights and context ------------------------------------------------------------------------


@check("forward returns context (batch, q_len, key_size) and weights (batch, q_len, k_len)")
def forward_shapes(AdditiveAttention: AttentionClass, batch: int = 2, q_len: int = 3, k_len: int = 5,
                   query_size: int = 4, key_size: int = 6, attention_size: int = 7) -> None:
    case = _Case(AdditiveAttention, batch, q_len, k_len, query_size, key_size, attention_size, seed=30)
    context, weights = case.forward()
    expect_shape("weights", weights, (batch, q_len, k_len),
                 cause="the weights are the softmax of the scores: the same shape (batch, q_len, k_len).")
    if isinstance(context, torch.Tensor) and tuple(context.shape) == (batch, q_len, k_len):
        fail("context has the wrong shape.", expected=(batch, q_len, key_size), got=tuple(context.shape),
             cause="the context is summed over the wrong axis (the features): sum the weighted encoder states "
                   "`keys` over the source positions, or simply weights @ keys.")
    expect_shape("context", context, (batch, q_len, key_size),
                 cause="the context of each query is the weighted sum of the encoder states `keys` (the h_j, "
                       "unprojected): weights @ keys, "
                       "(batch, q_len, k_len) @ (batch, k_len, key_size).")


@check("forward's weights are the softmax of the scores over the source positions, padding hidden")
def weights_values(AdditiveAttention: AttentionClass, batch: int = 3, q_len: int = 4, k_len: int = 6,
                   query_size: int = 5, key_size: int = 3, attention_size: int = 8) -> None:
    case = _Case(AdditiveAttention, batch, q_len, k_len, query_size, key_size, attention_size, seed=40)
    _, weights = case.forward()
    with torch.no_grad():
        _, expected = case.reference(case.query, case.keys, case.mask)
        raw = case.reference.score(case.query, case.keys)  # (batch, q_len, k_len), nothing hidden
    declared.values("weights", weights, expected, traces=case.trace_forward, context=case.context,
                    axes=("batch", "query", "key"), own=[lambda got: _weights_reading(got, raw, case.mask)],
                    recipe="fill the scores at padded positions with -1e9 (mask.unsqueeze(1) == 0), then "
                           "torch.softmax(scores, dim=-1)." + FIX_SCORE_FIRST)


@check("padded source positions get exactly zero weight and every query's weights sum to 1")
def masked_padding_gets_zero(AdditiveAttention: AttentionClass, batch: int = 4, q_len: int = 3, k_len: int = 7,
                             query_size: int = 5, key_size: int = 4, attention_size: int = 6) -> None:
    case = _Case(AdditiveAttention, batch, q_len, k_len, query_size, key_size, attention_size, seed=50,
                 v_scale=40.0)  # large scores: weak fills leak
    _, weights = case.forward()
    weights = expect_shape("weights", weights, (batch, q_len, k_len),
                           cause="the weights have one row per query and one column per source position.")
    padded = (case.mask == 0).unsqueeze(1).expand_as(weights)  # (batch, q_len, k_len)
    leaked = weights[padded].abs()
    row_sums = weights.sum(dim=-1)  # (batch, q_len)
    rows_off = not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-6)
    leaks = bool(leaked.numel()) and leaked.max() != 0
    if leaks or rows_off:
        with torch.no_grad():
            raw = case.reference.score(case.query, case.keys)  # the scores forward received: the course's score
    if leaks:
        fill = _fill_value(weights, raw, padded)
        reading = _weights_reading(weights.to(raw.dtype), raw, case.mask)  # an inverted or an unapplied mask
        got = f"weights up to {leaked.max().item():.3g} on padding"
        if "inverted" in reading or "no effect" in reading:
            cause = reading + "."
        elif fill is None:
            cause = ("the padded scores are not pushed far enough down before the softmax, or not for every query: "
                     "fill them with a very negative number (-1e9 or float('-inf')), with the mask's query axis "
                     "added, mask.unsqueeze(1) == 0.")
        else:
            cause = _fill_cause(fill)
        if rows_off:  # what else the weights show
            got += f"; a query's weights do not sum to 1 either (off by up to {(row_sums - 1).abs().max().item():.3g})"
            column_sums = weights.sum(dim=1)  # (batch, k_len)
            if torch.allclose(column_sums, torch.ones_like(column_sums), atol=1e-6):
                cause = ("the softmax normalises each source position over the queries (every column of weights "
                         "sums to 1) instead of each query over the source positions: take it over the last axis, "
                         "dim=-1.")
        fail("padded source positions still get attention weight.", expected="exactly 0 wherever mask is False",
             got=got, cause=cause + FIX_SCORE_FIRST)
    if rows_off:
        fail("a query's weights do not sum to 1.", expected="every row of weights (over the source) sums to 1",
             got=f"row sums off by up to {(row_sums - 1).abs().max().item():.3g}",
             cause=(_weights_reading(weights.to(raw.dtype), raw, case.mask)
                    or "a query's weights are cut after the softmax, or normalised over another axis than its source "
                       "positions: hide the padding in the scores before the softmax, and take the softmax over the "
                       "source positions, dim=-1") + "." + FIX_SCORE_FIRST)


@check("forward's context is the weighted sum of the encoder states `keys`, with its own weights")
def context_values(AdditiveAttention: AttentionClass, batch: int = 3, q_len: int = 4, k_len: int = 6,
                   query_size: int = 5, key_size: int = 3, attention_size: int = 8) -> None:
    case = _Case(AdditiveAttention, batch, q_len, k_len, query_size, key_size, attention_size, seed=60)
    context, weights = case.forward()
    weights = expect_shape("weights", weights, (batch, q_len, k_len),
                           cause="the weights have one row per query and one column per source position.")
    expected = weights.to(case.keys.dtype) @ case.keys  # (batch, q_len, key_size): the student's own weights
    with torch.no_grad():
        _, reference_weights = case.reference(case.query, case.keys, case.mask)

    def same_context_everywhere(got: torch.Tensor) -> str:
        if q_len > 1 and torch.allclose(got, got[:, :1].expand_as(got), atol=1e-9):
            return "every query of a sentence gets the same context: the weights are not used"
        return ""

    def mixed_by_scores(got: torch.Tensor) -> str:
        """The keys multiplied by the scores forward received (as they are, or with the padding filled), where the
        weights belong."""
        with torch.no_grad():
            raw = case.reference.score(case.query, case.keys).to(case.keys.dtype)  # what forward's score gave
        hidden = case.mask.unsqueeze(1) == 0  # (batch, 1, k_len)
        for scores in (raw, raw.masked_fill(hidden, -1e9), raw.masked_fill(hidden, float("-inf")),
                       raw.masked_fill(hidden, 0.0)):
            mixed = scores @ case.keys  # (batch, q_len, key_size)
            if mixed.shape == got.shape and torch.allclose(got.to(mixed.dtype), mixed, atol=1e-6, rtol=1e-5,
                                                           equal_nan=True):
                return ("the context is the keys multiplied by the scores, where the weights the softmax makes of "
                        "them belong")
        return ""

    # the engine compares with the reference's computation: only when the student's weights are the reference's,
    # and not when the context ignores them or mixes the keys by the scores (both would read the unused weights
    # as the returned value, one step short, at the softmax's line)
    comparable = isinstance(context, torch.Tensor) and context.shape == expected.shape
    mixed = mixed_by_scores(context) if comparable else ""
    ignored = comparable and bool(same_context_everywhere(context)) or bool(mixed)
    declared.values("context", context, expected, traces=case.trace_forward, context=case.context,
                    axes=("batch", "query", "feature"), own=[lambda _context: mixed, same_context_everywhere],
                    engine=tensors_close(weights, reference_weights, 1e-7, 1e-6) and not ignored,
                    steps=not mixed,
                    recipe="context[b, i] = sum over j of weights[b, i, j] * keys[b, j]: weights @ keys.")


@check("each sentence's context and weights depend only on its own real source positions")
def sentences_are_independent(AdditiveAttention: AttentionClass, batch: int = 3, q_len: int = 2, k_len: int = 6,
                              query_size: int = 4, key_size: int = 5, attention_size: int = 6) -> None:
    case = _Case(AdditiveAttention, batch, q_len, k_len, query_size, key_size, attention_size, seed=70)
    context, weights = case.forward()
    expect_shape("context", context, (batch, q_len, key_size), cause="see the shape check above.")
    expect_shape("weights", weights, (batch, q_len, k_len), cause="see the shape check above.")
    query, keys, mask = case.query, case.keys, case.mask
    for sentence in range(batch):
        length = int(mask[sentence].sum())  # alone and without its padding
        own_context, own_weights = _forward(case.module, query[sentence:sentence + 1],
                                            keys[sentence:sentence + 1, :length], mask[sentence:sentence + 1, :length])
        own_weights = expect_shape("weights", own_weights, (1, q_len, length), cause="see the shape check above.")
        own_context = expect_shape("context", own_context, (1, q_len, key_size), cause="see the shape check above.")
        together = torch.cat([weights[sentence:sentence + 1, :, :length], context[sentence:sentence + 1]], dim=-1)
        if not tensors_close(together, torch.cat([own_weights, own_context], dim=-1), 1e-7, 1e-6):
            fail(f"sentence {sentence} gets a different result in the batch than alone, without its padding.",
                 expected="the same context and weights (on its real positions) either way",
                 got=f"a difference with {k_len - length} padded positions and {batch - 1} other sentences",
                 cause=_independence_reading(case, weights) + FIX_SCORE_FIRST)


def _fill_cause(fill: float) -> str:
    """Why padded scores set to `fill` (read from the weights, `_fill_value`) still get weight."""
    if fill == 0:
        return ("the padded scores are set to 0, which the softmax weighs like any other score: use a very negative "
                "number such as -1e9 (or float('-inf')).")
    return (f"the padded scores are set to {fill:.4g}, which is not negative enough: next to large scores its weight "
            "is tiny but not 0; use a very negative number such as -1e9 (or float('-inf')).")


def _independence_reading(case: _Case, weights: torch.Tensor) -> str:
    """What the batch's weights show when a sentence depends on its padding or on the other sentences: the
    mask's readings (inverted, without effect, applied after the softmax, a weak fill), a softmax over another
    axis; else what is expected, said as the recipe it is (nothing was recognised)."""
    weights = weights.to(torch.float64)
    with torch.no_grad():
        raw = case.reference.score(case.query, case.keys).to(torch.float64)  # what forward received
    reading = _weights_reading(weights, raw, case.mask)
    if reading and not reading.endswith("they must get exactly 0"):  # inverted, without effect, after the softmax
        return reading + "."
    for axis, effect in ((0, "over the sentences of the batch, so every sentence's weights depend on the "
                             "other sentences"),
                         (1, "each source position over the queries, so the padded positions get weight "
                             "(every column of weights sums to 1)")):
        sums = weights.sum(dim=axis)
        if torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
            return (f"the softmax normalises {effect}: each query's weights run over its own source positions, the "
                    "last axis.")
    padded = (case.mask == 0).unsqueeze(1).expand_as(weights)
    fill = _fill_value(weights, raw, padded)
    if fill is not None and padded.any() and bool(weights[padded].any()):
        return _fill_cause(fill)
    return (f"{RECIPE} the softmax runs over each query's own source positions (dim=-1), and the padding is hidden "
            "in the scores before it, with the mask's query axis, mask.unsqueeze(1) == 0.")


# --- predict, then run ------------------------------------------------------------------------------


@check("your prediction: the trainable parameters of AdditiveAttention(6, 8, 10)")
def predicted_parameter_count(predict: Any) -> None:
    expect_number(predict, truths=lambda: parameters_of(lambda: ReferenceAdditiveAttention(6, 8, 10)),
                  what="the trainable parameters of AdditiveAttention(query_size=6, key_size=8, attention_size=10)",
                  cause="read the given constructor: which layers it builds, with which in_features and "
                        "out_features, and whether they have a bias; v is a Linear too.")


def _weight_with_zero_v() -> float:
    module = ReferenceAdditiveAttention(6, 8, 10).double()
    mask = torch.tensor([[True] * 5 + [False] * 3])  # (1, k_len = 8)
    with torch.no_grad():
        module.v.weight.zero_()
        _, weights = module(randn(1, 1, 6, seed=90), randn(1, 8, 8, seed=91), mask)
    return float(weights[0, 0, 0])


@check("your prediction: the first real token's weight when v is zero (5 real tokens, 3 padding)")
def predicted_weight_with_zero_v(predict: Any) -> None:
    expect_number(predict, truths=_weight_with_zero_v, absolute=0.005,
                  what="the weight of the first real token when v = 0",
                  cause="with v = 0, what is every score before the mask? What does the softmax make of equal "
                        "scores, and which positions take part once the padding is hidden?")
