"""Measure the checks on mistakes they were not written against: run mechanical mutants of the
reference solutions (`quality.mutations`) through the real grade cells and judge the outcome.

THE RULE (written before the measurement it is used for; `names_operation_and_relation`): a failure message
*names* a mutant when it names both
1. the operation the mutation touched: the student's line in the mutated function ("in `split_heads`,
   line 3"), or the value, call or module it changes by the name the code or the lesson uses (the targets
   and aliases below, the calls and variables the mutation's description quotes); and
2. the relation the mutation introduced, by one of the words its kind declares in `RELATION_WORDS`
   (swapped, sign, factor, axis, shifted, missing, twice, another operation, opposite, ...).
A message that says where but not what, or what but not where, does not name it. The words are matched
case-insensitively in the message with the check titles and any "what is expected" recipe taken out.

A mutant is *rejected* when at least one grade cell fails. Its failure is *named* when a failing
cell's message (with the check titles and any "what is expected" recipe taken out, since those say
nothing about this mutant) names the place of the mutation or what it changes:
- the student's own line, "in `split_heads`, line 3" (crash messages);
- the intermediate value the mutated statement computes: its variable (`scores`, `div_term`) or
  what that value is in the lesson's words (`div_term`: the frequencies, the exponent);
- what the mutation touches: the call it drops (`contiguous`, `dropout`, `W_o`), the call whose
  axis or arguments it changes (`softmax`, `transpose`), the variables it swaps;
- the function itself when its exercise region has at most two statements (the check then names
  the place exactly).
"""

from __future__ import annotations

import ast
import copy
import importlib
import os
import pickle
import re
import select
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import torch

from quality.inprocess import GradeOutcome, run_grade_cells
from quality.mistakes import is_solution
from quality.mutations import Mutant, sample
from transformer_course.checks.framework import RECIPE as RECIPE_MARK

# What each intermediate value is, in the words the lessons (and so the messages) use.
ALIASES: dict[str, tuple[str, ...]] = {
    "position": ("position", "positions", "row"),
    "two_i": ("exponent", "frequency", "frequencies", "period", "2i"),
    "div_term": ("exponent", "frequency", "frequencies", "period", "div_term"),
    "scores": ("scores",),
    "weights": ("weights", "softmax", "sum to 1"),
    "allowed": ("diagonal", "triangle", "future"),
    "Q": ("queries", "W_q"),
    "K": ("keys", "W_k"),
    "V": ("values", "W_v"),
    "heads": ("head", "heads"),
    "split_heads": ("split_heads",),
    "combine_heads": ("combine_heads",),
    "batch_size": ("batch",),
    "seq_length": ("seq_len",),
    "tgt_in": ("tgt_in", "shift", "shifted"),
    "tgt_out": ("tgt_out", "shift", "shifted"),
    "logits": ("logits",),
    "loss": ("loss",),
    "next_token": ("next token", "argmax"),
    "finished": ("finished", "<eos>"),
    "ys": ("ys",),
    "enc_out": ("enc_out", "encoder output", "memory"),
    "padding": ("padding",),
    "look_ahead": ("look-ahead", "look_ahead", "future"),
    "encoder_self": ("encoder_self",),
    "decoder_self": ("decoder_self",),
    "cross": ("cross",),
    "step": ("step",),
}
SLICE_WORDS = {r"\[:, ?0::2\]\s*=": ("even columns",), r"\[:, ?1::2\]\s*=": ("odd columns",)}
# Targets too common to say anything: every message of their stage mentions them.
TOO_COMMON = {"x", "_", "pe", "output", "mask"}


@dataclass
class Verdict:
    mutant: Mutant
    outcomes: dict[str, GradeOutcome] = field(default_factory=dict)
    error: str = ""  # the run itself failed (time limit), not a grade cell

    @property
    def failing(self) -> list[GradeOutcome]:
        return [outcome for outcome in self.outcomes.values() if not outcome.passed]

    @property
    def rejected(self) -> bool:
        return bool(self.failing) or bool(self.error)

    def named_in(self, outcome: GradeOutcome, titles: Iterable[str]) -> bool:
        return names_the_mutation(self.mutant, outcome.message, titles)

    def named(self, titles: Iterable[str]) -> bool:
        return any(self.named_in(outcome, titles) for outcome in self.failing)

    def named_first(self, titles: Iterable[str]) -> bool:
        return bool(self.failing) and self.named_in(self.failing[0], titles)

    def named_by_the_rule(self, titles: Iterable[str]) -> bool:
        """Some failing cell's message names the operation and the relation (the rule)."""
        return any(names_operation_and_relation(self.mutant, outcome.message, titles) for outcome in self.failing)


def _region_size(mutant: Mutant) -> int:
    """Statements in the exercise region of the mutated function."""
    tree = ast.parse(mutant.module_source)
    short = mutant.function.rpartition(".")[2]
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == short:
            lines = ast.get_source_segment(mutant.module_source, node) or ""
            body = lines.partition("### BEGIN SOLUTION")[2].partition("### END SOLUTION")[0]
            try:
                return len(ast.parse(_dedent(body)).body)
            except SyntaxError:
                return 99
    return 99


def _dedent(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in lines), default=0)
    return "\n".join(line[indent:] for line in lines)


def place_terms(mutant: Mutant) -> list[str]:
    """The words that name this mutation's place or what it changes."""
    terms: list[str] = []
    for target in mutant.targets:
        if target not in TOO_COMMON:
            terms.append(target)
        terms.extend(ALIASES.get(target, ()))
    for pattern, words in SLICE_WORDS.items():  # a slice of a table, in words: pe[:, 0::2] -> the even columns
        if re.search(pattern, mutant.line):
            terms.extend(words)
    if mutant.kind in ("drop_call", "change_axis", "swap_arguments", "swap_variable"):
        terms.extend(name.lstrip(".").rstrip("(.)") for name in re.findall(r"`([^`]+)`", mutant.description))
    return [term for term in dict.fromkeys(terms) if term and term not in TOO_COMMON
            and (len(term) > 1 or term.isupper())]


def _without(message: str, titles: Iterable[str]) -> str:
    for title in titles:
        message = message.replace(title, " ")
    return "\n".join(line.partition(RECIPE_MARK)[0] for line in message.splitlines())


def _mentions(text: str, term: str) -> bool:
    """term as a whole word; a one-letter term (Q, K, V) only in its own case."""
    if len(term) == 1:
        return re.search(rf"(?<![\w]){re.escape(term)}(?![\w])", text) is not None
    words = re.escape(term.lower())
    return re.search(rf"(?<![\w]){words}(?![\w])", text.lower()) is not None


def names_the_mutation(mutant: Mutant, message: str, titles: Iterable[str]) -> bool:
    short = mutant.function.rpartition(".")[2]
    if f"in `{short}`, line" in message:
        return True
    if _region_size(mutant) <= 2 and _mentions(message, short):
        return True
    body = _without(message, titles)
    for term in place_terms(mutant):
        if term.startswith("self."):
            term = term.removeprefix("self.")
        if _mentions(body, term):
            return True
    return False


# What a message must say about the change each kind of mutation makes (the rule above, part 2).
RELATION_WORDS: dict[str, tuple[str, ...]] = {
    "swap_operands": ("swapped", "opposite", "sign", "order", "reversed", "transposed", "the other way",
                      "inverted", "instead of", "where the paper", "where the reference"),
    "swap_arguments": ("swapped", "order", "receives", "where the paper", "where the reference", "instead of",
                       "transposed", "axis", "axes", "shape", "argument"),
    "change_axis": ("axis", "axes", "dim", "transposed", "normalised over", "shape", "swapped", "order",
                    "argument"),
    "off_by_one": ("shifted", "by one", "off by one", "+1", "-1", "−1", "one more", "one fewer", "length", "shape",
                   "argument", "missing", "extra", "instead of", "where", "is expected"),
    "drop_call": ("missing", "never", "without", "not applied", "leaves out", "skipped", "not called", "unchanged",
                  "left out", "no ", "not ", "as it is", "where the paper", "where the reference", "instead of"),
    "change_constant": ("factor", "×", "constant", "argument", "where", "instead of", "sign", "is expected",
                        "+", "shifted", "value"),
    "swap_comparison": ("opposite", "inverted", "true", "false", "visible", "hidden", "comparison", "where",
                        "instead of", "is expected", "never", "stops"),
    "delete_statement": ("missing", "never", "without", "not ", "unchanged", "leaves out", "skipped",
                         "left out", "no ", "as it is", "empty"),
    "swap_variable": ("receives", "instead of", "where the paper", "where the reference", "uses self.", "swapped",
                      "changed", "another", "same as", "equals", "is the", "shape"),
    "duplicate_call": ("twice", "more than once", "extra", "again", "×", "factor", "times", "applied to its result",
                       "another order", "instead of", "where the paper", "where the reference"),
    "replace_operator": ("applies the", "another", "instead of", "where the paper", "where the reference", "×",
                         "sign", "opposite", "inverted", "normalised", "factor", "squared", "log", "exp", "sum",
                         "mean"),
}


def names_operation(mutant: Mutant, message: str, titles: Iterable[str]) -> bool:
    """Part 1 of the rule: the message names the operation the mutation touched (its line or its name)."""
    return names_the_mutation(mutant, message, titles)


def names_relation(mutant: Mutant, message: str, titles: Iterable[str]) -> bool:
    """Part 2 of the rule: the message says what the change is, in one of its kind's words."""
    body = _without(message, titles).lower()
    return any(word.lower() in body for word in RELATION_WORDS.get(mutant.kind, ()))


def names_operation_and_relation(mutant: Mutant, message: str, titles: Iterable[str]) -> bool:
    """THE RULE (see the module docstring): both the operation and the relation are named."""
    return names_operation(mutant, message, titles) and names_relation(mutant, message, titles)


def _normal(text: str) -> str:
    """Code as Python reads it: comments, spacing and docstring layout folded (ast.unparse)."""
    try:
        return ast.unparse(ast.parse(text))
    except SyntaxError:
        return " ".join(text.split())


def _changed_cells(edit: Any, notebook: nbformat.NotebookNode) -> tuple[str, ...]:
    """The exercise cells an edit changes, as they read afterwards (whitespace folded)."""
    try:
        edited = edit.apply(copy.deepcopy(notebook))
    except ValueError:
        return ()
    return tuple(_normal(new.source) for old, new in zip(notebook.cells, edited.cells, strict=True)
                 if old.source != new.source)


def catalogued_edits() -> set[tuple[str, tuple[str, ...]]]:
    """(stage, the exercise cells as a catalogued mistake leaves them) for every mistake of the catalog: a
    mutant that leaves a cell the same way is a mistake the checks were written against, and is left out
    of the measure."""
    from quality.mistakes import catalog

    mistakes, _ = catalog()
    found = set()
    for mistake in mistakes:
        found.add((mistake.assignment, _changed_cells(mistake, _solution(mistake.assignment))))
    return found


def in_catalog(mutant: Mutant, catalogued: set[tuple[str, tuple[str, ...]]]) -> bool:
    return (mutant.assignment, _changed_cells(mutant.edit, _solution(mutant.assignment))) in catalogued


def drawn_sample(everything: list[Mutant], per_kind: int, seed: int, left_out_seeds: Iterable[int],
                 left_out_per_kind: int, catalogued: set[tuple[str, tuple[str, ...]]],
                 exclude: set[str] = frozenset()) -> tuple[list[Mutant], list[Mutant]]:
    """The mutants of the sample drawn with `seed` (up to `per_kind` of every kind), leaving out every mutant of
    the samples drawn with `left_out_seeds` (tuned on, or measured before) and `exclude`: (the mutants measured,
    the ones a catalogued mistake already makes, which are left out of the measure)."""
    earlier = {m.identifier for s in left_out_seeds for m in sample(everything, left_out_per_kind, s)}
    drawn = sample(everything, per_kind, seed, exclude=earlier | set(exclude))
    written_against = [mutant for mutant in drawn if in_catalog(mutant, catalogued)]
    return [mutant for mutant in drawn if mutant not in written_against], written_against


_SOLUTIONS: dict[str, nbformat.NotebookNode] = {}


def _solution(assignment: str) -> nbformat.NotebookNode:
    if assignment not in _SOLUTIONS:
        from transformer_course.authoring import repository_root

        _SOLUTIONS[assignment] = nbformat.read(repository_root() / "solutions" / assignment / f"{assignment}.ipynb",
                                               as_version=4)
    return _SOLUTIONS[assignment]


def check_titles(assignment: str) -> list[str]:
    """The titles of every check of a stage (they are the same whatever the mistake)."""
    name = {"00_why_attention": "why_attention", "01_positional_encoding": "positional_encoding",
            "02_attention": "attention", "03_blocks": "blocks", "04_transformer": "model", "05_training": "training",
            "06_decoding": "decoding", "07_fast_and_better_decoding": "fast_decoding"}[assignment]
    module = importlib.import_module(f"transformer_course.checks.{name}")
    return sorted((title for value in vars(module).values() if (title := getattr(value, "check_title", None))),
                  key=len, reverse=True)


# --- running ------------------------------------------------------------------------------------------


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).partition(".")[0] for alias in node.names}
        else:
            names |= {child.id for child in ast.walk(node) if isinstance(child, ast.Name)
                      and isinstance(child.ctx, ast.Store)}
    return names


def _used(tree: ast.Module) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def reduced(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook with only what the grade cells need: the setup, exercise and grade cells and the
    given cells that define a name those use (figures and demos after them cannot change a grade)."""
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    grade_positions = [index for index, cell in enumerate(cells) if cell.metadata.get("nbgrader", {}).get("grade")]
    cells = cells[: max(grade_positions, default=-1) + 1]
    trees = []
    for cell in cells:
        try:
            trees.append(ast.parse(cell.source))
        except SyntaxError:
            trees.append(None)
    keep = {index for index, cell in enumerate(cells) if is_solution(cell) or cell.metadata.get("nbgrader", {})
            .get("grade") or cell.metadata.get("nbgrader", {}).get("grade_id") == "setup" or trees[index] is None}
    changed = True
    while changed:
        changed = False
        for index in sorted(keep):
            for name in _used(trees[index]) if trees[index] else ():
                definers = [earlier for earlier in range(index) if trees[earlier] and name in _defined(trees[earlier])]
                if definers and definers[-1] not in keep:
                    keep.add(definers[-1])
                    changed = True
    small = copy.deepcopy(notebook)
    small.cells = [copy.deepcopy(cell) for index, cell in enumerate(cells) if index in keep]
    return small


def last_grade_cell_of_its_exercise(mutant: Mutant, notebook: nbformat.NotebookNode) -> str | None:
    """The last grade cell between the exercise cell the mutant edits and the next exercise cell."""
    last, inside = None, False
    for cell in notebook.cells:
        if is_solution(cell):
            if inside:
                break
            inside = mutant.edit.find in cell.source
        elif inside and cell.metadata.get("nbgrader", {}).get("grade"):
            last = cell.metadata["nbgrader"]["grade_id"]
    return last


def _child(mutant: Mutant, notebook: nbformat.NotebookNode, directory: Path, write: int, focused: bool) -> None:
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.nice(5)
        torch.set_num_threads(1)  # a thread pool the parent started does not survive fork: never touch it
        try:
            mutated = mutant.edit.apply(copy.deepcopy(notebook))
            stop = last_grade_cell_of_its_exercise(mutant, notebook) if focused else None
            payload: object = run_grade_cells(mutated, directory, stop_after=stop)
        except Exception as error:  # report it rather than die silently
            payload = f"{type(error).__name__}: {error}"
        data = pickle.dumps(payload)
        with os.fdopen(write, "wb") as pipe:
            pipe.write(data)
    finally:
        os._exit(0)


def run_mutants(mutants: list[Mutant], notebooks: dict[str, tuple[nbformat.NotebookNode, Path]],
                jobs: int = 1, timeout: float = 180.0, focused: bool = False) -> list[Verdict]:
    """Grade every mutant in a child process of its own (forked: the checks are imported once),
    at most `jobs` at a time; a mutant that runs past `timeout` seconds counts as rejected. With
    `focused`, grading stops after the grade cells of the mutated exercise (a quick sample)."""
    pending = list(mutants)
    running: dict[int, tuple[Mutant, int, float, bytearray, int]] = {}  # read fd -> mutant, pid, start, data
    verdicts: dict[str, Verdict] = {}
    while pending or running:
        while pending and len(running) < max(1, jobs):
            mutant = pending.pop(0)
            notebook, directory = notebooks[mutant.assignment]
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                _child(mutant, notebook, directory, write, focused)
            os.close(write)
            running[read] = (mutant, pid, time.monotonic(), bytearray(), 0)
        ready, _, _ = select.select(list(running), [], [], 0.5)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            mutant, pid, start, data, _ = running[fd]
            if chunk:
                data.extend(chunk)
                continue
            os.close(fd)
            os.waitpid(pid, 0)
            del running[fd]
            try:
                payload = pickle.loads(bytes(data))
            except Exception:
                payload = "the grading process died without a result"
            verdicts[mutant.identifier] = (Verdict(mutant, payload) if isinstance(payload, dict)
                                           else Verdict(mutant, error=str(payload)))
        for fd, (mutant, pid, start, _, _) in list(running.items()):
            if time.monotonic() - start > timeout:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(fd)
                del running[fd]
                verdicts[mutant.identifier] = Verdict(mutant, error=f"no result within {timeout:.0f} s")
    return [verdicts[mutant.identifier] for mutant in mutants]
