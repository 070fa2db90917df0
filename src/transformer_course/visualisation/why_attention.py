"""Stage 0 figures: the one-vector bottleneck against attention, the masked softmax of one query,
BLEU by source length, an interactive alignment heatmap and the cost of the two attention scores."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from transformer_course.visualisation.unseen import not_drawn_while_grading

if TYPE_CHECKING:  # plotly is imported where it is used: importing it costs a second, grading never needs it
    from transformer_course.visualisation.interactive import InteractiveFigure

ENCODER, DECODER, SENTENCE, ATTENTION = "#deebf7", "#fee6ce", "#d62728", "#31a354"


def _cells(axis: Axes, tokens: Sequence[str], y: float, colour: str, label: str) -> list[float]:
    """One box per token on a row; returns the boxes' x positions."""
    xs = [float(index) for index in range(len(tokens))]
    for x, token in zip(xs, tokens, strict=True):
        axis.text(x, y, token, ha="center", va="center", fontsize=9,
                  bbox={"boxstyle": "round", "facecolor": colour, "edgecolor": "#636363"})
    axis.text(-0.8, y, label, ha="right", va="center", fontsize=9)
    return xs


def _draw_model(axis: Axes, source: Sequence[str], target: Sequence[str], attend: bool) -> None:
    encoder_xs = _cells(axis, source, 0.0, ENCODER, "encoder\nstates h_j")
    offset = len(source) + 1.5
    decoder_xs = [offset + x for x in range(len(target))]
    for x, token in zip(decoder_xs, target, strict=True):
        axis.text(x, 2.2, token, ha="center", va="center", fontsize=9,
                  bbox={"boxstyle": "round", "facecolor": DECODER, "edgecolor": "#636363"})
    axis.text(decoder_xs[0], 2.75, "decoder states s_t", ha="left", fontsize=9)
    if not attend:
        middle = (encoder_xs[-1] + decoder_xs[0]) / 2
        axis.annotate("", xy=(middle, 1.1), xytext=(encoder_xs[-1], 0.3),
                      arrowprops={"arrowstyle": "->", "color": SENTENCE, "lw": 2})
        axis.text(middle, 1.1, "c", ha="center", va="center", fontsize=12, color="white",
                  bbox={"boxstyle": "circle", "facecolor": SENTENCE})
        for x in decoder_xs:
            axis.annotate("", xy=(x, 1.95), xytext=(middle, 1.3), arrowprops={"arrowstyle": "->", "color": SENTENCE})
        axis.set_title("Without attention: the whole sentence squeezed into one vector c, read at every step")
        return
    chosen = decoder_xs[len(target) // 2]
    weights = np.exp(-0.5 * (np.arange(len(source)) - len(source) * 0.55) ** 2)  # a made-up alignment
    weights /= weights.sum()
    for x, weight in zip(encoder_xs, weights, strict=True):
        axis.annotate("", xy=(chosen, 1.95), xytext=(x, 0.3),
                      arrowprops={"arrowstyle": "->", "color": ATTENTION, "lw": 0.5 + 6 * weight, "alpha": 0.85})
    axis.set_title("With attention: at every step t a fresh context c_t = Σ_j α_tj h_j (one step drawn)")


@not_drawn_while_grading
def plot_bottleneck(source: Sequence[str], target: Sequence[str]) -> Figure:
    """Two panels: the plain encoder-decoder and the same model with attention, on one sentence pair."""
    figure, axes = plt.subplots(2, 1, figsize=(1.0 * (len(source) + len(target)) + 3, 5.6))
    for axis, attend in zip(axes, (False, True), strict=True):
        _draw_model(axis, source, target, attend)
        axis.set_xlim(-2.4, len(source) + len(target) + 1.2)
        axis.set_ylim(-0.6, 3.1)
        axis.axis("off")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_masked_softmax(scores: torch.Tensor, weights: torch.Tensor, source_tokens: Sequence[str],
                        mask: torch.Tensor) -> Figure:
    """One query: its scores e_j (left) and its weights α_j (right); padded positions are hatched.

    scores, weights: (k_len,), one per source token; mask: (k_len,), True at real tokens. Anything else is
    refused with the shapes it had (the figure draws what a student's attention returned, so its shapes are
    what a student needs to see, not a plotting error deep in matplotlib).
    """
    wanted = (len(source_tokens),)
    got = {"scores": tuple(scores.shape), "weights": tuple(weights.shape), "mask": tuple(mask.shape)}
    if any(shape != wanted for shape in got.values()):
        raise ValueError(f"this figure draws one query over {len(source_tokens)} source tokens: it needs scores, "
                         f"weights and mask of shape {wanted} each, and got "
                         + ", ".join(f"{name} {shape}" for name, shape in got.items()))
    scores, weights = scores.detach().double().cpu(), weights.detach().double().cpu()
    padded = ~mask.bool().cpu()
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for axis, values, title in ((axes[0], scores, "scores e_j = v^T tanh(W_q s + W_k h_j)"),
                                (axes[1], weights, "weights α_j = softmax over real positions")):
        colours = ["#bdbdbd" if hidden else "#4a78b5" for hidden in padded.tolist()]
        bars = axis.bar(range(len(values)), values.numpy(), color=colours)
        for bar, hidden in zip(bars, padded.tolist(), strict=True):
            if hidden:
                bar.set_hatch("//")
        axis.set_xticks(range(len(source_tokens)))
        axis.set_xticklabels(source_tokens, rotation=45, ha="right")
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_title(title, fontsize=10)
    axes[1].set_ylim(0, 1.05)
    figure.suptitle("Grey, hatched: padding. Its score is ignored, its weight is exactly 0, and the rest sum to 1")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_bleu_by_length(results: Mapping[str, Mapping[str, Mapping[str, float]]],
                        title: str = "BLEU by source-sentence length") -> Figure:
    """Grouped bars, one group per length bucket and one bar per run.

    results: run label -> bleu_by_length's dict ({bucket: {"bleu": ..., "sentences": ...}}).
    """
    runs = list(results)
    buckets = [label for label in next(iter(results.values())) if label != "all"]
    width = 0.8 / len(runs)
    figure, axis = plt.subplots(figsize=(1.5 * len(buckets) + 3, 3.8))
    for index, run in enumerate(runs):
        values = [results[run].get(bucket, {}).get("bleu", 0.0) for bucket in buckets]
        positions = np.arange(len(buckets)) + (index - (len(runs) - 1) / 2) * width
        quoted = "quoted" in run.lower()  # measured by the script: pale and hatched; your own runs: solid
        colour = SENTENCE if "without" in run.lower() else ATTENTION
        axis.bar(positions, values, width, label=run, color=colour, alpha=0.45 if quoted else 0.9,
                 hatch="//" if quoted else None, edgecolor="white")
    counts = next(iter(results.values()))
    axis.set_xticks(range(len(buckets)))
    axis.set_xticklabels([f"{bucket}\n({int(counts[bucket]['sentences'])} sentences)" for bucket in buckets])
    axis.set_xlabel("German sentence length in tokens")
    axis.set_ylabel("BLEU (greedy)")
    axis.set_title(title)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


@not_drawn_while_grading  # while grading: an Unseen figure, whose .show() shows nothing
def plot_alignment_interactive(weights: torch.Tensor, source_tokens: Sequence[str], target_tokens: Sequence[str],
                               title: str = "Where the decoder looked") -> InteractiveFigure:
    """Plotly heatmap of one sentence's attention: rows = English tokens produced, columns = German tokens.

    Hover shows both tokens and the weight. weights: (tgt_len, src_len). Returned as an InteractiveFigure
    (HTML and PNG versions too, so it shows on GitHub and in nbconvert HTML): `.show()` it.
    """
    import plotly.graph_objects as go

    from transformer_course.visualisation.interactive import InteractiveFigure

    matrix = weights.detach().float().cpu().numpy()
    if matrix.shape != (len(target_tokens), len(source_tokens)):
        raise ValueError(f"{len(target_tokens)} target and {len(source_tokens)} source labels for a "
                         f"{matrix.shape} map")
    pairs = [[(english, german) for german in source_tokens] for english in target_tokens]
    figure = go.Figure(go.Heatmap(
        z=matrix, x=list(range(len(source_tokens))), y=list(range(len(target_tokens))), customdata=pairs,
        colorscale="Blues", zmin=0.0, zmax=1.0, colorbar={"title": {"text": "α"}},
        hovertemplate="writing: %{customdata[0]}<br>looking at: %{customdata[1]}<br>weight: %{z:.3f}<extra></extra>",
    ))
    figure.update_layout(
        title={"text": title},
        xaxis={"tickvals": list(range(len(source_tokens))), "ticktext": list(source_tokens), "tickangle": -60,
               "title": {"text": "German (source)"}, "side": "top"},
        yaxis={"tickvals": list(range(len(target_tokens))), "ticktext": list(target_tokens), "autorange": "reversed",
               "title": {"text": "English (produced)"}},
        width=max(480, 90 + 40 * len(source_tokens)), height=max(420, 160 + 30 * len(target_tokens)),
        margin={"l": 90, "r": 30, "t": 110, "b": 30},
    )
    return InteractiveFigure(figure)


@not_drawn_while_grading
def plot_score_cost(lengths: Sequence[int], milliseconds: Mapping[str, Sequence[float]]) -> Figure:
    """Time to score every (query, key) pair of a batch, per score function, against the sentence length."""
    figure, axis = plt.subplots(figsize=(6.5, 3.6))
    for label, values in milliseconds.items():
        axis.plot(lengths, values, "o-", label=label)
    axis.set_xlabel("sentence length (queries = keys)")
    axis.set_ylabel("milliseconds per batch")
    axis.set_yscale("log")
    axis.set_title("Scoring all pairs: one matrix product against a small network per pair")
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
