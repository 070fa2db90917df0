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
# **Working time:** about 3 hours if you are at ease with PyTorch, about 4½ hours if you are new to it
# or get stuck. That is reading (73 minutes, or 96 with the folded hints), three exercises, one bug
# hunt, three predictions and three written questions, 5 to 10 minutes of setting up (Colab, the setup
# cell, saving a copy), and the training run of section 11 (ten epochs of about 3.5 minutes of CPU
# time each: 17 to 35 minutes on a 2-core CPU). (Estimated by `scripts/working_time.py` in the course
# repository from the notebook's length and the measured run time of its cells, with assumptions it
# prints, not measurements of students: for example 150 or 100 words a minute, 5 or 10 minutes per
# exercise plus 2 or 4 per line you write, 10 or 20 per bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. describe the Multi30k data set and turn its sentences into id sequences with a tokeniser and a
#    vocabulary (`min_freq`, special tokens, `<unk>` for unknown words);
# 2. build padded batches in which the decoder reads the target **shifted by one** (teacher forcing),
#    and measure how much padding length-bucketed batching saves;
# 3. write the training loss: cross-entropy that ignores padding, with label smoothing, and read
#    a loss as a perplexity;
# 4. implement the paper's warm-up learning-rate schedule and explain why Transformers need it;
# 5. write one training epoch (zero the gradients, loss, backward, clip, optimiser step, scheduler
#    step) and recognise the classic training-loop bugs from their symptoms;
# 6. train and evaluate the model, plot its curves, save a checkpoint and resume from it.
#
# **Before you start.** You need stage 4's `Transformer` (imported from the course package), a PyTorch
# training loop (gradients, `backward`, an optimiser's step), cross-entropy, and why sentences of a
# batch are padded to one length.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package),
# then the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is
# given and correct. After each exercise a few *check cells* test one property each: `✔` means it
# holds, a red `✘` block says what was expected and what came out, hints folded under it. A failing check
# does not stop the notebook: *Run all* always reaches the end, where the last cell lists every
# check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work (the
# grader also runs a few hidden ones with other sizes). The checks use small synthetic data, so they
# run in seconds and need no download.
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
import time
from collections.abc import Iterable, Sequence  # noqa: F401  (Sequence: used by the given code spliced below)
from functools import partial
from pathlib import Path  # noqa: F401  (used by the given code spliced below)
from typing import Any  # noqa: F401  (used by the given code spliced below)

import matplotlib.pyplot as plt
import torch
from torch import nn  # noqa: F401  (used by the given code spliced below)
from torch.utils.data import DataLoader
from tqdm.auto import tqdm  # progress bars: batches in train_epoch and evaluate, epochs in the training run

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
# set: each English image description comes with a German translation made by a professional
# translator. We use its translation task ("task 1"):
#
# | split | sentence pairs | used for |
# |---|---|---|
# | `train` | 29,000 | learning the weights |
# | `val` | 1,014 | watching progress, choosing settings |
# | `test_2016_flickr` | 1,000 | the final score (notebook 6) |
#
# The sentences are short, simple descriptions of photos, which makes the task small enough to
# train in minutes on a GPU, yet real.
#
# The course package downloads the six files on first use from the data set's GitHub repository,
# checks each against its published SHA-256 checksum and keeps them in a cache folder, so the
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
# "Dog" and "dog" as two separate words would halve the examples of each; lowercasing merges them.
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
# ### Teacher forcing: the target, shifted by one
# The decoder learns to predict the **next** token. During training we give it the true English
# sentence as input, one position behind the tokens it must predict: that is called
# **teacher forcing**. For the framed target `<bos> a dog runs <eos>`:
#
# | position $t$ | 0 | 1 | 2 | 3 |
# |---|---|---|---|---|
# | `tgt_in` (decoder reads) | `<bos>` | a | dog | runs |
# | `tgt_out` (must predict) | a | dog | runs | `<eos>` |
#
# `tgt_in` is the target without its **last** token, `tgt_out` is the target without its **first**
# token (`<bos>`). Position $t$ may look at `tgt_in[0..t]` (the look-ahead mask hides the rest) and
# must predict `tgt_out[t]`, which is `tgt_in[t + 1]`: the next word. One forward pass trains all
# positions at once, in parallel, which is what makes Transformers fast to train compared with RNNs.
#
# If you forget the shift and use the same tensor as input and target, position $t$ is asked to
# output the token it is reading. That is trivial: the loss drops towards zero almost at once, and
# the model has learned nothing about translation (section 10 shows it).

# %%
figures.plot_shifted_target(["<bos>", "a", "dog", "runs", "<eos>"])
plt.show()

# %% [markdown]
# With a batch the shift works the same way, on every row of the padded target tensor at once. A
# shorter sentence keeps its `<eos>` in `tgt_in`, followed by padding; those positions all have
# `<pad>` as their target, so the loss ignores them.
#
# ## 4. Exercise: `collate`
#
# `collate` turns a list of `(source ids, target ids)` pairs into one `Batch` (a small dataclass
# with the fields `src`, `tgt_in`, `tgt_out`, `src_mask`, `tgt_mask`). The padding and the masks are
# given. Write the shift: from the padded target `tgt`, an int64 tensor of shape
# `(batch, tgt_len + 1)` framed by `<bos>` ... `<eos>`, make `tgt_in` (what the decoder reads) and
# `tgt_out` (what it must predict), both `(batch, tgt_len)`, as in the table above.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Both are the whole target with one token dropped: `tgt_in` loses the token nobody reads as
# input, `tgt_out` the token nobody has to predict. Which one is which?
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# Slice the **second** axis (positions) and keep the first (sentences) whole. Dropping one end
# turns length `tgt_len + 1` into `tgt_len`; slicing makes views, no copy needed.
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
# tenth, so an epoch needs roughly half the computation for the same sentences.
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
# The second form reads: the usual cross-entropy, plus a small penalty for giving *any* word an
# extremely low probability. Why? With one-hot targets the loss keeps rewarding larger and larger
# logits for $y$, and the model becomes over-confident. With smoothing the best possible prediction
# is $p = q$, which keeps the logits bounded. The paper reports that this hurts perplexity (the model
# is, on purpose, less sure) but improves BLEU.

# %%
figures.plot_label_smoothing(vocab_size=10, correct=3, epsilon=0.1)
plt.show()

# %% [markdown]
# One consequence to remember when reading curves: with smoothing, even a perfect model has a loss
# above zero, namely the entropy of $q$. For our English vocabulary and $\varepsilon = 0.1$:

# %%
K, epsilon = len(target_vocab), 0.1
q_correct, q_other = 1 - epsilon + epsilon / K, epsilon / K
floor = -(q_correct * math.log(q_correct) + (K - 1) * q_other * math.log(q_other))
print(f"lowest possible label-smoothed training loss: {floor:.2f} nats per token")

# %% [markdown]
# **Perplexity** is $e^{\text{loss}}$ for the *un*smoothed cross-entropy: a model with perplexity
# 20 is, on average, as unsure as if it chose uniformly among 20 words. An untrained model that
# spreads probability evenly over $K$ words has perplexity $K$. We report training loss with
# smoothing (what is optimised) and validation loss and perplexity without it (what is comparable).
#
# The criterion is given:

# %%
#| include transformer_course.reference.training:make_criterion

# %% [markdown]
# ## 6. Exercise: `compute_loss`
#
# `compute_loss(model, batch, criterion)` returns the mean loss per real target token of one batch,
# a scalar tensor that can be backpropagated. The model takes
# `(src, tgt_in, src_mask, tgt_mask)`, the argument order of stage 4, and returns logits
# `(batch, tgt_len, vocab)`. `nn.CrossEntropyLoss` wants scores of shape `(N, vocab)` and targets of
# shape `(N,)` (int64). Use the `criterion` you are given (it knows the padding id and the
# smoothing); don't build a new `nn.CrossEntropyLoss()` inside the function.

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
assert check.compute_loss_values(compute_loss, batch_size=3, d_model=8, label_smoothing=0.0, seed=13)
assert check.compute_loss_ignores_padding(compute_loss, batch_size=6, extra=5, seed=14)
### END HIDDEN TESTS

# %% [markdown]
# **A sanity check you can always run before training:** an untrained model knows nothing, so its
# unsmoothed loss should be close to $\ln K$, the loss of a model that gives all $K$ words the same
# probability. A much larger starting loss points to a bug (for instance, wrong targets). Once
# training runs, the loss says how much probability the model gives the right word.
#
# **Prediction 1 (1 point).** Predict, then run: work this out on paper before you run anything. A
# model puts probability 0.5 on the right word at every position and spreads the other 0.5 evenly
# over the remaining 9,999 words of a $K = 10{,}000$-word vocabulary. What is its cross-entropy
# (natural log, no label smoothing)? Write the number (within 1%) or the arithmetic you worked out
# after `return` (`math` is allowed). A prediction is a value you work out, so the function may not
# call your code, torch or anything else of the notebook: the check refuses that. The check only
# looks at the form of your prediction and notes it: **it is scored when your notebook is graded**,
# and nothing in this notebook says whether it is right, so trying again tells you nothing. The cell
# after the check shows the truth for *another* probability: use it to test your method. The case
# you are graded on is never shown.

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
# - $\mathit{step}$ — the number of optimiser updates so far, counting from 1: one per **batch**,
#   not per epoch;
# - $\mathit{warmup\_steps}$ — the length of the warm-up (4,000 in the paper);
# - $d_{model}$ — the model width (512 in the paper): wider models get smaller steps.
#
# For $\mathit{step} < \mathit{warmup\_steps}$ the second term is the smaller one, so the rate
# **rises linearly**. Afterwards the first term is smaller and the rate **decays** like
# $1/\sqrt{\mathit{step}}$. Both terms are equal at $\mathit{step} = \mathit{warmup\_steps}$, where
# the rate is largest. We add a constant `factor` in front (1 in the paper) to tune the peak for our
# much smaller data set and batches.
#
# **Why warm up?** At the start Adam's estimate of each weight's typical gradient size comes from
# very few batches and is unreliable, so its early steps can be large and badly aimed; and a
# Transformer with LayerNorm after each residual sum, like ours and the paper's, is known to
# diverge when the first updates are too large. Small steps at first let these statistics settle;
# the later decay lets the model settle into a good minimum. (For the analyses, see Liu et al.,
# 2020, *On the Variance of the Adaptive Learning Rate and Beyond*, and Xiong et al., 2020,
# *On Layer Normalization in the Transformer Architecture*.) Without warm-up, a learning rate as
# large as the peak often makes training unstable right at the start.
#
# ## 8. Exercise, a bug hunt: `noam_learning_rate`
#
# `noam_learning_rate(step, d_model, warmup_steps, factor=1.0)` returns the formula's learning rate
# times `factor`, as a Python float. The schedule is named after Noam Shazeer, one of the paper's
# authors. One detail: a step of 0 counts as step 1, since $0^{-0.5}$ divides by zero. The optimiser
# wiring given below passes `index + 1` and so never asks for step 0, but a schedule that crashes on
# 0 is a trap for the next piece of code that calls it (one of the checks does).
#
# The code below was typed in from the paper by a classmate, with **one slip**. Training with it
# does not crash, but the rate peaks after a handful of steps (step 16 for the paper's warm-up of
# 4,000, step 8 for the 400 steps of section 11), at about 16 and 7 times the intended peak, and
# then follows the decay curve. There is no real warm-up: the first steps are exactly the large
# ones the warm-up exists to avoid. Run the cell and the figure under it, compare the curve with
# what section 7 says the schedule does, read the check's message, then find the slip and fix it
# in place.

# %% solution="noam_learning_rate"
#| bug: warmup_steps ** -1.5 => warmup_steps ** -0.5
#| bug: factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) => the paper's equation 3
#| bug: equation 3  (paper, eq. 3). => equation 3 (section 7), times factor.
#| include transformer_course.reference.training:noam_learning_rate

# %% [markdown]
# **The symptom, drawn.** Your schedule over the first 20,000 steps for the paper's settings (and
# two others). Section 7 says where the peak of each curve must be.

# %%
figures.plot_learning_rate_schedule(noam_learning_rate, settings=[(512, 4000), (512, 8000), (256, 4000)])
plt.show()

# %% [markdown]
# <details><summary>Hint 1: read the symptom</summary>
#
# The curves rise and then fall, as they should, but the peak is nowhere near `warmup_steps`: it
# comes after a handful of steps, and a longer warm-up hardly moves it. So the two terms of the
# minimum cross in the wrong place.
#
# </details>
#
# <details><summary>Hint 2: where to look</summary>
#
# The two terms cross where $\mathit{step}^{-0.5} = \mathit{step} \cdot \mathit{warmup\_steps}^{e}$,
# that is at $\mathit{step} = \mathit{warmup\_steps}^{-2e/3}$. For the peak to sit at
# `warmup_steps`, what must the exponent $e$ be? Compare it with the code.
#
# </details>
#
# <details><summary>Hint 3: the line</summary>
#
# The rising term is `step * warmup_steps ** -1.5`: the exponent is $-1.5$, not $-0.5$.
#
# </details>

# %% [markdown]
# ### Check your work

# %% tests="train_noam_values" points=3
assert check.noam_values(noam_learning_rate, bug_hunt=True)
assert check.noam_step_zero(noam_learning_rate, bug_hunt=True)

# %% tests="train_noam_peak" points=1
assert check.noam_peak_at_warmup(noam_learning_rate, bug_hunt=True)

# %% tests="train_noam_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.noam_values(noam_learning_rate, d_model=256, warmup_steps=400, factor=0.5)
assert check.noam_peak_at_warmup(noam_learning_rate, d_model=128, warmup_steps=37)
### END HIDDEN TESTS

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
# **The truth, for other settings**, from your schedule: the largest value over the first 20,000
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
# Look back at the figure under the exercise, now drawn by your fixed schedule (rerun its cell if you
# have not): a longer warm-up gives a later and lower peak, a wider model a lower curve overall.

# %% [markdown]
# **Wiring it into PyTorch (given).** `LambdaLR` multiplies the optimiser's base learning rate by
# `lr_lambda(index)`, where `index` counts the scheduler's `step()` calls from 0. With a base rate of
# 1.0 the learning rate *is* our schedule; `index + 1` makes the first batch use step 1. Each call
# of the scheduler's `step` method moves the schedule on by one, so it must be called once per batch.

# %%
#| include transformer_course.reference.training:make_optimizer

# %% [markdown]
# ## 9. Gradient clipping
#
# The paper does not mention it, but it is a standard safety net: before each update, if the
# gradient's total norm $\lVert g \rVert = \sqrt{\sum_i g_i^2}$ (over **all** parameters together)
# exceeds a limit $c$, scale the whole gradient down to norm $c$:
#
# $$g \leftarrow g \cdot \min\!\left(1, \frac{c}{\lVert g \rVert}\right)$$
#
# The gradient's direction stays the same; only its length is capped, so one unlucky batch cannot
# dominate Adam's running averages (with plain SGD this caps the step length directly).
# `nn.utils.clip_grad_norm_` (arguments: the
# parameters, then $c$) does exactly this, in place (PyTorch adds $10^{-6}$ to $\lVert g \rVert$ in the
# quotient), and it must run **after** the backward pass (which fills the gradients) and **before**
# the optimiser's update (which uses them). Its cousin
# `clip_grad_value_` clips every entry separately, which changes the gradient's direction: a
# different method, and not the one we use (the checks say so if you pick it).
#
# ## 10. Exercise: `train_epoch`
#
# The loop over batches, `model.train()` (dropout on) and the bookkeeping of the mean loss are
# given. Inside the loop, write one update for the batch: clear the old gradients, compute the loss
# with your `compute_loss` and store it in a variable named `loss` (the given lines after yours read
# it), backpropagate, clip the gradients' total norm to `clip_norm`, update the weights, then move
# the learning-rate schedule on by one step. `scheduler` may be `None` (no schedule): then skip
# that last step.
#
# **Why zero the gradients?** `backward()` *adds* to each parameter's `.grad`; it never overwrites.
# Without `zero_grad()` every update would use the sum of all gradients so far:

# %%
w = torch.tensor([1.0], requires_grad=True)
for attempt in range(3):
    (2 * w).sum().backward()  # d(2w)/dw = 2 every time
    print(f"after backward #{attempt + 1}: w.grad = {w.grad.item()}")

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# The order matters: gradients must be cleared before the backward pass fills them, clipped after
# it and before the optimiser uses them; the schedule moves on after the update it set the rate for.
#
# </details>
#
# <details><summary>Hint 2: the objects</summary>
#
# The optimiser clears and applies gradients (two methods); the loss tensor starts the backward
# pass; `nn.utils.clip_grad_norm_` takes `model.parameters()` and the limit; the scheduler has one
# method that moves it on.
#
# </details>
#
# <details><summary>Hint 3: the lines</summary>
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
assert check.train_epoch_scheduler_per_batch(train_epoch)

# %% tests="train_epoch_mean_loss" points=1
assert check.train_epoch_mean_loss_per_token(train_epoch)

# %% tests="train_epoch_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.train_epoch_zero_grad(train_epoch, num_batches=3, seed=14)
assert check.train_epoch_clips_gradients(train_epoch, clip_norm=0.2, num_batches=3, seed=15)
assert check.train_epoch_scheduler_per_batch(train_epoch, num_batches=7, d_model=32, warmup_steps=4, seed=16)
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
def copy_pairs(count: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Random sentences over the ids 4..11, each paired with itself, framed by <bos>/<eos>."""
    random = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(count):
        length = int(torch.randint(2, 7, (1,), generator=random))
        words = torch.randint(4, 12, (length,), generator=random).tolist()
        pairs.append(([1, *words, 2], [1, *words, 2]))
    return pairs

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
        print(f"{name:22s} first word predicted: {first[:, 0].tolist()}")
    figures.plot_loss_curves(curves, title="Copy task, your training loop")
    plt.show()
finally:
    torch.set_num_threads(threads)  # put back even when your code raises

# %% [markdown]
# ### Your own ablation: is the warm-up needed?
#
# Section 7 gave the reasons for the warm-up; now test them. The cell trains the same toy model on the
# copy task three times with your `train_epoch`: with the warm-up schedule of the run above; with the
# schedule's peak learning rate from the very first step and no warm-up; and with ten times that
# rate, again without warm-up. (With `scheduler=None`, your `train_epoch` leaves the rate alone.)
#
# **Predict first**, and write it down: which curve falls fastest over the first epoch, and which
# ends lowest after seven? Does the ten-times rate learn at all? A loss near $\ln 9 \approx 2.2$ on
# this task means a model that guesses among the nine possible next tokens and has learned nothing.
# On a CPU the cell takes a few seconds.

# %%
threads = torch.get_num_threads()
torch.set_num_threads(1)
try:
    peak = noam_learning_rate(50, 32, 50, 0.5)  # the toy schedule's largest rate, at its step 50
    ablation = {}
    for name, constant in (("warm-up (as above)", None), ("no warm-up, the peak rate", peak),
                           ("no warm-up, 10 × the peak", 10 * peak)):
        torch.manual_seed(0)
        toy = Transformer(12, 12, 32, 4, 1, 64, 20, 0.0)
        toy_optimizer, toy_scheduler = make_optimizer(toy, 32, warmup_steps=50, factor=0.5)
        if constant is not None:  # a constant learning rate from step 1
            toy_scheduler = None
            for group in toy_optimizer.param_groups:
                group["lr"] = constant
        ablation[name] = [train_epoch(toy, shifted, make_criterion(PAD_IDX, 0.0), toy_optimizer, toy_scheduler,
                                      progress=False) for _ in range(2 if short_run() else 7)]
        print(f"{name:26s} loss per epoch: {[round(loss, 2) for loss in ablation[name]]}")
    figures.plot_loss_curves(ablation, title="Copy task: warm-up or not")
    plt.show()
finally:
    torch.set_num_threads(threads)

# %% [markdown]
# **Reading it.** Compare the curves with your prediction. In the course's own run (torch 2.13 on a
# CPU, seed 0), the constant peak rate fell faster in the first epoch but ended above the warm-up's
# curve, and ten times that rate stalled near 2.2 from the second epoch on: it never learned to copy.
# On this tiny model the damage of skipping the warm-up is mild at the peak rate and total at ten
# times it; post-LN Transformers of the paper's size trained without warm-up did far worse even at
# much smaller rates (Xiong et al., 2020). Try `label_smoothing=0.1` in `make_criterion` for one of the runs: the loss
# then cannot fall to 0 (section 5), so compare the curves' shapes, not their floors.

# %% [markdown]
# ## 11. Training on Multi30k
#
# **The device.** The setup cell picked it automatically and stored it in `device`: the GPU when
# there is one, else the CPU. The model is moved there once (`.to(device)`), and `train_epoch` and
# `evaluate` move each batch there. In Colab you get a GPU with *Runtime → Change runtime type* (for
# example *T4 GPU*); then run the notebook again from the top, and the setup cell prints the device.
#
# **How long it takes.** One epoch of this run (116 batches, then the validation split) is about
# 3.5 minutes of computation for one core of a 2-core AMD EPYC CPU (torch 2.13), measured with
# `python scripts/benchmark.py --epoch --threads 1` from the course repository. (We measured CPU time
# on one thread because the machine was busy with other work, which makes clock times meaningless.)
# Two cores can at most halve that, so on a 2-core CPU expect between about 1.7 and 3.5 minutes per
# epoch, 17 to 35 minutes for the 10 epochs: slow, but practical. **No GPU time has been measured
# for this course yet.** On a GPU, read it off the outer progress bar of the training run (seconds
# per epoch and time left), or measure it in a checkout of the course with
# `python scripts/benchmark.py --epoch --device cuda`.
#
# The settings: a model smaller than the paper's base model (Multi30k is small; $d_{model} = 256$,
# 3 layers on each side), Adam with the warm-up schedule, label smoothing 0.1, dropout 0.1. Our
# batches of about 4,000 tokens are far smaller than the paper's (about 25,000 source and 25,000
# target tokens) and an epoch has only about 120 of them, so we warm up for 400 steps instead of 4,000.
# With $d_{model} = 256$ and that warm-up the formula would peak at $3.1 \cdot 10^{-3}$; `factor = 0.5`
# halves that to $1.56 \cdot 10^{-3}$ (the truth cell of section 8 printed it), still about 2.2 times
# the paper's peak of $7.0 \cdot 10^{-4}$: a smaller model and a much shorter warm-up tolerate, and
# need, larger steps. While the notebook is being autograded, a tiny model, five
# small batches and part of the validation split keep this part to seconds; the numbers it then
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
else:
    CONFIG = dict(d_model=256, num_heads=8, num_layers=3, d_ff=512, max_seq_length=128, dropout=0.1)
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
optimizer = scheduler = None
optimizer, scheduler = make_optimizer(model, CONFIG["d_model"], WARMUP_STEPS, LR_FACTOR)
finished = resume_training(STATE_PATH, model, optimizer, scheduler, history, CONFIG)
if finished:
    print(f"resumed after epoch {finished} from {STATE_PATH}; the next batch uses schedule step "
          f"{scheduler.last_epoch + 1}")
else:
    print(f"no saved run at {STATE_PATH}: training starts from scratch")

# %% [markdown]
# ### The training run
# Each epoch: train on every batch (a fresh shuffle of the batch order per epoch), evaluate on the
# validation split, record the numbers, save the training state. The inner progress bar counts the
# batches of an epoch; the outer one counts the epochs and shows the seconds per epoch and the time
# left. Running this cell again continues with the next epoch (up to `EPOCHS`).

# %%
if optimizer is None:  # the cell above could not build it: noam_learning_rate is not written yet
    raise NotImplementedError
epochs = tqdm(range(len(history) + 1, EPOCHS + 1), desc="epochs", unit="epoch", initial=len(history),
              total=EPOCHS)
for epoch in epochs:
    started = time.perf_counter()
    train_loader.batch_sampler.set_epoch(epoch)
    train_loss = train_epoch(model, train_loader, criterion, optimizer, scheduler, device,
                             clip_norm=CLIP_NORM, max_steps=MAX_STEPS)
    val_loss = evaluate(model, val_loader, plain_criterion, device)
    history.append({"epoch": epoch, "train_loss": train_loss, "val_loss": val_loss,
                    "lr": scheduler.get_last_lr()[0], "seconds": time.perf_counter() - started})
    save_training_state(STATE_PATH, model, optimizer, scheduler, history, CONFIG)
    epochs.write(f"epoch {epoch}: train loss {train_loss:.3f}, validation loss {val_loss:.3f}, "
                 f"perplexity {perplexity(val_loss):.1f}, learning rate {scheduler.get_last_lr()[0]:.2e}, "
                 f"{history[-1]['seconds']:.0f} s")

# %% [markdown]
# ### Curves
# Read them like this: both losses should fall quickly at first, then flatten. The training loss
# includes label smoothing and dropout, so it normally sits above the validation loss and cannot
# go below the floor computed in section 5. A validation loss that turns upward while the training
# loss keeps falling means over-fitting: the epoch with the lowest validation loss is the one to keep.

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
# settling in one point; their mean lies nearer the middle of that region and usually generalises
# a little better than any single checkpoint. It costs nothing when translating: the result is one
# ordinary model.
#
# The course's pretrained model was made this way: `scripts/train_checkpoint.py` in the course
# repository saves the weights after every epoch and, at the end, averages those of the last epochs
# (for the shipped file, the last 3 of 12 epochs; its metadata, which notebook 6 prints, lists
# them). The function below does the averaging; to try it on your run, keep a copy of
# `model.state_dict()` after each epoch (cloned tensors, in memory or on disk), average the last few
# and load the result into the model.

# %%
def average_state_dicts(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of each floating-point tensor over `states` (checkpoints of one run)."""
    averaged = {}
    for name, last in states[-1].items():
        if last.is_floating_point():
            averaged[name] = torch.stack([state[name].float() for state in states]).mean(dim=0).to(last.dtype)
        else:  # integer buffers (counters, say) are not averaged: keep the latest
            averaged[name] = last.clone()
    return averaged


if history:  # with the weights of one finished run, averaging a checkpoint with itself changes nothing
    same = average_state_dicts([model.state_dict(), model.state_dict()])
    print("unchanged:", all(torch.equal(same[name], tensor) for name, tensor in model.state_dict().items()))

# %% [markdown]
# ## 12. Pitfalls
# Each of these bugs lets training *run*; only the numbers tell you something is wrong.
#
# - **Target not shifted** (`tgt_in` equal to `tgt_out`): the loss drops to almost 0 within an
#   epoch, and the model only echoes its input (the toy run in section 10).
# - **The loss counts `<pad>` tokens:** the loss depends on how much padding a batch happens to
#   have, and the model spends effort learning to predict `<pad>`.
# - **Gradients never cleared:** they pile up batch after batch, the steps grow, and the loss
#   jumps about or diverges.
# - **Scheduler stepped once per epoch** instead of once per batch: the schedule then counts epochs,
#   so with a warm-up of 400 steps the learning rate would need 400 epochs to reach its peak.
# - **No `model.train()` / `model.eval()`:** dropout off while training (more over-fitting) or on
#   while evaluating (a noisy, too high validation loss).
# - **Learning rate too high, no warm-up:** the loss explodes or gets stuck high in the first few
#   hundred steps.
# - **`clip_grad_value_` instead of `clip_grad_norm_`:** each gradient entry is cut separately, so
#   the update points in a different direction.
#
# ## Summary
# - Multi30k: 29,000 / 1,014 / 1,000 German–English caption pairs; spaCy blank tokenisers,
#   lowercased; vocabularies from the training split with `min_freq=2`, rare words become `<unk>`.
# - Batches are padded; the decoder reads the target without its last token and predicts the target
#   without `<bos>`; bucketing by length cuts the padding from about half of the token slots to
#   under a tenth.
# - The loss is cross-entropy over real target tokens (`ignore_index=pad`) with label smoothing 0.1;
#   perplexity is $e^{\text{loss}}$ without smoothing.
# - Adam with $\mathit{lrate} = d_{model}^{-0.5}\min(\mathit{step}^{-0.5},
#   \mathit{step}\cdot\mathit{warmup}^{-1.5})$, stepped once per batch; gradients clipped by norm.
# - One update: clear the gradients → loss → backward pass → clip → optimiser update → schedule step.
# - Checkpoints hold the model, optimiser and scheduler state, the history and the random generators, so
#   a run resumes exactly, into the same objects; in Colab, keep them in Google Drive.
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
# `nn.CrossEntropyLoss(ignore_index=PAD_IDX, label_smoothing=0.1)`. The same five sentence pairs
# form a batch twice: once padded to a target length of 20, once with extra `<pad>` tokens appended
# up to a length of 40. (a) Is the batch loss the same in both cases? Explain what a `<pad>`
# position contributes to each of the two terms of the smoothed loss, and what the mean divides
# by. (b) How much does smoothing raise the lowest loss a perfect model can reach, for
# $K = 10{,}000$ and $\varepsilon = 0.1$, if `<pad>` is excluded from the smoothing mass
# ($\varepsilon$ spread evenly over the other $K - 1$ ids)? How far is that from PyTorch's version,
# which spreads $\varepsilon$ over all $K$ ids?

# %% [markdown] answer="train_q_smoothing_padding" points=2
# **Model answer.** (a) Yes, the same. `ignore_index` drops a `<pad>` position completely: it adds
# nothing to the $(1-\varepsilon)(-\log p(y))$ term **and** nothing to the smoothing term
# $\varepsilon \cdot \frac{1}{K}\sum_k -\log p(k)$, and the mean divides by the number of
# non-ignored positions only. Extra padding therefore changes neither the sum nor the count (the
# masks also keep padding from changing the real positions' logits). (b) The best possible
# prediction is $p = q$, so the floor is the entropy of the smoothed target. With `<pad>` excluded,
# the correct word gets $a = 1 - \varepsilon + \varepsilon/(K-1)$, each of the $K - 2$ other
# ids $b = \varepsilon/(K-1)$ and `<pad>` nothing:
#
# $$H(q) = -a\ln a - (K-2)\,b\ln b \approx -(1-\varepsilon)\ln(1-\varepsilon) - \varepsilon\ln\frac{\varepsilon}{K}
#   \approx 0.095 + 1.151 = 1.246$$
#
# nats per token, up from 0 without smoothing. PyTorch's version
# (`ignore_index` only drops the padded *positions*; at a real position `<pad>` is still one of the
# $K$ ids and gets $\varepsilon/K$) has the floor $1.24599$ instead of $1.24598$: about $10^{-5}$
# nats more, a negligible difference, and the correct word stays the most probable either way.
#
# **Rubric.**
# - 1 point: same loss: pad positions are excluded from both the cross-entropy and the smoothing
#   term, and the mean divides by the number of real (non-pad) target tokens.
# - 1 point: the floor is the entropy of the smoothed target, about 1.25 nats per token for
#   $K = 10{,}000$ and $\varepsilon = 0.1$ (a formula with numbers), and including `<pad>` in the
#   smoothing, as PyTorch does, changes it only negligibly (about $10^{-5}$ nats).

# %% [markdown]
# **Question 2 (2 points).** A classmate writes their own resume code and forgets one line. Predict
# what happens in the first batches after resuming at step 2,000 of a run with a warm-up of 400 steps
# (a) if the **scheduler's** state is not restored (the optimiser's is), and (b) if the
# **optimiser's** state is not restored (the scheduler's is). Think of what each object stores.

# %% [markdown] answer="train_q_resume" points=2
# **Model answer.** (a) The scheduler stores the step count. `optimizer.load_state_dict` restores
# the learning rate stored in the optimiser's parameter group, so the first resumed batch still
# runs at the right rate; but the fresh scheduler counts from the start, and its first `step()`
# sets the rate for the second resumed batch to the step-2 warm-up value, about 1% of the rate it
# had. The warm-up then repeats: the next 400 batches learn slowly and the whole schedule is
# shifted by 2,000 steps, so later rates are larger than in the uninterrupted run. Nothing breaks;
# training just differs from the run it should continue. (b) Adam stores each weight's running
# averages of the gradient and of its square. Restarted from zero, with bias correction its first
# updates have a size of about the learning rate in every coordinate (gradient divided by its own
# magnitude), whatever that coordinate's usual gradient size. Loading the scheduler's state does not
# touch the fresh optimiser's rate, so the first resumed batch still takes a tiny step-1-sized
# step; from the second batch on the rate is the one of step 2,001, still about half its peak
# ($\sqrt{400/2000} \approx 0.45$), far above the early warm-up rates. With no warm-up to soften
# them, these updates are large and can make the loss jump before the averages recover.
#
# **Rubric.**
# - 1 point: without the scheduler state the step count restarts: the learning rate falls to an
#   early warm-up value (from the second resumed batch on) and the warm-up repeats (slower
#   progress, shifted schedule).
# - 1 point: without the optimiser state Adam's moment estimates restart, so the first updates
#   are about the size of the (now large) learning rate in every coordinate, without warm-up: a jump
#   in the loss; also full credit for "the warm-up existed to protect exactly these first steps".

# %% [markdown]
# **Question 3 (2 points).** Averaging the weights of the last few checkpoints of one run usually
# gives a model at least as good as the last checkpoint. Predict what you get if you instead
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
# model is much worse than either, typically close to useless (a loss near or above the untrained
# model's is possible).
#
# **Rubric.**
# - 1 point: checkpoints of one run lie near one another in one low-loss region; averaging removes
#   the noise of the last updates.
# - 1 point: the two models sit in different low-loss regions (e.g. units or heads in another
#   order, different features), so their average is not a low-loss solution.

# %%
check.summary()
