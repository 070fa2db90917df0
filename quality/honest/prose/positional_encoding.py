"""Stage 1 from the formula, one entry at a time: for every position and every column pair i, the angle
pos / 10000^(2i/d_model), its sine in column 2i and its cosine in column 2i + 1."""

from quality.honest import Answer

ANSWERS = {
    "positional_encoding": Answer(stubs=(
        """
        pe = torch.zeros(max_seq_length, d_model)
        for pos in range(max_seq_length):
            for i in range(d_model // 2):
                angle = pos / 10000 ** (2 * i / d_model)
                pe[pos, 2 * i] = math.sin(angle)  # even column: sine
                pe[pos, 2 * i + 1] = math.cos(angle)  # odd column: cosine of the same angle
        """,
        """
        seq_len = x.size(1)
        positions = self.pe[:, 0:seq_len, :]  # (1, seq_len, d_model): broadcasts over the batch
        x = x + positions
        """,
    )),
    "pe_predict_self_dot": Answer(stubs=("return 256",)),
    "pe_predict_parameters": Answer(stubs=("return 512000",)),
}
