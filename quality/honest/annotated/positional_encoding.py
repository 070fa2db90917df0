"""Stage 1 as the Annotated Transformer computes the table: 1/10000^(2i/d_model) as exp(2i * -ln(10000)/d_model),
the slice of the table added with `.requires_grad_(False)`."""

from quality.honest import Answer

ANSWERS = {
    "positional_encoding": Answer(stubs=(
        """
        # Compute the positional encodings once in log space.
        pe = torch.zeros(max_seq_length, d_model)
        position = torch.arange(0, max_seq_length).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        """,
        """
        x = x + self.pe[:, : x.size(1)].requires_grad_(False)
        """,
    )),
    "pe_predict_self_dot": Answer(stubs=("return 512 // 2 * 1.0",)),
    "pe_predict_parameters": Answer(stubs=("return 1000 * 512 + 0  # the embedding; a buffer is no parameter",)),
}
