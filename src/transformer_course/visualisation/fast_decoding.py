"""Stage 7 figures: what a key/value cache saves, decode time against length, a beam search tree, the
length penalty, and a sentence's log-probability token by token under greedy decoding and beam search."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.ticker import MaxNLocator

from transformer_course.visualisation.unseen import not_drawn_while_grading

COMPUTED, CACHED, ONCE, PRUNED = "#e6550d", "#9ecae1", "#a1d99b", "#d9d9d9"


@not_drawn_while_grading
def plot_recomputation(steps: int = 8) -> Figure:
    """Which decoder positions are computed at each step: stage 6 (the whole prefix, every step) against the
    key/value cache (only the new position; the earlier ones are read from the cache)."""
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for axis, cached in zip(axes, (False, True), strict=True):
        for step in range(1, steps + 1):
            for position in range(step):
                new = position == step - 1
                colour = COMPUTED if (new or not cached) else CACHED
                axis.add_patch(Rectangle((position, step - 1), 0.92, 0.85, color=colour))
        computed = steps * (steps + 1) // 2 if not cached else steps
        axis.set_title(("stage 6: every step recomputes the prefix" if not cached else
                        "with the cache: one new position per step") + f"\n{computed} position-computations")
        axis.set_xlim(0, steps)
        axis.set_ylim(steps, 0)
        axis.set_xticks([p + 0.46 for p in range(steps)], [str(p) for p in range(steps)])
        axis.set_yticks([s + 0.42 for s in range(steps)], [str(s) for s in range(steps)])  # step t feeds position t
        axis.set_xlabel("decoder position")
    axes[0].set_ylabel("decoding step")
    handles = [Rectangle((0, 0), 1, 1, color=COMPUTED), Rectangle((0, 0), 1, 1, color=CACHED)]
    figure.legend(handles, ["computed at this step", "read from the cache (keys and values)"], loc="lower center",
                  ncol=2, frameon=False)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    return figure


def _boxes(axis: plt.Axes, x: float, y: float, labels: Sequence[str], colours: Sequence[str], caption: str) -> None:
    for index, (label, colour) in enumerate(zip(labels, colours, strict=True)):
        axis.add_patch(Rectangle((x + index, y), 0.9, 0.8, color=colour))
        axis.text(x + index + 0.45, y + 0.4, label, ha="center", va="center", fontsize=8)
    axis.text(x - 0.2, y + 0.4, caption, ha="right", va="center", fontsize=9)


@not_drawn_while_grading
def plot_cache_contents(position: int = 5, src_len: int = 7) -> Figure:
    """One decoder layer at one step: the new position's query attends to the cached self-attention keys and
    values (one more each step) and to the cross-attention keys and values (computed once per sentence)."""
    figure, axis = plt.subplots(figsize=(10, 3.2))
    self_labels = [f"k{p}, v{p}" for p in range(position + 1)]
    self_colours = [CACHED] * position + [COMPUTED]
    _boxes(axis, 0, 2.2, self_labels, self_colours, "self-attention cache\n(batch, heads, steps, d_k)")
    _boxes(axis, 0, 0.2, [f"src {s}" for s in range(src_len)], [ONCE] * src_len,
           "cross-attention keys, values\n(batch, heads, src_len, d_k)")
    axis.add_patch(Rectangle((position + 2.5, 1.2), 1.6, 0.8, color=COMPUTED))
    axis.text(position + 3.3, 1.6, f"query q{position}", ha="center", va="center", fontsize=9)
    for target in (((position + 1) / 2, 2.2), (src_len / 2, 1.0)):  # it attends to every cached position
        axis.add_patch(FancyArrowPatch((position + 2.5, 1.6), target, arrowstyle="->", mutation_scale=12))
    axis.text(max(position, src_len) + 4.5, 2.6,
              f"step {position}: append k{position}, v{position}\n(the new token's, computed now);\n"
              f"k0 … k{position - 1} come from the cache", fontsize=8, va="center")
    axis.text(max(position, src_len) + 4.5, 0.6, "computed once, in start_cache;\nread at every step", fontsize=8,
              va="center")
    axis.set_xlim(-5.2, max(position, src_len) + 8.5)
    axis.set_ylim(0, 3.2)
    axis.axis("off")
    axis.set_title("One decoder layer at one step, with the cache")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_decode_times(lengths: Sequence[int], without_cache: Sequence[float], with_cache: Sequence[float],
                      title: str = "Time to translate one sentence") -> Figure:
    """Seconds per sentence (one sentence at a time) against the number of tokens produced, both decoders."""
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.scatter(lengths, [1000 * s for s in without_cache], s=14, color="#3182bd", label="stage 6, no cache")
    axis.scatter(lengths, [1000 * s for s in with_cache], s=14, color=COMPUTED, label="with the key/value cache")
    axis.set_xlabel("tokens produced (translation + <eos>)")
    axis.set_ylabel("milliseconds per sentence")
    axis.set_title(title)
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_beam_tree(steps: Sequence[Sequence[tuple[tuple[str, ...], float, bool]]],
                   title: str = "Beam search, beam size 2") -> Figure:
    """A beam search as a tree: one column per step, every candidate with its probability; kept candidates
    (orange: still going; green: ended with <eos>) are joined to their parent, pruned ones are grey.

    steps[t]: the candidates of step t + 1 as (words so far, probability of the whole prefix, kept).
    """
    figure, axis = plt.subplots(figsize=(3.0 * len(steps) + 1.5, 0.55 * max(len(s) for s in steps) + 1.4))
    places: dict[tuple[str, ...], tuple[float, float]] = {(): (0.0, 0.0)}
    axis.text(0, 0, "<bos>", ha="center", va="center", fontsize=9,
              bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "black"})
    for column, candidates in enumerate(steps, start=1):
        ordered = sorted(candidates, key=lambda candidate: -candidate[1])
        for row, (words, probability, kept) in enumerate(ordered):
            y = (len(ordered) - 1) / 2 - row
            places[words] = (column * 3.0, y)
            colour = PRUNED if not kept else (ONCE if words[-1] == "<eos>" else COMPUTED)
            axis.text(column * 3.0, y, f"{words[-1]}  {probability:.3f}", ha="center", va="center", fontsize=8,
                      bbox={"boxstyle": "round", "facecolor": colour, "edgecolor": "none"})
            parent = places.get(words[:-1])
            if parent is not None:
                axis.plot([parent[0] + 0.55, column * 3.0 - 0.8], [parent[1], y], color="black" if kept else
                          PRUNED, linewidth=1.2 if kept else 0.6, zorder=0)
    axis.set_xlim(-0.8, 3.0 * len(steps) + 1.2)
    axis.set_ylim(min(y for _, y in places.values()) - 0.8, max(y for _, y in places.values()) + 0.8)
    labels = ["start"] + [f"step {column}" for column in range(len(steps))]  # counted from 0, as the checks do
    axis.set_xticks([3.0 * column for column in range(len(steps) + 1)], labels)
    axis.tick_params(left=False, labelleft=False)
    for side in ("left", "right", "top"):
        axis.spines[side].set_visible(False)
    axis.set_title(title + " (the number: probability of the whole prefix)")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_length_penalty(alphas: Sequence[float] = (0.0, 0.6, 1.0), max_length: int = 30,
                        log_prob_per_token: float = -0.4) -> Figure:
    """Left: lp(n) = ((5 + n) / 6) ** alpha. Right: the ranking score of a sentence whose every token has the
    same log-probability, score / lp(n): without the penalty longer sentences always look worse."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    lengths = list(range(1, max_length + 1))
    for alpha in alphas:
        penalty = [((5 + n) / 6) ** alpha for n in lengths]
        left.plot(lengths, penalty, label=f"alpha = {alpha}")
        right.plot(lengths, [log_prob_per_token * n / p for n, p in zip(lengths, penalty, strict=True)],
                   label=f"alpha = {alpha}")
    left.set_title("length penalty lp(n)")
    left.set_xlabel("tokens n")
    left.legend()
    right.set_title(f"score / lp(n), every token log-prob {log_prob_per_token}")
    right.set_xlabel("tokens n")
    right.set_ylabel("ranking score (higher is better)")
    for axis in (left, right):
        axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_sentence_log_probs(translations: Mapping[str, tuple[Sequence[str], Sequence[float]]],
                            title: str = "Log-probability of the translation so far") -> Figure:
    """The running total of log P(token | earlier tokens, source) along each translation, tokens on the curve:
    greedy leads at the first steps it chose, beam search can end higher."""
    figure, axis = plt.subplots(figsize=(9, 3.8))
    colours = {"greedy": "#3182bd", "beam": COMPUTED}
    for number, (name, (tokens, log_probs)) in enumerate(translations.items()):
        running, total = [], 0.0
        for value in log_probs:
            total += value
            running.append(total)
        colour = colours.get(name.split()[0], None)
        axis.plot(range(1, len(running) + 1), running, marker="o", color=colour, label=f"{name}: {total:.2f}")
        for step, (token, value) in enumerate(zip(tokens, running, strict=True), start=1):
            axis.annotate(token, (step, value), textcoords="offset points", xytext=(0, -13 if number == 0 else 7),
                          ha="center", fontsize=7, color=colour)  # the first curve's words below it
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.margins(y=0.12)  # room for the words under and over the curves
    axis.set_xlabel("step (token produced)")
    axis.set_ylabel("total log-probability")
    axis.set_title(title)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_bleu_comparison(scores: Mapping[str, float], title: str = "BLEU on the sentences decoded") -> Figure:
    """One bar per decoding method with its corpus BLEU."""
    figure, axis = plt.subplots(figsize=(5, 3.2))
    bars = axis.bar(list(scores), list(scores.values()), color=["#3182bd", COMPUTED, "#74c476"][: len(scores)])
    axis.bar_label(bars, fmt="%.2f")
    axis.set_ylabel("BLEU")
    axis.set_ylim(0, max(scores.values()) * 1.2)
    axis.set_title(title)
    figure.tight_layout()
    return figure
