"""What is noted about the reference solution in the student's process: a grade cell handed a part of it.

The grading build (`build`) leaves the reference solution of the graded notebook's exercises out of the sandbox:
it cannot be handed in, run or copied there, so nothing watches for that any more (no probes in the reference,
no audit hook for copies). What stays are the few exercise parts that the checks' experiments plug into the
student's objects and for which there is no stand-in (`build.KEPT_FOR_EXPERIMENTS`): a grade cell's argument
that is such a part, a subclass of its class, or made of its methods becomes a note for the grader, which
decides what to flag (`executor.findings_from`). Nothing here traces the notebook.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

REFERENCE = "transformer_course.reference"


class Watcher:
    """Notes for the grader: a grade cell's argument that is (or is made of) the reference of an exercise."""

    def __init__(self, exercises: list[str]) -> None:
        self.exercises = set(exercises)
        self.notes: list[dict[str, str]] = []

    def supply(self, value: Any) -> None:
        """What a check plugs into the student's objects (`checks.boundary.supplied`): nothing to note."""

    def _reference(self, value: Any) -> str | None:
        """'name' when `value` is the reference's own class or function of exercise `name`."""
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if not isinstance(module, str) or not isinstance(qualname, str) or not module.startswith(REFERENCE):
            return None
        top = qualname.split(".")[0]
        return top if top in self.exercises else None

    def handed_in(self, name: str, value: Any) -> None:
        """A grade cell's argument: is it the reference itself, a subclass, or made of its methods?"""
        unwrapped = getattr(value, "__func__", value)
        exercise = self._reference(unwrapped)
        if exercise is not None:
            self._note("reference", exercise, f"{name} is the course's reference solution ({exercise})")
            return
        if isinstance(value, type):
            for base in value.__mro__[1:]:
                exercise = self._reference(base)
                if exercise is not None:
                    self._note("subclass", exercise, f"{name} is a subclass of the reference solution ({exercise})")
                    return
            for attribute in vars(value).values():
                exercise = self._reference(getattr(attribute, "__func__", attribute))
                if exercise is not None:
                    self._note("reference", exercise, f"{name} is made of the reference solution's code ({exercise})")
                    return

    def _note(self, kind: str, reference: str, text: str, digest: str = "") -> None:
        note = {"kind": kind, "reference": reference, "text": text, "digest": digest}
        if note not in self.notes:
            self.notes.append(note)

    def take(self) -> list[dict[str, str]]:
        notes, self.notes = self.notes, []
        return notes

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Kept for the runner's shape: nothing is watched while code runs."""
        yield
