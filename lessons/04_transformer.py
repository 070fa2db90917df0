# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# <!-- colab-badge -->
#
# # Stage 4 — The full encoder–decoder Transformer
#
# *Transformers from Scratch*: you build the Transformer of Vaswani et al.,
# ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (2017), one stage at a time,
# and train it to translate German into English.
#
# | stage | notebook |
# |---|---|
# | 0 (optional) | why attention: the RNN bottleneck, additive attention |
# | 1 | positional encoding |
# | 2 | scaled dot-product and multi-head attention, masks |
# | 3 | feed-forward, residual + LayerNorm, encoder and decoder blocks |
# | **4** | **the full encoder–decoder** (this one) |
# | 5 | training on Multi30k German→English |
# | 6 | greedy decoding, BLEU, attention heatmaps |
# | 7 (optional) | the key/value cache and beam search |
#
# **Working time:** about 1 hour 40 minutes: 35 minutes of reading, four exercises (about 50
# minutes), three written questions (about 15 minutes), and cells that run in seconds. (Estimated by
# `scripts/working_time.py` in the course repository: reading at 150 words and 10 lines of given
# code a minute, 5 minutes per exercise plus 2 per line you write, 5 per written question, and the
# measured run time of the cells.)
#
# ## Learning outcomes
# After this notebook you can
# 1. trace a batch of token ids through the whole model and name the shape after every step;
# 2. say where the embeddings are multiplied by $\sqrt{d_{model}}$ (before the positional encoding is
#    added) and what the factor changes;
# 3. explain teacher forcing and build the target mask from a padding part and a look-ahead part;
# 4. implement `Encoder`, `Decoder` and `Transformer` so that every block is registered with PyTorch;
# 5. count the parameters per component and compare them with the paper's base model;
# 6. test a model for causality and padding invariance, and against PyTorch's own `nn.Transformer`.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package),
# then the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is
# given and correct. After each exercise a few *check cells* test one property each: `✔` means it
# holds, a red `✘` block says what was expected, what came out and the likely cause. A failing check
# does not stop the notebook: *Run all* always reaches the end, where the last cell lists every
# check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work, so all
# green here means full marks for the visible checks (the grader also runs a few hidden ones with
# other sizes).
#
# The pieces from stages 1–3 are imported from the course's reference code, so a slip in an earlier
# notebook cannot break this one.
#
# <!-- keep-and-hand-in -->

# %% readonly="setup"
#| setup

# %%
#| settings

# %%
import math

import matplotlib.pyplot as plt
import torch
from torch import nn

from transformer_course.checks import model as check
from transformer_course.reference import (  # the earlier stages, from the course's reference code
    DecoderBlock,  # noqa: F401  (used by the Decoder below)
    EncoderBlock,
    MultiHeadAttention,  # noqa: F401  (used inside the blocks)
    PositionalEncoding,  # noqa: F401  (used by the Encoder and Decoder below)
    count_parameters,
    make_look_ahead_mask,
    make_padding_mask,
)
from transformer_course.visualisation import diagrams
from transformer_course.visualisation import model as figures

# %% [markdown]
# ## 1. The whole architecture
#
# The diagram below is Figure 1 of the paper, drawn for this course. Read it from the bottom:
#
# - **left, the encoder.** The source sentence (German) becomes token ids, the ids become vectors
#   (embedding, scaled by $\sqrt{d_{model}}$, plus the positional encoding of stage 1), and $N$
#   encoder blocks (stage 3) refine them. The result, `enc_out`, holds one vector per source token
#   that describes the token *in its context*.
# - **right, the decoder.** The target sentence (English) so far goes through the same kind of
#   embedding, then $N$ decoder blocks. Each block attends to earlier target tokens (masked
#   self-attention) and to `enc_out` (cross-attention).
# - **top, the prediction layer.** A linear layer turns each decoder vector into one score per word
#   of the target vocabulary: the **logits**. A softmax of the logits is the model's probability for
#   the next word.
#
# In the paper $N = 6$, $d_{model} = 512$, $h = 8$ heads and $d_{ff} = 2048$ (the *base* model).
# Everything in this notebook works for any sizes; the examples use small ones so they run fast.

# %%
diagrams.show("transformer")

# %% [markdown]
# ## 2. A toy batch to follow through the model
#
# Two German sentences and their English translations, with tiny vocabularies. The special tokens
# come first, with the ids the whole course uses (the vocabularies of stage 5 are built the same
# way): `<unk>` = 0 (unknown word), `<bos>` = 1 (beginning of sentence), `<eos>` = 2 (end of
# sentence) and `<pad>` = 3 (filler that makes sentences the same length). Every function takes the
# pad id as an argument (`pad_idx`), so nothing depends on that choice.
#
# The second sentence is shorter, so it is filled up with `<pad>`. A batch is then one integer
# tensor of shape `(batch, seq_len)`.

# %%
SPECIALS = ["<unk>", "<bos>", "<eos>", "<pad>"]  # ids 0, 1, 2, 3
source_vocabulary = SPECIALS + ["zwei", "kleine", "katzen", "schlafen", "ein", "hund", "läuft"]
target_vocabulary = SPECIALS + ["two", "small", "cats", "are", "sleeping", "a", "dog", "runs"]
BOS, EOS, PAD = 1, 2, 3


def encode(words: list[str], vocabulary: list[str], length: int) -> list[int]:
    """Words -> ids, padded with PAD up to `length`."""
    ids = [vocabulary.index(word) for word in words]
    return ids + [PAD] * (length - len(ids))


src = torch.tensor([encode("zwei kleine katzen schlafen <eos>".split(), source_vocabulary, 5),
                    encode("ein hund läuft <eos>".split(), source_vocabulary, 5)])  # (batch, src_len)
tgt = torch.tensor([encode("<bos> two small cats are sleeping <eos>".split(), target_vocabulary, 7),
                    encode("<bos> a dog runs <eos>".split(), target_vocabulary, 7)])  # (batch, 7)
print("src:", src.shape, src.tolist())
print("tgt:", tgt.shape, tgt.tolist())

# %% [markdown]
# ## 3. From token ids to vectors
#
# Both stacks start the same way. For a batch of token ids $x$ of shape `(batch, seq_len)`:
#
# $$H^{(0)} = \mathrm{Dropout}\!\left(E[x]\,\sqrt{d_{model}} + PE_{[0:\,seq\_len]}\right)$$
#
# - $E$ — the embedding table, one learned row of width $d_{model}$ per vocabulary word
#   (`nn.Embedding(vocab_size, d_model)`); $E[x]$ looks up one row per token:
#   `(batch, seq_len)` → `(batch, seq_len, d_model)`;
# - $\sqrt{d_{model}}$ — the scaling of section 3.4 of the paper, which gives no reason for it. It sets
#   the size of the word signal relative to the position signal (PE entries lie in $[-1, 1]$);
#   stage 1 measured that which of the two is larger depends on how the embeddings are initialised.
#   The factor multiplies the **embeddings only**, before PE is added;
# - $PE_{[0:\,seq\_len]}$ — the first `seq_len` rows of the sinusoid table of stage 1;
# - Dropout — applied to the sum, inside `PositionalEncoding.forward`.
#
# In code: `self.positional_encoding(self.embedding(x) * math.sqrt(self.d_model))`. The cell below
# shows the lookup on the toy source batch.

# %%
d_model = 32
embedding = nn.Embedding(len(source_vocabulary), d_model)
vectors = embedding(src)  # (batch, src_len, d_model)
print("token ids", tuple(src.shape), "-> embeddings", tuple(vectors.shape))
print("row of token 'hund' equals embedding.weight[9]:", torch.equal(vectors[1, 1], embedding.weight[9]))

# %% [markdown]
# ## 4. The encoder stack
#
# After the embedding come $N$ encoder blocks, each feeding the next:
#
# $$H^{(\ell)} = \mathrm{EncoderBlock}_\ell\!\left(H^{(\ell-1)},\, M_{src}\right), \quad \ell = 1, \dots, N,
# \qquad \texttt{enc\_out} = H^{(N)}$$
#
# - $H^{(\ell)}$ — the vectors after block $\ell$, shape `(batch, src_len, d_model)` throughout;
# - $M_{src}$ — the **source mask**: `True` where a key is a real token, `False` at padding, shape
#   `(batch, 1, 1, src_len)` so it broadcasts over heads and query positions. Every encoder block
#   gets the same mask. It is the padding mask of stage 2, given below as `make_source_mask`.
#
# Each block has its *own* weights: $N$ blocks means $N$ separately created `EncoderBlock` objects.
# They live in an `nn.ModuleList`, which registers them with PyTorch (section 11 shows what goes
# wrong with a plain Python list). The given constructor already builds them.

# %%
#| include transformer_course.reference.model:make_source_mask

# %%
source_mask = make_source_mask(src, PAD)  # (batch, 1, 1, src_len)
print(source_mask.shape)
print(source_mask[:, 0, 0].int())  # the second sentence has one pad token at the end

# %% [markdown]
# ## 5. Teacher forcing: what the decoder reads and what it predicts
#
# The decoder is trained to predict the next target word. During training we already know the
# whole translation, so instead of feeding the decoder its own (at first mostly wrong) guesses, we
# feed it the **true** previous words. That is **teacher forcing**:
#
# - decoder input `dec_in` = the target **shifted right**: `<bos>` followed by the target words,
#   without the last token;
# - labels = the target **shifted left**: the target words followed by `<eos>`, without `<bos>`.
#
# In code, for a target batch that starts with `<bos>` and ends with `<eos>`:
# `dec_in = tgt[:, :-1]` and `labels = tgt[:, 1:]` (stage 5 does exactly this). At position $t$ the
# decoder has read `<bos>`, $y_1, \dots, y_t$ and must output $y_{t+1}$.
#
# Teacher forcing only works if position $t$ **cannot look at** positions after $t$: the input at
# position $t+1$ *is* the label of position $t$, so a decoder that could look ahead would learn to
# copy, and would be useless when it has to translate a sentence it has not seen.

# %%
figures.plot_teacher_forcing(["two", "small", "cats", "are", "sleeping"])
plt.show()

# %%
dec_in, labels = tgt[:, :-1], tgt[:, 1:]  # (batch, 6) each
for row in range(2):
    print("dec_in :", [target_vocabulary[i] for i in dec_in[row]])
    print("labels :", [target_vocabulary[i] for i in labels[row]], "\n")

# %% [markdown]
# Look at the second sentence: its `dec_in` contains `<eos>` and `<pad>`, and its labels end in two
# `<pad>`s. Positions whose label is `<pad>` predict nothing useful; the loss of stage 5 ignores
# them (`ignore_index=PAD`).

# %% [markdown]
# ## 6. The target mask: padding **and** look-ahead
#
# The decoder's self-attention needs two rules at once:
#
# $$M_{tgt}[b, i, j] = \underbrace{[\,j \le i\,]}_{\text{look-ahead}} \;\wedge\;
#   \underbrace{[\,y_{b,j} \ne \texttt{pad}\,]}_{\text{padding}}$$
#
# - $b$ — the sentence in the batch, $i$ — the query position (the one attending),
#   $j$ — the key position (the one attended to);
# - **look-ahead**: query $i$ may see keys $0, \dots, i$ — itself included — and nothing later
#   (the lower triangle of a `(tgt_len, tgt_len)` matrix; `make_look_ahead_mask` of stage 2);
# - **padding**: no query may attend to a pad token (`make_padding_mask` of stage 2).
#
# Why both? Padding alone lets every position see the future, which breaks teacher forcing.
# Look-ahead alone is *almost* enough when the pads sit at the end of each sentence, as here: a
# real token only sees earlier positions, and those are never pads. But the pad positions would
# still attend to each other, and a batch padded anywhere else (some pipelines pad on the left)
# would leak pads into real positions. The combined mask is right for any layout and costs one
# `&`; PyTorch's `nn.Transformer` does the same when given both `tgt_mask` and
# `tgt_key_padding_mask`.
#
# Below are the two ingredients for the second sentence of `dec_in`. Your combined mask must be
# blue only where **both** are blue.

# %%
second = dec_in[1:2]  # (1, tgt_len)
tokens = [target_vocabulary[i] for i in second[0]]
padding = make_padding_mask(second, PAD)  # (1, 1, 1, tgt_len)
look_ahead = make_look_ahead_mask(second.size(1))  # (1, 1, tgt_len, tgt_len)
figures.plot_mask_panels({"padding mask (keys)": padding.expand(1, 1, 6, 6),
                          "look-ahead mask": look_ahead}, labels=tokens)
plt.show()

# %% [markdown]
# ### Exercise 1: `make_target_mask`
#
# Return a bool mask of shape `(batch, 1, tgt_len, tgt_len)`, `True` where query $i$ may attend to
# key $j$. Use `make_padding_mask(tgt, pad_idx)` (shape `(batch, 1, 1, tgt_len)`) and
# `make_look_ahead_mask(tgt.size(1), device=tgt.device)` (shape `(1, 1, tgt_len, tgt_len)`); the
# `&` of the two broadcasts to the full shape. Creating the look-ahead mask on `tgt.device` keeps
# the function working on a GPU.

# %% solution="model_make_target_mask"
#| include transformer_course.reference.model:make_target_mask

# %% [markdown]
# #### Check your work

# %% tests="model_target_mask_shape" points=1
assert check.target_mask_shape(make_target_mask)

# %% tests="model_target_mask_values" points=2
assert check.target_mask_values(make_target_mask)

# %% tests="model_target_mask_device" points=1
assert check.target_mask_device(make_target_mask)

# %% tests="model_target_mask_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.target_mask_shape(make_target_mask, batch=5, tgt_len=4, pad_idx=0)
assert check.target_mask_values(make_target_mask, batch=4, tgt_len=9, pad_idx=0)
assert check.target_mask_values(make_target_mask, batch=2, tgt_len=5, pad_idx=3)
### END HIDDEN TESTS

# %% [markdown]
# Your mask for the whole toy batch: the first sentence has no padding, so its mask is the plain
# lower triangle; in the second, the column of the pad token is grey in every row.

# %%
with skip_until_implemented("make_target_mask"):
    target_mask = make_target_mask(dec_in, PAD)  # (batch, 1, tgt_len, tgt_len)
    print("target mask:", tuple(target_mask.shape), target_mask.dtype)
    sentences = [[target_vocabulary[i] for i in row] for row in dec_in]
    figures.plot_mask_panels({f"sentence {row}: padding & look-ahead": target_mask[row] for row in range(2)},
                             labels=sentences)
    plt.show()

# %% [markdown]
# ## 7. Exercise 2: the `Encoder`
#
# Write `forward(x, mask)`: token ids `(batch, src_len)` → vectors `(batch, src_len, d_model)`.
#
# 1. look up the embeddings and multiply them by $\sqrt{d_{model}}$ (`self.d_model` is stored);
# 2. add the positional encoding with `self.positional_encoding(...)` (it also applies dropout);
# 3. run the blocks in order, each on the previous one's output, all with the same `mask`.
#
# | step | shape |
# |---|---|
# | `x` (token ids) | `(batch, src_len)` |
# | `self.embedding(x) * sqrt(d_model)` | `(batch, src_len, d_model)` |
# | `self.positional_encoding(...)` | `(batch, src_len, d_model)` |
# | after each `layer(x, mask)` | `(batch, src_len, d_model)` |
#
# The constructor is given: keep it as it is, the checks copy weights by its parameter names.

# %% solution="model_encoder"
#| include transformer_course.reference.model:Encoder

# %% [markdown]
# #### Check your work
# The value check copies the reference weights into your encoder and compares outputs in float64.
# If it fails, its message names the likely mistake.

# %% tests="model_encoder_shape" points=1
assert check.encoder_output_shape(Encoder)

# %% tests="model_encoder_values" points=2
assert check.encoder_values(Encoder)

# %% tests="model_encoder_layers" points=1
assert check.encoder_layers_registered(Encoder)

# %% tests="model_encoder_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.encoder_output_shape(Encoder, src_vocab=17, d_model=24, num_heads=3, num_layers=3, d_ff=20,
                                  batch=4, src_len=9, pad_idx=0)
assert check.encoder_values(Encoder, src_vocab=17, d_model=24, num_heads=3, num_layers=3, d_ff=20,
                            batch=4, src_len=9, pad_idx=0)
assert check.encoder_layers_registered(Encoder, num_layers=4, d_model=8, num_heads=2, d_ff=12)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Exercise 3: the `Decoder` and the prediction layer
#
# The decoder starts like the encoder, then each block gets four inputs: its own input, the encoder
# output and both masks. Watch the order in `DecoderBlock.forward(x, enc_out, enc_mask, dec_mask)`:
# the **source** mask is for cross-attention (queries from the target, keys from the source), the
# **target** mask for masked self-attention.
#
# $$G^{(0)} = \mathrm{Dropout}\!\left(E_{tgt}[y]\sqrt{d_{model}} + PE\right),\quad
#   G^{(\ell)} = \mathrm{DecoderBlock}_\ell\!\left(G^{(\ell-1)}, \texttt{enc\_out}, M_{src}, M_{tgt}\right),
#   \quad \texttt{logits} = G^{(N)} W_{pred} + b_{pred}$$
#
# - $W_{pred}$ — shape `(d_model, vocab_size)`, $b_{pred}$ — `(vocab_size,)`: `self.pred_layer`;
# - logits — shape `(batch, tgt_len, vocab_size)`: at each position, one unnormalised score per
#   target word. **Return the logits, not probabilities**: the cross-entropy loss of stage 5 applies
#   the (log-)softmax itself, in a numerically safer way.
#
# The probability of the next word is then
# $p(y_{t+1} = w \mid y_{\le t}, x) = \mathrm{softmax}(\texttt{logits}_{t})_w$.

# %% solution="model_decoder"
#| include transformer_course.reference.model:Decoder

# %% [markdown]
# #### Check your work

# %% tests="model_decoder_shape" points=1
assert check.decoder_output_shape(Decoder)

# %% tests="model_decoder_values" points=2
assert check.decoder_values(Decoder)

# %% tests="model_decoder_layers" points=1
assert check.decoder_layers_registered(Decoder)

# %% tests="model_embedding_dropout" points=1
assert check.embedding_dropout(Encoder, Decoder)

# %% tests="model_decoder_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.decoder_output_shape(Decoder, tgt_vocab=9, d_model=24, num_heads=3, num_layers=3, d_ff=20,
                                  batch=4, src_len=8, tgt_len=5, pad_idx=0)
assert check.decoder_values(Decoder, tgt_vocab=9, d_model=24, num_heads=3, num_layers=3, d_ff=20,
                            batch=4, src_len=6, tgt_len=6, pad_idx=0)
assert check.decoder_values(Decoder, tgt_vocab=19, num_layers=1, batch=2, src_len=10, tgt_len=4)
assert check.decoder_layers_registered(Decoder, num_layers=4, d_model=8, num_heads=2, d_ff=12)
### END HIDDEN TESTS

# %% [markdown]
# ## 9. Exercise 4: the `Transformer`
#
# The full model only wires the two stacks together:
#
# 1. `enc_out = self.encoder(enc_in, enc_mask)` — shape `(batch, src_len, d_model)`;
# 2. `logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask)` — shape `(batch, tgt_len, dec_vocab_size)`.
#
# The encoder runs **once** per batch; every decoder block reads the same `enc_out`. The given
# constructor also initialises every weight matrix with Xavier-uniform initialisation, a common
# choice for Transformers (the paper does not state its initialisation).

# %% solution="model_transformer"
#| include transformer_course.reference.model:Transformer

# %% [markdown]
# #### Check your work
# Besides the comparison with the reference, these checks test properties any correct
# encoder–decoder must have, and compare your model with PyTorch's own `nn.Transformer`:
#
# - **`nn.Transformer`** implements the same blocks. The check gives your model and PyTorch's the
#   same weights (`W_q, W_k, W_v` concatenated into `in_proj_weight`, `W_o` into `out_proj`),
#   removes the extra LayerNorm it puts after each stack (`.encoder.norm = None`,
#   `.decoder.norm = None`; the paper's post-LN model has none), wraps it in our embeddings
#   $\times\sqrt{d_{model}}$, PE and `pred_layer`, and converts the masks: PyTorch's bool masks mean
#   `True` = **hidden**, the opposite of ours.
# - **causality**: changing target tokens after position $t$ must not change the logits at
#   positions $\le t$. This uses *your* `make_target_mask`.
# - **padding invariance**: extra `<pad>` tokens change no logit of a real position.

# %% tests="model_transformer_shape" points=1
assert check.transformer_output_shape(Transformer)

# %% tests="model_transformer_values" points=2
assert check.transformer_values(Transformer)

# %% tests="model_transformer_builtin" points=2
assert check.matches_torch_transformer(Transformer)

# %% tests="model_causality" points=2
assert check.transformer_causality(Transformer)

# %% tests="model_source_padding" points=1
assert check.source_padding_invariance(Transformer)

# %% tests="model_target_padding" points=1
assert check.target_padding_invariance(Transformer)

# %% tests="model_gradients" points=1
assert check.transformer_gradients(Transformer)

# %% tests="model_no_builtins" points=1
assert check.no_builtin_modules(Transformer)

# %% tests="model_transformer_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.transformer_output_shape(Transformer, src_vocab=17, tgt_vocab=9, d_model=24, num_heads=3,
                                      num_layers=3, d_ff=20, pad_idx=0, batch=4, src_len=8, tgt_len=5)
assert check.transformer_values(Transformer, src_vocab=17, tgt_vocab=9, d_model=24, num_heads=3,
                                num_layers=3, d_ff=20, pad_idx=0, batch=4, src_len=8, tgt_len=5)
assert check.matches_torch_transformer(Transformer, src_vocab=17, tgt_vocab=9, d_model=24, num_heads=3,
                                       num_layers=3, d_ff=20, pad_idx=0, batch=4, src_len=8, tgt_len=5)
assert check.transformer_causality(Transformer, src_vocab=17, tgt_vocab=9, d_model=24, num_heads=3,
                                   num_layers=3, d_ff=20, pad_idx=0, batch=4, src_len=8, tgt_len=5)
assert check.source_padding_invariance(Transformer, extra=5, tgt_vocab=9, d_model=24, num_heads=3,
                                       num_layers=3, pad_idx=0, batch=4, src_len=8, tgt_len=5)
assert check.target_padding_invariance(Transformer, extra=2, tgt_vocab=9, d_model=24, num_heads=3,
                                       num_layers=3, pad_idx=0, batch=4, src_len=8, tgt_len=5)
### END HIDDEN TESTS

# %% [markdown]
# ## 10. Following the toy batch through your model
#
# A **forward hook** is a function PyTorch calls right after a module's `forward`, with the
# module, its inputs and its output. Hooks let you watch a model without editing it, which makes
# them a good debugging tool. The cell below hangs a hook on the main parts of your model and prints
# each output's shape as the toy batch flows through. (The multiplication by $\sqrt{d_{model}}$ is
# not a module, so it happens silently between the `embedding` and `positional_encoding` lines.)

# %%
def print_shapes(model: nn.Module, *inputs: torch.Tensor) -> torch.Tensor:
    """Run model(*inputs) once, printing the output shape of the embeddings, PE, every block and pred_layer."""
    watched = ("embedding", "positional_encoding", "pred_layer")
    handles = [
        module.register_forward_hook(lambda _m, _i, output, name=name: print(f"{name:32s} {tuple(output.shape)}"))
        for name, module in model.named_modules()
        if name.endswith(watched) or (name.count(".") == 2 and ".layers." in name)
    ]
    try:
        with torch.no_grad():
            return model(*inputs)
    finally:
        for handle in handles:
            handle.remove()  # hooks stay until removed


# %%
with skip_until_implemented("Transformer (or a part of it)"):
    torch.manual_seed(0)
    toy_model = Transformer(len(source_vocabulary), len(target_vocabulary), d_model=32, num_heads=4,
                            num_layers=2, d_ff=64, max_seq_length=50, dropout=0.1).eval()
    print(f"{'src':32s} {tuple(src.shape)}\n{'dec_in':32s} {tuple(dec_in.shape)}")
    logits = print_shapes(toy_model, src, dec_in, make_source_mask(src, PAD), make_target_mask(dec_in, PAD))
    cross = toy_model.decoder.layers[0].cross_attn.attn_weights  # kept by MultiHeadAttention
    print(f"{'cross-attention weights, block 0':32s} {tuple(cross.shape)}  (batch, heads, tgt_len, src_len)")

# %% [markdown]
# The logits become next-word probabilities with a softmax over the last axis. The model is
# untrained, so its guesses are arbitrary; after stage 5 the bright cell of row $t$ should be the
# label of position $t$ ("two" after `<bos>`, "small" after "two", ...).
#
# A cheap sanity check before training: a model that guesses uniformly has cross-entropy loss
# $\ln(\text{vocab size})$. An untrained model should land near that value — a bit above it here,
# because random weights make confident, arbitrary guesses. A loss far from it before training
# hints at a bug (a softmax applied twice, a missing scaling, wrong labels). Stage 5 uses this.

# %%
with skip_until_implemented("Transformer (or a part of it)"):
    torch.manual_seed(0)
    toy_model = Transformer(len(source_vocabulary), len(target_vocabulary), 32, 4, 2, 64, 50, 0.1).eval()
    with torch.no_grad():
        logits = toy_model(src, dec_in, make_source_mask(src, PAD), make_target_mask(dec_in, PAD))
    probabilities = logits.softmax(dim=-1)  # (batch, tgt_len, vocab_size), rows sum to 1
    figures.plot_next_token_probabilities(probabilities[0], [target_vocabulary[i] for i in dec_in[0]],
                                          target_vocabulary)
    plt.show()
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=PAD)
    print(f"untrained loss {loss.item():.2f}; ln(vocab size) = {math.log(len(target_vocabulary)):.2f}")

# %% [markdown]
# ## 11. How many parameters?
#
# `count_parameters(model)` adds up the sizes of all trainable tensors. Below, the **paper's base
# configuration** — $d_{model} = 512$, 8 heads, $N = 6$, $d_{ff} = 2048$ and a shared vocabulary of
# about 37 000 byte-pair tokens for English and German — built on PyTorch's `meta` device: the
# tensors have shapes but no memory, so even a 100-million-parameter model is created instantly.
# Only the given constructors run, so this works before your exercises do.
#
# Where the parameters sit:
# - an **embedding** has `vocab_size × d_model` = 37 000 × 512 ≈ 18.9 M parameters;
# - an **encoder block** has $4(d_{model}^2 + d_{model})$ in attention, $2\,d_{model} d_{ff} + d_{ff} + d_{model}$
#   in the feed-forward network and $2 \times 2\,d_{model}$ in two LayerNorms ≈ 3.15 M;
#   a **decoder block** adds a second attention and a third LayerNorm ≈ 4.2 M;
# - the **positional encoding** has none: it is a fixed buffer.

# %%
with torch.device("meta"):  # shapes only, no memory and no computation
    base = Transformer(37000, 37000, d_model=512, num_heads=8, num_layers=6, d_ff=2048,
                       max_seq_length=512, dropout=0.1)
counts = {
    "encoder embedding": count_parameters(base.encoder.embedding),
    "encoder blocks (6)": count_parameters(base.encoder.layers),
    "decoder embedding": count_parameters(base.decoder.embedding),
    "decoder blocks (6)": count_parameters(base.decoder.layers),
    "pred_layer": count_parameters(base.decoder.pred_layer),
}
print("positional encoding parameters:", count_parameters(base.encoder.positional_encoding))
figures.plot_parameter_counts(counts, title="Paper's base configuration, our model", paper_total=65)
plt.show()

# %% [markdown]
# Our total is about 101 M, while Table 3 of the paper lists 65 M for the base model. The
# difference is **weight sharing**: section 3.4 of the paper uses *one* matrix for the encoder
# embedding, the decoder embedding and the prediction layer (possible because the byte-pair
# vocabulary is shared by both languages). Counting that matrix once gives the paper's figure up
# to about 2 M, which the paper does not break down. This course keeps the three separate: German
# and English get their own vocabularies in stage 5, so the matrices do not even have the same
# shape.

# %%
embedding_size = counts["encoder embedding"]
blocks = counts["encoder blocks (6)"] + counts["decoder blocks (6)"]
print(f"ours, nothing shared     : {sum(counts.values()) / 1e6:6.1f} M")
print(f"one shared 37000x512 table: {(blocks + embedding_size) / 1e6:6.1f} M   (paper: 65 M)")

# %% [markdown]
# ## 12. Pitfalls
#
# - **No $\sqrt{d_{model}}$ scaling**, or scaling *after* PE is added. Both run without error, but the
#   model is no longer the paper's (the value check compares with the reference and names them). The
#   scaling belongs to the embeddings only.
# - **Blocks in a plain Python list.** `self.layers = [EncoderBlock(...) for _ in range(N)]` hides
#   the blocks from PyTorch: `model.parameters()` misses them (the optimiser never trains them),
#   `state_dict()` does not save them and `model.to(device)` does not move them. Use `nn.ModuleList`.
# - **One block repeated $N$ times.** `nn.ModuleList([block] * N)` or `[EncoderBlock(...)] * N`
#   puts the *same object* in every slot: the model has one block's weights, used $N$ times.
# - **Masks mixed up.** The encoder and the decoder's cross-attention use the source mask; the
#   decoder's self-attention uses the target mask. `DecoderBlock` takes `(x, enc_out, enc_mask,
#   dec_mask)` in that order.
# - **Forgetting `pred_layer`**: the decoder then returns `(batch, tgt_len, d_model)` vectors, not
#   logits over the vocabulary. Applying a softmax to the logits is the opposite mistake: the
#   loss expects raw logits.
# - **A target mask without padding or without look-ahead**: without look-ahead the model copies
#   the next input during training; without padding it attends to filler tokens.
#
# The two registration pitfalls are easy to see:

# %%
class PlainListStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = [EncoderBlock(32, 4, 64, 0.1) for _ in range(2)]  # a plain list: NOT registered


class SameBlockStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([EncoderBlock(32, 4, 64, 0.1)] * 2)  # one object, twice


one_block = count_parameters(EncoderBlock(32, 4, 64, 0.1))
print("two distinct blocks should have:", 2 * one_block)
print("plain list   :", count_parameters(PlainListStack()), "parameters")
print("same block x2:", count_parameters(SameBlockStack()), "parameters")
stack = PlainListStack().double()
print("after .double(), a block in the plain list is still", stack.layers[0].norm1.weight.dtype)

# %% [markdown]
# ## Summary
# - Token ids → `embedding * sqrt(d_model)` → `+ PE` (and dropout) → $N$ blocks; the encoder's
#   output feeds the cross-attention of every decoder block.
# - Teacher forcing: `dec_in = tgt[:, :-1]` (starts with `<bos>`), `labels = tgt[:, 1:]`.
# - The target mask is `padding & look_ahead`, shape `(batch, 1, tgt_len, tgt_len)`; the source mask
#   is the padding mask `(batch, 1, 1, src_len)`.
# - `pred_layer` maps each decoder vector to logits `(batch, tgt_len, vocab_size)`; the loss takes
#   raw logits.
# - Blocks live in an `nn.ModuleList`, one new object per layer.
# - Your model equals PyTorch's `nn.Transformer` (without its final stack norms) with the same
#   weights, is causal, and ignores padding. Stage 5 trains it.
#
# The last cell lists every check of this notebook with `✔` or `✘` and its points.
# When you are done: *File → Download → Download .ipynb*, and hand in that file.

# %% [markdown]
# ## Questions: explain your reasoning
# The check cells grade your code; these questions grade your understanding, and your instructor
# reads them. Answer each one in the empty cell right below it (double-click the cell to write;
# formulas as `$...$` work), in a few sentences of your own. A good answer says *why*, with what
# you saw in this notebook; there is nothing to look up. The points are given in each question.

# %% [markdown]
# **Question 1 (2 points).** Why does the decoder need the look-ahead mask in training while the
# encoder does not? Describe what a model trained without it would learn, and why it would then
# fail when it translates.

# %% [markdown] answer="model_q_lookahead" points=2
# **Model answer.** With teacher forcing the decoder reads the whole shifted target at once:
# position $i$ must predict token $i+1$, and token $i+1$ is itself an input at position $i+1$.
# Without the mask, self-attention at position $i$ can read position $i+1$ and copy it, so the loss
# falls towards 0 without the model learning to translate. When it translates, the later words do
# not exist yet: the model has never learned to predict from the earlier words alone, and its output
# is poor. The encoder reads the source sentence, which is complete before translating starts and
# is never predicted, so every source word may look at every other, in both directions.
#
# **Rubric.**
# - 1 point: unmasked, the decoder sees the token it must predict and learns to copy it (low
#   training loss, no translation at inference, where future words do not exist).
# - 1 point: the source is fully known at translation time and is not predicted, so the encoder may
#   attend both ways.

# %% [markdown]
# **Question 2 (2 points).** One classmate keeps the encoder blocks in a plain Python list,
# another writes `nn.ModuleList([EncoderBlock(...)] * N)`. Both models run and give outputs of the
# right shape. Explain for each what is actually wrong: what does the optimiser train, and what is
# saved?

# %% [markdown] answer="model_q_modulelist" points=2
# **Model answer.** `nn.Module` registers sub-modules assigned as modules or module containers; a
# plain list is invisible to it. The blocks' weights are then missing from `model.parameters()`, so
# the optimiser never updates them (they stay random), `state_dict()` does not save them and
# `model.to(device)` does not move them. `[block] * N` builds a list of $N$ references to *one*
# object: the model has one block's weights used $N$ times, a third or a sixth of the parameters it
# should have, and every update changes "all" blocks at once.
#
# **Rubric.**
# - 1 point: plain list: the blocks are not registered, so they are not trained, saved or moved.
# - 1 point: `[block] * N`: one block shared N times (N times fewer parameters, tied weights).

# %% [markdown]
# **Question 3 (2 points).** The source mask has shape `(batch, 1, 1, src_len)`, the target mask
# `(batch, 1, tgt_len, tgt_len)`. Explain why the source mask can get away with size 1 on the query
# axis while the target mask needs the full square.

# %% [markdown] answer="model_q_masks" points=2
# **Model answer.** Whether a key is padding depends on the key alone: the same keys are hidden
# for every query, so one row broadcasts over all queries (and over the heads). The look-ahead rule,
# key $j$ visible only if $j \le i$, depends on the pair of query $i$ and key $j$, so it needs a
# value per pair: a `tgt_len` × `tgt_len` square. The target mask is that square combined with the
# target padding row by `&`, and broadcasting gives `(batch, 1, tgt_len, tgt_len)`.
#
# **Rubric.**
# - 1 point: padding depends only on the key, so a single row broadcasts over the queries.
# - 1 point: look-ahead depends on the (query, key) pair, so it needs the square; `&` combines both
#   by broadcasting.

# %%
check.summary()
