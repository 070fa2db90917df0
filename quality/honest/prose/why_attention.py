"""Stage 0 from the three steps of the lesson: one score column per source position j (a loop over the keys),
the padding turned into a 0/1 `keep` factor, a softmax written out (maximum subtracted, exponentials, divided
by their sum) and the context as the weighted sum over j of the encoder outputs."""

from quality.honest import Answer

ANSWERS = {
    "additive_attention": Answer(stubs=(
        """
        projected_query = self.W_q(query)  # (batch, q_len, attention_size)
        columns = []
        for j in range(keys.size(1)):  # e_tj = v^T tanh(W_q s_t + W_k h_j), for every source position j
            projected_key = self.W_k(keys[:, j, :])  # (batch, attention_size)
            hidden = torch.tanh(projected_query + projected_key.unsqueeze(1))  # (batch, q_len, attention_size)
            columns.append(self.v(hidden).squeeze(-1))  # (batch, q_len)
        scores = torch.stack(columns, dim=-1)  # (batch, q_len, k_len)
        """,
        """
        keep = mask.to(scores.dtype).unsqueeze(1)  # (batch, 1, k_len): 1 at real tokens, 0 at padding
        scores = scores * keep - 1e9 * (1 - keep)  # padded positions get -1e9, so exp() gives exactly 0
        exponentials = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        weights = exponentials / exponentials.sum(dim=-1, keepdim=True)  # alpha_tj, each row sums to 1
        # c_t = sum over j of alpha_tj h_j
        context = (weights.unsqueeze(-1) * keys.unsqueeze(1)).sum(dim=2)  # (batch, q_len, key_size)
        """,
    )),
    "why_predict_parameters": Answer(stubs=("return 10 * (6 + 8 + 1)",)),
    "why_predict_zero_v": Answer(stubs=("return 0.20  # five equal scores share the weight",)),
}
