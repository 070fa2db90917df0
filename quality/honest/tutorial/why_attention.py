"""Stage 0 as bentrevett's seq2seq tutorial writes Bahdanau attention: the decoder states and the encoder
outputs repeated to every pair (`repeat`), the energy through tanh and v, `masked_fill(mask == 0, -1e10)`,
`F.softmax` over the source positions and the context from `torch.bmm`."""

from quality.honest import Answer

ANSWERS = {
    "additive_attention": Answer(
        helpers="""
        import torch.nn.functional as F
        """,
        stubs=(
            """
            src_len, tgt_len = keys.shape[1], query.shape[1]
            # repeat each decoder state for every source position, and each encoder output for every decoder state
            queries = self.W_q(query).unsqueeze(2).repeat(1, 1, src_len, 1)  # (batch, q_len, k_len, attention)
            encoded = self.W_k(keys).unsqueeze(1).repeat(1, tgt_len, 1, 1)  # (batch, q_len, k_len, attention)
            energy = torch.tanh(queries + encoded)
            scores = self.v(energy).squeeze(3)  # (batch, q_len, k_len)
            """,
            """
            scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e10)
            weights = F.softmax(scores, dim=2)
            context = torch.bmm(weights, keys)  # (batch, q_len, key_size)
            """,
        ),
    ),
    "why_predict_parameters": Answer(stubs=("return 150",)),
    "why_predict_zero_v": Answer(stubs=("return 0.2",)),
}
