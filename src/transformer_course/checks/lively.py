"""Random models that show what a decoding check compares.

A check of a decoding loop runs the student's loop and the reference's on a small random model. Most random
models say one token whatever they read, or end every sentence at the same step: on such a model a loop that
reads the wrong position, never pads, or stops at the first <eos> agrees with a right one. Stages 6 and 7
therefore search seeds (`seeds`) for a model whose reference decoding `shows_decoding`, each with conditions of
its own on top (a target mask that matters, a cache whose order matters).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

SEED_STEP = 7919  # the distance between two seeds tried


def seeds(seed: int, tries: int) -> Iterator[int]:
    """The seeds to try, in order: `seed` itself (the course-written seeds pass at once), then a step apart."""
    for attempt in range(tries):
        yield seed + SEED_STEP * attempt


def shows_decoding(generated: torch.Tensor, eos: int, pad: int, *, min_steps: int = 0,
                   after_first_end: int = 0) -> bool:
    """Whether a decoding's generated ids (batch, steps) (<bos> left out) can tell loops apart: two different
    words at least and, for one sentence, `min_steps` steps at least; for a batch, sentences that end at
    different steps (or one ends and another does not), with `after_first_end` steps at least after the first
    sentence's <eos>."""
    words = {int(token) for token in generated.flatten() if int(token) not in (eos, pad)}
    if len(words) < 2:
        return False
    if generated.size(0) == 1:
        return generated.size(1) >= min_steps
    ends = {next((step for step, token in enumerate(row) if int(token) == eos), None) for row in generated}
    first = min((end for end in ends if end is not None), default=None)  # the step of the first sentence's <eos>
    return len(ends) >= 2 and first is not None and generated.size(1) - 1 - first >= after_first_end
