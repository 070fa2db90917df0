"""Stage 6 checks: batched greedy decoding and the attention maps of a model.

`greedy_decode` is tested two ways:
- on a *scripted* model whose next token is fixed in advance for every sentence and step, so the
  bookkeeping can be pinned down exactly: <bos> first, stop at <eos>, pad finished sentences, respect
  max_len, stop once all are finished, read the last position, hand both masks to the decoder. The
  scripted encoder writes each sentence's number into its output, so a decoder that only sees some of
  the sentences (a batch compacted to the unfinished ones) still gets the right script;
- on a small real Transformer with random weights from a fixed seed, token for token against the
  reference implementation, and twice in a row to see that decoding is deterministic.

The student's function runs in experiments (`checks.boundary`): the model is built from its description
on the student's side, every decoder call is recorded (the tokens it was fed, both masks, its logits),
and only the token ids and the calls come back. The check decodes the same input with the reference on
its own copy of the model, and a difference is read from the values: the first step and sentence where
the tokens part, what the decoder was fed there, which position's argmax the token is, whether the
sentence had already said <eos>, when decoding stopped and which sentences were still running.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_course.checks import lively, parts, runs
from transformer_course.checks.boundary import on_student_side, supplied
from transformer_course.checks.framework import (
    CheckFailed,
    check,
    describe,
    expect_shape,
    expect_tensor,
    fail,
    generator,
    student_code,
    summary,
)
from transformer_course.checks.predictions import expect_number
from transformer_course.checks.salt import salted_seed
from transformer_course.reference import Transformer, make_source_mask, make_target_mask
from transformer_course.reference.decoding import attention_maps as reference_attention_maps
from transformer_course.reference.decoding import greedy_decode as reference_greedy_decode

# the parts of PyTorch this stage's grade cells meet, used once before any notebook code (runner.warm_up_torch):
# tests/test_grading_speed.py fails when a grade cell imports a module
WARM_UP: tuple[str, ...] = ()

__all__ = [
    "attention_maps_rows_sum_to_one",
    "attention_maps_shapes",
    "attention_maps_values",
    "batch_translation_is_independent",
    "batch_translation_matches",
    "bleu_agrees_with_sacrebleu",
    "bleu_brevity_penalty",
    "bleu_clips_counts",
    "bleu_geometric_mean",
    "bleu_returns_three_values",
    "bleu_sums_over_the_corpus",
    "greedy_eval_no_grad",
    "greedy_is_deterministic",
    "greedy_matches_reference",
    "greedy_matches_reference_batch",
    "greedy_passes_masks",
    "greedy_respects_max_len",
    "greedy_starts_with_bos",
    "greedy_stops_at_eos",
    "greedy_stops_when_all_finished",
    "greedy_uses_last_position",
    "predicted_brevity_penalty",
    "predicted_decoder_calls",
    "summary",
]


@dataclass(frozen=True)
class Ids:
    """The special token ids a check passes to greedy_decode (the course's Vocab uses these defaults)."""

    pad: int = 3
    bos: int = 1
    eos: int = 2
    unk: int = 0


NO_TARGET_MASK = ("the decoder gets no target mask (None), so the earlier positions of ys attend to the later ones, "
                  "which they never saw in training, and the last position reads their changed outputs in the next "
                  "layer: pass make_target_mask(ys, pad_idx), the look-ahead mask the model was trained with.")
NO_SOURCE_MASK = ("the decoder gets no source mask (None): pass src_mask, so padding in the source is never "
                  "attended to.")


# --- the scripted model ------------------------------------------------------------------------------------


@dataclass
class _Call:
    """What one decoder call received: the target ids, the sentence numbers and both masks."""

    ys: torch.Tensor
    sentences: list[int] | None  # which sentence each row is (None: not known)
    enc_mask: torch.Tensor | None
    dec_mask: torch.Tensor | None
    logits: torch.Tensor | None = None
    enc_out: torch.Tensor | None = None


class _ScriptedEncoder(nn.Module):
    """Writes each sentence's number (its first source token minus `first_id`) into channel 0."""

    def __init__(self, first_id: int) -> None:
        super().__init__()
        self.first_id = first_id

    def forward(self, src: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        out = torch.zeros(src.size(0), src.size(1), 2, dtype=torch.float64)  # (batch, src_len, 2)
        out[:, :, 0] = (src[:, :1] - self.first_id).double()
        return out


class _ScriptedDecoder(nn.Module):
    """At position j of sentence s the logits peak at scripts[s][j]; after the script: the `chatter` token.

    The peak is highest at position 1 and lower the further a position is from it (so reading position 0
    and an argmax over all positions give different wrong answers); <pad> always gets the lowest logit,
    as in a trained model.
    """

    def __init__(self, scripts: Sequence[Sequence[int]], vocab: int, ids: Ids, chatter: int) -> None:
        super().__init__()
        self.scripts, self.vocab, self.ids, self.chatter = scripts, vocab, ids, chatter
        self.calls: list[_Call] = []

    def forward(self, x: torch.Tensor, enc_out: torch.Tensor, enc_mask: torch.Tensor | None,
                dec_mask: torch.Tensor | None) -> torch.Tensor:
        sentences = [int(round(float(value))) for value in enc_out[:, 0, 0]]
        call = _Call(x.detach().clone(), sentences, _copy(enc_mask), _copy(dec_mask))
        self.calls.append(call)
        batch, length = x.shape
        logits = torch.zeros(batch, length, self.vocab, dtype=torch.float64)  # (batch, len, vocab)
        logits[..., self.ids.pad] = -10.0
        for row, sentence in enumerate(sentences):
            script = self.scripts[sentence]
            for position in range(length):
                token = script[position] if position < len(script) else self.chatter
                logits[row, position, token] = 10.0 - 0.25 * abs(position - 1)
        call.logits = logits
        return logits


class _ScriptedModel(nn.Module):
    """A stand-in with the Transformer's interface: encoder, decoder and forward(src, tgt, src_mask, tgt_mask)."""

    FIRST_ID = 20  # source sentence s starts with token FIRST_ID + s
    VOCAB = 12  # target ids 0..11

    def __init__(self, scripts: Sequence[Sequence[int]], ids: Ids, chatter: int = 9) -> None:
        super().__init__()
        self.encoder = _ScriptedEncoder(self.FIRST_ID)
        self.decoder = _ScriptedDecoder(scripts, self.VOCAB, ids, chatter)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None,
                tgt_mask: torch.Tensor | None) -> torch.Tensor:
        return self.decoder(tgt, self.encoder(src, src_mask), src_mask, tgt_mask)


def _copy(value: Any) -> Any:
    """A tensor the decoder received, kept as it was then; None as it is; anything else described."""
    if value is None or isinstance(value, torch.Tensor):
        return value.detach().clone() if isinstance(value, torch.Tensor) else None
    return describe(value)


def _shown(value: Any) -> str:
    """A value that came back from the student's side, for a message (strings are descriptions already)."""
    return value if isinstance(value, str) else describe(value)


def _scripted_source(count: int, ids: Ids, real_lengths: Sequence[int] | None = None, length: int = 6) -> torch.Tensor:
    """(count, length) source ids: sentence s starts with FIRST_ID + s, then words, then padding."""
    src = torch.full((count, length), 4, dtype=torch.long)
    src[:, 0] = _ScriptedModel.FIRST_ID + torch.arange(count)
    for row, real in enumerate(real_lengths or [length] * count):
        src[row, real:] = ids.pad
    return src


@dataclass(frozen=True)
class Script:
    """A scripted decoding task: what each sentence says, and the max_len it is decoded with."""

    sentences: tuple[tuple[int, ...], ...]
    max_len: int
    ids: Ids = field(default_factory=Ids)
    real_lengths: tuple[int, ...] | None = None  # source lengths before padding (None: no padding)

    def build(self) -> tuple[nn.Module, torch.Tensor]:
        return (_ScriptedModel(self.sentences, self.ids),
                _scripted_source(len(self.sentences), self.ids, self.real_lengths))


def _script(sentences: Sequence[Sequence[int | str]], max_len: int, ids: Ids,
            real_lengths: Sequence[int] | None = None) -> Script:
    """Scripts written with "eos" for the end token, so they follow the ids of a check's variant."""
    return Script(tuple(tuple(ids.eos if token == "eos" else int(token) for token in sentence)
                        for sentence in sentences), max_len, ids,
                  tuple(real_lengths) if real_lengths is not None else None)


# --- a small real model with random weights -------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """A small Transformer with random weights, and the batch it translates."""

    src_vocab: int = 19
    tgt_vocab: int = 17
    d_model: int = 16
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 32
    max_seq_length: int = 40
    dropout: float = 0.1
    batch: int = 4
    src_len: int = 7
    max_len: int = 10
    seed: int = 0


@dataclass(frozen=True)
class Translation:
    """A real decoding task: the model's sizes, the special ids, and whether later sentences are padded."""

    sizes: Sizes
    ids: Ids = field(default_factory=Ids)
    padded: bool = False

    def build(self) -> tuple[nn.Module, torch.Tensor]:
        return _random_model(self.sizes, self.ids), _random_source(self.sizes, self.ids, self.padded)


def _random_model(sizes: Sizes, ids: Ids) -> nn.Module:
    """The course's Transformer with random weights from a fixed seed (the notebook's own random stream left
    untouched); <pad> is never predicted (as in a trained model)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(salted_seed(sizes.seed))
        model = Transformer(sizes.src_vocab, sizes.tgt_vocab, sizes.d_model, sizes.num_heads, sizes.num_layers,
                            sizes.d_ff, sizes.max_seq_length, sizes.dropout)
    with torch.no_grad():
        model.decoder.pred_layer.bias[ids.pad] = -1e4
    return model.double().eval()


def _random_source(sizes: Sizes, ids: Ids, padded: bool) -> torch.Tensor:
    """(batch, src_len) ids without special tokens inside; later sentences shorter (padded) if `padded`."""
    draws = torch.randint(4, sizes.src_vocab, (sizes.batch, sizes.src_len), generator=generator(sizes.seed + 100))
    if padded:
        for row in range(1, sizes.batch):
            draws[row, max(2, sizes.src_len - 2 * row):] = ids.pad
    return draws


# --- running the student's decoder (on the student's side) -----------------------------------------------------


class _Selections(TorchFunctionMode):
    """Records the argmax / max / topk calls of the student's decoder: (input shape, dim)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple[int, ...], Any]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("argmax", "max", "topk") and args and isinstance(args[0], torch.Tensor):
            self.calls.append((tuple(args[0].shape), kwargs.get("dim", args[1] if len(args) > 1 else None)))
        return func(*args, **kwargs)


BATCH = ("the code handles one sentence at a time only (`.item()`, `if next_token == eos_idx:` or a `break` at the "
         "first <eos> are fine for a single sentence). For a batch keep a boolean vector `finished` (batch,), "
         "set it where the new token is eos_idx, give finished sentences pad_idx, and stop once finished.all().")


def _crash_cause(error: Exception, selections: _Selections, batch: int) -> str | None:
    """Name a crash of the student's decoding loop from its error and the argmax calls it made."""
    for shape, dim in selections.calls:
        if len(shape) == 2 and shape[0] == batch and dim in (0, -2):
            return ("next_token is taken over axis 0, the sentences: logits[:, -1] is (batch, vocab), so the next "
                    "token is its argmax over the vocabulary, logits[:, -1].argmax(dim=-1), one id per sentence.")
    if "same number of dimensions" in str(error):
        return ("torch.cat joins ys (batch, len) with next_token (batch,): give the new tokens a length axis, "
                "torch.cat([ys, next_token.unsqueeze(1)], dim=1).")
    return None


@dataclass
class _Run:
    """The student's output ids and what every decoder call received."""

    ys: torch.Tensor
    calls: list[_Call]


def _decode_once(greedy_decode: Callable, model: nn.Module, src: torch.Tensor, ids: Ids, max_len: int,
                 selections: _Selections) -> tuple[Any, list[_Call]]:
    """Run the student's greedy_decode (with gradients allowed: the function itself must switch them off)."""
    scripted = isinstance(model, _ScriptedModel)
    start = len(model.decoder.calls) if scripted else 0
    with torch.enable_grad(), student_code(), selections, parts.recorded(model, {"decoder": "decoder"}, False) as calls:
        got = greedy_decode(model, src, ids.pad, ids.bos, ids.eos, max_len)
    if scripted:
        return got, model.decoder.calls[start:]
    steps = [_Call(call.args["x"].detach(), list(range(src.size(0))) if call.args["x"].size(0) == src.size(0)
                   else None, _copy(call.args.get("enc_mask")), _copy(call.args.get("dec_mask")),
                   call.output.detach() if isinstance(call.output, torch.Tensor) else None,
                   _copy(call.args.get("enc_out"))) for call in calls if isinstance(call.args.get("x"), torch.Tensor)]
    return got, steps


def _ids(got: Any, src: torch.Tensor) -> str | None:
    """Why `got` is not a (batch, out_len) tensor of ids, or None when it is."""
    if not isinstance(got, torch.Tensor):
        return f"{describe(got)} instead of a tensor"
    if got.is_floating_point():
        return "floating-point values"
    if got.dim() != 2 or got.size(0) != src.size(0):
        return f"shape {tuple(got.shape)}"
    return None


def _call(greedy_decode: Callable, model: nn.Module, src: torch.Tensor, ids: Ids, max_len: int) -> _Run:
    """The student's decoding of `src`. A decoder that fails on this batch but decodes its first sentence
    alone is told so (it was written for one sentence), instead of a crash in every cell."""
    error: Exception | None = None
    selections = _Selections()
    try:
        got, calls = _decode_once(greedy_decode, model, src, ids, max_len, selections)
        problem = _ids(got, src)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as crash:  # noqa: BLE001  (explained below, or re-raised)
        error, problem = crash, f"{type(crash).__name__}: {(str(crash).splitlines() or [''])[0][:120]}"
    if problem is not None and src.size(0) > 1:
        try:
            single, _ = _decode_once(greedy_decode, model, src[:1], ids, max_len, _Selections())
            alone = _ids(single, src[:1]) is None
        except Exception:  # noqa: BLE001  (then the problem is not about batches)
            alone = False
        if alone:
            fail(f"greedy_decode decodes one sentence, but not a batch of {src.size(0)}.",
                 expected=f"a (batch={src.size(0)}, out_len) tensor of token ids", got=problem, cause=BATCH)
    if error is not None:
        cause = _crash_cause(error, selections, src.size(0))
        if cause is None:
            raise error
        fail("greedy_decode crashed.", expected="a (batch, out_len) tensor of token ids", got=problem, cause=cause)
    ys = expect_tensor("greedy_decode(...)", got, cause="return ys, the (batch, out_len) tensor of token ids.")
    if ys.is_floating_point():
        fail("greedy_decode returned floating-point values, not token ids.", expected="an integer tensor (torch.long)",
             got=describe(ys), cause="argmax already gives integer ids; keep ys as torch.long (do not use "
                                     "probabilities or torch.zeros without dtype=torch.long).")
    if ys.dim() != 2 or ys.size(0) != src.size(0):
        fail("greedy_decode returned the wrong shape.", expected=f"(batch={src.size(0)}, out_len)",
             got=tuple(ys.shape), cause="append one column per step: torch.cat([ys, next_token.unsqueeze(1)], dim=1).")
    return _Run(ys.detach().cpu().long(), calls)


@on_student_side
def _decoded(greedy_decode: Callable, task: Script | Translation, times: int = 1) -> list[_Run]:
    """The student's decoding of the task's source, `times` times in a row on the same model."""
    model, src = task.build()
    supplied(model)
    max_len = task.max_len if isinstance(task, Script) else task.sizes.max_len
    with torch.random.fork_rng(devices=[]):  # the notebook's random stream is left untouched
        return [_call(greedy_decode, model, src, task.ids, max_len) for _ in range(times)]


@on_student_side
def _decoding_states(greedy_decode: Callable, task: Translation) -> list[tuple[bool, bool]]:
    """(gradients enabled, model in train mode) at every encoder and decoder call, for a model handed over in
    train mode, as straight from training."""
    model, src = task.build()
    supplied(model)
    model.train()
    states: list[tuple[bool, bool]] = []

    def note(_module: nn.Module, _args: tuple) -> None:
        states.append((torch.is_grad_enabled(), model.training))

    handles = [model.encoder.register_forward_pre_hook(note), model.decoder.register_forward_pre_hook(note)]
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(task.sizes.seed)  # dropout's draws, and so the number of steps, the same every run
            _call(greedy_decode, model, src, task.ids, task.sizes.max_len)
    finally:
        for handle in handles:
            handle.remove()
    return states


# --- reading a difference in the token ids -----------------------------------------------------------------------


def _word(token: int, ids: Ids) -> str:
    return {ids.bos: "<bos>", ids.eos: "<eos>", ids.pad: "<pad>"}.get(int(token), str(int(token)))


def _show(rows: torch.Tensor, ids: Ids) -> str:
    return "".join(f"\n      sentence {index}: " + " ".join(_word(token, ids) for token in row)
                   for index, row in enumerate(rows))


def _words(tokens: torch.Tensor, ids: Ids) -> str:
    return "[" + " ".join(_word(token, ids) for token in tokens) + "]"


def _said_eos(row: torch.Tensor, ids: Ids, before: int) -> int | None:
    """The step (column) at which a sentence first said <eos>, among columns 1 .. before - 1."""
    found = (row[1:before] == ids.eos).nonzero()
    return int(found[0]) + 1 if found.numel() else None


def _shorter(got: torch.Tensor, expected: torch.Tensor, column: int, sentence: int, ids: Ids, max_len: int
             ) -> str:
    """Why the student's output ends at `column` while sentence `sentence` goes on in the reference's."""
    ended = f"your output ends after step {column - 1}"
    goes_on = _word(int(expected[sentence, column]), ids)
    finished = [row for row in range(got.size(0)) if _said_eos(got[row], ids, column) is not None]
    running = [row for row in range(expected.size(0)) if _said_eos(expected[row], ids, column) is None]
    if column - 1 == max_len - 1:
        return (f"{ended}, with {max_len - 1} tokens generated, one too few: the loop must run up to max_len "
                f"times (for _ in range(max_len)), so ys can reach max_len + 1 = {max_len + 1} columns with <bos>.")
    last = expected[:, column]
    if column == expected.size(1) - 1 and all(int(token) in (ids.eos, ids.pad) for token in last):
        return (f"{ended}, before the last <eos> (sentence {sentence} says it at step {column}): the loop breaks "
                "before the last <eos> is appended. Append the new tokens to ys first, then update `finished` and "
                "test finished.all().")
    if finished and running:
        return (f"{ended}, where sentence {finished[0]} had said <eos> but sentence {running[0]} had not: decoding "
                "stops as soon as ONE sentence is finished. Break only when all are, finished.all(), not "
                "finished.any().")
    return (f"{ended}, but sentence {sentence} had not finished: it goes on with {goes_on} (decode until every "
            "sentence has produced <eos>, or max_len tokens).")


def _longer(got: torch.Tensor, column: int, ids: Ids, max_len: int) -> str:
    """Why the student's output goes on at `column` after the reference's ended."""
    extra = got[:, column:]
    if column == max_len + 1:
        return (f"your output goes on after max_len = {max_len} generated tokens: one token too many, the loop "
                "runs max_len + 1 times; use range(max_len), <bos> is not generated.")
    if bool((extra == ids.pad).all()):
        return (f"decoding never stops early: every sentence had said <eos> by step {column - 1}, yet your output "
                f"goes on with {extra.size(1)} columns of pure <pad>. Once every sentence is finished, break out of "
                "the loop (if finished.all(): break).")
    return (f"your output goes on after step {column - 1}, where every sentence had finished or max_len tokens were "
            "generated: stop there.")


def _after_eos(got: torch.Tensor, sentence: int, column: int, said: int, mine: int, ids: Ids) -> str:
    """Why a finished sentence gets `mine` at `column` (it said <eos> at step `said`)."""
    head = f"sentence {sentence} said <eos> at step {said}, yet at step {column} it gets {_word(mine, ids)}"
    if mine == ids.eos:
        return f"{head}: finished sentences are filled with <eos> instead of <pad>: fill them with pad_idx."
    between = got[sentence, said + 1:column].tolist()
    if ids.pad in between:
        return (f"{head}, after {_word(ids.pad, ids)} in between: `finished` forgets earlier sentences. It is "
                "overwritten each step (finished = next_token == eos_idx) instead of accumulated "
                "(finished |= next_token == eos_idx).")
    return (f"{head}: finished sentences keep producing words after their <eos>. Replace their new token with "
            "pad_idx, e.g. next_token.masked_fill(finished, pad_idx) or torch.where(finished, pad_idx, next_token).")


def _mask_rows(mask: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    try:
        return (mask.detach().cpu() != 0).expand(shape)
    except RuntimeError:
        return None


def _at_step(head: str, call: _Call, row: int, sentence: int, column: int, mine: int, theirs: int,
             src: torch.Tensor, so_far: torch.Tensor, ids: Ids) -> str:
    """What the decoder call of this step says about the student's token."""
    fed = call.ys[row].cpu()
    if not torch.equal(fed, so_far):
        return f"{head}. At that step the decoder was fed {_words(fed, ids)} instead of {_words(so_far, ids)}."
    shape = (call.ys.size(0), 1, column, src.size(1))
    mask = _mask_rows(call.enc_mask, shape) if isinstance(call.enc_mask, torch.Tensor) else None
    if mask is None or not torch.equal(mask[row, 0], (src[sentence] != ids.pad).expand(column, src.size(1))):
        return f"{head}. At that step the decoder's src_mask was not make_source_mask(src, pad_idx)."
    if call.logits is None:
        return head + "."
    logits = call.logits[row]  # (len, vocab)
    best = int(logits[-1].argmax())
    if best == theirs and mine == ids.pad and theirs == ids.eos:
        return (f"{head}: the <eos> itself was replaced by <pad>. Pad only the sentences that had finished "
                "before this step: update `finished` from the token just appended.")
    positions = [position for position in range(logits.size(0) - 1) if int(logits[position].argmax()) == mine]
    if best == theirs and positions:
        return (f"{head}: that is the token the model predicts at position {positions[0]} (the argmax of "
                f"logits[:, {positions[0]}]); the next token is the one it predicts at the LAST position, "
                "logits[:, -1].argmax(dim=-1).")
    if best == theirs:
        return f"{head}: the decoder's logits at the last position pick {_word(best, ids)}; append their argmax."
    return (f"{head}: with the same tokens so far, the decoder's logits differ from the reference's, so something "
            "else it receives differs (the encoder output, computed once as model.encoder(src, src_mask), or the "
            "target mask make_target_mask(ys, pad_idx)).")


def _step_departure(got: torch.Tensor, expected: torch.Tensor, calls: Sequence[_Call], src: torch.Tensor,
                    ids: Ids, max_len: int | None = None) -> str | None:
    """The first step and sentence where the student's tokens leave the reference's, and why, from the values:
    when the output stops, whether the sentence had finished, what the decoder was fed at that step (its tokens
    so far, its masks) and which position's argmax the student's token is."""
    if got.size(1) > 1 and bool((got[:, -1] == ids.bos).all()) and not bool((got[:, 0] == ids.bos).all()):
        return ("your sequences end with <bos>: the new tokens are put in front of ys (prepended); append them "
                "after it.")
    if got.size(1) and expected.size(1) and not torch.equal(got[:, 0], expected[:, 0]):
        first = sorted({_word(int(token), ids) for token in got[:, 0]})
        return (f"your sequences start with {', '.join(first)}, not <bos>: keep the given ys = torch.full(..., "
                "bos_idx); the decoder's first input is <bos>, and the returned sequence keeps it.")
    limit = max_len if max_len is not None else max(got.size(1), expected.size(1))
    for column in range(1, max(got.size(1), expected.size(1))):
        for sentence in range(expected.size(0)):
            mine = int(got[sentence, column]) if column < got.size(1) else None
            theirs = int(expected[sentence, column]) if column < expected.size(1) else None
            if mine == theirs:
                continue
            if mine is None:
                return _shorter(got, expected, column, sentence, ids, limit)
            if theirs is None:
                return _longer(got, column, ids, limit)
            said = _said_eos(expected[sentence], ids, column)
            if said is not None:
                return _after_eos(got, sentence, column, said, mine, ids)
            head = f"sentence {sentence}, step {column}: your token is {_word(mine, ids)}, the reference's " \
                   f"{_word(theirs, ids)}"
            so_far = expected[sentence, :column]
            call = next((call for call in calls if call.sentences is not None and sentence in call.sentences
                         and call.ys.size(1) == column), None)
            if call is None:
                lengths = sorted({int(call.ys.size(1)) for call in calls})
                if lengths == [1] and column > 1:
                    return (f"{head}. Every decoder call got ys of length 1, only the last token: the decoder needs "
                            "the whole sequence so far, model.decoder(ys, ...) with all of ys, at every step.")
                known = all(call.sentences is not None for call in calls)
                return head + (f". No decoder call got the {column} tokens of sentence {sentence} so far, "
                               f"{_words(so_far, ids)}: the decoder was fed ys of lengths {lengths}. Feed it the "
                               "whole sequence so far at every step." if known else ".")
            return _at_step(head, call, call.sentences.index(sentence), sentence, column, mine, theirs, src,
                            so_far, ids)
    return None


def _expect_ids(run: _Run, expected: torch.Tensor, src: torch.Tensor, ids: Ids, max_len: int, *, problem: str,
                cause: str) -> None:
    """Exact comparison of token ids, naming the first step where they depart from the reference's and why."""
    got = run.ys
    if got.shape == expected.shape and torch.equal(got, expected):
        return
    fail(problem, expected=f"shape {tuple(expected.shape)}{_show(expected, ids)}",
         got=f"shape {tuple(got.shape)}{_show(got, ids)}",
         cause=_step_departure(got, expected, run.calls, src, ids, max_len) or cause)


def _expected(task: Script | Translation) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(the reference's ids, the source, max_len) for a task, on the check's own copy of its model."""
    model, src = task.build()
    max_len = task.max_len if isinstance(task, Script) else task.sizes.max_len
    with torch.no_grad():
        return reference_greedy_decode(model, src, task.ids.pad, task.ids.bos, task.ids.eos, max_len), src, max_len


def _scripted_case(greedy_decode: Callable, script: Script) -> tuple[_Run, torch.Tensor, torch.Tensor]:
    """(student's run, expected ids, the source) on a scripted model."""
    run = _decoded(greedy_decode, script)[0]
    expected, src, _ = _expected(script)
    return run, expected, src


STOP_SCRIPT = ((5, 6, "eos"), ("eos",), (6, 6, 5, 5, "eos"))  # finishes after 3, 1 and 5 steps
ENDLESS_SCRIPT = ((5, 6, 7, 8, 5, 6, 7, 8, 5, 6), (8, 7, 6, 5, 8, 7, 6, 5, 8, 7))  # never says <eos>
EARLY_SCRIPT = (("eos",), (7, "eos"), (5, 6, "eos"))  # all finished after 3 steps


# Checks whose property does not need a batch decode one sentence, so that a decoder written for one
# sentence loses only the points of the checks about batches (which then say so).


@check("greedy_decode returns token ids (batch, out_len) whose first column is <bos>")
def greedy_starts_with_bos(greedy_decode: Callable, bos_idx: int = 1, eos_idx: int = 2, pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    script = _script(STOP_SCRIPT[:1], 8, ids)
    run, expected, src = _scripted_case(greedy_decode, script)
    got, start = run.ys, expected[:, :2]
    if got.size(1) == 0 or not torch.equal(got[:, :2], start[:, :got.size(1)]):
        fail("the output's first two columns (<bos>, then the first generated token) are wrong.",
             expected=f"columns 0 and 1 = {start.tolist()}", got=f"columns 0 and 1 = {got[:, :2].tolist()}",
             cause=_step_departure(got, start, run.calls, src, ids)
             or "step 1 feeds ys = <bos> to the decoder and appends the argmax of logits[:, -1].")


@check("each sentence stops at its own <eos>; finished sentences are padded with <pad>")
def greedy_stops_at_eos(greedy_decode: Callable, bos_idx: int = 1, eos_idx: int = 2, pad_idx: int = 3,
                        sentences: Sequence[Sequence[int | str]] = STOP_SCRIPT, max_len: int = 8) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, src = _scripted_case(greedy_decode, _script(sentences, max_len, ids))
    _expect_ids(run, expected, src, ids, max_len,
                problem="a scripted model whose sentences say <eos> after different numbers of steps "
                        "was decoded wrongly.",
                cause="keep a `finished` vector; after <eos> a sentence only gets pad_idx; stop when all are finished.")


@check("without any <eos>, greedy_decode generates exactly max_len tokens (max_len + 1 columns with <bos>)")
def greedy_respects_max_len(greedy_decode: Callable, max_len: int = 5, bos_idx: int = 1, eos_idx: int = 2,
                            pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, src = _scripted_case(greedy_decode, _script(ENDLESS_SCRIPT[:1], max_len, ids))
    _expect_ids(run, expected, src, ids, max_len,
                problem=f"a scripted model that never says <eos> was decoded with max_len={max_len} wrongly.",
                cause="run the loop at most max_len times: range(max_len) generates max_len tokens after <bos>.")


@check("greedy_decode stops as soon as every sentence is finished (no columns of pure padding)")
def greedy_stops_when_all_finished(greedy_decode: Callable, max_len: int = 9, bos_idx: int = 1, eos_idx: int = 2,
                                   pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, src = _scripted_case(greedy_decode, _script(EARLY_SCRIPT, max_len, ids))
    _expect_ids(run, expected, src, ids, max_len,
                problem="every sentence of a scripted model says <eos> within 3 steps, but the output is wrong.",
                cause="after appending the new tokens, `if finished.all(): break`.")


@check("each new token is the word the model rates most likely to come next")
def greedy_uses_last_position(greedy_decode: Callable, max_len: int = 4, bos_idx: int = 1, eos_idx: int = 2,
                              pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, src = _scripted_case(greedy_decode, _script(ENDLESS_SCRIPT[:1], max_len, ids))
    _expect_ids(run, expected, src, ids, max_len,
                problem="a scripted model that predicts a different word at every position was decoded wrongly.",
                cause="logits has shape (batch, len, vocab); the next token is logits[:, -1].argmax(dim=-1).")


@check("every decoder call gets the source padding mask and the causal target mask of the current ys")
def greedy_passes_masks(greedy_decode: Callable, bos_idx: int = 1, eos_idx: int = 2, pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    real_lengths = [4]  # one sentence (no batch needed for this property), with source padding
    run = _decoded(greedy_decode, _script(STOP_SCRIPT[2:], 8, ids, real_lengths))[0]
    source_allowed = torch.arange(6).unsqueeze(0) < torch.tensor(real_lengths).unsqueeze(1)  # (sentences, src_len)
    if not run.calls:
        fail("the decoder was never called.", expected="one call per generated token", got="no call",
             cause="call model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx)) inside the loop.")
    for step, call in enumerate(run.calls, start=1):
        batch, length = call.ys.shape
        if call.enc_mask is None:
            fail(f"decoder call {step} got no source mask.", expected="src_mask (batch, 1, 1, src_len)", got="None",
                 cause=NO_SOURCE_MASK)
        allowed = _mask_rows(call.enc_mask, (batch, 1, length, 6)) if isinstance(call.enc_mask, torch.Tensor) \
            else None
        wanted = source_allowed[call.sentences].unsqueeze(1).unsqueeze(1).expand(batch, 1, length, 6)
        if allowed is None or not torch.equal(allowed, wanted):
            fail(f"decoder call {step} got a wrong source mask.",
                 expected="the padding mask of src: False at its padded positions",
                 got=_shown(call.enc_mask), cause="pass the given src_mask (computed once before the loop).")
        if call.dec_mask is None:
            fail(f"decoder call {step} got no target mask.", expected=f"a causal mask (batch, 1, {length}, {length})",
                 got="None", cause=NO_TARGET_MASK)
        allowed = _mask_rows(call.dec_mask, (batch, 1, length, length)) \
            if isinstance(call.dec_mask, torch.Tensor) else None
        causal = torch.ones(length, length, dtype=torch.bool).tril()  # (len, len)
        running = ~(call.ys == ids.pad).any(dim=1)  # sentences without padding yet: their mask is causal
        if allowed is None or not bool((allowed[running] == causal).all()):
            fail(f"decoder call {step} (ys of length {length}) got a wrong target mask.",
                 expected=f"the look-ahead mask of ys: lower-triangular ({length}, {length}) per sentence",
                 got=_shown(call.dec_mask),
                 cause="build the target mask from the current ys inside the loop, make_target_mask(ys, pad_idx); "
                       "a mask built once before the loop has the wrong size.")


def _lively(task: Translation, tries: int = 150) -> Translation:
    """The task on the first of `tries` random models (`lively.seeds`) whose reference
    translation shows what these checks compare: at least two different generated tokens over three or more
    steps (a model that says one token whatever it reads agrees with a loop that reads the wrong position or
    masks nothing), other tokens when the decoder is called without the target mask (where no later position
    changes what an earlier one says, a loop that masks nothing agrees) and, for a batch, a sentence ending with
    <eos> while another goes on for two steps more at least (else a loop that never pads, or stops at the first
    <eos>, or forgets after one step that a sentence has finished, agrees). The seeds the
    course writes pass at once; the hidden tests' seeds, drawn from the class's secret, are random, so most
    random models would show neither."""
    for seed in lively.seeds(task.sizes.seed, tries):
        candidate = replace(task, sizes=replace(task.sizes, seed=seed))
        expected, _, _ = _expected(candidate)
        if lively.shows_decoding(expected[:, 1:], task.ids.eos, task.ids.pad, min_steps=3, after_first_end=2) \
                and _target_mask_matters(candidate, expected):
            return candidate
    return task


def _target_mask_matters(task: Translation, expected: torch.Tensor) -> bool:
    """Whether greedy decoding of `task` with every decoder call given no target mask gives other ids than
    `expected` (the reference's): with one layer it never does (the last position may see every earlier one)."""
    model, src = task.build()
    # the reference's greedy decoding, its decoder calls (ys, enc_out, src_mask, tgt_mask) given no tgt_mask
    unmask = model.decoder.register_forward_pre_hook(lambda _decoder, args: (*args[:3], None))
    try:
        with torch.no_grad():
            ys = reference_greedy_decode(model, src, task.ids.pad, task.ids.bos, task.ids.eos, task.sizes.max_len)
    finally:
        unmask.remove()
    return ys.shape != expected.shape or not torch.equal(ys, expected)


def _random_case(greedy_decode: Callable, task: Translation) -> None:
    task = _lively(task)
    run = _decoded(greedy_decode, task)[0]
    expected, src, max_len = _expected(task)
    _expect_ids(run, expected, src, task.ids, max_len,
                problem=f"a small Transformer with random weights (seed {task.sizes.seed}) translates "
                        f"{'a padded batch' if task.padded else 'this input'} differently from the reference.",
                cause="each step: logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx)); "
                      "next_token = logits[:, -1].argmax(dim=-1); pad finished sentences; append to ys.")


@check("on a small random Transformer, greedy_decode gives exactly the reference token ids")
def greedy_matches_reference(greedy_decode: Callable, eos_idx: int = 2, **sizes: int) -> None:
    _random_case(greedy_decode, Translation(replace(Sizes(batch=1, src_len=6), **sizes), Ids(eos=eos_idx)))


@check("on a padded batch of source sentences, greedy_decode gives exactly the reference token ids")
def greedy_matches_reference_batch(greedy_decode: Callable, eos_idx: int = 2, **sizes: int) -> None:
    _random_case(greedy_decode, Translation(replace(Sizes(seed=4), **sizes), Ids(eos=eos_idx), padded=True))


@check("decoding is deterministic: the next token is the argmax, not a sample")
def greedy_is_deterministic(greedy_decode: Callable) -> None:
    ids = Ids()
    first, *others = [run.ys for run in _decoded(greedy_decode, Translation(Sizes(dropout=0.5, seed=3, batch=1)),
                                                 times=3)]
    for got in others:
        if got.shape != first.shape or not torch.equal(got, first):
            fail("the same model (in eval mode) and input gave different translations.",
                 expected=f"every call like the first:{_show(first, ids)}", got=f"another call:{_show(got, ids)}",
                 cause="take the argmax of the logits instead of sampling (torch.multinomial, torch.distributions).")


@check("greedy_decode switches the model to eval mode and runs under torch.no_grad()")
def greedy_eval_no_grad(greedy_decode: Callable) -> None:
    states = _decoding_states(greedy_decode, Translation(Sizes(dropout=0.5, seed=3, batch=1)))
    if any(training for _, training in states):
        fail("the model ran in train mode while decoding: dropout was on.", expected="eval mode in every call",
             got=f"{sum(training for _, training in states)} of {len(states)} calls in train mode",
             cause="keep the given model.eval() at the start of greedy_decode: a model handed over straight from "
                   "training is in train mode, and dropout then changes the translation from call to call.")
    if any(grad for grad, _ in states):
        fail("decoding builds autograd graphs.", expected="every call under torch.no_grad()",
             got=f"gradients enabled in {sum(grad for grad, _ in states)} of {len(states)} calls",
             cause="keep the given @torch.no_grad() above greedy_decode: decoding needs no gradients, and without "
                   "it every step keeps the whole graph of the decoder in memory.")


# --- attention maps ----------------------------------------------------------------------------------------

KINDS = ("encoder_self", "decoder_self", "cross")
AXES = ("layers", "batch", "heads", "q_len", "k_len")


@dataclass(frozen=True)
class MapsCase:
    """A random model, the batch it runs forward once, and the target length."""

    sizes: Sizes
    tgt_len: int

    def run(self) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
        """The model after one forward pass (its attention modules keep their weights), the source, the target."""
        ids = Ids()
        model = _random_model(self.sizes, ids)
        src = _random_source(self.sizes, ids, padded=True)
        tgt = torch.randint(4, self.sizes.tgt_vocab, (self.sizes.batch, self.tgt_len),
                            generator=generator(self.sizes.seed + 200))
        tgt[:, 0] = ids.bos
        with torch.no_grad():
            model(src, tgt, make_source_mask(src, ids.pad), make_target_mask(tgt, ids.pad))
        return model, src, tgt


@on_student_side
def _student_maps(attention_maps: Callable, case: MapsCase) -> Any:
    """What the student's attention_maps returns for the model after its forward pass: a dict of its values
    (tensors, or what else they are), or what else it returned."""
    model, _, _ = case.run()
    supplied(model)
    with torch.no_grad(), student_code():
        got = attention_maps(model)
    if not isinstance(got, Mapping):
        return describe(got)
    return {str(key): value.detach() if isinstance(value, torch.Tensor) else describe(value)
            for key, value in got.items()}


def _maps_case(attention_maps: Callable, tgt_len: int, sizes: Mapping[str, int]
               ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.Tensor]:
    """(the student's maps as float64 tensors of the expected shapes, the reference maps, the source), or a
    failure that says why the student's maps are not that."""
    config = replace(Sizes(), **sizes)
    case = MapsCase(config, tgt_len)
    got = _student_maps(attention_maps, case)
    model, src, tgt = case.run()
    expected = reference_attention_maps(model)
    if not isinstance(got, dict):
        fail("attention_maps did not return a dictionary.", expected=f"a dict with the keys {list(KINDS)}",
             got=got, cause="keep the given return {...} line with the three stacked tensors.")
    missing = [kind for kind in KINDS if kind not in got]
    if missing:
        fail("attention_maps misses some kinds.", expected=list(KINDS), got=list(got),
             cause="return all three: encoder self-attention, decoder self-attention and cross-attention.")
    expected = {kind: value.detach() for kind, value in expected.items()}
    return _map_tensors(got, expected), expected, src


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), atol=1e-9, rtol=1e-7))


def _reduced(got: torch.Tensor, reference: torch.Tensor) -> str | None:
    """'averaged over the heads axis' and the like: got is the reference with one axis reduced or indexed away."""
    for axis, name in enumerate(AXES):
        if tuple(got.shape) != tuple(reference.shape[:axis]) + tuple(reference.shape[axis + 1:]):
            continue
        ways = {f"averaged over the {name} axis": reference.mean(axis),
                f"summed over the {name} axis": reference.sum(axis),
                f"only the first entry of the {name} axis": reference.select(axis, 0),
                f"only the last entry of the {name} axis": reference.select(axis, -1)}
        for words, value in ways.items():
            if _close(got, value):
                return words
    return None


def _shape_cause(kind: str, got: torch.Tensor, expected: Mapping[str, torch.Tensor]) -> str:
    """The likely cause of a wrong shape for maps[kind], from its shape and its values."""
    shape, reference = tuple(got.shape), expected[kind]
    others = [other for other, value in expected.items() if other != kind and tuple(value.shape) == shape]
    if others:
        return (f"this is the shape of '{others[0]}': self-attention is layer.self_attn, cross-attention is "
                "layer.cross_attn of the decoder layers; the encoder's layers are model.encoder.layers.")
    if shape == tuple(reference.shape[1:]):
        layer = next((f" (layer {index}'s)" for index in range(reference.size(0)) if _close(got, reference[index])), "")
        return (f"only one layer's weights{layer}: stack the weights of every layer, in order, with torch.stack.")
    reduced = _reduced(got, reference)
    if reduced:
        return (f"maps['{kind}'] is {reduced}: keep every axis, each layer's attn_weights is (batch, heads, q_len, "
                "k_len) as stored, and torch.stack puts the layers in front.")
    return ("torch.stack([layer.<attention>.attn_weights for layer in <stack>.layers]) gives "
            "(layers, batch, heads, q_len, k_len).")


def _map_tensors(got: Mapping[str, Any], expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The student's three maps as float64 tensors of the expected shapes, or a failure that says why not."""
    tensors = {}
    for kind in KINDS:
        if not isinstance(got[kind], torch.Tensor):
            fail(f"maps['{kind}'] is not a tensor.", expected="a torch.Tensor", got=_shown(got[kind]),
                 cause="stack the layers' attn_weights with torch.stack.")
        tensor = got[kind]
        expect_shape(f"maps['{kind}']", tensor, tuple(expected[kind].shape),
                     cause=_shape_cause(kind, tensor, expected))
        tensors[kind] = tensor.double()
    return tensors


def _layers_held(tensor: torch.Tensor, kind: str, expected: Mapping[str, torch.Tensor]) -> str | None:
    """Which layer of which kind each entry of the student's map holds, in words (None: no layer's weights)."""
    held: list[tuple[str, int]] = []
    for index in range(tensor.size(0)):
        match = next(((other, layer) for other in (kind, *[k for k in KINDS if k != kind])
                      for layer in range(expected[other].size(0))
                      if _close(tensor[index], expected[other][layer])), None)
        if match is None:
            return None
        held.append(match)
    layers = tensor.size(0)
    kinds = {other for other, _ in held}
    if kinds == {kind}:
        order = [layer for _, layer in held]
        if order == list(range(layers - 1, -1, -1)):
            return "the layers are in reverse order: layer 0 (next to the embeddings) comes first."
        if len(set(order)) == 1:
            return (f"every entry holds layer {order[0]}'s weights: collect layer.….attn_weights of each layer "
                    "in the loop.")
    if len(kinds) == 1 and kind not in kinds:
        other = kinds.pop()
        return (f"'{kind}' holds the weights of '{other}': encoder layers are model.encoder.layers, decoder layers "
                "model.decoder.layers; self-attention is layer.self_attn, cross-attention layer.cross_attn.")
    return "the entries hold " + ", ".join(f"'{other}' layer {layer}" for other, layer in held) + \
        f", in this order, where '{kind}' layers 0 to {layers - 1} belong."


@check("attention_maps returns encoder_self, decoder_self and cross stacked over layers, with the right shapes")
def attention_maps_shapes(attention_maps: Callable, tgt_len: int = 5, **sizes: int) -> None:
    _maps_case(attention_maps, tgt_len, sizes)


@check("attention_maps holds each layer's stored attn_weights, in layer order (encoder, decoder, cross)")
def attention_maps_values(attention_maps: Callable, tgt_len: int = 5, **sizes: int) -> None:
    tensors, expected, _ = _maps_case(attention_maps, tgt_len, sizes)
    for kind, tensor in tensors.items():
        reference = expected[kind].double()
        if torch.allclose(tensor, reference, atol=1e-12, rtol=0):
            continue
        fail(f"maps['{kind}'] has the wrong values.", expected="the attn_weights stored by each layer's attention",
             got=f"largest difference {float((tensor - reference).abs().max()):.3g}",
             cause=_layers_held(tensor, kind, expected)
             or "each entry is torch.stack([layer.<attention>.attn_weights for layer in <stack>.layers]).")


@check("every kind of map holds attention weights: each row sums to 1 and hidden keys get exactly 0")
def attention_maps_rows_sum_to_one(attention_maps: Callable, tgt_len: int = 5, **sizes: int) -> None:
    tensors, _, src = _maps_case(attention_maps, tgt_len, sizes)
    source_allowed = (src != Ids().pad)[None, :, None, None, :]  # (1, batch, 1, 1, src_len)
    causal = torch.ones(tgt_len, tgt_len, dtype=torch.bool).tril()  # (tgt_len, tgt_len)
    hidden_keys = {"encoder_self": ~source_allowed, "cross": ~source_allowed, "decoder_self": ~causal}
    for kind, weights in tensors.items():
        sums = weights.sum(dim=-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-6):
            fail(f"the rows of maps['{kind}'] do not sum to 1.", expected="1.0 for every query row",
                 got=f"row sums between {float(sums.min()):.3g} and {float(sums.max()):.3g}",
                 cause="return the attention weights (after the softmax) that each MultiHeadAttention keeps in "
                       "attn_weights, not scores or outputs.")
        leaked = weights.masked_select(hidden_keys[kind].expand_as(weights))
        if leaked.numel() and float(leaked.abs().max()) > 0:
            fail(f"maps['{kind}'] gives weight to hidden keys.", expected="exactly 0 on padding / future keys",
                 got=f"up to {float(leaked.abs().max()):.3g}",
                 cause="the weights must come from the forward pass with the masks: read attn_weights after the "
                       "model ran, do not recompute attention without masks.")


# --- predict, then run ------------------------------------------------------------------------------


def _decoder_calls() -> float:
    ids = Ids()
    model, src = _script(((5, 6, 7, "eos"), (5, 6, 7, 8, 5, 6, 7, 8, "eos"), (5, "eos")), 12, ids).build()
    with torch.no_grad():
        reference_greedy_decode(model, src, ids.pad, ids.bos, ids.eos, 12)
    return float(len(model.decoder.calls))


@check("your prediction: decoder calls for sentences that end after 4, 9 and 2 tokens, max_len = 12")
def predicted_decoder_calls(predict: Any) -> None:
    expect_number(predict, truths=_decoder_calls,
                  what="the number of decoder calls (sentences ending after 4, 9 and 2 tokens, max_len = 12)",
                  cause="how many tokens does one step add, and to how many sentences at once? The loop stops "
                        "when every sentence has produced <eos> or after max_len steps: which sentence decides?")


def _corpus_brevity_penalty() -> float:
    hypothesis_lengths, reference_lengths = (10, 5), (10, 10)
    c, r = sum(hypothesis_lengths), sum(reference_lengths)  # corpus BLEU sums the lengths first
    return 1.0 if c > r else math.exp(1 - r / c)


@check("your prediction: the brevity penalty of a two-sentence corpus (lengths 10 and 5, references 10 and 10)")
def predicted_brevity_penalty(predict: Any) -> None:
    expect_number(predict, truths=_corpus_brevity_penalty, absolute=0.01,
                  what="the brevity penalty of the corpus",
                  cause="read c and r in the formula: lengths of what, added over which sentences? Corpus BLEU "
                        "is not an average of per-sentence penalties.")


# --- corpus BLEU ---------------------------------------------------------------------------------------------
#
# The student's compute_bleu(hypotheses, references) gets token lists and returns (bleu, precisions,
# brevity_penalty). The truth is sacreBLEU's corpus score of the same tokens joined by single spaces, with
# tokenize="none" (so both count the same tokens) and smooth_method="none" (BLEU's definition: a precision of 0
# gives 0; on the real translations no precision is 0, so this equals the course's recipe, sacreBLEU's default).
# The readings below recompute the corpus in the ways a mistake would (unclipped counts, a reversed brevity
# penalty, an arithmetic mean, sentence scores averaged) and name one only when the student's numbers are it.

Corpus = tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]  # (hypotheses, references), as tokens
ORDERS = 4


def _corpus(pairs: Sequence[tuple[str, str]]) -> Corpus:
    """Pairs of space-separated sentences as a corpus of token tuples."""
    return (tuple(tuple(hypothesis.split()) for hypothesis, _ in pairs),
            tuple(tuple(reference.split()) for _, reference in pairs))


class _SacreBleuCalled(Exception):
    """The student's compute_bleu called sacreBLEU's BLEU (raised inside it; noted in case it is caught)."""


@contextmanager
def _without_sacrebleu(called: list[str]) -> Iterator[None]:
    """Inside: sacreBLEU's BLEU computation raises and is noted in `called` (the exercise is to compute BLEU)."""
    import sacrebleu.metrics.bleu as bleu_module

    cls = bleu_module.BLEU
    saved = {name: cls.__dict__[name] for name in ("_compute_score_from_stats", "compute_bleu") if name in cls.__dict__}

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        called.append("sacreBLEU")
        raise _SacreBleuCalled("sacreBLEU's BLEU was called")

    try:
        for name in saved:
            setattr(cls, name, staticmethod(refuse) if name == "compute_bleu" else refuse)
        yield
    finally:
        for name, value in saved.items():
            setattr(cls, name, value)


def _number(value: Any) -> float | None:
    """A plain float from a number (Python, numpy or a one-element tensor), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, torch.Tensor):
        return float(value.detach().cpu().double().item()) if value.numel() == 1 else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@on_student_side
def _student_bleu(compute_bleu: Callable, corpus: Corpus) -> dict[str, Any] | str:
    """What the student's compute_bleu returns for the corpus (fresh lists of its tokens): {"bleu", "precisions",
    "brevity_penalty"} as plain floats, or in words what else came back; fails when it computes with sacreBLEU."""
    hypotheses, references = corpus
    called: list[str] = []
    with _without_sacrebleu(called), student_code():
        try:
            got = compute_bleu([list(tokens) for tokens in hypotheses], [list(tokens) for tokens in references])
        except _SacreBleuCalled:
            got = None
    if called:
        fail("your compute_bleu calls sacreBLEU's BLEU.", expected="BLEU computed by your own code",
             got="a call to sacreBLEU's BLEU computation",
             cause="the exercise is to compute BLEU from its definition; sacreBLEU is only the yardstick the checks "
                   "compare your numbers with.")
    if not isinstance(got, tuple | list) or len(got) != 3:
        return f"{describe(got)} instead of a tuple (bleu, precisions, brevity_penalty)"
    bleu, precisions, brevity_penalty = got
    if isinstance(precisions, torch.Tensor):
        precisions = precisions.detach().cpu().double().flatten().tolist()
    elif hasattr(precisions, "tolist") and not isinstance(precisions, list | tuple):  # a numpy array
        precisions = precisions.tolist()
    numbers = {"bleu": _number(bleu), "brevity_penalty": _number(brevity_penalty),
               "precisions": [_number(p) for p in precisions] if isinstance(precisions, list | tuple) else None}
    for name, value in (("bleu", bleu), ("brevity_penalty", brevity_penalty)):
        if numbers[name] is None:
            return f"{name} is {describe(value)}, not a number"
    if numbers["precisions"] is None or any(p is None for p in numbers["precisions"]):
        return f"precisions is {describe(precisions)}, not a list of numbers"
    return numbers


@dataclass(frozen=True)
class _Bleu:
    """A corpus's BLEU, its precisions (fractions) and its brevity penalty."""

    bleu: float
    precisions: tuple[float, ...]
    brevity_penalty: float

    def shown(self) -> str:
        return (f"bleu {self.bleu:.4f}, precisions [{', '.join(f'{p:.4f}' for p in self.precisions)}], "
                f"brevity_penalty {self.brevity_penalty:.4f}")


def _sacrebleu(corpus: Corpus) -> _Bleu:
    """sacreBLEU's corpus score of the corpus (tokenize='none', no smoothing)."""
    import sacrebleu

    hypotheses, references = corpus
    metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    score = metric.corpus_score([" ".join(h) for h in hypotheses], [[" ".join(r) for r in references]])
    return _Bleu(float(score.score), tuple(p / 100 for p in score.precisions), float(score.bp))


def _bleu_of(compute_bleu: Callable, corpus: Corpus) -> _Bleu:
    """The student's result for the corpus, or a failure that says why it is not (bleu, 4 precisions, BP)."""
    got = _student_bleu(compute_bleu, corpus)
    if isinstance(got, str):
        fail("compute_bleu does not return (bleu, precisions, brevity_penalty).",
             expected="a tuple of three: a number, a list of 4 numbers (p_1 to p_4), a number", got=got,
             cause="return bleu, precisions, brevity_penalty, in that order.")
    if len(got["precisions"]) != ORDERS:
        fail("compute_bleu returns another number of precisions than 4.", expected="4 precisions, p_1 to p_4",
             got=f"{len(got['precisions'])}: {got['precisions']}",
             cause="BLEU uses the n-grams of n = 1, 2, 3 and 4 tokens: one precision per order.")
    return _Bleu(got["bleu"], tuple(got["precisions"]), got["brevity_penalty"])


def _grams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _counts(corpus: Corpus, clip: bool = True, distinct: bool = False, short: int = 0) -> tuple[list[int], list[int]]:
    """(matches, totals) per order over the corpus: clipped (or not) counts; `distinct`: each n-gram type once;
    `short`: the last `short` n-grams of every sentence left out (a range that stops too early)."""
    matches, totals = [0] * ORDERS, [0] * ORDERS
    for hypothesis, reference in zip(*corpus, strict=True):
        for n in range(1, ORDERS + 1):
            mine = _grams(hypothesis[:max(0, len(hypothesis) - short)] if short else hypothesis, n)
            theirs = _grams(reference[:max(0, len(reference) - short)] if short else reference, n)
            if distinct:
                mine, theirs = Counter(set(mine)), Counter(set(theirs))
            matches[n - 1] += sum(min(count, theirs[gram]) if clip else count * (gram in theirs)
                                  for gram, count in mine.items())
            totals[n - 1] += sum(mine.values())
    return matches, totals


def _ratios(matches: Sequence[int], totals: Sequence[int]) -> tuple[float, ...]:
    return tuple(m / t if t else 0.0 for m, t in zip(matches, totals, strict=True))


def _geometric(precisions: Sequence[float]) -> float:
    return 0.0 if min(precisions) <= 0 else math.exp(sum(math.log(p) for p in precisions) / len(precisions))


def _penalty(c: float, r: float) -> float:
    return 1.0 if c > r else math.exp(1 - r / c)


def _lengths(corpus: Corpus) -> tuple[int, int]:
    return sum(len(h) for h in corpus[0]), sum(len(r) for r in corpus[1])


def _sentences(corpus: Corpus) -> list[Corpus]:
    return [((hypothesis,), (reference,)) for hypothesis, reference in zip(*corpus, strict=True)]


def _close_to(got: Sequence[float], expected: Sequence[float], tolerance: float = 1e-6) -> bool:
    return len(got) == len(expected) and all(abs(a - b) <= tolerance for a, b in zip(got, expected, strict=True))


def _precision_reading(got: Sequence[float], corpus: Corpus) -> str:
    """What the student's precisions are, when they are one of the readings' recomputations ('' when none)."""
    if _close_to(got, _ratios(*_counts(corpus, clip=False))):
        return ("every n-gram of a hypothesis that occurs in its reference is counted each time it occurs in the "
                "hypothesis, even beyond the number of times the reference has it: the counts are not clipped. A "
                "hypothesis n-gram earns at most as many matches as its reference holds that n-gram.")
    if _close_to(got, _ratios(*_counts(corpus, distinct=True))):
        return ("the precisions count each different n-gram once, in the matches and in the totals: a repeated "
                "n-gram is counted as often as it occurs in the hypothesis (the total), and matches up to the "
                "number of times the reference holds it.")
    matches, totals = _counts(corpus)
    _, distinct_totals = _counts(corpus, distinct=True)
    if _close_to(got, _ratios(matches, distinct_totals)):
        return ("the matches are clipped, but the totals count each different n-gram once: the denominator is the "
                "number of n-grams in the hypotheses, repeats included.")
    if _close_to(got, _ratios(*_counts(corpus, short=1))):
        return ("the last n-gram of every sentence is left out, in the hypotheses and the references: a sentence "
                "of L tokens has L - n + 1 n-grams of n tokens, the last one starting at position L - n.")
    if _close_to(got, [100 * p for p in _ratios(matches, totals)]):
        return "the precisions are percentages: return them as fractions from 0 to 1 (only bleu is on 0 to 100)."
    sentences = [_ratios(*_counts(sentence)) for sentence in _sentences(corpus)]
    if len(sentences) > 1 and _close_to(got, [sum(s[n] for s in sentences) / len(sentences) for n in range(ORDERS)]):
        return ("each precision is the average of the sentences' precisions: corpus BLEU adds the matches of all "
                "sentences and divides by all their n-grams, so a long sentence counts for more than a short one.")
    return ""


def _sentence_lengths(corpus: Corpus) -> str:
    """'hypotheses of 5 and 11 tokens, references of 9 and 9'."""
    lengths = [_lengths(sentence) for sentence in _sentences(corpus)]
    return (f"hypotheses of {' and '.join(str(c) for c, _ in lengths)} tokens, references of "
            f"{' and '.join(str(r) for _, r in lengths)}")


def _bp_reading(got: float, corpus: Corpus) -> str:
    """What the student's brevity penalty is, when it is a reading's recomputation ('' when none)."""
    c, r = _lengths(corpus)
    ways = {
        "the ratio is turned round: the exponent is 1 - c/r where the definition has 1 - r/c (c the hypotheses' "
        "length, r the references')": 1.0 if c > r else math.exp(1 - c / r),
        "the penalty falls on the corpus that is too LONG: it must be 1 when the hypotheses are longer than the "
        "references (c > r) and below 1 when they are shorter": math.exp(1 - r / c) if c > r else 1.0,
        "the penalty falls on the corpus that is too long, with the ratio turned round": math.exp(1 - c / r)
        if c > r else 1.0,
        "the penalty is the length ratio c/r itself, not e^(1 - r/c)": min(1.0, c / r),
        "the penalty is e^(1 - r/c) for every corpus, also one longer than its references (where it must be 1)":
        math.exp(1 - r / c),
    }
    for words, value in ways.items():
        if abs(got - value) <= 1e-6 and abs(value - _penalty(c, r)) > 1e-6:
            return words + "."
    sentences = [_penalty(*_lengths(sentence)) for sentence in _sentences(corpus)]
    if len(sentences) > 1 and abs(got - sum(sentences) / len(sentences)) <= 1e-6:
        return ("the brevity penalty is the average of the sentences' penalties: corpus BLEU compares the total "
                "length of all hypotheses with that of all references.")
    return ""


def _mean_reading(got: _Bleu) -> str:
    """How the student's bleu follows from their own precisions and penalty, when not by the definition."""
    p, bp = got.precisions, got.brevity_penalty
    ways = {
        "the arithmetic mean of the precisions: BLEU takes their geometric mean, the fourth root of their product "
        "(the exponential of the mean of their logarithms)": 100 * bp * sum(p) / len(p),
        "the product of the four precisions, without the fourth root": 100 * bp * math.prod(p),
        "the geometric mean without the brevity penalty": 100 * _geometric(p),
        "the geometric mean on a scale of 0 to 1: sacreBLEU reports BLEU from 0 to 100": bp * _geometric(p),
        "the geometric mean of the precisions that are not 0: a precision of 0 makes the geometric mean 0, so "
        "BLEU is 0": 100 * bp * _geometric([x for x in p if x > 0]) if any(x > 0 for x in p) else 0.0,
    }
    for words, value in ways.items():
        if abs(got.bleu - value) <= 1e-6 * max(1.0, abs(value)):
            return f"your bleu is {words}."
    return ""


@check("compute_bleu returns (bleu from 0 to 100, 4 precisions from 0 to 1, a brevity penalty in (0, 1])")
def bleu_returns_three_values(compute_bleu: Callable) -> None:
    corpus = _corpus(CORPUS_PAIRS)
    got = _bleu_of(compute_bleu, corpus)
    problems = [text for wrong, text in (
        (not 0 <= got.bleu <= 100, f"bleu {got.bleu:.4g} outside 0 to 100"),
        (any(not 0 <= p <= 1 for p in got.precisions), f"precisions {list(got.precisions)} outside 0 to 1"),
        (not 0 < got.brevity_penalty <= 1, f"brevity_penalty {got.brevity_penalty:.4g} outside (0, 1]")) if wrong]
    if problems:
        fail("compute_bleu returns numbers outside their ranges.",
             expected="bleu from 0 to 100, each precision from 0 to 1, brevity_penalty above 0 and at most 1",
             got="; ".join(problems),
             cause=_precision_reading(got.precisions, corpus) or _bp_reading(got.brevity_penalty, corpus)
             or "precisions are fractions of matched n-grams (0 to 1); bleu is on sacreBLEU's scale, 0 to 100; the "
                "brevity penalty is 1 or an exponential of a negative number.")


CLIPPING_PAIR = ("the cat the cat the cat on the mat", "the cat is on the mat")
CORPUS_PAIRS = (("a dog runs on the grass .", "a dog runs across the grass ."),
                ("two men play chess", "two women play chess"),
                ("people sit outside near one big tree", "people sit near a big old tree"))
BREVITY_PAIRS = (("a man rides a bike", "a man is riding a bike down the street"),  # shorter: c < r
                 ("a man is riding a bike down the street", "a man is riding a bike down the street"),  # c = r
                 ("a man is riding a red bike down the long street", "a man is riding a bike down the street"))
GEOMETRIC_PAIRS = (("a man is riding a bike down the road .", "a man is riding a bike down the street ."),
                   ("a man is riding a bike", "a man is riding a bike down the street"),  # BP < 1, every p_n 1
                   ("a man rides down the street on a bike .", "a man is riding a bike down the street ."),
                   ("bike a riding man street the down is a", "a man is riding a bike down the street"))
WORDS = ("a", "the", "man", "dog", "red", "runs", "on", "grass", "two", "women", "in", "park", "sit", "near",
         "big", "tree", "ball", "blue", "street", "old")


def _drawn_pair(seed: int, length: int, repeats: bool) -> tuple[str, str]:
    """A reference of `length` words and a hypothesis close to it: some words replaced, and (with `repeats`) a
    stretch of the reference repeated so that clipping matters; drawn from the seed."""
    stream = generator(seed)
    pick = [WORDS[int(i)] for i in torch.randint(len(WORDS), (2 * length + 8,), generator=stream)]
    reference = pick[:length]
    hypothesis = list(reference)
    for position in torch.randperm(length, generator=stream)[: max(1, length // 4)].tolist():
        hypothesis[position] = pick[length + position]
    if repeats:
        start = int(torch.randint(max(1, length - 3), (1,), generator=stream))
        hypothesis = hypothesis[: start + 3] + reference[start:start + 3] * 2 + hypothesis[start + 3:]
    return " ".join(hypothesis), " ".join(reference)


def _drawn_distinct(seed: int, sentences: int) -> tuple[tuple[str, str], ...]:
    """Pairs of different lengths whose hypotheses repeat no word (clipping plays no part) and have their
    reference's length (the brevity penalty is 1), drawn from the seed."""
    stream = generator(seed)
    pairs = []
    for index in range(sentences):
        length = 2 + (index * 5 + int(torch.randint(3, (1,), generator=stream))) % 8  # 2 to 9 words
        order = torch.randperm(len(WORDS), generator=stream).tolist()
        hypothesis = [WORDS[i] for i in order[:length]]
        reference = list(hypothesis)
        for position in torch.randperm(length, generator=stream)[: max(1, length // 3)].tolist():
            reference[position] = WORDS[order[length + position]]
        pairs.append((" ".join(hypothesis), " ".join(reference)))
    return tuple(pairs)


def _expect_precisions(got: _Bleu, expected: _Bleu, corpus: Corpus, problem: str, cause: str) -> None:
    if _close_to(got.precisions, expected.precisions):
        return
    wrong = [n + 1 for n in range(ORDERS) if abs(got.precisions[n] - expected.precisions[n]) > 1e-6]
    fail(problem, expected=f"precisions {[round(p, 4) for p in expected.precisions]}",
         got=f"precisions {[round(p, 4) for p in got.precisions]} (p_{', p_'.join(map(str, wrong))} differ)",
         cause=_precision_reading(got.precisions, corpus) or cause)


@check("the n-gram matches are clipped: an n-gram earns at most as many matches as its reference holds it")
def bleu_clips_counts(compute_bleu: Callable, seed: int | None = None, length: int = 8) -> None:
    pair = CLIPPING_PAIR if seed is None else _drawn_pair(seed, length, repeats=True)
    corpus = _corpus([pair])
    got, expected = _bleu_of(compute_bleu, corpus), _sacrebleu(corpus)
    _expect_precisions(got, expected, corpus,
                       problem=f"one sentence pair whose hypothesis repeats n-grams of its reference gets the wrong "
                               f"precisions (hypothesis '{pair[0]}', reference '{pair[1]}').",
                       cause="for each order n, the matches are the hypothesis's n-grams found in the reference, "
                             "each counted at most as often as the reference holds it; the total is the number of "
                             "n-grams in the hypothesis.")


@check("compute_bleu gives sacreBLEU's precisions for a corpus of several sentences")
def bleu_sums_over_the_corpus(compute_bleu: Callable, seed: int | None = None, sentences: int = 3) -> None:
    pairs = CORPUS_PAIRS if seed is None else _drawn_distinct(seed, sentences)
    corpus = _corpus(pairs)
    got, expected = _bleu_of(compute_bleu, corpus), _sacrebleu(corpus)
    _expect_precisions(got, expected, corpus,
                       problem=f"a corpus of {len(pairs)} sentence pairs of different lengths (no word repeated, each "
                               "hypothesis as long as its reference) gets the wrong precisions.",
                       cause="each precision adds the matches of every sentence and divides by the number of "
                             "n-grams of every hypothesis.")


@check("the brevity penalty is 1 for a corpus longer than its references and e^(1 - r/c) otherwise")
def bleu_brevity_penalty(compute_bleu: Callable, seed: int | None = None, length: int = 9) -> None:
    if seed is None:  # one sentence each (shorter, as long, longer), then a corpus of a shorter and a longer one
        cases = [[pair] for pair in BREVITY_PAIRS] + [[BREVITY_PAIRS[0], BREVITY_PAIRS[2]]]
    else:
        reference = _drawn_pair(seed, length, repeats=False)[1].split()
        cases = [[(" ".join(reference[:max(1, length - 1 - k)]), " ".join(reference))] for k in (1, 3)]
        whole = " ".join(reference)
        longer = (" ".join(reference + reference[:2]), whole)
        cases += [[(whole, whole)], [longer], [(" ".join(reference[:length - 3]), whole), longer]]
    for pairs in cases:
        corpus = _corpus(pairs)
        got, expected = _bleu_of(compute_bleu, corpus), _sacrebleu(corpus)
        if abs(got.brevity_penalty - expected.brevity_penalty) <= 1e-6:
            continue
        c, r = _lengths(corpus)
        fail((f"a hypothesis of {c} tokens against a reference of {r}" if len(pairs) == 1 else
              f"a corpus of {len(pairs)} sentence pairs ({_sentence_lengths(corpus)}: {c} hypothesis tokens "
              f"against {r} reference tokens in all)") + " gets the wrong brevity penalty.",
             expected=f"brevity_penalty {expected.brevity_penalty:.6f}",
             got=f"brevity_penalty {got.brevity_penalty:.6f}",
             cause=_bp_reading(got.brevity_penalty, corpus)
             or "with c the hypotheses' total length and r the references': 1 when c > r, else e^(1 - r/c).")


@check("bleu follows from the four precisions and the brevity penalty as BLEU defines it")
def bleu_geometric_mean(compute_bleu: Callable) -> None:
    for pair in GEOMETRIC_PAIRS:
        got = _bleu_of(compute_bleu, _corpus([pair]))
        expected = 100 * got.brevity_penalty * _geometric(got.precisions)
        if abs(got.bleu - expected) <= 1e-6 * max(1.0, expected):
            continue
        fail(f"bleu does not follow from your own precisions and brevity penalty (hypothesis '{pair[0]}', "
             f"reference '{pair[1]}').",
             expected=f"bleu {expected:.4f} from your precisions {[round(p, 4) for p in got.precisions]} and "
                      f"brevity penalty {got.brevity_penalty:.4f}",
             got=f"bleu {got.bleu:.4f}",
             cause=_mean_reading(got) or "BLEU = 100 · BP · (p_1 p_2 p_3 p_4)^(1/4), and 0 when a precision is 0.")


def _real_corpus(sentences: int, seed: int) -> Corpus:
    """The shipped checkpoint's greedy translations of the test set and their references: all of them, or
    `sentences` of them drawn from the seed."""
    from transformer_course.reference.checkpoint_translations import HYPOTHESES, REFERENCES

    indices = list(range(len(HYPOTHESES)))
    if sentences < len(indices):
        indices = sorted(torch.randperm(len(indices), generator=generator(seed))[:max(1, sentences)].tolist())
    return (tuple(tuple(HYPOTHESES[i].split()) for i in indices), tuple(tuple(REFERENCES[i].split()) for i in indices))


@check("on the course checkpoint's translations of the test set, compute_bleu gives sacreBLEU's corpus BLEU")
def bleu_agrees_with_sacrebleu(compute_bleu: Callable, sentences: int = 1000, seed: int = 0) -> None:
    corpus = _real_corpus(sentences, seed)
    got, expected = _bleu_of(compute_bleu, corpus), _sacrebleu(corpus)
    if abs(got.bleu - expected.bleu) <= 1e-6 * max(1.0, expected.bleu):
        return
    seen = []
    if not _close_to(got.precisions, expected.precisions):
        seen.append(_precision_reading(got.precisions, corpus) or "your precisions differ from sacreBLEU's.")
    if abs(got.brevity_penalty - expected.brevity_penalty) > 1e-6:
        seen.append(_bp_reading(got.brevity_penalty, corpus) or "your brevity penalty differs from sacreBLEU's.")
    averaged = [_sacrebleu(sentence).bleu for sentence in _sentences(corpus)]
    if abs(got.bleu - sum(averaged) / len(averaged)) <= 1e-6 * max(1.0, got.bleu):
        zeros = sum(score == 0 for score in averaged)
        seen.insert(0, "your bleu is the average of the sentences' BLEU scores: corpus BLEU adds the counts and "
                       f"lengths of all sentences first, then computes one score ({zeros} of these {len(averaged)} "
                       "sentences score 0 on their own, since one of their precisions is 0).")
    if not seen:
        seen.append(_mean_reading(got) or "your precisions and brevity penalty are sacreBLEU's, but bleu is not "
                                          "100 · BP · (p_1 p_2 p_3 p_4)^(1/4).")
    c, r = _lengths(corpus)
    fail(f"on {len(corpus[0]):,} real translations ({c:,} hypothesis tokens, {r:,} reference tokens), your BLEU is "
         "not sacreBLEU's.", expected=f"sacreBLEU: {expected.shown()}", got=f"yours: {got.shown()}",
         cause=" ".join(text[:1].upper() + text[1:] for text in seen))


# --- translate_batch (a bug hunt) ------------------------------------------------------------------------------
#
# The student's translate_batch runs with the checks' own greedy_decode in place of the notebook's (a mistake in
# greedy_decode is charged by its own checks), on a small random Transformer whose vocabularies name every id.
# What comes back: the translations and the source batches greedy_decode was handed.


@dataclass(frozen=True)
class Batching:
    """Source sentences of different lengths (ids with <bos> and <eos>) for a small random model."""

    sizes: Sizes
    lengths: tuple[int, ...]  # tokens of each sentence, <bos> and <eos> included

    def sources(self) -> list[list[int]]:
        ids = Ids()
        stream = generator(self.sizes.seed + 300)
        words = torch.randint(4, self.sizes.src_vocab, (len(self.lengths), max(self.lengths)), generator=stream)
        words[1::2, 0] = ids.unk  # every other sentence starts with a word the vocabulary lacks, as test sets do
        return [[ids.bos, *words[row, :max(0, length - 2)].tolist(), ids.eos]
                for row, length in enumerate(self.lengths)]


def _translation_model(sizes: Sizes) -> nn.Module:
    """The small random Transformer the translate_batch checks decode with: neither <pad> nor <unk> is ever
    predicted (as in a trained model), so an <unk> in a translation can only come from the source."""
    model = _random_model(sizes, Ids())
    with torch.no_grad():
        model.decoder.pred_layer.bias[0] = -1e4  # <unk>
    return model


def _vocabularies(sizes: Sizes) -> tuple[Any, Any]:
    from transformer_course.data.vocab import SPECIALS, Vocab

    return (Vocab([*SPECIALS, *(f"de{i}" for i in range(len(SPECIALS), sizes.src_vocab))]),
            Vocab([*SPECIALS, *(f"w{i}" for i in range(len(SPECIALS), sizes.tgt_vocab))]))


@on_student_side
def _translated(translate_batch: Callable, case: Batching, batch_size: int) -> tuple[Any, list[tuple[torch.Tensor,
                                                                                                    Any]]]:
    """The student's translations of the case's sentences in batches of `batch_size`, with the checks'
    greedy_decode plugged in, and (source tensor, pad_idx) for every call of greedy_decode."""
    model = _translation_model(case.sizes)
    supplied(model)
    source_vocab, target_vocab = _vocabularies(case.sizes)
    run = runs.Run()
    with torch.random.fork_rng(devices=[]), student_code(), \
            runs.plugged(translate_batch, {"greedy_decode": reference_greedy_decode}, run):
        got = translate_batch(model, case.sources(), source_vocab, target_vocab, batch_size=batch_size,
                              max_len=case.sizes.max_len)
    if not isinstance(got, list | tuple) or not all(isinstance(tokens, list | tuple) for tokens in got):
        got = describe(got)
    else:
        got = [[str(token) for token in tokens] for tokens in got]
    return got, [(call.args["src"], call.args.get("pad_idx") if type(call.args.get("pad_idx")) is int else None)
                 for call in run.of("greedy_decode")  # plain values only leave this side
                 if isinstance(call.args.get("src"), torch.Tensor)]


def _alone(case: Batching, model: nn.Module | None = None, target_vocab: Any = None) -> list[list[str]]:
    """Each sentence of the case decoded alone (no padding) by the reference: its translation. `model` and
    `target_vocab`: the case's translation model and target vocabulary, when the caller has built them."""
    model = model if model is not None else _translation_model(case.sizes)
    target_vocab = target_vocab if target_vocab is not None else _vocabularies(case.sizes)[1]
    ids = Ids()
    translations = []
    for source in case.sources():
        with torch.no_grad():
            ys = reference_greedy_decode(model, torch.tensor([source]), ids.pad, ids.bos, ids.eos, case.sizes.max_len)
        translations.append(target_vocab.decode(ys[0].tolist()))
    return translations


def _padded_batch_translations(model: nn.Module, target_vocab: Any, rows: Sequence[list[int]], fill: int,
                               left: bool, max_len: int, pad_idx: int = Ids.pad) -> list[list[str]]:
    """The reference's translations of `rows` decoded in one batch padded with `fill`, on the left or the right,
    the source mask hiding `pad_idx` (<pad> unless told)."""
    ids, longest = Ids(), max(len(row) for row in rows)
    src = torch.full((len(rows), longest), fill)  # (sentences, longest)
    for index, row in enumerate(rows):
        if left:
            src[index, longest - len(row):] = torch.tensor(row)
        else:
            src[index, :len(row)] = torch.tensor(row)
    with torch.no_grad():
        ys = reference_greedy_decode(model, src, pad_idx, ids.bos, ids.eos, max_len)  # (sentences, out)
    return [target_vocab.decode(row.tolist()) for row in ys]


def _telling(case: Batching, *, order: bool = False, padding: bool = False, tries: int = 40) -> Batching:
    """The case on the first of `tries` random models (`lively.seeds`) on which what the
    check compares shows. Always, where a source holds <unk>: hiding it as if it were padding (a batch padded
    with <unk> whose decoding is told that <unk> is the padding) changes some translation. `order`: the sentences'
    translations put in the order of their lengths are not the translations in the input order (a small random
    model often says the same words whatever it reads, and then translations returned in the sorted order
    agree). `padding`: in one batch, padding with <unk> instead of <pad> and padding on the left each change some
    translation (else a batch padded so agrees). The seeds the course writes pass at once; the hidden tests'
    seeds, drawn from the class's secret, are random."""
    for seed in lively.seeds(case.sizes.seed, tries):
        candidate = replace(case, sizes=replace(case.sizes, seed=seed))
        model, (_, target_vocab) = _translation_model(candidate.sizes), _vocabularies(candidate.sizes)
        alone = _alone(candidate, model, target_vocab)
        if order:
            sorted_order = sorted(range(len(alone)), key=lambda index: candidate.lengths[index])
            if [alone[index] for index in sorted_order] == alone:
                continue
        rows, max_len = candidate.sources(), candidate.sizes.max_len
        unk = Ids.unk
        if any(unk in row for row in rows) \
                and _padded_batch_translations(model, target_vocab, rows, unk, False, max_len, pad_idx=unk) == alone:
            continue
        if padding and (_padded_batch_translations(model, target_vocab, rows, unk, False, max_len) == alone
                        or _padded_batch_translations(model, target_vocab, rows, Ids.pad, True, max_len) == alone):
            continue
        return candidate
    return case


def _translations_of(translate_batch: Callable, case: Batching, batch_size: int
                     ) -> tuple[list[list[str]], list[tuple[torch.Tensor, Any]]]:
    got, batches = _translated(translate_batch, case, batch_size)
    if isinstance(got, str) or len(got) != len(case.lengths):
        fail("translate_batch does not return one list of tokens per sentence.",
             expected=f"a list of {len(case.lengths)} lists of English tokens, one per sentence, in their order",
             got=got if isinstance(got, str) else f"a list of {len(got)}",
             cause="return one translation per source sentence, in the order of `sources`.")
    return got, batches


def _padding_reading(batches: Sequence[tuple[torch.Tensor, Any]], case: Batching) -> str:
    """What the source batches handed to greedy_decode hold where a sentence has ended ('' when <pad>), or the
    pad_idx it was told when that is not <pad>'s."""
    ids, sources = Ids(), case.sources()
    named = {ids.unk: "<unk>", ids.bos: "<bos>", ids.eos: "<eos>"}
    told = next((pad_idx for _, pad_idx in batches if isinstance(pad_idx, int) and pad_idx != ids.pad), None)
    if told is not None:
        return (f"greedy_decode is told that the padding is {named.get(told, 'a word')} (id {told}), not <pad> (id "
                f"{ids.pad}): its source mask then hides that token wherever a sentence has it, not only after the "
                "sentence's end. Pad with source_vocab.pad_idx and pass that as pad_idx.")
    for src, _ in batches:
        for row in range(src.size(0)):
            tokens = src[row].tolist()
            source = next((s for s in sources if tokens[:len(s)] == s or tokens[-len(s):] == s), None)
            if source is None or len(source) == len(tokens):
                continue
            if tokens[:len(source)] != source and tokens[-len(source):] == source:
                return ("a shorter sentence sits at the right end of its row, after the padding: its words then take "
                        "other positions than when it is alone (the positional encoding of position 0 goes to a "
                        "padding token). Put each sentence at the start of its row, the padding after it.")
            filler = sorted(set(tokens[len(source):]))
            if filler != [ids.pad]:
                held = ", ".join(f"{named.get(token, 'a word')} (id {token})" for token in filler)
                return (f"after a sentence's <eos> its row of the batch holds {held} where <pad> (id {ids.pad}) "
                        "belongs: the source mask hides only <pad>, so the encoder and the cross-attention read those "
                        "positions as words. Fill the batch with source_vocab.pad_idx.")
    return ""


def _batch_reading(got: Sequence[Sequence[str]], expected: Sequence[list[str]], differ: Sequence[int],
                   batches: Sequence[tuple[torch.Tensor, Any]], case: Batching) -> str:
    """Why translations differ: what the batches hold after a sentence's end, or translations in another order."""
    padding = _padding_reading(batches, case)
    if padding:
        return padding
    moved = {index: expected.index(list(got[index])) for index in differ if list(got[index]) in expected}
    if sorted(map(tuple, got)) == sorted(map(tuple, expected)) and len(moved) == len(differ):
        return ("the translations come back in another order: translation " + ", ".join(
            f"{index} is that of sentence {source}" for index, source in list(moved.items())[:4])
            + ". Put each translation back at its sentence's index in `sources`.")
    return ""


def _show_translations(translations: Sequence[Sequence[str]], which: Sequence[int]) -> str:
    return "".join(f"\n      sentence {index}: {' '.join(translations[index]) or '(empty)'}" for index in which)


def _source_lengths(step: int, sentences: int, src_len: int) -> tuple[int, ...]:
    """Source lengths 3 + (step x index mod (src_len - 2)), never already in ascending order unless all equal
    (then reversed): sorting the sentences by length must move some, so a translation returned in the sorted
    order, not the input order, shows."""
    lengths = tuple(3 + (index * step) % max(1, src_len - 2) for index in range(sentences))
    return lengths[::-1] if list(lengths) == sorted(lengths) else lengths


@check("each sentence's translation is the same in a batch with longer sentences as on its own")
def batch_translation_is_independent(translate_batch: Callable, sentences: int = 5, **sizes: int) -> None:
    config = replace(Sizes(seed=11, src_len=12, max_len=8), **sizes)
    lengths = _source_lengths(4, sentences, config.src_len)
    case = _telling(Batching(config, lengths), padding=sentences > 1)
    alone = _alone(case)
    together, batches = _translations_of(translate_batch, case, batch_size=max(1, sentences))
    differ = [index for index in range(sentences) if list(together[index]) != alone[index]]
    if differ:
        fail(f"{len(differ)} of {sentences} sentences translate differently in one batch than each on its own "
             f"(source lengths {list(lengths)} tokens).",
             expected="the same translation either way:" + _show_translations(alone, differ),
             got="in the batch:" + _show_translations(together, differ),
             cause=_batch_reading(together, alone, differ, batches, case)
             or "a sentence's translation must not depend on the other sentences of its batch: check what the "
                "batch tensor holds after each sentence's end, and which masks the decoder gets.")


@check("translate_batch returns every sentence's greedy translation, in the input order, for any batch size")
def batch_translation_matches(translate_batch: Callable, sentences: int = 6, batch_size: int = 4,
                              **sizes: int) -> None:
    config = replace(Sizes(seed=8, src_len=11, max_len=8), **sizes)
    lengths = _source_lengths(5, sentences, config.src_len)
    case = _telling(Batching(config, lengths), order=True)
    expected = _alone(case)
    got, batches = _translations_of(translate_batch, case, batch_size)
    differ = [index for index in range(sentences) if list(got[index]) != expected[index]]
    if not differ:
        return
    fail(f"{len(differ)} of {sentences} sentences (source lengths {list(lengths)}, batches of {batch_size}) do not "
         "get their greedy translation.", expected="each sentence's greedy translation:"
         + _show_translations(expected, differ), got="yours:" + _show_translations(got, differ),
         cause=_batch_reading(got, expected, differ, batches, case)
         or "translate every sentence with greedy_decode, in batches of at most batch_size, and return the "
            "translations in the order of `sources`.")
