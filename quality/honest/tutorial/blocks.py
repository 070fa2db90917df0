"""Stage 3 with d2l.ai's add & norm (`norm(dropout(Y) + X)`, written as a small local function) and the
functional dropout of the PyTorch layers (`F.dropout(..., p, training=self.training)`); `F.relu` in the
feed-forward network."""

from quality.honest import Answer

ANSWERS = {
    "block_feed_forward": Answer(fixes=(("self.relu(self.fc2(self.fc1(x)))", "self.fc2(F.relu(self.fc1(x)))"),)),
    "block_encoder": Answer(stubs=(
        """
        def add_norm(norm, X, Y):  # d2l's AddNorm: dropout on the sublayer output, residual, layer norm
            return norm(F.dropout(Y, p=self.dropout.p, training=self.training) + X)

        Y = add_norm(self.norm1, x, self.self_attn(x, x, x, mask))
        x = add_norm(self.norm2, Y, self.feed_forward(Y))
        """,
    )),
    "block_decoder": Answer(stubs=(
        """
        def add_norm(norm, X, Y):
            return norm(F.dropout(Y, p=self.dropout.p, training=self.training) + X)

        X2 = add_norm(self.norm1, x, self.self_attn(x, x, x, dec_mask))  # masked self-attention
        Z = add_norm(self.norm2, X2, self.cross_attn(X2, enc_out, enc_out, enc_mask))  # encoder-decoder attention
        x = add_norm(self.norm3, Z, self.feed_forward(Z))
        """,
    )),
    "block_pre_ln": Answer(stubs=(
        """
        def add_prenorm(X, norm, sublayer):  # X + dropout(sublayer(norm(X))): only the sublayer sees normalised values
            return X + F.dropout(sublayer(norm(X)), p=self.dropout.p, training=self.training)

        X = add_prenorm(x, self.norm1, lambda Y: self.self_attn(Y, Y, Y, mask))
        x = add_prenorm(X, self.norm2, self.feed_forward)
        """,
    )),
    "block_predict_encoder_parameters": Answer(stubs=('return 3_152_384',)),
    "block_predict_decoder_parameters": Answer(stubs=('return 4_204_032',)),
    "block_predict_feed_forward_share": Answer(stubs=('return 33.3',)),
}
