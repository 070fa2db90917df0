"""Stage 6 as the PyTorch translation tutorial's greedy decoder, for a batch: `argmax(dim=-1)` of the last
position's logits, finished sentences given `<pad>` with `torch.where`, `finished = finished | ...`; the
attention maps collected in lists by a loop over the layers, then stacked."""

from quality.honest import Answer

ANSWERS = {
    "greedy_decode": Answer(stubs=(
        """
        for _ in range(max_len):
            tgt_mask = make_target_mask(ys, pad_idx)
            logits = model.decoder(ys, enc_out, src_mask, tgt_mask)  # (batch, len, vocab)
            next_token = logits[:, -1, :].argmax(dim=-1)  # (batch,)
            next_token = torch.where(finished, torch.full_like(next_token, pad_idx), next_token)
            ys = torch.cat((ys, next_token.reshape(-1, 1)), dim=1)
            finished = finished | (next_token == eos_idx)
            if finished.all():
                break
        """,
    )),
    "attention_maps": Answer(fixes=(("[layer.self_attn.attn_weights for layer in model.decoder.layers])  "
                                       "# queries: target",
                                      "[block.cross_attn.attn_weights for block in model.decoder.layers])"),)),
    "dec_predict_decoder_calls": Answer(stubs=("return int(9.0)",)),
    "dec_predict_brevity_penalty": Answer(stubs=("return 0.717",)),
}
