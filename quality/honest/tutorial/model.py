"""Stage 4 as d2l.ai's TransformerEncoder/Decoder: `embedding(X) * math.sqrt(num_hiddens)` through the
positional encoding, then `for i, blk in enumerate(self.blks)`; the target mask built in one expression from
a lower triangle of ones (`tril`) on the target's device and the padding comparison broadcast against it."""

from quality.honest import Answer

ANSWERS = {
    "model_make_target_mask": Answer(fixes=(("padding | look_ahead", "torch.logical_and(padding, look_ahead)"),)),
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
        X = self.positional_encoding(self.embedding(x) * math.sqrt(self.d_model))
        for i, blk in enumerate(self.layers):
            X = blk(X, enc_out, enc_mask, dec_mask)
        logits = self.pred_layer(X)  # d2l's self.dense
        """,
    )),
    "model_transformer": Answer(stubs=(
        """
        enc_outputs = self.encoder(enc_in, enc_mask)
        logits = self.decoder(dec_in, enc_outputs, enc_mask, dec_mask)
        """,
    )),
    "model_predict_parameters": Answer(stubs=("return 334624",)),
    "model_predict_tying_saving": Answer(stubs=("return 800 * 64",)),
}
