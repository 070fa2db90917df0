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
# # Stage 3 — Feed-forward network, residual + LayerNorm, encoder and decoder blocks
#
# *Transformers from Scratch*: you build the Transformer of Vaswani et al.,
# ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (2017), one stage at a time.
#
# | stage | notebook |
# |---|---|
# | 0 (optional) | why attention: the RNN bottleneck, additive attention |
# | 1 | positional encoding |
# | 2 | scaled dot-product and multi-head attention, masks |
# | **3** | **feed-forward, residual + LayerNorm, encoder and decoder blocks** (this one) |
# | 4 | the full encoder–decoder |
# | 5 | training on Multi30k German→English |
# | 6 | greedy decoding, BLEU, attention heatmaps |
# | 7 (optional) | the key/value cache and beam search |
#
# **Working time:** about 2 hours if you are at ease with PyTorch, about 3½ hours if you are new to it or get
# stuck. That is reading (55 minutes at 150 words a minute without the folded hints, 80 at 100 words a minute
# with them, and the given code at 10 lines a minute), three exercises, one bug hunt, three predictions and
# three written questions, 5 to 10 minutes of setting up (Colab, the setup cell, saving a copy), and cells
# that run in seconds. (Estimated by `scripts/working_time.py` in the course repository from the notebook's
# length and the measured run time of its cells, with assumptions it prints, not measurements of students: for
# example 150 or 100 words a minute, 5 or 10 minutes per exercise plus 2 or 4 per line you write, 10 or 20 per
# bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. write down the feed-forward network $\max(0, xW_1 + b_1)W_2 + b_2$, name every symbol and shape,
#    and show what "position-wise" means with a permutation;
# 2. find a bug in a feed-forward network from how it trains, not from reading its code first;
# 3. say what a residual connection buys a deep stack (and what Dong et al., 2021, proved about attention
#    without it), what LayerNorm normalises (the $d_{model}$ features of one position) and what its
#    $\gamma$ and $\beta$ are for;
# 4. build `EncoderBlock` and `DecoderBlock` from the paper's description of how each sublayer uses its
#    residual connection, LayerNorm and dropout (the post-LN arrangement);
# 5. say which mask goes to which attention in the decoder, and where cross-attention takes its
#    queries, keys and values from;
# 6. build the pre-LN variant from its defining properties, and explain from a measurement why its lower
#    blocks get larger gradients than its upper ones.
#
# **Before you start.** You need stage 2 (multi-head attention and the two masks; this notebook imports
# the course's versions), `nn.Linear`, the ReLU, dropout, and what `model.train()` and `model.eval()`
# change. Layer normalisation is explained here.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package), then
# the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is given and
# correct, apart from the bug hunt's code, which says so. After each exercise a few *check cells* test one
# property each: `✔` means it holds, a red `✘` block says what was expected and what came out, hints
# folded under it. A failing check does not stop the notebook: *Run all* always reaches the end, where the
# last cell lists every check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work (the grader
# also runs a few hidden ones with other sizes).
#
# Multi-head attention and the masks come from the course's reference package, not from your
# stage-2 notebook, so a mistake left there cannot break this one. In the same spirit, the block
# checks plug the reference feed-forward network into your blocks: a feed-forward mistake costs
# points once, in its own checks.
#
# <!-- keep-and-hand-in -->

# %% readonly="setup"
#| setup

# %%
#| settings

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from transformer_course.checks import blocks as check
from transformer_course.reference import MultiHeadAttention, make_padding_mask, make_target_mask
from transformer_course.visualisation import blocks as figures
from transformer_course.visualisation import diagrams

# %% [markdown]
# ## 1. Where the blocks sit
#
# The whole model is two stacks of blocks: $N = 6$ **encoder blocks** on the left read the source
# sentence, $N = 6$ **decoder blocks** on the right write the translation. Everything else
# (embeddings, positional encoding, the output layer) wraps around the stacks; stage 4 assembles it.
# This notebook builds one block of each kind, and a variant of the encoder block. All are made of the
# same few parts: multi-head attention (stage 2), a small feed-forward network, residual connections,
# LayerNorm and dropout.

# %%
diagrams.show("transformer")

# %% [markdown]
# ## 2. The position-wise feed-forward network
#
# After attention has let every position gather information from the others, each position is
# processed **on its own** by the same two-layer network (section 3.3 of the paper):
#
# $$\mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2$$
#
# - $x \in \mathbb{R}^{d_{model}}$ — the vector of **one** position (a row vector);
# - $W_1 \in \mathbb{R}^{d_{model} \times d_{ff}}$, $b_1 \in \mathbb{R}^{d_{ff}}$ — the first layer,
#   `fc1`, which widens the vector to $d_{ff}$ hidden units ($d_{ff} = 2048 = 4 \cdot 512$ in the paper);
# - $\max(0, \cdot)$ — the ReLU, applied element by element: negative hidden values become 0;
# - $W_2 \in \mathbb{R}^{d_{ff} \times d_{model}}$, $b_2 \in \mathbb{R}^{d_{model}}$ — the second layer,
#   `fc2`, which brings the vector back to width $d_{model}$.
#
# **Why "position-wise"?** The same $W_1, b_1, W_2, b_2$ are used at every position, and position
# $i$'s output depends only on position $i$'s input. Attention *mixes* positions; the feed-forward
# network *transforms* each one. `nn.Linear` acts on the last axis only, so for a batch
# `(batch, seq_len, d_model)` one call does every position at once:
# `(batch, seq_len, d_model)` in, `(batch, seq_len, d_ff)` in the hidden layer, `(batch, seq_len, d_model)` out.
# (The paper also describes it as two convolutions with kernel size 1: the same thing.)
#
# Small as it looks, it has about twice as many parameters as the multi-head attention before it
# whenever $d_{ff} = 4\,d_{model}$, as in the paper. With half the paper's sizes:

# %%
d_model, d_ff, num_heads = 256, 1024, 4
stand_in_ffn = nn.ModuleList([nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)])  # W1, b1 and W2, b2
attention = MultiHeadAttention(d_model, num_heads)
print(f"feed-forward network: {sum(p.numel() for p in stand_in_ffn.parameters()):>9,} parameters")
print(f"multi-head attention: {sum(p.numel() for p in attention.parameters()):>9,} parameters")

# %% [markdown]
# **What the ReLU does to the hidden layer.** Below, 12 random positions go through a randomly
# initialised `fc1` and the ReLU. About half of the hidden values are exactly 0: each position
# switches on its own subset of hidden units, and `fc2` combines just those. Without the ReLU the
# two layers would collapse into one: $(xW_1 + b_1)W_2 + b_2 = x(W_1W_2) + (b_1W_2 + b_2)$ is again a
# matrix product plus a bias, so the network could compute nothing a single `nn.Linear` cannot.

# %%
torch.manual_seed(0)
fc1 = nn.Linear(32, 128)  # d_model = 32, d_ff = 128
with torch.no_grad():
    pre_activation = fc1(torch.randn(12, 32))  # 12 positions -> (12, d_ff)
figures.plot_feed_forward_hidden(pre_activation)
plt.show()

# %% [markdown]
# ## 3. Exercise, a bug hunt: `PositionWiseFeedForward`
#
# The constructor makes `self.fc1` ($W_1, b_1$), `self.relu` and `self.fc2` ($W_2, b_2$); `forward`
# must return $\mathrm{FFN}(x)$ of section 2 for `x` of shape `(batch, seq_len, d_model)`, a tensor of
# the same shape.
#
# This one is written for you, by a classmate, and it has **one realistic mistake**: it runs and its
# shapes are right. Find it the way you would in a real project, from what the network *does*:
# 1. run the cell, then the small training run under it, and read its numbers and its figure;
# 2. work out what the network can and cannot output, and which part of it is responsible;
# 3. fix the cell in place, run it again, then the training run and the checks.

# %% solution="block_feed_forward"
#| bug: return self.fc2(self.relu(self.fc1(x))) => return self.relu(self.fc2(self.fc1(x)))
#| include transformer_course.reference.blocks:PositionWiseFeedForward

# %% [markdown]
# **A small training run.** In a block, a sublayer's job is to learn a *correction* that is added to
# the vector of each position (section 4 says why). The cell gives the classmate's network a small
# such job: for 512 random positions ($d_{model} = 8$, $d_{ff} = 32$), output a fixed *nonlinear*
# function of the input (the size of each input coordinate, mixed by a random matrix and centred), whose
# values are positive and negative in about equal numbers. A correct network of this width can
# represent that function exactly, so it drives the loss close to 0 within these 300 steps. The figure
# shows the loss at every step and, after training, every output value against its target (a perfect
# fit lies on the diagonal).

# %%
torch.manual_seed(0)
classmates_network = PositionWiseFeedForward(d_model=8, d_ff=32)
inputs = torch.randn(1, 512, 8)  # (batch, positions, d_model)
targets = inputs.abs() @ torch.randn(8, 8) / 8**0.5  # (1, 512, 8): a fixed nonlinear correction of each position
targets = targets - targets.mean(dim=1, keepdim=True)  # centred: about as many negative values as positive
losses, predictions = figures.fit_to_targets(classmates_network, inputs, targets, steps=300)
print(f"loss of predicting 0 everywhere: {targets.pow(2).mean():.3f}; "
      f"after 100 steps: {losses[99]:.4f}; after 300 steps: {losses[-1]:.4f}")
print(f"targets below 0: {(targets < 0).float().mean():.0%}; outputs below 0: {(predictions < 0).float().mean():.0%}")
figures.plot_fit(losses, targets.pow(2).mean().item(), targets, predictions)
plt.show()

# %% [markdown]
# <details><summary>Hint 1: read the symptom</summary>
#
# Does the loss approach 0, or stop somewhere? Compare where it stops with the loss of predicting 0
# everywhere. Then look at the right-hand panel: where do the points leave the diagonal, and what is
# the smallest value the network ever outputs? Which operation in the network produces exactly that
# value for every input below it?
#
# </details>
#
# <details><summary>Hint 2: where to look</summary>
#
# The ReLU belongs to the hidden layer only, between `fc1` and `fc2`, where it lets each position switch
# hidden units on and off. The output of `fc2` is the correction added to the residual stream, and it
# must be free to be negative: a ReLU there clips every output to 0 or more, so half of the targets
# can never be reached and the loss stalls far above 0.
#
# </details>
#
# <details><summary>Hint 3: the line</summary>
#
# ```python
# return self.fc2(self.relu(self.fc1(x)))
# ```
#
# </details>

# %% [markdown]
# ### Check your work
# Each cell checks one property. Read the message of the first failing one: fix that, rerun the
# exercise cell, then rerun the checks.

# %% tests="block_ffn_values" points=3
assert check.feed_forward_shape(PositionWiseFeedForward, bug_hunt=True)
assert check.feed_forward_values(PositionWiseFeedForward, bug_hunt=True)

# %% tests="block_ffn_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.feed_forward_values(PositionWiseFeedForward, d_model=24, d_ff=40, batch=2, seq_len=9)
assert check.feed_forward_shape(PositionWiseFeedForward, d_model=6, d_ff=10, batch=1, seq_len=1)
### END HIDDEN TESTS

# %% [markdown]
# **Position-wise, seen in numbers.** Shuffle the positions of the input and the outputs come out
# shuffled the same way; change one position and only that position's output moves.

# %%
torch.manual_seed(0)
ffn = PositionWiseFeedForward(d_model=8, d_ff=32)
x = torch.randn(1, 5, 8)  # (batch, seq_len, d_model)
order = torch.tensor([3, 0, 4, 1, 2])
with torch.no_grad():
    same = torch.allclose(ffn(x)[:, order], ffn(x[:, order]), atol=1e-6)
    edited = x.clone()
    edited[0, 2] += 1.0  # change position 2 only
    moved = (ffn(edited) - ffn(x)).abs().amax(dim=-1)[0]  # (seq_len,)
print("shuffling positions only shuffles the outputs:", same)
print("largest change of each output position after editing position 2:", moved.numpy().round(3))

# %% [markdown]
# ## 4. Residual connections
#
# A **residual connection** (He et al., 2016) adds a sublayer's input to its output:
#
# $$y = x + \mathrm{Sublayer}(x)$$
#
# - $x$ — the sublayer's input, `(batch, seq_len, d_model)`;
# - $\mathrm{Sublayer}$ — self-attention, cross-attention or the feed-forward network;
# - $y$ — same shape as $x$; this is why every sublayer, and the embeddings, have width $d_{model}$.
#
# Two things follow. The sublayer only has to learn a *correction* to $x$ (the running sum $x$ that
# flows through the stack: the *residual stream*), and doing nothing is easy (output 0). And the
# gradient has a direct path back: $\partial y / \partial x = I +
# \partial\,\mathrm{Sublayer}/\partial x$, so it reaches the lower blocks even when the sublayers'
# own Jacobians are small. (In the paper's block a LayerNorm follows the sum, so the gradient passes
# through that LayerNorm too; section 11 comes back to what that does.)
#
# Attention has a further, specific need for it. Each attention output is a weighted *average* of
# value vectors, and averaging again and again makes all positions alike. The experiment below
# stacks 12 random attention layers, each followed by a LayerNorm, once with a residual connection
# around every attention layer and once without, and tracks two measures after every layer:
# - the mean **cosine similarity** between the positions of a sequence: 0 means unrelated vectors, 1
#   the same direction;
# - the **distance to a sequence whose positions all hold the same vector** (the sequence's mean vector
#   at every position, the nearest such sequence), relative to the size of the sequence: 0 means every
#   position carries the same vector. It is computed in float64, whose rounding error is about
#   $10^{-16}$.

# %%
def mean_similarity(x: torch.Tensor) -> float:
    """Average cosine similarity between the different positions of each sequence in x (batch, seq_len, d)."""
    unit = F.normalize(x, dim=-1)
    similarity = unit @ unit.transpose(-2, -1)  # (batch, seq_len, seq_len), 1 on the diagonal
    n = x.size(1)
    return ((similarity.sum(dim=(-2, -1)) - n) / (n * (n - 1))).mean().item()


def distance_to_equal_positions(x: torch.Tensor) -> float:
    """How far x (batch, seq_len, d) is from the sequence holding its mean vector at every position, relative."""
    spread = x - x.mean(dim=1, keepdim=True)  # (batch, seq_len, d): each position minus the mean position
    return (spread.norm(dim=(1, 2)) / x.norm(dim=(1, 2))).mean().item()


def stack_of_attention(residual: bool, num_layers: int = 12, d_model: int = 64) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    x = torch.randn(8, 10, d_model, dtype=torch.float64)  # 8 sequences of 10 positions
    similarity, distance = [mean_similarity(x)], [distance_to_equal_positions(x)]
    with torch.no_grad():
        for _ in range(num_layers):
            attention = MultiHeadAttention(d_model, 4).double()
            update = attention(x, x, x)  # every position: a weighted average of all positions' values
            x = x + update if residual else update
            x = nn.LayerNorm(d_model).double()(x)  # every layer ends with a LayerNorm
            similarity.append(mean_similarity(x))
            distance.append(distance_to_equal_positions(x))
    return similarity, distance


# %%
with_residual, without_residual = stack_of_attention(residual=True), stack_of_attention(residual=False)
distances = without_residual[1]  # without residual connections: after 0, 1, 2, ... layers
print(f"without residual connections, at the start: distance {distances[0]:.1e}")
for layer in range(1, 5):
    print(f"after {layer} layer{'s' if layer > 1 else ' '}: distance {distances[layer]:.1e};  "
          f"the cube of the distance one layer earlier {distances[layer - 1] ** 3:.1e}")
figures.plot_similarity_by_depth({"with residual connections": with_residual[0],
                                  "without residual connections": without_residual[0]},
                                 {"with residual connections": with_residual[1],
                                  "without residual connections": without_residual[1]})
plt.show()

# %% [markdown]
# Without the residual path, two layers are enough for every position to carry (almost) the same
# vector: the sentence has been averaged away. With it, the similarity creeps up only slowly and
# stays far below 1 after 12 layers: each position keeps most of its own identity.
#
# **What is proved about this.** Dong, Cordonnier and Loukas (2021, "Attention is not all you need:
# pure attention loses rank doubly exponentially with depth") studied stacks of self-attention layers
# with no residual connections and no feed-forward networks. They proved that the output of such a
# stack approaches a matrix of rank 1 whose rows are all equal (every position the same vector), and
# how fast: after each layer, the distance from such a matrix is at most a constant times the *cube*
# of the distance before it (for weights of bounded size; they measure the distance in another matrix
# norm than ours). Once the distance is small, cubing it at every layer makes it fall *doubly
# exponentially* with the depth $L$, like $c^{3^L}$. The printed distances of the stack without residual
# connections are consistent with that: up to layer 3 each is below the cube of the one before it, and
# the exponent roughly triples from layer 2 to layer 3; at layer 4 float64's rounding stops the fall near
# $10^{-16}$. Consistent, not a check of the theorem: its bound has a constant and another norm, our stack
# has a LayerNorm the theorem does not cover, and much of the first layer's fall comes from attention
# weights that are nearly uniform at random initialisation. They also
# found that residual connections counteract this collapse and that feed-forward networks slow it
# down. Their proof covers attention alone; whether the LayerNorm in our stack rescues it is
# question 1.
#
# ## 5. Layer normalisation
#
# **LayerNorm** (Ba et al., 2016) rescales the vector of each position to mean 0 and variance 1,
# then lets the model choose a scale and shift of its own:
#
# $$\mathrm{LayerNorm}(z) = \gamma \odot \frac{z - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta,
# \qquad \mu = \frac{1}{d_{model}}\sum_{i=1}^{d_{model}} z_i, \qquad
# \sigma^2 = \frac{1}{d_{model}}\sum_{i=1}^{d_{model}} (z_i - \mu)^2$$
#
# - $z \in \mathbb{R}^{d_{model}}$ — the vector of **one position of one sentence**;
# - $\mu, \sigma^2$ — the mean and variance of that vector's $d_{model}$ features (not over the batch,
#   not over the positions);
# - $\epsilon$ — a small constant ($10^{-5}$ in `nn.LayerNorm`) that avoids dividing by 0;
# - $\gamma, \beta \in \mathbb{R}^{d_{model}}$ — a learned gain and bias, one per feature, starting at
#   1 and 0; $\odot$ is the element-wise product. They let the model undo the normalisation where a
#   feature needs a different scale.
#
# `nn.LayerNorm(d_model)` normalises the last axis of a `(batch, seq_len, d_model)` tensor, every
# position independently. Unlike BatchNorm it uses no statistics across the batch, so it behaves the
# same in training and evaluation, for a batch of one, and whatever padding the batch holds.
#
# The cell computes LayerNorm by hand for 6 positions whose features have very different means and
# spreads, and compares with `nn.LayerNorm`. The figure shows each position's 32 features before
# and after: every position ends up centred on 0 with spread 1 (here $\gamma = 1$, $\beta = 0$).

# %%
torch.manual_seed(0)
offsets = torch.tensor([-3.0, 0.0, 2.0, 5.0, 1.0, -1.0]).unsqueeze(1)  # (6, 1): one mean per position
spreads = torch.tensor([0.5, 1.0, 3.0, 0.3, 2.0, 1.5]).unsqueeze(1)  # (6, 1): one spread per position
z = offsets + spreads * torch.randn(6, 32)  # 6 positions, d_model = 32
layer_norm = nn.LayerNorm(32)
mean = z.mean(dim=-1, keepdim=True)  # (6, 1)
variance = z.var(dim=-1, correction=0, keepdim=True)  # (6, 1), divides by d_model, not d_model - 1
by_hand = (z - mean) / torch.sqrt(variance + layer_norm.eps) * layer_norm.weight + layer_norm.bias
with torch.no_grad():
    print("by hand equals nn.LayerNorm:", torch.allclose(by_hand, layer_norm(z), atol=1e-5))
    figures.plot_layer_norm(z, layer_norm(z))
plt.show()

# %% [markdown]
# ## 6. How the paper puts the parts together
#
# Sections 4 and 5 gave the ingredients. The paper says in words how every sublayer uses them
# (section 3.1, for the encoder; the decoder's sublayers are arranged "similar to the encoder"):
#
# > We employ a residual connection around each of the two sub-layers, followed by layer
# > normalization.
#
# and where dropout goes (section 5.4, *Residual Dropout*, with $P_{drop} = 0.1$ for the base model):
#
# > We apply dropout to the output of each sub-layer, before it is added to the sub-layer input and
# > normalized.
#
# Why each piece sits where it does:
# - **The residual connection around the sublayer.** The sublayer computes a correction; the
#   residual keeps each position's own vector in the result (section 4).
# - **Layer normalisation after the residual sum.** What leaves each sublayer, and so each block, is
#   normalised, which keeps the activations at one scale however many blocks are stacked. Because the
#   LayerNorm comes *after* the addition, this arrangement is called **post-LN**. Section 12 builds
#   the other arrangement, pre-LN, which most large language models since GPT-2 use.
# - **Dropout on the sublayer's output, before the addition.** Only the correction is dropped out; what
#   the residual connection carries past the sublayer arrives whole.
# - **A LayerNorm of its own for every sublayer** (`norm1`, `norm2`, …): each learns its own
#   $\gamma$ and $\beta$. One dropout module is enough for all sublayers: it has no parameters, each
#   call draws a fresh random mask, and in eval mode (`model.eval()`) it does nothing.

# %% [markdown]
# ## 7. The encoder block
#
# An encoder block has two sublayers: multi-head **self-attention**, in which every position of the
# source sentence attends to the positions of the same sentence (queries, keys and values all come
# from the block's input; the paper, section 3.2.3: "all of the keys, values and queries come from the
# same place"), then the feed-forward network. The figure draws it as the paper's Figure 1 does, with
# the course's attribute names; "Add & Norm" is the residual connection and the LayerNorm of
# section 6, and dropout (section 5.4) is not drawn.

# %%
diagrams.show("encoder_block")

# %% [markdown]
# The `mask` is the source padding mask from stage 2, `(batch, 1, 1, src_len)`, True where the key
# is a real token: no position attends to `<pad>`. Only attention needs it; the feed-forward
# network never mixes positions, so padding cannot leak through it.
#
# ### What goes wrong, and what it looks like
# - the block runs and every shape is right, but its values differ from the reference's and from
#   `nn.TransformerEncoderLayer`'s (the checks compare them in eval mode, where dropout does nothing;
#   PyTorch's layer also applies dropout inside the feed-forward network and to the attention weights,
#   which the paper does not describe);
# - adding `<pad>` tokens changes the outputs at the real positions;
# - a `TypeError` raised inside the feed-forward network;
# - two eval-mode runs of the same input give different outputs;
# - both dropout modes behave, but the dropout-placement check fails.
#
# <details><summary>The causes behind these symptoms (open this when a check fails and you are stuck)</summary>
#
# In the same order: a missing residual, a LayerNorm in the wrong place, or one LayerNorm for both
# sublayers (the checks give the two LayerNorms different gains, and in training the unused one would
# never learn); the mask left out of self-attention; the mask passed to the feed-forward network; a
# dropout that ignores eval mode; dropout on something else than each sublayer's output.
#
# </details>
#
# ## 8. Exercise: `EncoderBlock`
#
# Complete `forward(x, mask)`. The contract:
# - **inputs**: `x` of shape `(batch, src_len, d_model)`; `mask`, the source padding mask
#   `(batch, 1, 1, src_len)` (True where a key may be attended), or `None`;
# - **output**: a tensor of the same shape as `x`; the given last line returns `x`, so leave the
#   block's result there;
# - **sublayers**, in the paper's order: self-attention (`self.self_attn`, the course's
#   `MultiHeadAttention` of stage 2, called as `(q, k, v, mask)`), then the feed-forward network
#   (`self.feed_forward`, called with one tensor);
# - **arrangement**: the paper's, section 6: each sublayer with its residual connection and its own
#   LayerNorm (`self.norm1` for self-attention, `self.norm2` for the feed-forward network), post-LN;
#   dropout (`self.dropout`) on each sublayer's output, as section 5.4 says;
# - **properties the checks test**: the shape, and that training can run through the block (it leaves the
#   `x` it was given as it was, and a backward pass from its output works); the values of the paper's
#   block (the reference's, and PyTorch's `nn.TransformerEncoderLayer` with the same weights); padding
#   changes no real position's output; dropout acts in train mode only, on each sublayer's output.
#
# The constructor is given; keep its attribute names (the checks plug the reference attention and
# feed-forward network in there, so that only your `forward` is graded).

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Each sublayer becomes one statement that replaces `x`: the sublayer's output, dropped out, added to
# the `x` the sublayer read, and the sum normalised by that sublayer's LayerNorm. Two sublayers, two
# statements, each with its own LayerNorm.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# Every tensor here is `(batch, src_len, d_model)`. `self.self_attn` takes `(q, k, v, mask)`, and in
# self-attention all three of `q`, `k`, `v` are the same `x`. `self.feed_forward` takes `x` only.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)))
# x = self.norm2(x + self.dropout(self.feed_forward(x)))
# ```
#
# </details>

# %% solution="block_encoder"
#| include transformer_course.reference.blocks:EncoderBlock

# %% [markdown]
# ### Check your work
# The first checks compare your block with the reference on random inputs (float64, eval mode, same
# random weights, LayerNorm gains included, so `norm1` and `norm2` differ). One compares with
# PyTorch's own `nn.TransformerEncoderLayer`, given the same weights: its packed projection
# `in_proj_weight` is `W_q`, `W_k`, `W_v` stacked, and its padding mask means True = *ignore*, the
# opposite of ours. The last ones test properties: padding, and dropout in train and eval mode.

# %% tests="block_enc_shape" points=1
assert check.encoder_shape(EncoderBlock)

# %% tests="block_enc_values" points=2
assert check.encoder_values(EncoderBlock)

# %% tests="block_enc_torch" points=2
assert check.encoder_matches_torch(EncoderBlock)

# %% tests="block_enc_padding" points=1
assert check.encoder_padding_invariance(EncoderBlock)

# %% tests="block_enc_dropout" points=1
assert check.encoder_dropout_modes(EncoderBlock)

# %% tests="block_enc_dropout_place" points=1
assert check.encoder_dropout_placement(EncoderBlock)

# %% tests="block_enc_hidden_values" points=1
### BEGIN HIDDEN TESTS
assert check.encoder_values(EncoderBlock, d_model=12, num_heads=3, d_ff=20, batch=4, seq_len=9, int_mask=True)
assert check.encoder_matches_torch(EncoderBlock, d_model=24, num_heads=6, d_ff=40, batch=2, seq_len=9)
### END HIDDEN TESTS

# %% tests="block_enc_hidden_properties" points=1
### BEGIN HIDDEN TESTS
assert check.encoder_padding_invariance(EncoderBlock, d_model=12, num_heads=2, d_ff=24, seq_len=4, extra=5)
assert check.encoder_dropout_placement(EncoderBlock, d_model=8, num_heads=2, d_ff=16, batch=3, seq_len=5)
### END HIDDEN TESTS

# %% [markdown]
# **LayerNorm inside your block.** A forward hook (`register_forward_hook` calls our function every
# time `norm1` runs, with its input and output) records what goes into your `norm1` and what comes
# out of it. The input here is deliberately far from mean 0 and
# standard deviation 1; after `norm1` every position is back to mean 0, spread 1 (the fresh
# LayerNorm has $\gamma = 1$, $\beta = 0$). This is what keeps the activations at the same scale
# from block to block, however many blocks are stacked.

# %%
torch.manual_seed(0)
block = EncoderBlock(d_model=32, num_heads=4, d_ff=64, dropout=0.1).eval()
captured = {}
block.norm1.register_forward_hook(lambda module, args, output: captured.update(sum=args[0], out=output))
x = 2.0 + 3.0 * torch.randn(1, 5, 32)  # (batch, src_len, d_model), mean 2, std 3
with torch.no_grad():
    block(x, None)
for name in ("sum", "out"):
    mean = captured[name].mean(dim=-1)[0].numpy().round(2) + 0.0  # + 0.0 turns -0.0 into 0.0
    std = captured[name].std(dim=-1, correction=0)[0].numpy().round(2)
    print(f"{name:>3}: mean per position {mean}   std per position {std}")

# %% [markdown]
# ## 9. The decoder block
#
# A decoder block has **three** sublayers (section 3.1 of the paper: "In addition to the two
# sub-layers in each encoder layer, the decoder inserts a third sub-layer, which performs multi-head
# attention over the output of the encoder stack"), each arranged as in the encoder (section 6):

# %%
diagrams.show("decoder_block")

# %% [markdown]
# - **Masked self-attention** (`self.self_attn`) lets each target position look at the target tokens
#   written so far. Its mask `dec_mask`, `(batch, 1, tgt_len, tgt_len)`, combines the look-ahead mask
#   with the target padding mask of stage 2 (stage 4 builds it): during training the decoder sees the
#   whole target sentence at once, and the mask is the only thing that stops position $t$ from
#   reading the tokens after it, the token it must predict among them.
# - **Cross-attention** (`self.cross_attn`) is where the translation looks at the source. The paper
#   (section 3.2.3): "the queries come from the previous decoder layer, and the memory keys and
#   values come from the output of the encoder". So the queries are the decoder's own vectors ("what
#   do I need next?"), and the keys and values are `enc_out`, `(batch, src_len, d_model)`. Its mask
#   `enc_mask`, `(batch, 1, 1, src_len)`, is the source padding mask, so no target position attends to
#   source `<pad>`. The result has one row per *query*, so its shape is `(batch, tgt_len, d_model)`
#   even though `src_len` usually differs from `tgt_len`.
# - The **feed-forward** sublayer (`self.feed_forward`) is the same kind of network as in the encoder.
#
# The figure below shows both masks for one sentence pair (source: 5 tokens + 2 `<pad>`, target: 4
# tokens + 2 `<pad>`; `<bos>` = 1 and `<pad>` = 3, the ids the whole course uses). Each row is a
# decoder position; blue cells are what it may attend to, grey cells are hidden. (`dec_mask` comes from
# the course's `make_target_mask`, which you write yourself in stage 4.)

# %%
BOS, PAD = 1, 3  # the course's special ids: <unk> 0, <bos> 1, <eos> 2, <pad> 3
source = torch.tensor([[12, 7, 31, 5, 9, PAD, PAD]])  # (1, src_len = 7)
target = torch.tensor([[BOS, 14, 5, 22, PAD, PAD]])  # (1, tgt_len = 6)
enc_mask = make_padding_mask(source, PAD)  # (1, 1, 1, 7)
dec_mask = make_target_mask(target, PAD)  # (1, 1, 6, 6)
figures.plot_decoder_masks(dec_mask[0, 0], enc_mask[0, 0].expand(target.size(1), -1))
plt.show()

# %% [markdown]
# ### What goes wrong, and what it looks like
# - the shape check stops with a size mismatch (the checks use a source and a target of different
#   lengths);
# - with a source as long as the target, the output does not change when the source sentence changes;
# - with a source as long as the target, no error, but the values differ from the reference's;
# - with a source as long as the target, no error, but a position's output changes when a *later*
#   target token changes: the decoder sees the future;
# - the encoder's symptoms, now for three sublayers.
#
# <details><summary>The causes behind these symptoms (open this when a check fails and you are stuck)</summary>
#
# In the same order: a mask or a query that does not fit the source's length (cross-attention that reads
# the target as its keys, cross-attention whose rows follow the source, or swapped masks); cross-attention
# that never reads the source; cross-attention whose rows follow the source, one attention module for both
# attention sublayers (cross-attention has weights of its own), or swapped masks; swapped masks, or no
# look-ahead mask in self-attention; the residual, LayerNorm and dropout causes of the encoder.
#
# </details>
#
# ## 10. Exercise: `DecoderBlock`
#
# Complete `forward(x, enc_out, enc_mask, dec_mask)`. The contract:
# - **inputs**: `x` `(batch, tgt_len, d_model)`, the decoder's vectors; `enc_out`
#   `(batch, src_len, d_model)`, the encoder's output; `enc_mask` `(batch, 1, 1, src_len)` and `dec_mask`
#   `(batch, 1, tgt_len, tgt_len)`, True where a key may be attended;
# - **output**: a tensor of the shape of `x`, left in `x` for the given last line;
# - **sublayers**, in the paper's order: masked self-attention (`self.self_attn`), cross-attention
#   (`self.cross_attn`), the feed-forward network (`self.feed_forward`), each with the inputs and the
#   mask of section 9;
# - **arrangement**: as in your encoder block, post-LN with `self.norm1`, `self.norm2`, `self.norm3`
#   belonging to the three sublayers in that order, and dropout on each sublayer's output;
# - **properties the checks test**: the shape (also when `src_len` differs from `tgt_len`), and that
#   training can run through the block, as for the encoder block; the values
#   of the paper's block (the reference's, and `nn.TransformerDecoderLayer`'s); causality (changing
#   the decoder's inputs after position $t$ never changes its outputs up to $t$); dropout as in the
#   encoder.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# The same one-statement pattern as in your encoder block, three times, each with its own attention
# module or network and its own LayerNorm. Only the inputs of the middle sublayer are new.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# In cross-attention the queries are the decoder's `x` `(batch, tgt_len, d_model)`; keys and values
# are both `enc_out` `(batch, src_len, d_model)`; the result has the query's shape, so the residual
# addition works. Self-attention takes `dec_mask`, cross-attention `enc_mask`.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# x = self.norm1(x + self.dropout(self.self_attn(x, x, x, dec_mask)))
# x = self.norm2(x + self.dropout(self.cross_attn(x, enc_out, enc_out, enc_mask)))
# x = self.norm3(x + self.dropout(self.feed_forward(x)))
# ```
#
# </details>

# %% solution="block_decoder"
#| include transformer_course.reference.blocks:DecoderBlock

# %% [markdown]
# ### Check your work
# As for the encoder, plus **causality**: changing the decoder inputs at positions after $t$ must
# never change the outputs at positions up to $t$. PyTorch's `nn.TransformerDecoderLayer` is the
# yardstick this time: its `self_attn` is our `self_attn`, its `multihead_attn` our `cross_attn`.

# %% tests="block_dec_shape" points=1
assert check.decoder_shape(DecoderBlock)

# %% tests="block_dec_values" points=2
assert check.decoder_values(DecoderBlock)

# %% tests="block_dec_torch" points=2
assert check.decoder_matches_torch(DecoderBlock)

# %% tests="block_dec_causal" points=1
assert check.decoder_causality(DecoderBlock)

# %% tests="block_dec_dropout" points=1
assert check.decoder_dropout_modes(DecoderBlock)

# %% tests="block_dec_dropout_place" points=1
assert check.decoder_dropout_placement(DecoderBlock)

# %% tests="block_dec_hidden_values" points=1
### BEGIN HIDDEN TESTS
assert check.decoder_values(DecoderBlock, d_model=12, num_heads=3, d_ff=20, batch=2, tgt_len=5, src_len=9,
                            int_mask=True)
assert check.decoder_matches_torch(DecoderBlock, d_model=12, num_heads=2, d_ff=20, tgt_len=7, src_len=4)
### END HIDDEN TESTS

# %% tests="block_dec_hidden_properties" points=1
### BEGIN HIDDEN TESTS
assert check.decoder_causality(DecoderBlock, d_model=12, num_heads=3, d_ff=24, tgt_len=8, src_len=3)
assert check.decoder_dropout_placement(DecoderBlock, d_model=8, num_heads=2, d_ff=16, tgt_len=4, src_len=7)
### END HIDDEN TESTS

# %% [markdown]
# **Where your decoder block looks.** Each attention module keeps its last weights in
# `attn_weights`, `(batch, num_heads, q_len, k_len)`. For the sentence pair above (random vectors
# stand in for the embedded tokens and the encoder output), head 0 of self-attention has only zeros
# above the diagonal and in the target-padding columns; cross-attention gives the two source
# `<pad>` columns exactly zero weight.

# %%
torch.manual_seed(0)
block = DecoderBlock(d_model=32, num_heads=4, d_ff=64, dropout=0.1).eval()
x = torch.randn(1, target.size(1), 32)  # (batch, tgt_len, d_model)
enc_out = torch.randn(1, source.size(1), 32)  # (batch, src_len, d_model)
with torch.no_grad():
    out = block(x, enc_out, enc_mask, dec_mask)
print("output shape:", tuple(out.shape))
figures.plot_decoder_attention(block.self_attn.attn_weights, block.cross_attn.attn_weights)  # sentence 0, head 0
plt.show()

# %% [markdown]
# ### Predict, then run
# The predictions are at the paper's sizes ($d_{model} = 512$, 8 heads, $d_{ff} = 2048$); section 2
# counted the feed-forward network and one multi-head attention at half those sizes. From the given
# constructors and what you know about the blocks, work these out on paper before you run anything.
# Write your prediction after `return`: a number, or the arithmetic you worked out (such as `3 * 4`;
# `math` is allowed). A prediction is a value you work out, so the function may not call your
# blocks, torch or anything else of the notebook: the check refuses that. The check only looks at the
# form of your prediction and notes it: **it is scored when your notebook is graded**, and nothing in
# this notebook says whether it is right, so trying again tells you nothing. The cell after the checks
# shows the truth for *other* sizes: use it to test your method. The answer you are graded on is
# never printed.
#
# Count the blocks as their given constructors build them. As in stage 2, a count without the
# biases of the attention projections (the paper's attention formulas have none) is accepted too;
# the feed-forward network's biases $b_1, b_2$ are in the paper's formula, so they count either way.
#
# **Prediction 1 (1 point).** How many trainable parameters does
# `EncoderBlock(d_model=512, num_heads=8, d_ff=2048, dropout=0.1)` have?

# %% solution="block_predict_encoder_parameters"
def predict_encoder_parameters() -> int:
    """Your prediction of the number of trainable parameters of EncoderBlock(512, 8, 2048, 0.1)."""
    ### BEGIN SOLUTION
    attention = 4 * (512 * 512 + 512)
    feed_forward = 512 * 2048 + 2048 + 2048 * 512 + 512
    return attention + feed_forward + 2 * (512 + 512)  # two LayerNorms, gain and bias each
    ### END SOLUTION


# %% tests="block_predicted_encoder_parameters" points=1
assert check.predicted_encoder_parameters(predict_encoder_parameters)

# %% [markdown]
# **Prediction 2 (1 point).** And `DecoderBlock(d_model=512, num_heads=8, d_ff=2048, dropout=0.1)`?

# %% solution="block_predict_decoder_parameters"
def predict_decoder_parameters() -> int:
    """Your prediction of the number of trainable parameters of DecoderBlock(512, 8, 2048, 0.1)."""
    ### BEGIN SOLUTION
    attention = 4 * (512 * 512 + 512)
    feed_forward = 512 * 2048 + 2048 + 2048 * 512 + 512
    return 2 * attention + feed_forward + 3 * (512 + 512)  # self- and cross-attention, three LayerNorms
    ### END SOLUTION


# %% tests="block_predicted_decoder_parameters" points=1
assert check.predicted_decoder_parameters(predict_decoder_parameters)

# %% [markdown]
# **Prediction 3 (1 point).** A narrower feed-forward network: what share of the parameters of
# `DecoderBlock(d_model=512, num_heads=8, d_ff=1024, dropout=0.1)`, in percent, belongs to its
# feed-forward network? (A number between 0 and 100; within 1 percentage point counts.)

# %% solution="block_predict_feed_forward_share"
def predict_feed_forward_share() -> float:
    """Your prediction of the feed-forward network's share of DecoderBlock(512, 8, 1024, 0.1)'s parameters, in %."""
    ### BEGIN SOLUTION
    feed_forward = 512 * 1024 + 1024 + 1024 * 512 + 512
    return 100 * feed_forward / (2 * 4 * (512 * 512 + 512) + feed_forward + 3 * 1024)
    ### END SOLUTION


# %% tests="block_predicted_feed_forward_share" points=1
assert check.predicted_feed_forward_share(predict_feed_forward_share)

# %% [markdown]
# **The truth, for other sizes.** The cell below counts the parameters of your own blocks (their
# constructors are the given ones) for $d_{model} = 64$, 4 heads and $d_{ff} = 192$, and the
# feed-forward network's share. Check that your method gives these numbers too; where it does not,
# find the step of your reasoning that went wrong.

# %%
def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


encoder_block = EncoderBlock(d_model=64, num_heads=4, d_ff=192, dropout=0.1)
decoder_block = DecoderBlock(d_model=64, num_heads=4, d_ff=192, dropout=0.1)
for name, block_of_kind in (("encoder block", encoder_block), ("decoder block", decoder_block)):
    share = 100 * count(block_of_kind.feed_forward) / count(block_of_kind)
    print(f"{name}: {count(block_of_kind):,} parameters, of which feed-forward {share:.1f} %")

# %% [markdown]
# With these sizes the feed-forward network holds 59.5 % of an encoder block's parameters but only
# 42.5 % of a decoder block's, whose second attention module (cross-attention) has as many
# parameters as the first. The LayerNorms are a rounding error.
#
# ## 11. Post-LN and pre-LN
#
# The paper normalises **after** the residual addition: post-LN. GPT-2 (Radford et al., 2019) moved
# the LayerNorm "to the input of each sub-block" and added one more LayerNorm "after the final
# self-attention block"; most large language models since have kept this **pre-LN** arrangement. Its
# defining properties:
# - each sublayer reads a **normalised copy** of the residual stream, made by its own LayerNorm;
# - the residual stream itself is **never normalised inside a block**: each sublayer's (dropped-out)
#   output is added to it as it is, so from the embeddings to the last block the stream is a plain sum,
#   an identity path; a stack of pre-LN blocks therefore ends with one LayerNorm of its own, after the
#   last block.
#
# Why change it? In post-LN every path from the loss back to a lower block passes through the
# LayerNorms of all the blocks above it. Xiong et al. (2020, "On Layer Normalization in the Transformer
# Architecture") showed that at initialisation the post-LN gradients of the parameters near the output
# are large, so a large learning rate at the start makes training unstable; they offer this as the
# reason the paper's recipe needs a **learning-rate warm-up** (4000 steps in the paper; you will meet it
# in stage 5), which the paper itself does not explain. Their analysis bounds the gradient of the last
# block's feed-forward weights at initialisation by a quantity that does not depend on the number of
# blocks $L$ for post-LN, and shrinks like $1/\sqrt{L}$ for pre-LN; in their experiments pre-LN
# Transformers trained without the warm-up. This course builds and trains the paper's post-LN model.
#
# ## 12. Exercise: `PreLNEncoderBlock`
#
# Write the `forward` of a pre-LN encoder block. The contract:
# - **the parts of your `EncoderBlock`** (the given constructor is the same): `self.norm1` belongs to
#   self-attention, `self.norm2` to the feed-forward network, `self.dropout` acts on each sublayer's
#   output, as in the paper's section 5.4;
# - **inputs and output** as for `EncoderBlock.forward`: `x` `(batch, src_len, d_model)` and the
#   padding `mask` → a tensor shaped like `x`, left in `x` for the given last line;
# - **the properties above**, which the checks test: in eval mode the block's output is its input plus
#   what its two sublayers returned, and nothing else happens to the stream; its values equal those of
#   PyTorch's own pre-LN layer, `nn.TransformerEncoderLayer(..., norm_first=True)`, with the same
#   weights; dropout acts on each sublayer's output; training can run through it, as through your
#   `EncoderBlock`. The block has no final LayerNorm: that one belongs
#   after the last block of a stack (the experiment of section 13 adds it).

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Follow the stream `x` through the block. It is only ever *added to*. What gets added is a sublayer's
# output (dropped out), and what that sublayer reads is its LayerNorm applied to the stream as it is
# at that point.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# Everything is `(batch, src_len, d_model)`. Self-attention reads the same normalised tensor as its
# queries, keys and values; the feed-forward network reads `self.norm2` of the stream *after* the
# self-attention's output has been added to it.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# normed = self.norm1(x)
# x = x + self.dropout(self.self_attn(normed, normed, normed, mask))
# x = x + self.dropout(self.feed_forward(self.norm2(x)))
# ```
#
# </details>

# %% solution="block_pre_ln"
#| include transformer_course.reference.blocks:PreLNEncoderBlock

# %% [markdown]
# ### Check your work
# The checks plug the reference attention and feed-forward network into your block, as before. The
# stream check records what the two sublayers return and feeds an input far from mean 0 and spread 1;
# the next compares with PyTorch's layer, given the same weights.

# %% tests="block_pre_ln_shape" points=1
assert check.pre_ln_shape(PreLNEncoderBlock)

# %% tests="block_pre_ln_stream" points=2
assert check.pre_ln_stream(PreLNEncoderBlock)

# %% tests="block_pre_ln_torch" points=2
assert check.pre_ln_matches_torch(PreLNEncoderBlock)

# %% tests="block_pre_ln_dropout_place" points=1
assert check.pre_ln_dropout_placement(PreLNEncoderBlock)

# %% tests="block_pre_ln_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.pre_ln_stream(PreLNEncoderBlock, d_model=12, num_heads=3, d_ff=20, batch=3, seq_len=1)
assert check.pre_ln_matches_torch(PreLNEncoderBlock, d_model=24, num_heads=6, d_ff=40, batch=2, seq_len=9)
assert check.pre_ln_dropout_placement(PreLNEncoderBlock, d_model=8, num_heads=2, d_ff=16, batch=3, seq_len=5)
### END HIDDEN TESTS

# %% [markdown]
# ## 13. Gradients in the two arrangements
#
# The experiment stacks blocks, runs one untrained forward and backward pass with a random target,
# and measures how large the gradient of each block's parameters is. Your `EncoderBlock` makes the
# post-LN stack, your `PreLNEncoderBlock` the pre-LN stack (with its final LayerNorm). A third run
# of the pre-LN stack changes one thing: every `nn.LayerNorm` inside the blocks (the given constructor
# makes them) passes its input on *detached* (`Tensor.detach()`: the same values, no gradient through
# them), so the forward pass and the growing stream stay exactly as they are, but no gradient flows
# back through any sublayer. Each block's parameters then get gradient only along the residual path,
# from the loss straight down the stream.

# %%
def gradient_norm_per_block(block_class: type, num_layers: int, d_model: int = 64,
                            cut_sublayer_paths: bool = False) -> list[float]:
    """Gradient norm of each block's parameters at initialisation, averaged over 5 random stacks."""
    totals = torch.zeros(num_layers)
    for seed in range(5):
        torch.manual_seed(seed)
        blocks = nn.ModuleList([block_class(d_model, 4, 4 * d_model, 0.0) for _ in range(num_layers)])
        if cut_sublayer_paths:  # each LayerNorm in the blocks hands its input on without a gradient path
            for norm in (module for module in blocks.modules() if isinstance(module, nn.LayerNorm)):
                norm.register_forward_pre_hook(lambda module, args: (args[0].detach(),))
        final_norm = nn.LayerNorm(d_model) if block_class is PreLNEncoderBlock else nn.Identity()
        head = nn.Linear(d_model, 100)  # stand-in output layer over 100 "words"
        for parameter in [*blocks.parameters(), head.weight]:
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)  # the initialisation of stage 4
        x = torch.randn(16, 20, d_model)  # stand-in for embedded sentences
        for block in blocks:
            x = block(x, None)
        logits = head(final_norm(x))  # (16, 20, 100)
        words = torch.randint(100, (16, 20))  # stand-in labels: one "word" per position
        log_probabilities = logits.log_softmax(dim=-1)  # (16, 20, 100)
        (-log_probabilities.gather(-1, words.unsqueeze(-1)).mean()).backward()  # cross-entropy of the labels
        totals += torch.stack([torch.cat([p.grad.flatten() for p in b.parameters() if p.grad is not None]).norm()
                               for b in blocks])  # a parameter the loss never reached has no gradient: 0
    return (totals / 5).tolist()


# %%
for num_layers in (6, 12):
    post = gradient_norm_per_block(EncoderBlock, num_layers)
    pre = gradient_norm_per_block(PreLNEncoderBlock, num_layers)
    cut = gradient_norm_per_block(PreLNEncoderBlock, num_layers, cut_sublayer_paths=True)
    figures.plot_gradient_norms({f"post-LN, {num_layers} blocks": post, f"pre-LN, {num_layers} blocks": pre,
                                 "pre-LN, sublayer paths cut": cut})
    plt.show()
    print(f"{num_layers} blocks: top block / bottom block  post-LN {post[-1] / post[0]:.2f}, pre-LN "
          f"{pre[-1] / pre[0]:.2f}, pre-LN with the sublayer paths cut {cut[-1] / cut[0]:.2f};  "
          f"top block post-LN / pre-LN {post[-1] / pre[-1]:.1f}")
    largest = max(range(num_layers), key=lambda block: post[block])  # an index from 0; the figure counts from 1
    print(f"  post-LN: the largest gradient is at block {largest + 1}, {post[largest] / post[0]:.2f} × the bottom's")

# %% [markdown]
# **Reading the bars.** In the post-LN stacks the upper blocks get larger gradients than the lower
# ones: the printed top-to-bottom ratios are about 1.2 (6 blocks) and 1.6 (12 blocks), moderate at this
# size (in the 12-block stack the largest, about 1.8 times the bottom block's, sit at blocks 9 and 10,
# just below the top). In the pre-LN stacks it is the other way round (ratios about 0.6 and 0.5). The
# cut shows where the difference comes from, the paths through the sublayers: with them cut, the stream
# grows exactly as before, and the ratios turn to about 1.3 and 1.5. In a pre-LN stack the stream that
# block $\ell$ adds to is read by every sublayer above it, so block $\ell$ collects gradient along the
# residual path *and* through each of those sublayers; the lower the block, the more sublayers read what
# it added, and what the top block's feed-forward network adds is read by none. (How much each of those
# paths carries also depends on the stream's size, since each LayerNorm divides by it; the cut cannot
# separate the two.) This is one small setting: width 64, a random target, untrained. Shleifer et al.
# (2021, "NormFormer") report the same mismatch while pre-training pre-LN language models, with larger
# gradients in the early layers than in the later ones. The clearest difference is between the two
# arrangements: the top post-LN block gets about 2.5 times (6 blocks) and 3.7 times (12 blocks) the
# gradient of the top pre-LN block. Doubling the depth multiplied that factor by about 1.5 here. Xiong et
# al.'s bounds, which concern the last feed-forward weight rather than a whole block, would give $\sqrt{2}
# \approx 1.4$ with the post-LN gradient unchanged; here the post-LN one grew as well, so the closeness is
# not a confirmation. Larger gradients in the upper blocks are harmless with a tiny learning rate, and a
# warm-up gives exactly that in the first steps of training.
#
# ## Summary
# - The feed-forward network $\max(0, xW_1 + b_1)W_2 + b_2$ is one small MLP applied to every
#   position alone, width $d_{model} \to d_{ff} \to d_{model}$; it holds about two thirds of an
#   encoder block's parameters and half of a decoder block's.
# - A residual connection adds the sublayer's input to its output; without it a stack of attention
#   layers averages all positions into one, and Dong et al. (2021) proved that this collapse is
#   doubly exponential in the depth for attention alone.
# - LayerNorm normalises the $d_{model}$ features of each position to mean 0, variance 1, then applies
#   the learned $\gamma$, $\beta$; it never looks across the batch or across positions.
# - The paper's arrangement (post-LN): a residual connection around every sublayer, followed by that
#   sublayer's own LayerNorm; dropout on each sublayer's output before the addition.
# - Encoder block: self-attention with the source padding mask, then feed-forward.
#   Decoder block: masked self-attention with `dec_mask`; cross-attention with queries from the
#   decoder, keys and values from `enc_out` and `enc_mask`; then feed-forward.
# - Pre-LN normalises only what each sublayer reads and leaves the stream a plain sum, with one
#   LayerNorm after the last block. Its lower blocks get the larger gradients because they collect
#   gradient through every sublayer above them; Xiong et al. tie post-LN's large gradients near the
#   output to its need for a learning-rate warm-up.
#
# Next, stage 4 stacks these blocks, adds embeddings, positional encoding and the output layer, and
# builds the full encoder–decoder. The last cell lists every check of this notebook with `✔` or `✘`
# and its points. When you are done: *File → Download → Download .ipynb*, and hand in that file.

# %% [markdown]
# ## Questions: explain your reasoning
# The check cells grade your code; these questions grade your understanding, and your instructor
# reads them. Answer each one in the empty cell right below it (double-click the cell to write;
# formulas as `$...$` work), in a few sentences of your own. A good answer says *why*, with what
# you saw in this notebook; there is nothing to look up. The points are given in each question.

# %% [markdown]
# **Question 1 (2 points).** In section 4, the stack without residual connections still had a
# LayerNorm after every attention layer. A classmate argues: "LayerNorm rescales every position to
# mean 0 and variance 1, so it undoes the averaging, and the residual connection is not needed."
# Using sections 4 and 5, explain why the figure of section 4 contradicts them, and what the
# residual connection provides that LayerNorm cannot.

# %% [markdown] answer="block_q_residual" points=2
# **Model answer.** LayerNorm works on each position alone, with that position's own mean and
# variance; it shifts and rescales a vector but keeps its direction pattern (up to the shift), and
# two vectors that are (nearly) the same before it are (nearly) the same after it. It never compares
# positions, so it cannot bring back differences between positions that attention has averaged
# away: that is why the curve without residuals reaches a cosine similarity of 1 although every layer
# ends in a LayerNorm. The residual connection adds each position's *own* input to the attention
# output, so the information that distinguishes the positions survives every layer and attention
# only adds a correction. (It also gives the gradient a direct identity term,
# $\partial y/\partial x = I + \partial\,\mathrm{Sublayer}/\partial x$.)
#
# **Rubric.**
# - 1 point: LayerNorm acts per position (mean and variance of one vector), so it maps equal vectors
#   to equal vectors and cannot restore differences between positions; the figure shows similarity
#   1 despite the LayerNorms.
# - 1 point: the residual keeps each position's own input in the sum (attention adds a correction);
#   also accept the identity path for the gradient as the second reason, if the first is stated.

# %% [markdown]
# **Question 2 (3 points).** Suppose you had handed in the `forward` of your `PreLNEncoderBlock`
# (section 12) as the `forward` of your `EncoderBlock`. Go through the encoder's checks of section 8
# (shape, values, PyTorch comparison, padding, dropout modes, dropout placement): which would still
# pass, which would fail, and why? Then predict what the LayerNorm hook experiment after those checks
# would print if it recorded the *block's output* instead.

# %% [markdown] answer="block_q_preln" points=3
# **Model answer.** The shape check passes: every step keeps `(batch, src_len, d_model)`. The padding
# check passes too: pre-LN uses the same mask in the same attention and the same per-position
# LayerNorm and feed-forward network, so padding keys are still hidden and adding padding does not
# change the real positions. Both dropout checks pass: dropout is still applied only to each
# sublayer's output, so the block is deterministic in eval mode, random in training mode, and the
# dropout sits where the placement check looks for it. The value check and the PyTorch comparison
# fail: pre-LN is a different function of the same parameters, and `nn.TransformerEncoderLayer`
# computes post-LN by default (`norm_first=False`). These two checks are the only ones that tell
# the orders apart. The block's output would not be normalised: it is the input plus two
# corrections, so with the input of mean 2 and standard deviation 3 the output keeps roughly that
# mean and spread instead of mean 0, spread 1 per position; this is why a pre-LN stack needs a final
# LayerNorm.
#
# **Rubric.**
# - 1 point: shape, padding and both dropout checks pass (they test properties that pre-LN shares),
#   with a reason. Section 8 does not say how the placement check finds the dropout, so "placement
#   fails, because it compares training-mode outputs with the paper's block" also earns the point when
#   the rest is right.
# - 1 point: the value check and the PyTorch comparison fail, because pre-LN computes a different
#   function (PyTorch's layer is post-LN unless `norm_first=True`).
# - 1 point: the pre-LN output is not normalised per position (it keeps roughly the input's mean and
#   spread), hence the final LayerNorm.

# %% [markdown]
# **Question 3 (2 points).** Cross-attention uses only the source padding mask. A classmate adds a
# look-ahead mask to it "to be safe" in the decoder block. (a) What happens for the sentence pair of
# section 9 (`tgt_len = 6`, `src_len = 7`)? (b) What happens for a pair with `tgt_len == src_len`,
# and how would it hurt a German-to-English translation?

# %% [markdown] answer="block_q_cross" points=2
# **Model answer.** (a) A look-ahead mask of size 6 is `(1, 1, 6, 6)`, while the cross-attention
# scores are `(batch, heads, 6, 7)`: the last axes 6 and 7 do not broadcast, so the forward pass
# raises an error (and a look-ahead mask of size 7 would not fit the 6 queries). (b) With equal
# lengths the shapes fit and nothing complains, but target position $t$ may then read only source
# positions $0, \dots, t$. The source sentence is complete before translation starts, so looking at
# all of it leaks nothing from the future; hiding its end only removes information. Word order
# differs between the languages: German often puts the verb at the end of a clause, which the first
# English words need, so the translation gets worse, with no error to warn about.
#
# **Rubric.**
# - 1 point: for different lengths the masks do not broadcast against `(…, tgt_len, src_len)`: a
#   shape error. Also accept: a rectangular `tril(tgt_len, src_len)` mask runs silently and hides
#   source positions after $t$.
# - 1 point: for equal lengths it runs silently and hides the end of the source from early target
#   positions; the source is fully known, so the mask removes information without preventing any
#   leak (a word-order example, or "worse translations", earns the point).

# %%
check.summary()
