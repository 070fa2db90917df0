"""Stage 5: batches with the shifted target, label-smoothed loss, the paper's warm-up schedule,
one training epoch, evaluation, the epoch loop (`fit`), saving and resuming a run, averaging checkpoints."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
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
    """(source ids, target ids) pairs, each target framed as <bos> ... <eos> -> a Batch for teacher forcing.

    src (batch, src_len): the padded sources. tgt_in and tgt_out, both (batch, tgt_len), int64: at every
    position t, tgt_in[:, t] is the token the decoder reads there and tgt_out[:, t] the token it must predict
    there (section 3 of the lesson); tgt_len is one less than the longest framed target.
    """
    src = pad_sequences([source for source, _ in pairs], pad_idx)  # (batch, src_len)
    tgt = pad_sequences([target for _, target in pairs], pad_idx)  # (batch, tgt_len + 1)
    ### BEGIN SOLUTION
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # shift by one: predict the next token
    ### END SOLUTION
    return Batch(src, tgt_in, tgt_out, make_source_mask(src, pad_idx), make_target_mask(tgt_in, pad_idx))


def copy_pairs(count: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """`count` random sentences of 2 to 6 words over the ids 4..11, each paired with itself, framed by
    <bos> (1) and <eos> (2): the copy task."""
    random = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(count):
        length = int(torch.randint(2, 7, (1,), generator=random))
        words = torch.randint(4, 12, (length,), generator=random).tolist()
        pairs.append(([1, *words, 2], [1, *words, 2]))
    return pairs


def make_criterion(pad_idx: int, label_smoothing: float = 0.1) -> nn.CrossEntropyLoss:
    """Cross-entropy over the target vocabulary that ignores padding positions."""
    return nn.CrossEntropyLoss(ignore_index=pad_idx, label_smoothing=label_smoothing)


def compute_loss(model: nn.Module, batch: Batch, criterion: nn.Module) -> torch.Tensor:
    """The mean loss per real target token of one batch: a 0-d tensor that can be backpropagated.

    model: stage 4's Transformer (or any module with its call and its logits (batch, tgt_len, vocab));
    criterion: the given nn.CrossEntropyLoss, which knows the padding id and the label smoothing.
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
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


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
    """One pass of training over `batches` (the first max_steps of them, when given); returns the mean loss
    per real target token, each batch's loss measured before its update.

    What must hold: dropout is on while training; every batch makes exactly one update of the weights, driven by
    the gradient of that batch's loss alone (its loss from compute_loss), with the total norm of the gradients
    of all parameters together at most clip_norm; the k-th update of a run uses the schedule's k-th learning
    rate; with scheduler None the learning rate is left as it is. The given lines after yours read the batch's
    loss tensor from the name `loss`.
    """
    total_loss, total_tokens = 0.0, 0
    ### BEGIN SOLUTION
    model.train()  # dropout on: evaluate() leaves the model in eval mode
    ### END SOLUTION
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
    """e^loss for a loss in nats per token (capped, so that a diverged run gives a large number, not inf)."""
    return math.exp(min(loss, 50.0))


def fit(model: nn.Module, train_batches: Iterable[Batch], val_batches: Iterable[Batch], criterion: nn.Module,
        optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        epochs: int = 1, history: list[dict[str, float]] | None = None, device: torch.device | str = "cpu",
        clip_norm: float = 1.0, max_steps: int | None = None,
        after_epoch: Callable[[list[dict[str, float]]], None] | None = None, progress: bool = True,
        ) -> list[dict[str, float]]:
    """Train until `history` holds `epochs` epochs, continuing after the epochs it already holds.

    Each epoch: train_epoch on train_batches (in a fresh order when their batch sampler has set_epoch), then
    the validation loss without label smoothing on val_batches. One record per epoch goes into history:
    epoch, train_loss, val_loss, lr (the learning rate the next update will use) and seconds; after_epoch
    (to save the training state, say) is called with history after each. Returns history."""
    history = [] if history is None else history
    plain = make_criterion(criterion.ignore_index, label_smoothing=0.0)  # validation loss: comparable, unsmoothed
    sampler = getattr(train_batches, "batch_sampler", None)
    done = len(history)
    bar = tqdm(range(done + 1, epochs + 1), desc="epochs", unit="epoch", initial=done, total=max(epochs, done),
               disable=not progress)
    for epoch in bar:
        started = time.perf_counter()
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # another shuffle of the batches every epoch
        ### BEGIN SOLUTION
        train_loss = train_epoch(model, train_batches, criterion, optimizer, scheduler, device, clip_norm,
                                 max_steps, progress)
        val_loss = evaluate(model, val_batches, plain, device, progress)
        ### END SOLUTION
        history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss,
                        "lr": optimizer.param_groups[0]["lr"], "seconds": time.perf_counter() - started})
        if after_epoch is not None:
            after_epoch(history)
        if progress:
            bar.write(f"epoch {epoch}: train loss {train_loss:.3f}, validation loss {val_loss:.3f} (perplexity "
                      f"{perplexity(val_loss):.1f}), next learning rate {history[-1]['lr']:.2e}, "
                      f"{history[-1]['seconds']:.0f} s")
    return history


def average_state_dicts(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of each floating-point tensor over `states` (checkpoints of one run); integer
    tensors (counters, say) are taken from the last state."""
    averaged = {}
    for name, last in states[-1].items():
        if last.is_floating_point():
            averaged[name] = torch.stack([state[name].float() for state in states]).mean(dim=0).to(last.dtype)
        else:
            averaged[name] = last.clone()
    return averaged


# --- saving and resuming a training run ----------------------------------------------------------

TRAINING_STATE_NAME = "training_state.pt"


def save_training_state(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                        scheduler: torch.optim.lr_scheduler.LRScheduler, history: Sequence[dict[str, float]],
                        config: dict[str, Any] | None = None) -> None:
    """Write everything a run needs to continue exactly where it stopped: the weights, the optimiser's
    state (Adam's running averages), the scheduler's step count, the history (one record per finished
    epoch), the configuration and the random number generators' states (dropout's; the order of the batches
    follows from the sampler's seed and the epoch).

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
