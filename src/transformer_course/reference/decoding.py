"""Stage 6: batched greedy decoding that stops each sentence at <eos>, and the attention maps of a model."""

from __future__ import annotations

import torch
from torch import nn

from transformer_course.reference.model import make_source_mask, make_target_mask


@torch.no_grad()
def greedy_decode(model: nn.Module, src: torch.Tensor, pad_idx: int, bos_idx: int, eos_idx: int,
                  max_len: int) -> torch.Tensor:
    """Translate a batch one token at a time, always taking the most likely next token.

    src: (batch, src_len) source ids. Returns (batch, out_len) target ids that start with <bos>;
    out_len <= max_len + 1. A sentence that has produced <eos> is finished: every later position
    holds pad_idx. Decoding stops when all sentences are finished or max_len tokens were generated.
    """
    model.eval()
    src_mask = make_source_mask(src, pad_idx)  # (batch, 1, 1, src_len)
    enc_out = model.encoder(src, src_mask)  # (batch, src_len, d_model), computed once
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long, device=src.device)  # (batch, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    ### BEGIN SOLUTION
    for _ in range(max_len):
        logits = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx))  # (batch, len, vocab)
        next_token = logits[:, -1].argmax(dim=-1)  # (batch,) prediction after the last position
        next_token = next_token.masked_fill(finished, pad_idx)  # finished sentences only get padding
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        finished |= next_token == eos_idx
        if finished.all():
            break
    ### END SOLUTION
    return ys


def attention_maps(model: nn.Module) -> dict[str, torch.Tensor]:
    """The attention weights of the model's last forward pass, one tensor per kind, stacked over layers.

    Every MultiHeadAttention keeps its last weights, (batch, heads, q_len, k_len), in `attn_weights`.
    Returns {"encoder_self": (layers, batch, heads, src_len, src_len),
             "decoder_self": (layers, batch, heads, tgt_len, tgt_len),
             "cross": (layers, batch, heads, tgt_len, src_len)}, layer 0 first (next to the embeddings).
    """
    ### BEGIN SOLUTION
    encoder_self = torch.stack([layer.self_attn.attn_weights for layer in model.encoder.layers])
    decoder_self = torch.stack([layer.self_attn.attn_weights for layer in model.decoder.layers])
    cross = torch.stack([layer.cross_attn.attn_weights for layer in model.decoder.layers])  # queries: target
    ### END SOLUTION
    return {"encoder_self": encoder_self, "decoder_self": decoder_self, "cross": cross}
