"""Stage 0: additive attention (Bahdanau, Cho and Bengio, 2015), the score, the masked softmax over
the source positions and the context vector."""

from __future__ import annotations

import torch
from torch import nn


class AdditiveAttention(nn.Module):
    """score(s, h) = v^T tanh(W_q s + W_k h): a one-hidden-layer network scores every (query, key) pair.

    query_size: width of a query s (a decoder state); key_size: width of an encoder output h (the argument
    `keys`); attention_size: width of the hidden layer inside the score. The h are compared with the query
    through W_k and mixed, unprojected, as the values.
    """

    def __init__(self, query_size: int, key_size: int, attention_size: int) -> None:
        super().__init__()
        self.W_q = nn.Linear(query_size, attention_size, bias=False)
        self.W_k = nn.Linear(key_size, attention_size, bias=False)
        self.v = nn.Linear(attention_size, 1, bias=False)

    def score(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """query (batch, q_len, query_size), keys (batch, k_len, key_size) -> scores (batch, q_len, k_len)."""
        ### BEGIN SOLUTION
        projected_query = self.W_q(query).unsqueeze(2)  # (batch, q_len, 1, attention_size)
        projected_keys = self.W_k(keys).unsqueeze(1)  # (batch, 1, k_len, attention_size)
        hidden = torch.tanh(projected_query + projected_keys)  # (batch, q_len, k_len, attention_size)
        scores = self.v(hidden).squeeze(-1)  # (batch, q_len, k_len)
        ### END SOLUTION
        return scores

    def forward(self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """mask (batch, k_len): True at real source tokens, False at padding.

        Returns the context vectors (batch, q_len, key_size) and the weights (batch, q_len, k_len).
        """
        scores = self.score(query, keys)  # (batch, q_len, k_len)
        ### BEGIN SOLUTION
        scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)  # padding hidden from every query
        weights = torch.softmax(scores, dim=-1)  # over the source positions: each row sums to 1
        context = weights @ keys  # (batch, q_len, key_size): the weighted sum of the keys
        ### END SOLUTION
        return context, weights
