"""Stage 7 in the tutorials' idiom: the cross-attention keys and values projected and reshaped by hand
(reshape/permute, as d2l's `transpose_qkv`), the caches grown along axis -2, `F.log_softmax`; candidates of
finished hypotheses set with `masked_fill`; parents and tokens with `torch.div(..., rounding_mode="floor")` and
`torch.remainder`; parents followed with `torch.take_along_dim` and the rows with `index_select`."""

from quality.honest import Answer

ANSWERS = {
    "start_cache": Answer(stubs=(
        """
        attention = layer.cross_attn
        batch_size, num_steps, _ = enc_out.shape
        K = attention.W_k(enc_out).reshape(batch_size, num_steps, attention.num_heads, -1).permute(0, 2, 1, 3)
        V = attention.W_v(enc_out).reshape(batch_size, num_steps, attention.num_heads, -1).permute(0, 2, 1, 3)
        cache.cross_keys.append(K)
        cache.cross_values.append(V)
        """,
    )),
    "decoder_step": Answer(
        helpers="""
        import torch.nn.functional as F
        """,
        stubs=(
            """
            X = decoder.embedding(tokens) * math.sqrt(decoder.d_model)  # (batch, 1, d_model)
            X = decoder.positional_encoding.dropout(X + decoder.positional_encoding.pe[:, position, :].unsqueeze(1))
            for i, blk in enumerate(decoder.layers):
                new_keys, new_values = project_keys_values(blk.self_attn, X)  # (batch, heads, 1, d_k)
                cache.self_keys[i] = torch.cat((cache.self_keys[i], new_keys), dim=-2)
                cache.self_values[i] = torch.cat((cache.self_values[i], new_values), dim=-2)
                Y = blk.norm1(X + attend(blk.self_attn, X, cache.self_keys[i], cache.self_values[i]))
                Z = blk.norm2(Y + attend(blk.cross_attn, Y, cache.cross_keys[i], cache.cross_values[i],
                                         mask=cache.src_mask))
                X = blk.norm3(Z + blk.feed_forward(Z))
            logits = decoder.pred_layer(X[:, -1, :])  # (batch, vocab)
            """,
        ),
    ),
    "cached_greedy_decode": Answer(fixes=(("logits = decoder_step(model, cache, ys)",
                                            "logits = decoder_step(model, cache, ys[:, ys.size(1) - 1:])"),)),
    "select_beams": Answer(stubs=(
        """
        batch_size, num_beams = scores.shape
        # a finished hypothesis has one candidate: itself, extended by <pad> at no cost
        ended = log_probs.masked_fill(finished.unsqueeze(-1), float("-inf"))
        ended[..., pad_idx] = torch.where(finished, torch.zeros_like(scores), ended[..., pad_idx])
        candidates = ended + scores.reshape(batch_size, num_beams, 1)
        candidate_lengths = (lengths + torch.logical_not(finished).long()).reshape(batch_size, num_beams, 1)
        ranking = (candidates / length_penalty(candidate_lengths, alpha)).reshape(batch_size, -1)
        _, best = torch.topk(ranking, beam_size, dim=1)
        new_scores = torch.gather(candidates.reshape(batch_size, -1), 1, best)
        parents = torch.div(best, vocab, rounding_mode="floor")
        tokens = torch.remainder(best, vocab)
        """,
    )),
    "beam_search": Answer(stubs=(
        """
        for _ in range(max_len):
            log_probs = F.log_softmax(decoder_step(model, cache, ys[:, -1:]), dim=-1)  # (batch * beam, vocab)
            scores, parents, tokens = select_beams(scores, log_probs.reshape(batch, beam_size, -1), finished,
                                                   lengths, beam_size, alpha, pad_idx)
            rows = (first_row + parents).reshape(-1)
            ys = torch.cat((ys.index_select(0, rows), tokens.reshape(-1, 1)), dim=1)
            cache.reorder(rows)
            was_finished = torch.take_along_dim(finished, parents, dim=1)
            lengths = torch.take_along_dim(lengths, parents, dim=1) + torch.logical_not(was_finished).long()
            finished = torch.logical_or(was_finished, tokens == eos_idx)
            if finished.all():
                break
        """,
    )),
    "fast_predict_penalty_choice": Answer(stubs=('return str("A")',)),
    "fast_predict_cached_vectors": Answer(stubs=("return int(240.0)",)),
    "fast_predict_candidates": Answer(stubs=("return 1217",)),
}
