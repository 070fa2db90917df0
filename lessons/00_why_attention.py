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
# # Stage 0 — Why attention: the one-vector bottleneck and additive attention
#
# *Transformers from Scratch*: you will build the Transformer of Vaswani et al.,
# ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (2017), one stage at a time,
# and train it to translate German into English. This stage is **optional**: it comes before the
# Transformer and shows the problem attention was invented to solve.
#
# | stage | notebook |
# |---|---|
# | **0** (optional) | **why attention: the RNN bottleneck, additive attention** (this one) |
# | 1 | positional encoding |
# | 2 | scaled dot-product and multi-head attention, masks |
# | 3 | feed-forward, residual + LayerNorm, encoder and decoder blocks |
# | 4 | the full encoder–decoder |
# | 5 | training on Multi30k German→English |
# | 6 | greedy decoding, BLEU, attention heatmaps |
# | 7 (optional) | the key/value cache and beam search |
#
# **Working time:** about 1¾ hours if you are at ease with PyTorch, about 2½ hours if you are new to it or get
# stuck. That is reading (56 minutes at 150 words a minute without the folded hints, 75 at 100 words a minute
# with them, and the given code at 10 lines a minute), one exercise, two predictions and two written
# questions, 5 to 10 minutes of setting up (Colab, the setup cell, saving a copy), and about 4 minutes of
# computation on one CPU core, most of it the training of section 7. (Estimated by `scripts/working_time.py`
# in the course repository from the notebook's length and the measured run time of its cells, with assumptions
# it prints, not measurements of students: for example 150 or 100 words a minute, 5 or 10 minutes per exercise
# plus 2 or 4 per line you write, 10 or 20 per bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. explain how a recurrent encoder–decoder translates, and why squeezing a whole sentence into one
#    vector should hurt long sentences most;
# 2. test that on a measurement: BLEU by source-sentence length, with and without the bottleneck, and
#    say what the measurement can and cannot show;
# 3. write down additive attention, $e_{tj} = v^\top \tanh(W_q s_t + W_k h_j)$, and say what every
#    symbol means and what shape it has;
# 4. implement it: the score, the softmax over the source positions with padding getting exactly zero
#    weight, and the context vector;
# 5. train the same model with and without attention, compare them by sentence length, and read an
#    attention heatmap;
# 6. say what changes on the way from additive attention to the Transformer's scaled dot-product
#    attention, and why.
#
# **Before you start.** You need Python and PyTorch basics (tensors and their shapes, `nn.Module`, a
# training loop with an optimiser), softmax, and what a recurrent network does: it reads a sentence
# one token at a time and keeps a state vector. Nothing of the Transformer yet.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package),
# then the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is
# given and correct. After the exercise a few *check cells* test one property each: `✔` means it
# holds, a red `✘` block says what was expected and what came out, hints folded under it. A failing check
# does not stop the notebook: *Run all* always reaches the end, where the last cell lists every
# check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work (the
# grader also runs a few hidden ones with other sizes). Until you have written `AdditiveAttention`,
# the cells that use it say "skipped". Section 7 trains two small translation models on the CPU; it
# takes several minutes (the numbers we measured are printed beside yours), and a GPU is not needed.
#
# <!-- keep-and-hand-in -->

# %% readonly="setup"
#| setup

# %%
#| settings

# %%
import math
import time
from collections.abc import Callable  # noqa: F401  (used by the given build_seq2seq spliced below)
from dataclasses import replace

import matplotlib.pyplot as plt
import torch
from torch import nn

from transformer_course.checks import why_attention as check
from transformer_course.data.tokenize import Tokenizer
from transformer_course.reference import bottleneck_results
from transformer_course.reference.bottleneck import (
    LENGTH_BUCKETS,
    ExperimentConfig,
    bleu_by_length,
    bucket_of,
    held_out,
    prepare_experiment_data,
    train_seq2seq,
)
from transformer_course.reference.rnn import greedy_decode_rnn
from transformer_course.reference.training import collate
from transformer_course.reference.translation import TranslationData, translate_ids  # noqa: F401 (build_seq2seq)
from transformer_course.runtime import short_run
from transformer_course.visualisation import training as training_figures
from transformer_course.visualisation import why_attention as figures

# %% [markdown]
# ## 1. Translating through one vector
#
# Before the Transformer, neural machine translation used **recurrent neural networks** (RNNs) in an
# **encoder–decoder** (Sutskever, Vinyals and Le, 2014; Cho et al., 2014). The encoder reads the German
# sentence one token at a time. At each position $j$ it updates a **hidden state** $h_j$ from the
# previous state and the current word $x_j$:
#
# $$h_j = \mathrm{GRU}(x_j,\ h_{j-1})$$
#
# - $x_j$ — the embedding (a learned vector) of the $j$-th German token;
# - $h_j$ — the state after reading tokens $1..j$: a vector of fixed width that summarises them;
# - GRU — a *gated recurrent unit*, one common kind of RNN cell (an LSTM would do as well).
#
# When the encoder reaches the end, its last state has to describe the **whole sentence**. Call it the
# sentence vector $c$. The decoder starts from $c$ and writes English one token at a time; its state
# $s_t$, from which it predicts token $t$, is
#
# $$s_t = \mathrm{GRU}\big([y_{t-1};\ c],\ s_{t-1}\big), \qquad
#   p(y_t \mid y_{<t}, x) = \mathrm{softmax}\big(W_{out} \tanh(W_{comb}\,[s_t;\ c])\big)$$
#
# - $y_{t-1}$ — the embedding of the English token written last (`<bos>` at the start);
# - $[a;\ b]$ — the two vectors concatenated;
# - $W_{comb}$, $W_{out}$ — learned matrices that turn the state and $c$ into one score per English word.
#
# Everything the decoder ever learns about the German sentence has to pass through $c$: a vector of a
# few hundred numbers, **the same size for a 4-word sentence as for a 30-word one**, and the same
# vector at every step, whether the decoder is writing the first word or the twentieth. That is the
# **bottleneck**. The top half of the figure shows it; the bottom half shows the fix this notebook
# builds, attention, which hands the decoder a fresh mix of *all* the encoder's states at every step.

# %%
figures.plot_bottleneck("ein mann mit einem orangefarbenen hut".split(), "a man in an orange hat".split())
plt.show()

# %% [markdown]
# ## 2. The bottleneck, measured
#
# We trained such a model, without attention, for a few minutes on a CPU on a subset of the Multi30k
# German–English captions (section 6 shows its code, section 7 lets you repeat the run), then had it
# translate the 2,014 held-out sentences of the validation and test splits, which it never saw in
# training. We scored the translations with **BLEU**, grouped by the length of the German sentence.
# BLEU compares a translation with the human one by counting the word sequences (1 to 4 words) they
# share, from 0 to 100 (stage 6 explains it in detail).
#
# Watch the score fall as the German sentences get longer. Part of that fall is the bottleneck (the longer
# the sentence, the more of it must pass through one vector), part is that long sentences are harder for
# any model; section 8 sets a model without the bottleneck beside it. (Short sentences are not perfectly
# easy either, and BLEU is noisy on small groups, so read the trend, not each bar.)

# %%
print("measured with:", bottleneck_results.COMMAND)
print("on:", bottleneck_results.MACHINE)
print("settings:", bottleneck_results.CONFIG)
plain_quoted = bottleneck_results.RUNS["without attention"]
for label, result in plain_quoted["bleu"].items():
    print(f"{label:>6} German tokens: BLEU {result['bleu']:5.1f}  ({result['sentences']:,} sentences)")
print(f"training took {plain_quoted['cpu_minutes']:.1f} CPU minutes ({plain_quoted['wall_minutes']:.1f} minutes "
      "on the clock, on a machine shared with other jobs)")
figures.plot_bleu_by_length({"without attention (quoted)": plain_quoted["bleu"]},
                            title="The model without attention, by German sentence length")
plt.show()

# %% [markdown]
# ## 3. Additive attention
#
# Bahdanau, Cho and Bengio (2015, *Neural Machine Translation by Jointly Learning to Align and
# Translate*) let the decoder keep **all** encoder outputs $h_1, \dots, h_n$ and choose, at every target
# position $t$, which of them to read. In three steps:
#
# **1. Score** every source position $j$ against the decoder state $s_t$ with a small network:
#
# $$e_{tj} = v^\top \tanh\big(W_q\, s_t + W_k\, h_j\big)$$
#
# **2. Normalise** the scores over the source positions with a softmax, so the weights are positive and
# sum to 1:
#
# $$\alpha_{tj} = \frac{\exp(e_{tj})}{\sum_{k=1}^{n} \exp(e_{tk})}$$
#
# **3. Mix**: the context vector is the weighted sum of the encoder outputs:
#
# $$c_t = \sum_{j=1}^{n} \alpha_{tj}\, h_j$$
#
# - $s_t$ — the **query**: the decoder's state at target position $t$, `query_size` wide ("what am I
#   about to write?");
# - $h_j$ — the encoder's output at source position $j$, `key_size` wide ("what is here?"). It plays
#   two parts: projected by $W_k$ it is compared with the query (in the Transformer's words, $W_k h_j$
#   is the **key**), and as it is, unprojected, it is what gets mixed (the **value**);
# - $W_q$ (`attention_size` × `query_size`) and $W_k$ (`attention_size` × `key_size`) — learned
#   matrices that bring query and key into one space of width `attention_size`, where they are *added*
#   (hence "additive");
# - $\tanh$ — squashes each entry of the sum into $(-1, 1)$: this makes the score a one-hidden-layer
#   network of the pair, not a linear function;
# - $v$ — a learned vector (`attention_size` wide) that turns the hidden layer into one number, the
#   score $e_{tj}$;
# - $\alpha_{tj}$ — how much position $t$ reads from source token $j$; $c_t$ — what it reads, as wide as
#   an encoder state $h_j$ (`key_size`).
#
# **Padding.** Sentences in a batch are padded to the same length. A padded position is not a word, so
# it must get weight **exactly 0**, and the weights of the real tokens must still sum to 1. The mask is
# `True` at real tokens and has shape `(batch, k_len)`. How to get an exact 0 out of a softmax is yours
# to work out (the first hint after the exercise gives the idea).
#
# **Where $s_t$ comes from.** Bahdanau et al. score with the state *before* the step, $s_{t-1}$, and feed
# $c_t$ into the recurrence. Our decoder scores with the state *after* the step, $s_t$, and feeds $c_t$
# to the output layer (as Luong, Pham and Manning, 2015, did): the scoring function is the same, and during
# training the queries of all target positions can be scored at once. So a query has a length axis too.
#
# ### The contract: shapes
# | tensor | shape |
# |---|---|
# | `query` (the decoder states $s_t$) | `(batch, q_len, query_size)` |
# | `keys` (the encoder outputs $h_j$) | `(batch, k_len, key_size)` |
# | `mask` | `(batch, k_len)`, `True` at real tokens |
# | the scores $e_{tj}$, returned by `score` | `(batch, q_len, k_len)`, also when `q_len` is 1 |
# | the weights $\alpha_{tj}$ | `(batch, q_len, k_len)`, each query's weights sum to 1 |
# | the context vectors $c_t$ | `(batch, q_len, key_size)` |
#
# (The argument `keys` holds the encoder outputs $h_j$ themselves: `score` compares them with the
# queries through $W_k$, and `forward` mixes them, unprojected, as the values.)
#
# The one step to work out yourself: the projected queries have shape `(batch, q_len, attention_size)`
# and the projected keys `(batch, k_len, attention_size)`, yet the formula adds *every* query to *every*
# key. How do you make PyTorch form all `q_len × k_len` sums at once, without a loop? (The hints after
# the exercise help if you are stuck.)
#
# ### What goes wrong, and what it looks like
# The checks after the exercise report what they see; these are the symptoms we see every year:
# - each query's weights do not sum to 1 over the source positions;
# - padded positions get weight: all of it, some, or a tiny amount that is not exactly 0; or the rows no
#   longer sum to 1;
# - an error about sizes that do not match, raised where the mask meets the scores; or no error, but a
#   sentence hidden with another sentence's padding; or, with one query, weights of shape
#   `(batch, batch, k_len)`;
# - every query gets the same weights;
# - with one query, scores that have lost an axis;
# - a context of shape `(batch, q_len, k_len)`.
#
# <details><summary>The causes behind these symptoms (open this when a check fails and you are stuck)</summary>
#
# - the softmax over the wrong axis: then each query's weights do not sum to 1 over the source
#   positions; instead they sum to 1 down a column (over the queries) or across the batch;
# - the mask inverted (it is `True` at *real* tokens, so the padding gets all the weight), computed but
#   not kept (`masked_fill` returns a new tensor and leaves its input unchanged), applied after the
#   softmax (the rows then no longer sum to 1), or filled with 0 (the padding keeps real weight) or a
#   moderate number such as $-100$ (its weight is then tiny, but not always exactly 0);
# - the mask, `(batch, k_len)`, used as it is against scores `(batch, q_len, k_len)`: broadcasting
#   lines up the *last* axes, so `batch` meets `q_len`: a size-mismatch error, or, worse, no error
#   when the two sizes happen to be equal (the wrong sentence's mask) or when `q_len` is 1 (the result
#   silently grows to `(batch, batch, k_len)`);
# - `tanh` forgotten, or applied to each projection separately instead of to their sum: the score is
#   then a query part plus a key part, the softmax cancels the query part, and every query gets the
#   same weights;
# - every axis of size 1 removed at the end of `score`: with one query (translation, one word at a
#   time) `q_len` disappears too, and the scores lose an axis;
# - the context summed over the features instead of the source positions: it comes out
#   `(batch, q_len, k_len)` instead of `(batch, q_len, key_size)`.
#
# </details>

# %% [markdown]
# ## 4. Exercise: `AdditiveAttention`
#
# The constructor is given: the two projections `W_q` and `W_k` and the vector `v` (as a `Linear` layer
# with one output). Complete the two marked parts:
# 1. `score`: the scores $e$ for every (query, key) pair, shape `(batch, q_len, k_len)`;
# 2. `forward`: the given first line calls your `score`; from the scores, compute the weights
#    $\alpha$ and the context vectors $c$ of section 3 (padding gets weight exactly 0); the given
#    `return` hands back `context, weights`.
#
# <details><summary>Hint 1: the idea</summary>
#
# In `score`, project the queries with `W_q` and the keys with `W_k`; then give each of the two
# projections an extra axis of size 1 where the *other* one has its length, so that adding them
# broadcasts to every (query, key) pair. `tanh` of that sum, then `v`, gives one number per pair. In
# `forward`, push the scores of the padded positions far down before the softmax, take the softmax
# over the source positions, and average the keys with the weights.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# | tensor | shape |
# |---|---|
# | projected queries, with a size-1 key axis | `(batch, q_len, 1, attention_size)` |
# | projected keys, with a size-1 query axis | `(batch, 1, k_len, attention_size)` |
# | their sum, and its `tanh` | `(batch, q_len, k_len, attention_size)` |
# | after `v` | `(batch, q_len, k_len, 1)`: drop only the last axis |
# | the mask, made ready for the scores | `(batch, 1, k_len)`: the same for every query |
# | weights `(batch, q_len, k_len)` times keys `(batch, k_len, key_size)` | `(batch, q_len, key_size)` |
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# - `self.W_q(query).unsqueeze(2)` and `self.W_k(keys).unsqueeze(1)`; add them, then `torch.tanh`;
#   `self.v(...)` and `.squeeze(-1)` give the scores.
# - `scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)` (keep the result), then
#   `torch.softmax(..., dim=-1)`.
# - The context is a batched matrix product of the weights and the keys: `weights @ keys`.
#
# </details>

# %% solution="additive_attention"
#| include transformer_course.reference.additive_attention:AdditiveAttention

# %% [markdown]
# ### Check your work
# Each cell checks one property. Read the message of the first failing one: fix that, rerun the exercise
# cell, then rerun the checks. The checks of `forward` run it with the course's `score`, so a mistake in
# `score` is counted once, in the first two cells.

# %% tests="why_score_shape" points=1
assert check.score_shape(AdditiveAttention)

# %% tests="why_score_values" points=2
assert check.score_values(AdditiveAttention)

# %% tests="why_score_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.score_values(AdditiveAttention, batch=3, q_len=1, k_len=9, query_size=6, key_size=2, attention_size=5)
assert check.score_shape(AdditiveAttention, batch=1, q_len=4, k_len=2, query_size=3, key_size=8, attention_size=4)
### END HIDDEN TESTS

# %% tests="why_forward_shapes" points=1
assert check.forward_shapes(AdditiveAttention)

# %% tests="why_weights_values" points=2
assert check.weights_values(AdditiveAttention)

# %% tests="why_masked_zero" points=2
assert check.masked_padding_gets_zero(AdditiveAttention)

# %% tests="why_context_values" points=2
assert check.context_values(AdditiveAttention)

# %% tests="why_independent" points=1
assert check.sentences_are_independent(AdditiveAttention)

# %% tests="why_forward_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.weights_values(AdditiveAttention, batch=4, q_len=4, k_len=5, query_size=3, key_size=6, attention_size=7)
assert check.masked_padding_gets_zero(AdditiveAttention, batch=3, q_len=1, k_len=9, query_size=2, key_size=3,
                                      attention_size=4)
assert check.context_values(AdditiveAttention, batch=2, q_len=1, k_len=7, query_size=6, key_size=5, attention_size=3)
assert check.sentences_are_independent(AdditiveAttention, batch=4, q_len=3, k_len=8, query_size=5, key_size=2,
                                       attention_size=9)
### END HIDDEN TESTS

# %% [markdown]
# ### Predict, then run
# Work these out on paper before you run anything: each follows from the constructor and the formulas
# of section 3. Write your prediction after `return`: a number, or the arithmetic you worked out
# (such as `3 * 4`; `math` is allowed). A prediction is a value you work out, so the function may not
# call your module, torch or anything else of the notebook: the check refuses that. The check only
# looks at the form of your prediction and notes it: **it is scored when your notebook is graded**,
# and nothing in this notebook says whether it is right, so trying again tells you nothing. The cell
# after the checks shows the truth for *another* configuration (other sizes, another sentence): use
# it to test your method. The answer you are graded on is never printed.
#
# **Prediction 1 (1 point).** How many trainable numbers does
# `AdditiveAttention(query_size=6, key_size=8, attention_size=10)` hold, that is, what does
# `sum(p.numel() for p in module.parameters())` count? (Look at the given constructor.)

# %% solution="why_predict_parameters"
def predict_parameter_count() -> int:
    """Your prediction of the number of trainable parameters of AdditiveAttention(6, 8, 10)."""
    ### BEGIN SOLUTION
    return 10 * 6 + 10 * 8 + 10 * 1  # W_q, W_k and v, none with a bias
    ### END SOLUTION


# %% tests="why_predicted_parameters" points=1
assert check.predicted_parameter_count(predict_parameter_count)

# %% [markdown]
# **Prediction 2 (1 point).** Take the same module and set every entry of $v$ to zero. One query
# attends to a padded sentence of 8 positions: 5 real tokens, then 3 padding (`mask` is `True` five
# times, then `False` three times). What weight $\alpha$ does your `forward` give to the *first real*
# token?

# %% solution="why_predict_zero_v"
def predict_weight_with_zero_v() -> float:
    """Your prediction of the first real token's weight when v is all zeros (5 real tokens, 3 padding)."""
    ### BEGIN SOLUTION
    return 1 / (8 - 3)  # every score is 0: the softmax shares the weight equally among the real tokens
    ### END SOLUTION


# %% tests="why_predicted_zero_v" points=1
assert check.predicted_weight_with_zero_v(predict_weight_with_zero_v)

# %% [markdown]
# **The truth, for other sizes.** The cell below measures the same two things with your own
# `AdditiveAttention` on another configuration: a module with `query_size=4, key_size=5,
# attention_size=7`, and with $v = 0$ a sentence of 7 positions, 3 real tokens and 4 padding. Check
# that your method gives these numbers too; where it does not, find the step of your reasoning that
# went wrong. The weights come from *your* `forward`: trust them only once its checks above are green.

# %%
torch.manual_seed(0)
other = AdditiveAttention(query_size=4, key_size=5, attention_size=7)
print("trainable parameters:", sum(p.numel() for p in other.parameters()))
with torch.no_grad():
    other.v.weight.zero_()
    _, zero_v_weights = other(torch.randn(1, 1, 4), torch.randn(1, 7, 5), torch.tensor([[True] * 3 + [False] * 4]))
print("weights with v = 0:", [round(w, 4) for w in zero_v_weights[0, 0].tolist()])

# %% [markdown]
# **Your attention on one query.** An untrained `AdditiveAttention` (random weights), one decoder state as
# the query, and a padded German sentence as the keys. Left, the scores: the padded positions have
# scores too, and they can be large. Right, your weights: the padded positions get exactly 0, the real
# ones share 1. Training will make these weights meaningful.

# %%
torch.manual_seed(1)
tokens = Tokenizer("de")("Ein Hund rennt über die Wiese.") + ["<pad>"] * 3
toy_keys = torch.randn(1, len(tokens), 8)  # (batch=1, k_len, key_size=8)
toy_mask = torch.tensor([[token != "<pad>" for token in tokens]])  # (1, k_len), True at real tokens
toy_attention = AdditiveAttention(query_size=6, key_size=8, attention_size=12)
with torch.no_grad():
    toy_query = torch.randn(1, 1, 6)  # one decoder state: (batch=1, q_len=1, query_size=6)
    toy_scores = toy_attention.score(toy_query, toy_keys)  # (1, 1, k_len)
    toy_context, toy_weights = toy_attention(toy_query, toy_keys, toy_mask)
figures.plot_masked_softmax(toy_scores[0, 0], toy_weights[0, 0], tokens, toy_mask[0])
plt.show()
print(f"weights sum to {toy_weights.sum().item():.6f}; context {tuple(toy_context.shape)}")

# %% [markdown]
# ## 5. The data
#
# We translate Multi30k, the German–English image captions of stages 5 and 6 (stage 5 explains the data
# in detail). To keep training to minutes on a CPU we train on a random **subset** of the 29,000
# training pairs. The sentences are tokenised with spaCy's rule-based tokenisers and lowercased, every
# token gets an id from a vocabulary built on that subset (words seen fewer than twice become `<unk>`),
# and each sentence is framed by `<bos>` and `<eos>`; `prepare_experiment_data` does all of it.
#
# We evaluate on the 2,014 sentences of the validation and test splits together, grouped into
# **buckets by the length of the German sentence**, so that we can ask: *does quality drop as
# sentences get longer?* While the notebook is being autograded, a tiny model and a few hundred pairs
# keep everything to seconds; the numbers it then prints mean nothing.

# %%
CONFIG = ExperimentConfig()  # the settings of the run we quote: data subset, sizes, epochs, learning rate
MAX_STEPS, HELD_OUT_LIMIT = None, None  # None: every batch of an epoch, every held-out sentence
if short_run():  # while autograding: a tiny model, a few batches and 100 sentences, so it takes seconds
    CONFIG = replace(CONFIG, train_pairs=400, epochs=1, embedding_size=16, hidden_size=32, attention_size=16,
                     max_len=20)
    MAX_STEPS, HELD_OUT_LIMIT = 3, 100
    torch.set_num_threads(1)  # models this tiny run fastest on one CPU thread
print(CONFIG)

data = prepare_experiment_data(CONFIG)  # the training subset, val and test_2016_flickr, as ids
source_vocab, target_vocab, PAD_IDX = data.source_vocab, data.target_vocab, data.source_vocab.pad_idx
train_pairs = data.splits["train"]
print(f"{len(train_pairs):,} training pairs; vocabularies: German {len(source_vocab):,}, English {len(target_vocab):,}")

# %%
sources, references = held_out(data, HELD_OUT_LIMIT)
counts = {label: 0 for label, _, _ in LENGTH_BUCKETS}
for source in sources:
    counts[bucket_of(len(source) - 2)] += 1  # German tokens without <bos> and <eos>
for label, count in counts.items():
    print(f"{label:>6} German tokens: {count:5,} held-out sentences")

# %% [markdown]
# ## 6. The model (given)
#
# **The encoder** is a *bidirectional* GRU: one GRU reads the sentence left to right, a second one right
# to left, and their states at each position are concatenated. So `outputs[:, j]` describes token $j$
# together with what comes before *and* after it: from here on, $h_j$ is this concatenation, no longer the
# state after reading tokens $1..j$ of section 1 (Bahdanau et al. use the same bidirectional encoder). The
# sentence vector $c$ joins the final state of each
# direction (the left-to-right GRU after the last word, the right-to-left one after the first). Padding
# is skipped by *packing* the batch (`pack_padded_sequence`), so the final states belong to each
# sentence's real last token, not to a `<pad>`.

# %%
#| include transformer_course.reference.rnn:GRUEncoder

# %% [markdown]
# **The decoder** is a GRU over the English tokens. At every position it reads the previous token and the
# sentence vector, and its output layer sees the state $s_t$ together with a **context vector**. Read the
# `if`: without attention, the context is the sentence vector, the same for every position (the
# bottleneck). With attention, it is recomputed for every position from all of the encoder's outputs.
# That line is the only difference in the two models' code. (Their random starting weights differ too:
# the attention module is made first and draws from the same random stream.)
#
# During training the decoder reads the true English sentence shifted by one (*teacher forcing*, stage
# 5), so one call handles all positions at once; when translating, it is called one token at a time,
# carrying its `state` from step to step.

# %%
#| include transformer_course.reference.rnn:GRUDecoder

# %% [markdown]
# **The model** joins the two. `bridge` turns the sentence vector into the decoder's first state. The
# padding mask (`True` at real tokens) comes from the source ids, and `forward` keeps the attention
# weights of its last call in `attn_weights` for the heatmap at the end.

# %%
#| include transformer_course.reference.rnn:Seq2Seq

# %%
#| include transformer_course.reference.bottleneck:build_seq2seq

# %% [markdown]
# **One vector, whatever the length.** An untrained model, a short and a long German sentence: the
# encoder gives one vector per token, but the sentence vector has the same width for both.

# %%
torch.manual_seed(0)
plain = build_seq2seq(data, CONFIG)
german_tokenizer = Tokenizer("de")  # spaCy's rules for German, lowercased
for german in ("Ein Hund rennt.",
               "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt die Fenster eines hohen Hauses."):
    src = torch.tensor([source_vocab.encode(german_tokenizer(german))])  # (1, src_len)
    outputs, sentence, state, source_mask = plain.encode(src)
    print(f"{src.size(1) - 2:2d} German tokens -> outputs {tuple(outputs.shape)}, "
          f"sentence vector {tuple(sentence.shape)}")

# %% [markdown]
# ## 7. Train both models
#
# Two models, built with the same sizes from the same seed and trained on the same pairs for the same
# number of epochs: **without attention** (`build_seq2seq(data, CONFIG)`) and **with your attention**
# (`build_seq2seq(data, CONFIG, AdditiveAttention)`, which creates
# `AdditiveAttention(hidden_size, hidden_size, attention_size)`: queries are decoder states, keys are
# the bidirectional encoder's outputs, both `hidden_size` wide here; each encoder direction is
# `hidden_size // 2` wide, so their concatenation is `hidden_size`).
#
# The training loop is the standard one (stage 5 has you write it): for every batch, the cross-entropy
# of the predicted next tokens, ignoring padding; backpropagation; gradients clipped to norm 1; an Adam
# step. `train_seq2seq` runs it and records the loss of each epoch.
#
# One habit worth keeping: **run one batch through a new model before training it**. A bug in your code
# then shows in a second, not after minutes of training.
#
# This is the long cell: on a CPU it takes a few minutes per model. Our run needed about 1.5 to 2
# minutes of CPU time per model on one thread (printed below beside your times; our clock time was
# longer because the machine was busy with other jobs). On a GPU (*Runtime → Change runtime type* in
# Colab) it is faster. If you interrupt it, rerun it: it starts again from fresh models.

# %%
models: dict[str, nn.Module] = {}  # filled by the training cell
histories: dict[str, list[dict[str, float]]] = {}
torch.manual_seed(CONFIG.seed)
built = {"without attention": build_seq2seq(data, CONFIG).to(device)}
torch.manual_seed(CONFIG.seed)
built["with attention"] = build_seq2seq(data, CONFIG, AdditiveAttention).to(device)
probe = collate(train_pairs[:4], PAD_IDX).to(device)  # four sentence pairs as one padded batch
built["with attention"](probe.src, probe.tgt_in)  # one batch through the new model first: bugs show now
for name, model in built.items():
    print(f"training the model {name}: {sum(p.numel() for p in model.parameters()):,} parameters")
    started = time.perf_counter()
    histories[name] = train_seq2seq(model, train_pairs, CONFIG, device, max_steps=MAX_STEPS)
    models[name] = model
    losses = ", ".join(f"{record['train_loss']:.2f}" for record in histories[name])
    print(f"  {(time.perf_counter() - started) / 60:.1f} minutes; training loss per epoch: {losses}")
    ours = bottleneck_results.RUNS[name]
    print(f"  (our run: {ours['cpu_minutes']:.1f} CPU minutes on one thread, {ours['wall_minutes']:.1f} "
          "minutes on the clock of a busy shared machine)")

# %% [markdown]
# **The training curves.** Both losses fall; the model with attention usually ends lower, because it
# can look up the word it is translating instead of reconstructing it from one vector.

# %%
if histories:
    training_figures.plot_loss_curves({name: [record["train_loss"] for record in history]
                                       for name, history in histories.items()},
                                      title="Training loss per epoch, your runs")
    plt.show()
else:
    print("(train the models first: the cell above)")

# %% [markdown]
# ## 8. BLEU by sentence length: your models beside ours
#
# Greedy decoding (one word at a time, always the most likely one; stage 6 builds it for the
# Transformer) translates every held-out sentence, and BLEU is computed per length bucket. It takes a
# few seconds per model. Your numbers will not match ours exactly (another machine, other random
# draws), but the pattern should.

# %%
ours = {f"{name} (quoted)": run["bleu"] for name, run in bottleneck_results.RUNS.items()}
yours = {f"{name} (yours)": bleu_by_length(model, data, device, CONFIG.max_len, HELD_OUT_LIMIT)
         for name, model in models.items()}
labels = [label for label, _, _ in LENGTH_BUCKETS] + ["all"]
print(f"{'BLEU':28s}" + "".join(f"{label:>8s}" for label in labels))
for name, result in {**ours, **yours}.items():
    print(f"{name:28s}" + "".join(f"{result[label]['bleu']:8.1f}" if label in result else f"{'–':>8s}"
                                  for label in labels))
figures.plot_bleu_by_length({**ours, **yours}, title="BLEU by German sentence length: ours (hatched) and yours")
plt.show()

# %% [markdown]
# **Reading the bars.** Attention helps in every bucket, by roughly 9 to 12 BLEU points in the course's
# run (the gains are printed below). The ratio of the two models' BLEU grows as the sentences get
# longer, but a gain of about the same size over a baseline that falls would make it grow anyway, so
# the ratio alone does not show that long sentences gain more (in points, the longest bucket did not
# gain more than the others). What the bars do show: the model with attention keeps a larger share of
# its short-sentence quality (in the course's run, from the shortest to the longest bucket it loses
# about 30 %, the model that squeezes everything into one vector about 47 %). Both find the longest sentences
# harder: a longer sentence has more words to get
# wrong, and after a few minutes of training neither model is good. One seed and a few hundred
# sentences per bucket: read the trend, not each bar.

# %%
for name, result in {**ours, **yours}.items():
    if name.startswith("with attention"):
        plain_result = {**ours, **yours}[name.replace("with attention", "without attention")]
        ratios = "".join(f"{result[label]['bleu'] / plain_result[label]['bleu']:8.2f}" if plain_result[label]['bleu']
                         else f"{'(0)':>8s}" for label in labels)  # (0): the model without attention scored 0
        gains = "".join(f"{result[label]['bleu'] - plain_result[label]['bleu']:+8.1f}" for label in labels)
        print(f"{'BLEU with / without ' + name[len('with attention'):]:28s}{ratios}")
        print(f"{'BLEU with - without ' + name[len('with attention'):]:28s}{gains}")
        shortest, longest = labels[0], labels[-2]  # the first and the last length bucket
        for model_result, words in ((result, "with attention"), (plain_result, "without attention")):
            if model_result[shortest]["bleu"]:  # a model that scored 0 on short sentences has nothing to lose
                lost = 1 - model_result[longest]["bleu"] / model_result[shortest]["bleu"]
                print(f"  {words}: {lost:.0%} of its BLEU lost from the shortest to the longest bucket")

# %% [markdown]
# ## 9. Where the decoder looks
#
# Now the translations themselves, from both models, for one of the long held-out sentences. Then the
# attention weights of the model with attention: row $t$ is the English token it wrote, column $j$ the
# German token, and the colour is $\alpha_{tj}$. To get the weights we run the model once more on its
# own translation with teacher forcing: it then computes the weights it used while translating (the
# same, up to rounding in the last digits).
# Hover over a cell to read the two tokens and the weight.

# %%
long_ones = [index for index, source in enumerate(sources) if len(source) - 2 >= 15]
example = long_ones[3] if len(long_ones) > 3 else 0
example_src = torch.tensor([sources[example]])  # (1, src_len)
print("German    :", " ".join(source_vocab.decode(sources[example])))
print("reference :", references[example])
for name, model in models.items():
    translation = translate_ids(model, [sources[example]], source_vocab, target_vocab, device, CONFIG.max_len,
                                decode=greedy_decode_rnn)[0]
    print(f"{name:18s}:", " ".join(translation))
if not models:
    print("(train the models first: section 7)")

# %%
if "with attention" in models:
    attentive = models["with attention"].eval()
    ys = greedy_decode_rnn(attentive, example_src.to(device), PAD_IDX, target_vocab.bos_idx,
                           target_vocab.eos_idx, CONFIG.max_len)  # (1, out_len): <bos> ... <eos>
    with torch.no_grad():
        attentive(example_src.to(device), ys)  # run again on what it wrote, to keep its attention weights
    produced = [target_vocab.itos[i] for i in ys[0, 1:].tolist()]  # the tokens it wrote, <eos> included
    german = [source_vocab.itos[i] for i in sources[example]]
    alignment = attentive.attn_weights[0, :len(produced)]  # (out_len - 1, src_len): row t wrote produced[t]
    figures.plot_alignment_interactive(alignment, german, produced,
                                       title="Attention of your model: English written (rows), German read").show()
else:
    print("(train the models first: section 7)")

# %% [markdown]
# Read it like this: a bright cell in row "dog" and column "hund" means that while writing "dog" the
# decoder read mostly the encoder's vector at "hund". For these captions German and English word order
# are similar, so the bright cells run roughly down a diagonal, and they jump where the orders differ
# (a German verb at the end of a clause, say). Nobody told the model which words correspond: it learned
# the alignment from the translation loss alone. After a few minutes of training some rows already put
# nearly all their weight on one German word, while others spread it over several; longer training
# sharpens more of them.
#
# ## 10. From additive attention to scaled dot-product attention
#
# The Transformer keeps the three steps (score, softmax over the keys, weighted sum) and changes almost
# everything around them. Stage 2 has you build its version:
#
# | | additive (this notebook) | scaled dot product (stage 2) |
# |---|---|---|
# | score of a pair | $v^\top \tanh(W_q s + W_k h)$: a small network | $q \cdot k / \sqrt{d_k}$: a dot product |
# | all pairs at once | an `attention_size`-wide vector for every pair, all in memory | one matrix product $QK^\top$ |
# | widths | query and key may differ | $q$ and $k$ both $d_k$ wide |
# | values | the states $h_j$ themselves (the keys are $W_k h_j$) | a projection of their own, $V = XW^V$ |
# | scaling | none: $\tanh$ bounds each hidden entry, unlike $q \cdot k$ | $1/\sqrt{d_k}$, else the softmax saturates |
# | queries and keys | decoder states and RNN outputs | any tokens: the sentence itself (*self*-attention) |
# | how many | one attention | several heads in parallel (*multi-head*) |
#
# **Why the change?** Speed, mostly. Matrix products are the operation GPUs and CPUs run fastest, and
# the dot product never holds a vector per (query, key) pair in memory. Luong et al.
# (2015) found the plain dot-product score to work well in their experiments, and their version of
# the additive score ("concat") not to;
# Vaswani et al. (2017) note that additive attention beats the *unscaled* dot product when $d_k$ is
# large and suspect that the dot products then grow large and push the softmax into regions where
# its gradients are tiny, hence the $1/\sqrt{d_k}$ (stage 2 shows it
# with numbers). The cell
# below times both scores on the same random queries and keys, on your machine.

# %%
torch.manual_seed(0)
width, lengths = (64, (8, 16)) if short_run() else (256, (8, 16, 32, 64, 128))
additive = AdditiveAttention(width, width, width)
scores = {"additive: v^T tanh(W_q q + W_k k)": additive.score,
          "scaled dot product: q·k/√d": lambda q, k: torch.einsum("bqd,bkd->bqk", q, k) / math.sqrt(width)}
milliseconds: dict[str, list[float]] = {name: [] for name in scores}
for length in lengths:
    q, k = torch.randn(32, length, width), torch.randn(32, length, width)  # (batch, length, width)
    for name, score in scores.items():
        with torch.no_grad():
            started = time.perf_counter()
            for _ in range(3):
                score(q, k)  # (32, length, length)
        milliseconds[name].append((time.perf_counter() - started) / 3 * 1000)
for name, values in milliseconds.items():
    print(f"{name:36s}" + "  ".join(f"{value:8.2f} ms" for value in values))
figures.plot_score_cost(lengths, milliseconds)
plt.show()

# %% [markdown]
# **And the RNN?** Attention fixed the bottleneck, but the encoder and decoder were still RNNs: token
# $j$ can only be processed after token $j-1$, so a sentence of 30 tokens takes 30 steps one after
# another, however many cores you have. The Transformer's answer is in its paper's title, *Attention Is
# All You Need*: drop the recurrence and let attention relate every token to every other one directly
# (self-attention), all positions in parallel. But then nothing tells the model in which *order* the
# words came: an RNN knew it by construction, attention alone does not. That is **stage 1: positional
# encoding**.
#
# ## Summary
# - An RNN encoder–decoder squeezes the source sentence into one fixed-size vector; quality drops as
#   sentences get longer (BLEU by length shows it).
# - Additive attention scores every source position for every target position,
#   $e_{tj} = v^\top\tanh(W_q s_t + W_k h_j)$, turns the scores into weights with a softmax over the
#   source positions (padding gets exactly 0), and reads
#   $c_t = \sum_j \alpha_{tj} h_j$, a fresh context for every target position.
# - Shapes: scores and weights `(batch, q_len, k_len)`, context `(batch, q_len, key_size)`, the mask
#   `(batch, k_len)`.
# - The Transformer keeps score → softmax → weighted sum, but scores with a scaled dot product, gives the
#   values a learned projection of their own (here they are the unprojected $h_j$), uses several heads,
#   and drops the RNN, which is why it needs positional encodings.
#
# Next, stage 1: positional encoding. The last cell lists every check of this notebook with `✔` or
# `✘` and its points. When you are done: *File → Download → Download .ipynb*, and hand in that file.

# %% [markdown]
# ## Questions: explain your reasoning
# The check cells grade your code; these questions grade your understanding, and your instructor
# reads them. Answer each one in the empty cell right below it (double-click the cell to write;
# formulas as `$...$` work), in a few sentences of your own. A good answer says *why*, with what
# you saw in this notebook; there is nothing to look up. The points are given in each question.

# %% [markdown]
# **Question 1 (3 points).** Two moments in your attentive decoder, translating a German sentence of
# 20 real tokens (no padding). At one step its weights are spread evenly, each $\alpha_{tj} = 1/20$;
# at another, one weight is almost 1 and the others almost 0. Say what the context vector $c_t$ holds
# in each case. If the weights stayed evenly spread at *every* step, how would the model compare with
# the model without attention, and why would that hurt more on long sentences than on short ones?

# %% [markdown] answer="why_q_uniform" points=3
# **Model answer.** With even weights the context is the plain average of the 20 encoder outputs,
# $c_t = \frac{1}{20}\sum_j h_j$: a summary of the whole sentence in which each token's vector counts
# for a twentieth. With one weight near 1 at position $j$, the context is almost exactly $h_j$: the
# encoder's vector for that one token (which, from the bidirectional encoder, also describes its
# neighbours), read directly. If the weights stayed evenly spread at every step, $c_t$ would be the
# same average at every step, whatever word the decoder is writing: one fixed-size vector for the
# whole sentence, as in the model without attention (an average of the token vectors instead of the
# last states, but the same bottleneck). The longer the sentence, the more vectors share that one
# average (each counts for $1/n$), so a single word's information is diluted more; attention helps
# because it can learn to concentrate its weight on the few tokens it is translating now.
#
# **Rubric.**
# - 1 point: even weights give the average of the encoder outputs, each weighted $1/20$.
# - 1 point: a weight near 1 at $j$ gives (almost) $h_j$, that token's own encoder vector.
# - 1 point: always-even weights give the same context at every step, a fixed-size summary like the
#   sentence vector of the model without attention; either the dilution by $1/n$ or the fixed size
#   for any length explains why long sentences suffer more.

# %% [markdown]
# **Question 2 (2 points).** Your `forward` turns the scores $e_{tj}$ into weights with a softmax
# over the source positions. Why not use the raw scores as the weights directly, and why not read
# only the one source position with the highest score (an argmax)? Say what each alternative would
# break.

# %% [markdown] answer="why_q_softmax" points=2
# **Model answer.** The softmax makes each target position's weights positive and sum to 1 over the
# real source tokens, with exactly 0 on the padding (its score was set to $-10^9$ first). The
# context $c_t$ is then a weighted average of encoder outputs: it has the scale of one $h_j$,
# whatever the sentence length and however large the scores are. Raw scores can be negative and of
# any size, and the context would be a sum of as many terms as the sentence has words, so its scale
# would change from one sentence to the next; and the padding would not be hidden: its $-10^9$
# would multiply its vector instead of removing it. An argmax
# would read exactly one encoder output, but it is a hard choice: a small change of the scores does
# not change it, so its gradient with respect to the scores is zero and no training signal reaches
# $W_q$, $W_k$ and $v$; the model could never learn where to look. The softmax is a smooth version of
# that choice: the loss can move weight step by step towards the useful words (that is how the
# alignment of section 9 was learned without anyone marking which words correspond), and it can
# share the weight among several words when one English word needs them.
#
# **Rubric.**
# - 1 point: the softmax gives positive weights summing to 1 (padding exactly 0), so the context is
#   an average on a fixed scale for any length; raw scores can be negative and do not sum to 1, so
#   their weighted sum changes scale with the length (either this or the padding no longer being
#   hidden).
# - 1 point: an argmax has no useful gradient, so attention could not be learned from the
#   translation loss; the softmax is a differentiable, soft selection (and can mix several words).

# %%
check.summary()
