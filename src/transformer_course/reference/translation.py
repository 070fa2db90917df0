"""Stages 5–6 glue: Multi30k as id sequences, bucketed batches, translating sentences, corpus BLEU.

`translate_batch` is stage 6's bug hunt (given with a bug planted); `translate_ids` does the same with any decoder.

BLEU recipe (so the number is reproducible): references and hypotheses are lowercased and tokenised
with spaCy's blank English tokenizer, joined by single spaces, and scored by sacreBLEU's corpus_bleu
with tokenize="none" (the text is already tokenised) and default smoothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import sacrebleu
import torch
from torch import nn
from torch.utils.data import DataLoader

from transformer_course.data import token_cache
from transformer_course.data.batching import BucketBatchSampler
from transformer_course.data.multi30k import load_pairs
from transformer_course.data.tokenize import Tokenizer
from transformer_course.data.vocab import Vocab
from transformer_course.reference.decoding import greedy_decode
from transformer_course.reference.training import collate

SOURCE_LANGUAGE, TARGET_LANGUAGE = "de", "en"


@dataclass
class TranslationData:
    """Tokenised Multi30k with vocabularies built on the training split."""

    source_vocab: Vocab
    target_vocab: Vocab
    splits: dict[str, list[tuple[list[int], list[int]]]]  # split -> (source ids, target ids) with <bos>/<eos>
    references: dict[str, list[str]]  # split -> tokenised, lowercased English references joined by spaces
    sources: dict[str, list[str]]  # split -> raw German sentences


def prepare_data(directory: str | Path | None = None, min_freq: int = 2,
                 splits: Sequence[str] = ("train", "val", "test_2016_flickr"),
                 vocabs: tuple[Vocab, Vocab] | None = None, train_subset: int | None = None,
                 seed: int = 0) -> TranslationData:
    """With `train_subset`, the training split is that many pairs drawn at random (a fixed draw for a
    given seed), and the vocabularies are built from them."""
    source_tokenizer, target_tokenizer = Tokenizer(SOURCE_LANGUAGE), Tokenizer(TARGET_LANGUAGE)
    tokenised = {}
    raw_sources = {}
    for split in splits:
        pairs = load_pairs(split, directory)
        if split == "train" and train_subset is not None:
            pairs = random.Random(seed).sample(pairs, min(train_subset, len(pairs)))
        raw_sources[split] = [german for german, _ in pairs]
        tokenised[split] = (token_cache.tokenise(source_tokenizer, [g for g, _ in pairs]),  # once per machine
                            token_cache.tokenise(target_tokenizer, [e for _, e in pairs]))
    if vocabs is None:
        vocabs = (Vocab.build(tokenised["train"][0], min_freq), Vocab.build(tokenised["train"][1], min_freq))
    source_vocab, target_vocab = vocabs

    def encode(split: str) -> list[tuple[list[int], list[int]]]:
        sources, targets = tokenised[split]
        return [(source_vocab.encode(s), target_vocab.encode(t)) for s, t in zip(sources, targets, strict=True)]

    return TranslationData(
        source_vocab, target_vocab,
        splits={split: encode(split) for split in splits},
        references={split: [" ".join(t) for t in tokenised[split][1]] for split in splits},
        sources=raw_sources,
    )


def make_loader(examples: list[tuple[list[int], list[int]]], pad_idx: int, max_tokens: int = 4096,
                shuffle: bool = True, seed: int = 0) -> DataLoader:
    """Length-bucketed batches of at most max_tokens padded tokens, collated into Batch objects."""
    lengths = [max(len(source), len(target)) for source, target in examples]
    sampler = BucketBatchSampler(lengths, max_tokens=max_tokens, shuffle=shuffle, seed=seed)
    return DataLoader(examples, batch_sampler=sampler, collate_fn=partial(collate, pad_idx=pad_idx))


def translate_batch(model: nn.Module, sources: list[list[int]], source_vocab: Vocab, target_vocab: Vocab,
                    batch_size: int = 256, max_len: int = 80) -> list[list[str]]:
    """Greedy translations (target tokens) of encoded source sentences, in the input order, decoded with
    `greedy_decode` in batches of at most `batch_size` sentences of similar lengths (on the model's device)."""
    device = next(model.parameters()).device
    ### BEGIN SOLUTION
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # similar lengths share a batch
    translations: dict[int, list[str]] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]  # the sentences of this batch, by their index in `sources`
        longest = max(len(sources[i]) for i in chunk)
        src = torch.full((len(chunk), longest), source_vocab.pad_idx)  # (batch, longest)
        for row, index in enumerate(chunk):
            src[row, :len(sources[index])] = torch.tensor(sources[index])  # each sentence from the left
        ys = greedy_decode(model, src.to(device), source_vocab.pad_idx, target_vocab.bos_idx, target_vocab.eos_idx,
                           max_len)  # (batch, out_len)
        for row, index in enumerate(chunk):
            translations[index] = target_vocab.decode(ys[row].tolist())  # stops at <eos>, drops <bos>, <pad>
    ### END SOLUTION
    return [translations[i] for i in range(len(sources))]


@torch.no_grad()
def translate_ids(model: nn.Module, sources: list[list[int]], source_vocab: Vocab, target_vocab: Vocab,
                  device: torch.device | str = "cpu", max_len: int = 80, batch_size: int = 256,
                  decode: Callable[..., torch.Tensor] = greedy_decode) -> list[list[str]]:
    """Translations (as target tokens) of already-encoded source sentences, in input order.

    `decode` has greedy_decode's signature; pass your own to translate with it."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))  # similar lengths batch well
    outputs: dict[int, list[str]] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        src = torch.full((len(chunk), max(len(sources[i]) for i in chunk)), source_vocab.pad_idx, dtype=torch.long)
        for row, index in enumerate(chunk):
            src[row, : len(sources[index])] = torch.tensor(sources[index])
        ys = decode(model, src.to(device), source_vocab.pad_idx, target_vocab.bos_idx,
                           target_vocab.eos_idx, max_len)
        for row, index in enumerate(chunk):
            outputs[index] = target_vocab.decode(ys[row].tolist())
    return [outputs[i] for i in range(len(sources))]


def translate(model: nn.Module, sentence: str, source_vocab: Vocab, target_vocab: Vocab,
              device: torch.device | str = "cpu", max_len: int = 80) -> str:
    """German sentence -> English sentence (lowercased, tokens joined by spaces)."""
    ids = source_vocab.encode(Tokenizer(SOURCE_LANGUAGE)(sentence))
    return " ".join(translate_ids(model, [ids], source_vocab, target_vocab, device, max_len)[0])


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """sacreBLEU corpus BLEU on pre-tokenised, lowercased text (tokenize='none'): (score, signature)."""
    metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)  # input is tokenised on purpose
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(metric.get_signature())
