"""Stage 7, second idea: batched beam search with a length penalty, on top of the key/value cache.

Every sentence keeps `beam_size` hypotheses. At each step every live hypothesis is extended by every token,
a finished one (it said <eos>) only by <pad> at no cost, and the `beam_size` best candidates of each
sentence survive, ranked by their total log-probability divided by the length penalty
lp(n) = ((5 + n) / 6) ** alpha of Wu et al. (2016), n = tokens generated, <eos> included.
"""

from __future__ import annotations

import torch
from torch import nn

from transformer_course.reference.kv_cache import decoder_step, start_cache
from transformer_course.reference.model import make_source_mask, make_target_mask


def length_penalty(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """lp(n) = ((5 + n) / 6) ** alpha, elementwise: 1 for alpha = 0; larger alpha favours longer outputs."""
    return ((5.0 + lengths) / 6.0) ** alpha


def select_beams(scores: torch.Tensor, log_probs: torch.Tensor, finished: torch.Tensor, lengths: torch.Tensor,
                 beam_size: int, alpha: float, pad_idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of beam search for a batch: which `beam_size` extensions of each sentence's hypotheses survive.

    scores (batch, beam): total log-probability of each hypothesis so far; log_probs (batch, beam, vocab): its
    next-token log-probabilities; finished (batch, beam): it has said <eos>; lengths (batch, beam): tokens it
    has generated. A live hypothesis may be extended by any token (length + 1); a finished one only by
    pad_idx, with its score and length unchanged. Candidates are ranked by score / length_penalty(length).
    Returns (new scores, parent beam index, new token), each (batch, beam_size), best candidate first.
    """
    vocab = log_probs.size(-1)
    ### BEGIN SOLUTION
    stay = torch.full_like(log_probs, float("-inf"))  # a finished hypothesis: only <pad>, at no cost
    stay[..., pad_idx] = 0.0
    step = torch.where(finished.unsqueeze(-1), stay, log_probs)  # (batch, beam, vocab)
    candidates = scores.unsqueeze(-1) + step  # total log-probability of every extension
    new_lengths = lengths + (~finished).long()  # (batch, beam): finished ones keep their length
    ranking = candidates / length_penalty(new_lengths, alpha).unsqueeze(-1)
    best = ranking.flatten(1).topk(beam_size, dim=-1).indices  # (batch, beam_size) into beam * vocab
    new_scores = candidates.flatten(1).gather(1, best)
    parents, tokens = best // vocab, best % vocab
    ### END SOLUTION
    return new_scores, parents, tokens


@torch.no_grad()
def beam_search(model: nn.Module, src: torch.Tensor, pad_idx: int, bos_idx: int, eos_idx: int, max_len: int,
                beam_size: int = 4, alpha: float = 0.6) -> torch.Tensor:
    """Translate a batch with beam search; same arguments and output as greedy_decode, plus the beam size and alpha.

    src: (batch, src_len). Returns (batch, out_len): per sentence the hypothesis with the best
    score / length_penalty, starting with <bos>, padded after its <eos>. beam_size=1 is greedy decoding.
    """
    model.eval()
    batch = src.size(0)
    src_mask = make_source_mask(src, pad_idx).repeat_interleave(beam_size, dim=0)  # row b * beam_size + j
    cache = start_cache(model, model.encoder(src.repeat_interleave(beam_size, dim=0), src_mask), src_mask)
    ys = torch.full((batch * beam_size, 1), bos_idx, dtype=torch.long, device=src.device)  # every hypothesis
    scores = torch.full((batch, beam_size), float("-inf"), device=src.device)
    scores[:, 0] = 0.0  # one live hypothesis to start with, so no two beams are the same
    lengths = torch.zeros(batch, beam_size, dtype=torch.long, device=src.device)
    finished = torch.zeros(batch, beam_size, dtype=torch.bool, device=src.device)
    first_row = torch.arange(batch, device=src.device).unsqueeze(1) * beam_size  # (batch, 1)
    ### BEGIN SOLUTION
    for _ in range(max_len):
        log_probs = torch.log_softmax(decoder_step(model, cache, ys[:, -1:]), dim=-1)  # (batch * beam, vocab)
        scores, parents, tokens = select_beams(scores, log_probs.view(batch, beam_size, -1), finished, lengths,
                                               beam_size, alpha, pad_idx)
        rows = (first_row + parents).flatten()  # (batch * beam,): the row each new hypothesis continues
        ys = torch.cat([ys[rows], tokens.view(-1, 1)], dim=1)
        cache.reorder(rows)
        was_finished = finished.gather(1, parents)
        lengths = lengths.gather(1, parents) + (~was_finished).long()
        finished = was_finished | (tokens == eos_idx)
        if finished.all():
            break
    ### END SOLUTION
    best = (scores / length_penalty(lengths, alpha)).argmax(dim=-1)  # (batch,) the winner of each sentence
    return ys.view(batch, beam_size, -1)[torch.arange(batch, device=src.device), best]


@torch.no_grad()
def sequence_log_probs(model: nn.Module, src: torch.Tensor, ys: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """The model's total log-probability of each decoded sentence (what beam search maximises before the
    length penalty), by one teacher-forced forward pass.

    src: (batch, src_len); ys: (batch, out_len) as returned by greedy_decode or beam_search. Returns (batch,):
    the sum of log P(token | earlier tokens, source) over every generated token, <eos> included, padding not.
    """
    model.eval()
    decoder_input, targets = ys[:, :-1], ys[:, 1:]  # (batch, out_len - 1) each
    logits = model(src, decoder_input, make_source_mask(src, pad_idx), make_target_mask(decoder_input, pad_idx))
    token_log_probs = torch.log_softmax(logits, dim=-1).gather(2, targets.unsqueeze(-1)).squeeze(-1)
    return token_log_probs.masked_fill(targets == pad_idx, 0.0).sum(dim=1)  # (batch,)
