"""Stage 4 from the lesson: the two masks of stage 2 combined with a logical and; the embedding step written
as its three operations, each in its own variable; the blocks visited by index; the decoder called with
keyword arguments so that the two masks cannot be swapped."""

from quality.honest import Answer

ANSWERS = {
    "model_make_target_mask": Answer(fixes=(("return padding | look_ahead",
                                             "return look_ahead & padding  # both rules must allow the key"),)),
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
    "model_predict_parameters": Answer(stubs=(
        """
        embeddings = 1000 * 64 + 800 * 64
        attention = 4 * (64 * 64 + 64)
        feed_forward = 64 * 128 + 128 + 128 * 64 + 64
        encoder_blocks = 2 * (attention + feed_forward + 2 * 128)
        decoder_blocks = 2 * (2 * attention + feed_forward + 3 * 128)
        return embeddings + encoder_blocks + decoder_blocks + 800 * 64 + 800
        """,
    )),
    "model_predict_tying_saving": Answer(stubs=("return 51200.0",)),
}
