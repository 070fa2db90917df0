"""Stage 2 in the Annotated Transformer's shape: a module-level attention helper (einsum for the two products)
that `scaled_dot_product_attention` and `MultiHeadAttention.forward` both use; the masks built with
triu/unsqueeze as its `subsequent_mask`; the projections applied in one comprehension over zip.

The helper is the Annotated Transformer's `attention()`, renamed `compute_attention`: the notebook's given cell
"Looking at the heads" binds the global name `attention` to a MultiHeadAttention, so a helper of that name is
replaced there and the cells after it crash (a student who runs the notebook to its end renames it)."""

from quality.honest import Answer

ANSWERS = {
    "attention_function": Answer(
        helpers='''
        def compute_attention(query, key, value, mask=None):
            "Compute 'Scaled Dot Product Attention' over the last two axes; returns (output, probabilities)."
            d_k = query.size(-1)
            scores = torch.einsum("...qd,...kd->...qk", query, key) / math.sqrt(d_k)
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            p_attn = scores.softmax(dim=-1)
            return torch.einsum("...qk,...kd->...qd", p_attn, value), p_attn
        ''',
        stubs=(
            """
            output, weights = compute_attention(Q, K, V, mask=mask)
            """,
        ),
    ),
    "padding_mask": Answer(stubs=(
        """
        mask = (token_ids != pad_idx).unsqueeze(-2).unsqueeze(-2)  # (batch, 1, 1, seq_len)
        """,
    )),
    "look_ahead_mask": Answer(fixes=((".triu()", ".tril()"),)),
    "multi_head_attention": Answer(stubs=(
        """
        nbatches = x.size(0)
        return x.view(nbatches, -1, self.num_heads, self.d_k).transpose(1, 2)
        """,
        """
        nbatches = x.size(0)
        return x.transpose(1, 2).contiguous().view(nbatches, -1, self.num_heads * self.d_k)
        """,
        """
        # 1) Do all the linear projections in batch from d_model => h x d_k
        query, key, value = [self.split_heads(lin(x)) for lin, x in zip((self.W_q, self.W_k, self.W_v), (q, k, v))]
        # 2) Apply attention on all the projected vectors in batch.
        x, weights = compute_attention(query, key, value, mask=mask)
        # 3) "Concat" using a view and apply a final linear.
        output = self.W_o(self.combine_heads(x))
        """,
    )),
    "attn_predict_score_std": Answer(stubs=('return (64 * 9.0 * 4.0) ** 0.5 / 64 ** 0.5  # std of the scaled score',)),
    "attn_predict_parameters": Answer(stubs=('return 4 * 1024 * 1024 + 4 * 1024  # weights and biases, four layers',)),
    "attn_predict_visible_pairs": Answer(stubs=('return sum(min(i + 1, 3) for i in range(6))  # keys per row',)),
}
