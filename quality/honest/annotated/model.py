"""Stage 4 in the Annotated Transformer's way: the target mask as its `make_std_mask` builds it (the padding test
unsqueezed, `&` a `subsequent_mask` made with `triu(..., diagonal=1) == 0`), the embeddings scaled inside one
expression, the layers applied in a plain for loop (the decoder's loop repaired so that each layer reads the one
before), `encode` then `decode`."""

from quality.honest import Answer

ANSWERS = {
    "model_make_target_mask": Answer(stubs=(
        """
        tgt_mask = (tgt != pad_idx).unsqueeze(-2)  # (batch, 1, tgt_len): which keys are words
        size = tgt.size(-1)
        subsequent_mask = torch.triu(torch.ones((1, size, size), device=tgt.device), diagonal=1) == 0
        return (tgt_mask & subsequent_mask).unsqueeze(1)  # (batch, 1, tgt_len, tgt_len), one head axis
        """,
    )),
    "model_encoder": Answer(stubs=(
        """
        x = self.positional_encoding(self.embedding(x) * math.sqrt(self.d_model))
        for layer in self.layers:
            x = layer(x, mask)
        """,
    )),
    "model_decoder": Answer(stubs=(
        """
        embedded = self.embedding(x) * math.sqrt(self.d_model)  # (batch, tgt_len, d_model)
        x = self.positional_encoding(embedded)  # + PE, then dropout
        """,
    ), fixes=(("output = layer(x, enc_out, enc_mask, dec_mask)",
                                    "x = layer(x, enc_out, enc_mask, dec_mask)"),
                                   ("self.pred_layer(output)", "self.pred_layer(x)"))),
    "model_transformer": Answer(stubs=(
        """
        memory = self.encoder(enc_in, enc_mask)
        logits = self.decoder(dec_in, memory, enc_mask, dec_mask)
        """,
    )),
    "model_predict_parameters": Answer(stubs=(
        "return (1000 + 800) * 64 + 2 * (33_472 + 50_240) + 800 * 65  # embeddings, blocks, pred_layer",)),
    "model_predict_tying_saving": Answer(stubs=("return 51_200  # 800 x 64, the bias stays",)),
}
