"""Stage 6 checks: batched greedy decoding and the attention maps of a model.

`greedy_decode` is tested two ways:
- on a *scripted* model whose next token is fixed in advance for every sentence and step, so the
  bookkeeping can be pinned down exactly: <bos> first, stop at <eos>, pad finished sentences, respect
  max_len, stop once all are finished, read the last position, hand both masks to the decoder. The
  scripted encoder writes each sentence's number into its output, so a decoder that only sees some of
  the sentences (a batch compacted to the unfinished ones) still gets the right script;
- on a small real Transformer with random weights from a fixed seed, token for token against the
  reference implementation, and twice in a row to see that decoding is deterministic.

Known wrong decoders (`_decode(..., mistake=...)`) are replayed on the same model to name the mistake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

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
from transformer_course.checks.localise import recorded_calls
from transformer_course.reference import Transformer, make_source_mask, make_target_mask
from transformer_course.reference.decoding import attention_maps as reference_attention_maps
from transformer_course.reference.decoding import greedy_decode as reference_greedy_decode

__all__ = [
    "attention_maps_rows_sum_to_one",
    "attention_maps_shapes",
    "attention_maps_values",
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
    "summary",
]


@dataclass(frozen=True)
class Ids:
    """The special token ids a check passes to greedy_decode (the course's Vocab uses these defaults)."""

    pad: int = 3
    bos: int = 1
    eos: int = 2


# --- decoders with known mistakes -------------------------------------------------------------------------

MISTAKES = {
    "no_padding": "finished sentences keep producing words after their <eos>: replace their new token with "
    "pad_idx, e.g. next_token.masked_fill(finished, pad_idx) or torch.where(finished, pad_idx, next_token).",
    "no_stop": "a sentence does not stop at <eos>: it keeps producing words until max_len. Keep a boolean "
    "vector `finished` (batch,), set it where the new token is eos_idx, replace the tokens of finished "
    "sentences with pad_idx, and break once finished.all().",
    "fill_eos": "finished sentences are filled with <eos> instead of <pad>: fill them with pad_idx.",
    "overwrite": "`finished` forgets earlier sentences: it is overwritten each step (finished = next == eos) "
    "instead of accumulated (finished |= next_token == eos_idx).",
    "any_finished": "decoding stops as soon as ONE sentence is finished: break only when all are, "
    "finished.all(), not finished.any().",
    "no_break": "decoding never stops early: once every sentence is finished, break out of the loop "
    "(if finished.all(): break) instead of adding columns of padding up to max_len.",
    "no_final_eos": "the loop breaks before the last <eos> is appended: append the new tokens to ys first, "
    "then update `finished` and test finished.all().",
    "fewer": "one token too few: the loop must run up to max_len times (for _ in range(max_len)), "
    "so ys can reach max_len + 1 columns with <bos>.",
    "more": "one token too many: the loop runs max_len + 1 times; use range(max_len), <bos> is not generated.",
    "first_position": "the next token is read at position 0 (logits[:, 0]): the prediction for the next "
    "token sits at the LAST position, logits[:, -1].",
    "all_positions": "the argmax runs over all positions at once: take logits[:, -1] (batch, vocab) first, "
    "then argmax over the vocabulary (dim=-1).",
    "no_target_mask": "the decoder gets no target mask (None): pass make_target_mask(ys, pad_idx), the "
    "look-ahead mask the model was trained with.",
    "no_source_mask": "the decoder gets no source mask (None): pass src_mask, so padding in the source "
    "is never attended to.",
}


def _decode(model: nn.Module, src: torch.Tensor, ids: Ids, max_len: int, mistake: str = "") -> torch.Tensor:
    """Greedy decoding as in the reference, or with one of the MISTAKES."""
    src_mask = make_source_mask(src, ids.pad)  # (batch, 1, 1, src_len)
    enc_out = model.encoder(src, src_mask)  # (batch, src_len, d_model)
    ys = torch.full((src.size(0), 1), ids.bos, dtype=torch.long)  # (batch, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    steps = {"fewer": max_len - 1, "more": max_len + 1}.get(mistake, max_len)
    for _ in range(steps):
        dec_mask = None if mistake == "no_target_mask" else make_target_mask(ys, ids.pad)
        enc_mask = None if mistake == "no_source_mask" else src_mask
        logits = model.decoder(ys, enc_out, enc_mask, dec_mask)  # (batch, len, vocab)
        if mistake == "all_positions":
            next_token = logits.flatten(1).argmax(dim=-1) % logits.size(-1)  # best (position, token) pair
        else:
            next_token = logits[:, 0 if mistake == "first_position" else -1].argmax(dim=-1)  # (batch,)
        if mistake not in ("no_stop", "no_padding"):
            next_token = next_token.masked_fill(finished, ids.eos if mistake == "fill_eos" else ids.pad)
        if mistake == "no_final_eos":
            finished |= next_token == ids.eos
            if finished.all():
                break
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)  # (batch, len + 1)
        if mistake == "no_final_eos":
            continue
        finished = (next_token == ids.eos) if mistake == "overwrite" else finished | (next_token == ids.eos)
        stop = finished.any() if mistake == "any_finished" else finished.all()
        if stop and mistake not in ("no_stop", "no_break"):
            break
    return ys


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
        call = _Call(x.detach().clone(), sentences, enc_mask, dec_mask)
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


def _script(sentences: Sequence[Sequence[int | str]], max_len: int, ids: Ids) -> Script:
    """Scripts written with "eos" for the end token, so they follow the ids of a check's variant."""
    return Script(tuple(tuple(ids.eos if token == "eos" else int(token) for token in sentence)
                        for sentence in sentences), max_len, ids)


# --- running the student's decoder and comparing token ids ----------------------------------------------


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
    with torch.enable_grad(), student_code(), selections, recorded_calls(model, ["decoder"]) as calls:
        got = greedy_decode(model, src, ids.pad, ids.bos, ids.eos, max_len)
    if scripted:
        return got, model.decoder.calls[start:]
    steps = [_Call(call.args["x"].detach(), list(range(src.size(0))) if call.args["x"].size(0) == src.size(0)
                   else None, call.args.get("enc_mask"), call.args.get("dec_mask"),
                   call.output.detach() if isinstance(call.output, torch.Tensor) else None,
                   call.args.get("enc_out")) for call in calls if isinstance(call.args.get("x"), torch.Tensor)]
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


def _show(rows: torch.Tensor, ids: Ids) -> str:
    names = {ids.bos: "<bos>", ids.eos: "<eos>", ids.pad: "<pad>"}
    lines = [f"sentence {index}: " + " ".join(names.get(int(token), str(int(token))) for token in row)
             for index, row in enumerate(rows)]
    return "".join(f"\n      {line}" for line in lines)


def _word(token: int, ids: Ids) -> str:
    return {ids.bos: "<bos>", ids.eos: "<eos>", ids.pad: "<pad>"}.get(int(token), str(int(token)))


def _words(tokens: torch.Tensor, ids: Ids) -> str:
    return "[" + " ".join(_word(token, ids) for token in tokens) + "]"


def _step_departure(got: torch.Tensor, expected: torch.Tensor, calls: Sequence[_Call], src: torch.Tensor,
                    ids: Ids) -> str | None:
    """The first step and sentence where the student's tokens leave the reference's, and what the decoder
    was fed at that step (its tokens so far, its masks, its output)."""
    if got.size(1) > 1 and bool((got[:, -1] == ids.bos).all()) and not bool((got[:, 0] == ids.bos).all()):
        return "your sequences end with <bos>: the new tokens are put in front of ys; append them after it."
    columns = max(got.size(1), expected.size(1))
    for column in range(1, columns):
        for sentence in range(expected.size(0)):
            mine = int(got[sentence, column]) if column < got.size(1) else None
            theirs = int(expected[sentence, column]) if column < expected.size(1) else None
            if mine == theirs:
                continue
            if mine is None:
                return (f"your output ends after step {column - 1}, but sentence {sentence} had not finished: it "
                        f"goes on with {_word(theirs, ids)} (decode until every sentence has produced <eos>, or "
                        "max_len tokens).")
            if theirs is None:
                return (f"your output goes on after step {column - 1} ({_word(mine, ids)} in sentence {sentence}), "
                        "where every sentence had finished or max_len tokens were generated: stop there.")
            head = f"sentence {sentence}, step {column}: your token is {_word(mine, ids)}, the reference's " \
                   f"{_word(theirs, ids)}"
            if ids.eos in expected[sentence, 1:column].tolist():
                return f"{head}. The sentence had already produced <eos>: every later token is <pad>."
            so_far = expected[sentence, :column]
            call = next((call for call in calls if call.sentences is not None and sentence in call.sentences
                         and call.ys.size(1) == column), None)
            if call is None:
                lengths = sorted({int(call.ys.size(1)) for call in calls})
                known = all(call.sentences is not None for call in calls)
                return head + (f". No decoder call got the {column} tokens of sentence {sentence} so far, "
                               f"{_words(so_far, ids)}: the decoder was fed ys of lengths {lengths}. Feed it the "
                               "whole sequence so far at every step." if known else ".")
            row = call.sentences.index(sentence)
            fed = call.ys[row].cpu()
            if not torch.equal(fed, so_far):
                return f"{head}. At that step the decoder was fed {_words(fed, ids)} instead of {_words(so_far, ids)}."
            shape = (call.ys.size(0), 1, column, src.size(1))
            mask = _mask_rows(call.enc_mask, shape) if call.enc_mask is not None else None
            if mask is None or not torch.equal(mask[row, 0], (src[sentence] != ids.pad).expand(column, src.size(1))):
                return f"{head}. At that step the decoder's src_mask was not make_source_mask(src, pad_idx)."
            if call.logits is None:
                return head + "."
            logits = call.logits[row]  # (len, vocab)
            best = int(logits[-1].argmax())
            if best == theirs and mine == ids.pad and theirs == ids.eos:
                return (f"{head}: the <eos> itself was replaced by <pad>. Pad only the sentences that had finished "
                        "before this step: update `finished` from the token just appended.")
            if best == theirs and logits.size(0) > 1 and mine == int(logits[0].argmax()):
                return f"{head}: that is the argmax at position 0; the next token is the argmax at the last position."
            if best == theirs:
                return (f"{head}: the decoder's logits at the last position pick {_word(best, ids)}; append their "
                        "argmax.")
            return (f"{head}: with the same tokens so far, the decoder's logits differ from the reference's, so "
                    "something else it receives differs (the encoder output, computed once as "
                    "model.encoder(src, src_mask), or the target mask make_target_mask(ys, pad_idx)).")
    return None


def reproduced(suspects: Mapping[str, Callable[[], torch.Tensor]] | None, got: torch.Tensor) -> str | None:
    """The cause of the first known wrong decoder (`suspects`: cause -> replay) that gives exactly the ids `got`;
    None when none does (stage 7's checks use it too)."""
    for suspected_cause, make_wrong in (suspects or {}).items():
        try:
            wrong = make_wrong()
        except Exception:  # a suspect that cannot be replayed here is simply not the answer
            continue
        if wrong.shape == got.shape and torch.equal(wrong, got):
            return suspected_cause
    return None


def _expect_ids(run: _Run, expected: torch.Tensor, src: torch.Tensor, ids: Ids, *, problem: str, cause: str,
                suspects: Mapping[str, Callable[[], torch.Tensor]] | None = None) -> None:
    """Exact comparison of token ids, naming the first suspect mistake that reproduces the student's ids,
    else the first step where they depart from the reference's."""
    got = run.ys
    if got.shape == expected.shape and torch.equal(got, expected):
        return
    departure = _step_departure(got, expected, run.calls, src, ids)
    # What the decoder was fed is observed, not guessed: it comes before the known wrong decoders, which can
    # reproduce the same ids for another reason.
    found = departure if departure and ("was fed" in departure or "in front of ys" in departure) else None
    found = found or reproduced(suspects, got)
    fail(problem, expected=f"shape {tuple(expected.shape)}{_show(expected, ids)}",
         got=f"shape {tuple(got.shape)}{_show(got, ids)}",
         cause=found or departure or cause)


def _scripted_case(greedy_decode: Callable, script: Script, real_lengths: Sequence[int] | None = None,
                   ) -> tuple[_Run, torch.Tensor, dict[str, Callable[[], torch.Tensor]], torch.Tensor]:
    """(student's run, expected ids, suspects, the source) on a scripted model."""
    ids, count = script.ids, len(script.sentences)
    src = _scripted_source(count, ids, real_lengths)
    model = _ScriptedModel(script.sentences, ids)
    run = _call(greedy_decode, model, src, ids, script.max_len)
    replay = _ScriptedModel(script.sentences, ids)
    with torch.no_grad():
        expected = reference_greedy_decode(replay, src, ids.pad, ids.bos, ids.eos, script.max_len)
    suspects = {cause: (lambda mistake=mistake: _decode(replay, src, ids, script.max_len, mistake))
                for mistake, cause in MISTAKES.items()}
    return run, expected, suspects, src


STOP_SCRIPT = ((5, 6, "eos"), ("eos",), (6, 6, 5, 5, "eos"))  # finishes after 3, 1 and 5 steps
ENDLESS_SCRIPT = ((5, 6, 7, 8, 5, 6, 7, 8, 5, 6), (8, 7, 6, 5, 8, 7, 6, 5, 8, 7))  # never says <eos>
EARLY_SCRIPT = (("eos",), (7, "eos"), (5, 6, "eos"))  # all finished after 3 steps


# Checks whose property does not need a batch decode one sentence, so that a decoder written for one
# sentence loses only the points of the checks about batches (which then say so).


@check("greedy_decode returns token ids (batch, out_len) whose first column is <bos>")
def greedy_starts_with_bos(greedy_decode: Callable, bos_idx: int = 1, eos_idx: int = 2, pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, _, src = _scripted_case(greedy_decode, _script(STOP_SCRIPT[:1], 8, ids))
    got = run.ys
    if not bool((got[:, 0] == ids.bos).all()):
        in_front = got.size(1) > 1 and bool((got[:, -1] == ids.bos).all())
        fail("the output does not start with <bos>.", expected=f"column 0 all bos_idx={ids.bos}",
             got=f"column 0 = {got[:, 0].tolist()}" + (", and <bos> in the last column" if in_front else ""),
             cause="the new tokens are put in front of ys: append them after it, torch.cat([ys, "
                   "next_token.unsqueeze(1)], dim=1)." if in_front else
             "keep the given ys = torch.full(..., bos_idx) and append to it; the decoder's first input is "
             "<bos>, and the returned sequence keeps it.")
    if got.size(1) > 1 and not torch.equal(got[:, 1], expected[:, 1]):
        fail("the first generated token is wrong.", expected=f"column 1 = {expected[:, 1].tolist()}",
             got=f"column 1 = {got[:, 1].tolist()}",
             cause=_step_departure(got[:, :2], expected[:, :2], run.calls, src, ids)
             or "step 1 feeds ys = <bos> to the decoder and appends the argmax of logits[:, -1].")


@check("each sentence stops at its own <eos>; finished sentences are padded with <pad>")
def greedy_stops_at_eos(greedy_decode: Callable, bos_idx: int = 1, eos_idx: int = 2, pad_idx: int = 3,
                        sentences: Sequence[Sequence[int | str]] = STOP_SCRIPT, max_len: int = 8) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, suspects, src = _scripted_case(greedy_decode, _script(sentences, max_len, ids))
    _expect_ids(run, expected, src, ids, suspects=suspects,
                problem="a scripted model whose sentences say <eos> after different numbers of steps "
                        "was decoded wrongly.",
                cause="keep a `finished` vector; after <eos> a sentence only gets pad_idx; stop when all are finished.")


@check("without any <eos>, greedy_decode generates exactly max_len tokens (max_len + 1 columns with <bos>)")
def greedy_respects_max_len(greedy_decode: Callable, max_len: int = 5, bos_idx: int = 1, eos_idx: int = 2,
                            pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, suspects, src = _scripted_case(greedy_decode, _script(ENDLESS_SCRIPT[:1], max_len, ids))
    _expect_ids(run, expected, src, ids, suspects=suspects,
                problem=f"a scripted model that never says <eos> was decoded with max_len={max_len} wrongly.",
                cause="run the loop at most max_len times: range(max_len) generates max_len tokens after <bos>.")


@check("greedy_decode stops as soon as every sentence is finished (no columns of pure padding)")
def greedy_stops_when_all_finished(greedy_decode: Callable, max_len: int = 9, bos_idx: int = 1, eos_idx: int = 2,
                                   pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, suspects, src = _scripted_case(greedy_decode, _script(EARLY_SCRIPT, max_len, ids))
    _expect_ids(run, expected, src, ids, suspects=suspects,
                problem="every sentence of a scripted model says <eos> within 3 steps, but the output is wrong.",
                cause="after appending the new tokens, `if finished.all(): break`.")


@check("the next token is the argmax of the logits at the LAST position, logits[:, -1]")
def greedy_uses_last_position(greedy_decode: Callable, max_len: int = 4, bos_idx: int = 1, eos_idx: int = 2,
                              pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    run, expected, suspects, src = _scripted_case(greedy_decode, _script(ENDLESS_SCRIPT[:1], max_len, ids))
    _expect_ids(run, expected, src, ids, suspects=suspects,
                problem="a scripted model that predicts a different word at every position was decoded wrongly.",
                cause="logits has shape (batch, len, vocab); the next token is logits[:, -1].argmax(dim=-1).")


def _mask_rows(mask: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    try:
        return (mask.detach().cpu() != 0).expand(shape)
    except RuntimeError:
        return None


@check("every decoder call gets the source padding mask and the causal target mask of the current ys")
def greedy_passes_masks(greedy_decode: Callable, bos_idx: int = 1, eos_idx: int = 2, pad_idx: int = 3) -> None:
    ids = Ids(pad_idx, bos_idx, eos_idx)
    real_lengths = [4]  # one sentence (no batch needed for this property), with source padding
    run, _, _, _ = _scripted_case(greedy_decode, _script(STOP_SCRIPT[2:], 8, ids), real_lengths)
    source_allowed = torch.arange(6).unsqueeze(0) < torch.tensor(real_lengths).unsqueeze(1)  # (sentences, src_len)
    if not run.calls:
        fail("the decoder was never called.", expected="one call per generated token", got="no call",
             cause="call model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx)) inside the loop.")
    for step, call in enumerate(run.calls, start=1):
        batch, length = call.ys.shape
        if call.enc_mask is None:
            fail(f"decoder call {step} got no source mask.", expected="src_mask (batch, 1, 1, src_len)", got="None",
                 cause=MISTAKES["no_source_mask"])
        allowed = _mask_rows(call.enc_mask, (batch, 1, length, 6))
        wanted = source_allowed[call.sentences].unsqueeze(1).unsqueeze(1).expand(batch, 1, length, 6)
        if allowed is None or not torch.equal(allowed, wanted):
            fail(f"decoder call {step} got a wrong source mask.", expected="src_mask = make_source_mask(src, pad_idx)",
                 got=describe(call.enc_mask), cause="pass the given src_mask (computed once before the loop).")
        if call.dec_mask is None:
            fail(f"decoder call {step} got no target mask.", expected=f"a causal mask (batch, 1, {length}, {length})",
                 got="None", cause=MISTAKES["no_target_mask"])
        allowed = _mask_rows(call.dec_mask, (batch, 1, length, length))
        causal = torch.ones(length, length, dtype=torch.bool).tril()  # (len, len)
        running = ~(call.ys == ids.pad).any(dim=1)  # sentences without padding yet: their mask is causal
        if allowed is None or not bool((allowed[running] == causal).all()):
            fail(f"decoder call {step} (ys of length {length}) got a wrong target mask.",
                 expected=f"make_target_mask(ys, pad_idx): lower-triangular ({length}, {length}) per sentence",
                 got=describe(call.dec_mask),
                 cause="build the target mask from the current ys inside the loop, make_target_mask(ys, pad_idx); "
                       "a mask built once before the loop has the wrong size.")


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


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Build modules from a fixed seed without disturbing the notebook's own random stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _random_model(sizes: Sizes, ids: Ids) -> nn.Module:
    """The course's Transformer with random weights; <pad> is never predicted (as in a trained model)."""
    with _seeded(sizes.seed):
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


def _random_case(greedy_decode: Callable, sizes: Sizes, ids: Ids, padded: bool) -> None:
    model = _random_model(sizes, ids)
    src = _random_source(sizes, ids, padded)
    run = _call(greedy_decode, model, src, ids, sizes.max_len)
    with torch.no_grad():
        expected = reference_greedy_decode(model, src, ids.pad, ids.bos, ids.eos, sizes.max_len)
        suspects = {cause: (lambda mistake=mistake: _decode(model, src, ids, sizes.max_len, mistake))
                    for mistake, cause in MISTAKES.items()}
        _expect_ids(run, expected, src, ids, suspects=suspects,
                    problem=f"a small Transformer with random weights (seed {sizes.seed}) translates "
                            f"{'a padded batch' if padded else 'this input'} differently from the reference.",
                    cause="each step: logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx)); "
                          "next_token = logits[:, -1].argmax(dim=-1); pad finished sentences; append to ys.")


@check("on a small random Transformer, greedy_decode gives exactly the reference token ids")
def greedy_matches_reference(greedy_decode: Callable, eos_idx: int = 2, **sizes: int) -> None:
    config = replace(Sizes(batch=1, src_len=6), **sizes)
    _random_case(greedy_decode, config, Ids(eos=eos_idx), padded=False)


@check("on a padded batch of source sentences, greedy_decode gives exactly the reference token ids")
def greedy_matches_reference_batch(greedy_decode: Callable, eos_idx: int = 2, **sizes: int) -> None:
    config = replace(Sizes(seed=4), **sizes)
    _random_case(greedy_decode, config, Ids(eos=eos_idx), padded=True)


@check("decoding is deterministic: the next token is the argmax, not a sample")
def greedy_is_deterministic(greedy_decode: Callable) -> None:
    ids, sizes = Ids(), Sizes(dropout=0.5, seed=3, batch=1)
    model = _random_model(sizes, ids)
    src = _random_source(sizes, ids, padded=False)
    with torch.random.fork_rng(devices=[]):  # the notebook's random stream is left untouched
        first, *others = [_call(greedy_decode, model.eval(), src, ids, sizes.max_len).ys for _ in range(3)]
    for got in others:
        if got.shape != first.shape or not torch.equal(got, first):
            fail("the same model (in eval mode) and input gave different translations.",
                 expected=f"every call like the first:{_show(first, ids)}", got=f"another call:{_show(got, ids)}",
                 cause="take the argmax of the logits instead of sampling (torch.multinomial, torch.distributions).")


@check("greedy_decode switches the model to eval mode and runs under torch.no_grad()")
def greedy_eval_no_grad(greedy_decode: Callable) -> None:
    ids, sizes = Ids(), Sizes(dropout=0.5, seed=3, batch=1)
    model = _random_model(sizes, ids).train()  # handed over straight from training
    src = _random_source(sizes, ids, padded=False)
    states: list[tuple[bool, bool]] = []

    def record(_module: nn.Module, _args: tuple) -> None:
        states.append((torch.is_grad_enabled(), model.training))

    handles = [model.encoder.register_forward_pre_hook(record), model.decoder.register_forward_pre_hook(record)]
    try:
        with torch.random.fork_rng(devices=[]):
            _call(greedy_decode, model, src, ids, sizes.max_len)
    finally:
        for handle in handles:
            handle.remove()
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


def _maps_case(attention_maps: Callable, sizes: Sizes, tgt_len: int) -> tuple[dict, dict, torch.Tensor,
                                                                                    torch.Tensor, nn.Module]:
    """(student's maps, reference maps, source, target, model) after one forward pass of a random model."""
    ids = Ids()
    model = _random_model(sizes, ids)
    src = _random_source(sizes, ids, padded=True)
    tgt = torch.randint(4, sizes.tgt_vocab, (sizes.batch, tgt_len), generator=generator(sizes.seed + 200))
    tgt[:, 0] = ids.bos
    with torch.no_grad():
        model(src, tgt, make_source_mask(src, ids.pad), make_target_mask(tgt, ids.pad))
        expected = reference_attention_maps(model)
    with torch.no_grad(), student_code():
        got = attention_maps(model)
    if not isinstance(got, Mapping):
        fail("attention_maps did not return a dictionary.", expected=f"a dict with the keys {list(KINDS)}",
             got=describe(got), cause="keep the given return {...} line with the three stacked tensors.")
    missing = [kind for kind in KINDS if kind not in got]
    if missing:
        fail("attention_maps misses some kinds.", expected=list(KINDS), got=list(got),
             cause="return all three: encoder self-attention, decoder self-attention and cross-attention.")
    return dict(got), expected, src, tgt, model


def _shape_cause(kind: str, shape: tuple[int, ...], shapes: Mapping[str, tuple[int, ...]], sizes: Sizes) -> str:
    """The likely cause of a wrong shape for maps[kind]."""
    layers, batch = sizes.num_layers, sizes.batch
    expected = shapes[kind]
    others = [other for other, other_shape in shapes.items() if other != kind and other_shape == shape]
    if others:
        return (f"this is the shape of '{others[0]}': self-attention is layer.self_attn, cross-attention is "
                "layer.cross_attn of the decoder layers; the encoder's layers are model.encoder.layers.")
    if shape == expected[1:]:
        return "only one layer's weights: stack the weights of every layer, in order, with torch.stack."
    if shape == (batch, layers, *expected[2:]):
        return "the layer axis must come first: torch.stack(list_of_layer_weights) stacks along a new axis 0."
    if shape == (layers * batch, *expected[2:]):
        return "the layers were concatenated with torch.cat along the batch axis: use torch.stack for a new axis."
    axes = ("layers", "batch", "heads", "q_len", "k_len")
    for axis, name in enumerate(axes):
        if axis and shape == expected[:axis] + expected[axis + 1:]:
            return (f"the {name} axis is missing (averaged, summed or indexed away?): keep it, each layer's "
                    "attn_weights is (batch, heads, q_len, k_len) as stored.")
    return ("torch.stack([layer.<attention>.attn_weights for layer in <stack>.layers]) gives "
            "(layers, batch, heads, q_len, k_len).")


def _map_tensors(got: Mapping[str, object], shapes: Mapping[str, tuple[int, ...]], sizes: Sizes,
                 ) -> dict[str, torch.Tensor]:
    """The student's three maps as float64 CPU tensors of the expected shapes, or a failure that says why not."""
    tensors = {}
    for kind in KINDS:
        tensor = expect_tensor(f"maps['{kind}']", got[kind], cause="stack the layers' attn_weights with torch.stack.")
        expect_shape(f"maps['{kind}']", tensor, shapes[kind],
                     cause=_shape_cause(kind, tuple(tensor.shape), shapes, sizes))
        tensors[kind] = tensor.detach().cpu().double()
    return tensors


def _expected_shapes(sizes: Sizes, src_len: int, tgt_len: int) -> dict[str, tuple[int, ...]]:
    front = (sizes.num_layers, sizes.batch, sizes.num_heads)
    return {"encoder_self": (*front, src_len, src_len), "decoder_self": (*front, tgt_len, tgt_len),
            "cross": (*front, tgt_len, src_len)}


@check("attention_maps returns encoder_self, decoder_self and cross stacked over layers, with the right shapes")
def attention_maps_shapes(attention_maps: Callable, tgt_len: int = 5, **sizes: int) -> None:
    config = replace(Sizes(), **sizes)
    got, _, src, _, _ = _maps_case(attention_maps, config, tgt_len)
    _map_tensors(got, _expected_shapes(config, src.size(1), tgt_len), config)


@check("attention_maps holds each layer's stored attn_weights, in layer order (encoder, decoder, cross)")
def attention_maps_values(attention_maps: Callable, tgt_len: int = 5, **sizes: int) -> None:
    config = replace(Sizes(), **sizes)
    got, expected, src, _, _ = _maps_case(attention_maps, config, tgt_len)
    tensors = _map_tensors(got, _expected_shapes(config, src.size(1), tgt_len), config)
    for kind, tensor in tensors.items():
        if torch.allclose(tensor, expected[kind], atol=1e-12, rtol=0):
            continue
        reference = expected[kind]
        suspects = {
            "the layers are in reverse order: layer 0 (next to the embeddings) comes first.": reference.flip(0),
            "every entry holds the last layer's weights: collect layer.….attn_weights of each layer in the loop.": (
                reference[-1:].expand_as(reference)),
            "every entry holds the first layer's weights: collect layer.….attn_weights of each layer in the loop.": (
                reference[:1].expand_as(reference)),
        }
        swapped = {"encoder_self": "decoder_self", "decoder_self": "encoder_self"}.get(kind)
        if swapped and expected[swapped].shape == reference.shape:
            suspects[f"'{kind}' holds the weights of '{swapped}': encoder layers are model.encoder.layers, "
                     "decoder layers model.decoder.layers."] = expected[swapped]
        cause = "each entry is torch.stack([layer.<attention>.attn_weights for layer in <stack>.layers])."
        for suspected_cause, wrong in suspects.items():
            if torch.allclose(tensor, wrong, atol=1e-12, rtol=0):
                cause = suspected_cause
                break
        fail(f"maps['{kind}'] has the wrong values.", expected="the attn_weights stored by each layer's attention",
             got=f"largest difference {float((tensor - reference).abs().max()):.3g}", cause=cause)


@check("every kind of map holds attention weights: each row sums to 1 and hidden keys get exactly 0")
def attention_maps_rows_sum_to_one(attention_maps: Callable, tgt_len: int = 5, **sizes: int) -> None:
    config = replace(Sizes(), **sizes)
    got, _, src, tgt, _ = _maps_case(attention_maps, config, tgt_len)
    source_allowed = (src != Ids().pad)[None, :, None, None, :]  # (1, batch, 1, 1, src_len)
    causal = torch.ones(tgt_len, tgt_len, dtype=torch.bool).tril()  # (tgt_len, tgt_len)
    hidden_keys = {"encoder_self": ~source_allowed, "cross": ~source_allowed, "decoder_self": ~causal}
    tensors = _map_tensors(got, _expected_shapes(config, src.size(1), tgt_len), config)
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
