"""Stage 3 mistakes: the feed-forward network, the post-LN encoder and decoder blocks, and the pre-LN encoder
block."""

from quality.mistakes import Alternative, Mistake

STAGE = "03_blocks"

_FFN = "return self.fc2(self.relu(self.fc1(x)))  # (batch, seq_len, d_ff) inside"
_ENC_ATTN = "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))"
_ENC_FFN = "x = self.norm2(x + self.dropout(self.feed_forward(x)))"
_ENCODER = _ENC_ATTN + "\n        " + _ENC_FFN
_DEC_SELF = "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, dec_mask)))"
_DEC_CROSS = "x = self.norm2(x + self.dropout(self.cross_attn(x, enc_out, enc_out, enc_mask)))"
_DEC_FFN = "x = self.norm3(x + self.dropout(self.feed_forward(x)))"
_DECODER = _DEC_SELF + "\n        " + _DEC_CROSS + "\n        " + _DEC_FFN
_ENC_FORWARD = ("    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:\n"
                "        ### BEGIN SOLUTION\n")
_ENC_PARTS = ("        self.norm1 = nn.LayerNorm(d_model)\n        self.norm2 = nn.LayerNorm(d_model)\n"
              "        self.dropout = nn.Dropout(dropout)\n\n" + _ENC_FORWARD + "        " + _ENCODER)
_PRE_NORM = "normed = self.norm1(x)  # (batch, src_len, d_model): what self-attention reads"
_PRE_ATTN = "x = x + self.dropout(self.self_attn(normed, normed, normed, mask))"
_PRE_FFN = "x = x + self.dropout(self.feed_forward(self.norm2(x)))"
_PRE_LN = _PRE_NORM + "\n        " + _PRE_ATTN + "\n        " + _PRE_FFN
_PRE_PARTS = ("        self.norm1 = nn.LayerNorm(d_model)\n        self.norm2 = nn.LayerNorm(d_model)\n"
              "        self.dropout = nn.Dropout(dropout)\n\n" + _ENC_FORWARD + "        " + _PRE_LN)

MISTAKES: list[Mistake] = [
    # --- PositionWiseFeedForward ---
    Mistake(
        STAGE, "encoder block adds the attention's output in place (x += ...), then normalises",
        "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))",
        "x += self.dropout(self.self_attn(x, x, x, mask))\n        x = self.norm1(x)",
        fails="block_enc_shape", cause="an in-place operation",
    ),
    Mistake(
        STAGE, "pre-LN block adds the attention's output to the stream in place (x += ...)",
        "x = x + self.dropout(self.self_attn(normed, normed, normed, mask))",
        "x += self.dropout(self.self_attn(normed, normed, normed, mask))",
        fails="block_pre_ln_shape", cause="an in-place operation",
    ),
    Mistake(
        STAGE, "feed-forward without the ReLU",
        _FFN,
        "return self.fc2(self.fc1(x))",
        fails="block_ffn_values", cause="there is no ReLU",
    ),
    Mistake(
        STAGE, "feed-forward with a second ReLU after fc2",
        _FFN,
        "return self.relu(self.fc2(self.relu(self.fc1(x))))",
        fails="block_ffn_values", cause="the output goes through the ReLU as well",
    ),
    Mistake(
        STAGE, "feed-forward with the ReLU after fc2 instead of between the layers",
        _FFN,
        "return self.relu(self.fc2(self.fc1(x)))",
        fails="block_ffn_values", cause="the ReLU is applied after self.fc2 instead of between the two layers",
    ),
    Mistake(
        STAGE, "feed-forward with GELU instead of ReLU",
        _FFN,
        "return self.fc2(F.gelu(self.fc1(x)))",
        fails="block_ffn_values", cause="the hidden layer goes through GELU where the paper applies the ReLU",
    ),
    Mistake(
        STAGE, "feed-forward returns the hidden layer (fc2 never applied)",
        _FFN,
        "return self.relu(self.fc1(x))",
        fails="block_ffn_values", cause="fc2",
    ),
    # --- EncoderBlock ---
    Mistake(
        STAGE, "encoder: no residual around self-attention",
        _ENC_ATTN,
        "x = self.norm1(self.dropout(self.self_attn(x, x, x, mask)))",
        fails="block_enc_values", cause="the residual connection around self.self_attn is missing",
    ),
    Mistake(
        STAGE, "encoder: no residual around the feed-forward network",
        _ENC_FFN,
        "x = self.norm2(self.dropout(self.feed_forward(x)))",
        fails="block_enc_values", cause="the residual connection around self.feed_forward is missing",
    ),
    Mistake(
        STAGE, "encoder: pre-LN instead of post-LN",
        _ENCODER,
        "h = self.norm1(x)\n"
        "        x = x + self.dropout(self.self_attn(h, h, h, mask))\n"
        "        x = x + self.dropout(self.feed_forward(self.norm2(x)))",
        fails="block_enc_values", cause="pre-LN",
    ),
    Mistake(
        STAGE, "encoder: one LayerNorm (norm1) shared by both sublayers",
        _ENC_FFN,
        "x = self.norm1(x + self.dropout(self.feed_forward(x)))",
        fails="block_enc_values", cause="self.norm2 is never called; self.norm1 is called twice",
    ),
    Mistake(
        STAGE, "encoder: LayerNorm on the sublayer output only",
        _ENCODER,
        "x = x + self.norm1(self.dropout(self.self_attn(x, x, x, mask)))\n"
        "        x = x + self.norm2(self.dropout(self.feed_forward(x)))",
        fails="block_enc_values", cause="applied to the sublayer output only",
    ),
    Mistake(
        STAGE, "encoder: padding mask not passed to self-attention",
        _ENC_ATTN,
        "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, None)))",
        fails="block_enc_values", cause="self.self_attn receives None as its mask",
    ),
    Mistake(
        STAGE, "encoder: feed-forward before self-attention",
        _ENCODER,
        "x = self.norm1(x + self.dropout(self.feed_forward(x)))\n"
        "        x = self.norm2(x + self.dropout(self.self_attn(x, x, x, mask)))",
        fails="block_enc_values", cause="self.self_attn and self.feed_forward are swapped",
    ),
    Mistake(
        STAGE, "encoder: functional dropout that stays on in eval mode",
        _ENC_FFN,
        "x = self.norm2(x + F.dropout(self.feed_forward(x), 0.1))",
        fails="block_enc_values", cause="F.dropout(..., training=True)",
    ),
    Mistake(
        STAGE, "encoder: no dropout on either sublayer",
        _ENCODER,
        "x = self.norm1(x + self.self_attn(x, x, x, mask))\n"
        "        x = self.norm2(x + self.feed_forward(x))",
        fails="block_enc_dropout",
        cause="the output of self.self_attn is not dropped out; the output of self.feed_forward is not dropped out",
    ),
    Mistake(
        STAGE, "encoder: dropout missing on the self-attention output",
        _ENC_ATTN,
        "x = self.norm1(x + self.self_attn(x, x, x, mask))",
        fails="block_enc_dropout_place", cause="the output of self.self_attn is not dropped out",
    ),
    Mistake(
        STAGE, "encoder: dropout after the LayerNorm",
        _ENCODER,
        "x = self.dropout(self.norm1(x + self.self_attn(x, x, x, mask)))\n"
        "        x = self.dropout(self.norm2(x + self.feed_forward(x)))",
        fails="block_enc_dropout_place", cause="dropout is applied to the output of self.norm1, after the LayerNorm",
    ),
    # --- DecoderBlock ---
    Mistake(
        STAGE, "decoder: cross-attention takes keys and values from the decoder",
        _DEC_CROSS,
        "x = self.norm2(x + self.dropout(self.cross_attn(x, x, x, enc_mask)))",
        fails="block_dec_shape", cause="self.cross_attn receives the output of self.norm1 as its keys and values",
    ),
    Mistake(
        STAGE, "decoder: cross-attention takes its query from the encoder",
        _DEC_CROSS,
        "x = self.norm2(x + self.dropout(self.cross_attn(enc_out, x, x, enc_mask)))",
        fails="block_dec_shape", cause="self.cross_attn receives `enc_out` as its query",
    ),
    Mistake(
        STAGE, "decoder: self-attention uses the source mask",
        _DEC_SELF,
        "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, enc_mask)))",
        fails="block_dec_shape",
        cause="self.self_attn receives `enc_mask` as its mask where the reference gives it `dec_mask`",
    ),
    Mistake(
        STAGE, "decoder: cross-attention uses the target mask",
        _DEC_CROSS,
        "x = self.norm2(x + self.dropout(self.cross_attn(x, enc_out, enc_out, dec_mask)))",
        fails="block_dec_shape",
        cause="self.cross_attn receives `dec_mask` as its mask where the reference gives it `enc_mask`",
    ),
    Mistake(
        STAGE, "decoder: self-attention without the look-ahead mask",
        _DEC_SELF,
        "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, None)))",
        fails="block_dec_values",
        cause="self.self_attn receives None as its mask where the reference gives it `dec_mask`",
    ),
    Mistake(
        STAGE, "decoder: cross-attention reuses the self-attention module",
        _DEC_CROSS,
        "x = self.norm2(x + self.dropout(self.self_attn(x, enc_out, enc_out, enc_mask)))",
        fails="block_dec_values", cause="self.cross_attn is never called; self.self_attn is called twice",
    ),
    Mistake(
        STAGE, "decoder: cross-attention before masked self-attention",
        _DEC_SELF + "\n        " + _DEC_CROSS,
        "x = self.norm1(x + self.dropout(self.cross_attn(x, enc_out, enc_out, enc_mask)))\n"
        "        x = self.norm2(x + self.dropout(self.self_attn(x, x, x, dec_mask)))",
        fails="block_dec_values", cause="self.self_attn and self.cross_attn are swapped",
    ),
    Mistake(
        STAGE, "decoder: no residual around self-attention",
        _DEC_SELF,
        "x = self.norm1(self.dropout(self.self_attn(x, x, x, dec_mask)))",
        fails="block_dec_values", cause="the residual connection around self.self_attn is missing",
    ),
    Mistake(
        STAGE, "decoder: no residual around cross-attention",
        _DEC_CROSS,
        "x = self.norm2(self.dropout(self.cross_attn(x, enc_out, enc_out, enc_mask)))",
        fails="block_dec_values", cause="the residual connection around self.cross_attn is missing",
    ),
    Mistake(
        STAGE, "decoder: pre-LN instead of post-LN",
        _DECODER,
        "h = self.norm1(x)\n"
        "        x = x + self.dropout(self.self_attn(h, h, h, dec_mask))\n"
        "        x = x + self.dropout(self.cross_attn(self.norm2(x), enc_out, enc_out, enc_mask))\n"
        "        x = x + self.dropout(self.feed_forward(self.norm3(x)))",
        fails="block_dec_values", cause="pre-LN",
    ),
    Mistake(
        STAGE, "decoder: one LayerNorm (norm1) for all three sublayers",
        _DECODER,
        "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, dec_mask)))\n"
        "        x = self.norm1(x + self.dropout(self.cross_attn(x, enc_out, enc_out, enc_mask)))\n"
        "        x = self.norm1(x + self.dropout(self.feed_forward(x)))",
        fails="block_dec_values", cause="self.norm1 is called 3 times",
    ),
    Mistake(
        STAGE, "decoder: dropout missing on the cross-attention output",
        _DEC_CROSS,
        "x = self.norm2(x + self.cross_attn(x, enc_out, enc_out, enc_mask))",
        fails="block_dec_dropout_place", cause="the output of self.cross_attn is not dropped out",
    ),
    # --- issue 20: the residual that skips the attention sublayer, and pre-LN with a part the paper has not ---
    Mistake(
        STAGE, "encoder: the second residual adds the block input, skipping the attention sublayer",
        _ENCODER,
        "h = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))\n"
        "        x = self.norm2(x + self.dropout(self.feed_forward(h)))",
        fails="block_enc_values", cause="self.norm2 receives the block's input x + the output of self.feed_forward",
    ),
    Mistake(
        STAGE, "encoder: pre-LN with a final LayerNorm added to the constructor",
        _ENC_PARTS,
        "        self.norm1 = nn.LayerNorm(d_model)\n        self.norm2 = nn.LayerNorm(d_model)\n"
        "        self.final_norm = nn.LayerNorm(d_model)\n        self.dropout = nn.Dropout(dropout)\n\n"
        + _ENC_FORWARD + "        h = self.norm1(x)\n"
        "        x = x + self.dropout(self.self_attn(h, h, h, mask))\n"
        "        x = x + self.dropout(self.feed_forward(self.norm2(x)))\n"
        "        x = self.final_norm(x)",
        fails="block_enc_values", cause="this is the pre-LN order",
    ),
    # --- PreLNEncoderBlock (issue 38: the pre-LN block written from its properties) ---
    Mistake(
        STAGE, "pre-LN block written in the paper's post-LN arrangement",
        _PRE_LN,
        "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))\n"
        "        x = self.norm2(x + self.dropout(self.feed_forward(x)))",
        fails="block_pre_ln_stream", cause="that is the paper's post-LN arrangement",
    ),
    Mistake(
        STAGE, "pre-LN block that normalises its output at the end (a final LayerNorm inside the block)",
        _PRE_FFN,
        _PRE_FFN + "\n        x = self.norm2(x)",
        fails="block_pre_ln_stream", cause="self.norm2 is called twice",
    ),
    Mistake(
        STAGE, "pre-LN block whose stream continues from the normalised copy",
        _PRE_LN,
        "x = self.norm1(x)\n"
        "        x = x + self.dropout(self.self_attn(x, x, x, mask))\n"
        "        " + _PRE_FFN,
        fails="block_pre_ln_stream",
        cause="self.norm2 receives the output of self.norm1 + the output of self.self_attn as its input",
    ),
    Mistake(
        STAGE, "pre-LN block with one LayerNorm (norm1) for both sublayers",
        _PRE_FFN,
        "x = x + self.dropout(self.feed_forward(self.norm1(x)))",
        fails="block_pre_ln_torch", cause="self.norm2 is never called",
    ),
    Mistake(
        STAGE, "pre-LN block whose self-attention normalises only its queries",
        _PRE_ATTN,
        "x = x + self.dropout(self.self_attn(normed, x, x, mask))",
        fails="block_pre_ln_torch", cause="as its keys and values where the pre-LN block gives it the output of",
    ),
    Mistake(
        STAGE, "pre-LN block whose feed-forward network reads the normalised block input",
        _PRE_FFN,
        "x = x + self.dropout(self.feed_forward(normed))",
        fails="block_pre_ln_torch", cause="self.norm2 is never called",
    ),
    Mistake(
        STAGE, "pre-LN block without dropout on the feed-forward output",
        _PRE_FFN,
        "x = x + self.feed_forward(self.norm2(x))",
        fails="block_pre_ln_dropout_place", cause="the output of self.feed_forward is not dropped out",
    ),
    Mistake(
        STAGE, "pre-LN block that leaves x as it was (results kept in another variable)",
        _PRE_LN,
        "stream = x + self.dropout(self.self_attn(self.norm1(x), self.norm1(x), self.norm1(x), mask))\n"
        "        stream = stream + self.dropout(self.feed_forward(self.norm2(stream)))",
        fails="block_pre_ln_shape", cause="returned its input x unchanged",
    ),
]

ALTERNATIVES: list[Alternative] = [
    Alternative(
        STAGE, "feed-forward with clamp(min=0) as the ReLU",
        _FFN,
        "hidden = self.fc1(x).clamp(min=0)  # (batch, seq_len, d_ff)\n"
        "        return self.fc2(hidden)",
    ),
    Alternative(
        STAGE, "decoder sublayers in a loop over (sublayer, norm) pairs",
        _DECODER,
        "sublayers = (\n"
        "            (lambda t: self.self_attn(t, t, t, dec_mask), self.norm1),\n"
        "            (lambda t: self.cross_attn(t, enc_out, enc_out, enc_mask), self.norm2),\n"
        "            (self.feed_forward, self.norm3),\n"
        "        )\n"
        "        for sublayer, norm in sublayers:\n"
        "            x = norm(x + self.dropout(sublayer(x)))",
    ),
    Alternative(
        STAGE, "feed-forward as one nn.Sequential with its own names (no weights are copied by name)",
        "        self.fc1 = nn.Linear(d_model, d_ff)\n"
        "        self.fc2 = nn.Linear(d_ff, d_model)\n"
        "        self.relu = nn.ReLU()\n"
        "\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        ### BEGIN SOLUTION\n"
        "        " + _FFN,
        "        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))\n"
        "\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        ### BEGIN SOLUTION\n"
        "        return self.net(x)",
    ),
    Alternative(
        STAGE, "feed-forward with torch.relu instead of the ReLU module",
        _FFN,
        "return self.fc2(torch.relu(self.fc1(x)))",
    ),
    Alternative(
        STAGE, "encoder block written step by step, the residual added before the LayerNorm call",
        _ENCODER,
        "attended = self.self_attn(x, x, x, mask)  # (batch, src_len, d_model)\n"
        "        x = x + self.dropout(attended)\n"
        "        x = self.norm1(x)\n"
        "        x = self.norm2(x + self.dropout(self.feed_forward(x)))",
    ),
    Alternative(
        STAGE, "encoder block with functional dropout that follows the module's mode",
        _ENCODER,
        "x = self.norm1(x + F.dropout(self.self_attn(x, x, x, mask), self.dropout.p, self.training))\n"
        "        x = self.norm2(x + F.dropout(self.feed_forward(x), self.dropout.p, self.training))",
    ),
    Alternative(
        STAGE, "decoder block calling attention with keyword arguments",
        _DECODER,
        "x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask=dec_mask)))\n"
        "        x = self.norm2(x + self.dropout(self.cross_attn(q=x, k=enc_out, v=enc_out, mask=enc_mask)))\n"
        "        x = self.norm3(x + self.dropout(self.feed_forward(x)))",
    ),
    Alternative(
        STAGE, "encoder block whose LayerNorms and dropouts have other names (one dropout module per sublayer)",
        _ENC_PARTS,
        "        self.ln_attention = nn.LayerNorm(d_model)\n        self.ln_feed_forward = nn.LayerNorm(d_model)\n"
        "        self.drop_attention = nn.Dropout(dropout)\n        self.drop_feed_forward = nn.Dropout(dropout)\n\n"
        + _ENC_FORWARD + "        x = self.ln_attention(x + self.drop_attention(self.self_attn(x, x, x, mask)))\n"
        "        x = self.ln_feed_forward(x + self.drop_feed_forward(self.feed_forward(x)))",
    ),
    Alternative(
        STAGE, "encoder block in the Annotated Transformer's layout: each LayerNorm and dropout inside a wrapper",
        _ENC_PARTS,
        "        class SublayerConnection(nn.Module):  # LayerNorm(x + Dropout(sublayer(x))) around any sublayer\n"
        "            def __init__(self) -> None:\n"
        "                super().__init__()\n"
        "                self.norm = nn.LayerNorm(d_model)\n"
        "                self.dropout = nn.Dropout(dropout)\n\n"
        "            def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:\n"
        "                return self.norm(x + self.dropout(sublayer(x)))\n\n"
        "        self.sublayer = nn.ModuleList([SublayerConnection() for _ in range(2)])\n\n"
        + _ENC_FORWARD + "        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))\n"
        "        x = self.sublayer[1](x, self.feed_forward)",
    ),
    Alternative(
        STAGE, "encoder block with hand-written layer normalisations (a gain a_2 and a bias b_2 each)",
        _ENC_PARTS,
        "        class LayerNorm(nn.Module):\n"
        "            def __init__(self, features: int, eps: float = 1e-5) -> None:\n"
        "                super().__init__()\n"
        "                self.a_2, self.b_2 = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features))\n"
        "                self.eps = eps\n\n"
        "            def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "                mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)\n"
        "                return self.a_2 * (x - mean) / torch.sqrt(var + self.eps) + self.b_2\n\n"
        "        self.norm1, self.norm2 = LayerNorm(d_model), LayerNorm(d_model)\n"
        "        self.dropout = nn.Dropout(dropout)\n\n" + _ENC_FORWARD + "        " + _ENCODER,
    ),
    Alternative(
        STAGE, "pre-LN block in the Annotated Transformer's own layout: LayerNorm and dropout inside a wrapper",
        _PRE_PARTS,
        "        class SublayerConnection(nn.Module):  # x + Dropout(sublayer(LayerNorm(x))), as the Annotated "
        "Transformer writes it\n"
        "            def __init__(self) -> None:\n"
        "                super().__init__()\n"
        "                self.norm = nn.LayerNorm(d_model)\n"
        "                self.dropout = nn.Dropout(dropout)\n\n"
        "            def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:\n"
        "                return x + self.dropout(sublayer(self.norm(x)))\n\n"
        "        self.sublayer = nn.ModuleList([SublayerConnection() for _ in range(2)])\n\n"
        + _ENC_FORWARD + "        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))\n"
        "        x = self.sublayer[1](x, self.feed_forward)",
    ),
    Alternative(
        STAGE, "pre-LN block with hand-written layer normalisations",
        _PRE_PARTS,
        "        class LayerNorm(nn.Module):\n"
        "            def __init__(self, features: int, eps: float = 1e-5) -> None:\n"
        "                super().__init__()\n"
        "                self.gain = nn.Parameter(torch.ones(features))\n"
        "                self.bias = nn.Parameter(torch.zeros(features))\n"
        "                self.eps = eps\n\n"
        "            def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "                centred = x - x.mean(-1, keepdim=True)\n"
        "                return self.gain * centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps) "
        "+ self.bias\n\n"
        "        self.norm1, self.norm2 = LayerNorm(d_model), LayerNorm(d_model)\n"
        "        self.dropout = nn.Dropout(dropout)\n\n" + _ENC_FORWARD + "        " + _PRE_LN,
    ),
    Alternative(
        STAGE, "pre-LN block with F.layer_norm on the LayerNorms' own parameters and functional dropout",
        _PRE_LN,
        "d_model = x.size(-1)\n"
        "        h = F.layer_norm(x, (d_model,), self.norm1.weight, self.norm1.bias, self.norm1.eps)\n"
        "        x = x + F.dropout(self.self_attn(h, h, h, mask), self.dropout.p, self.training)\n"
        "        h = F.layer_norm(x, (d_model,), self.norm2.weight, self.norm2.bias, self.norm2.eps)\n"
        "        x = x + F.dropout(self.feed_forward(h), self.dropout.p, self.training)",
    ),
]

# --- held out ---------------------------------------------------------------------------------------------
# Realistic mistakes written before the checks were reworked for issue 10 and never tuned to: they
# measure how the checks do on bugs nobody catalogued (`scripts/measure_held_out.py`). `cause` lists
# phrases, separated by " | ", any of which in a failing cell's message names the cause; `fails` is the
# cell that should catch it. They are not part of `catalog()`, so tests/test_mistakes.py does not pin them.

HELD_OUT: list[Mistake] = [
    Mistake(
        STAGE, "feed-forward with functional dropout between the layers (stays on in eval mode)",
        _FFN,
        "return self.fc2(F.dropout(self.relu(self.fc1(x)), 0.1))",
        fails="block_ffn_values", cause="dropout",
    ),
    Mistake(
        STAGE, "feed-forward applies fc2 before fc1",
        _FFN,
        "return self.fc1(self.relu(self.fc2(x)))",
        fails="block_ffn_values", cause="before fc1 | fc1 first | widens",
    ),
    Mistake(
        STAGE, "encoder: feed-forward fed the block input instead of the first sublayer's output",
        _ENCODER,
        "h = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))\n"
        "        x = self.norm2(h + self.dropout(self.feed_forward(x)))",
        fails="block_enc_values", cause="norm1's output | output of norm1 | norm1 output",
    ),
    Mistake(
        STAGE, "encoder: norm1 applied to x alone, attention added after it",
        _ENC_ATTN,
        "x = self.norm1(x) + self.dropout(self.self_attn(x, x, x, mask))",
        fails="block_enc_values", cause="norm1's input | input of norm1 | norm1 gets | norm1 got | normalise the sum",
    ),
    Mistake(
        STAGE, "encoder: result kept in other variables, the given `return x` returns the input",
        _ENCODER,
        "h = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))\n"
        "        out = self.norm2(h + self.dropout(self.feed_forward(h)))",
        fails="block_enc_values", cause="returns its input | input unchanged | returned unchanged | its own input",
    ),
    Mistake(
        STAGE, "encoder: dropout on the residual x instead of the sublayer output",
        _ENC_ATTN,
        "x = self.norm1(self.dropout(x) + self.self_attn(x, x, x, mask))",
        fails="block_enc_dropout_place", cause="dropped out x | dropout on x | residual path | on the residual",
    ),
    Mistake(
        STAGE, "decoder: norm2 and norm3 swapped",
        _DEC_CROSS + "\n        " + _DEC_FFN,
        "x = self.norm3(x + self.dropout(self.cross_attn(x, enc_out, enc_out, enc_mask)))\n"
        "        x = self.norm2(x + self.dropout(self.feed_forward(x)))",
        fails="block_dec_values", cause="norm2 and norm3 | norm3 and norm2",
    ),
    Mistake(
        STAGE, "decoder: cross-attention values taken from the decoder",
        _DEC_CROSS,
        "x = self.norm2(x + self.dropout(self.cross_attn(x, enc_out, x, enc_mask)))",
        fails="block_dec_shape", cause="values",
    ),
    Mistake(
        STAGE, "decoder: cross-attention query is the block input, not the first sublayer's output",
        _DECODER,
        "h = self.norm1(x + self.dropout(self.self_attn(x, x, x, dec_mask)))\n"
        "        h = self.norm2(h + self.dropout(self.cross_attn(x, enc_out, enc_out, enc_mask)))\n"
        "        x = self.norm3(h + self.dropout(self.feed_forward(h)))",
        fails="block_dec_values", cause="query | norm1's output | output of norm1",
    ),
    Mistake(
        STAGE, "decoder: dropout applied twice to the self-attention output",
        _DEC_SELF,
        "x = self.norm1(x + self.dropout(self.dropout(self.self_attn(x, x, x, dec_mask))))",
        fails="block_dec_dropout_place", cause="twice | 2 times | two times | exactly once",
    ),
]
