"""Stage 1 as d2l.ai builds the table: positions divided by torch.pow(10000, 2i / d_model), shapes made with
reshape, the table sliced with explicit `:` on every axis and moved to the input's device. The offset matrix
filled by advanced indexing on the even and odd columns, the error by slicing on the sign of k."""

from quality.honest import Answer

ANSWERS = {
    "positional_encoding": Answer(stubs=(
        """
        angles = torch.arange(max_seq_length, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)  # (max_seq_length, d_model / 2)
        pe = torch.zeros((max_seq_length, d_model))
        pe[:, 0::2] = torch.sin(angles)
        pe[:, 1::2] = torch.cos(angles)
        """,
        """
        x = x + self.pe[:, :x.shape[1], :].to(x.device)
        """,
    )),
    "positional_offset": Answer(stubs=(
        """
        freqs = torch.pow(10000, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model / 2,)
        theta = k * freqs
        matrix = torch.zeros((d_model, d_model), dtype=torch.float64)
        even, odd = torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)
        matrix[even, even] = torch.cos(theta)
        matrix[even, odd] = torch.sin(theta)
        matrix[odd, even] = -torch.sin(theta)
        matrix[odd, odd] = torch.cos(theta)
        """,
        """
        n = table.shape[0]
        if k >= 0:
            before, after = table[: n - k], table[k:]
        else:
            before, after = table[-k:], table[: n + k]
        error = torch.max(torch.abs(torch.matmul(matrix, before.T).T - after))
        """,
    )),
    "pe_predict_self_dot": Answer(stubs=("return 256.0",)),
    "pe_predict_parameters": Answer(stubs=("return int(512_000)",)),
}
