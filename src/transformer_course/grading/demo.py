"""The main job on built-in examples: generate the student notebooks, grade three example
students with real nbgrader, write scores.csv and feedback, print the score table.

    python -m transformer_course.grading.demo        (from the repository root)
"""

from __future__ import annotations

import argparse
import time

from transformer_course.authoring import assignments, build, repository_root
from transformer_course.grading.classroom import Classroom, score_table
from transformer_course.grading.examples import KNOWN_BUGS, student_submissions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="just these assignments, e.g. 01_positional_encoding")
    arguments = parser.parse_args(argv)
    root = repository_root()
    started = time.perf_counter()
    print("1/4 generating student notebooks: lessons/ -> solutions/ -> notebooks/ (nbgrader generate_assignment)")
    build(root, arguments.only)
    classroom = Classroom(root, root / "autograde" / "demo")
    classroom.reset()
    assignment_ids = classroom.prepare(arguments.only or assignments(root))
    print("2/4 submitting: ada (reference solutions), blake (blank notebooks), chen (one bug per stage)")
    for student, notebooks in student_submissions(root, assignment_ids).items():
        for assignment, notebook in notebooks.items():
            classroom.submit(student, assignment, notebook)
    print("3/4 autograding with nbgrader (every notebook runs in a fresh kernel)")
    classroom.autograde()
    print("4/4 writing feedback (hidden tests removed) and scores.csv")
    classroom.feedback()
    csv_path = classroom.write_csv()
    print()
    print(score_table(classroom.scores()))
    print("\nchen's bugs:", "; ".join(f"{a}: {m.description}" for a, m in KNOWN_BUGS.items() if a in assignment_ids))
    print(f"scores: {csv_path.relative_to(root)}   feedback: {(classroom.folder / 'feedback').relative_to(root)}/")
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
