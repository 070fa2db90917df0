"""One look for attention masks in every notebook: blue = may attend (True / 1), grey = hidden (False / 0),
with the same legend under every mask figure."""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

ALLOWED, HIDDEN = "#2b7bba", "#e6e6e6"
MASK_COLOURS = ListedColormap([HIDDEN, ALLOWED])  # 0 = hidden, 1 = may attend


def draw_mask(axis: Axes, matrix: np.ndarray, annotate: bool = False) -> None:
    """Draw a (q_len, k_len) 0/1 mask: rows are queries, columns keys, white lines between the cells."""
    rows, columns = matrix.shape
    axis.imshow(matrix, cmap=MASK_COLOURS, vmin=0, vmax=1)
    axis.set_xticks([c - 0.5 for c in range(1, columns)], minor=True)
    axis.set_yticks([r - 0.5 for r in range(1, rows)], minor=True)
    axis.grid(which="minor", color="white", linewidth=1)
    axis.tick_params(which="minor", length=0)
    if annotate:
        for row in range(rows):
            for column in range(columns):
                allowed = matrix[row, column] > 0.5
                axis.text(column, row, "1" if allowed else "0", ha="center", va="center", fontsize=8,
                          color="white" if allowed else "dimgrey")


def add_mask_legend(figure: Figure) -> None:
    """Lay the panels out and put the legend shared by every mask figure of the course above them."""
    figure.tight_layout(rect=(0, 0, 1, 0.92))
    handles = [Patch(facecolor=ALLOWED, label="may attend (True / 1)"),
               Patch(facecolor=HIDDEN, edgecolor="#bbbbbb", label="hidden (False / 0)")]
    figure.legend(handles=handles, loc="upper center", ncol=2, frameon=False, fontsize=9)
