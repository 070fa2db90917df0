"""Stage 4 from the lesson: the target mask filled query by query from the formula M_tgt (a key is allowed when it
is not after the query and not padding); the embedding step written as its three operations, each in its own
variable; the blocks visited by index; the decoder's loop repaired by starting its running variable before the
loop; the decoder called with keyword arguments so that the two masks cannot be swapped."""

from quality.honest import Answer

ANSWERS = {
    "model_make_target_mask": Answer(stubs=(
        """
        batch, length = tgt.shape
        allowed = torch.zeros(batch, 1, length, length, dtype=torch.bool, device=tgt.device)
        is_word = tgt != pad_idx  # (batch, length): the padding rule, one value per key
        for query in range(length):
            # the look-ahead rule: keys 0..query; among them only real words
            allowed[:, 0, query, : query + 1] = is_word[:, : query + 1]
        return allowed
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
        x = self.positional_encoding(self.embedding(x) * scale)  # (batch, tgt_len, d_model)
        """,
    ), fixes=(
        ("for layer in self.layers:", "output = x  # what the next block reads: the running result\n"
                                      "        for layer in self.layers:"),
        ("output = layer(x, enc_out, enc_mask, dec_mask)", "output = layer(output, enc_out, enc_mask, dec_mask)"),
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
