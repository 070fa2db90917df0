"""Stage 5: batches with the shifted target, label-smoothed loss, the paper's warm-up schedule,
one training epoch and evaluation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from transformer_course.reference.model import make_source_mask, make_target_mask


@dataclass
class Batch:
    """One padded batch. src (batch, src_len); tgt_in and tgt_out (batch, tgt_len);
    src_mask (batch, 1, 1, src_len); tgt_mask (batch, 1, tgt_len, tgt_len)."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    src_mask: torch.Tensor
    tgt_mask: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(getattr(self, name).to(device) for name in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask")))


def pad_sequences(sequences: Sequence[Sequence[int]], pad_idx: int) -> torch.Tensor:
    """Right-pad lists of ids into a (batch, longest) int64 tensor."""
    longest = max(len(sequence) for sequence in sequences)
    padded = torch.full((len(sequences), longest), pad_idx, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        padded[row, : len(sequence)] = torch.as_tensor(sequence, dtype=torch.long)
    return padded


def collate(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_idx: int) -> Batch:
    """(source ids, target ids) pairs, each target framed as <bos> ... <eos> -> a Batch.

    Teacher forcing: the decoder reads tgt_in = target[:, :-1] and must predict tgt_out = target[:, 1:].
    """
    src = pad_sequences([source for source, _ in pairs], pad_idx)  # (batch, src_len)
    tgt = pad_sequences([target for _, target in pairs], pad_idx)  # (batch, tgt_len + 1)
    ### BEGIN SOLUTION
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # shift by one: predict the next token
    ### END SOLUTION
    return Batch(src, tgt_in, tgt_out, make_source_mask(src, pad_idx), make_target_mask(tgt_in, pad_idx))


def make_criterion(pad_idx: int, label_smoothing: float = 0.1) -> nn.CrossEntropyLoss:
    """Cross-entropy over the target vocabulary that ignores padding positions."""
    return nn.CrossEntropyLoss(ignore_index=pad_idx, label_smoothing=label_smoothing)


def compute_loss(model: nn.Module, batch: Batch, criterion: nn.Module) -> torch.Tensor:
    """Mean loss per real target token of one batch (a scalar tensor that can be backpropagated).

    The model maps (src, tgt_in, src_mask, tgt_mask) to logits (batch, tgt_len, vocab); the criterion
    wants one row of scores per token, (batch * tgt_len, vocab), and the targets tgt_out as (batch * tgt_len,).
    """
    ### BEGIN SOLUTION
    logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (batch, tgt_len, vocab)
    loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1))
    ### END SOLUTION
    return loss


def noam_learning_rate(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)  (paper, eq. 3).

    Steps count from 1; step 0 is treated as step 1 (torch's LambdaLR asks for step 0 when it is created).
    """
    ### BEGIN SOLUTION
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)
    ### END SOLUTION


def make_optimizer(model: nn.Module, d_model: int, warmup_steps: int = 4000, factor: float = 1.0,
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam(beta1=0.9, beta2=0.98, eps=1e-9) driven by the warm-up schedule, as in the paper."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda index: noam_learning_rate(index + 1, d_model, warmup_steps, factor))
    return optimizer, scheduler


def train_epoch(model: nn.Module, batches: Iterable[Batch], criterion: nn.Module,
                optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
                device: torch.device | str = "cpu", clip_norm: float = 1.0, max_steps: int | None = None,
                progress: bool = True) -> float:
    """One pass of training; returns the mean loss per target token.

    For every batch: zero the gradients, compute the loss, backpropagate, clip the gradients' total norm
    to clip_norm, take an optimizer step, then a scheduler step (the schedule counts batches, not epochs).
    """
    model.train()
    total_loss, total_tokens = 0.0, 0
    for step, batch in enumerate(tqdm(batches, desc="train", leave=False, disable=not progress)):
        if max_steps is not None and step >= max_steps:
            break
        batch = batch.to(device)
        ### BEGIN SOLUTION
        optimizer.zero_grad()
        loss = compute_loss(model, batch, criterion)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        ### END SOLUTION
        tokens = int((batch.tgt_out != criterion.ignore_index).sum())
        total_loss += loss.item() * tokens
        total_tokens += tokens
    return total_loss / max(total_tokens, 1)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Batch], criterion: nn.Module,
             device: torch.device | str = "cpu", progress: bool = True) -> float:
    """Mean loss per target token over batches, in eval mode (perplexity = exp of it without smoothing)."""
    model.eval()
    total_loss, total_tokens = 0.0, 0
    for batch in tqdm(batches, desc="eval", leave=False, disable=not progress):
        batch = batch.to(device)
        tokens = int((batch.tgt_out != criterion.ignore_index).sum())
        total_loss += compute_loss(model, batch, criterion).item() * tokens
        total_tokens += tokens
    return total_loss / max(total_tokens, 1)


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))
