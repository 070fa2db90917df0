"""Stage 2: scaled dot-product attention, masks and multi-head attention.

Mask convention throughout the course: True (or 1) means "may attend", False (0) means
"hidden", as in `scores.masked_fill(mask == 0, ...)`. Masks broadcast against the score
tensor of shape (batch, num_heads, q_len, k_len).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def scaled_dot_product_attention(
    Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V.

    Q: (..., q_len, d_k), K: (..., k_len, d_k), V: (..., k_len, d_v);
    mask: broadcastable to (..., q_len, k_len), True where attention is allowed.
    Returns (output, weights): output (..., q_len, d_v), weights (..., q_len, k_len),
    every row of weights sums to 1 and masked keys get exactly 0.
    """
    d_k = Q.size(-1)
    ### BEGIN SOLUTION
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (..., q_len, k_len)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)  # exp(-1e9) underflows to exactly 0
    weights = torch.softmax(scores, dim=-1)  # normalise over the keys
    output = weights @ V  # (..., q_len, d_v)
    ### END SOLUTION
    return output, weights


def make_padding_mask(token_ids: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """token_ids: (batch, seq_len) -> bool mask (batch, 1, 1, seq_len), False at padding keys."""
    ### BEGIN SOLUTION
    mask = (token_ids != pad_idx).unsqueeze(1).unsqueeze(2)  # (batch, 1, 1, seq_len)
    ### END SOLUTION
    return mask


def make_look_ahead_mask(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Bool mask (1, 1, size, size): position i may attend to positions 0..i (lower triangle)."""
    ### BEGIN SOLUTION
    allowed = torch.ones(size, size, dtype=torch.bool, device=device).tril()  # (size, size)
    mask = allowed.unsqueeze(0).unsqueeze(0)  # (1, 1, size, size)
    ### END SOLUTION
    return mask


class MultiHeadAttention(nn.Module):
    """num_heads attention heads of width d_k = d_model / num_heads, run in parallel.

    forward(q, k, v, mask) takes q: (batch, q_len, d_model), k and v: (batch, k_len, d_model)
    and returns (batch, q_len, d_model). The last attention weights, (batch, num_heads,
    q_len, k_len), are kept in `self.attn_weights` for plotting.
    """

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        self.attn_weights: torch.Tensor | None = None

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, seq_len, d_model) -> (batch, num_heads, seq_len, d_k)."""
        ### BEGIN SOLUTION
        batch_size, seq_length, _ = x.shape
        x = x.view(batch_size, seq_length, self.num_heads, self.d_k)  # (batch, seq_len, heads, d_k)
        return x.transpose(1, 2)  # (batch, heads, seq_len, d_k)
        ### END SOLUTION

    def combine_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, num_heads, seq_len, d_k) -> (batch, seq_len, d_model)."""
        ### BEGIN SOLUTION
        batch_size, _, seq_length, _ = x.shape
        x = x.transpose(1, 2).contiguous()  # (batch, seq_len, heads, d_k)
        return x.view(batch_size, seq_length, self.d_model)
        ### END SOLUTION

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        ### BEGIN SOLUTION
        Q = self.split_heads(self.W_q(q))  # (batch, heads, q_len, d_k)
        K = self.split_heads(self.W_k(k))  # (batch, heads, k_len, d_k)
        V = self.split_heads(self.W_v(v))  # (batch, heads, k_len, d_k)
        heads, weights = scaled_dot_product_attention(Q, K, V, mask)  # heads: (batch, heads, q_len, d_k)
        output = self.W_o(self.combine_heads(heads))  # (batch, q_len, d_model)
        ### END SOLUTION
        self.attn_weights = weights.detach()
        return output
