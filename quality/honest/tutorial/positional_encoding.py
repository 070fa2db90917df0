"""Stage 1 as d2l.ai builds the table: positions divided by torch.pow(10000, 2i / d_model), shapes made with
reshape, the table sliced with explicit `:` on every axis and moved to the input's device."""

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
    "pe_predict_self_dot": Answer(stubs=("return 256.0",)),
    "pe_predict_parameters": Answer(stubs=("return int(512_000)",)),
}
