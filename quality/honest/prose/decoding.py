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
    "attention_maps": Answer(stubs=(
        """
        encoder_layers, decoder_layers = model.encoder.layers, model.decoder.layers
        first_encoder = encoder_layers[0].self_attn.attn_weights  # (batch, heads, src_len, src_len)
        first_decoder = decoder_layers[0].self_attn.attn_weights  # (batch, heads, tgt_len, tgt_len)
        first_cross = decoder_layers[0].cross_attn.attn_weights  # (batch, heads, tgt_len, src_len)
        encoder_self = first_encoder.new_empty((len(encoder_layers), *first_encoder.shape))
        decoder_self = first_decoder.new_empty((len(decoder_layers), *first_decoder.shape))
        cross = first_cross.new_empty((len(decoder_layers), *first_cross.shape))
        for index, layer in enumerate(encoder_layers):
            encoder_self[index] = layer.self_attn.attn_weights
        for index, layer in enumerate(decoder_layers):
            decoder_self[index] = layer.self_attn.attn_weights
            cross[index] = layer.cross_attn.attn_weights
        """,
    )),
}
