"""Stage 6 figures: the choices greedy decoding makes, a decoded batch with its padding, and BLEU's parts."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from transformer_course.visualisation.unseen import not_drawn_while_grading

_KIND_COLOURS = ["#d9d9d9", "#c6dbef", "#a1d99b", "#f7f7f7"]  # <bos>, word, <eos>, <pad>
_KINDS = {"<bos>": 0, "<eos>": 2, "<pad>": 3}


@not_drawn_while_grading
def plot_next_token_choices(steps: Sequence[tuple[str, Sequence[str], Sequence[float]]],
                            title: str = "Greedy decoding: the top candidates at every step",
                            max_columns: int = 4, max_steps: int = 16) -> Figure:
    """One bar chart per step: the most likely next tokens and their probabilities; the chosen one in orange.

    steps: (the prefix written so far, candidate tokens best first, their probabilities) per step;
    greedy decoding always takes the first candidate. Only the first `max_steps` steps are drawn.
    """
    steps = list(steps)[:max_steps]
    columns = min(max_columns, len(steps))
    rows = math.ceil(len(steps) / columns)
    figure, axes = plt.subplots(rows, columns, squeeze=False, figsize=(3.3 * columns, 0.5 + 2.0 * rows),
                                layout="constrained")
    for index, axis in enumerate(axes.flat):
        if index >= len(steps):
            axis.axis("off")
            continue
        prefix, tokens, probabilities = steps[index]
        positions = list(range(len(tokens)))[::-1]  # best candidate on top
        colours = ["#e6550d" if rank == 0 else "#9ecae1" for rank in range(len(tokens))]
        axis.barh(positions, probabilities, color=colours)
        axis.set_yticks(positions)
        axis.set_yticklabels(tokens, fontsize=8)
        axis.set_xlim(0, 1)
        axis.tick_params(axis="x", labelsize=7)
        shown = prefix if len(prefix) <= 34 else "…" + prefix[-33:]
        axis.set_title(f"step {index + 1}: after «{shown}»", fontsize=8)
    for axis in axes[-1]:
        axis.set_xlabel("probability", fontsize=8)
    figure.suptitle(title)
    return figure


@not_drawn_while_grading
def plot_decoded_batch(rows: Sequence[Sequence[str]], title: str = "A decoded batch: ys, one row per sentence"
                       ) -> Figure:
    """The output of batched decoding as a table of tokens: <bos> grey, words blue, <eos> green, <pad> white.

    rows: the tokens of each sentence, all of the same length (ys translated id by id, padding included).
    """
    width = max(len(row) for row in rows)
    kinds = [[_KINDS.get(token, 1) for token in row] for row in rows]
    figure, axis = plt.subplots(figsize=(1.0 + 0.75 * width, 0.7 + 0.42 * len(rows)))
    axis.imshow(kinds, cmap=ListedColormap(_KIND_COLOURS), vmin=0, vmax=3, aspect="auto")
    for row, tokens in enumerate(rows):
        for column, token in enumerate(tokens):
            axis.text(column, row, token, ha="center", va="center", fontsize=7,
                      color="#9a9a9a" if token == "<pad>" else "black")
    axis.set_xticks(range(width))
    axis.set_xticklabels([f"{step}" for step in range(width)], fontsize=7)
    axis.set_xlabel("column of ys (0 = <bos>, then one column per decoding step)")
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels([f"sentence {row}" for row in range(len(rows))], fontsize=8)
    axis.set_xticks([column - 0.5 for column in range(1, width)], minor=True)
    axis.set_yticks([row - 0.5 for row in range(1, len(rows))], minor=True)
    axis.grid(which="minor", color="white", linewidth=1.5)
    axis.tick_params(which="both", length=0)
    axis.set_title(title)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_bleu_breakdown(precisions: Sequence[float], brevity_penalty: float, score: float,
                        title: str = "What the BLEU score is made of") -> Figure:
    """Bars for the n-gram precisions p1..p4 (in %) and the brevity penalty, with the resulting score."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(8, 3), gridspec_kw={"width_ratios": [3, 1]})
    labels = [f"p{n}\n({n}-grams)" for n in range(1, len(precisions) + 1)]
    bars = left.bar(labels, precisions, color="#4a78b5")
    left.bar_label(bars, fmt="%.1f", fontsize=8)
    geometric_mean = math.exp(sum(math.log(max(p, 1e-9) / 100) for p in precisions) / len(precisions)) * 100
    left.axhline(geometric_mean, color="#e6550d", linestyle="--", label=f"geometric mean {geometric_mean:.1f}")
    left.set_ylim(0, 100)
    left.set_ylabel("clipped precision (%)")
    left.legend(fontsize=8)
    right.bar(["BP"], [brevity_penalty], color="#74c476")
    right.text(0, brevity_penalty / 2, f"{brevity_penalty:.3f}", ha="center", fontsize=9)
    right.set_ylim(0, 1.05)
    right.set_title("brevity penalty", fontsize=9)
    figure.suptitle(f"{title}: BLEU = BP × geometric mean = {score:.1f}")
    figure.tight_layout()
    return figure
