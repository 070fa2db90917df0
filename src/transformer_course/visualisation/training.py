"""Stage 5 figures: the examples a target sentence teaches, sentence lengths and padding, label smoothing,
the warm-up learning-rate schedule, gradient clipping and training curves."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from transformer_course.visualisation.unseen import not_drawn_while_grading


@not_drawn_while_grading
def plot_next_token_examples(tokens: Sequence[str]) -> Figure:
    """The examples one framed target sentence `<bos> ... <eos>` teaches the decoder, one row each: the tokens
    of the reference it has read so far (blue) and the token it must predict next (orange)."""
    rows = len(tokens) - 1
    figure, axis = plt.subplots(figsize=(1.15 * len(tokens) + 2.2, 0.62 * rows + 1.0))
    for row in range(rows):
        y = rows - 1 - row
        for column in range(row + 1):
            axis.text(column, y, tokens[column], ha="center", va="center", fontsize=10,
                      bbox={"boxstyle": "round", "facecolor": "#deebf7", "edgecolor": "#3182bd"})
        axis.annotate("", xy=(row + 0.72, y), xytext=(row + 0.3, y), arrowprops={"arrowstyle": "->"})
        axis.text(row + 1, y, tokens[row + 1], ha="center", va="center", fontsize=10,
                  bbox={"boxstyle": "round", "facecolor": "#fee6ce", "edgecolor": "#e6550d"})
        axis.text(-0.8, y, f"example {row + 1}", ha="right", va="center", fontsize=9)
    axis.set_xlim(-2.4, len(tokens) - 0.4)
    axis.set_ylim(-0.6, rows - 0.4)
    axis.axis("off")
    axis.set_title("One target sentence, one example per token to predict: read (blue), predict (orange)")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_gradient_clipping(gradients: Sequence[tuple[float, float]], clip_norm: float) -> Figure:
    """Two-parameter gradients (arrows from 0) before clipping, clipped by their norm to `clip_norm` (direction
    kept) and clipped entry by entry to ±clip_norm (direction changed); the circle is the norm limit."""
    figure, axes = plt.subplots(1, 2, figsize=(9, 4.2), sharex=True, sharey=True)
    limit = max(max(abs(x), abs(y)) for x, y in gradients) * 1.15
    for axis, how in zip(axes, ("by the total norm", "entry by entry (by value)"), strict=True):
        axis.add_patch(plt.Circle((0, 0), clip_norm, fill=False, linestyle="--", color="grey"))
        axis.add_patch(plt.Rectangle((-clip_norm, -clip_norm), 2 * clip_norm, 2 * clip_norm, fill=False,
                                     linestyle=":", color="grey"))
        for index, (x, y) in enumerate(gradients):
            norm = math.hypot(x, y)
            if how.startswith("by the total"):
                scale = min(1.0, clip_norm / norm)
                clipped = (x * scale, y * scale)
            else:
                clipped = (max(-clip_norm, min(clip_norm, x)), max(-clip_norm, min(clip_norm, y)))
            colour = f"C{index}"
            axis.annotate("", xy=(x, y), xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": colour,
                                                                  "alpha": 0.35, "linewidth": 1.5})
            axis.annotate("", xy=clipped, xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": colour,
                                                                    "linewidth": 2.2})
        axis.set_title(f"clipped {how}")
        axis.set_aspect("equal")
        axis.set_xlim(-limit, limit)
        axis.set_ylim(-limit, limit)
        axis.axhline(0, color="lightgrey", linewidth=0.8)
        axis.axvline(0, color="lightgrey", linewidth=0.8)
        axis.set_xlabel("gradient entry 1")
    axes[0].set_ylabel("gradient entry 2")
    figure.suptitle(f"Faint: the gradients as backward() left them; bold: after clipping with c = {clip_norm}")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_rate_curves(curves: Mapping[str, Sequence[float]], title: str = "Learning rate per update") -> Figure:
    """One line per schedule: label -> the learning rate of each update (updates counted from 1)."""
    figure, axis = plt.subplots(figsize=(7, 3.2))
    for label, rates in curves.items():
        axis.plot(range(1, len(rates) + 1), list(rates), label=label)
    axis.set_xlabel("update (batches seen)")
    axis.set_ylabel("learning rate")
    axis.set_yscale("log")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_sentence_lengths(source_lengths: Sequence[int], target_lengths: Sequence[int]) -> Figure:
    """Histogram of sentence lengths in tokens (with <bos>/<eos>) for both languages."""
    figure, axis = plt.subplots(figsize=(8, 3.2))
    longest = max(max(source_lengths), max(target_lengths))
    bins = range(0, longest + 2)
    axis.hist(source_lengths, bins=bins, alpha=0.6, label="German (source)")
    axis.hist(target_lengths, bins=bins, alpha=0.6, label="English (target)")
    axis.set_xlabel("sentence length in tokens, <bos> and <eos> included")
    axis.set_ylabel("sentences")
    axis.set_title("Multi30k training sentences are short, but their lengths vary")
    axis.legend()
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_padding_share(shares: Mapping[str, Sequence[float]]) -> Figure:
    """Histogram of the padding share per batch (0 = no padding) for each way of forming batches.

    shares: label -> one value per batch, the fraction of token slots in that batch that are <pad>.
    """
    figure, axis = plt.subplots(figsize=(8, 3.2))
    bins = [index / 50 for index in range(51)]
    for label, values in shares.items():
        mean = sum(values) / max(len(values), 1)
        axis.hist(values, bins=bins, alpha=0.6, label=f"{label} (mean {mean:.0%})")
    axis.set_xlabel("share of the batch's token slots that are padding")
    axis.set_ylabel("batches")
    axis.set_title("Padding per batch")
    axis.legend()
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_label_smoothing(vocab_size: int = 10, correct: int = 3, epsilon: float = 0.1) -> Figure:
    """Target distribution over a toy vocabulary: one-hot versus label-smoothed (PyTorch's definition:
    (1 - epsilon) on the correct token plus epsilon / vocab_size on every token)."""
    one_hot = [1.0 if k == correct else 0.0 for k in range(vocab_size)]
    smoothed = [(1 - epsilon) * value + epsilon / vocab_size for value in one_hot]
    figure, axes = plt.subplots(1, 2, figsize=(9, 2.8), sharey=True)
    for axis, values, title in ((axes[0], one_hot, "one-hot target"),
                                (axes[1], smoothed, f"smoothed target, ε = {epsilon}")):
        colours = ["#e6550d" if k == correct else "#9ecae1" for k in range(vocab_size)]
        axis.bar(range(vocab_size), values, color=colours)
        axis.set_xticks(range(vocab_size))
        axis.set_xlabel("token id k")
        axis.set_title(title)
    axes[0].set_ylabel("target probability q(k)")
    axes[1].annotate(f"{smoothed[correct]:.2f}", (correct, smoothed[correct]), ha="center", va="bottom")
    axes[1].annotate(f"{epsilon / vocab_size:.2f} each", (0, epsilon / vocab_size), ha="left", va="bottom",
                     xytext=(0, 8), textcoords="offset points")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_learning_rate_schedule(rate_function: Callable[..., float],
                                settings: Sequence[tuple[int, int]] = ((512, 4000), (512, 6000), (256, 4000)),
                                max_step: int = 20000, factor: float = 1.0) -> Figure:
    """Learning rate against step for a few (d_model, warmup_steps) settings.

    rate_function(step, d_model, warmup_steps, factor) is the schedule, e.g. `noam_learning_rate`.
    """
    steps = list(range(1, max_step + 1, max(1, max_step // 1000)))
    figure, axis = plt.subplots(figsize=(8, 3.5))
    for d_model, warmup_steps in settings:
        rates = [float(rate_function(step, d_model, warmup_steps, factor)) for step in steps]
        line, = axis.plot(steps, rates, label=f"d_model={d_model}, warmup={warmup_steps}")
        peak = float(rate_function(warmup_steps, d_model, warmup_steps, factor))
        axis.plot([warmup_steps], [peak], "o", color=line.get_color())
    axis.set_xlabel("training step (batches seen)")
    axis.set_ylabel("learning rate")
    axis.set_title("Warm-up schedule: linear rise for warmup steps, then decay ∝ 1/√step")
    axis.legend()
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_history(history: Sequence[Mapping[str, float]], title: str = "Training curves") -> Figure:
    """Loss and perplexity per epoch from a list of dicts with keys `epoch`, `train_loss` and, when
    measured, `val_loss` (perplexity = exp(val_loss), the loss being cross-entropy per token in nats)."""
    epochs = [record["epoch"] for record in history]
    figure, (loss_axis, perplexity_axis) = plt.subplots(1, 2, figsize=(10, 3.5))
    loss_axis.plot(epochs, [record["train_loss"] for record in history], "o-", label="train (label-smoothed)")
    validated = [record for record in history if record.get("val_loss") is not None]
    if validated:
        loss_axis.plot([record["epoch"] for record in validated], [record["val_loss"] for record in validated],
                       "o-", label="validation")
        perplexity_axis.plot([record["epoch"] for record in validated],
                             [math.exp(min(record["val_loss"], 50.0)) for record in validated], "o-",
                             color="C1")
    loss_axis.set_xlabel("epoch")
    loss_axis.set_ylabel("cross-entropy per token (nats)")
    loss_axis.set_title(title)
    loss_axis.legend()
    perplexity_axis.set_xlabel("epoch")
    perplexity_axis.set_ylabel("validation perplexity")
    perplexity_axis.set_yscale("log")
    perplexity_axis.set_title("Perplexity = exp(validation loss)")
    for axis in (loss_axis, perplexity_axis):
        _integer_epochs(axis, epochs)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_loss_curves(curves: Mapping[str, Sequence[float]], title: str = "Training loss per epoch") -> Figure:
    """One line per run: label -> mean training loss of each epoch (epochs counted from 1)."""
    figure, axis = plt.subplots(figsize=(7, 3.5))
    for label, losses in curves.items():
        axis.plot(range(1, len(losses) + 1), list(losses), "o-", label=label)
    axis.set_xlabel("epoch")
    axis.set_ylabel("cross-entropy per token (nats)")
    axis.set_title(title)
    _integer_epochs(axis, range(1, max((len(losses) for losses in curves.values()), default=1) + 1))
    axis.legend()
    figure.tight_layout()
    return figure


def _integer_epochs(axis: Axes, epochs: Sequence[int]) -> None:
    """Tick every epoch when there are few of them, else let matplotlib choose whole numbers."""
    epochs = list(epochs)
    if 0 < len(epochs) <= 20:
        axis.set_xticks(epochs)
    else:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
