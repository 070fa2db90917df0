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
# # Stage 6 — Greedy decoding, BLEU and attention heatmaps
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
# | 5 | training on Multi30k German→English |
# | **6** | **greedy decoding, BLEU, attention heatmaps** (this one) |
# | 7 (optional) | the key/value cache and beam search |
#
# **Working time:** about 2¾ hours if you are at ease with PyTorch, about 4¾ hours if you are new to it or get
# stuck. That is reading (60 minutes at 150 words a minute without the folded hints, 85 at 100 words a minute
# with them, and the given code at 10 lines a minute), three exercises, one bug hunt, two predictions and
# three written questions, 5 to 10 minutes of setting up (Colab, the setup cell, saving a copy), and about a
# minute of computation on one CPU core, BLEU on all 1,000 test sentences included. (Estimated by
# `scripts/working_time.py` in the course repository from the notebook's length and the measured run time of
# its cells, with assumptions it prints, not measurements of students: for example 150 or 100 words a minute,
# 5 or 10 minutes per exercise plus 2 or 4 per line you write, 10 or 20 per bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. explain why training runs all target positions in parallel while translating runs step by step,
#    and say what greedy decoding and beam search each do;
# 2. implement batched greedy decoding that stops every sentence at its own `<eos>`, pads finished
#    sentences and respects a maximum length;
# 3. load a pretrained checkpoint into the model of stage 4 and translate German test sentences;
# 4. explain why BLEU clips its n-gram counts, takes a geometric mean, adds a brevity penalty and is
#    computed over the whole corpus; compute corpus BLEU yourself and match sacreBLEU's score; state the
#    exact recipe behind a BLEU number;
# 5. collect the attention weights of every layer and read cross-attention, encoder self-attention
#    and decoder self-attention heatmaps, per layer and head;
# 6. recognise the classic decoding bugs from their symptoms, and find a batching bug from what it does
#    to the translations.
#
# **Before you start.** You need stages 4 and 5: the model's forward pass with its masks, and the
# vocabulary's `<bos>`, `<eos>` and `<pad>`. A trained model is provided (the course's checkpoint), so
# notebook 5's training run is not needed. For BLEU: logarithms and a geometric mean.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package),
# then the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is
# given and correct, apart from the bug hunt's code, which says so. After each exercise a few *check
# cells* test one property each: `✔` means it
# holds, a red `✘` block says what was expected and what came out, hints folded under it. A failing check
# does not stop the notebook: *Run all* always reaches the end, where the last cell lists every
# check with its points. (To stop at the first failing check instead, set
# `STOP_AT_FIRST_FAILURE = True` in the settings cell.) The check cells also grade your work (the
# grader also runs a few hidden ones with other sizes). The model classes come from the course
# package (`transformer_course.reference`): they are the stage-4 architecture you wrote, so a bug
# left in an earlier notebook cannot break this one.
#
# <!-- keep-and-hand-in -->

# %% readonly="setup"
#| setup

# %%
#| settings

# %%
import math  # noqa: F401  (here for your own code)
import time
from collections import Counter  # noqa: F401  (here for your own code)

import matplotlib.pyplot as plt
import sacrebleu
import torch
from torch import nn

from transformer_course.checks import decoding as check
from transformer_course.data.tokenize import Tokenizer
from transformer_course.data.vocab import Vocab  # noqa: F401  (translate_batch's type hints)
from transformer_course.reference import Transformer, count_parameters, make_source_mask, make_target_mask
from transformer_course.reference.checkpoint import load, pretrained_path, read_metadata, select
from transformer_course.reference.translation import corpus_bleu, prepare_data
from transformer_course.runtime import checkpoint_folder, short_run
from transformer_course.visualisation import attention_maps as heatmaps
from transformer_course.visualisation import decoding as figures
from transformer_course.visualisation import diagrams

# %% [markdown]
# ## 1. From training to translating
#
# **Training is parallel.** In stage 5 the decoder saw the reference translation during training
# (*teacher forcing*): for the pair "ein Hund läuft" → "a dog runs" its input was
# `<bos> a dog runs` and its targets were `a dog runs <eos>`, each target the input shifted left by
# one. The look-ahead mask made position $t$ see only the inputs $0, \dots, t$, so a single forward
# pass produced the predictions for *every* position at once.
#
# **Translating is step by step.** For a new sentence there is no reference. The word at position
# $t$ is whatever the model chose at step $t$, so it cannot be fed in before that step has run.
# The decoder therefore runs once per output word, each time on everything written so far:
#
# $$\hat y_t = \operatorname*{arg\,max}_{w \in V} \; P\left(w \mid \hat y_0, \dots, \hat y_{t-1},\, x\right),
#   \qquad \hat y_0 = \langle\text{bos}\rangle$$
#
# - $x$ — the source (German) sentence, encoded **once** by the encoder;
# - $\hat y_0, \dots, \hat y_{t-1}$ — the tokens written so far, starting with `<bos>`;
# - $V$ — the target vocabulary; $P(w \mid \dots)$ — the softmax of the decoder's logits at the
#   **last** position, the one that predicts what comes next;
# - $\arg\max$ — pick the most likely word. Stop when that word is `<eos>`, or after a maximum
#   number of steps.
#
# In the diagram, the decoder's input "outputs (shifted right)" is exactly that growing sequence.

# %%
diagrams.show("transformer")

# %% [markdown]
# **Greedy search and beam search.** Taking the single most likely word at every step is *greedy*
# decoding. It is fast and simple, but a choice can never be undone: a word that looks best now can
# lead into a sentence that is worse overall. *Beam search* keeps the $k$ best partial sentences
# (the beam, e.g. $k = 4$) at every step, extends each of them by every possible word, and keeps the
# $k$ best extensions by total log-probability (usually divided by a length term, or it would favour
# short sentences). The paper used beam size 4 with a length penalty $\alpha = 0.6$. This notebook
# implements greedy decoding; stage 7 (optional) adds beam search and measures what it gains on this
# course's model.
#
# **A tiny worked example.** The "model" below is a hand-made table of next-word probabilities for
# each prefix. Greedy decoding follows the best word at each step; listing every sentence shows that
# the best *sentence* starts with the word greedy rejected.

# %%
toy_model = {  # prefix (words so far) -> probability of each next word
    (): {"the": 0.5, "a": 0.4, "<eos>": 0.1},
    ("the",): {"dog": 0.45, "cat": 0.4, "<eos>": 0.15},
    ("a",): {"dog": 0.9, "cat": 0.1},
    ("the", "dog"): {"<eos>": 0.7, "runs": 0.3},
    ("the", "cat"): {"<eos>": 0.6, "runs": 0.4},
    ("a", "dog"): {"<eos>": 0.8, "runs": 0.2},
}


def toy_greedy(model: dict, max_len: int = 4) -> tuple[list[str], float, list]:
    words, probability, steps = [], 1.0, []
    for _ in range(max_len):
        options = model.get(tuple(words), {"<eos>": 1.0})  # an unknown prefix can only end
        ranked = sorted(options, key=options.get, reverse=True)
        steps.append((" ".join(["<bos>", *words]), ranked, [options[w] for w in ranked]))
        best = ranked[0]  # the argmax
        probability *= options[best]
        if best == "<eos>":
            break
        words.append(best)
    return words, probability, steps


# %%
def all_sentences(model: dict, prefix: tuple = ()) -> list[tuple[tuple, float]]:
    """Every complete sentence the toy model can write, with its probability (the product of its steps)."""
    sentences = []
    for word, p in model.get(prefix, {"<eos>": 1.0}).items():
        if word == "<eos>":
            sentences.append((prefix, p))
        else:
            sentences += [(words, p * rest) for words, rest in all_sentences(model, (*prefix, word))]
    return sentences


greedy_words, greedy_probability, toy_steps = toy_greedy(toy_model)
print(f"greedy: {' '.join(greedy_words)!r:14} probability {greedy_probability:.3f}")
print("the three most likely sentences:")
for words, p in sorted(all_sentences(toy_model), key=lambda pair: -pair[1])[:3]:
    print(f"        {' '.join(words)!r:14} probability {p:.3f}")
figures.plot_next_token_choices(toy_steps, title="Greedy decoding on the toy model (orange: the word taken)")
plt.show()

# %% [markdown]
# Greedy takes "the" (0.5 beats 0.4) and ends with "the dog" at probability
# $0.5 \cdot 0.45 \cdot 0.7 \approx 0.16$, while "a dog" has $0.4 \cdot 0.9 \cdot 0.8 = 0.288$. A beam of
# size 2 would have kept "a" at step 1 and found it. Real models are less extreme, but this is why
# beam search helps a little.

# %% [markdown]
# ## 2. Greedy decoding for a whole batch
#
# Translating one sentence at a time wastes the hardware, so we decode a batch `src` `(batch, src_len)`
# together. Four facts shape the loop; each is a requirement your code must meet, and the table below shows
# all four on an example.
#
# - **The source is encoded once.** The German sentence does not change while the English one is written,
#   so the encoder's output `enc_out` `(batch, src_len, d_model)` is the same at every step: encoding it again
#   would give the same tensor, only slower. (The given lines compute it before the loop.)
# - **Each step sees everything written so far, as in training.** The decoder was trained on whole prefixes,
#   with the source mask and the look-ahead mask, so every step gives it the whole prefix `ys` as it is now
#   (it grows by one column per step), with the masks it was trained with. It answers with one row of logits
#   per position of the prefix, and section 1 says which row predicts the next word.
# - **Sentences end at different steps.** A batch is one tensor, so a sentence that has said `<eos>` still
#   gets a new column at every later step. What the model predicts there is not part of its translation: the
#   contract fills it with `<pad>`, at every step after the `<eos>`.
# - **The loop ends when nothing is left to write:** once every sentence has said `<eos>`, or after `max_len`
#   generated tokens for a model that never says it.
#
# `max_len` counts generated tokens, not `<bos>`: the result has at most `max_len + 1` columns.
# Every step runs the decoder over the whole prefix again, so a sentence of $n$ words costs about
# $n^2/2$ position-steps. Stage 7 keeps the keys and values of earlier positions in a cache and
# computes only the newest position; we keep the simple version here.
#
# **The bookkeeping on an example.** Two sentences, "a dog runs ." and "people .":
#
# | step | new tokens | `ys` after the step | ended |
# |---|---|---|---|
# | 0 | — | `<bos>` / `<bos>` | no, no |
# | 1 | a, people | `<bos> a` / `<bos> people` | no, no |
# | 2 | dog, . | `<bos> a dog` / `<bos> people .` | no, no |
# | 3 | runs, `<eos>` | `… dog runs` / `… people . <eos>` | no, **yes** |
# | 4 | ., ~~in~~ → `<pad>` | `… runs .` / `… <eos> <pad>` | no, yes |
# | 5 | `<eos>`, `<pad>` | `… runs . <eos>` / `… <eos> <pad> <pad>` | **yes**, yes → stop |
#
# At step 4 the model still "wants" to write *in* for the finished sentence: it gets `<pad>` instead.
# Sentences end at different steps, so the rows of `ys` end in different amounts of padding.

# %% [markdown]
# ### What goes wrong, and what it looks like
# - a translation that runs on to `max_len`, with words repeated after its end;
# - words in `ys` after a sentence's `<eos>`;
# - a sentence that gets one `<pad>` after its `<eos>` and then words again;
# - a batch that stops as soon as its shortest translation is done, cutting the others off;
# - the same word at every step, the one that follows `<bos>`;
# - the same sentence translated differently on every call;
# - one column too few or too many;
# - the first word of every sentence right and later words different from the checks' expected ones, with
#   no error raised.
#
# <details><summary>The causes behind these symptoms (open this when a check fails and you are stuck)</summary>
#
# In the same order: the loop never noticed the `<eos>`; the sentence was not treated as finished; the
# loop forgot, a step later, that the sentence had ended; the loop stopped when *any* sentence was
# done; the next word was read from the wrong row of the logits; dropout is on (the given first line,
# `model.eval()`, prevents it); the count of columns is off (`max_len` generated tokens, plus
# `<bos>`); something built for a prefix of one token was used for longer ones (a mask of one position
# broadcasts over any length without an error).
#
# </details>

# %% [markdown]
# ## 3. Exercise: `greedy_decode`
#
# Write the loop between the markers. The given lines put the model in eval mode, build `src_mask`,
# encode the source once into `enc_out`, and create `ys` (full of `bos_idx`) and `finished` (all
# `False`); the given `return ys` hands back the result. `make_source_mask` and `make_target_mask`
# are imported above. The decorator `@torch.no_grad()` switches gradient tracking off: decoding never
# trains.
#
# **The contract.** `greedy_decode(model, src, pad_idx, bos_idx, eos_idx, max_len)` takes `src`
# `(batch, src_len)` of `torch.long` ids and returns `ys` `(batch, out_len)`, `torch.long`, with
# `out_len <= max_len + 1`: column 0 is `<bos>`, each row holds its sentence's tokens up to and
# including its `<eos>`, and `pad_idx` after that. The loop stops as soon as every sentence has
# produced `<eos>`, or after `max_len` generated tokens.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# One pass of the loop is one step of the table in section 2: run the decoder on everything written
# so far, keep only what the last position predicts, overwrite the rows of finished sentences, append,
# update `finished`, and leave the loop early when nothing is left to write. `tensor.all()` returns a
# one-element bool tensor that `if` understands.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# At a step where `ys` is `(batch, len)`: the target mask is built from this `ys`; the decoder returns
# `(batch, len, vocab)`; the last position's logits are `(batch, vocab)`; the argmax over the
# vocabulary gives one id per sentence, `(batch,)`, the same shape as `finished`; to append it as a
# column it must become `(batch, 1)`, and the new `ys` is `(batch, len + 1)`.
#
# </details>
#
# <details><summary>Hint 3: the hardest line</summary>
#
# Replacing the new token of every finished sentence by `<pad>` in one operation, with `finished` a
# `(batch,)` bool tensor: `next_token = next_token.masked_fill(finished, pad_idx)` (or
# `torch.where(finished, pad_idx, next_token)`).
#
# </details>

# %% solution="greedy_decode"
#| include transformer_course.reference.decoding:greedy_decode

# %% [markdown]
# ### Check your work
# The first checks run your function on a *scripted* model: a stand-in whose next word is fixed in
# advance for every sentence and step, so the expected output is known exactly. The later ones run a
# small real Transformer with random weights and compare your tokens with the reference
# implementation. Read the message of the first failing check: fix that, rerun the exercise cell,
# then rerun the checks.

# %% tests="dec_greedy_starts_with_bos" points=1
assert check.greedy_starts_with_bos(greedy_decode)

# %% tests="dec_greedy_stops_at_eos" points=2
assert check.greedy_stops_at_eos(greedy_decode)

# %% tests="dec_greedy_max_len" points=1
assert check.greedy_respects_max_len(greedy_decode)

# %% tests="dec_greedy_all_finished" points=1
assert check.greedy_stops_when_all_finished(greedy_decode)

# %% tests="dec_greedy_last_position" points=1
assert check.greedy_uses_last_position(greedy_decode)

# %% tests="dec_greedy_masks" points=1
assert check.greedy_passes_masks(greedy_decode)

# %% tests="dec_greedy_scripted_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.greedy_starts_with_bos(greedy_decode, bos_idx=2, eos_idx=0, pad_idx=1)
assert check.greedy_stops_at_eos(greedy_decode, bos_idx=2, eos_idx=0, pad_idx=1, max_len=9,
                                 sentences=((7, 7, 7, "eos"), (5, "eos"), ("eos",), (8, 6, 8, 6, 8, 6, "eos")))
assert check.greedy_respects_max_len(greedy_decode, max_len=7, bos_idx=2, eos_idx=0, pad_idx=1)
assert check.greedy_stops_when_all_finished(greedy_decode, max_len=6, bos_idx=2, eos_idx=0, pad_idx=1)
assert check.greedy_passes_masks(greedy_decode, bos_idx=2, eos_idx=0, pad_idx=1)
### END HIDDEN TESTS

# %% tests="dec_greedy_matches_reference" points=2
assert check.greedy_matches_reference(greedy_decode)

# %% tests="dec_greedy_matches_reference_batch" points=2
assert check.greedy_matches_reference_batch(greedy_decode)

# %% tests="dec_greedy_deterministic" points=1
assert check.greedy_is_deterministic(greedy_decode)

# %% tests="dec_greedy_mode" points=1
assert check.greedy_eval_no_grad(greedy_decode)

# %% tests="dec_greedy_reference_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.greedy_matches_reference(greedy_decode, eos_idx=7, src_len=5, num_layers=3, num_heads=2,
                                      d_model=12, d_ff=24, seed=4)
assert check.greedy_matches_reference_batch(greedy_decode, eos_idx=7, batch=5, src_len=9, num_heads=8, max_len=12,
                                            seed=3)
### END HIDDEN TESTS

# %% [markdown]
# ### Predict, then run
# Work this out on paper before you run anything: it follows from the loop you just wrote. Write your
# prediction after `return`: a number, or the arithmetic you worked out (`math` is allowed). A
# prediction is a value you work out, so the function may not call your `greedy_decode`, torch or
# anything else of the notebook: the check refuses that. The check only looks at the form of your
# prediction and notes it: **it is scored when your notebook is graded**, and nothing in this
# notebook says whether it is right, so trying again tells you nothing. The cell after the check
# shows the truth for *another* batch: use it to test your method. The answer you are graded on is
# never printed.
#
# **Prediction 1 (1 point).** A batch of three sentences is decoded with `max_len=12`. The model would
# end the first sentence with `<eos>` as its 4th generated token, the second as its 9th and the third
# as its 2nd. How many times does your `greedy_decode` call `model.decoder`?

# %% solution="dec_predict_decoder_calls"
def predict_decoder_calls() -> int:
    """Your prediction of the number of model.decoder calls (ends after 4, 9 and 2 tokens, max_len=12)."""
    ### BEGIN SOLUTION
    return max(4, 9, 2)  # one call per step; the batch runs until its longest sentence has said <eos>
    ### END SOLUTION


# %% tests="dec_predicted_decoder_calls" points=1
assert check.predicted_decoder_calls(predict_decoder_calls)

# %% [markdown]
# **The truth, for another batch.** The cell below builds a stand-in model whose sentence $b$ writes
# word 4 until its step `ends[b]`, where it writes `<eos>`, counts the calls of its decoder, and decodes
# it with your `greedy_decode`, for two batches: sentences that end after 3, 7 and 5 tokens with
# `max_len=6`, and sentences that end after 2 and 5 tokens with `max_len=10`. Check that your method gives
# these numbers too; where it does not, find the step of your reasoning that went wrong.

# %%
class StandIn(nn.Module):
    """Sentence b says word 4 until its ends[b]-th token, which is <eos>; counts the decoder's calls."""

    def __init__(self, ends: list[int], eos: int = 2, vocab: int = 8) -> None:
        super().__init__()
        self.ends, self.eos, self.vocab, self.calls = torch.tensor(ends), eos, vocab, 0

    def encoder(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        return torch.zeros(src.size(0), src.size(1), 4)  # (batch, src_len, 4): not used

    def decoder(self, ys, enc_out, src_mask, tgt_mask) -> torch.Tensor:
        self.calls += 1
        logits = torch.zeros(ys.size(0), ys.size(1), self.vocab)  # (batch, len, vocab)
        logits[:, :, 4] = 1.0  # the same scores at every position of the prefix
        logits[ys.size(1) >= self.ends, :, self.eos] = 2.0  # the next token is token number ys.size(1)
        return logits


for ends, max_len in (([3, 7, 5], 6), ([2, 5], 10)):
    stand_in = StandIn(ends)
    ys = greedy_decode(stand_in, torch.ones(len(ends), 5, dtype=torch.long), 3, 1, 2, max_len)  # pad 3, bos 1, eos 2
    print(f"ends after {ends}, max_len={max_len}: {stand_in.calls} decoder calls; ys has {ys.size(1)} columns")

# %% [markdown]
# ## 4. The pretrained checkpoint
#
# Training this model to a useful quality takes a while (12 epochs for this one: the metadata below
# says how many minutes they took on a 2-core CPU that was shared with other work, and notebook 5
# says what to expect per epoch), so the course ships a trained one. It was produced by
# `scripts/train_checkpoint.py` in the course repository: the reference model (the stage-4
# architecture), trained on the 29,000 Multi30k training pairs with the recipe of stage 5 (label
# smoothing 0.1, Adam with warm-up, dropout 0.1), its final weights averaged over the last few
# epochs, then scored with greedy decoding.
#
# The file holds four things: the **configuration** (`d_model`, `num_heads`, ...), the **weights**
# (`state_dict`, stored in float16 to halve the file), **both vocabularies** (the ids only mean
# something together with them), and **metadata** (the scores and how it was trained).
# `pretrained_path()` finds it: the environment variable `TRANSFORMER_COURSE_CHECKPOINT`, else
# `assets/checkpoint/` of a course checkout, else a copy downloaded once into your cache.
# `load(path, Transformer)` builds `Transformer(len(source_vocab), len(target_vocab), **config)`,
# loads the weights by parameter name and switches to eval mode. Any class with the course's
# parameter names works, which is why we insisted on the given constructors: your own stage-4
# `Transformer` loads this file too.
#
# **Your model or the course's.** If you trained the model of notebook 5 to the end, it saved your
# own `transformer_de_en.pt` in its checkpoints folder. Set `MODEL = "mine"` below to translate with
# it (with the same `USE_GOOGLE_DRIVE` as in notebook 5); the default, `"shipped"`, takes the course's
# checkpoint. Everything in this notebook works with either, and section 6 reports your model's BLEU
# beside the course checkpoint's. (When no checkpoint of yours is found, the cell says so and takes
# the course's.)

# %%
MODEL = "shipped"  # "shipped": the course's pretrained checkpoint; "mine": the one notebook 5 saved
USE_GOOGLE_DRIVE = False  # as in notebook 5 (in Colab, True if your checkpoints are in Google Drive)
path, chosen = select(MODEL, checkpoint_folder(USE_GOOGLE_DRIVE) if MODEL == "mine" else None)
print("translating with", chosen)
mine = path != pretrained_path()  # False when MODEL is "shipped" or no checkpoint of yours was found
shipped_bleu = read_metadata(pretrained_path())["test_bleu"]  # the course checkpoint's recorded score

# %%
model, source_vocab, target_vocab, metadata = load(path, Transformer, device=device)
print(f"{path.name}: {count_parameters(model):,} parameters, vocabularies: German {len(source_vocab):,}, "
      f"English {len(target_vocab):,} tokens")
print("special ids: <bos> =", target_vocab.bos_idx, " <eos> =", target_vocab.eos_idx,
      " <pad> =", target_vocab.pad_idx)
for key in ("test_bleu", "val_bleu", "bleu_signature", "epochs", "averaged_epochs", "training_minutes",
            "device", "command"):
    print(f"{key:>17}: {metadata.get(key)}")

# %% [markdown]
# The test set, `test_2016_flickr`, has 1,000 German captions with one English reference each. We
# tokenise it with the checkpoint's vocabularies (a word the model never saw becomes `<unk>`).
# `data.splits[...]` holds `(source ids, target ids)` pairs with `<bos>`/`<eos>`, `data.references`
# the tokenised, lowercased English references as strings.

# %%
data = prepare_data(splits=("test_2016_flickr",), vocabs=(source_vocab, target_vocab))
test_sources = [source for source, _ in data.splits["test_2016_flickr"]]
test_references = data.references["test_2016_flickr"]
test_german = data.sources["test_2016_flickr"]
print(len(test_sources), "test pairs; the first one:")
print("  German   :", test_german[0])
print("  ids      :", test_sources[0])
print("  reference:", test_references[0])

# %% [markdown]
# ## 5. Exercise, a bug hunt: translating the test set in batches
#
# `translate_batch(model, sources, source_vocab, target_vocab, batch_size=256, max_len=80)` translates a
# list of encoded German sentences (lists of ids with `<bos>` and `<eos>`, of different lengths) with
# **your** `greedy_decode`. It sorts the sentences by length (sentences of similar lengths share a batch, so
# little padding is wasted), puts each batch of at most `batch_size` sentences into one `(batch, longest)`
# tensor, decodes it, and turns every row back into words with `target_vocab.decode`, which drops `<bos>` and
# `<pad>` and stops at `<eos>`. It returns one list of English tokens per sentence, in the order of
# `sources`. A sentence's translation must not depend on which other sentences share its batch. The
# settings (batches of 256, `max_len=80`) are those the checkpoint's own score was measured with.
#
# This function was written by a classmate, with **one mistake**. It runs without an error and most of
# its translations look right. Run it and the two cells under it: the first translates eight test
# sentences in one batch, the second translates each of them on its own. Read what differs, find the
# mistake and fix it in place; the check cells below them grade the repair.

# %% [markdown]
# <details><summary>Hint 1: read the symptom</summary>
#
# Which sentences change when they are translated together, and how? Compare what is added to each with
# how much shorter it is than the longest sentence of the batch.
#
# </details>
#
# <details><summary>Hint 2: where to look</summary>
#
# The only thing the other sentences of a batch change for one sentence is its row of the batch tensor:
# what sits in that row after the sentence's own `<eos>`, and what does the model's source mask treat as
# "not a word"?
#
# </details>

# %% solution="translate_batch"
#| bug: full((len(chunk), longest), source_vocab.pad_idx) => zeros(len(chunk), longest, dtype=torch.long)
#| include transformer_course.reference.translation:translate_batch

# %% [markdown]
# Eight test sentences, translated in one batch, side by side with their references. Expect fluent,
# mostly right captions; typical errors of a correct model are rare words (`<unk>`), a wrong colour or
# number, and a dropped detail.

# %%
picked = [0, 1, 4, 6, 8, 9, 10, 15]
together = translate_batch(model, [test_sources[i] for i in picked], source_vocab, target_vocab)
for index, tokens in zip(picked, together, strict=True):
    print(f"[{index}] German   : {test_german[index]}  ({len(test_sources[index])} tokens with <bos> and <eos>)")
    print(f"     reference: {test_references[index]}")
    print(f"     model    : {' '.join(tokens)}\n")

# %% [markdown]
# **Alone and together.** The same eight sentences, each translated in a batch of its own. A translation
# depends only on its own sentence, so the two lists must agree.

# %%
alone = [translate_batch(model, [test_sources[i]], source_vocab, target_vocab)[0] for i in picked]
for index, tokens_together, tokens_alone in zip(picked, together, alone, strict=True):
    if tokens_together == tokens_alone:
        print(f"[{index}] the same alone and in the batch")
    else:
        print(f"[{index}] alone     : {' '.join(tokens_alone)}\n     in batch : {' '.join(tokens_together)}")
print(f"\n{sum(a == b for a, b in zip(together, alone, strict=True))} of {len(picked)} translations agree")

# %% tests="dec_batch_independent" points=2
assert check.batch_translation_is_independent(translate_batch, bug_hunt=True)

# %% tests="dec_batch_matches" points=2
assert check.batch_translation_matches(translate_batch, bug_hunt=True)

# %% tests="dec_batch_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.batch_translation_is_independent(translate_batch, sentences=4, src_len=10, seed=3)
assert check.batch_translation_matches(translate_batch, sentences=7, batch_size=3, seed=5)
### END HIDDEN TESTS

# %% [markdown]
# **What `ys` looks like.** Below is the raw output of one call of your `greedy_decode` for six short
# test sentences of the same length (so their batch needs no source padding), every id turned into its
# token. Each row starts with `<bos>`, ends its translation with `<eos>` at its own step, and is padded
# after that; the batch stops at the step where the last sentence finished.

# %%
picked = [i for i in range(len(test_sources)) if len(test_sources[i]) == 9][:6]  # 9 ids with <bos>, <eos>
src = torch.tensor([test_sources[i] for i in picked], device=device)  # (6, 9)
ys = greedy_decode(model, src, source_vocab.pad_idx, target_vocab.bos_idx, target_vocab.eos_idx, max_len=30)
figures.plot_decoded_batch([[target_vocab.itos[i] for i in row] for row in ys.tolist()])
plt.show()

# %% [markdown]
# **Every step's choice, from one forward pass.** Feed the finished translation back in with teacher
# forcing, `model(src, ys[:, :-1], ...)`: thanks to the look-ahead mask, position $t$ sees exactly the
# prefix it saw at step $t + 1$ of decoding, so this one parallel pass reproduces the distribution of
# every step (up to rounding in the last digits). This is the same trick that makes training
# parallel. The bars show the five most likely words at each step; greedy took the orange one.

# %%
src = torch.tensor([test_sources[9]], device=device)  # (1, src_len)
ys = greedy_decode(model, src, source_vocab.pad_idx, target_vocab.bos_idx, target_vocab.eos_idx, 40)
decoder_input = ys[:, :-1]  # the translation without its last token: (1, steps)
with torch.no_grad():
    logits = model(src, decoder_input, make_source_mask(src, source_vocab.pad_idx),
                   make_target_mask(decoder_input, target_vocab.pad_idx))  # (1, steps, vocab)
top = torch.softmax(logits[0], dim=-1).topk(5, dim=-1)  # values and indices: (steps, 5)
words = [target_vocab.itos[i] for i in ys[0].tolist()]
steps = [(" ".join(words[:t + 1]), [target_vocab.itos[i] for i in top.indices[t].tolist()],
          top.values[t].tolist()) for t in range(decoder_input.size(1))]
print("German:", test_german[9])
figures.plot_next_token_choices(steps, title="Greedy decoding of test sentence 9")
plt.show()


# %% [markdown]
# ## 6. Measuring translation quality: BLEU
#
# BLEU (Papineni et al., 2002) compares the model's translations (the *hypotheses*) with human references
# by counting shared word sequences. An *n-gram* is a run of $n$ consecutive tokens: "a dog" is a 2-gram,
# and a sentence of $L$ tokens holds $L - n + 1$ of them (none when $L < n$). Each ingredient of BLEU is
# there because a simpler score can be fooled; the cells below show each one with sacreBLEU (Post, 2018),
# the library that computes the BLEU scores reported today, on made-up sentences. (They call it with
# `tokenize="none"`, since the text is already split into tokens, and `smooth_method="none"`, BLEU as the
# paper defines it.)
#
# **1. The precision of n-grams, clipped.** The precision $p_n$ is the share of the hypothesis's n-grams
# that the reference also contains. Counted naively, a hypothesis that repeats one right word is perfect:
# every unigram of "the the the the" occurs in "the cat is on the mat". So BLEU credits each n-gram of the
# hypothesis at most as many times as the reference holds it (*clipping*): the reference has "the" twice,
# so 2 of the 4 unigrams count.

# %%
plain_bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none")  # BLEU as defined, no smoothing
parts = plain_bleu.corpus_score(["the the the the"], [["the cat is on the mat"]])
print(f"p1 of 'the the the the' against 'the cat is on the mat': {parts.precisions[0]:.0f} %")

# %% [markdown]
# **2. One to four tokens, combined by a geometric mean.** $p_1$ says whether the right words were
# chosen; $p_2$ to $p_4$ say whether they come in the right order. BLEU combines the four by their
# *geometric* mean, $(p_1 p_2 p_3 p_4)^{1/4}$, the exponential of the mean of their logarithms: it is 0 as
# soon as one of them is 0, where an arithmetic mean would still give credit. The cell scores three
# hypotheses against one reference: the reference itself, its words shuffled (every word right, no pair
# in order), and its first six words.

# %%
reference = "a man is riding a bike down the street"
for hypothesis in (reference, "street the down bike a riding is man a", "a man is riding a bike"):
    parts = plain_bleu.corpus_score([hypothesis], [[reference]])
    print(f"{hypothesis!r:42} p1..p4 = {[round(p) for p in parts.precisions]} %, "
          f"arithmetic mean {sum(parts.precisions) / 4:5.1f}, BLEU {parts.score:5.1f}")

# %% [markdown]
# The shuffled sentence has every word right and scores 0: no 2-gram of it is in the reference. The third
# hypothesis is perfectly precise, $p_1 = \dots = p_4 = 100\,\%$, and yet scores 60.7, which is the next
# ingredient.
#
# **3. The brevity penalty.** Precision rewards saying little: the first six words of the reference are
# 100 % precise. BLEU has no recall (with several references, recall is ill-defined), so it multiplies the
# geometric mean by a *brevity penalty* that punishes hypotheses shorter than their references:
#
# $$\mathrm{BP} = \begin{cases} 1 & c > r \\ e^{\,1 - r/c} & c \le r \end{cases} \qquad
#   \mathrm{BLEU} = 100 \cdot \mathrm{BP} \cdot (p_1\, p_2\, p_3\, p_4)^{1/4}$$
#
# with $c$ the length of the hypotheses and $r$ that of the references. Six words against nine: $e^{1 - 9/6}
# \approx 0.61$. A hypothesis *longer* than its reference is not penalised here: its extra words already
# lower its precisions.
#
# **4. The whole corpus at once.** A test set is scored as one corpus: the clipped matches of all
# sentences are added, and divided by all the n-grams of all hypotheses; $c$ and $r$ are the total lengths
# of all hypotheses and of all references. Corpus BLEU is *not* the average of the sentences' scores, in
# which a two-word caption would weigh as much as a long one, and a sentence with no matching 4-gram
# scores 0 however good its words are (a sentence of three words has no 4-gram at all).

# %%
pairs = [("a dog runs on the grass .", "a dog runs on the grass ."), ("two men play", "two women play chess")]
corpus = plain_bleu.corpus_score([h for h, _ in pairs], [[r for _, r in pairs]]).score
alone = [plain_bleu.corpus_score([h], [[r]]).score for h, r in pairs]
print(f"the two sentences alone: BLEU {alone[0]:.1f} and {alone[1]:.1f} (mean {sum(alone) / 2:.1f}); "
      f"as one corpus: BLEU {corpus:.1f}")

# %% [markdown]
# **Prediction 2 (1 point).** Predict, then run, as Prediction 1: a number or the arithmetic you
# worked out, noted here and scored when your notebook is graded. A test set of two sentences, each
# reference 10 tokens long. The model's translations are 10 and 5 tokens long. What brevity penalty BP
# does *corpus* BLEU give them? (Within 0.01: two decimals are enough.)

# %% solution="dec_predict_brevity_penalty"
def predict_brevity_penalty() -> float:
    """Your prediction of BP for hypotheses of 10 and 5 tokens against references of 10 and 10."""
    ### BEGIN SOLUTION
    return math.exp(1 - (10 + 10) / (10 + 5))  # c = 15, r = 20: the lengths are summed over the corpus first
    ### END SOLUTION


# %% tests="dec_predicted_brevity_penalty" points=1
assert check.predicted_brevity_penalty(predict_brevity_penalty)

# %% [markdown]
# **The truth, for other lengths.** sacreBLEU scores two made-up pairs whose translations are 12 and
# 6 tokens long, against references of 10 and 12, and reports the corpus lengths it used and its
# brevity penalty. Check that your method gives this number too.

# %%
pairs = [(" ".join(["w"] * 12), " ".join(["w"] * 10)), (" ".join(["w"] * 6), " ".join(["w"] * 12))]
bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none")
parts = bleu.corpus_score([h for h, _ in pairs], [[r for _, r in pairs]])
print(f"hypotheses: {parts.sys_len} tokens, references: {parts.ref_len} tokens, BP = {parts.bp:.4f}")

# %% [markdown]
# ### Exercise: `compute_bleu`
#
# Now compute corpus BLEU yourself, from the four ingredients above.
#
# **The contract.** `compute_bleu(hypotheses, references)` takes two lists of the same length:
# `hypotheses[i]` and `references[i]` are the tokens of sentence $i$ (lists of strings, already lowercased
# and tokenised as the course's recipe below does), one reference per sentence. It returns
# `(bleu, precisions, brevity_penalty)`:
# - `precisions`: the list $[p_1, p_2, p_3, p_4]$ of the corpus's clipped n-gram precisions, as fractions
#   from 0 to 1: of all n-grams of all hypotheses, the share their references credit, each n-gram of a
#   hypothesis credited at most as many times as its own reference holds it ($p_n = 0$ for an order of which
#   the hypotheses hold no n-gram);
# - `brevity_penalty`: BP from the total lengths $c$ and $r$ of the corpus, a number in $(0, 1]$;
# - `bleu`: $100 \cdot \mathrm{BP} \cdot (p_1 p_2 p_3 p_4)^{1/4}$, from 0 to 100 like sacreBLEU's score;
#   0 when one of the precisions is 0.
#
# **How it is checked.** sacreBLEU is the yardstick. The checks join your token lists with single spaces
# and score them with `sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none")`, so both count exactly
# the same tokens; your numbers must agree to six decimals. One check runs your function on the course
# checkpoint's translations of the 1,000 test sentences (shipped with the course), where no precision is 0:
# there sacreBLEU's default smoothing changes nothing, and the expected score is the checkpoint's 37.71.
# Your function must compute BLEU itself: one that calls sacreBLEU fails the checks.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# Work sentence by sentence, order by order, but only *count*: for each sentence and each $n$, how many
# n-grams the hypothesis has, and how many of them the reference credits. Keep one running total of each
# per order, and the two total lengths; divide, combine and penalise once, after the loop. Python's
# `collections.Counter` counts hashable things, such as tuples of tokens, and two Counters combine with
# `&`, which keeps the smaller count of every key.
#
# </details>
#
# <details><summary>Hint 2: the shapes</summary>
#
# A sentence of $L$ tokens has the n-grams `tuple(tokens[i:i + n])` for $i = 0, \dots, L - n$ (none when
# $L < n$). The running totals are two lists of four integers (matches and n-grams per order) and two
# integers ($c$, $r$). `precisions` is a list of four floats; `math.log` and `math.exp` give the geometric
# mean, once every precision is above 0.
#
# </details>
#
# <details><summary>Hint 3: the clipped count</summary>
#
# With `hypothesis_grams = Counter(...)` and `reference_grams = Counter(...)` for one sentence and one $n$,
# the matches it adds are `sum((hypothesis_grams & reference_grams).values())`, and its n-grams
# `sum(hypothesis_grams.values())`.
#
# </details>

# %% solution="compute_bleu"
#| include transformer_course.reference.bleu:compute_bleu

# %% tests="dec_bleu_returns" points=1
assert check.bleu_returns_three_values(compute_bleu)

# %% tests="dec_bleu_clipping" points=2
assert check.bleu_clips_counts(compute_bleu)

# %% tests="dec_bleu_corpus" points=2
assert check.bleu_sums_over_the_corpus(compute_bleu)

# %% tests="dec_bleu_brevity" points=2
assert check.bleu_brevity_penalty(compute_bleu)

# %% tests="dec_bleu_geometric" points=2
assert check.bleu_geometric_mean(compute_bleu)

# %% tests="dec_bleu_sacrebleu" points=2
assert check.bleu_agrees_with_sacrebleu(compute_bleu)

# %% tests="dec_bleu_hidden" points=2
### BEGIN HIDDEN TESTS
assert check.bleu_clips_counts(compute_bleu, seed=3, length=8)
assert check.bleu_sums_over_the_corpus(compute_bleu, seed=4, sentences=4)
assert check.bleu_brevity_penalty(compute_bleu, seed=5, length=9)
assert check.bleu_agrees_with_sacrebleu(compute_bleu, sentences=300, seed=2)
### END HIDDEN TESTS

# %% [markdown]
# **The recipe.** A BLEU number means little without the exact way it was computed: Post (2018) found
# differences of up to 1.8 BLEU between common ways of tokenising and normalising the same references, and
# another test set is another measurement altogether. Ours, for every score in this course:
# - test set `test_2016_flickr` (1,000 sentences, one reference each), greedy decoding, `max_len=80`;
# - references and hypotheses **lowercased** and **tokenised with spaCy's blank English tokenizer**,
#   tokens joined by single spaces (the model writes exactly such tokens);
# - `sacrebleu.metrics.BLEU(tokenize="none")`, because the text is already tokenised, default
#   smoothing, `corpus_score`. The *signature* printed below records these settings (`tok:none`: no
#   tokenisation by sacreBLEU; `case:mixed`: sacreBLEU did not lowercase, our text already is).
#
# Compare a number with another only when their recipes match. Post (2018) asks papers to report
# sacreBLEU's default recipe (its own tokenizer on detokenised, cased text), but many published tables use a
# tokenisation or lowercasing of their own, and their numbers cannot be set beside each other.
# The next cell translates the test set with `translate_batch` and
# scores it twice, with sacreBLEU and with your `compute_bleu`. While the grader runs this notebook it
# decodes only the first 10 sentences to stay fast; otherwise all 1,000, which took 31 and 52 seconds of
# CPU time on one thread with the course checkpoint in two runs of the course's benchmark on a machine
# busy with other work (`python scripts/benchmark.py --data ../shared/data/multi30k --steps 1 --threads 1`,
# and with `--no-training` in place of `--steps 1`; a model that rarely says `<eos>` takes longer).
# Set `count` lower if you are in a hurry: a batch runs until its longest sentence has finished, and
# each step re-reads the whole prefix.

# %%
count = 10 if short_run() else len(test_sources)
started = time.time()
translations = translate_batch(model, test_sources[:count], source_vocab, target_vocab)
hypotheses = [" ".join(tokens) for tokens in translations]
score, signature = corpus_bleu(hypotheses, test_references[:count])
print(f"decoded {count} sentences in {time.time() - started:.0f} s;  signature: {signature}")
print(f"BLEU of {'your model' if mine else 'the course checkpoint'}, measured now: {score:.2f} "
      f"on {count} test sentences with your greedy_decode and translate_batch")
mine_bleu, mine_precisions, mine_penalty = compute_bleu(translations, [r.split() for r in test_references[:count]])
print(f"the same with your compute_bleu: {mine_bleu:.2f} (brevity penalty {mine_penalty:.3f})")
print(f"BLEU of the course checkpoint, stored in it: {shipped_bleu} on all 1,000 test sentences")
# force=True: our text is tokenised on purpose, so sacreBLEU need not warn that it looks tokenised
parts = sacrebleu.metrics.BLEU(tokenize="none", force=True).corpus_score(hypotheses, [test_references[:count]])
figures.plot_bleu_breakdown(parts.precisions, parts.bp, parts.score)
plt.show()

# %% [markdown]
# With the course's checkpoint and all 1,000 sentences your decoder should reproduce the stored score:
# it was measured on exactly the float16 weights in the file, with the same batches and settings
# (the course's tests reproduce it to within 0.05). With your own model, the two lines compare your
# training run with the course's (12 epochs, the last three averaged). $p_1$ is high — most words
# are right — and the precision falls with $n$, since longer runs must match word for word.
# The brevity penalty tells whether the translations are too short overall: 1 means at least as long as
# the references; the further below 1, the more words are missing.

# %% [markdown]
# ## 7. Exercise: collecting the attention maps
#
# Every `MultiHeadAttention` keeps the weights of its last forward pass in `attn_weights`,
# `(batch, heads, q_len, k_len)`. The model has three kinds of attention, and each layer holds its own:
# - **encoder self-attention**, German attending to German, `(batch, heads, src_len, src_len)`;
# - **decoder self-attention**, English attending to earlier English, `(batch, heads, tgt_len, tgt_len)`;
# - **cross-attention**, English queries attending to the German keys, `(batch, heads, tgt_len,
#   src_len)`.
#
# The model is the architecture you built in stages 3 and 4, with the names of its parts; `print(model)`
# lists them.
#
# **The contract.** `attention_maps(model)`, called right after a forward pass of `model` (the weights
# are those of the *last* pass), returns a dictionary with three entries, each kind stacked over the
# layers on a new first axis, layer 0 (next to the embeddings) first: `"encoder_self"` `(layers, batch,
# heads, src_len, src_len)`, `"decoder_self"` `(layers, batch, heads, tgt_len, tgt_len)` and `"cross"`
# `(layers, batch, heads, tgt_len, src_len)`. The weights are returned as stored: no axis averaged or
# dropped. The heatmaps of section 8 are drawn from it.

# %% [markdown]
# <details><summary>Hint 1: the idea</summary>
#
# One tensor per kind: go through the layers of the right stack in order, take the stored weights of the
# right attention of each layer, and put the per-layer tensors on top of each other along a new axis.
#
# </details>
#
# <details><summary>Hint 2: where the weights are</summary>
#
# The encoder's layers are `model.encoder.layers`, the decoder's `model.decoder.layers`. An encoder
# layer's attention is its `self_attn`; a decoder layer has two, `self_attn` and `cross_attn`.
#
# </details>
#
# <details><summary>Hint 3: the shapes</summary>
#
# `torch.stack` of a list of $N$ tensors of shape `(batch, heads, q_len, k_len)` gives
# `(N, batch, heads, q_len, k_len)`; `torch.cat` would give `(N · batch, heads, q_len, k_len)` instead.
#
# </details>

# %% solution="attention_maps"
#| include transformer_course.reference.decoding:attention_maps

# %% tests="dec_maps_shapes" points=1
assert check.attention_maps_shapes(attention_maps)

# %% tests="dec_maps_values" points=2
assert check.attention_maps_values(attention_maps)

# %% tests="dec_maps_rows" points=1
assert check.attention_maps_rows_sum_to_one(attention_maps)

# %% tests="dec_maps_hidden" points=1
### BEGIN HIDDEN TESTS
assert check.attention_maps_shapes(attention_maps, tgt_len=8, num_layers=3, num_heads=2, batch=2, seed=5)
assert check.attention_maps_values(attention_maps, tgt_len=8, num_layers=3, num_heads=2, batch=2, seed=5)
assert check.attention_maps_rows_sum_to_one(attention_maps, tgt_len=3, num_layers=1, num_heads=8, batch=1)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Attention heatmaps
#
# `attention_for` translates one German sentence with your `greedy_decode`, then runs **one** forward
# pass over the translation (teacher forcing, as in section 5), so that every query position of the
# decoder is stored at once, and collects the weights with your `attention_maps`. It returns the maps
# and three token lists: the German tokens, the decoder's input tokens (`<bos>` plus the translation)
# and the words *produced* at each position (the translation plus `<eos>`).

# %%
german_tokenizer = Tokenizer("de")


def attention_for(model: nn.Module, german: str) -> tuple[dict[str, torch.Tensor], list[str], list[str], list[str]]:
    """(maps, source tokens, decoder input tokens, produced tokens) for one sentence."""
    src = torch.tensor([source_vocab.encode(german_tokenizer(german))], device=device)  # (1, src_len)
    ys = greedy_decode(model, src, source_vocab.pad_idx, target_vocab.bos_idx, target_vocab.eos_idx, 40)
    decoder_input = ys[:, :-1]  # (1, tgt_len): <bos> and the translation
    with torch.no_grad():
        model(src, decoder_input, make_source_mask(src, source_vocab.pad_idx),
              make_target_mask(decoder_input, target_vocab.pad_idx))
    source_tokens = [source_vocab.itos[i] for i in src[0].tolist()]
    inputs = [target_vocab.itos[i] for i in decoder_input[0].tolist()]
    produced = [target_vocab.itos[i] for i in ys[0, 1:].tolist()]
    return attention_maps(model), source_tokens, inputs, produced


sentence = test_german[201]  # a German relative clause that puts its verb last
print(sentence)

# %% [markdown]
# **Cross-attention, averaged over the heads of the last layer.** Row $t$ is the decoder position that
# *produced* the word on its label; the columns are the German tokens. The red box marks the German
# token that row attends to most. Where German and English put their words in the same order, the
# boxes run down a diagonal. This sentence has a German relative clause, and German puts the verb of
# such a clause last: "..., die in einem Zelt am Wasser Instrumente **spielen**", where English says
# "people **playing** instruments in a tent at the water". With the course's checkpoint, the decoder
# writing "playing" looks at "spielen", at the very end of the German sentence, then jumps back to
# "instrumente" and on to "zelt" and "wasser": the boxes leave the diagonal and come back. The cell
# prints each English word with the German token its row attends to most, so you can check this (your
# own model may align differently). Nobody told the model which words correspond: whatever
# correspondence the map shows was learned from translation pairs alone. Read it with care, though: the
# keys are the encoder's outputs, and after three layers of self-attention source position $j$ holds
# more than the word $j$ (question 3 asks what else the map cannot tell). The last two rows, which produce
# the final period and `<eos>`, look most at the source's `<bos>`, which holds no word of the sentence.

# %%
maps, source_tokens, inputs, produced = attention_for(model, sentence)
heatmaps.plot_head_average(maps["cross"], produced, source_tokens,
                           title="Cross-attention, last layer, mean of the heads")
plt.show()
strongest = maps["cross"][-1, 0].mean(0).argmax(-1)  # (tgt_len,): the German token each row looks at most
print("  ".join(f"{word}→{source_tokens[int(column)]}" for word, column in zip(produced, strongest, strict=True)))

# %% [markdown]
# **Every layer and head.** One row of panels per layer, one column per head, with a shared colour
# scale. Under the figure, the cell prints how sharp each head is: a row's largest weight, averaged over
# the rows (1 would be one German token per row). With the course's checkpoint, on this sentence, the
# heads are sharper in the deeper layers: the first layer's spread their weight (0.26 to 0.50), the last
# layer's look mostly at one token (0.72 to 0.82). No head here sends most of its rows to `<eos>` or the
# final period, the "nothing useful here" default that
# [Clark et al. (2019)](https://arxiv.org/abs/1906.04341) found in many heads of BERT, a much larger
# model.

# %%
maps, source_tokens, inputs, produced = attention_for(model, sentence)
heatmaps.plot_attention_grid(maps["cross"], produced, source_tokens,
                             title="Cross-attention (rows: English word produced, columns: German)")
plt.show()
sharpness = maps["cross"][:, 0].max(-1).values.mean(-1)  # (layers, heads): a row's largest weight, averaged
for layer, heads in enumerate(sharpness.tolist()):
    print(f"layer {layer}, heads 0-{len(heads) - 1}: " + "  ".join(f"{value:.2f}" for value in heads))

# %% [markdown]
# **Interactive.** Drag the slider to go through the layers and heads (each layer also offers the mean
# of its heads); hover over a cell to read the English word, the German word and the weight.

# %%
maps, source_tokens, inputs, produced = attention_for(model, sentence)
heatmaps.plot_attention_interactive(maps["cross"], produced, source_tokens, title="Cross-attention",
                                    query_label="English (produced)", key_label="German").show()

# %% [markdown]
# **Encoder self-attention.** German attending to German. Look for heads that attend to the next or
# the previous token (a shifted diagonal: a positional pattern that the sinusoidal encoding of stage 1
# makes easy), heads in which an article looks at its noun (does "einem" look at "zelt"?), heads in
# which the relative pronoun "die" looks at the noun it stands for ("menschen") or the clause's verb
# "spielen" at its object "instrumente", and heads that collect on the final period or `<eos>`. Every
# row is a full distribution: there is no padding in a batch of one, and the encoder has no look-ahead
# mask.

# %%
maps, source_tokens, inputs, produced = attention_for(model, sentence)
heatmaps.plot_attention_grid(maps["encoder_self"], source_tokens, source_tokens,
                             title="Encoder self-attention (German → German)")
plt.show()
heatmaps.plot_attention_interactive(maps["encoder_self"], source_tokens, source_tokens,
                                    title="Encoder self-attention", query_label="German (query)",
                                    key_label="German (key)").show()

# %% [markdown]
# **Decoder self-attention.** English attending to earlier English. Rows and columns are the decoder's
# *inputs* here (`<bos>` and the words so far). Everything above the diagonal is exactly 0: the
# look-ahead mask at work, the same mask that made decoding step by step possible. With the course's
# checkpoint, on this sentence, the query's own position (which holds the word produced one step
# earlier) is the key most often given the largest weight in 6 of the 8 heads of the last layer, but only
# heads 1 and 6 do so in most rows (10 and 13 of the 14 rows after `<bos>`); the first layer's heads
# spread their largest weights over the position before, the query's own and `<bos>`.

# %%
maps, source_tokens, inputs, produced = attention_for(model, sentence)
heatmaps.plot_attention_grid(maps["decoder_self"], inputs, inputs,
                             title="Decoder self-attention (lower triangle only)")
plt.show()
heatmaps.plot_attention_interactive(maps["decoder_self"], inputs, inputs, title="Decoder self-attention",
                                    query_label="English (query)", key_label="English (key)").show()

# %% [markdown]
# Try your own sentence: set `sentence = "..."` in the cell that defines `attention_for` (any German
# caption-like sentence, e.g. *"Zwei Hunde spielen im Schnee."*) and rerun the figure cells. A word the
# vocabulary does not know shows as `<unk>`; watch where the decoder looks when it has to guess.
#
# A caution: attention weights show where information was *read*, not what the model *understood*.
# They are a useful window, not an explanation of each decision.

# %% [markdown]
# ## Summary
# - Training uses teacher forcing: all positions in one pass. Translating must go step by step, since
#   each word is fed back in as the next input.
# - Greedy decoding takes the most likely next word after the whole prefix at every step; beam search
#   keeps the $k$ best partial sentences and usually gains a little (stage 7 measures how much).
# - In a batch, sentences end at different steps: after its `<eos>` a sentence only gets `<pad>`, and
#   decoding stops once all have ended or after `max_len` tokens.
# - A sentence's translation must not depend on which sentences share its batch: translating the same
#   sentences alone and in batches, and comparing, is how you find out whether it does.
# - Corpus BLEU is the brevity penalty times the geometric mean of the clipped 1- to 4-gram precisions,
#   all counted over the whole corpus; a score is only meaningful together with its recipe and
#   sacreBLEU signature.
# - Every attention layer keeps its weights; stacked over layers they show where each position read:
#   from which source positions (cross-attention, often close to a word alignment, but the keys are
#   encoder outputs, not words), which context (encoder) and the causal triangle (decoder).
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
# **Question 1 (2 points).** A classmate's `greedy_decode` builds the decoder's mask from padding
# only, without the look-ahead part, so that every position of `ys` may attend to every other
# position. The model is the course's checkpoint, trained *with* the look-ahead mask, and it has
# several decoder layers. Would the tokens it writes change? Would your answer be different for a
# decoder with a single layer? Explain, following what the **last** position reads in each layer.

# %% [markdown] answer="dec_q_mask" points=2
# **Model answer.** Greedy decoding only uses the last position, and in the first layer the last
# position may attend to every position of the prefix with or without the look-ahead mask (nothing
# comes after it), so in a one-layer decoder its logits, and the tokens, do not change. With several
# layers they can change: without the mask the *earlier* positions' vectors in the first layer now
# also read the later tokens of the prefix, and in the second layer the last position attends to
# those changed vectors. Its logits are then computed from vectors the model never saw in training
# (they no longer match what teacher forcing produced), so the argmax may differ and the tokens can
# change.
#
# **Rubric.**
# - 1 point: for the last position the mask hides nothing (no later position exists), so a
#   one-layer decoder writes the same tokens.
# - 1 point: with two or more layers the earlier positions' vectors change (they read later tokens),
#   the last position reads them in the next layer, so the logits differ from training's and tokens
#   can change. (An answer that says "the tokens change because the model can see the future" with
#   no account of the layers gets 0 for this point: during decoding there is no future token.)

# %% [markdown]
# **Question 2 (2 points).** Suppose your `greedy_decode` kept its `finished` vector and its stopping
# rule exactly as they are, but no longer replaced the new token of a finished sentence by `<pad>`.
# Would the English translations that section 5 prints change? Would decoding get faster or
# slower? Explain both, then say what the `<pad>` tokens and the `finished` vector are each good for.

# %% [markdown] answer="dec_q_finished" points=2
# **Model answer.** The printed translations stay the same. `target_vocab.decode` stops at the first
# `<eos>` of a row, so nothing written after it reaches the text; and with the look-ahead mask, tokens
# written after `<eos>` cannot change any earlier token of the row (the decoder never mixes rows of a
# batch either). The speed stays the same too: the batch is one tensor, so a finished row goes
# through the decoder at every step whether its new token is `<pad>` or a word, and the loop still
# stops when the last sentence has produced `<eos>`. The `<pad>` tokens keep `ys` itself clean: each
# row is exactly its translation and then padding, so any code that reads `ys` without stopping at
# `<eos>` (the figure of section 5, a count of the tokens generated, a sum of log-probabilities over
# the non-padding tokens) does not see words the model wrote after it had ended. The `finished`
# vector, accumulated over the steps, is the loop's record of which sentences have ended, and the
# stopping rule reads it to end the batch before `max_len` (the same could be recomputed from `ys` at
# every step, by looking for an `<eos>` in each row; the `<pad>` tokens alone would not tell it).
#
# **Rubric.**
# - 1 point: the translations do not change, because `decode` stops at the first `<eos>` (and later
#   tokens cannot change earlier ones). An answer claiming that words after `<eos>` would enter the
#   translations gets 0 here.
# - 1 point: the speed does not change (finished rows are computed at every step either way), and one
#   correct purpose: `<pad>` keeps `ys` clean for code that reads it past `<eos>`, or `finished`
#   records which sentences have ended so that the loop can stop before `max_len`. An answer that says
#   decoding gets slower or faster gets 0 here.

# %% [markdown]
# **Question 3 (2 points).** The lesson warns that attention maps show where information was read,
# not what the model understood. Give two reasons why a clean-looking cross-attention map need not
# explain a translation choice.

# %% [markdown] answer="dec_q_attention" points=2
# **Model answer.** The encoder output at source position $j$ is not the word $j$ any more: encoder
# self-attention has mixed information from the whole sentence into it, so attending to position $j$
# can mean reading about other words. And one head of one layer is a small part of the computation:
# there are several heads and layers, the residual connections carry information around attention,
# the feed-forward networks and the output layer transform it, and a weight says nothing about how
# large the value vector it multiplies is.
#
# **Rubric.**
# - 1 point: a first valid reason, for example: encoder outputs are mixtures of the whole source, so
#   a position is not a word; one map is one head of one layer among many; residual paths and
#   feed-forward layers carry information that attention weights do not show (nor do the weights show
#   the size of the value vectors they multiply); averaging over heads hides what single heads do;
#   attention weights are not causal evidence (changing them need not change the output).
# - 1 point: a second valid reason, distinct from the first (any other example above, or another
#   sound one).

# %%
check.summary()
