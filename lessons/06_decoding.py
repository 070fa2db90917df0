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
# **Working time:** about 1¾ hours if you are at ease with PyTorch, about 3 hours if you are new to it
# or get stuck. That is reading (52 minutes, or 69 with the folded hints), one exercise, one bug hunt,
# two predictions and three written questions, 5 to 10 minutes of setting up (Colab, the setup cell,
# saving a copy), and under a minute of computation on one CPU core, BLEU on all 1,000 test sentences
# included. (Estimated by `scripts/working_time.py` in the course repository from the notebook's
# length and the measured run time of its cells, with assumptions it prints, not measurements of
# students: for example 150 or 100 words a minute, 5 or 10 minutes per exercise plus 2 or 4 per line
# you write, 10 or 20 per bug hunt.)
#
# ## Learning outcomes
# After this notebook you can
# 1. explain why training runs all target positions in parallel while translating runs step by step,
#    and say what greedy decoding and beam search each do;
# 2. implement batched greedy decoding that stops every sentence at its own `<eos>`, pads finished
#    sentences and respects a maximum length;
# 3. load a pretrained checkpoint into the model of stage 4 and translate German test sentences;
# 4. compute corpus BLEU with sacreBLEU, explain n-gram precision and the brevity penalty, and state
#    the exact recipe behind a BLEU number;
# 5. collect the attention weights of every layer and read cross-attention, encoder self-attention
#    and decoder self-attention heatmaps, per layer and head;
# 6. recognise the classic decoding bugs from their symptoms.
#
# **Before you start.** You need stages 4 and 5: the model's forward pass with its masks, and the
# vocabulary's `<bos>`, `<eos>` and `<pad>`. A trained model is provided (the course's checkpoint), so
# notebook 5's training run is not needed. For BLEU: logarithms and a geometric mean.
#
# **How this notebook works.** Run the setup cell first (in Colab it installs the course package),
# then the settings cell below it. Cells marked *YOUR CODE HERE* are yours; every other cell is
# given and correct. After each exercise a few *check cells* test one property each: `✔` means it
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
import math
import time
from collections import Counter

import matplotlib.pyplot as plt
import sacrebleu
import torch
from torch import nn

from transformer_course.checks import decoding as check
from transformer_course.data.tokenize import Tokenizer
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
# Translating one sentence at a time wastes the hardware, so we decode a batch `src`
# `(batch, src_len)` together. The algorithm in words:
#
# 1. **Encode once.** The encoder turns the source into `enc_out` `(batch, src_len, d_model)`. The
#    source does not change while we write the translation; encoding it again at every step would
#    give the same tensor, only slower.
# 2. **Start** with the prefix `ys` `(batch, 1)` holding `<bos>` in every row, and a `finished`
#    flag per sentence, all `False`.
# 3. **Repeat at most `max_len` times:**
#    1. run the decoder on the whole prefix, with the encoder output, the source mask and a
#       look-ahead mask for the prefix *as it is now* (it grows by one position per step), exactly
#       as in training: one row of logits per position of `ys`;
#    2. read the prediction of the next token at the **last** position of the prefix and take the
#       most likely word of the vocabulary;
#    3. a sentence that already produced `<eos>` is finished: its new token is `<pad>`, whatever the
#       model says;
#    4. append the new tokens as one new column of `ys`;
#    5. remember which sentences have now produced `<eos>` (a sentence that finished earlier stays
#       finished); once **all** are finished, stop.
#
# `max_len` counts generated tokens, not `<bos>`: the result has at most `max_len + 1` columns.
# Every step runs the decoder over the whole prefix again, so a sentence of $n$ words costs about
# $n^2/2$ position-steps. Stage 7 keeps the keys and values of earlier positions in a cache and
# computes only the newest position; we keep the simple version here.
#
# **The bookkeeping on an example.** Two sentences, "a dog runs ." and "people .":
#
# | step | new tokens | `ys` after the step | `finished` |
# |---|---|---|---|
# | 0 | — | `<bos>` / `<bos>` | F, F |
# | 1 | a, people | `<bos> a` / `<bos> people` | F, F |
# | 2 | dog, . | `<bos> a dog` / `<bos> people .` | F, F |
# | 3 | runs, `<eos>` | `… dog runs` / `… people . <eos>` | F, **T** |
# | 4 | ., ~~in~~ → `<pad>` | `… runs .` / `… <eos> <pad>` | F, T |
# | 5 | `<eos>`, `<pad>` | `… runs . <eos>` / `… <eos> <pad> <pad>` | **T**, T → stop |
#
# At step 4 the model still "wants" to write *in* for the finished sentence: we overwrite it with
# `<pad>`. Sentences end at different steps, so the rows of `ys` end in different amounts of padding.

# %% [markdown]
# ### Pitfalls we see every year
# - **not stopping at `<eos>`:** the sentence runs on to `max_len` with repeated words after its end;
# - **finished sentences keep talking:** tokens after `<eos>` must be `<pad>`, whatever the model
#   predicts for that row;
# - **`finished` overwritten instead of accumulated** (set from this step's tokens alone): a sentence
#   forgets that it ended one step earlier;
# - **stopping when *one* sentence is finished** (`finished.any()`) instead of all of them;
# - **argmax over the wrong position:** `logits[:, 0]` (the prediction after `<bos>`, every step) or
#   an argmax over all positions;
# - **forgetting `model.eval()`:** dropout stays on and the same sentence translates differently each
#   time (the given first line of `greedy_decode` does it);
# - **re-encoding the source at every step:** correct, but it repeats work the encoder already did;
# - **off-by-one in the length:** the loop runs `max_len` times (`range(max_len)`), so `ys` can reach
#   `max_len + 1` columns with `<bos>`;
# - **a target mask built once before the loop:** its size must follow `ys`, so build it inside.

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
# shows the truth for *another* batch: use it to test your method. The batch you are graded on is
# never shown.
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
# it with your `greedy_decode`: sentences that end after 3, 7 and 5 tokens, once with `max_len=12` and
# once with `max_len=6`. Check that your method gives these numbers too; where it does not, find the
# step of your reasoning that went wrong.

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
        logits[:, -1, 4] = 1.0
        logits[ys.size(1) >= self.ends, -1, self.eos] = 2.0  # the next token is token number ys.size(1)
        return logits


for max_len in (12, 6):
    stand_in = StandIn([3, 7, 5])
    ys = greedy_decode(stand_in, torch.ones(3, 5, dtype=torch.long), 3, 1, 2, max_len)  # pad 3, bos 1, eos 2
    print(f"max_len={max_len:2}: {stand_in.calls} decoder calls; ys has {ys.size(1)} columns")

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
# ## 5. Translating
#
# `translate_batch` turns lists of source ids into English tokens with **your** `greedy_decode`:
# it sorts the sentences by length (similar lengths waste less padding), pads each batch into one
# tensor, decodes it, and turns every row back into words with `target_vocab.decode`, which drops
# `<bos>` and `<pad>` and stops at `<eos>`. The settings (batches of 256, `max_len=80`) are those the
# checkpoint's own score was measured with.

# %%
def translate_batch(model: nn.Module, sources: list[list[int]], batch_size: int = 256,
                    max_len: int = 80) -> list[list[str]]:
    """Greedy translations (English tokens) of encoded German sentences, in the input order."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    translations = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        src = torch.full((len(chunk), max(len(sources[i]) for i in chunk)), source_vocab.pad_idx)
        for row, index in enumerate(chunk):
            src[row, :len(sources[index])] = torch.tensor(sources[index])
        ys = greedy_decode(model, src.to(device), source_vocab.pad_idx, target_vocab.bos_idx,
                           target_vocab.eos_idx, max_len)  # (len(chunk), out_len)
        for row, index in enumerate(chunk):
            translations[index] = target_vocab.decode(ys[row].tolist())
    return [translations[i] for i in range(len(sources))]


# %% [markdown]
# Eight test sentences, side by side with their references. Expect fluent, mostly right captions;
# typical errors are rare words (`<unk>`), a wrong colour or number, and a dropped detail.

# %%
picked = [0, 1, 4, 6, 8, 9, 10, 15]
for index, tokens in zip(picked, translate_batch(model, [test_sources[i] for i in picked]), strict=True):
    print(f"[{index}] German   : {test_german[index]}")
    print(f"     reference: {test_references[index]}")
    print(f"     model    : {' '.join(tokens)}\n")

# %% [markdown]
# **What `ys` looks like.** Below is the raw output of one call for six short sentences, every id
# turned into its token. Each row starts with `<bos>`, ends its translation with `<eos>` at its own
# step, and is padded after that; the batch stops at the step where the last sentence finished.

# %%
picked = [4, 6, 8, 23, 30, 41]
src = torch.full((len(picked), max(len(test_sources[i]) for i in picked)), source_vocab.pad_idx)
for row, index in enumerate(picked):
    src[row, :len(test_sources[index])] = torch.tensor(test_sources[index])
ys = greedy_decode(model, src.to(device), source_vocab.pad_idx, target_vocab.bos_idx,
                   target_vocab.eos_idx, max_len=30)
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
# BLEU (Papineni et al., 2002) compares the model's translations with human references by counting
# shared word sequences. For $n = 1, \dots, 4$:
#
# $$p_n = \frac{\sum_{\text{sentences}} \sum_{g \in \text{n-grams(hyp)}} \min\big(\text{count}_{hyp}(g),\,
#   \text{count}_{ref}(g)\big)}{\sum_{\text{sentences}} \text{number of n-grams in hyp}}$$
#
# - an *n-gram* is a run of $n$ consecutive tokens ("a dog" is a 2-gram);
# - $\text{count}_{hyp}(g)$, $\text{count}_{ref}(g)$ — how often $g$ occurs in the hypothesis (the
#   model's translation) and in the reference;
# - the $\min$ *clips* each match: "the the the the" against "the cat" earns one match, not four;
# - the sums run over the **whole corpus** before dividing: corpus BLEU is not an average of
#   sentence scores.
#
# Precision alone rewards saying little (a one-word hypothesis can be 100% precise), so a
# **brevity penalty** punishes a corpus of translations that is shorter than the references:
#
# $$\mathrm{BP} = \begin{cases} 1 & c > r \\ e^{\,1 - r/c} & c \le r \end{cases} \qquad
#   \mathrm{BLEU} = \mathrm{BP} \cdot \exp\Big(\sum_{n=1}^{4} \tfrac14 \log p_n\Big)$$
#
# with $c$ the total length of the hypotheses and $r$ that of the references. The exponential of the
# mean log is the *geometric* mean of $p_1, \dots, p_4$; it is reported ×100, from 0 to 100.
#
# **By hand, on one pair.** The cell counts clipped n-gram matches with `Counter` and compares the
# result with sacreBLEU's on the same pair.

# %%
def clipped_precision(hypothesis: list[str], reference: list[str], n: int) -> tuple[int, int]:
    """(clipped matches, number of hypothesis n-grams) for one sentence pair."""
    hyp = Counter(tuple(hypothesis[i:i + n]) for i in range(len(hypothesis) - n + 1))
    ref = Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n + 1))
    return sum(min(count, ref[gram]) for gram, count in hyp.items()), sum(hyp.values())


hypothesis = "a man rides a bike down the street .".split()
reference = "a man is riding a bike down the street .".split()
mean_log = 0.0
for n in range(1, 5):
    matches, total = clipped_precision(hypothesis, reference, n)
    mean_log += math.log(matches / total) / 4
    print(f"p{n} = {matches}/{total} = {matches / total:.3f}")
c, r = len(hypothesis), len(reference)  # hypothesis and reference lengths
brevity = 1.0 if c > r else math.exp(1 - r / c)
print(f"BP = exp(1 - {r}/{c}) = {brevity:.3f}")
print(f"BLEU by hand = {100 * brevity * math.exp(mean_log):.2f}")
print(f"sacreBLEU    = {corpus_bleu([' '.join(hypothesis)], [' '.join(reference)])[0]:.2f}")

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
# **The truth, for other lengths.** sacreBLEU scores two made-up pairs whose translations are 10 and
# 6 tokens long, against references of 10 and 12, and reports the corpus lengths it used and its
# brevity penalty. Check that your method gives this number too.

# %%
pairs = [(" ".join(["w"] * 10), " ".join(["w"] * 10)), (" ".join(["w"] * 6), " ".join(["w"] * 12))]
parts = sacrebleu.metrics.BLEU(tokenize="none").corpus_score([h for h, _ in pairs], [[r for _, r in pairs]])
print(f"hypotheses: {parts.sys_len} tokens, references: {parts.ref_len} tokens, BP = {parts.bp:.4f}")

# %% [markdown]
# **The recipe.** A BLEU number means little without the exact way it was computed: tokenisation,
# casing and the test set change it by several points. Ours, for every score in this course:
# - test set `test_2016_flickr` (1,000 sentences, one reference each), greedy decoding, `max_len=80`;
# - references and hypotheses **lowercased** and **tokenised with spaCy's blank English tokenizer**,
#   tokens joined by single spaces (the model writes exactly such tokens);
# - `sacrebleu.metrics.BLEU(tokenize="none")`, because the text is already tokenised, default
#   smoothing, `corpus_score`. The *signature* printed below records these settings (`tok:none`: no
#   tokenisation by sacreBLEU; `case:mixed`: sacreBLEU did not lowercase, our text already is).
#
# Scores on lowercased, tokenised text run a little higher than the detokenised, cased BLEU of
# published tables, so compare numbers only when the recipes match. While the grader runs this
# notebook it decodes only the first 10 sentences to stay fast; otherwise it decodes all 1,000, which
# took 31 seconds of CPU time on one core with the course checkpoint (measured by
# `python scripts/benchmark.py --steps 1 --threads 1`; the separate run of stage 7's benchmark,
# `scripts/benchmark.py --no-training --threads 1`, measured 33 s for the same decoding; a model that
# rarely says `<eos>` takes longer).
# Set `count` lower if you are in a hurry: a batch runs until its longest sentence has finished, and
# each step re-reads the whole prefix.

# %%
count = 10 if short_run() else len(test_sources)
started = time.time()
hypotheses = [" ".join(tokens) for tokens in translate_batch(model, test_sources[:count])]
score, signature = corpus_bleu(hypotheses, test_references[:count])
print(f"decoded {count} sentences in {time.time() - started:.0f} s;  signature: {signature}")
print(f"BLEU of {'your model' if mine else 'the course checkpoint'}, measured now: {score:.2f} "
      f"on {count} test sentences with your greedy_decode")
print(f"BLEU of the course checkpoint, stored in it: {shipped_bleu} on all 1,000 test sentences")
parts = sacrebleu.metrics.BLEU(tokenize="none").corpus_score(hypotheses, [test_references[:count]])
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
# ## 7. Exercise, a bug hunt: collecting the attention maps
#
# Every `MultiHeadAttention` keeps the weights of its last forward pass in `attn_weights`,
# `(batch, heads, q_len, k_len)`. The model has three kinds of attention:
# - **encoder self-attention**: `layer.self_attn` of each layer in `model.encoder.layers`,
#   German attending to German, `(batch, heads, src_len, src_len)`;
# - **decoder self-attention**: `layer.self_attn` of each layer in `model.decoder.layers`,
#   English attending to earlier English, `(batch, heads, tgt_len, tgt_len)`;
# - **cross-attention**: `layer.cross_attn` of each decoder layer, English queries attending to the
#   German keys, `(batch, heads, tgt_len, src_len)`.
#
# `attention_maps(model)` stacks each kind over the layers, layer 0 (next to the embeddings) first,
# into `encoder_self` `(layers, batch, heads, src_len, src_len)`, `decoder_self`
# `(layers, batch, heads, tgt_len, tgt_len)` and `cross` `(layers, batch, heads, tgt_len, src_len)`,
# and returns them in a dictionary. It must be called right after a forward pass: the weights are
# those of the *last* pass.
#
# This time the function is written for you, by a classmate, with **one mistake**: it runs without
# an error and returns three tensors of five axes each, which is how it slipped through. Run it and
# the check cells below it, read what they say, then find the mistake and fix it in place.
# The heatmaps of section 8 use this function: with the mistake, the first of them stops with an
# error about the labels, a second symptom of the same bug.

# %% [markdown]
# <details><summary>Hint 1: read the symptom</summary>
#
# Which of the three maps do the checks complain about, and what is wrong with it: the shape they
# expected and the one they got? Which of its axes should be the German length?
#
# </details>
#
# <details><summary>Hint 2: where to look</summary>
#
# Only one kind of attention in a decoder layer has the German tokens as its keys. Which module of
# the decoder layer is that, and which module does the line that builds this map read?
#
# </details>

# %% solution="attention_maps"
#| bug: layer.cross_attn.attn_weights => layer.self_attn.attn_weights
#| include transformer_course.reference.decoding:attention_maps

# %% tests="dec_maps_shapes" points=1
assert check.attention_maps_shapes(attention_maps, bug_hunt=True)

# %% tests="dec_maps_values" points=2
assert check.attention_maps_values(attention_maps, bug_hunt=True)

# %% tests="dec_maps_rows" points=1
assert check.attention_maps_rows_sum_to_one(attention_maps, bug_hunt=True)

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
# own model may align differently). Nobody told the model which words correspond: the alignment is
# learned from translation pairs alone.

# %%
maps, source_tokens, inputs, produced = attention_for(model, sentence)
heatmaps.plot_head_average(maps["cross"], produced, source_tokens,
                           title="Cross-attention, last layer, mean of the heads")
plt.show()
strongest = maps["cross"][-1, 0].mean(0).argmax(-1)  # (tgt_len,): the German token each row looks at most
print("  ".join(f"{word}→{source_tokens[int(column)]}" for word, column in zip(produced, strongest, strict=True)))

# %% [markdown]
# **Every layer and head.** One row of panels per layer, one column per head, with a shared colour
# scale. Heads specialise: some follow the alignment sharply, some spread out, some park their
# weight on `<eos>` or the final period (a "nothing useful here" default, common in trained models).

# %%
maps, source_tokens, inputs, produced = attention_for(model, sentence)
heatmaps.plot_attention_grid(maps["cross"], produced, source_tokens,
                             title="Cross-attention (rows: English word produced, columns: German)")
plt.show()

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
# look-ahead mask at work, the same mask that made decoding step by step possible. Many heads look at
# the previous word or back at `<bos>`.

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
# - Greedy decoding takes the argmax of `logits[:, -1]` at every step; beam search keeps the $k$ best
#   partial sentences and usually gains a little.
# - In a batch, a `finished` vector records which sentences have said `<eos>`; their later tokens are
#   `<pad>`, and decoding stops once all are finished or after `max_len` tokens.
# - Corpus BLEU is the brevity penalty times the geometric mean of clipped 1- to 4-gram precisions;
#   a score is only meaningful together with its recipe and sacreBLEU signature.
# - Every attention layer keeps its weights; stacked over layers they show the alignment
#   (cross-attention), context gathering (encoder) and the causal triangle (decoder).
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
# Would the English translations that `translate_batch` prints change? Would decoding get faster or
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
# vector, accumulated over the steps, is what lets the batch stop early: without it the loop could not
# tell that every sentence has ended and would run to `max_len`, computing steps nobody reads.
#
# **Rubric.**
# - 1 point: the translations do not change, because `decode` stops at the first `<eos>` (and later
#   tokens cannot change earlier ones). An answer claiming that words after `<eos>` would enter the
#   translations gets 0 here.
# - 1 point: any correct account of cost or purpose: the speed does not change (finished rows are
#   computed at every step either way); `<pad>` keeps `ys` clean for code that reads it past
#   `<eos>`; the accumulated `finished` vector is what lets the loop stop before `max_len`.

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
