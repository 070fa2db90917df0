"""Stage 4 from the lesson: the two masks of stage 2 combined with a logical and; the embedding step written
as its three operations, each in its own variable; the blocks visited by index; the decoder called with
keyword arguments so that the two masks cannot be swapped."""

from quality.honest import Answer

ANSWERS = {
    "model_make_target_mask": Answer(stubs=(
        """
        padding = make_padding_mask(tgt, pad_idx)  # (batch, 1, 1, tgt_len): no query looks at a pad key
        look_ahead = make_look_ahead_mask(tgt.size(1), device=tgt.device)  # (1, 1, tgt_len, tgt_len)
        mask = torch.logical_and(padding, look_ahead)  # both rules: (batch, 1, tgt_len, tgt_len)
        return mask
        """,
    )),
    "model_encoder": Answer(stubs=(
        """
        scale = math.sqrt(self.d_model)
        embedded = self.embedding(x) * scale  # (batch, src_len, d_model)
        hidden = self.positional_encoding(embedded)  # + PE, then dropout
        for index in range(len(self.layers)):
            hidden = self.layers[index](hidden, mask)
        x = hidden
        """,
    )),
    "model_decoder": Answer(stubs=(
        """
        scale = math.sqrt(self.d_model)
        embedded = self.embedding(x) * scale  # (batch, tgt_len, d_model)
        hidden = self.positional_encoding(embedded)
        for index in range(len(self.layers)):
            hidden = self.layers[index](hidden, enc_out, enc_mask, dec_mask)
        logits = self.pred_layer(hidden)  # (batch, tgt_len, vocab_size): scores, not probabilities
        """,
    )),
    "model_transformer": Answer(stubs=(
        """
        encoded = self.encoder(enc_in, mask=enc_mask)  # (batch, src_len, d_model), computed once
        logits = self.decoder(dec_in, enc_out=encoded, enc_mask=enc_mask, dec_mask=dec_mask)
        """,
    )),
}
