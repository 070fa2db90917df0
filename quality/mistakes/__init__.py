"""The mistake catalog: realistic student bugs, and correct solutions written differently.

Every `Mistake` is a small edit of a reference solution cell that a real student could make;
the tests run each one through the real grade cells and require the named cell to fail with a
message that names the cause. Every `Alternative` is a correct solution in another style
(einsum, -inf masks, reshape/permute, loops, ...) that must pass every grade cell, hidden ones
included. One module per stage, as in `transformer_course.checks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import nbformat


@dataclass(frozen=True)
class Edit:
    """Replace `find` (which must occur exactly once, in one solution cell) by `replace`."""

    assignment: str
    description: str
    find: str
    replace: str

    def apply(self, notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
        hits = [cell for cell in notebook.cells if self.find in cell.source and is_solution(cell)]
        if len(hits) != 1 or hits[0].source.count(self.find) != 1:
            raise ValueError(f"{self.description!r}: {self.find!r} must occur exactly once in one solution cell")
        hits[0].source = hits[0].source.replace(self.find, self.replace)
        return notebook


@dataclass(frozen=True)
class Mistake(Edit):
    """A bug: grade cell `fails` must fail and its message must contain `cause` (any case)."""

    fails: str = ""
    cause: str = ""


@dataclass(frozen=True)
class Alternative(Edit):
    """A correct solution written differently: every grade cell must pass."""


def is_solution(cell: nbformat.NotebookNode) -> bool:
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution"))


def catalog() -> tuple[list[Mistake], list[Alternative]]:
    """Every mistake and every alternative, stage by stage."""
    from quality.mistakes import (
        attention,
        blocks,
        decoding,
        fast_decoding,
        model,
        positional_encoding,
        training,
        why_attention,
    )

    stages = (why_attention, positional_encoding, attention, blocks, model, training, decoding, fast_decoding)
    mistakes = [mistake for stage in stages for mistake in stage.MISTAKES]
    alternatives = [alternative for stage in stages for alternative in stage.ALTERNATIVES]
    return mistakes, alternatives
