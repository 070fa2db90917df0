"""Stage 5 checks: the shifted batch, the loss, the warm-up schedule and one training epoch.

Everything runs on small synthetic data (a copy task over 12 token ids, <bos>/<eos>/<pad> as in
the course vocabulary), so no download is needed. Expected values come from the reference
functions with the same model, the same batches and the same initial weights.

While `train_epoch` is checked, the name `compute_loss` in the student's namespace temporarily
points to the reference `compute_loss`, so a mistake there is graded once, by its own checks.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks.framework import (
    check,
    expect_close,
    expect_shape,
    expect_tensor,
    fail,
    generator,
    student_code,
    summary,
    tensors_close,
)
from transformer_course.checks.localise import Call, Step, Values, first_departure, recorded_calls, terms
from transformer_course.reference import Transformer as ReferenceTransformer
from transformer_course.reference.training import Batch, make_criterion, make_optimizer
from transformer_course.reference.training import collate as reference_collate
from transformer_course.reference.training import compute_loss as reference_compute_loss
from transformer_course.reference.training import noam_learning_rate as reference_rate
from transformer_course.reference.training import train_epoch as reference_train_epoch

__all__ = [
    "collate_shapes",
    "collate_shift",
    "compute_loss_ignores_padding",
    "compute_loss_values",
    "noam_peak_at_warmup",
    "noam_step_zero",
    "noam_values",
    "summary",
    "train_epoch_clips_gradients",
    "train_epoch_learns_copy_task",
    "train_epoch_mean_loss_per_token",
    "train_epoch_scheduler_per_batch",
    "train_epoch_train_mode",
    "train_epoch_zero_grad",
]

UNK, BOS, EOS, PAD = 0, 1, 2, 3  # the course vocabulary's special ids
VOCAB = 12  # ids 4..11 are "words"


# --- synthetic data --------------------------------------------------------------------------------


def _pairs(count: int, seed: int, min_len: int = 2, max_len: int = 7, copy_task: bool = False,
           ) -> list[tuple[list[int], list[int]]]:
    """(source ids, target ids) pairs framed as <bos> ... <eos>; the target copies the source if copy_task."""
    random = generator(seed)
    pairs = []
    for _ in range(count):
        source_len = int(torch.randint(min_len, max_len + 1, (1,), generator=random))
        source = torch.randint(4, VOCAB, (source_len,), generator=random).tolist()
        if copy_task:
            target = list(source)
        else:
            target_len = int(torch.randint(min_len, max_len + 1, (1,), generator=random))
            target = torch.randint(4, VOCAB, (target_len,), generator=random).tolist()
        pairs.append(([BOS, *source, EOS], [BOS, *target, EOS]))
    return pairs


def _batches(count: int, batch_size: int, seed: int, copy_task: bool = True) -> list[Batch]:
    pairs = _pairs(count * batch_size, seed, copy_task=copy_task)
    return [reference_collate(pairs[i:i + batch_size], PAD) for i in range(0, len(pairs), batch_size)]


def _model(seed: int, d_model: int = 16, num_heads: int = 2, num_layers: int = 1, d_ff: int = 32,
           dtype: torch.dtype = torch.float64, dropout: float = 0.0) -> nn.Module:
    """A tiny reference Transformer (no dropout unless asked), weights fixed by seed (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ReferenceTransformer(VOCAB, VOCAB, d_model, num_heads, num_layers, d_ff, 30, dropout)
    return model.to(dtype)


def _parameters(model: nn.Module) -> torch.Tensor:
    return torch.cat([parameter.detach().reshape(-1) for parameter in model.parameters()])


@contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny models train fastest on one CPU thread; more threads only fight over a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# --- collate --------------------------------------------------------------------------------------


def _student_batch(collate: Callable[..., Any], pairs: list[tuple[list[int], list[int]]], pad_idx: int) -> Any:
    with student_code():
        batch = collate(pairs, pad_idx)
    for name in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask"):
        if not hasattr(batch, name):
            fail("collate returned the wrong thing.", expected="a Batch with src, tgt_in, tgt_out and masks",
                 got=type(batch).__name__, cause="keep the given `return Batch(...)` line.")
    return batch


SHIFTED = "tgt_in and tgt_out are one token shorter than the padded target: tgt[:, :-1] and tgt[:, 1:]."


def _shift_shape_cause(name: str, got: torch.Tensor, batch_size: int, tgt_len: int) -> str:
    """Why tgt_in or tgt_out has the wrong shape, from its shape (tgt is (batch_size, tgt_len + 1))."""
    if tuple(got.shape) == (batch_size, tgt_len + 1):
        return (f"{name} is the whole padded target, not shifted: with tgt_in == tgt_out the decoder reads the very "
                "token it must predict and learns to copy. Use tgt_in = tgt[:, :-1] and tgt_out = tgt[:, 1:].")
    if tuple(got.shape) == (batch_size - 1, tgt_len + 1):
        return ("the slice is taken on the batch axis (axis 0): tgt[:-1] drops the last sentence and tgt[1:] the "
                "first, keeping every token. Slice the time axis: tgt[:, :-1] and tgt[:, 1:].")
    return SHIFTED


@check("collate: src, tgt_in, tgt_out and both masks have the right shapes")
def collate_shapes(collate: Callable[..., Any], batch_size: int = 4, seed: int = 0) -> None:
    pairs = _pairs(batch_size, seed)
    batch = _student_batch(collate, pairs, PAD)
    src_len = max(len(source) for source, _ in pairs)
    tgt_len = max(len(target) for _, target in pairs) - 1  # one shorter than the framed target
    expect_shape("src", batch.src, (batch_size, src_len), cause="keep the given padding of the sources.")
    for name in ("tgt_in", "tgt_out"):
        got = expect_tensor(name, getattr(batch, name), cause=SHIFTED)
        expect_shape(name, got, (batch_size, tgt_len), cause=_shift_shape_cause(name, got, batch_size, tgt_len))
    expect_shape("src_mask", batch.src_mask, (batch_size, 1, 1, src_len), cause="keep the given mask lines.")
    expect_shape("tgt_mask", batch.tgt_mask, (batch_size, 1, tgt_len, tgt_len),
                 cause="the target mask is built from tgt_in by the given line: make tgt_in the right length.")


@check("collate shifts the target: tgt_in = target without its last token, tgt_out = target without <bos>")
def collate_shift(collate: Callable[..., Any], batch_size: int = 4, seed: int = 1, pad_idx: int = PAD) -> None:
    pairs = _pairs(batch_size, seed)
    batch = _student_batch(collate, pairs, pad_idx)
    expected = reference_collate(pairs, pad_idx)
    longest = max(len(target) for _, target in pairs)
    tgt = torch.full((batch_size, longest), pad_idx, dtype=torch.long)  # (batch, tgt_len + 1), framed
    for row, (_, target) in enumerate(pairs):
        tgt[row, : len(target)] = torch.tensor(target)
    same_length = "the same length as tgt_in, shifted by one"
    if (isinstance(batch.tgt_in, torch.Tensor) and isinstance(batch.tgt_out, torch.Tensor)
            and batch.tgt_in.shape == expected.tgt_out.shape and torch.equal(batch.tgt_in, expected.tgt_out)
            and torch.equal(batch.tgt_out, expected.tgt_in)):
        fail("tgt_in and tgt_out are swapped.", expected="tgt_in = tgt[:, :-1] (starts with <bos>), "
             "tgt_out = tgt[:, 1:] (ends with <eos>)", got="tgt_in = tgt[:, 1:], tgt_out = tgt[:, :-1]",
             cause="tgt_in and tgt_out are swapped: the decoder must READ <bos> first (tgt_in = tgt[:, :-1]) and "
                   "PREDICT the next tokens (tgt_out = tgt[:, 1:]).")
    for name in ("tgt_in", "tgt_out"):
        got = expect_tensor(name, getattr(batch, name), "return tensors")
        expect_shape(name, got, tuple(expected.tgt_out.shape),
                     cause=_shift_shape_cause(name, got, batch_size, expected.tgt_out.size(1)))
    expect_close(
        "tgt_out", expect_tensor("tgt_out", batch.tgt_out, "return tensors").double(),
        expected.tgt_out.double(), atol=0, rtol=0,
        suspects={
            "tgt_out is the whole target, not shifted: the decoder would be asked to output the token it "
            "already reads, so it learns to copy its input. Use tgt[:, 1:].": lambda: tgt.double(),
            "tgt_out still starts with <bos>: it should be the target without its first token, tgt[:, 1:], "
            "so position t is trained to predict token t + 1.": lambda: tgt[:, :-1].double(),
        },
        cause="tgt_out = tgt[:, 1:] (the target without <bos>), " + same_length + ".",
    )
    got_in = expect_tensor("tgt_in", batch.tgt_in, "return tensors")
    # Positions whose target is <pad> are ignored by the loss; tgt_in may hold anything there.
    real = expected.tgt_out != pad_idx  # (batch, tgt_len)
    if got_in.shape == expected.tgt_in.shape and torch.equal(got_in[real], expected.tgt_in[real]):
        return
    expect_close(
        "tgt_in", got_in.double(), expected.tgt_in.double(), atol=0, rtol=0,
        suspects={
            "tgt_in is the whole target, not shifted: use tgt[:, :-1].": lambda: tgt.double(),
            "tgt_in and tgt_out are swapped, or tgt_in drops <bos>: the decoder must READ <bos> first "
            "(tgt_in = tgt[:, :-1]) and PREDICT the next tokens (tgt_out = tgt[:, 1:]).": (
                lambda: tgt[:, 1:].double()
            ),
        },
        cause="tgt_in = tgt[:, :-1] (the target without its last token), starting with <bos>.",
    )


# --- the loss -------------------------------------------------------------------------------------


def _student_loss(compute_loss: Callable[..., Any], model: nn.Module, batch: Batch, criterion: nn.Module,
                  ) -> torch.Tensor:
    calls: list[Call] = []
    try:
        with student_code(), recorded_calls(model, [""]) as calls:
            loss = compute_loss(model, batch, criterion)
    except RuntimeError as error:
        if "view size is not compatible" in str(error):
            fail("`.view` was called on a tensor whose memory is not in row order.",
                 expected="a flattened tensor", got=str(error).splitlines()[0][:100],
                 cause="batch.tgt_out is a slice of the padded target (tgt[:, 1:]), which `.view` cannot "
                       "flatten: use `.reshape(-1)` (it copies only when it must).")
        for call in calls:
            call.name = "model"
        departure = _model_call_departure(calls, batch, complete=False)
        if departure:
            fail("compute_loss crashed.", expected="a loss", got=f"RuntimeError: {str(error).splitlines()[0][:120]}",
                 cause=departure)
        raise
    loss = expect_tensor("compute_loss(...)", loss, "return the criterion's output tensor, not loss.item(): "
                         "train_epoch calls loss.backward() on it.")
    return expect_shape("compute_loss(...)", loss, (),
                        cause="the criterion's default reduction='mean' gives one number (a 0-d tensor).")


def _loss_suspects(model: nn.Module, batch: Batch, criterion: nn.Module) -> dict[str, Callable[[], torch.Tensor]]:
    def logits(tgt: torch.Tensor | None = None, masks: bool = True) -> torch.Tensor:
        tgt = batch.tgt_in if tgt is None else tgt
        if not masks:
            return model(batch.src, tgt, None, None)
        return model(batch.src, tgt, batch.src_mask, batch.tgt_mask)  # (batch, tgt_len, vocab)

    def flat(scores: torch.Tensor) -> torch.Tensor:
        return scores.reshape(-1, scores.size(-1))  # (batch * tgt_len, vocab)

    smoothing = getattr(criterion, "label_smoothing", 0.0)

    return {
        "the loss compares the predictions with tgt_in: the targets are tgt_out, the next tokens.": (
            lambda: criterion(flat(logits()), batch.tgt_in.reshape(-1))
        ),
        "the model reads tgt_out: the decoder input is tgt_in (it starts with <bos>), the targets are tgt_out.": (
            lambda: criterion(flat(logits(batch.tgt_out)), batch.tgt_out.reshape(-1))
        ),
        "the masks are not passed to the model: call model(src, tgt_in, src_mask, tgt_mask).": (
            lambda: criterion(flat(logits(masks=False)), batch.tgt_out.reshape(-1))
        ),
        "the logits and the targets are flattened in different orders (a transpose before the reshape): "
        "flatten both as (batch * tgt_len, ...), batch first.": (
            lambda: criterion(flat(logits().transpose(0, 1)), batch.tgt_out.reshape(-1))
        ),
        "a new nn.CrossEntropyLoss() is used instead of the `criterion` argument: it counts <pad> positions "
        "and has no label smoothing. Use the criterion you are given.": (
            lambda: F.cross_entropy(flat(logits()), batch.tgt_out.reshape(-1))
        ),
        "the loss counts <pad> positions: use the given criterion (ignore_index=pad).": (
            lambda: F.cross_entropy(flat(logits()), batch.tgt_out.reshape(-1), label_smoothing=smoothing)
        ),
        "the loss is summed over the tokens, not averaged: use the given criterion (reduction='mean').": (
            lambda: F.cross_entropy(flat(logits()), batch.tgt_out.reshape(-1), ignore_index=PAD,
                                    label_smoothing=smoothing, reduction="sum")
        ),
        "the loss has no label smoothing: use the `criterion` argument, not a cross-entropy of your own.": (
            lambda: F.cross_entropy(flat(logits()), batch.tgt_out.reshape(-1), ignore_index=PAD)
        ),
    }


# Reading a loss through its gradient. For a cross-entropy with label smoothing eps over V classes,
# averaged with weight w_t per token, the gradient with respect to token t's logits z_t is
#     dL/dz_t = w_t * (softmax(z_t) - q_t),   q_t = (1 - eps) * onehot(y_t) + eps / V.
# So the gradient the student's loss sends back to the logits tells, token by token, which target it
# pulls towards (y_t), how much that token weighs (w_t: 1/N for each of the N real tokens, 0 at <pad>)
# and how much smoothing there is (eps): enough to name where a wrong loss departs from the right one.


def _model_call_departure(calls: list[Call], batch: Batch, complete: bool) -> str | None:
    values = Values()
    for name in ("src", "tgt_in", "tgt_out"):
        values.add(name, f"batch.{name}", getattr(batch, name))
    for name in ("src_mask", "tgt_mask"):
        values.add(name, f"batch.{name}", getattr(batch, name), mask=True)
    step = Step("model", {"enc_in": terms("src"), "dec_in": terms("tgt_in"), "enc_mask": terms("src_mask"),
                          "dec_mask": terms("tgt_mask")}, "logits", words="the logits")
    return first_departure(calls, [step], values, where="compute_loss", complete=complete)


def _loss_trace(compute_loss: Callable[..., Any], model: nn.Module, batch: Batch, criterion: nn.Module,
                ) -> tuple[Any, list[Call]]:
    """Run the student's compute_loss with gradients on, recording the model's calls (logits keep .grad)."""

    def keep_grad(_module: nn.Module, _args: tuple, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.retain_grad()

    handle = model.register_forward_hook(keep_grad)
    calls: list[Call] = []
    try:
        with torch.enable_grad(), student_code(), recorded_calls(model, [""]) as calls:
            loss = compute_loss(model, batch, criterion)
    finally:
        handle.remove()
    for call in calls:
        call.name = "model"
    return loss, calls


def _explain_loss(compute_loss: Callable[..., Any], model: nn.Module, batch: Batch, criterion: nn.Module,
                  ) -> str | None:
    """Where the student's loss departs from the criterion's mean over real tokens, read from its gradient."""
    try:
        loss, calls = _loss_trace(compute_loss, model, batch, criterion)
    except Exception:  # noqa: BLE001  (the check itself reports the crash)
        return None
    departure = _model_call_departure(calls, batch, complete=True)
    if departure:
        return departure
    logits = calls[-1].output if calls and isinstance(calls[-1].output, torch.Tensor) else None
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or logits is None or not loss.requires_grad:
        return None
    loss.backward()
    if logits.grad is None:
        return "the loss does not depend on the logits the model returned."
    gradient, probabilities = logits.grad.double(), logits.detach().double().softmax(-1)  # (batch, tgt_len, V)
    vocab, targets = gradient.size(-1), batch.tgt_out
    if gradient.shape[:2] != targets.shape:
        return None
    # per token: fit gradient = w * p + c over all classes but the one the loss pulls up (c = -w * eps / V);
    # first assume that class is the intended target, then, where that fits badly, the most deviant class.

    def fit(target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        others = ~torch.nn.functional.one_hot(target, vocab).bool()  # (batch, tgt_len, V)
        count = others.sum(-1, keepdim=True)
        mean_p = (probabilities * others).sum(-1, keepdim=True) / count
        mean_g = (gradient * others).sum(-1, keepdim=True) / count
        spread = ((probabilities - mean_p) ** 2 * others).sum(-1)
        weight = (((probabilities - mean_p) * (gradient - mean_g)) * others).sum(-1) / spread  # (batch, tgt_len)
        offset = mean_g.squeeze(-1) - weight * mean_p.squeeze(-1)
        residual = gradient - weight.unsqueeze(-1) * probabilities - offset.unsqueeze(-1)
        scale = gradient.abs().amax(-1).clamp_min(1e-300)
        return weight, offset, (residual.abs() * others).amax(-1) / scale, residual

    weight, offset, misfit, residual = fit(targets)
    pulled = targets.clone()
    alternative = residual.abs().scatter(-1, targets.unsqueeze(-1), -1.0).argmax(-1)  # (batch, tgt_len)
    weight2, offset2, misfit2, _ = fit(alternative)
    better = (misfit > 1e-4) & (misfit2 < misfit)
    weight, offset = torch.where(better, weight2, weight), torch.where(better, offset2, offset)
    misfit, pulled = torch.where(better, misfit2, misfit), torch.where(better, alternative, pulled)
    real = targets != PAD
    active = weight.abs() > 1e-9 * float(weight.abs().max())
    if bool((misfit[active] > 1e-4).any()):
        return ("the gradient of your loss is not that of a cross-entropy of the model's logits: something "
                "transforms the logits before the loss (a softmax? the criterion applies log-softmax itself).")
    wrong = active & real & (pulled != targets)
    if bool(wrong.any()) and torch.equal(pulled[active & real], batch.tgt_in[active & real]):
        return ("the loss compares the predictions with tgt_in, the tokens the decoder reads: the targets are "
                "tgt_out, the next tokens.")
    if bool(wrong.any()):
        row, column = (int(i) for i in wrong.nonzero()[0])
        other = int(pulled[row, column])
        known = " (that is batch.tgt_in there: the targets are batch.tgt_out)" \
            if other == int(batch.tgt_in[row, column]) else ""
        return (f"at sentence {row}, position {column} the loss trains the model towards token {other}, but the "
                f"target there is batch.tgt_out[{row}, {column}] = {int(targets[row, column])}{known}.")
    if bool((active & ~real).any()):
        return ("the loss counts <pad> positions: their logits get a gradient, so padding is learnt. Use the "
                "given criterion (built with ignore_index=pad_idx).")
    tokens = int(real.sum())
    ratio = weight[real] * tokens  # 1 for every real token when the loss is the mean over real tokens
    per_sentence = 1.0 / (real.sum(1, keepdim=True).double() * batch.tgt_out.size(0))  # (batch, 1)
    if not torch.allclose(ratio, torch.ones_like(ratio), rtol=1e-4):
        if torch.allclose(weight[real], per_sentence.expand_as(weight)[real], rtol=1e-4):
            return ("the loss is averaged per sentence, then over the sentences: a token of a short sentence weighs "
                    "more than one of a long sentence. The criterion averages over all real tokens of the batch "
                    "(each weighs 1/N): apply it once to the whole flattened batch.")
        if torch.allclose(ratio, ratio.mean().expand_as(ratio), rtol=1e-4):
            factor = float(ratio.mean())
            sizes = {batch.tgt_out.size(0): "the batch size", tokens: "the number of real tokens",
                     batch.tgt_out.numel(): "the number of positions"}
            named = next((f" (1 / {words}: divided by {words} once more)" for size, words in sizes.items()
                          if abs(factor * size - 1) < 1e-4), next(
                          (f" ({words}: summed instead of averaged)" for size, words in sizes.items()
                           if abs(factor - size) < 1e-4 * size), ""))
            return f"every token's weight in the loss is {factor:.4g} × the right one{named}."
        return "the real tokens do not all weigh the same in the loss: it must be the mean over all real tokens."
    smoothing = float(getattr(criterion, "label_smoothing", 0.0))
    estimate = float((-offset[real] * vocab / weight[real]).median())
    if abs(estimate - smoothing) > 1e-3:
        amount = "no label smoothing" if abs(estimate) < 1e-3 else f"label smoothing {estimate:.3g}"
        return (f"the loss has {amount}, the criterion {smoothing:g}: use the `criterion` argument, not a "
                "cross-entropy of your own.")
    return None


@check("compute_loss equals the reference loss (same model, same batch, same criterion)")
@_one_thread()
def compute_loss_values(compute_loss: Callable[..., Any], batch_size: int = 5, d_model: int = 16,
                        label_smoothing: float = 0.1, seed: int = 2) -> None:
    model = _model(seed, d_model=d_model).eval()
    batch = reference_collate(_pairs(batch_size, seed), PAD)
    criterion = make_criterion(PAD, label_smoothing)
    got = _student_loss(compute_loss, model, batch, criterion)
    if not got.requires_grad:
        fail("the loss is not connected to the model's weights.", expected="a tensor with requires_grad=True",
             got="requires_grad=False", cause="don't compute the loss under torch.no_grad() or detach it: "
                                              "train_epoch backpropagates through it.")
    expected = reference_compute_loss(model, batch, criterion)
    # One number matches a wrong variant by chance too easily: the loss's gradient names the cause first,
    # the known wrong variants only when the gradient cannot.
    explained = None if tensors_close(got, expected, 1e-8, 1e-8) else _explain_loss(compute_loss, model, batch,
                                                                                     criterion)
    with torch.no_grad():
        expect_close("compute_loss(...)", got, expected, atol=1e-8, rtol=1e-8,
                     suspects=None if explained else _loss_suspects(model, batch, criterion),
                     cause=explained or "logits = model(src, tgt_in, src_mask, tgt_mask); "
                                        "criterion(logits.reshape(-1, vocab), tgt_out.reshape(-1)).")


@check("compute_loss ignores padding: extra <pad> columns leave the loss unchanged")
@_one_thread()
def compute_loss_ignores_padding(compute_loss: Callable[..., Any], batch_size: int = 4, extra: int = 3,
                                 seed: int = 3) -> None:
    model = _model(seed).eval()
    pairs = _pairs(batch_size, seed)
    padded_pairs = [(source + [PAD] * extra, target + [PAD] * (extra + 1)) for source, target in pairs]
    batch, padded = reference_collate(pairs, PAD), reference_collate(padded_pairs, PAD)
    criterion = make_criterion(PAD, 0.1)
    with torch.no_grad():
        short = _student_loss(compute_loss, model, batch, criterion)
        long = _student_loss(compute_loss, model, padded, criterion)
        counted = F.cross_entropy(  # the same loss with <pad> positions counted
            model(padded.src, padded.tgt_in, padded.src_mask, padded.tgt_mask).reshape(-1, VOCAB),
            padded.tgt_out.reshape(-1), label_smoothing=0.1)
        expect_close(
            "compute_loss on the batch with extra padding", long, short, atol=1e-8, rtol=1e-8,
            suspects={"the loss counts <pad> positions: use the given criterion, built with "
                      "ignore_index=pad_idx, instead of a new nn.CrossEntropyLoss().": lambda: counted},
            cause="<pad> targets must not count: pass the given `criterion` the targets tgt_out, and "
                  "don't average over all positions yourself.",
        )


# --- the schedule ---------------------------------------------------------------------------------


def _rates(noam_learning_rate: Callable[..., Any], steps: Sequence[int], d_model: int, warmup_steps: int,
           factor: float) -> torch.Tensor:
    values = []
    with student_code():
        for step in steps:
            value = noam_learning_rate(step, d_model, warmup_steps, factor)
            try:
                values.append(float(value))
            except (TypeError, ValueError):
                fail("noam_learning_rate returned something that is not a number.", expected="a float",
                     got=f"{type(value).__name__} {value!r}"[:120], cause="return the learning rate as a float.")
    return torch.tensor(values, dtype=torch.float64)


def _formula(steps: Sequence[int], d_model: int, warmup_steps: int, factor: float, *, d_power: float = -0.5,
             warmup_power: float = -1.5, combine: Callable[[float, float], float] = min,
             use_factor: bool = True) -> torch.Tensor:
    scale = (factor if use_factor else 1.0) * d_model ** d_power
    return torch.tensor([scale * combine(step ** -0.5, step * warmup_steps ** warmup_power) for step in steps],
                        dtype=torch.float64)


SCHEDULE_STEPS = (1, 2, 10, 100, 1000, 3999, 4000, 4001, 8000, 100000)


def _schedule_departure(got: torch.Tensor, steps: Sequence[int], d_model: int, warmup_steps: int,
                        factor: float) -> str | None:
    """Compare the student's rates with the reference's at the same steps, one step off, and branch by branch."""
    def rate(step: int) -> float:
        return reference_rate(step, d_model, warmup_steps, factor) if step >= 1 else float("nan")

    def same(values: list[float], chosen: Sequence[int]) -> bool:
        pairs = [(float(got[index]), values[index]) for index in chosen if math.isfinite(values[index])]
        return bool(pairs) and all(math.isclose(a, b, rel_tol=1e-9) for a, b in pairs)

    everywhere = range(len(steps))
    for shift in (1, -1):
        if same([rate(step + shift) for step in steps], [i for i in everywhere if steps[i] + shift >= 1]):
            sign = "+" if shift > 0 else "-"
            return (f"the learning rate at step s is the reference's at step s {sign} 1: the schedule is off by one "
                    "step. Steps count from 1 (only step 0, which LambdaLR asks for first, is treated as step 1: "
                    "step = max(step, 1)).")
    expected = [rate(step) for step in steps]
    ratios = [float(got[index]) / value for index, value in enumerate(expected) if value]
    if ratios and all(math.isclose(r, ratios[0], rel_tol=1e-9) for r in ratios) and not math.isclose(ratios[0], 1):
        return (f"every rate is {ratios[0]:.6g} × the reference's: a constant factor is wrong (factor, "
                "d_model^-0.5).")
    warm = [i for i in everywhere if steps[i] < warmup_steps]
    decay = [i for i in everywhere if steps[i] > warmup_steps]
    for branch, words in ((warm, "during the warm-up"), (decay, "after the warm-up")):
        if len(branch) > 1 and all(math.isclose(float(got[i]), float(got[branch[0]]), rel_tol=1e-9) for i in branch):
            return (f"{words} the rate stays at {float(got[branch[0]]):.4g} whatever the step: it must change with "
                    "the step, rising as step · warmup_steps^-1.5 during the warm-up and falling as step^-0.5 "
                    "after it.")
    if warm and decay and same(expected, decay) and not same(expected, warm):
        return ("after the warm-up the rates are right, during it they are not: the warm-up branch must rise "
                "linearly, step · warmup_steps^-1.5 (times factor · d_model^-0.5), and meet the decay at "
                "step = warmup_steps.")
    if warm and decay and same(expected, warm) and not same(expected, decay):
        return ("during the warm-up the rates are right, after it they are not: the decay branch is step^-0.5 "
                "(times factor · d_model^-0.5), and min() picks it once step > warmup_steps.")
    return None


@check("noam_learning_rate follows d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), times factor")
def noam_values(noam_learning_rate: Callable[..., Any], d_model: int = 512, warmup_steps: int = 4000,
                factor: float = 2.0) -> None:
    steps = [max(1, round(step * warmup_steps / 4000)) for step in SCHEDULE_STEPS]
    got = _rates(noam_learning_rate, steps, d_model, warmup_steps, factor)
    expected = torch.tensor([reference_rate(step, d_model, warmup_steps, factor) for step in steps],
                            dtype=torch.float64)

    def wrong(**options: Any) -> Callable[[], torch.Tensor]:
        return lambda: _formula(steps, d_model, warmup_steps, factor, **options)

    expect_close(
        f"rates at steps {steps} (d_model={d_model}, warmup={warmup_steps}, factor={factor})",
        got, expected, atol=0, rtol=1e-9,
        suspects={
            "the factor d_model^-0.5 is missing.": wrong(d_power=0.0),
            "d_model^+0.5 instead of d_model^-0.5.": wrong(d_power=0.5),
            "warmup_steps^-0.5 instead of warmup_steps^-1.5 in the warm-up branch: the rise must be "
            "step · warmup^-1.5 so that both branches meet at step = warmup_steps.": wrong(warmup_power=-0.5),
            "max instead of min: the smaller of the two branches is the rate.": wrong(combine=max),
            "the `factor` argument is ignored: multiply the whole rate by it.": wrong(use_factor=False),
            "no warm-up: the rate is only the decay d_model^-0.5 · step^-0.5.": wrong(combine=lambda a, b: a),
        },
        cause=_schedule_departure(got, steps, d_model, warmup_steps, factor)
        or "lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5) (paper, eq. 3).",
    )


@check("noam_learning_rate peaks exactly at step = warmup_steps")
def noam_peak_at_warmup(noam_learning_rate: Callable[..., Any], d_model: int = 64, warmup_steps: int = 100,
                        ) -> None:
    steps = list(range(1, 3 * warmup_steps + 1))
    got = _rates(noam_learning_rate, steps, d_model, warmup_steps, 1.0)
    peak = steps[int(got.argmax())]
    if peak != warmup_steps:
        fail("the learning rate does not peak at the end of the warm-up.",
             expected=f"the largest rate at step {warmup_steps}", got=f"the largest rate at step {peak}",
             cause=_schedule_departure(got, steps, d_model, warmup_steps, 1.0)
             or "the two branches of min(step^-0.5, step · warmup^-1.5) meet at step = warmup_steps; "
                "check the exponents.")
    top = d_model ** -0.5 * warmup_steps ** -0.5
    if not math.isclose(float(got.max()), top, rel_tol=1e-9):
        fail("the peak learning rate is wrong.", expected=f"d_model^-0.5 · warmup^-0.5 = {top:.6g}",
             got=f"{float(got.max()):.6g}", cause="check the factor d_model^-0.5.")


@check("noam_learning_rate(0, ...) does not divide by zero (step 0 counts as step 1)")
def noam_step_zero(noam_learning_rate: Callable[..., Any], d_model: int = 512, warmup_steps: int = 4000) -> None:
    cause = ("0 ** -0.5 divides by zero: treat step 0 as step 1 first, e.g. `step = max(step, 1)`. "
             "The given make_optimizer never asks for step 0, but other callers of the schedule may.")
    try:
        got = _rates(noam_learning_rate, [0, 1], d_model, warmup_steps, 1.0)
    except (ZeroDivisionError, ValueError, OverflowError) as error:
        fail("noam_learning_rate(0, ...) raised an error.", expected="a finite learning rate",
             got=f"{type(error).__name__}: {error}", cause=cause)
    # Graded against the student's own step 1 (one property only: a wrong formula is noam_values' business),
    # or the reference's (a schedule off by one step gives step 0 the rate of step 1: noam_values says so).
    value, first = float(got[0]), float(got[1])
    usable = (math.isclose(value, first, rel_tol=1e-9) or value == 0.0
              or math.isclose(value, reference_rate(1, d_model, warmup_steps), rel_tol=1e-9))
    if not math.isfinite(value) or not usable:
        fail("noam_learning_rate(0, ...) is not usable.", expected=f"the rate of step 1 ({first:.6g}), or 0",
             got=f"{value!r}", cause=cause if not math.isfinite(value) else
             "LambdaLR uses the rate of step 0 for the first update: treat step 0 as step 1, step = max(step, 1).")


# --- train_epoch ----------------------------------------------------------------------------------


class _RecordingSGD(torch.optim.SGD):
    """Plain SGD that records, at every step, the learning rate and the gradients it is about to apply."""

    def __init__(self, parameters: Any, lr: float) -> None:
        super().__init__(parameters, lr=lr)
        self.records: list[dict[str, float]] = []

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: ANN401
        gradients = [p.grad.reshape(-1) for group in self.param_groups for p in group["params"] if p.grad is not None]
        flat = torch.cat(gradients) if gradients else torch.zeros(1)
        self.records.append({"lr": float(self.param_groups[0]["lr"]), "norm": float(flat.norm()),
                             "largest": float(flat.abs().max())})
        return super().step(closure)


@contextmanager
def _reference_compute_loss(train_epoch: Callable[..., Any]) -> Iterator[None]:
    """Let the student's train_epoch call the reference compute_loss (restored afterwards)."""
    namespace = getattr(train_epoch, "__globals__", {})
    had = "compute_loss" in namespace
    saved = namespace.get("compute_loss")
    if had:
        namespace["compute_loss"] = reference_compute_loss
    try:
        yield
    finally:
        if had:
            namespace["compute_loss"] = saved


AUTOGRAD_CRASHES = {
    "does not require grad": "the loss has no graph to backpropagate through: it was computed under "
    "torch.no_grad() or cut off with .detach() / .data. Compute it with gradients on (train_epoch must not use "
    "torch.no_grad(); that belongs to evaluation).",
    "backward through the graph a second time": "loss.backward() runs twice on the same graph: call it once per "
    "batch.",
}


def _run(train_epoch: Callable[..., Any], model: nn.Module, batches: list[Batch], optimizer: torch.optim.Optimizer,
         scheduler: Any = None, clip_norm: float = 1e9, label_smoothing: float = 0.0) -> float:
    criterion = make_criterion(PAD, label_smoothing)
    try:
        with student_code(), _reference_compute_loss(train_epoch):
            result = train_epoch(model, batches, criterion, optimizer, scheduler, device="cpu", clip_norm=clip_norm,
                                 progress=False)
    except AttributeError as error:
        if "NoneType" in str(error) and "step" in str(error):
            fail("train_epoch fails when it is given no scheduler.", expected="scheduler=None to be allowed",
                 got=f"AttributeError: {error}",
                 cause="step the scheduler only if there is one: `if scheduler is not None: scheduler.step()`.")
        if "object has no attribute 'backward'" in str(error):
            fail("train_epoch calls .backward() on something that is not a tensor.", expected="loss.backward() on "
                 "the tensor compute_loss returns", got=f"AttributeError: {error}",
                 cause="keep `loss` the tensor compute_loss returns (loss.item() or float(loss) is a plain number, "
                       "with no graph to backpropagate through); the given lines call loss.item() themselves.")
        raise
    except RuntimeError as error:
        for sign, cause in AUTOGRAD_CRASHES.items():
            if sign in str(error):
                fail("train_epoch crashed in loss.backward().", expected="a backward pass through the model",
                     got=f"RuntimeError: {str(error).splitlines()[0][:120]}", cause=cause)
        raise
    except NameError as error:
        if "loss" in str(error):
            fail("the lines after your code cannot find the batch loss.", expected="a variable named `loss`",
                 got=f"{type(error).__name__}: {error}",
                 cause="store the batch's loss in `loss` (loss = compute_loss(...)); the given lines read it.")
        raise
    if not isinstance(result, int | float | torch.Tensor):
        fail("train_epoch returned something that is not a number.", expected="the mean loss per token",
             got=f"{type(result).__name__}", cause="keep the given `return` line.")
    return float(result)


def _manual_epoch(model: nn.Module, batches: list[Batch], optimizer: torch.optim.Optimizer, *,
                  zero_grad: bool = True, step: bool = True, clip: float | None = None) -> None:
    """A deliberately simple (possibly wrong) epoch, to reproduce a suspected mistake."""
    criterion = make_criterion(PAD, 0.0)
    model.train()
    for batch in batches:
        if zero_grad:
            optimizer.zero_grad()
        reference_compute_loss(model, batch, criterion).backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        if step:
            optimizer.step()


@check("train_epoch learns: on a small copy task the loss falls clearly within a few epochs")
@_one_thread()
def train_epoch_learns_copy_task(train_epoch: Callable[..., Any], epochs: int = 4, num_batches: int = 16,
                                 seed: int = 0) -> None:
    model = _model(seed, d_model=32, num_heads=4, d_ff=64, dtype=torch.float32)
    start = _parameters(model).clone()
    batches = _batches(num_batches, 32, seed)
    optimizer, scheduler = make_optimizer(model, 32, warmup_steps=50, factor=0.5)
    first_lr = optimizer.param_groups[0]["lr"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        losses = [_run(train_epoch, model, batches, optimizer, scheduler, clip_norm=1.0) for _ in range(epochs)]
    if losses[-1] < 0.6 * losses[0]:
        return
    if torch.equal(_parameters(model), start):
        cause = "the weights never changed: call optimizer.step() after loss.backward()."
    elif optimizer.param_groups[0]["lr"] == first_lr:
        cause = "the learning rate never left its first, tiny warm-up value: call scheduler.step() after every batch."
    else:
        cause = ("check the order zero_grad -> loss -> backward -> clip -> optimizer.step -> scheduler.step, "
                 "and that the loss is computed with compute_loss(model, batch, criterion).")
    fail("the loss did not fall.", expected=f"epoch {epochs} loss below 60% of epoch 1's ({losses[0]:.3f})",
         got="losses per epoch " + ", ".join(f"{loss:.3f}" for loss in losses), cause=cause)


@check("train_epoch trains in train mode (dropout on), also after an evaluation left the model in eval mode")
@_one_thread()
def train_epoch_train_mode(train_epoch: Callable[..., Any], num_batches: int = 2, seed: int = 8) -> None:
    model = _model(seed, dropout=0.3).eval()  # as evaluate() leaves it, between two epochs
    modes: list[bool] = []

    def record(module: nn.Module, _args: tuple) -> None:
        modes.append(module.training and all(part.training for part in module.modules()
                                             if isinstance(part, nn.Dropout)))

    handle = model.register_forward_pre_hook(record)
    try:
        _run(train_epoch, model, _batches(num_batches, 4, seed), torch.optim.SGD(model.parameters(), lr=0.1))
    finally:
        handle.remove()
    if not modes:
        fail("train_epoch never ran the model.", expected=f"{num_batches} forward passes", got="none",
             cause="compute each batch's loss with compute_loss(model, batch, criterion).")
    if not all(modes):
        fail("the model was in eval mode during training: dropout was off.",
             expected="every forward pass in train mode",
             got=f"{modes.count(False)} of {len(modes)} forward passes in eval mode",
             cause="keep the given model.train() at the start of train_epoch: evaluate() switches the model to "
                   "eval mode, so every epoch after the first would otherwise train without dropout.")


@check("train_epoch zeroes the gradients every batch: weights after 2 steps match the reference")
@_one_thread()
def train_epoch_zero_grad(train_epoch: Callable[..., Any], num_batches: int = 2, seed: int = 4) -> None:
    batches = _batches(num_batches, 6, seed, copy_task=False)
    model = _model(seed)
    start = copy.deepcopy(model)
    _run(train_epoch, model, batches, torch.optim.SGD(model.parameters(), lr=0.5))
    expected_model = copy.deepcopy(start)
    reference_train_epoch(expected_model, batches, make_criterion(PAD, 0.0),
                          torch.optim.SGD(expected_model.parameters(), lr=0.5), None, clip_norm=1e9, progress=False)

    def variant(**options: Any) -> Callable[[], torch.Tensor]:
        def make() -> torch.Tensor:
            wrong = copy.deepcopy(start)
            _manual_epoch(wrong, batches, torch.optim.SGD(wrong.parameters(), lr=0.5), **options)
            return _parameters(wrong)
        return make

    expect_close(
        "the weights after the epoch", _parameters(model), _parameters(expected_model), atol=1e-8, rtol=1e-7,
        suspects={
            "the gradients accumulate from batch to batch: call optimizer.zero_grad() at the start of every "
            "batch (loss.backward() ADDS to .grad).": variant(zero_grad=False),
            "the weights never changed: call optimizer.step() after loss.backward() (and don't zero the "
            "gradients between backward and step).": lambda: _parameters(start),
            "the gradients were clipped to norm 1.0 although this check passes clip_norm=1e9: clip to the "
            "`clip_norm` argument, not to a fixed number.": variant(clip=1.0),
        },
        cause="per batch: optimizer.zero_grad(); loss = compute_loss(...); loss.backward(); clip; "
              "optimizer.step().",
    )


@check("train_epoch clips the gradients' total norm to clip_norm before optimizer.step()")
@_one_thread()
def train_epoch_clips_gradients(train_epoch: Callable[..., Any], clip_norm: float = 0.05, num_batches: int = 2,
                                seed: int = 5) -> None:
    batches = _batches(num_batches, 6, seed, copy_task=False)
    model = _model(seed)
    start = copy.deepcopy(model)
    optimizer = _RecordingSGD(model.parameters(), lr=0.1)
    _run(train_epoch, model, batches, optimizer, clip_norm=clip_norm)
    if len(optimizer.records) != num_batches:
        fail("optimizer.step() was not called once per batch.", expected=f"{num_batches} calls",
             got=f"{len(optimizer.records)} calls", cause="call optimizer.step() once inside the loop.")
    reference_optimizer = _RecordingSGD(start.parameters(), lr=0.1)
    reference_train_epoch(start, batches, make_criterion(PAD, 0.0), reference_optimizer, None, clip_norm=clip_norm,
                          progress=False)
    got = torch.tensor([record["norm"] for record in optimizer.records], dtype=torch.float64)
    expected = torch.tensor([record["norm"] for record in reference_optimizer.records], dtype=torch.float64)
    if _close_enough(got, expected):
        return
    largest = max(record["largest"] for record in optimizer.records)
    if largest <= clip_norm * (1 + 1e-6) and (got > clip_norm * (1 + 1e-6)).any():
        cause = ("every element was clipped to ±clip_norm (clip_grad_value_): that changes the gradient's "
                 "direction. Clip the total norm: nn.utils.clip_grad_norm_(model.parameters(), clip_norm).")
    elif torch.isclose(got, torch.ones_like(got), rtol=1e-6).any():
        cause = "the norm was clipped to 1.0, not to the `clip_norm` argument: pass clip_norm."
    elif (got > clip_norm * (1 + 1e-6)).any():
        cause = ("the gradients reached optimizer.step() unclipped: call nn.utils.clip_grad_norm_("
                 "model.parameters(), clip_norm) after loss.backward(), before optimizer.step().")
    else:
        cause = "clip the total norm once, with nn.utils.clip_grad_norm_(model.parameters(), clip_norm)."
    fail("the gradients' total norm at optimizer.step() is not the clipped one.",
         expected="norms " + ", ".join(f"{value:.4g}" for value in expected.tolist()) + f" (clip_norm = {clip_norm})",
         got="norms " + ", ".join(f"{value:.4g}" for value in got.tolist()), cause=cause)


def _close_enough(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return got.shape == expected.shape and bool(torch.allclose(got, expected, rtol=1e-5, atol=1e-9))


@check("train_epoch steps the scheduler once per batch, after optimizer.step()")
@_one_thread()
def train_epoch_scheduler_per_batch(train_epoch: Callable[..., Any], num_batches: int = 5, d_model: int = 16,
                                    warmup_steps: int = 3, seed: int = 6) -> None:
    batches = _batches(num_batches, 4, seed)
    model = _model(seed, d_model=d_model)
    optimizer = _RecordingSGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda index: reference_rate(index + 1, d_model, warmup_steps))
    _run(train_epoch, model, batches, optimizer, scheduler)
    used = torch.tensor([record["lr"] for record in optimizer.records], dtype=torch.float64)

    def rates(steps: Sequence[int]) -> torch.Tensor:
        return torch.tensor([reference_rate(step, d_model, warmup_steps) for step in steps], dtype=torch.float64)

    expected = rates(range(1, num_batches + 1))
    expect_close(
        f"learning rates used by the {num_batches} optimizer steps", used, expected, atol=0, rtol=1e-9,
        suspects={
            "the scheduler is never stepped: call scheduler.step() after every optimizer.step().": (
                lambda: rates([1] * num_batches)
            ),
            "scheduler.step() comes before optimizer.step(): the first update must use the schedule's first "
            "rate, so step the optimizer first.": lambda: rates(range(2, num_batches + 2)),
            "the scheduler is stepped twice per batch: once after optimizer.step() is enough.": (
                lambda: rates(range(1, 2 * num_batches, 2))
            ),
        },
        cause="one scheduler.step() per batch, right after optimizer.step().",
    )
    final = float(optimizer.param_groups[0]["lr"])
    if not math.isclose(final, float(rates([num_batches + 1])[0]), rel_tol=1e-9):
        fail("after the epoch the scheduler is at the wrong step.",
             expected=f"the rate of step {num_batches + 1} after {num_batches} batches",
             got=f"learning rate {final:.6g}", cause="call scheduler.step() exactly once per batch.")


@check("train_epoch returns the mean loss per target token, measured before each update")
@_one_thread()
def train_epoch_mean_loss_per_token(train_epoch: Callable[..., Any], sizes: Sequence[int] = (3, 5, 7),
                                    seed: int = 7) -> None:
    pairs = _pairs(sum(sizes), seed, copy_task=False)  # batches of different sizes, so weighting matters
    starts = [sum(sizes[:index]) for index in range(len(sizes))]
    batches = [reference_collate(pairs[start:start + size], PAD) for start, size in zip(starts, sizes, strict=True)]
    model = _model(seed)
    start = copy.deepcopy(model)
    got = _run(train_epoch, model, batches, torch.optim.SGD(model.parameters(), lr=0.5), label_smoothing=0.1)
    reference_model = copy.deepcopy(start)
    expected = reference_train_epoch(reference_model, batches, make_criterion(PAD, 0.1),
                                     torch.optim.SGD(reference_model.parameters(), lr=0.5), None, clip_norm=1e9,
                                     progress=False)

    def after_update() -> torch.Tensor:  # the loss recomputed after each step
        wrong = copy.deepcopy(start)
        optimizer, criterion = torch.optim.SGD(wrong.parameters(), lr=0.5), make_criterion(PAD, 0.1)
        total, tokens = 0.0, 0
        for batch in batches:
            optimizer.zero_grad()
            reference_compute_loss(wrong, batch, criterion).backward()
            optimizer.step()
            count = int((batch.tgt_out != PAD).sum())
            total += float(reference_compute_loss(wrong, batch, criterion)) * count
            tokens += count
        return torch.tensor(total / tokens, dtype=torch.float64)

    expect_close("train_epoch(...)", torch.tensor(got, dtype=torch.float64), torch.tensor(expected), atol=1e-8,
                 rtol=1e-7, suspects={"the loss is measured after optimizer.step(): keep the `loss` that was "
                                      "backpropagated, computed before the update.": after_update},
                 cause="`loss` must be the batch's mean loss from compute_loss; the given lines weight it by "
                       "the batch's real tokens.")
