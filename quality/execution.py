"""Execute a notebook in a fresh kernel and report, cell by cell, what passed and what failed.

Used by the tests (solutions must pass every grade cell, student notebooks must fail every
visible one, no other cell may fail) and by lesson authors:

    python -m quality.execution notebooks/01_positional_encoding/01_positional_encoding.ipynb
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient


@dataclass(frozen=True)
class CellOutcome:
    index: int
    cell_id: str
    grade: bool  # an nbgrader grade (test) cell
    points: float
    failed: bool  # an error, or text on stderr, which nbgrader also scores as a failure
    message: str
    source: str
    printed: str = ""  # the cell's stdout
    displayed: str = ""  # the text/plain of what the cell displayed (the checks' red failure blocks, the summary)
    html: str = ""  # the text/html of the same (a failure block's folded hints are only there)


def _failure(cell: nbformat.NotebookNode) -> str:
    for output in cell.get("outputs", []):
        if output.output_type == "error":
            return f"{output.ename}: {output.evalue}"
    for output in cell.get("outputs", []):
        if output.output_type == "stream" and output.name == "stderr" and "Warning" not in output.text:
            return f"stderr: {output.text.strip()[:300]}"
    return ""


def execute(path: Path, timeout: int = 600, environment: dict[str, str] | None = None,
            allow_errors: bool = True) -> list[CellOutcome]:
    """Run every cell and return one outcome per code cell. With allow_errors (the default) an error does
    not stop the run; without it the first error raises nbclient's CellExecutionError, as "Run all" stops."""
    notebook = nbformat.read(path, as_version=4)
    previous = dict(os.environ)
    os.environ.update({"MPLBACKEND": "Agg", "PYTHONWARNINGS": "ignore", **(environment or {})})
    try:
        client = NotebookClient(
            notebook, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
            resources={"metadata": {"path": str(Path(path).parent)}},
        )
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(previous)
    outcomes = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        nbgrader = cell.metadata.get("nbgrader", {})
        message = _failure(cell)
        outcomes.append(CellOutcome(
            index=index, cell_id=cell.get("id", ""), grade=bool(nbgrader.get("grade")),
            points=float(nbgrader.get("points", 0) or 0), failed=bool(message), message=message,
            source=cell.source, printed="".join(output.get("text", "") for output in cell.get("outputs", [])
                                                if output.output_type == "stream" and output.name == "stdout"),
            displayed="".join(output.get("data", {}).get("text/plain", "") for output in cell.get("outputs", [])
                              if output.output_type in ("display_data", "execute_result")),
            html="".join(output.get("data", {}).get("text/html", "") for output in cell.get("outputs", [])
                         if output.output_type in ("display_data", "execute_result")),
        ))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebook", type=Path)
    arguments = parser.parse_args(argv)
    outcomes = execute(arguments.notebook)
    for outcome in outcomes:
        kind = "GRADE" if outcome.grade else "cell "
        status = "FAIL" if outcome.failed else "ok  "
        first = outcome.message.splitlines()[0][:150] if outcome.message else ""
        print(f"{status} {kind} [{outcome.index:2d}] {outcome.cell_id:28s} {first}")
    grade = [o for o in outcomes if o.grade]
    other_failures = [o for o in outcomes if not o.grade and o.failed]
    print(f"\n{sum(not o.failed for o in grade)}/{len(grade)} grade cells pass; "
          f"{len(other_failures)} non-grade cells failed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
