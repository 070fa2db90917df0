"""Stage 2 checks: scaled dot-product attention, the two masks and multi-head attention.

Expected values come from the reference implementation (float64, same inputs, same weights); PyTorch's
built-ins (`F.scaled_dot_product_attention`, `nn.MultiheadAttention`) are a second yardstick. Whatever
touches the student's code is an experiment (`@on_student_side`: call their function, build and run their
module, record what it computes); the comparisons, the diagnosis and the verdict run in the check.

A wrong value is explained twice, in one message: by a reading of the values themselves (the scores
recovered from the weights, what a mask hides, where each element of the split heads comes from) and by the
differential engine (`checks.differential`), which names the student's line that first computes something
else (for forward: what each projection receives, what follows W_o, a value with an axis too many).

One requirement, one charge: the masked-attention checks accept a function whose masking is right even
when its scores are not (the student's own function on the visible keys alone is the yardstick; the
scores have checks of their own), the integer-mask check compares with the student's own bool-mask
result, and the MultiHeadAttention checks grade forward's own composition: when forward with the
student's scaled_dot_product_attention, split_heads and combine_heads differs, it runs again with the
reference's parts plugged in, and passes when that run is right.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import product
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks import differential
from transformer_course.checks.boundary import StudentError, as_exception, on_student_side, supplied
from transformer_course.checks.compare import index_ranges
from transformer_course.checks.errors import as_record, crash_lines, first_line
from transformer_course.checks.framework import (
    CheckFailed,
    Diagnosis,
    check,
    course_code,
    expect_close,
    expect_shape,
    fail,
    generator,
    parameter_names,
    randn,
    reject_builtin_modules,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.checks.predictions import expect_number, parameters_of
from transformer_course.reference import MultiHeadAttention as _ReferenceMultiHeadAttention
from transformer_course.reference import make_look_ahead_mask as _reference_look_ahead_mask
from transformer_course.reference import make_padding_mask as _reference_padding_mask
from transformer_course.reference import scaled_dot_product_attention as _reference_attention

# the parts of PyTorch this stage's grade cells meet, used once before any notebook code (runner.warm_up_torch):
# tests/test_grading_speed.py fails when a grade cell imports a module
WARM_UP: tuple[str, ...] = ("shape checks", "optimiser step")

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
    "predicted_attention_parameters",
    "predicted_scaled_score_std",
    "predicted_visible_pairs",
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
_QKV = ("Q", "K", "V", "mask")
_PLURAL = {"batch": "sentences of the batch", "head": "heads", "query": "queries", "key": "keys"}


# --- on the student's side -----------------------------------------------------------------------------------


@contextmanager
def _bool_only_explained() -> Iterator[None]:
    """A bool-only operation on a mask that may arrive as integers 0/1 gets its own message; every other error
    is explained by its kind (framework.run_check)."""
    try:
        yield
    except RuntimeError as error:
        text = str(error)
        if "only supports boolean masks" in text or "condition to be a boolean tensor" in text:
            fail(
                "your code needs a bool mask, but masks may also arrive as integers 0/1.",
                expected="the same result for a bool mask and for the integer mask mask.long()",
                got=first_line(error, 120) + crash_lines(error),
                cause="masked_fill and torch.where take only a bool mask, and `~` on an integer tensor flips "
                      "bits (1 becomes -2) instead of negating it: turn the 0/1 mask into a bool one first, by "
                      "comparing it with zero (`mask == 0`) or converting it (`~mask.bool()`).",
            )
        raise


def _clone(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


@on_student_side
def _attend(function: AttentionFunction, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
            mask: torch.Tensor | None = None) -> tuple[Any, Any]:
    """The student's attention on copies of these inputs: (output, weights)."""
    with torch.no_grad(), student_code(), _bool_only_explained():
        result = function(Q.clone(), K.clone(), V.clone(), _clone(mask))
    if not (isinstance(result, tuple) and len(result) == 2):
        fail("scaled_dot_product_attention returned the wrong thing.", expected="a pair (output, weights)",
             got=type(result).__name__, cause="keep the given `return output, weights` line.")
    return result


@on_student_side
def _attend_each(function: AttentionFunction, inputs: list[tuple[torch.Tensor, ...]]) -> list[Any] | None:
    """The student's attention, without a mask, on each (Q, K, V) of `inputs`; None when a call fails."""
    results = []
    with torch.no_grad(), student_code():
        for Q, K, V in inputs:
            try:
                result = function(Q.clone(), K.clone(), V.clone(), None)
            except Exception:  # a call this check can do without: the masked result is then compared as it is
                return None
            if not (isinstance(result, tuple) and len(result) == 2):
                return None
            results.append(result)
    return results


@on_student_side
def _call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """What the student's function returns for these arguments."""
    with torch.no_grad(), student_code():
        return function(*args, **kwargs)


@on_student_side
def _mask_on_another_device(function: Callable[..., Any], size: int) -> tuple[str, str, StudentError | None]:
    """The look-ahead mask asked for on a device that is not the CPU: a GPU where there is one, else PyTorch's
    `meta` device (shapes without values). (the device asked for, the device of the mask, the error)."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("meta")
    try:
        with torch.no_grad(), student_code():
            mask = function(size, device=device)
    except Exception as error:
        return device.type, "", as_record(error)
    return device.type, mask.device.type if isinstance(mask, torch.Tensor) else type(mask).__name__, None


@on_student_side
def _build(MultiHeadAttention: type[nn.Module], d_model: int, num_heads: int) -> nn.Module:
    """The student's module in float64 and eval mode (the global random stream left as it was)."""
    with torch.random.fork_rng(devices=[]), student_code():
        module = MultiHeadAttention(d_model, num_heads)
    reject_builtin_modules(module, "MultiHeadAttention")
    return module.double().eval()


@on_student_side
def _parameter_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(value.shape) for name, value in module.state_dict().items()}


@on_student_side
def _load(module: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Copy `values` into the module's parameters of those names."""
    state = module.state_dict()
    with torch.no_grad():
        for name, value in values.items():
            state[name].copy_(value)


@on_student_side
def _heads(module: nn.Module, method: str, x: torch.Tensor) -> Any:
    """module.split_heads(x), module.combine_heads(x), or (method "round trip") combine_heads(split_heads(x))."""
    with torch.no_grad(), student_code(), _bool_only_explained():
        if method == "round trip":
            return module.combine_heads(module.split_heads(x.clone()))
        return getattr(module, method)(x.clone())


@on_student_side
def _forward_output(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None) -> tuple[Any, Any, bool]:
    """forward with the student's own parts: (output, self.attn_weights, whether it ran without an error)."""
    try:
        with torch.no_grad(), student_code():
            output = module(q.clone(), k.clone(), v.clone(), _clone(mask))
    except Exception:  # the check runs forward again with the reference's parts, and judges that run
        return None, None, False
    return output, getattr(module, "attn_weights", None), True


@dataclass(frozen=True)
class _Sizes:
    """What the reference's split_heads and combine_heads read from `self`."""

    d_model: int
    num_heads: int
    d_k: int


@dataclass
class _Forward:
    """One call of the student's forward: its computation operation by operation (`trace`; None for a run with
    the student's own parts, which is not recorded), the output, self.attn_weights after the call, and the error
    when it crashed."""

    trace: differential.Trace | None
    output: Any
    weights: Any
    error: StudentError | None


def _split_heads_stand_in(self: _Sizes, x: torch.Tensor) -> torch.Tensor:
    """The reference split_heads' values and shape contract (a tensor that is not (batch, seq_len, d_model), or
    not contiguous, fails as it would there): (batch, seq_len, d_model) -> (batch, num_heads, seq_len, d_k).
    Plugged into the student's module where forward is graded; in grading it reaches only that experiment's
    servant (`grading.sandbox.build.experiment_parts`)."""
    batch, length, _ = x.shape
    return x.view(batch, length, self.num_heads, self.d_k).permute(0, 2, 1, 3)  # (batch, heads, length, d_k)


def _combine_heads_stand_in(self: _Sizes, x: torch.Tensor) -> torch.Tensor:
    """The reference combine_heads' values and shape contract: (batch, num_heads, seq_len, d_k) -> (batch, seq_len,
    d_model); any other number of axes fails as it would there."""
    batch, _, length, _ = x.shape
    return x.permute(0, 2, 1, 3).contiguous().view(batch, length, self.d_model)  # (batch, length, d_model)


@contextmanager
def _reference_parts(module: nn.Module, sizes: _Sizes) -> Iterator[None]:
    """Inside, the student's forward uses the reference's scaled_dot_product_attention (the name its code
    looks up) and stand-ins with the values of the reference's split_heads and combine_heads."""
    namespace = getattr(inspect.unwrap(getattr(type(module), "forward", None)), "__globals__", None)
    name = "scaled_dot_product_attention"
    original = namespace.get(name) if isinstance(namespace, dict) else None
    split, combine = _split_heads_stand_in, _combine_heads_stand_in
    supplied(_reference_attention, split, combine)

    def attention(*args: Any, **kwargs: Any) -> Any:
        with course_code():  # the check's own part: in the grading build, a stand-in on PyTorch's attention
            return _reference_attention(*args, **kwargs)

    kept = {key: module.__dict__[key] for key in ("split_heads", "combine_heads") if key in module.__dict__}
    if callable(original):
        namespace[name] = attention
    object.__setattr__(module, "split_heads", functools.partial(split, sizes))  # an instance attribute shadows
    object.__setattr__(module, "combine_heads", functools.partial(combine, sizes))  # the method
    try:
        yield
    finally:
        if callable(original):
            namespace[name] = original
        for key in ("split_heads", "combine_heads"):
            module.__dict__.pop(key, None)
        module.__dict__.update(kept)


@on_student_side
def _forward_observed(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None, sizes: _Sizes) -> _Forward:
    """forward with the reference's attention, split_heads and combine_heads plugged in, recorded operation by
    operation; a crash is kept with what was recorded before it."""
    error = None
    inputs = {"q": q.clone(), "k": k.clone(), "v": v.clone(), "mask": _clone(mask)}
    with _reference_parts(module, sizes), torch.no_grad(), student_code(), \
            differential.recording(module, inputs) as trace:
        try:
            trace.output = module(*inputs.values())
        except Exception as crash:
            error = as_record(crash)
    return _Forward(trace, trace.output, getattr(module, "attn_weights", None), error)


# --- reading values ----------------------------------------------------------------------------------------


def _same(got: Any, expected: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-5) -> bool:
    return isinstance(got, torch.Tensor) and tensors_close(got, expected, atol, rtol)


def _sums_to_one(weights: torch.Tensor, dim: int) -> bool:
    return torch.allclose(weights.sum(dim=dim), torch.ones((), dtype=weights.dtype), atol=1e-6)


def _recorded(trace: differential.Trace, key: str) -> torch.Tensor | None:
    """The value a recorded argument refers to ('input:q', 'op:3', 'leaf:W_q.weight')."""
    kind, _, rest = key.partition(":")
    if kind == "op":
        return trace.ops[int(rest)].output
    return (trace.inputs if kind == "input" else trace.leaves).get(rest)


# --- scaled dot-product attention -----------------------------------------------------------------------------


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


def _axes(tensor: torch.Tensor) -> tuple[str, ...]:
    return ("batch", "head", "query", "key") if tensor.dim() == 4 else ("batch", "query", "key")[-tensor.dim():]


def _scores(Q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    return Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))  # (..., q_len, k_len)


def _context(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> differential.Context:
    sizes = dict(zip(_axes(Q)[:-2], Q.shape[:-2], strict=True))
    sizes |= {"query": Q.size(-2), "key": K.size(-2), "d_k": Q.size(-1), "d_v": V.size(-1)}
    return differential.Context(sizes=sizes, quantities={"d_k": Q.size(-1), "q_len": Q.size(-2), "k_len": K.size(-2)})


def _divisor(divisor: float, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> str:
    """What the student divides Q K^T by, in words."""
    d_k = Q.size(-1)
    if abs(divisor - 1) < 1e-3:
        return "the scores are not divided by √d_k: divide Q K^T by math.sqrt(d_k) before the softmax."
    if abs(divisor - 1 / math.sqrt(d_k)) < 1e-3 * divisor:
        return "the scores are multiplied by √d_k instead of divided by it."
    for name, size in (("d_k", d_k), ("q_len", Q.size(-2)), ("k_len", K.size(-2)), ("d_v", V.size(-1))):
        for value, words in ((float(size), f"{name} = {size}"), (math.sqrt(size), f"√{name} = {math.sqrt(size):.4g}")):
            if abs(divisor - value) < 1e-3 * value and (name, value) != ("d_k", math.sqrt(d_k)):
                hint = ("divide by its square root, math.sqrt(d_k)" if name == "d_k" else
                        "d_k is the width of the queries and keys, the last axis: Q.size(-1)")
                return (f"the scores are divided by {words} where the paper divides by √d_k = {math.sqrt(d_k):.4g}: "
                        f"{hint}.")
    return f"the scores are divided by {divisor:.4g} where the paper divides by √d_k = {math.sqrt(d_k):.4g}."


def _read_scores(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, w: torch.Tensor, hidden: torch.Tensor
                 ) -> Diagnosis:
    """Weights whose rows sum to 1 and whose mask is right: the log-weights are the scores up to one constant per
    row; compared with Q K^T / √d_k they show a factor (and the divisor it means) or a transpose."""
    visible = ~hidden
    counts = visible.sum(dim=-1, keepdim=True).clamp_min(1)

    def centred(values: torch.Tensor) -> torch.Tensor:
        values = torch.where(visible, values, torch.zeros_like(values))
        return (values - values.sum(dim=-1, keepdim=True) / counts) * visible

    scores = _scores(Q, K)
    got, wanted = centred(w.clamp_min(1e-300).log()), centred(scores)
    factor = ((got * wanted).sum() / (wanted * wanted).sum().clamp_min(1e-300)).item()
    if abs(factor) > 1e-9 and tensors_close(got, factor * wanted, 1e-5, 1e-4):
        return Diagnosis(f"the scores before the softmax are {factor:.4g} × Q K^T / √d_k",
                         _divisor(math.sqrt(Q.size(-1)) / factor, Q, K, V))
    if w.size(-1) == w.size(-2) and tensors_close(got, centred(scores.transpose(-2, -1)), 1e-5, 1e-4):
        return Diagnosis("the scores before the softmax are transposed: row i holds the scores of key i",
                         "scores = Q @ K.transpose(-2, -1): one row per query, one column per key.")
    return Diagnosis("the scores before the softmax are not Q K^T / √d_k, nor a multiple of it",
                     "scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k): each query times each key, over their last "
                     "axis.")


def _fill_value(scores: torch.Tensor, w: torch.Tensor, hidden: torch.Tensor) -> float | None:
    """The score the hidden keys were given, read from the weights of the rows where they got some: the visible
    keys' log-weights are their scores plus one constant per row, which places the hidden ones' scores."""
    rows = ((hidden & (w > 0)).any(dim=-1) & (~hidden & (w > 0)).any(dim=-1)).unsqueeze(-1)
    log_w, visible = w.clamp_min(1e-300).log(), ~hidden & rows
    offset = (torch.where(visible, log_w - scores, 0.0).sum(dim=-1) / visible.sum(dim=-1).clamp_min(1)).unsqueeze(-1)
    if not rows.any() or not tensors_close(torch.where(visible, log_w - scores - offset, 0.0), torch.zeros_like(w),
                                           1e-5, 0.0):
        return None  # no row to read it from, or the visible scores are not the expected ones
    fills = (log_w - offset)[hidden & rows & (w > 0)]
    if (fills.max() - fills.min()).item() > 1e-4 * max(1.0, fills.abs().max().item()):
        return None
    return fills.mean().item()


def _read_masking(Q: torch.Tensor, K: torch.Tensor, w: torch.Tensor, hidden: torch.Tensor,
                  plain: torch.Tensor | None) -> Diagnosis | None:
    """What masked weights show: allowed keys that get none, hidden keys zeroed after the softmax, hidden keys that
    get weight (as without the mask, or with the score they were given). `plain`: the weights without a mask."""
    some = hidden.any(dim=-1, keepdim=True) & ~hidden.all(dim=-1, keepdim=True)  # rows with hidden and allowed keys
    if bool((w[~hidden & some] == 0).all()) and bool((w[hidden & some] > 0).all()):
        return Diagnosis("the keys the mask allows get weight 0, and the keys it hides share the weight",
                         "the mask is inverted, the keys hidden are those where the mask is True, and True (1) means "
                         "'may attend': hide the positions where mask == 0.")
    leaked = w[hidden]
    if not (leaked != 0).any():
        if _sums_to_one(w, -1) or not _same(w, (plain if plain is not None else torch.softmax(_scores(Q, K), -1))
                                            * ~hidden):
            return None
        return Diagnosis("the hidden keys get 0, but the rows of weights sum to less than 1",
                         "the allowed keys keep the weights of a softmax over every key: the mask is applied after "
                         "the softmax: zeroing weights after normalising leaves rows that do "
                         "not sum to 1; fill the scores with -1e9 before the softmax, so that it shares each row among "
                         "the allowed keys alone.")
    most = f"up to {leaked.abs().max().item():.3g}"
    if bool((w < 0).any()) or bool((w > 1 + 1e-6).any()):
        return Diagnosis(f"the weights are not probabilities: they run from {w.min().item():.3g} to "
                         f"{w.max().item():.3g}",
                         "no softmax turns the scores into weights after the masked fill: each row of weights is "
                         "the softmax of its (filled) scores, with entries between 0 and 1 that sum to 1.")
    if plain is not None and _same(w, plain):
        return Diagnosis(f"the mask changes nothing: hidden keys get weight ({most}), as without a mask",
                         "the mask is not applied: scores = scores.masked_fill(mask == 0, -1e9), before the softmax.")
    fill = _fill_value(_scores(Q, K), w, hidden)
    if fill is not None:
        fill = 0.0 if abs(fill) < 1e-6 else fill
        return Diagnosis(f"hidden keys get weight ({most})",
                         ("the hidden scores are set to 0, and e to the power 0 is 1, so those keys still get "
                          "weight" if fill == 0
                          else f"the hidden scores are set to {fill:.4g}, which is not negative enough: next to "
                               f"large scores, e to the power {fill:.4g} still counts")
                         + "; use a very negative number such as -1e9 (or float('-inf')).")
    return Diagnosis(f"hidden keys get weight ({most})",
                     "fill the hidden scores with a very negative number (-1e9 or float('-inf')) before the softmax; "
                     "True (1) means 'may attend', so hide where mask == 0.")


def diagnose_weights(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None,
                     weights: Any, unmasked: Any = None) -> Diagnosis | None:
    """How attention weights (..., q_len, k_len) depart from softmax(Q K^T / √d_k) with `mask`, read from their
    values alone, in this order: NaN, the axis they are normalised over, what the mask hides, no softmax, rows
    that do not sum to 1, the scores before the softmax. `unmasked`: the same function's weights without a mask."""
    shape = (*Q.shape[:-1], K.size(-2))
    if not isinstance(weights, torch.Tensor) or weights.shape != shape:
        return None
    w = weights.detach().to(torch.float64).cpu()
    if not torch.isfinite(w).all():
        return Diagnosis("the weights hold NaN or inf", "a row whose scores are all -inf (every key hidden) gives "
                         "NaN; fill hidden scores with a large negative number (-1e9), and check the division.")
    for dim in range(w.dim() - 1):
        if not _sums_to_one(w, -1) and w.size(dim) > 1 and _sums_to_one(w, dim):
            axis = _axes(w)[dim]
            return Diagnosis(f"the weights sum to 1 over the {axis} axis, not over the keys",
                             f"the softmax runs over the wrong axis, the {_PLURAL[axis]}: each query's weights over "
                             "the keys must sum to 1, so use dim=-1.")
    hidden = (mask == 0).expand(shape) if mask is not None else torch.zeros(shape, dtype=torch.bool)
    plain = unmasked.detach().to(torch.float64).cpu() if isinstance(unmasked, torch.Tensor) \
        and unmasked.shape == shape else None
    masking = _read_masking(Q, K, w, hidden, plain) if mask is not None else None
    if masking is not None:
        return masking
    if not _sums_to_one(w, -1):
        scores = _scores(Q, K)
        if _same(w, scores.masked_fill(hidden, -1e9)) or _same(w, scores):
            return Diagnosis("the weights are the scores themselves: no softmax was applied",
                             "`weights` must be softmax(scores, dim=-1), not the scaled scores.")
        low, high = w.sum(dim=-1).aminmax()
        sums = f"every row sums to {low:.6g}" if high - low < 1e-6 else f"their sums run from {low:.4g} to {high:.4g}"
        return Diagnosis(f"the rows of weights do not sum to 1 ({sums})", "weights = softmax(scores, dim=-1): one "
                         "softmax over the keys, with nothing done to the weights afterwards.")
    if (w[~hidden] <= 0).any() or (w[hidden] != 0).any():
        return None
    return _read_scores(Q, K, V, w, hidden)


def _diagnoses(function: AttentionFunction, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
               mask: torch.Tensor | None, weights: Any, unmasked: torch.Tensor | None = None
               ) -> tuple[Callable[[torch.Tensor], Any], Callable[[torch.Tensor], Any]]:
    """How the student's weights and output depart from the reference's: the readings of the values (the mask's
    first when there is one; for the output, the weights' when they already differ), merged with the engine's
    comparison of the two computations, recorded once when first needed."""
    expected = _reference_attention(Q, K, V, mask)

    @functools.cache
    def traces() -> tuple[differential.Trace, differential.Trace]:
        student = differential.traced(function, Q.clone(), K.clone(), V.clone(), _clone(mask), names=_QKV)
        return student, differential.traced_call(_reference_attention, Q, K, V, mask, names=_QKV)

    def engine(value: torch.Tensor, part: int) -> Any:
        return differential.explain(*traces(), value, expected[part], _context(Q, K, V), _axes(Q))

    def of_weights(value: torch.Tensor) -> Any:
        return differential.combined(diagnose_weights(Q, K, V, mask, value, unmasked), engine(value, 1))

    def of_output(value: torch.Tensor) -> Any:
        if isinstance(weights, torch.Tensor) and weights.shape == expected[1].shape \
                and not _same(weights, expected[1], 1e-7):
            return of_weights(weights)
        return engine(value, 0)

    return of_weights, of_output


def _expect_attention(function: AttentionFunction, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                      mask: torch.Tensor | None, got: tuple[Any, Any], *, cause: str,
                      unmasked: torch.Tensor | None = None) -> None:
    """The weights, then the output, compared with the reference's."""
    expected = _reference_attention(Q, K, V, mask)
    of_weights, of_output = _diagnoses(function, Q, K, V, mask, got[1], unmasked)
    expect_close("weights", got[1], expected[1], atol=1e-7, diagnose=of_weights, cause=cause)
    expect_close("output", got[0], expected[0], atol=1e-7, diagnose=of_output, cause="output = weights @ V.")


@check("scaled_dot_product_attention returns output (..., q_len, d_v) and weights (..., q_len, k_len)")
def sdpa_shapes(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                q_len: int = 4, k_len: int = 6, d_k: int = 5, d_v: int = 7) -> None:
    """With a heads axis (4-D inputs) and, unless heads=0 already asks for it, without one (3-D): a crash on
    3-D inputs is explained by its kind (an axis out of range: count axes from the end)."""
    for heads_here in dict.fromkeys((heads, 0)):
        Q, K, V = _qkv(batch, heads_here, q_len, k_len, d_k, d_v, seed=10)
        leading = (batch, heads_here) if heads_here else (batch,)
        output, weights = _attend(scaled_dot_product_attention, Q, K, V)
        expect_shape("weights", weights, (*leading, q_len, k_len),
                     cause="scores are Q @ K.transpose(-2, -1): one row per query, one column per key.")
        expect_shape("output", output, (*leading, q_len, d_v),
                     cause="output is weights @ V: one row per query, as wide as the values (d_v).")


@check("scaled_dot_product_attention gives softmax(Q K^T / sqrt(d_k)) V (no mask)")
def sdpa_values(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                q_len: int = 4, k_len: int = 6, d_k: int = 5, d_v: int = 7) -> None:
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_v, seed=20)
    got = _attend(scaled_dot_product_attention, Q, K, V)
    _expect_attention(scaled_dot_product_attention, Q, K, V, None, got,
                      cause="weights = softmax(Q @ K.transpose(-2, -1) / sqrt(d_k), dim=-1).")


def _by_removal(function: AttentionFunction, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """What masking must give by the student's own attention: each query attends, without a mask, to the keys
    it may see and to no other. None when the student's function cannot be run that way."""
    leading, q_len = Q.shape[:-2], Q.size(-2)
    visible = (mask != 0).expand(*leading, q_len, K.size(-2))
    places, inputs = [], []
    for index in product(*(range(size) for size in leading)):
        for query in range(q_len):
            keys = visible[index][query].nonzero().flatten()
            ones = (1,) * len(leading)
            inputs.append((Q[index][query:query + 1].reshape(*ones, 1, -1),
                           K[index][keys].reshape(*ones, len(keys), -1), V[index][keys].reshape(*ones, len(keys), -1)))
            places.append((index, query, keys))
    results = _attend_each(function, inputs)
    if results is None:
        return None
    output = torch.zeros(*leading, q_len, V.size(-1), dtype=torch.float64)
    weights = torch.zeros(*leading, q_len, K.size(-2), dtype=torch.float64)
    for (index, query, keys), (row_output, row_weights) in zip(places, results, strict=True):
        if not (isinstance(row_output, torch.Tensor) and isinstance(row_weights, torch.Tensor)) \
                or row_output.numel() != V.size(-1) or row_weights.numel() != len(keys):
            return None
        output[index][query] = row_output.reshape(-1).to(torch.float64)
        weights[index][query][keys] = row_weights.reshape(-1).to(torch.float64)
    return output, weights


@check("scaled_dot_product_attention hides the keys where the mask is False")
def sdpa_masked_values(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                       q_len: int = 5, k_len: int = 6, d_k: int = 4, d_v: int = 7) -> None:
    """Masking is graded on its own: a result equal to the student's attention over the allowed keys alone
    passes, whatever the scores (the unmasked checks grade those)."""
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_v, seed=30)
    mask = _random_mask(batch, q_len, k_len, seed=31, heads_axis=heads > 0)
    expected = _reference_attention(Q, K, V, mask)
    output, weights = _attend(scaled_dot_product_attention, Q, K, V, mask)
    if _same(output, expected[0], 1e-7) and _same(weights, expected[1], 1e-7):
        return
    own = _by_removal(scaled_dot_product_attention, Q, K, V, mask)
    if own is not None and _same(output, own[0], 1e-7) and _same(weights, own[1], 1e-7):
        return
    unmasked = _attend(scaled_dot_product_attention, Q, K, V)[1]
    _expect_attention(scaled_dot_product_attention, Q, K, V, mask, (output, weights), unmasked=unmasked,
                      cause="before the softmax, fill the scores with -1e9 where mask == 0; the mask broadcasts "
                            "against the scores (batch, heads, q_len, k_len).")


@check("scaled_dot_product_attention agrees with torch.nn.functional.scaled_dot_product_attention")
def sdpa_matches_pytorch(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                         q_len: int = 5, k_len: int = 7, d_k: int = 8, d_v: int = 6) -> None:
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_v, seed=40)
    mask = _random_mask(batch, q_len, k_len, seed=41, heads_axis=heads > 0)
    for name, used_mask in (("without a mask", None), ("with a bool mask", mask)):
        with torch.no_grad():  # the built-in is the yardstick
            expected = F.scaled_dot_product_attention(Q, K, V, attn_mask=used_mask)  # True = may attend
        output, weights = _attend(scaled_dot_product_attention, Q, K, V, used_mask)
        expect_close(f"output {name}", output, expected, atol=1e-5, rtol=1e-5,
                     diagnose=_diagnoses(scaled_dot_product_attention, Q, K, V, used_mask, weights)[1],
                     cause="PyTorch's built-in computes softmax(Q K^T / sqrt(d_k)) V with the same mask "
                           "convention (True = may attend).")


@check("masked keys get exactly zero weight and every row of weights sums to 1")
def sdpa_masked_keys_get_zero(scaled_dot_product_attention: AttentionFunction, batch: int = 3, heads: int = 2,
                              q_len: int = 6, k_len: int = 6, d_k: int = 4) -> None:
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_k, seed=50)
    lengths = torch.tensor([k_len, k_len - 2, 1] + [k_len] * (batch - 3))[:batch]
    padding = (torch.arange(k_len) < lengths[:, None]).view(batch, 1, 1, k_len)  # (batch, 1, 1, k_len)
    look_ahead = torch.ones(q_len, k_len, dtype=torch.bool).tril().view(1, 1, q_len, k_len)
    Q_scaled = Q * 10  # large scores: a weak fill value such as -100 would still leak
    for which, mask in (("padding mask", padding), ("look-ahead mask", look_ahead),
                        ("combined mask", padding & look_ahead)):
        _, weights = _attend(scaled_dot_product_attention, Q_scaled, K, V, mask)
        w = expect_shape("weights", weights, (batch, heads, q_len, k_len),
                         cause="weights keep one row per query and one column per key.").to(torch.float64)
        leaked = w[(mask == 0).expand_as(w)]
        if (leaked != 0).any() or not _sums_to_one(w, -1):
            reading = diagnose_weights(Q_scaled, K, V, mask, w)
            fail(f"with the {which}, " + ("hidden keys still get attention weight." if (leaked != 0).any() else
                                          "the weights of a query do not sum to 1."),
                 expected="exactly 0 weight wherever mask == 0, and every row of weights (over the keys) summing to 1",
                 got=reading.where if reading else f"weights up to {leaked.abs().max().item():.3g} on hidden keys",
                 cause=reading.cause if reading else "fill the hidden scores with a very negative number (-1e9 or "
                 "float('-inf')) before the softmax, so that exp() of them is exactly 0 even next to large scores.")


@check("scaled_dot_product_attention accepts an integer 0/1 mask as well as a bool one")
def sdpa_integer_mask(scaled_dot_product_attention: AttentionFunction, batch: int = 2, heads: int = 3,
                      q_len: int = 4, k_len: int = 5, d_k: int = 6) -> None:
    """The property is that the mask's dtype changes nothing: the integer masks' results are compared with the
    student's own bool-mask result (the reference's when that one fails)."""
    Q, K, V = _qkv(batch, heads, q_len, k_len, d_k, d_k, seed=60)
    mask = _random_mask(batch, q_len, k_len, seed=61, heads_axis=heads > 0)
    try:
        with_bool = _attend(scaled_dot_product_attention, Q, K, V, mask)
    except CheckFailed:
        raise
    except Exception:  # noqa: BLE001  (the bool mask has checks of its own; compare with the reference then)
        with_bool = None
    if not (isinstance(with_bool, tuple) and all(isinstance(part, torch.Tensor) for part in with_bool)
            and torch.isfinite(with_bool[1]).all()):
        with_bool = _reference_attention(Q, K, V, mask)
    for dtype in (torch.long, torch.int32):
        integer_mask = mask.to(dtype)  # 1 = may attend, 0 = hidden
        output, weights = _attend(scaled_dot_product_attention, Q, K, V, integer_mask)

        def diagnose(got: torch.Tensor, w: Any = weights) -> Diagnosis | None:
            if isinstance(w, torch.Tensor) and w.shape == with_bool[1].shape:
                zero = w == 0
                if bool(zero.any()) and torch.equal(zero, (mask != 0).expand_as(w)):
                    return Diagnosis("with the integer mask the keys where mask == 1 get weight 0",
                                     "an integer 1 is treated as 'hidden': hide where mask == 0, so 1 means "
                                     "'may attend' (`~mask` on integers flips bits, 1 -> -2).")
            return None

        expect_close(f"weights with a {dtype} 0/1 mask", weights, with_bool[1], atol=1e-9, diagnose=diagnose,
                     cause="hide the keys where mask == 0; the result must not depend on the mask's dtype.")
        expect_close(f"output with a {dtype} 0/1 mask", output, with_bool[0], atol=1e-9,
                     cause="hide the keys where mask == 0; the result must not depend on the mask's dtype.")


# --- masks ---------------------------------------------------------------------------------------------------


def _token_batch(batch: int, seq_len: int, pad_idx: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (batch, seq_len) padded at the end, id 0 also used as a real token; and the real lengths."""
    tokens = torch.randint(0, 9, (batch, seq_len), generator=generator(seed))
    tokens[tokens == pad_idx] = pad_idx + 1  # only the padding below uses pad_idx
    tokens[:, 0] = 0 if pad_idx != 0 else 2  # a real token with id 0 (unless 0 is the padding id)
    lengths = torch.tensor([seq_len, max(1, seq_len - 3), max(1, seq_len - 1), 1] * batch)[:batch]
    positions = torch.arange(seq_len)
    tokens[positions >= lengths[:, None]] = pad_idx
    return tokens, lengths


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


def _read_padding(mask: torch.Tensor, tokens: torch.Tensor, pad_idx: int) -> Diagnosis | None:
    """Which tokens the student's padding mask hides, told by the token id they share."""
    shown = (mask != 0).reshape(tokens.shape)
    for value in [pad_idx, *sorted((set(tokens.unique().tolist()) | {0, 1}) - {pad_idx})]:
        for hides, opposite in ((tokens != value, False), (tokens == value, True)):
            if not torch.equal(shown, hides):
                continue
            if value == pad_idx and opposite:
                return Diagnosis("True at the padding and False at the real tokens",
                                 "the mask is inverted: it must be True where the token is real "
                                 "(token_ids != pad_idx).")
            if value != pad_idx:
                return Diagnosis(f"the mask {'keeps only' if opposite else 'hides'} the tokens with id {value}, not "
                                 f"the padding (id {pad_idx})",
                                 f"the comparison uses {value} instead of pad_idx: compare with the argument pad_idx, "
                                 "(token_ids != pad_idx)." + (" It is also inverted: True marks the real tokens."
                                                              if opposite else ""))
    return None


@check("make_padding_mask returns shape (batch, 1, 1, seq_len)")
def padding_mask_shape(make_padding_mask: Callable[..., Any], batch: int = 3, seq_len: int = 7,
                       pad_idx: int = 1) -> None:
    tokens, _ = _token_batch(batch, seq_len, pad_idx, seed=70)
    mask = _call(make_padding_mask, tokens, pad_idx)
    if isinstance(mask, torch.Tensor) and tuple(mask.shape) == (batch, 1, seq_len, 1) and seq_len > 1:
        fail("padding mask has the wrong shape.", expected=(batch, 1, 1, seq_len), got=tuple(mask.shape),
             cause="this mask hides padded queries (rows of the scores) instead of padded keys (columns): its seq_len "
                   "lies on the query axis, so it broadcasts over the keys.",
             idea="in (batch, 1, 1, seq_len) seq_len lies along the key axis: the mask hides the padded keys' "
                  "columns and broadcasts over the heads and the queries.",
             code="(token_ids != pad_idx).unsqueeze(1).unsqueeze(2)")
    expect_shape("padding mask", mask, (batch, 1, 1, seq_len),
                 cause="add a heads axis and a query axis: (token_ids != pad_idx).unsqueeze(1).unsqueeze(2), "
                       "so the mask broadcasts against scores of shape (batch, heads, q_len, k_len).")


@check("make_padding_mask is True at real tokens and False at padding")
def padding_mask_values(make_padding_mask: Callable[..., Any], batch: int = 4, seq_len: int = 8,
                        pad_idx: int = 1) -> None:
    tokens, _ = _token_batch(batch, seq_len, pad_idx, seed=80)
    mask = _call(make_padding_mask, tokens, pad_idx)
    expected = _reference_padding_mask(tokens, pad_idx)
    expect_shape("padding mask", mask, tuple(expected.shape), cause="the mask has shape (batch, 1, 1, seq_len).")
    _expect_mask_dtype("padding mask", mask,
                       cause="return the comparison itself (token_ids != pad_idx), a bool tensor; the decoder's mask "
                             "(stage 4) keeps a key where two bool masks both allow it, a logic floats do not have.")
    expect_close("padding mask", mask.double(), expected.double(), atol=0.0, rtol=0.0,
                 diagnose=lambda got: _read_padding(got, tokens, pad_idx), axes=("batch", "head", "query", "key"),
                 cause="True (may attend) for real tokens, False for padding: (token_ids != pad_idx).")


def _read_triangle(mask: torch.Tensor, size: int) -> Diagnosis | None:
    """The look-ahead mask's True region as a triangle: which side of which diagonal it keeps. The check is a
    bug hunt's: the message's first line says only where the values differ, and this reading is the cause
    (folded in a notebook), since it is the bug's name in other words."""
    read = _triangle(mask, size)
    if read is None:
        return None
    expected = _reference_look_ahead_mask(size).reshape(size, size)
    differ = int(((mask != 0).reshape(size, size) != expected).sum())
    return Diagnosis(f"{differ} of its {size} × {size} entries differ", f"{read.where}; {read.cause}")


def _triangle(mask: torch.Tensor, size: int) -> Diagnosis | None:
    shown = (mask != 0).reshape(size, size)
    rows, columns = torch.arange(size).unsqueeze(1), torch.arange(size).unsqueeze(0)
    if bool(shown.all()) or not shown.any():
        return Diagnosis(f"the mask is {'True' if shown.any() else 'False'} everywhere",
                         "row i (the query) is True in columns 0..i and False after: "
                         "torch.ones(size, size, dtype=torch.bool).tril().")
    for offset in range(-size + 1, size):
        if torch.equal(shown, columns - rows <= offset) and offset != 0:
            return Diagnosis(f"row i is True in columns 0..i{offset:+d}" + (": the diagonal is hidden, so no position "
                                                                             "sees itself" if offset < 0 else ""),
                             "a position may attend to itself and to the positions before it: keep the diagonal, "
                             "tril() with diagonal=0" + (" (not tril(-1))." if offset == -1 else "."))
        if torch.equal(shown, columns - rows >= offset):
            if offset >= 1:
                return Diagnosis(f"row i is True in columns i{offset:+d}..size-1 (the future) and False on the past",
                                 "the mask is inverted: True marks what a position may see, the positions before it "
                                 "and itself (the lower triangle); the upper triangle is what it must not see.")
            return Diagnosis(f"row i (the query at position i) is True in columns i{offset:+d}..size-1 and False "
                             "before: every position may read itself and the positions after it, none before it"
                             .replace("+0", ""),
                             "the mask is transposed: row i is the query, so row i may see columns 0..i, the lower "
                             "triangle (tril), not the upper one (triu).")
    return None


@check("make_look_ahead_mask returns shape (1, 1, size, size)")
def look_ahead_mask_shape(make_look_ahead_mask: Callable[..., Any], size: int = 6) -> None:
    mask = _call(make_look_ahead_mask, size)
    expect_shape("look-ahead mask", mask, (1, 1, size, size),
                 cause="the mask has no batch and heads axes: it must broadcast over the scores (batch, heads, "
                       "q_len, k_len), so it needs two leading axes of size 1 (.unsqueeze(0) twice) in front of the "
                       "(size, size) table.")


@check("make_look_ahead_mask lets position i see positions 0..i (diagonal included), on the given device")
def look_ahead_mask_values(make_look_ahead_mask: Callable[..., Any], size: int = 6) -> None:
    mask = _call(make_look_ahead_mask, size, device="cpu")
    expected = _reference_look_ahead_mask(size)
    expect_shape("look-ahead mask", mask, tuple(expected.shape), cause="the mask has shape (1, 1, size, size).")
    _expect_mask_dtype("look-ahead mask", mask,
                       cause="create it with dtype=torch.bool (for example torch.ones(size, size, "
                             "dtype=torch.bool).tril()); the decoder's mask (stage 4) keeps a key where "
                             "it and the padding mask both allow it, a logic floats do not have.")
    expect_close("look-ahead mask", mask.double(), expected.double(), atol=0.0, rtol=0.0,
                 diagnose=lambda got: _read_triangle(got, size), axes=("batch", "head", "query", "key"),
                 cause="row i (the query) is True in columns 0..i: torch.ones(size, size, dtype=torch.bool).tril().")
    asked, made, error = _mask_on_another_device(make_look_ahead_mask, size)
    if error is not None and asked == "meta" and "meta" in error.message.lower():
        return  # an operation without a `meta` version ran on the device asked for: the device is used
    if error is not None:
        raise as_exception(error, CheckFailed)
    if made != asked:
        fail("the mask is not made on the device it is asked for.",
             expected=f"make_look_ahead_mask(size, device={asked!r}) returns a mask on that device"
                      + (" (PyTorch's `meta` device holds shapes without values; it stands in for a GPU here)"
                         if asked == "meta" else ""),
             got=f"a mask on the {made} device",
             cause="create the mask directly on `device`: torch.ones(size, size, dtype=torch.bool, device=device); "
                   "a mask made on the CPU cannot be combined with the model's tensors on a GPU.")


# --- multi-head attention ------------------------------------------------------------------------------------

_ROLES = ("W_q", "W_k", "W_v", "W_o")


def _reference_module(d_model: int, num_heads: int, seed: int) -> nn.Module:
    """The reference MultiHeadAttention in float64 with distinct weights drawn from a private generator."""
    with torch.random.fork_rng(devices=[]):
        module = _ReferenceMultiHeadAttention(d_model, num_heads).double().eval()
    with torch.no_grad():
        for index, (_, parameter) in enumerate(sorted(module.named_parameters())):
            parameter.copy_(randn(*parameter.shape, seed=seed + index) / math.sqrt(parameter.shape[-1]))
    return module


def _sizes(reference: nn.Module) -> _Sizes:
    return _Sizes(reference.d_model, reference.num_heads, reference.d_k)


def _roles(module: nn.Module, reference: nn.Module) -> dict[str, str] | None:
    """Which of the student's linear layers projects q, k and v, and which comes last (W_o), read from one
    forward pass with distinct q, k, v; None when that is not clear."""
    d_model = reference.d_model
    q, k, v = (randn(2, length, d_model, seed=seed) for seed, length in ((201, 3), (202, 5), (203, 5)))
    observed = _forward_observed(module, q, k, v, None, _sizes(reference))
    if observed.error is not None or observed.trace is None:
        return None
    trace = observed.trace
    linear = [op for op in trace.ops if op.name == "linear" and op.scope and op.sources]
    roles: dict[str, str] = {}
    for role, given in (("W_q", q), ("W_k", k), ("W_v", v)):
        users = {op.scope for op in linear if _same(_recorded(trace, op.sources[0]), given)}
        if len(users) != 1:
            return None
        roles[role] = users.pop()
    rest = {op.scope for op in linear} - set(roles.values())
    if len(rest) != 1 or len(set(roles.values())) != 3:
        return None
    roles["W_o"] = rest.pop()
    return roles


def _prepared(MultiHeadAttention: type[nn.Module], reference: nn.Module, *, required: bool = True) -> nn.Module:
    """The student's module holding the reference's weights, copied by parameter name, or, for a module whose
    four linear layers have other names, by what each layer does; with `required=False` a module whose layers
    cannot be matched keeps its own weights."""
    module = _build(MultiHeadAttention, reference.d_model, reference.num_heads)
    shapes = _parameter_shapes(module)
    state = reference.state_dict()
    names = {key: key for key in state} if set(shapes) == set(state) else None
    if names is None:
        roles = _roles(module, reference)
        mapping = {f"{roles[role]}.{leaf}": f"{role}.{leaf}" for role in _ROLES for leaf in ("weight", "bias")} \
            if roles is not None else {}
        names = mapping if set(mapping) == set(shapes) else None
    if names is None:
        if not required:
            return module
        missing = [key for key in state if key not in shapes]
        extra = [key for key in shapes if key not in state]
        fail("MultiHeadAttention: this check copies the reference weights into your module by parameter name, and "
             "your module's names differ.", expected=f"the parameters {parameter_names(list(state))}",
             got="; ".join(part for part in (f"missing {parameter_names(missing)}" if missing else "",
                                             f"not expected {parameter_names(extra)}" if extra else "") if part),
             cause="keep the given `__init__` and its attribute names (other names work only when four linear layers "
                   "can be told apart by what forward gives them): only the checks that compare values with the same "
                   "weights need them.")
    for mine, theirs in names.items():
        if shapes[mine] != tuple(state[theirs].shape):
            fail(f"MultiHeadAttention: the parameter `{mine}` has another shape than the reference's.",
                 expected=tuple(state[theirs].shape), got=shapes[mine],
                 cause="keep the given `__init__`: build each layer with the sizes it is given.")
    _load(module, {mine: state[theirs] for mine, theirs in names.items()})
    return module


def _mha_inputs(batch: int, q_len: int, k_len: int, d_model: int, seed: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct q, k, v and a padding mask (batch, 1, 1, k_len) hiding the tail of some key sequences."""
    q = randn(batch, q_len, d_model, seed=seed)
    k = randn(batch, k_len, d_model, seed=seed + 1)
    v = randn(batch, k_len, d_model, seed=seed + 2)
    lengths = torch.tensor([k_len, max(1, k_len - 2), max(1, k_len - 3)] * batch)[:batch]
    mask = (torch.arange(k_len) < lengths[:, None]).view(batch, 1, 1, k_len)
    return q, k, v, mask


class _Case:
    """One check of forward: the reference MultiHeadAttention (float64, distinct weights drawn with `seed`), the
    student's module holding the same weights (see `_prepared`), and the inputs: distinct q, k, v and a padding
    mask drawn with seed + 1, unless `inputs` gives them."""

    def __init__(self, MultiHeadAttention: type[nn.Module], d_model: int, num_heads: int, batch: int, q_len: int,
                 k_len: int, seed: int, *, inputs: tuple[torch.Tensor, ...] | None = None,
                 required: bool = True) -> None:
        self.reference = _reference_module(d_model, num_heads, seed)
        self.module = _prepared(MultiHeadAttention, self.reference, required=required)
        self.q, self.k, self.v, self.mask = inputs or _mha_inputs(batch, q_len, k_len, d_model, seed=seed + 1)

    def expected(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference's output and its self.attn_weights."""
        with torch.no_grad():
            output = self.reference(self.q, self.k, self.v, self.mask)
        return output, self.reference.attn_weights

    def run(self, accept: Callable[[Any, Any], bool]) -> _Forward:
        """forward with the student's own parts; when `accept` rejects that, again with the reference's attention,
        split_heads and combine_heads (their mistakes cost the points of their own checks, not forward's). A
        crash there is explained by the first step that departed before it when one did (a value with an axis
        too many, say), else by the error's kind (raised again as the student's error)."""
        output, weights, ran = _forward_output(self.module, self.q, self.k, self.v, self.mask)
        if ran and accept(output, weights):
            return _Forward(None, output, weights, None)
        observed = _forward_observed(self.module, self.q, self.k, self.v, self.mask, _sizes(self.reference))
        if observed.error is not None:
            error = as_exception(observed.error, CheckFailed)
            if observed.error.stub or isinstance(error, CheckFailed):
                raise error
            reading = differential.before_crash(observed.trace, *self.recorded())
            if reading is None:
                raise error
            fail("forward crashed.", expected="forward(q, k, v, mask) -> (batch, q_len, d_model)",
                 got=f"{observed.error.type_name}: {first_line(error, 160)}" + crash_lines(error),
                 cause=reading.cause)
        return observed

    def recorded(self) -> tuple[differential.Trace, differential.Context]:
        """The reference's forward recorded operation by operation, and the sizes, factors and words for it."""
        recorded = differential.traced_call(self.reference, self.q, self.k, self.v, self.mask,
                                            names=("q", "k", "v", "mask"))
        sizes = {"batch": self.q.size(0), "head": self.reference.num_heads, "query": self.q.size(1),
                 "key": self.k.size(1), "d_k": self.reference.d_k, "d_model": self.reference.d_model}
        said = {"output": "the heads that scaled_dot_product_attention returns", "weights": "the attention weights"}
        words = {f"op:{op.index}": said[op.variable] for op in recorded.ops
                 if op.line is not None and op.line.name == "scaled_dot_product_attention" and op.variable in said}
        quantities = {"d_k": self.reference.d_k, "d_model": self.reference.d_model}
        return recorded, differential.Context(sizes=sizes, quantities=quantities, words=words)

    def diagnosis(self, run: _Forward, expected: torch.Tensor, weights: bool = False
                  ) -> Callable[[torch.Tensor], Diagnosis | None] | None:
        """The engine's comparison of the plugged-in run with the reference's forward, for the output (or, with
        `weights`, for self.attn_weights)."""
        if run.trace is None:
            return None

        def diagnose(got: torch.Tensor) -> Diagnosis | None:
            recorded, context = self.recorded()
            if weights:
                recorded.output = self.reference.attn_weights
            axes = ("batch", "head", "query", "key") if weights else ("batch", "query", "feature")
            return differential.explain(run.trace, recorded, got, expected, context, axes)

        return diagnose

    def expect(self, expected: torch.Tensor, *, name: str, cause: str, atol: float = 1e-7, rtol: float = 1e-5
               ) -> None:
        """forward's output compared with `expected`."""
        run = self.run(lambda output, _: _same(output, expected, atol, rtol))
        expect_close(name, run.output, expected, atol=atol, rtol=rtol, diagnose=self.diagnosis(run, expected),
                     cause=cause)


# --- split_heads and combine_heads: where each value goes ------------------------------------------------------


def _origins(got: torch.Tensor, source: torch.Tensor) -> torch.Tensor | None:
    """For each element of got, the flat index of the element of `source` (distinct values) it holds; None when
    got holds values that are not in source."""
    values, order = source.detach().to(torch.float64).cpu().reshape(-1).sort()
    wanted = got.detach().to(torch.float64).cpu().reshape(-1)
    place = torch.searchsorted(values, wanted).clamp(max=values.numel() - 1)
    if not torch.equal(values[place], wanted):
        return None
    return order[place].reshape(got.shape)


def _read_split(got: torch.Tensor, x: torch.Tensor, num_heads: int) -> Diagnosis | None:
    """Which token and which features of x each place of the split heads (batch, heads, seq_len, d_k) holds."""
    batch, seq_len, d_model = x.shape
    d_k = d_model // num_heads
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (batch, num_heads, seq_len, d_k):
        return None
    origins = _origins(got, x)
    if origins is None:
        return None
    sentence, token, feature = origins // (seq_len * d_model), origins // d_model % seq_len, origins % d_model
    head = torch.arange(num_heads).view(1, -1, 1, 1)
    position = torch.arange(seq_len).view(1, 1, -1, 1)
    column = torch.arange(d_k).view(1, 1, 1, -1)
    if not torch.equal(sentence, torch.arange(batch).view(-1, 1, 1, 1).expand_as(sentence)):
        return Diagnosis("a sentence's heads hold values of another sentence of the batch",
                         "keep the batch axis first: view as (batch, seq_len, num_heads, d_k), then transpose(1, 2).")
    if not torch.equal(token, position.expand_as(token)):
        b, h, p, _ = (token != position).nonzero()[0].tolist()
        return Diagnosis(f"head {h} at position {p} holds features {index_ranges(feature[b, h, p].tolist())} of token "
                         f"{index_ranges(token[b, h, p].tolist())}: the tokens are mixed inside a head",
                         "viewed straight to (batch, num_heads, seq_len, d_k) without a transpose, the memory is read "
                         "in the wrong order and pieces of one token pose as other positions: view as (batch, "
                         "seq_len, num_heads, d_k), then transpose(1, 2).")
    if torch.equal(feature, (column * num_heads + head).expand_as(feature)):
        return Diagnosis("head h holds features h, h + num_heads, h + 2·num_heads, ... of each token",
                         "each head takes every num_heads-th feature instead of a block of d_k neighbouring "
                         "features: view as (batch, seq_len, num_heads, d_k), the heads before d_k.")
    wrong = (feature != head * d_k + column).any(dim=(0, 2, 3)).nonzero().flatten().tolist()
    h = wrong[0]
    return Diagnosis(f"head {h} holds features {index_ranges(feature[0, h, 0].tolist())} of each token instead of "
                     f"{h * d_k}–{(h + 1) * d_k - 1}",
                     "head h holds the d_k features h·d_k ... (h+1)·d_k − 1 of every token: view as (batch, seq_len, "
                     "num_heads, d_k), then transpose(1, 2).")


def _read_combine(got: torch.Tensor, heads: torch.Tensor) -> Diagnosis | None:
    """Which head, position and feature each place of the combined (batch, seq_len, d_model) tensor holds."""
    batch, num_heads, seq_len, d_k = heads.shape
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != (batch, seq_len, num_heads * d_k):
        return None
    origins = _origins(got, heads)
    if origins is None:
        return None
    head, position = origins // (seq_len * d_k) % num_heads, origins // d_k % seq_len
    within = origins % d_k
    place = torch.arange(seq_len).view(1, -1, 1)
    feature = torch.arange(num_heads * d_k).view(1, 1, -1)
    if not torch.equal(position, place.expand_as(position)):
        b, p, f = (position != place).nonzero()[0].tolist()
        return Diagnosis(f"position {p} holds values of position {position[b, p, f].item()} (head "
                         f"{head[b, p, f].item()}): the positions are mixed",
                         "combine_heads regroups the numbers into (batch, seq_len, d_model) (a view or a reshape) "
                         "without moving the heads' axis back behind the positions first: transpose(1, 2) first, to "
                         "(batch, seq_len, num_heads, d_k), then view as (batch, seq_len, d_model).")
    if torch.equal(head, (feature % num_heads).expand_as(head)) and torch.equal(within, (feature // num_heads)
                                                                               .expand_as(within)):
        return Diagnosis("feature f holds head f mod num_heads: the heads are interleaved feature by feature",
                         "after transpose(1, 2) the tensor is (batch, seq_len, num_heads, d_k); view it to (batch, "
                         "seq_len, d_model) directly, so each head's d_k features stay together.")
    return Diagnosis("the features of each position hold the heads in another order",
                     "features h·d_k ... (h+1)·d_k − 1 of a position are head h's: transpose(1, 2), then view as "
                     "(batch, seq_len, d_model).")


def _read_round_trip(got: torch.Tensor, x: torch.Tensor) -> Diagnosis | None:
    """Where each value of combine_heads(split_heads(x)) comes from in x."""
    origins = _origins(got, x) if isinstance(got, torch.Tensor) and got.shape == x.shape else None
    if origins is None:
        return None
    token = origins // x.size(2) % x.size(1)
    mixed = (token != torch.arange(x.size(1)).view(1, -1, 1)).nonzero()
    where = (f"position {mixed[0, 1].item()} holds features of token {token[tuple(mixed[0].tolist())].item()}: the "
             "round trip mixes the tokens" if len(mixed) else "each token's features come back in another order")
    return Diagnosis(where, "combine_heads must undo split_heads step by step in reverse order: transpose(1, 2), "
                            "then view to (batch, seq_len, d_model).")


def _heads_diagnosis(module: nn.Module, reference: nn.Module, method: str, x: torch.Tensor, expected: torch.Tensor,
                     reading: Callable[[torch.Tensor], Diagnosis | None]) -> Callable[[torch.Tensor], Any]:
    def diagnose(got: torch.Tensor) -> Any:
        student = differential.traced(module, x.clone(), method=method, names=("x",))
        recorded = differential.traced_call(reference, x, method=method, names=("x",))
        sizes = {"batch": x.size(0), "head": reference.num_heads, "d_k": reference.d_k, "d_model": reference.d_model}
        context = differential.Context(sizes=sizes, quantities={"d_k": reference.d_k, "d_model": reference.d_model})
        return differential.combined(reading(got), differential.explain(student, recorded, got, expected, context))

    return diagnose


@check("split_heads turns (batch, seq_len, d_model) into (batch, num_heads, seq_len, d_k)")
def split_heads_shape(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 3,
                      batch: int = 2, seq_len: int = 5) -> None:
    module = _build(MultiHeadAttention, d_model, num_heads)  # no weights: any layer names pass
    split = _heads(module, "split_heads", randn(batch, seq_len, d_model, seed=91))
    shape = tuple(split.shape) if isinstance(split, torch.Tensor) else ()
    cause = ("the heads axis must come before the positions, (batch, num_heads, seq_len, d_k): view as (batch, "
             "seq_len, num_heads, d_k), then transpose(1, 2) to bring the heads forward.")
    if len(shape) == 3 and d_model in shape:
        cause = (f"split_heads returns {len(shape)} axes with d_model = {d_model} still whole: the view to (batch, "
                 "seq_len, num_heads, d_k) that cuts each token's features into heads is missing; " + cause)
    expect_shape("split_heads(x)", split, (batch, num_heads, seq_len, d_model // num_heads), cause=cause)


@check("split_heads gives head h the features h*d_k ... (h+1)*d_k - 1 of every token")
def split_heads_values(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 3,
                       batch: int = 2, seq_len: int = 5) -> None:
    reference = _reference_module(d_model, num_heads, 100)
    module = _build(MultiHeadAttention, d_model, num_heads)
    x = randn(batch, seq_len, d_model, seed=101)
    expected = reference.split_heads(x)
    expect_close("split_heads(x)", _heads(module, "split_heads", x), expected, atol=0.0, rtol=0.0,
                 axes=("batch", "head", "position", "feature"),
                 diagnose=_heads_diagnosis(module, reference, "split_heads", x, expected,
                                           lambda got: _read_split(got, x, num_heads)),
                 cause="view as (batch, seq_len, num_heads, d_k), then transpose(1, 2).")


@check("combine_heads turns (batch, num_heads, seq_len, d_k) back into (batch, seq_len, d_model)")
def combine_heads_values(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 3,
                         batch: int = 2, seq_len: int = 5) -> None:
    reference = _reference_module(d_model, num_heads, 110)
    module = _build(MultiHeadAttention, d_model, num_heads)
    heads = randn(batch, num_heads, seq_len, d_model // num_heads, seed=111)
    expected = reference.combine_heads(heads)
    expect_close("combine_heads(x)", _heads(module, "combine_heads", heads), expected, atol=0.0, rtol=0.0,
                 axes=("batch", "position", "feature"),
                 diagnose=_heads_diagnosis(module, reference, "combine_heads", heads, expected,
                                           lambda got: _read_combine(got, heads)),
                 cause="transpose(1, 2) to (batch, seq_len, num_heads, d_k), .contiguous(), then view(batch, seq_len, "
                       "d_model).")


@check("combine_heads(split_heads(x)) gives x back")
def combine_heads_inverts_split(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 4,
                                batch: int = 2, seq_len: int = 5) -> None:
    module = _build(MultiHeadAttention, d_model, num_heads)
    x = randn(batch, seq_len, d_model, seed=121)
    split = _heads(module, "split_heads", x)
    if isinstance(split, torch.Tensor) and split.dim() != 4:  # undoing nothing is no inverse
        fail("split_heads(x) does not split x into heads, so there is nothing for combine_heads to undo.",
             expected="a tensor with 4 axes, (batch, num_heads, seq_len, d_k)", got=f"shape {tuple(split.shape)}",
             cause="split_heads views the last axis as (num_heads, d_k) and moves the heads axis forward; "
                   "combine_heads then undoes both steps.")
    expect_close("combine_heads(split_heads(x))", _heads(module, "round trip", x), x, atol=0.0, rtol=0.0,
                 axes=("batch", "position", "feature"), diagnose=lambda got: _read_round_trip(got, x),
                 cause="combine_heads must undo split_heads step by step in reverse order: transpose(1, 2), then "
                       "view to (batch, seq_len, d_model).")


# --- forward -------------------------------------------------------------------------------------------------


@check("MultiHeadAttention.forward returns (batch, q_len, d_model) (run with the course's parts where yours differ)")
def mha_output_shape(MultiHeadAttention: type[nn.Module], d_model: int = 16, num_heads: int = 4,
                     batch: int = 2, q_len: int = 5, k_len: int = 5) -> None:
    case = _Case(MultiHeadAttention, d_model, num_heads, batch, q_len, k_len, 130, required=False)
    wanted = (batch, q_len, d_model)
    run = case.run(lambda output, _: isinstance(output, torch.Tensor) and tuple(output.shape) == wanted)
    # no value of the paper's attention has 5 axes
    grown = differential.axis_growth(run.trace, widest=4) if run.trace is not None else None
    expect_shape("forward(q, k, v, mask)", run.output, wanted,
                 cause=grown.how + "." if grown is not None else
                 "project, split_heads, attend, combine_heads, then W_o: the output has one d_model-wide row per "
                 "query.")
    if run.trace is None:  # the right shape from the student's own parts: it must also come from the values
        other, _, ran = _forward_output(case.module, case.q, case.k, case.v + randn(*case.v.shape, seed=132),
                                        case.mask)
        if ran and isinstance(other, torch.Tensor) and torch.equal(other, run.output):
            fail("forward's output does not change when the values v change.",
                 expected="an output that changes when v changes (attention mixes the values)",
                 got="the same output for two different v",
                 cause="the output is computed without the input v: the values come from v through W_v (in "
                       "cross-attention k and v are not q), and the output is made from them: "
                       "W_o(combine_heads(attention(Q, K, V, mask))), not a tensor that only has the right shape.")


@check("MultiHeadAttention.forward matches the reference, same weights, padding mask (the course's parts where "
       "yours differ)")
def mha_values(MultiHeadAttention: type[nn.Module], d_model: int = 15, num_heads: int = 3, batch: int = 2,
               seq_len: int = 7) -> None:
    case = _Case(MultiHeadAttention, d_model, num_heads, batch, seq_len, seq_len, 140)
    case.expect(case.expected()[0], name="forward(q, k, v, mask)",
                cause="Q = split_heads(W_q(q)), K = split_heads(W_k(k)), V = split_heads(W_v(v)); attend with the "
                      "mask; return W_o(combine_heads(heads)).")


def _pytorch_twin(reference: nn.Module) -> nn.MultiheadAttention:
    """nn.MultiheadAttention holding the reference's weights: in_proj = [W_q; W_k; W_v], out_proj = W_o."""
    builtin = nn.MultiheadAttention(reference.d_model, reference.num_heads, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        projections = (reference.W_q, reference.W_k, reference.W_v)
        builtin.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))  # (3 * d_model, d_model)
        builtin.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))  # (3 * d_model,)
        builtin.out_proj.weight.copy_(reference.W_o.weight)
        builtin.out_proj.bias.copy_(reference.W_o.bias)
    return builtin.eval()


def _compare_with_pytorch(case: _Case, **builtin_masks: torch.Tensor) -> None:
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        expected, _ = _pytorch_twin(case.reference)(case.q, case.k, case.v, need_weights=False, **builtin_masks)
    # only the output: the weights kept in self.attn_weights have a check of their own
    case.expect(expected, name="forward(q, k, v, mask)", atol=1e-5, rtol=1e-5,
                cause="nn.MultiheadAttention with the same weights computes W_o(concat of heads) with in_proj = "
                      "[W_q; W_k; W_v].")


@check("MultiHeadAttention.forward agrees with torch.nn.MultiheadAttention, same weights, padding mask (the "
       "course's parts where yours differ)")
def mha_matches_pytorch(MultiHeadAttention: type[nn.Module], d_model: int = 16, num_heads: int = 2,
                        batch: int = 3, q_len: int = 5, k_len: int = 6) -> None:
    case = _Case(MultiHeadAttention, d_model, num_heads, batch, q_len, k_len, 150)
    key_padding_mask = ~case.mask[:, 0, 0, :]  # (batch, k_len); PyTorch's True means "ignore", unlike ours
    _compare_with_pytorch(case, key_padding_mask=key_padding_mask)


@check("MultiHeadAttention.forward agrees with torch.nn.MultiheadAttention under a look-ahead mask (the course's "
       "parts where yours differ)")
def mha_matches_pytorch_causal(MultiHeadAttention: type[nn.Module], d_model: int = 16, num_heads: int = 2,
                               batch: int = 3, seq_len: int = 6) -> None:
    x = randn(batch, seq_len, d_model, seed=161)
    look_ahead = _reference_look_ahead_mask(seq_len)  # (1, 1, seq_len, seq_len), True = may attend
    case = _Case(MultiHeadAttention, d_model, num_heads, batch, seq_len, seq_len, 160, inputs=(x, x, x, look_ahead))
    _compare_with_pytorch(case, attn_mask=~look_ahead[0, 0])


@check("MultiHeadAttention keeps attn_weights (batch, num_heads, q_len, k_len): rows sum to 1, pads get 0 (the "
       "course's parts where yours differ)")
def mha_attention_weights(MultiHeadAttention: type[nn.Module], d_model: int = 12, num_heads: int = 3,
                          batch: int = 2, q_len: int = 5, k_len: int = 7) -> None:
    case = _Case(MultiHeadAttention, d_model, num_heads, batch, q_len, k_len, 170)
    expected = case.expected()[1]
    run = case.run(lambda _, weights: _same(weights, expected, 1e-7))
    # no value of the paper's attention has 5 axes
    grown = differential.axis_growth(run.trace, widest=4) if run.trace is not None else None
    expect_shape("self.attn_weights", run.weights, (batch, num_heads, q_len, k_len),
                 cause=grown.text() if grown is not None else
                 "keep the given line `self.attn_weights = weights.detach()`, where `weights` is the second result "
                 "of scaled_dot_product_attention on the split heads.")
    expect_close("self.attn_weights", run.weights, expected, atol=1e-7, diagnose=case.diagnosis(run, expected, True),
                 cause="the weights of every head, from the same projections the output uses: rows sum to 1 and "
                       "the padded keys get 0.")


@check("MultiHeadAttention.forward works as cross-attention, queries and keys of different lengths (the course's "
       "parts where yours differ)")
def mha_cross_attention(MultiHeadAttention: type[nn.Module], d_model: int = 20, num_heads: int = 4,
                        batch: int = 2, q_len: int = 3, k_len: int = 7) -> None:
    case = _Case(MultiHeadAttention, d_model, num_heads, batch, q_len, k_len, 180)
    case.expect(case.expected()[0], name="forward(q, k, v, mask) with q_len != k_len",
                cause="take each sequence length from its own input: split_heads reads seq_len from x.shape, so Q "
                      "has q_len rows and K, V have k_len rows.")


# --- predict, then run ------------------------------------------------------------------------------


@check("your prediction: the standard deviation of q·k / √d_k (d_k = 64, Var(q_m) = 9, Var(k_m) = 4)")
def predicted_scaled_score_std(predict: Any) -> None:
    d_k, variance_q, variance_k = 64, 9.0, 4.0
    expect_number(predict, truths=lambda: math.sqrt(d_k * variance_q * variance_k) / math.sqrt(d_k), tolerance=0.03,
                  what="the standard deviation of q·k / √d_k",
                  cause="work with variances, not standard deviations: the variance of one product q_m k_m of "
                        "independent entries, of the sum of d_k such products, then what dividing by √d_k does "
                        "to a variance.")


@check("your prediction: the parameters of MultiHeadAttention(1024, 16)")
def predicted_attention_parameters(predict: Any) -> None:
    expect_number(predict, truths=lambda: (parameters_of(lambda: _ReferenceMultiHeadAttention(1024, 16)),
                                           parameters_of(lambda: _ReferenceMultiHeadAttention(1024, 16),
                                                         attention_biases=False)),
                  what="the parameters of MultiHeadAttention(1024, 16) (with or without the biases)",
                  cause="count the layers the given constructor builds, each with its in_features and "
                        "out_features. Does the number of heads change any of them?")


def _visible_pairs() -> float:
    token_ids = torch.tensor([[5, 6, 7, 3, 3, 3]])  # "ein hund läuft <pad> <pad> <pad>", <pad> = 3
    mask = _reference_padding_mask(token_ids, 3) & _reference_look_ahead_mask(6)  # (1, 1, 6, 6)
    return float(mask.sum())


@check("your prediction: the entries both masks allow (6 × 6) for 3 words + 3 <pad>")
def predicted_visible_pairs(predict: Any) -> None:
    expect_number(predict, truths=_visible_pairs,
                  what="the number of entries of the 6 × 6 table that both masks allow",
                  cause="go row by row, one query per row: which keys does the look-ahead mask let it see, and "
                        "which does the padding mask hide? Which of the two masks acts on rows, which on columns?")
