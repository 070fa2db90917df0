"""Stage 6 after the Annotated Transformer's `greedy_decode`: the decoder on the whole prefix, the generator's
scores at the last position, `_, next_word = torch.max(prob, dim=1)`, the word appended with torch.cat; the
batches padded by `torch.full` with the source's pad id; corpus BLEU from an `ngrams` helper and Counter
intersections, the brevity penalty and the geometric mean as one expression; the attention maps gathered by a
`collect` helper that stacks one kind over the layers."""

from quality.honest import Answer

ANSWERS = {
    "greedy_decode": Answer(stubs=(
        """
        for i in range(max_len):
            out = model.decoder(ys, enc_out, src_mask, make_target_mask(ys, pad_idx))
            prob = out[:, -1]
            _, next_word = torch.max(prob, dim=1)
            next_word = next_word.masked_fill(finished, pad_idx)
            ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)
            finished = finished | (next_word == eos_idx)
            if finished.all():
                break
        """,
    )),
    "translate_batch": Answer(fixes=((
        "src = torch.zeros(len(chunk), longest, dtype=torch.long)",
        "src = torch.full((len(chunk), longest), source_vocab.pad_idx, dtype=torch.long)"),)),
    "compute_bleu": Answer(helpers="""
        def ngrams(tokens, n):
            "Every run of n consecutive tokens, with how often it occurs."
            return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
        """, stubs=(
        """
        stats = [[0, 0] for _ in range(4)]  # per order: clipped matches, hypothesis n-grams
        for hyp, ref in zip(hypotheses, references):
            for n, stat in enumerate(stats, start=1):
                h, r = ngrams(hyp, n), ngrams(ref, n)
                stat[0] += sum((h & r).values())
                stat[1] += sum(h.values())
        precisions = [m / t if t > 0 else 0.0 for m, t in stats]
        hyp_len, ref_len = sum(map(len, hypotheses)), sum(map(len, references))
        brevity_penalty = math.exp(min(0.0, 1 - ref_len / hyp_len))
        bleu = 0.0 if 0.0 in precisions else 100 * brevity_penalty * math.exp(
            sum(map(math.log, precisions)) / len(precisions))
        """,
    )),
    "attention_maps": Answer(helpers="""
        def collect(layers, kind):
            "One kind of attention weights, stacked over the layers (first layer first)."
            return torch.stack([getattr(layer, kind).attn_weights for layer in layers])
        """, stubs=(
        """
        encoder_self = collect(model.encoder.layers, "self_attn")
        decoder_self = collect(model.decoder.layers, "self_attn")
        cross = collect(model.decoder.layers, "cross_attn")
        """,
    )),
    "dec_predict_decoder_calls": Answer(stubs=("return max(4, 9, 2)  # the longest sentence sets the steps",)),
    "dec_predict_brevity_penalty": Answer(stubs=("return math.exp(1 - 20 / 15)",)),
}
