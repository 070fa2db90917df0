"""Stage 2 as d2l.ai writes it: `torch.bmm` over (batch * heads) matrices, so the leading axes are folded into
one and unfolded afterwards; masks applied with `torch.where(mask, scores, -inf)` and `F.softmax`; heads split
with reshape/permute, and `forward` folds the heads into the batch axis as d2l's `transpose_qkv` does (the
mask broadcast to every head first)."""

from quality.honest import Answer

ANSWERS = {
    "attention_function": Answer(
        helpers="""
        import torch.nn.functional as F
        """,
        stubs=(
            """
            *leading, q_len, _ = Q.shape
            k_len, d_v = K.shape[-2], V.shape[-1]
            queries, keys, values = Q.reshape(-1, q_len, d_k), K.reshape(-1, k_len, d_k), V.reshape(-1, k_len, d_v)
            scores = torch.bmm(queries, keys.permute(0, 2, 1)).reshape(*leading, q_len, k_len) / math.sqrt(d_k)
            if mask is not None:
                scores = torch.where(mask.bool(), scores, float("-inf"))  # hidden keys: exp(-inf) = 0
            weights = F.softmax(scores, dim=-1)
            output = torch.bmm(weights.reshape(-1, q_len, k_len), values).reshape(*leading, q_len, d_v)
            """,
        ),
    ),
    "padding_mask": Answer(stubs=(
        """
        mask = (token_ids != pad_idx).reshape(token_ids.shape[0], 1, 1, token_ids.shape[1])
        """,
    )),
    "look_ahead_mask": Answer(fixes=(("torch.ones(size, size, dtype=torch.bool, device=device).triu()",
                                      "torch.tril(torch.ones(size, size, dtype=torch.bool, device=device))"),)),
    "multi_head_attention": Answer(stubs=(
        """
        batch_size, num_steps, _ = x.shape
        return x.reshape(batch_size, num_steps, self.num_heads, -1).permute(0, 2, 1, 3)
        """,
        """
        batch_size, _, num_steps, _ = x.shape
        return x.permute(0, 2, 1, 3).reshape(batch_size, num_steps, -1)
        """,
        """
        batch_size, q_len, k_len = q.shape[0], q.shape[1], k.shape[1]
        # like d2l's transpose_qkv: (batch, heads, steps, d_k) -> (batch * heads, steps, d_k)
        queries = self.split_heads(self.W_q(q)).reshape(batch_size * self.num_heads, q_len, self.d_k)
        keys = self.split_heads(self.W_k(k)).reshape(batch_size * self.num_heads, k_len, self.d_k)
        values = self.split_heads(self.W_v(v)).reshape(batch_size * self.num_heads, k_len, self.d_k)
        if mask is not None:  # the same mask for every head
            mask = mask.expand(batch_size, self.num_heads, q_len, k_len).reshape(-1, q_len, k_len)
        heads, weights = scaled_dot_product_attention(queries, keys, values, mask)
        heads = heads.reshape(batch_size, self.num_heads, q_len, self.d_k)
        weights = weights.reshape(batch_size, self.num_heads, q_len, k_len)
        output = self.W_o(self.combine_heads(heads))
        """,
    )),
    "attn_predict_score_std": Answer(stubs=('return 6.0',)),
    "attn_predict_parameters": Answer(stubs=('return 4_198_400',)),
    "attn_predict_visible_pairs": Answer(stubs=('return 15',)),
}
