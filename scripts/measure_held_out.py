"""Measure the checks on mistakes they were not written against, and time the grade cells.

    python scripts/measure_held_out.py [--stage 03_blocks ...] [--verbose]   held-out mistakes
    python scripts/measure_held_out.py --alternatives                        correct alternatives
    python scripts/measure_held_out.py --timing                              seconds per grade cell

The held-out mistakes (`HELD_OUT` in `quality.mistakes.<stage>`) were written
before the stage 3-6 checks were reworked for issue 10 and are never tuned to. Each one is applied
to the reference solution notebook and every grade cell runs in this process (as the mistake
catalog's tests do). A mistake is *rejected* when any grade cell fails; its cause is *named* when
a failing cell's message contains one of the phrases in its `cause` (separated by " | ", written
with the mistake). *Points lost* sums the points of the failing cells: one mistake should cost the
checks about it, not every check downstream.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from transformer_course.authoring import repository_root

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # quality/ lives at the repository root
from quality.inprocess import run_grade_cells  # noqa: E402

STAGES = {"03_blocks": "blocks", "04_transformer": "model", "05_training": "training", "06_decoding": "decoding"}


@dataclass
class Measured:
    stage: str
    description: str
    rejected: bool
    named: bool
    points_lost: float
    points: float
    failing: dict[str, str]  # grade id -> message


def _solution(stage: str) -> Path:
    return repository_root() / "solutions" / stage / f"{stage}.ipynb"


def _points(notebook: nbformat.NotebookNode) -> dict[str, float]:
    return {cell.metadata["nbgrader"]["grade_id"]: float(cell.metadata["nbgrader"].get("points", 0))
            for cell in notebook.cells if cell.metadata.get("nbgrader", {}).get("grade")}


def measure(stage: str, mistake: object) -> Measured:
    path = _solution(stage)
    notebook = mistake.apply(nbformat.read(path, as_version=4))
    points = _points(notebook)
    outcomes = run_grade_cells(notebook, path.parent)
    failing = {grade_id: outcome.message for grade_id, outcome in outcomes.items() if not outcome.passed}
    phrases = [phrase.strip().lower() for phrase in mistake.cause.split(" | ")]
    named = any(phrase in message.lower() for message in failing.values() for phrase in phrases)
    return Measured(stage, mistake.description, bool(failing), named, sum(points[g] for g in failing),
                    sum(points.values()), failing)


def held_out(stages: list[str], verbose: bool) -> None:
    results = []
    for stage in stages:
        module = importlib.import_module(f"quality.mistakes.{STAGES[stage]}")
        for mistake in module.HELD_OUT:
            result = measure(stage, mistake)
            results.append(result)
            mark = ("named" if result.named else "unnamed") if result.rejected else "PASSES"
            print(f"{stage[:2]} {mark:8s} -{result.points_lost:4.0f}/{result.points:.0f}  {result.description}")
            if verbose:
                for grade_id, message in result.failing.items():
                    print(f"      {grade_id}: " + message.replace("\n", "\n        ")[:900])
    print()
    for stage in [*stages, "all"]:
        chosen = [r for r in results if stage in ("all", r.stage)]
        if not chosen:
            continue
        rejected = sum(r.rejected for r in chosen)
        named = sum(r.named for r in chosen)
        lost = sum(r.points_lost for r in chosen) / len(chosen)
        print(f"{stage:15s} {len(chosen):3d} mistakes: rejected {rejected} ({100 * rejected / len(chosen):.0f} %), "
              f"cause named {named} ({100 * named / len(chosen):.0f} %), mean points lost {lost:.1f}")


def alternatives(stages: list[str]) -> None:
    for stage in stages:
        module = importlib.import_module(f"quality.mistakes.{STAGES[stage]}")
        for alternative in module.ALTERNATIVES:
            path = _solution(stage)
            outcomes = run_grade_cells(alternative.apply(nbformat.read(path, as_version=4)), path.parent)
            failed = {g: o.message.splitlines()[0][:200] for g, o in outcomes.items() if not o.passed}
            print(f"{stage[:2]} {'ok    ' if not failed else 'FAILS '} {alternative.description}  {failed or ''}")


class _Clock:
    """Inserted cells call `mark(label)` before every code cell; the differences are the cells' times."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []

    def mark(self, label: str) -> None:
        self.marks.append((label, time.perf_counter()))


CLOCK = _Clock()


def timing(stages: list[str]) -> None:
    for stage in stages:
        path = _solution(stage)
        notebook = nbformat.read(path, as_version=4)
        timed = []
        for cell in notebook.cells:
            if cell.cell_type == "code":
                grade = cell.metadata.get("nbgrader", {})
                label = grade["grade_id"] if grade.get("grade") else ""
                timed.append(nbformat.v4.new_code_cell(f"__import__('sys').modules['__main__'].CLOCK.mark({label!r})"))
            timed.append(cell)
        timed.append(nbformat.v4.new_code_cell("__import__('sys').modules['__main__'].CLOCK.mark('end')"))
        notebook.cells = timed
        CLOCK.marks.clear()
        run_grade_cells(notebook, path.parent)
        marks = CLOCK.marks
        spans = [(label, after - before) for (label, before), (_, after) in zip(marks, marks[1:], strict=False)]
        graded = [(label, seconds) for label, seconds in spans if label]
        other = sum(seconds for label, seconds in spans if not label)
        print(f"{stage}: grade cells {sum(s for _, s in graded):.1f} s, other cells {other:.1f} s")
        for label, seconds in sorted(graded, key=lambda item: -item[1])[:6]:
            print(f"    {label:36s} {seconds:.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", nargs="*", default=list(STAGES), choices=list(STAGES))
    parser.add_argument("--verbose", action="store_true", help="print the failing cells' messages")
    parser.add_argument("--alternatives", action="store_true", help="run the correct alternatives instead")
    parser.add_argument("--timing", action="store_true", help="time the solution notebooks' grade cells")
    arguments = parser.parse_args(argv)
    if arguments.timing:
        timing(arguments.stage)
    elif arguments.alternatives:
        alternatives(arguments.stage)
    else:
        held_out(arguments.stage, arguments.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
