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
# **Working time:** about 2 hours if you are at ease with PyTorch, about 3½ hours if you are new to it or get
# stuck. That is reading (53 minutes at 150 words a minute without the folded hints, 76 at 100 words a minute
# with them, and the given code at 10 lines a minute), three exercises, one bug hunt, two predictions and
# three written questions, 5 to 10 minutes of setting up (Colab, the setup cell, saving a copy), and cells
# that run in seconds. (Estimated by `scripts/working_time.py` in the course repository from the notebook's
# length and the measured run time of its cells, with assumptions it prints, not measurements of students: for
# example 150 or 100 words a minute, 5 or 10 minutes per exercise plus 2 or 4 per line you write, 10 or 20 per
# bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. trace a batch of token ids through the whole model and name the shape after every step;
# 2. say where the embeddings are multiplied by $\sqrt{d_{model}}$ (before the positional encoding is
#    added) and what the factor changes;
# 3. explain teacher forcing and build the target mask from a padding part and a look-ahead part,
#    broadcasting them against each other;
# 4. implement `Encoder` and `Transformer` so that every block is registered with PyTorch, and find a bug
#    in a `Decoder` from which of its parts get a gradient;
# 5. count the parameters per component and compare them with the paper's base model and its size
#    variations (Table 3);
# 6. test a model for causality and padding invariance, and against PyTorch's own `nn.Transformer`.
#
# **Before you start.** You need stages 1 to 3 (positional encoding, multi-head attention and the masks,
# the encoder and decoder blocks; this notebook imports the course's versions), `nn.Embedding` and
# `nn.ModuleList`.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package), then
# the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is given and
# correct, apart from the bug hunt's code, which says so. After each exercise a few *check cells* test one
# property each: `✔` means it holds, a red `✘` block says what was expected and what came out, hints
# folded under it. A failing check does not stop the notebook: *Run all* always reaches the end, where the
# last cell lists every check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work, so all green
# here means full marks for the visible checks (the grader also runs a few hidden ones with other sizes; a
# prediction, marked ○, is scored only then).
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
    make_padding_mask,  # noqa: F401  (used by make_source_mask below)
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
#   embedding, then $N$ decoder blocks. Each block attends to the target tokens up to its own
#   position (masked self-attention) and to `enc_out` (cross-attention).
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
english = ["two small cats are sleeping".split(), "a dog runs".split()]  # the two translations, as words
print("src:", src.shape, src.tolist())

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
# The cell below shows the lookup on the toy source batch.

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
# They live in an `nn.ModuleList`, which registers them with PyTorch (section 12 shows what goes
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
# feed it the **true** previous words. That is **teacher forcing**. The figure shows it for one
# sentence: at position $t$ the decoder has read `<bos>`, $y_1, \dots, y_t$ and must output $y_{t+1}$;
# after the last word it must output `<eos>`.
#
# Teacher forcing only works if position $t$ **cannot look at** positions after $t$: for every word of
# the sentence, the input at position $t+1$ *is* the label of position $t$, so a decoder that could look
# ahead would find those labels among its own inputs (Question 1 asks what that does to its
# translations).

# %%
figures.plot_teacher_forcing(["two", "small", "cats", "are", "sleeping"])
plt.show()

# %% [markdown]
# The cell below writes down what the decoder reads (`dec_in`) and what it must predict (`labels`)
# for the two toy translations, word by word as in the figure, padded to one length. (Stage 5 makes
# both from the training data with tensor operations; working out which is part of its exercise.)

# %%
dec_in = torch.tensor([encode(["<bos>", *words], target_vocabulary, 6) for words in english])  # (batch, 6)
labels = torch.tensor([encode([*words, "<eos>"], target_vocabulary, 6) for words in english])  # (batch, 6)
for row in range(2):
    print("dec_in :", [target_vocabulary[i] for i in dec_in[row]])
    print("labels :", [target_vocabulary[i] for i in labels[row]], "\n")

# %% [markdown]
# Look at the second sentence: it is shorter, so `dec_in` and `labels` both end in `<pad>`s.
# Positions whose label is `<pad>` predict nothing useful; the loss ignores them (section 8 computes
# it). So what the decoder reads at such a position does not matter either.

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
# - **look-ahead**: query $i$ may see keys $0, \dots, i$ — itself included — and nothing later;
# - **padding**: no query may attend to a pad token.
#
# Why both? Padding alone lets every position see the future, which breaks teacher forcing.
# Look-ahead alone is *almost* enough when the pads sit at the end of each sentence, as here: a
# real token only sees earlier positions, and those are never pads. But the pad positions would
# still attend to the pads before them (harmless here, as their labels are ignored), and a batch
# padded anywhere else (some pipelines pad on the left) would leak pads into real positions. The
# combined mask is right for any layout and costs one more operation; PyTorch's `nn.Transformer`
# does the same when given both `tgt_mask` and `tgt_key_padding_mask`.
#
# Below are the two rules for the second sentence of `dec_in`, each drawn as a table of queries
# (rows) and keys (columns). Before you write anything, look at what each table depends on: does it
# change from row to row? Would it change for another sentence of the batch? The answers tell you how
# small a tensor can hold each rule. Your combined mask must be blue only where **both** are blue.

# %%
second = dec_in[1:2]  # (1, tgt_len)
tokens = [target_vocabulary[i] for i in second[0]]
figures.plot_target_mask_rules(second, PAD, labels=tokens)
plt.show()

# %% [markdown]
# ### Exercise: `make_target_mask`
#
# Write `make_target_mask(tgt, pad_idx)`. The contract:
# - **input**: target ids `tgt` of shape `(batch, tgt_len)` (int64) and the pad id `pad_idx`;
# - **output**: a **bool** mask of shape `(batch, 1, tgt_len, tgt_len)` (the checks also accept 0/1
#   numbers, which stage 2's attention reads the same way), one `(tgt_len, tgt_len)` table per sentence,
#   `True` exactly where query $i$ may attend to key $j$: the $M_{tgt}[b, i, j]$ of the formula above.
#   The axis of size 1 lets the mask broadcast over the heads of the attention scores
#   `(batch, heads, tgt_len, tgt_len)`;
# - **any pad id**: compare the tokens with `pad_idx`, never with a fixed number;
# - **on the device of `tgt`**, so that the function also works for a batch on a GPU (a check runs it
#   on PyTorch's `meta` device, which stands for any device other than the CPU);
# - **built from `tgt` with tensor operations**: stage 2's `make_padding_mask` and `make_look_ahead_mask`
#   (and `make_source_mask`, which calls the first) are not to be used here; the checks say so when they
#   run. Getting both rules into one table of the right shape, with broadcasting, is the exercise.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# A key is allowed when *both* rules allow it: an element-wise logical "and" of two bool tables. One
# rule depends on the tokens (where the sentence's pads are), the other only on the positions (which key
# comes after which query). Neither needs a loop.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# The token rule is a comparison of the tokens with `pad_idx`, one value per key; give it the shape
# `(batch, 1, 1, tgt_len)`: its last axis is the key axis, and its size-1 query axis repeats it for every
# query. The position rule compares the position of each query with the position of each key: a
# `(tgt_len, tgt_len)` table, the same for every sentence. PyTorch lines shapes up from the right and
# stretches every axis of size 1 (broadcasting), so the "and" of the two is
# `(batch, 1, tgt_len, tgt_len)`. A tensor made from nothing but a size is made on the CPU unless it is
# given `device=tgt.device`.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# key_is_word = (tgt != pad_idx)[:, None, None, :]  # (batch, 1, 1, tgt_len)
# positions = torch.arange(tgt.size(1), device=tgt.device)  # (tgt_len,)
# not_later = positions[None, :] <= positions[:, None]  # (tgt_len, tgt_len): key j <= query i
# return key_is_word & not_later  # (batch, 1, tgt_len, tgt_len)
# ```
#
# The position rule is also the lower triangle of a square of `True`s:
# `torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=tgt.device).tril()`.
#
# </details>

# %% solution="model_make_target_mask"
#| include transformer_course.reference.model:make_target_mask

# %% [markdown]
# **Your mask, drawn.** Your mask for the toy batch, one panel per sentence (blue: may attend). A
# correct mask is blue only where **both** rules above are blue: the first sentence has no
# padding, so its mask is the plain lower triangle; in the second, the columns of its two pad tokens
# are grey in every row.

# %%
target_mask = make_target_mask(dec_in, PAD)  # (batch, 1, tgt_len, tgt_len)
print("target mask:", tuple(target_mask.shape), target_mask.dtype)
sentences = [[target_vocabulary[i] for i in row] for row in dec_in]
figures.plot_mask_panels({f"sentence {row}: padding and look-ahead": target_mask[row] for row in range(2)},
                         labels=sentences)
plt.show()

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
assert check.target_mask_values(make_target_mask, batch=1, tgt_len=1, pad_idx=1)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Exercise: the `Encoder`
#
# Write `forward(x, mask)`: token ids `x` of shape `(batch, src_len)` (int64) and the source mask
# `(batch, 1, 1, src_len)` → vectors `(batch, src_len, d_model)` (float), computed as the formulas
# of sections 3 and 4: $H^{(0)}$ from the ids, then the $N$ blocks. The constructor is given: it
# stores `self.d_model` and creates `self.embedding`, `self.positional_encoding` (which adds PE
# **and** applies dropout) and `self.layers`. Keep it as it is: the checks find these parts and copy
# the reference's weights into them.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Three steps: ids to scaled vectors, add the position signal, then let each block refine the
# output of the previous one. Every block gets the same source mask.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# | step | shape |
# |---|---|
# | `x` (token ids) | `(batch, src_len)` |
# | embedding lookup, times $\sqrt{d_{model}}$ | `(batch, src_len, d_model)` |
# | after the positional encoding module | `(batch, src_len, d_model)` |
# | after each block | `(batch, src_len, d_model)` |
#
# The scaling factor is a Python float: `math.sqrt` of the stored width.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, src_len, d_model)
# x = self.positional_encoding(x)
# for layer in self.layers:
#     x = layer(x, mask)
# ```
#
# </details>

# %% solution="model_encoder"
#| include transformer_course.reference.model:Encoder

# %% [markdown]
# #### Check your work
# The value check copies the reference weights into your encoder and compares outputs in float64.
# If it fails, its message says where the outputs differ; its folded hints name the likely mistake.

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
# ## 8. Exercise, a bug hunt: the `Decoder` and the prediction layer
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
# - $y$ — the decoder's input ids `(batch, tgt_len)`; $E_{tgt}$ — the target embedding table, one row
#   per target word;
# - $W_{pred}$ — shape `(d_model, vocab_size)`, $b_{pred}$ — `(vocab_size,)`: `self.pred_layer`
#   (an `nn.Linear`, which stores the transpose: `pred_layer.weight` has shape `(vocab_size, d_model)`);
# - logits — shape `(batch, tgt_len, vocab_size)`: at each position, one unnormalised score per
#   target word. **Return the logits, not probabilities**: the cross-entropy loss of stage 5 applies
#   the (log-)softmax itself, in a numerically safer way.
#
# The probability of the next word is then
# $p(y_{t+1} = w \mid y_{\le t}, x) = \mathrm{softmax}(\texttt{logits}_{t})_w$.
#
# `forward(x, enc_out, enc_mask, dec_mask)` takes target ids `x` `(batch, tgt_len)`, the encoder output
# `(batch, src_len, d_model)`, the source mask and the target mask, and returns the logits
# `(batch, tgt_len, vocab_size)`. The constructor creates `self.embedding`, `self.positional_encoding`,
# `self.layers` and `self.pred_layer`.
#
# This one is written for you, by a classmate, who left its first step to you: turning the ids into
# the vectors $G^{(0)}$ is done as in your `Encoder` (section 7), so write it where the cell says *YOUR
# CODE HERE*. The rest has **one realistic mistake**: it runs, its output has the right shape, and a
# model built with it still trains. Find it from what the decoder does:
# 1. write the first step, run the cell, then the measurement under it;
# 2. read which parts of the decoder the loss reacts to, and work out what that says about the way
#    from each part to the logits;
# 3. fix the cell in place, then run it, the measurement and the checks again.

# %% solution="model_decoder"
#| bug: x = layer(x, enc_out, enc_mask, dec_mask) => output = layer(x, enc_out, enc_mask, dec_mask)
#| bug: logits = self.pred_layer(x) => logits = self.pred_layer(output)
#| bug: x = self.embedding(x) * math.sqrt(self.d_model)  # (batch, tgt_len, d_model) => # YOUR CODE HERE
#| bug: x = self.positional_encoding(x) => raise NotImplementedError()
#| bug: # YOUR CODE HERE => # the first step, as in your Encoder (section 7)\n        # YOUR CODE HERE
#| include transformer_course.reference.model:Decoder

# %% [markdown]
# **The loss.** Training (stage 5) lowers a loss built on the **cross-entropy** of the labels: at every
# position whose label is a word, $-\log p(\text{label})$, minus the log of the probability the model
# gives the right next word, averaged over those positions. It is 0 when the model is sure of every right
# word, and large when it gives them little probability. The given function below computes it from the
# logits. Stage 5 uses PyTorch's `nn.CrossEntropyLoss` instead, which computes the same mean; with label
# smoothing, stage 5 trains on a variant of it.

# %%
def next_word_loss(logits: torch.Tensor, labels: torch.Tensor, pad_idx: int) -> torch.Tensor:
    """Mean of -log p(label) over the positions whose label is not `pad_idx`.

    logits (batch, tgt_len, vocab_size), labels (batch, tgt_len) int64 -> a 0-d tensor.
    """
    log_probabilities = logits.log_softmax(dim=-1)  # (batch, tgt_len, vocab_size)
    of_labels = log_probabilities.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (batch, tgt_len): log p(label)
    return -of_labels[labels != pad_idx].mean()  # averaged over the real labels only


# %% [markdown]
# **A small run.** The cell builds a 3-block decoder from the classmate's class, runs the toy batch
# through it once (random vectors stand in for the encoder's output, and the look-ahead mask alone is
# enough here, section 6 says why) and computes the loss against the labels of section 5. Then
# `torch.autograd.grad` gives the gradient of the loss with respect to every parameter: what training
# follows. The figure shows its size for each part: the embedding, every block and the prediction
# layer. A part that gets no gradient at all (`torch.autograd.grad` returns `None` for it, drawn as 0)
# is not used on the way to the loss: however its weights change, the loss stays the same, so training
# can never change them. (A gradient that happens to be 0 at one point is another matter: the loss can
# still depend on those weights.)

# %%
torch.manual_seed(0)
decoder = Decoder(len(target_vocabulary), d_model=32, num_heads=4, num_layers=3, d_ff=64, max_seq_length=50,
                  dropout=0.0)
enc_out = torch.randn(2, src.size(1), 32)  # (batch, src_len, d_model): stands in for the encoder's output
decoder_logits = decoder(dec_in, enc_out, make_source_mask(src, PAD), make_look_ahead_mask(dec_in.size(1)))
decoder_loss = next_word_loss(decoder_logits, labels, PAD)
model_parts = {"embedding": decoder.embedding, **{f"block {index}": block for index, block in
                                                  enumerate(decoder.layers)}, "pred_layer": decoder.pred_layer}
parameters = [parameter for part in model_parts.values() for parameter in part.parameters()]
gradients = iter(torch.autograd.grad(decoder_loss, parameters, allow_unused=True))  # None: no influence
norms = {}
for name, part in model_parts.items():
    squares = [gradient.pow(2).sum() for gradient in (next(gradients) for _ in part.parameters())
               if gradient is not None]
    norms[name] = float(sum(squares)) ** 0.5 if squares else 0.0
print("gradient norm per part:", ", ".join(f"{name} {norm:.3g}" for name, norm in norms.items()))
figures.plot_gradient_per_part(norms)
plt.show()

# %% [markdown]
# <details><summary>Hint 1: read the symptom</summary>
#
# Which parts get no gradient at all (0 in the figure), and which get one? A part can influence the loss only
# through a chain of computations that ends in the logits. For each part named in red, where does that
# chain break? Compare what the code computes with the formula for $G^{(\ell)}$ above.
#
# </details>
#
# <details><summary>Hint 2: where to look</summary>
#
# Follow the loop: which variable does each block write its output to, which variable does the next
# block read, and which one does `pred_layer` read? Every block must read what the block before it
# wrote, and `pred_layer` what the last block wrote.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# for layer in self.layers:
#     x = layer(x, enc_out, enc_mask, dec_mask)
# logits = self.pred_layer(x)  # (batch, tgt_len, vocab_size)
# ```
#
# </details>

# %% [markdown]
# #### Check your work

# %% tests="model_decoder_values" points=3
assert check.decoder_output_shape(Decoder, bug_hunt="with a step of yours")
assert check.decoder_values(Decoder, bug_hunt="with a step of yours")

# %% tests="model_decoder_layers" points=2
assert check.decoder_layers_registered(Decoder, bug_hunt="with a step of yours")
assert check.decoder_every_part_learns(Decoder, bug_hunt="with a step of yours")

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
assert check.decoder_every_part_learns(Decoder, num_layers=4, d_model=8, num_heads=2, d_ff=12)
### END HIDDEN TESTS

# %% [markdown]
# ## 9. Exercise: the `Transformer`
#
# The full model only wires the two stacks together. Write
# `forward(enc_in, dec_in, enc_mask, dec_mask)`: source ids `(batch, src_len)`, decoder input ids
# `(batch, tgt_len)`, the source mask `(batch, 1, 1, src_len)` and the target mask
# `(batch, 1, tgt_len, tgt_len)` → logits `(batch, tgt_len, dec_vocab_size)`, using the given
# `self.encoder` and `self.decoder`. The encoder must run **once** per batch: every decoder block
# reads the same `enc_out`. The given constructor also initialises every parameter of more than one
# axis, the weight matrices and both embedding tables, with Xavier-uniform initialisation (Glorot and
# Bengio, 2010: each weight drawn uniformly between $\pm\sqrt{6/(n_{in}+n_{out})}$, with $n_{in}$ and
# $n_{out}$ the layer's input and output sizes, so that signals keep about the same variance from layer
# to layer), a common choice for Transformers (the paper does not state its initialisation).

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Encode the source once; then decode the target while reading the encoder's output. Which mask
# does each stack need? The encoder only ever sees the source.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# The encoder returns `(batch, src_len, d_model)`; the decoder takes its own ids, that tensor and
# both masks (source mask first, as in `DecoderBlock`), and returns the logits.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# enc_out = self.encoder(enc_in, enc_mask)  # (batch, src_len, d_model)
# logits = self.decoder(dec_in, enc_out, enc_mask, dec_mask)
# ```
#
# </details>

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
#   $\times\sqrt{d_{model}}$, PE and `pred_layer`, and converts the masks: the bool masks of
#   `nn.Transformer` and `nn.MultiheadAttention` mean `True` = **hidden**, the opposite of ours
#   (`F.scaled_dot_product_attention`'s bool mask means `True` = may attend, as ours does).
# - **causality**: changing target tokens after position $t$ must not change the logits at
#   positions $\le t$. The check builds both masks with the course's own functions and hands them to
#   your model, so it tests where your `Transformer` passes each mask; your `make_target_mask` has
#   its own checks above.
# - **padding invariance**: extra `<pad>` tokens change no logit of a real position.
# - **own embedding tables**: German and English have vocabularies of their own, so id 5 is one
#   word in the source and another in the target. The check builds your model as it is written and
#   watches which embedding table looks up the source ids and which the target ids.

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

# %% tests="model_own_embeddings" points=1
assert check.transformer_own_embeddings(Transformer)

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
assert check.transformer_own_embeddings(Transformer, src_vocab=17, tgt_vocab=9, d_model=24, num_heads=3,
                                        num_layers=3, d_ff=20, pad_idx=0, batch=4, src_len=8, tgt_len=5)
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
# $\ln(\text{vocab size})$. An untrained model should land near that value; this one lands somewhat
# above it, because its logits are random numbers rather than equal ones, and an uneven, arbitrary
# guess costs more on average than a uniform one. The check catches a loss on another scale
# altogether: summed over the tokens instead of averaged, say (the cell prints it). It does **not**
# catch every bug. A softmax applied to the logits before the loss (which applies its own) turns them
# into numbers between 0 and 1, whose softmax is almost uniform, so the loss lands almost exactly on
# $\ln(\text{vocab size})$; and before training every word is about as unlikely as any other, so wrong
# labels (the decoder's own inputs instead of the next words) also give a loss near
# $\ln(\text{vocab size})$. The cell prints all four.

# %%
torch.manual_seed(0)
toy_model = Transformer(len(source_vocabulary), len(target_vocabulary), 32, 4, 2, 64, 50, 0.1).eval()
with torch.no_grad():
    logits = toy_model(src, dec_in, make_source_mask(src, PAD), make_target_mask(dec_in, PAD))
probabilities = logits.softmax(dim=-1)  # (batch, tgt_len, vocab_size), rows sum to 1
figures.plot_next_token_probabilities(probabilities[0], [target_vocabulary[i] for i in dec_in[0]],
                                      target_vocabulary)
plt.show()
real_labels = int((labels != PAD).sum())  # the positions the loss averages over
print(f"ln(vocab size) = {math.log(len(target_vocabulary)):.3f}")
print(f"untrained loss                          {next_word_loss(logits, labels, PAD):.3f}")
print(f"softmax applied before the loss as well {next_word_loss(logits.softmax(dim=-1), labels, PAD):.3f}")
print(f"wrong labels (the decoder's inputs)     {next_word_loss(logits, dec_in, PAD):.3f}")
print(f"summed over the tokens, not averaged    {next_word_loss(logits, labels, PAD) * real_labels:.3f}")

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
# embedding, the decoder embedding and the prediction layer (following Press and Wolf, 2017,
# *Using the Output Embedding to Improve Language Models*). Counting that matrix once gives the
# paper's figure up to about 2 M, which the paper does not break down.
#
# Two kinds of sharing hide in that sentence:
# - **target embedding and `pred_layer`.** The decoder's embedding has shape
#   `(tgt_vocab, d_model)` and `pred_layer.weight` has the same shape `(tgt_vocab, d_model)`
#   (`nn.Linear` stores $W_{pred}$ transposed): row $w$ is the vector of word $w$ on the way in and
#   the direction whose dot product scores word $w$ on the way out. This sharing works for any
#   vocabularies, ours included;
# - **source embedding too.** That needs source and target to use one *joint* vocabulary, as the
#   paper's byte-pair vocabulary does. Stage 5 gives German and English separate vocabularies of
#   different sizes, so the source embedding cannot join in there.
#
# This course keeps all three matrices separate (the checks and the pretrained model expect that).
# The base configuration above has one vocabulary for both languages, so the cell below can share all
# three matrices of it, as the paper does, and count again. What sharing only the target embedding with
# `pred_layer` saves is prediction 2's question, for another configuration.

# %%
print(f"ours, nothing shared               : {count_parameters(base) / 1e6:6.1f} M")
table = base.encoder.embedding.weight  # (37000, 512): one Parameter, used three times from here on
base.decoder.embedding.weight, base.decoder.pred_layer.weight = table, table
print(f"one 37000x512 table for all three  : {count_parameters(base) / 1e6:6.1f} M   (paper: 65 M)")

# %% [markdown]
# **How size changes quality: Table 3, rows (C).** The paper trained variations of the base model
# and reports them in its Table 3. Rows (C) change its size. Quoted as printed in arXiv 1706.03762
# (empty cells: "Unlisted values are identical to those of the base model"; all metrics on the
# English-to-German development set, newstest2013; perplexities are per word-piece):
#
# | | N | d_model | d_ff | h | d_k | d_v | P_drop | ε_ls | train steps | PPL (dev) | BLEU (dev) | params ×10⁶ |
# |---|---|---|---|---|---|---|---|---|---|---|---|---|
# | base | 6 | 512 | 2048 | 8 | 64 | 64 | 0.1 | 0.1 | 100K | 4.92 | 25.8 | 65 |
# | (C) | 2 | | | | | | | | | 6.11 | 23.7 | 36 |
# | | 4 | | | | | | | | | 5.19 | 25.3 | 50 |
# | | 8 | | | | | | | | | 4.88 | 25.5 | 80 |
# | | | 256 | | | 32 | 32 | | | | 5.75 | 24.5 | 28 |
# | | | 1024 | | | 128 | 128 | | | | 4.66 | 26.0 | 168 |
# | | | | 1024 | | | | | | | 5.12 | 25.4 | 53 |
# | | | | 4096 | | | | | | | 4.75 | 26.2 | 90 |
#
# The paper sums these rows up (section 6.2): "as expected, bigger models are better". Not
# uniformly: 8 blocks scored 25.5 BLEU against the base model's 25.8 with 6, while the widest model
# ($d_{model} = 1024$, 26.0) and the widest feed-forward network ($d_{ff} = 4096$, 26.2) did best,
# each at the price of many more parameters. The cell below counts our model in each configuration,
# with one shared 37 000-row table as in the paper, beside the paper's count.

# %%
TABLE_3_C = [  # (N, d_model, d_ff, the paper's parameter count in millions); h = 8 in every row
    (6, 512, 2048, 65), (2, 512, 2048, 36), (4, 512, 2048, 50), (8, 512, 2048, 80),
    (6, 256, 2048, 28), (6, 1024, 2048, 168), (6, 512, 1024, 53), (6, 512, 4096, 90)]
for num_layers, width, hidden, paper in TABLE_3_C:
    with torch.device("meta"):
        variant = Transformer(37000, 37000, d_model=width, num_heads=8, num_layers=num_layers, d_ff=hidden,
                              max_seq_length=512, dropout=0.1)
    shared = (count_parameters(variant.encoder.layers) + count_parameters(variant.decoder.layers)
              + count_parameters(variant.encoder.embedding) + variant.decoder.pred_layer.bias.numel())
    print(f"N = {num_layers}, d_model = {width:4d}, d_ff = {hidden}: ours with one shared table "
          f"{shared / 1e6:6.1f} M, paper {paper:3d} M")

# %% [markdown]
# Our counts follow the paper's from row to row and stay about 1 to 4 M below them. The gap grows with
# $d_{model}$ (about 1, 2 and 4 M for $d_{model}$ = 256, 512 and 1024) but not with $N$: it is
# something whose size grows with the width and not with the number of blocks, as an embedding
# table's does. The paper does not break its counts down, so the course cannot say what it is.

# %% [markdown]
# ### Predict, then run
# Work these out on paper with the counts above before you run anything. Write your prediction
# after `return`: a number, or the arithmetic you worked out (`math` is allowed). A prediction is a
# value you work out, so the function may not call your model, `count_parameters`, torch or anything
# else of the notebook: the check refuses that. The check only looks at the form of your prediction
# and notes it: **it is scored when your notebook is graded**, and nothing in this notebook says
# whether it is right, so trying again tells you nothing. The cell after the checks shows the truth
# for *another* configuration: use it to test your method. The answer you are graded on is never
# printed. Take the configuration
# `Transformer(src_vocab=1000, tgt_vocab=800, d_model=64, num_heads=4, num_layers=2, d_ff=128,
# max_seq_length=50, dropout=0.1)`.
#
# **Prediction 1 (1 point).** How many trainable parameters does it have, exactly (what
# `count_parameters` returns)? As in stages 2 and 3, a count without the biases of the attention
# projections (which the paper's formulas do not have) is accepted too; every other bias counts.

# %% solution="model_predict_parameters"
def predict_parameter_count() -> int:
    """Your prediction of count_parameters(Transformer(1000, 800, 64, 4, 2, 128, 50, 0.1))."""
    ### BEGIN SOLUTION
    d, ff, n = 64, 128, 2
    attention, feed_forward, norm = 4 * (d * d + d), 2 * d * ff + ff + d, 2 * d
    encoder_block, decoder_block = attention + feed_forward + 2 * norm, 2 * attention + feed_forward + 3 * norm
    return 1000 * d + 800 * d + n * (encoder_block + decoder_block) + (800 * d + 800)
    ### END SOLUTION


# %% tests="model_predicted_parameters" points=1
assert check.predicted_parameter_count(predict_parameter_count)

# %% [markdown]
# **Prediction 2 (1 point).** You make `pred_layer` use the decoder embedding's matrix
# (`model.decoder.pred_layer.weight = model.decoder.embedding.weight`). How many trainable parameters
# fewer does `count_parameters` now report for the same configuration?

# %% solution="model_predict_tying_saving"
def predict_tying_saving() -> int:
    """Your prediction of how many parameters sharing the target embedding with pred_layer saves."""
    ### BEGIN SOLUTION
    return 800 * 64  # one (tgt_vocab, d_model) matrix counted once; the bias stays
    ### END SOLUTION


# %% tests="model_predicted_tying_saving" points=1
assert check.predicted_tying_saving(predict_tying_saving)

# %% [markdown]
# **The truth, for another configuration.** The cell below builds
# `Transformer(500, 300, d_model=32, num_heads=4, num_layers=1, d_ff=64, max_seq_length=50,
# dropout=0.1)` with your `Transformer` (only the given constructor runs), counts it, then shares the
# matrix and counts again. `model.parameters()` yields a shared tensor once, so it is counted and
# updated once; both uses add to its gradient. Check that your method gives these numbers too; where
# it does not, find the step of your reasoning that went wrong.

# %%
torch.manual_seed(0)
small = Transformer(500, 300, d_model=32, num_heads=4, num_layers=1, d_ff=64, max_seq_length=50, dropout=0.1)
separate = count_parameters(small)
print("embedding", tuple(small.decoder.embedding.weight.shape), " pred_layer.weight",
      tuple(small.decoder.pred_layer.weight.shape))
small.decoder.pred_layer.weight = small.decoder.embedding.weight  # one Parameter, used twice
print(f"separate: {separate:,}   shared: {count_parameters(small):,}   saved: {separate - count_parameters(small):,}")
print("one tensor:", small.decoder.pred_layer.weight is small.decoder.embedding.weight)

# %% [markdown]
# ## 12. Pitfalls
#
# - **No $\sqrt{d_{model}}$ scaling**, or scaling *after* PE is added. Both run without error, but the
#   model is no longer the paper's (the value check compares with the reference; its folded hint names them). The
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
# - **A target mask without padding or without look-ahead**: without look-ahead every position can
#   read its own label during training; without padding it attends to filler tokens.
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
prefixes = sorted({".".join(key.split(".")[:2]) for key in SameBlockStack().state_dict()})  # "layers.0", ...
print("same block x2: state_dict keys start with", prefixes)
stack = PlainListStack().double()
print("after .double(), a block in the plain list is still", stack.layers[0].norm1.weight.dtype)

# %% [markdown]
# ## Summary
# - Each stack turns token ids into vectors (section 3) and passes them through its $N$ blocks; the
#   encoder's output feeds the cross-attention of every decoder block.
# - Teacher forcing: in training the decoder reads the true previous words, not its own guesses, and
#   predicts the next word at every position in one pass.
# - The target mask allows a key only if it is neither padding nor in the future, shape
#   `(batch, 1, tgt_len, tgt_len)`; the source mask is the padding mask `(batch, 1, 1, src_len)`.
# - A part of a model that gets no gradient at all (`None` from `autograd`) is not used on the way to
#   the loss, and training can never change it.
# - The target embedding and `pred_layer.weight` have the same shape and can be shared (the paper
#   does); sharing the source embedding as well needs one joint vocabulary. Table 3 of the paper shows
#   what size buys: more blocks, a wider model or a wider feed-forward network mostly scored better.
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
# **Question 1 (2 points).** A classmate's decoder uses only the padding mask, no look-ahead. Their
# training loss becomes tiny. When they translate, they decode word by word: at every step the
# decoder reads `<bos>` and the words produced so far, and only the **last** position's logits pick
# the next word. That last position has no later tokens it could look at, so it seems the missing
# mask cannot matter at translation time. Explain why the translations are nevertheless poor.

# %% [markdown] answer="model_q_lookahead" points=2
# **Model answer.** The damage is done in training. With teacher forcing, the input at position
# $t+1$ is the label of position $t$; without the look-ahead mask position $t$ can attend to it, so
# the cheapest way to a low loss is to copy that token, and the model learns to rely on the future
# input instead of predicting from the source and the earlier words. At translation time the last
# position has no position after it: the thing it learned to look at is missing, and it has hardly
# learned to predict from the past alone (the only position that trained with no future to copy is
# each sentence's last one, whose label is `<eos>`: that much it learned, so translations may also end
# too early), so its guess is poor. In addition, the earlier positions
# now see different contexts than in training: in training every position saw the whole true target
# sentence, every later word to its end; at translation time each sees only the words of the prefix
# written so far, the model's own guesses. So the inputs the last position attends to are unlike
# anything it was trained on.
#
# **Rubric.**
# - 1 point: in training, position $t$ sees the next input, which is its own label, so the model
#   learns to copy instead of to predict (a tiny training loss that means nothing).
# - 1 point: at translation time that token does not exist yet (nothing to copy), and the model was
#   hardly trained to predict from earlier words only (full credit too for the sharper account: only
#   the last position, labelled `<eos>`, trained without a future, so translations tend to end early);
#   also full credit for explaining instead that the earlier positions' representations differ from
#   those seen in training (train/test mismatch).

# %% [markdown]
# **Question 2 (2 points).** A classmate builds the encoder with
# `self.layers = nn.ModuleList([EncoderBlock(...)] * 2)`, trains it and saves `model.state_dict()`.
# (a) The pitfall cell above printed what `count_parameters` reports for such a stack and which keys
# its `state_dict` holds. Explain both: why is the count one block's while the keys name two slots,
# and what values do the two slots' keys hold? (b) You load that
# file into a **correct** model with `load_state_dict`. Does it load without an error, and does the
# correct model then compute the same outputs as the classmate's? What happens if you train it on?

# %% [markdown] answer="model_q_modulelist" points=2
# **Model answer.** (a) `[block] * 2` is a list holding the same object twice. `parameters()`
# yields each tensor once, so `count_parameters` reports one block's parameters, half of a correct
# 2-block encoder's. `state_dict()` walks the module tree by name without removing duplicates, so it
# holds the full set of keys, `layers.0.…` and `layers.1.…`, with identical values. (b) The keys
# and shapes match a correct model exactly, so loading succeeds without an error; both of the
# correct model's blocks receive the same weights, so it computes exactly what the classmate's
# model computed. The difference shows only when training goes on: in the correct model the two
# blocks are separate tensors and drift apart, while the classmate's stay tied (one set of weights,
# updated by the sum of both uses' gradients).
#
# **Rubric.**
# - 1 point: the list holds one object twice; `parameters()` yields each tensor once (one block's
#   count) while `state_dict()` names every slot of the module tree (keys for both, equal values).
# - 1 point: loading into the correct model succeeds and gives the same outputs (both blocks get the
#   same weights); further training unties them (or: a strict load does not detect the bug).

# %% [markdown]
# **Question 3 (2 points).** By mistake, a source mask is built with the size-1 axis in the wrong
# place: shape `(batch, 1, src_len, 1)` instead of `(batch, 1, 1, src_len)`, with the same values.
# Predict what the encoder's self-attention (scores `(batch, heads, src_len, src_len)`, hidden
# positions filled with $-10^9$ before the softmax) now does for a real token and for a padding
# token. Would a padding-invariance test (append extra `<pad>` tokens to the source, compare the
# real positions' outputs) notice?

# %% [markdown] answer="model_q_masks" points=2
# **Model answer.** The mask now broadcasts along the **key** axis instead of the query axis: it
# says which *queries* are padding. A real token's query row is all `True`, so it attends to every
# key, padding included: the padding is no longer hidden, and the outputs of real tokens change
# when more `<pad>` tokens are appended, which is exactly what a padding-invariance test compares,
# so it fails. A padding token's row is all `False`: every score becomes $-10^9$, the softmax of
# equal scores is uniform, and that position averages all value vectors (no error and no NaN, because
# $-10^9$ is finite). In the decoder's cross-attention the shapes may not even broadcast
# (`src_len` on the query axis against `tgt_len` queries), which raises an error when the lengths
# differ.
#
# **Rubric.**
# - 1 point: the mask now selects queries, not keys: real tokens attend to padding, so their
#   outputs depend on the padding and the padding-invariance check fails.
# - 1 point: padding queries have every score masked, giving uniform attention (finite $-10^9$, so
#   no NaN). The broadcasting error in cross-attention when the lengths differ is a correct remark
#   but does not replace the padding queries' case.

# %%
check.summary()
