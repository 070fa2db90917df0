"""Gradebook writes tried again where they fail, not the notebook.

Several workers (or machines, on a cluster) write one gradebook. SQLite answers "database is locked" when
another writer holds it longer than its busy time-out; PostgreSQL breaks a deadlock or a serialisation
conflict by failing one of the transactions; two workers creating the same rows at once get an integrity
error. nbgrader's autograde writes the grades after the notebook ran (`SaveAutoGrades`, then
`AssignLatePenalties`). A write refused there used to fail the whole autograde, and the worker graded the
notebook again from the start: its visible cells then ran after its hidden parts. The steps below try only
the write again, with the notebook's executed cells as they are.
"""

from __future__ import annotations

import time
from typing import Any

from nbgrader.preprocessors import AssignLatePenalties, SaveAutoGrades
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

CONFLICTS = ("deadlock detected", "could not serialize", "database is locked")  # another writer, at this moment
TROUBLE = ("IntegrityError", "OperationalError", *CONFLICTS)  # in nbgrader's log of a failed autograde
ATTEMPTS = 5  # writes of one step: the first and four more, 1, 2, 3 and 4 seconds apart


def is_trouble(text: str) -> bool:
    """Whether the text of a failed autograde shows a database error (the worker grades such a notebook again)."""
    return any(sign in text for sign in TROUBLE)


def _retried(step: type) -> type:
    """`step` (an nbgrader preprocessor that writes the gradebook) whose `preprocess` is tried again when the
    database refuses a write; every attempt opens the gradebook anew (nbgrader's steps open and close it
    themselves) and sets the same values, so an attempt that half wrote is completed by the next."""

    def preprocess(self: Any, nb: Any, resources: Any) -> Any:
        for attempt in range(ATTEMPTS):
            try:
                return step.preprocess(self, nb, resources)
            except (OperationalError, IntegrityError, DBAPIError) as error:
                conflict = isinstance(error, IntegrityError) or any(sign in str(error) for sign in CONFLICTS)
                if attempt == ATTEMPTS - 1 or not conflict:  # a missing table or a lost server: at once
                    raise
                self.log.warning("the gradebook refused a write (%s); trying again", type(error).__name__)
                time.sleep(1 + attempt)
        raise AssertionError("unreachable")

    return type(step.__name__, (step,), {"preprocess": preprocess, "__doc__": f"{step.__name__}, its writes "
                                         "tried again when the gradebook refuses them (`retries`)."})


RetriedSaveAutoGrades = _retried(SaveAutoGrades)
RetriedAssignLatePenalties = _retried(AssignLatePenalties)
REPLACEMENTS = {"SaveAutoGrades": RetriedSaveAutoGrades, "AssignLatePenalties": RetriedAssignLatePenalties}


def pipeline(preprocessors: list) -> list:
    """nbgrader's autograde pipeline with its gradebook writes retried in place: nbgrader's two steps that
    write, and any step of the course's that says it writes (`writes_gradebook = True`)."""
    def name(step: Any) -> str:
        return (step if isinstance(step, str) else step.__name__).rsplit(".", 1)[-1]

    def retried(step: Any) -> Any:
        if name(step) in REPLACEMENTS:
            return REPLACEMENTS[name(step)]
        return _retried(step) if getattr(step, "writes_gradebook", False) else step

    return [retried(step) for step in preprocessors]
