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
# # Stage 2 — Attention, masks and multi-head attention
#
# *Transformers from Scratch*: you build the Transformer of Vaswani et al.,
# ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (2017), one stage at a time.
#
# | stage | notebook |
# |---|---|
# | 0 (optional) | why attention: the RNN bottleneck, additive attention |
# | 1 | positional encoding |
# | **2** | **scaled dot-product and multi-head attention, masks** (this one) |
# | 3 | feed-forward, residual + LayerNorm, encoder and decoder blocks |
# | 4 | the full encoder–decoder |
# | 5 | training on Multi30k German→English |
# | 6 | greedy decoding, BLEU, attention heatmaps |
# | 7 (optional) | the key/value cache and beam search |
#
# **Working time:** about 2½ hours if you are at ease with PyTorch, about 4¼ hours if you are new to it or get
# stuck. That is reading (56 minutes at 150 words a minute without the folded hints, 85 at 100 words a minute
# with them, and the given code at 10 lines a minute), three exercises, one bug hunt, three predictions and
# three written questions, 5 to 10 minutes of setting up (Colab, the setup cell, saving a copy), and cells
# that run in seconds. (Estimated by `scripts/working_time.py` in the course repository from the notebook's
# length and the measured run time of its cells, with assumptions it prints, not measurements of students: for
# example 150 or 100 words a minute, 5 or 10 minutes per exercise plus 2 or 4 per line you write, 10 or 20 per
# bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. explain attention as a soft dictionary lookup with queries, keys and values;
# 2. write down $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$, name every symbol and its shape, and show
#    with numbers why the scores are divided by $\sqrt{d_k}$;
# 3. implement `scaled_dot_product_attention` for any number of leading axes, with an optional mask;
# 4. build the padding mask and the look-ahead mask, and say which keys each one hides and why;
# 5. implement `MultiHeadAttention` and its two helpers, `split_heads` and `combine_heads`, and say what
#    each head sees and why the biases of its projections are a convention, not the paper's;
# 6. recognise the classic attention bugs from their symptoms.
#
# **Before you start.** You need stage 1 (why positions are added to the embeddings), matrix products of
# batched tensors (`@` works on the last two axes, `transpose`), softmax, broadcasting, `view` and
# `reshape`, and `nn.Linear`.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package), then
# the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is given and
# correct, apart from the bug hunt's code, which says so. After each exercise a few *check cells* test one
# property each: `✔` means it holds, a red `✘` block says what was expected and what came out, hints
# folded under it. A failing check does not stop the notebook: *Run all* always reaches the end, where the
# last cell lists every check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work (the grader
# also runs a few hidden ones with other sizes). Work top to bottom: later exercises call your earlier
# functions.
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

from transformer_course.checks import attention as check
from transformer_course.reference.copy_task import copy_batch, copy_two_ways, train_copier  # section 7's bug hunt
from transformer_course.runtime import short_run
from transformer_course.visualisation import attention as figures
from transformer_course.visualisation import diagrams

# %% [markdown]
# ## 1. Queries, keys and values
#
# Think of a Python dictionary: you hand it a key, it finds the *one* entry whose key is equal and
# returns that entry's value. Attention is a *soft* version of that lookup. Every token produces
# three vectors:
#
# - a **query** $q$ — "what am I looking for?";
# - a **key** $k$ — "what do I contain?", the label other tokens match their queries against;
# - a **value** $v$ — "what do I hand over if someone picks me?".
#
# A query is compared with *every* key by a dot product: the better they agree, the larger the
# score. The scores become weights that are positive and sum to 1 (a softmax), and the result is
# the weighted average of the values. Instead of returning one entry, the lookup returns a blend,
# dominated by the best matches. In a trained Transformer the three vectors come from learned
# linear maps of the token's current vector (in the first layer, its embedding plus its positional
# encoding); here we choose them by hand.
#
# **A toy sentence.** Four tokens and four features, one per word class:
# `[noun, verb, determiner, particle]`. Each **key** says which class the token is; each **query**
# says which class the token wants to find ("the" looks for its noun, "cat" for its verb, "sat" for
# its subject noun, "down" for the verb it belongs to). Each **value** is a one-hot tag of its own
# token, so an output row reads directly as "how much of each token was mixed in".

# %%
tokens = ["the", "cat", "sat", "down"]
noun, verb, determiner, particle = torch.eye(4)  # one feature per word class

K_toy = 2 * torch.stack([determiner, noun, verb, particle])  # (4 tokens, d_k = 4): what each token is
Q_toy = 4 * torch.stack([noun, verb, noun, verb])  # (4, 4): what each token looks for
V_toy = torch.eye(4)  # (4 tokens, d_v = 4): token j hands over the tag e_j

scores_toy = Q_toy @ K_toy.T  # (4 queries, 4 keys): q_i · k_j for every pair
print(scores_toy)

# %% [markdown]
# Row $i$ of `scores_toy` compares query $i$ with every key. "sat" (row 2) scores 8 against "cat"
# and 0 against everything else: its query matches exactly one key. The heatmap shows the same
# table; the next two sections turn it into attention weights.

# %%
figures.plot_attention_weights(scores_toy, tokens, tokens, title="Raw scores q · k",
                               vmax=None, colour_label="score")
plt.show()

# %% [markdown]
# ## 2. Scaled dot-product attention
#
# For a whole sequence at once, stack the queries, keys and values as rows of matrices:
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V$$
#
# - $Q$ — the queries, shape `(q_len, d_k)`: one row per position that *asks*;
# - $K$ — the keys, shape `(k_len, d_k)`: one row per position that can be *looked at*; queries and
#   keys must have the same width $d_k$ so that their dot products exist;
# - $V$ — the values, shape `(k_len, d_v)`: one row per key, the content that gets mixed;
# - $K^\top$ — $K$ transposed, `(d_k, k_len)`, so $QK^\top$ has shape `(q_len, k_len)` and entry
#   $(i, j) = q_i \cdot k_j$, the **score** of query $i$ for key $j$;
# - $d_k$ — the width of queries and keys; $\sqrt{d_k}$ keeps the scores in a sensible range
#   (section 3);
# - $\mathrm{softmax}$ — applied to each **row** (over the keys, the last axis):
#   $a_{ij} = e^{s_{ij}} / \sum_{j'} e^{s_{ij'}}$, so each query's weights are positive and sum to 1;
# - the product with $V$ — row $i$ of the result is $\sum_j a_{ij} v_j$, shape `(q_len, d_v)`.
#
# Queries and keys can come from different sequences. In *self-attention* $Q$, $K$ and $V$ all come
# from the same sentence ($q\_len = k\_len$). In the decoder's *cross-attention* the queries come
# from the target sentence and the keys and values from the encoded source, so in general
# $q\_len \neq k\_len$.
#
# **Batches and heads.** In the model these matrices carry leading axes:
# `Q` is `(batch, heads, q_len, d_k)`. Matrix multiplication `@` treats every leading axis as a
# batch axis, so the same computation works for 2-D, 3-D or 4-D inputs, as long as the transpose of
# $K$ swaps only its **last two** axes (the leading axes must stay where they are).

# %% [markdown]
# ## 3. Why divide by $\sqrt{d_k}$?
#
# Take a query and a key whose $d_k$ entries are independent, with mean 0 and variance 1 (an
# initialisation that keeps the variance, such as Xavier's, gives roughly that; `nn.Linear`'s default
# gives about a third of the input's variance). Their dot product $q \cdot k = \sum_{m=1}^{d_k} q_m k_m$ is
# a sum of $d_k$ independent terms, each of mean 0 and variance $1 \cdot 1 = 1$. Variances of
# independent terms add up, so
#
# $$\mathrm{Var}(q \cdot k) = d_k, \qquad \text{typical size } |q \cdot k| \approx \sqrt{d_k}.$$
#
# With $d_k = 64$ (the paper's head width) scores of $\pm 8$ and more are common. Dividing by
# $\sqrt{d_k}$ brings the variance back to 1 whatever the width. The cell below measures it.

# %%
generator = torch.Generator().manual_seed(0)
d_k_values = [4, 16, 64, 256, 1024]
raw_variances, scaled_variances = [], []
for d_k in d_k_values:
    q = torch.randn(4000, d_k, generator=generator)  # 4000 random queries, entries ~ N(0, 1)
    k = torch.randn(4000, d_k, generator=generator)  # 4000 random keys
    dots = (q * k).sum(dim=-1)  # (4000,): one dot product per query-key pair
    raw_variances.append(dots.var().item())
    scaled_variances.append((dots / math.sqrt(d_k)).var().item())
    print(f"d_k = {d_k:4d}   Var(q·k) = {raw_variances[-1]:7.1f}   "
          f"Var(q·k / √d_k) = {scaled_variances[-1]:.2f}")

figures.plot_dot_product_variance(d_k_values, raw_variances, scaled_variances)
plt.show()

# %% [markdown]
# **Why large scores hurt.** The softmax of large, spread-out scores is almost one-hot: one key gets
# nearly all the weight. That looks decisive, but the softmax is then *saturated*: its derivative
# $\partial a_i / \partial s_j = a_i(\delta_{ij} - a_j)$ is close to 0 for every entry, so almost no
# gradient flows back to the queries and keys. The paper "suspects" that this is what hurts large
# $d_k$ (section 3.2.1): learning on such scores is slow. Below, one query meets 8 keys
# with $d_k = 512$: compare the weights and the largest entry of the softmax's Jacobian (the table
# of all $\partial a_i/\partial s_j$).

# %%
generator = torch.Generator().manual_seed(1)
d_k = 512
q = torch.randn(d_k, generator=generator)  # one query
K_random = torch.randn(8, d_k, generator=generator)  # (8 keys, d_k)
scores = K_random @ q  # (8,): the scores of this query

for name, s in (("unscaled", scores), ("scaled  ", scores / math.sqrt(d_k))):
    a = torch.softmax(s, dim=0)
    jacobian = torch.diag(a) - torch.outer(a, a)  # d a_i / d s_j
    print(f"{name}: largest weight {a.max():.3f}, largest gradient entry {jacobian.abs().max():.2e}")

figures.plot_softmax_saturation(scores, d_k)
plt.show()

# %% [markdown]
# ## 4. Hiding keys with a mask
#
# Sometimes a query must not look at certain keys: padding tokens that only fill a batch up to the
# same length, or (in the decoder) words that come *later* in the sentence. A **mask** says which
# query–key pairs are allowed. The convention in this course:
#
# > `True` (or 1) = **may attend**, `False` (or 0) = **hidden**.
#
# A boolean `attn_mask` of PyTorch's `F.scaled_dot_product_attention` means the same (True = takes
# part in attention); PyTorch's `nn.MultiheadAttention` uses the opposite (True = not allowed,
# section 11), so always check which convention a function expects.
#
# The mask has a shape that *broadcasts* against the scores `(batch, heads, q_len, k_len)`; you
# build the two real masks in sections 6 and 7. To hide a key, set its score to a huge negative
# number such as $-10^9$ **before** the softmax. The softmax subtracts the row's largest score before
# it exponentiates, and $e^{-10^9}$ underflows to exactly 0 in floating point, so the hidden key
# gets weight 0 and the softmax spreads the whole weight 1 over the allowed keys.
# `float('-inf')` hides a key just as well (the paper sets the hidden scores to $-\infty$; $-10^9$ is
# this course's choice), but a row whose keys are *all* hidden then becomes $0/0$ = NaN, while $-10^9$
# gives an evenly spread row (question 2 asks when such a row can occur). In `float16`, whose largest
# number is 65,504, $-10^9$ does not fit: `masked_fill` raises an error there, and
# `torch.finfo(scores.dtype).min` is the very negative number that fits any dtype.
#
# The cell shows one score row with the last key hidden: first the weights that hiding must give (the
# softmax of the allowed keys alone, and 0 for the hidden one, worked out here by leaving the hidden key
# out, which does not carry over to a batch of masks), then two common wrong ways (they use
# `torch.where(condition, a, b)`, which takes `a` where the condition is True and `b` elsewhere).

# %%
row = torch.tensor([2.0, 1.0, 0.5, 3.0])  # scores of one query for 4 keys
allowed = torch.tensor([True, True, True, False])  # the last key is hidden

target = torch.zeros(4)
target[allowed] = torch.softmax(row[allowed], dim=-1)  # the target: the hidden key left out altogether
fill_zero = torch.softmax(torch.where(allowed, row, 0.0), dim=-1)  # wrong: e^0 = 1 is not 0
after_softmax = torch.softmax(row, dim=-1) * allowed  # wrong: too late

for name, weights in (("target", target), ("filled with 0", fill_zero), ("after softmax", after_softmax)):
    print(f"{name:14s} weights {[round(w, 3) for w in weights.tolist()]}  sum {weights.sum():.3f}")

# %% [markdown]
# ### What goes wrong, and what it looks like
# The symptoms we see every year (the checks after the exercise report them):
# - the weights of one query do not sum to 1, but each *key's* column does;
# - weights that are too flat or too peaked compared with the reference;
# - rows that sum to less than 1;
# - the hidden keys get all the weight and the allowed keys get 0;
# - a mask given as 0/1 integers hides every key, or raises an error, while a bool mask works;
# - "weights" with negative entries, or rows that do not sum to 1.
#
# <details><summary>The causes behind these symptoms (open this when a check fails and you are stuck)</summary>
#
# - **softmax over the wrong axis.** The weights of one query are normalised over the keys.
# - **the wrong scale.** Inside multi-head attention each head has width $d_k = d_{model}/h$, not
#   $d_{model}$; the given first line reads $d_k$ from the input.
# - **masking after the softmax** (the demo above). The mask must change the *scores*.
# - **an inverted mask.** Remember: `True` means "may attend".
# - **`~mask` on an integer mask.** `~` flips an integer's bits (for a signed integer 1 becomes −2
#   and 0 becomes −1; for `uint8` they become 254 and 255: all non-zero), and `masked_fill` raises an
#   error for a mask that is not bool. Build a condition that is a bool tensor for both kinds of mask.
# - **returning the scores.** The function returns the *weights* (after the softmax), which the
#   model later plots.
#
# </details>

# %% [markdown]
# ## 5. Exercise: `scaled_dot_product_attention`
#
# Complete the function between the markers. It receives `Q` `(..., q_len, d_k)`, `K`
# `(..., k_len, d_k)`, `V` `(..., k_len, d_v)` and an optional `mask` that broadcasts to
# `(..., q_len, k_len)` (or `None`: nothing hidden). It computes
# $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$ with the hidden scores set to $-10^9$ before the
# softmax, and returns two tensors, under these names (the given last line returns them):
#
# - `weights` `(..., q_len, k_len)`: every row sums to 1 and hidden keys get exactly 0;
# - `output` `(..., q_len, d_v)`: row $i$ is the weighted sum of the values with row $i$ of `weights`.
#
# The given first line reads $d_k$. The mask may be bool or 0/1 integers. The checks call the function
# with 4-D inputs `(batch, heads, len, d)` and with 3-D ones `(batch, len, d)`, so count axes from
# the end. Use plain tensor operations: the checks reject PyTorch's built-in attention.
#
# Open a hint only when you are stuck, one at a time.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Four steps, each one tensor operation: all scores at once with one matrix product (scaled), the
# mask applied to the scores, a softmax, and one more matrix product with the values. Only the mask
# step depends on whether a mask was given.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# `Q` `(..., q_len, d_k)` times $K^\top$ `(..., d_k, k_len)` gives the scores `(..., q_len, k_len)`;
# $K^\top$ is `K` with its last two axes swapped. The keys are the last axis of the scores, so the
# softmax runs over `dim=-1`. `weights` `(..., q_len, k_len)` times `V` `(..., k_len, d_v)` gives
# `(..., q_len, d_v)`. To hide the keys, `Tensor.masked_fill(condition, value)` writes `value`
# wherever `condition` is True; with our convention the condition is "the mask is 0".
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
# if mask is not None:
#     scores = scores.masked_fill(mask == 0, -1e9)
# weights = torch.softmax(scores, dim=-1)
# output = weights @ V
# ```
#
# </details>

# %% solution="attention_function"
#| include transformer_course.reference.attention:scaled_dot_product_attention

# %% [markdown]
# ### Check your work
# Each cell checks one property. Read the message of the first failing one: fix that, rerun the
# exercise cell, then rerun the checks.

# %% tests="attn_sdpa_shapes" points=1
assert check.sdpa_shapes(scaled_dot_product_attention)

# %% tests="attn_sdpa_values" points=2
assert check.sdpa_values(scaled_dot_product_attention)

# %% tests="attn_sdpa_masked_values" points=2
assert check.sdpa_masked_values(scaled_dot_product_attention)

# %% tests="attn_sdpa_masked_zero" points=1
assert check.sdpa_masked_keys_get_zero(scaled_dot_product_attention)

# %% tests="attn_sdpa_integer_mask" points=1
assert check.sdpa_integer_mask(scaled_dot_product_attention)

# %% tests="attn_sdpa_matches_pytorch" points=1
assert check.sdpa_matches_pytorch(scaled_dot_product_attention)

# %% tests="attn_sdpa_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.sdpa_shapes(scaled_dot_product_attention, batch=3, heads=0, q_len=7, k_len=2, d_k=3, d_v=1)
assert check.sdpa_values(scaled_dot_product_attention, batch=1, heads=0, q_len=5, k_len=9, d_k=16, d_v=4)
assert check.sdpa_values(scaled_dot_product_attention, batch=2, heads=8, q_len=6, k_len=6, d_k=64, d_v=64)
assert check.sdpa_masked_values(scaled_dot_product_attention, batch=4, heads=0, q_len=3, k_len=8, d_k=6,
                                d_v=2)
assert check.sdpa_masked_values(scaled_dot_product_attention, batch=3, heads=2, q_len=6, k_len=4, d_k=5, d_v=7)
assert check.sdpa_masked_keys_get_zero(scaled_dot_product_attention, batch=5, heads=4, q_len=9, k_len=9,
                                       d_k=8)
assert check.sdpa_matches_pytorch(scaled_dot_product_attention, batch=1, heads=2, q_len=10, k_len=4, d_k=32,
                                  d_v=5)
### END HIDDEN TESTS

# %% [markdown]
# ### The toy sentence through your function
# The same hand-made `Q_toy`, `K_toy`, `V_toy` as in section 1. After scaling ($\sqrt{4} = 2$) the
# matching key scores 4 and the others 0, so each query puts $e^4/(e^4 + 3) \approx 0.95$ of its
# weight on its match. Because the values are one-hot tags, each output row is that same weight row:
# "sat" now carries 95% of the value of "cat".

# %%
output_toy, weights_toy = scaled_dot_product_attention(Q_toy, K_toy, V_toy)
figures.plot_attention_weights(weights_toy, tokens, tokens, title="Weights softmax(Q Kᵀ / √d_k)")
plt.show()
print("output row of 'sat':", [round(x, 3) for x in output_toy[2].tolist()])

# %% [markdown]
# ## 6. The padding mask
#
# Sentences in a batch have different lengths, so the shorter ones are filled up with a special
# `<pad>` token (its id is `pad_idx`; in the vocabularies of stage 5 it is 3). Padding carries no meaning,
# so no query may attend to a padding **key**.
#
# `make_padding_mask(token_ids, pad_idx)` takes the ids `(batch, seq_len)` and returns a bool mask
# of shape `(batch, 1, 1, seq_len)`: `True` at real tokens, `False` at padding. The two axes of
# size 1 are there for broadcasting against the scores `(batch, heads, q_len, k_len)`: the same
# keys are hidden for every head and for every query, so the mask only varies along the batch and
# the key axis. (Padding *queries* are not masked: a `<pad>` position still computes an output row
# from the real tokens. That row does no harm as long as its values are finite: every later attention
# hides that position as a *key* with the same padding mask (weight 0), in the encoder's next layers
# and in the decoder's cross-attention over the source. A NaN there would still spread, since
# $0 \cdot \mathrm{NaN}$ is NaN: question 2 comes back to it. On the target side, the loss of stage 5 also skips
# `<pad>` positions.)
#
# Store the result in `mask`; the given last line returns it. Do not hard-code 0 or 1 as the
# padding id: use the argument.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# "Is this token a real one?" is one element-wise comparison of the ids with `pad_idx`; it already
# gives a bool tensor. The rest is adding the two axes of size 1.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# The comparison gives `(batch, seq_len)`. `unsqueeze(d)` inserts an axis of size 1 at position `d`:
# you need new axes at positions 1 and 2 to reach `(batch, 1, 1, seq_len)`.
#
# </details>
#
# <details><summary>Hint 3: the line</summary>
#
# ```python
# mask = (token_ids != pad_idx).unsqueeze(1).unsqueeze(2)
# ```
#
# </details>

# %% solution="padding_mask"
#| include transformer_course.reference.attention:make_padding_mask

# %% tests="attn_padding_mask_shape" points=1
assert check.padding_mask_shape(make_padding_mask)

# %% tests="attn_padding_mask_values" points=1
assert check.padding_mask_values(make_padding_mask)

# %% [markdown]
# ## 7. The look-ahead mask
#
# The decoder produces the translation one word at a time: to predict word $i + 1$ it may use the
# target words $0, \dots, i$ only. In training we feed the whole target sentence at once (it is much
# faster), so we must stop position $i$ from peeking at positions after $i$. Row $i$ of the mask is
# the query at position $i$; it may attend to columns $0, \dots, i$ — **including itself**, the
# diagonal:
#
# $$\text{mask}_{ij} = \begin{cases} \text{True} & j \le i \\ \text{False} & j > i \end{cases}$$
#
# `make_look_ahead_mask(size, device=None)` returns it as a bool tensor of shape
# `(1, 1, size, size)` (it broadcasts over batch and heads), created directly on `device`.
#
# ### Exercise, a bug hunt: `make_look_ahead_mask`
#
# This one is written for you, by a classmate, and it has **one realistic mistake**: it runs, and
# its shape, dtype and device are right. Do not hunt for it by reading the code first: run the cells
# under it, which train a model with this mask, and reason from what the trained model does. Then
# find the mistake, fix it in place, and run the cells under it and the checks again.

# %% solution="look_ahead_mask"
#| bug: .tril() => .triu()
#| bug: positions 0..i (lower triangle) => positions 0..i
#| include transformer_course.reference.attention:make_look_ahead_mask

# %% [markdown]
# **A model trained with this mask.** The cell below trains a tiny encoder–decoder Transformer from
# the course's package, `Copier` (PyTorch's own `nn.Transformer` with this course's embeddings and
# positional encoding: you build the course's version yourself in stages 3 and 4 and write its
# training loop in stage 5; here both are given), on a toy task: copy a sequence of 8 random
# symbols. Its encoder reads the sequence, its decoder writes it out again, and the decoder's
# self-attention uses the `make_look_ahead_mask` above, which the cell hands to `train_copier`
# (`Copier` turns it into PyTorch's convention, True = hidden, by itself). In training the decoder
# receives the correct output shifted by one position, `<bos> a b c …`, and learns to predict at
# every position the symbol that comes next, `a b c … <eos>`, all positions in one pass (stage 5
# explains why training works this way). It takes a few seconds.

# %%
torch.set_num_threads(1)  # one CPU thread from here on, for the rest of this notebook
steps = 40 if short_run() else 400  # while your notebook is autograded, a few steps (nobody reads them)
copier, losses = train_copier(make_look_ahead_mask, steps=steps)  # batches of 64 sequences, your mask
print(f"training loss: {losses[0]:.3f} at the first step, {losses[-1]:.4f} at the last")

# %% [markdown]
# **The trained model, used two ways**, on 200 new sequences. *Teacher forcing*, as in training: the
# decoder receives the correct output shifted by one and predicts every position in one pass.
# *Greedy decoding*, as when translating: the decoder starts from `<bos>` alone and, step by step,
# appends the symbol it predicts at its last position, so at each step it has the source and its own
# output so far, nothing else (stage 6 has you build this for real sentences). Both use the mask above;
# the course's package runs them (`copy_two_ways`). The cell prints three sequences as letters (`_` for a
# special token) and the share of symbols each way gets right.

# %%
source, _, _ = copy_batch(200, torch.Generator().manual_seed(1))  # (200, 8): 200 new sequences
forced, written = copy_two_ways(copier, source, make_look_ahead_mask)  # (200, 8) each


def letters(ids: torch.Tensor) -> str:
    return "".join("....abcdefghij"[i] if i >= 4 else "_" for i in ids.tolist())


for row in range(3):
    print(f"source {letters(source[row])}   teacher forcing {letters(forced[row])}   "
          f"greedy {letters(written[row])}")
teacher_forced, greedy = (forced == source).double().mean().item(), (written == source).double().mean().item()
print(f"symbols copied correctly: teacher forcing {100 * teacher_forced:.1f} %, greedy decoding {100 * greedy:.1f} %")
figures.plot_copy_symptom(losses, teacher_forced, greedy)
plt.show()

# %% [markdown]
# Read the two numbers together before you open a hint: what can the decoder at position $i$ use
# during training, and what can it use while decoding greedily?
#
# <details><summary>Hint 1: read the symptom</summary>
#
# The training loss went almost to 0 and teacher forcing copies nearly every symbol, yet the same
# model, writing on its own, gets most symbols wrong. The only difference between the two runs is
# what the decoder is given: in training (and with teacher forcing) the whole correct output sits
# in its input at once; while decoding greedily, step $i$ has only the symbols written so far. A model
# that is perfect when the whole answer is in its input and lost when only the past is: what could
# position $i$ have been reading during training?
#
# </details>
#
# <details><summary>Hint 2: where to look</summary>
#
# Print `make_look_ahead_mask(5)[0, 0]` and read it row by row against the formula at the top of this
# section: row $i$ is the query at position $i$, the columns are the positions it may read. Which
# positions may row 0 read, and which the last row? The shape, the dtype and the device are right (as
# the exercise says), so look at the call that decides which entries are `True`.
#
# </details>
#
# <details><summary>Hint 3: the line</summary>
#
# Keep the **lower** triangle, diagonal included: `.tril()` instead of `.triu()`.
#
# </details>

# %% tests="attn_look_ahead_mask_values" points=3
assert check.look_ahead_mask_shape(make_look_ahead_mask, bug_hunt=True)
assert check.look_ahead_mask_values(make_look_ahead_mask, bug_hunt=True)

# %% tests="attn_masks_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.padding_mask_shape(make_padding_mask, batch=1, seq_len=12, pad_idx=0)
assert check.padding_mask_values(make_padding_mask, batch=6, seq_len=5, pad_idx=0)
assert check.padding_mask_values(make_padding_mask, batch=3, seq_len=10, pad_idx=7)
assert check.look_ahead_mask_shape(make_look_ahead_mask, size=1)
assert check.look_ahead_mask_values(make_look_ahead_mask, size=11)
### END HIDDEN TESTS

# %% [markdown]
# ### Pictures of the masks
# A batch of two German sentences, the shorter one padded (`<pad>` has id 3, as in every notebook of the
# course). Blue cells may be attended to, grey cells are hidden (the same colours in every mask figure of
# the course); rows are queries, columns are keys. The padding mask hides the `<pad>` columns for every
# row; the look-ahead mask hides everything right of the diagonal. The decoder uses both at once: a key is
# visible only if *both* masks allow it. (Question 2 asks when a whole row is hidden.)
# The third panel is built entry by entry from
# that rule; stage 4 asks you for the same table as one tensor expression, for a whole batch.

# %%
vocabulary = {"<pad>": 3, "ein": 5, "hund": 6, "läuft": 7, "schnell": 8, "heim": 9}
sentences = [["ein", "hund", "läuft", "<pad>", "<pad>"], ["ein", "hund", "läuft", "schnell", "heim"]]
token_ids = torch.tensor([[vocabulary[word] for word in sentence] for sentence in sentences])  # (2, 5)

padding_mask = make_padding_mask(token_ids, pad_idx=3)  # (2, 1, 1, 5)
look_ahead_mask = make_look_ahead_mask(token_ids.size(1))  # (1, 1, 5, 5)
print("shapes:", tuple(padding_mask.shape), tuple(look_ahead_mask.shape))
both_allow = torch.tensor([[bool(padding_mask[0, 0, 0, key]) and bool(look_ahead_mask[0, 0, query, key])
                            for key in range(5)] for query in range(5)])  # (5, 5): sentence 1, entry by entry
figures.plot_masks({"padding (sentence 1)": padding_mask[0], "look-ahead": look_ahead_mask,
                    "both allow (sentence 1)": both_allow}, sentences[0], sentences[0])
plt.show()

# %% [markdown]
# **The masks at work.** Random queries and keys for the first sentence, attended with the mask where
# both allow: every hidden cell gets weight exactly 0, and each row still sums to 1.

# %%
generator = torch.Generator().manual_seed(2)
Q_demo, K_demo, V_demo = (torch.randn(1, 1, 5, 8, generator=generator) for _ in range(3))  # (1, 1, 5, 8)
_, weights_demo = scaled_dot_product_attention(Q_demo, K_demo, V_demo, both_allow)  # mask (5, 5) broadcasts
figures.plot_attention_weights(weights_demo[0, 0], sentences[0], sentences[0],
                               title="Weights where both masks allow")
plt.show()
print("row sums:", [round(x, 3) for x in weights_demo[0, 0].sum(dim=-1).tolist()])

# %% [markdown]
# ## 8. Multi-head attention
#
# One attention computation gives each query *one* weighted average. But a word relates to its
# sentence in several ways at once: "sat" wants its subject, its modifiers, maybe the tense of a
# nearby auxiliary. A single softmax has to blend all of these into one distribution. **Multi-head
# attention** runs $h$ attentions side by side, each on its own learned projection, so each head can
# specialise in one kind of relation (stage 6 shows what trained heads attend to):
#
# $$\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O,
# \qquad \mathrm{head}_i = \mathrm{Attention}(Q W_i^Q,\; K W_i^K,\; V W_i^V)$$
#
# - $h$ = `num_heads` (8 in the paper); $d_{model}$ = the model width (512);
# - $W_i^Q, W_i^K$ — the projections of head $i$, each $d_{model} \times d_k$, and $W_i^V$,
#   $d_{model} \times d_v$, with $d_k = d_v = d_{model}/h$ (64 in the paper);
# - $\mathrm{Concat}$ — the $h$ head outputs side by side, back to width $h \cdot d_k = d_{model}$;
# - $W^O$ — a $d_{model} \times d_{model}$ projection that **mixes** the heads: without it each
#   slice of the output would only ever contain one head's result.
#
# Because each head is $h$ times narrower, all heads together cost about as much as one full-width
# attention.
#
# **Does it help?** The paper measured it, in its Table 3: the base model changed in one respect per
# row, each variant scored on the English→German development set (newstest2013) by perplexity per
# word piece (lower is better) and BLEU (higher is better). Rows (A) keep the
# computation the same, $h \cdot d_k = 512$, and change the number of heads; rows (B) keep 8 heads and
# $d_v = 64$ and make only the queries and keys narrower:
#
# | row | heads $h$ | $d_k$ | $d_v$ | perplexity | BLEU |
# |---|---|---|---|---|---|
# | (A) | 1 | 512 | 512 | 5.29 | 24.9 |
# | (A) | 4 | 128 | 128 | 5.00 | 25.5 |
# | base | 8 | 64 | 64 | 4.92 | 25.8 |
# | (A) | 16 | 32 | 32 | 4.91 | 25.8 |
# | (A) | 32 | 16 | 16 | 5.01 | 25.4 |
# | (B) | 8 | 32 | 64 | 5.01 | 25.4 |
# | (B) | 8 | 16 | 64 | 5.16 | 25.1 |
#
# One head was 0.9 BLEU worse than the best setting, and quality also dropped with too many heads,
# each of them narrow. Rows (B) separate the width from the number of heads: with 8 heads kept,
# cutting $d_k$ alone to 32 and to 16 cost 0.4 and 0.7 BLEU. The paper: "reducing the attention key
# size $d_k$ hurts model quality. This suggests that determining compatibility is not easy and that a
# more sophisticated compatibility function than dot product may be beneficial." Two cautions when
# you read these numbers: rows (B) also have fewer parameters (60 M and 58 M against the base's 65 M,
# since $W^Q$ and $W^K$ shrink with $d_k$), and differences of a few tenths of BLEU, reported as one
# number per row with no spread over repeated runs, are weak evidence.
#
# **One big projection instead of $h$ small ones.** Putting the $h$ matrices $W_i^Q$ side by side
# gives one $d_{model} \times d_{model}$ matrix: `W_q = nn.Linear(d_model, d_model)` computes all
# heads' queries in one go, and features $i \cdot d_k$ to $(i+1) \cdot d_k - 1$ of its output belong
# to head $i$. The same holds for `W_k`, `W_v`. The constructor (given) creates the four layers
# `W_q`, `W_k`, `W_v`, `W_o` and stores `d_model`, `num_heads` and `d_k`.
#
# **Biases: a convention of this course, not the paper's.** `nn.Linear` adds a learned bias vector to
# its output unless it is built with `bias=False`, and the given constructor keeps that default, as
# PyTorch's own `nn.MultiheadAttention` does (`bias=True`). The paper's formulas have no biases: its
# $W_i^Q, W_i^K, W_i^V, W^O$ are matrices and nothing else. Two of the biases add nothing the model
# could not do without them: the key bias adds the same number to all the scores of one query, which
# the softmax ignores, and since every row of weights sums to 1, the value bias adds the same vector to
# every output, which the bias of `W_o` could hold as well. The query bias $b^Q$ is different: it adds
# $b^Q \cdot k_j$ to the score of key $j$ for every query alike, a preference for some keys whatever
# the query asks, and that does change the weights. Keep the biases: the checks compare your module
# with the reference and with `nn.MultiheadAttention`, both with biases.

# %% [markdown]
# ### Splitting into heads and joining them back
# `split_heads` turns `(batch, seq_len, d_model)` into `(batch, num_heads, seq_len, d_k)`, so that
# `scaled_dot_product_attention` treats `(batch, num_heads)` as leading axes and runs every head at
# once. What must hold: element `[b, i, t, :]` of the result is the block of features
# $i \cdot d_k$ to $(i+1) \cdot d_k - 1$ of token $t$ of sentence $b$. Every head sees *every*
# token, and only its own block of each token's features.
#
# `combine_heads` is the exact inverse: `(batch, num_heads, seq_len, d_k)` back to
# `(batch, seq_len, d_model)`, head $i$'s output for token $t$ in features $i \cdot d_k$ to
# $(i+1) \cdot d_k - 1$ of token $t$, so that `combine_heads(split_heads(x))` gives `x` back.
#
# What you need to know about PyTorch's tensors: a tensor is read in row order (the last axis
# fastest), and a newly made tensor lies in memory in that order. `view` and `reshape` read the numbers
# in that order and cut the sequence into another shape, so which number follows which never changes;
# `transpose` and `permute` change which axis is read first, without copying anything. Work out on
# paper, with the small example below, which of these gives each head the right numbers. The
# diagram shows what must come out of each function (colour = head), not which tensor operations get
# it there, and where the two sit in multi-head attention, in the order of the paper's Figure 2.

# %%
diagrams.show("head_splitting")

# %% [markdown]
# **Why a single `view` is not enough.** Below, 3 tokens with $d_{model} = 4$ and 2 heads, so
# $d_k = 2$. Token $t$ holds the features $4t, \dots, 4t+3$. Head 0 should see the first two features
# of *every* token. A bare `view` to `(batch, heads, seq_len, d_k)` has the right shape but
# fills head 0 with the first six numbers in memory: pieces of token 0 and token 1 posing as three
# different tokens.

# %%
x = torch.arange(12.0).view(1, 3, 4)  # (batch 1, seq_len 3, d_model 4)
print("the tokens:\n", x[0])
print("what head 0 must contain (features 0 and 1 of every token):\n", x[0, :, 0:2])
print("head 0 after a bare x.view(1, 2, 3, 2):\n", x.view(1, 2, 3, 2)[0, 0])

# %% [markdown]
# ### Putting it together: `forward(q, k, v, mask)`
# `forward` computes the formula above: $\mathrm{Concat}(\mathrm{head}_1, \dots,
# \mathrm{head}_h)\,W^O$ with $\mathrm{head}_i = \mathrm{Attention}(qW_i^Q, kW_i^K, vW_i^V)$, every
# head at once, using **your** `scaled_dot_product_attention`, `split_heads` and `combine_heads`.
# `q` is `(batch, q_len, d_model)`, `k` and `v` are `(batch, k_len, d_model)`, and `mask` is one of
# the masks you built (it broadcasts over the heads axis) or `None`.
#
# The given lines after the markers store `weights` `(batch, num_heads, q_len, k_len)` in
# `self.attn_weights` (for plotting) and return `output` `(batch, q_len, d_model)`, so your code must
# leave its results in variables with those two names.
#
# ### What goes wrong, and what it looks like
# - the right shape, but tokens scrambled: the output at one position depends on other positions'
#   inputs in ways the reference's does not;
# - the right shape, but outputs that differ from the reference's everywhere;
# - attention weights flatter than the reference's;
# - an error from `view` saying the tensor is not contiguous, or that the view size is not compatible
#   with its size and stride;
# - a size mismatch, or wrong values, only when the queries' length differs from the keys' (as in
#   cross-attention).
#
# <details><summary>The causes behind these symptoms (open this when a check fails and you are stuck)</summary>
#
# - **a single `view`** in `split_heads` (shown above), or in `combine_heads`.
# - **skipping `W_o`**: returning the concatenated heads.
# - **scaling by $\sqrt{d_{model}}$**: happens when attention runs on the full width before
#   splitting; each head is $d_k$ wide.
# - **a tensor that `view` refuses**: its numbers are no longer in row order in memory, which `view`
#   needs (`reshape` copies when it must).
# - **mixing up the inputs**: queries come from `q`, keys from `k`, values from `v`. In
#   cross-attention `q` has a different length from `k` and `v`, so never take the sequence length
#   of one for the others.
#
# </details>

# %% [markdown]
# ## 9. Exercise: `MultiHeadAttention`
# Complete `split_heads`, `combine_heads` and `forward`. Keep the constructor as it is: the checks
# copy weights into your module by the names `W_q`, `W_k`, `W_v`, `W_o`, and compare it with the
# reference and with PyTorch's `nn.MultiheadAttention` holding the same weights.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# `split_heads` is two steps: first cut each token's features into `num_heads` blocks of `d_k`
# (a new axis next to the features), then move the heads axis in front of the sequence axis.
# `combine_heads` undoes the two steps in reverse order. `forward` is five steps: project, split,
# attend, combine, mix with `W_o`.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# `split_heads`: `(batch, seq_len, d_model)` → `view` → `(batch, seq_len, num_heads, d_k)` →
# `transpose(1, 2)` → `(batch, num_heads, seq_len, d_k)`. `combine_heads`: the reverse, with
# `.contiguous()` (or `reshape`, which copies when it must) before the `view` back to
# `(batch, seq_len, d_model)`. Read the batch size and the sequence length from `x.shape`: `q` and
# `k` may have different lengths. In `forward`, `Q` comes from `q` through `W_q`, `K` from `k`
# through `W_k`, `V` from `v` through `W_v`.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# # split_heads
# batch_size, seq_length, _ = x.shape
# return x.view(batch_size, seq_length, self.num_heads, self.d_k).transpose(1, 2)
# # combine_heads
# batch_size, _, seq_length, _ = x.shape
# return x.transpose(1, 2).contiguous().view(batch_size, seq_length, self.d_model)
# # forward
# Q, K, V = self.split_heads(self.W_q(q)), self.split_heads(self.W_k(k)), self.split_heads(self.W_v(v))
# heads, weights = scaled_dot_product_attention(Q, K, V, mask)
# output = self.W_o(self.combine_heads(heads))
# ```
#
# </details>

# %% solution="multi_head_attention"
# Names the checks rely on: `split_heads`, `combine_heads` and `forward(q, k, v, mask)`, whatever your layers
# are called. The checks that compare forward's values copy the reference weights into your module by the
# parameter names W_q, W_k, W_v, W_o (weight and bias each), so keep the given constructor; the attention-map
# check reads `self.attn_weights`, set by the given line at the end of forward.
#| include transformer_course.reference.attention:MultiHeadAttention

# %% tests="attn_split_heads_shape" points=1
assert check.split_heads_shape(MultiHeadAttention)

# %% tests="attn_split_heads_values" points=2
assert check.split_heads_values(MultiHeadAttention)

# %% tests="attn_combine_heads_values" points=2
assert check.combine_heads_values(MultiHeadAttention)

# %% tests="attn_combine_inverts_split" points=1
assert check.combine_heads_inverts_split(MultiHeadAttention)

# %% tests="attn_heads_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.split_heads_values(MultiHeadAttention, d_model=32, num_heads=8, batch=3, seq_len=7)
assert check.split_heads_values(MultiHeadAttention, d_model=6, num_heads=1, batch=1, seq_len=4)
assert check.combine_heads_values(MultiHeadAttention, d_model=30, num_heads=5, batch=2, seq_len=9)
assert check.combine_heads_inverts_split(MultiHeadAttention, d_model=16, num_heads=2, batch=4, seq_len=1)
assert check.combine_heads_inverts_split(MultiHeadAttention, d_model=18, num_heads=3, batch=2, seq_len=6)
### END HIDDEN TESTS

# %% [markdown]
# **What the checks of `forward` test.** Each one first runs your `forward` as it is, with your own
# `split_heads`, `combine_heads` and `scaled_dot_product_attention`. If that run is wrong, it runs your
# `forward` again with the course's three parts in their place, and grades that second run. So a mistake
# in one of the parts costs only that part's checks, above: a ✔ below says that your `forward` puts the
# parts together correctly, **not** that your `split_heads` or `combine_heads` are right. A mistake in
# `forward` itself can fail several checks below, one for each property it breaks. Section 11 runs your
# whole module, your own parts included, beside PyTorch's.

# %% tests="attn_mha_output_shape" points=1
assert check.mha_output_shape(MultiHeadAttention)

# %% tests="attn_mha_values" points=2
assert check.mha_values(MultiHeadAttention)

# %% tests="attn_mha_attention_weights" points=1
assert check.mha_attention_weights(MultiHeadAttention)

# %% tests="attn_mha_cross_attention" points=2
assert check.mha_cross_attention(MultiHeadAttention)

# %% tests="attn_mha_matches_pytorch" points=2
assert check.mha_matches_pytorch(MultiHeadAttention)

# %% tests="attn_mha_matches_pytorch_causal" points=1
assert check.mha_matches_pytorch_causal(MultiHeadAttention)

# %% tests="attn_mha_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.mha_values(MultiHeadAttention, d_model=32, num_heads=8, batch=2, seq_len=9)
assert check.mha_values(MultiHeadAttention, d_model=10, num_heads=1, batch=3, seq_len=4)
assert check.mha_cross_attention(MultiHeadAttention, d_model=24, num_heads=6, batch=3, q_len=8, k_len=2)
assert check.mha_matches_pytorch(MultiHeadAttention, d_model=64, num_heads=8, batch=2, q_len=11, k_len=11)
assert check.mha_matches_pytorch_causal(MultiHeadAttention, d_model=12, num_heads=3, batch=3, seq_len=9)
### END HIDDEN TESTS

# %% tests="attn_mha_weights_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.mha_attention_weights(MultiHeadAttention, d_model=16, num_heads=8, batch=2, q_len=7, k_len=3)
### END HIDDEN TESTS

# %% [markdown]
# ### Predict, then run
# Work these out on paper before you run anything: each takes a few lines of reasoning from this
# notebook. Write your prediction after `return`: a number, or the
# arithmetic you worked out (such as `3 * 4`; `math` is allowed). A prediction is a value you work
# out, so the function may not call your code, torch or anything else of the notebook: the check
# refuses that. The check only looks at the form of your prediction and notes it: **it is scored when
# your notebook is graded**, and nothing in this notebook says whether it is right, so trying again
# tells you nothing. The cell after the checks shows the truth for *other* sizes and another
# sentence: use it to test your method. The answer you are graded on is never printed.
#
# **Prediction 1 (1 point).** Section 3 took query and key entries of variance 1. Now the query
# entries have variance 9 (standard deviation 3) and the key entries variance 4 (standard deviation
# 2), all independent with mean 0, and $d_k = 64$. What is the standard deviation of the *scaled* score
# $q \cdot k / \sqrt{d_k}$? (Within 3%.)

# %% solution="attn_predict_score_std"
def predict_scaled_score_std() -> float:
    """Your prediction of the standard deviation of q·k / sqrt(d_k): d_k = 64, Var(q_m) = 9, Var(k_m) = 4."""
    ### BEGIN SOLUTION
    return math.sqrt(64 * 9 * 4) / math.sqrt(64)  # Var(q·k) = d_k · Var(q_m) · Var(k_m)
    ### END SOLUTION


# %% tests="attn_predicted_score_std" points=1
assert check.predicted_scaled_score_std(predict_scaled_score_std)

# %% [markdown]
# **Prediction 2 (1 point).** How many trainable parameters does `MultiHeadAttention(1024, 16)` have
# (the sizes of the paper's big model)? The given constructor builds its projections with
# `nn.Linear`, which has a bias by default; the paper's formulas ($Q W_i^Q$, ...) have no biases.
# Count either way: both counts are accepted.

# %% solution="attn_predict_parameters"
def predict_attention_parameters() -> int:
    """Your prediction of the number of trainable parameters of MultiHeadAttention(1024, 16)."""
    ### BEGIN SOLUTION
    return 4 * (1024 * 1024 + 1024)  # four d_model x d_model layers with biases; heads add nothing
    ### END SOLUTION


# %% tests="attn_predicted_parameters" points=1
assert check.predicted_attention_parameters(predict_attention_parameters)

# %% [markdown]
# **Prediction 3 (1 point).** Take the sentence `ein hund läuft <pad> <pad> <pad>` (three words
# and three `<pad>`, `<pad>` = 3). Its decoder mask allows query $i$ to see key $j$ only where both its
# padding mask and the look-ahead mask of size 6 allow it. How many of the 36 entries of that
# 6 × 6 table are `True`?

# %% solution="attn_predict_visible_pairs"
def predict_visible_pairs() -> int:
    """Your prediction of the number of True entries where both masks allow, for 3 words + 3 <pad>."""
    ### BEGIN SOLUTION
    return 1 + 2 + 3 + 3 * 3  # rows 3 to 5 (the <pad> queries) still see the three words
    ### END SOLUTION


# %% tests="attn_predicted_visible_pairs" points=1
assert check.predicted_visible_pairs(predict_visible_pairs)

# %% [markdown]
# **The truth, for other sizes.** The cell below measures the same three things on another
# configuration: the scaled score's standard deviation with random numbers for query entries of
# variance 9, key entries of variance 1/4 and $d_k = 16$; the parameters of your
# `MultiHeadAttention(96, 4)` (and of `nn.MultiheadAttention(96, 4)` as a second count) with and
# without the biases; and the entries both masks allow for a sentence of four words and two `<pad>`.
# The counts and the masks come from *your* code: trust them only once its checks above are green.
# Check that your method gives these numbers too; where it does not, find the step of your reasoning
# that went wrong.

# %%
generator = torch.Generator().manual_seed(5)
q = 3 * torch.randn(100_000, 16, generator=generator)  # query entries: variance 9
k = 0.5 * torch.randn(100_000, 16, generator=generator)  # key entries: variance 1/4
print(f"std of q·k / √16 over 100,000 pairs: {((q * k).sum(dim=-1) / math.sqrt(16)).std():.3f}")
other = MultiHeadAttention(96, 4)
biases = sum(p.numel() for name, p in other.named_parameters() if name.endswith("bias"))
print("parameters of your MultiHeadAttention(96, 4):", sum(p.numel() for p in other.parameters()),
      "  without the biases:", sum(p.numel() for p in other.parameters()) - biases,
      "  of nn.MultiheadAttention(96, 4):", sum(p.numel() for p in nn.MultiheadAttention(96, 4).parameters()))
six_tokens = torch.tensor([[5, 6, 7, 8, 3, 3]])  # ein hund läuft schnell <pad> <pad>: (1, 6)
six_padding, six_look_ahead = make_padding_mask(six_tokens, pad_idx=3), make_look_ahead_mask(6)
allowed_per_row = [sum(bool(six_padding[0, 0, 0, key]) and bool(six_look_ahead[0, 0, query, key])
                       for key in range(6)) for query in range(6)]  # keys both masks allow, per query
print("entries where both masks allow, row by row:", allowed_per_row, " in all:", sum(allowed_per_row))

# %% [markdown]
# ## 10. Looking at the heads
# Your module, untrained, on the second German sentence with the look-ahead mask. The weights are
# random, so the patterns mean nothing yet, but every head has its own pattern, and the masked
# upper triangle is 0 in all of them. Stage 6 draws the attention of a trained model, where the
# heads do follow patterns of their own.

# %%
torch.manual_seed(3)
demo_attention = MultiHeadAttention(d_model=32, num_heads=4).eval()
embedded = torch.randn(1, 5, 32)  # (batch 1, seq_len 5, d_model): stand-in token vectors
with torch.no_grad():
    result = demo_attention(embedded, embedded, embedded, make_look_ahead_mask(5))
print("output:", tuple(result.shape), " attn_weights:", tuple(demo_attention.attn_weights.shape))
figures.plot_attention_heads(demo_attention.attn_weights, sentences[1], sentences[1])
plt.show()

# %% [markdown]
# ## 11. The same computation in PyTorch
# PyTorch ships `nn.MultiheadAttention`. It stores the three input projections stacked in one
# matrix `in_proj_weight` = $[W_q; W_k; W_v]$ of shape `(3·d_model, d_model)` and the output
# projection as `out_proj`. Its boolean masks use the **opposite** convention: in `attn_mask` and
# in `key_padding_mask`, `True` means "not allowed to attend" (a float mask is added to the scores
# instead). So ours are inverted with `~`, and the padding mask is squeezed to `(batch, seq_len)`,
# the shape `key_padding_mask` expects. With the same weights both modules agree to rounding error
# (in float32, a difference of the order of $10^{-7}$ or less) when your module is right. (It is
# only a yardstick here: the checks reject it inside your code.)
#
# This cell runs your **whole** module: your `forward` with your own `split_heads`, `combine_heads` and
# `scaled_dot_product_attention`. The checks of `forward` in section 9 do not always do that: when your
# own parts give a wrong result, they grade `forward` with the course's parts plugged in instead. So if
# every check of `forward` shows ✔ and this cell still prints a large difference, the mistake is in one
# of the three parts; their own checks, above those of `forward`, say which.

# %%
torch.manual_seed(4)
ours = MultiHeadAttention(d_model=16, num_heads=4).eval()
builtin = nn.MultiheadAttention(16, 4, batch_first=True).eval()
with torch.no_grad():
    builtin.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
    builtin.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
    builtin.out_proj.weight.copy_(ours.W_o.weight)
    builtin.out_proj.bias.copy_(ours.W_o.bias)
    x = torch.randn(2, 5, 16)  # the two sentences, random stand-in vectors
    mask = make_padding_mask(token_ids, pad_idx=3)  # (2, 1, 1, 5), True = may attend
    mine = ours(x, x, x, mask)
    theirs, _ = builtin(x, x, x, key_padding_mask=~mask[:, 0, 0, :])  # (2, 5), True = ignore
print("largest difference:", (mine - theirs).abs().max().item())

# %% [markdown]
# ## 12. What self-attention costs, and what it buys
# The paper compares one self-attention layer with one recurrent layer (an RNN, as in stage 0) on a
# sequence of $n$ positions of width $d$ (its Table 1):
#
# | layer | operations per layer | sequential operations | longest path between two positions |
# |---|---|---|---|
# | self-attention | $O(n^2 \cdot d)$ | $O(1)$ | $O(1)$ |
# | recurrent | $O(n \cdot d^2)$ | $O(n)$ | $O(n)$ |
#
# - **Operations.** Self-attention computes $n^2$ dot products of width $d$; a recurrent layer
#   multiplies a $d$-vector by a $d \times d$ matrix at each of its $n$ steps. The attention itself is
#   the cheaper one while $n < d$, which holds for sentences (the paper's $d = 512$). The table counts
#   only that: the four $d \times d$ projections of the module you built add about $4 n d^2$, the same
#   order as the recurrent layer's $n d^2$.
# - **Sequential operations.** All positions of a self-attention layer are computed at once; an RNN
#   must finish step $t - 1$ before step $t$, so it cannot use the parallel hardware as well.
# - **Path length.** In self-attention every position reads every other one directly; in an RNN
#   information from word 1 reaches word $n$ only through $n - 1$ steps, which makes long-range
#   dependencies harder to learn.
#
# The cell prints the two leading terms, $n^2 d$ and $n d^2$, for $d = 512$ (constant factors left
# out, so only the ratio means something).

# %%
d = 512
for n in (10, 50, 512, 2000):
    attention_ops, recurrent_ops = n * n * d, n * d * d
    print(f"n = {n:4d}:  self-attention n²·d = {attention_ops:>13,}   recurrent n·d² = {recurrent_ops:>13,}"
          f"   ratio {attention_ops / recurrent_ops:.2f}")

# %% [markdown]
# The price of self-attention is the $n^2$: for long documents it is the more expensive layer, and the
# scores alone take $n^2$ numbers per head. For the sentences of this course ($n$ of a few tens) the
# attention itself is the cheaper part, and the projections cost the same order as a recurrent layer; what
# self-attention buys is the other two columns: every position at once, and short paths.
#
# ## Summary
# - Attention is a soft lookup: each query's output is an average of the values, weighted by how well
#   the query matches each key, with one weight per key and the weights of a query summing to 1.
# - Dot products of width $d_k$ have variance $d_k$; dividing by $\sqrt{d_k}$ keeps the softmax out of
#   saturation so gradients flow.
# - A mask says which keys each query may read. A hidden key must get a weight of exactly 0, and the
#   weights a query keeps must still sum to 1.
# - The padding mask hides `<pad>` keys from every query; the look-ahead mask lets each position read
#   itself and the positions before it, never one after; the decoder's self-attention needs both at once.
# - Multi-head attention projects with `W_q`, `W_k`, `W_v` (with biases, a convention the paper does not
#   have), gives each head its own block of `d_k` features of every token, attends per head, joins the
#   heads back and
#   mixes them with `W_o`. In the paper one head was 0.9 BLEU worse than the best number of heads, and
#   narrower queries and keys with 8 heads kept ($d_k$ = 32, 16) were worse too (Table 3, rows (A), (B)).
# - A self-attention layer costs $O(n^2 \cdot d)$ operations against a recurrent layer's
#   $O(n \cdot d^2)$, but needs no sequential steps and links every pair of positions directly.
#
# Next, stage 3 wraps `MultiHeadAttention` with a feed-forward network, residual connections and
# LayerNorm into encoder and decoder blocks. The last cell lists every check of this notebook with
# `✔` or `✘` and its points. When you are done: *File → Download → Download .ipynb*, and hand in that file.

# %% [markdown]
# ## Questions: explain your reasoning
# The check cells grade your code; these questions grade your understanding, and your instructor
# reads them. Answer each one in the empty cell right below it (double-click the cell to write;
# formulas as `$...$` work), in a few sentences of your own. A good answer says *why*, with what
# you saw in this notebook; there is nothing to look up. The points are given in each question.

# %% [markdown]
# **Question 1 (3 points).** A classmate's `MultiHeadAttention` for $d_{model} = 512$ with $h = 8$
# heads divides every head's scores by $\sqrt{d_{model}}$ instead of $\sqrt{d_k}$. (a) With query and
# key entries of mean 0 and variance 1, what is the variance of their scaled scores at
# initialisation, and what does that do to the attention weights? (b) For which number of heads
# would the mistake make no difference at all, and why? (c) Would the classmate's model be unable to
# learn, or only start worse? Explain.

# %% [markdown] answer="attn_q_scale" points=3
# **Model answer.** (a) Each head has width $d_k = 512/8 = 64$, so $\mathrm{Var}(q \cdot k) = 64$.
# Dividing by $\sqrt{512}$ divides the variance by 512: it becomes $64/512 = 1/8$ (standard deviation
# about 0.35) instead of 1. Scores that close together give a softmax close to uniform: every query
# spreads its weight almost evenly over the keys, so at first attention hardly prefers any key (and
# the softmax's derivatives are those of a flat softmax, not of a peaked one). (b) With $h = 1$,
# $d_k = d_{model}$, so both divisors are the same and the outputs are identical; the error grows
# with the number of heads (the variance is $1/h$). (c) It can still learn: the wrong factor is a
# constant $1/\sqrt{h}$ on every score, and the learned projections can make up for it: a score is a
# product of a query and a key, so scaling the query projection (weights and bias) by $a$ and the key
# projection by $b$ scales every score by $ab$, and any $a$, $b$ with $ab = \sqrt{h}$ ($\sqrt{8} \approx
# 2.8$) gives exactly the scores of a correctly scaled model, for example $W^Q$ alone $\sqrt{8}$ times
# larger, or both about $8^{1/4} \approx 1.7$ times larger. So the classmate's model can compute the
# same functions: training starts flatter and may need longer, but nothing is lost for good. (The
# opposite mistake, no scaling at all, saturates the softmax instead.)
#
# **Rubric.**
# - 1 point: variance $d_k / d_{model} = 1/h = 1/8$ (standard deviation ≈ 0.35); scores too small,
#   weights nearly uniform at initialisation.
# - 1 point: no difference for $h = 1$ (then $d_k = d_{model}$); also accept an answer that says the
#   error grows with $h$ and is none at $h = 1$.
# - 1 point: it only starts worse: a constant factor on the scores that the learned projections can
#   absorb (their scales multiplying to $\sqrt{h}$, or simply "the query or key projection grows by
#   $\sqrt{h}$"; an answer that only says the weights are too flat at first, without saying why the
#   model can still learn, gets no point).

# %% [markdown]
# **Question 2 (2 points).** Section 4 says that with `float("-inf")` a row whose keys are *all*
# hidden becomes NaN. The padding mask hides keys, not queries. In the decoder, where a key is visible
# only if both the padding and the look-ahead mask allow it: can a row be fully hidden when sentences
# are padded at the *end* (as in this notebook)? What if a batch were padded at the *start* instead
# (`<pad> <pad> <bos> ...`)?
# For the case where it happens, say what `-inf` and `-1e9` each give, and why a NaN in a `<pad>`
# position that nothing reads can still ruin training.

# %% [markdown] answer="attn_q_mask" points=2
# **Model answer.** Padded at the end: row $i$ may see keys $0, \dots, i$, and key 0 is `<bos>`, a
# real token, so every row keeps at least one visible key; a row is fully hidden only if the whole
# sentence is padding (an empty slot in the batch). Padded at the start: the first rows are `<pad>`
# queries whose keys $0, \dots, i$ are all `<pad>`, so those rows are fully hidden. With `-inf` every
# score of such a row is $-\infty$ and the softmax computes $0/0$ = NaN; with `-1e9` all its scores
# are equal and the weights are uniform ($1/k\_len$ each), finite and harmless. The NaN does not stay
# in its row: in the next layer that position is a hidden key with weight 0, but
# $0 \cdot \mathrm{NaN} = \mathrm{NaN}$ in the product with the values, so every output becomes NaN,
# then the loss and all gradients.
#
# **Rubric.**
# - 1 point: end padding never hides a whole row (key 0 stays visible) unless the sentence is all
#   padding; start padding plus the look-ahead mask hides the first rows completely.
# - 1 point: `-inf` gives NaN ($0/0$), `-1e9` gives uniform finite weights; the NaN spreads (for
#   example $0 \cdot \mathrm{NaN}$ in the next weighted sum, or through the loss's gradient).

# %% [markdown]
# **Question 3 (2 points).** A classmate's `combine_heads` is one line:
# `x.reshape(batch, seq_len, d_model)`, applied to its input `(batch, num_heads, seq_len, d_k)`. The
# output has the right shape. (a) What does output position $t$ then contain, for $h = 2$ heads and a
# sequence of 3 tokens? (b) For which sizes would the result be exactly right, so that no check run at
# those sizes could catch the mistake, and why?

# %% [markdown] answer="attn_q_heads" points=2
# **Model answer.** (a) `reshape` re-reads the memory in row order, and that memory holds all of
# head 0 (its 3 positions, one after another), then all of head 1. The 6 blocks of $d_k$ numbers are
# cut into 3 rows of $2 d_k$: output position 0 holds head 0's results for tokens 0 and 1, position 1
# holds head 0's token 2 and head 1's token 0, position 2 holds head 1's tokens 1 and 2. The shape is
# right, but positions are mixed across tokens, so the values are wrong and `combine_heads` no longer
# inverts `split_heads`. (b) When `num_heads = 1` or `seq_len = 1`: the transpose then swaps an axis
# of size 1, which does not change the order of the numbers in memory, so skipping it changes
# nothing. Checks with those sizes alone cannot see the bug; that is why the checks use several heads
# and tokens.
#
# **Rubric.**
# - 1 point: the reshape reads head by head, so an output position mixes pieces of different tokens
#   (the exact layout above, or "tokens scrambled, same shape").
# - 1 point: invisible when `num_heads == 1` or `seq_len == 1` (transposing a size-1 axis changes
#   no order); either size earns the point with the reason.

# %%
check.summary()
