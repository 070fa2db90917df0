"""Stage 0 with broadcasting and einsum: every (query, key) pair through tanh at once, v applied as an einsum
over the attention features, the padding hidden with masked_fill(mask == 0, -1e9), the context a matmul."""

from quality.honest import Answer

ANSWERS = {
    "additive_attention": Answer(stubs=(
        """
        # (batch, q_len, 1, attention) + (batch, 1, k_len, attention): every query meets every key.
        hidden = torch.tanh(self.W_q(query).unsqueeze(2) + self.W_k(keys).unsqueeze(1))
        scores = torch.einsum("bqka,a->bqk", hidden, self.v.weight[0])
        """,
        """
        scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)
        weights = scores.softmax(dim=-1)
        context = torch.matmul(weights, keys)
        """,
    )),
    "why_predict_parameters": Answer(stubs=("return 6 * 10 + 8 * 10 + 10  # W_q, W_k, v: no biases",)),
    "why_predict_zero_v": Answer(stubs=("return 1.0 / 5",)),
}
