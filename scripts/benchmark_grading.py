"""Benchmark grading: how long an instructor waits, and where the time goes.

    python scripts/benchmark_grading.py [--repeat 3] [--full-stages STAGE ...] [--full-class N]
                                        [--students 50] [--assignment 02_attention] [--jobs 1 2]
                                        [--skip-class] [--skip-serial] [--output figures.json]

Measures, on this machine,
1. one full submission (the reference solutions of every stage, or of --full-stages) through the batch command
   (`--jobs 1`, sandboxed when bubblewrap works here), --repeat times: wall seconds, CPU seconds
   (user + system of the batch command, its worker and the student's sandbox, from a cpuacct
   cgroup made for the run; where none can be made, getrusage of the children, which misses the
   sandbox), and the per-phase breakdown the worker records (`transformer_course.grading.sandbox.profiling`):
   worker start-up, nbgrader start-up, nbgrader's own autograde work, the database, zygote start,
   runner forks, ordinary cells, grade cells (with and without hidden tests), feedback HTML; and, unless
   --skip-plain, the same notebooks graded by nbgrader as it comes (`plain_nbgrader`: `nbgrader autograde` and
   `generate_feedback` with nbgrader's own preprocessors, every cell in a Jupyter kernel), --repeat times,
   and the ratio of the two (ours / plain);
2. with --full-class N, a class of N students who each hand in every notebook of the full submission,
   graded with --jobs equal to the number of cores: wall and CPU seconds per student, and the core-seconds
   per student (wall x cores / students), from which a larger class on more cores is extrapolated;
3. unless --skip-class, a synthetic class of --students (a third correct, a third with a known bug, a
   third blank) on one assignment, with the batch command at each --jobs value;
4. unless --skip-serial, the same class with plain serial nbgrader (`nbgrader autograde` and
   `generate_feedback` over the class with the course's config: one process, no checks, no sandbox).
Registering the assignments (generate_assignment, once per class) is excluded from all of them.
Reports medians and the load average around each run: on a machine shared with other work, wall time
is inflated by the others; CPU time much less so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from transformer_course.authoring import assignments, repository_root
from transformer_course.grading.classroom.batch import BatchGrader
from transformer_course.grading.gradebook.class_folder import Classroom
from transformer_course.grading.sandbox.isolation import bubblewrap_problem
from transformer_course.grading.sandbox.profiling import ENVIRONMENT_VARIABLE as PROFILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # quality/ lives at the repository root
from quality.examples import student_submissions  # noqa: E402

ORDER = ["worker start (Python, imports)", "nbgrader start-up", "nbgrader autograde (its own work)",
         "database (opening the gradebook)", "zygote start (sandbox, imports)", "runner fork", "runner park",
         "ordinary cells", "grade cells", "grade cells with hidden tests", "hidden tests", "runner end",
         "feedback HTML"]
BATCH_OPTIONS: list[str] = []  # --sandbox-per-notebook: the design of 2026-11-25 evening, for comparison
SANDBOX_PHASES = ("zygote start (sandbox, imports)", "runner fork", "runner park", "ordinary cells", "grade cells",
                  "grade cells with hidden tests", "hidden tests", "runner end")


# --- CPU time of a command and everything it starts ------------------------------------------------


class CpuCgroup:
    """A cgroup that counts the CPU time of a process tree (cgroup v1 cpuacct, or v2's cpu.stat)."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        name = f"grading-benchmark-{os.getpid()}-{time.monotonic_ns()}"
        for parent, kind in ((Path("/sys/fs/cgroup/cpuacct"), 1), (Path("/sys/fs/cgroup"), 2)):
            if (parent / "cgroup.procs").exists() and os.access(parent, os.W_OK):
                if kind == 2 and not (parent / "cgroup.controllers").exists():
                    continue
                try:
                    (parent / name).mkdir()
                except OSError:
                    continue
                self.folder, self.kind = parent / name, kind
                return

    def enter(self) -> None:
        """Called in the child before exec (preexec_fn): it and all it starts are counted."""
        if self.folder is not None:
            (self.folder / "cgroup.procs").write_text(str(os.getpid()))

    def seconds(self) -> tuple[float, float] | None:
        """(user, system) CPU seconds so far."""
        if self.folder is None:
            return None
        if self.kind == 1:
            ticks = dict(line.split() for line in (self.folder / "cpuacct.stat").read_text().splitlines())
            hertz = os.sysconf("SC_CLK_TCK")
            return int(ticks["user"]) / hertz, int(ticks["system"]) / hertz
        stat = dict(line.split() for line in (self.folder / "cpu.stat").read_text().splitlines())
        return int(stat["user_usec"]) / 1e6, int(stat["system_usec"]) / 1e6

    def remove(self) -> None:
        if self.folder is not None:
            for _ in range(100):
                try:
                    self.folder.rmdir()
                    return
                except OSError:
                    time.sleep(0.05)


def timed_command(command: list[str], environment: dict[str, str], cwd: Path | None = None) -> dict:
    cgroup = CpuCgroup()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        process = subprocess.run(command, env=environment, capture_output=True, text=True, cwd=cwd,
                                 preexec_fn=cgroup.enter if cgroup.folder is not None else None)
        wall = time.perf_counter() - start
        counted = cgroup.seconds()
    finally:
        cgroup.remove()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed:\n{process.stdout[-2000:]}\n{process.stderr[-2000:]}")
    user, system = counted or (after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 1), "cpu_s": round(user + system, 1), "user_s": round(user, 1),
            "system_s": round(system, 1), "cpu_counted_by": "cgroup" if counted else "getrusage (without the sandbox)",
            "load_before": round(load, 1), "load_after": round(os.getloadavg()[0], 1)}


# --- one full submission ----------------------------------------------------------------------------


def one_full_submission(root: Path, work: Path, repeat: int, stages: list[str] | None = None) -> dict:
    """`stages`: the notebooks of the submission (default: every stage of the course)."""
    folder, class_dir = work / "one", work / "class-one"
    hand_in(folder / "ada", student_submissions(root, stages or assignments(root))["ada"])
    grader = BatchGrader(root, class_dir, folder, jobs=1, sandbox=bubblewrap_problem() is None)
    started = time.perf_counter()
    grader.prepare()
    prepare_s = time.perf_counter() - started
    runs = []
    for number in range(repeat):
        for leftover in ("records", "autograded", "feedback"):
            shutil.rmtree(class_dir / leftover, ignore_errors=True)
        profile = work / f"profile-{number}.jsonl"
        environment = {**os.environ, PROFILE: str(profile)}
        command = [sys.executable, "-m", "transformer_course.grading.batch", str(folder), "--class-dir",
                   str(class_dir), "--jobs", "1", *([] if grader.sandbox else ["--no-sandbox"]), *BATCH_OPTIONS]
        run = timed_command(command, environment)
        parts = [derived(json.loads(line)["phases"]) for line in profile.read_text().splitlines()]
        run["phases"] = {name: [sum(part[name][i] for part in parts if name in part) for i in range(3)]
                         for name in ORDER if any(name in part for part in parts)}
        # the spare core grades part of the student's notebooks in a second worker (batch.BatchGrader.split):
        # CPU seconds of each worker and its sandbox, from the phases (which do not overlap)
        run["cpu_per_worker_s"] = [round(sum(part[name][1] for name in ORDER if name in part), 1) for part in parts]
        # wall seconds of each notebook in its worker (nbgrader autograde + feedback): batch.BatchGrader.cost
        run["notebook_seconds"] = json.loads((class_dir / "records" / "ada.json").read_text())["notebook_seconds"]
        runs.append(run)
        print(f"  run {number + 1}: {run['wall_s']} s wall, {run['cpu_s']} s CPU (per worker and its sandbox: "
              f"{run['cpu_per_worker_s']}), load {run['load_before']}; per notebook: {run['notebook_seconds']}",
              flush=True)
    return {"prepare_s": round(prepare_s, 1), "runs": runs, **summarise(runs)}


def summarise(runs: list[dict]) -> dict:
    """Medians over the runs, and the per-phase breakdown (medians of each phase's wall and CPU)."""
    phases: dict[str, dict[str, float]] = {}
    for name in ORDER:
        rows = [run["phases"].get(name) for run in runs]
        rows = [row for row in rows if row]
        if rows:
            phases[name] = {"wall_s": round(statistics.median(row[0] for row in rows), 2),
                            "cpu_s": round(statistics.median(row[1] for row in rows), 2), "count": rows[0][2]}
    return {"median_wall_s": statistics.median(run["wall_s"] for run in runs),
            "median_cpu_of_busiest_worker_s": statistics.median(max(run["cpu_per_worker_s"]) for run in runs),
            "median_cpu_s": statistics.median(run["cpu_s"] for run in runs),
            "median_load": statistics.median(run["load_before"] for run in runs), "phases": phases}


def derived(phases: dict[str, list[float]]) -> dict[str, list[float]]:
    """nbgrader's own autograde work = its autograde phase less what ran inside it (the executor's
    phases and opening the gradebook), in wall time and in the grader process's CPU time."""
    result = {name: [wall, cpu, count] for name, (wall, cpu, count, _own) in phases.items()}
    if "nbgrader autograde" in phases:
        wall, _cpu, count, own = phases["nbgrader autograde"]
        inner = [phases[name] for name in (*SANDBOX_PHASES[1:], "database (opening the gradebook)") if name in phases]
        result["nbgrader autograde (its own work)"] = [wall - sum(p[0] for p in inner),
                                                       own - sum(p[3] for p in inner), count]
    return result


# --- the same submission through plain nbgrader ----------------------------------------------------

PLAIN_CONFIG = """# nbgrader as it comes: its own Execute (a Jupyter kernel runs every cell, grade cells and
# their hidden tests included), its own feedback; only the folders, the timeout and the warnings pattern are ours.
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "plain-nbgrader"
c.CourseDirectory.root = {root!r}
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = {folder!r} + "/release"
c.CourseDirectory.submitted_directory = {folder!r} + "/submitted"
c.CourseDirectory.autograded_directory = {folder!r} + "/autograded"
c.CourseDirectory.feedback_directory = {folder!r} + "/feedback"
c.CourseDirectory.db_url = "sqlite:///" + {folder!r} + "/gradebook.db"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py"]
c.ExecutePreprocessor.timeout = 120
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"\\w*Warning\\b"
"""


def plain_nbgrader(root: Path, work: Path, repeat: int, stages: list[str]) -> dict:
    """The same student's notebooks graded by nbgrader as it comes (`nbgrader autograde` then
    `nbgrader generate_feedback`, one process each, with nbgrader's default preprocessors): every cell runs in
    an ipykernel, the grade cells' checks (visible and hidden, with the literals written in the source) in the
    student's own kernel, no sandbox, no grader-side verdicts, no hidden inputs drawn, no class report. The
    kernel gets what the course's runner gets (NBGRADER_EXECUTION=autograde, which nbgrader's Execute sets,
    one thread, Multi30k and its tokens from the same places). Registering the assignments
    (generate_assignment) is excluded, as for the batch command."""
    folder = work / "plain"
    folder.mkdir()
    (folder / "nbgrader_config.py").write_text(PLAIN_CONFIG.format(root=str(root), folder=str(folder)))
    environment = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   "MPLBACKEND": "Agg"}
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{folder / 'gradebook.db'}") as gradebook:
        for assignment in stages:
            gradebook.update_or_create_assignment(assignment)
    nbgrader = [sys.executable, "-m", "nbgrader"]
    pattern = stages[0] if len(stages) == 1 else "*"
    registered = subprocess.run([*nbgrader, "generate_assignment", pattern, "--force"], cwd=folder, env=environment,
                                capture_output=True, text=True)
    if registered.returncode != 0:
        raise SystemExit(f"plain nbgrader generate_assignment failed:\n{registered.stdout[-2000:]}\n"
                         f"{registered.stderr[-2000:]}")
    for assignment, notebook in student_submissions(root, stages)["ada"].items():
        path = folder / "submitted" / "ada" / assignment / f"{assignment}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, path)
    script = " && ".join(f"{' '.join(nbgrader)} {step} '{pattern}' --student=ada --force"
                         for step in ("autograde", "generate_feedback"))
    runs = []
    for number in range(repeat):
        for leftover in ("autograded", "feedback"):
            shutil.rmtree(folder / leftover, ignore_errors=True)
        run = timed_command(["sh", "-c", script], environment, cwd=folder)
        runs.append(run)
        print(f"  plain nbgrader run {number + 1}: {run['wall_s']} s wall, {run['cpu_s']} s CPU, load "
              f"{run['load_before']}", flush=True)
    scores = subprocess.run([sys.executable, "-c", PLAIN_SCORES, str(folder / "gradebook.db")], capture_output=True,
                            text=True, env=environment)
    return {"runs": runs, "median_wall_s": statistics.median(run["wall_s"] for run in runs),
            "median_cpu_s": statistics.median(run["cpu_s"] for run in runs),
            "median_load": statistics.median(run["load_before"] for run in runs),
            "scores": scores.stdout.strip() or scores.stderr.strip()[-500:]}


# what plain nbgrader gave ada, notebook by notebook (it should be full marks: the reference solutions)
PLAIN_SCORES = """import sys
from nbgrader.api import Gradebook
with Gradebook("sqlite:///" + sys.argv[1]) as gradebook:
    for submission in gradebook.student_submissions("ada"):
        print(f"{submission.assignment.name}: {submission.score:g}/{submission.max_score:g}", end="; ")
"""


# --- a class ----------------------------------------------------------------------------------------


def hand_in(student_folder: Path, notebooks: dict[str, nbformat.NotebookNode]) -> None:
    """Write one student's notebooks ({assignment: notebook}) into their submission folder."""
    student_folder.mkdir(parents=True, exist_ok=True)
    for assignment, notebook in notebooks.items():
        nbformat.write(notebook, student_folder / f"{assignment}.ipynb")


def synthetic_class(root: Path, folder: Path, assignment: str, count: int) -> None:
    kinds = student_submissions(root, [assignment])  # ada: correct, chen: one bug, blake: blank
    order = ["ada", "chen", "blake"]
    for number in range(count):
        hand_in(folder / f"student{number:03d}", {assignment: kinds[order[number % 3]][assignment]})


def full_class(root: Path, folder: Path, stages: list[str], count: int) -> None:
    """`count` students, each handing in every notebook of `stages` (the reference solutions)."""
    notebooks = student_submissions(root, stages)["ada"]
    for number in range(count):
        hand_in(folder / f"student{number:03d}", notebooks)


def batch_seconds(root: Path, work: Path, submissions: Path, assignment_ids: list[str], jobs: int) -> dict:
    class_dir = work / f"class-jobs{jobs}-{len(assignment_ids)}"
    grader = BatchGrader(root, class_dir, submissions, jobs=jobs, assignment_ids=assignment_ids,
                         sandbox=bubblewrap_problem() is None)
    grader.prepare()
    command = [sys.executable, "-m", "transformer_course.grading.batch", str(submissions), "--class-dir",
               str(class_dir), "--jobs", str(jobs), *(f"--assignment={a}" for a in assignment_ids),
               *([] if grader.sandbox else ["--no-sandbox"]), *BATCH_OPTIONS]
    run = timed_command(command, dict(os.environ))
    count = len(list(submissions.iterdir()))
    return {**run, "students": count, "wall_per_student_s": round(run["wall_s"] / count, 2),
            "cpu_per_student_s": round(run["cpu_s"] / count, 2)}


def serial_nbgrader_seconds(root: Path, work: Path, submissions: Path, assignment: str) -> dict:
    classroom = Classroom(root, work / "class-serial")
    classroom.prepare([assignment])
    for folder in sorted(submissions.iterdir()):
        notebook = nbformat.read(folder / f"{assignment}.ipynb", as_version=4)
        classroom.submit(folder.name, assignment, notebook)
    start = time.perf_counter()
    classroom.autograde(assignment)
    classroom.feedback(assignment)
    return {"wall_s": round(time.perf_counter() - start, 1)}


def table(figures: dict) -> str:
    one = figures.get("one_full_submission")
    lines = []
    if one:
        lines += [f"one full submission, median of {len(one['runs'])}: {one['median_wall_s']} s wall, "
                  f"{one['median_cpu_s']} s CPU, of which {one['median_cpu_of_busiest_worker_s']} s in the busiest "
                  f"worker and its sandbox (load average {one['median_load']})", "",
                  f"{'phase':42s} {'count':>5s} {'wall s':>8s} {'CPU s':>8s}"]
        for name, row in one["phases"].items():
            lines.append(f"{name:42s} {row['count']:5d} {row['wall_s']:8.2f} {row['cpu_s']:8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs of the one full submission")
    parser.add_argument("--students", type=int, default=50)
    parser.add_argument("--assignment", default="02_attention")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--skip-full", action="store_true", help="skip the one-full-submission measurement")
    parser.add_argument("--full-stages", nargs="+", default=None,
                        help="the notebooks of the full submission (default: all, optional stages 0 and 7 included)")
    parser.add_argument("--skip-class", action="store_true", help="skip the synthetic class")
    parser.add_argument("--full-class", type=int, default=0, metavar="N",
                        help="also grade a class of N full submissions (the --full-stages notebooks) with --jobs "
                             "equal to the number of cores: the per-core throughput a large class gets")
    parser.add_argument("--skip-serial", action="store_true", help="skip plain serial nbgrader")
    parser.add_argument("--skip-plain", action="store_true",
                        help="skip grading the one full submission with plain nbgrader beside it")
    parser.add_argument("--sandbox-per-notebook", action="store_true",
                        help="grade with the batch command's --sandbox-per-notebook (the design of 2026-11-25 evening)")
    parser.add_argument("--output", type=Path)
    arguments = parser.parse_args(argv)
    BATCH_OPTIONS[:] = ["--sandbox-per-notebook"] if arguments.sandbox_per_notebook else []
    root = repository_root()
    work = Path(tempfile.mkdtemp(prefix="grading-benchmark-"))
    figures: dict[str, object] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "sandbox": bubblewrap_problem() or "bubblewrap",
    }
    try:
        if not arguments.skip_full:
            print("one full submission:", flush=True)
            figures["one_full_submission"] = one_full_submission(root, work, arguments.repeat, arguments.full_stages)
            print(table(figures), flush=True)
            if not arguments.skip_plain:
                print("the same submission, plain nbgrader:", flush=True)
                stages = arguments.full_stages or assignments(root)
                plain = plain_nbgrader(root, work, arguments.repeat, stages)
                ours = figures["one_full_submission"]
                plain["ours_over_plain_cpu"] = round(ours["median_cpu_s"] / plain["median_cpu_s"], 2)
                plain["ours_over_plain_wall"] = round(ours["median_wall_s"] / plain["median_wall_s"], 2)
                figures["plain_nbgrader"] = plain
                print(f"plain nbgrader, median of {len(plain['runs'])}: {plain['median_wall_s']} s wall, "
                      f"{plain['median_cpu_s']} s CPU (load average {plain['median_load']}; scores: {plain['scores']})"
                      f"\nours / plain: {plain['ours_over_plain_cpu']} in CPU, {plain['ours_over_plain_wall']} in wall "
                      "time", flush=True)
        if arguments.full_class:
            stages = arguments.full_stages or assignments(root)
            full_class(root, work / "full-class", stages, arguments.full_class)
            jobs = os.cpu_count() or 1
            run = batch_seconds(root, work, work / "full-class", stages, jobs)
            figures["full_class"] = {**run, "jobs": jobs, "stages": stages,
                                     "core_seconds_per_student": round(run["wall_s"] * jobs / run["students"], 1)}
            print(f"class of {arguments.full_class} full submissions, {jobs} jobs:", figures["full_class"], flush=True)
        if not arguments.skip_class:
            cohort = work / "cohort"
            synthetic_class(root, cohort, arguments.assignment, arguments.students)
            figures.update(students=arguments.students, assignment=arguments.assignment)
            for jobs in arguments.jobs:
                figures[f"class_batch_jobs{jobs}"] = batch_seconds(root, work, cohort, [arguments.assignment], jobs)
                print(f"class, batch grader, {jobs} job(s):", figures[f"class_batch_jobs{jobs}"], flush=True)
            if not arguments.skip_serial:
                figures["class_serial_nbgrader"] = serial_nbgrader_seconds(root, work, cohort, arguments.assignment)
                print("class, plain serial nbgrader:", figures["class_serial_nbgrader"], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(figures, indent=1))
    if arguments.output:
        arguments.output.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
