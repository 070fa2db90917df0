"""Stage 4 as d2l.ai's TransformerEncoder/Decoder: `embedding(X) * math.sqrt(num_hiddens)` through the
positional encoding, then `for i, blk in enumerate(self.blks)`; the target mask from the PyTorch tutorials'
`nn.Transformer.generate_square_subsequent_mask` (0 where allowed, -inf above the diagonal) turned into bool on
the target's device, and the padding comparison broadcast against it with `torch.logical_and`; the decoder's
loop repaired by carrying each block's output into the next."""

from quality.honest import Answer

ANSWERS = {
    "model_make_target_mask": Answer(stubs=(
        """
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device) == 0  # (T, T)
        key_is_word = (tgt != pad_idx)[:, None, None, :]  # (batch, 1, 1, T)
        return torch.logical_and(key_is_word, causal)
        """,
    )),
    "model_encoder": Answer(stubs=(
        """
        X = self.positional_encoding(self.embedding(x) * math.sqrt(self.d_model))
        for i, blk in enumerate(self.layers):
            X = blk(X, mask)
        x = X
        """,
    )),
    "model_decoder": Answer(stubs=(
        """
        x = self.positional_encoding(self.embedding(x) * math.sqrt(self.d_model))
        """,
    ), fixes=(("output = layer(x, enc_out, enc_mask, dec_mask)",
                                    "x = output = layer(x, enc_out, enc_mask, dec_mask)  # the next block reads it"),)),
    "model_transformer": Answer(stubs=(
        """
        enc_outputs = self.encoder(enc_in, enc_mask)
        logits = self.decoder(dec_in, enc_outputs, enc_mask, dec_mask)
        """,
    )),
    "model_predict_parameters": Answer(stubs=("return 334624",)),
    "model_predict_tying_saving": Answer(stubs=("return 800 * 64",)),
}
