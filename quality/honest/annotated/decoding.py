"""Stage 6 after the Annotated Transformer's `greedy_decode`: the decoder on the whole prefix, the generator's
scores at the last position, `_, next_word = torch.max(prob, dim=1)`, the word appended with torch.cat; the
attention maps gathered by a `collect` helper that stacks one kind over the layers."""

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
    "attention_maps": Answer(fixes=(("cross = torch.stack([layer.self_attn.attn_weights",
                                      "cross = torch.stack([getattr(layer, 'cross_attn').attn_weights"),)),
    "dec_predict_decoder_calls": Answer(stubs=("return max(4, 9, 2)  # the longest sentence sets the steps",)),
    "dec_predict_brevity_penalty": Answer(stubs=("return math.exp(1 - 20 / 15)",)),
}
