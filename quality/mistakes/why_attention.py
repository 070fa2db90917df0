"""Stage 0 mistakes: additive attention (the score, the masked softmax, the context vector)."""

from quality.mistakes import Alternative, Mistake

STAGE = "00_why_attention"

_PROJECTIONS = (
    "projected_query = self.W_q(query).unsqueeze(2)  # (batch, q_len, 1, attention_size)\n"
    "        projected_keys = self.W_k(keys).unsqueeze(1)  # (batch, 1, k_len, attention_size)"
)
_HIDDEN = "hidden = torch.tanh(projected_query + projected_keys)"
_SCORES = "scores = self.v(hidden).squeeze(-1)"
_FILL = "scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)"
_SOFTMAX = "weights = torch.softmax(scores, dim=-1)"
_CONTEXT = "context = weights @ keys"
_FORWARD = (
    "        " + _FILL + "  # padding hidden from every query\n"
    "        " + _SOFTMAX + "  # over the source positions: each row sums to 1\n"
    "        " + _CONTEXT + "  # (batch, q_len, key_size): the weighted sum of the keys\n"
)

MISTAKES: list[Mistake] = [
    # --- the score ---
    Mistake(
        STAGE, "tanh missing from the score",
        _HIDDEN, "hidden = projected_query + projected_keys",
        fails="why_score_values", cause="there is no tanh between the sum of the projections and v",
    ),
    Mistake(
        STAGE, "tanh applied to each projection separately",
        _HIDDEN, "hidden = torch.tanh(projected_query) + torch.tanh(projected_keys)",
        fails="why_score_values", cause="tanh is applied to each projection on its own",
    ),
    Mistake(
        STAGE, "v skipped: the hidden features are summed",
        _SCORES, "scores = hidden.sum(dim=-1)",
        fails="why_score_values", cause="applies the sum where the reference applies `self.v`",
    ),
    Mistake(
        STAGE, "projections multiplied instead of added",
        _HIDDEN, "hidden = torch.tanh(projected_query * projected_keys)",
        fails="why_score_values", cause="applies the product where the reference applies the sum",
    ),
    Mistake(
        STAGE, "tanh applied after v instead of before it",
        _HIDDEN + "  # (batch, q_len, k_len, attention_size)\n        " + _SCORES,
        "hidden = projected_query + projected_keys\n        scores = torch.tanh(self.v(hidden).squeeze(-1))",
        fails="why_score_values", cause="applies the tanh after `self.v`",
    ),
    Mistake(
        STAGE, "scores divided by the square root of the attention size",
        _SCORES, "scores = self.v(hidden).squeeze(-1) / math.sqrt(hidden.size(-1))",
        fails="why_score_values", cause="the factor is 1/√attention_size",
    ),
    Mistake(
        STAGE, "softmax already taken inside score",
        _SCORES, "scores = torch.softmax(self.v(hidden).squeeze(-1), dim=-1)",
        fails="why_score_values", cause="already applies the softmax",
    ),
    Mistake(
        STAGE, "squeeze() without an axis drops q_len for a single query",
        _SCORES, "scores = self.v(hidden).squeeze()",
        fails="why_score_shape", cause=".squeeze(-1)",
    ),
    Mistake(
        STAGE, "v's output axis of size 1 not squeezed",
        _SCORES, "scores = self.v(hidden)",
        fails="why_score_shape", cause="remove it with .squeeze(-1)",
    ),
    Mistake(
        STAGE, "query and key axes swapped: scores transposed",
        _PROJECTIONS,
        "projected_query = self.W_q(query).unsqueeze(1)\n"
        "        projected_keys = self.W_k(keys).unsqueeze(2)",
        fails="why_score_shape", cause="the scores are transposed",
    ),
    Mistake(
        STAGE, "projections added without the broadcasting axes",
        _PROJECTIONS,
        "projected_query = self.W_q(query)  # (batch, q_len, attention_size)\n"
        "        projected_keys = self.W_k(keys)  # (batch, k_len, attention_size)",
        fails="why_score_shape", cause="every query must meet every key",
    ),
    Mistake(
        STAGE, "W_q applied to the keys and W_k to the query",
        _PROJECTIONS,
        "projected_query = self.W_k(query).unsqueeze(2)\n"
        "        projected_keys = self.W_q(keys).unsqueeze(1)",
        fails="why_score_shape", cause="a projection gets the wrong input",
    ),
    # --- the masked softmax ---
    Mistake(
        STAGE, "softmax over the queries (dim=1)",
        _SOFTMAX, "weights = torch.softmax(scores, dim=1)",
        fails="why_weights_values", cause="normalised over the query axis",
    ),
    Mistake(
        STAGE, "softmax over the batch (dim=0)",
        _SOFTMAX, "weights = torch.softmax(scores, dim=0)",
        fails="why_weights_values", cause="normalised over the batch axis",
    ),
    Mistake(
        STAGE, "padding mask inverted",
        _FILL, "scores = scores.masked_fill(mask.unsqueeze(1), -1e9)",
        fails="why_weights_values", cause="the mask is inverted",
    ),
    Mistake(
        STAGE, "masked_fill result not assigned (mask ignored)",
        _FILL, "scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)",
        fails="why_weights_values", cause="the mask has no effect",
    ),
    Mistake(
        STAGE, "additive attention: mask applied to the weights after the softmax",
        _FORWARD,
        "        " + _SOFTMAX + "\n"
        "        weights = weights.masked_fill(mask.unsqueeze(1) == 0, 0.0)\n"
        "        " + _CONTEXT + "\n",
        fails="why_weights_values", cause="the mask is applied to the weights after the softmax",
    ),
    Mistake(
        STAGE, "padded scores filled with 0",
        _FILL, "scores = scores.masked_fill(mask.unsqueeze(1) == 0, 0.0)",
        fails="why_weights_values", cause="0 where -1e+09 is expected",
    ),
    Mistake(
        STAGE, "weak fill value lets padding leak",
        _FILL, "scores = scores.masked_fill(mask.unsqueeze(1) == 0, -100.0)",
        fails="why_masked_zero", cause="very negative number",
    ),
    Mistake(
        STAGE, "mask used without its query axis",
        _FILL, "scores = scores.masked_fill(mask == 0, -1e9)",
        fails="why_forward_shapes", cause="query axis",
    ),
    # --- the context ---
    Mistake(
        STAGE, "context summed over the features instead of the source positions",
        _CONTEXT, "context = (weights.unsqueeze(-1) * keys.unsqueeze(1)).sum(dim=-1)",
        fails="why_forward_shapes", cause="summed over the wrong axis",
    ),
    Mistake(
        STAGE, "context from the scores instead of the weights",
        _CONTEXT, "context = scores @ keys",
        fails="why_context_values", cause="the context is the keys multiplied by the scores",
    ),
    Mistake(
        STAGE, "context from the scores filled with -inf at the padding (NaN where the weights belong)",
        _CONTEXT, "context = torch.bmm(scores.masked_fill(mask.unsqueeze(1) == 0, float('-inf')), keys)",
        fails="why_context_values", cause="the context is the keys multiplied by the scores",
    ),
    Mistake(
        STAGE, "context averages the keys, ignoring the weights",
        _CONTEXT, "context = keys.mean(dim=1, keepdim=True).expand(-1, query.size(1), -1)",
        fails="why_context_values", cause="the weights are not used",
    ),
    Mistake(
        STAGE, "context divided by the number of source positions",
        _CONTEXT, "context = weights @ keys / keys.size(1)",
        fails="why_context_values", cause="the factor is 1/k_len",
    ),
]

ALTERNATIVES: list[Alternative] = [
    Alternative(
        STAGE, "score with None indexing and v's weight as a vector",
        _PROJECTIONS + "\n        " + _HIDDEN + "  # (batch, q_len, k_len, attention_size)\n        " + _SCORES,
        "hidden = torch.tanh(self.W_q(query)[:, :, None, :] + self.W_k(keys)[:, None, :, :])\n"
        "        scores = (hidden * self.v.weight[0]).sum(dim=-1)  # v^T tanh(...)",
    ),
    Alternative(
        STAGE, "score with einsum",
        _SCORES,
        'scores = torch.einsum("bqka,a->bqk", hidden, self.v.weight.squeeze(0))',
    ),
    Alternative(
        STAGE, "-inf mask via torch.where, bmm context",
        _FORWARD,
        '        scores = torch.where(mask.bool().unsqueeze(1), scores, float("-inf"))\n'
        "        weights = scores.softmax(dim=2)\n"
        "        context = torch.bmm(weights, keys)\n",
    ),
    Alternative(
        STAGE, "softmax then zero the padding and renormalise; context by broadcasting",
        _FORWARD,
        "        weights = torch.softmax(scores, dim=-1) * mask.unsqueeze(1)  # padding zeroed\n"
        "        weights = weights / weights.sum(dim=-1, keepdim=True)  # rows sum to 1 again\n"
        "        context = (weights.unsqueeze(-1) * keys.unsqueeze(1)).sum(dim=2)  # sum over the source\n",
    ),
    Alternative(
        STAGE, "hand-written stable softmax with ~mask and einsum context",
        _FORWARD,
        "        scores = scores.masked_fill(~mask[:, None, :], -1e9)\n"
        "        exps = (scores - scores.amax(dim=-1, keepdim=True)).exp()\n"
        "        weights = exps / exps.sum(dim=-1, keepdim=True)\n"
        '        context = torch.einsum("bqk,bkd->bqd", weights, keys)\n',
    ),
]
