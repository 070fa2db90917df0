"""Stage 7 from the lesson's numbered steps: the heads split by hand with view and transpose, the step's
position encoding read as one row of the table, one decoder layer at a time with every intermediate named;
greedy decoding with the output allocated up front as in stage 6; beam selection one sentence at a time (a
loop over the batch and over the beams) and the rows of the parents listed in a loop."""

from quality.honest import Answer

ANSWERS = {
    "start_cache": Answer(stubs=(
        """
        cross = layer.cross_attn
        batch, src_len = enc_out.size(0), enc_out.size(1)
        keys = cross.W_k(enc_out).view(batch, src_len, cross.num_heads, cross.d_k).transpose(1, 2)
        values = cross.W_v(enc_out).view(batch, src_len, cross.num_heads, cross.d_k).transpose(1, 2)
        cache.cross_keys.append(keys)  # (batch, heads, src_len, d_k), computed once per sentence
        cache.cross_values.append(values)
        """,
    )),
    "decoder_step": Answer(stubs=(
        """
        table = decoder.positional_encoding.pe  # (1, max_seq_length, d_model)
        embedded = decoder.embedding(tokens) * math.sqrt(decoder.d_model)  # (batch, 1, d_model)
        x = embedded + table[0, position]  # the encoding of this position only, broadcast over the batch
        for i in range(len(decoder.layers)):
            layer = decoder.layers[i]
            # 1. keys and values of the new position, appended to this layer's cache (axis 2: the steps)
            new_keys, new_values = project_keys_values(layer.self_attn, x)
            keys = torch.cat([cache.self_keys[i], new_keys], dim=2)
            values = torch.cat([cache.self_values[i], new_values], dim=2)
            cache.self_keys[i] = keys
            cache.self_values[i] = values
            # 2. masked self-attention over every position so far (no look-ahead mask: nothing later is cached)
            attended = attend(layer.self_attn, x, keys, values)
            x = layer.norm1(x + attended)
            # 3. cross-attention with the keys and values of the encoder output, computed once
            crossed = attend(layer.cross_attn, x, cache.cross_keys[i], cache.cross_values[i], cache.src_mask)
            x = layer.norm2(x + crossed)
            # 4. the feed-forward network
            x = layer.norm3(x + layer.feed_forward(x))
        logits = decoder.pred_layer(x[:, -1, :])  # (batch, vocab)
        """,
    )),
    "cached_greedy_decode": Answer(fixes=(("decoder_step(model, cache, ys)",
                                            "decoder_step(model, cache, ys.narrow(1, ys.size(1) - 1, 1))"),)),
    "select_beams": Answer(stubs=(
        """
        batch, beam = scores.shape
        new_scores = torch.empty(batch, beam_size, dtype=scores.dtype, device=scores.device)
        parents = torch.empty(batch, beam_size, dtype=torch.long, device=scores.device)
        tokens = torch.empty(batch, beam_size, dtype=torch.long, device=scores.device)
        for b in range(batch):
            candidates = scores[b].unsqueeze(1) + log_probs[b]  # (beam, vocab): parent's score + log p(token)
            candidate_lengths = lengths[b].clone()
            for j in range(beam):
                if finished[b, j]:  # only candidate: itself extended by <pad>, score and length unchanged
                    candidates[j] = float("-inf")
                    candidates[j, pad_idx] = scores[b, j]
                else:
                    candidate_lengths[j] = lengths[b, j] + 1
            ranking = candidates / length_penalty(candidate_lengths, alpha).unsqueeze(1)
            best = ranking.flatten().topk(beam_size).indices  # best first
            new_scores[b] = candidates.flatten()[best]
            parents[b] = best // vocab  # index i is token i mod vocab of parent i // vocab
            tokens[b] = best % vocab
        """,
    )),
    "beam_search": Answer(stubs=(
        """
        for step in range(max_len):
            logits = decoder_step(model, cache, ys[:, -1:])  # (batch * beam_size, vocab)
            log_probs = torch.log_softmax(logits, dim=-1).view(batch, beam_size, -1)
            scores, parents, tokens = select_beams(scores, log_probs, finished, lengths, beam_size=beam_size,
                                                   alpha=alpha, pad_idx=pad_idx)
            rows = []
            for b in range(batch):
                for j in range(beam_size):
                    rows.append(b * beam_size + int(parents[b, j]))  # the row of the parent of hypothesis j
            rows = torch.tensor(rows, dtype=torch.long, device=src.device)
            ys = torch.cat([ys[rows], tokens.view(-1, 1)], dim=1)
            cache.reorder(rows)
            new_finished = torch.zeros_like(finished)
            new_lengths = torch.zeros_like(lengths)
            for b in range(batch):
                for j in range(beam_size):
                    parent = int(parents[b, j])
                    new_finished[b, j] = finished[b, parent] or tokens[b, j] == eos_idx
                    new_lengths[b, j] = lengths[b, parent] if finished[b, parent] else lengths[b, parent] + 1
            finished, lengths = new_finished, new_lengths
            if finished.all():
                break
        """,
    )),
    "fast_predict_penalty_choice": Answer(stubs=("return 'A'  # A ranks -2.0, B -2.33",)),
    "fast_predict_cached_vectors": Answer(stubs=("return 5 * 48  # 48 per position: 3 layers, 8 heads, K and V",)),
    "fast_predict_candidates": Answer(stubs=("return 13_217 - 6_000 * (13_217 // 6_000)",)),
}
