"""Stand-ins, written apart from the reference, for reference parts whose solution a notebook's grading build leaves
out (`build`): the exercises of the graded stage and of every later stage. Each computes the reference's values
(tests/test_grading_build.py); none is the reference's code. They are in the student's reach anyway: torch is.

A function here takes the place of the reference definition of the same name in two ways:
- where the checks' experiments import it from the reference and it is an exercise of the graded stage or a later
  one (`build.stand_ins_for`: the build's checks import the stand-in instead);
- where it is an exercise of a *later* stage, which the graded notebook or the earlier stages' code use (stage 0
  collates its batches with stage 5's `collate`, stage 5 translates with stage 6's `greedy_decode`), the build's
  reference module imports the stand-in in place of the definition (`build.stand_in_definitions`).
None depends on another exercise's reference solution (a later stage's may be gone from the build too).
The stand-ins for *methods* an experiment plugs into a student's module (additive attention's score, split and
combine heads, the feed-forward network's and the stacks' forward) live beside their experiments in the checks
modules, which may not import the grading package (tests/test_layout.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn


def scaled_dot_product_attention(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, weights) of attention, operation for operation as the lesson builds it (the checks' recorder
    matches a student's forward with the plugged attention inside against the reference's, operation by
    operation, and explains crashes from what each operation received). It reaches only the servant of an
    experiment that plugs it (`build.experiment_parts`). Q (..., q_len, d_k), K (..., k_len, d_k), V (..., k_len,
    d_v), mask broadcastable to (..., q_len, k_len), 0 where attention is not allowed."""
    scale = math.sqrt(K.shape[-1])
    scores = torch.matmul(Q, K.transpose(-2, -1)) / scale  # (..., q_len, k_len)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)  # exp(-1e9) is exactly 0 in softmax
    weights = torch.softmax(scores, dim=-1)  # (..., q_len, k_len)
    output = torch.matmul(weights, V)  # (..., q_len, d_v)
    return output, weights


def compute_loss(model: nn.Module, batch: Any, criterion: nn.Module) -> torch.Tensor:
    """The criterion (PyTorch's `nn.CrossEntropyLoss`) over every target token of the batch."""
    logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    return criterion(logits.flatten(0, -2), batch.tgt_out.flatten())


def train_epoch(model: nn.Module, batches: Iterable[Any], criterion: nn.Module, optimizer: torch.optim.Optimizer,
                scheduler: Any = None, device: torch.device | str = "cpu", clip_norm: float = 1.0,
                max_steps: int | None = None, progress: bool = True) -> float:
    """One pass of training over at most `max_steps` batches (no progress bar: nobody sees it while grading): for
    each, the loss of `compute_loss` above, its gradients clipped to a total norm of `clip_norm`, an optimizer step,
    then a scheduler step. Returns the mean loss per target token that is not `criterion.ignore_index`."""
    model.train()
    weighted, counted = 0.0, 0
    steps = [optimizer.step, *([scheduler.step] if scheduler is not None else [])]  # in this order, once a batch
    for batch in itertools.islice(batches, max_steps):
        batch = batch.to(device)
        optimizer.zero_grad()
        loss = compute_loss(model, batch, criterion)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip_norm)
        for step in steps:
            step()
        real = int(torch.count_nonzero(batch.tgt_out != criterion.ignore_index))
        weighted, counted = weighted + loss.item() * real, counted + real
    return weighted / max(counted, 1)


def make_padding_mask(token_ids: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """(batch, seq_len) ids -> (batch, 1, 1, seq_len) bool, True at the tokens that are not padding."""
    return torch.ne(token_ids, pad_idx)[:, None, None, :]


def make_look_ahead_mask(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(1, 1, size, size) bool, True where key j <= query i (the diagonal included), from two `arange`s."""
    positions = torch.arange(size, device=device)
    return (positions[:, None] >= positions[None, :])[None, None]


def make_target_mask(tgt: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """(batch, tgt_len) ids -> (batch, 1, tgt_len, tgt_len): the look-ahead mask and the keys that are not
    padding."""
    return torch.logical_and(make_look_ahead_mask(tgt.size(1), device=tgt.device), make_padding_mask(tgt, pad_idx))


def collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_idx: int) -> Any:
    """A Batch from (source ids, target ids) pairs, padded by `nn.utils.rnn.pad_sequence`; the decoder reads the
    target without its last token and predicts it without its first (`narrow`). Its masks are this module's."""
    from transformer_course.reference.training import Batch  # given code (a dataclass), no exercise

    def padded(sequences: list[Sequence[int]]) -> torch.Tensor:
        return nn.utils.rnn.pad_sequence([torch.as_tensor(list(ids), dtype=torch.long) for ids in sequences],
                                         batch_first=True, padding_value=pad_idx)

    src = padded([source for source, _ in pairs])
    tgt = padded([target for _, target in pairs])
    steps = tgt.size(1) - 1
    tgt_in, tgt_out = tgt.narrow(1, 0, steps), tgt.narrow(1, 1, steps)
    return Batch(src, tgt_in, tgt_out, make_padding_mask(src, pad_idx), make_target_mask(tgt_in, pad_idx))


@torch.no_grad()
def greedy_decode(model: nn.Module, src: torch.Tensor, pad_idx: int, bos_idx: int, eos_idx: int,
                  max_len: int) -> torch.Tensor:
    """src (batch, src_len) -> (batch, out_len <= max_len + 1) ids that start with <bos>, each step the argmax of
    the model's decoder (`model.encoder` run once); padding after a sentence's <eos>, stopping when every sentence
    has one."""
    model.eval()
    source_mask = make_padding_mask(src, pad_idx)  # (batch, 1, 1, src_len)
    memory = model.encoder(src, source_mask)
    tokens = [torch.full((src.size(0),), bos_idx, dtype=torch.long, device=src.device)]
    ended = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        so_far = torch.stack(tokens, dim=1)  # (batch, steps)
        logits = model.decoder(so_far, memory, source_mask, make_target_mask(so_far, pad_idx))
        chosen = torch.where(ended, torch.full_like(tokens[0], pad_idx), torch.argmax(logits[:, -1], dim=-1))
        tokens.append(chosen)
        ended = ended | chosen.eq(eos_idx)
        if bool(ended.all()):
            break
    return torch.stack(tokens, dim=1)
