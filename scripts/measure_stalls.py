"""How long a stalling notebook holds its grader: the fourth hostile class's stalls, each graded alone.

    python scripts/measure_stalls.py [--student stan tim] [--timeout 30] [--notebook-timeout 180]

`quality/hostile_fourth`'s stan (three cells sleeping 3 s; every hidden part kills every process of its sandbox)
and tim (the same sleeps; every hidden part sleeps past its cell's time), each graded by the grader's Execute step
(`JudgedExecute`) in a sandbox of its own, as the batch's worker grades a notebook (2 GB, the class's limits of
`hostile_fourth.LIMITS` unless given). Prints, for each, the seconds from its runner's start to the end of its
hidden parts, each hidden part's outcome and the notebook's faults. Run it on an earlier commit for "before" (that
commit's JudgedExecute has no deadline over its hidden parts: --notebook-timeout is passed only where it does).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quality import hostile_fourth  # noqa: E402
from quality.honest import with_hidden_tests  # noqa: E402
from quality.inprocess import run_notebook  # noqa: E402
from transformer_course.grading.sandbox import isolation  # noqa: E402
from transformer_course.grading.sandbox.executor import FINDINGS_KEY, JudgedExecute, preload_modules  # noqa: E402
from transformer_course.grading.sandbox.session import Session, grading_environment, sandboxed_launcher  # noqa: E402


def measure(student: str, timeout: int, notebook_timeout: int) -> None:
    build = {"stan": hostile_fourth.stan_stage_2, "tim": hostile_fourth.tim_stage_2}[student]
    solution = nbformat.read(ROOT / "solutions" / hostile_fourth.ATTENTION / f"{hostile_fourth.ATTENTION}.ipynb",
                             as_version=4)
    notebook = with_hidden_tests(build(), solution)
    options = {"notebook_timeout": notebook_timeout} if "deadline" in JudgedExecute.notebook_timeout.help else {}
    limits = isolation.Limits(memory_bytes=int(hostile_fourth.LIMITS["memory_gb"] * 2**30))
    environment = {**grading_environment(1), "NBGRADER_EXECUTION": "autograde"}
    with Session(preload_modules([notebook]), environment=environment,
                 launcher=sandboxed_launcher(limits=limits)) as session:
        began = time.monotonic()
        graded = run_notebook(notebook, Path("work/stall"), timeout=timeout, session=session, **options)
        seconds = time.monotonic() - began
    print(f"{student}: {seconds:.1f} s (cell limit {timeout} s"
          + (f", notebook deadline {notebook_timeout} s)" if options else ", no deadline over the hidden parts)"))
    for cell in graded.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in hostile_fourth.HIDDEN_CELLS:
            error = next((o for o in cell.outputs if o.get("output_type") == "error"), None)
            print(f"  {grade_id}: {'passed' if error is None else error['ename'] + ': ' + error['evalue'][:70]}")
    for fault in graded.metadata.get(FINDINGS_KEY, {}).get("faults", []):
        print(f"  fault: {fault}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--student", nargs="+", default=["stan", "tim"], choices=["stan", "tim"])
    parser.add_argument("--timeout", type=int, default=hostile_fourth.LIMITS["timeout"])
    parser.add_argument("--notebook-timeout", type=int, default=hostile_fourth.LIMITS["notebook_timeout"])
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if isolation.bubblewrap_problem() is not None:
        raise SystemExit(f"no sandbox here: {isolation.bubblewrap_problem()}")
    for student in arguments.student:
        measure(student, arguments.timeout, arguments.notebook_timeout)


if __name__ == "__main__":
    main()
