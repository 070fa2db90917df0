"""Stage 5: batches with the shifted target, label-smoothed loss, the paper's warm-up schedule,
one training epoch and evaluation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    Steps count from 1; step 0 is treated as step 1 (make_optimizer passes index + 1 and never asks for 0,
    but the formula must not divide by zero for a caller that does).
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


# --- saving and resuming a training run ----------------------------------------------------------

TRAINING_STATE_NAME = "training_state.pt"


def save_training_state(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                        scheduler: torch.optim.lr_scheduler.LRScheduler, history: Sequence[dict[str, float]],
                        config: dict[str, Any] | None = None) -> None:
    """Write everything a run needs to continue exactly where it stopped: the weights, the optimiser's
    state (Adam's running averages), the scheduler's step count, the history (one record per finished
    epoch), the configuration and the random number generators' states (dropout, shuffling).

    The file is written beside its destination and then moved into place, so an interruption while
    saving (a Colab disconnect) leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "history": [dict(record) for record in history], "config": dict(config or {}),
             "rng": {"torch": torch.get_rng_state(),
                     "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}}
    temporary = path.with_name(path.name + ".part")
    torch.save(state, temporary)
    temporary.replace(path)


def resume_training(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler, history: list[dict[str, float]],
                    config: dict[str, Any] | None = None) -> int:
    """Continue a saved run in the objects you already have: load the weights into `model`, the state of
    `optimizer` and `scheduler`, replace the contents of `history` and restore the random generators,
    all in place. Returns the number of finished epochs (0, touching nothing, when there is no file).

    Raises ValueError when the file was saved with a different configuration (its weights would not
    fit): delete or move it, or set the configuration back."""
    path = Path(path)
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    if config is not None and state.get("config") and state["config"] != dict(config):
        raise ValueError(f"{path} was saved by a run with the configuration {state['config']}, not {dict(config)}: "
                         "move or delete that file to start afresh, or set the configuration back to resume it.")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    history[:] = state["history"]
    torch.set_rng_state(state["rng"]["torch"])
    if torch.cuda.is_available() and len(state["rng"]["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return len(history)
