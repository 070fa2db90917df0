"""Stage 0 checks: additive attention, its score, the masked softmax over the source positions and the
context vector.

Expected values come from the reference `AdditiveAttention` in float64 with the student's module holding
the same weights. The checks of `forward` run it with the reference `score` bound in place of the
student's, so a mistake in `score` costs its points once, in the score cells. Known wrong variants
(`_variant(..., mistake=...)`) are replayed on the same inputs to name the mistake.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MethodType
from typing import Any

import torch
from torch import nn

from transformer_course.checks.framework import (
    check,
    copy_weights,
    crash_explained,
    expect_close,
    expect_shape,
    fail,
    randn,
    reject_builtin_modules,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.reference.additive_attention import AdditiveAttention as ReferenceAdditiveAttention

__all__ = [
    "context_values",
    "forward_shapes",
    "masked_padding_gets_zero",
    "score_shape",
    "score_values",
    "sentences_are_independent",
    "summary",
    "weights_values",
]

AttentionClass = type[nn.Module]
FIX_SCORE_FIRST = " (These checks use the course's score, so only forward is being tested here.)"


# --- inputs, modules and known mistakes ------------------------------------------------------------


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


def _student_module(AdditiveAttention: AttentionClass, reference: nn.Module, query_size: int, key_size: int,
                    attention_size: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]), student_code():
        module = AdditiveAttention(query_size, key_size, attention_size)
    reject_builtin_modules(module, "AdditiveAttention")
    module = module.double()
    copy_weights(reference, module, "AdditiveAttention")
    return module.eval()


def _inputs(batch: int, q_len: int, k_len: int, query_size: int, key_size: int, seed: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query (batch, q_len, query_size), keys (batch, k_len, key_size), a padding mask (batch, k_len).

    Sentence 0 has no padding; the others end in 2, 3, 1, ... padded positions (at least one real key)."""
    query = randn(batch, q_len, query_size, seed=seed)
    keys = randn(batch, k_len, key_size, seed=seed + 1)
    padding = torch.tensor([0, 2, 3, 1] * batch)[:batch].clamp(max=k_len - 1)  # (batch,)
    mask = torch.arange(k_len) < (k_len - padding)[:, None]  # (batch, k_len), True = real token
    return query, keys, mask


def _score_variant(module: nn.Module, query: torch.Tensor, keys: torch.Tensor, mistake: str = "") -> torch.Tensor:
    """The score of the reference, or a known wrong way of computing it: (batch, q_len, k_len)."""
    projected_query = module.W_q(query).unsqueeze(2)  # (batch, q_len, 1, attention_size)
    projected_keys = module.W_k(keys).unsqueeze(1)  # (batch, 1, k_len, attention_size)
    if mistake == "no tanh":
        return module.v(projected_query + projected_keys).squeeze(-1)
    if mistake == "tanh each":
        return module.v(torch.tanh(projected_query) + torch.tanh(projected_keys)).squeeze(-1)
    hidden = torch.tanh(projected_query + projected_keys)  # (batch, q_len, k_len, attention_size)
    if mistake == "sum instead of v":
        return hidden.sum(-1)
    if mistake == "mean instead of v":
        return hidden.mean(-1)
    scores = module.v(hidden).squeeze(-1)
    return torch.softmax(scores, dim=-1) if mistake == "softmax in score" else scores


def _variant(module: nn.Module, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor, *,
             softmax_dim: int = -1, mask_mode: str = "before", fill: float = -1e9,
             context_mode: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """forward of the reference with one known mistake switched on: (context, weights)."""
    scores = _score_variant(module, query, keys)  # (batch, q_len, k_len)
    hidden = (mask == 0).unsqueeze(1)  # (batch, 1, k_len)
    if mask_mode == "before":
        scores = scores.masked_fill(hidden, fill)
    elif mask_mode == "inverted":
        scores = scores.masked_fill(~hidden, fill)
    elif mask_mode == "no query axis":  # mask (batch, k_len) broadcast as (1, batch, k_len): needs batch == q_len
        scores = scores.masked_fill((mask == 0).unsqueeze(0), fill)
    weights = scores if mask_mode == "no softmax" else torch.softmax(scores, dim=softmax_dim)
    if mask_mode == "after":
        weights = weights.masked_fill(hidden, 0.0)
    if context_mode == "scores":  # the (masked) scores instead of the weights
        return scores @ keys, weights
    if context_mode == "mean of keys":
        return keys.mean(dim=1, keepdim=True).expand(-1, query.size(1), -1), weights
    if context_mode == "divided by k_len":
        return weights @ keys / keys.size(1), weights
    return weights @ keys, weights


WEIGHT_MISTAKES: dict[str, dict[str, Any]] = {
    "the softmax runs over dim=1 (the queries): each query's weights over the source positions must sum to 1, "
    "so use dim=-1 (the last axis, k_len).": {"softmax_dim": 1},
    "the softmax runs over dim=0 (the sentences of the batch): normalise each query's scores over the source "
    "positions, dim=-1.": {"softmax_dim": 0},
    "the mask is inverted: True means a real token, so hide the positions where mask == 0 (or ~mask), "
    "not where mask is True.": {"mask_mode": "inverted"},
    "the mask is ignored: fill the padded scores, scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9), "
    "and keep the result (masked_fill returns a new tensor).": {"mask_mode": "none"},
    "the mask is applied after the softmax: zeroing weights after normalising leaves rows that do not sum "
    "to 1; fill the scores with -1e9 before the softmax.": {"mask_mode": "after"},
    "padded scores are set to 0: exp(0) = 1 still gives padding weight; use a very negative number such "
    "as -1e9 (or float('-inf')).": {"fill": 0.0},
    "the weights are the raw scores: apply the softmax over the source positions, "
    "torch.softmax(scores, dim=-1).": {"mask_mode": "no softmax"},
    "the mask has no query axis, so sentence b's mask is applied to query b of every sentence: "
    "(batch, k_len) lines up with the last two axes of the scores (batch, q_len, k_len); add the query "
    "axis first, mask.unsqueeze(1) -> (batch, 1, k_len).": {"mask_mode": "no query axis"},
}


def _suspects(module: nn.Module, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor,
              part: int, mistakes: dict[str, dict[str, Any]]) -> dict[str, Callable[[], torch.Tensor]]:
    def make(settings: dict[str, Any]) -> Callable[[], torch.Tensor]:
        return lambda: _variant(module, query, keys, mask, **settings)[part]

    applicable = {cause: settings for cause, settings in mistakes.items()
                  if settings.get("mask_mode") != "no query axis" or query.size(0) == query.size(1)}
    return {cause: make(settings) for cause, settings in applicable.items()}


def _score_crash_cause(error: RuntimeError) -> str:
    text = str(error)
    if "cannot be multiplied" in text:
        return ("a projection gets the wrong input: W_q takes the query (query_size wide) and W_k the keys "
                "(key_size wide).")
    return ("every query must meet every key: give the projected query a key axis and the projected keys a query "
            "axis, W_q(query).unsqueeze(2) + W_k(keys).unsqueeze(1) -> (batch, q_len, k_len, attention_size).")


def _student_score(module: nn.Module, query: torch.Tensor, keys: torch.Tensor) -> Any:
    crashes: list[RuntimeError] = []  # the error, kept for the cause
    with torch.no_grad(), student_code(), crash_explained(
        f"score crashed on query {tuple(query.shape)} and keys {tuple(keys.shape)}.",
        expected="scores of shape (batch, q_len, k_len)", cause=lambda: _score_crash_cause(crashes[0]),
        when=lambda error: crashes.append(error) is None,
    ):
        return module.score(query, keys)


def _with_reference_score(module: nn.Module) -> nn.Module:
    """Bind the reference score to the student's module (same weights), so forward is tested on its own."""
    module.score = MethodType(ReferenceAdditiveAttention.score, module)
    return module


def _forward_crash_cause(module: nn.Module, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> str:
    try:  # does the same code run once the mask has its query axis?
        with torch.no_grad(), student_code():
            module(query, keys, mask.unsqueeze(1))
    except Exception:
        return ("a tensor of the wrong shape meets the scores (batch, q_len, k_len): the mask needs a query axis, "
                "mask.unsqueeze(1); the context is weights @ keys, (batch, q_len, k_len) @ (batch, k_len, "
                "key_size).")
    return ("the mask (batch, k_len) has no query axis, so it cannot line up with the scores (batch, q_len, k_len): "
            "use mask.unsqueeze(1) -> (batch, 1, k_len) in masked_fill.")


def _student_forward(module: nn.Module, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad(), student_code(), crash_explained(
        f"forward crashed on query {tuple(query.shape)}, keys {tuple(keys.shape)} and mask {tuple(mask.shape)}.",
        expected="context (batch, q_len, key_size) and weights (batch, q_len, k_len)",
        cause=lambda: _forward_crash_cause(module, query, keys, mask),
    ):
        result = module(query, keys, mask)
    if not (isinstance(result, tuple) and len(result) == 2):
        fail("forward returned the wrong thing.", expected="a pair (context, weights)", got=type(result).__name__,
             cause="keep the given `return context, weights` line.")
    return result


def _setup(AdditiveAttention: AttentionClass, batch: int, q_len: int, k_len: int, query_size: int, key_size: int,
           attention_size: int, seed: int, reference_score: bool = True, v_scale: float = 2.0
           ) -> tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    reference = _reference_module(query_size, key_size, attention_size, seed, v_scale)
    module = _student_module(AdditiveAttention, reference, query_size, key_size, attention_size)
    if reference_score:
        _with_reference_score(module)
    return (module, reference, *_inputs(batch, q_len, k_len, query_size, key_size, seed + 50))


# --- the score ---------------------------------------------------------------------------------------


@check("score returns one score per (query, key) pair: (batch, q_len, k_len), also for a single query")
def score_shape(AdditiveAttention: AttentionClass, batch: int = 2, q_len: int = 3, k_len: int = 5,
                query_size: int = 4, key_size: int = 6, attention_size: int = 7) -> None:
    """With q_len queries and with one query (q_len = 1: translating one word at a time)."""
    module, _, query, keys, _ = _setup(AdditiveAttention, batch, q_len, k_len, query_size, key_size,
                                       attention_size, seed=10, reference_score=False)
    for queries in (query, query[:, :1]):
        length = queries.size(1)
        scores = _student_score(module, queries, keys)
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else None
        if got == (batch, length, k_len, 1):
            fail("scores have the wrong shape.", expected=(batch, length, k_len), got=got,
                 cause="v maps each attention_size-wide vector to a single number and leaves an axis of size 1: "
                       "remove it with .squeeze(-1).")
        if got is not None and got != (batch, length, k_len) and length == 1 and scores.numel() == batch * k_len:
            fail("scores have the wrong shape for a single query (q_len = 1).", expected=(batch, 1, k_len), got=got,
                 cause="`.squeeze()` without an axis also removes the q_len axis when there is one query (and the "
                       "batch axis for one sentence): squeeze only the last axis, .squeeze(-1).")
        if got == (batch, k_len, length) and length > 1:
            fail("scores have the wrong shape.", expected=(batch, length, k_len), got=got,
                 cause="the scores are transposed: one row per query, so the query gets the new axis at position "
                       "2 and the keys at position 1, W_q(query).unsqueeze(2) + W_k(keys).unsqueeze(1).")
        expect_shape("scores", scores, (batch, length, k_len),
                     cause="project the query with W_q and the keys with W_k, add them with broadcasting to "
                           "(batch, q_len, k_len, attention_size), apply tanh, then v and .squeeze(-1).")


@check("score computes v^T tanh(W_q s + W_k h) for every query s and key h")
def score_values(AdditiveAttention: AttentionClass, batch: int = 2, q_len: int = 3, k_len: int = 5,
                 query_size: int = 4, key_size: int = 6, attention_size: int = 7) -> None:
    module, reference, query, keys, _ = _setup(AdditiveAttention, batch, q_len, k_len, query_size, key_size,
                                               attention_size, seed=20, reference_score=False)
    scores = _student_score(module, query, keys)
    with torch.no_grad():
        expected = reference.score(query, keys)

        def variant(mistake: str) -> Callable[[], torch.Tensor]:
            return lambda: _score_variant(reference, query, keys, mistake)

        expect_close("scores", scores, expected, atol=1e-7, cause=(
            "scores = v(tanh(W_q(query).unsqueeze(2) + W_k(keys).unsqueeze(1))).squeeze(-1)."), suspects={
            "tanh is missing: the projected query and key are added, then squashed by torch.tanh, then scored "
            "by v.": variant("no tanh"),
            "tanh is applied to each projection separately: add first, tanh(W_q s + W_k h), then v.":
                variant("tanh each"),
            "v is skipped (the hidden features are summed): score each tanh(...) vector with the layer self.v, "
            "then .squeeze(-1).": variant("sum instead of v"),
            "v is skipped (the hidden features are averaged): score each tanh(...) vector with the layer "
            "self.v, then .squeeze(-1).": variant("mean instead of v"),
            "score already applies the softmax: it returns the raw scores e; the mask and the softmax belong "
            "in forward.": variant("softmax in score"),
        })


# --- forward: weights and context ------------------------------------------------------------------------


@check("forward returns context (batch, q_len, key_size) and weights (batch, q_len, k_len)")
def forward_shapes(AdditiveAttention: AttentionClass, batch: int = 2, q_len: int = 3, k_len: int = 5,
                   query_size: int = 4, key_size: int = 6, attention_size: int = 7) -> None:
    module, _, query, keys, mask = _setup(AdditiveAttention, batch, q_len, k_len, query_size, key_size,
                                          attention_size, seed=30)
    context, weights = _student_forward(module, query, keys, mask)
    expect_shape("weights", weights, (batch, q_len, k_len),
                 cause="the weights are the softmax of the scores: the same shape (batch, q_len, k_len).")
    if isinstance(context, torch.Tensor) and tuple(context.shape) == (batch, q_len, k_len):
        fail("context has the wrong shape.", expected=(batch, q_len, key_size), got=tuple(context.shape),
             cause="the context is summed over the wrong axis (the features): sum the weighted keys over the "
                   "source positions, or simply weights @ keys.")
    expect_shape("context", context, (batch, q_len, key_size),
                 cause="the context of each query is the weighted sum of the keys: weights @ keys, "
                       "(batch, q_len, k_len) @ (batch, k_len, key_size).")


@check("forward's weights are the softmax of the scores over the source positions, padding hidden")
def weights_values(AdditiveAttention: AttentionClass, batch: int = 3, q_len: int = 4, k_len: int = 6,
                   query_size: int = 5, key_size: int = 3, attention_size: int = 8) -> None:
    module, reference, query, keys, mask = _setup(AdditiveAttention, batch, q_len, k_len, query_size, key_size,
                                                  attention_size, seed=40)
    _, weights = _student_forward(module, query, keys, mask)
    with torch.no_grad():
        _, expected = reference(query, keys, mask)
        expect_close("weights", weights, expected, atol=1e-7,
                     suspects=_suspects(reference, query, keys, mask, 1, WEIGHT_MISTAKES),
                     cause="fill the scores at padded positions with -1e9 (mask.unsqueeze(1) == 0), then "
                           "torch.softmax(scores, dim=-1)." + FIX_SCORE_FIRST)


@check("padded source positions get exactly zero weight and every query's weights sum to 1")
def masked_padding_gets_zero(AdditiveAttention: AttentionClass, batch: int = 4, q_len: int = 3, k_len: int = 7,
                             query_size: int = 5, key_size: int = 4, attention_size: int = 6) -> None:
    module, _, query, keys, mask = _setup(AdditiveAttention, batch, q_len, k_len, query_size, key_size,
                                          attention_size, seed=50, v_scale=40.0)  # large scores: weak fills leak
    _, weights = _student_forward(module, query, keys, mask)
    weights = expect_shape("weights", weights, (batch, q_len, k_len),
                           cause="the weights have one row per query and one column per source position.")
    padded = (mask == 0).unsqueeze(1).expand_as(weights)  # (batch, q_len, k_len)
    leaked = weights[padded].abs()
    if leaked.numel() and leaked.max() != 0:
        fail("padded source positions still get attention weight.", expected="exactly 0 wherever mask is False",
             got=f"weights up to {leaked.max().item():.3g} on padding",
             cause="fill the padded scores with a very negative number (-1e9 or float('-inf')) before the "
                   "softmax, with the mask's query axis added: mask.unsqueeze(1) == 0." + FIX_SCORE_FIRST)
    row_sums = weights.sum(dim=-1)  # (batch, q_len)
    if not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-6):
        fail("a query's weights do not sum to 1.", expected="every row of weights (over the source) sums to 1",
             got=f"row sums off by up to {(row_sums - 1).abs().max().item():.3g}",
             cause="apply the mask to the scores before the softmax, not to the weights after it, and take the "
                   "softmax over the source positions, dim=-1." + FIX_SCORE_FIRST)


@check("forward's context is the weighted sum of the keys, with its own weights")
def context_values(AdditiveAttention: AttentionClass, batch: int = 3, q_len: int = 4, k_len: int = 6,
                   query_size: int = 5, key_size: int = 3, attention_size: int = 8) -> None:
    module, reference, query, keys, mask = _setup(AdditiveAttention, batch, q_len, k_len, query_size, key_size,
                                                  attention_size, seed=60)
    context, weights = _student_forward(module, query, keys, mask)
    weights = expect_shape("weights", weights, (batch, q_len, k_len),
                           cause="the weights have one row per query and one column per source position.")
    with torch.no_grad():
        expected = weights.to(keys.dtype) @ keys  # (batch, q_len, key_size): the student's own weights
        suspects = {
            "the context uses the scores instead of the weights: multiply the keys by the softmax weights, "
            "context = weights @ keys.": lambda: _variant(reference, query, keys, mask, context_mode="scores")[0],
            "the weights are ignored (the keys are averaged): each query's context is its own weighted sum, "
            "weights @ keys.": lambda: _variant(reference, query, keys, mask, context_mode="mean of keys")[0],
            "the context is divided by the number of source positions: the weights already sum to 1, so the "
            "weighted sum needs no further division.": lambda: expected / k_len,
        }
        expect_close("context", context, expected, atol=1e-7, suspects=suspects,
                     cause="context[b, i] = sum over j of weights[b, i, j] * keys[b, j]: weights @ keys.")


@check("each sentence's context and weights depend only on its own real source positions")
def sentences_are_independent(AdditiveAttention: AttentionClass, batch: int = 3, q_len: int = 2, k_len: int = 6,
                              query_size: int = 4, key_size: int = 5, attention_size: int = 6) -> None:
    module, _, query, keys, mask = _setup(AdditiveAttention, batch, q_len, k_len, query_size, key_size,
                                          attention_size, seed=70)
    context, weights = _student_forward(module, query, keys, mask)
    expect_shape("context", context, (batch, q_len, key_size), cause="see the shape check above.")
    expect_shape("weights", weights, (batch, q_len, k_len), cause="see the shape check above.")
    for sentence in range(batch):
        length = int(mask[sentence].sum())  # alone and without its padding
        own_context, own_weights = _student_forward(
            module, query[sentence:sentence + 1], keys[sentence:sentence + 1, :length],
            mask[sentence:sentence + 1, :length])
        together = torch.cat([weights[sentence:sentence + 1, :, :length], context[sentence:sentence + 1]], dim=-1)
        if not tensors_close(together, torch.cat([own_weights, own_context], dim=-1), 1e-7, 1e-6):
            fail(f"sentence {sentence} gets a different result in the batch than alone, without its padding.",
                 expected="the same context and weights (on its real positions) either way",
                 got=f"a difference with {k_len - length} padded positions and {batch - 1} other sentences",
                 cause="the softmax must run over each query's own source positions (dim=-1), never over the "
                       "batch (dim=0), and padding must be hidden with the mask's query axis, "
                       "mask.unsqueeze(1) == 0." + FIX_SCORE_FIRST)
