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
# # Stage 7 — Fast and better decoding: the key/value cache and beam search
#
# *Transformers from Scratch*: you build the Transformer of Vaswani et al.,
# ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (2017), one stage at a time.
# This stage is **optional**: it comes after the six stages of the Transformer and makes the
# decoding of stage 6 faster and its translations better.
#
# | stage | notebook |
# |---|---|
# | 0 (optional) | why attention: the RNN bottleneck, additive attention |
# | 1 | positional encoding |
# | 2 | scaled dot-product and multi-head attention, masks |
# | 3 | feed-forward, residual + LayerNorm, encoder and decoder blocks |
# | 4 | the full encoder–decoder |
# | 5 | training on Multi30k German→English |
# | 6 | greedy decoding, BLEU, attention heatmaps |
# | **7** (optional) | **the key/value cache and beam search** (this one) |
#
# **Working time:** about 3¼ hours if you are at ease with PyTorch, about 5¾ hours if you are new to it or get
# stuck. That is reading (69 minutes at 150 words a minute without the folded hints, 96 at 100 words a minute
# with them, and the given code at 10 lines a minute), four exercises, one bug hunt, three predictions and two
# written questions, 5 to 10 minutes of setting up (Colab, the setup cell, saving a copy), and, with the quick
# setting below, 27 seconds of CPU time on one thread (the wall time of *Run all* on a busy 2-core machine is given
# under *Quick mode*). (Estimated by `scripts/working_time.py` in the course repository from the
# notebook's length and the measured run time of its cells, with assumptions it prints, not measurements of
# students: for example 150 or 100 words a minute, 5 or 10 minutes per exercise plus 2 or 4 per line you
# write, 10 or 20 per bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. explain why the greedy decoding of stage 6 repeats work, and which results stay the same from one
#    step to the next (and why: the look-ahead mask);
# 2. implement a key/value cache: cross-attention keys and values computed once per sentence,
#    self-attention keys and values appended one position per step, and a decoder step that computes only
#    the newest position, with the weights of the model you built in stage 4;
# 3. show that cached decoding computes the same logits (up to rounding) and so writes the same tokens,
#    and measure what it saves;
# 4. explain beam search, the log-probability of a sentence, and why beam search needs a length penalty;
# 5. implement batched beam search in which every hypothesis ends at its own `<eos>`, and check that a
#    beam of one is greedy decoding;
# 6. compare greedy decoding and beam search in BLEU with an honest protocol: settings chosen on the
#    validation set, the score reported on the test set.
#
# **Before you start.** You need stage 6's greedy decoding (its loop and masks), stage 2's multi-head
# attention (queries, keys, values, heads) and log-probabilities.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package), then
# the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is given and
# correct, apart from the bug hunt's code, which says so. After each exercise a few *check cells* test
# one property each: `✔` means it holds, a red `✘` block says what was expected and what came out,
# hints folded under it. A failing check does not stop the notebook: *Run all* always reaches the end, where the
# last cell lists every check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work (the grader
# also runs a few hidden ones with other sizes). The model classes come from the course package
# (`transformer_course.reference`): they are the stage-4 architecture you wrote, so a bug left in an
# earlier notebook cannot break this one.
#
# **Quick mode.** Sections 9 and 10 decode test sentences with the pretrained model, three ways (stage 6's
# greedy decoding, yours with the cache, beam search). The cell under the imports sets `QUICK = True`:
# they then decode the first 100 test sentences, and *Run all* took 7.7 minutes on the course's 2-core
# machine while other work ran on it (load average about 10; 2.2 minutes of CPU time, the threads of
# PyTorch added up, which inflates it when they wait for each other). Set `QUICK = False`
# once, when your code passes its checks, to measure on all 1,000: *Run all* then took 37 minutes on the
# same busy machine (10 minutes of CPU time). (Measured with `python scripts/benchmark.py --notebook
# 07_fast_and_better_decoding` in the course repository, which runs the notebook top to bottom both ways
# on a 2-core CPU.) A GPU is faster but not needed.
#
# <!-- keep-and-hand-in -->

# %% readonly="setup"
#| setup

# %%
#| settings

# %%
import math  # noqa: F401  (used by the given code spliced below)
import time
from dataclasses import dataclass, field  # noqa: F401  (KVCache below)
from functools import partial

import matplotlib.pyplot as plt
import torch
from torch import nn  # noqa: F401  (type hints of the code below)

from transformer_course.checks import fast_decoding as check
from transformer_course.reference import (
    Transformer,
    make_source_mask,
    make_target_mask,
    scaled_dot_product_attention,  # noqa: F401  (used by attend below)
)
from transformer_course.reference import fast_decoding_results as measured  # scripts/benchmark.py's figures
from transformer_course.reference.beam_search import sequence_log_probs
from transformer_course.reference.checkpoint import load, pretrained_path
from transformer_course.reference.decoding import greedy_decode
from transformer_course.reference.translation import corpus_bleu, prepare_data, translate_ids
from transformer_course.runtime import short_run
from transformer_course.visualisation import fast_decoding as figures

# %%
QUICK = True  # True while you work: sections 9 and 10 on 100 test sentences; False: on all 1,000 (see the top)

# %% [markdown]
# ## 1. Where stage 6 spends its time
#
# Greedy decoding in stage 6 called the whole decoder at every step on everything written so far:
# at step $t$ (counted from 0, as the checks count) the input `ys` holds $t + 1$ tokens (`<bos>` and the
# $t$ words written so far), and the decoder computes a
# vector for every one of them, in every layer, although only the last position's logits are used.
# A translation of $n$ tokens therefore costs
#
# $$1 + 2 + \dots + n = \frac{n(n+1)}{2} \text{ position-computations instead of } n .$$
#
# For a 20-token caption that is 210 instead of 20. (Self-attention inside each of those is itself
# proportional to the prefix length, so the true cost of stage-6 decoding grows even faster than $n^2$.)
#
# **Why the repeated work is the same work.** The decoder's self-attention uses the look-ahead mask: the
# vector at position $j$ is computed from the tokens $0, \dots, j$ only. Appending token $t$ cannot change
# anything at positions $j < t$, in any layer. The cell below checks this on a small model with random
# weights: the decoder is run on a prefix of 5 tokens and on the same prefix with a 6th token; the first
# 5 rows of its output do not change.

# %%
torch.manual_seed(0)
small = Transformer(20, 20, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_seq_length=50, dropout=0.0).eval()
src = torch.randint(4, 20, (1, 7))  # (1, src_len): one German sentence of random ids
ys = torch.cat([torch.tensor([[1]]), torch.randint(4, 20, (1, 5))], dim=1)  # <bos> + 5 words: (1, 6)
src_mask = make_source_mask(src, 3)
with torch.no_grad():
    enc_out = small.encoder(src, src_mask)
    five = small.decoder(ys[:, :5], enc_out, src_mask, make_target_mask(ys[:, :5], 3))  # (1, 5, vocab)
    six = small.decoder(ys, enc_out, src_mask, make_target_mask(ys, 3))  # (1, 6, vocab)
print("largest change in the first 5 positions after appending a 6th token:",
      f"{(six[:, :5] - five).abs().max().item():.2e}")

# %% [markdown]
# The difference is 0, or a rounding difference around $10^{-7}$ on some hardware (the same sums
# computed in another order). Every step of stage 6 recomputes, for all earlier positions, numbers it
# already had. The figure shows which
# positions each step computes: the whole triangle without a cache, only the diagonal with one.

# %%
figures.plot_recomputation(steps=8)
plt.show()

# %% [markdown]
# ## 2. What a step needs from the past: keys and values
#
# Follow the new position $t$ through one decoder layer (the `DecoderBlock` of stage 3):
#
# 1. **Masked self-attention.** Its query is $q_t = x_t W_q$, and it attends to the keys and values of
#    positions $0, \dots, t$:
#    $$\operatorname{head}(x_t) = \operatorname{softmax}\!\Big(\frac{q_t\,[k_0; \dots; k_t]^\top}{\sqrt{d_k}}\Big)\,
#      [v_0; \dots; v_t], \qquad k_j = x_j W_k,\quad v_j = x_j W_v$$
#    - $x_j$ — the vector of position $j$ entering this layer; it never changes once computed (section 1);
#    - $k_j, v_j$ — its key and value; $[k_0; \dots; k_t]$ stacks them into a $(t+1) \times d_k$ matrix;
#    - so the keys and values of positions $0, \dots, t-1$ can be **kept** from earlier steps; only
#      $k_t, v_t$ are new. No look-ahead mask is needed: the cache holds no future positions.
# 2. **Cross-attention.** Its keys and values are $K = \text{enc\_out}\, W_k$ and $V = \text{enc\_out}\, W_v$
#    of the layer's `cross_attn`: the encoder output never changes while a sentence is translated, so they
#    are computed **once per sentence**. Only the query $x_t W_q$ is new.
# 3. **Feed-forward, residuals, LayerNorm** act on each position alone: they run on position $t$ only.
#
# So each decoder layer keeps a **key/value cache**: the self-attention keys and values of every position
# decoded so far, `(batch, heads, steps, d_k)`, growing by one position per step, and the cross-attention
# keys and values, `(batch, heads, src_len, d_k)`, fixed. (Only keys and values: old queries are never
# used again.) A step then costs the same at position 50 as at position 1, apart from attending over a
# longer cache (and copying it into a tensor one position longer). What it costs is
# state kept from step to step: for the pretrained model (3 layers, $d_\text{model} = 256$) a batch of
# 256 sentences at step 30 keeps about 11.8 million numbers (47 MB in float32) of self-attention cache.
# Stage 6's decoder computes as many keys and values at that step, and throws them away after it; beam
# search keeps one cache row per hypothesis, so its cache is beam-size times larger and is reordered at
# every step.

# %%
figures.plot_cache_contents(position=5, src_len=7)
plt.show()

# %% [markdown]
# **The given building blocks.** We do not change the modules you built in stages 2–6: the cached step
# is new code that uses their weights. `KVCache` holds the four lists (one entry per decoder layer) and the
# source mask; `cache.steps` is the number of positions cached, which is the position of the next token.
# `project_keys_values(attention, memory)` computes the keys and values a `MultiHeadAttention` would
# compute from `memory`; `attend(attention, x, K, V, mask)` is the rest of its forward pass: the queries
# of `x`, scaled dot-product attention over `K`, `V`, the heads combined, `W_o`.

# %%
#| include transformer_course.reference.kv_cache:KVCache

# %%
#| include transformer_course.reference.kv_cache:project_keys_values


#| include transformer_course.reference.kv_cache:attend

# %% [markdown]
# ## 3. Exercise: `start_cache`
#
# The cache is made once per batch of sentences, before the first step. Nothing has been decoded yet, so
# its self-attention part is empty (the given lines make those entries); what you add is the part that
# section 2 showed can be prepared in advance, because it never changes while the batch is decoded.
#
# **The contract.** `start_cache(model, enc_out, src_mask)` returns a `KVCache` whose four lists hold one
# tensor per decoder layer, layer 0 first: `self_keys[i]`, `self_values[i]` `(batch, heads, 0, d_k)` and
# `cross_keys[i]`, `cross_values[i]` `(batch, heads, src_len, d_k)`.
#
# **The properties the checks test.** Each list has one entry per decoder layer; no position is cached
# yet (`cache.steps` is 0); and `cross_keys[i]`, `cross_values[i]` are exactly the keys and values that
# layer `i`'s cross-attention would use for this `enc_out`, so that no decoder step ever has to look at
# `enc_out` again. What a mistake looks like: an entry of another shape, a list one entry too short or too
# long, or cross entries that equal the keys of another layer, or of another attention of the same layer.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Cross-attention's keys and values are the encoder output passed through that attention's own key and
# value projections, split into heads. One of the given building blocks does exactly that for any
# `MultiHeadAttention` and any memory tensor.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# `enc_out` is `(batch, src_len, d_model)`; each projection keeps that shape, and splitting into heads
# gives `(batch, heads, src_len, d_k)` with `d_k = d_model / heads`. One key tensor and one value tensor
# per layer: after the loop each cross list has `num_layers` entries.
#
# </details>

# %% solution="start_cache"
#| include transformer_course.reference.kv_cache:start_cache

# %% tests="fast_cache_starts_empty" points=1
assert check.cache_starts_empty(start_cache)

# %% tests="fast_cache_cross_kv" points=2
assert check.cache_cross_keys_values(start_cache)

# %% tests="fast_cache_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.cache_starts_empty(start_cache, num_layers=3, num_heads=2, d_model=12, src_len=5, batch=2, seed=4)
assert check.cache_cross_keys_values(start_cache, num_layers=3, num_heads=2, d_model=12, src_len=5, batch=2, seed=4)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Exercise: `decoder_step`
#
# `decoder_step(model, cache, tokens)` runs the decoder for **one** new position per sentence: `tokens`
# `(batch, 1)` holds the newest token of each sentence, which sits at position `position = cache.steps`.
# It must give the numbers that `model.decoder` gives at the last position of the whole prefix (section 1
# says why that is possible) for every sentence still being written (after a sentence's `<eos>`, its prefix
# holds `<pad>`s, which the full decoder's target mask hides and the cache keeps: the logits of such a row
# differ, and decoding never uses them), with the weights of the model you built in stages 2–4, while computing
# nothing the cache already holds. `Decoder.forward` and `DecoderBlock.forward` of stages 3–4 compute the
# same thing for every position at once: your step computes it for the newest one, with the attention
# parts of section 2.
#
# **The contract.** `tokens` `(batch, 1)` `torch.long`; returns the next-token logits `(batch, vocab)`;
# after the call every `cache.self_keys[i]` and `cache.self_values[i]` is one position longer,
# `(batch, heads, position + 1, d_k)`, with the new position's keys and values last, and the cross entries
# are unchanged. The modules are reached as `decoder = model.decoder`: `decoder.embedding`,
# `decoder.d_model`, `decoder.positional_encoding` (your module of stage 1), `decoder.layers` (each with
# `self_attn`, `cross_attn`, `feed_forward`, `norm1`, `norm2`, `norm3`) and `decoder.pred_layer`; the given
# `project_keys_values` and `attend` do the attention. Decoding runs in eval mode, where dropout does
# nothing, so the step leaves dropout out.
#
# **The properties the checks test.** Step by step over a prefix, the logits equal the full decoder's at
# the prefix's last position, on a batch whose sources are padded; each step makes every layer's
# self-attention cache exactly one position longer; and a step reads the cross-attention keys and values
# from the cache and projects only the new position, never the encoder output or earlier tokens.
#
# ### What you may see, and what it tells you
# Each line is an observation a check can report; what usually causes it is in the last folded hint.
# - Step 0's logits match the full decoder's, and every later step's differ.
# - Logits already differ at step 0, with no error raised.
# - After a step the cache holds as many positions as before it.
# - An error when the new keys and values meet the cache (sizes that do not match).
# - The logits match on an unpadded batch and differ on a padded one.
# - The logits match, but the checks count projections of the encoder output at every step.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Write `DecoderBlock.forward` of stage 3 again with two changes: the self-attention keys and values come
# from the cache (after you have added the new position to it), and the cross-attention keys and values
# are read from the cache instead of being computed from the encoder output. `attend` is everything
# `MultiHeadAttention.forward` does after the keys and values are known. Dropout is left out.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# `x` stays `(batch, 1, d_model)` through every layer. The new keys and values are `(batch, heads, 1, d_k)`;
# the cache before the step is `(batch, heads, position, d_k)` and after it `(batch, heads, position + 1,
# d_k)`. The self-attention weights of the new position are `(batch, heads, 1, position + 1)`, the
# cross-attention weights `(batch, heads, 1, src_len)`. The output layer sees `(batch, d_model)` and gives
# `(batch, vocab)`.
#
# </details>
#
# <details><summary>Hint 3: what each observation usually means</summary>
#
# - *Step 0 right, later steps wrong*: either the new token got the position signal of position 0 (the
#   positional-encoding module numbers the positions of its own input, which here is one token long: add
#   row `position` of its table yourself), or the new position attended to itself alone instead of to
#   every position in the cache.
# - *Wrong at step 0, no error*: the new position attended to the cache before its own keys and values were
#   in it (position $t$ attends to positions $0, \dots, t$, itself included; over the empty cache of the
#   first step every head's output is all zeros, and the attention returns only the bias of `W_o`).
# - *The cache does not grow*: `torch.cat` makes a new tensor, and the cache keeps only what is assigned
#   back to `cache.self_keys[i]` and `cache.self_values[i]`.
# - *An error when joining*: the cache's axes are `(batch, heads, steps, d_k)`; the positions are axis 2.
# - *Wrong only on a padded batch*: cross-attention must not look at padded source positions; the cache
#   holds their mask.
# - *The encoder output projected at every step*: the cross-attention keys and values were computed again
#   instead of read from `cache.cross_keys[i]` and `cache.cross_values[i]`.
#
# </details>

# %% solution="decoder_step"
#| include transformer_course.reference.kv_cache:decoder_step

# %% [markdown]
# ### Check your work
# The checks build a small Transformer with random weights, run your `decoder_step` once per token of a
# prefix (starting from the reference `start_cache`, so a bug in your `start_cache` cannot hide one here)
# and compare with the full decoder on the whole prefix. Forward hooks on the projections count how
# often they run and on how many positions.

# %% tests="fast_step_logits" points=1
assert check.step_returns_logits(decoder_step)

# %% tests="fast_step_matches" points=3
assert check.step_matches_full_decoder(decoder_step)

# %% tests="fast_step_cache_grows" points=2
assert check.step_cache_grows_by_one(decoder_step)

# %% tests="fast_step_reuses" points=2
assert check.step_reuses_cross_keys_values(decoder_step)

# %% tests="fast_step_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.step_matches_full_decoder(decoder_step, steps=9, num_layers=3, num_heads=2, d_model=12, d_ff=24, seed=5)
assert check.step_cache_grows_by_one(decoder_step, steps=6, num_layers=1, num_heads=8, batch=2, seed=6)
assert check.step_reuses_cross_keys_values(decoder_step, steps=3, num_layers=3, seed=7)
### END HIDDEN TESTS

# %% [markdown]
# **Prediction 1 (1 point).** Predict, then run: work this out on paper before you run anything, and
# write your prediction after `return`: a number, or the arithmetic you worked out (`math` is
# allowed). A prediction is a value you work out, so the function may not call your code, torch or
# anything else of the notebook: the check refuses that. The check only looks at the form of your
# prediction and notes it: **it is scored when your notebook is graded**, and nothing in this notebook
# says whether it is right, so trying again tells you nothing. The cell after the check shows the
# truth for a model of *another* shape: use it to test your method. The answer you are graded on is
# never printed. The same holds for Predictions 2 and 3 below.
#
# The pretrained model of section 9 has 3 decoder layers with 8 heads each.
# It translates **one** German sentence of 9 tokens. After `start_cache` and 5 calls of `decoder_step`,
# how many key and value vectors (each $d_k$ numbers long; keys and values both counted, all layers and
# heads) does the **self-attention** part of the cache hold?

# %% solution="fast_predict_cached_vectors"
def predict_cached_vectors() -> int:
    """Your prediction of the self-attention key and value vectors cached after 5 steps (3 layers, 8 heads)."""
    ### BEGIN SOLUTION
    return 2 * 3 * 8 * 5  # (keys, values) * layers * heads * positions
    ### END SOLUTION


# %% tests="fast_predicted_cached_vectors" points=1
assert check.predicted_cached_vectors(predict_cached_vectors)

# %% [markdown]
# **The truth, for another shape.** The cell runs your `start_cache` and 7 steps of your `decoder_step` on
# a model of 2 decoder layers with 4 heads (random weights) for one sentence of 6 tokens, and counts the
# key and value vectors of each part of the cache. Check that your method gives these numbers too.

# %%
torch.manual_seed(0)
shaped = Transformer(20, 20, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_seq_length=50, dropout=0.0)
source = torch.randint(4, 20, (1, 6))  # (1, 6): one sentence of 6 tokens
with torch.no_grad():
    source_mask = make_source_mask(source, 3)
    kv = start_cache(shaped.eval(), shaped.encoder(source, source_mask), source_mask)
    for token in (1, 5, 6, 7, 8, 9, 10):  # <bos> and six words
        decoder_step(shaped, kv, torch.tensor([[token]]))
vectors = {part: sum(t.shape[0] * t.shape[1] * t.shape[2] for t in getattr(kv, part))
           for part in ("self_keys", "self_values", "cross_keys", "cross_values")}
print("key and value vectors: self-attention", vectors["self_keys"] + vectors["self_values"],
      " cross-attention", vectors["cross_keys"] + vectors["cross_values"])

# %% [markdown]
# ## 5. Exercise, a bug hunt: `cached_greedy_decode`
#
# Greedy decoding with the cache takes the same arguments and returns the same tensor as stage 6's
# `greedy_decode`: `(batch, out_len)` ids starting with `<bos>`, padded after each sentence's `<eos>`.
# It encodes the source and starts the cache once; then each step calls `decoder_step` with the cache
# and uses the next-token logits it returns. A finished sentence still goes through the step (its rows
# are part of the batch tensors) and whatever it predicts is replaced by `<pad>`, exactly as in stage 6.
# Its translations must be stage 6's, token for token: section 9 measures what the cache saves on the
# pretrained model.
#
# This time the loop is written for you, by a classmate who ported stage 6's `greedy_decode` to the cache,
# and it has **one realistic mistake**. On short sentences it runs, and its output reads like English; on a
# longer one it stops with an error. The pretrained model of stage 6 is loaded first, with the test set;
# the cell after the loop translates a few test sentences with stage 6's `greedy_decode` and with the
# classmate's loop. Compare the two, read the checks below, then find the line and fix it in place. The
# checks run the loop with the course's own `start_cache` and `decoder_step` in place of yours (a mistake
# there is counted by their own checks above, once); they compare its tokens with stage 6's greedy
# decoding on small random models.

# %%
model, source_vocab, target_vocab, metadata = load(pretrained_path(), Transformer, device=device)
data = prepare_data(splits=("test_2016_flickr",), vocabs=(source_vocab, target_vocab))
test_sources = [source for source, _ in data.splits["test_2016_flickr"]]
test_references = data.references["test_2016_flickr"]
test_german = data.sources["test_2016_flickr"]
special = (source_vocab.pad_idx, target_vocab.bos_idx, target_vocab.eos_idx)  # pad, bos, eos for the decoders


def translate_with(decode, sources: list[list[int]], batch_size: int = 256) -> list[list[str]]:
    """English tokens for encoded German sentences, decoded with `decode` (greedy_decode's signature)."""
    return translate_ids(model, sources, source_vocab, target_vocab, device, max_len=80, batch_size=batch_size,
                         decode=decode)


# %% [markdown]
# <details><summary>Hint 1: read the symptom</summary>
#
# How do the classmate's translations differ from stage 6's, and what do the checks report about the cache
# after each step? After step $t$ (counting from 0), how many positions should the cache hold?
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# `decoder_step` adds one position to every layer's self-attention cache for each token it is handed. How
# many tokens per sentence does the loop hand it at its third step, and what does the cache already hold
# by then?
#
# </details>

# %% solution="cached_greedy_decode"
#| bug: cache, ys[:, -1:])  # (batch, vocab): only the newest token goes in => cache, ys)  # (batch, vocab)
#| include transformer_course.reference.kv_cache:cached_greedy_decode

# %% [markdown]
# Five short test sentences and a longer one, each translated alone by stage 6's `greedy_decode` (no
# cache) and by `cached_greedy_decode`. The loop runs here with the course's own `start_cache` and
# `decoder_step` in place of yours, as the checks run it (`check.with_course_parts`), so what you see is
# the loop's doing, however you wrote your parts. The two must write the same words.

# %%
classmates_loop = check.with_course_parts(cached_greedy_decode)  # with the course's start_cache, decoder_step
words = {"stage 6": 0, "cached": 0}
for index in (0, 4, 8, 23, 30, 65):
    src = torch.tensor([test_sources[index]], device=device)  # (1, src_len): one sentence, no padding
    print(f"[{index}] German : {test_german[index]}")
    for name, decode in (("stage 6", greedy_decode), ("cached", classmates_loop)):
        try:
            tokens = target_vocab.decode(decode(model, src, *special, 80)[0].tolist())
        except RuntimeError as error:  # the classmate's loop may stop with an error: show it, carry on
            print(f"     {name:7}: stopped with an error: {error}")
            continue
        words[name] += len(tokens)
        print(f"     {name:7}: {' '.join(tokens)}")
print(f"\nwords written: {words['stage 6']} by stage 6's greedy_decode, {words['cached']} by cached_greedy_decode")

# %% tests="fast_greedy_matches" points=2
assert check.cached_greedy_matches_greedy(cached_greedy_decode, bug_hunt=True)

# %% tests="fast_greedy_padded" points=2
assert check.cached_greedy_matches_greedy_padded(cached_greedy_decode, bug_hunt=True)

# %% tests="fast_greedy_uses_cache" points=2
assert check.cached_greedy_uses_the_cache(cached_greedy_decode, bug_hunt=True)

# %% tests="fast_greedy_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.cached_greedy_matches_greedy_padded(cached_greedy_decode, seed=3, eos_bias=2.0, max_len=12, batch=4)
assert check.cached_greedy_matches_greedy(cached_greedy_decode, num_layers=3, num_heads=2, d_model=12, seed=1,
                                          batch=2, max_len=7)
assert check.cached_greedy_uses_the_cache(cached_greedy_decode, num_layers=1, seed=4, max_len=5)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Beam search
#
# The model gives a probability to every sentence $y = (y_1, \dots, y_n)$, the last token $y_n$ being
# `<eos>`: the product of its steps, or, in logarithms (a sum is easier to handle than a product of
# many small numbers),
#
# $$\log P(y \mid x) = \sum_{t=1}^{n} \log P\big(y_t \mid y_0, \dots, y_{t-1},\, x\big),
#   \qquad y_0 = \langle\text{bos}\rangle .$$
#
# Each term is at most 0, so no token raises the total. Greedy decoding maximises each term in turn.
# That does not maximise the sum: a word that wins one step can lead into a sentence whose later steps are
# all unlikely. Searching every sentence is impossible ($|V|^n$ of them), so **beam search** keeps the $k$
# best *prefixes* (the beam; $k$ is the beam size):
#
# 1. start with one hypothesis, `<bos>`, score 0;
# 2. at each step extend every hypothesis by every token of the vocabulary: $k \cdot |V|$ candidates, each
#    scored with its parent's score plus the token's log-probability;
# 3. keep the $k$ best candidates (they may come from any parents: one good hypothesis can have two
#    surviving children while another has none);
# 4. stop when every hypothesis has ended with `<eos>`, or after `max_len` steps; answer with the best.
#
# With $k = 1$ this is greedy decoding. The toy model below (a table of next-word probabilities given the
# previous word) shows the difference: greedy takes "the" (0.5 beats 0.4), but the best sentence starts
# with "a". A beam of 2 keeps "a" alive long enough to find it.

# %%
toy_model = {  # previous word -> probability of each next word
    "<bos>": {"the": 0.5, "a": 0.4, "<eos>": 0.1},
    "the": {"dog": 0.45, "cat": 0.4, "<eos>": 0.15},
    "a": {"cat": 0.9, "dog": 0.1},
    "dog": {"<eos>": 0.7, "runs": 0.3},
    "cat": {"<eos>": 0.8, "runs": 0.2},
    "runs": {"<eos>": 1.0},
}


def toy_beam_search(model: dict, beam_size: int, max_len: int = 4) -> tuple[tuple[str, ...], float, list]:
    """Beam search on the toy model, with probabilities and no length penalty: (best words, probability,
    the new candidates of every step as (words, probability, kept))."""
    beam, steps = [((), 1.0)], []  # hypotheses: (words so far, probability)
    for _ in range(max_len):
        finished = [(words, p) for words, p in beam if words and words[-1] == "<eos>"]  # they stay as they are
        new = [((*words, word), p * q) for words, p in beam if (words, p) not in finished
               for word, q in model[words[-1] if words else "<bos>"].items()]
        beam = sorted(finished + new, key=lambda hypothesis: -hypothesis[1])[:beam_size]
        steps.append([(words, p, (words, p) in beam) for words, p in new])
        if all(words[-1] == "<eos>" for words, _ in beam):
            break
    return *beam[0], steps


# %%
for beam_size in (1, 2):
    words, probability, steps = toy_beam_search(toy_model, beam_size)
    print(f"beam size {beam_size}: {' '.join(words):18} probability {probability:.3f}")
figures.plot_beam_tree(steps, title="Beam search on the toy model, beam size 2")
plt.show()

# %% [markdown]
# ### The length penalty
#
# Because every token lowers the log-probability, a plain sum favours short sentences: the beam fills with
# hypotheses that said `<eos>` early, and the translation drops details. The usual remedy (Wu et al. 2016,
# Google's neural machine translation system) ranks a hypothesis by its score divided by a *length penalty*
# (Wu et al. also add a coverage penalty; the Transformer paper and this course use the length penalty only):
#
# $$\text{rank}(y) = \frac{\log P(y \mid x)}{\mathrm{lp}(n)}, \qquad
#   \mathrm{lp}(n) = \Big(\frac{5 + n}{6}\Big)^{\alpha}$$
#
# - $n$ — the number of tokens generated, `<eos>` included (not `<bos>`);
# - $\alpha \ge 0$ — how strongly length is favoured: $\alpha = 0$ gives $\mathrm{lp} = 1$, the plain sum;
#   $\alpha = 1$ divides by a factor that grows linearly with the length; the Transformer paper used
#   $\alpha = 0.6$; the course's benchmark picks $\alpha$ on the validation set (section 10);
# - $\mathrm{lp}(1) = 1$ for every $\alpha$. The constant 5 flattens the penalty at short lengths: with
#   $\alpha = 1$, going from 1 to 2 tokens raises $\mathrm{lp}$ from 1 to $7/6$, where the plain
#   $n^\alpha$ would double it. Between two long outputs the ratio of their penalties,
#   $\big((5 + n_1)/(5 + n_2)\big)^\alpha$, is close to that of $n^\alpha$: the 5 matters for short ones.
#
# The score is negative, so dividing it by $\mathrm{lp}(n) > 1$ brings it closer to 0: longer hypotheses
# get more help. Which $\alpha$ and which beam size are best is measured on the **validation** set; the test
# set is used once, for the final number (choosing on the test set would flatter the result).

# %%
figures.plot_length_penalty()
plt.show()

# %%
#| include transformer_course.reference.beam_search:length_penalty

# %% [markdown]
# ### Predict, then run
# Work these out on paper before you run anything. Write your prediction after `return` (a number, the
# arithmetic you worked out, or one of the choices as text); as with Prediction 1, the check notes it and
# it is scored when your notebook is graded, and the cell after the check shows the truth for other cases.
#
# **Prediction 2 (1 point).** Two finished hypotheses of one sentence: "A" has 10 tokens (with `<eos>`)
# and $\log P = -5.0$; "B" has 4 tokens and $\log P = -3.5$. With $\alpha = 1$, which one does the
# ranking $\log P / \mathrm{lp}(n)$ put first? Return `"A"` or `"B"`.

# %% solution="fast_predict_penalty_choice"
def predict_penalty_choice() -> str:
    """Your prediction: "A" (10 tokens, log P = -5.0) or "B" (4 tokens, log P = -3.5), with alpha = 1."""
    ### BEGIN SOLUTION
    return "A"  # -5.0 / (15/6) = -2.0 beats -3.5 / (9/6) = -2.33
    ### END SOLUTION


# %% tests="fast_predicted_penalty_choice" points=1
assert check.predicted_penalty_choice(predict_penalty_choice)

# %% [markdown]
# **The truth, for two other hypotheses**, from the given `length_penalty`, for four values of $\alpha$:
# "C" has 12 tokens and $\log P = -7.0$, "D" has 3 tokens and $\log P = -3.0$. Check that your method
# picks the same ones.

# %%
for alpha in (0.0, 0.6, 1.0, 1.5):
    ranks = {name: log_p / length_penalty(torch.tensor(n), alpha).item() for name, n, log_p in
             (("C", 12, -7.0), ("D", 3, -3.0))}
    print(f"alpha {alpha}: C {ranks['C']:.3f}, D {ranks['D']:.3f} -> {max(ranks, key=ranks.get)} first")

# %% [markdown]
# ### Ending: `<eos>` for each hypothesis
#
# Hypotheses end at different steps. In this course a hypothesis that has said `<eos>` **stays in the beam**:
# at every later step its only candidate is itself, extended by `<pad>` at no cost (log-probability 0, so
# its score and its length do not change). It competes with the live hypotheses through its ranking score
# $\text{score}/\mathrm{lp}(n)$, and the search stops once all $k$ hypotheses of every sentence have ended
# (or after `max_len` steps). The answer is the hypothesis with the best ranking score.
# Libraries such as fairseq and Hugging Face's `generate` do it another way: they set a finished
# hypothesis aside and keep $k$ live ones, so the live beam never shrinks. Both are beam search; on
# the same model they can give different translations.
#
# ### Batched: `batch × beam` rows
#
# A batch of $B$ sentences with beam size $k$ becomes $B \cdot k$ rows for the decoder: row $b \cdot k + j$
# is hypothesis $j$ of sentence $b$ (`repeat_interleave` copies each sentence $k$ times, cross-attention keys
# and values included). The bookkeeping lives in `(batch, beam)` tensors: `scores` (total log-probability),
# `lengths` (tokens generated) and `finished`. At the start only hypothesis 0 is live (score 0); the others
# get $-\infty$, or the first step would keep $k$ copies of the same best word.
#
# **Choosing the best entries of a table: flat indices.** To pick the $k$ best of *all* candidates of a
# sentence, whichever hypothesis they extend, flatten its `(beam, vocab)` block into one row of
# `beam · vocab` entries. Entry $(r, c)$ of a table with $C$ columns lands at flat index $i = r \cdot C + c$;
# the way back from $i$ to $(r, c)$ is yours to work out from that. PyTorch's `topk(k, dim)` returns the
# $k$ largest values along an axis and their indices. The cell numbers the entries of a toy block of
# 3 rows × 4 columns the way `flatten` lays them out.

# %%
table = torch.tensor([[0.1, 0.7, 0.2, 0.0], [0.5, 0.3, 0.9, 0.4], [0.6, 0.8, 0.05, 0.2]])  # (3, 4)
print("flat index of every entry (row r, column c):")
print(torch.arange(table.numel()).view(3, 4))
print("flattened:", table.flatten().tolist())  # (12,): row 0, then row 1, then row 2

# %% [markdown]
# ### What goes wrong, and what it looks like
# - beams that jump between unrelated words, and a final choice no better than greedy's;
# - a sentence that loses its finished hypothesis, or one that goes on after `<eos>`;
# - tokens that make no sense after their hypothesis;
# - a hypothesis whose history is another's;
# - sentence 0 right and the others wrong;
# - a preference for hypotheses that have already ended.
#
# <details><summary>The causes behind these symptoms (open this when a check fails and you are stuck)</summary>
#
# In the same order: candidates ranked by their last token alone, or by raw logits (which are not
# log-probabilities and do not add up); a finished hypothesis not kept, or not kept as it is; the flat
# index split the wrong way round into parent and token; the new hypotheses not given their parents'
# rows of the tokens so far, of the cache, of the finished flags and of the lengths; a parent's row taken
# within sentence 0's block of rows; the length penalty taken at the parent's length, where a live
# candidate has one token more.
#
# </details>

# %% [markdown]
# ## 7. Exercise: `select_beams`
#
# One step of the search for a whole batch, on tensors. Besides the beam size, $\alpha$ and the id of
# `<pad>`, `select_beams` (its signature is in the cell below) receives, for `batch` sentences of `beam`
# hypotheses each:
#
# - `scores` `(batch, beam)` float: each hypothesis's total log-probability so far ($-\infty$ for an empty slot);
# - `log_probs` `(batch, beam, vocab)` float: its next-token log-probabilities;
# - `finished` `(batch, beam)` bool: it has said `<eos>`; `lengths` `(batch, beam)` long: tokens it has generated.
#
# It scores every candidate by the rules of section 6: a live hypothesis of score $s$ extended by token $w$
# is a candidate of score $s + \log P(w)$, one token longer; a finished hypothesis has exactly one
# candidate, itself extended by `pad_idx`, with its score and length unchanged (every other token of a
# finished hypothesis is impossible, $-\infty$). Candidates are ranked by their score divided by the
# `length_penalty` of their own length, and the `beam_size` best of each sentence survive, taken over all
# `beam × vocab` candidates of the sentence together (section 6's index arithmetic).
#
# **The contract.** Return `(new_scores, parents, tokens)`, each `(batch, beam_size)`, best candidate first:
# the surviving candidates' plain total log-probabilities (not divided by the penalty), the beam index
# (`torch.long`, $0 \dots$ `beam - 1`) of the hypothesis each one extends, and its new token (`torch.long`).

# %% solution="select_beams"
#| include transformer_course.reference.beam_search:select_beams

# %% tests="fast_select_top" points=2
assert check.select_beams_top_candidates(select_beams)

# %% tests="fast_select_finished" points=2
assert check.select_beams_keeps_finished(select_beams)

# %% tests="fast_select_penalty" points=2
assert check.select_beams_length_penalty(select_beams)

# %% tests="fast_select_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.select_beams_top_candidates(select_beams, state=(((-0.3, -0.4, -5.0),), ((False, False, False),),
                                                              ((4, 4, 4),), 0.6, 11))
assert check.select_beams_keeps_finished(select_beams, state=(((-0.2, -0.1, -0.7), (-1.0, -1.1, -9.0)),
                                                              ((False, True, True), (True, True, False)),
                                                              ((3, 1, 2), (5, 5, 4)), 0.0, 12))
assert check.select_beams_length_penalty(select_beams, state=(((-2.2, -2.5, -1.9), (-3.0, -1.0, -2.0)),
                                                              ((False, True, False), (False, False, True)),
                                                              ((8, 3, 6), (4, 4, 2)), 0.8, 13))
### END HIDDEN TESTS

# %% [markdown]
# **Prediction 3 (1 point).** One sentence is searched with a beam of 4 over a target vocabulary of
# 6,000 tokens. `select_beams` flattens the sentence's `(beam, vocab)` candidate scores into one row,
# and `topk` names flat index 13,217 as the best candidate. Which token (its id in the vocabulary) does
# that candidate append? (It also has a parent hypothesis; only the token is graded.)

# %% solution="fast_predict_candidates"
def predict_flat_index_token() -> int:
    """Your prediction of the token id that flat index 13,217 stands for (beam 4, vocabulary 6,000)."""
    ### BEGIN SOLUTION
    return 13_217 - 2 * 6_000  # two whole rows of 6,000 tokens come first: parent 2
    ### END SOLUTION


# %% tests="fast_predicted_candidates" points=1
assert check.predicted_flat_index_token(predict_flat_index_token)

# %% [markdown]
# **The truth, for another index.** The cell gives your `select_beams` one sentence searched with a beam
# of 3 over 4,000 tokens whose best candidate sits at flat index 9,876 of its `beam · vocab` row (every
# other candidate much worse) and prints the parent and the token it returns for it. Once the checks of
# `select_beams` above pass, check that your method gives the same.

# %%
flat_index, beam, vocab = 9_876, 3, 4_000
flat_log_probs = torch.full((1, beam * vocab), -20.0)  # one sentence, its candidates in one row
flat_log_probs[0, flat_index] = -0.1  # the best candidate
_, best_parent, best_token = select_beams(torch.zeros(1, beam), flat_log_probs.view(1, beam, vocab),
                                          torch.zeros(1, beam, dtype=torch.bool),
                                          torch.zeros(1, beam, dtype=torch.long), beam, 0.6, 3)
print(f"your select_beams: parent {best_parent[0, 0].item()}, token {best_token[0, 0].item()}")

# %% [markdown]
# ## 8. Exercise: `beam_search`
#
# The given lines set up `batch × beam` rows: the source repeated, the cache started once on the repeated
# encoder output, `ys` `(batch · beam, 1)` full of `<bos>`, and `scores`, `lengths`, `finished` as
# `(batch, beam)` tensors; `first_row` `(batch, 1)` holds $b \cdot k$, the first row of sentence $b$. Write the
# loop, at most `max_len` steps, with your `decoder_step` and your `select_beams`.
#
# **The contract.** Same arguments as `greedy_decode` plus `beam_size` and `alpha`. After the loop, `ys` is
# `(batch · beam, out_len)` with row $b \cdot k + j$ hypothesis $j$ of sentence $b$, and `scores`, `lengths`,
# `finished` describe those rows as `(batch, beam)` tensors. Every hypothesis is one that `select_beams`
# chose at its step, from the scores of section 6 (log-probabilities, not raw logits), and carries its
# parent's whole history: its row of `ys` with the new token appended, its rows of the self-attention cache
# (the given `KVCache` has a method for that), its `finished` and its length. A live parent's child is one
# token longer; a child is finished when its parent was or when its token is `<eos>`. The loop ends as soon
# as every hypothesis of every sentence has finished. The given last lines pick each sentence's best
# hypothesis by `scores / length_penalty(lengths, alpha)` and return `(batch, out_len)`.

# %% solution="beam_search"
#| include transformer_course.reference.beam_search:beam_search

# %% [markdown]
# ### Check your work
# Three checks use a hand-made *bigram* model: a course `Transformer` with no blocks, whose embedding and
# output layer are set so that the next-token distribution is a table indexed by the previous token (the toy
# model above, in tensors). There the right answer is known exactly. As in section 5, your loop runs with the
# course's own `start_cache`, `decoder_step` and `select_beams`. A failing check shows the token ids it
# expected and the ones your search returned; its first folded hint names the likely cause, and the second
# shows where the run first went wrong (the step, and what `select_beams` was given there or which rows of the
# cache the step began with, against what they should have been) together with code.

# %% tests="fast_beam_one_is_greedy" points=2
assert check.beam_size_one_is_greedy(beam_search)

# %% tests="fast_beam_finds_missed" points=2
assert check.beam_finds_what_greedy_misses(beam_search)

# %% tests="fast_beam_eos" points=2
assert check.beam_handles_eos_per_hypothesis(beam_search)

# %% tests="fast_beam_penalty" points=2
assert check.beam_final_choice_uses_length_penalty(beam_search)

# %% tests="fast_beam_matches" points=2
assert check.beam_matches_reference(beam_search)

# %% tests="fast_beam_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.beam_size_one_is_greedy(beam_search, alpha=1.0, seed=2, batch=4, max_len=12)
assert check.beam_finds_what_greedy_misses(beam_search, beam_size=3)
assert check.beam_final_choice_uses_length_penalty(beam_search, beam_size=3, max_len=6)
assert check.beam_matches_reference(beam_search, beam_size=4, alpha=1.0, seed=5, eos_bias=1.0, batch=3)
### END HIDDEN TESTS

# %% [markdown]
# ## 9. Faster: the cache on the pretrained model
#
# You have built both tools; now measure what they give on a real model: the pretrained model of stage 6,
# loaded in section 5, whose weights your cached step uses as they are.

# %% [markdown]
# **Same tokens, less time.** The cell translates test sentences in batches of 256, as stage 6 did, once
# with stage 6's `greedy_decode` and once with your `cached_greedy_decode`, and compares every token.
# With `QUICK = True` (the setting under the imports) it uses the first 100 test sentences, with
# `QUICK = False` all 1,000; while the grader runs this notebook, 8. (What the whole test set took on a
# 2-core CPU is printed at the end of this section, from the course's benchmark; a GPU is much faster.)

# %%
count = 8 if short_run() else 100 if QUICK else len(test_sources)
seconds = {}
translations = {}
for name, decode in (("with the cache", cached_greedy_decode), ("stage 6, no cache", greedy_decode)):
    started = time.perf_counter()
    translations[name] = translate_with(decode, test_sources[:count])
    seconds[name] = time.perf_counter() - started
    print(f"{name:>17}: {count / seconds[name]:6.1f} sentences/s")
same = sum(a == b for a, b in zip(*translations.values(), strict=True))
speedup = seconds["stage 6, no cache"] / seconds["with the cache"]
print(f"identical translations: {same} of {count}; the cache is {speedup:.1f}× faster")

# %% [markdown]
# **Time against length.** Now one sentence at a time, so that each sentence's time is its own: short
# and long test sentences (10 with `QUICK = True`, 63 without), each decoded by both. Without the cache the
# time per sentence grows faster than its length (every step redoes the prefix); with it, roughly in
# proportion to the length. Ten sentences timed on a busy machine can hide the trend: the 63 of
# `QUICK = False` show it.

# %%
def time_per_sentence(decode, indices: list[int]) -> tuple[list[int], list[float]]:
    """(tokens produced, seconds) for each sentence, decoded alone."""
    lengths, seconds = [], []
    for index in indices:
        src = torch.tensor([test_sources[index]], device=device)  # (1, src_len)
        started = time.perf_counter()
        ys = decode(model, src, *special, 80)
        seconds.append(time.perf_counter() - started)
        lengths.append(ys.size(1) - 1)
    return lengths, seconds


by_length = sorted(range(len(test_sources)), key=lambda i: len(test_sources[i]))
picked = by_length[:900:300] if short_run() else by_length[::100] if QUICK else by_length[::16]  # shortest up
lengths, with_cache = time_per_sentence(cached_greedy_decode, picked)
_, without_cache = time_per_sentence(greedy_decode, picked)
figures.plot_decode_times(lengths, without_cache, with_cache)
plt.show()
print(f"{len(picked)} sentences one at a time: {sum(without_cache):.1f} s without the cache, {sum(with_cache):.1f} s "
      f"with it ({sum(without_cache) / sum(with_cache):.1f}×)")

# %% [markdown]
# One sentence at a time, both decoders also pay a fixed cost per step (Python, launching many small
# operations), which the cache does not remove; compare the ratio printed under the figure with the
# batched one above. What you measure also depends on the machine: threads, and other programs sharing
# it, slow the two decoders unequally. The course's benchmark script (`scripts/benchmark.py` in the
# repository) measured both on the whole test set, in the same run, in batches of 256 as above, and
# recorded what it measured in the course package (`transformer_course.reference.fast_decoding_results`).
# The cell prints it: the command, the machine, sentences per second and the time each decoder took (on
# the clock, and the CPU time, which says more on a machine shared with other work).

# %%
print("measured with:", measured.COMMAND)
print("on:", measured.MACHINE)
for name, label in (("without_cache", "stage 6, no cache"), ("with_cache", "with the cache")):
    print(f"{label:>17}: {measured.CACHE['sentences_per_s'][name]:6.1f} sentences/s, "
          f"{measured.CACHE['seconds'][name]:.1f} s ({measured.CACHE['cpu_seconds'][name]:.1f} s of CPU time)")
print(f"on {measured.CACHE['sentences']:,} test sentences the cache was {measured.CACHE['speedup']:.1f}× faster; "
      f"identical token ids in every sentence: {measured.CACHE['identical_token_ids']}")

# %% [markdown]
# Re-run the cells above on your hardware rather than trusting these numbers; a GPU changes them a lot.
# On the course's own 2-core machine, busy with other work, *Run all* with `QUICK = False` measured the cache
# at 4.5× in the batched cell above and 2.1× one sentence at a time (two threads, against the benchmark's one);
# with `QUICK = True`, 4.3× and 2.3×.

# %% [markdown]
# ## 10. Better: beam search on the pretrained model
#
# The beam size and $\alpha$ used below were chosen on the **validation** set by `scripts/benchmark.py`: it
# tried every combination of the beam sizes and $\alpha$ values printed below, scored each with BLEU on the
# validation sentences, and kept the best. The test set played no part in the choice: the script translated
# it with greedy decoding and with the chosen setting only. The cell prints the grid, the choice and the
# test scores. The choice sits at the corner of the grid, the largest beam and the largest $\alpha$ tried,
# so this grid has not found where BLEU stops rising: a wider one might do better still (the script's
# `--beam-sizes` and `--alphas` try others).

# %%
BEAM_SIZE, ALPHA = measured.CHOICE["beam_size"], measured.CHOICE["alpha"]  # chosen on val by the benchmark

print(f"BLEU on {measured.SETTINGS['val_sentences']:,} validation sentences:")
for setting, score in measured.CHOICE["val_bleu"].items():
    print(f"  {setting:>18}: {score:5.2f}")
print(f"chosen: beam size {BEAM_SIZE}, alpha {ALPHA}")
print(f"on {measured.SETTINGS['test_sentences']:,} test sentences: greedy {measured.BLEU['test_greedy']:.2f}, "
      f"beam search {measured.BLEU['test_beam']:.2f} BLEU ({measured.BLEU['gain']:+.2f}); beam search took "
      f"{measured.BEAM['seconds']['wall']:.0f} s ({measured.BEAM['seconds']['cpu']:.0f} s of CPU time)")

# %% [markdown]
# The next cell scores greedy decoding and your beam search on the test set with the course's BLEU recipe
# (stage 6): the first 100 sentences with `QUICK = True`, all 1,000 with `QUICK = False`, 8 while the grader
# runs it (a beam of $k$ decodes $k$ rows per sentence, so expect it to take longer than greedy decoding,
# as the times above show). On 100 sentences the two scores are far noisier than on 1,000; the cell after
# it says how sure even the whole test set's difference is.

# %%
count = 8 if short_run() else 100 if QUICK else len(test_sources)
greedy_text = [" ".join(t) for t in translate_with(cached_greedy_decode, test_sources[:count])]
started = time.perf_counter()
beam_text = [" ".join(t) for t in translate_with(partial(beam_search, beam_size=BEAM_SIZE, alpha=ALPHA),
                                                 test_sources[:count])]
print(f"beam search: {count / (time.perf_counter() - started):.1f} sentences/s")
bleu = {"greedy": corpus_bleu(greedy_text, test_references[:count])[0],
        f"beam {BEAM_SIZE}, alpha {ALPHA}": corpus_bleu(beam_text, test_references[:count])[0]}
print("signature:", corpus_bleu(beam_text, test_references[:count])[1])
figures.plot_bleu_comparison(bleu, title=f"BLEU on {count} test sentences")
plt.show()

# %% [markdown]
# **Is the gain more than luck?** The 1,000 test sentences are a sample of the captions the model could be
# asked to translate, and another sample would give other scores. The benchmark script asked sacreBLEU's
# *paired bootstrap resampling* test (Koehn, 2004; on the command line `sacrebleu --paired-bs`) whether beam
# search's gain over greedy decoding could be luck of the draw. It draws 1,000 new test sets from the real
# one, each of 1,000 sentences taken at random with replacement, and scores both systems on each same
# draw: *paired*, so a draw full of easy sentences raises both. sacreBLEU reports each system's mean BLEU
# over the draws with a 95 % interval, and a p-value: how often the sizes of the draws' differences, minus
# their mean (sacreBLEU's stand-in for what two equally good systems would give), exceed the size of the
# difference observed.
# The script also counted, on the same draws, how often beam search scored higher, and the range that
# holds the middle 95 % of the differences.

# %%
significance = measured.SIGNIFICANCE
print(f"{significance['test']}: {significance['resamples']:,} resampled test sets of "
      f"{significance['sentences']:,} sentences, seed {significance['seed']}")
for name in ("greedy", "beam"):
    result = significance[name]
    print(f"  {name:>6}: BLEU {result['bleu']:.2f}; over the resampled sets {result['mean']:.2f} ± "
          f"{result['ci95']:.2f} (95 %)")
low, high = significance["difference_percentiles_2_5_97_5"]
print(f"  p-value of beam search's difference: {significance['beam']['p_value']}")
print(f"  beam search scored higher on {significance['beam_higher_share']:.1%} of the resampled sets; the middle "
      f"95 % of the differences lie between {low:+.2f} and {high:+.2f} BLEU")
print("  signature:", significance["signature"])

# %% [markdown]
# With 1,000 draws the smallest p-value the test can give is $1/1001 \approx 0.001$ (sacreBLEU counts the
# observed difference as one draw more), which is what it found: in no draw did the shifted difference
# exceed the observed one. The two systems' 95 % intervals overlap, and yet the difference is clear: the
# intervals describe each score alone, while the paired test looks at the difference on the same
# sentences, where most of the variation from one draw to the next cancels out. What the test cannot say:
# whether the gain holds on other test sets or with another model; it measures only the uncertainty that
# comes from which sentences were drawn.

# %% [markdown]
# **Where beam search fixes a greedy error.** The benchmark script also searched the test sentences for
# translations where beam search found a sentence that the model itself rates more probable than greedy's
# *and* that is closer to the reference (sentence-level BLEU). `BEAM_FIXES` holds the three with the
# largest gains it recorded (none if it found none). The cell decodes them with your functions and shows
# both translations next to the reference, with the model's log-probability of each ($\log P$, the score
# beam search maximises before the length penalty).

# %%
BEAM_FIXES = [example["index"] for example in measured.BEAM_FIXES[:3]]  # test sentence numbers
print("test sentences where the benchmark found beam search fixing greedy decoding:", BEAM_FIXES or "none")

for index in BEAM_FIXES:
    src = torch.tensor([test_sources[index]], device=device)  # (1, src_len)
    outputs = {"greedy": cached_greedy_decode(model, src, *special, 80),
               "beam": beam_search(model, src, *special, 80, beam_size=BEAM_SIZE, alpha=ALPHA)}
    print(f"[{index}] German   : {test_german[index]}\n     reference: {test_references[index]}")
    for name, ys in outputs.items():
        log_prob = sequence_log_probs(model, src, ys, target_vocab.pad_idx).item()
        print(f"     {name:9}: {' '.join(target_vocab.decode(ys[0].tolist()))}   (log P = {log_prob:.2f})")
    print()

# %% [markdown]
# **Token by token.** For the first of them, the running total of the log-probability along each
# translation. Up to the first token where the two translations part they are the same; at that token
# greedy's word is the more likely one (it is the argmax after the same prefix), so greedy is ahead
# there. After it the two continue different prefixes and either can be ahead: beam search accepted a
# less likely word and ends higher. (In the toy model of section 6, "a" trails "the" after one token,
# 0.4 against 0.5, but "a cat" already leads "the dog" after two, 0.36 against 0.225.)

# %%
def token_log_probs(src: torch.Tensor, ys: torch.Tensor) -> tuple[list[str], list[float]]:
    """The tokens produced (without <bos>) and each one's log-probability, by one teacher-forced pass."""
    decoder_input = ys[:, :-1]  # (1, steps)
    with torch.no_grad():
        logits = model(src, decoder_input, make_source_mask(src, source_vocab.pad_idx),
                       make_target_mask(decoder_input, target_vocab.pad_idx))  # (1, steps, vocab)
    chosen = torch.log_softmax(logits[0], dim=-1).gather(1, ys[0, 1:].unsqueeze(1)).squeeze(1)  # (steps,)
    keep = ys[0, 1:] != target_vocab.pad_idx
    return [target_vocab.itos[i] for i in ys[0, 1:][keep].tolist()], chosen[keep].tolist()


if not BEAM_FIXES:
    print("(BEAM_FIXES is empty: there is no example sentence to follow)")
else:
    src = torch.tensor([test_sources[BEAM_FIXES[0]]], device=device)
    figures.plot_sentence_log_probs({
        "greedy": token_log_probs(src, cached_greedy_decode(model, src, *special, 80)),
        f"beam {BEAM_SIZE}": token_log_probs(src, beam_search(model, src, *special, 80, BEAM_SIZE, ALPHA))},
        title=f"Test sentence {BEAM_FIXES[0]}: total log-probability as the translation grows")
    plt.show()

# %% [markdown]
# Beam search does not always win: on some sentences its more probable translation is *further* from the
# reference (the model's probability and BLEU disagree), and a larger beam is not always better: Koehn and
# Knowles (2017) found that very wide beams gave shorter translations and lower BLEU on their systems (the
# course's grid stops at 6 beams: its validation BLEU rises with the beam for α 0.6 and 1, and stays within
# 0.1 for α 0). That is why the settings are chosen on held-out data, and why the gain on Multi30k is
# modest, as the benchmark's test scores above show, not a leap.

# %% [markdown]
# ## Summary
# - Thanks to the look-ahead mask, earlier positions never change while decoding; stage 6 recomputed them at
#   every step, about $n^2/2$ position-computations for $n$ tokens.
# - A key/value cache keeps, per decoder layer, the self-attention keys and values of every decoded position
#   (one more per step) and the cross-attention keys and values of the source (computed once). A step then
#   runs the decoder for the newest position only. For every sentence not yet ended, its logits equal the
#   full decoder's up to rounding
#   (about $10^{-7}$ on the small model of section 1; more on larger models with larger logits), so it
#   writes the same tokens unless two candidates tie to within that rounding (on
#   the 1,000 test sentences the benchmark found no such case).
# - Beam search keeps the $k$ best candidates at every step, ranked by total log-probability divided by a
#   length penalty $((5+n)/6)^\alpha$, which counters its preference for short sentences; $k = 1$ is greedy
#   decoding. Finished hypotheses wait in the beam.
# - Beam size and $\alpha$ are chosen on the validation set; the test set gives the final number.
#
# The last cell lists every check of this notebook with `✔` or `✘` and its points. When you are
# done: *File → Download → Download .ipynb*, and hand in that file.

# %% [markdown]
# ## Questions: explain your reasoning
# The check cells grade your code; these questions grade your understanding, and your instructor
# reads them. Answer each one in the empty cell right below it (double-click the cell to write;
# formulas as `$...$` work), in a few sentences of your own. A good answer says *why*, with what
# you saw in this notebook; there is nothing to look up. The points are given in each question.

# %% [markdown]
# **Question 1 (3 points).** The cache works because the decoder's self-attention has a look-ahead mask.
# Suppose a decoder had *no* look-ahead mask in its self-attention (every position attends to every
# position, as in the encoder), and we still decoded it one token at a time. When token $t$ is appended,
# which of the numbers computed at earlier steps stay valid and which must be recomputed: the outputs of
# the earlier positions, their self-attention keys and values in the **first** layer, and those in the
# later layers? What would a step then cost, compared with section 1's $n(n+1)/2$?

# %% [markdown] answer="fast_q_cache" points=3
# **Model answer.** Without the mask, every earlier position attends to the new token too, so the output
# of every position changes in the first layer as soon as token $t$ is appended, and hence in every layer
# after it. The first layer's keys and values are projections of that layer's *input*, the token
# embeddings plus the positional encoding, which do not depend on the other tokens: those could still be
# kept. From the second layer on, the inputs are the first layer's outputs, which have changed, so the keys
# and values of all positions must be recomputed in every layer from the second on. A step therefore
# redoes layers 1 to $N-1$ for all $t$ positions (layer 1 reusing only the key and value projections of
# the earlier tokens), and layer $N$ for the newest position only, apart from its keys and values of all
# positions (only the newest position's output feeds the next-token logits). For $N \ge 2$ step $t$ therefore
# costs about $t$ position-computations per layer instead of 1, and $n$ tokens cost about $n(n+1)/2$, as in
# stage 6. A one-layer decoder could
# still use the cache: its keys and values come from the embeddings and only the newest position's output
# is needed. The cache is exact and cheap only because causality freezes the past.
#
# **Rubric.**
# - 1 point: the earlier positions' outputs change when a token is appended (they now attend to it), in
#   the first layer and so in all later ones.
# - 1 point: the first layer's keys and values depend only on each token's embedding and position and stay
#   valid; the later layers' keys and values must all be recomputed. (An answer that says nothing at all
#   can be kept gets the other two points but not this one.)
# - 1 point: for $N \ge 2$ the layers below the last must be rerun on all positions at every step, so the
#   cost grows with the prefix again, as without a cache. Either way of saying it earns the point: per
#   step (step $t$ recomputes all $t$ positions, so its work grows in proportion to $t$ instead of staying
#   constant) or in total (about $n(n+1)/2$ position-computations for $n$ tokens, quadratic in $n$, instead
#   of $n$); so does an answer per layer (the layers below the last cost $t$ positions each at step $t$).
#   Noting the one-layer exception (a one-layer decoder could still use the cache: its keys and values come
#   from the embeddings, and only the newest position's output is needed) is right and must not cost points.

# %% [markdown]
# **Question 2 (3 points).** Two finished hypotheses of one sentence: one of 14 tokens with
# $\log P = -7$, one of 7 tokens with $\log P = -4.5$. Compute $\mathrm{lp}(n)$ for each and the ranking
# $\log P / \mathrm{lp}(n)$ with $\alpha = 1$ and with $\alpha = 0.6$ (two decimals are enough): which
# hypothesis wins in each case, and which would win with $\alpha = 0$? Explain in one or two sentences why a
# larger $\alpha$ moves the choice the way it does.

# %% [markdown] answer="fast_q_length" points=3
# **Model answer.** With $\alpha = 1$: $\mathrm{lp}(14) = 19/6 \approx 3.17$ and $\mathrm{lp}(7) = 12/6 = 2$,
# so the rankings are $-7/3.17 \approx -2.21$ and $-4.5/2 = -2.25$: the 14-token hypothesis wins. With
# $\alpha = 0.6$: $\mathrm{lp}(14) = 3.17^{0.6} \approx 2.00$ and $\mathrm{lp}(7) = 2^{0.6} \approx 1.52$, so
# $-7/2.00 \approx -3.51$ against $-4.5/1.52 \approx -2.97$: the 7-token hypothesis wins. With $\alpha = 0$
# both penalties are 1 and the plain sums compare, $-4.5 > -7$: the short one wins. Every token adds a
# log-probability of at most 0, so the plain sum favours short hypotheses; the penalty divides a negative
# score by a factor that grows with the length, bringing long hypotheses closer to 0, and a larger $\alpha$
# makes that factor grow faster, so the longer hypothesis overtakes between $\alpha = 0.6$ and $\alpha = 1$
# (exactly where $(19/12)^\alpha$ exceeds $7/4.5$, at $\alpha \approx 0.96$).
#
# **Rubric.**
# - 1 point: the four penalties, about 3.17, 2.00 (α = 1) and 2.00, 1.52 (α = 0.6) (rounding within
#   0.02 accepted).
# - 1 point: the winners: the 14-token one at α = 1 (−2.21 against −2.25), the 7-token one at α = 0.6
#   (−2.97 against −3.51) and at α = 0 (−4.5 against −7).
# - 1 point: the reason, in words or exactly: log-probabilities only add negative terms, so sums favour
#   short outputs, and dividing by a penalty that grows with the length, faster for larger α, helps the
#   longer hypothesis; or the exact condition (the longer one wins once $(19/12)^\alpha > 7/4.5$, i.e.
#   α above about 0.96). (A larger α does not rank by the average log-probability per token: at α = 1 the
#   rank is $6 \log P / (5 + n)$, which can disagree with $\log P / n$; that claim alone earns no point.)

# %%
check.summary()
