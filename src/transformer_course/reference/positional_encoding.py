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
