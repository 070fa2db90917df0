"""Stage 2 checks: scaled dot-product attention, the two masks and multi-head attention.

Expected values always come from the reference implementation (float64, same inputs, same
weights); PyTorch's built-ins (`F.scaled_dot_product_attention`, `nn.MultiheadAttention`) are
used as a second yardstick and run outside `student_code()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks.compare import close_elements, describe_difference, index_ranges
from transformer_course.checks.errors import first_line, student_frame
from transformer_course.checks.framework import (
    Diagnosis,
    check,
    copy_weights,
    expect_close,
    expect_shape,
    fail,
    generator,
    randn,
    reject_builtin_modules,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.reference import MultiHeadAttention as ReferenceMultiHeadAttention
from transformer_course.reference import make_look_ahead_mask as reference_look_ahead_mask
from transformer_course.reference import make_padding_mask as reference_padding_mask
from transformer_course.reference import scaled_dot_product_attention as reference_attention

__all__ = [
    "combine_heads_inverts_split",
    "combine_heads_values",
    "look_ahead_mask_shape",
    "look_ahead_mask_values",
    "mha_attention_weights",
    "mha_cross_attention",
    "mha_matches_pytorch",
    "mha_matches_pytorch_causal",
    "mha_output_shape",
    "mha_values",
    "padding_mask_shape",
    "padding_mask_values",
    "sdpa_integer_mask",
    "sdpa_masked_keys_get_zero",
    "sdpa_masked_values",
    "sdpa_matches_pytorch",
    "sdpa_shapes",
    "sdpa_values",
    "split_heads_shape",
    "split_heads_values",
    "summary",
]

AttentionFunction = Callable[..., Any]
FIX_ATTENTION_FIRST = (
    " If a scaled_dot_product_attention check above fails, fix that first: forward uses your function."
)


# --- helpers --------------------------------------------------------------------------------------


@contextmanager
def _explain_runtime_errors() -> Iterator[None]:
    """A bool-only operation on a mask that may arrive as integers 0/1 gets its own message; every
    other error is explained by its kind (framework.run_check)."""
    try:
        yield
    except RuntimeError as error:
        text = str(error)
        if "only supports boolean masks" in text or "condition to be a boolean tensor" in text:
            where = student_frame(error)
            fail(
                "your code needs a bool mask, but masks may also arrive as integers 0/1.",
                expected="the same result for a bool mask and for the integer mask mask.long()",
                got=first_line(error, 120) + (f"\n  {where}" if where else ""),
                cause="compare with zero (`mask == 0`) or convert first (`~mask.bool()`); "
                      "`~mask` on an integer tensor flips bits (1 -> -2), it does not negate.",
            )
        raise


def _as_pair(result: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(result, tuple) and len(result) == 2):
        fail("scaled_dot_product_attention returned the wrong thing.", expected="a pair (output, weights)",
             got=f"{type(result).__name__}", cause="keep the given `return output, weights` line.")
    return result


def _student_attention(function: AttentionFunction, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                       mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad(), student_code(), _explain_runtime_errors():
        return _as_pair(function(Q, K, V, mask))


def _qkv(batch: int, heads: int, q_len: int, k_len: int, d_k: int, d_v: int, seed: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q, K, V in float64 with enough spread that the softmax is neither flat nor one-hot."""
    leading = (batch, heads) if heads else (batch,)
    Q = randn(*leading, q_len, d_k, seed=seed) * 1.5
    K = randn(*leading, k_len, d_k, seed=seed + 1) * 1.5
    V = randn(*leading, k_len, d_v, seed=seed + 2)
    return Q, K, V


def _random_mask(batch: int, q_len: int, k_len: int, seed: int, heads_axis: bool = True) -> torch.Tensor:
    """Bool mask (batch, 1, q_len, k_len), about 40% hidden, every row with at least one visible key."""
    mask = torch.rand(batch, q_len, k_len, generator=generator(seed)) > 0.4
    rows = torch.arange(q_len)
    mask[:, rows, rows % k_len] = True  # no query is left with nothing to look at
    mask[0, 0] = True  # one fully visible row, so an inverted mask would hide a whole row
    return mask.unsqueeze(1) if heads_axis else mask


def _attention_variant(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None, *,
                       scale: float | None = None, softmax_dim: int = -1, mask_mode: str = "before",
                       fill: float = -1e9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention with one known mistake switched on; returns (output, weights, scores)."""
    scale = math.sqrt(Q.size(-1)) if scale is None else scale
    scores = Q @ K.transpose(-2, -1) / scale  # (..., q_len, k_len)
    if mask is not None and mask_mode == "before":
        scores = scores.masked_fill(mask == 0, fill)
    if mask is not None and mask_mode == "inverted":
        scores = scores.masked_fill(mask != 0, fill)
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None and mask_mode == "after":
        weights = weights.masked_fill(mask == 0, 0.0)
    return weights @ V, weights, scores


def _sdpa_suspects(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None,
                   part: int) -> dict[str, Callable[[], torch.Tensor]]:
    """Known mistakes for the output (part 0) or the weights (part 1)."""
    d_k, q_len = Q.size(-1), Q.size(-2)

    def variant(**kwargs: Any) -> Callable[[], torch.Tensor]:
        return lambda: _attention_variant(Q, K, V, mask, **kwargs)[part]

    suspects = {
        "the scores are not scaled: divide Q K^T by sqrt(d_k) before the softmax.": variant(scale=1.0),
        "the scores are divided by d_k: the paper divides by the square root, math.sqrt(d_k).": (
            variant(scale=d_k)
        ),
        "the scores are divided by the square root of the wrong size (the query length): d_k is the last "
        "axis of Q, Q.size(-1).": variant(scale=math.sqrt(q_len)),
        "the softmax runs over dim=-2 (the queries): each query's weights over the keys must sum to 1, "
        "so use dim=-1.": variant(softmax_dim=-2),
    }
    if Q.dim() == 4:
        suspects["the softmax runs over the wrong axis, dim=1 (the heads): count from the end and normalise "
                 "over the keys, dim=-1."] = variant(softmax_dim=1)
    if mask is not None:
        suspects |= {
            "the mask is applied after the softmax: zeroing weights after normalising leaves rows that "
            "do not sum to 1; fill the scores with -1e9 before the softmax.": variant(mask_mode="after"),
            "the mask is inverted: True (1) means 'may attend', so hide the positions where mask == 0.": (
                variant(mask_mode="inverted")
            ),
            "hidden scores are set to 0: exp(0) = 1 still gives those keys weight; use a very negative "
            "number such as -1e9 (or float('-inf')).": variant(fill=0.0),
            "the mask is ignored: apply it with scores = scores.masked_fill(mask == 0, -1e9) (masked_fill "
            "returns a new tensor, so assign the result).": (
                variant(mask_mode="none")
            ),
        }
    if part == 1:
        suspects["`weights` holds the scaled scores, not their softmax: return softmax(scores, dim=-1)."] = (
            lambda: _attention_variant(Q, K, V, mask)[2]
        )
    return suspects


# --- where attention departs from the reference -------------------------------------------------------
#
# The weights and the output are checked against the reference step by step: the scores before the
# softmax (recovered from the weights: log(weights) is the scores up to one constant per row), the
# weights (do the rows sum to 1, or another axis? do hidden keys get exactly 0?), each head, then
# the output. The first place that departs is named, with how it departs and the likely cause.

AXES = ("batch", "head", "query", "key")


def _close(a: Any, b: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    return isinstance(a, torch.Tensor) and tensors_close(a, b, atol, rtol)


def _axes_for(tensor: torch.Tensor) -> tuple[str, ...]:
    return AXES if tensor.dim() == 4 else ("batch", "query", "key")[-tensor.dim():]


def _heads_text(got: torch.Tensor, expected: torch.Tensor) -> str:
    """' in heads 1, 3 (of 4)' when only some heads differ (4-D tensors), else ''."""
    if got.dim() != 4 or got.shape != expected.shape or got.size(1) < 2:
        return ""
    wrong = ~close_elements(got, expected, 1e-6, 1e-5)
    heads = wrong.any(dim=(0, 2, 3)).nonzero().flatten().tolist()
    return f" in head{'s' if len(heads) > 1 else ''} {index_ranges(heads)} (of {got.size(1)})" \
        if 0 < len(heads) < got.size(1) else ""


def _scale_cause(factor: float, d_k: int, q_len: int, k_len: int) -> str:
    """Name the divisor that turns the expected scores into factor × them."""
    divisor = math.sqrt(d_k) / factor  # the student divides Q K^T by this
    for value, cause in ((1.0, "the scores are not scaled: divide Q K^T by sqrt(d_k) before the softmax."),
                         (d_k, "the scores are divided by d_k: the paper divides by the square root, math.sqrt(d_k)."),
                         (math.sqrt(q_len), "the scores are divided by the square root of the wrong size (the query "
                                            "length): d_k is the last axis of Q, Q.size(-1)."),
                         (math.sqrt(k_len), "the scores are divided by the square root of the key length: d_k is "
                                            "the last axis of Q, Q.size(-1)."),
                         (1 / math.sqrt(d_k), "the scores are multiplied by sqrt(d_k): divide by it.")):
        if abs(divisor - value) < 1e-3 * max(1.0, value):
            return cause
    return f"the scores are divided by {divisor:.4g} instead of sqrt(d_k) = {math.sqrt(d_k):.4g}."


def diagnose_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None,
                       weights: Any, output: Any = None) -> Diagnosis | None:
    """The first place where the student's attention departs from the reference on these inputs:
    the scores, the weights (normalisation, hidden keys), or the output."""
    expected_output, expected_weights = reference_attention(Q, K, V, mask)
    if not isinstance(weights, torch.Tensor) or weights.shape != expected_weights.shape:
        return None
    d_k, q_len, k_len = Q.size(-1), Q.size(-2), K.size(-2)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (..., q_len, k_len)
    hidden = (mask == 0).expand_as(scores) if mask is not None else torch.zeros_like(scores, dtype=torch.bool)
    w = weights.detach().to(torch.float64)
    if _close(w, expected_weights):
        if output is None or not isinstance(output, torch.Tensor) or output.shape != expected_output.shape:
            return None
        out = output.detach().to(torch.float64)
        for candidate, cause in ((scores.masked_fill(hidden, -1e9) @ V, "the output multiplies the scores, not the "
                                  "weights, with V: output = weights @ V."),
                                 (V[..., :q_len, :] if V.size(-2) >= q_len else None, "the output is V itself: "
                                  "multiply the weights with it, output = weights @ V.")):
            if candidate is not None and _close(out, candidate):
                return Diagnosis("scores match; weights match; the output differs", cause)
        return Diagnosis(f"scores match; weights match; the output differs{_heads_text(out, expected_output)}: "
                         f"{describe_difference(out, expected_output, _axes_for(out)) or 'other values'}",
                         "output = weights @ V: one row of weights per query times V (..., k_len, d_v).")
    if not torch.isfinite(w).all():
        return Diagnosis("the weights hold NaN or inf",
                         "a row whose scores are all -inf (every key hidden) gives NaN; fill hidden scores with "
                         "a large negative number (-1e9) or check the division.")
    heads = _heads_text(w, expected_weights)
    row_sums = w.sum(dim=-1)
    if not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-6):
        masked = scores.masked_fill(hidden, -1e9)
        for dim in range(-2, -w.dim() - 1, -1):
            if _close(w, torch.softmax(masked, dim=dim)) or _close(w, torch.softmax(scores, dim=dim)):
                axis = _axes_for(w)[dim]
                plural = {"query": "queries", "head": "heads", "batch": "batch"}.get(axis, axis)
                return Diagnosis(f"scores match; weights differ: the rows (over the keys) do not sum to 1, the "
                                 f"{axis} axis does — softmax over the wrong axis (dim={dim}, the {plural})",
                                 f"the softmax runs over dim={dim} (the {plural}): each query's weights over the keys "
                                 "must sum to 1, so use dim=-1." if dim == -2 else
                                 f"the softmax runs over the wrong axis, dim={dim} (the {plural}): count from the end "
                                 "and normalise over the keys, dim=-1.")
        if mask is not None and _close(w, torch.softmax(scores, dim=-1).masked_fill(hidden, 0.0)):
            return Diagnosis("scores match; weights differ: the rows do not sum to 1 because the hidden keys were "
                             "zeroed after the softmax",
                             "the mask is applied after the softmax: zeroing weights after normalising leaves rows "
                             "that do not sum to 1; fill the scores with -1e9 before the softmax.")
        if _close(w, masked) or _close(w, scores):
            return Diagnosis("weights differ: they are the scores themselves, no softmax was applied",
                             "`weights` holds the scaled scores, not their softmax: return softmax(scores, dim=-1).")
        return Diagnosis(f"weights differ{heads}: the rows do not sum to 1 (sums from {row_sums.min().item():.3g} to "
                         f"{row_sums.max().item():.3g})", "weights = softmax(scores, dim=-1): one softmax over the "
                         "keys, with nothing done to the weights afterwards.")
    leaked = w[hidden]
    if leaked.numel() and leaked.abs().max() > 1e-9:
        for candidate, cause in (
            (torch.softmax(scores, dim=-1), "the mask is ignored: apply it with scores = scores.masked_fill(mask == 0, "
             "-1e9) (masked_fill returns a new tensor, so assign the result)."),
            (torch.softmax(scores.masked_fill(hidden, 0.0), dim=-1), "hidden scores are set to 0: exp(0) = 1 still "
             "gives those keys weight; use a very negative number such as -1e9 (or float('-inf'))."),
            (torch.softmax(scores.masked_fill(~hidden, -1e9), dim=-1), "the mask is inverted: True (1) means 'may "
             "attend', so hide the positions where mask == 0."),
        ):
            if _close(w, candidate):
                return Diagnosis(f"scores match; weights differ: hidden keys get weight (up to "
                                 f"{leaked.abs().max().item():.3g})", cause)
        return Diagnosis(f"weights differ: hidden keys get weight (up to {leaked.abs().max().item():.3g})",
                         "fill the hidden scores with a very negative number (-1e9 or float('-inf')) before the "
                         "softmax; True (1) means 'may attend', so hide where mask == 0.")
    starved = w[~hidden & (expected_weights > 1e-6)]
    if mask is not None and starved.numel() and (starved < 1e-12).any():
        return Diagnosis("weights differ: keys that may be attended get weight 0",
                         "the mask is inverted: True (1) means 'may attend', so hide the positions where mask == 0.")
    # The rows sum to 1 and the mask is right, so the weights are a softmax of other scores: recover
    # them (log-weights up to one constant per row) and compare with the expected scores.
    visible = ~hidden
    counts = visible.sum(dim=-1, keepdim=True).clamp_min(1)
    log_w = torch.where(visible, w.clamp_min(1e-300).log(), torch.zeros_like(w))
    got_scores = log_w - (log_w * visible).sum(dim=-1, keepdim=True) / counts
    centred = torch.where(visible, scores, torch.zeros_like(scores))
    centred = (centred - (centred * visible).sum(dim=-1, keepdim=True) / counts) * visible
    got_scores = got_scores * visible
    factor = ((got_scores * centred).sum() / (centred * centred).sum().clamp_min(1e-300)).item()
    if _close(got_scores, factor * centred, 1e-5, 1e-4):
        return Diagnosis(f"the scores before the softmax are {factor:.4g} × the expected Q K^T / sqrt(d_k){heads}",
                         _scale_cause(factor, d_k, q_len, k_len))
    if q_len == k_len:
        transposed = torch.where(visible, scores.transpose(-2, -1), torch.zeros_like(scores))
        transposed = (transposed - (transposed * visible).sum(dim=-1, keepdim=True) / counts) * visible
        if _close(got_scores, transposed, 1e-5, 1e-4):
            return Diagnosis("the scores before the softmax are transposed: row i holds the scores of key i",
                             "scores = Q @ K.transpose(-2, -1): one row per query, one column per key.")
    return Diagnosis(f"the scores before the softmax differ{heads} (not by a scale factor)",
                     "scores = Q @ K.transpose(-2, -1) / sqrt(d_k): queries times keys, over the last axis of each.")


# --- where multi-head attention departs -------------------------------------------------------------


@dataclass
class _Trace:
    """What happened inside the student's forward: every nn.Linear call, every call of the attention
    function, and the output (or the error)."""

    linear: list[tuple[str, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    attention: list[list[Any]] = field(default_factory=list)  # [args, kwargs, result or None]
    combined: list[Any] = field(default_factory=list)  # what combine_heads was given
    output: Any = None
    error: BaseException | None = None

    roles: dict[str, str] = field(default_factory=dict)  # W_q -> the student's name for it, when they differ

    def layer(self, name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        name = self.roles.get(name, name)
        return next(((given, result) for layer, given, result in self.linear if layer == name), None)


@contextmanager
def _tracing(module: nn.Module, trace: _Trace) -> Iterator[None]:
    """Record the student's linear layers (forward hooks) and attention calls (the function forward
    looks up by name is wrapped while the check runs)."""
    hooks = [layer.register_forward_hook(
        lambda _, inputs, result, name=name: trace.linear.append((name, inputs[0].detach(), result.detach())))
        for name, layer in module.named_modules() if isinstance(layer, nn.Linear)]
    namespace = getattr(getattr(type(module), "forward", None), "__globals__", {})
    original = namespace.get("scaled_dot_product_attention")

    def recording(*args: Any, **kwargs: Any) -> Any:
        entry = [args, kwargs, None]
        trace.attention.append(entry)
        entry[2] = original(*args, **kwargs)
        return entry[2]

    if callable(original):
        namespace["scaled_dot_product_attention"] = recording
    combine = getattr(module, "combine_heads", None)

    def combining(x: Any, *args: Any, **kwargs: Any) -> Any:
        trace.combined.append(x.detach() if isinstance(x, torch.Tensor) else x)
        return combine(x, *args, **kwargs)

    if callable(combine):
        object.__setattr__(module, "combine_heads", combining)  # an instance attribute shadows the method
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        if callable(original):
            namespace["scaled_dot_product_attention"] = original
        module.__dict__.pop("combine_heads", None)


def _attention_arguments(entry: list[Any]) -> tuple[Any, Any, Any, Any]:
    args, kwargs, _ = entry
    names = ("Q", "K", "V", "mask")
    values = list(args) + [None] * (4 - len(args))
    for index, name in enumerate(names):
        for key in (name, name.lower()):
            if key in kwargs:
                values[index] = kwargs[key]
    return tuple(values[:4])  # type: ignore[return-value]


def _diagnose_mha(reference: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None, trace: _Trace) -> Diagnosis | None:
    """Follow forward step by step (projections, split heads, the attention call, its heads, the combined
    heads, W_o) and name the first place where the student's values depart from the reference's."""
    inputs = {"q": q, "k": k, "v": v}
    expected: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for layer, source in (("W_q", "q"), ("W_k", "k"), ("W_v", "v")):
            expected[layer] = getattr(reference, layer)(inputs[source])
    passed: list[str] = []

    def departs(where: str, cause: str) -> Diagnosis:
        return Diagnosis("; ".join([*passed, where]), cause)

    for layer, source in (("W_q", "q"), ("W_k", "k"), ("W_v", "v")):
        call = trace.layer(layer)
        if call is None:
            if trace.error is None:
                return departs(f"`self.{layer}` is never called", f"project the input: self.{layer}({source}).")
            return None
        given = call[0]
        if not _close(given, inputs[source]):
            used = next((name for name, tensor in inputs.items() if _close(given, tensor)), None)
            if used is None:
                return departs(f"`self.{layer}` gets another input than `{source}`",
                               f"apply self.{layer} to the {source} argument of forward.")
            cause = {("W_k", "v"): "keys and values are mixed up: K = W_k(k) and V = W_v(v).",
                     ("W_v", "k"): "keys and values are mixed up: K = W_k(k) and V = W_v(v).",
                     ("W_k", "q"): "K and V are computed from q: keys come from W_k(k) and values from W_v(v), "
                                   "which differ from q in cross-attention.",
                     ("W_v", "q"): "K and V are computed from q: keys come from W_k(k) and values from W_v(v), "
                                   "which differ from q in cross-attention."}.get(
                (layer, used), f"apply self.{layer} to {source}, not to {used}.")
            return departs(f"`self.{layer}` is applied to `{used}` instead of `{source}`", cause)
    passed.append("projections match")
    if not trace.attention:
        return _diagnose_inline(reference, expected, mask, trace, passed)
    Q, K, V, given_mask = _attention_arguments(trace.attention[0])
    with torch.no_grad():
        wanted = {"Q": reference.split_heads(expected["W_q"]), "K": reference.split_heads(expected["W_k"]),
                  "V": reference.split_heads(expected["W_v"])}
    for name, tensor in (("Q", Q), ("K", K), ("V", V)):
        if _close(tensor, wanted[name]):
            continue
        shape = tuple(wanted[name].shape)
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
            got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            return departs(f"the {name} passed to scaled_dot_product_attention has shape {got} instead of "
                           f"(batch, num_heads, len, d_k) = {shape}",
                           "split every projection into heads, self.split_heads(self.W_q(q)) and so on, before "
                           "attending.")
        other = next((o for o in wanted if o != name and _close(tensor, wanted[o])), None)
        if other:
            return departs(f"the {name} passed to scaled_dot_product_attention is the expected {other}",
                           "call scaled_dot_product_attention(Q, K, V, mask) with the arguments in this order.")
        return departs(f"the {name} passed to scaled_dot_product_attention differs: "
                       f"{describe_difference(tensor, wanted[name], AXES) or 'other values'}",
                       "split_heads must give head h the features h*d_k ... (h+1)*d_k - 1 of every token: view as "
                       "(batch, seq_len, num_heads, d_k), then transpose(1, 2).")
    passed.append("split heads match")
    if mask is not None and given_mask is None:
        return departs("scaled_dot_product_attention gets no mask",
                       "the mask is not passed on: call scaled_dot_product_attention(Q, K, V, mask).")
    if mask is not None and isinstance(given_mask, torch.Tensor) and given_mask.shape != mask.shape:
        return departs(f"the mask passed to scaled_dot_product_attention has shape {tuple(given_mask.shape)} "
                       f"({given_mask.dim()} axes) instead of the given {tuple(mask.shape)}",
                       "pass the mask on as it is given: it already broadcasts against the scores (batch, num_heads, "
                       "q_len, k_len); adding an axis (unsqueeze) breaks that.")
    if mask is not None and isinstance(given_mask, torch.Tensor) and not torch.equal(given_mask != 0, mask != 0):
        return departs("the mask passed to scaled_dot_product_attention is not the given one",
                       "pass the mask on unchanged: scaled_dot_product_attention(Q, K, V, mask).")
    passed.append("the mask is passed on")
    result = trace.attention[0][2]
    if result is None:
        return None
    heads = result[0] if isinstance(result, tuple) else result
    with torch.no_grad():
        expected_heads = reference_attention(wanted["Q"], wanted["K"], wanted["V"], mask)[0]
    if not _close(heads, expected_heads):
        return departs(f"your scaled_dot_product_attention returns other heads{_heads_text(heads, expected_heads)}",
                       "scaled_dot_product_attention gives another result on these heads: fix its checks first.")
    passed.append("attention matches")
    known = {"`q`": q, "`k`": k, "`v`": v, "Q": wanted["Q"], "K": wanted["K"], "V": wanted["V"]}
    return _diagnose_output(reference, expected_heads, trace, passed, known)


def _diagnose_inline(reference: nn.Module, expected: dict[str, torch.Tensor], mask: torch.Tensor | None,
                     trace: _Trace, passed: list[str]) -> Diagnosis | None:
    """Attention written inside forward (no call to the function): compare the heads W_o receives."""
    with torch.no_grad():
        Q, K, V = (reference.split_heads(expected[name]) for name in ("W_q", "W_k", "W_v"))
        expected_heads = reference_attention(Q, K, V, mask)[0]
        wider = _attention_variant(Q, K, V, mask, scale=math.sqrt(reference.d_model))[0]
    call = trace.layer("W_o")
    if call is not None and not _close(call[0], reference.combine_heads(expected_heads)):
        if _close(call[0], reference.combine_heads(wider)):
            return Diagnosis("; ".join([*passed, "the heads differ: their scores are divided by sqrt(d_model)"]),
                             "the scores are scaled by sqrt(d_model) instead of sqrt(d_k) = sqrt(d_model / "
                             "num_heads).")
        return Diagnosis("; ".join([*passed, "the attention written in forward gives other heads (the input of "
                                             "W_o differs)"]),
                         "attend each head with softmax(Q K^T / sqrt(d_k)) V, d_k = d_model / num_heads.")
    return _diagnose_output(reference, expected_heads, trace, passed, {"Q": Q, "K": K, "V": V})


def _diagnose_output(reference: nn.Module, heads: torch.Tensor, trace: _Trace, passed: list[str],
                     known: dict[str, torch.Tensor]) -> Diagnosis | None:
    with torch.no_grad():
        combined = reference.combine_heads(heads)
    if trace.combined and not _close(trace.combined[0], heads):
        given = trace.combined[0]
        name = next((name for name, value in known.items() if _close(given, value)), None)
        what = f"{name}" if name else (f"a tensor of shape {tuple(given.shape)}" if isinstance(given, torch.Tensor)
                                       else type(given).__name__)
        return Diagnosis("; ".join([*passed, f"combine_heads is given {what} instead of the heads that "
                                             "scaled_dot_product_attention returned"]),
                         "join the heads the attention returned: self.W_o(self.combine_heads(heads)).")
    call = trace.layer("W_o")
    if call is None:
        if trace.error is None:
            return Diagnosis("; ".join([*passed, "`self.W_o` is never called"]),
                             "W_o is skipped: the concatenated heads go through the output projection, "
                             "self.W_o(self.combine_heads(...)).")
        return None
    if not _close(call[0], combined):
        got = call[0]
        how = describe_difference(got, combined, ("batch", "query", "feature")) if got.shape == combined.shape else \
            f"shape {tuple(got.shape)} instead of {tuple(combined.shape)}"
        return Diagnosis("; ".join([*passed, f"the combined heads (the input of W_o) differ: {how or 'other values'}"]),
                         "combine_heads must undo split_heads: transpose(1, 2) back to (batch, seq_len, num_heads, "
                         "d_k), then view as (batch, seq_len, d_model), so each head's d_k features stay together.")
    passed.append("combined heads match")
    if trace.output is not None and not _close(trace.output, call[1]):
        return Diagnosis("; ".join([*passed, "forward returns something other than the output of W_o"]),
                         "return output = self.W_o(self.combine_heads(heads)).")
    return None


# --- scaled dot-product attention ------------------------------------------------------------------


@check("scaled_dot_product_attention returns output (..., q_len, d_v) and weights (..., q_len, k_len)")
def sdpa_shapes(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                q_len: int = 4, k_len: int = 6, d_k: int = 5, d_v: int = 7) -> None:
    """With a heads axis (4-D inputs) and, unless heads=0 already asks for it, without one (3-D)."""
    for heads_here in dict.fromkeys((heads, 0)):
        Q, K, V = _qkv(batch, heads_here, q_len, k_len, d_k, d_v, seed=10)
        leading = (batch, heads_here) if heads_here else (batch,)
        try:
            output, weights = _student_attention(scaled_dot_product_attention, Q, K, V)
        except (IndexError, RuntimeError) as error:
            if heads_here == heads:  # the inputs the caller asked for: report the error as it is
                raise
            fail(
                f"scaled_dot_product_attention fails on {Q.dim()}-D inputs Q {tuple(Q.shape)}.",
                expected="the same code working for any number of leading axes (..., q_len, d_k)",
                got=f"{type(error).__name__}: {str(error).splitlines()[0][:100]}",
                cause="count axes from the end: K.transpose(-2, -1), softmax(dim=-1), Q.size(-1).",
            )
        expect_shape("weights", weights, (*leading, q_len, k_len),
                     cause="scores are Q @ K.transpose(-2, -1): one row per query, one column per key.")
        expect_shape("output", output, (*leading, q_len, d_v),
                     cause="output is weights @ V: one row per query, as wide as the values (d_v).")


@check("scaled_dot_product_attention gives softmax(Q K^T / sqrt(d_k)) V (no mask)")
def sdpa_values(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                q_len: int = 4, k_len: int = 6, d_k: int = 5, d_v: int = 7) -> None:
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_v, seed=20)
    output, weights = _student_attention(scaled_dot_product_attention, Q, K, V)
    expected_output, expected_weights = reference_attention(Q, K, V)
    expect_close("weights", weights, expected_weights, atol=1e-7, suspects=_sdpa_suspects(Q, K, V, None, 1),
                 diagnose=lambda got: diagnose_attention(Q, K, V, None, got),
                 cause="weights = softmax(Q @ K.transpose(-2, -1) / sqrt(d_k), dim=-1).")
    expect_close("output", output, expected_output, atol=1e-7, suspects=_sdpa_suspects(Q, K, V, None, 0),
                 diagnose=lambda got: diagnose_attention(Q, K, V, None, weights, got),
                 cause="output = weights @ V.")


@check("scaled_dot_product_attention hides the keys where the mask is False (before the softmax)")
def sdpa_masked_values(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                       q_len: int = 5, k_len: int = 6, d_k: int = 4, d_v: int = 3) -> None:
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_v, seed=30)
    mask = _random_mask(batch, q_len, k_len, seed=31, heads_axis=heads > 0)
    output, weights = _student_attention(scaled_dot_product_attention, Q, K, V, mask)
    expected_output, expected_weights = reference_attention(Q, K, V, mask)
    expect_close("weights", weights, expected_weights, atol=1e-7, suspects=_sdpa_suspects(Q, K, V, mask, 1),
                 diagnose=lambda got: diagnose_attention(Q, K, V, mask, got),
                 cause="before the softmax, fill the scores with -1e9 where mask == 0; the mask broadcasts "
                       "against the scores (batch, heads, q_len, k_len).")
    expect_close("output", output, expected_output, atol=1e-7, suspects=_sdpa_suspects(Q, K, V, mask, 0),
                 diagnose=lambda got: diagnose_attention(Q, K, V, mask, weights, got),
                 cause="output = weights @ V, with the masked weights.")


@check("scaled_dot_product_attention agrees with torch.nn.functional.scaled_dot_product_attention")
def sdpa_matches_pytorch(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                         q_len: int = 5, k_len: int = 7, d_k: int = 8, d_v: int = 6) -> None:
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_v, seed=40)
    mask = _random_mask(batch, q_len, k_len, seed=41, heads_axis=heads > 0)
    for name, used_mask in (("without a mask", None), ("with a bool mask", mask)):
        output, weights = _student_attention(scaled_dot_product_attention, Q, K, V, used_mask)
        with torch.no_grad():  # the built-in is the yardstick: it runs outside student_code()
            expected = F.scaled_dot_product_attention(Q, K, V, attn_mask=used_mask)  # True = may attend
        expect_close(f"output {name}", output, expected, atol=1e-5, rtol=1e-5,
                     suspects=_sdpa_suspects(Q, K, V, used_mask, 0),
                     diagnose=lambda got, m=used_mask, w=weights: diagnose_attention(Q, K, V, m, w, got),
                     cause="PyTorch's built-in computes softmax(Q K^T / sqrt(d_k)) V with the same mask "
                           "convention (True = may attend).")


def _check_masked_weights(weights: torch.Tensor, mask: torch.Tensor, which: str) -> None:
    hidden = (mask == 0).expand_as(weights)
    leaked = weights[hidden]
    column_sums = weights.sum(dim=-2)  # 1 everywhere when the softmax ran over the queries
    columns_normalised = torch.allclose(column_sums, torch.ones_like(column_sums))
    if leaked.numel() and leaked.abs().max() != 0 and columns_normalised:
        fail(
            f"keys hidden by the {which} still get attention weight, and each *column* of weights sums to 1.",
            expected="exactly 0 weight wherever mask == 0, every row summing to 1",
            got=f"weights up to {leaked.abs().max().item():.3g} on hidden keys",
            cause="the softmax runs over dim=-2 (the queries); normalise over the keys with dim=-1.",
        )
    if leaked.numel() and leaked.abs().max() != 0:
        fail(
            f"keys hidden by the {which} still get attention weight.",
            expected="exactly 0 weight wherever mask == 0",
            got=f"weights up to {leaked.abs().max().item():.3g} on hidden keys",
            cause="fill the hidden scores with a very negative number (-1e9 or float('-inf')) before the "
                  "softmax; True (1) means 'may attend', so hide where mask == 0.",
        )
    row_sums = weights.sum(dim=-1)
    if not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-6):
        worst = (row_sums - 1).abs().max().item()
        fail(
            "the attention weights of a query do not sum to 1.",
            expected="every row of weights (over the keys) sums to 1",
            got=f"row sums off by up to {worst:.3g}",
            cause="apply the mask to the scores *before* the softmax (not to the weights after it), and take "
                  "the softmax over the keys, dim=-1.",
        )


@check("masked keys get exactly zero weight and every row of weights sums to 1")
def sdpa_masked_keys_get_zero(scaled_dot_product_attention: AttentionFunction, batch: int = 3, heads: int = 2,
                              q_len: int = 6, k_len: int = 6, d_k: int = 4) -> None:
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_k, seed=50)
    lengths = torch.tensor([k_len, k_len - 2, 1] + [k_len] * (batch - 3))[:batch]
    padding = (torch.arange(k_len) < lengths[:, None]).view(batch, 1, 1, k_len)  # (batch, 1, 1, k_len)
    look_ahead = torch.ones(q_len, k_len, dtype=torch.bool).tril().view(1, 1, q_len, k_len)
    for which, mask in (("padding mask", padding), ("look-ahead mask", look_ahead),
                        ("combined mask", padding & look_ahead)):
        Q_scaled = Q * 10  # large scores: a weak fill value such as -100 would still leak
        _, weights = _student_attention(scaled_dot_product_attention, Q_scaled, K, V, mask)
        expect_shape("weights", weights, (batch, heads, q_len, k_len),
                     cause="weights keep one row per query and one column per key.")
        _check_masked_weights(weights, mask, which)


@check("scaled_dot_product_attention accepts an integer 0/1 mask as well as a bool one")
def sdpa_integer_mask(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 2,
                      q_len: int = 4, k_len: int = 5, d_k: int = 6) -> None:
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_k, seed=60)
    mask = _random_mask(batch, q_len, k_len, seed=61, heads_axis=heads > 0)
    expected_output, _ = reference_attention(Q, K, V, mask)
    inverted = _attention_variant(Q, K, V, mask, mask_mode="inverted")[0]
    for dtype in (torch.long, torch.int32):
        integer_mask = mask.to(dtype)  # 1 = may attend, 0 = hidden
        output, weights = _student_attention(scaled_dot_product_attention, Q, K, V, integer_mask)
        _check_masked_weights(weights, mask, f"integer 0/1 mask ({dtype})")
        expect_close(f"output with a {dtype} 0/1 mask", output, expected_output, atol=1e-7,
                     suspects={"an integer 1 is treated as 'hidden': hide where mask == 0, so 1 means "
                               "'may attend'.": lambda: inverted},
                     diagnose=lambda got, w=weights: diagnose_attention(Q, K, V, mask, w, got),
                     cause="hide the keys where mask == 0; the result must not depend on the mask's dtype.")


# --- masks -----------------------------------------------------------------------------------------


def _token_batch(batch: int, seq_len: int, pad_idx: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (batch, seq_len) padded at the end, id 0 also used as a real token; and the real lengths."""
    tokens = torch.randint(0, 9, (batch, seq_len), generator=generator(seed))
    tokens[tokens == pad_idx] = pad_idx + 1  # only the padding below uses pad_idx
    tokens[:, 0] = 0 if pad_idx != 0 else 2  # a real token with id 0 (unless 0 is the padding id)
    lengths = torch.tensor([seq_len, max(1, seq_len - 3), max(1, seq_len - 1), 1] * batch)[:batch]
    positions = torch.arange(seq_len)
    tokens[positions >= lengths[:, None]] = pad_idx
    return tokens, lengths


def _student_mask(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with torch.no_grad(), student_code():
        return function(*args, **kwargs)


def _expect_mask_dtype(name: str, mask: torch.Tensor, cause: str) -> None:
    """Bool, or integers 0/1 (what the course's attention accepts and `&` combines); not floats."""
    if mask.dtype == torch.bool:
        return
    if mask.is_floating_point() or mask.is_complex():
        fail(f"{name} is a {mask.dtype} tensor.", expected="dtype torch.bool (or an integer 0/1 mask)",
             got=f"dtype {mask.dtype}", cause=cause)
    values = set(torch.unique(mask).tolist())
    if not values <= {0, 1}:
        fail(f"{name} holds values other than 0 and 1.", expected="True/False, or integers 1 (may attend) and 0",
             got=f"values {sorted(values)[:6]}", cause="compare the tokens with pad_idx and keep the result as it "
             "is (bool), or as .int(); `~` on an integer mask flips bits (1 -> -2).")


@check("make_padding_mask returns shape (batch, 1, 1, seq_len)")
def padding_mask_shape(make_padding_mask: Callable[..., Any], batch: int = 3, seq_len: int = 7,
                       pad_idx: int = 1) -> None:
    tokens, _ = _token_batch(batch, seq_len, pad_idx, seed=70)
    mask = _student_mask(make_padding_mask, tokens, pad_idx)
    if isinstance(mask, torch.Tensor) and tuple(mask.shape) == (batch, 1, seq_len, 1) and seq_len > 1:
        fail("padding mask has the wrong shape.", expected=(batch, 1, 1, seq_len), got=tuple(mask.shape),
             cause="this mask hides padded queries (rows of the scores) instead of padded keys (columns): "
                   "unsqueeze(1).unsqueeze(2) puts seq_len last, so it broadcasts over the keys axis.")
    expect_shape("padding mask", mask, (batch, 1, 1, seq_len),
                 cause="add a heads axis and a query axis: (token_ids != pad_idx).unsqueeze(1).unsqueeze(2), "
                       "so the mask broadcasts against scores of shape (batch, heads, q_len, k_len).")


@check("make_padding_mask is True at real tokens and False at padding")
def padding_mask_values(make_padding_mask: Callable[..., Any], batch: int = 4, seq_len: int = 8,
                        pad_idx: int = 1) -> None:
    tokens, _ = _token_batch(batch, seq_len, pad_idx, seed=80)
    mask = _student_mask(make_padding_mask, tokens, pad_idx)
    expected = reference_padding_mask(tokens, pad_idx)
    expect_shape("padding mask", mask, tuple(expected.shape),
                 cause="the mask has shape (batch, 1, 1, seq_len).")
    _expect_mask_dtype("padding mask", mask,
                       cause="return the comparison itself (token_ids != pad_idx), a bool tensor; stage 4 combines "
                             "masks with `&`, which floats do not support.")
    expect_close(
        "padding mask", mask.double(), expected.double(), atol=0.0, rtol=0.0,
        suspects={
            "the mask is inverted: it must be True where the token is real (token_ids != pad_idx).": (
                lambda: (~expected).double()
            ),
            "the comparison uses 0 instead of pad_idx: the padding id is the argument pad_idx.": (
                lambda: reference_padding_mask(tokens, 0).double()
            ),
        },
        cause="True (may attend) for real tokens, False for padding: (token_ids != pad_idx).",
    )


@check("make_look_ahead_mask returns shape (1, 1, size, size)")
def look_ahead_mask_shape(make_look_ahead_mask: Callable[..., Any], size: int = 6) -> None:
    mask = _student_mask(make_look_ahead_mask, size)
    expect_shape("look-ahead mask", mask, (1, 1, size, size),
                 cause="build a (size, size) lower triangle, then add two leading axes "
                       "(.unsqueeze(0) twice).")


@check("make_look_ahead_mask lets position i see positions 0..i (diagonal included), on the given device")
def look_ahead_mask_values(make_look_ahead_mask: Callable[..., Any], size: int = 6) -> None:
    mask = _student_mask(make_look_ahead_mask, size, device=torch.device("cpu"))
    expected = reference_look_ahead_mask(size)
    expect_shape("look-ahead mask", mask, tuple(expected.shape),
                 cause="the mask has shape (1, 1, size, size).")
    _expect_mask_dtype("look-ahead mask", mask,
                       cause="create it with dtype=torch.bool (for example torch.ones(size, size, "
                             "dtype=torch.bool).tril()); stage 4 combines it with the padding mask using `&`, which "
                             "floats do not support.")
    ones = torch.ones(size, size, dtype=torch.float64)
    expect_close(
        "look-ahead mask", mask.double(), expected.double(), atol=0.0, rtol=0.0,
        suspects={
            "the diagonal is hidden: a position may attend to itself, so keep the diagonal (tril(), not "
            "tril(-1) or triu(1) inverted).": lambda: ones.tril(-1).view(1, 1, size, size),
            "the mask is inverted: True must mark the allowed past (lower triangle), False the future.": (
                lambda: ones.triu(1).view(1, 1, size, size)
            ),
            "the mask is transposed: row i is the query, so row i may see columns 0..i "
            "(lower triangle, tril).": (
                lambda: ones.triu().view(1, 1, size, size)
            ),
        },
        cause="row i (the query) is True in columns 0..i: torch.ones(size, size, dtype=torch.bool).tril().",
    )
    if mask.device.type != "cpu":
        fail("the mask is not on the requested device.", expected="device cpu", got=str(mask.device),
             cause="pass device=device to the torch.ones/torch.tril call that creates the mask.")


# --- multi-head attention --------------------------------------------------------------------------


def _reference_module(d_model: int, num_heads: int, seed: int) -> nn.Module:
    """The reference MultiHeadAttention in float64 with weights drawn from a private generator."""
    with torch.random.fork_rng(devices=[]):
        module = ReferenceMultiHeadAttention(d_model, num_heads).double().eval()
    with torch.no_grad():
        for index, (_, parameter) in enumerate(sorted(module.named_parameters())):
            fan_in = parameter.shape[-1]
            parameter.copy_(randn(*parameter.shape, seed=seed + index) / math.sqrt(fan_in))
    return module


def _student_module(MultiHeadAttention: type[nn.Module], d_model: int, num_heads: int,
                    reference: nn.Module | None = None, *, names_required: bool = True) -> nn.Module:
    """The student's module in float64 and eval mode; with `reference`, holding its weights (copied by
    parameter name: only the checks that compare values with the same weights need the names; with
    `names_required=False` other names are fine and the weights stay as they are)."""
    with torch.random.fork_rng(devices=[]), student_code():
        module = MultiHeadAttention(d_model, num_heads)
    reject_builtin_modules(module, "MultiHeadAttention")
    module = module.double().eval()  # before copying, so the float64 weights are not rounded to float32
    if reference is None:
        return module
    if set(module.state_dict()) == set(reference.state_dict()):
        copy_weights(reference, module, "MultiHeadAttention")
    elif not _copy_by_role(reference, module) and names_required:
        copy_weights(reference, module, "MultiHeadAttention")  # fails, naming the parameters it needs
    return module


def _copy_by_role(reference: nn.Module, module: nn.Module) -> bool:
    """Copy the reference weights into a module whose layers have other names, by what each layer does:
    one forward pass with distinct q, k, v shows which linear layer projects q, k and v and which one
    comes last (the output projection). False when the roles are not clear."""
    layers = {name: layer for name, layer in module.named_modules() if isinstance(layer, nn.Linear)}
    if len(layers) != 4 or len(list(module.parameters())) != 8:
        return False
    d_model = reference.d_model
    q, k, v = (randn(2, length, d_model, seed=seed) for seed, length in ((201, 3), (202, 5), (203, 5)))
    trace = _Trace()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), student_code(), _tracing(module, trace):
            module(q, k, v, None)
    except Exception:  # a forward that crashes has no roles to read; the names decide
        return False
    roles: dict[str, str] = {}
    for role, source in (("W_q", q), ("W_k", k), ("W_v", v)):
        users = {name for name, given, _ in trace.linear if _close(given, source)}
        if len(users) != 1:
            return False
        roles[role] = users.pop()
    rest = set(layers) - set(roles.values())
    if len(rest) != 1 or len(set(roles.values())) != 3:
        return False
    roles["W_o"] = rest.pop()
    with torch.no_grad():
        for role, name in roles.items():
            if layers[name].weight.shape != getattr(reference, role).weight.shape or layers[name].bias is None:
                return False
            layers[name].weight.copy_(getattr(reference, role).weight)
            layers[name].bias.copy_(getattr(reference, role).bias)
    module.linear_roles = roles  # type: ignore[assignment]  # read by the diagnosis
    return True


def _run_traced(module: nn.Module, reference: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> tuple[Any, _Trace]:
    """Run forward while recording its steps; a crash is explained by the first step that departed
    before it (an extra mask axis, heads split into the wrong shape), else by its kind."""
    trace = _Trace(roles=dict(getattr(module, "linear_roles", {})))
    try:
        with torch.no_grad(), student_code(), _tracing(module, trace), _explain_runtime_errors():
            trace.output = module(q, k, v, mask)
    except (RuntimeError, IndexError, ValueError, TypeError) as error:
        if isinstance(error, NotImplementedError):
            raise
        trace.error = error
        diagnosis = _diagnose_mha(reference, q, k, v, mask, trace)
        if diagnosis is None:
            raise
        where = student_frame(error)
        fail(f"forward crashed: {diagnosis.where}.", expected="forward(q, k, v, mask) -> (batch, q_len, d_model)",
             got=f"{type(error).__name__}: {first_line(error, 160)}" + (f"\n  {where}" if where else ""),
             cause=diagnosis.cause)
    return trace.output, trace


def _split(module: nn.Module, x: torch.Tensor, mistake: str = "") -> torch.Tensor:
    """split_heads of the reference, or a known wrong way of doing it."""
    batch, seq_len, _ = x.shape
    if mistake == "view without transpose":
        return x.reshape(batch, module.num_heads, seq_len, module.d_k)
    if mistake == "interleaved":
        return x.reshape(batch, seq_len, module.d_k, module.num_heads).permute(0, 3, 1, 2)
    return module.split_heads(x)


def _combine(module: nn.Module, x: torch.Tensor, mistake: str = "") -> torch.Tensor:
    """combine_heads of the reference, or a known wrong way of doing it."""
    batch, _, seq_len, _ = x.shape
    if mistake == "view without transpose":
        return x.reshape(batch, seq_len, module.d_model)
    if mistake == "interleaved":
        return x.permute(0, 2, 3, 1).reshape(batch, seq_len, module.d_model)
    return module.combine_heads(x)


def _mha_variant(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None, *, split: str = "", combine: str = "", use_W_o: bool = True,
                 one_head: bool = False, scale: float | None = None, swap_k_v: bool = False,
                 mask_used: bool = True, kv_from_q: bool = False) -> torch.Tensor:
    """The reference forward pass with one known mistake switched on; returns (batch, q_len, d_model)."""
    with torch.no_grad():
        projected_k, projected_v = module.W_k(k), module.W_v(v)
        if swap_k_v:
            projected_k, projected_v = module.W_k(v), module.W_v(k)
        if kv_from_q:
            projected_k, projected_v = module.W_k(q), module.W_v(q)
        mask = mask if mask_used else None
        if one_head:
            heads, _, _ = _attention_variant(module.W_q(q), projected_k, projected_v,
                                             None if mask is None else mask[:, 0])
            return module.W_o(heads) if use_W_o else heads
        Q, K, V = (_split(module, t, split) for t in (module.W_q(q), projected_k, projected_v))
        heads, _, _ = _attention_variant(Q, K, V, mask, scale=scale)  # (batch, heads, q_len, d_k)
        combined = _combine(module, heads, combine or split)
        return module.W_o(combined) if use_W_o else combined


def _mha_suspects(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None) -> dict[str, Callable[[], torch.Tensor]]:
    def variant(**kwargs: Any) -> Callable[[], torch.Tensor]:
        return lambda: _mha_variant(module, q, k, v, mask, **kwargs)

    return {
        "W_o is skipped: the concatenated heads go through the output projection, "
        "self.W_o(self.combine_heads(...)).": variant(use_W_o=False),
        "the heads are split with .view but no transpose: view to (batch, seq_len, num_heads, d_k), then "
        "transpose(1, 2) (and undo both in combine_heads).": variant(split="view without transpose"),
        "combine_heads reshapes without transposing back: transpose(1, 2) first, then view to "
        "(batch, seq_len, d_model).": variant(combine="view without transpose"),
        "each head takes every num_heads-th feature instead of a block of d_k neighbouring features: view "
        "as (batch, seq_len, num_heads, d_k).": variant(split="interleaved"),
        "the heads are never split: attention runs once over the full d_model width (so it is scaled by "
        "sqrt(d_model) instead of sqrt(d_k)); apply split_heads to the projected Q, K and V.": (
            variant(one_head=True)
        ),
        "the scores are scaled by sqrt(d_model) instead of sqrt(d_k) = sqrt(d_model / num_heads).": variant(
            scale=math.sqrt(module.d_model)
        ),
        "keys and values are mixed up: K = W_k(k) and V = W_v(v).": variant(swap_k_v=True),
        "K and V are computed from q: keys come from W_k(k) and values from W_v(v), which differ from q in "
        "cross-attention.": variant(kv_from_q=True),
        "the mask is not passed on: call scaled_dot_product_attention(Q, K, V, mask).": (
            variant(mask_used=False)
        ),
    }


def _mha_inputs(batch: int, q_len: int, k_len: int, d_model: int, seed: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct q, k, v and a padding mask (batch, 1, 1, k_len) hiding the tail of some key sequences."""
    q = randn(batch, q_len, d_model, seed=seed)
    k = randn(batch, k_len, d_model, seed=seed + 1)
    v = randn(batch, k_len, d_model, seed=seed + 2)
    lengths = torch.tensor([k_len, max(1, k_len - 2), max(1, k_len - 3)] * batch)[:batch]
    mask = (torch.arange(k_len) < lengths[:, None]).view(batch, 1, 1, k_len)
    return q, k, v, mask


@check("split_heads turns (batch, seq_len, d_model) into (batch, num_heads, seq_len, d_k)")
def split_heads_shape(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 3,
                      batch: int = 2, seq_len: int = 5) -> None:
    module = _student_module(MultiHeadAttention, d_model, num_heads)  # no weights: any layer names pass
    x = randn(batch, seq_len, d_model, seed=91)
    with torch.no_grad(), student_code(), _explain_runtime_errors():
        split = module.split_heads(x)
    expect_shape("split_heads(x)", split, (batch, num_heads, seq_len, d_model // num_heads),
                 cause="view as (batch, seq_len, num_heads, d_k), then transpose(1, 2) to bring the heads "
                       "forward.")


@check("split_heads gives head h the features h*d_k ... (h+1)*d_k - 1 of every token")
def split_heads_values(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 3,
                       batch: int = 2, seq_len: int = 5) -> None:
    reference = _reference_module(d_model, num_heads, 100)
    module = _student_module(MultiHeadAttention, d_model, num_heads)  # no weights: any layer names pass
    x = randn(batch, seq_len, d_model, seed=101)
    with torch.no_grad(), student_code(), _explain_runtime_errors():
        split = module.split_heads(x)
    expect_close(
        "split_heads(x)", split, reference.split_heads(x), atol=0.0, rtol=0.0,
        suspects={
            "reshaped straight to (batch, num_heads, seq_len, d_k) without a transpose: that mixes the "
            "features of different tokens into one head; view as (batch, seq_len, num_heads, d_k) then "
            "transpose(1, 2).": (
                lambda: _split(reference, x, "view without transpose")
            ),
            "each head takes every num_heads-th feature: view as (batch, seq_len, num_heads, d_k), so a head "
            "gets a block of d_k neighbouring features.": lambda: _split(reference, x, "interleaved"),
        },
        cause="view as (batch, seq_len, num_heads, d_k), then transpose(1, 2).",
    )


@check("combine_heads turns (batch, num_heads, seq_len, d_k) back into (batch, seq_len, d_model)")
def combine_heads_values(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 3,
                         batch: int = 2, seq_len: int = 5) -> None:
    reference = _reference_module(d_model, num_heads, 110)
    module = _student_module(MultiHeadAttention, d_model, num_heads)  # no weights: any layer names pass
    heads = randn(batch, num_heads, seq_len, d_model // num_heads, seed=111)
    with torch.no_grad(), student_code(), _explain_runtime_errors():
        combined = module.combine_heads(heads)
    expect_close(
        "combine_heads(x)", combined, reference.combine_heads(heads), atol=0.0, rtol=0.0,
        suspects={
            "reshaped straight to (batch, seq_len, d_model) without transposing back: transpose(1, 2) first, "
            "then .contiguous().view(batch, seq_len, d_model).": lambda: _combine(reference, heads,
                                                                                  "view without transpose"),
            "the heads are interleaved feature by feature: after transpose(1, 2) the tensor is "
            "(batch, seq_len, num_heads, d_k); view it to (batch, seq_len, d_model) so each head's d_k "
            "features stay together.": (
                lambda: _combine(reference, heads, "interleaved")
            ),
        },
        cause="transpose(1, 2) to (batch, seq_len, num_heads, d_k), .contiguous(), then view(batch, seq_len, "
              "d_model).",
    )


@check("combine_heads(split_heads(x)) gives x back")
def combine_heads_inverts_split(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 4,
                                batch: int = 2, seq_len: int = 3) -> None:
    reference = _reference_module(d_model, num_heads, 120)
    module = _student_module(MultiHeadAttention, d_model, num_heads)  # no weights: any layer names pass
    x = randn(batch, seq_len, d_model, seed=121)
    with torch.no_grad(), student_code(), _explain_runtime_errors():
        round_trip = module.combine_heads(module.split_heads(x))
    with torch.no_grad():
        split = reference.split_heads(x)  # (batch, num_heads, seq_len, d_k)
    expect_close("combine_heads(split_heads(x))", round_trip, x, atol=0.0, rtol=0.0,
                 suspects={"combine_heads reshapes without transposing back: transpose(1, 2) first, then "
                           "view to (batch, seq_len, d_model).": lambda: _combine(reference, split,
                                                                                  "view without transpose")},
                 cause="combine_heads must undo split_heads step by step in reverse order: transpose(1, 2), "
                       "then view to (batch, seq_len, d_model).")


@check("MultiHeadAttention.forward returns (batch, q_len, d_model)")
def mha_output_shape(MultiHeadAttention: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                     batch: int = 2, q_len: int = 5, k_len: int = 5) -> None:
    reference = _reference_module(d_model, num_heads, 130)
    module = _student_module(MultiHeadAttention, d_model, num_heads, reference, names_required=False)
    q, k, v, mask = _mha_inputs(batch, q_len, k_len, d_model, seed=131)
    output, _ = _run_traced(module, reference, q, k, v, mask)
    expect_shape("forward(q, k, v, mask)", output, (batch, q_len, d_model),
                 cause="project, split_heads, attend, combine_heads, then W_o: the output has one "
                       "d_model-wide row per query.")


@check("MultiHeadAttention.forward matches the reference with the same weights (padding mask)")
def mha_values(MultiHeadAttention: type[nn.Module], d_model: int = 16, num_heads: int = 4, batch: int = 3,
               seq_len: int = 6) -> None:
    reference = _reference_module(d_model, num_heads, 140)
    module = _student_module(MultiHeadAttention, d_model, num_heads, reference)
    q, k, v, mask = _mha_inputs(batch, seq_len, seq_len, d_model, seed=141)
    output, trace = _run_traced(module, reference, q, k, v, mask)
    with torch.no_grad():
        expected = reference(q, k, v, mask)
    expect_close("forward(q, k, v, mask)", output, expected, atol=1e-7,
                 suspects=_mha_suspects(reference, q, k, v, mask),
                 diagnose=lambda _: _diagnose_mha(reference, q, k, v, mask, trace),
                 cause="Q = split_heads(W_q(q)), K = split_heads(W_k(k)), V = split_heads(W_v(v)); attend "
                       "with the mask; return W_o(combine_heads(heads))." + FIX_ATTENTION_FIRST)


def _pytorch_twin(reference: nn.Module) -> nn.MultiheadAttention:
    """nn.MultiheadAttention holding the reference's weights: in_proj = [W_q; W_k; W_v], out_proj = W_o."""
    d_model, num_heads = reference.d_model, reference.num_heads
    builtin = nn.MultiheadAttention(d_model, num_heads, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        projections = (reference.W_q, reference.W_k, reference.W_v)
        builtin.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))  # (3 * d_model, d_model)
        builtin.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))  # (3 * d_model,)
        builtin.out_proj.weight.copy_(reference.W_o.weight)
        builtin.out_proj.bias.copy_(reference.W_o.bias)
    return builtin.eval()


def _compare_with_pytorch(module: nn.Module, reference: nn.Module, q: torch.Tensor, k: torch.Tensor,
                          v: torch.Tensor, our_mask: torch.Tensor, **builtin_masks: torch.Tensor) -> None:
    output, trace = _run_traced(module, reference, q, k, v, our_mask)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        builtin = _pytorch_twin(reference)
        expected, _ = builtin(q, k, v, need_weights=False, **builtin_masks)
    # Only the output is compared: the weights kept in self.attn_weights have a check of their own.
    expect_close("forward(q, k, v, mask)", output, expected, atol=1e-5, rtol=1e-5,
                 suspects=_mha_suspects(reference, q, k, v, our_mask),
                 diagnose=lambda _: _diagnose_mha(reference, q, k, v, our_mask, trace),
                 cause="nn.MultiheadAttention with the same weights computes W_o(concat of heads) with "
                       "in_proj = [W_q; W_k; W_v]." + FIX_ATTENTION_FIRST)


@check("MultiHeadAttention agrees with torch.nn.MultiheadAttention (same weights, padding mask)")
def mha_matches_pytorch(MultiHeadAttention: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                        batch: int = 3, q_len: int = 5, k_len: int = 6) -> None:
    reference = _reference_module(d_model, num_heads, 150)
    module = _student_module(MultiHeadAttention, d_model, num_heads, reference)
    q, k, v, mask = _mha_inputs(batch, q_len, k_len, d_model, seed=151)
    key_padding_mask = ~mask[:, 0, 0, :]  # (batch, k_len); PyTorch's True means "ignore", unlike ours
    _compare_with_pytorch(module, reference, q, k, v, mask, key_padding_mask=key_padding_mask)


@check("MultiHeadAttention agrees with torch.nn.MultiheadAttention under a look-ahead mask")
def mha_matches_pytorch_causal(MultiHeadAttention: type[nn.Module], d_model: int = 16, num_heads: int = 2,
                               batch: int = 2, seq_len: int = 6) -> None:
    reference = _reference_module(d_model, num_heads, 160)
    module = _student_module(MultiHeadAttention, d_model, num_heads, reference)
    x = randn(batch, seq_len, d_model, seed=161)
    look_ahead = reference_look_ahead_mask(seq_len)  # (1, 1, seq_len, seq_len), True = may attend
    _compare_with_pytorch(module, reference, x, x, x, look_ahead, attn_mask=~look_ahead[0, 0])


@check("MultiHeadAttention keeps attn_weights (batch, num_heads, q_len, k_len): rows sum to 1, pads get 0")
def mha_attention_weights(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 3,
                          batch: int = 3, q_len: int = 4, k_len: int = 6) -> None:
    reference = _reference_module(d_model, num_heads, 170)
    module = _student_module(MultiHeadAttention, d_model, num_heads, reference)
    q, k, v, mask = _mha_inputs(batch, q_len, k_len, d_model, seed=171)
    _, trace = _run_traced(module, reference, q, k, v, mask)
    weights = expect_shape("self.attn_weights", getattr(module, "attn_weights", None),
                           (batch, num_heads, q_len, k_len),
                           cause="keep the given line `self.attn_weights = weights.detach()`, where "
                                 "`weights` is the second result of scaled_dot_product_attention on the "
                                 "split heads.")
    _check_masked_weights(weights, mask, "padding mask")
    with torch.no_grad():
        reference(q, k, v, mask)
    expect_close("self.attn_weights", weights, reference.attn_weights, atol=1e-7,
                 diagnose=lambda _: _diagnose_mha(reference, q, k, v, mask, trace),
                 cause="the weights of every head, from the same projections the output uses."
                       + FIX_ATTENTION_FIRST)


@check("MultiHeadAttention works as cross-attention: queries and keys of different lengths")
def mha_cross_attention(MultiHeadAttention: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                        batch: int = 2, q_len: int = 3, k_len: int = 7) -> None:
    reference = _reference_module(d_model, num_heads, 180)
    module = _student_module(MultiHeadAttention, d_model, num_heads, reference)
    q, k, v, mask = _mha_inputs(batch, q_len, k_len, d_model, seed=181)
    output, trace = _run_traced(module, reference, q, k, v, mask)
    with torch.no_grad():
        expected = reference(q, k, v, mask)
    expect_close("forward(q, k, v, mask) with q_len != k_len", output, expected, atol=1e-7,
                 suspects=_mha_suspects(reference, q, k, v, mask),
                 diagnose=lambda _: _diagnose_mha(reference, q, k, v, mask, trace),
                 cause="take each sequence length from its own input: split_heads reads seq_len from "
                       "x.shape, so Q has q_len rows and K, V have k_len rows." + FIX_ATTENTION_FIRST)
