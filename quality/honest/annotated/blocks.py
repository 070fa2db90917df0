"""Stage 3 with the Annotated Transformer's sublayer connection, adapted to the paper's post-LN order: one
helper `sublayer(x, fn, norm, dropout)` applies norm(x + dropout(fn(x))), and each block passes its sublayers
to it as lambdas. The pre-LN block uses the Annotated Transformer's own connection, which is pre-LN."""

from quality.honest import Answer

_SUBLAYER = '''
def sublayer(x, fn, norm, dropout):
    "A residual connection followed by a layer norm (post-LN, as in the paper): norm(x + dropout(fn(x)))."
    return norm(x + dropout(fn(x)))
'''

_PRE_NORM_SUBLAYER = '''
def prenorm_sublayer(x, fn, norm, dropout):
    "The Annotated Transformer's SublayerConnection as it wrote it: x + dropout(fn(norm(x)))."
    return x + dropout(fn(norm(x)))
'''

ANSWERS = {
    "block_feed_forward": Answer(fixes=(("return self.relu(self.fc2(self.fc1(x)))",
                                         "return self.fc2(self.fc1(x).relu())"),)),
    "block_encoder": Answer(helpers=_SUBLAYER, stubs=(
        """
        x = sublayer(x, lambda x: self.self_attn(x, x, x, mask), self.norm1, self.dropout)
        x = sublayer(x, self.feed_forward, self.norm2, self.dropout)
        """,
    )),
    "block_decoder": Answer(stubs=(
        """
        m = enc_out
        x = sublayer(x, lambda x: self.self_attn(x, x, x, dec_mask), self.norm1, self.dropout)
        x = sublayer(x, lambda x: self.cross_attn(x, m, m, enc_mask), self.norm2, self.dropout)
        x = sublayer(x, self.feed_forward, self.norm3, self.dropout)
        """,
    )),
    "block_pre_ln": Answer(helpers=_PRE_NORM_SUBLAYER, stubs=(
        """
        x = prenorm_sublayer(x, lambda x: self.self_attn(x, x, x, mask), self.norm1, self.dropout)
        x = prenorm_sublayer(x, self.feed_forward, self.norm2, self.dropout)
        """,
    )),
    "block_predict_encoder_parameters": Answer(stubs=(
        "return 4 * (512 * 512 + 512) + (2 * 512 * 2048 + 2048 + 512) + 4 * 512  # MHA + FFN + 2 LayerNorms",)),
    "block_predict_decoder_parameters": Answer(stubs=(
        "return 8 * (512 * 512 + 512) + (2 * 512 * 2048 + 2048 + 512) + 6 * 512  # 2 MHA + FFN + 3 LayerNorms",)),
    "block_predict_feed_forward_share": Answer(stubs=(
        "return 100 * 1_050_112 / 3_154_432  # FFN (d_ff 1024) over the whole decoder block",)),
}
