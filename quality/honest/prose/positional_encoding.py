"""Stage 1 from the formula, one entry at a time: for every position and every column pair i, the angle
pos / 10000^(2i/d_model), its sine in column 2i and its cosine in column 2i + 1. The offset matrix entry by entry,
for every column pair, and the error by loops over positions and entries."""

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
    "positional_offset": Answer(stubs=(
        """
        matrix = torch.zeros(d_model, d_model, dtype=torch.float64)
        for i in range(d_model // 2):
            angle = k / 10000 ** (2 * i / d_model)  # how far pair i turns in k positions
            # new sine = old sine * cos(angle) + old cosine * sin(angle)
            matrix[2 * i, 2 * i] = math.cos(angle)
            matrix[2 * i, 2 * i + 1] = math.sin(angle)
            # new cosine = old cosine * cos(angle) - old sine * sin(angle)
            matrix[2 * i + 1, 2 * i] = -math.sin(angle)
            matrix[2 * i + 1, 2 * i + 1] = math.cos(angle)
        """,
        """
        error = 0.0
        for p in range(table.size(0)):
            if 0 <= p + k < table.size(0):
                moved = matrix @ table[p]  # (d_model,)
                for j in range(table.size(1)):
                    error = max(error, abs(float(moved[j] - table[p + k, j])))
        """,
    )),
    "pe_predict_self_dot": Answer(stubs=("return 256",)),
    "pe_predict_parameters": Answer(stubs=("return 512000",)),
}
