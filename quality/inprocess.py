"""Run a notebook the way the grader does and report what every grade cell said.

The tests and the mistake catalog run hundreds of notebook variants, so they share a runner zygote per stage
in each test process (`transformer_course.grading.sandbox.runner`, started without a sandbox: what it runs is the
course's own reference code and its edits) instead of a sandbox per notebook. Everything else is the
batch grader's own path: nbgrader's Execute replaced by `JudgedExecute`, ordinary cells in the runner, each
grade cell judged in this process against a servant, hidden parts at the end against snapshots,
`NBGRADER_EXECUTION` set so the training and decoding demos take their short grading path.
"""

from __future__ import annotations

import atexit
import copy
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from transformer_course.grading.cells import is_grade_cell
from transformer_course.grading.sandbox import executor
from transformer_course.grading.sandbox.executor import FINDINGS_KEY, JudgedExecute, preload_modules
from transformer_course.grading.sandbox.session import Session


@dataclass(frozen=True)
class GradeOutcome:
    grade_id: str
    passed: bool
    message: str  # the error a failing cell raised ("" when it passed)
    output: str = ""  # what the cell printed
    findings: tuple[str, ...] = ()  # what the grader flags for review in this notebook


def grade_id(cell: nbformat.NotebookNode) -> str | None:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return nbgrader.get("grade_id") if nbgrader.get("grade") else None


_SESSIONS: dict[tuple[str, ...], Session] = {}  # runner zygotes of this test process, the latest used last
KEPT_SESSIONS = 9  # zygotes kept alive at once: one per stage and one for no notebook (250-390 MB each); test
# files run stage after stage, and pytest-xdist hands a worker tests of several files at once


def shared_session(notebook: nbformat.NotebookNode | None = None) -> Session:
    """A runner zygote of the test process's, started on first use for the modules `notebook` imports (as the
    batch preloads what a class's notebooks import): one per stage, so that a stage's zygote carries neither
    spaCy for a stage that does not use it nor its cost at every fork."""
    modules = tuple(preload_modules([notebook] if notebook is not None else []))
    session = _SESSIONS.pop(modules, None)
    if session is None or not session.alive():
        environment = {**os.environ, "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg",
                       "PYTHONWARNINGS": "ignore"}
        session = Session(list(modules), environment=environment).start()
        atexit.register(session.close)
    _SESSIONS[modules] = session
    while len(_SESSIONS) > KEPT_SESSIONS:
        _SESSIONS.pop(next(iter(_SESSIONS))).close()
    return session


def run_notebook(notebook: nbformat.NotebookNode, directory: Path, timeout: float = 600,
                 session: Session | None = None, student: str | None = None, **options: Any) -> nbformat.NotebookNode:
    """The notebook as the grader leaves it: every cell's outputs, the findings in its metadata. `session`:
    a zygote of the caller's (default: the test process's shared one); `student`: whose submission it is, as
    nbgrader says (the hidden inputs are drawn for it); `options`: JudgedExecute's settings."""
    executor._SESSION[0] = session or shared_session(notebook)
    executor._SESSION_FACTORY[0] = (lambda _notebook: session.start()) if session else shared_session
    preprocessor = JudgedExecute(timeout=timeout, sandbox_per_notebook=False, **options)  # one zygote for the tests
    preprocessor.log = logging.getLogger("inprocess")
    try:
        resources: dict[str, Any] = {"cwd": str(directory)}
        if student is not None:
            resources["nbgrader"] = {"student": student}
        graded, _ = preprocessor.preprocess(copy.deepcopy(notebook), resources)
    finally:
        executor._SESSION[0], executor._SESSION_FACTORY[0] = None, None
    return graded


def run_grade_cells(notebook: nbformat.NotebookNode, directory: Path, stop_after: str | None = None,
                    timeout: float = 600) -> dict[str, GradeOutcome]:
    """{grade_id: outcome} for every grade cell of `notebook` run with `directory` as working directory;
    with `stop_after`, the cells below that grade cell are left out (they cannot change its outcome)."""
    notebook = copy.deepcopy(notebook)
    if stop_after is not None:
        last = next((index for index, cell in enumerate(notebook.cells) if grade_id(cell) == stop_after), None)
        if last is not None:
            notebook.cells = notebook.cells[:last + 1]
    graded = run_notebook(notebook, directory, timeout)
    findings = tuple(graded.metadata.get(FINDINGS_KEY, {}).get("findings", []))
    outcomes: dict[str, GradeOutcome] = {}
    for cell in graded.cells:
        identifier = grade_id(cell) if is_grade_cell(cell) else None
        if identifier is None:
            continue
        printed = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        message = f"{error['ename']}: {error['evalue']}" if error is not None else ""
        outcomes[identifier] = GradeOutcome(identifier, error is None, message, printed, findings)
    return outcomes


__all__ = ["GradeOutcome", "grade_id", "is_grade_cell", "run_grade_cells", "run_notebook", "shared_session"]
