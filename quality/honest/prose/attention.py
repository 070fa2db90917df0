"""Stage 2 from the lesson's prose: the scores, the mask turned into 0/1 numbers that push hidden scores to
-1e9, the softmax written out; the masks filled in place; heads cut out feature block by feature block and
joined with torch.cat; attention run head by head in a loop, with the mask broadcast to every head."""

from quality.honest import Answer

ANSWERS = {
    "attention_function": Answer(stubs=(
        """
        scores = torch.matmul(Q, K.transpose(-1, -2)) / math.sqrt(d_k)  # (..., q_len, k_len)
        if mask is not None:
            keep = mask.to(scores.dtype)  # 1 = may attend, 0 = hidden (works for bool and 0/1 masks)
            scores = scores * keep - 1e9 * (1 - keep)
        largest = scores.max(dim=-1, keepdim=True).values  # subtracted first so that exp never overflows
        exponentials = torch.exp(scores - largest)
        weights = exponentials / exponentials.sum(dim=-1, keepdim=True)  # softmax over the keys
        output = torch.matmul(weights, V)
        """,
    )),
    "padding_mask": Answer(stubs=(
        """
        batch, seq_len = token_ids.shape
        real = torch.ne(token_ids, pad_idx)  # True at real tokens
        mask = real.view(batch, 1, 1, seq_len)
        """,
    )),
    "look_ahead_mask": Answer(fixes=((".triu()  # (size, size)",
                                    ".tril(diagonal=0)  # the lower triangle, diagonal included"),)),
    "multi_head_attention": Answer(stubs=(
        """
        heads = []
        for h in range(self.num_heads):  # head h gets the features h*d_k ... (h+1)*d_k - 1 of every token
            heads.append(x[:, :, h * self.d_k:(h + 1) * self.d_k])
        return torch.stack(heads, dim=1)  # (batch, num_heads, seq_len, d_k)
        """,
        """
        pieces = [x[:, h, :, :] for h in range(self.num_heads)]  # each (batch, seq_len, d_k)
        return torch.cat(pieces, dim=-1)  # the heads side by side: (batch, seq_len, d_model)
        """,
        """
        Q = self.split_heads(self.W_q(q))  # (batch, num_heads, q_len, d_k)
        K = self.split_heads(self.W_k(k))  # (batch, num_heads, k_len, d_k)
        V = self.split_heads(self.W_v(v))
        batch, q_len, k_len = q.size(0), q.size(1), k.size(1)
        if mask is not None:
            mask = torch.broadcast_to(mask, (batch, self.num_heads, q_len, k_len))
        head_outputs, head_weights = [], []
        for h in range(self.num_heads):
            head_mask = None if mask is None else mask[:, h]
            head_output, head_weight = scaled_dot_product_attention(Q[:, h], K[:, h], V[:, h], head_mask)
            head_outputs.append(head_output)
            head_weights.append(head_weight)
        heads = torch.stack(head_outputs, dim=1)  # (batch, num_heads, q_len, d_k)
        weights = torch.stack(head_weights, dim=1)  # (batch, num_heads, q_len, k_len)
        output = self.W_o(self.combine_heads(heads))
        """,
    )),
    "attn_predict_score_std": Answer(stubs=('return 3 * 2  # the two standard deviations multiply',)),
    "attn_predict_parameters": Answer(stubs=('return 4194304  # no biases, as in the paper',)),
    "attn_predict_visible_pairs": Answer(stubs=('return 6 + 9',)),
}
