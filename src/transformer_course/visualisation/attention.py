"""Stage 2 figures: attention weights (one head, a grid of heads), masks, and why scores are scaled."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from transformer_course.visualisation.masks import add_mask_legend, draw_mask
from transformer_course.visualisation.unseen import not_drawn_while_grading


def _matrix(tensor: torch.Tensor) -> torch.Tensor:
    """Reduce (..., rows, cols) to (rows, cols) by taking index 0 of every leading axis."""
    tensor = tensor.detach()
    while tensor.dim() > 2:
        tensor = tensor[0]
    return tensor.float().cpu()


def _heads(weights: torch.Tensor) -> torch.Tensor:
    """Accept (heads, q_len, k_len) or (batch, heads, q_len, k_len); return (heads, q_len, k_len)."""
    weights = weights.detach()
    while weights.dim() > 3:
        weights = weights[0]
    return weights.float().cpu()


def _label_axes(axis: Axes, query_tokens: Sequence[str] | None, key_tokens: Sequence[str] | None,
                rows: int, cols: int) -> None:
    axis.set_xticks(range(cols))
    axis.set_yticks(range(rows))
    if key_tokens is not None:
        axis.set_xticklabels(key_tokens, rotation=45, ha="right")
    if query_tokens is not None:
        axis.set_yticklabels(query_tokens)


def _draw_weights(axis: Axes, matrix: torch.Tensor, query_tokens: Sequence[str] | None,
                  key_tokens: Sequence[str] | None, annotate: bool, vmax: float | None = 1.0) -> object:
    vmax = float(matrix.max()) if vmax is None else vmax
    image = axis.imshow(matrix.numpy(), cmap="Blues", vmin=min(0.0, float(matrix.min())), vmax=vmax)
    rows, cols = matrix.shape
    _label_axes(axis, query_tokens, key_tokens, rows, cols)
    if annotate:
        for row in range(rows):
            for col in range(cols):
                value = float(matrix[row, col])
                axis.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=8,
                          color="white" if value > 0.6 * vmax else "black")
    return image


@not_drawn_while_grading
def plot_attention_weights(weights: torch.Tensor, query_tokens: Sequence[str] | None = None,
                           key_tokens: Sequence[str] | None = None, title: str = "Attention weights",
                           annotate: bool = True, vmax: float | None = 1.0,
                           colour_label: str = "weight") -> Figure:
    """Heatmap of one head's weights (q_len, k_len): row i shows how query i spreads its attention.

    Extra leading axes (batch, heads) are reduced by taking index 0. Pass vmax=None (and another
    colour_label) to draw raw scores, which are not limited to [0, 1].
    """
    matrix = _matrix(weights)
    rows, cols = matrix.shape
    figure, axis = plt.subplots(figsize=(1.0 + 0.6 * cols + 1.2, 0.8 + 0.5 * rows + 0.6))
    image = _draw_weights(axis, matrix, query_tokens, key_tokens, annotate and rows * cols <= 150, vmax)
    axis.set_xlabel("key (attended to)")
    axis.set_ylabel("query (attending)")
    axis.set_title(title)
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04, label=colour_label)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_attention_heads(weights: torch.Tensor, query_tokens: Sequence[str] | None = None,
                         key_tokens: Sequence[str] | None = None, max_columns: int = 4,
                         title: str = "Attention weights, one panel per head") -> Figure:
    """Grid of heatmaps, one per head, from weights (batch, heads, q_len, k_len); batch item 0 is shown."""
    heads = _heads(weights)
    num_heads, rows, cols = heads.shape
    columns = min(max_columns, num_heads)
    grid_rows = math.ceil(num_heads / columns)
    width = 0.9 + (0.35 * cols + 0.8) * columns
    height = 0.9 + 0.35 * rows * grid_rows
    figure, axes = plt.subplots(grid_rows, columns, squeeze=False, figsize=(width, height))
    image = None
    for index, axis in enumerate(axes.flat):
        if index >= num_heads:
            axis.axis("off")
            continue
        image = _draw_weights(axis, heads[index], query_tokens if index % columns == 0 else None, key_tokens,
                              annotate=False)
        if index % columns != 0:
            axis.set_yticklabels([])
        axis.set_title(f"head {index}", fontsize=10)
    figure.suptitle(title)
    figure.tight_layout()
    if image is not None:
        figure.colorbar(image, ax=axes.ravel().tolist(), fraction=0.025, pad=0.02, label="weight")
    return figure


@not_drawn_while_grading
def plot_masks(masks: Mapping[str, torch.Tensor], query_tokens: Sequence[str] | None = None,
               key_tokens: Sequence[str] | None = None) -> Figure:
    """One panel per mask: blue cells may be attended to (True / 1), grey cells are hidden (False / 0).

    Each mask is reduced to 2-D (index 0 of leading axes) and broadcast to (q_len, k_len) when the
    token labels give those lengths, so a padding mask (batch, 1, 1, k_len) shows as full rows.
    """
    figure, axes = plt.subplots(1, len(masks), squeeze=False, figsize=(3.6 * len(masks), 4.0))
    for axis, (name, mask) in zip(axes.flat, masks.items(), strict=True):
        matrix = _matrix(mask.to(torch.float32))
        rows = len(query_tokens) if query_tokens is not None else matrix.shape[0]
        cols = len(key_tokens) if key_tokens is not None else matrix.shape[1]
        matrix = matrix.expand(rows, cols)  # a (1, k_len) padding row becomes (q_len, k_len)
        draw_mask(axis, matrix.numpy(), annotate=True)
        _label_axes(axis, query_tokens, key_tokens, rows, cols)
        axis.set_title(name)
        axis.set_xlabel("key")
    axes.flat[0].set_ylabel("query")
    add_mask_legend(figure)
    return figure


@not_drawn_while_grading
def plot_dot_product_variance(d_k_values: Sequence[int], raw_variances: Sequence[float],
                              scaled_variances: Sequence[float]) -> Figure:
    """Variance of q·k for random unit-variance vectors, before and after dividing by sqrt(d_k)."""
    figure, axis = plt.subplots(figsize=(6, 3.6))
    axis.plot(d_k_values, d_k_values, color="lightgrey", linewidth=7, label="the line y = d_k")
    axis.plot(d_k_values, raw_variances, "o-", label="q · k   (grows like d_k)")
    axis.plot(d_k_values, scaled_variances, "s-", label="q · k / √d_k   (stays near 1)")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log", base=2)
    axis.set_xlabel("d_k (width of queries and keys)")
    axis.set_ylabel("variance of the score")
    axis.set_title("Dot products spread out as d_k grows")
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_softmax_saturation(scores: torch.Tensor, d_k: int) -> Figure:
    """Softmax of one row of raw scores next to the softmax of the same scores divided by sqrt(d_k)."""
    row = scores.detach().float().cpu().flatten()
    keys = range(len(row))
    raw, scaled = torch.softmax(row, dim=0), torch.softmax(row / math.sqrt(d_k), dim=0)
    figure, axes = plt.subplots(1, 2, figsize=(9, 3), sharey=True)
    for axis, weights, name in ((axes[0], raw, "softmax(q·k)"), (axes[1], scaled, f"softmax(q·k / √{d_k})")):
        axis.bar(keys, weights.numpy(), color="#4a78b5")
        axis.set_title(name)
        axis.set_xlabel("key")
        axis.set_ylim(0, 1.05)
    axes[0].set_ylabel("attention weight")
    figure.suptitle(f"One query, {len(row)} keys, d_k = {d_k}: unscaled, the softmax is almost one-hot")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_copy_symptom(losses: Sequence[float], teacher_forced: float, greedy: float) -> Figure:
    """A model trained on a copy task: its training loss per step (log scale), and the share of symbols it gets
    right with teacher forcing (the correct output given, every position at once) and with greedy decoding (its
    own output fed back, one step at a time)."""
    figure, (curve, bars) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [2, 1]})
    curve.plot(range(1, len(losses) + 1), losses, color="#3b74b8", linewidth=1)
    curve.set_yscale("log")
    curve.set_xlabel("training step")
    curve.set_ylabel("cross-entropy loss (log scale)")
    curve.set_title(f"Training loss: {losses[0]:.2f} at the first step, {losses[-1]:.4f} at the last", fontsize=10)
    shares = [100 * teacher_forced, 100 * greedy]
    drawn = bars.bar(["teacher forcing", "greedy decoding"], shares, color=["#8fbf7f", "#e08a6f"])
    bars.bar_label(drawn, labels=[f"{share:.1f} %" for share in shares], fontsize=9)
    bars.set_ylim(0, 110)
    bars.set_ylabel("symbols copied correctly (%)")
    bars.set_title("The same trained model, used two ways", fontsize=10)
    figure.tight_layout()
    return figure
