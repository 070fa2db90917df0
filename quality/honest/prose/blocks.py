"""Stage 3 step by step as the lesson's sublayer pattern lists it: keep the input as the residual, run the
sublayer, apply dropout to its output, add the residual, normalise; max(0, .) written as the formula says."""

from quality.honest import Answer

ANSWERS = {
    "block_feed_forward": Answer(fixes=(("return self.relu(self.fc2(self.fc1(x)))",
                                         "return self.fc2(torch.clamp(self.fc1(x), min=0))  # max(0, .) inside"),)),
    "block_encoder": Answer(stubs=(
        """
        # sublayer 1: multi-head self-attention
        residual = x
        x = self.self_attn(x, x, x, mask)
        x = self.dropout(x)
        x = self.norm1(residual + x)
        # sublayer 2: the position-wise feed-forward network
        residual = x
        x = self.feed_forward(x)
        x = self.dropout(x)
        x = self.norm2(residual + x)
        """,
    )),
    "block_decoder": Answer(stubs=(
        """
        # sublayer 1: masked self-attention over the target written so far
        residual = x
        x = self.self_attn(x, x, x, dec_mask)
        x = self.norm1(residual + self.dropout(x))
        # sublayer 2: cross-attention, queries from the decoder, keys and values from the encoder output
        residual = x
        x = self.cross_attn(x, enc_out, enc_out, enc_mask)
        x = self.norm2(residual + self.dropout(x))
        # sublayer 3: the position-wise feed-forward network
        residual = x
        x = self.feed_forward(x)
        x = self.norm3(residual + self.dropout(x))
        """,
    )),
    "block_pre_ln": Answer(stubs=(
        """
        # sublayer 1: self-attention reads a normalised copy; the stream x itself is only added to
        copy = self.norm1(x)
        update = self.self_attn(copy, copy, copy, mask)
        x = x + self.dropout(update)
        # sublayer 2: the feed-forward network reads its own normalised copy of the stream as it is now
        copy = self.norm2(x)
        update = self.feed_forward(copy)
        x = x + self.dropout(update)
        """,
    )),
    "block_predict_encoder_parameters": Answer(stubs=('return 3152384',)),
    "block_predict_decoder_parameters": Answer(stubs=('return 4204032',)),
    "block_predict_feed_forward_share": Answer(stubs=('return 100 / 3  # about a third',)),
}
