"""How much starting a program confined costs (grading/isolation.py), against starting it plainly.

    python scripts/benchmark_isolation.py [--runs 30] [--folders]

For `true` and for `python -c pass` it times, over --runs runs each (median and 90th percentile, ms):
- plain: subprocess.run, no isolation;
- confined: `isolation.start` with bubblewrap and the sandbox's limits, until the program has ended,
  and, separately, `start` alone (until it returns) and `close` (cgroup removed);
- unconfined: `start` with isolate=False (limits, no bubblewrap).
It prints which mechanism holds the limits here. The overhead of confinement is confined - plain. The same
confined start without the machine-wide counters' fixed files (`isolation.counter_files`) gives what those cost.

With --folders it also times, in a real student's sandbox (a zygote started as the batch starts it, a runner forked
for stage 1), the grader's work on the sandbox's writable folders (`grading/sandbox/scratch.py`): the inventory
before and the restore after a grade cell's checks (per grade cell), and emptying them (per hidden part).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from transformer_course.grading.sandbox import isolation
from transformer_course.grading.sandbox.isolation import Sandbox, bubblewrap_problem, course_paths, python_paths, start


def median(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:7.1f}"


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    return f"{median(ordered)} {ordered[int(0.9 * (len(ordered) - 1))] * 1000:7.1f}"


def measure(program: list[str], runs: int, sandbox: Sandbox | None) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"total": [], "start": [], "close": []}
    for _ in range(runs):
        began = time.perf_counter()
        if sandbox is None:
            subprocess.run(program, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
            times["total"].append(time.perf_counter() - began)
            continue
        confined = start(sandbox, program, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        started = time.perf_counter()
        status = confined.wait()
        ended = time.perf_counter()
        confined.close()
        closed = time.perf_counter()
        if status != 0:
            raise SystemExit(f"{program} failed in the sandbox (status {status})")
        times["total"].append(ended - began)
        times["start"].append(started - began)
        times["close"].append(closed - ended)
        mechanism = confined.mechanism
    if sandbox is not None:
        times["mechanism"] = mechanism  # type: ignore[assignment]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--folders", action="store_true", help="also time the grader's work on a sandbox's folders")
    arguments = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    readable = (*python_paths(), *course_paths(root))
    problem = bubblewrap_problem()
    print(f"bubblewrap: {problem or 'works'}")
    print(f"{'program':<18}{'how':<12}{'median':>8}{'p90':>8}   (ms)  start()  close()   limits held by")
    for name, program in (("true", ["true"]), ("python -c pass", [sys.executable, "-c", "pass"])):
        for how, sandbox in (("plain", None), ("confined", Sandbox(readable=readable)),
                             ("unconfined", Sandbox(readable=readable, isolate=False))):
            if how == "confined" and problem:
                continue
            times = measure(program, arguments.runs, sandbox)
            extra = "" if sandbox is None else \
                f"  {median(times['start'])} {median(times['close'])}   {times['mechanism']}"
            print(f"{name:<18}{how:<12}{summary(times['total'])}        {extra}")
    if not problem:
        real = isolation.counter_files
        isolation.counter_files = lambda limits: {}
        try:
            times = measure([sys.executable, "-c", "pass"], arguments.runs, Sandbox(readable=readable))
        finally:
            isolation.counter_files = real
        print(f"{'python -c pass':<18}{'confined, no fixed counters':<12}{summary(times['total'])}"
              f"          {median(times['start'])} {median(times['close'])}")
    if arguments.folders:
        folder_work(arguments.runs, problem is None)


def folder_work(runs: int, isolate: bool) -> None:
    """Median and p90 (ms) of the grader's folder work on one real sandbox, over `runs` rounds each."""
    from transformer_course.grading.sandbox.executor import grading_environment
    from transformer_course.grading.sandbox.session import Session, sandboxed_launcher

    checks = "transformer_course.checks.positional_encoding"
    with Session([checks, "IPython.core.interactiveshell", "torch"], environment=grading_environment(1),
                 launcher=sandboxed_launcher(isolate=isolate)) as session:
        session.notebook(checks, ["PositionalEncoding"], "work/benchmark")
        session.run_cell("import torch, matplotlib.pyplot as plt\nplt.plot([1, 2])", 120)  # what a notebook leaves
        times: dict[str, list[float]] = {"inventory + restore (per grade cell)": [], "emptying (per hidden part)": []}
        for _ in range(runs):
            began = time.perf_counter()
            kept = session.scratch_inventory()
            session.scratch_restore(kept)
            times["inventory + restore (per grade cell)"].append(time.perf_counter() - began)
        for _ in range(runs):
            began = time.perf_counter()
            session.empty_scratch()
            times["emptying (per hidden part)"].append(time.perf_counter() - began)
        entries = sum(len(found) for found in (kept or {}).values())
        session.end_notebook()
    print(f"the grader's work on a sandbox's folders ({entries} entries there after the zygote and one cell; "
          f"{'bubblewrap' if isolate else 'unconfined'}):")
    for name, samples in times.items():
        print(f"  {name:<40}{summary(samples)}   (ms: median, p90)")


if __name__ == "__main__":
    main()
