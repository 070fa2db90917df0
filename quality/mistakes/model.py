"""Stage 4 mistakes: the target mask, the Encoder and Decoder stacks and the full Transformer."""

from quality.mistakes import Alternative, Mistake

STAGE = "04_transformer"

_ENCODER_LAYERS = (
    "self.layers = nn.ModuleList(\n"
    "            [EncoderBlock(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)]\n"
    "        )"
)
_DECODER_LAYERS = (
    "self.layers = nn.ModuleList(\n"
    "            [DecoderBlock(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)]\n"
    "        )"
)

_ENCODER_FORWARD = (
    "x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)\n"
    "        x = self.positional_encoding(x)\n"
    "        for layer in self.layers:\n"
    "            x = layer(x, mask)"
)

_ENCODER_PARTS = (
    _ENCODER_LAYERS + "\n\n    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:\n"
    "        ### BEGIN SOLUTION\n        " + _ENCODER_FORWARD
)

_DECODER_MADE = ("        self.decoder = Decoder(dec_vocab_size, d_model, num_heads, num_layers, d_ff, max_seq_length, "
                 "dropout)\n")

MISTAKES: list[Mistake] = [
    Mistake(
        STAGE, "the decoder reuses the encoder's embedding table",
        _DECODER_MADE,
        _DECODER_MADE + "        self.decoder.embedding = self.encoder.embedding  # one table for both languages\n",
        fails="model_own_embeddings", cause="the same embedding table as the source ids",
    ),
    # --- the target mask, built from the tokens (issue 38: the broadcasting is the exercise). FIND texts are lines
    # of the reference: key_is_word (the padding rule), positions, not_later (the look-ahead rule), the return.
    Mistake(
        STAGE, "look-ahead part negated in the target mask",
        "    return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)\n",
        "    return key_is_word & ~not_later  # (batch, 1, tgt_len, tgt_len)\n",
        fails="model_target_mask_values", cause="exact opposite of j <= i",
    ),
    Mistake(
        STAGE, "look-ahead positions counted along the batch axis",
        "torch.arange(tgt.size(1), device=tgt.device)",
        "torch.arange(tgt.size(0), device=tgt.device)",
        fails="model_target_mask_shape", cause="axis -1 (counted from the end) does not fit",
    ),
    Mistake(
        STAGE, "target mask: the padding rule combined into the (tgt_len, tgt_len) look-ahead table in place (&=)",
        "    return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)\n",
        "    not_later &= key_is_word  # in place: not_later keeps its (tgt_len, tgt_len) shape\n"
        "    return not_later\n",
        fails="model_target_mask_shape", cause="writes the result into `not_later` itself (in place)",
    ),
    Mistake(
        STAGE, "target mask is the padding rule only (no look-ahead)",
        "return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)",
        "return key_is_word  # (batch, 1, 1, tgt_len)",
        fails="model_target_mask_values", cause="padding mask alone",
    ),
    Mistake(
        STAGE, "target mask is the look-ahead rule only (padding not combined)",
        "return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)",
        "return not_later.expand(tgt.size(0), 1, -1, -1)  # (batch, 1, tgt_len, tgt_len)",
        fails="model_target_mask_values", cause="this is the look-ahead mask alone",
    ),
    Mistake(
        STAGE, "target mask combines padding and look-ahead with | instead of &",
        "return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)",
        "return key_is_word | not_later  # (batch, 1, tgt_len, tgt_len)",
        fails="model_target_mask_values", cause="the two masks are combined with `|`",
    ),
    Mistake(
        STAGE, "target mask: the padding part on the query axis instead of the key axis",
        "    key_is_word = (tgt != pad_idx)[:, None, None, :]",
        "    key_is_word = (tgt != pad_idx)[:, None, :, None]",
        fails="model_target_mask_values", cause="padding hides query rows",
    ),
    Mistake(
        STAGE, "target mask without the head axis",
        "    key_is_word = (tgt != pad_idx)[:, None, None, :]",
        "    key_is_word = (tgt != pad_idx)[:, None, :]",
        fails="model_target_mask_shape", cause="the head axis is missing",
    ),
    Mistake(
        STAGE, "target mask compares the tokens with 0, not with pad_idx",
        "    key_is_word = (tgt != pad_idx)[:, None, None, :]",
        "    key_is_word = (tgt != 0)[:, None, None, :]",
        fails="model_target_mask_values", cause="hold token id 0, not pad_idx=1",
    ),
    Mistake(
        STAGE, "target mask whose look-ahead part hides the diagonal",
        "    not_later = positions[None, :] <= positions[:, None]",
        "    not_later = positions[None, :] < positions[:, None]",
        fails="model_target_mask_values", cause="lets no position attend to itself",
    ),
    Mistake(
        STAGE, "target mask built with stage 2's helpers (the exercise's work delegated)",
        "    key_is_word = (tgt != pad_idx)[:, None, None, :]",
        "    from transformer_course.reference import make_padding_mask\n"
        "    key_is_word = make_padding_mask(tgt, pad_idx)",
        fails="model_target_mask_values", cause="calls the course's make_padding_mask",
    ),
    Mistake(
        STAGE, "target mask's look-ahead part from stage 2's make_look_ahead_mask (delegated)",
        "    not_later = positions[None, :] <= positions[:, None]",
        "    not_later = make_look_ahead_mask(tgt.size(1), device=tgt.device)",
        fails="model_target_mask_shape", cause="calls the course's make_look_ahead_mask",
    ),
    Mistake(
        STAGE, "encoder embeddings not scaled by sqrt(d_model) (only the decoder scales)",
        "x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)",
        "x = self.embedding(x)  # (batch, src_len, d_model)",
        fails="model_encoder_values", cause="the embeddings are not multiplied by sqrt(d_model)",
    ),
    Mistake(
        STAGE, "encoder skips the positional encoding",
        "        x = self.positional_encoding(x)\n        for layer in self.layers:\n            x = layer(x, mask)",
        "        for layer in self.layers:\n            x = layer(x, mask)",
        fails="model_encoder_values", cause="self.positional_encoding is never called",
    ),
    Mistake(
        STAGE, "encoder blocks kept in a plain Python list",
        _ENCODER_LAYERS,
        "self.layers = [EncoderBlock(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)]",
        fails="model_encoder_layers", cause="plain Python list",
    ),
    Mistake(
        STAGE, "encoder uses one block object num_layers times",
        _ENCODER_LAYERS,
        "self.layers = nn.ModuleList([EncoderBlock(d_model, num_heads, d_ff, dropout)] * num_layers)",
        fails="model_encoder_values", cause="one block object is repeated",
    ),
    Mistake(
        STAGE, "decoder blocks kept in a plain Python list",
        _DECODER_LAYERS,
        "self.layers = [DecoderBlock(d_model, num_heads, d_ff, dropout) for _ in range(num_layers)]",
        fails="model_decoder_layers", cause="plain Python list",
    ),
    Mistake(
        STAGE, "decoder repeats one block object",
        _DECODER_LAYERS,
        "block = DecoderBlock(d_model, num_heads, d_ff, dropout)\n"
        "        self.layers = nn.ModuleList([block for _ in range(num_layers)])",
        fails="model_decoder_layers", cause="repeats the same block object",
    ),
    Mistake(
        STAGE, "decoder scales by sqrt(d_model) after adding the positional encoding",
        "x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, tgt_len, d_model)\n"
        "        x = self.positional_encoding(x)",
        "x = self.positional_encoding(self.embedding(x)) * math.sqrt(self.d_model)  # (batch, tgt_len, d_model)",
        fails="model_decoder_values", cause="sqrt(d_model) multiplies the sum embedding + PE",
    ),
    Mistake(
        STAGE, "decoder blocks get the source and target masks swapped",
        "x = layer(x, enc_out, enc_mask, dec_mask)",
        "x = layer(x, enc_out, dec_mask, enc_mask)",
        fails="model_decoder_values", cause="self.layers[0] receives `dec_mask` as its argument `enc_mask`",
    ),
    Mistake(
        STAGE, "decoder returns the hidden states without the prediction layer",
        "logits = self.pred_layer(x)  # (batch, tgt_len, vocab_size)",
        "logits = x  # (batch, tgt_len, d_model)",
        fails="model_decoder_values", cause="self.pred_layer is never called",
    ),
    Mistake(
        STAGE, "decoder blocks all read the embeddings; only the last block's output reaches pred_layer",
        "x = layer(x, enc_out, enc_mask, dec_mask)\n"
        "        logits = self.pred_layer(x)",
        "output = layer(x, enc_out, enc_mask, dec_mask)\n"
        "        logits = self.pred_layer(output)",
        fails="model_decoder_layers", cause="each block must receive the previous block's output",
    ),
    Mistake(
        STAGE, "Encoder never looks the ids up in its embedding table",
        "x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)",
        "x = x * math.sqrt(self.d_model)  # (batch, src_len, d_model)",
        fails="model_encoder_shape", cause="self.embedding is never called",
    ),
    Mistake(
        STAGE, "decoder returns probabilities (softmax on the logits)",
        "logits = self.pred_layer(x)  # (batch, tgt_len, vocab_size)",
        "logits = self.pred_layer(x).softmax(dim=-1)  # (batch, tgt_len, vocab_size)",
        fails="model_decoder_values", cause="forward returns a softmax of the output of self.pred_layer",
    ),
    Mistake(
        STAGE, "Transformer passes the masks to the decoder in the wrong order",
        "logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask)",
        "logits = self.decoder(dec_in, enc_out, dec_mask, enc_mask)",
        fails="model_transformer_values",
        cause="self.decoder receives `dec_mask` (the target mask) as its argument `enc_mask`",
    ),
    Mistake(
        STAGE, "Transformer runs the encoder without the source mask",
        "enc_out = self.encoder(enc_in, enc_mask)  # (batch, src_len, d_model)",
        "enc_out = self.encoder(enc_in, None)  # (batch, src_len, d_model)",
        fails="model_transformer_values", cause="self.encoder receives None as its mask",
    ),
    # --- issue 20: parts the paper's stack has not cost the value checks, not the registration check
    # (tests/test_blocks_and_model_checks.py holds model_encoder_layers passing for both) ---
    Mistake(
        STAGE, "Encoder adds a LayerNorm after its last block",
        _ENCODER_PARTS,
        _ENCODER_LAYERS + "\n        self.norm = nn.LayerNorm(d_model)"
        "\n\n    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:\n"
        "        ### BEGIN SOLUTION\n        " + _ENCODER_FORWARD + "\n        x = self.norm(x)",
        fails="model_encoder_values", cause="forward returns the output of self.norm where the reference returns",
    ),
    Mistake(
        STAGE, "Encoder adds a learned position table instead of the sinusoidal encoding",
        _ENCODER_PARTS,
        _ENCODER_LAYERS + "\n        self.positions = nn.Embedding(max_seq_length, d_model)"
        "\n\n    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:\n"
        "        ### BEGIN SOLUTION\n"
        "        x = self.embedding(x) * math.sqrt(self.d_model) + self.positions(torch.arange(x.size(1)))\n"
        "        for layer in self.layers:\n            x = layer(x, mask)",
        fails="model_encoder_values", cause="self.positional_encoding is never called",
    ),
]

ALTERNATIVES: list[Alternative] = [
    Alternative(
        STAGE, "target mask from view and a position comparison written the other way round",
        "    key_is_word = (tgt != pad_idx)[:, None, None, :]  # (batch, 1, 1, tgt_len): the padding rule, about keys\n"
        "    positions = torch.arange(tgt.size(1), device=tgt.device)  # (tgt_len,)\n"
        "    not_later = positions[None, :] <= positions[:, None]  # (tgt_len, tgt_len): key j <= query i\n"
        "    return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)\n",
        "    positions = torch.arange(tgt.size(1), device=tgt.device)  # (tgt_len,)\n"
        "    earlier = positions.view(-1, 1) >= positions.view(1, -1)  # (tgt_len, tgt_len): query i >= key j\n"
        "    return (tgt != pad_idx).view(tgt.size(0), 1, 1, -1) & earlier  # (batch, 1, tgt_len, tgt_len)\n",
    ),
    Alternative(
        STAGE, "target mask filled position by position in loops",
        "    key_is_word = (tgt != pad_idx)[:, None, None, :]  # (batch, 1, 1, tgt_len): the padding rule, about keys\n"
        "    positions = torch.arange(tgt.size(1), device=tgt.device)  # (tgt_len,)\n"
        "    not_later = positions[None, :] <= positions[:, None]  # (tgt_len, tgt_len): key j <= query i\n"
        "    return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)\n",
        "    batch, length = tgt.shape\n"
        "    mask = torch.zeros(batch, 1, length, length, dtype=torch.bool, device=tgt.device)\n"
        "    for i in range(length):\n"
        "        for j in range(i + 1):\n"
        "            mask[:, 0, i, j] = tgt[:, j] != pad_idx\n"
        "    return mask\n",
    ),
    Alternative(
        STAGE, "target mask from torch.triu of the transposed view and logical not, with unsqueeze",
        "    key_is_word = (tgt != pad_idx)[:, None, None, :]  # (batch, 1, 1, tgt_len): the padding rule, about keys\n"
        "    positions = torch.arange(tgt.size(1), device=tgt.device)  # (tgt_len,)\n"
        "    not_later = positions[None, :] <= positions[:, None]  # (tgt_len, tgt_len): key j <= query i\n"
        "    return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)\n",
        "    length = tgt.size(1)\n"
        "    future = torch.triu(torch.ones(length, length, dtype=torch.bool, device=tgt.device), diagonal=1)\n"
        "    padding = tgt.ne(pad_idx).unsqueeze(1).unsqueeze(2)  # (batch, 1, 1, tgt_len)\n"
        "    return torch.logical_and(padding, torch.logical_not(future))\n",
    ),
    Alternative(
        STAGE, "target mask from ones().tril(), the padding test unsqueezed, combined by multiplying",
        "    key_is_word = (tgt != pad_idx)[:, None, None, :]  # (batch, 1, 1, tgt_len): the padding rule, about keys\n"
        "    positions = torch.arange(tgt.size(1), device=tgt.device)  # (tgt_len,)\n"
        "    not_later = positions[None, :] <= positions[:, None]  # (tgt_len, tgt_len): key j <= query i\n"
        "    return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)\n",
        "    lower = torch.ones(tgt.size(1), tgt.size(1), device=tgt.device).tril()  # (tgt_len, tgt_len), float\n"
        "    words = (tgt != pad_idx).float().unsqueeze(1).unsqueeze(1)  # (batch, 1, 1, tgt_len)\n"
        "    return (words * lower).bool()  # (batch, 1, tgt_len, tgt_len)\n",
    ),
    Alternative(
        STAGE, "target mask: look-ahead part as triu of the transposed square",
        "    not_later = positions[None, :] <= positions[:, None]",
        "    not_later = torch.ones(len(positions), len(positions), dtype=torch.bool, device=tgt.device).triu().T",
    ),
    Alternative(
        STAGE, "decoder blocks appended to an nn.ModuleList in a loop",
        _DECODER_LAYERS,
        "self.layers = nn.ModuleList()\n"
        "        for _ in range(num_layers):\n"
        "            self.layers.append(DecoderBlock(d_model, num_heads, d_ff, dropout))",
    ),
    Alternative(
        STAGE, "target mask combined with torch.where",
        "return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)",
        "return torch.where(not_later, key_is_word, torch.zeros_like(key_is_word))  # (batch, 1, tgt_len, tgt_len)",
    ),
    Alternative(
        STAGE, "target mask returned as integer 0/1",
        "return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)",
        "return (key_is_word & not_later).int()  # 1 = may attend",
    ),
    Alternative(
        STAGE, "encoder scaled with d_model ** 0.5 and its layers indexed in a loop",
        _ENCODER_FORWARD,
        "x = self.positional_encoding(self.embedding(x) * self.d_model ** 0.5)  # (batch, src_len, d_model)\n"
        "        for index in range(len(self.layers)):\n"
        "            x = self.layers[index](x, mask=mask)",
    ),
    Alternative(
        STAGE, "Transformer forward in one line, with keyword arguments",
        "enc_out = self.encoder(enc_in, enc_mask)  # (batch, src_len, d_model)\n"
        "        logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask)",
        "logits = self.decoder(dec_in, self.encoder(enc_in, mask=enc_mask), enc_mask=enc_mask, dec_mask=dec_mask)",
    ),
]

# --- held out ---------------------------------------------------------------------------------------------
# Written before the checks were reworked for issue 10 and never tuned to (see quality/mistakes/blocks.py
# and scripts/measure_held_out.py): `cause` lists phrases separated by " | ".

HELD_OUT: list[Mistake] = [
    Mistake(
        STAGE, "target mask: look-ahead mask built on the default device, whatever the device of tgt",
        "positions = torch.arange(tgt.size(1), device=tgt.device)",
        "positions = torch.arange(tgt.size(1))",
        fails="model_target_mask_device", cause="device",
    ),
    Mistake(
        STAGE, "target mask: float lower triangle combined with & (no bool)",
        "not_later = positions[None, :] <= positions[:, None]",
        "not_later = torch.tril(torch.ones(tgt.size(1), tgt.size(1), device=tgt.device))",
        fails="model_target_mask_values", cause="dtype=torch.bool | .bool() | to bool",
    ),
    Mistake(
        STAGE, "Encoder keeps the layers' results in another variable and returns the embeddings",
        _ENCODER_FORWARD,
        "x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)\n"
        "        x = self.positional_encoding(x)\n"
        "        for layer in self.layers:\n"
        "            out = layer(x, mask)",
        fails="model_encoder_values", cause="never updated | not kept | positional encoding's output | "
                                             "output of the positional encoding | no layer",
    ),
    Mistake(
        STAGE, "Encoder scales the token ids instead of the embedding vectors",
        "x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)",
        "x = self.embedding(x * math.sqrt(self.d_model))  # (batch, src_len, d_model)",
        fails="model_encoder_shape", cause="not the ids | not the token ids | the vectors, not | before the embedding",
    ),
    Mistake(
        STAGE, "Encoder adds the positional table by hand (its dropout never runs)",
        "        x = self.positional_encoding(x)\n        for layer in self.layers:\n            x = layer(x, mask)",
        "        x = x + self.positional_encoding.pe[:, : x.size(1)]\n"
        "        for layer in self.layers:\n            x = layer(x, mask)",
        fails="model_embedding_dropout", cause="dropout",
    ),
    Mistake(
        STAGE, "Decoder gives its blocks the source mask twice",
        "x = layer(x, enc_out, enc_mask, dec_mask)",
        "x = layer(x, enc_out, enc_mask, enc_mask)",
        fails="model_decoder_values", cause="instead of dec_mask | enc_mask twice | both masks | gets enc_mask | "
                                             "no target mask | target mask is missing",
    ),
    Mistake(
        STAGE, "Decoder applies its blocks in reverse order",
        "for layer in self.layers:\n            x = layer(x, enc_out, enc_mask, dec_mask)",
        "for layer in reversed(self.layers):\n            x = layer(x, enc_out, enc_mask, dec_mask)",
        fails="model_decoder_values", cause="reverse | wrong order | in turn",
    ),
    Mistake(
        STAGE, "Transformer gives the decoder the source token ids instead of the encoder output",
        "logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask)",
        "logits = self.decoder(dec_in, enc_in, enc_mask, dec_mask)",
        fails="model_transformer_shape", cause="token ids instead | source ids | enc_in instead | "
                                                "instead of the encoder output | not the encoder output",
    ),
    Mistake(
        STAGE, "Transformer detaches the encoder output (no gradient reaches the encoder)",
        "enc_out = self.encoder(enc_in, enc_mask)  # (batch, src_len, d_model)",
        "enc_out = self.encoder(enc_in, enc_mask).detach()  # (batch, src_len, d_model)",
        fails="model_gradients", cause="gradient | detach",
    ),
    Mistake(
        STAGE, "Transformer gives the decoder the source mask as its target mask",
        "logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask)",
        "logits = self.decoder(dec_in, enc_out, enc_mask, enc_mask)",
        fails="model_transformer_values", cause="instead of dec_mask | enc_mask twice | both masks | gets enc_mask | "
                                                 "no target mask | target mask is missing",
    ),
    Mistake(
        STAGE, "Transformer encodes the source a second time for the decoder (the logits are right, the work doubles)",
        "logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask)",
        "logits = self.decoder(dec_in, self.encoder(enc_in, enc_mask), enc_mask, dec_mask)",
        fails="model_transformer_values", cause="encoded more than once",
    ),
]
