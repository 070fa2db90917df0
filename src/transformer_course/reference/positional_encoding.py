"""Stage 1: sinusoidal positional encoding (Vaswani et al. 2017, section 3.5)."""

from __future__ import annotations

import math

import torch
from torch import nn


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal position signal to a batch of embeddings, then applies dropout.

    PE[pos, 2i]   = sin(pos / 10000^(2i / d_model))
    PE[pos, 2i+1] = cos(pos / 10000^(2i / d_model))

    The table is stored in the buffer `pe` of shape (1, max_seq_length, d_model).
    `forward` takes x of shape (batch, seq_len, d_model) and returns the same shape.
    """

    def __init__(self, d_model: int, max_seq_length: int, dropout: float) -> None:
        super().__init__()
        if d_model % 2 != 0:
            raise ValueError(f"d_model must be even to pair sin and cos columns, got {d_model}")
        self.dropout = nn.Dropout(dropout)
        ### BEGIN SOLUTION
        position = torch.arange(max_seq_length, dtype=torch.float).unsqueeze(1)  # (max_seq_length, 1)
        two_i = torch.arange(0, d_model, 2, dtype=torch.float)  # (d_model / 2,) the even indices 2i
        div_term = torch.exp(two_i * (-math.log(10000.0) / d_model))  # 1 / 10000^(2i / d_model)
        pe = torch.zeros(max_seq_length, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)  # even columns
        pe[:, 1::2] = torch.cos(position * div_term)  # odd columns
        ### END SOLUTION
        self.register_buffer("pe", pe.unsqueeze(0))  # (1, max_seq_length, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq_len, d_model) -> (batch, seq_len, d_model)."""
        ### BEGIN SOLUTION
        x = x + self.pe[:, : x.size(1)]  # broadcast over the batch
        ### END SOLUTION
        return self.dropout(x)


def offset_matrix(k: int, d_model: int) -> torch.Tensor:
    """The matrix M_k, (d_model, d_model), with M_k @ PE[p] = PE[p + k] for every position p.

    PE[p] is row p of the sinusoid table (a vector of d_model numbers); k is any whole offset (negative:
    backwards, 0: no move). M_k is built from the formula alone: it depends on k and d_model, not on p.
    Returned in float64 here (exact to about 1e-15); the checks accept float32 too.
    """
    ### BEGIN SOLUTION
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model / 2,) the even indices 2i
    angle = k / 10000.0 ** (two_i / d_model)  # (d_model / 2,) how far each column pair turns in k positions
    cos, sin = torch.cos(angle), torch.sin(angle)
    matrix = torch.zeros(d_model, d_model, dtype=torch.float64)
    matrix[0::2, 0::2] = torch.diag(cos)  # sin(a + b) = sin a cos b + cos a sin b
    matrix[0::2, 1::2] = torch.diag(sin)
    matrix[1::2, 0::2] = torch.diag(-sin)  # cos(a + b) = cos a cos b - sin a sin b
    matrix[1::2, 1::2] = torch.diag(cos)
    ### END SOLUTION
    return matrix


def largest_offset_error(table: torch.Tensor, matrix: torch.Tensor, k: int) -> float:
    """The largest |matrix @ table[p] - table[p + k]| over every entry and every position p for which both p
    and p + k are rows of `table` (n, d_model); matrix (d_model, d_model); k any whole offset with |k| < n.
    Returns a Python float.
    """
    ### BEGIN SOLUTION
    n = table.size(0)
    start, stop = max(0, -k), min(n, n - k)  # the positions p with 0 <= p < n and 0 <= p + k < n
    moved = table[start:stop] @ matrix.T  # (stop - start, d_model): row p holds matrix @ table[p]
    error = (moved - table[start + k:stop + k]).abs().max()
    ### END SOLUTION
    return float(error)
