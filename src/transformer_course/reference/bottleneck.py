"""Stage 0's experiment: the same GRU encoder-decoder trained with and without attention on a subset of
Multi30k, then scored by source-sentence length. `scripts/train_rnn_baselines.py` runs it for the quoted
numbers; the notebook runs the same functions with the same settings.

BLEU recipe: stage 6's (`transformer_course.reference.translation`), greedy decoding, on the 2,014 held-out
sentences of val and test_2016_flickr together, split into buckets by the number of German tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from transformer_course.reference.rnn import GRUDecoder, GRUEncoder, Seq2Seq, greedy_decode_rnn
from transformer_course.reference.training import evaluate, make_criterion, train_epoch
from transformer_course.reference.translation import (
    TranslationData,
    corpus_bleu,
    make_loader,
    prepare_data,
    translate_ids,
)

HELD_OUT = ("val", "test_2016_flickr")
# Source-length buckets (German tokens, <bos>/<eos> not counted): (label, shortest, longest).
LENGTH_BUCKETS: tuple[tuple[str, int, int], ...] = (
    ("1–8", 1, 8), ("9–11", 9, 11), ("12–14", 12, 14), ("15–18", 15, 18), ("19+", 19, 10_000),
)


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything that decides the result; the script and the notebook use the same defaults."""

    train_pairs: int = 12_000  # a random subset of the 29,000 training pairs; the vocabularies come from it
    epochs: int = 4
    embedding_size: int = 128
    hidden_size: int = 256  # decoder state; each encoder direction has half of it
    attention_size: int = 128
    dropout: float = 0.2
    learning_rate: float = 2e-3
    max_tokens: int = 1024  # padded tokens per batch and side (small batches: more updates per CPU minute)
    clip_norm: float = 1.0
    max_len: int = 60  # longest greedy translation
    seed: int = 0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def prepare_experiment_data(config: ExperimentConfig, directory: str | Path | None = None) -> TranslationData:
    """Multi30k for the experiment: a random subset of the training pairs (the vocabularies come from it,
    words seen fewer than twice there become <unk>) and the full validation and test splits."""
    return prepare_data(directory, min_freq=2, train_subset=config.train_pairs, seed=config.seed)


def build_seq2seq(data: TranslationData, config: ExperimentConfig,
                  attention_class: Callable[[int, int, int], nn.Module] | None = None) -> Seq2Seq:
    """The GRU encoder-decoder; with `attention_class(query_size, key_size, attention_size)` it attends."""
    pad_idx, context_size = data.source_vocab.pad_idx, config.hidden_size
    attention = None
    if attention_class is not None:
        attention = attention_class(config.hidden_size, context_size, config.attention_size)
    encoder = GRUEncoder(len(data.source_vocab), config.embedding_size, config.hidden_size // 2, config.dropout,
                         pad_idx)
    decoder = GRUDecoder(len(data.target_vocab), config.embedding_size, config.hidden_size, context_size,
                         config.dropout, pad_idx, attention)
    return Seq2Seq(encoder, decoder, pad_idx)


def train_seq2seq(model: Seq2Seq, train_pairs: Sequence[tuple[list[int], list[int]]], config: ExperimentConfig,
                  device: torch.device | str = "cpu", max_steps: int | None = None,
                  progress: bool = True) -> list[dict[str, float]]:
    """Adam and stage 5's training loop (plain cross-entropy without padding); one record per epoch."""
    pad_idx = model.pad_idx
    loader = make_loader(list(train_pairs), pad_idx, config.max_tokens, seed=config.seed)
    criterion = make_criterion(pad_idx, label_smoothing=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    history, started = [], time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        loader.batch_sampler.set_epoch(epoch)
        loss = train_epoch(model.to(device), loader, criterion, optimizer, None, device, config.clip_norm,
                           max_steps, progress)
        history.append({"epoch": epoch, "train_loss": loss, "minutes": (time.perf_counter() - started) / 60})
    return history


def validation_loss(model: Seq2Seq, pairs: Sequence[tuple[list[int], list[int]]], device: torch.device | str = "cpu",
                    max_tokens: int = 2048) -> float:
    """Mean cross-entropy per target token (teacher forcing), padding ignored."""
    loader = make_loader(list(pairs), model.pad_idx, max_tokens, shuffle=False)
    return evaluate(model, loader, make_criterion(model.pad_idx, label_smoothing=0.0), device, progress=False)


def bucket_of(source_length: int) -> str:
    """The LENGTH_BUCKETS label of a source sentence with that many tokens (no <bos>/<eos>)."""
    return next(label for label, shortest, longest in LENGTH_BUCKETS if shortest <= source_length <= longest)


def held_out(data: TranslationData, limit: int | None = None) -> tuple[list[list[int]], list[str]]:
    """Source ids and tokenised references of val + test_2016_flickr (or their first `limit` sentences)."""
    sources = [source for split in HELD_OUT for source, _ in data.splits[split]][:limit]
    references = [reference for split in HELD_OUT for reference in data.references[split]][:limit]
    return sources, references


def bleu_by_length(model: Seq2Seq, data: TranslationData, device: torch.device | str = "cpu",
                   max_len: int = 60, limit: int | None = None) -> dict[str, dict[str, float]]:
    """Greedy corpus BLEU per source-length bucket and over all held-out sentences.

    Returns {bucket label or "all": {"bleu": score, "sentences": count}}; buckets without sentences are left out.
    """
    sources, references = held_out(data, limit)
    hypotheses = [" ".join(tokens) for tokens in translate_ids(
        model, sources, data.source_vocab, data.target_vocab, device, max_len, decode=greedy_decode_rnn)]
    groups: dict[str, list[int]] = {label: [] for label, _, _ in LENGTH_BUCKETS}
    for index, source in enumerate(sources):
        groups[bucket_of(len(source) - 2)].append(index)
    groups["all"] = list(range(len(sources)))
    return {label: {"bleu": corpus_bleu([hypotheses[i] for i in indices], [references[i] for i in indices])[0],
                    "sentences": len(indices)}
            for label, indices in groups.items() if indices}
