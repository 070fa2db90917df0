"""How much starting a program confined costs (grading/isolation.py), against starting it plainly.

    python scripts/benchmark_isolation.py [--runs 30]

For `true` and for `python -c pass` it times, over --runs runs each (median and 90th percentile, ms):
- plain: subprocess.run, no isolation;
- confined: `isolation.start` with bubblewrap and the sandbox's limits, until the program has ended,
  and, separately, `start` alone (until it returns) and `close` (cgroup removed);
- unconfined: `start` with isolate=False (limits, no bubblewrap).
It prints which mechanism holds the limits here. The overhead of confinement is confined - plain.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


if __name__ == "__main__":
    main()
