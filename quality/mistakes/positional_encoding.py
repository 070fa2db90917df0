"""Stage 1 mistakes: the sinusoid table and its use in forward."""

from quality.mistakes import Alternative, Mistake

STAGE = "01_positional_encoding"

_POSITION = "position = torch.arange(max_seq_length, dtype=torch.float).unsqueeze(1)  # (max_seq_length, 1)"
_TWO_I = "two_i = torch.arange(0, d_model, 2, dtype=torch.float)  # (d_model / 2,) the even indices 2i"
_SIN = "pe[:, 0::2] = torch.sin(position * div_term)  # even columns"
_COS = "pe[:, 1::2] = torch.cos(position * div_term)  # odd columns"
_ADD = "x = x + self.pe[:, : x.size(1)]  # broadcast over the batch"
_RETURN = "return self.dropout(x)"
_TABLE = (
    "        " + _POSITION + "\n"
    "        " + _TWO_I + "\n"
    "        div_term = torch.exp(two_i * (-math.log(10000.0) / d_model))  # 1 / 10000^(2i / d_model)\n"
    "        pe = torch.zeros(max_seq_length, d_model)\n"
    "        " + _SIN + "\n"
    "        " + _COS + "\n"
)

MISTAKES: list[Mistake] = [
    Mistake(
        STAGE, "dropout applied to the table as well as to the sum",
        _ADD,
        "x = x + self.dropout(self.pe[:, : x.size(1)])  # broadcast over the batch",
        fails="pe_dropout", cause="the table is dropped out as well as the sum",
    ),
    Mistake(
        STAGE, "the table sliced on its first axis (size 1) instead of the positions",
        _ADD,
        "x = x + self.pe[: x.size(1)]  # broadcast over the batch",
        fails="pe_dropout", cause="the same slice on axis 1",
    ),
    Mistake(
        STAGE, "sin and cos swapped",
        _SIN + "\n        " + _COS,
        "pe[:, 0::2] = torch.cos(position * div_term)  # even columns\n"
        "        pe[:, 1::2] = torch.sin(position * div_term)  # odd columns",
        fails="pe_table_values", cause="swapped",
    ),
    Mistake(
        STAGE, "exponent uses i instead of 2i (arange over d_model / 2)",
        _TWO_I,
        "two_i = torch.arange(0, d_model // 2, dtype=torch.float)  # (d_model / 2,)",
        fails="pe_table_values", cause="uses i instead of 2i",
    ),
    Mistake(
        STAGE, "exponent without the step: arange(0, d_model) gives d_model frequencies",
        _TWO_I,
        "two_i = torch.arange(0, d_model, dtype=torch.float)",
        fails="pe_buffer_shape", cause="not torch.arange(0, d_model)",
    ),
    Mistake(
        STAGE, "positions a flat row: arange(max_seq_length) without .unsqueeze(1)",
        _POSITION,
        "position = torch.arange(max_seq_length, dtype=torch.float)  # (max_seq_length,)",
        fails="pe_buffer_shape", cause="positions must be a column",
    ),
    Mistake(
        STAGE, "the table built in float64 (the contract says float32)",
        "pe = torch.zeros(max_seq_length, d_model)",
        "pe = torch.zeros(max_seq_length, d_model, dtype=torch.float64)",
        fails="pe_buffer_shape", cause="is built in another dtype",
    ),
    Mistake(
        STAGE, "2i doubled: arange(0, d_model, 2) multiplied by 2 again",
        _TWO_I,
        "two_i = 2 * torch.arange(0, d_model, 2, dtype=torch.float)",
        fails="pe_table_values", cause="exponent is doubled",
    ),
    Mistake(
        STAGE, "positions counted from 1",
        _POSITION,
        "position = torch.arange(1, max_seq_length + 1, dtype=torch.float).unsqueeze(1)",
        fails="pe_table_values", cause="positions start at 1",
    ),
    Mistake(
        STAGE, "sin written into the odd columns as well",
        _COS,
        "pe[:, 1::2] = torch.sin(position * div_term)  # odd columns",
        fails="pe_table_values", cause="sin is in the odd columns too",
    ),
    Mistake(
        STAGE, "cos written into column 1 only (pe[:, 1] instead of pe[:, 1::2])",
        _COS,
        "pe[:, 1] = torch.cos(position[:, 0] * div_term[0])  # odd columns",
        fails="pe_table_values", cause="column 1 only",
    ),
    Mistake(
        STAGE, "table stored as an nn.Parameter instead of a buffer",
        'self.register_buffer("pe", pe.unsqueeze(0))  # (1, max_seq_length, d_model)',
        "self.pe = nn.Parameter(pe.unsqueeze(0))",
        fails="pe_buffer_shape", cause="register_buffer",
    ),
    Mistake(
        STAGE, "positional encoding computed but not added (result discarded)",
        _ADD,
        "x + self.pe[:, : x.size(1)]",
        fails="pe_forward", cause="returns x unchanged",
    ),
    Mistake(
        STAGE, "forward replaces x by the table",
        _ADD,
        "x = self.pe[:, : x.size(1)]",
        fails="pe_forward", cause="never uses the input `x`",
    ),
    Mistake(
        STAGE, "table sliced by d_model instead of the sequence length (pe[:, :d_model])",
        _ADD,
        "x = x + self.pe[:, : x.size(2)]",
        fails="pe_forward", cause="wrong slice of pe",
    ),
    Mistake(
        STAGE, "table sliced along the batch axis (pe[:seq_len])",
        _ADD,
        "x = x + self.pe[: x.size(1)]",
        fails="pe_forward", cause="wrong slice of pe",
    ),
    Mistake(
        STAGE, "table indexed instead of sliced (pe[:, seq_len])",
        _ADD,
        "x = x + self.pe[:, x.size(1)]",
        fails="pe_forward", cause="the slice has `index` (:, 7) where (:, :7) is expected",
    ),
    Mistake(
        STAGE, "embeddings scaled by sqrt(d_model) inside PositionalEncoding",
        _ADD,
        "x = x * math.sqrt(x.size(-1)) + self.pe[:, : x.size(1)]",
        fails="pe_forward", cause="receives the input `x` after an extra product",
    ),
    Mistake(
        STAGE, "dropout not applied",
        _RETURN,
        "return x",
        fails="pe_dropout", cause="apply self.dropout to the sum",
    ),
    Mistake(
        STAGE, "dropout applied to x before adding the encoding",
        _ADD + "\n        ### END SOLUTION\n        " + _RETURN,
        "x = self.dropout(x) + self.pe[:, : x.size(1)]\n        ### END SOLUTION\n        return x",
        fails="pe_dropout", cause="after adding pe",
    ),
    Mistake(
        STAGE, "functional dropout that stays on in eval mode",
        _RETURN,
        "return nn.functional.dropout(x, self.dropout.p)",
        fails="pe_forward", cause="still active in eval mode",
    ),
]

ALTERNATIVES: list[Alternative] = [
    Alternative(
        STAGE, "frequencies with torch.pow instead of exp/log",
        "div_term = torch.exp(two_i * (-math.log(10000.0) / d_model))  # 1 / 10000^(2i / d_model)",
        "div_term = 1.0 / torch.pow(10000.0, two_i / d_model)  # (d_model / 2,)",
    ),
    Alternative(
        STAGE, "table filled with explicit Python loops and math.sin/math.cos",
        _TABLE,
        "        pe = torch.zeros(max_seq_length, d_model)\n"
        "        for pos in range(max_seq_length):\n"
        "            for i in range(0, d_model, 2):\n"
        "                angle = pos / (10000 ** (i / d_model))\n"
        "                pe[pos, i] = math.sin(angle)\n"
        "                pe[pos, i + 1] = math.cos(angle)\n",
    ),
    Alternative(
        STAGE, "sin and cos interleaved with torch.stack(...).flatten(1), frequencies by a power",
        _TABLE,
        "        position = torch.arange(max_seq_length).unsqueeze(1).float()  # (max_seq_length, 1)\n"
        "        frequencies = 10000 ** (-torch.arange(0, d_model, 2).float() / d_model)  # (d_model / 2,)\n"
        "        angles = position * frequencies  # (max_seq_length, d_model / 2)\n"
        "        pe = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # sin, cos, sin, cos, ...\n",
    ),
    Alternative(
        STAGE, "table from a nested list comprehension with math.sin/math.cos, as in many tutorials",
        _TABLE,
        "        pe = torch.tensor([[math.sin(pos / 10000 ** (2 * (j // 2) / d_model)) if j % 2 == 0\n"
        "                            else math.cos(pos / 10000 ** (2 * (j // 2) / d_model))\n"
        "                            for j in range(d_model)] for pos in range(max_seq_length)],\n"
        "                          dtype=torch.float)  # (max_seq_length, d_model)\n",
    ),
    Alternative(
        STAGE, "forward slicing with x.shape[1] and all three axes spelled out",
        _ADD,
        "x = x + self.pe[:, : x.shape[1], :]  # (1, seq_len, d_model)",
    ),
    Alternative(
        STAGE, "forward with narrow and an in-place-free addition via torch.add",
        _ADD,
        "x = torch.add(x, self.pe.narrow(1, 0, x.size(1)))  # (1, seq_len, d_model) broadcasts",
    ),
]

# --- the offset as a matrix: offset_matrix and largest_offset_error ------------------------------------------

_SIN_ENTRIES = ("    matrix[0::2, 1::2] = torch.diag(sin)\n"
                "    matrix[1::2, 0::2] = torch.diag(-sin)  # cos(a + b) = cos a cos b - sin a sin b\n")
_ANGLE = "angle = k / 10000.0 ** (two_i / d_model)  # (d_model / 2,) how far each column pair turns in k positions"
_OFFSET_TWO_I = "two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model / 2,) the even indices 2i"
_RANGE = "start, stop = max(0, -k), min(n, n - k)  # the positions p with 0 <= p < n and 0 <= p + k < n"
_MOVED = "moved = table[start:stop] @ matrix.T  # (stop - start, d_model): row p holds matrix @ table[p]"
_ERROR = "error = (moved - table[start + k:stop + k]).abs().max()"
_OFFSET_MATRIX = (
    "    " + _OFFSET_TWO_I + "\n"
    "    " + _ANGLE + "\n"
    "    cos, sin = torch.cos(angle), torch.sin(angle)\n"
    "    matrix = torch.zeros(d_model, d_model, dtype=torch.float64)\n"
    "    matrix[0::2, 0::2] = torch.diag(cos)  # sin(a + b) = sin a cos b + cos a sin b\n"
    + _SIN_ENTRIES +
    "    matrix[1::2, 1::2] = torch.diag(cos)\n"
)
_OFFSET_ERROR = "    n = table.size(0)\n    " + _RANGE + "\n    " + _MOVED + "\n    " + _ERROR + "\n"

MISTAKES += [
    Mistake(
        STAGE, "offset matrix: the block transposed (the sine entries' signs swapped), so it moves backwards",
        _SIN_ENTRIES,
        "    matrix[0::2, 1::2] = torch.diag(-sin)\n"
        "    matrix[1::2, 0::2] = torch.diag(sin)  # cos(a + b) = cos a cos b - sin a sin b\n",
        fails="pe_offset_matrix_moves", cause="moves every position 3 back",
    ),
    Mistake(
        STAGE, "offset matrix: k forgotten in the angle (every pair turns by one position's angle)",
        _ANGLE,
        "angle = 1 / 10000.0 ** (two_i / d_model)  # (d_model / 2,)",
        fails="pe_offset_matrix_moves", cause="moves every position by 1",
    ),
    Mistake(
        STAGE, "offset matrix: the exponent doubled (2i multiplied by 2 again)",
        _OFFSET_TWO_I,
        "two_i = 2 * torch.arange(0, d_model, 2, dtype=torch.float64)",
        fails="pe_offset_matrix_moves", cause="the exponent is doubled",
    ),
    Mistake(
        STAGE, "offset matrix: i instead of 2i in the exponent",
        _OFFSET_TWO_I,
        "two_i = torch.arange(0, d_model // 2, dtype=torch.float64)",
        fails="pe_offset_matrix_moves", cause="half of 2i / d_model",
    ),
    Mistake(
        STAGE, "offset matrix: both sine entries with a plus sign",
        "    matrix[1::2, 0::2] = torch.diag(-sin)  # cos(a + b) = cos a cos b - sin a sin b\n",
        "    matrix[1::2, 0::2] = torch.diag(sin)\n",
        fails="pe_offset_matrix_moves", cause="angle-addition formulas",
    ),
    Mistake(
        STAGE, "offset matrix: a vector assigned to a block of entries without torch.diag (pairs mixed)",
        "    matrix[0::2, 1::2] = torch.diag(sin)\n",
        "    matrix[0::2, 1::2] = sin\n",
        fails="pe_offset_matrix_moves", cause="mixes column pairs",
    ),
    Mistake(
        STAGE, "offset matrix: sin and cos swapped in every block",
        "    cos, sin = torch.cos(angle), torch.sin(angle)\n",
        "    sin, cos = torch.cos(angle), torch.sin(angle)\n",
        fails="pe_offset_matrix_moves", cause="angle-addition formulas",
    ),
    Mistake(
        STAGE, "offset matrix as whole numbers (an integer zeros tensor)",
        "    matrix = torch.zeros(d_model, d_model, dtype=torch.float64)\n",
        "    matrix = torch.zeros(d_model, d_model, dtype=torch.long)\n",
        fails="pe_offset_matrix_shape", cause="make the matrix a tensor of floats",
    ),
    Mistake(
        STAGE, "offset error: the last position with a partner left out",
        _RANGE,
        "start, stop = max(0, -k), min(n, n - k) - 1",
        fails="pe_offset_error_values", cause="without the last position",
    ),
    Mistake(
        STAGE, "offset error: the first position left out (a loop from 1)",
        _RANGE,
        "start, stop = max(1, -k), min(n, n - k)",
        fails="pe_offset_error_values", cause="without the first position",
    ),
    Mistake(
        STAGE, "offset error: rows multiplied by the matrix, not its transpose",
        _MOVED,
        "moved = table[start:stop] @ matrix",
        fails="pe_offset_error_values", cause="from the right",
    ),
    Mistake(
        STAGE, "offset error: the mean difference instead of the largest",
        _ERROR,
        "error = (moved - table[start + k:stop + k]).abs().mean()",
        fails="pe_offset_error_values", cause="the mean difference",
    ),
    Mistake(
        STAGE, "offset error: the largest signed difference (abs forgotten)",
        _ERROR,
        "error = (moved - table[start + k:stop + k]).max()",
        fails="pe_offset_error_values", cause="without the absolute value",
    ),
    Mistake(
        STAGE, "offset error: slices written for a positive k only (table[:-k], table[k:])",
        "    " + _RANGE + "\n    " + _MOVED + "\n    " + _ERROR + "\n",
        "    moved = table[:-k] @ matrix.T\n    error = (moved - table[k:]).abs().max()\n",
        fails="pe_offset_error_offsets", cause="size of tensor",
    ),
]

ALTERNATIVES += [
    Alternative(
        STAGE, "offset matrix from 2x2 blocks with torch.block_diag, in float32",
        _OFFSET_MATRIX,
        "    frequencies = 10000 ** (-torch.arange(0, d_model, 2).float() / d_model)  # (d_model / 2,)\n"
        "    blocks = [torch.tensor([[math.cos(k * w), math.sin(k * w)], [-math.sin(k * w), math.cos(k * w)]])\n"
        "              for w in frequencies.tolist()]\n"
        "    matrix = torch.block_diag(*blocks)  # (d_model, d_model), float32\n",
    ),
    Alternative(
        STAGE, "offset matrix with loops over the column pairs and math.cos/math.sin",
        _OFFSET_MATRIX,
        "    matrix = torch.zeros(d_model, d_model, dtype=torch.float64)\n"
        "    for i in range(d_model // 2):\n"
        "        a = k * math.exp(-2 * i * math.log(10000.0) / d_model)\n"
        "        matrix[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[math.cos(a), math.sin(a)],\n"
        "                                                             [-math.sin(a), math.cos(a)]])\n",
    ),
    Alternative(
        STAGE, "offset matrix as a sum of four scattered diagonals (index_put on even and odd indices)",
        _OFFSET_MATRIX,
        "    even = torch.arange(0, d_model, 2)\n"
        "    a = k * torch.exp(even.double() * (-math.log(10000.0) / d_model))\n"
        "    matrix = torch.zeros(d_model, d_model, dtype=torch.float64)\n"
        "    matrix.index_put_((even, even), a.cos())\n"
        "    matrix.index_put_((even, even + 1), a.sin())\n"
        "    matrix.index_put_((even + 1, even), -a.sin())\n"
        "    matrix.index_put_((even + 1, even + 1), a.cos())\n",
    ),
    Alternative(
        STAGE, "offset error with the matrix applied to columns (matrix @ rows.T) and torch.amax",
        _OFFSET_ERROR,
        "    n = table.size(0)\n"
        "    ps = torch.arange(n)\n"
        "    ps = ps[(ps + k >= 0) & (ps + k < n)]  # the positions with a partner\n"
        "    error = torch.amax(torch.abs((matrix @ table[ps].T).T - table[ps + k]))\n",
    ),
    Alternative(
        STAGE, "offset error as a Python loop over positions with a running maximum",
        _OFFSET_ERROR,
        "    error = 0.0\n"
        "    for p in range(len(table)):\n"
        "        if 0 <= p + k < len(table):\n"
        "            error = max(error, (matrix @ table[p] - table[p + k]).abs().max().item())\n",
    ),
]
