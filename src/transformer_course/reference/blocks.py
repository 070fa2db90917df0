"""Stage 3: position-wise feed-forward network, encoder block and decoder block (post-LN, as in the paper), and
the pre-LN variant of the encoder block."""

from __future__ import annotations

import torch
from torch import nn

from transformer_course.reference.attention import MultiHeadAttention


class PositionWiseFeedForward(nn.Module):
    """The position-wise feed-forward network of the paper's section 3.3, applied to every position alone.

    x: (batch, seq_len, d_model) -> (batch, seq_len, d_model), hidden width d_ff.
    """

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ### BEGIN SOLUTION
        return self.fc2(self.relu(self.fc1(x)))  # (batch, seq_len, d_ff) inside
        ### END SOLUTION


class EncoderBlock(nn.Module):
    """One encoder layer of the paper (section 3.1): self-attention, then the feed-forward network, each with a
    residual connection and its own LayerNorm in the paper's post-LN arrangement, and dropout on each sublayer's
    output (section 5.4).

    forward(x, mask): x (batch, src_len, d_model), mask broadcastable to
    (batch, num_heads, src_len, src_len), True where a key may be attended -> (batch, src_len, d_model).

    The checks rely on the names of the given constructor: they plug the reference attention and
    feed-forward network in at self.self_attn and self.feed_forward, and copy weights into self.norm1
    and self.norm2.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = PositionWiseFeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        ### BEGIN SOLUTION
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))
        x = self.norm2(x + self.dropout(self.feed_forward(x)))
        ### END SOLUTION
        return x


class DecoderBlock(nn.Module):
    """One decoder layer of the paper (section 3.1): masked self-attention, cross-attention over the encoder
    output, then the feed-forward network, each arranged as in the encoder block (post-LN, dropout on each
    sublayer's output).

    forward(x, enc_out, enc_mask, dec_mask): x (batch, tgt_len, d_model), enc_out
    (batch, src_len, d_model), enc_mask broadcastable to (batch, heads, tgt_len, src_len),
    dec_mask broadcastable to (batch, heads, tgt_len, tgt_len) -> (batch, tgt_len, d_model).

    The checks rely on the names of the given constructor: they plug the reference modules in at
    self.self_attn, self.cross_attn and self.feed_forward, and copy weights into self.norm1 to self.norm3.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = PositionWiseFeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        enc_out: torch.Tensor,
        enc_mask: torch.Tensor | None,
        dec_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        ### BEGIN SOLUTION
        x = self.norm1(x + self.dropout(self.self_attn(x, x, x, dec_mask)))
        x = self.norm2(x + self.dropout(self.cross_attn(x, enc_out, enc_out, enc_mask)))
        x = self.norm3(x + self.dropout(self.feed_forward(x)))
        ### END SOLUTION
        return x


class PreLNEncoderBlock(nn.Module):
    """The encoder block's parts in the pre-LN arrangement (not the paper's; most large language models since
    GPT-2 use it): each sublayer reads a normalised copy of the residual stream, and the stream itself is never
    normalised inside the block (a stack of such blocks ends with one LayerNorm of its own).

    forward(x, mask): x (batch, src_len, d_model), mask as for EncoderBlock -> (batch, src_len, d_model).
    The constructor is EncoderBlock's: norm1 belongs to self-attention, norm2 to the feed-forward network, and
    dropout acts on each sublayer's output, as in the post-LN block. The checks plug the reference attention and
    feed-forward network in at self.self_attn and self.feed_forward.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = PositionWiseFeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        ### BEGIN SOLUTION
        normed = self.norm1(x)  # (batch, src_len, d_model): what self-attention reads
        x = x + self.dropout(self.self_attn(normed, normed, normed, mask))
        x = x + self.dropout(self.feed_forward(self.norm2(x)))
        ### END SOLUTION
        return x
