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
    protect,
    student_code,
    summary,
)
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
           dtype: torch.dtype = torch.float64) -> nn.Module:
    """A tiny reference Transformer, without dropout, with weights fixed by seed (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ReferenceTransformer(VOCAB, VOCAB, d_model, num_heads, num_layers, d_ff, 30, 0.0)
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


@check("collate: src, tgt_in, tgt_out and both masks have the right shapes")
def collate_shapes(collate: Callable[..., Any], batch_size: int = 4, seed: int = 0) -> None:
    pairs = _pairs(batch_size, seed)
    batch = _student_batch(collate, pairs, PAD)
    src_len = max(len(source) for source, _ in pairs)
    tgt_len = max(len(target) for _, target in pairs) - 1  # one shorter than the framed target
    shifted = "tgt_in and tgt_out are one token shorter than the padded target: tgt[:, :-1] and tgt[:, 1:]."
    unshifted = ("is the whole padded target, not shifted: with tgt_in == tgt_out the decoder reads the very token "
                 "it must predict and learns to copy. Use tgt_in = tgt[:, :-1] and tgt_out = tgt[:, 1:].")
    expect_shape("src", batch.src, (batch_size, src_len), cause="keep the given padding of the sources.")
    for name in ("tgt_in", "tgt_out"):
        got = expect_tensor(name, getattr(batch, name), cause=shifted)
        whole = tuple(got.shape) == (batch_size, tgt_len + 1)
        expect_shape(name, got, (batch_size, tgt_len), cause=f"{name} {unshifted}" if whole else shifted)
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
    try:
        with student_code():
            loss = compute_loss(model, batch, criterion)
    except RuntimeError as error:
        if "view size is not compatible" in str(error):
            fail("`.view` was called on a tensor whose memory is not in row order.",
                 expected="a flattened tensor", got=str(error).splitlines()[0][:100],
                 cause="batch.tgt_out is a slice of the padded target (tgt[:, 1:]), which `.view` cannot "
                       "flatten: use `.reshape(-1)` (it copies only when it must).")
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
    with torch.no_grad():
        expect_close("compute_loss(...)", got, expected, atol=1e-8, rtol=1e-8,
                     suspects=_loss_suspects(model, batch, criterion),
                     cause="logits = model(src, tgt_in, src_mask, tgt_mask); "
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
        cause="lrate = factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5) (paper, eq. 3).",
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
             cause="the two branches of min(step^-0.5, step · warmup^-1.5) meet at step = warmup_steps; "
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
    value, first = float(got[0]), float(got[1])  # graded against the student's own step 1: one property only
    if not math.isfinite(value) or not (math.isclose(value, first, rel_tol=1e-9) or value == 0.0):
        fail("noam_learning_rate(0, ...) is not usable.", expected=f"the rate of step 1 ({first:.6g}), or 0",
             got=f"{value!r}", cause=cause)


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


protect(__name__)  # snapshot the tools these checks use (see framework.protect)
