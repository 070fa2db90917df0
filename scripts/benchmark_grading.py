"""Benchmark grading: how long an instructor waits.

    python scripts/benchmark_grading.py [--students 50] [--assignment 02_attention] [--jobs 1 2]

Measures, on this machine, wall-clock seconds for
1. one full submission (all six notebooks, the reference solutions) with the batch grader;
2. a synthetic class of --students (a third correct, a third with a known bug, a third blank) on
   one assignment, with the batch grader at each --jobs value (checks, sandboxed kernels, feedback);
3. the same class with plain serial nbgrader (the `nbgrader autograde` and `generate_feedback` commands
   over the whole class with the course's config: one process, no submission checks, no sandbox).
Preparing the gradebook (generate_assignment) is timed separately and excluded from 1-3.
Prints a table and, with --output, writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import nbformat

from transformer_course.authoring import assignments, repository_root
from transformer_course.grading.batch import BatchGrader
from transformer_course.grading.classroom import Classroom
from transformer_course.grading.examples import student_submissions
from transformer_course.grading.isolation import bubblewrap_problem


def synthetic_class(root: Path, folder: Path, assignment: str, count: int) -> None:
    kinds = student_submissions(root, [assignment])  # ada: correct, chen: one bug, blake: blank
    order = ["ada", "chen", "blake"]
    for number in range(count):
        notebook = kinds[order[number % 3]][assignment]
        path = folder / f"student{number:03d}" / f"{assignment}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, path)


def batch_seconds(root: Path, work: Path, submissions: Path, assignment_ids: list[str], jobs: int) -> dict:
    class_dir = work / f"class-jobs{jobs}-{len(assignment_ids)}"
    grader = BatchGrader(root, class_dir, submissions, jobs=jobs, assignment_ids=assignment_ids,
                         sandbox=bubblewrap_problem() is None)
    start = time.perf_counter()
    grader.prepare()
    prepared = time.perf_counter()
    students = grader.run()
    done = time.perf_counter()
    graded = sum(result.status == "graded" for result in students.values())
    return {"prepare_s": round(prepared - start, 1), "grade_s": round(done - prepared, 1), "students": graded}


def serial_nbgrader_seconds(root: Path, work: Path, submissions: Path, assignment: str) -> dict:
    classroom = Classroom(root, work / "class-serial")
    start = time.perf_counter()
    classroom.prepare([assignment])
    prepared = time.perf_counter()
    for folder in sorted(submissions.iterdir()):
        notebook = nbformat.read(folder / f"{assignment}.ipynb", as_version=4)
        classroom.submit(folder.name, assignment, notebook)
    classroom.autograde(assignment)
    classroom.feedback(assignment)
    done = time.perf_counter()
    return {"prepare_s": round(prepared - start, 1), "grade_s": round(done - prepared, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=50)
    parser.add_argument("--assignment", default="02_attention")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--skip-full", action="store_true", help="skip the one-full-submission measurement")
    parser.add_argument("--skip-serial", action="store_true", help="skip plain serial nbgrader")
    parser.add_argument("--output", type=Path)
    arguments = parser.parse_args(argv)
    root = repository_root()
    work = Path(tempfile.mkdtemp(prefix="grading-benchmark-"))
    figures: dict[str, object] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "sandbox": bubblewrap_problem() or "bubblewrap", "students": arguments.students,
        "assignment": arguments.assignment,
    }
    try:
        if not arguments.skip_full:
            one = work / "one"
            for assignment, notebook in student_submissions(root, assignments(root))["ada"].items():
                path = one / "ada" / f"{assignment}.ipynb"
                path.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(notebook, path)
            figures["one_full_submission"] = batch_seconds(root, work, one, assignments(root), jobs=1)
            print("one full submission:", figures["one_full_submission"], flush=True)
        cohort = work / "cohort"
        synthetic_class(root, cohort, arguments.assignment, arguments.students)
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
