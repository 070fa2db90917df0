"""Grade every stage's reference solution with hidden inputs drawn from many secrets: each hidden check must
still pass on the reference (the drawing rules of `grading.sandbox.hidden_inputs` keep every hidden test
valid), and the drawn sizes must differ from the published ones.

    python scripts/check_hidden_draws.py [--secrets 10] [--only 02_attention ...]

Prints, per stage, the number of secrets tried, the hidden calls whose sizes changed, and every failure."""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import graded_part  # noqa: E402
from quality.inprocess import run_grade_cells  # noqa: E402
from transformer_course.authoring import assignments  # noqa: E402
from transformer_course.grading.sandbox import executor, hidden_inputs  # noqa: E402


def test_secret(number: int) -> bytes:
    """A fixed secret per number, so a failure can be replayed."""
    return hashlib.sha256(f"check_hidden_draws {number}".encode()).digest()


def changed_calls(notebook: nbformat.NotebookNode, secret: bytes, checks: str) -> tuple[int, int, int]:
    """(hidden calls, how many of them the secret gives other sizes, seeds or floats than the published ones (the
    check's own defaults included), how many of them other sizes)."""
    total = changed = sized = 0
    key = hidden_inputs.submission_key(secret, "", notebook)  # as the grader draws them (no student named)
    for grade_id, line, call in hidden_inputs.hidden_calls(notebook, executor.parse_grade_cell):
        drawn, _ = hidden_inputs.draw(call, key, f"{checks}:{grade_id}:{line}", checks)
        published = {**hidden_inputs.check_defaults(checks, call.name), **dict(call.kwargs)}
        moved = {name for name, value in drawn.kwargs if published.get(name) != value}
        total += 1
        changed += bool(moved)
        sized += bool(moved & set(hidden_inputs.SIZES))
    return total, changed, sized


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--secrets", type=int, default=10)
    parser.add_argument("--first", type=int, default=0, help="number of the first secret")
    parser.add_argument("--only", nargs="*")
    arguments = parser.parse_args(argv)
    failures = 0
    for assignment in arguments.only or assignments(ROOT):
        path = ROOT / "solutions" / assignment / f"{assignment}.ipynb"
        notebook = graded_part(nbformat.read(path, as_version=4))
        checks = executor.checks_module(notebook)
        started, calls, changed, sized = time.perf_counter(), 0, 0, 0
        for number in range(arguments.first, arguments.first + arguments.secrets):
            secret = test_secret(number)
            total, moved, resized = changed_calls(notebook, secret, checks)
            calls, changed, sized = calls + total, changed + moved, sized + resized
            executor.use_secret(secret)
            try:
                with tempfile.TemporaryDirectory() as folder:
                    outcomes = run_grade_cells(notebook, Path(folder))
            finally:
                executor.use_secret(None)
            for grade_id, outcome in outcomes.items():
                if not outcome.passed:
                    failures += 1
                    print(f"FAIL {assignment} secret {number} {grade_id}: {outcome.message[:300]}", flush=True)
        print(f"{assignment}: {arguments.secrets} secrets, {changed} of {calls} hidden calls drawn with other "
              f"sizes, seeds or floats than published ({sized} with other sizes), every one with its random values "
              f"salted; {time.perf_counter() - started:.0f} s", flush=True)
    print("failures:", failures)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
