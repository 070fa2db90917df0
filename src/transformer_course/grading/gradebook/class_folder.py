"""A class on disk and the real nbgrader commands that grade it.

    folder/submitted/<student>/<assignment>/<assignment>.ipynb   what students handed in
    folder/autograded/..., folder/feedback/...                    what nbgrader writes
    folder/gradebook.db                                            the sqlite gradebook
    folder/scores.csv                                              per-cell and total scores

Several machines may share one gradebook (a PostgreSQL URL, or one sqlite file) and one class
folder: `prepare` registers the assignments under `gradebook_lock`, so two machines starting at
once neither create nbgrader's tables twice nor write the release folder at the same time.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat

from transformer_course.authoring import assignments, plant_bugs, run_nbgrader


@dataclass
class Classroom:
    root: Path  # the course repository (solutions/ is the nbgrader source)
    folder: Path  # where this class's submissions, gradebook and feedback live
    database_url: str | None = None  # any SQLAlchemy URL; default: sqlite in `folder`

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.folder / 'gradebook.db'}"

    def flags(self) -> list[str]:
        return [
            f"--CourseDirectory.db_url={self.db_url}",
            f"--CourseDirectory.release_directory={self.folder / 'release'}",
            f"--CourseDirectory.submitted_directory={self.folder / 'submitted'}",
            f"--CourseDirectory.autograded_directory={self.folder / 'autograded'}",
            f"--CourseDirectory.feedback_directory={self.folder / 'feedback'}",
        ]

    def nbgrader(self, *arguments: str) -> None:
        run_nbgrader(self.root, [*arguments, *self.flags()])

    def prepare(self, assignment_ids: list[str] | None = None) -> list[str]:
        """Register the assignments and their grade cells in the gradebook, holding its lock."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with gradebook_lock(self.db_url, self.folder):
            return self.register(assignment_ids)

    def register(self, assignment_ids: list[str] | None = None) -> list[str]:
        """Register the assignments and their grade cells (real generate_assignment); the caller
        holds `gradebook_lock` when other machines may be doing the same."""
        from nbgrader.api import Gradebook
        assignment_ids = assignment_ids or assignments(self.root)
        self.folder.mkdir(parents=True, exist_ok=True)
        with Gradebook(self.db_url) as gradebook:
            for assignment in assignment_ids:
                gradebook.update_or_create_assignment(assignment)
        pattern = assignment_ids[0] if len(assignment_ids) == 1 else "*"
        self.nbgrader("generate_assignment", pattern, "--force")
        for assignment in assignment_ids:  # the bug hunts' broken code, as in the students' notebooks
            plant_bugs(self.root, assignment, self.root / "solutions", self.folder / "release")
        return assignment_ids

    def submit(self, student: str, assignment: str, notebook: nbformat.NotebookNode) -> Path:
        path = self.folder / "submitted" / student / assignment / f"{assignment}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, path)
        return path

    def autograde(self, assignment: str = "*", student: str = "*") -> None:
        self.nbgrader("autograde", assignment, f"--student={student}", "--force")

    def feedback(self, assignment: str = "*", student: str = "*") -> None:
        self.nbgrader("generate_feedback", assignment, f"--student={student}", "--force")

    def scores(self) -> list[dict[str, object]]:
        """One row per (student, assignment): every grade cell's score, the total and the maximum.

        Two queries whatever the size of the class (the gradebook's objects would cost a query per
        submission, notebook and grade: minutes for a class of thousands on a remote PostgreSQL)."""
        from nbgrader.api import Assignment, Grade, Gradebook, SubmittedAssignment, SubmittedNotebook
        from sqlalchemy.orm import joinedload

        rows: dict[tuple[str, str], dict[str, object]] = {}
        with Gradebook(self.db_url) as gradebook:
            totals = (gradebook.db.query(SubmittedAssignment.student_id, Assignment.name, SubmittedAssignment.score,
                                         SubmittedAssignment.max_score)
                      .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id))
            for student, assignment, total, maximum in totals:
                rows[student, assignment] = {"student": student, "assignment": assignment}
                rows[student, assignment].update(total=total, max=maximum)
            cells = (gradebook.db.query(SubmittedAssignment.student_id, Assignment.name, Grade)
                     .select_from(Grade)
                     .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
                     .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                     .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                     .options(joinedload(Grade.cell)))
            for student, assignment, grade in cells:
                rows[student, assignment][grade.cell.name] = grade.score
        ordered = [{key: row[key] for key in [*(k for k in row if k not in ("total", "max")), "total", "max"]}
                   for row in rows.values()]
        return sorted(ordered, key=lambda row: (str(row["student"]), str(row["assignment"])))

    def write_csv(self, path: Path | None = None) -> Path:
        rows = self.scores()
        path = path or self.folder / "scores.csv"
        columns = ["student", "assignment"]
        columns += sorted({key for row in rows for key in row} - {"student", "assignment", "total", "max"})
        columns += ["total", "max"]
        with open(path, "w", newline="", encoding="utf-8-sig") as handle:  # a byte-order mark first, for Excel
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        return path

    def reset(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


LOCK_NAME = "transformer_course.gradebook"


@contextlib.contextmanager
def gradebook_lock(db_url: str, folder: Path) -> Iterator[None]:
    """Hold the gradebook's lock: one machine at a time sets the gradebook up.

    PostgreSQL: a session-level advisory lock (released by the server if this process dies).
    sqlite: an exclusive lock on a file beside the database. Any other database: a lock file in
    the class folder (enough for machines sharing that folder)."""
    if db_url.startswith(("postgresql", "postgres:")):
        from sqlalchemy import create_engine, text

        key = int.from_bytes(hashlib.sha256(LOCK_NAME.encode()).digest()[:8], "big", signed=True)
        engine = create_engine(db_url, future=True)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
                try:
                    yield
                finally:
                    connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
        finally:
            engine.dispose()
        return
    database = db_url.split(":///", 1)[1] if db_url.startswith("sqlite:///") else ""
    path = Path(database + ".lock") if database and database != ":memory:" else folder / ".gradebook.lock"
    with file_lock(path):
        yield


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (made, with its folder, when missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def score_table(rows: list[dict[str, object]]) -> str:
    """Students down, assignments across, 'score/max' in each cell."""
    students = sorted({str(row["student"]) for row in rows})
    assignment_ids = sorted({str(row["assignment"]) for row in rows})
    cell = {(row["student"], row["assignment"]): f"{row['total']:g}/{row['max']:g}" for row in rows}
    width = max([len(a) for a in assignment_ids] + [9])
    lines = ["student".ljust(10) + "".join(a.ljust(width + 2) for a in assignment_ids) + "total"]
    for student in students:
        total = sum(float(row["total"]) for row in rows if row["student"] == student)
        maximum = sum(float(row["max"]) for row in rows if row["student"] == student)
        line = student.ljust(10) + "".join(cell.get((student, a), "-").ljust(width + 2) for a in assignment_ids)
        lines.append(line + f"{total:g}/{maximum:g}")
    return "\n".join(lines)
