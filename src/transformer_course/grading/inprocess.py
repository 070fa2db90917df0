"""Run a notebook's cells in this Python process and report what every grade cell said.

A kernel per run costs seconds; the mistake catalog runs a hundred notebook variants, so it
executes the cells here instead: the same cell sources nbgrader runs, in order, in one fresh
namespace, with `NBGRADER_EXECUTION` set so the training and decoding demos take their short
grading path. A cell that raises does not stop the run (as in nbgrader with allow_errors).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import nbformat

from transformer_course.grading.guard import checks_module, guarded, prelude


@dataclass(frozen=True)
class GradeOutcome:
    grade_id: str
    passed: bool
    message: str  # the error a failing cell raised ("" when it passed)
    output: str = ""  # what the cell printed


def grade_id(cell: nbformat.NotebookNode) -> str | None:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return nbgrader.get("grade_id") if nbgrader.get("grade") else None


def run_grade_cells(
    notebook: nbformat.NotebookNode, directory: Path, stop_after: str | None = None, guard: bool = False
) -> dict[str, GradeOutcome]:
    """Execute the code cells of `notebook` with `directory` as working directory.

    Returns {grade_id: outcome} for every grade cell reached; with `stop_after`, execution ends
    after that grade cell (the cells below cannot change its outcome). With `guard`, the checks
    are imported first and every grade cell runs behind the grader's guard line, as under the
    batch grader (see `transformer_course.grading.guard`).
    """
    checks = checks_module(notebook) if guard else None
    namespace: dict[str, object] = {"__name__": "__main__"}
    outcomes: dict[str, GradeOutcome] = {}
    previous_directory, previous_flag = Path.cwd(), os.environ.get("NBGRADER_EXECUTION")
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    os.chdir(directory)
    try:
        if checks:
            exec(prelude(checks), {})  # noqa: S102
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            message, printed = "", io.StringIO()
            identifier = grade_id(cell)
            source = guarded(cell.source, checks) if checks and identifier is not None else cell.source
            try:
                code = compile(source, f"<cell {index}>", "exec")
                with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        exec(code, namespace)  # noqa: S102  (running notebook cells is the point)
            except Exception as error:  # a failing cell is a result, not a crash of the run
                message = f"{type(error).__name__}: {error}"
            if identifier is not None:
                outcomes[identifier] = GradeOutcome(identifier, not message, message, printed.getvalue())
                if identifier == stop_after:
                    break
    finally:
        os.chdir(previous_directory)
        if previous_flag is None:
            os.environ.pop("NBGRADER_EXECUTION", None)
        else:
            os.environ["NBGRADER_EXECUTION"] = previous_flag
    return outcomes
