"""Stage 7 mistakes: the key/value cache (start_cache, decoder_step, cached_greedy_decode) and beam search
(select_beams, beam_search)."""

from quality.mistakes import Alternative, Mistake

STAGE = "07_fast_and_better_decoding"

_CROSS = "keys, values = project_keys_values(layer.cross_attn, enc_out)  # (batch, heads, src_len, d_k) each"
_POSITION = "x = x + decoder.positional_encoding.pe[:, position:position + 1]  # the signal of THIS position"
_APPEND = (
    "        cache.self_keys[i] = torch.cat([cache.self_keys[i], keys], dim=2)  # (batch, heads, position + 1, d_k)\n"
    "        cache.self_values[i] = torch.cat([cache.self_values[i], values], dim=2)\n"
)
_SELF = "x = layer.norm1(x + attend(layer.self_attn, x, cache.self_keys[i], cache.self_values[i]))"
_CROSS_ATTEND = ("x = layer.norm2(x + attend(layer.cross_attn, x, cache.cross_keys[i], cache.cross_values[i], "
                 "cache.src_mask))")
_STEP_BODY = (
    "    x = decoder.embedding(tokens) * math.sqrt(decoder.d_model)  # (batch, 1, d_model)\n"
    "    " + _POSITION + "\n"
    "    for i, layer in enumerate(decoder.layers):\n"
    "        keys, values = project_keys_values(layer.self_attn, x)  # (batch, heads, 1, d_k): the new position\n"
    + _APPEND +
    "        " + _SELF + "\n"
    "        " + _CROSS_ATTEND + "\n"
    "        x = layer.norm3(x + layer.feed_forward(x))\n"
    "    logits = decoder.pred_layer(x[:, -1])  # (batch, vocab)\n"
)
_SELECT_BODY = (
    "    stay = torch.full_like(log_probs, float(\"-inf\"))  # a finished hypothesis: only <pad>, at no cost\n"
    "    stay[..., pad_idx] = 0.0\n"
    "    step = torch.where(finished.unsqueeze(-1), stay, log_probs)  # (batch, beam, vocab)\n"
    "    candidates = scores.unsqueeze(-1) + step  # total log-probability of every extension\n"
    "    new_lengths = lengths + (~finished).long()  # (batch, beam): finished ones keep their length\n"
    "    ranking = candidates / length_penalty(new_lengths, alpha).unsqueeze(-1)\n"
    "    best = ranking.flatten(1).topk(beam_size, dim=-1).indices  # (batch, beam_size) into beam * vocab\n"
    "    new_scores = candidates.flatten(1).gather(1, best)\n"
    "    parents, tokens = best // vocab, best % vocab\n"
)
_BEAM_FOLLOW = (
    "        rows = (first_row + parents).flatten()  # (batch * beam,): the row each new hypothesis continues\n"
    "        ys = torch.cat([ys[rows], tokens.view(-1, 1)], dim=1)\n"
    "        cache.reorder(rows)\n"
    "        was_finished = finished.gather(1, parents)\n"
    "        lengths = lengths.gather(1, parents) + (~was_finished).long()\n"
)

MISTAKES: list[Mistake] = [
    Mistake(
        STAGE, "decoder step: the feed-forward output normalised without its residual sum",
        "x = layer.norm3(x + layer.feed_forward(x))",
        "x = layer.norm3(layer.feed_forward(x))",
        fails="fast_step_matches", cause="the reference's step in between, the sum, is missing",
    ),
    Mistake(
        STAGE, "decoder step: the cross-attention output normalised without its residual sum",
        "x = layer.norm2(x + attend(layer.cross_attn, x, cache.cross_keys[i], cache.cross_values[i], cache.src_mask))",
        "x = layer.norm2(attend(layer.cross_attn, x, cache.cross_keys[i], cache.cross_values[i], cache.src_mask))",
        fails="fast_step_cache_grows", cause="computes layer 1's input differently",
    ),
    Mistake(
        STAGE, "beam search views the hypotheses' rows with the beam and batch axes swapped",
        "log_probs.view(batch, beam_size, -1), finished, lengths,",
        "log_probs.view(beam_size, batch, -1).transpose(0, 1), finished, lengths,",
        fails="fast_beam_finds_missed", cause="the batch and beam axes are swapped",
    ),
    Mistake(
        STAGE, "length penalty multiplied by alpha instead of raised to it (inline)",
        "    ranking = candidates / length_penalty(new_lengths, alpha).unsqueeze(-1)\n",
        "    ranking = candidates / (((5.0 + new_lengths) / 6.0) * alpha).unsqueeze(-1)\n",
        fails="fast_select_top", cause="multiplies by alpha where it raises to the power alpha",
    ),
    Mistake(
        STAGE, "length penalty multiplied by alpha (seen where alpha is neither 0 nor 1)",
        "    ranking = candidates / length_penalty(new_lengths, alpha).unsqueeze(-1)\n",
        "    ranking = candidates / (((5.0 + new_lengths) / 6.0) * alpha + (alpha == 0)).unsqueeze(-1)\n",
        fails="fast_select_penalty", cause="multiplies by alpha where it raises to the power alpha",
    ),
    # start_cache
    Mistake(
        STAGE, "cross-attention keys and values taken from the self-attention weights",
        _CROSS, "keys, values = project_keys_values(layer.self_attn, enc_out)",
        fails="fast_cache_cross_kv", cause="holds the keys of layer 0's self_attn",
    ),
    Mistake(
        STAGE, "the cross-attention values never appended to the cache",
        "        cache.cross_values.append(values)\n", "",
        fails="fast_cache_starts_empty", cause="nothing is ever appended to cache.cross_values: the append is missing",
    ),
    Mistake(
        STAGE, "the cross-attention keys appended twice per layer",
        "        cache.cross_keys.append(keys)\n",
        "        cache.cross_keys.append(keys)\n        cache.cross_keys.append(keys)\n",
        fails="fast_cache_starts_empty", cause="2 entries per layer: it is appended to more than once",
    ),
    Mistake(
        STAGE, "cross-attention keys and values swapped in the cache",
        _CROSS, "values, keys = project_keys_values(layer.cross_attn, enc_out)",
        fails="fast_cache_cross_kv", cause="holds the values of layer 0's cross_attn (W_v), where the keys",
    ),
    Mistake(
        STAGE, "cross-attention keys and values not split into heads",
        _CROSS, "keys, values = layer.cross_attn.W_k(enc_out), layer.cross_attn.W_v(enc_out)",
        fails="fast_cache_starts_empty", cause="split into heads",
    ),
    # decoder_step
    Mistake(
        STAGE, "the positional encoding module adds position 0 at every step",
        _POSITION, "x = decoder.positional_encoding(x)  # (adds pe[:, :1] to a one-token x)",
        fails="fast_step_matches", cause="got the positional encoding of position 0",
    ),
    Mistake(
        STAGE, "embedding not scaled by sqrt(d_model) in the step",
        "x = decoder.embedding(tokens) * math.sqrt(decoder.d_model)  # (batch, 1, d_model)",
        "x = decoder.embedding(tokens)  # (batch, 1, d_model)",
        fails="fast_step_matches", cause="the factor is √d_model",
    ),
    Mistake(
        STAGE, "the concatenated keys and values are never stored back into the cache",
        _APPEND + "        " + _SELF,
        "        all_keys = torch.cat([cache.self_keys[i], keys], dim=2)\n"
        "        all_values = torch.cat([cache.self_values[i], values], dim=2)\n"
        "        x = layer.norm1(x + attend(layer.self_attn, x, all_keys, all_values))",
        fails="fast_step_cache_grows", cause="did not grow",
    ),
    Mistake(
        STAGE, "the new position attends before its key and value are appended",
        _APPEND + "        " + _SELF,
        "        " + _SELF + "\n" + _APPEND.rstrip("\n"),
        fails="fast_step_matches", cause="does not attend to itself",
    ),
    Mistake(
        STAGE, "self-attention over the new position only, not the cache",
        _SELF, "x = layer.norm1(x + attend(layer.self_attn, x, keys, values))",
        fails="fast_step_matches", cause="sees only the new position",
    ),
    Mistake(
        STAGE, "cross-attention in the step without the source mask",
        _CROSS_ATTEND,
        "x = layer.norm2(x + attend(layer.cross_attn, x, cache.cross_keys[i], cache.cross_values[i]))",
        fails="fast_step_matches", cause="ignores the source mask",
    ),
    Mistake(
        STAGE, "the step's feed-forward sublayer normalised with norm2 instead of norm3",
        "x = layer.norm3(x + layer.feed_forward(x))", "x = layer.norm2(x + layer.feed_forward(x))",
        fails="fast_step_matches", cause="norm2",
    ),
    Mistake(
        STAGE, "the cache grows along the heads axis",
        _APPEND,
        "        cache.self_keys[i] = torch.cat([cache.self_keys[i], keys], dim=1)\n"
        "        cache.self_values[i] = torch.cat([cache.self_values[i], values], dim=1)\n",
        fails="fast_step_logits", cause="only the steps axis may grow",
    ),
    Mistake(
        STAGE, "the step returns (batch, 1, vocab) logits",
        "logits = decoder.pred_layer(x[:, -1])  # (batch, vocab)",
        "logits = decoder.pred_layer(x)  # (batch, 1, vocab)",
        fails="fast_step_logits", cause="pred_layer(x[:, -1])",
    ),
    # cached_greedy_decode
    Mistake(
        STAGE, "cached greedy decoding feeds <bos> at every step",
        "logits = decoder_step(model, cache, ys[:, -1:])  # (batch, vocab): only the newest token goes in",
        "logits = decoder_step(model, cache, ys[:, :1])  # (batch, vocab)",
        fails="fast_greedy_matches", cause="feeds <bos>",
    ),
    Mistake(
        STAGE, "cached greedy decoding feeds the whole prefix to the step",
        "logits = decoder_step(model, cache, ys[:, -1:])  # (batch, vocab): only the newest token goes in",
        "logits = decoder_step(model, cache, ys)  # (batch, vocab)",
        fails="fast_greedy_uses_cache", cause="with the newest token only",
    ),
    Mistake(
        STAGE, "cached greedy decoding does not pad finished sentences",
        "next_token = logits.argmax(dim=-1).masked_fill(finished, pad_idx)  # (batch,)",
        "next_token = logits.argmax(dim=-1)  # (batch,)",
        fails="fast_greedy_padded", cause="keep producing words after their <eos>",
    ),
    # select_beams
    Mistake(
        STAGE, "beam candidates ranked by the new token's log-probability alone",
        "candidates = scores.unsqueeze(-1) + step", "candidates = step",
        fails="fast_select_top", cause="the new token's log-probability alone",
    ),
    Mistake(
        STAGE, "parent and token swapped when unflattening the best candidates",
        "parents, tokens = best // vocab, best % vocab", "parents, tokens = best % vocab, best // vocab",
        fails="fast_select_top", cause="your parents are the tokens of the best candidates",
    ),
    Mistake(
        STAGE, "best candidates unflattened with the beam size instead of the vocabulary size",
        "parents, tokens = best // vocab, best % vocab", "parents, tokens = best // beam_size, best % beam_size",
        fails="fast_select_top", cause="split by the beam size",
    ),
    Mistake(
        STAGE, "parents made by true division: fractions where beam indices belong",
        "parents, tokens = best // vocab, best % vocab", "parents, tokens = best / vocab, best % vocab",
        fails="fast_select_top", cause="your parents are not whole numbers",
    ),
    Mistake(
        STAGE, "finished hypotheses dropped from the beam (-inf for every token, <pad> included)",
        "    stay[..., pad_idx] = 0.0\n", "",
        fails="fast_select_finished", cause="finished hypotheses disappear",
    ),
    Mistake(
        STAGE, "finished hypotheses extended like live ones",
        "step = torch.where(finished.unsqueeze(-1), stay, log_probs)  # (batch, beam, vocab)",
        "step = log_probs  # (batch, beam, vocab)",
        fails="fast_select_finished", cause="a finished hypothesis was extended by a word",
    ),
    Mistake(
        STAGE, "length penalty computed with the length before the step",
        "new_lengths = lengths + (~finished).long()  # (batch, beam): finished ones keep their length",
        "new_lengths = lengths",
        fails="fast_select_penalty", cause="length before this step",
    ),
    Mistake(
        STAGE, "candidates ranked without the length penalty",
        "ranking = candidates / length_penalty(new_lengths, alpha).unsqueeze(-1)", "ranking = candidates",
        fails="fast_select_penalty", cause="as if there were no length penalty",
    ),
    Mistake(
        STAGE, "candidates multiplied by alpha instead of divided by the length penalty",
        "ranking = candidates / length_penalty(new_lengths, alpha).unsqueeze(-1)", "ranking = candidates * alpha",
        fails="fast_select_penalty", cause="as if there were no length penalty",
    ),
    Mistake(
        STAGE, "one child per hypothesis: each hypothesis's best token instead of the best of all candidates",
        "    best = ranking.flatten(1).topk(beam_size, dim=-1).indices  # (batch, beam_size) into beam * vocab\n"
        "    new_scores = candidates.flatten(1).gather(1, best)\n"
        "    parents, tokens = best // vocab, best % vocab\n",
        "    tokens = ranking.argmax(dim=-1)  # (batch, beam): the best token of each hypothesis\n"
        "    new_scores = candidates.gather(2, tokens.unsqueeze(-1)).squeeze(-1)\n"
        "    parents = torch.arange(scores.size(1)).expand_as(tokens)\n",
        fails="fast_select_top", cause="each hypothesis keeps exactly one child",
    ),
    Mistake(
        STAGE, "select_beams returns length-penalised scores",
        "new_scores = candidates.flatten(1).gather(1, best)", "new_scores = ranking.flatten(1).gather(1, best)",
        fails="fast_select_penalty", cause="the scores you return are divided by the length penalty",
    ),
    # beam_search
    Mistake(
        STAGE, "beam search does not reorder the cache",
        "        cache.reorder(rows)\n", "",
        fails="fast_beam_matches", cause="the cache is not reordered",
    ),
    Mistake(
        STAGE, "beam search does not reorder ys",
        "ys = torch.cat([ys[rows], tokens.view(-1, 1)], dim=1)", "ys = torch.cat([ys, tokens.view(-1, 1)], dim=1)",
        fails="fast_beam_finds_missed", cause="ys is not reordered",
    ),
    Mistake(
        STAGE, "beam search reorders the cache twice",
        "        cache.reorder(rows)\n", "        cache.reorder(rows)\n        cache.reorder(rows)\n",
        fails="fast_beam_matches", cause="the cache's rows were not those of the parents",
    ),
    Mistake(
        STAGE, "beam search takes the parents' rows without the sentence offset",
        "rows = (first_row + parents).flatten()", "rows = parents.flatten()",
        fails="fast_beam_matches", cause="ignore the sentence",
    ),
    Mistake(
        STAGE, "beam search adds raw logits instead of log-probabilities",
        "log_probs = torch.log_softmax(decoder_step(model, cache, ys[:, -1:]), dim=-1)",
        "log_probs = decoder_step(model, cache, ys[:, -1:])",
        fails="fast_beam_matches", cause="raw logits",
    ),
    Mistake(
        STAGE, "beam search does not take `finished` from the parents",
        "was_finished = finished.gather(1, parents)", "was_finished = finished",
        fails="fast_beam_eos", cause="`finished` is not taken from the parents",
    ),
    Mistake(
        STAGE, "beam search does not take `lengths` from the parents",
        "lengths = lengths.gather(1, parents) + (~was_finished).long()",
        "lengths = lengths + (~was_finished).long()",
        fails="fast_beam_penalty", cause="`lengths` is not taken from the parents",
    ),
    Mistake(
        STAGE, "beam search stops when the first hypothesis ends",
        "        finished = was_finished | (tokens == eos_idx)\n        if finished.all():",
        "        finished = was_finished | (tokens == eos_idx)\n        if finished.any():",
        fails="fast_beam_eos", cause="stops when ONE hypothesis is finished",
    ),
]

ALTERNATIVES: list[Alternative] = [
    Alternative(
        STAGE, "decoder step with einsum attention written out, reshape/permute heads and the pe row by index",
        _STEP_BODY,
        "    def heads(t, attention):  # (batch, len, d_model) -> (batch, heads, len, d_k)\n"
        "        return t.reshape(t.size(0), -1, attention.num_heads, attention.d_k).permute(0, 2, 1, 3)\n"
        "\n"
        "    x = decoder.embedding(tokens) * decoder.d_model ** 0.5 + decoder.positional_encoding.pe[0, position]\n"
        "    for i, layer in enumerate(decoder.layers):\n"
        "        sa, ca = layer.self_attn, layer.cross_attn\n"
        "        cache.self_keys[i] = torch.cat((cache.self_keys[i], heads(sa.W_k(x), sa)), dim=-2)\n"
        "        cache.self_values[i] = torch.cat((cache.self_values[i], heads(sa.W_v(x), sa)), dim=-2)\n"
        "        for attention, K, V, mask in ((sa, cache.self_keys[i], cache.self_values[i], None),\n"
        "                                      (ca, cache.cross_keys[i], cache.cross_values[i], cache.src_mask)):\n"
        "            q = heads(attention.W_q(x), attention)  # (batch, heads, 1, d_k)\n"
        "            scores = torch.einsum('bhqd,bhkd->bhqk', q, K) / attention.d_k ** 0.5\n"
        "            if mask is not None:\n"
        "                scores = torch.where(mask.bool(), scores, torch.tensor(float('-inf'), dtype=scores.dtype))\n"
        "            out = torch.einsum('bhqk,bhkd->bhqd', scores.softmax(-1), V).permute(0, 2, 1, 3)\n"
        "            out = attention.W_o(out.reshape(x.shape))\n"
        "            x = (layer.norm1 if attention is sa else layer.norm2)(x + out)\n"
        "        x = layer.norm3(x + layer.feed_forward(x))\n"
        "    logits = decoder.pred_layer(x.squeeze(1))\n",
    ),
    Alternative(
        STAGE, "select_beams with masked_fill, sort instead of topk and floor division by torch.div",
        _SELECT_BODY,
        "    extend = log_probs.masked_fill(finished.unsqueeze(-1), float('-inf'))\n"
        "    extend[..., pad_idx] = torch.where(finished, torch.zeros_like(scores), extend[..., pad_idx])\n"
        "    candidates = (scores[..., None] + extend).reshape(scores.size(0), -1)  # (batch, beam * vocab)\n"
        "    grown = (lengths + torch.where(finished, 0, 1)).repeat_interleave(vocab, dim=1)\n"
        "    ranking = candidates / ((5.0 + grown) / 6.0) ** alpha\n"
        "    best = ranking.sort(dim=1, descending=True).indices[:, :beam_size]\n"
        "    new_scores = torch.take_along_dim(candidates, best, dim=1)\n"
        "    parents = torch.div(best, vocab, rounding_mode='floor')\n"
        "    tokens = best - parents * vocab\n",
    ),
    Alternative(
        STAGE, "beam search following the parents with view/gather on (batch, beam, len) tensors",
        _BEAM_FOLLOW,
        "        history = ys.view(batch, beam_size, -1).gather(1, parents[..., None].expand(-1, -1, ys.size(1)))\n"
        "        ys = torch.cat([history, tokens[..., None]], dim=2).view(batch * beam_size, -1)\n"
        "        cache.reorder((parents + first_row).view(-1))\n"
        "        was_finished = torch.take_along_dim(finished, parents, dim=1)\n"
        "        lengths = torch.take_along_dim(lengths, parents, dim=1) + (~was_finished).int()\n",
    ),
]
