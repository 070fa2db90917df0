"""Hidden tests whose inputs come from the instructor's secret and the submission, not from the published course.

A hidden grade cell is published with the course (lessons/, solutions/): its checks, and the sizes and seeds
written in it, are public. At grading time the grader draws, for each hidden check call, new sizes and a
salt (`draw`) from a key made for the one submission being graded (`submission_key`): HMAC-SHA256 under the
class's secret of the student's name and of the submission's code (`code_of`). The call's place (checks
module, grade cell, line, check) then seeds a private random stream under that key. So:
- publishing the course reveals what the hidden tests check, but none of the inputs they check it on;
- what one student learns of their inputs (through any channel: a timing, a classmate being told) says nothing
  of a classmate's, whose key differs, nor of their own next submission, whose code differs;
- the same file of the same student graded with the same secret draws the same inputs: a regrade gives the
  same scores.

*The code of a submission* (`code_of`) is what the grader runs of it: the source of every code cell that is not a
grade cell, in order, as nbgrader hands it to the grader (the cells the instructor locked restored from the
release), each with its line endings made `\\n`, the spaces at the end of each line and the blank lines at its
start and end removed; empty cells are left out. Outputs, execution counts, metadata, cell ids, markdown cells
(written answers) and attachments are not part of it: re-saving the notebook (in Colab, Jupyter or an editor
that changes line endings or strips trailing spaces) or running it again draws the same inputs; changing a
line of code, a comment included, draws new ones.

What is drawn, from the call as written and the check's own defaults (`SIZES` names every size keyword and how
it is drawn; `RULES` holds what a check needs beyond the rules by name):
- each size is drawn uniformly from a wide range (`Size`: from `low` up to twice the written value, and at
  least `span` above it), so that the published value says little; 0 and 1 stay as written (they are the cases
  a hidden test is written for: no heads axis, one query, one head, one layer);
- every two sizes of a call are drawn different, and different from the sizes they imply (the width of one
  head, `d_model / num_heads`; the number of sine columns, `d_model / 2`), unless a check declares them tied
  (`Rule.tied`), and different from every other whole number of the call kept as written (a vocabulary, a
  padding index, a beam size, a number of steps): a mistake that confuses two axes or two widths shows only
  when their sizes differ;
- the relations a size's name implies hold (`LESS`: a sequence is shorter than the table of positions, an index
  is below the vocabulary it indexes), and the ones a check declares (`Rule.less`, `Rule.low`); `d_model` is a
  multiple of `num_heads` and stays even when written even; `num_heads` is drawn only beside the `d_model` it
  divides (a check's own default width would not be its multiple);
- a written `seed` is replaced by a drawn one, and every fixed seed inside the checks is salted (`checks.salt`):
  the random inputs and weights differ too.
- a float a check declares (`Rule.floats`) is drawn between two bounds.
Anything else (floats, flags, tuples, indices) is kept as written. `tests/test_hidden_inputs.py` grades every
stage's reference solution with drawn inputs and requires every hidden call of the lessons to draw without
falling back; `tests/test_hidden_teeth.py` runs the mistake catalog through the hidden calls alone; and
`scripts/check_hidden_draws.py` grades the references for many secrets.

The secret is a file of 64 hexadecimal digits the instructor keeps outside the class folder (`secret_path`,
`read_or_create`, made atomically so that machines starting at once agree on one); nothing of it enters the
student's sandbox (only each call's salt and sizes, when the hidden part runs).

    python -m transformer_course.grading.sandbox.hidden_inputs [--secret-file PATH]

makes the secret where the batch command would look for it (or PATH), unless it is there, and says where it is.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import importlib
import inspect
import os
import random
import secrets
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SECRET_VARIABLE = "TRANSFORMER_COURSE_SECRET_FILE"
ATTEMPTS = 400


# --- how each size is drawn --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """A size keyword drawn uniformly from `low` to max(2 x written, written + `span`) (`cap`: at most that)."""

    low: int = 2
    span: int = 8
    cap: int | None = None

    def bounds(self, written: int) -> tuple[int, int]:
        high = max(2 * written, written + self.span, self.low + 1)
        return self.low, min(high, self.cap) if self.cap is not None else high


_BATCH, _LENGTH, _WIDTH, _COUNT = Size(2, 4), Size(2, 8), Size(2, 8), Size(2, 2, cap=6)
SIZES: dict[str, Size] = {
    # sentences in a batch
    "batch": _BATCH, "batch_size": _BATCH,
    # sequence lengths, the table of positions, a square mask's side
    "q_len": _LENGTH, "k_len": _LENGTH, "seq_len": _LENGTH, "src_len": _LENGTH, "tgt_len": _LENGTH,
    "size": _LENGTH, "max_seq_length": Size(2, 16), "extra": Size(2, 4),
    # how many positions a positional encoding's offset matrix moves by (below the table's length)
    "offset": _LENGTH,
    # widths (d_model: a multiple of num_heads, see _draw_sizes)
    "d_model": Size(2, 16), "d_k": _WIDTH, "d_v": _WIDTH, "d_ff": Size(2, 16), "query_size": _WIDTH,
    "key_size": _WIDTH, "attention_size": _WIDTH,
    # heads: an axis of its own (heads, scaled dot-product attention) or the divisor of d_model (num_heads)
    "heads": _BATCH, "num_heads": Size(2, 2, cap=8),
    # counts that multiply the check's cost: a narrower range
    "num_layers": _COUNT, "num_batches": Size(2, 3, cap=10), "warmup_steps": Size(2, 8),
}

# (a, b): a < b wherever a call has both (as written or as the check's default)
LESS: tuple[tuple[str, str], ...] = (
    ("seq_len", "max_seq_length"), ("src_len", "max_seq_length"), ("tgt_len", "max_seq_length"),
    ("q_len", "max_seq_length"), ("k_len", "max_seq_length"), ("offset", "max_seq_length"),
    ("pad_idx", "src_vocab"), ("pad_idx", "tgt_vocab"), ("bos_idx", "tgt_vocab"), ("eos_idx", "tgt_vocab"),
)


@dataclass(frozen=True)
class Rule:
    """What one check needs of its sizes beyond the rules by name (see `RULES`)."""

    tied: tuple[tuple[str, str], ...] = ()  # drawn equal (the check builds one from the other)
    less: tuple[tuple[str, str], ...] = ()  # a < b
    low: tuple[tuple[str, int], ...] = ()  # a size at least this (drawn even where written 0 or 1)
    kept: frozenset[str] = frozenset()  # sizes kept as written
    defaults: tuple[tuple[str, int], ...] = ()  # sizes the check takes through **sizes, for the relations
    floats: tuple[tuple[str, float, float], ...] = ()  # a float keyword drawn uniformly between two bounds
    why: str = ""


# Keyed by "checks module stem.check name". Every entry says why: a check whose needs the rules by name cover
# has none. tests/test_hidden_inputs.py requires every hidden call of the lessons to draw (no fallback) and to
# pass on the reference solution; tests/test_hidden_teeth.py requires every catalogued mistake that fails a
# check's visible calls to fail its hidden calls too.
RULES: dict[str, Rule] = {
    "attention.sdpa_masked_keys_get_zero": Rule(
        low=(("k_len", 3),), why="its padding mask keeps k_len - 2 keys of the second sentence"),
    "training.compute_loss_values": Rule(
        floats=(("label_smoothing", 0.15, 0.45),),
        why="written 0.0, which hides a smoothing left out (the visible check's is 0.1): drawn away from 0 and "
            "from 0.1, it shows a smoothing left out and one written as a number"),
    "attention.sdpa_shapes": Rule(
        low=(("heads", 2),), why="the check runs 3-D inputs (heads=0) itself beside 4-D ones: a heads axis shows "
                                 "what 3-D inputs hide (K transposed on the heads and positions axes)"),
    **{f"positional_encoding.{name}": Rule(
        low=(("d_model", 4),),
        why="at d_model = 2 the table has one pair of columns, whose frequency is 1 whatever the exponent: a "
            "mistake in the frequencies (2i doubled, another base) shows only from two pairs on")
       for name in ("table_values", "offset_matrix_moves_every_position")},
    "positional_encoding.forward_adds_encoding": Rule(
        low=(("d_model", 4),), less=(("seq_len", "d_model"),),
        why="d_model as above, and more than seq_len: a table sliced by x.size(2) (d_model) instead of x.size(1) "
            "fits when the two are equal (the check's batch of x is never seq_len, for x.size(0))"),
    "positional_encoding.offset_matrix_any_offset": Rule(
        low=(("d_model", 4), ("max_seq_length", 5)),
        why="d_model as above; it compares positions 4 to max_seq_length - 1 for k = -4, so the table holds five "
            "at least"),
    "model.target_mask_values": Rule(
        low=(("batch", 2), ("tgt_len", 4)),
        why="the padded batch pads from its second sentence on, by at least one position from four on: with one "
            "sentence or fewer than four positions nothing is padded, and a look-ahead mask alone passes"),
    "decoding.greedy_matches_reference_batch": Rule(
        low=(("max_len", 4),),
        why="its random model is chosen so that one sentence ends while another goes on for two more steps at least "
            "(`decoding._lively`): with max_len 2 or 3 no model has that, and a loop that never pads a finished "
            "sentence passes"),
    "decoding.batch_translation_is_independent": Rule(
        low=(("src_len", 7),),
        why="its sentences are 3 + (4 i mod (src_len - 2)) tokens long: for src_len 2, 3, 4 or 6 every sentence "
            "has 3 and nothing is padded, so a batch padded wrongly passes; from 7 on they are 3 and 7 long"),
    "decoding.batch_translation_matches": Rule(
        low=(("src_len", 8),),
        why="its sentences are 3 + (5 i mod (src_len - 2)) tokens long: for src_len 2, 3 or 7 all have the same "
            "length, so sorting them by length moves none and translations returned in the sorted order pass"),
    "positional_encoding.offset_error_offsets": Rule(
        low=(("max_seq_length", 3),), why="for k = -2 the positions p from 2 on are compared: a table of three at "
                                          "least"),
}
RULES_FOR_ALL = Rule()


def rule_for(checks: str | None, name: str) -> Rule:
    """The declared needs of check `name` of module `checks` (a module name or its last part)."""
    stem = (checks or "").rsplit(".", 1)[-1]
    return RULES.get(f"{stem}.{name}", RULES_FOR_ALL)


# --- the secret ------------------------------------------------------------------------------------------


def secret_path(explicit: str | Path | None = None) -> Path:
    """Where the class's secret lives: `explicit`, else $TRANSFORMER_COURSE_SECRET_FILE, else
    ~/.config/transformer-course/hidden-inputs.key (outside every class folder)."""
    chosen = explicit or os.environ.get(SECRET_VARIABLE)
    if chosen:
        return Path(chosen).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "transformer-course" / "hidden-inputs.key"


SECRET_BYTES = 32  # what read_or_create makes: 64 hexadecimal digits and a newline


class SecretError(ValueError):
    """The secret file exists but is not one (the grader refuses to guess)."""


def read_secret(path: Path) -> bytes:
    return _secret_from(path, path.read_text(encoding="ascii", errors="replace"))


def _secret_from(path: Path, text: str) -> bytes:
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        raise SecretError(f"{path} does not hold a secret (64 hexadecimal digits)") from None
    if len(secret) < 16:
        raise SecretError(f"{path} holds {len(secret)} bytes: a secret needs at least 16")
    return secret


def _being_written(text: str) -> bool:
    """Whether `text` may be a secret caught between its creation and the end of its writing: empty, or fewer hex
    digits than the 2 * SECRET_BYTES this module writes, without the newline that ends them."""
    return (len(text) < 2 * SECRET_BYTES and not text.endswith("\n")
            and all(character in "0123456789abcdef" for character in text))


def read_or_create(path: Path, settle_seconds: float = 10.0) -> tuple[bytes, bool]:
    """(the secret, whether it was created now): made once, 32 random bytes, readable by its owner only.

    Safe when many machines or tasks start at once on a shared folder (`create_once`): every caller reads the
    one file that won; a caller that finds it still empty (a file system without hard links, between its
    creation and its writing) waits up to `settle_seconds` for the writer."""
    if path.exists():
        return _read_settled(path, settle_seconds), False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    secret = secrets.token_bytes(SECRET_BYTES)
    if create_once(path, secret.hex() + "\n"):
        return secret, True
    return _read_settled(path, settle_seconds), False


def create_once(path: Path, text: str, mode: int = 0o600) -> bool:
    """Create `path` holding `text` unless it exists; True when this call made it. The text is written whole
    into a file of this process's own, which is then linked to `path`: a hard link is made atomically (on NFS
    too) and fails where `path` exists, so of many callers at once exactly one wins and nobody sees a
    half-written file. Where the file system makes no hard links, `path` is created exclusively and written."""
    own = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    descriptor = os.open(own, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(own, path)
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here: create it exclusively instead
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                return False
            with os.fdopen(descriptor, "w", encoding="ascii") as handle:
                handle.write(text)
            return True
    finally:
        own.unlink(missing_ok=True)


def _read_settled(path: Path, settle_seconds: float) -> bytes:
    """The secret at `path`; a file still being written (another caller between creating and writing it, on a file
    system without hard links) is read again until `settle_seconds` have passed. What is judged is the text read,
    never a later look at the file, which the writer may have finished in between."""
    deadline = time.monotonic() + settle_seconds
    while True:
        text = path.read_text(encoding="ascii", errors="replace")
        if not _being_written(text) or time.monotonic() > deadline:
            return _secret_from(path, text)
        time.sleep(0.05)


def secret_id(secret: bytes) -> str:
    """A name for the secret that reveals nothing of it (to tell two secrets apart in a class folder)."""
    return hmac.new(secret, b"transformer-course class secret id", hashlib.sha256).hexdigest()[:16]


# --- the key of one submission ----------------------------------------------------------------------------


def _normalised(source: Any) -> str:
    text = "".join(source) if isinstance(source, list) else str(source or "")
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def _graded(cell: dict) -> bool:
    """Whether a code cell (a NotebookNode or plain JSON) is a grade cell (`cells.is_grade_cell`)."""
    nbgrader = (cell.get("metadata") or {}).get("nbgrader") or {}
    return bool(nbgrader.get("grade")) if isinstance(nbgrader, dict) else False


def code_of(notebook: Any) -> str:
    """The code of a submission, as the draw reads it (see the module's docstring)."""
    cells = notebook.get("cells", []) if isinstance(notebook, dict) else []
    sources = [_normalised(cell.get("source")) for cell in cells
               if isinstance(cell, dict) and cell.get("cell_type") == "code" and not _graded(cell)]
    return "\n\x00\n".join(source for source in sources if source)


def submission_key(secret: bytes, student: str, notebook: Any) -> bytes:
    """The key every hidden input of one submission is drawn from: the class's secret, the student's name and
    the submission's code (`code_of`)."""
    message = b"submission\x00" + student.encode("utf-8", "surrogatepass") + b"\x00"
    message += hashlib.sha256(code_of(notebook).encode("utf-8", "surrogatepass")).digest()
    return hmac.new(secret, message, hashlib.sha256).digest()


# --- drawing -----------------------------------------------------------------------------------------------


def _stream(key: bytes, place: str) -> random.Random:
    return random.Random(hmac.new(key, place.encode(), hashlib.sha256).digest())


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_defaults(checks: str | None, name: str) -> dict[str, int]:
    """The size keywords check `name` of module `checks` has defaults for in its signature ({} when unknown)."""
    if not checks:
        return {}
    try:
        function = getattr(importlib.import_module(checks), name, None)
        parameters = inspect.signature(function).parameters if callable(function) else {}
    except (ImportError, TypeError, ValueError):
        return {}
    return {key: parameter.default for key, parameter in parameters.items()
            if key in SIZES and _whole(parameter.default)}


@dataclass
class _Groups:
    """Sizes drawn together: each tied group draws once."""

    parent: dict[str, str] = field(default_factory=dict)

    def root(self, name: str) -> str:
        while self.parent.get(name, name) != name:
            name = self.parent[name]
        return name

    def tie(self, a: str, b: str) -> None:
        self.parent[self.root(a)] = self.root(b)


def _holds(drawn: dict[str, int], every: dict[str, int], rule: Rule, groups: _Groups) -> bool:
    """Whether the sizes `drawn` (with the call's other whole numbers `every`) keep every relation."""
    values = {**every, **drawn}
    for a, b in (*LESS, *rule.less):
        if a in values and b in values and not values[a] < values[b]:
            return False
    if any(name in values and values[name] < least for name, least in rule.low):
        return False
    sizes = [(name, value) for name, value in values.items() if name in SIZES and value > 1]
    for index, (a, first) in enumerate(sizes):  # every two sizes differ, unless tied
        for b, second in sizes[index + 1:]:
            if first == second and groups.root(a) != groups.root(b):
                return False
    implied = _implied(values).values()  # and so do the sizes they imply (the number of heads and their width)
    if any(value == size for value in implied for _, size in sizes):
        return False
    kept = {value for name, value in every.items() if name not in SIZES and value > 1}  # vocabularies, indices,
    return not any(value in kept for value in drawn.values())  # steps, beams: a drawn size equals none of them


def _implied(values: dict[str, int]) -> dict[str, int]:
    """Sizes a check's computation implies: the width of one head, the number of sine (and of cosine) columns."""
    implied = {}
    if values.get("num_heads", 0) > 1 and values.get("d_model", 0) > 1 and values["d_model"] % values["num_heads"] == 0:
        implied["d_model / num_heads"] = values["d_model"] // values["num_heads"]
    if values.get("d_model", 0) > 2 and values["d_model"] % 2 == 0:
        implied["d_model / 2"] = values["d_model"] // 2
    return {name: value for name, value in implied.items() if value > 1}


def _draw_sizes(written: dict[str, int], every: dict[str, int], rule: Rule,
                stream: random.Random) -> dict[str, int] | None:
    """Sizes drawn for `written` (the call's size keywords, its defaults included), or None where no draw keeps
    every relation in `ATTEMPTS` tries."""
    groups = _Groups()
    for a, b in rule.tied:
        if a in written and b in written:
            groups.tie(a, b)
    heads_divide = "d_model" in written and written["d_model"] > 1
    least = dict(rule.low)
    free = [name for name, value in written.items()
            if (value > 1 or name in least) and name not in rule.kept and name != "d_model"
            and (name != "num_heads" or heads_divide)]
    for _ in range(ATTEMPTS):
        drawn: dict[str, int] = {}
        by_group: dict[str, int] = {}
        for name in free:
            group = groups.root(name)
            if group not in by_group:
                low, high = SIZES[name].bounds(written[name])
                low = max(low, least.get(name, low))
                by_group[group] = stream.randint(low, max(low, high))
            drawn[name] = by_group[group]
        if heads_divide and "d_model" not in rule.kept:
            heads = drawn.get("num_heads", written.get("num_heads", 1)) or 1
            if "num_heads" in written:  # the width of one head, then d_model = heads x width
                low, high = _WIDTH.bounds(max(1, written["d_model"] // (written["num_heads"] or 1)))
            else:
                low, high = SIZES["d_model"].bounds(written["d_model"])
            width = stream.randint(low, high)
            if written["d_model"] % 2 == 0 and heads * width % 2:
                continue  # an even width stays even (the positional encoding pairs its columns)
            drawn["d_model"] = heads * width
        if _holds(drawn, every, rule, groups):
            return drawn
    return None


def draw(call: Any, key: bytes, place: str, checks: str | None = None) -> tuple[Any, int]:
    """(the check call with its hidden inputs drawn, the salt of its fixed seeds) for one hidden check call
    (an `executor.CheckCall`) at `place` (checks module, grade cell id, line), from `key` (a submission's key,
    `submission_key`; the class's secret itself where no submission is known). `checks`: the checks module,
    whose check's own default sizes are drawn too. Sizes that no draw can give keep their written values (a
    hidden call must not stop the grading; tests/test_hidden_inputs.py requires that no lesson's call does)."""
    drawn, salt, _ = draw_explained(call, key, place, checks)
    return drawn, salt


def draw_explained(call: Any, key: bytes, place: str, checks: str | None = None) -> tuple[Any, int, bool]:
    """`draw`, and whether the sizes were drawn (False: kept as written, no draw kept every relation)."""
    stream = _stream(key, f"{place}:{call.name}")
    rule = rule_for(checks, call.name)
    kwargs = dict(call.kwargs)
    defaults = {name: value for name, value in check_defaults(checks, call.name).items() if name not in kwargs}
    sizes = {name: value for name, value in kwargs.items() if name in SIZES and _whole(value)} | defaults
    every = {name: value for name, value in {**dict(rule.defaults), **defaults, **kwargs}.items()
             if _whole(value) and name != "seed"}
    chosen = _draw_sizes(sizes, every, rule, stream)
    kwargs.update(defaults)
    if chosen is not None:
        kwargs.update(chosen)
    for name, low, high in rule.floats:
        if isinstance(kwargs.get(name), float):
            kwargs[name] = round(stream.uniform(low, high), 3)
    if _whole(kwargs.get("seed")):
        kwargs["seed"] = stream.randrange(2**31)
    salt = stream.getrandbits(62)
    names = [name for name, _ in call.kwargs] + [name for name in defaults]
    return replace(call, kwargs=tuple((name, kwargs[name]) for name in names)), salt, chosen is not None


def hidden_calls(notebook: Any, parse: Any) -> Iterable[tuple[str, int, Any]]:
    """(grade cell id, line, call) of every hidden check call of `notebook`; `parse` reads a grade cell (the
    executor's `parse_grade_cell`)."""
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code" or not _graded(cell):
            continue
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        for line, call in enumerate(parse(cell.get("source", ""))[1]):
            yield str(grade_id), line, call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Make the class's secret, which the hidden tests' inputs are "
                                                 "drawn from, unless it exists; print where it is.")
    parser.add_argument("--secret-file", type=Path,
                        help=f"where (default: ${SECRET_VARIABLE}, else ~/.config/transformer-course/"
                             "hidden-inputs.key)")
    arguments = parser.parse_args(argv)
    path = secret_path(arguments.secret_file)
    try:
        secret, created = read_or_create(path)
    except (OSError, SecretError) as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"{'made' if created else 'found'} the class's secret {path} (id {secret_id(secret)}): keep it for the "
          "whole term, outside the class folder and the downloads, and give every grading machine the same file")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
