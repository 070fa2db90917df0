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
# # Stage 5 — Training the Transformer on Multi30k German→English
#
# *Transformers from Scratch*: you build the Transformer of Vaswani et al.,
# ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (2017), one stage at a time.
#
# | stage | notebook |
# |---|---|
# | 0 (optional) | why attention: the RNN bottleneck, additive attention |
# | 1 | positional encoding |
# | 2 | scaled dot-product and multi-head attention, masks |
# | 3 | feed-forward, residual + LayerNorm, encoder and decoder blocks |
# | 4 | the full encoder–decoder |
# | **5** | **training on Multi30k German→English** (this one) |
# | 6 | greedy decoding, BLEU, attention heatmaps |
# | 7 (optional) | the key/value cache and beam search |
#
# **Working time:** about 4 hours if you are at ease with PyTorch, about 5¾ hours if you are new to it or get
# stuck. That is reading (102 minutes at 150 words a minute without the folded hints, 136 at 100 words a minute
# with them, and the given code at 10 lines a minute), three exercises, one bug hunt, three predictions and
# three written questions, 5 to 10 minutes of setting up (Colab, the setup cell, saving a copy), and the
# training run of section 11 (ten epochs of roughly 3 to 6 minutes each on a 2-core CPU: 30 minutes to an
# hour). (Estimated by `scripts/working_time.py` in the course repository from the notebook's length and the
# measured run time of its cells, with assumptions it prints, not measurements of students: for example 150 or
# 100 words a minute, 5 or 10 minutes per exercise plus 2 or 4 per line you write, 10 or 20 per bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. describe the Multi30k data set and explain how its sentences become id sequences (a tokeniser and
#    a vocabulary with `min_freq`, special tokens, `<unk>` for unknown words);
# 2. build padded batches in which the decoder reads the target **shifted by one** (teacher forcing),
#    and explain why length-bucketed batching saves work;
# 3. write the training loss from the model's output (cross-entropy that ignores padding, with label
#    smoothing), and read a loss as a perplexity;
# 4. read the paper's warm-up learning-rate schedule and predict its values, and explain why
#    Transformers need it;
# 5. explain why a training update needs each of its ingredients (dropout switched on, the scheduled
#    learning rate, clipping, the gradient of its own batch alone), write one training epoch from its
#    contract, and find a training-loop bug from its loss curve;
# 6. run the training, read its curves, resume it from a checkpoint, and read measured effects of
#    label smoothing, the warm-up and checkpoint averaging.
#
# **Before you start.** You need stage 4's `Transformer` (imported from the course package), a PyTorch
# training loop (gradients, `backward`, an optimiser's step), cross-entropy, and why sentences of a
# batch are padded to one length.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package), then
# the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is given and
# correct, apart from the bug hunt's code, which says so. After each exercise a few *check cells* test one
# property each: `✔` means it holds, a red `✘` block says what was expected and what came out, hints
# folded under it. A failing check does not stop the notebook: *Run all* always reaches the end, where the
# last cell lists every check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work (the grader
# also runs a few hidden ones with other sizes). The checks use small synthetic data, so they run in
# seconds and need no download.
#
# The model itself comes from the course package (`transformer_course.reference`), so a bug left in
# an earlier stage cannot spoil this one.
#
# <!-- keep-and-hand-in -->

# %% readonly="setup"
#| setup

# %%
#| settings

# %%
import math
import time  # noqa: F401  (used by the given code spliced below)
from collections.abc import Callable, Iterable, Sequence  # noqa: F401  (used by the given code spliced below)
from functools import partial
from pathlib import Path  # noqa: F401  (used by the given code spliced below)
from typing import Any  # noqa: F401  (used by the given code spliced below)

import matplotlib.pyplot as plt
import torch
from torch import nn  # noqa: F401  (used by the given code spliced below)
from torch.utils.data import DataLoader
from tqdm.auto import tqdm  # noqa: F401  (progress bars of the given train_epoch, evaluate and fit)

from transformer_course.checks import training as check
from transformer_course.data.batching import BucketBatchSampler
from transformer_course.data.multi30k import load_pairs
from transformer_course.data.tokenize import Tokenizer
from transformer_course.reference import (
    Transformer,
    checkpoint,
    count_parameters,
    make_source_mask,  # noqa: F401  (used by collate below)
    make_target_mask,
)
from transformer_course.reference.training import TRAINING_STATE_NAME, Batch
from transformer_course.reference.translation import prepare_data, translate
from transformer_course.runtime import checkpoint_folder, short_run
from transformer_course.visualisation import attention as attention_figures
from transformer_course.visualisation import diagrams
from transformer_course.visualisation import training as figures

# %% [markdown]
# ## 1. The task and the data
#
# We train the encoder–decoder of stage 4 to translate German into English. Recall the picture:
# the encoder reads the German sentence; the decoder writes the English one token by token, each
# time looking at the encoder's output (cross-attention) and at the English tokens it has so far
# (masked self-attention). The last layer scores every word of the English vocabulary.

# %%
diagrams.show("transformer")

# %% [markdown]
# **Multi30k** (Elliott, Frank, Sima'an and Specia, 2016, *Multi30K: Multilingual English-German
# Image Descriptions*, Workshop on Vision and Language) extends the Flickr30k image-caption data
# set (five English descriptions per image): for one English description of each image, a professional
# translator wrote a German translation. We use its translation task ("task 1"):
#
# | split | sentence pairs | used for |
# |---|---|---|
# | `train` | 29,000 | learning the weights |
# | `val` | 1,014 | watching progress, choosing settings |
# | `test_2016_flickr` | 1,000 | the final score (notebook 6) |
#
# The sentences are short, simple descriptions of photos, which makes the task small enough to
# train on a 2-core CPU in an hour or less (section 11), yet real.
#
# The course package downloads the six files on first use from the data set's GitHub repository,
# checks each against the SHA-256 checksum the course records for it and keeps them in a cache folder, so the
# download happens once. (If the files already sit somewhere, set the environment variable
# `MULTI30K_DIR` to that folder.) Here are the first pairs of the training split:

# %%
for german, english in load_pairs("train")[:4]:
    print(f"DE: {german}\nEN: {english}\n")

# %% [markdown]
# ## 2. From sentences to ids: tokeniser and vocabulary
#
# **Tokenising** splits a sentence into *tokens*: words and punctuation. We use spaCy's rule-based
# tokenisers for German and English (`spacy.blank("de")`, `spacy.blank("en")`): rules only, no
# trained model to download. We also **lowercase** everything. With only 29,000 training sentences,
# "Dog" and "dog" as two separate words would split the examples of one word between two entries;
# lowercasing merges them.
# The price: the model's output is lowercase too.

# %%
german_tokenizer, english_tokenizer = Tokenizer("de"), Tokenizer("en")
print(german_tokenizer("Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."))
print(english_tokenizer("A man in an orange hat starring at something."))

# %% [markdown]
# **The vocabulary** maps every token to an integer id, one vocabulary per language, built from the
# **training** split only (the model must not peek at validation or test data). It starts with four
# special tokens:
#
# | id | token | meaning |
# |---|---|---|
# | 0 | `<unk>` | "unknown": any word that is not in the vocabulary |
# | 1 | `<bos>` | beginning of sentence: the decoder's first input |
# | 2 | `<eos>` | end of sentence: the model says "I am done" by predicting it |
# | 3 | `<pad>` | padding that fills up short sentences in a batch (section 3) |
#
# Then come the words, most frequent first. A word seen fewer than `min_freq` times in the training
# data is left out: a word seen once gives the model one example to learn an embedding from, too few
# to learn anything, and such rare words (typos, names, compound nouns, which German makes freely)
# would make the vocabulary, and with it the embedding and output layers, much larger. With
# `min_freq=2` rare words become `<unk>`.
#
# `prepare_data` does all of it: tokenise the three splits, build both vocabularies with
# `min_freq=2`, and encode every sentence as ids framed by `<bos>` and `<eos>`. It takes several
# seconds.

# %%
data = prepare_data(min_freq=2)
source_vocab, target_vocab = data.source_vocab, data.target_vocab
PAD_IDX = target_vocab.pad_idx  # 3 in both vocabularies
print(f"German vocabulary: {len(source_vocab):,} tokens; English vocabulary: {len(target_vocab):,} tokens")
print("first ids:", source_vocab.itos[:12])
for split, examples in data.splits.items():
    print(f"{split:17s} {len(examples):6,} pairs")

# %% [markdown]
# Encoding a sentence adds `<bos>`/`<eos>`; a word the vocabulary has never seen falls back to
# `<unk>` (id 0), and decoding drops the specials. How much of the training text ends up as `<unk>`?

# %%
tokens = german_tokenizer("Ein Zebrafink sitzt auf dem Fahrrad.")
ids = source_vocab.encode(tokens)
print(tokens, "->", ids)
print("decoded:", source_vocab.decode(ids), " ('zebrafink' is not in the vocabulary)")
for name, side in (("German", 0), ("English", 1)):
    all_ids = [i for pair in data.splits["train"] for i in pair[side][1:-1]]
    print(f"{name}: {sum(i == 0 for i in all_ids) / len(all_ids):.1%} of training tokens are <unk>")

# %% [markdown]
# ## 3. Batches
#
# ### Padding
# A batch is a tensor, and a tensor is a rectangle, but sentences have different lengths. So we
# **pad**: append `<pad>` (id 3) to each sentence until it is as long as the longest one in its batch.
# `pad_sequences` does that (given):

# %%
#| include transformer_course.reference.training:pad_sequences

# %%
print(pad_sequences([[1, 7, 8, 9, 2], [1, 5, 2]], PAD_IDX))

# %% [markdown]
# Padding is filler. Three things must make sure it never matters:
# - the **source mask** (`make_source_mask`, stage 4) hides padded source positions from every
#   attention layer, so real tokens never attend to `<pad>`;
# - the **target mask** (`make_target_mask`, stage 4) combines the same padding rule with the
#   look-ahead rule for the decoder;
# - the **loss** ignores positions whose target is `<pad>` (section 5).
#
# ### Teacher forcing: what the decoder reads and what it must predict
# When the trained decoder translates (notebook 6), it writes the English sentence one token at a
# time: it starts from `<bos>` and predicts the first word; it appends that word and predicts the
# next; and so on, until it predicts `<eos>`. Training must teach it each of these predictions. For
# the reference translation `<bos> a dog runs <eos>` they are four examples, one per token to
# predict:

# %%
figures.plot_next_token_examples(["<bos>", "a", "dog", "runs", "<eos>"])
plt.show()

# %% [markdown]
# In training the decoder reads the **true** tokens of the reference, not its own earlier guesses:
# that is called **teacher forcing**. A wrong guess early in a sentence then cannot spoil the
# examples after it, and every example can be made before the model knows anything.
#
# Four forward passes for four examples would be slow. The decoder makes them all in **one** pass,
# thanks to two things you built in stages 2–4: it reads one sequence and outputs one prediction per
# position, and its look-ahead mask makes the prediction at position $t$ depend only on the tokens
# at positions $0, \dots, t$ of what it reads. So one sequence that the decoder reads and one
# sequence of targets, compared position by position, hold every example of the figure at once, if
# the two are chosen right. The paper puts it in one sentence (section 3.1): the masking, "combined
# with fact that the output embeddings are offset by one position, ensures that the predictions for
# position $i$ can depend only on the known outputs at positions less than $i$."
#
# Work it out on paper for the four examples before you write code: at each position, what does the
# decoder read and what must it predict? Which token of the sentence (on its own, unpadded) is never
# read, and which is never predicted? In a batch the targets are padded to the longest one, and the same rule must work
# on every row of the padded tensor at once: a position that exists only because of padding must end
# up with `<pad>` as its target, so that the loss ignores it.
#
# If the decoder could read the very token it must predict at a position, the task would be trivial:
# the loss would drop towards zero almost at once, and the model would have learned nothing about
# translation (section 9 shows it).
#
# ## 4. Exercise: `collate`
#
# `collate(pairs, pad_idx)` turns a list of `(source ids, target ids)` pairs into one `Batch`, a
# small dataclass with the fields `src`, `tgt_in`, `tgt_out`, `src_mask` and `tgt_mask`. The padding
# and the masks are given. You write the two fields of teacher forcing from `tgt`, the padded target
# tensor: int64, shape `(batch, L)`, each row a framed target `<bos> ... <eos>` followed by `<pad>`
# up to the longest. The contract:
# - `tgt_in` holds, at every position of every sentence, the token the decoder reads there;
#   `tgt_out` the token it must predict there, the one that follows in the reference;
# - both are int64 tensors of shape `(batch, L - 1)`;
# - a position past a sentence's end has the target `<pad>`.
#
# The given line after yours builds the target mask from `tgt_in`, so it must be what the decoder
# reads.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Both are the whole target with one token dropped: `tgt_in` loses the token nobody reads as
# input (what would the decoder predict after `<eos>`?), `tgt_out` the token nobody has to predict
# (what comes before `<bos>`?). Which one is which?
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# Slice the **second** axis (positions) and keep the first (sentences) whole. Dropping one end
# turns length `L` into `L - 1`; slicing makes views, no copy needed. A short sentence's row then
# keeps its `<eos>` among what the decoder reads, followed by padding, and every position after its
# `<eos>` has the target `<pad>`.
#
# </details>
#
# <details><summary>Hint 3: the line</summary>
#
# ```python
# tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # shift by one: predict the next token
# ```
#
# </details>

# %% solution="collate"
#| include transformer_course.reference.training:collate

# %% [markdown]
# ### Check your work
# Each cell checks one property. Read the message of the first failing one: fix that, rerun the
# exercise cell, then rerun the checks.

# %% tests="train_collate_shapes" points=1
assert check.collate_shapes(collate)

# %% tests="train_collate_shift" points=2
assert check.collate_shift(collate)

# %% tests="train_collate_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.collate_shapes(collate, batch_size=7, seed=11)
assert check.collate_shift(collate, batch_size=6, seed=12, pad_idx=0)
### END HIDDEN TESTS

# %% [markdown]
# A real batch of three training pairs, and the target mask of the shortest one: each row is a
# decoder position, the blue cells are the positions it may attend to, grey cells are hidden. The
# padded columns are grey in every row, and no row sees the future.

# %%
example = collate(data.splits["train"][3:6], PAD_IDX)
print("src", tuple(example.src.shape), " tgt_in", tuple(example.tgt_in.shape),
      " tgt_out", tuple(example.tgt_out.shape), " tgt_mask", tuple(example.tgt_mask.shape))
shortest = int((example.tgt_out != PAD_IDX).sum(dim=1).argmin())
reads = [target_vocab.itos[i] for i in example.tgt_in[shortest]]
print("tgt_in :", " ".join(reads))
print("tgt_out:", " ".join(target_vocab.itos[i] for i in example.tgt_out[shortest]))
attention_figures.plot_masks({"target mask of that sentence": example.tgt_mask[shortest]}, reads, reads)
plt.show()

# %% [markdown]
# ### Length bucketing: less padding, less wasted work
# Every `<pad>` slot costs the same computation as a real token, and the result is thrown away. If
# batches were formed at random, one long sentence would force every short sentence in its batch to
# be padded to its length. The lengths vary a lot:

# %%
source_lengths = [len(source) for source, _ in data.splits["train"]]
target_lengths = [len(target) for _, target in data.splits["train"]]
figures.plot_sentence_lengths(source_lengths, target_lengths)
plt.show()

# %% [markdown]
# **Bucketing** puts sentences of similar length together. `BucketBatchSampler` (given, in the data
# package) shuffles the data, cuts it into large pools, sorts each pool by length, slices it into
# batches of at most `max_tokens` padded tokens, and shuffles the order of the batches, so training
# still sees them in random order. Let us measure the padding share per batch on the training
# data, against random batches with the same number of sentences on average:

# %%
lengths = [max(s, t) for s, t in zip(source_lengths, target_lengths, strict=True)]


def padding_per_batch(batches: Iterable[list[int]]) -> tuple[list[float], int]:
    """Per batch, the share of its source + target token slots that are <pad>; and all slots together."""
    shares, all_slots = [], 0
    for indices in batches:
        real = sum(source_lengths[i] + target_lengths[i] for i in indices)
        slots = len(indices) * (max(source_lengths[i] for i in indices) + max(target_lengths[i] for i in indices))
        shares.append(1 - real / slots)
        all_slots += slots
    return shares, all_slots


bucketed = list(BucketBatchSampler(lengths, max_tokens=4096, seed=0))
size = round(len(lengths) / len(bucketed))  # the same number of sentences per batch on average
order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(0)).tolist()
random_batches = [order[start:start + size] for start in range(0, len(order), size)]
real_tokens, shares = sum(source_lengths) + sum(target_lengths), {}
for name, batches in (("random batches", random_batches), ("bucketed batches", bucketed)):
    shares[name], slots = padding_per_batch(batches)
    print(f"{name:16s}: {len(batches)} batches, {slots:,} token slots, {1 - real_tokens / slots:.0%} padding")
figures.plot_padding_share(shares)
plt.show()

# %% [markdown]
# With random batches about half of all token slots are padding; bucketing brings that under a
# tenth, so an epoch processes about half as many token slots for the same sentences.
#
# The training loader combines both pieces: the bucketing sampler picks the indices of each batch,
# your `collate` builds the `Batch`. `DataLoader` only calls `collate` when a batch is requested, so
# creating the loaders works before the exercise is done.

# %%
MAX_TOKENS = 4096  # at most this many padded tokens per batch and side


def make_batches(examples: list[tuple[list[int], list[int]]], shuffle: bool = True, seed: int = 0) -> DataLoader:
    """Length-bucketed batches, collated by `collate` into Batch objects."""
    lengths = [max(len(source), len(target)) for source, target in examples]
    sampler = BucketBatchSampler(lengths, max_tokens=MAX_TOKENS, shuffle=shuffle, seed=seed)
    return DataLoader(examples, batch_sampler=sampler, collate_fn=partial(collate, pad_idx=PAD_IDX))


train_loader = make_batches(data.splits["train"])
val_loader = make_batches(data.splits["val"], shuffle=False)
print(f"{len(train_loader)} training batches, {len(val_loader)} validation batches")

# %% [markdown]
# ## 5. The loss
#
# ### Cross-entropy per token, ignoring `<pad>`
# At every target position the model outputs one score (logit) per vocabulary word; softmax turns
# them into probabilities $p(k)$. The loss at that position is the **cross-entropy**
# $-\log p(y)$, where $y$ is the correct next token: 0 when the model gives $y$ probability 1,
# large when it gives it little. The batch loss is the **mean over the real target tokens**.
# Positions whose target is `<pad>` must not count: `nn.CrossEntropyLoss(ignore_index=PAD_IDX)`
# skips them, both in the sum and in the count it divides by (the default `reduction="mean"` with
# no class weights).
#
# **Perplexity** is $e^{\text{loss}}$ for this (unsmoothed) cross-entropy: a model with perplexity 20 is,
# on average, as unsure as if it chose uniformly among 20 words. An untrained model that spreads
# probability evenly over $K$ words has perplexity $K$.
#
# ### Label smoothing
# The paper trains with **label smoothing** $\varepsilon_{ls} = 0.1$. Instead of the one-hot target
# ("all probability on $y$") the model is trained towards a slightly softened one. PyTorch's
# `label_smoothing=ε` uses, for a vocabulary of $K$ words,
#
# $$q(k) = (1 - \varepsilon)\,[k = y] + \frac{\varepsilon}{K}, \qquad
#   \text{loss} = -\sum_{k=1}^{K} q(k)\,\log p(k)
#   = (1-\varepsilon)\,\big(-\log p(y)\big) + \varepsilon\,\frac{1}{K}\sum_{k=1}^{K}\big(-\log p(k)\big)$$
#
# - $y$ — the correct token; $[k = y]$ is 1 for it and 0 for every other $k$;
# - $K$ — the vocabulary size; $\varepsilon$ — how much probability is spread evenly over all words
#   (PyTorch spreads it over every id, `<pad>` and `<bos>` included; leaving them out, as some
#   implementations do, makes a negligible difference);
# - $p(k)$ — the model's probability for word $k$ (softmax of the logits).
#
# The second form reads: the usual cross-entropy, weighted by $1 - \varepsilon$, plus, weighted by
# $\varepsilon$, a penalty for giving *any* word an extremely low probability. Why? With one-hot targets
# the loss keeps rewarding larger and larger logits for $y$, and the model becomes over-confident. With
# smoothing the best possible prediction is $p = q$, which keeps the logits bounded. The paper (section
# 5.4): "This hurts perplexity, as the model learns to be more unsure, but improves accuracy and BLEU
# score." Its Table 3, row (D), varies
# $\varepsilon_{ls}$ alone on the base model (English→German development set newstest2013,
# perplexity per word piece, beam search, no checkpoint averaging):
#
# | $\varepsilon_{ls}$ | perplexity (dev) | BLEU (dev) |
# |---|---|---|
# | 0.0 | 4.67 | 25.3 |
# | 0.1 (the base model) | 4.92 | 25.8 |
# | 0.2 | 5.47 | 25.7 |
#
# Perplexity gets worse with every step of smoothing, BLEU better by half a point from 0 to 0.1 and no
# better beyond. These are the paper's numbers, for its data and model.
#
# **On Multi30k.** `scripts/measure_training_choices.py` in the course repository trained a smaller
# model than this notebook's twice, with $\varepsilon_{ls} = 0.1$ and $0$ and nothing else different
# (the same initial weights, batches and dropout draws), translated the test set with both by greedy
# decoding, scored the translations with BLEU (0 to 100, higher is better; notebook 6 explains both) and
# compared the two with sacreBLEU's paired bootstrap test (is a difference larger than resampling the test
# sentences would make by chance?). The next cell prints what it measured.

# %%
from transformer_course.reference import training_results  # noqa: E402  (measured by a script of the course)

smoothing_measured, smoothing_settings = (training_results.RESULTS["smoothing_and_averaging"],
                                        training_results.RESULTS["config"])
print(f"d_model {smoothing_settings['d_model']}, {smoothing_settings['num_layers']} layers a side, "
      f"{smoothing_settings['epochs']} epochs")
for name, run in smoothing_measured["runs"].items():
    last = run["checkpoints"]["last epoch"]
    print(f"  {name}: validation perplexity (without smoothing) {last['val_perplexity']:.2f}, "
          f"greedy BLEU on val {last['val_bleu']:.2f}, on test_2016_flickr {last['test_2016_flickr_bleu']:.2f}")
test = smoothing_measured["paired_bootstrap_test"][0]
print(f"test_2016_flickr, {test['system']} against {test['baseline']}: {test['difference']:+.2f} BLEU, "
      f"p = {test['p_value']:.2f}")

# %% [markdown]
# As in the paper, smoothing made the perplexity worse (5.37 against 5.18): the model is less sure of
# itself. Unlike the paper, BLEU did not improve: 36.08 against 36.43 on the test set, a difference
# the bootstrap test does not tell apart from chance (p = 0.14: were the two equally good, a
# difference at least this large would still turn up in about 14 % of the resamplings; the usual
# threshold is 5 %). These runs are not the
# paper's setting: its base model trained for 100,000 steps on 4.5 million sentence pairs; these
# stopped after 8 epochs of 29,000 pairs, with the validation loss still falling. One run of one
# small model shows the perplexity cost the paper names; whether the BLEU gain needs the paper's
# longer training and larger data, it cannot say.

# %%
figures.plot_label_smoothing(vocab_size=10, correct=3, epsilon=0.1)
plt.show()

# %% [markdown]
# One consequence to remember when reading curves: with smoothing, even the best possible model, the one
# that predicts $p = q$, has a loss above zero, namely the entropy of $q$. For our English vocabulary and
# $\varepsilon = 0.1$:

# %%
K, epsilon = len(target_vocab), 0.1
q_correct, q_other = 1 - epsilon + epsilon / K, epsilon / K
floor = -(q_correct * math.log(q_correct) + (K - 1) * q_other * math.log(q_other))
print(f"lowest possible label-smoothed training loss: {floor:.2f} nats per token")

# %% [markdown]
# Perplexity, defined above, uses the *un*smoothed loss. We report training loss with
# smoothing (what is optimised) and validation loss and perplexity without it (what is comparable).
#
# The criterion is given:

# %%
#| include transformer_course.reference.training:make_criterion


# %% [markdown]
# ## 6. Exercise: `compute_loss`
#
# `compute_loss(model, batch, criterion)` returns the batch's mean loss per real target token: a 0-d
# tensor that can be backpropagated. Everything it needs is in the batch (section 3) and in stage 4's
# model, called as `model(src, tgt_in, src_mask, tgt_mask)`, which returns logits of shape
# `(batch, tgt_len, vocab)`. Use the `criterion` you are given (it knows the padding id and the
# smoothing); don't build a new `nn.CrossEntropyLoss()` inside the function. PyTorch's documentation
# of `nn.CrossEntropyLoss` says what shapes it takes: the class scores on axis 1, either `(N, C)` with
# targets `(N,)` or `(N, C, d)` with targets `(N, d)`, targets as int64 class ids. Which tensor of the
# batch holds the targets, and how do the logits become one of these shapes without mixing up which
# score belongs to which target?

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Two steps: a forward pass of the model on the batch's fields, then the criterion on the logits
# and `batch.tgt_out`. Every (sentence, position) pair is one classification example.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# Merge the batch and position axes into one: logits `(batch * tgt_len, vocab)`, targets
# `(batch * tgt_len,)`, flattened in the same order. Use `.reshape`, not `.view`: `batch.tgt_out`
# is a slice of the padded target, not contiguous in memory, and `.view` refuses to flatten it.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# ```python
# logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)  # (batch, tgt_len, vocab)
# loss = criterion(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1))
# ```
#
# </details>

# %% solution="compute_loss"
#| include transformer_course.reference.training:compute_loss

# %% [markdown]
# ### Check your work

# %% tests="train_loss_values" points=2
assert check.compute_loss_values(compute_loss)

# %% tests="train_loss_ignores_padding" points=2
assert check.compute_loss_ignores_padding(compute_loss)

# %% tests="train_loss_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.compute_loss_values(compute_loss, batch_size=3, d_model=8, label_smoothing=0.2, seed=13)
assert check.compute_loss_ignores_padding(compute_loss, batch_size=6, extra=5, seed=14)
### END HIDDEN TESTS

# %% [markdown]
# **What the loss of an untrained model can and cannot tell.** With a vocabulary of thousands of
# words, a freshly initialised model's logits are small and nearly equal: Xavier initialisation gives the
# prediction layer's weights a variance of $2/(d_{model} + K)$, which shrinks as the vocabulary grows
# (stage 4's toy model, with 12 words, started further from uniform). It then gives every word about
# the same probability, $1/K$, and its unsmoothed loss is close to $\ln K$, the loss of a model that knows
# nothing. A starting loss far
# from $\ln K$ points to a mistake of scale: a loss summed over the tokens instead of averaged (thousands
# of times too large on this notebook's batches), or initial weights far too large. But many mistakes leave it at about
# $\ln K$: comparing the logits with the wrong targets, applying a softmax before the criterion (which
# applies its own), or counting `<pad>` positions. A model that gives every word the same probability
# has the same loss whatever the targets, and a softmax of nearly uniform probabilities is nearly
# uniform again. Such mistakes show only once training runs. The cell after Prediction 1 ends with an
# untrained model's loss beside $\ln K$.

# %% [markdown]
# **Prediction 1 (1 point).** Predict, then run: work this out on paper before you run anything. A
# model puts probability 0.5 on the right word at every position and spreads the other 0.5 evenly
# over the remaining 9,999 words of a $K = 10{,}000$-word vocabulary. What is its cross-entropy
# (natural log, no label smoothing)? Write the number (within 1%) or the arithmetic you worked out
# after `return` (`math` is allowed). A prediction is a value you work out, so the function may not
# call your code, torch or anything else of the notebook: the check refuses that. The check only
# looks at the form of your prediction and notes it: **it is scored when your notebook is graded**,
# and nothing in this notebook says whether it is right, so trying again tells you nothing. The cell
# after the check shows the truth for *another* probability: use it to test your method. The answer
# you are graded on is never printed.

# %% solution="train_predict_uniform_loss"
def predict_half_right_loss() -> float:
    """Your prediction of the cross-entropy when the right word gets probability 0.5 of 10,000 words."""
    ### BEGIN SOLUTION
    return -math.log(1 / 2)  # only p(right word) enters the unsmoothed loss
    ### END SOLUTION


# %% tests="train_predicted_uniform_loss" points=1
assert check.predicted_half_right_loss(predict_half_right_loss)

# %% [markdown]
# **The truth, for another probability**: the loss of a model that puts probability 0.2 on the right
# word and spreads the rest evenly, over $K = 10{,}000$ words and over $K = 100$, beside the uniform
# model's loss and an untrained model's loss on a validation batch. Check that your method gives these
# numbers too; where it does not, find the step of your reasoning that went wrong.

# %%
for size in (10_000, 100):
    fifth_right = torch.full((1, size), 0.8 / (size - 1), dtype=torch.float64)  # the rest, spread evenly
    fifth_right[0, 5] = 0.2  # the right word, id 5
    fifth_right_loss = nn.functional.cross_entropy(fifth_right.log(), torch.tensor([5]))  # log-probabilities
    print(f"p(right word) = 0.2 of K = {size:,}: loss {fifth_right_loss.item():.3f}")
for size in (10_000, len(target_vocab)):
    uniform = torch.zeros(1, size)  # equal logits: every word gets probability 1/K
    print(f"K = {size:,}: uniform model's loss {nn.functional.cross_entropy(uniform, torch.tensor([5])).item():.3f}")
torch.manual_seed(0)
untrained = Transformer(len(source_vocab), len(target_vocab), 64, 4, 1, 128, 128, 0.0).eval()
first_batch = next(iter(val_loader))
with torch.no_grad():
    start_loss = compute_loss(untrained, first_batch, make_criterion(PAD_IDX, label_smoothing=0.0))
print(f"untrained loss {start_loss.item():.2f}, ln K = {math.log(len(target_vocab)):.2f}")


# %% [markdown]
# ## 7. The optimiser and the warm-up schedule
#
# The paper trains with **Adam** ($\beta_1 = 0.9$, $\beta_2 = 0.98$, $\epsilon = 10^{-9}$) and a
# learning rate that changes at every step (equation 3 of the paper):
#
# $$\mathit{lrate} = d_{model}^{-0.5} \cdot \min\!\left(\mathit{step}^{-0.5},\;
#   \mathit{step} \cdot \mathit{warmup\_steps}^{-1.5}\right)$$
#
# - $\mathit{step}$ — the number of optimiser updates so far, counting from 1;
# - $\mathit{warmup\_steps}$ — the length of the warm-up (4,000 in the paper);
# - $d_{model}$ — the model width (512 in the paper): wider models get smaller steps.
#
# Read it as two curves and the smaller of the two. The first, $\mathit{step}^{-0.5}$, **decays**
# like $1/\sqrt{\mathit{step}}$. The second, $\mathit{step} \cdot c$, **rises linearly**. The
# constant $c$ decides where the two cross, and so where the rate stops rising: for the crossing to
# be at $\mathit{step} = \mathit{warmup\_steps} = w$, $w \cdot c = w^{-0.5}$, so $c = w^{-1.5}$, the
# exponent of the formula. Before $w$ the rising line is the smaller, after it the decay; the rate is
# largest at $w$. We add a constant `factor` in front (1 in the paper) to tune the peak for our much
# smaller data set and batches.
#
# **Why warm up?** At the start Adam's estimate of each weight's typical gradient size comes from
# very few batches and is unreliable, so its early steps can be large and badly aimed; and a
# Transformer with LayerNorm after each residual sum, like ours and the paper's, is known to
# diverge when the first updates are too large. Small steps at first let these statistics settle;
# the later decay lets the model settle into a good minimum. (For the analyses, see Liu et al.,
# 2020, *On the Variance of the Adaptive Learning Rate and Beyond*, and Xiong et al., 2020,
# *On Layer Normalization in the Transformer Architecture*.) Section 10 tests the warm-up on a toy
# task.
#
# The schedule is given (the schedule is named after Noam Shazeer, one of the paper's authors). A
# step of 0 counts as step 1, since $0^{-0.5}$ divides by zero:

# %%
#| include transformer_course.reference.training:noam_learning_rate

# %% [markdown]
# The schedule over the first 20,000 steps for the paper's settings and two others; the dot on each
# curve is its peak, at `warmup_steps`. A longer warm-up gives a later and lower peak, a wider model
# a lower curve overall.

# %%
figures.plot_learning_rate_schedule(noam_learning_rate, settings=[(512, 4000), (512, 6000), (256, 4000)])
plt.show()

# %% [markdown]
# ### Predict, then run
# Work these out from the formula before you run anything; write your prediction after `return`
# (a number, or the arithmetic you worked out, with `math` if you like; not a call of your schedule).
# As with Prediction 1, the checks only note your predictions: they are scored when your notebook is
# graded, and the cell after them shows the truth for *other* settings.
#
# **Prediction 2 (1 point).** With the paper's base settings ($d_{model} = 512$,
# $\mathit{warmup\_steps} = 4000$, factor 1) the rate peaks at step 4,000. At which step would it peak
# if the code used `warmup_steps ** -1.0` instead of `warmup_steps ** -1.5`? Give the whole-number
# step with the largest rate (within half a step).

# %% solution="train_predict_peak_step"
def predict_variant_peak_step() -> int:
    """Your prediction of the step at which the schedule with warmup_steps ** -1.0 peaks (warm-up 4000)."""
    ### BEGIN SOLUTION
    return round(4000 ** (2 / 3))  # step^-0.5 = step / warmup  <=>  step^1.5 = warmup
    ### END SOLUTION


# %% tests="train_predicted_peak_step" points=1
assert check.predicted_variant_peak_step(predict_variant_peak_step)

# %% [markdown]
# **Prediction 3 (1 point).** Back to the paper's formula (exponent $-1.5$), now with the sizes of the
# paper's big model: $d_{model} = 1024$, $\mathit{warmup\_steps} = 4000$, factor 1. What is the
# largest learning rate of its schedule (within 2%)?

# %% solution="train_predict_peak_rate"
def predict_peak_rate() -> float:
    """Your prediction of the largest learning rate of the schedule with d_model = 1024 and warm-up 4000."""
    ### BEGIN SOLUTION
    return (1024 * 4000) ** -0.5
    ### END SOLUTION


# %% tests="train_predicted_peak_rate" points=1
assert check.predicted_peak_rate(predict_peak_rate)

# %% [markdown]
# **The truth, for other settings**, from the schedule: the largest value over the first 20,000
# steps and where it sits, for the paper's base settings and for those of the training run in
# section 11 ($d_{model} = 256$, a warm-up of 400 steps, `factor = 0.5`), which section 11 compares
# with the paper's; and, from the formula, the exponent $-1.0$ of Prediction 2 with a warm-up of
# 8,000 steps. Check that your method gives these numbers too.

# %%
for d, warmup, factor in ((512, 4000, 1.0), (256, 400, 0.5)):
    rates = [noam_learning_rate(step, d, warmup, factor) for step in range(1, 20001)]
    peak = max(rates)
    print(f"d_model {d}, warm-up {warmup}, factor {factor}: peak {peak:.3e} at step {rates.index(peak) + 1}")
variant = [512 ** -0.5 * min(step ** -0.5, step * 8000 ** -1.0) for step in range(1, 20001)]
print(f"d_model 512, warm-up 8000, exponent -1.0: peak {max(variant):.3e} at step {variant.index(max(variant)) + 1}")

# %% [markdown]
# **Wiring it into PyTorch (given).** `LambdaLR` multiplies the optimiser's base learning rate by
# `lr_lambda(index)`, where `index` counts the scheduler's `step()` calls from 0. With a base rate of
# 1.0 the learning rate *is* our schedule; `index + 1` makes the first update use step 1.

# %%
#| include transformer_course.reference.training:make_optimizer

# %% [markdown]
# ## 8. One training update, and why each part of it is there
#
# `train_epoch` (section 9) will make one update of the weights per batch. This section takes the
# update apart: what each ingredient is for, and what goes wrong without it, shown on small
# computations. How to put them together is then yours to work out.
#
# ### What `backward()` computes
# Training moves every weight against its **gradient**: the derivative of the batch's loss with
# respect to that weight, which says how the loss would change if that weight moved a little.
# Calling `backward()` on a scalar tensor computes these derivatives, by the chain rule backwards
# through the operations that produced it, for every tensor it was computed from that was *created*
# with `requires_grad=True` (the leaves of the computation; for a model, its parameters), and stores
# each in that tensor's `.grad`. It changes no weight: without the optimiser's `step()`, which reads
# every `.grad` as it is at that moment and moves the weights, nothing is learned. A check on a "loss"
# of two weights whose derivatives you can work out on paper, $f(w) = (3w_1 - 1)^2 + w_2^2$:

# %%
w = torch.tensor([0.5, -2.0], requires_grad=True)
error = (3 * w[0] - 1) ** 2 + w[1] ** 2  # a scalar computed from w
error.backward()  # fills w.grad; w itself does not change
print("w.grad from backward():", w.grad.tolist(), "  on paper: 6(3w1 - 1) = 3.0 and 2w2 = -4.0")
print("w after backward():    ", w.tolist())

# %% [markdown]
# ### Why old gradients must be cleared
# `backward()` *adds* to each `.grad`; it never overwrites. Run it a second time on a fresh
# computation and the new gradient lands on top of the old one:

# %%
w = torch.tensor([1.0], requires_grad=True)
for attempt in range(3):
    (2 * w).sum().backward()  # d(2w)/dw = 2 every time
    print(f"after backward #{attempt + 1}: w.grad = {w.grad.item()}")

# %% [markdown]
# Adding up is deliberate: it lets you sum the gradients of several small batches before one update
# (gradient accumulation, a way to train with larger batches than fit in memory). But an update that
# should follow *this* batch's gradient alone would, without clearing, follow the sum of every
# gradient so far: after 100 batches, a sum of 100 gradients of old weights. The optimiser clears its
# parameters' gradients with its `zero_grad()` method (by default it sets them to `None`, which
# `backward()` then fills afresh).
#
# ### Clipping the gradient's norm
# The paper does not mention it, but it is a standard safety net. The first updates of an untrained
# model, or an unusual batch, can have a gradient many times larger than usual. If the gradient's
# total norm $\lVert g \rVert = \sqrt{\sum_i g_i^2}$, taken over **all** parameters together, exceeds
# a limit $c$, scale the whole gradient down to norm $c$:
#
# $$g \leftarrow g \cdot \min\!\left(1, \frac{c}{\lVert g \rVert}\right)$$
#
# The gradient's direction stays the same; only its length is capped. With plain SGD that caps the
# length of the step. Clipping entry by entry instead (every $g_i$ cut to $\pm c$) is a different
# method: it changes the gradient's direction. Three gradients of two entries, clipped both ways with
# $c = 1$:

# %%
figures.plot_gradient_clipping([(2.0, 0.5), (0.3, 0.2), (-1.5, 1.8)], clip_norm=1.0)
plt.show()

# %% [markdown]
# What goes wrong without it, with Adam? Adam divides each update by the square root of a running
# average of the squared gradient ($\beta_2 = 0.98$), so one huge gradient does not make one huge step.
# But it stays in that average for hundreds of updates and shrinks all of them. One weight, Adam with
# the paper's betas, a gradient of 1 at every update except the 50th, which is 100 times larger; the
# size of each update, as a multiple of the learning rate, with that gradient as it is and clipped to
# norm 1:

# %%
for label, spike in (("as it is", 100.0), ("clipped to norm 1", 1.0)):
    weight = torch.zeros(1, requires_grad=True)
    adam = torch.optim.Adam([weight], lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    sizes = []
    for update in range(1, 301):
        weight.grad = torch.tensor([spike if update == 50 else 1.0])  # the gradient the update reads
        before = weight.detach().clone()
        adam.step()
        sizes.append(float((weight.detach() - before).abs()) / 1e-3)  # the step, in learning rates
    print(f"{label:17s} updates 49, 50, 51, 70, 100, 200, 300:",
          ", ".join(f"{sizes[update - 1]:.2f}" for update in (49, 50, 51, 70, 100, 200, 300)))

# %% [markdown]
# `torch.nn.utils.clip_grad_norm_` clips by the total norm, in place, and returns the norm the
# gradients had before (PyTorch adds $10^{-6}$ to $\lVert g \rVert$ in the quotient). Two tensors
# whose gradients have norms 5 and 12, together $\sqrt{25 + 144} = 13$:

# %%
a, b = torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)
a.grad, b.grad = torch.tensor([3.0, 0.0, 4.0]), torch.tensor([0.0, 12.0])  # as backward() would leave them
norm_before = nn.utils.clip_grad_norm_([a, b], max_norm=1.0)
print(f"norm before: {norm_before:.1f}, after: {torch.cat([a.grad, b.grad]).norm():.6f}")
print("a.grad:", [round(value, 4) for value in a.grad.tolist()],
      " b.grad:", [round(value, 4) for value in b.grad.tolist()])

# %% [markdown]
# ### Where each update's learning rate comes from
# The optimiser's update uses the learning rate stored in its parameter group at that moment,
# `optimizer.param_groups[0]["lr"]`. The scheduler writes it there: `LambdaLR` writes the rate of
# schedule step 1 as soon as it is created (before any update), and each call of its `step()` method
# writes the rate of the next step. The schedule counts **updates**: the $k$-th update of a run must
# use the schedule's $k$-th rate. Right after `make_optimizer` the first update's rate is in place;
# and if nothing ever moved the scheduler on, every update would keep that rate, a small fraction of
# the warm-up's peak (section 11's settings):

# %%
probe = nn.Linear(2, 2)  # any parameters will do
probe_optimizer, probe_scheduler = make_optimizer(probe, d_model=256, warmup_steps=400, factor=0.5)
print(f"in the optimiser after make_optimizer: {probe_optimizer.param_groups[0]['lr']:.4e}")
print("the schedule's steps 1, 2, 3:          ",
      ", ".join(f"{noam_learning_rate(step, 256, 400, 0.5):.4e}" for step in (1, 2, 3)))
print(f"the peak, at step 400:                  {noam_learning_rate(400, 256, 400, 0.5):.4e}")

# %% [markdown]
# Moving the scheduler on too often is wrong too: the schedule would run ahead of the updates, and
# the warm-up would be over before the model had made the updates it was meant to protect. Work out,
# from what you just printed, which rate the first update uses, and which the $k$-th, for each place
# the scheduler's step could go.
#
# ### Dropout on while training, off while evaluating
# Dropout (stage 3) zeroes random activations while training and scales the rest up, so that no
# unit can rely on one particular other; when evaluating it must do nothing. Which of the two it
# does depends on a flag of every module, set on a model and all its parts by `model.train()` or
# `model.eval()`:

# %%
torch.manual_seed(0)
dropout = nn.Dropout(p=0.5)
print("train mode:", dropout.train()(torch.ones(8)).tolist())  # about half zeroed, the rest doubled
print("eval mode: ", dropout.eval()(torch.ones(8)).tolist())  # unchanged

# %% [markdown]
# A freshly built model is in train mode. `evaluate` (given, section 9) switches it to eval mode,
# and nothing switches it back by itself: every epoch after the first evaluation would then train
# without dropout, and the model would over-fit more. How much dropout matters, the paper measured:
# Table 3, row (D), varies $P_{drop}$ alone on the base model (same set-up as the table in section 5):
#
# | $P_{drop}$ | perplexity (dev) | BLEU (dev) |
# |---|---|---|
# | 0.0 | 5.77 | 24.6 |
# | 0.1 (the base model) | 4.92 | 25.8 |
# | 0.2 | 4.95 | 25.5 |
#
# Without dropout the base model loses 1.2 BLEU; the paper: "dropout is very helpful in avoiding
# over-fitting."
#
# ### What the batch brings
# Teacher forcing is already in each batch (section 3): `compute_loss` (section 6) turns one batch
# into its loss with a single forward pass, the mean over the real target tokens only, so that padding
# neither adds to the loss nor to the gradient.
#
# ## 9. Exercise: `train_epoch`
#
# `train_epoch(model, batches, criterion, optimizer, scheduler=None, device="cpu", clip_norm=1.0,
# max_steps=None, progress=True)` makes one pass over `batches` and returns the mean loss per real
# target token. The loop over the batches (at most `max_steps` of them), moving each batch to
# `device`, and the bookkeeping of the mean loss are given; the given lines after yours read the
# batch's loss tensor from the name `loss`, so keep it there. Your code goes in two places: before
# the loop, and inside it for each batch. What you write must make these hold (each is one check
# below):
#
# - dropout is on while training, also when the model arrives in eval mode after an evaluation;
# - every batch makes exactly one update of the weights, driven by the gradient of **that batch's**
#   loss alone, the loss your `compute_loss` gives;
# - when the update uses the gradients, their total norm over all parameters is at most `clip_norm`;
# - the $k$-th update of a run uses the schedule's $k$-th learning rate, epoch after epoch; with
#   `scheduler=None` the learning rate is left as it is;
# - the mean loss returned is the loss of each batch before its update;
# - and, all together, the loss falls on a small copy task.
#
# Section 8 gave each ingredient and what goes wrong without it. Which order makes all of these
# hold follows from what each ingredient reads and writes (`.grad`, the weights, the rate): work it
# out before you open a hint.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# The order matters: gradients must be cleared before the backward pass fills them, clipped after
# it and before the optimiser uses them; the schedule moves on after the update it set the rate for.
# Dropout must be on before the first forward pass of the epoch.
#
# </details>
#
# <details><summary>Hint 2: the objects</summary>
#
# The model has one method that switches training mode on; the optimiser clears and applies
# gradients (two methods); the loss tensor starts the backward pass; `nn.utils.clip_grad_norm_` takes
# `model.parameters()` and the limit; the scheduler has one method that moves it on.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
#
# Before the loop: `model.train()`. Inside it, for each batch:
#
# ```python
# optimizer.zero_grad()
# loss = compute_loss(model, batch, criterion)
# loss.backward()
# nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
# optimizer.step()
# if scheduler is not None:
#     scheduler.step()
# ```
#
# </details>

# %% solution="train_epoch"
#| include transformer_course.reference.training:train_epoch

# %% [markdown]
# ### Check your work
# The checks train tiny models on a synthetic copy task (the target equals the source). They use
# the course's own `compute_loss`, so a mistake there is only counted once, above.

# %% tests="train_epoch_learns" points=2
assert check.train_epoch_learns_copy_task(train_epoch)

# %% tests="train_epoch_mode" points=1
assert check.train_epoch_train_mode(train_epoch)

# %% tests="train_epoch_zero_grad" points=2
assert check.train_epoch_zero_grad(train_epoch)

# %% tests="train_epoch_clips" points=1
assert check.train_epoch_clips_gradients(train_epoch)

# %% tests="train_epoch_scheduler" points=1
assert check.train_epoch_follows_the_schedule(train_epoch)

# %% tests="train_epoch_mean_loss" points=1
assert check.train_epoch_mean_loss_per_token(train_epoch)

# %% tests="train_epoch_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.train_epoch_zero_grad(train_epoch, num_batches=3, seed=14)
assert check.train_epoch_clips_gradients(train_epoch, clip_norm=0.2, num_batches=3, seed=15)
assert check.train_epoch_follows_the_schedule(train_epoch, num_batches=7, d_model=32, warmup_steps=4, seed=16)
assert check.train_epoch_mean_loss_per_token(train_epoch, sizes=(2, 6, 4, 8), seed=17)
### END HIDDEN TESTS

# %% [markdown]
# **Evaluation (given)** runs the same loss without updates: `model.eval()` switches dropout off
# (forgetting it makes the validation loss noisy and too high) and `torch.no_grad()` skips the
# gradient bookkeeping, which saves memory and time.

# %%
#| include transformer_course.reference.training:evaluate


#| include transformer_course.reference.training:perplexity

# %% [markdown]
# ### A first run on a toy task, and what the missing shift looks like
# Before spending minutes on real data, make sure the whole chain learns *something* quickly. The
# copy task (the "translation" equals the input, over 8 made-up words with ids 4 to 11) is easy, so
# a tiny model should get its loss well below the starting value within a few epochs on a CPU
# (a model guessing uniformly among all 12 ids would score $\ln 12 \approx 2.5$).
#
# The same cell shows the most instructive bug of this stage: a second model is trained on batches
# whose decoder input and target are **the same** tensor (no shift). Its loss collapses almost at
# once, which looks wonderful, but it has only learned to echo the token it reads. Ask both models
# for their first word when the decoder has read only `<bos>`: the correctly trained one answers
# with the first source word; the unshifted one answers `<bos>` (id 1), its own input.


# %%
#| include transformer_course.reference.training:copy_pairs

# %%
threads = torch.get_num_threads()
torch.set_num_threads(1)  # models this tiny train fastest on one CPU thread
try:
    toy_pairs = copy_pairs(512)
    shifted = [collate(toy_pairs[start:start + 32], PAD_IDX) for start in range(0, 512, 32)]
    unshifted = []
    for batch in shifted:  # the bug: decoder input and target both the full target <bos> ... <eos>
        full = torch.cat([batch.tgt_in[:, :1], batch.tgt_out], dim=1)  # (batch, tgt_len + 1)
        unshifted.append(Batch(batch.src, full, full, batch.src_mask, make_target_mask(full, PAD_IDX)))
    test = collate(copy_pairs(6, seed=1), PAD_IDX)
    bos_only = test.tgt_in[:, :1]  # (6, 1): each decoder has read just <bos>
    print("first source words:", test.src[:, 1].tolist())
    curves = {}
    for name, batches in (("shifted (correct)", shifted), ("not shifted (the bug)", unshifted)):
        torch.manual_seed(0)
        toy = Transformer(12, 12, 32, 4, 1, 64, 20, 0.0)  # vocab 12, d_model 32, 4 heads, 1 layer
        toy_optimizer, toy_scheduler = make_optimizer(toy, 32, warmup_steps=50, factor=0.5)
        curves[name] = [train_epoch(toy, batches, make_criterion(PAD_IDX, 0.0), toy_optimizer, toy_scheduler,
                                    progress=False) for _ in range(2 if short_run() else 7)]
        first = toy.eval()(test.src, bos_only, test.src_mask, make_target_mask(bos_only, PAD_IDX)).argmax(-1)
        print(f"{name:22s} loss per epoch: {[round(loss, 2) for loss in curves[name]]}")
        print(f"{'':22s} first word predicted: {first[:, 0].tolist()}")
    figures.plot_loss_curves(curves, title="Copy task, your training loop")
    plt.show()
finally:
    torch.set_num_threads(threads)  # put back even when your code raises

# %% [markdown]
# ## 10. Exercise, a bug hunt: a classmate's `fit`
#
# A run on real data is many epochs, and each ends the same way: evaluate, record, save. A classmate
# wrote that loop over epochs, `fit`, and section 11 uses it for the real run. It calls your
# `train_epoch` and the given `evaluate`. What it promises (its docstring): train until `history`
# holds `epochs` epochs, continuing after the ones it already holds; in each epoch, train on every
# batch, then measure the validation loss without label smoothing; record per epoch the epoch, both
# losses, the learning rate the next update will use and the seconds it took; call `after_epoch`
# (to save a checkpoint) after each. Training through `fit` must be the very same training as
# calling your `train_epoch` once per epoch yourself.
#
# It runs without an error and its loss falls. Before trusting it with the long run of section 11, try
# it where you know what to expect: the copy task of section 9, with the same model, seed, batches and
# schedule, for as many epochs as the run there. Run the two cells below and compare the curves.

# %% solution="fit"
#| bug: optimizer, scheduler, device, clip_norm, => optimizer, device=device, clip_norm=clip_norm,
#| bug: max_steps, progress) => max_steps=max_steps, progress=progress)
#| bug: progress)\n        history => progress)\n        scheduler.step()\n        history
#| include transformer_course.reference.training:fit

# %%
threads = torch.get_num_threads()
torch.set_num_threads(1)
try:
    torch.manual_seed(0)
    toy = Transformer(12, 12, 32, 4, 1, 64, 20, 0.0)  # the model of section 9's run, from the same seed
    toy_optimizer, toy_scheduler = make_optimizer(toy, 32, warmup_steps=50, factor=0.5)
    toy_val = [collate(copy_pairs(64, seed=1), PAD_IDX)]  # 64 other sentences for the validation loss
    toy_history = fit(toy, shifted, toy_val, make_criterion(PAD_IDX, 0.0), toy_optimizer, toy_scheduler,
                      epochs=len(curves["shifted (correct)"]), progress=False)
    through_fit = [record["train_loss"] for record in toy_history]
    print("train_epoch once per epoch (section 9):", [round(loss, 2) for loss in curves["shifted (correct)"]])
    print("the same training through fit:         ", [round(loss, 2) for loss in through_fit])
    figures.plot_loss_curves({"train_epoch once per epoch (section 9)": curves["shifted (correct)"],
                              "the same through the classmate's fit": through_fit},
                             title="Copy task: one training, run two ways")
    plt.show()
finally:
    torch.set_num_threads(threads)

# %% [markdown]
# **What to find.** Both runs start from the same weights and call the same `train_epoch` on the same
# batches in the same order, with no dropout: nothing random differs between them. So the two curves
# should lie on top of each other, and they do not. Find what in `fit` makes its training differ and
# work out what it does to the run, then repair it in place (run the cell again, then the one under it:
# the curves must then coincide), then run the checks.

# %% [markdown]
# <details><summary>Hint 1: read the symptom</summary>
#
# Same gradients from the same weights, yet `fit`'s loss falls more slowly: its updates must be
# smaller. What sets the size of an update, and where does it come from? `fit` records in each
# epoch's record the learning rate the next update will use: print
# `[record["lr"] for record in toy_history]` and compare with section 7's schedule for the toy run
# (`noam_learning_rate(step, 32, 50, 0.5)`): which schedule step does each epoch end at?
#
# </details>
#
# <details><summary>Hint 2: where to look</summary>
#
# An epoch of the toy run is 16 updates, so after epoch $e$ the schedule should be at step
# $16e + 1$. How far does `fit`'s schedule move per epoch? Look at what `fit` hands `train_epoch`
# as its scheduler, and at what it does with the scheduler itself.
#
# </details>
#
# <details><summary>Hint 3: the line</summary>
#
# `fit` does not pass the scheduler to `train_epoch` (which then gets its default, `None`) and calls
# `scheduler.step()` once after each epoch, so the schedule counts epochs, not updates: the whole toy
# run stays in the first steps of the warm-up. Pass `scheduler` to `train_epoch` (it steps it after
# every update) and delete the per-epoch `scheduler.step()`.
#
# </details>

# %% [markdown]
# ### Check your work
# The checks run `fit` with the course's own `train_epoch`, so a mistake in yours does not count
# here again.

# %% tests="train_fit_schedule" points=3
assert check.fit_trains_as_train_epoch(fit, bug_hunt=True)

# %% tests="train_fit_history" points=1
assert check.fit_history(fit, bug_hunt=True)

# %% tests="train_fit_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.fit_trains_as_train_epoch(fit, epochs=3, num_batches=2, warmup_steps=5, seed=21)
assert check.fit_history(fit, epochs=3, resume_after=2, num_batches=2, seed=22)
### END HIDDEN TESTS

# %% [markdown]
# ### Is the warm-up needed?
#
# Section 7 gave the reasons for the warm-up; now test them on the copy task. The cell trains the
# same toy model three times with your `train_epoch`, with three schedules: the toy schedule of
# section 9 (rising to its peak at update 50, then decaying); the same schedule without the warm-up
# (its peak rate from the first update on, then the same decay from update 50); and ten times that.
# The first two differ **only** in the first 50 updates, so whatever differs between their curves
# comes from the warm-up, not from the decay; the third is ten times the second at every update.
#
# **Predict first**, and write it down: which curve falls fastest over the first epoch, and which
# ends lowest after seven? Does the ten-times rate learn at all? A loss near $\ln 9 \approx 2.2$ on
# this task is that of a model that spreads its guess evenly over the nine tokens that can come next
# (the eight words and `<eos>`): it has not learned to copy. On a CPU the cell takes some seconds.

# %%
threads = torch.get_num_threads()
torch.set_num_threads(1)
try:
    peak = noam_learning_rate(50, 32, 50, 0.5)  # the toy schedule's largest rate, at its update 50
    schedules = {"warm-up, then decay (section 9)": lambda index: noam_learning_rate(index + 1, 32, 50, 0.5),
                 "no warm-up, the same decay": lambda index: peak * min(1.0, (50 / (index + 1)) ** 0.5),
                 "no warm-up, 10 × that": lambda index: 10 * peak * min(1.0, (50 / (index + 1)) ** 0.5)}
    ablation = {}
    for name, schedule in schedules.items():
        torch.manual_seed(0)
        toy = Transformer(12, 12, 32, 4, 1, 64, 20, 0.0)
        toy_optimizer = torch.optim.Adam(toy.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        toy_scheduler = torch.optim.lr_scheduler.LambdaLR(toy_optimizer, schedule)  # rate = schedule(index)
        ablation[name] = [train_epoch(toy, shifted, make_criterion(PAD_IDX, 0.0), toy_optimizer, toy_scheduler,
                                      progress=False) for _ in range(2 if short_run() else 7)]
        print(f"{name:32s} loss per epoch: {[round(loss, 2) for loss in ablation[name]]}")
    figures.plot_rate_curves({name: [schedule(index) for index in range(112)] for name, schedule in schedules.items()},
                             title="The three schedules over the 112 updates of 7 epochs")
    figures.plot_loss_curves(ablation, title="Copy task: warm-up or not")
    plt.show()
finally:
    torch.set_num_threads(threads)

# %% [markdown]
# **Reading it.** Compare the curves with your prediction. One run is one seed, and a toy model is noisy,
# so `scripts/measure_training_choices.py` in the course repository ran the same comparison for ten seeds
# (each seed draws other sentences and other initial weights). Its results, printed by the next cell: the
# loss after the first epoch (the mean over the seeds) and after the seventh (per seed).

# %%
from transformer_course.reference import training_results  # noqa: E402  (measured by a script of the course)

ablation_measured = training_results.RESULTS["warmup_ablation"]
print(f"seeds {', '.join(str(seed) for seed in ablation_measured['seeds'])}; loss after epoch 1 and after epoch 7:")
for name, runs in ablation_measured["losses"].items():
    first, last = [losses[0] for losses in runs.values()], [losses[-1] for losses in runs.values()]
    later = [loss for losses in runs.values() for loss in losses[1:]]  # every seed, epochs 2 to 7
    print(f"  {name:30s} epoch 1: mean {sum(first) / len(first):.2f}   epoch 7: "
          + " ".join(f"{loss:.2f}" for loss in last) + f"  (mean {sum(last) / len(last):.2f});"
          f" epochs 2 to 7 between {min(later):.2f} and {max(later):.2f}")

# %% [markdown]
# The script builds its sentences and batches its own way, so even its seed 0 prints other numbers than
# the run above; but over its ten seeds the pattern of the run above held every time. Without the warm-up
# the first epoch's loss is lower (about 2.06 against 2.40 on average): big steps from the start help at
# first. But after seven epochs the run with the warm-up ends lower in all ten seeds (0.23 on average,
# against 0.35). Ten times the rate without warm-up never learns to copy: from the second epoch on its
# loss stays between 2.10 and 2.23 in every seed. There is no run of ten times the rate *with* a warm-up,
# so this does not show that a warm-up would have saved it: the rate alone may be too high. The script
# also ran a fourth schedule, the peak rate kept constant with no decay; it ends higher still (0.40 on
# average), so comparing the warm-up schedule with a constant rate, as one is tempted to, would mix the
# effect of the warm-up with that of the decay. On this tiny model the cost of skipping the warm-up is
# moderate at the peak rate; Xiong et al. (2020) found that post-LN Transformers on translation tasks
# trained far worse without warm-up.
#
# Try `label_smoothing=0.1` in `make_criterion` for one of the runs: the loss then cannot fall to 0
# (section 5), so compare the curves' shapes, not their floors.

# %% [markdown]
# ## 11. Training on Multi30k
#
# **The device.** The setup cell picked it automatically and stored it in `device`: the GPU when
# there is one, else the CPU. The model is moved there once (`.to(device)`), and `train_epoch` and
# `evaluate` move each batch there. In Colab you get a GPU with *Runtime → Change runtime type* (for
# example *T4 GPU*); then run the notebook again from the top, and the setup cell prints the device.
#
# **How long it takes.** On the 2-core machine this course was written on (an AMD EPYC virtual machine,
# torch 2.13, no GPU), one epoch of this run (116 batches, then the validation split) needed 207 and,
# measured again later, 339 seconds of CPU time on one thread (`python scripts/benchmark.py --epoch
# --threads 1` in the course repository), both times while the machine was busy with other work, which
# slows even the thread being measured. With both cores and nothing else running, the epochs of the
# course's pretrained model, the same model, took about 2.8 minutes each. So on a 2-core CPU expect
# roughly 3 minutes per epoch with nothing else running and up to 6 (the one-thread times above) when the
# machine is busy or gives you one core: 30 minutes to an hour for the 10 epochs. Colab's free CPU runtime
# often gives you two hyper-threads of one physical core (run `!lscpu` there: "Thread(s) per core: 2"),
# which compute much like one core: expect the one-thread time there. Your own run's progress bar shows
# the seconds per epoch and the time left. **No GPU time has been measured for this course yet.** On a
# GPU, read it off the same progress bar, or measure it in a checkout of the course with `python
# scripts/benchmark.py --epoch --device cuda`.
#
# The settings: a model smaller than the paper's base model (Multi30k is small; $d_{model} = 256$,
# 3 layers on each side), Adam with the warm-up schedule, label smoothing 0.1, dropout 0.1. Our
# batches of at most 4,096 padded tokens per side are far smaller than the paper's (about 25,000
# source and 25,000 target tokens), and an epoch has only 116 of them: the 10 epochs make 1,160 updates,
# against the paper's 100,000. So we warm up for 400 steps instead of 4,000: a third of this run, against
# 4 % of the paper's. With $d_{model} = 256$ and that warm-up the formula would peak at
# $3.1 \cdot 10^{-3}$; `factor = 0.5` halves that to $1.56 \cdot 10^{-3}$ (the truth cell of section 7
# printed it), still about 2.2 times the paper's peak of $7.0 \cdot 10^{-4}$. The model is smaller and
# the warm-up much shorter than the paper's; that the run trains well at this peak is what the course
# measured, not why (no run at the paper's peak was made). While the notebook is being autograded, a tiny model,
# five small batches and part of the validation split keep this part to seconds; the numbers it then
# prints mean nothing.
#
# **Where the checkpoints go.** A long run can be interrupted: Colab disconnects idle sessions and
# recycles its machines, and everything on the machine is lost then. In Colab, set
# `USE_GOOGLE_DRIVE = True` below (Colab asks once for permission to use your Drive): checkpoints
# then go to the folder `transformers_from_scratch` in your Google Drive, where they survive, and
# notebook 6 finds your trained model there. Elsewhere the folder is `transformers_from_scratch` in
# your home directory.

# %%
USE_GOOGLE_DRIVE = False  # True in Colab: keep checkpoints in your Google Drive (opt-in)
RUN_DIR = checkpoint_folder(use_google_drive=USE_GOOGLE_DRIVE)
STATE_PATH = RUN_DIR / TRAINING_STATE_NAME  # the training state, saved after every epoch

# %%
EPOCHS = 1 if short_run() else 10
MAX_STEPS = 5 if short_run() else None  # batches per epoch; None = the whole epoch
if short_run():  # a tiny model, small batches and 200 validation pairs: autograding takes seconds
    CONFIG = dict(d_model=32, num_heads=2, num_layers=1, d_ff=64, max_seq_length=128, dropout=0.1)
    MAX_TOKENS = 512
    train_loader, val_loader = make_batches(data.splits["train"]), make_batches(data.splits["val"][:200], False)
else:  # the settings of the text (again, in case a short run changed them in this session)
    CONFIG = dict(d_model=256, num_heads=8, num_layers=3, d_ff=512, max_seq_length=128, dropout=0.1)
    MAX_TOKENS = 4096
    train_loader, val_loader = make_batches(data.splits["train"]), make_batches(data.splits["val"], False)
WARMUP_STEPS, LR_FACTOR, CLIP_NORM = 400, 0.5, 1.0

torch.manual_seed(0)
model = Transformer(len(source_vocab), len(target_vocab), **CONFIG).to(device)
history: list[dict[str, float]] = []  # one record per finished epoch
criterion = make_criterion(PAD_IDX, label_smoothing=0.1)  # what we optimise
plain_criterion = make_criterion(PAD_IDX, label_smoothing=0.0)  # for validation loss and perplexity
print(f"{count_parameters(model):,} trainable parameters on {device}")


# %% [markdown]
# ### Checkpoints: save after every epoch, resume later
# To continue exactly where a run stopped, a checkpoint must hold everything that changes during
# training: the model's weights, the optimiser's state (Adam's running averages), the scheduler's
# step count, the history so far, and the state of the random number generators (dropout draws from
# them). `state_dict()` gives the first three as plain tensors and numbers. The two functions are
# given (they live in the course package; read them here).

# %%
#| include transformer_course.reference.training:save_training_state

# %%
#| include transformer_course.reference.training:resume_training

# %% [markdown]
# The next cell creates the optimiser and the scheduler for `model` and then **resumes** a saved run
# into these objects: the same `model`, `optimizer`, `scheduler` and `history`, filled in place. With
# no saved run it resumes nothing. So, after a disconnect, run the notebook from the top (with the
# same `USE_GOOGLE_DRIVE`): this cell picks up the last finished epoch and the training cell continues
# with the next one. To start over instead, delete the file it names.

# %%
optimizer, scheduler = make_optimizer(model, CONFIG["d_model"], WARMUP_STEPS, LR_FACTOR)
finished = resume_training(STATE_PATH, model, optimizer, scheduler, history, CONFIG)
if finished:
    print(f"resumed after epoch {finished} from {STATE_PATH}; the next batch uses schedule step "
          f"{scheduler.last_epoch + 1}")
else:
    print(f"no saved run at {STATE_PATH}: training starts from scratch")

# %% [markdown]
# ### The training run
# `fit` runs the epochs: each trains on every batch (in a fresh order every epoch), evaluates on the
# validation split and records the numbers; after each, `after_epoch` below saves the training state
# and this epoch's weights (the last three are kept, for averaging them at the end). The inner
# progress bar counts the batches of an epoch; the outer one counts the epochs and shows the seconds
# per epoch and the time left. Running this cell again continues with the next epoch (up to `EPOCHS`).

# %%
AVERAGE_LAST = 3  # the weights of the last three epochs are kept, to average them below


def after_epoch(history: list[dict[str, float]]) -> None:
    """Save the training state and this epoch's weights; delete the weights of older epochs."""
    save_training_state(STATE_PATH, model, optimizer, scheduler, history, CONFIG)
    epoch = history[-1]["epoch"]
    torch.save(model.state_dict(), RUN_DIR / f"weights_epoch_{epoch}.pt")
    (RUN_DIR / f"weights_epoch_{epoch - AVERAGE_LAST}.pt").unlink(missing_ok=True)


TRAIN_ANYWAY = False  # True: start the run even while a check above fails
if not (short_run() or TRAIN_ANYWAY):
    check.before_the_long_run()  # stops here while a check above fails: the run would train the wrong way
history = fit(model, train_loader, val_loader, criterion, optimizer, scheduler, EPOCHS, history, device,
              clip_norm=CLIP_NORM, max_steps=MAX_STEPS, after_epoch=after_epoch)

# %% [markdown]
# ### Curves
# Read them like this: both losses should fall quickly at first, then flatten. The training loss
# includes label smoothing and dropout, so it normally sits above the validation loss and cannot
# go below the floor computed in section 5. A validation loss that turns upward while the training
# loss keeps falling means over-fitting: among the epochs, the one with the lowest validation loss
# is the usual choice. Validation loss is not BLEU, though: in both of the course's runs below, the
# average of the last 3 epochs has a lower validation perplexity than the last epoch and a lower BLEU
# (significantly lower in one of the two).

# %%
if history:
    figures.plot_history(history, title="Multi30k German→English")
    plt.show()
else:
    print("(no history yet: run the training cell above)")

# %% [markdown]
# **Sharing the trained model.** For translating you only need the weights, the configuration and
# the two vocabularies. `checkpoint.save` stores exactly those (weights in float16, half the size)
# as `transformer_de_en.pt` in the checkpoints folder. Notebook 6 loads it when you set
# `MODEL = "mine"` there (with the same `USE_GOOGLE_DRIVE` as here), into the course's `Transformer`
# or into yours, and scores it beside the course's pretrained checkpoint.

# %%
if history:
    model_path = RUN_DIR / checkpoint.PRETRAINED_NAME
    checkpoint.save(model_path, model, CONFIG, source_vocab, target_vocab,
                    {"epochs": len(history), "val_loss": round(history[-1]["val_loss"], 4), "device": str(device)})
    print(f"saved {model_path} ({model_path.stat().st_size / 1e6:.1f} MB) after {len(history)} epochs")

# %% [markdown]
# ### Three translations
# Greedy decoding (notebook 6 explains it) on three validation sentences. After a short run (one
# epoch, or a few batches) expect poor output: repeated words, generic phrases such as "a man in a
# ...". Notebook 6 measures the quality of a model properly, with BLEU.

# %%
if history:
    for german, english in load_pairs("val")[:3]:
        print("DE :", german)
        print("REF:", english)
        print("MT :", translate(model, german, source_vocab, target_vocab, device, max_len=50), "\n")
else:
    print("(train the model first)")


# %% [markdown]
# ### Averaging checkpoints
# Section 6.1 of the paper: "For the base models, we used a single model obtained by averaging the
# last 5 checkpoints, which were written at 10-minute intervals. For the big models, we averaged
# the last 20 checkpoints." Averaging means the element-wise mean of every weight tensor over
# checkpoints **of the same run**. Late in training the learning rate is small but not zero, and
# every batch's gradient is noisy, so the weights keep wandering around a good region instead of
# settling in one point; their mean can lie nearer the middle of that region than any single
# checkpoint, and then generalises better. It costs nothing when translating: the result is one
# ordinary model.
#
# The course's pretrained model was made this way: `scripts/train_checkpoint.py` in the course
# repository saves the weights after every epoch and, at the end, averages those of the last epochs
# (for the shipped file, the last 3 of 12 epochs; its metadata, which notebook 6 prints, lists
# them). The function below does the averaging (given). The next cell averages the weights of your
# run's last three epochs, which the training cell kept, and measures the validation loss of the
# average beside the last epoch's. `model` keeps the last epoch's weights (the ones saved above for
# notebook 6).

# %%
#| include transformer_course.reference.training:average_state_dicts

# %%
kept = [RUN_DIR / f"weights_epoch_{record['epoch']}.pt" for record in history[-AVERAGE_LAST:]]
kept = [path for path in kept if path.exists()]
if len(kept) >= 2:
    last_epoch = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model.load_state_dict(average_state_dicts([torch.load(path, map_location=device, weights_only=True)
                                               for path in kept]))
    averaged_loss = evaluate(model, val_loader, plain_criterion, device)
    model.load_state_dict(last_epoch)  # back to the last epoch's weights
    print(f"validation loss, last epoch ({history[-1]['epoch']}): {history[-1]['val_loss']:.3f}; "
          f"the average of epochs {', '.join(path.stem.removeprefix('weights_epoch_') for path in kept)}: "
          f"{averaged_loss:.3f}")
else:
    print(f"averaging needs the weights of two epochs or more; this run has {len(kept)}")

# %% [markdown]
# Whether averaging helps depends on where the run is. The course's script averaged the last 3 and
# the last 5 of the 8 epochs of both Multi30k runs above (printed below, with the bootstrap test of
# each average against its run's last epoch on test_2016_flickr).

# %%
for test in smoothing_measured["paired_bootstrap_test"][1:]:
    print(f"{test['system']}: {test['bleu']:.2f} BLEU against {test['baseline_bleu']:.2f} for the last epoch "
          f"({test['difference']:+.2f}, p = {test['p_value']:.3f})")
for name, run in smoothing_measured["runs"].items():
    print(f"{name}, validation perplexity: " + ", ".join(f"{checkpoint} {measured['val_perplexity']:.2f}"
                                                        for checkpoint, measured in run["checkpoints"].items()))

# %% [markdown]
# Here averaging the last 5 epochs cost about two BLEU points in both runs, far more than chance makes
# (p = 0.001, the smallest p the test reports with its 1,000 resamplings: $1/1001$). Averaging the last 3 cost
# 0.74 points in the run with smoothing (p = 0.022) and 0.33 in
# the run without (p = 0.14: within chance). These runs were still improving fast, so epochs 4 to 8 are
# far apart and their mean is partly an earlier, worse model. The paper averaged checkpoints written 10
# minutes apart at the end of a 12-hour run, when the weights only wander around one region. Your own
# run's averaged validation loss above does not settle it: in both of the course's runs the average of
# the last 3 epochs had a lower validation perplexity than the last epoch (5.32 against 5.37, and 5.06
# against 5.18; one run each, so untested) and yet no higher BLEU, which only a BLEU measurement shows.

# %% [markdown]
# ## 12. Pitfalls
# Each of these bugs lets training *run*; only the numbers tell you something is wrong.
#
# - **Target not shifted** (the decoder reads the token it must predict): the loss drops to almost 0
#   within the first two epochs of the toy run of section 9, and the model only echoes
#   its input.
# - **The loss counts `<pad>` tokens:** the loss depends on how much padding a batch happens to
#   have, and the model spends effort learning to predict `<pad>`. On an untrained model it is still
#   about $\ln K$, so the first loss does not show it (section 6).
# - **Gradients never cleared:** every update follows the sum of all gradients so far, computed at
#   old weights; the loss falls far more slowly than it should, or jumps about.
# - **No `model.train()` / `model.eval()`:** dropout off while training (more over-fitting) or on
#   while evaluating (a noisy validation loss, higher than the model's real one).
# - **A rate far too high:** the loss gets stuck high from the second epoch on (the ten-times run of
#   section 10, which had no warm-up either).
# - **`clip_grad_value_` instead of `clip_grad_norm_`:** each gradient entry is cut separately, so
#   the update points in a different direction.
#
# ## Summary
# - Multi30k: 29,000 / 1,014 / 1,000 German–English caption pairs; spaCy blank tokenisers,
#   lowercased; vocabularies from the training split with `min_freq=2`, rare words become `<unk>`.
# - Batches are padded; with teacher forcing, one forward pass trains every position of every
#   target at once on the true preceding tokens; bucketing by length cuts the padding from about
#   half of the token slots to under a tenth.
# - The loss is cross-entropy over real target tokens (`ignore_index=pad`) with label smoothing 0.1;
#   perplexity is $e^{\text{loss}}$ without smoothing.
# - Adam with the paper's warm-up schedule
#   $\mathit{lrate} = d_{model}^{-0.5}\min(\mathit{step}^{-0.5}, \mathit{step}\cdot\mathit{warmup}^{-1.5})$;
#   gradients clipped by their total norm.
# - Training updates the weights with dropout on; evaluation runs with dropout off and without
#   gradients.
# - Checkpoints hold the model, optimiser and scheduler state, the history and the random generators, so
#   a run resumes exactly, into the same objects; in Colab, keep them in Google Drive. Averaging the
#   weights of a run's last epochs gives one ordinary model.
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
# **Question 1 (2 points).** The criterion is
# `nn.CrossEntropyLoss(ignore_index=PAD_IDX, label_smoothing=0.1)`. (a) The same five sentence pairs
# form a batch twice: once padded to a target length of 20, once with extra `<pad>` tokens appended up to
# a length of 40. Is the batch loss the same? Now put one of the five sentences into another batch, beside
# four much longer sentences: does each of its target tokens weigh as much in that batch's loss (and so
# in the gradient) as it did before? Explain both from what the mean divides by. (b) Section 5 printed
# the lowest loss that label smoothing leaves for our English vocabulary. By about how much does that
# floor rise if the vocabulary is twice as large (the same $\varepsilon = 0.1$), and why? Give a formula
# and a number.

# %% [markdown] answer="train_q_smoothing_padding" points=2
# **Model answer.** (a) Padding: the same loss. `ignore_index` drops a `<pad>` position completely: it
# adds nothing to the $(1-\varepsilon)(-\log p(y))$ term **and** nothing to the smoothing term
# $\varepsilon \cdot \frac{1}{K}\sum_k -\log p(k)$, and the mean divides by the number of real
# (non-ignored) target tokens only, so extra padding changes neither the sum nor the count (the masks
# also keep padding from changing the real positions' logits). Another batch: no. The loss is the mean
# over the batch's real target tokens, so each token weighs $1/N$, with $N$ the number of real target
# tokens in its batch. Beside four long sentences $N$ is larger, so the same sentence's tokens weigh less
# in the loss and its gradient (the loss is a mean per token, not per sentence: long sentences have
# more say). (b) The floor is the entropy of the smoothed target $q$: the correct word gets
# $a = 1 - \varepsilon + \varepsilon/K$, each other word $b = \varepsilon/K$, and
#
# $$H(q) = -a\ln a - (K-1)\,b\ln b \approx -(1-\varepsilon)\ln(1-\varepsilon) + \varepsilon\ln\frac{K}{\varepsilon}$$
#
# for a large $K$. Doubling $K$ spreads the same mass $\varepsilon$ over twice as many words, each half
# as probable, so only the second term moves, by $\varepsilon \ln 2 \approx 0.069$ nats per token
# (computed exactly for $K = 5{,}892$ and $11{,}784$: from 1.1930 to 1.2624, up by 0.0694). Whether
# `<pad>` takes part in the smoothing mass changes these numbers by less than $10^{-3}$.
#
# **Rubric.**
# - 1 point: the padded batch gives the same loss (pad positions leave both terms and the count), and
#   the sentence's tokens weigh less beside long sentences, because the mean divides by the number of
#   real target tokens in the batch (each token weighs $1/N$).
# - 1 point: about $\varepsilon \ln 2 \approx 0.07$ nats more, because the floor is the entropy of the
#   smoothed target and the smoothing mass is spread over twice as many words (a formula with the
#   number; an exact computation of both floors with the reason also scores).

# %% [markdown]
# **Question 2 (2 points).** A classmate writes their own resume code and forgets one line. Predict
# what happens in the first batches after resuming at step 1,000 of a run with a warm-up of 400 steps
# (a) if the **scheduler's** state is not restored (the optimiser's is), and (b) if the
# **optimiser's** state is not restored (the scheduler's is). Think of what each object stores.

# %% [markdown] answer="train_q_resume" points=2
# **Model answer.** (a) The scheduler stores the step count. `optimizer.load_state_dict` restores
# the learning rate stored in the optimiser's parameter group, so the first resumed batch still
# runs at the right rate; but the fresh scheduler counts from the start, and its first `step()`
# sets the rate for the second resumed batch to the step-2 warm-up value, about 1% of the rate it
# had. The warm-up then repeats: the next 400 batches learn slowly and the whole schedule is
# shifted by 1,000 steps, so later rates are larger than in the uninterrupted run. Nothing breaks;
# training just differs from the run it should continue. (b) Adam stores each weight's running
# averages of the gradient and of its square. Restarted from zero, with bias correction its first
# updates have a size of about the learning rate in every coordinate (gradient divided by its own
# magnitude), whatever that coordinate's usual gradient size. Loading the scheduler's state does not
# touch the fresh optimiser's rate, so the first resumed batch still takes a tiny step-1-sized
# step; the scheduler's next `step()` moves on from its restored count, so from the second batch on
# the rates are those of steps 1,002, 1,003, ..., exactly as in the uninterrupted run, still about
# two thirds of the peak ($\sqrt{400/1002} \approx 0.63$), far above the early warm-up rates. With no
# warm-up to soften them, these updates are large and can make the loss jump before the averages recover.
#
# **Rubric.**
# - 1 point: without the scheduler state the step count restarts: the learning rate falls to an
#   early warm-up value and the warm-up repeats (slower progress, shifted schedule). Whether the fall
#   starts at the first or the second resumed batch depends on whether the scheduler is made before or
#   after the optimiser's state is loaded (a new `LambdaLR` sets the step-1 rate when it is made): either
#   order, stated, is right.
# - 1 point: without the optimiser state Adam's moment estimates restart, so the first updates
#   are about the size of the (now large) learning rate in every coordinate, without warm-up: the loss
#   can jump, or, argued from how fast the averages recover (β₂ = 0.98), only blip for some steps; also
#   full credit for "the warm-up existed to protect exactly these first steps".

# %% [markdown]
# **Question 3 (2 points).** Averaging the weights of the last few checkpoints of one run, late in
# a long run, usually gives a model about as good as the last checkpoint or better (the course's runs
# quoted in section 11 lost BLEU by it while they were still improving fast). Predict what you get if you instead
# average the weights of two models trained separately from different random initialisations (each
# good on its own), and explain the difference.

# %% [markdown] answer="train_q_averaging" points=2
# **Model answer.** Checkpoints late in one run are close to each other: they descend from the same
# weights and differ by the noise of the last updates around one good region, so their mean stays in
# that region, near its middle, and loses nothing. Two separately trained models found different
# solutions: the same function can be written with the hidden units of a feed-forward layer, or the
# heads of an attention layer, in any order, and the two runs picked different orders and different
# features. Unit 5 of one model has nothing to do with unit 5 of the other, so their average mixes
# unrelated features; the loss between two separate solutions is generally high, and the averaged
# model is much worse than either, typically close to useless.
#
# **Rubric.**
# - 1 point: checkpoints of one run lie near one another in one low-loss region; averaging removes
#   the noise of the last updates.
# - 1 point: the two models sit in different low-loss regions (e.g. units or heads in another
#   order, different features), so their average is not a low-loss solution.

# %%
check.summary()
