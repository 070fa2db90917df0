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
# **Working time:** about 1¾ hours if you are at ease with PyTorch, about 3¼ hours if you are new to it or get
# stuck. That is reading (34 minutes at 150 words a minute without the folded hints, 55 at 100 words a minute
# with them, and the given code at 10 lines a minute), two exercises, two predictions and three written
# questions, 5 to 10 minutes of setting up (Colab, the setup cell, saving a copy), and cells that run in
# seconds. (Estimated by `scripts/working_time.py` in the course repository from the notebook's length and the
# measured run time of its cells, with assumptions it prints, not measurements of students: for example 150 or
# 100 words a minute, 5 or 10 minutes per exercise plus 2 or 4 per line you write, 10 or 20 per bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. explain why a model built from attention needs to be *told* where each token sits;
# 2. write down the sinusoidal encoding and say what `pos`, `i` and `d_model` mean in it;
# 3. implement `PositionalEncoding` as a PyTorch module with a buffer and dropout;
# 4. derive the one matrix $M_k$ that turns the encoding of every position into that of the position
#    $k$ further on, build it in code, check numerically that it works at every position of a table, and say
#    what that does and does not give attention;
# 5. say why the paper chose sinusoids over learned position vectors, and what rotary encodings
#    (RoPE) later built on the same property;
# 6. say where the embeddings are scaled by $\sqrt{d_{model}}$ and what that scaling does (and does
#    not) do.
#
# **Before you start.** You need PyTorch tensors (shapes, broadcasting, slicing with a step), how an
# `nn.Module` is built, the dot product, and sine and cosine with the angle-addition formulas
# $\sin(a+b) = \sin a\cos b + \cos a \sin b$ and $\cos(a+b) = \cos a \cos b - \sin a \sin b$. You do not
# need attention yet (stage 2 builds it): here it is enough to know that attention compares tokens
# through dot products of their vectors.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package), then
# the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is given and
# correct. After each exercise a few *check cells* test one property each: `✔` means it holds, a red `✘`
# block says what was expected and what came out, hints folded under it. A failing check does not stop the
# notebook: *Run all* always reaches the end, where the last cell lists every check with its points. (To
# stop at the first failing check instead, set `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The
# check cells also grade your work, so all green here means full marks for the visible checks (the grader
# also runs a few hidden ones with other sizes; a prediction, marked ○, is scored only then).
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
# Attention (stage 2) compares every token with every other token through dot products. In
# **self-attention without a mask**, where every token may look at every token of the sentence,
# nothing in that computation depends on the *order* of the tokens: shuffle the words of a sentence
# and each word gets exactly the same attention result, only shuffled (the output is
# *permutation-equivariant*). "Dog bites man" and "man bites dog" hold the same words, so each word
# comes out as the same vector in both. An RNN knows order because it reads one token after
# another; a Transformer reads all tokens at once, so order must be written into the input. (This is
# a statement about attention *without* a mask. The Transformer's decoder, which you build in stages
# 3 and 4, uses a causal mask (stage 2 makes it), under which each token sees only itself and the
# tokens before it; Question 1 asks you what that changes.)
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
# - $10000^{2i/d_{model}}$ — the wavelength factor: column pair $i$ turns by the angle
#   $\omega_i = 1/10000^{2i/d_{model}}$ per position, so pair 0 completes a cycle every
#   $2\pi \approx 6.3$ positions and the last pair only every $2\pi \cdot 10000^{(d_{model}-2)/d_{model}}$
#   positions, just under $2\pi \cdot 10000$ (the paper: "a geometric progression from $2\pi$ to
#   $10000 \cdot 2\pi$").
#
# **Why this choice?** Every position gets its own pattern, and the values stay in $[-1, 1]$ however
# long the sentence. Above all, the paper's stated reason (section 3.5): "we hypothesized it would
# allow the model to easily learn to attend by relative positions, since for any fixed offset $k$,
# $PE_{pos+k}$ can be represented as a linear function of $PE_{pos}$." A linear function of a vector
# is a matrix, so the claim is: for each offset $k$ there is **one** $d_{model} \times d_{model}$
# matrix $M_k$ with
#
# $$PE_{pos+k} = M_k \, PE_{pos} \qquad \text{for every position } pos,$$
#
# the same matrix at position 3 as at position 300 (here $PE_{pos}$ is row $pos$ of the table, read as
# a column vector). The paper states this without a proof. Section 5 has you find $M_k$ from the
# formula above and check the claim with numbers (numbers on a table are evidence; the proof is the
# derivation you make to build $M_k$); section 4 draws the picture to start from.
#
# ### What goes wrong, and what it looks like
# - row 0 of the table reads 1, 0, 1, 0, ... instead of 0, 1, 0, 1, ...;
# - the wavelengths grow too slowly, or too fast, from one column pair to the next;
# - columns 3, 5, 7, ... stay 0;
# - in training mode more entries come out zero than the dropout rate gives, or the encodings pass
#   through unchanged while the embeddings are dropped out.
#
# <details><summary>The causes behind these symptoms (open this when a check fails and you are stuck)</summary>
#
# In the same order: sine and cosine swapped (the sine belongs in the even columns); the exponent off
# by a factor of two ($i$ used where the formula has $2i$, or an index that already counts in steps of
# two doubled once more); the cosine written into a single column instead of every odd column; dropout
# applied twice, or to `x` before the addition (the given `return` already applies it, once, to the
# sum of embeddings and encodings, as the paper does).
#
# </details>

# %% [markdown]
# ## 3. Exercise: `PositionalEncoding`
#
# Complete the two marked parts:
# 1. in `__init__`, compute the table `pe` of shape `(max_seq_length, d_model)`;
#    the given line after it adds the batch axis and registers the buffer;
# 2. in `forward`, add the first `seq_len` rows of the table to `x`
#    (`x` has shape `(batch, seq_len, d_model)`); the given `return` applies dropout.
#
# The table is `float32` (PyTorch's default), with sine in the even columns and cosine in the odd
# ones, exactly as in the formula of section 2. Try it on your own first; if you are stuck, open the
# hints one at a time.
#
# <details><summary>Hint 1: the idea</summary>
#
# You do not need a loop. Every entry of the table is the sine or the cosine of one angle,
# $pos \cdot \omega_i$: a position times a frequency. So first build the table of all the angles at
# once, every position times every frequency, then take its sine for the even columns and its cosine
# for the odd ones. In `forward`, the buffer holds more positions than a sentence has: keep only as
# many as `x` has, and let broadcasting add them to every sentence of the batch.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# | tensor | shape |
# |---|---|
# | the positions $0, 1, \dots$, as a column | `(max_seq_length, 1)` |
# | the frequencies $\omega_i$, one per column pair | `(d_model / 2,)` |
# | their product, the angle table (broadcasting) | `(max_seq_length, d_model / 2)` |
# | the even columns of `pe`, and the odd ones | `(max_seq_length, d_model / 2)` each |
# | the registered buffer | `(1, max_seq_length, d_model)` |
# | the part of it `forward` adds | `(1, seq_len, d_model)`: broadcasts over the batch |
#
# Axis 1 of the buffer is the position; axis 0 has size 1 (the batch axis added by the given line).
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# - `torch.arange(max_seq_length, dtype=torch.float)` gives the positions; `.unsqueeze(1)` makes
#   them a column.
# - `torch.arange(0, d_model, 2, dtype=torch.float)` gives the values $2i$ themselves (do not double
#   them again). A numerically pleasant form of the frequency is
#   $\omega_i = 1/10000^{2i/d_{model}} = \exp\left(-2i \cdot \ln(10000) / d_{model}\right)$, with
#   `torch.exp` and `math.log`.
# - Start from `pe = torch.zeros(max_seq_length, d_model)` and assign `torch.sin` of the angle
#   table to `pe[:, 0::2]` and `torch.cos` of it to `pe[:, 1::2]`.
# - In `forward`: `x = x + self.pe[:, :x.size(1)]`.
#
# </details>

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
# ### Predict, then run
# Work these out on paper before you run anything: each is one line of reasoning from the formula
# or from how PyTorch treats a buffer. Write your prediction after `return`: a number, or the
# arithmetic you worked out (such as `3 * 4`; `math` is allowed). A prediction is a value you work
# out, so the function may not call your module, torch or anything else of the notebook: the check
# refuses that. The check only looks at the form of your prediction and notes it: **it is scored when
# your notebook is graded**, and nothing in this notebook says whether it is right, so trying again
# tells you nothing. The cell after the checks shows the truth for *other* sizes: use it to test
# your method. The answer you are graded on is never printed.
#
# **Prediction 1 (1 point).** For the paper's $d_{model} = 512$, what is the dot product
# $PE_{pos} \cdot PE_{pos}$ of a row of the table with itself? (It is the same for every position;
# within 1%.)

# %% solution="pe_predict_self_dot"
def predict_self_dot_product() -> float:
    """Your prediction of PE[pos] · PE[pos] for d_model = 512."""
    ### BEGIN SOLUTION
    return (512 // 2) * 1.0  # one sin² + cos² = 1 per column pair
    ### END SOLUTION


# %% tests="pe_predicted_self_dot" points=1
assert check.predicted_self_dot_product(predict_self_dot_product)

# %% [markdown]
# **Prediction 2 (1 point).** Token ids first go through an embedding table, `nn.Embedding(1000, 512)`:
# one trainable vector of 512 numbers for each of 1,000 words (stage 4 builds it in). How many
# *trainable* parameters does `nn.Sequential(nn.Embedding(1000, 512), PositionalEncoding(d_model=512,
# max_seq_length=5000, dropout=0.1))` have, that is, how many numbers would
# `sum(p.numel() for p in model.parameters())` count?

# %% solution="pe_predict_parameters"
def predict_parameter_count() -> int:
    """Your prediction of the trainable parameters of Embedding(1000, 512) then PositionalEncoding(512, 5000, 0.1)."""
    ### BEGIN SOLUTION
    return 1000 * 512 + 0  # the embedding's table; the encoding's table is a buffer and dropout has no weights
    ### END SOLUTION


# %% tests="pe_predicted_parameters" points=1
assert check.predicted_parameter_count(predict_parameter_count)

# %% [markdown]
# **The truth, for other sizes.** The cell below measures both with your own `PositionalEncoding`
# on smaller sizes: the dot product for $d_{model} = 20$ at three positions, and the parameters of
# an embedding of 100 words × 20 followed by `PositionalEncoding(20, 40, 0.1)`, beside the numbers
# its buffers hold. Check that your method gives these numbers too; where it does not, find the step
# of your reasoning that went wrong.

# %%
table = PositionalEncoding(d_model=20, max_seq_length=40, dropout=0.0).pe[0]  # (40, 20)
print("d_model = 20: PE[pos] · PE[pos] for pos = 0, 17, 39:",
      [round(float(table[p] @ table[p]), 4) for p in (0, 17, 39)])
small = nn.Sequential(nn.Embedding(100, 20), PositionalEncoding(d_model=20, max_seq_length=40, dropout=0.1))
print("trainable parameters:", sum(p.numel() for p in small.parameters()),
      {name: tuple(p.shape) for name, p in small.named_parameters()},
      "  numbers in buffers:", sum(b.numel() for b in small.buffers()))

# %% [markdown]
# ## 4. Looking at the encoding
#
# **The table as a heatmap.** Rows are positions, columns are dimensions. On the left the columns
# flip sign every few positions; towards the right they change so slowly that over 100 positions
# they look constant. Read a row from left to right and you read a position's "fingerprint".

# %%
encoding = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0)
figures.plot_encoding_heatmap(encoding.pe)
plt.show()

# %% [markdown]
# **A few columns as curves.** Each column is one sinusoid; each pair (sin, cos) shares a
# wavelength, and the wavelength grows geometrically with $i$.

# %%
encoding = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0)
figures.plot_encoding_curves(encoding.pe, dims=(0, 1, 8, 9, 20, 21))
plt.show()

# %% [markdown]
# **Each column pair on its own.** Draw the two entries of one column pair at position $p$,
# $(\sin \omega_i p,\ \cos \omega_i p)$, as a point in the plane: since $\sin^2 + \cos^2 = 1$, every
# position lands on the unit circle, and one step along the sentence moves the point by the same
# angle $\omega_i$ around it. The figure draws positions 0 to 11 for a fast pair and a slower one,
# with arrows from $p$ to $p + 3$ for two different $p$: look at how far each arrow goes round the
# circle. That picture, written as a formula, is section 5's exercise.

# %%
encoding = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0)
figures.plot_pairs_on_circles(encoding.pe, pairs=(0, 3), positions=12, offset=3, starts=(1, 6))
plt.show()

# %% [markdown]
# **Which positions look alike?** Each column pair contributes
# $\sin a \sin b + \cos a \cos b = \cos(a - b)$, so
#
# $$PE_p \cdot PE_q = \sum_{i=0}^{d_{model}/2 - 1} \cos\big(\omega_i\,(p - q)\big).$$
#
# It depends only on the offset $p - q$: the bands run parallel to the diagonal. It is largest at
# $p = q$. And it is **even** in the offset, since $\cos(-x) = \cos x$: the
# token three places to the left and the token three places to the right get exactly the same value,
# so this dot product alone cannot tell left from right. Away from the diagonal the value falls
# quickly at first, then only slowly and not steadily: it goes up and down, because the columns'
# different wavelengths drift in and out of step (the banding in the figure). The cell prints it for
# a few offsets.

# %%
encoding = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0)
figures.plot_position_similarity(encoding.pe)
plt.show()
table = encoding.pe[0]  # (200, 64)
print("PE[10]·PE[13] =", round(float(table[10] @ table[13]), 4),
      "  PE[40]·PE[43] =", round(float(table[40] @ table[43]), 4), "(same offset, same value)")
print("PE[50]·PE[47] =", round(float(table[50] @ table[47]), 4),
      "  PE[50]·PE[53] =", round(float(table[50] @ table[53]), 4), "(left and right look alike)")
offsets = [1, 2, 5, 10, 20, 40, 60, 80, 100, 120, 140]
print("PE[50]·PE[50 + k] for k =", offsets)
print("                        ", [round(float(table[50] @ table[50 + k]), 1) for k in offsets])

# %% [markdown]
# ## 5. Exercise: an offset is a matrix
#
# **Why it matters for attention.** Attention does not score $PE_p \cdot PE_q$. It first projects
# each token's vector with learned matrices, a query $W_Q$ and a key $W_K$ (stage 2), and scores
# $(x_p + PE_p) W_Q \cdot (x_q + PE_q) W_K$. Its position part, $PE_p W_Q \cdot PE_q W_K$, is in
# general *not* a function of $p - q$ any more: the first line of the cell below shows it for random
# projections. What the paper points to is a structure a projection can use: if
# $PE_{p+k} = M_k\, PE_p$ with one matrix $M_k$, then a query projection $W_Q$ made from $M_k$ turns
# the position part of the query of position $p$ into $PE_{p+k}$ (mind the two conventions: $M_k$ acts
# on $PE_p$ as a column vector, while attention multiplies row vectors by its matrices from the right;
# how the two meet is yours to work out, and it matters again in the exercise), and with $W_K$ the identity the
# position part of its score for key $q$ is $PE_{p+k} \cdot PE_q$, largest at $q = p + k$. It does so
# at every $p$ with the same matrix: "look $k$ tokens to the right" is one linear map that training
# can find. (Whether a trained model uses it this way is another matter: the paper states the
# property as a hope.)

# %%
table = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0).pe[0]  # (200, 64): your table
torch.manual_seed(0)
W_Q, W_K = torch.randn(64, 64) / 8, torch.randn(64, 64) / 8  # random projections
scores = [round(float((table[p] @ W_Q) @ (table[p + 3] @ W_K)), 3) for p in (10, 40)]
print("(PE[p] W_Q)·(PE[p+3] W_K) for p = 10, 40:", scores, "(same offset, different scores)")

# %% [markdown]
# **The exercise.** Test the paper's claim: build $M_k$, then measure that it does what the claim
# says at every position of a table. Complete the two functions of the cell below.
#
# 1. `offset_matrix(k, d_model)` returns $M_k$: a `(d_model, d_model)` tensor of floats such that
#    $M_k\, PE_p = PE_{p+k}$ for **every** position $p$ (row $p$ of the table of section 2, read as a
#    column vector of `d_model` numbers), for any whole offset $k$: positive (forward), 0, negative
#    (backward), and larger than any table. It depends on `k` and `d_model` only, not on $p$ and not
#    on a table: derive it from the formula of section 2, on paper first. (float64 keeps it exact to
#    about $10^{-15}$; the checks accept float32 too.)
# 2. `largest_offset_error(table, matrix, k)` returns, as a Python float, the largest absolute
#    difference between `matrix` $\cdot PE_p$ and $PE_{p+k}$, over every entry and over **every**
#    position $p$ for which both $p$ and $p + k$ are rows of `table` (`(n, d_model)`, row $p$ is
#    $PE_p$; $k$ may be 0 or negative, $|k| < n$; `table` and `matrix` have the same dtype). It takes
#    any matrix: a wrong one gives a large number. With your `offset_matrix` it is your evidence: only
#    rounding is left, at every one of those positions.
#
# The checks give `offset_matrix` no table: they compare $M_k PE_p$ with $PE_{p+k}$ computed from the
# formula, for many $p$ and several $k$. They give `largest_offset_error` tables whose largest error
# sits at the first or the last position that counts.
#
# ### Pitfalls
# - the turn the wrong way round: then $M_k$ moves every position $k$ *back*. Try it on a small case
#   before the checks: $M_1$ applied to row 0 of your table must give row 1;
# - a matrix that is right for $k > 0$ only: $k = 0$ is the identity, and a negative $k$ moves back;
# - in `largest_offset_error`, positions left out at either end, or the offset applied the other
#   way: the error must be measured at every $p$ that has a partner $k$ rows away, and nowhere else.
#
# <details><summary>Hint 1: the idea</summary>
#
# Take one column pair on its own: at position $p$ it holds $\sin(\omega_i p)$ and $\cos(\omega_i p)$,
# a point on the unit circle (section 4's figure). At position $p + k$ it holds
# $\sin(\omega_i p + \omega_i k)$ and $\cos(\omega_i p + \omega_i k)$. Expand both with the
# angle-addition formulas: each is $\sin(\omega_i p)$ times a number plus $\cos(\omega_i p)$ times a
# number, and those numbers depend on $k$ and $\omega_i$ only. Four numbers per pair, and no pair
# needs another pair's entries: that is all of $M_k$. In `largest_offset_error`, apply the matrix to
# every row that has a partner $k$ rows further on, all at once, subtract the partners, and keep the
# largest absolute entry.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# $M_k$ is zero except for one $2 \times 2$ block per column pair on its diagonal, in rows and columns
# $2i$ and $2i + 1$:
#
# $$\begin{pmatrix} \sin \omega_i(p+k) \\ \cos \omega_i(p+k) \end{pmatrix} =
#   \begin{pmatrix} \cos \omega_i k & \sin \omega_i k \\ -\sin \omega_i k & \cos \omega_i k \end{pmatrix}
#   \begin{pmatrix} \sin \omega_i p \\ \cos \omega_i p \end{pmatrix}$$
#
# The frequencies $\omega_i$, one per pair, are a `(d_model / 2,)` tensor, as in your table. Slices
# with a step of 2 reach one kind of entry of every block at once: `M[0::2, 0::2]` is a
# `(d_model / 2, d_model / 2)` view whose diagonal holds the top-left entry of every block, and
# `torch.diag(v)` is a square matrix with `v` on its diagonal. In `largest_offset_error` the table holds
# the $PE_p$ as *rows*: $M\,PE_p$ for all of them at once is the rows times $M^\top$, shape
# `(number of positions, d_model)`. The positions $p$ run from $\max(0, -k)$ up to, but not including,
# $\min(n, n - k)$.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# # offset_matrix
# omega = 1 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model / 2,)
# cos, sin = torch.cos(k * omega), torch.sin(k * omega)
# matrix = torch.zeros(d_model, d_model, dtype=torch.float64)
# matrix[0::2, 0::2], matrix[0::2, 1::2] = torch.diag(cos), torch.diag(sin)
# matrix[1::2, 0::2], matrix[1::2, 1::2] = torch.diag(-sin), torch.diag(cos)
# # largest_offset_error
# start, stop = max(0, -k), min(table.size(0), table.size(0) - k)
# error = (table[start:stop] @ matrix.T - table[start + k:stop + k]).abs().max()
# ```
#
# </details>

# %% solution="positional_offset"
#| include transformer_course.reference.positional_encoding:offset_matrix
#| include transformer_course.reference.positional_encoding:largest_offset_error

# %% [markdown]
# ### Check your work
# The checks of `offset_matrix` use the paper's formula for $PE$, not your table, so a mistake in
# section 3 costs nothing here.

# %% tests="pe_offset_matrix_shape" points=1
assert check.offset_matrix_shape(offset_matrix)

# %% tests="pe_offset_matrix_moves" points=2
assert check.offset_matrix_moves_every_position(offset_matrix)

# %% tests="pe_offset_matrix_any_offset" points=1
assert check.offset_matrix_any_offset(offset_matrix)

# %% tests="pe_offset_matrix_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.offset_matrix_moves_every_position(offset_matrix, d_model=34, offset=7, max_seq_length=50)
assert check.offset_matrix_any_offset(offset_matrix, d_model=6, max_seq_length=20)
assert check.offset_matrix_shape(offset_matrix, d_model=2, offset=1)
### END HIDDEN TESTS

# %% tests="pe_offset_error_values" points=1
assert check.offset_error_values(largest_offset_error)

# %% tests="pe_offset_error_offsets" points=1
assert check.offset_error_offsets(largest_offset_error)

# %% tests="pe_offset_error_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.offset_error_values(largest_offset_error, d_model=10, max_seq_length=20, offset=7)
assert check.offset_error_offsets(largest_offset_error, d_model=4, max_seq_length=15)
### END HIDDEN TESTS

# %% [markdown]
# **Your evidence, on your own table.** The cell below takes the table of your `PositionalEncoding`
# (200 positions, $d_{model} = 64$) and measures, for several offsets, the largest difference between
# $M_k PE_p$ and $PE_{p+k}$ over every position that has a partner. Your table is stored in float32,
# so its entries carry rounding errors: about $10^{-5}$ if its angles were computed in float32 (the far
# positions' angles are large numbers), about $10^{-7}$ if they were computed in float64 and only the
# result stored in float32. Differences of that size are the table's rounding, not a failure of the claim. The
# last line uses $M_3$ for the offset 4: a matrix for another offset fails at once. Then the figure:
# $PE_{50} \cdot PE_q$ against $q$, symmetric about 50, and $(M_3 PE_{50}) \cdot PE_q$, whose peak
# sits where $M_3$ sent position 50.

# %%
table = PositionalEncoding(d_model=64, max_seq_length=200, dropout=0.0).pe[0].double()  # (200, 64), float64
for k in (1, 3, -5, 0, 120):
    print(f"k = {k:4d}: largest |M_k PE_p - PE_(p+k)| over every p with a partner: "
          f"{largest_offset_error(table, offset_matrix(k, 64).double(), k):.1e}")
print(f"M_3 used for the offset 4: {largest_offset_error(table, offset_matrix(3, 64).double(), 4):.2f}")
figures.plot_offset_scores(table, offset_matrix(3, 64), position=50, offset=3)
plt.show()

# %% [markdown]
# ## 6. Why sinusoids, and what came after
#
# **Learned positions work as well.** The paper also tried *learned* positional embeddings, one
# trained vector per position (an `nn.Embedding(max_seq_length, d_model)` indexed by position), and
# "found that the two versions produced nearly identical results": in its Table 3, row (E), the base
# model with learned positions scores 25.7 BLEU against 25.8 with sinusoids, on the English→German
# development set (newstest2013).
#
# **Why sinusoids, then?** The paper: "because it may allow the model to extrapolate to sequence
# lengths longer than the ones encountered during training". A learned table has one vector per
# position it was trained on and nothing beyond; the formula gives a vector for any position, and
# the same $M_k$ at every position. Note the "may": the paper did not measure it. Later work did, and
# found that Transformer language models with sinusoidal encodings get much worse on sequences only
# a little longer than those they were trained on (Press, Smith and Lewis, 2022, *ALiBi*).
#
# **Rotary position embeddings (RoPE).** Su et al. (2021, *RoFormer*) took the property of section 5
# one step further. Instead of adding $PE_{pos}$ to the input once, they *rotate* every query and key
# inside attention, pair by pair, by the angles of its position: the query vector $\mathbf{q}$ of
# position $m$ by a matrix $R_m$ and the key vector $\mathbf{k}$ of position $n$ by $R_n$, each of
# which turns every pair of coordinates as your $M_k$ turns the column pairs of $PE$ (by $m$ or $n$
# steps). Such rotations compose: turning back by $m$ and then forward by $n$ is turning by $n - m$,
# $R_m^\top R_n = R_{n-m}$ (the cell below checks it with your `offset_matrix`). So the score
#
# $$(R_m\, \mathbf{q}) \cdot (R_n\, \mathbf{k}) = \mathbf{q}^\top R_m^\top R_n\, \mathbf{k}
#   = \mathbf{q}^\top R_{n-m}\, \mathbf{k}$$
#
# depends on the positions only through $n - m$, whatever the learned projections, and, unlike
# $PE_p \cdot PE_q$, it can tell left from right. Many recent language models use it. This course
# keeps the paper's additive encoding.

# %%
m, n = 7, 19
composed = offset_matrix(m, 64).double().T @ offset_matrix(n, 64).double()  # turn back by m, then forward by n
print(f"largest |M_{m}ᵀ M_{n} - M_{n - m}|: {(composed - offset_matrix(n - m, 64).double()).abs().max():.1e}")

# %% [markdown]
# ## 7. Where the embeddings are scaled by $\sqrt{d_{model}}$
#
# Section 3.4 of the paper: "In the embedding layers, we multiply those weights by
# $\sqrt{d_{model}}$." In the Encoder and Decoder of stage 4, the input of the first layer for the
# token $w$ at position $pos$ is therefore
#
# $$\mathrm{Dropout}\big(\sqrt{d_{model}}\; E_w + PE_{pos}\big),$$
#
# where $E_w$ is the token's row of the embedding matrix: the embedding is scaled **before** the
# positional encoding is added, and the encoding itself is not scaled.
#
# **Why?** The paper gives no reason: that sentence is all it writes about it. What the factor does is
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
for name, initialise in (("PyTorch default N(0, 1)", nn.init.normal_), ("Xavier uniform", nn.init.xavier_uniform_)):
    embedding = nn.Embedding(vocab_size, d_model)
    initialise(embedding.weight)
    word = embedding(tokens).detach()  # (1, 20, d_model)
    print(f"{name:23s}: typical |embedding entry| {word.abs().mean():.3f}, after scaling by "
          f"sqrt(d_model) = {math.sqrt(d_model):.0f}: {(word * math.sqrt(d_model)).abs().mean():.3f}")
position_signal = PositionalEncoding(d_model, 20, 0.0).pe  # (1, 20, d_model): your table
print(f"typical |PE entry|: {position_signal.abs().mean():.3f}")

# %% [markdown]
# **Reading the numbers.** With the default initialisation the scaled word signal is about ten times
# larger than the position signal (about 6.4 against 0.57). The Xavier line is the one that matters
# for this course (stage 4 initialises its embeddings that way), and Question 3 asks you to read it.
# During training the model learns embeddings of whatever size works. Before you trust the common
# explanation that the scaling "keeps the position signal from drowning the words", compare the
# numbers at the initialisation this course uses.

# %% [markdown]
# ## Summary
# - Self-attention without a mask ignores order, so each position gets a fixed sinusoidal vector
#   added to its embedding.
# - Even columns hold $\sin(pos/10000^{2i/d_{model}})$, odd columns the cosine of the same angle.
# - `pe` is a buffer of shape `(1, max_seq_length, d_model)`; `forward` adds the table's first
#   `seq_len` positions and applies dropout to the sum.
# - $PE_p \cdot PE_q$ depends only on $p - q$ and cannot tell left from right; the useful property is
#   the paper's claim you checked: one matrix $M_k$ per offset, the same at every position, with
#   $PE_{p+k} = M_k PE_p$; rotary encodings (RoPE) build on the same turning of column pairs.
# - Learned position vectors scored nearly the same in the paper; it chose sinusoids in the hope of
#   handling longer sentences than seen in training.
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
# **Question 1 (2 points).** Section 1's shuffle argument was about self-attention *without* a
# mask. Now take a decoder-only model, as in today's language models: every layer uses a causal mask
# (each token attends only to itself and the tokens before it), and there is **no** positional
# encoding at all. Does shuffling the input still only shuffle the output? Can such a model tell
# "dog bites man" from "man bites dog", and can it find out at which position a token stands?
# Explain.

# %% [markdown] answer="pe_q_causal" points=2
# **Model answer.** No: the causal mask breaks the symmetry. Token $t$ mixes only tokens $1..t$, so
# what a token sees depends on where it stands: the first token attends to itself alone, the last
# to the whole sentence. Shuffling the input therefore changes the outputs, not just their order. In
# "dog bites man" the first output is computed from "dog" alone, in "man bites dog" from "man" alone,
# so the two sentences give different outputs and the model can tell them apart. Within one layer,
# token $t$ still sees the tokens before it as a *set* (a weighted average does not know the order
# of what it averages), but the outputs of the earlier positions already differ with the order, so
# the next layer sees the order too. Position can be inferred as well, for example from how many
# tokens are being averaged: if attention spreads evenly, a token that starts every sentence (such as
# `<bos>`) gets a share of $1/t$ at position $t$, which tells the model $t$. (Language models trained
# without any positional encoding have indeed been found to learn positional information.) The encoder,
# unmasked, has no such help and needs the encoding.
#
# **Rubric.**
# - 1 point: the causal mask makes what a token sees depend on its position (token $t$ sees only
#   $1..t$; the first token only itself), so shuffling changes the outputs and the two sentences
#   differ (for example in the first token's output).
# - 1 point: position or order can be recovered, argued either from how many tokens each position
#   averages (a $1/t$ share of a fixed first token), or from stacked layers, whose inputs at earlier
#   positions already differ with the order.

# %% [markdown]
# **Question 2 (2 points).** The given line registers `pe` with `register_buffer`. Suppose a
# classmate wrote `self.pe = pe.unsqueeze(0)` instead, a plain attribute. Predict what happens in
# each case, and why: (a) on a machine with a GPU, `model.to("cuda")`, then a forward pass on a batch
# that is on the GPU; (b) on the CPU, `model.double()`, then a forward pass on a `float64` batch.

# %% [markdown] answer="pe_q_buffer" points=2
# **Model answer.** `Module.to(...)` and `Module.double()` convert only the module's parameters and
# buffers (and those of its submodules); a plain tensor attribute is invisible to them and stays as it
# was built, a `float32` tensor on the CPU. (a) The batch is on the GPU and `pe` on the CPU, so `x +
# self.pe[...]` raises a `RuntimeError` (tensors on different devices), at the first forward pass. (b)
# Nothing fails: PyTorch's type promotion makes `float64 + float32` a `float64` result, so the sum is
# computed and returned in `float64`; the table's values were computed in `float32` either way, so the
# result is the same, number for number, as with a buffer. (Also true: the plain attribute is missing
# from `state_dict()`, which does no harm here, because the constructor rebuilds the same table.) A
# buffer avoids (a): it moves and converts with the module, is saved with it, and is still never
# trained.
#
# **Rubric.**
# - 1 point: (a) fails with a device-mismatch error, because `.to()` moves parameters and buffers
#   only and the plain attribute stays on the CPU.
# - 1 point: (b) runs: `float64 + float32` is promoted to `float64` (either saying so, or saying that
#   only a device mismatch, not a dtype mismatch, makes the sum fail).

# %% [markdown]
# **Question 3 (2 points).** Stage 4 initialises its embeddings with Xavier-uniform, as in section 7.
# Suppose its Encoder forgot the factor $\sqrt{d_{model}}$. Using the numbers printed in section 7,
# estimate how the sum "embedding + encoding" is split between the word and its position at the start
# of training, and what that means for telling words apart. A classmate proposes to fix it inside
# `PositionalEncoding`, by returning $\sqrt{d_{model}} \cdot (x + PE)$. Does that give the paper's
# balance between word and position? Compare the three cases.

# %% [markdown] answer="pe_q_scale" points=2
# **Model answer.** Section 7 printed a typical Xavier embedding entry of about 0.014 and a typical
# encoding entry of about 0.57, about 40 times larger. Without the factor the sum is almost all
# position: two different words at the same position differ by a few hundredths per entry on top of
# the same position vector, so at the start the first layer sees mostly positions and words are hard
# to tell apart (training can still grow the embeddings, but it starts from there). With the
# paper's factor ($\sqrt{64} = 8$) the word entries are about 0.11, still about five times smaller
# than the encoding: the factor narrows the gap eightfold but does not make words dominate at this
# initialisation. The classmate's version multiplies word and position alike, so their ratio is the
# same as without the factor (about 1 to 40), only everything is eight times larger; it is not the
# paper's model, which scales the embedding alone before the encoding is added.
#
# **Rubric.**
# - 1 point: without the factor the word signal is about 40 times smaller than the position signal
#   (about 0.014 against 0.57), so the input is mostly position at first; with the factor it is still
#   about five times smaller (sizes compared by squares instead, about 1:2000 and 1:27, are as good).
# - 1 point: scaling after the addition multiplies both signals, so the word-to-position ratio is the
#   one without the factor; only scaling the embedding before the addition changes the balance.

# %%
check.summary()
