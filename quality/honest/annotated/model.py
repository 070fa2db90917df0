"""Stage 4 in the Annotated Transformer's way: the target mask as the padding mask `&` the subsequent mask
(the course's helpers), the embeddings scaled inside one expression, the layers applied in a plain for loop,
`encode` then `decode`."""

from quality.honest import Answer

ANSWERS = {
    "model_make_target_mask": Answer(fixes=(("return padding | look_ahead", "return padding & look_ahead"),)),
    "model_encoder": Answer(stubs=(
        """
        x = self.positional_encoding(self.embedding(x) * math.sqrt(self.d_model))
        for layer in self.layers:
            x = layer(x, mask)
        """,
    )),
    "model_decoder": Answer(stubs=(
        """
        x = self.positional_encoding(self.embedding(x) * math.sqrt(self.d_model))
        for layer in self.layers:
            x = layer(x, enc_out, enc_mask, dec_mask)
        logits = self.pred_layer(x)
        """,
    )),
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
