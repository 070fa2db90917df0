"""Stage 6 figures: the attention of a trained model, per layer and head.

Weights come from `attention_maps(model)`: (layers, batch, heads, q_len, k_len) for each kind
(encoder self-attention, decoder self-attention, cross-attention). Two views:
- `plot_attention_grid`: matplotlib, one panel per (layer, head), token labels on the outer panels;
- `plot_attention_interactive`: plotly, one heatmap with a slider over layers and heads (and the mean
  of the heads of each layer); hovering a cell shows the query token, the key token and the weight.
  It comes with an HTML and a static PNG version, so it also shows on GitHub and in nbconvert HTML
  (see `transformer_course.visualisation.interactive`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from transformer_course.visualisation.unseen import not_drawn_while_grading

if TYPE_CHECKING:  # plotly is imported where it is used: importing it costs a second, grading never needs it
    from transformer_course.visualisation.interactive import InteractiveFigure


def _per_layer(weights: torch.Tensor, sentence: int) -> torch.Tensor:
    """Accept (layers, batch, heads, q, k) or (layers, heads, q, k); return (layers, heads, q, k) on the CPU."""
    weights = weights.detach().float().cpu()
    if weights.dim() == 5:
        weights = weights[:, sentence]
    if weights.dim() != 4:
        raise ValueError(f"expected (layers, batch, heads, q_len, k_len) weights, got shape {tuple(weights.shape)}")
    return weights


def _check_labels(weights: torch.Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str]) -> None:
    q_len, k_len = weights.shape[-2:]
    if len(query_tokens) != q_len or len(key_tokens) != k_len:
        raise ValueError(f"{len(query_tokens)} query and {len(key_tokens)} key labels for a ({q_len}, {k_len}) map")


@not_drawn_while_grading
def plot_attention_grid(weights: torch.Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str],
                        title: str, sentence: int = 0, heads: Sequence[int] | None = None,
                        panel_inches: float = 1.9) -> Figure:
    """Grid of heatmaps: one row per layer, one column per head (all heads, or those listed in `heads`).

    Rows of each panel are queries, columns are keys; the colour scale is shared by all panels
    (0 to the largest weight shown), so a pale panel is a head that spreads its attention.
    """
    per_layer = _per_layer(weights, sentence)
    _check_labels(per_layer, query_tokens, key_tokens)
    chosen = list(range(per_layer.size(1))) if heads is None else list(heads)
    layers = per_layer.size(0)
    vmax = float(per_layer[:, chosen].max())
    figure, axes = plt.subplots(layers, len(chosen), squeeze=False, layout="constrained",
                                figsize=(1.6 + panel_inches * len(chosen), 1.4 + panel_inches * layers))
    image = None
    for layer in range(layers):
        for column, head in enumerate(chosen):
            axis = axes[layer, column]
            image = axis.imshow(per_layer[layer, head].numpy(), cmap="Blues", vmin=0.0, vmax=vmax, aspect="auto")
            axis.set_xticks(range(len(key_tokens)))
            axis.set_yticks(range(len(query_tokens)))
            bottom, left = layer == layers - 1, column == 0
            axis.set_xticklabels(key_tokens if bottom else [], rotation=90, fontsize=6)
            axis.set_yticklabels(query_tokens if left else [], fontsize=6)
            axis.tick_params(length=0)
            if layer == 0:
                axis.set_title(f"head {head}", fontsize=9)
            if left:
                axis.set_ylabel(f"layer {layer}", fontsize=9)
    figure.suptitle(title)
    if image is not None:
        figure.colorbar(image, ax=axes, fraction=0.02, pad=0.01, label="attention weight")
    return figure


@not_drawn_while_grading  # while grading: an Unseen figure, whose .show() shows nothing
def plot_attention_interactive(weights: torch.Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str],
                               title: str, sentence: int = 0, query_label: str = "query",
                               key_label: str = "key") -> InteractiveFigure:
    """One heatmap with a slider over (layer, head); each layer also offers the mean over its heads.
    Returned as an InteractiveFigure: `.show()` it (`.figure` is the plotly figure).

    Hover shows `query_label`: token, `key_label`: token and the weight. Positions, not token strings,
    are the axis values, so a word that occurs twice keeps two rows.
    """
    import plotly.graph_objects as go

    from transformer_course.visualisation.interactive import InteractiveFigure

    per_layer = _per_layer(weights, sentence)
    _check_labels(per_layer, query_tokens, key_tokens)
    layers, heads = per_layer.shape[:2]
    views: list[tuple[str, np.ndarray]] = []
    for layer in range(layers):
        views.append((f"layer {layer} · mean of heads", per_layer[layer].mean(0).numpy()))
        views += [(f"layer {layer} · head {head}", per_layer[layer, head].numpy()) for head in range(heads)]
    pairs = np.empty((len(query_tokens), len(key_tokens), 2), dtype=object)  # hover text of every cell
    for row, query in enumerate(query_tokens):
        for column, key in enumerate(key_tokens):
            pairs[row, column] = (query, key)
    first_name, first_matrix = views[-heads - 1]  # the last layer's mean: usually the clearest picture
    figure = go.Figure(go.Heatmap(
        z=first_matrix, x=list(range(len(key_tokens))), y=list(range(len(query_tokens))), customdata=pairs,
        colorscale="Blues", zmin=0.0, zmax=float(per_layer.max()), colorbar={"title": {"text": "weight"}},
        hovertemplate=f"{query_label}: %{{customdata[0]}}<br>{key_label}: %{{customdata[1]}}"
                      "<br>weight: %{z:.3f}<extra></extra>",
    ))
    steps = [{"label": name, "method": "update", "args": [{"z": [matrix]}, {"title.text": f"{title} — {name}"}]}
             for name, matrix in views]
    figure.update_layout(
        title={"text": f"{title} — {first_name}"},
        xaxis={"tickvals": list(range(len(key_tokens))), "ticktext": list(key_tokens), "tickangle": -60,
               "title": {"text": key_label}},
        yaxis={"tickvals": list(range(len(query_tokens))), "ticktext": list(query_tokens), "autorange": "reversed",
               "title": {"text": query_label}},
        sliders=[{"active": len(views) - heads - 1, "steps": steps, "currentvalue": {"prefix": "showing: "},
                  "pad": {"t": 70}}],
        width=max(520, 60 + 38 * len(key_tokens)), height=max(480, 260 + 30 * len(query_tokens)),
        margin={"l": 90, "r": 30, "t": 60, "b": 40},
    )
    return InteractiveFigure(figure)


@not_drawn_while_grading
def plot_head_average(weights: torch.Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str],
                      title: str, layer: int = -1, sentence: int = 0) -> Figure:
    """One layer's weights averaged over its heads, annotated: a first, readable alignment picture."""
    matrix = _per_layer(weights, sentence)[layer].mean(0)  # (q_len, k_len)
    _check_labels(matrix, query_tokens, key_tokens)
    rows, columns = matrix.shape
    figure, axis = plt.subplots(figsize=(1.6 + 0.55 * columns, 1.2 + 0.45 * rows))
    image = axis.imshow(matrix.numpy(), cmap="Blues", vmin=0.0, vmax=float(matrix.max()))
    axis.set_xticks(range(columns))
    axis.set_xticklabels(key_tokens, rotation=60, ha="right")
    axis.set_yticks(range(rows))
    axis.set_yticklabels(query_tokens)
    for row in range(rows):
        column = int(matrix[row].argmax())
        axis.add_patch(plt.Rectangle((column - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="#d62728", lw=1.5))
    axis.set_title(title)
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04, label="mean weight over heads")
    figure.tight_layout()
    return figure
