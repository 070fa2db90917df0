"""Stage 3 figures: ReLU and the hidden layer of the feed-forward network, a small training run of it, residual
connections, LayerNorm before/after, the decoder's two masks and attention weights, post-LN vs pre-LN gradients."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure
from torch import nn

from transformer_course.visualisation.masks import add_mask_legend, draw_mask
from transformer_course.visualisation.unseen import not_drawn_while_grading


def _matrix(tensor: torch.Tensor) -> np.ndarray:
    """Squeeze leading axes of size 1 away and return a float numpy matrix."""
    matrix = tensor.detach().float().cpu()
    while matrix.dim() > 2:
        matrix = matrix[0]
    return matrix.numpy()


@not_drawn_while_grading
def plot_feed_forward_hidden(pre_activation: torch.Tensor, max_units: int = 64) -> Figure:
    """Left: the ReLU function. Right: ReLU(x W1 + b1) for each position (rows) and hidden unit (columns).

    pre_activation: (seq_len, d_ff) or (1, seq_len, d_ff), the values x W1 + b1 before the ReLU.
    """
    hidden = np.maximum(_matrix(pre_activation)[:, :max_units], 0.0)  # (seq_len, units)
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1, 2.6]})
    z = np.linspace(-3, 3, 201)
    left.plot(z, np.maximum(z, 0), color="tab:blue", linewidth=2)
    left.axhline(0, color="grey", linewidth=0.5)
    left.axvline(0, color="grey", linewidth=0.5)
    left.set_title("ReLU(z) = max(0, z)")
    left.set_xlabel("z")
    image = right.imshow(hidden, aspect="auto", cmap="Greens", vmin=0)
    zero_share = float((hidden == 0).mean())
    right.set_title(f"hidden layer after ReLU: {zero_share:.0%} of the values are exactly 0")
    right.set_xlabel(f"hidden unit (first {hidden.shape[1]} of d_ff)")
    right.set_ylabel("position")
    figure.colorbar(image, ax=right)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_similarity_by_depth(curves: Mapping[str, Sequence[float]],
                             distances: Mapping[str, Sequence[float]] | None = None) -> Figure:
    """Left: the mean cosine similarity between the positions of a sequence after each layer, one line per setup.
    Right (with `distances`): how far the sequence is from one whose positions all hold the same vector, relative
    to its size, on a log scale."""
    panels = 2 if distances else 1
    figure, axes = plt.subplots(1, panels, figsize=(7.5 * panels - 1 * (panels - 1), 3.6), squeeze=False)
    axis = axes[0, 0]
    for label, values in curves.items():
        axis.plot(range(len(values)), list(values), marker="o", label=label)
    axis.set_xlabel("number of layers applied")
    axis.set_ylabel("mean cosine similarity\nbetween positions")
    axis.set_ylim(-0.05, 1.05)
    axis.set_title("Without the residual path all positions\ncollapse to the same vector")
    axis.legend()
    if distances:
        right = axes[0, 1]
        for label, values in distances.items():
            right.semilogy(range(len(values)), list(values), marker="o", label=label)
        right.set_xlabel("number of layers applied")
        right.set_ylabel("relative distance to a sequence\nwith all positions equal")
        right.set_title("The same runs, distance on a log scale\n(float64: rounding stops it near 1e-16)")
        right.legend(fontsize=8)
    figure.tight_layout()
    return figure


def fit_to_targets(network: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, steps: int = 300,
                   learning_rate: float = 0.01) -> tuple[list[float], torch.Tensor]:
    """Train `network` with Adam to map `inputs` to `targets` (mean squared error, the whole set every step).

    Returns the loss before each step and the network's outputs after the last step (no gradient). The training
    loop itself is stage 5's subject; here it only produces a symptom to look at.
    """
    optimiser = torch.optim.Adam(network.parameters(), lr=learning_rate)
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(network(inputs), targets)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    with torch.no_grad():
        return losses, network(inputs)


@not_drawn_while_grading
def plot_fit(losses: Sequence[float], zero_loss: float, targets: torch.Tensor, predictions: torch.Tensor) -> Figure:
    """A small training run of a network on a regression task. Left: the loss at every step, and the loss of
    predicting 0 everywhere. Right: every prediction against its target (a perfect fit lies on the diagonal).

    targets, predictions: tensors of the same shape (any), compared element by element."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    left.plot(range(1, len(losses) + 1), list(losses), color="tab:blue", label="training loss")
    left.axhline(zero_loss, color="grey", linestyle="--", label="predicting 0 everywhere")
    left.set_xlabel("training step")
    left.set_ylabel("mean squared error")
    left.set_ylim(0, 1.1 * max(max(losses), zero_loss))
    left.set_title(f"loss after {len(losses)} steps: {losses[-1]:.4f}")
    left.legend()
    wanted = targets.detach().flatten().cpu().numpy()
    got = predictions.detach().flatten().cpu().numpy()
    right.scatter(wanted, got, s=4, alpha=0.4, color="tab:blue")
    low, high = float(min(wanted.min(), got.min())), float(max(wanted.max(), got.max()))
    right.plot([low, high], [low, high], color="grey", linewidth=1, label="prediction = target")
    right.axhline(0, color="grey", linewidth=0.5)
    right.axvline(0, color="grey", linewidth=0.5)
    right.set_xlabel("target")
    right.set_ylabel("prediction")
    right.set_title("every output value after training")
    right.legend(loc="upper left")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_layer_norm(before: torch.Tensor, after: torch.Tensor) -> Figure:
    """The d_model features of each position, as dots, before and after LayerNorm.

    before, after: (seq_len, d_model) or (1, seq_len, d_model). The black bars show each position's
    mean plus and minus one standard deviation.
    """
    panels = {"before LayerNorm": _matrix(before), "after LayerNorm (gamma = 1, beta = 0)": _matrix(after)}
    figure, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for axis, (title, values) in zip(axes, panels.items(), strict=True):
        positions = np.arange(values.shape[0])
        jitter = np.random.default_rng(0).uniform(-0.2, 0.2, size=values.shape)
        axis.scatter(positions[:, None] + jitter, values, s=6, alpha=0.5, color="tab:blue")
        axis.errorbar(positions, values.mean(axis=1), yerr=values.std(axis=1), fmt="o", color="black",
                      capsize=4, label="mean ± std over d_model")
        axis.axhline(0, color="grey", linewidth=0.5)
        axis.set_title(title)
        axis.set_xlabel("position")
        axis.set_xticks(positions)
    axes[0].set_ylabel("feature value")
    axes[0].legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    return figure


def _two_heatmaps(left: torch.Tensor, right: torch.Tensor, titles: tuple[str, str], cmap: str,
                  vmax: float | None) -> Figure:
    """Two matrices side by side, rows = decoder (query) positions."""
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, matrix, title, xlabel in zip(axes, (left, right), titles,
                                           ("decoder position (key)", "encoder position (key)"), strict=True):
        values = _matrix(matrix)
        image = axis.imshow(values, cmap=cmap, vmin=0, vmax=vmax)
        axis.set_title(title)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("decoder position (query)")
        figure.colorbar(image, ax=axis, fraction=0.046)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_decoder_masks(dec_mask: torch.Tensor, enc_mask: torch.Tensor) -> Figure:
    """Where each decoder query may look: dec_mask (tgt_len, tgt_len), enc_mask as (tgt_len, src_len).

    Both masks use the course convention and colours: blue (True / 1) = may attend, grey = hidden.
    """
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for axis, matrix, title, xlabel in zip(
            axes, (dec_mask, enc_mask), ("self-attention: dec_mask", "cross-attention: enc_mask"),
            ("decoder position (key)", "encoder position (key)"), strict=True):
        draw_mask(axis, (_matrix(matrix) != 0).astype(float), annotate=True)
        axis.set_title(title)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("decoder position (query)")
    add_mask_legend(figure)
    return figure


@not_drawn_while_grading
def plot_decoder_attention(self_weights: torch.Tensor | None, cross_weights: torch.Tensor | None) -> Figure:
    """Head 0 of sentence 0: self-attention weights (batch, heads, tgt_len, tgt_len) and cross-attention weights
    (batch, heads, tgt_len, src_len), as the attention modules keep them. A module that never ran has no weights
    (None): a clear error says which."""
    for name, weights in (("self_attn", self_weights), ("cross_attn", cross_weights)):
        if weights is None:
            raise ValueError(f"no attention weights to draw for block.{name}: it was not called when the block ran "
                             "(its attn_weights is still None). The checks of DecoderBlock above say more.")
    self_weights, cross_weights = self_weights[0, 0], cross_weights[0, 0]  # (tgt_len, tgt_len), (tgt_len, src_len)
    return _two_heatmaps(self_weights, cross_weights,
                         ("masked self-attention weights", "cross-attention weights"),
                         cmap="viridis", vmax=None)


@not_drawn_while_grading
def plot_gradient_norms(norms: Mapping[str, Sequence[float]]) -> Figure:
    """Gradient norm of each block's parameters (block 1 = next to the input), one bar group per setup."""
    figure, axis = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / max(len(norms), 1)
    for index, (label, values) in enumerate(norms.items()):
        blocks = np.arange(1, len(values) + 1)
        axis.bar(blocks + (index - (len(norms) - 1) / 2) * width, list(values), width=width, label=label)
    axis.set_xticks(np.arange(1, max(len(values) for values in norms.values()) + 1))
    axis.set_xlabel("block (1 = next to the input, last = next to the loss)")
    axis.set_ylabel("gradient norm of the\nblock's parameters")
    axis.set_title("Gradients at initialisation, before any training step")
    axis.set_ylim(0, 1.3 * max(max(values) for values in norms.values()))  # room for the legend
    axis.legend(loc="upper center", ncol=len(norms))
    figure.tight_layout()
    return figure
