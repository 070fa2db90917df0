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
# **Working time:** about 1¾ hours: 35 minutes of reading, four exercises (about an hour), three
# written questions (about 15 minutes), and cells that run in seconds. (Estimated by
# `scripts/working_time.py` in the course repository: reading at 150 words and 10 lines of given
# code a minute, 5 minutes per exercise plus 2 per line you write, 5 per written question, and the
# measured run time of the cells.)
#
# ## Learning outcomes
# After this notebook you can
# 1. explain attention as a soft dictionary lookup with queries, keys and values;
# 2. write down $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$, name every symbol and its shape, and show
#    with numbers why the scores are divided by $\sqrt{d_k}$;
# 3. implement `scaled_dot_product_attention` for any number of leading axes, with an optional mask;
# 4. build the padding mask and the look-ahead mask, and say which keys each one hides and why;
# 5. implement `MultiHeadAttention`: projections, `split_heads`, attention per head, `combine_heads`, `W_o`;
# 6. recognise the classic attention bugs from their symptoms.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package),
# then the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is
# given and correct. After each exercise a few *check cells* test one property each: `✔` means it
# holds, a red `✘` block says what was expected, what came out and the likely cause. A failing check
# does not stop the notebook: *Run all* always reaches the end, where the last cell lists every
# check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work (the
# grader also runs a few hidden ones with other sizes). Work top to bottom: later exercises call
# your earlier functions.
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
# linear maps of the token's embedding; here we choose them by hand.
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
# from the target sentence and the keys and values from the encoded source, so $q\_len \neq k\_len$.
#
# **Batches and heads.** In the model these matrices carry leading axes:
# `Q` is `(batch, heads, q_len, d_k)`. Matrix multiplication `@` treats every leading axis as a
# batch axis, so the same three lines work for 2-D, 3-D or 4-D inputs, as long as you transpose the
# **last two** axes of `K`: `K.transpose(-2, -1)`.

# %% [markdown]
# ## 3. Why divide by $\sqrt{d_k}$?
#
# Take a query and a key whose $d_k$ entries are independent, with mean 0 and variance 1 (roughly
# what well-initialised layers produce). Their dot product $q \cdot k = \sum_{m=1}^{d_k} q_m k_m$ is
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
# gradient flows back to the queries and keys, and learning stalls. Below, one query meets 8 keys
# with $d_k = 512$: compare the weights and the largest entry of the softmax's Jacobian.

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
# query–key pairs are allowed. The convention in this course, as in PyTorch's
# `F.scaled_dot_product_attention`:
#
# > `True` (or 1) = **may attend**, `False` (or 0) = **hidden**.
#
# The mask has a shape that *broadcasts* against the scores `(batch, heads, q_len, k_len)`; you
# build the two real masks in sections 6 and 7. To hide a key, set its score to a huge negative
# number **before** the softmax: $e^{-10^9}$ is exactly 0 in floating point, so the hidden key gets
# weight 0 and the softmax spreads the whole weight 1 over the allowed keys.
# `scores.masked_fill(mask == 0, -1e9)` does that in one call. `float('-inf')` works too, but a
# row whose keys are *all* hidden then becomes $0/0$ = NaN, while $-10^9$ gives an evenly spread row.
#
# The cell shows one score row with the last key hidden, done right and done in two common wrong ways.

# %%
row = torch.tensor([2.0, 1.0, 0.5, 3.0])  # scores of one query for 4 keys
allowed = torch.tensor([True, True, True, False])  # the last key is hidden

right = torch.softmax(row.masked_fill(allowed == 0, -1e9), dim=-1)
fill_zero = torch.softmax(row.masked_fill(allowed == 0, 0.0), dim=-1)  # wrong: e^0 = 1 is not 0
after_softmax = torch.softmax(row, dim=-1).masked_fill(allowed == 0, 0.0)  # wrong: too late

for name, weights in (("right", right), ("filled with 0", fill_zero), ("after softmax", after_softmax)):
    print(f"{name:14s} weights {[round(w, 3) for w in weights.tolist()]}  sum {weights.sum():.3f}")

# %% [markdown]
# ### Pitfalls we see every year
# - **softmax over the wrong axis.** The weights of one *query* must sum to 1, so normalise over the
#   keys: `dim=-1`. With `dim=-2` each *key's* column sums to 1 instead, which has no meaning here.
# - **the wrong scale.** Divide by $\sqrt{d_k}$, not by $d_k$ and not by $\sqrt{d_{model}}$: inside
#   multi-head attention each head has width $d_k = d_{model}/h$. Read $d_k$ from `Q.size(-1)`.
# - **masking after the softmax.** Zeroing weights after normalising leaves rows that sum to less
#   than 1. The mask must change the *scores*.
# - **an inverted mask.** `True` means "may attend": hide where `mask == 0`. Writing
#   `masked_fill(mask, -1e9)` hides exactly the tokens you wanted to keep.
# - **`~mask` on an integer mask.** Masks may arrive as 0/1 integers; `~` flips their bits
#   (1 becomes -2), and `masked_fill` refuses a non-bool mask. `mask == 0` works for both.
# - **returning the scores.** The function returns the *weights* (after the softmax), which the
#   model later plots.

# %% [markdown]
# ## 5. Exercise: `scaled_dot_product_attention`
#
# Complete the function between the markers. It receives `Q` `(..., q_len, d_k)`, `K`
# `(..., k_len, d_k)`, `V` `(..., k_len, d_v)` and an optional `mask` that broadcasts to
# `(..., q_len, k_len)`. Compute the scaled scores, fill the hidden ones with `-1e9` when a mask is
# given, take the softmax over the keys into `weights`, and set `output = weights @ V`. The given
# first line reads $d_k$; the given last line returns both tensors. The checks call it with 4-D
# inputs `(batch, heads, len, d)` and with 3-D ones `(batch, len, d)`, so count axes from the end.
# Use plain tensor operations: the checks reject PyTorch's built-in attention.

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
with skip_until_implemented("scaled_dot_product_attention"):
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
# the key axis. (Padding *queries* are not masked: their rows still attend to real tokens; their
# outputs are simply ignored by the loss in stage 5.)
#
# Store the result in `mask`; the given last line returns it.
#
# Hint: a comparison such as `token_ids != pad_idx` already gives a bool tensor; `unsqueeze` adds
# the axes. Do not hard-code 0 or 1 as the padding id: use the argument.

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
# diagonal. That is a lower-triangular matrix of `True`:
#
# $$\text{mask}_{ij} = \begin{cases} \text{True} & j \le i \\ \text{False} & j > i \end{cases}$$
#
# `make_look_ahead_mask(size, device=None)` returns it as a bool tensor of shape
# `(1, 1, size, size)` (it broadcasts over batch and heads), created directly on `device`; store it
# in `mask`, the given last line returns it.
# `torch.tril` keeps the lower triangle; mind its `diagonal` argument: `tril(-1)` would hide the
# diagonal and stop every word from seeing itself.

# %% solution="look_ahead_mask"
#| include transformer_course.reference.attention:make_look_ahead_mask

# %% tests="attn_look_ahead_mask_shape" points=1
assert check.look_ahead_mask_shape(make_look_ahead_mask)

# %% tests="attn_look_ahead_mask_values" points=2
assert check.look_ahead_mask_values(make_look_ahead_mask)

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
# A batch of two German sentences, the shorter one padded (`<pad>` has id 3, as in every notebook of
# the course). Blue cells may be attended to, grey cells are hidden (the same colours in every mask
# figure of the course); rows are queries, columns are keys. The padding mask hides the `<pad>` columns
# for every row; the look-ahead mask hides everything right of the diagonal; the decoder combines
# both with `&` (stage 4): a key is visible only if *both* masks allow it.

# %%
vocabulary = {"<pad>": 3, "ein": 5, "hund": 6, "läuft": 7, "schnell": 8, "heim": 9}
sentences = [["ein", "hund", "läuft", "<pad>", "<pad>"], ["ein", "hund", "läuft", "schnell", "heim"]]
token_ids = torch.tensor([[vocabulary[word] for word in sentence] for sentence in sentences])  # (2, 5)

with skip_until_implemented("make_padding_mask and make_look_ahead_mask"):
    padding_mask = make_padding_mask(token_ids, pad_idx=3)  # (2, 1, 1, 5)
    look_ahead_mask = make_look_ahead_mask(token_ids.size(1))  # (1, 1, 5, 5)
    combined_mask = padding_mask & look_ahead_mask  # broadcasts to (2, 1, 5, 5)
    print("shapes:", tuple(padding_mask.shape), tuple(look_ahead_mask.shape), tuple(combined_mask.shape))
    figures.plot_masks({"padding (sentence 1)": padding_mask[0], "look-ahead": look_ahead_mask,
                        "padding & look-ahead": combined_mask[0]}, sentences[0], sentences[0])
    plt.show()

# %% [markdown]
# **The masks at work.** Random queries and keys for the first sentence, attended with the combined
# mask: every hidden cell gets weight exactly 0, and each row still sums to 1.

# %%
with skip_until_implemented("the masks and scaled_dot_product_attention"):
    generator = torch.Generator().manual_seed(2)
    Q_demo, K_demo, V_demo = (torch.randn(2, 1, 5, 8, generator=generator) for _ in range(3))  # (2, 1, 5, 8)
    mask_demo = make_padding_mask(token_ids, 3) & make_look_ahead_mask(5)  # (2, 1, 5, 5)
    _, weights_demo = scaled_dot_product_attention(Q_demo, K_demo, V_demo, mask_demo)
    figures.plot_attention_weights(weights_demo[0, 0], sentences[0], sentences[0],
                                   title="Weights with padding & look-ahead mask")
    plt.show()
    print("row sums:", [round(x, 3) for x in weights_demo[0, 0].sum(dim=-1).tolist()])

# %% [markdown]
# ## 8. Multi-head attention
#
# One attention computation gives each query *one* weighted average. But a word relates to its
# sentence in several ways at once: "sat" wants its subject, its modifiers, maybe the tense of a
# nearby auxiliary. A single softmax has to blend all of these into one distribution. **Multi-head
# attention** runs $h$ attentions side by side, each on its own learned projection, so each head can
# specialise in one kind of relation (stage 6 shows what trained heads look at):
#
# $$\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O,
# \qquad \mathrm{head}_i = \mathrm{Attention}(Q W_i^Q,\; K W_i^K,\; V W_i^V)$$
#
# - $h$ = `num_heads` (8 in the paper); $d_{model}$ = the model width (512);
# - $W_i^Q, W_i^K, W_i^V$ — the projections of head $i$, each $d_{model} \times d_k$ with
#   $d_k = d_{model}/h$ (64 in the paper);
# - $\mathrm{Concat}$ — the $h$ head outputs side by side, back to width $h \cdot d_k = d_{model}$;
# - $W^O$ — a $d_{model} \times d_{model}$ projection that **mixes** the heads: without it each
#   slice of the output would only ever contain one head's result.
#
# Because each head is $h$ times narrower, all heads together cost about as much as one full-width
# attention.
#
# **One big projection instead of $h$ small ones.** Putting the $h$ matrices $W_i^Q$ side by side
# gives one $d_{model} \times d_{model}$ matrix: `W_q = nn.Linear(d_model, d_model)` computes all
# heads' queries in one go, and features $i \cdot d_k$ to $(i+1) \cdot d_k - 1$ of its output belong
# to head $i$. The same holds for `W_k`, `W_v`. The constructor (given) creates the four layers
# `W_q`, `W_k`, `W_v`, `W_o` and stores `d_model`, `num_heads` and `d_k`.

# %% [markdown]
# ### Splitting into heads and joining them back
# `split_heads` turns `(batch, seq_len, d_model)` into `(batch, num_heads, seq_len, d_k)`, so that
# `scaled_dot_product_attention` treats `(batch, num_heads)` as leading axes and runs every head at
# once. It takes two steps:
#
# 1. `view(batch, seq_len, num_heads, d_k)` — cut each token's `d_model` features into `num_heads`
#    consecutive blocks of `d_k`;
# 2. `transpose(1, 2)` — bring the heads axis in front of the sequence axis.
#
# `combine_heads` undoes it in reverse order: `transpose(1, 2)` back to
# `(batch, seq_len, num_heads, d_k)`, then `view(batch, seq_len, d_model)`. After a transpose the
# tensor's memory is no longer in row order, and `.view` refuses it: call `.contiguous()` first
# (or use `.reshape`, which copies when it must).

# %%
diagrams.show("head_splitting")

# %% [markdown]
# **Why the transpose matters.** Below, 3 tokens with $d_{model} = 4$ and 2 heads, so $d_k = 2$.
# Token $t$ holds the features $4t, \dots, 4t+3$. Head 0 should see the first two features of
# *every* token. A bare `view` straight to `(batch, heads, seq_len, d_k)` has the right shape but
# fills head 0 with the first six numbers in memory: pieces of token 0 and token 1 posing as three
# different tokens.

# %%
x = torch.arange(12.0).view(1, 3, 4)  # (batch 1, seq_len 3, d_model 4)
print("the tokens:\n", x[0])
print("what head 0 must contain (features 0 and 1 of every token):\n", x[0, :, 0:2])
print("head 0 after a bare x.view(1, 2, 3, 2):\n", x.view(1, 2, 3, 2)[0, 0])

# %% [markdown]
# ### Putting it together: `forward(q, k, v, mask)`
# 1. project: `self.W_q(q)`, `self.W_k(k)`, `self.W_v(v)` — each `(batch, len, d_model)`;
# 2. split each into heads: `Q`, `K`, `V` of shape `(batch, num_heads, len, d_k)`;
# 3. attend with **your** `scaled_dot_product_attention(Q, K, V, mask)`; the masks you built
#    broadcast over the heads axis; call the results `heads` (or any name) and `weights`;
# 4. `output = self.W_o(self.combine_heads(heads))` — `(batch, q_len, d_model)`.
#
# The given lines after the markers store `weights` `(batch, num_heads, q_len, k_len)` in
# `self.attn_weights` (for plotting) and return `output`, so use those two names.
#
# ### Pitfalls
# - **`view` without `transpose`** in `split_heads` (shown above), or in `combine_heads`: right
#   shape, scrambled tokens.
# - **skipping `W_o`**: returning the concatenated heads leaves every output feature computed by a
#   single head.
# - **scaling by $\sqrt{d_{model}}$**: happens when attention runs on the full width before
#   splitting; each head is $d_k$ wide.
# - **mixing up the inputs**: queries come from `q`, keys from `k`, values from `v`. In
#   cross-attention `q` has a different length from `k` and `v`, so never take the sequence length
#   of one for the others.

# %% [markdown]
# ## 9. Exercise: `MultiHeadAttention`
# Complete `split_heads`, `combine_heads` and `forward`. Keep the constructor as it is: the checks
# copy weights into your module by the names `W_q`, `W_k`, `W_v`, `W_o`, and compare it with the
# reference and with PyTorch's `nn.MultiheadAttention` holding the same weights.

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
### END HIDDEN TESTS

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
# ## 10. Looking at the heads
# Your module, untrained, on the second German sentence with the look-ahead mask. The weights are
# random, so the patterns mean nothing yet, but every head has its own pattern, and the masked
# upper triangle is 0 in all of them. In stage 6 the same figure for a trained model shows heads
# that follow word order, align words between the languages, or look at the end of the sentence.

# %%
with skip_until_implemented("MultiHeadAttention"):
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
# projection as `out_proj`. Its masks use the **opposite** convention (`True` = ignore), so ours
# are inverted with `~` and the padding mask is squeezed to `(batch, seq_len)`. With the same
# weights both modules agree to rounding error. (It is only a yardstick here: the checks reject it
# inside your code.)

# %%
with skip_until_implemented("MultiHeadAttention and make_padding_mask"):
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
# ## Summary
# - Attention is a soft lookup: $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$, scores `(…, q_len, k_len)`,
#   softmax over the keys (`dim=-1`), output `(…, q_len, d_v)`.
# - Dot products of width $d_k$ have variance $d_k$; dividing by $\sqrt{d_k}$ keeps the softmax out of
#   saturation so gradients flow.
# - Masks use `True` = may attend; hidden scores are filled with `-1e9` **before** the softmax, so
#   hidden keys get exactly 0 and rows still sum to 1.
# - The padding mask `(batch, 1, 1, seq_len)` hides `<pad>` keys; the look-ahead mask
#   `(1, 1, size, size)` is lower-triangular with the diagonal; the decoder combines them with `&`.
# - Multi-head attention projects with `W_q`, `W_k`, `W_v`, splits `d_model` into `num_heads` blocks
#   of `d_k` (view, then transpose), attends per head, joins the heads (transpose, then view) and
#   mixes them with `W_o`.
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
# **Question 1 (3 points).** You divided the scores by $\sqrt{d_k}$. A classmate leaves the
# division out in a model with $d_k = 64$. Explain, with the variance argument of section 3, what
# happens to the attention weights at initialisation and why training then slows down or stalls.
# Why $\sqrt{d_k}$, and not $d_k$?

# %% [markdown] answer="attn_q_scale" points=3
# **Model answer.** With query and key entries of mean 0 and variance 1, $q \cdot k$ is a sum of
# $d_k$ independent terms of variance 1, so its variance is $d_k$ and typical scores are about
# $\pm\sqrt{d_k} = \pm 8$. A softmax over scores that far apart is almost one-hot. It is then
# saturated: its derivatives $a_i(\delta_{ij} - a_j)$ are close to 0 for every entry, so hardly any
# gradient reaches the queries and keys (the projections $W_q$, $W_k$), and they learn very slowly.
# Dividing by $\sqrt{d_k}$ brings the variance back to 1 whatever the head width. Dividing by $d_k$
# would shrink the variance to $1/d_k$: all scores near 0, nearly uniform weights, and attention
# could
# not focus on anything at first.
#
# **Rubric.**
# - 1 point: $\mathrm{Var}(q \cdot k) = d_k$, so scores grow like $\sqrt{d_k}$ with the head width.
# - 1 point: large scores saturate the softmax (nearly one-hot weights), its gradients vanish,
#   learning stalls.
# - 1 point: $\sqrt{d_k}$ restores variance 1 for any width; $d_k$ would over-shrink the scores
#   (nearly uniform weights).

# %% [markdown]
# **Question 2 (2 points).** Your function hides a key by filling its score with `-1e9` *before* the
# softmax. A classmate multiplies the weights by the mask *after* the softmax instead. What is wrong
# with their weights? And why does this course use `-1e9` rather than `float("-inf")`?

# %% [markdown] answer="attn_q_mask" points=2
# **Model answer.** After the softmax the hidden key has already taken its share of the
# normaliser: zeroing its weight afterwards leaves a row that sums to less than 1, so the output is
# shrunk and the visible keys do not get the weights a softmax over them alone would give. A score
# of
# `-1e9` becomes exactly 0 after the exponential, so the softmax spreads the whole weight 1 over the
# allowed keys. With `-inf`, a row in which every key is hidden (a padding query, say) becomes
# $0/0$ = NaN, and NaN spreads to everything computed from it, the loss included; `-1e9` gives
# such a row evenly spread, finite weights instead.
#
# **Rubric.**
# - 1 point: masking after the softmax leaves rows that do not sum to 1 (the hidden key still counts
#   in the normaliser).
# - 1 point: `-inf` turns fully hidden rows into NaN ($0/0$); a large finite negative number does
#   not.

# %% [markdown]
# **Question 3 (2 points).** In `split_heads` you first viewed `(batch, seq_len, d_model)` as
# `(batch, seq_len, num_heads, d_k)` and then transposed. Explain why
# `x.view(batch, num_heads, seq_len, d_k)` gives the right shape but the wrong heads, and why
# `combine_heads` needs `.contiguous()` (or `reshape`) before its `view`.

# %% [markdown] answer="attn_q_heads" points=2
# **Model answer.** `view` only re-reads the same memory in row-major order, and the memory holds
# token 0's $d_{model}$ features, then token 1's, and so on. Read directly as
# `(num_heads, seq_len, d_k)`, head 0's "positions" are consecutive chunks of $d_k$ numbers: pieces
# of token 0, then of token 1, posing as different tokens. The shape is right, so only the values
# show the mistake. Viewing as `(seq_len, num_heads, d_k)` cuts each token's features into
# `num_heads` blocks, and `transpose(1, 2)` then puts the heads axis first without mixing tokens.
# A transposed tensor is no longer laid out in row-major order, and `view` cannot re-read it;
# `.contiguous()` copies it into that order first (`reshape` copies when it must).
#
# **Rubric.**
# - 1 point: a direct view splits memory in the wrong order, so a head's positions are pieces of
#   tokens; same shape, wrong values.
# - 1 point: after `transpose` the memory is not contiguous, so `view` needs `.contiguous()` (or
#   `reshape`).

# %%
check.summary()
