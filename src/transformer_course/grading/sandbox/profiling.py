"""Where a student's grading time goes, phase by phase (for scripts/benchmark_grading.py).

Off unless TRANSFORMER_COURSE_PROFILE names a file: then the worker appends one JSON line per
student to it, {"phases": {phase: [wall s, CPU s, count, CPU s of the grader's process alone]},
"first_started": {phase: the wall clock (seconds since the epoch) when the phase first began}} (the
latter orders a worker's events: tests/test_hostile_third.py reads when the hidden parts began). CPU seconds
are the grader's own (this process) plus, for phases that run in the student's sandbox, the
sandbox's processes (read from /proc: a process's own time and that of the children it has waited
for, so runners and grade cells' children are counted once they end). CPU time does not depend on
what else the machine runs; wall time does.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ENVIRONMENT_VARIABLE = "TRANSFORMER_COURSE_PROFILE"
_PHASES: dict[str, list[float]] = {}
_FIRST_STARTED: dict[str, float] = {}  # phase -> time.time() when it first began
_TICKS = os.sysconf("SC_CLK_TCK")


def enabled() -> bool:
    return bool(os.environ.get(ENVIRONMENT_VARIABLE))


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process, the children it waited for, and its live descendants."""
    from transformer_course.grading.sandbox.isolation import process_tree

    total = 0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            continue
    return total / _TICKS


@contextlib.contextmanager
def phase(name: str, sandbox_cpu: Callable[[], float] | None = None) -> Iterator[None]:
    """Add the wall and CPU time of the block to phase `name` (nothing when profiling is off)."""
    if not enabled():
        yield
        return
    _FIRST_STARTED.setdefault(name, time.time())
    wall, cpu = time.perf_counter(), time.process_time()
    inside = sandbox_cpu() if sandbox_cpu else 0.0
    try:
        yield
    finally:
        own = time.process_time() - cpu
        add(name, time.perf_counter() - wall, own + ((sandbox_cpu() - inside) if sandbox_cpu else 0.0), own)


def add(name: str, wall: float, cpu: float, own: float | None = None) -> None:
    if enabled():
        entry = _PHASES.setdefault(name, [0.0, 0.0, 0, 0.0])
        entry[0] += wall
        entry[1] += cpu
        entry[2] += 1
        entry[3] += cpu if own is None else own


def dump(student: str) -> None:
    """Append this process's phases to the profile file, and forget them."""
    if not enabled():
        return
    with open(os.environ[ENVIRONMENT_VARIABLE], "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"student": student, "phases": {
            name: [round(wall, 3), round(cpu, 3), count, round(own, 3)]
            for name, (wall, cpu, count, own) in _PHASES.items()},
            "first_started": dict(_FIRST_STARTED)}) + "\n")
    _PHASES.clear()
    _FIRST_STARTED.clear()
