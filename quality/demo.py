"""The main job on built-in examples: generate the student notebooks, put three example students'
notebooks in a downloads folder, and grade it with the instructors' batch command (real nbgrader,
sandboxed kernels): scores.csv, feedback, the summary table.

    python -m quality.demo        (from the repository root)
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import nbformat

from quality.examples import KNOWN_BUGS, student_submissions
from transformer_course.authoring import assignments, build, repository_root
from transformer_course.grading.classroom.batch import BatchGrader, summary
from transformer_course.grading.gradebook.class_folder import score_table
from transformer_course.grading.outputs.answers import score_rows
from transformer_course.grading.sandbox.isolation import bubblewrap_problem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="just these assignments, e.g. 01_positional_encoding")
    arguments = parser.parse_args(argv)
    root = repository_root()
    started = time.perf_counter()
    print("1/3 generating student notebooks: lessons/ -> solutions/ -> notebooks/ (nbgrader generate_assignment)")
    build(root, arguments.only)
    assignment_ids = arguments.only or assignments(root)
    demo = root / "autograde" / "demo"
    shutil.rmtree(demo, ignore_errors=True)
    print("2/3 downloads: ada (reference solutions), blake (blank notebooks), chen (one bug per stage)")
    for student, notebooks in student_submissions(root, assignment_ids).items():
        (demo / "downloads" / student).mkdir(parents=True)
        for assignment, notebook in notebooks.items():
            nbformat.write(notebook, demo / "downloads" / student / f"{assignment}.ipynb")
    problem = bubblewrap_problem()
    print("3/3 python -m transformer_course.grading.batch autograde/demo/downloads --class-dir autograde/demo/class"
          + (" --no-sandbox" if problem else ""))
    print(confinement(problem), flush=True)
    grader = BatchGrader(root, demo / "class", demo / "downloads", jobs=min(3, os.cpu_count() or 1),
                         assignment_ids=assignment_ids, sandbox=problem is None)
    students = grader.run()
    csv_path = grader.class_dir / "scores.csv"
    print()
    checks = [{**row, "total": row["autograded"], "max": row["autograded_max"]} for row in score_rows(grader.db_url)]
    print("points from the checks (the written answers wait for a person: website/instructor/written-answers.md):")
    print(score_table(checks))
    print()
    print(summary(students, csv_path))
    print("\nchen's bugs:", "; ".join(f"{a}: {m.description}" for a, m in KNOWN_BUGS.items() if a in assignment_ids))
    print(f"scores: {csv_path.relative_to(root)}   feedback: {(grader.class_dir / 'feedback').relative_to(root)}/   "
          f"class report: {(grader.class_dir / 'report.html').relative_to(root)}")
    print(confinement(problem))
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


def confinement(problem: str | None) -> str:
    """One plain line: were the example students' notebooks graded in the sandbox? (The demo grades its own
    built-in students, so it goes on without one; the batch command refuses to, unless told --no-sandbox.)"""
    if problem is None:
        return "graded CONFINED: every student's code ran in a bubblewrap sandbox (no network, no other files)"
    return (f"graded WITHOUT a sandbox, because {problem}: fine for these built-in example students, but "
            "install bubblewrap before grading a real class (the batch command refuses to grade without it "
            "unless given --no-sandbox)")


if __name__ == "__main__":
    raise SystemExit(main())
