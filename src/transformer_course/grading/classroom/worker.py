"""Grade one student: real nbgrader autograde and generate_feedback, in a process of its own.

The batch grader starts one of these per student (or per part of a student's notebooks, when spare cores
share them), so a crash stays with that student, and reads the JSON it prints last. nbgrader is driven
through its Python API, so its start-up cost is paid once per student, not once per command. nbgrader's
Execute step is the course's `JudgedExecute` (`transformer_course.grading.sandbox.executor`). The student's
notebooks are graded in two phases (`Phases`): the visible cells of all of them, then all their hidden parts,
in one sandboxed zygote (`transformer_course.grading.sandbox.isolation` confines it, `.runner` serves it), so
that nothing a hidden part does can reach an output the student is shown. With --sandbox-per-notebook each
notebook is graded from start to end in a sandbox of its own instead (the design of 2026-11-25 evening).

    python -m transformer_course.grading.classroom.worker --course ROOT --class-dir DIR --student NAME \
        --assignment 01_positional_encoding --assignment 02_attention [--db-url URL] [--no-sandbox]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import nbformat
from nbgrader.converters import Autograde
from traitlets.config import Config

from transformer_course.grading.classroom import NOTEBOOK_TIMEOUT, SANDBOX_PROBLEM
from transformer_course.grading.gradebook import retries
from transformer_course.grading.gradebook.config import nbgrader_config
from transformer_course.grading.outputs import inert
from transformer_course.grading.sandbox import executor, hidden_inputs, isolation, profiling
from transformer_course.grading.sandbox.executor import Session


def course_config(course: Path, class_dir: Path, db_url: str, timeout: int,
                  notebook_timeout: int = NOTEBOOK_TIMEOUT) -> Config:
    """The course's nbgrader configuration for this class, with the course's Execute and its time limits (a cell's,
    and a notebook's in all)."""
    config = inert.configure(nbgrader_config(course, class_dir, db_url))  # feedback pages: student text inert
    config.JudgedExecute.timeout = timeout
    config.JudgedExecute.notebook_timeout = notebook_timeout
    pipeline = config.Autograde.get("autograde_preprocessors") or Autograde.class_traits()[
        "autograde_preprocessors"].default()
    # the gradebook's writes after the cells ran are tried again in place (`retries`), not the notebook
    config.Autograde.autograde_preprocessors = retries.pipeline(executor.autograde_pipeline(list(pipeline)))
    return config


def session_factory(course: Path, notebooks: list[nbformat.NotebookNode], memory_gb: float, isolate: bool,
                    data_folder: str | None, warm_up: bool = True) -> Callable[[nbformat.NotebookNode], Session]:
    """Sessions for this student: a sandbox for each notebook, preloading what it imports (`notebooks`: kept
    for the callers; every notebook brings its own list)."""
    threads = max(1, int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    limits = isolation.Limits(memory_bytes=int(memory_gb * 2**30), cpus=float(threads))  # its share of the cores
    launcher = executor.sandboxed_launcher(limits=limits, isolate=isolate, course_root=course)
    environment = executor.grading_environment(threads, data_folder)
    return lambda notebook: Session(executor.preload_modules([notebook]),
                                    environment=environment, launcher=launcher, warm_up=warm_up).start()


def runner_start_problem(course: Path, memory_gb: float, isolate: bool, data_folder: str | None) -> str | None:
    """None when a runner starts under this class's sandbox and imports the checks, else why not.

    Run once before a batch: a sandbox that hides the Python environment (or a memory limit too low
    for torch) would otherwise fail every student, one by one. The runner skips its warm-up here
    (the course's reference modules, PyTorch's first optimiser step): measured, 1.5 s instead of 3.3 s."""
    factory = session_factory(course, [], memory_gb, isolate, data_folder, warm_up=False)
    try:
        with factory(nbformat.v4.new_notebook()) as session:
            session.notebook("transformer_course.checks.framework", [], "preflight")
            outputs = session.run_cell("import torch, transformer_course.checks.framework", 300)
            errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o.get("output_type") == "error"]
            session.end_notebook()
            return errors[0] if errors else None
    except (executor.RunnerDied, executor.ChannelBroken, TimeoutError, OSError, isolation.SandboxError) as error:
        return f"{type(error).__name__}: {error}"


class Phases:
    """A student's notebooks graded in two phases: first the visible cells of every one of them, then their hidden
    parts, so that nothing a hidden part does (files, processes, counters, the time it takes) can reach an
    output the student is shown. Each notebook keeps a sandbox of its own meanwhile (`executor.use_gate`).

    nbgrader grades a notebook from start to end in one call, so each call runs in a thread of its own, which
    the executor holds at `pause()` between the phases; only one thread runs at a time: `visible` starts a
    notebook and returns at its pause, `finish` lets it go on to the end."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.threads: dict[str, tuple[threading.Thread, threading.Event, threading.Event]] = {}
        self.results: dict[str, dict] = {}

    def pause(self) -> None:
        """Called by the executor in a notebook's thread, between its visible cells and its hidden parts."""
        paused, go = self.local.events
        _segment_end(self.local)
        paused.set()
        go.wait()
        self.local.started = (time.perf_counter(), time.process_time())
        # nbgrader's utils.setenv removes this variable when a notebook's execution ends, without looking
        # whether it is still there: with notebooks taking turns, it is set again for the one now going on
        os.environ["NBGRADER_EXECUTION"] = "autograde"

    def visible(self, assignment: str, autograde: Callable[[], dict], attempts: int = 3) -> None:
        """Start grading `assignment` and return when its visible cells have run (or its grading has ended). A
        grading the gradebook refused before any cell ran (another worker was writing) is tried again at once,
        up to `attempts` times; one refused later is left to the caller (its cells must not run again here)."""
        paused, go = threading.Event(), threading.Event()

        def work() -> None:
            self.local.events, self.local.assignment = (paused, go), assignment
            self.local.started = (time.perf_counter(), time.process_time())
            try:
                for attempt in range(attempts):
                    self.results[assignment] = result = autograde()
                    if result["success"] or go.is_set() or not _database_trouble(result):
                        break
                    time.sleep(1 + attempt)
            except BaseException as error:  # noqa: BLE001  (reported as the notebook's failure)
                self.results[assignment] = {"success": False, "error": f"{type(error).__name__}: {error}"}
            finally:
                _segment_end(self.local)
                paused.set()

        thread = threading.Thread(target=work, name=f"grade {assignment}", daemon=True)
        self.threads[assignment] = (thread, paused, go)
        thread.start()
        paused.wait()

    def finish(self, assignment: str) -> dict:
        """Let `assignment`'s hidden parts and the rest of its grading run; nbgrader's result."""
        thread, _paused, go = self.threads.pop(assignment)
        go.set()
        thread.join()
        return self.results.pop(assignment)


def _segment_end(local: threading.local) -> None:
    wall, cpu = local.started
    profiling.add("nbgrader autograde", time.perf_counter() - wall, time.process_time() - cpu)


def grade(arguments: argparse.Namespace) -> dict[str, object]:
    profiling.add("worker start (Python, imports)", _seconds_since_start(), time.process_time())
    course, class_dir = arguments.course.resolve(), arguments.class_dir.resolve()
    db_url = arguments.db_url or f"sqlite:///{class_dir / 'gradebook.db'}"
    config = course_config(course, class_dir, db_url, arguments.timeout, arguments.notebook_timeout)
    released = [nbformat.read(class_dir / "release" / a / f"{a}.ipynb", as_version=4) for a in arguments.assignment
                if (class_dir / "release" / a / f"{a}.ipynb").exists()]
    from transformer_course.data.multi30k import ENVIRONMENT_VARIABLE as MULTI30K_DIR

    phased = not arguments.sandbox_per_notebook
    if arguments.secret_file is not None:
        executor.use_secret(hidden_inputs.read_secret(arguments.secret_file))

    # a sandbox per notebook, in the phases too: nothing of one notebook's sandbox is another's
    executor.use_session_factory(session_factory(course, released, arguments.memory_gb, not arguments.no_sandbox,
                                                 os.environ.get(MULTI30K_DIR)))
    os.environ.setdefault("MPLBACKEND", "Agg")
    if phased and released:  # the sandbox first: where none starts, the batch stops instead of failing everyone
        try:
            executor.open_session(released[0])
        except (executor.RunnerDied, executor.ChannelBroken, TimeoutError, OSError, isolation.SandboxError) as error:
            executor.close_session()
            return {SANDBOX_PROBLEM: f"{type(error).__name__}: {error}"}

    with profiling.phase("nbgrader start-up"):
        from nbgrader.apps import NbGraderAPI  # imported late: it is slow and reads the environment

        api = NbGraderAPI(config=config)
    if profiling.enabled():
        _profile_gradebook()
    results: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    try:
        if phased:
            phases = Phases()
            executor.use_gate(phases)
            for assignment in arguments.assignment:  # one nbgrader API each: its calls change its course folder
                started = time.perf_counter()
                own = NbGraderAPI(config=config)
                phases.visible(assignment, lambda own=own, assignment=assignment: own.autograde(
                    assignment, arguments.student, force=True, create=True))
                seconds[assignment] = time.perf_counter() - started
            if arguments.wait_between_phases:
                sys.stdout.write("visible-done\n")
                sys.stdout.flush()
                sys.stdin.readline()  # the batch answers when the student's other workers are there too
            for assignment in reversed(arguments.assignment):  # last in, first out: nbgrader's setenv nests so
                started = time.perf_counter()
                results[assignment] = phases.finish(assignment)
                seconds[assignment] += time.perf_counter() - started
            executor.use_gate(None)
            executor.close_session()
        for assignment in arguments.assignment:
            result = results.get(assignment)
            if result is None or (not result["success"] and _database_trouble(result)):
                # graded (again) from start to end: the gradebook refused a write before the cells ran, or kept
                # refusing the grades' writes after them (each tried again in place first, `retries`); like
                # any regrade, this runs the notebook's visible cells again after its hidden parts ran
                started = time.perf_counter()
                with profiling.phase("nbgrader autograde"):
                    result = _autograde(api, assignment, arguments.student)
                seconds[assignment] = seconds.get(assignment, 0.0) + time.perf_counter() - started
                results[assignment] = result
        report: dict[str, object] = {}
        for assignment in arguments.assignment:
            started = time.perf_counter()
            result = results[assignment]
            if result["success"]:
                with profiling.phase("feedback HTML"):
                    result = api.generate_feedback(assignment, arguments.student, force=True)
            report[assignment] = {"success": bool(result["success"]),
                                  "error": "" if result["success"] else _last_lines(result),
                                  "seconds": round(seconds.get(assignment, 0.0) + time.perf_counter() - started, 1),
                                  "findings": _findings(class_dir, arguments.student, assignment),
                                  "faults": _findings(class_dir, arguments.student, assignment, "faults")}
    finally:
        executor.use_gate(None)
        executor.close_session()
        profiling.dump(arguments.student)
    return report


def _database_trouble(result: dict) -> bool:
    return retries.is_trouble(f"{result.get('error') or ''} {result.get('log') or ''}")


def _autograde(api: object, assignment: str, student: str, attempts: int = 3) -> dict:
    """nbgrader's autograde, tried again when the shared gradebook refused a write (another machine
    wrote the same rows at the same moment, a deadlock PostgreSQL broke, sqlite busy)."""
    for attempt in range(attempts):
        result = api.autograde(assignment, student, force=True, create=True)  # type: ignore[attr-defined]
        if result["success"] or not _database_trouble(result) or attempt == attempts - 1:
            return result
        time.sleep(1 + attempt)
    return result


def _seconds_since_start() -> float:
    """Wall seconds since this process started (Linux), 0 where that cannot be read."""
    try:
        started = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _profile_gradebook() -> None:
    """Count the time spent opening nbgrader's gradebook (every step of nbgrader opens it anew)."""
    from nbgrader import api

    opening = api.Gradebook.__init__

    def timed(self, *arguments, **keywords):  # noqa: ANN001, ANN002, ANN003
        with profiling.phase("database (opening the gradebook)"):
            opening(self, *arguments, **keywords)

    api.Gradebook.__init__ = timed


def _findings(class_dir: Path, student: str, assignment: str, key: str = "findings") -> list[str]:
    """What the grader flagged for review while running this notebook (see executor.FINDINGS_KEY), or with
    key="faults" the cells that did not finish and why."""
    path = class_dir / "autograded" / student / assignment / f"{assignment}.ipynb"
    try:
        notebook = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return []
    found = notebook.metadata.get(executor.FINDINGS_KEY, {}).get(key, [])
    return [str(finding) for finding in found] if isinstance(found, list) else []


def _last_lines(result: dict[str, str]) -> str:
    text = "\n".join(part for part in (result.get("error"), result.get("log")) if part)
    return "\n".join(text.strip().splitlines()[-8:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--course", type=Path, required=True)
    parser.add_argument("--class-dir", type=Path, required=True)
    parser.add_argument("--student", required=True)
    parser.add_argument("--assignment", action="append", required=True)
    parser.add_argument("--db-url")
    parser.add_argument("--timeout", type=int, default=120, help="seconds a cell may run")
    parser.add_argument("--notebook-timeout", type=int, default=NOTEBOOK_TIMEOUT,
                        help="seconds a notebook may run in all: its cells, replays and hidden parts")
    parser.add_argument("--memory-gb", type=float, default=6.0,
                        help="memory each notebook's sandbox may use, all its processes together (GB)")
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--secret-file", type=Path,
                        help="the class's secret: the hidden tests' inputs are drawn from it (without: as written)")
    parser.add_argument("--sandbox-per-notebook", action="store_true",
                        help="grade each notebook from start to end in a sandbox of its own (the design of "
                             "2026-11-25 evening), instead of every visible cell first, then the hidden parts, in "
                             "one sandbox")
    parser.add_argument("--wait-between-phases", action="store_true",
                        help="print 'visible-done' when every notebook's visible cells have run and read a line "
                             "before their hidden parts (the batch's barrier across a student's workers)")
    parser.add_argument("--wait-for-go", action="store_true",
                        help="read one line first: 'go' grades, anything else ends here (the batch's start-up test "
                             "runs while this process imports)")
    arguments = parser.parse_args(argv)
    if arguments.wait_for_go and sys.stdin.readline().strip() != "go":
        return 3
    report = grade(arguments)
    sys.stdout.write("\n" + json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
