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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_course.checks import parts
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


NO_TARGET_MASK = ("the decoder gets no target mask (None): pass make_target_mask(ys, pad_idx), the look-ahead mask "
                  "the model was trained with.")
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
        return (f"{head}: that is the token read at position {positions[0]} (the argmax of logits[:, "
                f"{positions[0]}]); the next token is read at the LAST position, logits[:, -1].argmax(dim=-1).")
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


@check("the next token is the argmax of the logits at the LAST position")
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
            fail(f"decoder call {step} got a wrong source mask.", expected="src_mask = make_source_mask(src, pad_idx)",
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
                 expected=f"make_target_mask(ys, pad_idx): lower-triangular ({length}, {length}) per sentence",
                 got=_shown(call.dec_mask),
                 cause="build the target mask from the current ys inside the loop, make_target_mask(ys, pad_idx); "
                       "a mask built once before the loop has the wrong size.")


def _random_case(greedy_decode: Callable, task: Translation) -> None:
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
