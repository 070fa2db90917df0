"""Stage 2's bug hunt, measured: a small Transformer trained on a toy copy task with a given look-ahead mask.

The model reads a sequence of random symbols and writes it out again. It is PyTorch's `nn.Transformer` with the
course's embedding scaling and `PositionalEncoding` around it: the course's own `MultiHeadAttention` is what stage 2
grades, so the grader's sandbox does not hold it while grading that notebook, and the demo must not depend on it.

Training feeds the decoder the correct output shifted by one position (teacher forcing) and uses the given mask in
the decoder's self-attention; the notebook then compares the trained model with teacher forcing and with greedy
decoding, where each step has only the symbols written so far. A mask that lets a position read later positions
shows as a training loss near zero, right answers with teacher forcing and wrong ones when decoding greedily.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from transformer_course.reference.positional_encoding import PositionalEncoding

BOS, EOS, LENGTH, VOCAB = 1, 2, 8, 14  # <bos> and <eos> as in the course's vocabularies; the symbols are ids 4..13
MaskFunction = Callable[[int], torch.Tensor]  # make_look_ahead_mask(size) -> (1, 1, size, size), True = may attend


def _after_bos(source: torch.Tensor) -> torch.Tensor:
    """The decoder's input for copying `source` (batch, LENGTH): <bos> then the sequence, (batch, LENGTH + 1)."""
    return torch.cat([torch.full((source.size(0), 1), BOS), source], dim=1)


def copy_batch(size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random sequences (size, LENGTH); the decoder's input <bos> a b c ... and its targets a b c ... <eos>,
    each (size, LENGTH + 1)."""
    source = torch.randint(4, VOCAB, (size, LENGTH), generator=generator)  # (size, LENGTH)
    decoder_in = _after_bos(source)  # (size, LENGTH + 1)
    decoder_out = torch.cat([source, torch.full((size, 1), EOS)], dim=1)  # (size, LENGTH + 1)
    return source, decoder_in, decoder_out


class Copier(nn.Module):
    """One encoder and one decoder layer (d_model 32, 2 heads, d_ff 64, no dropout): embeddings scaled by
    sqrt(d_model) plus the sinusoidal encoding, PyTorch's nn.Transformer, a linear layer to the vocabulary.

    forward(source, decoder_in, look_ahead_mask): source (batch, src_len) and decoder_in (batch, tgt_len) ids, the
    mask in the course's convention, (1, 1, tgt_len, tgt_len) with True = may attend -> logits (batch, tgt_len,
    VOCAB). The mask is turned into PyTorch's convention (True = may not attend) for the decoder's self-attention.
    """

    def __init__(self, d_model: int = 32, num_heads: int = 2, d_ff: int = 64) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(VOCAB, d_model)
        self.positional_encoding = PositionalEncoding(d_model, 2 * LENGTH, 0.0)
        self.transformer = nn.Transformer(d_model, num_heads, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=d_ff, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d_model, VOCAB)
        for parameter in self.parameters():  # Xavier for matrices, as the course's Transformer of stage 4
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.positional_encoding(self.embedding(ids) * math.sqrt(self.d_model))  # (batch, len, d_model)

    def forward(self, source: torch.Tensor, decoder_in: torch.Tensor, look_ahead_mask: torch.Tensor) -> torch.Tensor:
        hidden_mask = ~look_ahead_mask.reshape(decoder_in.size(1), decoder_in.size(1)).bool()  # PyTorch's convention
        hidden = self.transformer(self.embed(source), self.embed(decoder_in), tgt_mask=hidden_mask)
        return self.out(hidden)  # (batch, tgt_len, VOCAB)


def train_copier(make_look_ahead_mask: MaskFunction, steps: int = 400, seed: int = 0) -> tuple[Copier, list[float]]:
    """A Copier trained for `steps` batches of 64 sequences with Adam, the decoder's self-attention masked by
    `make_look_ahead_mask`; returns the model (in eval mode) and the loss of every step."""
    torch.manual_seed(seed)
    model = Copier()
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches, losses = torch.Generator().manual_seed(seed), []
    for _ in tqdm(range(steps), desc="training on the copy task"):
        source, decoder_in, decoder_out = copy_batch(64, batches)
        logits = model(source, decoder_in, make_look_ahead_mask(LENGTH + 1))  # (64, LENGTH + 1, VOCAB)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), decoder_out.reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return model.eval(), losses


@torch.no_grad()
def copy_two_ways(model: Copier, source: torch.Tensor,
                  make_look_ahead_mask: MaskFunction) -> tuple[torch.Tensor, torch.Tensor]:
    """The trained model's copies of `source` (batch, LENGTH), both (batch, LENGTH): with teacher forcing (the
    correct output shifted by one in the decoder's input, every position in one pass) and greedily (from <bos>
    alone, one symbol per step, each step reading only the symbols written so far)."""
    forced = model(source, _after_bos(source), make_look_ahead_mask(LENGTH + 1)).argmax(dim=-1)[:, :LENGTH]
    written = torch.full((source.size(0), 1), BOS)  # (batch, steps so far)
    for _ in range(LENGTH):
        logits = model(source, written, make_look_ahead_mask(written.size(1)))  # (batch, steps so far, VOCAB)
        written = torch.cat([written, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return forced, written[:, 1:]
