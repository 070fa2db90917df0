"""Stage 0: a GRU encoder-decoder for translation, with or without attention.

Both models share everything but one line: the context vector the decoder's output layer sees at
target position t. Without attention it is the whole sentence squeezed into one vector (the final
states of the encoder), the same at every t; with attention it is a weighted sum of the encoder's
vectors, one per source token, recomputed for every t.
"""

from __future__ import annotations

import torch
from torch import nn


class GRUEncoder(nn.Module):
    """A bidirectional GRU over the source: one vector per token, and one vector for the sentence."""

    def __init__(self, vocab_size: int, embedding_size: int, hidden_size: int, dropout: float, pad_idx: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_size, padding_idx=pad_idx)
        self.gru = nn.GRU(embedding_size, hidden_size, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src: torch.Tensor, source_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src, source_mask (batch, src_len) -> outputs (batch, src_len, 2 * hidden), sentence (batch, 2 * hidden).

        outputs[:, j] describes token j in its context (left to right and right to left); sentence
        joins the final state of each direction: everything the plain decoder will know about the source.
        """
        embedded = self.dropout(self.embedding(src))  # (batch, src_len, embedding_size)
        lengths = source_mask.sum(dim=1).cpu()  # real tokens per sentence: the GRU stops before the padding
        packed = nn.utils.rnn.pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        packed_outputs, final = self.gru(packed)  # final: (2, batch, hidden), one state per direction
        outputs, _ = nn.utils.rnn.pad_packed_sequence(packed_outputs, batch_first=True, total_length=src.size(1))
        return outputs, torch.cat([final[0], final[1]], dim=-1)


class GRUDecoder(nn.Module):
    """A GRU over the target; `attention=None` gives the plain model, which sees only the sentence vector."""

    def __init__(self, vocab_size: int, embedding_size: int, hidden_size: int, context_size: int, dropout: float,
                 pad_idx: int, attention: nn.Module | None = None) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_size, padding_idx=pad_idx)
        self.gru = nn.GRU(embedding_size + context_size, hidden_size, batch_first=True)
        self.attention = attention
        self.combine = nn.Linear(hidden_size + context_size, embedding_size)
        self.generator = nn.Linear(embedding_size, vocab_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, tgt_in: torch.Tensor, state: torch.Tensor, sentence: torch.Tensor, outputs: torch.Tensor,
                source_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """tgt_in (batch, tgt_len), state (1, batch, hidden) -> logits (batch, tgt_len, vocab), the new state,
        and the attention weights (batch, tgt_len, src_len) (None without attention)."""
        embedded = self.dropout(self.embedding(tgt_in))  # (batch, tgt_len, embedding_size)
        fixed = sentence.unsqueeze(1).expand(-1, tgt_in.size(1), -1)  # (batch, tgt_len, context_size)
        states, state = self.gru(torch.cat([embedded, fixed], dim=-1), state)  # states: (batch, tgt_len, hidden)
        if self.attention is None:
            context, weights = fixed, None  # the bottleneck: one vector for every target position
        else:
            context, weights = self.attention(states, outputs, source_mask)  # (batch, tgt_len, context_size)
        combined = torch.tanh(self.combine(torch.cat([states, context], dim=-1)))  # (batch, tgt_len, embedding)
        return self.generator(self.dropout(combined)), state, weights


class Seq2Seq(nn.Module):
    """Encoder + decoder. forward(src, tgt_in) gives the logits of teacher forcing (batch, tgt_len, vocab)."""

    def __init__(self, encoder: GRUEncoder, decoder: GRUDecoder, pad_idx: int) -> None:
        super().__init__()
        self.encoder, self.decoder, self.pad_idx = encoder, decoder, pad_idx
        self.bridge = nn.Linear(2 * encoder.gru.hidden_size, decoder.gru.hidden_size)
        self.attn_weights: torch.Tensor | None = None  # (batch, tgt_len, src_len) of the last forward pass

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The encoder's outputs and sentence vector, the decoder's first state (1, batch, hidden), the mask."""
        source_mask = src != self.pad_idx  # (batch, src_len), True at real tokens
        outputs, sentence = self.encoder(src, source_mask)
        state = torch.tanh(self.bridge(sentence)).unsqueeze(0)  # (1, batch, hidden)
        return outputs, sentence, state, source_mask

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, src_mask: object = None,
                tgt_mask: object = None) -> torch.Tensor:
        """src (batch, src_len), tgt_in (batch, tgt_len) -> logits (batch, tgt_len, vocab).

        src_mask and tgt_mask are accepted so the Transformer's training loop can drive this model, and
        ignored: the padding mask comes from src, and a left-to-right GRU never sees the future."""
        outputs, sentence, state, source_mask = self.encode(src)
        logits, _, self.attn_weights = self.decoder(tgt_in, state, sentence, outputs, source_mask)
        return logits


@torch.no_grad()
def greedy_decode_rnn(model: Seq2Seq, src: torch.Tensor, pad_idx: int, bos_idx: int, eos_idx: int,
                      max_len: int) -> torch.Tensor:
    """Greedy translation, one GRU step per token (the same signature as stage 6's greedy_decode).

    Returns (batch, out_len) ids starting with <bos>; after a sentence's <eos> only pad_idx follows.
    """
    model.eval()
    outputs, sentence, state, source_mask = model.encode(src)
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long, device=src.device)  # (batch, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        logits, state, _ = model.decoder(ys[:, -1:], state, sentence, outputs, source_mask)  # (batch, 1, vocab)
        next_token = logits[:, -1].argmax(dim=-1).masked_fill(finished, pad_idx)  # (batch,)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        finished |= next_token == eos_idx
        if finished.all():
            break
    return ys
