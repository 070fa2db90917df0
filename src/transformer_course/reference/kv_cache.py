"""Stage 7, first idea: incremental decoding with a key/value cache, built on the stage-4 model's weights.

Greedy decoding of stage 6 runs the whole decoder over the whole prefix at every step. The decoder is
causal, so the vectors of earlier positions never change once computed: a step only has to compute the
newest position. What that position needs from the past is, in every decoder layer, the self-attention
keys and values of the earlier positions (kept in a cache, one position appended per step) and the
cross-attention keys and values of the encoder output (the same at every step: computed once per sentence).
Nothing here changes the stage 2-6 modules: the functions read their weights (`W_q`, `W_k`, ...).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from transformer_course.reference.attention import scaled_dot_product_attention
from transformer_course.reference.model import make_source_mask


@dataclass
class KVCache:
    """What incremental decoding keeps between steps, one list entry per decoder layer.

    self_keys[i], self_values[i]: (batch, heads, steps, d_k), the self-attention keys and values of every
        position decoded so far; each decoder step appends one position (axis 2).
    cross_keys[i], cross_values[i]: (batch, heads, src_len, d_k), the cross-attention keys and values of the
        encoder output; computed once per sentence, read at every step.
    src_mask: (batch, 1, 1, src_len), True at real source tokens.
    """

    src_mask: torch.Tensor
    self_keys: list[torch.Tensor] = field(default_factory=list)
    self_values: list[torch.Tensor] = field(default_factory=list)
    cross_keys: list[torch.Tensor] = field(default_factory=list)
    cross_values: list[torch.Tensor] = field(default_factory=list)

    @property
    def steps(self) -> int:
        """How many positions are cached: the position of the next token to decode."""
        return self.self_keys[0].size(2) if self.self_keys else 0

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep row rows[j] of the self-attention caches as row j (beam search: each new hypothesis
        continues the history of its parent). The cross-attention entries stay: the hypotheses of one
        sentence share its source."""
        self.self_keys = [keys.index_select(0, rows) for keys in self.self_keys]
        self.self_values = [values.index_select(0, rows) for values in self.self_values]


def project_keys_values(attention: nn.Module, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values a MultiHeadAttention computes from `memory` (batch, length, d_model):
    split_heads(W_k(memory)) and split_heads(W_v(memory)), each (batch, heads, length, d_k)."""
    return attention.split_heads(attention.W_k(memory)), attention.split_heads(attention.W_v(memory))


def attend(attention: nn.Module, x: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention of the queries x (batch, q_len, d_model) over keys and values computed earlier,
    K and V (batch, heads, k_len, d_k), with the weights of `attention`: the rest of MultiHeadAttention.forward.
    Returns (batch, q_len, d_model)."""
    Q = attention.split_heads(attention.W_q(x))  # (batch, heads, q_len, d_k)
    heads, _ = scaled_dot_product_attention(Q, K, V, mask)  # (batch, heads, q_len, d_k)
    return attention.W_o(attention.combine_heads(heads))  # (batch, q_len, d_model)


def start_cache(model: nn.Module, enc_out: torch.Tensor, src_mask: torch.Tensor) -> KVCache:
    """A cache for decoding a batch whose encoder output is enc_out (batch, src_len, d_model).

    Returns a KVCache with one entry per decoder layer in each of its four lists, layer 0 first: nothing
    decoded yet (self-attention entries (batch, heads, 0, d_k)), and cross-attention entries
    (batch, heads, src_len, d_k) that are what that layer's cross-attention uses as keys and values for
    enc_out, so that no step needs enc_out again.
    """
    cache = KVCache(src_mask)
    for layer in model.decoder.layers:
        empty = enc_out.new_zeros(enc_out.size(0), layer.self_attn.num_heads, 0, layer.self_attn.d_k)
        cache.self_keys.append(empty)  # nothing decoded yet
        cache.self_values.append(empty)
        ### BEGIN SOLUTION
        keys, values = project_keys_values(layer.cross_attn, enc_out)  # (batch, heads, src_len, d_k) each
        cache.cross_keys.append(keys)
        cache.cross_values.append(values)
        ### END SOLUTION
    return cache


def decoder_step(model: nn.Module, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
    """Run the decoder for ONE new position per sentence, reading and extending the cache.

    tokens: (batch, 1), the last token of every sentence, at position cache.steps. Appends that position's
    self-attention keys and values to every layer's cache. Returns the logits for the next token,
    (batch, vocab): the same as model.decoder on the whole prefix, at its last position (in eval mode).
    """
    decoder = model.decoder
    position = cache.steps  # positions 0 .. position - 1 are in the cache
    ### BEGIN SOLUTION
    x = decoder.embedding(tokens) * math.sqrt(decoder.d_model)  # (batch, 1, d_model)
    x = x + decoder.positional_encoding.pe[:, position:position + 1]  # the signal of THIS position
    for i, layer in enumerate(decoder.layers):
        keys, values = project_keys_values(layer.self_attn, x)  # (batch, heads, 1, d_k): the new position
        cache.self_keys[i] = torch.cat([cache.self_keys[i], keys], dim=2)  # (batch, heads, position + 1, d_k)
        cache.self_values[i] = torch.cat([cache.self_values[i], values], dim=2)
        x = layer.norm1(x + attend(layer.self_attn, x, cache.self_keys[i], cache.self_values[i]))
        x = layer.norm2(x + attend(layer.cross_attn, x, cache.cross_keys[i], cache.cross_values[i], cache.src_mask))
        x = layer.norm3(x + layer.feed_forward(x))
    logits = decoder.pred_layer(x[:, -1])  # (batch, vocab)
    ### END SOLUTION
    return logits


@torch.no_grad()
def cached_greedy_decode(model: nn.Module, src: torch.Tensor, pad_idx: int, bos_idx: int, eos_idx: int,
                         max_len: int) -> torch.Tensor:
    """Greedy decoding as in stage 6 (same arguments, same output), with the key/value cache.

    src: (batch, src_len). Returns (batch, out_len) target ids starting with <bos>, padded after <eos>.
    """
    model.eval()
    src_mask = make_source_mask(src, pad_idx)  # (batch, 1, 1, src_len)
    cache = start_cache(model, model.encoder(src, src_mask), src_mask)  # cross-attention K, V: once
    ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long, device=src.device)  # (batch, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    ### BEGIN SOLUTION
    for _ in range(max_len):
        logits = decoder_step(model, cache, ys[:, -1:])  # (batch, vocab): only the newest token goes in
        next_token = logits.argmax(dim=-1).masked_fill(finished, pad_idx)  # (batch,)
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)
        finished |= next_token == eos_idx
        if finished.all():
            break
    ### END SOLUTION
    return ys
