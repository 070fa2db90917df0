"""Stage 1 figures: the positional-encoding table, a few of its columns, column pairs on their circles, position
similarity, and the scores an offset matrix moves."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from transformer_course.visualisation.unseen import not_drawn_while_grading


def _table(pe: torch.Tensor) -> torch.Tensor:
    """Accept (1, max_seq_length, d_model) or (max_seq_length, d_model); return the 2-D table."""
    return (pe[0] if pe.dim() == 3 else pe).detach().float().cpu()


@not_drawn_while_grading
def plot_encoding_heatmap(pe: torch.Tensor, max_positions: int = 100) -> Figure:
    """Heatmap of PE[pos, dim]: rows are positions, columns are embedding dimensions."""
    table = _table(pe)[:max_positions]
    figure, axis = plt.subplots(figsize=(9, 4))
    image = axis.imshow(table.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
    axis.set_xlabel("embedding dimension (even: sin, odd: cos)")
    axis.set_ylabel("position pos")
    axis.set_title("Sinusoidal positional encoding")
    figure.colorbar(image, ax=axis, label="PE[pos, dim]")
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_encoding_curves(pe: torch.Tensor, dims: tuple[int, ...] = (0, 1, 4, 5, 10, 11),
                         max_positions: int = 100) -> Figure:
    """A few columns of the table against position: low dimensions oscillate fast, high ones slowly."""
    table = _table(pe)[:max_positions]
    figure, axis = plt.subplots(figsize=(9, 3.5))
    for dim in dims:
        kind = "sin" if dim % 2 == 0 else "cos"
        axis.plot(table[:, dim].numpy(), label=f"dim {dim} ({kind})")
    axis.set_xlabel("position pos")
    axis.set_ylabel("PE[pos, dim]")
    axis.set_title("Each dimension is a sinusoid with its own wavelength")
    axis.legend(ncol=3, fontsize=8)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_pairs_on_circles(pe: torch.Tensor, pairs: tuple[int, ...] = (0, 3), positions: int = 12, offset: int = 3,
                          starts: tuple[int, ...] = (1, 6)) -> Figure:
    """Each column pair i of the table drawn as points (PE[p, 2i], PE[p, 2i+1]) for p = 0 .. positions - 1, one
    panel per pair, with an arrow from p to p + offset for each p of `starts`."""
    table = _table(pe)
    d_model = table.size(1)
    figure, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 4.2))
    for axis, pair in zip(axes if len(pairs) > 1 else [axes], pairs, strict=True):
        points = table[:positions, 2 * pair: 2 * pair + 2]  # (positions, 2): (sin, cos) of one frequency
        circle = torch.linspace(0, 2 * torch.pi, 200)
        axis.plot(circle.sin().numpy(), circle.cos().numpy(), color="#cccccc", linewidth=0.8)
        axis.scatter(points[:, 0].numpy(), points[:, 1].numpy(), s=18, color="#3b74b8", zorder=3)
        for p in range(positions):
            axis.annotate(str(p), (float(points[p, 0]), float(points[p, 1])), textcoords="offset points",
                          xytext=(4, 4), fontsize=7)
        for start in starts:
            if start + offset < positions:
                axis.annotate("", xy=(float(points[start + offset, 0]), float(points[start + offset, 1])),
                              xytext=(float(points[start, 0]), float(points[start, 1])),
                              arrowprops={"arrowstyle": "->", "color": "#c9731f", "linewidth": 1.5})
        axis.set_aspect("equal")
        axis.set_xlim(-1.25, 1.25)
        axis.set_ylim(-1.25, 1.25)
        axis.set_xlabel(f"column {2 * pair} (sin)")
        axis.set_ylabel(f"column {2 * pair + 1} (cos)")
        axis.set_title(f"column pair {pair}: ω = 1/10000^({2 * pair}/{d_model}) = {10000 ** (-2 * pair / d_model):.3g}",
                       fontsize=9)
    figure.suptitle(f"Positions 0..{positions - 1} as points; arrows from p to p + {offset} for p = "
                    + ", ".join(str(start) for start in starts), fontsize=10)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_position_similarity(pe: torch.Tensor, max_positions: int = 60) -> Figure:
    """Dot product PE[p] . PE[q] for every pair of positions: largest on the diagonal, decaying with |p - q|."""
    table = _table(pe)[:max_positions]
    similarity = table @ table.T  # (positions, positions)
    figure, axis = plt.subplots(figsize=(4.8, 4))
    image = axis.imshow(similarity.numpy(), cmap="viridis")
    axis.set_xlabel("position q")
    axis.set_ylabel("position p")
    axis.set_title("PE[p] · PE[q]")
    figure.colorbar(image, ax=axis)
    figure.tight_layout()
    return figure


@not_drawn_while_grading
def plot_offset_scores(pe: torch.Tensor, matrix: torch.Tensor, position: int = 50, offset: int = 3,
                       max_positions: int = 100) -> Figure:
    """Two rows of scores against the positions q: PE[position] · PE[q], symmetric about `position`, and
    (M_k PE[position]) · PE[q], which peaks at position + offset when M_k = `matrix`, (d_model, d_model), moves
    every position by the offset."""
    table = _table(pe)[:max_positions]
    plain = table @ table[position]  # (positions,)
    moved = table @ (matrix.detach().float().cpu() @ table[position])  # (positions,)
    figure, axis = plt.subplots(figsize=(9, 3.2))
    axis.plot(plain.numpy(), label=f"PE[{position}] · PE[q]")
    axis.plot(moved.numpy(), label=f"(M_{offset} PE[{position}]) · PE[q]")
    axis.axvline(position, color="grey", linewidth=0.8, linestyle=":")
    axis.axvline(position + offset, color="grey", linewidth=0.8, linestyle="--")
    axis.set_xlabel("position q")
    axis.set_ylabel("dot product")
    axis.set_title(f"Where each score peaks: q = {int(plain.argmax())} and q = {int(moved.argmax())}")
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
