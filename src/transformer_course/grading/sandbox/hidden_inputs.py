"""Hidden tests whose inputs come from the instructor's secret, not from the published course.

A hidden grade cell is published with the course (lessons/, solutions/): its checks, and the sizes and seeds
written in it, are public. At grading time the grader draws, for each hidden check call, new sizes and a
salt from a per-class secret (`draw`): HMAC-SHA256 of the call's place (checks module, grade cell, line,
check) under the secret seeds a private random stream. So publishing the course reveals what the hidden tests
check, but none of the inputs they check it on; the same secret draws the same inputs, so a regrade gives the
same scores.

What is drawn, from the call as written (`SIZES` are the keywords that are sizes of tensors or counts):
- each size is drawn near its written value (from about half to about twice it); 0 and 1 stay as written
  (they are the cases a hidden test is written for: no heads axis, one query, one head);
- sizes equal as written stay equal, and the order between every two whole-number keywords of the call is
  kept (so `k_len < q_len`, `tgt_len <= max_len` or `pad_idx < tgt_vocab` still hold), and `d_model` stays a
  multiple of `num_heads` (an even number stays even); `num_heads` is drawn only beside the `d_model` it
  divides (a check's own default width would not be its multiple);
- a written `seed` is replaced by a drawn one, and every fixed seed inside the checks is salted (`checks.salt`):
  the random inputs and weights differ too.
Anything else (floats, flags, tuples, indices) is kept as written. `tests/test_hidden_inputs.py` grades every
stage's reference solution with drawn inputs, and `scripts/check_hidden_draws.py` does it for many secrets.

The secret is a file of 64 hexadecimal digits the instructor keeps outside the class folder (`secret_path`,
`read_or_create`); nothing of it enters the student's sandbox (only each call's salt and sizes, when the
hidden part runs).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import random
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

SECRET_VARIABLE = "TRANSFORMER_COURSE_SECRET_FILE"
SIZES = frozenset({"batch", "batch_size", "heads", "num_heads", "d_model", "d_k", "d_v", "d_ff", "q_len", "k_len",
                   "seq_len", "src_len", "tgt_len", "key_size", "query_size", "attention_size", "max_seq_length",
                   "num_layers", "num_batches", "extra"})
ATTEMPTS = 200


def secret_path(explicit: str | Path | None = None) -> Path:
    """Where the class's secret lives: `explicit`, else $TRANSFORMER_COURSE_SECRET_FILE, else
    ~/.config/transformer-course/hidden-inputs.key (outside every class folder)."""
    chosen = explicit or os.environ.get(SECRET_VARIABLE)
    if chosen:
        return Path(chosen).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "transformer-course" / "hidden-inputs.key"


class SecretError(ValueError):
    """The secret file exists but is not one (the grader refuses to guess)."""


def read_secret(path: Path) -> bytes:
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise SecretError(f"{path} does not hold a secret (64 hexadecimal digits)") from None
    if len(secret) < 16:
        raise SecretError(f"{path} holds {len(secret)} bytes: a secret needs at least 16")
    return secret


def read_or_create(path: Path) -> tuple[bytes, bool]:
    """(the secret, whether it was created now): made once, 32 random bytes, readable by its owner only."""
    if path.exists():
        return read_secret(path), False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret = secrets.token_bytes(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        handle.write(secret.hex() + "\n")
    return secret, True


def _stream(secret: bytes, place: str) -> random.Random:
    return random.Random(hmac.new(secret, place.encode(), hashlib.sha256).digest())


def _near(value: int, stream: random.Random) -> int:
    if value <= 1:
        return value
    return stream.randint(max(2, value // 2), max(3, 2 * value))


def _same_order(drawn: dict[str, int], written: dict[str, int]) -> bool:
    names = list(written)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            before, after = written[a] - written[b], drawn[a] - drawn[b]
            if (before > 0) != (after > 0) or (before == 0) != (after == 0):
                return False
    return True


def _sizes(written: dict[str, int], stream: random.Random) -> dict[str, int]:
    """Sizes drawn near the written ones, in the same order (ties kept), d_model a multiple of num_heads."""
    for _ in range(ATTEMPTS):
        drawn = dict(written)
        tied: dict[int, int] = {}
        for name, value in written.items():
            if name in SIZES and name != "d_model" and (name != "num_heads" or "d_model" in written):
                drawn[name] = tied.setdefault(value, _near(value, stream))  # heads only with the width they divide
        if written.get("d_model", 0) > 1:
            heads = drawn.get("num_heads") or 1
            width = _near(written["d_model"] // (written.get("num_heads") or 1), stream)
            if written["d_model"] % 2 == 0 and heads * width % 2:
                width += 1  # an even width stays even (the positional encoding pairs its columns)
            drawn["d_model"] = heads * width
        if _same_order(drawn, written):
            return drawn
    return dict(written)


def draw(call: Any, secret: bytes, place: str) -> tuple[Any, int]:
    """(the check call with its hidden inputs drawn, the salt of its fixed seeds) for one hidden check call
    (an `executor.CheckCall`) at `place` (checks module, grade cell id, line)."""
    stream = _stream(secret, f"{place}:{call.name}")
    kwargs = dict(call.kwargs)
    whole = {name: value for name, value in kwargs.items()
             if isinstance(value, int) and not isinstance(value, bool) and name != "seed"}
    kwargs.update(_sizes(whole, stream))
    if isinstance(kwargs.get("seed"), int) and not isinstance(kwargs.get("seed"), bool):
        kwargs["seed"] = stream.randrange(2**31)
    salt = stream.getrandbits(62)
    return replace(call, kwargs=tuple((name, kwargs[name]) for name, _ in call.kwargs)), salt
