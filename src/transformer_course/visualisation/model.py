"""Stage 4 figures: attention masks of a padded batch, teacher forcing, the gradient that reaches each part of a
stack, parameter counts, next-token probabilities."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from transformer_course.reference.attention import make_look_ahead_mask, make_padding_mask
from transformer_course.visualisation.masks import add_mask_legend, draw_mask
from transformer_course.visualisation.unseen import not_drawn_while_grading


def _square(mask: torch.Tensor) -> torch.Tensor:
    """Accept (q_len, k_len) or any (1, ..., q_len, k_len) mask; return the 2-D bool table. A mask with a single
    query row, such as a padding mask (1, 1, 1, k_len), is drawn for k_len queries: it applies to every query."""
    table = mask.detach().cpu()
    while table.dim() > 2:
        table = table[0]
    if table.dim() == 1:
        table = table.unsqueeze(0)
    if table.size(0) == 1:
        table = table.expand(table.size(1), -1)  # (k_len, k_len): the same row for every query
    return table != 0


@not_drawn_while_grading
def plot_mask_panels(panels: Mapping[str, torch.Tensor],
                     labels: Sequence[str] | Sequence[Sequence[str]] | None = None) -> Figure:
    """One panel per mask (query rows x key columns): blue = may attend, grey = hidden.

    Each mask is (q_len, k_len), or a 4-D mask such as (1, 1, q_len, k_len) whose first entries are shown.
    `labels` names the tokens of a self-attention mask: one list shared by all panels, or one list per panel.
    """
    if labels is not None and len(labels) > 0 and isinstance(labels[0], str):
        labels = [labels] * len(panels)  # one list of tokens shared by every panel
    figure, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 4.2), squeeze=False)
    for index, (axis, (title, mask)) in enumerate(zip(axes[0], panels.items(), strict=True)):
        table = _square(mask)
        draw_mask(axis, table.float().numpy())
        rows, columns = table.shape
        tokens = labels[index] if labels is not None else None
        axis.set_xticks(range(columns), tokens or range(columns), rotation=60, fontsize=8)
        axis.set_yticks(range(rows), tokens or range(rows), fontsize=8)
        axis.set_xlabel("key (attended to)")
        axis.set_title(title, fontsize=10)
    axes[0][0].set_ylabel("query (attending)")
    add_mask_legend(figure)
    return figure


@not_drawn_while_grading
def plot_target_mask_rules(ids: torch.Tensor, pad_idx: int, labels: Sequence[str] | None = None) -> Figure:
    """The two rules of the decoder's self-attention for one sentence `ids` (tgt_len,) or (1, tgt_len), drawn as
    two (query x key) tables: the padding rule (a key is a real token, not `pad_idx`; the same for every query)
    and the look-ahead rule (a key is not after the query; the same for every sentence). Drawn from stage 2's
    masks."""
    sentence = ids.reshape(1, -1)  # (1, tgt_len)
    return plot_mask_panels({"padding rule (about keys)": make_padding_mask(sentence, pad_idx),
                             "look-ahead rule (about positions)": make_look_ahead_mask(sentence.size(1))},
                            labels=labels)


def _token_row(axis: plt.Axes, tokens: Sequence[str], y: float, colour: str) -> None:
    for x, token in enumerate(tokens):
        axis.add_patch(Rectangle((x - 0.45, y - 0.3), 0.9, 0.6, facecolor=colour, edgecolor="black"))
        axis.text(x, y, token, ha="center", va="center", fontsize=9)


@not_drawn_while_grading
def plot_teacher_forcing(target: Sequence[str], bos: str = "<bos>", eos: str = "<eos>") -> Figure:
    """The target sentence as decoder input (shifted right, starting with BOS) and as labels (ending with EOS).

    Arrows show that the decoder state at position t, which has seen inputs 0..t, predicts label t.
    """
    sequence = [bos, *target, eos]
    inputs, labels = sequence[:-1], sequence[1:]  # both of length len(target) + 1
    figure, axis = plt.subplots(figsize=(1.05 * len(inputs) + 2.2, 2.6))
    _token_row(axis, inputs, 0.0, "#cfe3f3")
    _token_row(axis, labels, 1.4, "#fde2c4")
    for position in range(len(inputs)):
        axis.add_patch(FancyArrowPatch((position, 0.32), (position, 1.08), arrowstyle="-|>", mutation_scale=12))
    axis.text(-0.65, 0.0, "decoder input\n(dec_in)", ha="right", va="center", fontsize=9)
    axis.text(-0.65, 1.4, "labels\n(what it must predict)", ha="right", va="center", fontsize=9)
    for position in range(len(inputs)):
        axis.text(position, -0.55, f"t={position}", ha="center", fontsize=8, color="grey")
    axis.set_xlim(-2.6, len(inputs) - 0.4)
    axis.set_ylim(-0.8, 1.9)
    axis.axis("off")
    axis.set_title("Teacher forcing: input = target shifted right; position t sees inputs 0..t and predicts label t",
                   fontsize=10)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_parameter_counts(counts: Mapping[str, int], title: str = "Trainable parameters per component",
                          paper_total: float | None = None) -> Figure:
    """Horizontal bars, one per component, labelled in millions; the total (and the paper's) in the title."""
    names, values = list(counts), [counts[name] / 1e6 for name in counts]
    figure, axis = plt.subplots(figsize=(8, 0.45 * len(names) + 1.4))
    bars = axis.barh(names, values, color="#2b7bba")
    axis.invert_yaxis()  # first component on top
    for bar, value in zip(bars, values, strict=True):
        axis.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.2f} M", va="center", fontsize=8)
    axis.set_xlabel("parameters (millions)")
    axis.set_xlim(0, max(values) * 1.25)
    total = sum(values)
    subtitle = f"total {total:.1f} M" + (f" (paper: about {paper_total:.0f} M)" if paper_total else "")
    axis.set_title(f"{title}\n{subtitle}", fontsize=10)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_next_token_probabilities(probabilities: torch.Tensor, input_labels: Sequence[str],
                                  vocabulary: Sequence[str]) -> Figure:
    """Heatmap of softmax(logits) for one sentence: rows are decoder positions, columns target-vocabulary words.

    probabilities: (tgt_len, vocab_size), each row sums to 1.
    """
    table = probabilities.detach().float().cpu()
    figure, axis = plt.subplots(figsize=(0.45 * len(vocabulary) + 2.5, 0.45 * len(input_labels) + 1.6))
    image = axis.imshow(table.numpy(), cmap="magma", vmin=0)
    axis.set_xticks(range(len(vocabulary)), vocabulary, rotation=60, fontsize=8)
    axis.set_yticks(range(len(input_labels)), [f"t={t}: {label}" for t, label in enumerate(input_labels)],
                    fontsize=8)
    axis.set_xlabel("next token (target vocabulary)")
    axis.set_ylabel("decoder position: input token")
    axis.set_title("softmax(logits): the model's guess for the next token", fontsize=10)
    figure.colorbar(image, ax=axis, label="probability")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_gradient_per_part(norms: Mapping[str, float]) -> Figure:
    """Horizontal bars, one per part of a model (first part on top), each labelled with its gradient norm; a part
    whose gradient is exactly 0 has no bar to show, so its name and its label are written in red."""
    names, values = list(norms), [float(norms[name]) for name in norms]
    figure, axis = plt.subplots(figsize=(8, 0.45 * len(names) + 1.4))
    bars = axis.barh(names, values, color="#2b7bba")
    axis.invert_yaxis()  # first part on top
    red = "#c0392b"
    for bar, value, name in zip(bars, values, axis.get_yticklabels(), strict=True):
        label = " 0: no gradient at all" if value == 0 else f" {value:.3g}"
        axis.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=8,
                  color=red if value == 0 else "black", fontweight="bold" if value == 0 else "normal")
        if value == 0:
            name.set_color(red)
    axis.set_xlabel("gradient norm of the part's parameters")
    axis.set_xlim(0, max(max(values), 1e-12) * 1.25)
    axis.set_title("How strongly the loss reacts to each part's weights (red: not at all)", fontsize=10)
    figure.tight_layout()
    return figure
