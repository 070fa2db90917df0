"""Stage 2's bug hunt, measured: the course's Transformer trained on a toy copy task with a given look-ahead mask.

The model reads a sequence of random symbols and writes it out again. Training feeds the decoder the correct
output shifted by one position (teacher forcing) and uses the given mask in the decoder's self-attention; the
notebook then compares the trained model with teacher forcing and with greedy decoding, where each step has only
the symbols written so far. A mask that lets a position read later positions shows as a training loss near zero,
right answers with teacher forcing and wrong ones when decoding greedily.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from transformer_course.reference.model import Transformer

BOS, EOS, LENGTH, VOCAB = 1, 2, 8, 14  # <bos> and <eos> as in the course's vocabularies; the symbols are ids 4..13
MaskFunction = Callable[[int], torch.Tensor]  # make_look_ahead_mask(size) -> (1, 1, size, size), True = may attend


def copy_batch(size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random sequences (size, LENGTH); the decoder's input <bos> a b c ... and its targets a b c ... <eos>,
    each (size, LENGTH + 1)."""
    source = torch.randint(4, VOCAB, (size, LENGTH), generator=generator)  # (size, LENGTH)
    decoder_in = torch.cat([torch.full((size, 1), BOS), source], dim=1)  # (size, LENGTH + 1)
    decoder_out = torch.cat([source, torch.full((size, 1), EOS)], dim=1)  # (size, LENGTH + 1)
    return source, decoder_in, decoder_out


def train_copier(make_look_ahead_mask: MaskFunction, steps: int = 400, seed: int = 0
                 ) -> tuple[Transformer, list[float]]:
    """A one-layer Transformer (d_model 32, 2 heads) trained for `steps` batches of 64 sequences with Adam, the
    decoder's self-attention masked by `make_look_ahead_mask`; returns the model and the loss of every step."""
    torch.manual_seed(seed)
    model = Transformer(VOCAB, VOCAB, d_model=32, num_heads=2, num_layers=1, d_ff=64, max_seq_length=16, dropout=0.0)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches, losses = torch.Generator().manual_seed(seed), []
    for _ in tqdm(range(steps), desc="training on the copy task"):
        source, decoder_in, decoder_out = copy_batch(64, batches)
        logits = model(source, decoder_in, None, make_look_ahead_mask(LENGTH + 1))  # (64, LENGTH + 1, VOCAB)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), decoder_out.reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return model.eval(), losses
