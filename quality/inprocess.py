"""Run a notebook's cells the way the grader does and report what every grade cell said.

The tests and the mistake catalog run hundreds of notebook variants, so they share one runner
zygote per test process (`transformer_course.grading.sandbox.runner`, started without a sandbox: what it
runs is the course's own reference code and its edits) instead of nbgrader's per-notebook
machinery. Cells run exactly as under the batch grader: ordinary cells in IPython, grade cells in a
sealed child with the strict checks, `NBGRADER_EXECUTION` set so the training and decoding demos
take their short grading path. A cell that raises does not stop the run.
"""

from __future__ import annotations

import atexit
import os
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import nbformat

from transformer_course.grading.cells import checks_module, is_grade_cell
from transformer_course.grading.sandbox.executor import (
    ChannelBroken,
    RunnerDied,
    Session,
    exercise_names,
    expected_titles,
    preload_modules,
)


@dataclass(frozen=True)
class GradeOutcome:
    grade_id: str
    passed: bool
    message: str  # the error a failing cell raised ("" when it passed)
    output: str = ""  # what the cell printed
    findings: tuple[str, ...] = ()  # what the grader flags for review (reference used, tools replaced)
    imported: int = 0  # modules the cell imported (each grade cell's child imports them again)


def grade_id(cell: nbformat.NotebookNode) -> str | None:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return nbgrader.get("grade_id") if nbgrader.get("grade") else None


_SESSION: list[Session | None] = [None]


def shared_session() -> Session:
    """The test process's runner zygote, started on first use with every checks module loaded."""
    session = _SESSION[0]
    if session is not None and session.alive():
        return session
    import transformer_course.checks as checks

    modules = [f"transformer_course.checks.{info.name}" for info in pkgutil.iter_modules(checks.__path__)]
    environment = {**os.environ, "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg", "PYTHONWARNINGS": "ignore"}
    session = Session(preload_modules([]) + modules, environment=environment).start()
    _SESSION[0] = session
    atexit.register(session.close)
    return session


def run_grade_cells(
    notebook: nbformat.NotebookNode, directory: Path, stop_after: str | None = None, guard: bool = True,
    timeout: float = 600,
) -> dict[str, GradeOutcome]:
    """Execute the code cells of `notebook` with `directory` as working directory.

    Returns {grade_id: outcome} for every grade cell reached; with `stop_after`, execution ends
    after that grade cell (the cells below cannot change its outcome). Grade cells always run
    sealed, as under the batch grader (`guard` is kept for old callers)."""
    session = shared_session()
    checks = checks_module(notebook)
    session.notebook(checks or "transformer_course.checks.framework", exercise_names(notebook), str(directory))
    outcomes: dict[str, GradeOutcome] = {}
    try:
        for index, cell in enumerate(notebook.cells):
            if cell.get("cell_type") != "code":
                continue
            identifier = grade_id(cell)
            if identifier is None:
                session.run_cell(index, cell.source, timeout)
                continue
            outcome = session.run_grade_cell(index, cell.source, expected_titles(cell.source, checks), timeout)
            printed = "".join(o.get("text", "") for o in outcome.outputs if o.get("output_type") == "stream")
            message = next((f"{o['ename']}: {o['evalue']}" for o in outcome.outputs
                            if o.get("output_type") == "error"), "")
            outcomes[identifier] = GradeOutcome(identifier, outcome.passed, message, printed,
                                                tuple(outcome.findings), outcome.imported)
            if identifier == stop_after:
                break
    except (RunnerDied, ChannelBroken, TimeoutError):
        session.close()
        _SESSION[0] = None
        raise
    session.end_notebook()
    return outcomes


__all__ = ["GradeOutcome", "grade_id", "is_grade_cell", "run_grade_cells", "shared_session"]
