"""Stage 2 mistakes: scaled dot-product attention, the two masks and multi-head attention."""

import inspect

from quality.mistakes import Alternative, Mistake
from transformer_course.reference.attention import MultiHeadAttention

STAGE = "02_attention"

_SCORES = "scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (..., q_len, k_len)"
_FILL = "scores = scores.masked_fill(mask == 0, -1e9)  # exp(-1e9) underflows to exactly 0"
_SOFTMAX = "weights = torch.softmax(scores, dim=-1)  # normalise over the keys"
_MASK_AND_SOFTMAX = (
    "    if mask is not None:\n"
    "        " + _FILL + "\n"
    "    " + _SOFTMAX + "\n"
)
_SDPA = (
    "    " + _SCORES + "\n"
    + _MASK_AND_SOFTMAX
    + "    output = weights @ V  # (..., q_len, d_v)\n"
)
_PADDING = "mask = (token_ids != pad_idx).unsqueeze(1).unsqueeze(2)  # (batch, 1, 1, seq_len)"
_TRIANGLE = "allowed = torch.ones(size, size, dtype=torch.bool, device=device).tril()  # (size, size)"
_SPLIT_VIEW = "x = x.view(batch_size, seq_length, self.num_heads, self.d_k)  # (batch, seq_len, heads, d_k)"
_SPLIT_RETURN = "return x.transpose(1, 2)  # (batch, heads, seq_len, d_k)"
_SPLIT = (
    "        batch_size, seq_length, _ = x.shape\n"
    "        " + _SPLIT_VIEW + "\n"
    "        " + _SPLIT_RETURN + "\n"
)
_COMBINE_TRANSPOSE = "x = x.transpose(1, 2).contiguous()  # (batch, seq_len, heads, d_k)"
_COMBINE = (
    "        batch_size, _, seq_length, _ = x.shape\n"
    "        " + _COMBINE_TRANSPOSE + "\n"
    "        return x.view(batch_size, seq_length, self.d_model)\n"
)
_K_AND_V = (
    "K = self.split_heads(self.W_k(k))  # (batch, heads, k_len, d_k)\n"
    "        V = self.split_heads(self.W_v(v))  # (batch, heads, k_len, d_k)"
)
_ATTEND = "heads, weights = scaled_dot_product_attention(Q, K, V, mask)  # heads: (batch, heads, q_len, d_k)"
_OUTPUT = "output = self.W_o(self.combine_heads(heads))  # (batch, q_len, d_model)"


def _class_text(start: str, end: str) -> str:
    """The reference MultiHeadAttention's text from the line holding `start` to the one holding `end`."""
    text = inspect.getsource(MultiHeadAttention)
    first = text.rindex("\n", 0, text.index(start)) + 1
    last = text.index("\n", text.index(end))
    return text[first:last + 1]


_RENAMED_FROM = _class_text("self.W_q = nn.Linear", _OUTPUT)


def _inline_attention(scale: str) -> str:
    """MHA forward's attention step written inline instead of calling scaled_dot_product_attention."""
    return (
        f"scores = Q @ K.transpose(-2, -1) / math.sqrt({scale})  # (batch, heads, q_len, k_len)\n"
        "        if mask is not None:\n"
        "            scores = scores.masked_fill(mask == 0, -1e9)\n"
        "        weights = torch.softmax(scores, dim=-1)\n"
        "        heads = weights @ V  # (batch, heads, q_len, d_k)"
    )


MISTAKES: list[Mistake] = [
    Mistake(
        STAGE, "attention written inline, Annotated-Transformer style, adding a heads axis to the course's 4-D mask",
        "        heads, weights = scaled_dot_product_attention(Q, K, V, mask)  # heads: (batch, heads, q_len, d_k)\n",
        "        if mask is not None:\n"
        "            mask = mask.unsqueeze(1)  # the same mask for every head\n"
        "        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)\n"
        "        if mask is not None:\n"
        "            scores = scores.masked_fill(mask == 0, -1e9)\n"
        "        weights = scores.softmax(dim=-1)\n"
        "        heads = weights @ V\n",
        fails="attn_mha_output_shape", cause="broadcasting gives the result 1 axis too many",
    ),
    Mistake(
        STAGE, "keys transposed on the wrong axes (heads and positions)",
        _SCORES,
        "scores = Q @ K.transpose(1, 2) / math.sqrt(d_k)  # (..., q_len, k_len)",
        fails="attn_sdpa_shapes", cause="these would fit: `K.transpose(-2, -1)`",
    ),
    Mistake(
        STAGE, "weights transposed before the product with V",
        "    output = weights @ V  # (..., q_len, d_v)\n",
        "    output = weights.transpose(-2, -1) @ V  # (..., q_len, d_v)\n",
        fails="attn_sdpa_shapes", cause="`weights` itself",
    ),
    # --- scaled dot-product attention ---
    Mistake(
        STAGE, "scores not scaled by 1/sqrt(d_k)",
        _SCORES,
        "scores = Q @ K.transpose(-2, -1)  # (..., q_len, k_len)",
        fails="attn_sdpa_values", cause="not divided by √d_k",
    ),
    Mistake(
        STAGE, "scores divided by d_k instead of sqrt(d_k)",
        _SCORES,
        "scores = Q @ K.transpose(-2, -1) / d_k",
        fails="attn_sdpa_values", cause="divided by d_k",
    ),
    Mistake(
        STAGE, "scores scaled by the square root of the query length",
        _SCORES,
        "scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-2))",
        fails="attn_sdpa_values", cause="divided by √q_len",
    ),
    Mistake(
        STAGE, "softmax over the queries (dim=-2)",
        _SOFTMAX,
        "weights = torch.softmax(scores, dim=-2)",
        fails="attn_sdpa_values", cause="runs over the wrong axis, the queries",
    ),
    Mistake(
        STAGE, "softmax over a fixed front axis (dim=1, the heads)",
        _SOFTMAX,
        "weights = torch.softmax(scores, dim=1)",
        fails="attn_sdpa_values", cause="wrong axis",
    ),
    Mistake(
        STAGE, "softmax axis counted from the front (dim=3) breaks 3-D inputs",
        _SOFTMAX,
        "weights = torch.softmax(scores, dim=3)",
        fails="attn_sdpa_shapes", cause="count axes from the end",
    ),
    Mistake(
        STAGE, "mask inverted (hides the allowed keys)",
        _FILL,
        "scores = scores.masked_fill(mask, -1e9)",
        fails="attn_sdpa_masked_values", cause="the mask is inverted",
    ),
    Mistake(
        STAGE, "mask applied to the weights after the softmax",
        _MASK_AND_SOFTMAX,
        "    " + _SOFTMAX + "\n"
        "    if mask is not None:\n"
        "        weights = weights.masked_fill(mask == 0, 0.0)\n",
        fails="attn_sdpa_masked_values", cause="after the softmax",
    ),
    Mistake(
        STAGE, "hidden scores filled with 0 instead of a large negative number",
        _FILL,
        "scores = scores.masked_fill(mask == 0, 0)",
        fails="attn_sdpa_masked_values", cause="hidden scores are set to 0",
    ),
    Mistake(
        STAGE, "masked_fill result not assigned (mask silently ignored)",
        _FILL,
        "scores.masked_fill(mask == 0, -1e9)",
        fails="attn_sdpa_masked_values", cause="it is not assigned",
    ),
    Mistake(
        STAGE, "weak fill value lets hidden keys leak",
        _FILL,
        "scores = scores.masked_fill(mask == 0, -100.0)",
        fails="attn_sdpa_masked_zero", cause="very negative number",
    ),
    Mistake(
        STAGE, "output passed through tanh after the product with V",
        "    output = weights @ V  # (..., q_len, d_v)\n",
        "    output = torch.tanh(weights @ V)  # (..., q_len, d_v)\n",
        fails="attn_sdpa_values", cause="then applies a tanh to it: the reference stops there",
    ),
    Mistake(
        STAGE, "bitwise ~ on the mask: fine for bool, wrong for integer 0/1 masks",
        _FILL,
        "scores = scores.masked_fill(~mask, -1e9)",
        fails="attn_sdpa_integer_mask", cause="flips bits",
    ),
    # --- masks ---
    Mistake(
        STAGE, "padding mask inverted (True at padding)",
        _PADDING,
        "mask = (token_ids == pad_idx).unsqueeze(1).unsqueeze(2)",
        fails="attn_padding_mask_values", cause="the mask is inverted",
    ),
    Mistake(
        STAGE, "padding mask shaped to hide queries instead of keys",
        _PADDING,
        "mask = (token_ids != pad_idx).unsqueeze(1).unsqueeze(-1)  # (batch, 1, seq_len, 1)",
        fails="attn_padding_mask_shape", cause="hides padded queries",
    ),
    Mistake(
        STAGE, "padding mask compares with 0 instead of pad_idx",
        _PADDING,
        "mask = (token_ids != 0).unsqueeze(1).unsqueeze(2)",
        fails="attn_padding_mask_values", cause="uses 0 instead of pad_idx",
    ),
    Mistake(
        STAGE, "look-ahead mask hides the diagonal",
        _TRIANGLE,
        "allowed = torch.ones(size, size, dtype=torch.bool, device=device).tril(-1)",
        fails="attn_look_ahead_mask_values", cause="the diagonal is hidden",
    ),
    Mistake(
        STAGE, "look-ahead mask inverted (True on the future)",
        _TRIANGLE,
        "allowed = torch.ones(size, size, dtype=torch.bool, device=device).triu(1)",
        fails="attn_look_ahead_mask_values", cause="the mask is inverted",
    ),
    Mistake(
        STAGE, "look-ahead mask as the upper triangle (transposed)",
        _TRIANGLE,
        "allowed = torch.ones(size, size, dtype=torch.bool, device=device).triu()",
        fails="attn_look_ahead_mask_values", cause="the mask is transposed",
    ),
    Mistake(
        STAGE, "look-ahead mask made on the CPU whatever the device",
        _TRIANGLE,
        "allowed = torch.ones(size, size, dtype=torch.bool).tril()  # diagonal included",
        fails="attn_look_ahead_mask_values", cause="not made on the device it is asked for",
    ),
    Mistake(
        STAGE, "look-ahead mask built as floats",
        _TRIANGLE,
        "allowed = torch.ones(size, size, device=device).tril()",
        fails="attn_look_ahead_mask_values", cause="dtype=torch.bool",
    ),
    Mistake(
        STAGE, "look-ahead mask returned without its batch and heads axes",
        "mask = allowed.unsqueeze(0).unsqueeze(0)  # (1, 1, size, size)",
        "mask = allowed  # (size, size)",
        fails="attn_look_ahead_mask_values", cause="two leading axes",
    ),
    # --- multi-head attention ---
    Mistake(
        STAGE, "heads split with view straight to (batch, heads, seq_len, d_k), no transpose",
        _SPLIT_VIEW + "\n        " + _SPLIT_RETURN,
        "return x.view(batch_size, self.num_heads, seq_length, self.d_k)",
        fails="attn_split_heads_values", cause="without a transpose",
    ),
    Mistake(
        STAGE, "split_heads returns before the transpose",
        _SPLIT_RETURN,
        "return x  # (batch, seq_len, heads, d_k)",
        fails="attn_split_heads_shape", cause="transpose(1, 2) to bring the heads forward",
    ),
    Mistake(
        STAGE, "heads split interleaved: (batch, seq_len, d_k, heads)",
        _SPLIT_VIEW + "\n        " + _SPLIT_RETURN,
        "x = x.view(batch_size, seq_length, self.d_k, self.num_heads)\n"
        "        return x.permute(0, 3, 1, 2)",
        fails="attn_split_heads_values", cause="every num_heads-th feature",
    ),
    Mistake(
        STAGE, "heads combined without transposing back",
        _COMBINE_TRANSPOSE,
        "x = x.contiguous()",
        fails="attn_combine_heads_values", cause="without moving the heads' axis back",
    ),
    Mistake(
        STAGE, "combine_heads: view after transpose without contiguous()",
        _COMBINE_TRANSPOSE,
        "x = x.transpose(1, 2)",
        fails="attn_combine_heads_values", cause="contiguous()",
    ),
    Mistake(
        STAGE, "W_o skipped",
        _OUTPUT,
        "output = self.combine_heads(heads)",
        fails="attn_mha_values", cause="self.W_o is never called",
    ),
    Mistake(
        STAGE, "mask not passed to the attention",
        _ATTEND,
        "heads, weights = scaled_dot_product_attention(Q, K, V)",
        fails="attn_mha_values", cause="never uses the input `mask`",
    ),
    Mistake(
        STAGE, "mask given one more axis in forward (unsqueeze on the already 4-D mask)",
        _ATTEND,
        "mask = mask.unsqueeze(1) if mask is not None else None  # (batch, 1, seq_len) -> (batch, 1, 1, seq_len)?\n"
        "        " + _ATTEND,
        fails="attn_mha_values", cause="the extra axis comes from the unsqueeze in `forward`",
    ),
    Mistake(
        STAGE, "residual connection added inside multi-head attention",
        _OUTPUT,
        "output = self.W_o(self.combine_heads(heads)) + q  # (batch, q_len, d_model)",
        fails="attn_mha_values", cause="computes the output of self.W_o as the reference does, then applies a sum",
    ),
    Mistake(
        STAGE, "keys and values projected from the wrong inputs (swapped)",
        _K_AND_V,
        "K = self.split_heads(self.W_k(v))\n        V = self.split_heads(self.W_v(k))",
        fails="attn_mha_values", cause="self.W_k receives the input `v` where the reference gives it the input `k`",
    ),
    Mistake(
        STAGE, "keys and values projected from q (self-attention only)",
        _K_AND_V,
        "K = self.split_heads(self.W_k(q))\n        V = self.split_heads(self.W_v(q))",
        fails="attn_mha_values", cause="self.W_v receives the input `q` where the reference gives it the input `v`",
    ),
    Mistake(
        STAGE, "inline attention scaled by sqrt(d_model) instead of sqrt(d_k)",
        _ATTEND,
        _inline_attention("self.d_model"),
        fails="attn_mha_values", cause="√d_model used where √d_k belongs",
    ),
]

ALTERNATIVES: list[Alternative] = [
    Alternative(
        STAGE, "attention with torch.einsum and a -inf fill via masked_fill(~mask.bool())",
        _SDPA,
        '    scores = torch.einsum("...qd,...kd->...qk", Q, K) / d_k ** 0.5  # (..., q_len, k_len)\n'
        "    if mask is not None:\n"
        '        scores = scores.masked_fill(~mask.bool(), float("-inf"))\n'
        "    weights = scores.softmax(dim=-1)\n"
        '    output = torch.einsum("...qk,...kd->...qd", weights, V)  # (..., q_len, d_v)\n',
    ),
    Alternative(
        STAGE, "masking with torch.where and matmul/exp-normalised softmax",
        _SDPA,
        "    scores = torch.matmul(Q, K.transpose(-1, -2)) * (1.0 / math.sqrt(d_k))\n"
        "    if mask is not None:\n"
        "        scores = torch.where(mask.bool(), scores, torch.full_like(scores, -1e9))\n"
        "    scores = scores - scores.amax(dim=-1, keepdim=True)  # stable exponentials\n"
        "    exps = scores.exp()\n"
        "    weights = exps / exps.sum(dim=-1, keepdim=True)\n"
        "    output = torch.matmul(weights, V)\n",
    ),
    Alternative(
        STAGE, "padding mask with None indexing",
        _PADDING,
        "mask = (token_ids != pad_idx)[:, None, None, :]",
    ),
    Alternative(
        STAGE, "look-ahead mask from comparing position indices",
        _TRIANGLE,
        "rows = torch.arange(size, device=device)\n"
        "    allowed = rows.unsqueeze(1) >= rows.unsqueeze(0)  # key index <= query index",
    ),
    Alternative(
        STAGE, "split/combine heads with reshape + permute",
        _SPLIT,
        "        batch_size, seq_length, _ = x.shape\n"
        "        return x.reshape(batch_size, seq_length, self.num_heads, self.d_k).permute(0, 2, 1, 3)\n",
    ),
    Alternative(
        STAGE, "combine heads with permute + flatten",
        _COMBINE,
        "        return x.permute(0, 2, 1, 3).flatten(start_dim=2)  # (batch, seq_len, heads * d_k)\n",
    ),
    Alternative(
        STAGE, "split heads with unflatten + transpose",
        _SPLIT,
        "        return x.unflatten(-1, (self.num_heads, self.d_k)).transpose(1, 2)\n",
    ),
    Alternative(
        STAGE, "attention with a -inf mask through torch.where",
        _MASK_AND_SOFTMAX,
        "    if mask is not None:\n"
        '        scores = torch.where(mask == 0, torch.full_like(scores, float("-inf")), scores)\n'
        "    " + _SOFTMAX + "\n",
    ),
    Alternative(
        STAGE, "attention computed one batch element at a time (batch-first loop)",
        _SDPA,
        "    outputs, all_weights = [], []\n"
        "    for b in range(Q.size(0)):\n"
        "        scores = Q[b] @ K[b].transpose(-2, -1) / math.sqrt(d_k)  # (..., q_len, k_len)\n"
        "        if mask is not None:\n"
        "            example_mask = mask[b] if mask.size(0) > 1 else mask[0]\n"
        "            scores = scores.masked_fill(example_mask == 0, -1e9)\n"
        "        all_weights.append(torch.softmax(scores, dim=-1))\n"
        "        outputs.append(all_weights[-1] @ V[b])\n"
        "    weights, output = torch.stack(all_weights), torch.stack(outputs)\n",
    ),
    Alternative(
        STAGE, "padding mask returned as int32 0/1",
        _PADDING,
        "mask = (token_ids != pad_idx).int().unsqueeze(1).unsqueeze(2)  # 1 = real token, 0 = padding",
    ),
    Alternative(
        STAGE, "look-ahead mask as an int32 lower triangle from torch.tril",
        _TRIANGLE,
        "allowed = torch.tril(torch.ones(size, size, dtype=torch.int32, device=device))  # 1 = may attend",
    ),
    Alternative(
        STAGE, "linear layers with other names (query, key, value, out), as in many public implementations",
        _RENAMED_FROM, _RENAMED_FROM.replace("self.W_q", "self.query").replace("self.W_k", "self.key")
        .replace("self.W_v", "self.value").replace("self.W_o", "self.out"),
    ),
    Alternative(
        STAGE, "forward looping over the heads, one 3-D attention call per head",
        _ATTEND,
        "per_head = [scaled_dot_product_attention(Q[:, h], K[:, h], V[:, h],\n"
        "                                                 None if mask is None else mask[:, 0])\n"
        "                    for h in range(self.num_heads)]  # each (batch, q_len, d_k), (batch, q_len, k_len)\n"
        "        heads = torch.stack([output for output, _ in per_head], dim=1)  # (batch, heads, q_len, d_k)\n"
        "        weights = torch.stack([weights for _, weights in per_head], dim=1)",
    ),
    Alternative(
        STAGE, "combine heads by concatenating the heads along the features",
        _COMBINE,
        "        return torch.cat(x.unbind(dim=1), dim=-1)  # heads side by side: (batch, seq_len, d_model)\n",
    ),
    Alternative(
        STAGE, "attention written inline in forward with sqrt(d_k)",
        _ATTEND,
        _inline_attention("self.d_k"),
    ),
]
