"""Stage 7 in the Annotated Transformer's idioms: zip over (stores, tensors), the decoder layer's sublayers
passed as lambdas to a small residual helper, greedy decoding as in stage 6 with `torch.max`; beam search on
whole tensors: a finished hypothesis's only candidate made with `index_fill_`, the candidates viewed as
(batch, beam * vocab), `topk`, and the parents' `finished` and `lengths` followed in one comprehension."""

from quality.honest import Answer

ANSWERS = {
    "start_cache": Answer(stubs=(
        """
        keys_and_values = project_keys_values(layer.cross_attn, enc_out)
        for store, tensor in zip((cache.cross_keys, cache.cross_values), keys_and_values):
            store.append(tensor)
        """,
    )),
    "decoder_step": Answer(stubs=(
        """
        def residual(x, norm, fn):
            "Post-LN residual connection (no dropout: decoding runs in eval mode)."
            return norm(x + fn(x))

        pe = decoder.positional_encoding.pe
        x = decoder.embedding(tokens) * math.sqrt(decoder.d_model) + pe[:, position:position + 1]
        for i, layer in enumerate(decoder.layers):
            k, v = project_keys_values(layer.self_attn, x)
            cache.self_keys[i] = torch.cat([cache.self_keys[i], k], 2)
            cache.self_values[i] = torch.cat([cache.self_values[i], v], 2)
            x = residual(x, layer.norm1, lambda x: attend(layer.self_attn, x, cache.self_keys[i], cache.self_values[i]))
            x = residual(x, layer.norm2, lambda x: attend(layer.cross_attn, x, cache.cross_keys[i],
                                                          cache.cross_values[i], cache.src_mask))
            x = residual(x, layer.norm3, layer.feed_forward)
        logits = decoder.pred_layer(x)[:, -1]
        """,
    )),
    "cached_greedy_decode": Answer(fixes=(("decoder_step(model, cache, ys)",
                                            "decoder_step(model, cache, ys[:, -1:])"),)),
    "select_beams": Answer(stubs=(
        """
        batch = scores.size(0)
        pad = torch.tensor([pad_idx], device=log_probs.device)
        pad_only = torch.full_like(log_probs, float("-inf")).index_fill_(-1, pad, 0.0)  # 0 at <pad>, -inf elsewhere
        candidates = scores[..., None] + torch.where(finished[..., None], pad_only, log_probs)
        ranking = candidates / length_penalty(lengths + finished.logical_not(), alpha)[..., None]
        top = ranking.view(batch, -1).topk(beam_size)
        new_scores = candidates.view(batch, -1).gather(-1, top.indices)
        parents, tokens = top.indices.div(vocab, rounding_mode="floor"), top.indices.fmod(vocab)
        """,
    )),
    "beam_search": Answer(stubs=(
        """
        for _ in range(max_len):
            out = decoder_step(model, cache, ys[:, -1:])
            log_probs = out.log_softmax(dim=-1).view(batch, beam_size, -1)
            scores, parents, tokens = select_beams(scores, log_probs, finished, lengths, beam_size, alpha, pad_idx)
            rows = (first_row + parents).view(-1)
            cache.reorder(rows)
            ys = torch.cat([ys.index_select(0, rows), tokens.view(-1, 1)], dim=-1)
            finished, lengths = [state.gather(1, parents) for state in (finished, lengths)]
            lengths = lengths + finished.logical_not()  # a live parent's child is one token longer
            finished = finished | tokens.eq(eos_idx)
            if finished.all():
                break
        """,
    )),
    "fast_predict_penalty_choice": Answer(stubs=('return "a"  # -5/2.5 = -2.0 against -3.5/1.5',)),
    "fast_predict_cached_vectors": Answer(stubs=("return 2 * 3 * 8 * 5",)),
    "fast_predict_candidates": Answer(stubs=("return 13217 % 6000  # the column (token) of the flat index",)),
}
