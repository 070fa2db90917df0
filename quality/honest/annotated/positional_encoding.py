"""Stage 1 as the Annotated Transformer computes the table: 1/10000^(2i/d_model) as exp(2i * -ln(10000)/d_model),
the slice of the table added with `.requires_grad_(False)`. The offset matrix as
torch.block_diag of its 2x2 blocks, the error with einsum over the positions that have a partner."""

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
    "positional_offset": Answer(stubs=(
        """
        # Each (sin, cos) column pair lives on a circle; k positions turn it by k * w_i.
        # sin(a + b) = sin a cos b + cos a sin b,  cos(a + b) = cos a cos b - sin a sin b.
        w = torch.exp(torch.arange(0, d_model, 2).double() * -(math.log(10000.0) / d_model))
        c, s = torch.cos(k * w), torch.sin(k * w)
        blocks = [torch.tensor([[ci, si], [-si, ci]], dtype=torch.float64) for ci, si in zip(c.tolist(), s.tolist())]
        matrix = torch.block_diag(*blocks)
        """,
        """
        n = table.size(0)
        ps = [p for p in range(n) if 0 <= p + k < n]
        src, tgt = table[ps], table[[p + k for p in ps]]
        error = torch.einsum("ij,pj->pi", matrix, src).sub(tgt).abs().max()
        """,
    )),
    "pe_predict_self_dot": Answer(stubs=("return 512 // 2 * 1.0",)),
    "pe_predict_parameters": Answer(stubs=("return 1000 * 512 + 0  # the embedding; a buffer is no parameter",)),
}
