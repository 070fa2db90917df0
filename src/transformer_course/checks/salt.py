"""The random values of a hidden test: drawn from the class's secret, not from the published seeds.

A check makes its inputs and weights from fixed seeds (`framework.generator(seed)`, `torch.manual_seed(seed)`
around a module's construction), so that a student's notebook and the grader see the same numbers. For a
hidden test that would make the inputs public: the seeds are in the course's source. While grading a hidden
part, the grader sets a *salt* (`salted`), drawn for that one check call from the instructor's secret
(`grading.sandbox.hidden_inputs`), and every fixed seed then stands for another one (`salted_seed`). The salt
travels with the check's requests to the student's side, so that the experiments run there draw the same way.
Without a salt (a student's own notebook, the visible checks) every seed is itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_SALT: ContextVar[int | None] = ContextVar("transformer_course_hidden_salt", default=None)


@contextmanager
def salted(salt: int | None) -> Iterator[None]:
    """Inside: every fixed seed of the checks stands for one drawn from `salt` (None: seeds as written)."""
    token = _SALT.set(salt if isinstance(salt, int) and not isinstance(salt, bool) else None)
    try:
        yield
    finally:
        _SALT.reset(token)


def current() -> int | None:
    """The salt in force, None outside a hidden part."""
    return _SALT.get()


def salted_seed(seed: int) -> int:
    """The seed that `seed` stands for now: itself without a salt, else a 63-bit number drawn from both."""
    salt = _SALT.get()
    if salt is None:
        return seed
    digest = hashlib.blake2b(f"{salt}:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1
