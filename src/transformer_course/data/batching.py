"""Length-bucketed batch order: sentences of similar length share a batch, so little compute is padding."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from torch.utils.data import Sampler


class BucketBatchSampler(Sampler[list[int]]):
    """Yields lists of dataset indices, each batch holding at most `max_tokens` padded tokens.

    Indices are shuffled, cut into pools of `pool_size` batches' worth, sorted by length inside
    each pool and sliced into batches; the batch order is shuffled again. `lengths[i]` is the
    longer of the source and target lengths of example i.
    """

    def __init__(self, lengths: Sequence[int], max_tokens: int = 4096, shuffle: bool = True,
                 seed: int = 0, pool_size: int = 100) -> None:
        self.lengths = list(lengths)
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.pool_size = pool_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        order = list(range(len(self.lengths)))
        rng = random.Random(self.seed + self.epoch)
        if self.shuffle:
            rng.shuffle(order)
        pool = max(1, self.pool_size * self.max_tokens // max(1, max(self.lengths, default=1)))
        batches: list[list[int]] = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start:start + pool], key=lambda index: self.lengths[index])
            batch: list[int] = []
            longest = 0
            for index in chunk:
                longest_if_added = max(longest, self.lengths[index])
                if batch and longest_if_added * (len(batch) + 1) > self.max_tokens:
                    batches.append(batch)
                    batch, longest_if_added = [], self.lengths[index]
                batch.append(index)
                longest = longest_if_added
            if batch:
                batches.append(batch)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())
