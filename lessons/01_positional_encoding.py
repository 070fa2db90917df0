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
# # Stage 1 — Positional encoding
#
# *Transformers from Scratch*: you will build the Transformer of Vaswani et al.,
# ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (2017), one stage at a time,
# and train it to translate German into English.
#
# | stage | notebook |
# |---|---|
# | 0 (optional) | why attention: the RNN bottleneck, additive attention |
# | **1** | **positional encoding** (this one) |
# | 2 | scaled dot-product and multi-head attention, masks |
# | 3 | feed-forward, residual + LayerNorm, encoder and decoder blocks |
# | 4 | the full encoder–decoder |
# | 5 | training on Multi30k German→English |
# | 6 | greedy decoding, BLEU, attention heatmaps |
# | 7 (optional) | the key/value cache and beam search |
#
# **Working time:** about 50 minutes: 18 minutes of reading, one exercise (about 20 minutes), three
# written questions (about 15 minutes), and cells that run in seconds. (Estimated by
# `scripts/working_time.py` in the course repository: reading at 150 words and 10 lines of given
# code a minute, 5 minutes per exercise plus 2 per line you write, 5 per written question, and the
# measured run time of the cells.)
#
# ## Learning outcomes
# After this notebook you can
# 1. explain why a model built from attention needs to be *told* where each token sits;
# 2. write down the sinusoidal encoding and say what `pos`, `i` and `d_model` mean in it;
# 3. implement `PositionalEncoding` as a PyTorch module with a buffer and dropout;
# 4. read its heatmap, and say where the embeddings are scaled by $\sqrt{d_{model}}$ and what that
#    scaling does (and does not) do.
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

from transformer_course.checks import positional_encoding as check
from transformer_course.visualisation import positional as figures

# %% [markdown]
# ## 1. Why attention needs positions
#
# Attention (stage 2) compares every token with every other token through dot products. Nothing
# in that computation depends on the *order* of the tokens: shuffle the words of a sentence and
# each word gets exactly the same attention result, only shuffled. "Dog bites man" and "man bites
# dog" would look identical. An RNN knows order because it reads one token after another; a
# Transformer reads all tokens at once, so order must be written into the input.
#
# The paper adds a **positional encoding** to each token embedding: a vector of the same width
# $d_{model}$ that depends only on the position. The model then sees
# `embedding(token) + PE[position]`.
#
# The cell below shows the problem. A toy "attention" (each row of `x` averaged with weights from
# dot products) gives the same output rows, just reordered, when the input rows are reordered.

# %%
torch.manual_seed(0)
x = torch.randn(4, 8)  # 4 tokens, 8 features each


def toy_attention(x: torch.Tensor) -> torch.Tensor:
    weights = torch.softmax(x @ x.T, dim=-1)  # (tokens, tokens)
    return weights @ x  # (tokens, features)


order = torch.tensor([2, 0, 3, 1])
same = torch.allclose(toy_attention(x)[order], toy_attention(x[order]), atol=1e-6)
print("shuffling the input only shuffles the output:", same)

# %% [markdown]
# ## 2. The sinusoidal encoding
#
# For position $pos$ (0 for the first token) and dimension index $i$ (pairs of columns,
# $0 \le i < d_{model}/2$):
#
# $$PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/d_{model}}}\right) \qquad
#   PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/d_{model}}}\right)$$
#
# - $pos$ — the token's position in the sequence, $0, 1, 2, \dots$
# - $2i$ and $2i+1$ — an even column and the odd column right after it; the pair shares one
#   frequency, sine in the even column, cosine in the odd one;
# - $d_{model}$ — the embedding width (512 in the paper);
# - $10000^{2i/d_{model}}$ — the wavelength factor: column pair 0 completes a cycle every
#   $2\pi \approx 6.3$ positions, the last pair only every $\approx 2\pi \cdot 10000$ positions.
#
# Why this choice? Every position gets a unique pattern; the values stay in $[-1, 1]$ whatever the
# length; and for a fixed offset $k$, $PE_{pos+k}$ is a rotation of $PE_{pos}$ pair by pair
# (the angle-addition formulas), so "k tokens to the left" looks the same everywhere in the
# sentence, which attention can learn to pick out.
#
# **Computing it.** Build a column of positions `(max_seq_length, 1)` and a row of inverse
# wavelengths `(d_model/2,)`; their product broadcasts to the angle table `(max_seq_length, d_model/2)`.
# A numerically pleasant way to get $1/10000^{2i/d_{model}}$ is
# $\exp\left(-2i \cdot \ln(10000) / d_{model}\right)$, with `torch.arange(0, d_model, 2)` giving
# the values $2i$ directly.
#
# ### Pitfalls we see every year
# - sine and cosine swapped (sine belongs in the **even** columns);
# - using $i$ instead of $2i$ in the exponent — or, with `arange(0, d_model, 2)`, multiplying by 2
#   a second time;
# - writing the cosine into column 1 only (`pe[:, 1]`) instead of every odd column (`pe[:, 1::2]`);
# - forgetting dropout: the paper applies dropout to the *sum* of embeddings and encodings;
# - storing `pe` as an `nn.Parameter`: it is fixed, not learned, so it is a *buffer* — it moves
#   with `.to(device)` and is saved in the `state_dict`, but the optimiser never touches it.

# %% [markdown]
# ## 3. Exercise: `PositionalEncoding`
#
# Complete the two marked parts:
# 1. in `__init__`, compute the table `pe` of shape `(max_seq_length, d_model)`;
#    the given line after it adds the batch axis and registers the buffer;
# 2. in `forward`, add the first `seq_len` rows of the table to `x`
#    (`x` has shape `(batch, seq_len, d_model)`); the given `return` applies dropout.

# %% solution="positional_encoding"
#| include transformer_course.reference.positional_encoding:PositionalEncoding

# %% [markdown]
# ### Check your work
# Each cell checks one property. Read the message of the first failing one: fix that, rerun the
# exercise cell, then rerun the checks.

# %% tests="pe_buffer_shape" points=1
assert check.buffer_shape(PositionalEncoding)

# %% tests="pe_table_values" points=2
assert check.table_values(PositionalEncoding)

# %% tests="pe_table_values_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.table_values(PositionalEncoding, d_model=34, max_seq_length=23)
assert check.buffer_shape(PositionalEncoding, d_model=6, max_seq_length=5)
### END HIDDEN TESTS

# %% tests="pe_forward" points=2
assert check.forward_adds_encoding(PositionalEncoding)

# %% tests="pe_forward_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.forward_adds_encoding(PositionalEncoding, d_model=12, max_seq_length=9, seq_len=9)
### END HIDDEN TESTS

# %% tests="pe_dropout" points=1
assert check.dropout_behaviour(PositionalEncoding)

# %% [markdown]
# ## 4. Looking at the encoding
#
# **The table as a heatmap.** Rows are positions, columns are dimensions. On the left the columns
# flip sign every few positions; towards the right they change so slowly that over 100 positions
# they look constant. Read a row from left to right and you read a position's "fingerprint".

# %%
with skip_until_implemented("PositionalEncoding"):
    encoding = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0)
    figures.plot_encoding_heatmap(encoding.pe)
    plt.show()

# %% [markdown]
# **A few columns as curves.** Each column is one sinusoid; each pair (sin, cos) shares a
# wavelength, and the wavelength grows geometrically with $i$.

# %%
with skip_until_implemented("PositionalEncoding"):
    encoding = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0)
    figures.plot_encoding_curves(encoding.pe, dims=(0, 1, 8, 9, 20, 21))
    plt.show()

# %% [markdown]
# **Which positions look alike?** The dot product $PE_p \cdot PE_q$ depends only on the offset
# $p - q$: the bands run parallel to the diagonal. It is largest at $p = q$, where it equals
# $d_{model}/2$ (each sin/cos pair contributes $\sin^2 + \cos^2 = 1$). Away from the diagonal it first
# drops quickly, then it does not keep falling: it wobbles, because the columns' different wavelengths
# drift in and out of step, and that wobble is the banding in the figure. The cell prints it for a
# few offsets. A fixed offset always gives the same value, which is what lets attention learn
# relative positions.

# %%
with skip_until_implemented("PositionalEncoding"):
    encoding = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0)
    figures.plot_position_similarity(encoding.pe)
    plt.show()
    table = encoding.pe[0]  # (200, 64)
    print("PE[10]·PE[13] =", round(float(table[10] @ table[13]), 4),
          "  PE[40]·PE[43] =", round(float(table[40] @ table[43]), 4), "(same offset, same value)")
    offsets = [0, 1, 2, 5, 10, 20, 40, 60, 80, 100, 120, 140]
    print("PE[50]·PE[50 + k] for k =", offsets)
    print("                        ", [round(float(table[50] @ table[50 + k]), 1) for k in offsets])

# %% [markdown]
# ## 5. Where the embeddings are scaled by $\sqrt{d_{model}}$
#
# Section 3.4 of the paper: "In the embedding layers, we multiply those weights by
# $\sqrt{d_{model}}$." The scaling happens **before** the positional encoding is added, in the
# Encoder and Decoder of stage 4:
#
# ```python
# x = self.embedding(tokens) * math.sqrt(self.d_model)   # (batch, seq_len, d_model)
# x = self.positional_encoding(x)                        # adds PE, then dropout
# ```
#
# **Why?** The paper does not say: that sentence is all it writes about it. What the factor does is
# set the size of the word signal relative to the position signal, since the two are simply added.
# Every PE entry lies in $[-1, 1]$; an embedding entry is as large as its initialisation makes it.
# The cell below compares the two for the two initialisations you will meet: PyTorch's default for
# `nn.Embedding` (each entry drawn from $\mathcal{N}(0, 1)$) and Xavier-uniform (entries within
# $\pm\sqrt{6/(\text{vocab} + d_{model})}$), which the `Transformer` of stage 4 uses.
#
# `PositionalEncoding` itself does **not** scale: keep the two jobs separate. (Implementations you
# find online sometimes forget the scaling altogether, or have a positional encoding that ignores
# its `dropout` argument: two bugs you now know to avoid.)

# %%
torch.manual_seed(0)
d_model, vocab_size = 64, 8000
tokens = torch.randint(vocab_size, (1, 20))  # 20 random word ids
with skip_until_implemented("PositionalEncoding"):
    position_signal = PositionalEncoding(d_model, 20, 0.0).pe  # (1, 20, d_model)
    print(f"typical |PE entry|: {position_signal.abs().mean():.3f}")
for name, initialise in (("PyTorch default N(0, 1)", nn.init.normal_), ("Xavier uniform", nn.init.xavier_uniform_)):
    embedding = nn.Embedding(vocab_size, d_model)
    initialise(embedding.weight)
    word = embedding(tokens).detach()  # (1, 20, d_model)
    print(f"{name:23s}: typical |embedding entry| {word.abs().mean():.3f}, after scaling by "
          f"sqrt(d_model) = {math.sqrt(d_model):.0f}: {(word * math.sqrt(d_model)).abs().mean():.3f}")

# %% [markdown]
# **Reading the numbers.** With the default initialisation the scaled word signal is about ten times
# larger than the position signal; with Xavier initialisation it is still several times *smaller*,
# even after the factor. So the factor alone does not decide which signal dominates: the
# initialisation does, and during training the model learns embeddings of whatever size works. Do
# not trust the common explanation that the scaling "keeps the position signal from drowning the
# words": at the initialisation this course uses, the numbers say otherwise.

# %% [markdown]
# ## Summary
# - Attention ignores order, so each position gets a fixed sinusoidal vector added to its embedding.
# - Even columns hold $\sin(pos/10000^{2i/d_{model}})$, odd columns the cosine of the same angle.
# - `pe` is a buffer of shape `(1, max_seq_length, d_model)`; `forward` adds `pe[:, :seq_len]` and
#   applies dropout to the sum.
# - Embeddings are multiplied by $\sqrt{d_{model}}$ before the encoding is added (stage 4). The paper
#   gives no reason; which of the two signals is larger depends on the initialisation.
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
# **Question 1 (2 points).** Section 1 showed that shuffling the rows of the input only shuffles
# the rows of the toy attention's output. Explain why attention without positional information
# cannot tell "the dog bit the man" from "the man bit the dog", and how adding $PE_{pos}$ to each
# embedding changes that.

# %% [markdown] answer="pe_q_order" points=2
# **Model answer.** Attention mixes value vectors with weights computed from dot products between
# token vectors; nothing in that computation depends on where a token stands. Reordering the input
# reorders the rows of $Q$, $K$ and $V$ together, so every token gets exactly the same output
# vector, only in another row. Both sentences hold the same tokens, so "dog" comes out the same
# whether it is the subject or the object. Once $PE_{pos}$ is added, the same word at position 1
# and at position 4 is a different vector: its scores against the other tokens differ, and the
# outputs can depend on the order.
#
# **Rubric.**
# - 1 point: the weights and outputs depend only on the token vectors, so permuting the input
#   permutes the output (the same words get the same vectors in both sentences).
# - 1 point: with the encoding added, one word at two positions is two different vectors, so scores
#   and outputs can depend on order.

# %% [markdown]
# **Question 2 (2 points).** `pe` is registered with `register_buffer`, not stored as an
# `nn.Parameter` and not as a plain attribute (`self.pe = pe`). For each of the two alternatives,
# say what would go wrong. Think of the optimiser, `model.to(device)` and `state_dict()`.

# %% [markdown] answer="pe_q_buffer" points=2
# **Model answer.** As an `nn.Parameter` the table would be in `model.parameters()`, so the
# optimiser would change it at every step: the fixed sinusoids would drift into a learned encoding
# (with its own extra parameters), which is not the paper's model and loses the clean
# relative-offset structure. As a plain attribute PyTorch does not know the tensor exists:
# `model.to("cuda")` or `.double()` leave it behind on the CPU in float32, so `x + pe` fails with a
# device or type mismatch on a GPU, and `state_dict()` does not contain it. A buffer moves and is
# saved with the module but is never trained.
#
# **Rubric.**
# - 1 point: a Parameter is updated by the optimiser, so the fixed table becomes a learned one.
# - 1 point: a plain attribute is not moved or converted by `.to(...)` (device mismatch on a GPU)
#   and is not in the `state_dict`.

# %% [markdown]
# **Question 3 (2 points).** The encoder of stage 4 multiplies the embeddings by $\sqrt{d_{model}}$
# *before* adding the positional encoding. Using the sizes printed in section 5, explain what the
# sum would be dominated by without this factor and why that hurts. Why is the scaling not done
# inside `PositionalEncoding`?

# %% [markdown] answer="pe_q_scale" points=2
# **Model answer.** Freshly initialised embedding entries are tiny (about 0.01 in section 5), while
# the encoding's entries lie between -1 and 1 with a typical size of about 0.6, some 40 times more.
# Without the factor the input would be almost all position: two different words at the same
# position would be nearly the same vector, so attention would at first see positions rather than
# words, and training would have to grow the embeddings before the words could count. Multiplying
# by $\sqrt{d_{model}} = 8$ brings the word signal to about 0.1, the same order as the position
# signal. The scaling
# belongs to the embedding layer (the paper scales the embedding weights); `PositionalEncoding` only
# adds a fixed signal. Scaling inside it would scale whatever it receives, and after the addition it
# would scale the positions too, changing the balance the factor is meant to set.
#
# **Rubric.**
# - 1 point: without the factor the encoding (entries up to 1) swamps the small initial embeddings,
#   so words are hard to tell apart at first.
# - 1 point: the scaling is the embedding's job, before the addition; inside the encoding module (or
#   after adding) it would scale the positions as well.

# %%
check.summary()
