"""Stage 4: embeddings + positional encoding + stacked blocks = the full encoder-decoder."""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer_course.reference.attention import make_padding_mask
from transformer_course.reference.blocks import DecoderBlock, EncoderBlock
from transformer_course.reference.positional_encoding import PositionalEncoding


def make_source_mask(src: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """src: (batch, src_len) token ids -> bool (batch, 1, 1, src_len): real tokens may be attended."""
    return make_padding_mask(src, pad_idx)


def make_target_mask(tgt: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """tgt: (batch, tgt_len) token ids (int64), pad_idx: the pad id -> bool (batch, 1, tgt_len, tgt_len).

    Entry [b, 0, i, j] is True exactly when query i of sentence b may attend to key j: j is not after i and
    token j of sentence b is not `pad_idx`. The axis of size 1 broadcasts over the heads. The mask is made on
    `tgt.device`, from `tgt` itself (not from stage 2's mask helpers).
    """
    ### BEGIN SOLUTION
    key_is_word = (tgt != pad_idx)[:, None, None, :]  # (batch, 1, 1, tgt_len): the padding rule, about keys
    positions = torch.arange(tgt.size(1), device=tgt.device)  # (tgt_len,)
    not_later = positions[None, :] <= positions[:, None]  # (tgt_len, tgt_len): key j <= query i
    return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)
    ### END SOLUTION


class Encoder(nn.Module):
    """Token ids (batch, src_len) -> contextual vectors (batch, src_len, d_model).

    The value check copies the reference weights by the names of the given constructor
    (self.embedding, self.layers).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        d_ff: int,
        max_seq_length: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.positional_encoding = PositionalEncoding(d_model, max_seq_length, dropout)
        self.layers = nn.ModuleList(
            [EncoderBlock(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)]
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        ### BEGIN SOLUTION
        x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)
        x = self.positional_encoding(x)
        for layer in self.layers:
            x = layer(x, mask)
        ### END SOLUTION
        return x


class Decoder(nn.Module):
    """Target ids (batch, tgt_len) + encoder output -> logits (batch, tgt_len, vocab_size).

    The value check copies the reference weights by the names of the given constructor
    (self.embedding, self.layers, self.pred_layer).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        d_ff: int,
        max_seq_length: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.positional_encoding = PositionalEncoding(d_model, max_seq_length, dropout)
        self.layers = nn.ModuleList(
            [DecoderBlock(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)]
        )
        self.pred_layer = nn.Linear(d_model, vocab_size)

    def forward(
        self,
        x: torch.Tensor,
        enc_out: torch.Tensor,
        enc_mask: torch.Tensor | None,
        dec_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        ### BEGIN SOLUTION
        x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, tgt_len, d_model)
        x = self.positional_encoding(x)
        for layer in self.layers:
            x = layer(x, enc_out, enc_mask, dec_mask)
        logits = self.pred_layer(x)  # (batch, tgt_len, vocab_size)
        ### END SOLUTION
        return logits


class Transformer(nn.Module):
    """The encoder-decoder of "Attention Is All You Need" (post-LN, as in the paper).

    forward(enc_in, dec_in, enc_mask, dec_mask): enc_in (batch, src_len) and dec_in
    (batch, tgt_len) token ids, masks from `make_source_mask` / `make_target_mask`
    -> logits (batch, tgt_len, dec_vocab_size).

    The checks plug the reference Encoder and Decoder in at self.encoder and self.decoder, so
    they grade this forward alone.
    """

    def __init__(
        self,
        enc_vocab_size: int,
        dec_vocab_size: int,
        d_model: int,
        num_heads: int,
        num_layers: int,
        d_ff: int,
        max_seq_length: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.encoder = Encoder(enc_vocab_size, d_model, num_heads, num_layers, d_ff, max_seq_length, dropout)
        self.decoder = Decoder(dec_vocab_size, d_model, num_heads, num_layers, d_ff, max_seq_length, dropout)
        for parameter in self.parameters():  # Xavier for matrices, as in common Transformer code
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)

    def forward(
        self,
        enc_in: torch.Tensor,
        dec_in: torch.Tensor,
        enc_mask: torch.Tensor | None,
        dec_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        ### BEGIN SOLUTION
        enc_out = self.encoder(enc_in, enc_mask)  # (batch, src_len, d_model)
        logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask)  # (batch, tgt_len, dec_vocab_size)
        ### END SOLUTION
        return logits


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars in `model`."""
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
