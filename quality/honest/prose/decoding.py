"""Stage 6 from the lesson's algorithm, with the output allocated up front: a (batch, max_len + 1) tensor full
of `<pad>`, its first column `<bos>`, filled one column per step and cut to the steps taken; finished
sentences handled one sentence at a time; the attention maps written into preallocated tensors layer by
layer."""

from quality.honest import Answer

ANSWERS = {
    "greedy_decode": Answer(stubs=(
        """
        batch = src.size(0)
        out = torch.full((batch, max_len + 1), pad_idx, dtype=torch.long, device=src.device)
        out[:, 0] = bos_idx
        length = 1  # columns of out written so far
        for step in range(max_len):
            prefix = out[:, :length]  # what has been written so far, <bos> first
            logits = model.decoder(prefix, enc_out, src_mask, make_target_mask(prefix, pad_idx))
            next_token = logits[:, -1].argmax(dim=-1)  # the prediction sits at the last position
            for b in range(batch):
                if finished[b]:
                    next_token[b] = pad_idx  # a finished sentence only gets padding
            out[:, length] = next_token
            length += 1
            finished = finished | (next_token == eos_idx)
            if bool(finished.all()):
                break
        ys = out[:, :length]
        """,
    )),
    "attention_maps": Answer(fixes=(("cross = torch.stack([layer.self_attn.attn_weights",
                                      "cross = torch.stack([layer.cross_attn.attn_weights"),)),
    "dec_predict_decoder_calls": Answer(stubs=("return 12 - 3  # the 9-token sentence ends the loop before max_len",)),
    "dec_predict_brevity_penalty": Answer(stubs=("return 0.7165",)),
}
