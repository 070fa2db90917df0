"""Stage 5 checks: the shifted batch, the loss, one training epoch, and the bug hunt's loop over epochs (`fit`).

Everything runs on small synthetic data (a copy task over 12 token ids, <bos>/<eos>/<pad> as in the
course vocabulary), so no download is needed. The student's functions run in experiments
(`checks.boundary`): the experiment builds the same tiny model and batches from a seed on the student's
side, runs the student's code and returns what it observed (the batch's fields, the loss and its
gradient, what the optimiser and the scheduler saw at every step). The check computes the expected
values with the reference on the same model, batches and weights, and judges.

Wrong values are read from the values themselves: which slice of the padded target a field holds; the
loss through its gradient, token by token; the schedule through its exponents (how the rate grows with
the step, d_model, warmup_steps and factor, branch by branch); the updates through the gradient each
`optimizer.step()` received, compared with the fresh gradient of its batch at the same weights. The
diagnosis engine (`checks.differential`) adds the student's line where it finds one.

While `train_epoch` is checked, the name `compute_loss` in the student's namespace points to the
reference `compute_loss` (declared with `supplied`), so a mistake there is graded once, by its own checks;
while `fit` is checked, `train_epoch` points to the reference's as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from transformer_course.checks import differential, parts
from transformer_course.checks.boundary import on_student_side, supplied
from transformer_course.checks.compare import describe_difference, tensors_close
from transformer_course.checks.errors import crash_lines
from transformer_course.checks.framework import (
    RECIPE,
    Diagnosis,
    check,
    describe,
    expect_close,
    expect_shape,
    fail,
    failing,
    generator,
    student_code,
    summary,
)
from transformer_course.checks.predictions import expect_number
from transformer_course.checks.salt import salted_seed
from transformer_course.reference import Transformer as ReferenceTransformer
from transformer_course.reference.training import Batch
from transformer_course.reference.training import collate as reference_collate
from transformer_course.reference.training import compute_loss as reference_compute_loss
from transformer_course.reference.training import fit as reference_fit
from transformer_course.reference.training import noam_learning_rate as reference_noam_learning_rate
from transformer_course.reference.training import train_epoch as reference_train_epoch

# the parts of PyTorch this stage's grade cells meet, used once before any notebook code (runner.warm_up_torch):
# tests/test_grading_speed.py fails when a grade cell imports a module
WARM_UP: tuple[str, ...] = ("shape checks", "optimiser step")

__all__ = [
    "predicted_half_right_loss",
    "predicted_peak_rate",
    "predicted_variant_peak_step",
    "collate_shapes",
    "collate_shift",
    "compute_loss_ignores_padding",
    "compute_loss_values",
    "fit_history",
    "fit_trains_as_train_epoch",
    "summary",
    "train_epoch_clips_gradients",
    "train_epoch_learns_copy_task",
    "train_epoch_mean_loss_per_token",
    "train_epoch_follows_the_schedule",
    "train_epoch_train_mode",
    "train_epoch_zero_grad",
]

UNK, BOS, EOS, PAD = 0, 1, 2, 3  # the course vocabulary's special ids
VOCAB = 12  # ids 4..11 are "words"
FIELDS = ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask")


# --- synthetic data (built the same way on both sides) ----------------------------------------------------


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


def _model(seed: int, d_model: int = 16, num_heads: int = 2, num_layers: int = 1, d_ff: int = 32,
           dtype: torch.dtype = torch.float64, dropout: float = 0.0) -> nn.Module:
    """A tiny reference Transformer (no dropout unless asked), weights fixed by seed (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(salted_seed(seed))
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


def _value(value: Any) -> Any:
    """What crosses back for a value the student returned: a tensor as it is, anything else described."""
    return value.detach() if isinstance(value, torch.Tensor) else describe(value)


def _tensor(name: str, value: Any, cause: str) -> torch.Tensor:
    """A value that came back from the student's side as a tensor, or a failure showing what it was."""
    if not isinstance(value, torch.Tensor):
        fail(f"{name} is not a tensor.", expected="a torch.Tensor", got=value, cause=cause)
    return value


def _student_line(student: differential.Trace | None, reference: differential.Trace, got: torch.Tensor,
                  expected: torch.Tensor, context: differential.Context) -> tuple[str, str]:
    """(the student's line where the engine finds the first departure, what the engine says there)."""
    if student is None:
        return "", ""
    try:
        found = differential.diagnose(student, reference, context=context, student_final=got,
                                      reference_final=expected)
    except Exception:  # a diagnosis that cannot be made says nothing
        return "", ""
    return (found.where, found.how) if found is not None else ("", "")


def _at_line(line: str, cause: str) -> str:
    return f"{line}: {cause}" if line else cause


# --- collate ------------------------------------------------------------------------------------------------


@on_student_side
def _collated(collate: Callable[..., Any], pairs: list[tuple[list[int], list[int]]], pad_idx: int,
              ) -> tuple[dict[str, Any], differential.Trace | None]:
    """The fields of the student's batch (tensors, or what else they are), and the collate call recorded."""
    with student_code(), differential.recording() as trace:
        batch = collate(pairs, pad_idx)
    missing = [name for name in FIELDS if not hasattr(batch, name)]
    if missing:
        fail("collate returned the wrong thing.", expected="a Batch with src, tgt_in, tgt_out and masks",
             got=describe(batch), cause="keep the given `return Batch(...)` line.")
    trace.output = None  # the check compares the fields one by one
    return {name: _value(getattr(batch, name)) for name in FIELDS}, trace


def _padded_target(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_idx: int) -> torch.Tensor:
    """The padded, framed target tgt, (batch, tgt_len + 1), as collate builds it before the shift."""
    longest = max(len(target) for _, target in pairs)
    tgt = torch.full((len(pairs), longest), pad_idx, dtype=torch.long)
    for row, (_, target) in enumerate(pairs):
        tgt[row, : len(target)] = torch.tensor(target)
    return tgt


def _slice_of(got: Any, tgt: torch.Tensor) -> tuple[int, int, int] | None:
    """(axis, start, stop) when `got` is tgt sliced along one axis (the whole of tgt: axis 1, 0, len); None
    when it is no slice of tgt."""
    if not isinstance(got, torch.Tensor) or got.dim() != 2 or got.is_floating_point():
        return None
    for axis in (1, 0):
        size = tgt.size(axis)
        for start in range(size):
            for stop in range(size, start, -1):
                part = tgt.narrow(axis, start, stop - start)
                if part.shape == got.shape and torch.equal(part, got.cpu()):
                    return axis, start, stop
    return None


def _slice_words(found: tuple[int, int, int], tgt: torch.Tensor) -> str:
    """A slice of the padded target in the lesson's words."""
    axis, start, stop = found
    size = tgt.size(axis)
    if (start, stop) == (0, size):
        return "the whole padded target tgt, not shifted"
    if axis == 0:
        return (f"tgt[{start}:{stop}], a slice along the batch axis (axis 0: the sentences), which keeps every "
                "token and drops whole sentences")
    text = f"tgt[:, {start or ''}:{'' if stop == size else stop - size}]"
    if (start, stop) == (0, size - 1):
        return f"{text}, the target without its last token (it starts with <bos>)"
    if (start, stop) == (1, size):
        return f"{text}, the target without <bos>"
    return text


def _shift_cause(name: str, got: Any, tgt: torch.Tensor) -> str | None:
    """What a wrong tgt_in or tgt_out holds, read from its values (None when it is no slice of tgt)."""
    found = _slice_of(got, tgt)
    if found is None:
        return None
    axis, start, stop = found
    holds = f"{name} holds {_slice_words(found, tgt)}"
    if (axis, start, stop) == (1, 0, tgt.size(1)):
        return (f"{holds}: each sequence must be one token shorter, so that position t reads the tokens up to t "
                "and is scored on token t + 1 (a decoder scored on the token it reads learns to copy). Use "
                "tgt_in = tgt[:, :-1] and tgt_out = tgt[:, 1:].")
    if axis == 0:
        return f"{holds}. Slice the time axis (axis 1): tgt_in = tgt[:, :-1] and tgt_out = tgt[:, 1:]."
    wanted = "tgt[:, :-1] (it starts with <bos>)" if name == "tgt_in" else "tgt[:, 1:] (it ends with <eos>)"
    return f"{holds}; {name} should be {wanted}."


SHIFTED = "tgt_in and tgt_out are one token shorter than the padded target: tgt[:, :-1] and tgt[:, 1:]."


@check("collate: src, tgt_in, tgt_out and both masks have the right shapes")
def collate_shapes(collate: Callable[..., Any], batch_size: int = 4, seed: int = 0) -> None:
    pairs = _pairs(batch_size, seed)
    fields, _ = _collated(collate, pairs, PAD)
    tgt = _padded_target(pairs, PAD)
    src_len = max(len(source) for source, _ in pairs)
    tgt_len = tgt.size(1) - 1  # one shorter than the framed target
    expect_shape("src", _tensor("src", fields["src"], "keep the given padding of the sources."), (batch_size, src_len),
                 cause="keep the given padding of the sources.")
    for name in ("tgt_in", "tgt_out"):
        got = _tensor(name, fields[name], cause=SHIFTED)
        expect_shape(name, got, (batch_size, tgt_len), cause=_shift_cause(name, got, tgt) or SHIFTED)
    masks = "keep the given mask lines."
    expect_shape("src_mask", _tensor("src_mask", fields["src_mask"], masks), (batch_size, 1, 1, src_len), cause=masks)
    expect_shape("tgt_mask", _tensor("tgt_mask", fields["tgt_mask"], masks), (batch_size, 1, tgt_len, tgt_len),
                 cause="the target mask is built from tgt_in by the given line: make tgt_in the right length.")


@check("collate: at every position, tgt_in holds what the decoder reads and tgt_out the next token it must predict")
def collate_shift(collate: Callable[..., Any], batch_size: int = 4, seed: int = 1, pad_idx: int = PAD) -> None:
    pairs = _pairs(batch_size, seed)
    fields, student = _collated(collate, pairs, pad_idx)
    with differential.recording() as reference:
        expected = reference_collate(pairs, pad_idx)
    tgt = _padded_target(pairs, pad_idx)
    got_in, got_out = fields["tgt_in"], fields["tgt_out"]
    if (_slice_of(got_in, tgt) == (1, 1, tgt.size(1)) and _slice_of(got_out, tgt) == (1, 0, tgt.size(1) - 1)):
        fail("tgt_in does not start with <bos>, and tgt_out does not end with each sentence's <eos>.",
             expected="tgt_in starting with <bos> in every sentence (what the decoder reads first), tgt_out holding "
                      "each sentence's <eos> (what it must predict last)",
             got="tgt_out starting with <bos> and tgt_in holding the <eos>",
             cause="tgt_in and tgt_out are swapped: the decoder must READ <bos> first and PREDICT the next tokens.",
             code="tgt_in = tgt[:, :-1], tgt_out = tgt[:, 1:].")
    context = differential.Context(sizes={"sentence": batch_size, "position": tgt.size(1) - 1})
    for name in ("tgt_out", "tgt_in"):
        got = _tensor(name, fields[name], "return tensors")
        wanted = getattr(expected, name)
        expect_shape(name, got, tuple(wanted.shape), cause=_shift_cause(name, got, tgt) or SHIFTED)
        if name == "tgt_in":  # positions whose target is <pad> are ignored by the loss: tgt_in may hold anything
            real = expected.tgt_out != pad_idx  # (batch, tgt_len)
            if torch.equal(got[real], wanted[real]):
                return
        elif torch.equal(got, wanted):
            continue
        line, _ = _student_line(student, reference, got.double(), wanted.double(), context)
        recipe = ("tgt_out = tgt[:, 1:] (the target without <bos>), the same length as tgt_in, shifted by one."
                  if name == "tgt_out" else
                  "tgt_in = tgt[:, :-1] (the target without its last token), starting with <bos>.")
        reading = _shift_cause(name, got, tgt)
        where = describe_difference(got.double(), wanted.double(), ("sentence", "position"))
        expect_close(name, got.double(), wanted.double(), atol=0, rtol=0, axes=("sentence", "position"),
                     diagnose=lambda _got, reading=reading, line=line, where=where: Diagnosis(
                         where, _at_line(line, reading)) if reading else None,
                     cause=recipe)


# --- the loss -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """Everything a loss or train_epoch check hands to the student's function (model, batches, criterion,
    optimiser, schedule), built the same on both sides."""

    seed: int
    sizes: tuple[int, ...]  # sentences per batch
    copy_task: bool = False
    d_model: int = 16
    num_heads: int = 2
    d_ff: int = 32
    double: bool = True
    dropout: float = 0.0
    optimizer: str = "sgd"  # "sgd" or "adam"
    lr: float = 0.5
    schedule: str = "constant"  # "constant" (rate 1), "warmup" (the paper's, own copy) or "none" (no scheduler)
    rate_d_model: int = 16
    warmup_steps: int = 4
    rate_factor: float = 1.0
    clip_norm: float = 1e9
    label_smoothing: float = 0.0
    epochs: int = 1
    start_in_eval: bool = False
    keep_gradients: bool = False  # record the gradient and the weights at every optimizer.step()
    extra: int = 0  # <pad> columns added to every source and target

    def model(self) -> nn.Module:
        return _model(self.seed, d_model=self.d_model, num_heads=self.num_heads, d_ff=self.d_ff,
                      dtype=torch.float64 if self.double else torch.float32, dropout=self.dropout)

    def batches(self) -> list[Batch]:
        pairs = [(source + [PAD] * self.extra, target + [PAD] * (self.extra + 1 if self.extra else 0))
                 for source, target in _pairs(sum(self.sizes), self.seed, copy_task=self.copy_task)]
        starts = [sum(self.sizes[:index]) for index in range(len(self.sizes))]
        return [reference_collate(pairs[start:start + size], PAD) for start, size in zip(starts, self.sizes,
                                                                                          strict=True)]

    def criterion(self) -> nn.Module:
        return nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=self.label_smoothing)

    def loss_case(self) -> tuple[nn.Module, Batch, nn.Module]:
        """The model (in eval mode), the first batch and the criterion a loss check hands to compute_loss."""
        return self.model().eval(), self.batches()[0], self.criterion()

    def rate(self, index: int) -> float:
        """The schedule's multiplier after `index` scheduler steps (LambdaLR's lr_lambda)."""
        if self.schedule != "warmup":
            return 1.0
        return _paper_rate(index + 1, self.rate_d_model, self.warmup_steps, self.rate_factor)


@dataclass
class LossRun:
    """What compute_loss did: its result, whether it can be backpropagated, the logits the model returned and
    the gradient the loss sent back to them, the model's calls, and the computation recorded."""

    loss: Any
    requires_grad: bool
    logits: torch.Tensor | None
    gradient: torch.Tensor | None
    calls: list[parts.Call] = field(default_factory=list)
    trace: differential.Trace | None = None


def _model_call_departure(calls: list[parts.Call], batch: Batch, complete: bool) -> str | None:
    """Where compute_loss's call of the model departs from model(src, tgt_in, src_mask, tgt_mask), in words."""
    values = parts.Values()
    for name in ("src", "tgt_in", "tgt_out"):
        values.add(name, f"batch.{name}", getattr(batch, name))
    for name in ("src_mask", "tgt_mask"):
        values.add(name, f"batch.{name}", getattr(batch, name), mask=True)
    step = parts.Step("model", {"enc_in": parts.terms("src"), "dec_in": parts.terms("tgt_in"),
                                "enc_mask": parts.terms("src_mask"), "dec_mask": parts.terms("tgt_mask")}, "logits",
                      label="the logits")
    reading = parts.Replay(calls, [step], values, {}).departure(complete=complete)
    return f"in compute_loss: {reading.text}." if reading else None


def _inputs(batch: Batch) -> dict[str, torch.Tensor]:
    return {name: getattr(batch, name) for name in FIELDS}


@on_student_side
def _loss_run(compute_loss: Callable[..., Any], case: Setup) -> LossRun:
    """The student's compute_loss on the case's model and batch, with gradients on; then backward from its
    result, to read the gradient it sends to the model's logits. A crash is explained by how compute_loss
    called the model, where that departs from model(src, tgt_in, src_mask, tgt_mask)."""
    model, batch, criterion = case.loss_case()
    supplied(model)
    logits: list[torch.Tensor] = []

    def keep(_module: nn.Module, _args: tuple, output: Any) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.retain_grad()
            logits.append(output)

    handle = model.register_forward_hook(keep)
    try:
        with _one_thread(), torch.enable_grad(), student_code(), parts.recorded(model, {}, False, "model") as calls, \
                differential.recording(model, _inputs(batch)) as trace:
            loss = compute_loss(model, batch, criterion)
    except RuntimeError as error:
        departure = None if isinstance(error, NotImplementedError) else parts.safely(
            _model_call_departure, calls, batch, complete=False)
        if departure:
            fail("compute_loss crashed.", expected="a loss", got=f"RuntimeError: {str(error).splitlines()[0][:120]}",
                 cause=departure)
        raise
    finally:
        handle.remove()
    trace.output = None
    gradient = None
    grad_ok = isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.requires_grad and bool(logits)
    if grad_ok:
        try:
            loss.backward()
            gradient = logits[-1].grad
        except RuntimeError:
            gradient = None
    return LossRun(_value(loss), isinstance(loss, torch.Tensor) and loss.requires_grad,
                   logits[-1].detach() if logits else None, gradient, calls, trace)


def _reference_loss(case: Setup) -> tuple[torch.Tensor, differential.Trace, Batch]:
    model, batch, criterion = case.loss_case()
    with torch.enable_grad(), differential.recording(model, _inputs(batch)) as trace:
        loss = reference_compute_loss(model, batch, criterion)
    trace.output = None
    return loss.detach(), trace, batch


def _loss_scale(factor: float, targets: torch.Tensor) -> str:
    """What a loss off by a constant factor from the mean over real tokens was divided by, read from the
    factor: the sum over the tokens divided by another count (the sentences, the positions, the target
    length), the mean divided once more, or the plain sum. '' when the factor is none of these."""
    tokens = int((targets != PAD).sum())
    counts = {"the batch size (the number of sentences)": targets.size(0), "the number of real tokens": tokens,
              "the number of positions, <pad> included": targets.numel(), "the target length": targets.size(1)}
    if abs(factor - tokens) < 1e-4 * tokens:
        return " (the loss is summed over the real tokens instead of averaged: divide by their number)"
    for words, count in counts.items():
        if count != tokens and abs(factor * count - tokens) < 1e-4 * tokens:
            return (f" (the loss is summed over the real tokens and divided by {words}, {count}, instead of by "
                    f"the number of real tokens, {tokens})")
        if abs(factor * count - 1) < 1e-4:
            return f" (the mean is divided by {words}, {count}, once more)"
    return ""


# Reading a loss through its gradient. For a cross-entropy with label smoothing eps over V classes,
# averaged with weight w_t per token, the gradient with respect to token t's logits z_t is
#     dL/dz_t = w_t * (softmax(z_t) - q_t),   q_t = (1 - eps) * onehot(y_t) + eps / V.
# So the gradient the student's loss sends back to the logits tells, token by token, which target it
# pulls towards (y_t), how much that token weighs (w_t: 1/N for each of the N real tokens, 0 at <pad>)
# and how much smoothing there is (eps): enough to name where a wrong loss departs from the right one.


def _read_gradient(run: LossRun, batch: Batch, smoothing: float) -> str | None:
    """Where the student's loss departs from the criterion's mean over real tokens, read from its gradient."""
    departure = _model_call_departure(run.calls, batch, complete=True)
    if departure:
        return departure
    if run.logits is None:
        return None
    if run.gradient is None:
        return "the loss does not depend on the logits the model returned." if run.requires_grad else None
    gradient, probabilities = run.gradient.double(), run.logits.double().softmax(-1)  # (batch, tgt_len, V)
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
    per_sentence = 1.0 / (real.sum(1, keepdim=True).double() * targets.size(0))  # (batch, 1)
    if not torch.allclose(ratio, torch.ones_like(ratio), rtol=1e-4):
        if torch.allclose(weight[real], per_sentence.expand_as(weight)[real], rtol=1e-4):
            return ("the loss is averaged per sentence, then over the sentences: a token of a short sentence weighs "
                    "more than one of a long sentence. The criterion averages over all real tokens of the batch "
                    "(each weighs 1/N): apply it once to the whole flattened batch.")
        if torch.allclose(ratio, ratio.mean().expand_as(ratio), rtol=1e-4):
            factor = float(ratio.mean())
            return f"every token's weight in the loss is {factor:.4g} × the right one{_loss_scale(factor, targets)}."
        return "the real tokens do not all weigh the same in the loss: it must be the mean over all real tokens."
    estimate = float((-offset[real] * vocab / weight[real]).median())
    if abs(estimate - smoothing) > 1e-3:
        amount = "no label smoothing" if abs(estimate) < 1e-3 else f"label smoothing {estimate:.3g}"
        return (f"the loss has {amount} where the given criterion has {smoothing:g}: use the `criterion` argument, "
                "not a cross-entropy of your own.")
    return None


def _loss_tensor(loss: Any) -> torch.Tensor:
    loss = _tensor("compute_loss(...)", loss, "return the criterion's output tensor, not loss.item(): "
                   "train_epoch calls loss.backward() on it.")
    return expect_shape("compute_loss(...)", loss, (),
                        cause="the criterion's default reduction='mean' gives one number (a 0-d tensor).")


def _loss_context(batch: Batch, d_model: int) -> differential.Context:
    tokens = int((batch.tgt_out != PAD).sum())
    return differential.Context(
        sizes={"sentence": batch.tgt_out.size(0), "position": batch.tgt_out.size(1), "vocabulary": VOCAB},
        quantities={"the batch size": batch.tgt_out.size(0), "the number of real tokens": tokens,
                    "d_model": d_model},
        words={"input:tgt_in": "batch.tgt_in", "input:tgt_out": "batch.tgt_out", "input:src": "batch.src",
               "input:src_mask": "batch.src_mask", "input:tgt_mask": "batch.tgt_mask"})


def _loss_diagnosis(run: LossRun, case: Setup, expected: torch.Tensor, reference: differential.Trace,
                    batch: Batch) -> Diagnosis:
    """The gradient's reading with the student's line; else what the engine says; else the recipe."""
    reading = _read_gradient(run, batch, case.label_smoothing)
    got = run.loss if isinstance(run.loss, torch.Tensor) else expected
    line, how = _student_line(run.trace, reference, got, expected, _loss_context(batch, case.d_model))
    if reading:
        return Diagnosis("", _at_line(line, reading))
    if line and how and "× the expected values" not in how:  # a factor of one number says nothing
        return Diagnosis("", f"{line}: {how}.")
    return Diagnosis("", "")


@check("compute_loss equals the reference loss (same model, same batch, same criterion)")
def compute_loss_values(compute_loss: Callable[..., Any], batch_size: int = 5, d_model: int = 16,
                        label_smoothing: float = 0.1, seed: int = 2) -> None:
    case = Setup(seed, (batch_size,), d_model=d_model, label_smoothing=label_smoothing)
    run = _loss_run(compute_loss, case)
    got = _loss_tensor(run.loss)
    if not run.requires_grad:
        fail("the loss is not connected to the model's weights.", expected="a tensor with requires_grad=True",
             got="requires_grad=False", cause="don't compute the loss under torch.no_grad() or detach it: "
                                              "train_epoch backpropagates through it.")
    expected, reference, batch = _reference_loss(case)
    expect_close("compute_loss(...)", got, expected, atol=1e-8, rtol=1e-8,
                 diagnose=lambda _got: _loss_diagnosis(run, case, expected, reference, batch),
                 cause="logits = model(src, tgt_in, src_mask, tgt_mask); "
                       "criterion(logits.reshape(-1, vocab), tgt_out.reshape(-1)).")


@check("compute_loss ignores padding: extra <pad> columns leave the loss unchanged")
def compute_loss_ignores_padding(compute_loss: Callable[..., Any], batch_size: int = 4, extra: int = 3,
                                 seed: int = 3) -> None:
    short_case = Setup(seed, (batch_size,), label_smoothing=0.1)
    long_case = Setup(seed, (batch_size,), label_smoothing=0.1, extra=extra)
    short = _loss_tensor(_loss_run(compute_loss, short_case).loss)
    run = _loss_run(compute_loss, long_case)
    long = _loss_tensor(run.loss)

    def diagnose(_got: torch.Tensor) -> Diagnosis:
        expected, reference, batch = _reference_loss(long_case)
        return _loss_diagnosis(run, long_case, expected, reference, batch)

    note = ""
    if not tensors_close(long, short, atol=1e-8, rtol=1e-8):  # it fails: is the loss without the padding wrong too?
        short_expected, _, _ = _reference_loss(short_case)
        if not tensors_close(short, short_expected.to(short.dtype), atol=1e-6, rtol=1e-5):
            note = " (that loss itself differs from the reference's, as the values check says)"
    expect_close("compute_loss on the batch with extra padding", long, short, atol=1e-8, rtol=1e-8,
                 diagnose=diagnose, expected_words=f"the loss your compute_loss gives the same {batch_size} sentences "
                 f"without the {extra} extra <pad> columns{note}",
                 cause="<pad> targets must not count: pass the given `criterion` the targets tgt_out, and "
                       "don't average over all positions yourself.")


# --- the schedule (given code: the checks of train_epoch and fit use the paper's rate) ---------------------


def _paper_rate(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """The paper's rate (eq. 3) times factor; step 0 counts as step 1."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


# --- train_epoch --------------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """What one optimizer.step() saw: the learning rate, the gradients' total norm, whether every gradient was
    None, and (when kept) the flat gradient and the weights before the update."""

    lr: float
    norm: float
    empty: bool
    gradient: torch.Tensor | None = None
    weights: torch.Tensor | None = None


@dataclass
class LossRecord:
    """One call of compute_loss from train_epoch: its value, the batch's real tokens, whether it was
    backpropagated."""

    value: float
    tokens: int
    backpropagated: bool = False


@dataclass
class EpochRun:
    """What the student's train_epoch did: its return value per epoch, every optimizer step, how often it
    stepped the scheduler, the training mode of every forward pass, every loss it computed, the learning rate
    at the end and whether the weights changed."""

    returned: list[Any] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    scheduler_steps: int = 0
    modes: list[bool] = field(default_factory=list)
    losses: list[LossRecord] = field(default_factory=list)
    final_lr: float = 0.0
    changed: bool = False
    events: list[str] = field(default_factory=list)  # "backward" and "step", in the order they happened

    def backward_before_step(self, index: int) -> bool | None:
        """Whether a loss was backpropagated within batch `index` before its optimizer.step() (None: no step)."""
        steps = [position for position, event in enumerate(self.events) if event == "step"]
        if index >= len(steps):
            return None
        start = steps[index - 1] + 1 if index else 0
        return "backward" in self.events[start:steps[index]]

    def empty_step_cause(self, index: int) -> str:
        """Why step `index` found no gradient, read from the order of loss.backward() and optimizer.step()."""
        if "backward" not in self.events:
            return "loss.backward() is never called, so no gradient is ever computed: call it before optimizer.step()."
        if not self.backward_before_step(index):
            return ("the optimiser steps before the gradients are computed: the step applies the gradient that is "
                    "there at that moment, which is none. In the batch optimizer.step() runs before loss.backward(): "
                    "call loss.backward() (and clip) before optimizer.step().")
        return ("loss.backward() ran before optimizer.step(), yet the step found no gradient: the gradients are "
                "zeroed between the two. Zero them at the start of the batch, before loss.backward().")


class _Spy:
    """An optimiser that records, at every step, the learning rate and the gradients it is about to apply."""

    run: EpochRun
    keep: bool

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: ANN401
        parameters = [p for group in self.param_groups for p in group["params"]]  # type: ignore[attr-defined]
        gradients = [p.grad for p in parameters]
        flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                          for g, p in zip(gradients, parameters, strict=True)])
        weights = torch.cat([p.detach().reshape(-1) for p in parameters]) if self.keep else None
        self.run.events.append("step")
        self.run.steps.append(StepRecord(float(self.param_groups[0]["lr"]), float(flat.norm()),  # type: ignore
                                         all(g is None for g in gradients), flat.clone() if self.keep else None,
                                         weights))
        return super().step(closure)  # type: ignore[misc]


class _SpySGD(_Spy, torch.optim.SGD):
    pass


class _SpyAdam(_Spy, torch.optim.Adam):
    pass


@contextmanager
def _course_compute_loss(train_epoch: Callable[..., Any], run: EpochRun) -> Iterator[None]:
    """Let the student's train_epoch call the reference compute_loss (restored afterwards), noting every loss."""
    namespace = getattr(train_epoch, "__globals__", {})
    had = "compute_loss" in namespace
    saved = namespace.get("compute_loss")
    supplied(reference_compute_loss)

    def compute_loss(model: nn.Module, batch: Batch, criterion: nn.Module) -> torch.Tensor:
        loss = reference_compute_loss(model, batch, criterion)
        record = LossRecord(float(loss.detach()), int((batch.tgt_out != PAD).sum()))
        run.losses.append(record)
        if loss.requires_grad:
            def backpropagated(gradient: torch.Tensor) -> torch.Tensor:
                record.backpropagated = True
                return gradient
            loss.register_hook(backpropagated)
        return loss

    supplied(compute_loss)
    if had:
        namespace["compute_loss"] = compute_loss
    try:
        yield
    finally:
        if had:
            namespace["compute_loss"] = saved


@on_student_side
def _train(train_epoch: Callable[..., Any], setup: Setup) -> EpochRun:
    """The student's train_epoch on the setup's model and batches, with the reference compute_loss, a spying
    optimiser and (unless the setup has none) a LambdaLR with the check's own schedule; `setup.epochs` epochs."""
    run = EpochRun()
    model, batches, criterion = setup.model(), setup.batches(), setup.criterion()
    supplied(model)
    if setup.start_in_eval:
        model.eval()  # as evaluate() leaves it, between two epochs
    start = _parameters(model).clone()
    adam_rate = 1.0 if setup.schedule == "warmup" else setup.lr  # the warm-up schedule gives the whole rate
    spy = _SpyAdam(model.parameters(), lr=adam_rate, betas=(0.9, 0.98), eps=1e-9) if setup.optimizer == "adam" \
        else _SpySGD(model.parameters(), lr=setup.lr)
    spy.run, spy.keep = run, setup.keep_gradients
    scheduler = None if setup.schedule == "none" else torch.optim.lr_scheduler.LambdaLR(spy, setup.rate)

    def mode(module: nn.Module, _args: tuple) -> None:
        run.modes.append(module.training and all(part.training for part in module.modules()
                                                 if isinstance(part, nn.Dropout)))

    def accumulated(_parameter: torch.Tensor) -> None:  # a backward pass reached the weights
        if not run.events or run.events[-1] != "backward":
            run.events.append("backward")

    handles = [model.register_forward_pre_hook(mode)] + [
        parameter.register_post_accumulate_grad_hook(accumulated) for parameter in model.parameters()]
    try:
        with _one_thread(), torch.random.fork_rng(devices=[]), student_code(), \
                _course_compute_loss(train_epoch, run):
            torch.manual_seed(salted_seed(setup.seed))
            for _ in range(setup.epochs):
                result = train_epoch(model, batches, criterion, spy, scheduler, device="cpu",
                                     clip_norm=setup.clip_norm, progress=False)
                run.returned.append(float(result) if isinstance(result, int | float | torch.Tensor)
                                    and getattr(result, "numel", lambda: 1)() == 1 else describe(result))
    except AttributeError as error:  # any other crash is explained by its kind (`errors`, `crash`)
        if "NoneType" in str(error) and "step" in str(error) and scheduler is None:
            fail("train_epoch fails when it is given no scheduler.", expected="scheduler=None to be allowed",
                 got=f"AttributeError: {error}" + crash_lines(error),
                 cause="step the scheduler only if there is one: `if scheduler is not None: scheduler.step()`.")
        raise
    finally:
        for handle in handles:
            handle.remove()
    run.final_lr = float(spy.param_groups[0]["lr"])
    run.scheduler_steps = scheduler.last_epoch if scheduler is not None else 0
    run.changed = not torch.equal(_parameters(model), start)
    return run


def _returned(run: EpochRun) -> list[float]:
    for value in run.returned:
        if not isinstance(value, float):
            fail("train_epoch returned something that is not a number.", expected="the mean loss per token",
                 got=value, cause="keep the given `return` line.")
    return run.returned


def _one_step_per_batch(run: EpochRun, batches: int, cause: str | None = None) -> None:
    if len(run.steps) != batches:
        fail("the optimiser did not step once per batch.", expected=f"{batches} steps",
             got=f"{len(run.steps)} steps" + (": the weights never changed" if not run.steps else ""),
             cause=cause or "call optimizer.step() once per batch, after loss.backward() and the clipping.")


def _fresh_gradient(setup: Setup, weights: torch.Tensor, index: int) -> torch.Tensor:
    """The reference gradient of batch `index` at the given weights (what backward gives after zero_grad)."""
    model = setup.model()
    torch.nn.utils.vector_to_parameters(weights.to(next(model.parameters()).dtype), model.parameters())
    model.train()
    with _one_thread(), torch.enable_grad():
        reference_compute_loss(model, setup.batches()[index], setup.criterion()).backward()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()]).double()


def _proportional(got: torch.Tensor, wanted: torch.Tensor) -> float | None:
    """c > 0 with got = c · wanted (up to rounding), else None."""
    denominator = float((wanted * wanted).sum())
    if denominator == 0:
        return None
    scale = float((got * wanted).sum()) / denominator
    if scale > 0 and torch.allclose(got, scale * wanted, rtol=1e-6, atol=1e-9 * float(wanted.abs().max())):
        return scale
    return None


def _accumulated(got: torch.Tensor, fresh: torch.Tensor, before: torch.Tensor) -> bool:
    """Whether got = fresh + before: the previous step's gradient was still in .grad when backward added to it."""
    return bool(torch.allclose(got, fresh + before, rtol=1e-6, atol=1e-9 * float(fresh.abs().max())))


@check("train_epoch trains with dropout on, whatever mode the model was left in")
def train_epoch_train_mode(train_epoch: Callable[..., Any], num_batches: int = 2, seed: int = 8) -> None:
    run = _train(train_epoch, Setup(seed, (4,) * num_batches, dropout=0.3, lr=0.1, start_in_eval=True))
    if not run.modes:
        fail("train_epoch never ran the model.", expected=f"{num_batches} forward passes", got="none",
             cause="compute each batch's loss with compute_loss(model, batch, criterion).")
    if not all(run.modes):
        first = run.modes.index(False) + 1
        fail("the model was in eval mode during training: dropout was off.",
             expected="every forward pass in train mode (the model came in eval mode, as evaluate() leaves it)",
             got=f"{run.modes.count(False)} of {len(run.modes)} forward passes in eval mode, the first of them "
                 f"pass {first}",
             cause=("nothing in train_epoch switches the model back to train mode before its first forward pass: "
                    "evaluate() leaves it in eval mode, so every epoch after the first would train without dropout. "
                    "Call model.train() at the start of train_epoch, before the first forward pass.") if first == 1
             else (f"the model was switched to eval mode before forward pass {first}: something in the loop "
                   "switches it (a call of evaluate(), or model.eval()) and train mode is not restored. Call "
                   "model.train() once at the start of train_epoch and nothing that switches it back inside "
                   "the loop."))


@check("train_epoch: every update is driven by the gradient of its own batch alone")
def train_epoch_zero_grad(train_epoch: Callable[..., Any], num_batches: int = 2, seed: int = 4) -> None:
    setup = Setup(seed, (6,) * num_batches, keep_gradients=True)
    run = _train(train_epoch, setup)
    _one_step_per_batch(run, num_batches)
    recipe = "per batch: optimizer.zero_grad(); loss = compute_loss(...); loss.backward(); clip; optimizer.step()."
    for index, step in enumerate(run.steps):
        got, fresh = step.gradient.double(), _fresh_gradient(setup, step.weights, index)
        if _proportional(got, fresh) is not None:
            continue
        where = f"at batch {index + 1} of {num_batches}"
        if step.empty or float(got.abs().max()) == 0:
            fail("the optimiser's step found no gradients.", expected=f"{where}, the gradient of that batch",
                 got="every .grad None" if step.empty else "every .grad 0",
                 cause=run.empty_step_cause(index) + ("" if step.empty else " (Or they are clipped to a norm "
                                                      "of 0: pass clip_norm as the clipping's limit.)"))
        before = run.steps[index - 1].gradient if index else None
        if before is not None and _accumulated(got, fresh, before.double()):
            fail("the optimiser's step received another gradient than its batch's.",
                 expected=f"{where}, the gradient of that batch alone",
                 got=f"gradient norm {got.norm():.4g} instead of {fresh.norm():.4g}",
                 cause="it received the sum of this batch's gradient and the previous ones: the gradients "
                       "accumulate from batch to batch: call optimizer.zero_grad() at the start of "
                       "every batch (loss.backward() ADDS to .grad).")
        fail("the optimiser's step did not receive the batch's gradient.", expected=f"{where}, the gradient of that "
             f"batch (norm {fresh.norm():.4g}), or a multiple of it after clipping",
             got=f"another gradient, of norm {got.norm():.4g}", cause=f"{RECIPE} {recipe}")


CLIP = "nn.utils.clip_grad_norm_(model.parameters(), clip_norm)"


def _clip_reading(got: torch.Tensor, fresh: torch.Tensor, sizes: list[int], clip_norm: float) -> str | None:
    """How the gradient a step received relates to the batch's fresh gradient: as it was, clamped entry by
    entry, clipped parameter by parameter, or scaled to another norm."""
    norm = float(got.norm())
    if norm == 0:
        return ("every gradient is 0 at optimizer.step(): clipped to a norm of 0 (is clip_norm what you pass as "
                f"the limit?), or zeroed after loss.backward(). Clip with {CLIP}.")
    if torch.allclose(got, fresh, rtol=1e-6):
        return ("the update used the gradients unclipped, as the backward pass left them: their total norm is "
                f"above clip_norm. Call {CLIP} after loss.backward() and before optimizer.step().")
    if torch.allclose(got, fresh.clamp(-clip_norm, clip_norm), rtol=1e-6, atol=1e-12):
        return ("every element was clipped to ±clip_norm (clip_grad_value_): that changes the gradient's "
                f"direction. Clip the total norm: {CLIP}.")
    per_parameter = torch.cat([part * min(1.0, clip_norm / (float(part.norm()) + 1e-6)) for part in fresh.split(sizes)])
    if torch.allclose(got, per_parameter, rtol=1e-6, atol=1e-12):
        return f"each parameter's gradient was clipped to norm clip_norm on its own: clip all of them together, {CLIP}."
    if _proportional(got, fresh) is None:
        return None
    if math.isclose(norm, 1.0, rel_tol=1e-5):
        return "the norm was clipped to 1.0, not to the `clip_norm` argument: pass clip_norm."
    return f"the gradient keeps its direction but its norm is {norm:.4g}, not min(its norm, clip_norm): {CLIP}."


@check("train_epoch: the gradients each update uses have a total norm of at most clip_norm")
def train_epoch_clips_gradients(train_epoch: Callable[..., Any], clip_norm: float = 0.05, num_batches: int = 2,
                                seed: int = 5) -> None:
    setup = Setup(seed, (6,) * num_batches, lr=0.1, clip_norm=clip_norm, keep_gradients=True)
    run = _train(train_epoch, setup)
    _one_step_per_batch(run, num_batches)
    sizes = [p.numel() for p in setup.model().parameters()]
    got_norms, expected_norms, cause = [], [], None
    for index, step in enumerate(run.steps):
        fresh = _fresh_gradient(setup, step.weights, index)
        got_norms.append(step.norm)  # no gradient at the step: nothing to clip (train_epoch_zero_grad says why)
        expected_norms.append(0.0 if step.empty else min(float(fresh.norm()), clip_norm))
        if not math.isclose(got_norms[-1], expected_norms[-1], rel_tol=1e-5):
            cause = cause or _clip_reading(step.gradient.double(), fresh, sizes, clip_norm) or f"clip once: {CLIP}."
    if cause is None:
        return
    fail("the gradients' total norm at the optimiser's step is not the clipped one.",
         expected="norms " + ", ".join(f"{value:.4g}" for value in expected_norms) + f" (clip_norm = {clip_norm})",
         got="norms " + ", ".join(f"{value:.4g}" for value in got_norms), cause=cause)


def _rate_steps(lrs: Sequence[float], setup: Setup, limit: int) -> list[int | None]:
    """For each learning rate an optimizer step used, the schedule index it belongs to (None: none does)."""
    table = [setup.rate(index) for index in range(limit)]
    return [next((index for index, rate in enumerate(table) if math.isclose(lr, rate, rel_tol=1e-9)), None)
            for lr in lrs]


def _schedule_reading(indices: list[int | None], count: int, batches: int) -> str | None:
    """What the schedule steps the updates used (and `count`, the scheduler's steps) say about scheduler.step()."""
    if None in indices:
        return None
    if count == 0 or all(index == 0 for index in indices):
        return "the scheduler is never stepped: call scheduler.step() after every optimizer.step()."
    if indices == list(range(1, len(indices) + 1)):
        return ("the scheduler moved on once before the first update, so every update uses the next step's rate "
                "and the schedule's first rate is never used: scheduler.step() comes before optimizer.step(), or "
                "it is also called once before the loop. Call it only after each optimizer.step().")
    if len(indices) > 1 and all(b - a == 2 for a, b in zip(indices, indices[1:], strict=False)):
        return "the scheduler is stepped twice per batch: once after optimizer.step() is enough."
    if count < batches and indices == sorted(indices):
        return (f"scheduler.step() ran {count} times for {batches} batches: step it once per batch (the schedule "
                "counts optimizer updates, not epochs).")
    return None


@check("train_epoch: the k-th update uses the schedule's k-th learning rate; scheduler=None is allowed")
def train_epoch_follows_the_schedule(train_epoch: Callable[..., Any], num_batches: int = 5, d_model: int = 16,
                                     warmup_steps: int = 3, seed: int = 6) -> None:
    setup = Setup(seed, (4,) * num_batches, copy_task=True, lr=1.0, schedule="warmup", rate_d_model=d_model,
                       warmup_steps=warmup_steps)
    run = _train(train_epoch, setup)
    used = torch.tensor([step.lr for step in run.steps], dtype=torch.float64)
    expected = torch.tensor([setup.rate(index) for index in range(num_batches)], dtype=torch.float64)
    indices = _rate_steps([step.lr for step in run.steps], setup, 3 * num_batches + 3)
    reading = _schedule_reading(indices, run.scheduler_steps, num_batches)
    _one_step_per_batch(run, num_batches, reading)
    listing = ", ".join("?" if index is None else str(index + 1) for index in indices)
    expect_close(f"the list of learning rates of the {num_batches} optimizer steps", used, expected, atol=0, rtol=1e-9,
                 diagnose=lambda _got: Diagnosis(f"the updates used the rates of schedule steps {listing}",
                                                 reading or ""),
                 cause="one scheduler.step() per batch, right after optimizer.step().")
    final = setup.rate(num_batches)
    if not math.isclose(run.final_lr, final, rel_tol=1e-9):
        fail("after the epoch the scheduler is at the wrong step.",
             expected=f"the rate of step {num_batches + 1} after {num_batches} batches",
             got=f"learning rate {run.final_lr:.6g}", cause=_schedule_reading(
                 _rate_steps([run.final_lr], setup, 3 * num_batches + 3), run.scheduler_steps, num_batches)
             or "call scheduler.step() exactly once per batch.")
    _train(train_epoch, Setup(seed, (4,), copy_task=True, lr=1.0, schedule="none"))  # must not crash


def _weighted(records: Sequence[LossRecord]) -> float:
    """The mean loss per real token of the batches' losses (nan when they have no tokens)."""
    tokens = sum(record.tokens for record in records)
    return sum(record.value * record.tokens for record in records) / tokens if tokens else math.nan


@check("train_epoch returns the mean loss per target token, measured before each update")
def train_epoch_mean_loss_per_token(train_epoch: Callable[..., Any], sizes: Sequence[int] = (3, 5, 7),
                                    seed: int = 7) -> None:
    setup = Setup(seed, tuple(sizes), label_smoothing=0.1)  # batches of different sizes: weighting matters
    run = _train(train_epoch, setup)
    got = _returned(run)[0]
    backpropagated = [record for record in run.losses if record.backpropagated]
    if len(backpropagated) == len(sizes):  # the student's own trajectory: independent of how it updates
        expected = _weighted(backpropagated)
        expected_words = ("the mean per real target token of the batch losses your train_epoch backpropagated "
                          "(each before its update)")
    else:  # compute_loss was not called by its name: the reference epoch, as the student's should be
        model = setup.model()
        optimizer = torch.optim.SGD(model.parameters(), lr=setup.lr)
        with _one_thread():
            expected = reference_train_epoch(model, setup.batches(), setup.criterion(), optimizer, None,
                                             clip_norm=setup.clip_norm, progress=False)
        expected_words = "the mean loss per real target token of a correct epoch on the same batches"

    def diagnose(_got: torch.Tensor) -> Diagnosis:
        others = [record for record in run.losses if not record.backpropagated]
        readings = {
            "the loss is measured after the update: the mean is over the losses that were backpropagated, computed "
            "before each update; keep the `loss` that was backpropagated.": _weighted(others) if len(others) == len(
                sizes) else None,
            "the batches' losses are averaged as they are, not weighted by their real tokens: keep the given "
            "lines that multiply each batch's loss by its number of real tokens.": (
                sum(r.value for r in backpropagated) / len(backpropagated) if backpropagated else None),
        }
        found = next((cause for cause, value in readings.items()
                      if value is not None and math.isclose(got, value, rel_tol=1e-7)), "")
        return Diagnosis("", found)

    expect_close("train_epoch(...)", torch.tensor(got, dtype=torch.float64), torch.tensor(expected,
                 dtype=torch.float64), atol=1e-8, rtol=1e-7, diagnose=diagnose, expected_words=expected_words,
                 cause="`loss` must be the batch's mean loss from compute_loss; the given lines weight it by "
                       "the batch's real tokens.")


LEARNS_RATE = 0.005  # a constant rate: a scheduler left unstepped is train_epoch_follows_the_schedule's finding alone


@check("train_epoch learns: on a small copy task the loss falls clearly within a few epochs")
def train_epoch_learns_copy_task(train_epoch: Callable[..., Any], epochs: int = 4, num_batches: int = 16,
                                 seed: int = 0) -> None:
    setup = Setup(seed, (32,) * num_batches, copy_task=True, d_model=32, num_heads=4, d_ff=64, double=False,
                       optimizer="adam", schedule="constant", lr=LEARNS_RATE,
                       clip_norm=1.0, epochs=epochs)
    run = _train(train_epoch, setup)
    losses = _returned(run)
    if losses[-1] < 0.6 * losses[0]:
        return
    if not run.steps:
        cause = "optimizer.step() is never called: call it after loss.backward(), once per batch."
    elif not run.changed:
        cause = ("the weights never changed although the optimiser stepped: " + (
            run.empty_step_cause(0) if run.steps[0].empty else "the gradients were 0 when it ran (zeroed after "
            "loss.backward(), or clipped to a norm of 0?)."))
    else:
        cause = ("the weights change, but the loss falls more slowly than a correct loop's: a step of the loop is "
                 "missing, out of order or wrong (the checks above test each step on its own: see which fail); "
                 f"{RECIPE} per batch zero_grad -> loss from compute_loss(model, batch, criterion) -> backward -> "
                 "clip -> optimizer.step -> scheduler.step.")
    fail("the loss did not fall enough.", expected=f"epoch {epochs} loss below 60% of epoch 1's ({losses[0]:.3f})",
         got="losses per epoch " + ", ".join(f"{loss:.3f}" for loss in losses), cause=cause)


# --- fit: the bug hunt's loop over epochs -------------------------------------------------------------------


@dataclass
class FitRun:
    """What the student's fit did: what it returned, the history list it was given (after the run), the learning
    rate of every optimizer step in order, how often the scheduler stepped, and the history's length at each
    call of after_epoch."""

    returned: Any = None
    history: list[Any] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    scheduler_steps: int = 0
    after_epoch: list[int] = field(default_factory=list)


def _fit_setup(seed: int, num_batches: int, warmup_steps: int) -> Setup:
    """Training batches of a copy task, the paper's schedule (own copy) on SGD, label smoothing 0.1 (so the
    validation loss, without it, is another number than the training criterion would give)."""
    return Setup(seed, (4,) * num_batches, copy_task=True, lr=1.0, schedule="warmup", warmup_steps=warmup_steps,
                 label_smoothing=0.1)


def _validation_batches(setup: Setup) -> list[Batch]:
    return Setup(setup.seed + 1, (5, 3), copy_task=True).batches()


@contextmanager
def _course_train_epoch(fit: Callable[..., Any]) -> Iterator[None]:
    """Let the student's fit call the reference train_epoch, and the given evaluate the reference compute_loss
    (both restored afterwards): a mistake in the student's own train_epoch or compute_loss is not counted again."""
    namespace = getattr(fit, "__globals__", {})
    supplied(reference_train_epoch, reference_compute_loss)
    saved = {name: namespace[name] for name in ("train_epoch", "compute_loss") if name in namespace}
    for name, course in (("train_epoch", reference_train_epoch), ("compute_loss", reference_compute_loss)):
        if name in saved:
            namespace[name] = course
    try:
        yield
    finally:
        namespace.update(saved)


@on_student_side
def _fit(fit: Callable[..., Any], setup: Setup, epochs: int, resume_after: int | None = None) -> FitRun:
    """The student's fit on the setup's model and batches, with a spying optimiser and the check's own LambdaLR
    schedule; with `resume_after`, first until the history holds that many epochs, then on with the same list."""
    run = FitRun()
    model, batches, criterion = setup.model(), setup.batches(), setup.criterion()
    supplied(model)
    spy = _SpySGD(model.parameters(), lr=1.0)
    spy.run, spy.keep = EpochRun(), False
    scheduler = torch.optim.lr_scheduler.LambdaLR(spy, setup.rate)
    history: list[Any] = []

    def after_epoch(records: Any) -> None:
        run.after_epoch.append(len(records) if isinstance(records, list) else -1)

    with _one_thread(), torch.random.fork_rng(devices=[]), student_code(), _course_train_epoch(fit):
        torch.manual_seed(salted_seed(setup.seed))
        for target in ([resume_after] if resume_after else []) + [epochs]:
            run.returned = fit(model, batches, _validation_batches(setup), criterion, spy, scheduler, epochs=target,
                               history=history, clip_norm=setup.clip_norm, after_epoch=after_epoch, progress=False)
    run.lrs = [step.lr for step in spy.run.steps]
    run.scheduler_steps = scheduler.last_epoch
    run.history = [dict(record) if isinstance(record, dict) else describe(record) for record in history]
    run.returned = "the history list" if run.returned is history else describe(run.returned)
    return run


def _reference_fit(setup: Setup, epochs: int) -> list[dict[str, float]]:
    """The history the reference fit records on the same setup (the reference train_epoch and evaluate)."""
    model, batches, criterion = setup.model(), setup.batches(), setup.criterion()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, setup.rate)
    with _one_thread(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(salted_seed(setup.seed))
        return reference_fit(model, batches, _validation_batches(setup), criterion, optimizer, scheduler, epochs,
                             clip_norm=setup.clip_norm, progress=False)


def _steps_listing(lrs: Sequence[float], setup: Setup) -> tuple[list[int | None], str]:
    indices = _rate_steps(lrs, setup, 3 * len(lrs) + 3)
    return indices, ", ".join("?" if index is None else str(index + 1) for index in indices)


def _fit_schedule_reading(indices: list[int | None], num_batches: int, epochs: int) -> str | None:
    """What the schedule steps of the updates say about where fit moves the schedule on."""
    if None in indices or len(indices) != num_batches * epochs:
        return None
    if all(index == 0 for index in indices):
        return ("the schedule never moves on: every update uses the rate of schedule step 1. fit gives train_epoch "
                "no scheduler, and nothing else steps it; train_epoch steps it after every update when fit passes "
                "it `scheduler`.")
    per_epoch = [indices[start:start + num_batches] for start in range(0, len(indices), num_batches)]
    if all(len(set(epoch)) == 1 for epoch in per_epoch) and [epoch[0] for epoch in per_epoch] == list(range(epochs)):
        return ("the schedule moves on once per epoch, not after every update: within an epoch every update uses "
                "the same rate, so the schedule counts epochs and the run stays in the first steps of the warm-up. "
                "fit gives train_epoch no scheduler and steps the scheduler itself after each epoch; train_epoch "
                "steps it after every update when fit passes it `scheduler`, and fit's own scheduler.step() "
                "must go.")
    expected = list(range(num_batches * epochs))
    jumps = [indices[index] - expected[index] for index in range(0, len(indices), num_batches)]
    if jumps == list(range(epochs)) and all(
            indices[start:start + num_batches] == [value + jump for value in expected[start:start + num_batches]]
            for start, jump in zip(range(0, len(indices), num_batches), jumps, strict=True)):
        return ("every update within an epoch moves the schedule on, and then it moves on once more after each "
                "epoch: the scheduler is stepped both by train_epoch and by fit. Only train_epoch should step it.")
    return None


@check("fit: the same training as train_epoch called once per epoch, update by update")
def fit_trains_as_train_epoch(fit: Callable[..., Any], epochs: int = 2, num_batches: int = 3, warmup_steps: int = 5,
                            seed: int = 20) -> None:
    setup = _fit_setup(seed, num_batches, warmup_steps)
    run = _fit(fit, setup, epochs)
    updates = epochs * num_batches
    if len(run.lrs) != updates:
        fail(f"fit made {len(run.lrs)} updates of the weights.",
             expected=f"{updates} updates ({epochs} epochs of {num_batches} batches)", got=f"{len(run.lrs)} updates",
             cause="fit must train until the history holds `epochs` epochs, each a call of train_epoch on the "
                   "training batches (train_epoch makes one update per batch).")
    indices, listing = _steps_listing(run.lrs, setup)
    expected = torch.tensor([setup.rate(index) for index in range(updates)], dtype=torch.float64)
    reading = _fit_schedule_reading(indices, num_batches, epochs)
    # What the rates say about the schedule (its steps, and the reading) is the cause, folded in a notebook: in the
    # bug hunt the student reads only that the rates differ, and where, and works out why.
    steps = f"the updates used the rates of schedule steps {listing} (expected 1 to {updates})"
    recipe = "the schedule must move on after every update, as train_epoch does when it is given the scheduler."
    expect_close(f"the list of learning rates of the {updates} updates ({epochs} epochs of {num_batches} batches)",
                 torch.tensor(run.lrs, dtype=torch.float64), expected, atol=0, rtol=1e-9,
                 diagnose=lambda _got: Diagnosis("", f"{steps}: {reading or recipe}"), cause=recipe)


HISTORY_KEYS = ("epoch", "train_loss", "val_loss", "lr")


@check("fit: one record per epoch (continuing a resumed history): its training loss, validation loss without "
       "smoothing and next learning rate")
def fit_history(fit: Callable[..., Any], epochs: int = 3, resume_after: int = 1, num_batches: int = 2,
                warmup_steps: int = 5, seed: int = 23) -> None:
    setup = _fit_setup(seed, num_batches, warmup_steps)
    run = _fit(fit, setup, epochs, resume_after=resume_after)
    expected = _reference_fit(setup, epochs)
    if run.returned != "the history list":
        fail("fit returned something else than the history it filled.", expected="the `history` list it was given",
             got=run.returned, cause="keep the given `return history`.")
    if len(run.history) != epochs or not all(isinstance(record, dict) for record in run.history):
        fail("the history does not hold one record per epoch.",
             expected=f"{epochs} records (dicts), after training up to {resume_after} epochs and then on to {epochs}",
             got=f"{len(run.history)} records" + (f": {run.history[:2]}" if run.history else ""),
             cause="fit continues after the epochs the history already holds and appends one record per epoch.")
    if run.after_epoch != list(range(1, epochs + 1)):
        fail("after_epoch was not called once after each epoch.",
             expected=f"calls with {', '.join(str(n) for n in range(1, epochs + 1))} records",
             got=f"calls with {', '.join(str(n) for n in run.after_epoch) or 'no'} records",
             cause="call after_epoch(history) once after each epoch's record is appended.")
    def agrees(value: Any, wanted: float) -> bool:
        return isinstance(value, int | float) and math.isclose(float(value), wanted, rel_tol=1e-7, abs_tol=1e-12)

    for number, got in enumerate(run.history, start=1):
        missing = [key for key in HISTORY_KEYS if key not in got]
        if missing:
            fail(f"epoch {number}'s record has no {', '.join(missing)}.",
                 expected=f"the keys {', '.join(HISTORY_KEYS)}", got=", ".join(str(key) for key in got),
                 cause="keep the given record of each epoch.")
    same_training = all(agrees(got[key], wanted[key]) for got, wanted in zip(run.history, expected, strict=True)
                        for key in ("epoch", "train_loss", "lr"))
    indices, _ = _steps_listing(run.lrs, setup)
    reading = _fit_schedule_reading(indices, num_batches, epochs)
    for number, (got, wanted) in enumerate(zip(run.history, expected, strict=True), start=1):
        for key in HISTORY_KEYS:
            if agrees(got[key], wanted[key]):
                continue
            if reading is None and key == "val_loss" and same_training:
                reading = ("the training is the same (every training loss and learning rate agrees) but the "
                           "validation loss is not: it must be measured without label smoothing, with the criterion "
                           "`plain` that fit builds for it.")
            fail(f"epoch {number}'s {key} differs from the same training done epoch by epoch with train_epoch.",
                 expected=f"{key} = {wanted[key]:.6g}",
                 got=f"{key} = {got[key]:.6g}" if isinstance(got[key], int | float) else f"{key} = {got[key]!r}",
                 cause=reading or "fit must train exactly as train_epoch does when called once per epoch with the "
                                  "optimizer and the scheduler, and record what it measured.")


class LongRunRefused(Exception):
    """Section 11's run was not started: a check of the notebook fails (`before_the_long_run`)."""


def before_the_long_run() -> None:
    """Refuse to start the long training run while a check of this notebook fails: with a failing `collate`,
    `compute_loss`, `train_epoch` or `fit` the run would take its 30 to 60 minutes and train the wrong way."""
    failed = failing(__name__)
    if failed:
        raise LongRunRefused(
            "the training run did not start, because these checks above fail:\n"
            + "\n".join(f"  ✘ {title}" for title in failed)
            + "\nRepair them and run their check cells again, then this cell. (To train anyway, set "
              "TRAIN_ANYWAY = True in this cell.)")


# --- predict, then run ------------------------------------------------------------------------------------------

PAPER_D_MODEL, PAPER_BIG_D_MODEL, PAPER_WARMUP = 512, 1024, 4000  # the paper's base and big models (section 5.3)


def _half_right_loss() -> float:
    vocabulary = 10_000
    probabilities = torch.full((1, vocabulary), 0.5 / (vocabulary - 1), dtype=torch.float64)
    probabilities[0, 4] = 0.5  # the right word
    return float(nn.functional.cross_entropy(probabilities.log(), torch.tensor([4])))


@check("your prediction: the loss when the right word gets probability 0.5 of 10,000 words")
def predicted_half_right_loss(predict: Any) -> None:
    expect_number(predict, truths=_half_right_loss, tolerance=0.01,
                  what="the loss when the right word gets probability 0.5",
                  cause="which of the model's probabilities enter the unsmoothed cross-entropy at one position? "
                        "Does how the rest is spread change it?")


def _variant_peak_step() -> float:
    rates = [PAPER_D_MODEL ** -0.5 * min(step ** -0.5, step * PAPER_WARMUP ** -1.0)
             for step in range(1, 5 * PAPER_WARMUP + 1)]
    return float(rates.index(max(rates)) + 1)


@check("your prediction: the step at which the schedule with warmup_steps ** -1.0 peaks")
def predicted_variant_peak_step(predict: Any) -> None:
    expect_number(predict, truths=_variant_peak_step, absolute=0.5,
                  what="the step at which the schedule with warmup_steps ** -1.0 peaks",
                  cause="the rate rises while the second term of the minimum is the smaller one and falls once "
                        "the first is: at which step are the two terms equal, and which whole step is largest?")


@check("your prediction: the peak learning rate of the paper's big model (d_model 1024, warm-up 4000)")
def predicted_peak_rate(predict: Any) -> None:
    expect_number(predict, truths=lambda: max(reference_noam_learning_rate(step, PAPER_BIG_D_MODEL, PAPER_WARMUP)
                                              for step in range(1, 5 * PAPER_WARMUP + 1)), tolerance=0.02,
                  what="the peak learning rate of the schedule with d_model = 1024 and warmup_steps = 4000",
                  cause="at which step does the schedule peak? Put that step into the formula with d_model = "
                        "1024.")
