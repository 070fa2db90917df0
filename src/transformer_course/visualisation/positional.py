"""Stage 1 figures: the positional-encoding table, a few of its columns, position similarity."""

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
def plot_offset_scores(pe: torch.Tensor, rotation: torch.Tensor, position: int = 50, offset: int = 3,
                       max_positions: int = 100) -> Figure:
    """Two rows of scores against the positions q: PE[position] · PE[q], symmetric about `position`, and
    (R_k PE[position]) · PE[q], which peaks at position + offset (R_k = `rotation`, (d_model, d_model))."""
    table = _table(pe)[:max_positions]
    plain = table @ table[position]  # (positions,)
    rotated = table @ (rotation.detach().float().cpu() @ table[position])  # (positions,)
    figure, axis = plt.subplots(figsize=(9, 3.2))
    axis.plot(plain.numpy(), label=f"PE[{position}] · PE[q]")
    axis.plot(rotated.numpy(), label=f"(R_{offset} PE[{position}]) · PE[q]")
    axis.axvline(position, color="grey", linewidth=0.8, linestyle=":")
    axis.axvline(position + offset, color="grey", linewidth=0.8, linestyle="--")
    axis.set_xlabel("position q")
    axis.set_ylabel("dot product")
    axis.set_title(f"A rotation by the offset moves the peak from q = {position} to q = {position + offset}")
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
