"""A small vocabulary (replaces torchtext's): token <-> id, specials, min_freq, save/load."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from pathlib import Path

UNK, BOS, EOS, PAD = "<unk>", "<bos>", "<eos>", "<pad>"
SPECIALS = (UNK, BOS, EOS, PAD)


class Vocab:
    """Ids 0..3 are <unk>, <bos>, <eos>, <pad>; then tokens by falling frequency (ties alphabetical).

    Unknown tokens map to <unk>. `encode` adds <bos>/<eos>; `decode` stops at <eos> and drops specials.
    """

    def __init__(self, tokens: Sequence[str]) -> None:
        if tuple(tokens[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a Vocab starts with the specials {SPECIALS}")
        self.itos: list[str] = list(tokens)
        self.stoi: dict[str, int] = {token: index for index, token in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("duplicate tokens in vocabulary")
        self.unk_idx, self.bos_idx, self.eos_idx, self.pad_idx = (self.stoi[s] for s in SPECIALS)

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_freq: int = 2) -> Vocab:
        """From tokenised sentences; tokens seen fewer than min_freq times become <unk>."""
        counts = Counter(chain.from_iterable(sentences))  # no Python call per token: fast under a tracer too
        kept = sorted((t for t, n in counts.items() if n >= min_freq and t not in SPECIALS),
                      key=lambda t: (-counts[t], t))
        return cls([*SPECIALS, *kept])

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, self.unk_idx)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def encode(self, tokens: Sequence[str], add_specials: bool = True) -> list[int]:
        ids = list(map(self.stoi.get, tokens, repeat(self.unk_idx, len(tokens))))  # (self[token] for each)
        return [self.bos_idx, *ids, self.eos_idx] if add_specials else ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids -> tokens, skipping <bos>/<pad>, stopping at the first <eos>."""
        tokens = []
        for index in ids:
            index = int(index)
            if index == self.eos_idx:
                break
            if index in (self.bos_idx, self.pad_idx):
                continue
            tokens.append(self.itos[index])
        return tokens

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"tokens": self.itos}, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        return cls(json.loads(Path(path).read_text(encoding="utf-8"))["tokens"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens)"
