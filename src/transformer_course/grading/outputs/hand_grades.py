"""Hand grades that survive a regrade: which answer text each hand score was given to.

nbgrader's autograde marks every written answer that has a hand score as "needs review" whenever the
notebook is graded again, changed or not (its SaveAutoGrades: "if there was previously a manual grade ...
mark this as needing review"). The batch command regrades a notebook handed in again (and every notebook of
the download with --force), so a resubmission would send every hand grade of that notebook back for review,
the answers the student did not touch included.

Here, whenever a person's score is taken into the gradebook (`answers import`, `answers refresh` after the
formgrader), the digest of the answer it was given to is kept in CLASS/records/hand-graded/<student>.json.
After a regrade, `keep_unchanged` clears the review mark of every answer whose text is still the one that
was graded; an answer that changed keeps it. Nothing else is touched: scores and comments stay as they were.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import nbformat

from transformer_course.grading.outputs.files import write_text_atomically
from transformer_course.grading.outputs.scores import is_answer_cell


def version(text: str) -> str:
    """A short name of an answer's text ("v" and 12 hex digits: no spreadsheet reads it as a number)."""
    return "v" + hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:12]


def answer_texts(class_dir: Path, student: str, assignment: str) -> dict[str, str]:
    """{question id: the answer's text} in the student's autograded notebook ({} when there is none)."""
    path = class_dir / "autograded" / student / assignment / f"{assignment}.ipynb"
    try:
        notebook = nbformat.read(path, as_version=4)
    except (OSError, ValueError):
        return {}
    return {cell.metadata["nbgrader"]["grade_id"]: cell.source for cell in notebook.cells if is_answer_cell(cell)}


def _path(class_dir: Path, student: str) -> Path:
    return class_dir / "records" / "hand-graded" / f"{student}.json"


def _load(class_dir: Path, student: str) -> dict[str, dict[str, str]]:
    try:
        saved = json.loads(_path(class_dir, student).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def remember(class_dir: Path, db_url: str, who: Iterable[tuple[str, str]]) -> int:
    """Keep the digest of every hand-graded answer of these (student, assignment) pairs that is not
    waiting for review (its score was given to the text it has now); returns how many were kept."""
    from nbgrader.api import Gradebook
    by_student: dict[str, set[str]] = {}
    for student, assignment in who:
        by_student.setdefault(student, set()).add(assignment)
    kept = 0
    with Gradebook(db_url) as gradebook:
        for student, assignment_ids in sorted(by_student.items()):
            saved = _load(class_dir, student)
            for assignment in sorted(assignment_ids):
                try:
                    submission = gradebook.find_submission(assignment, student)
                except Exception:  # noqa: BLE001  (MissingEntry: nothing of this pair in the gradebook)
                    continue
                texts = answer_texts(class_dir, student, assignment)
                for notebook in submission.notebooks:
                    for grade in notebook.grades:
                        if grade.manual_score is None or grade.needs_manual_grade or grade.name not in texts:
                            continue
                        saved.setdefault(assignment, {})[grade.name] = version(texts[grade.name])
                        kept += 1
            if saved:
                write_text_atomically(_path(class_dir, student), json.dumps(saved, indent=1, sort_keys=True))
    return kept


def keep_unchanged(class_dir: Path, db_url: str) -> list[tuple[str, str, str]]:
    """Clear the review mark nbgrader put on hand-graded answers whose text did not change since they
    were graded; returns the (student, assignment, question) cleared."""
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SQLAlchemyError
    cleared = []
    records: dict[str, dict[str, dict[str, str]]] = {}
    texts: dict[tuple[str, str], dict[str, str]] = {}
    with Gradebook(db_url) as gradebook:
        from nbgrader.api import Grade

        waiting = (gradebook.db.query(Grade).filter(Grade.needs_manual_grade.is_(True), Grade.manual_score.isnot(None))
                   .order_by(Grade.id).all())  # one order on every machine: two updating at once never deadlock
        for grade in waiting:
            student, assignment = grade.student.id, grade.assignment.name
            known = records.setdefault(student, _load(class_dir, student)).get(assignment, {}).get(grade.name)
            if known is None:
                continue
            if (student, assignment) not in texts:
                texts[student, assignment] = answer_texts(class_dir, student, assignment)
            text = texts[student, assignment].get(grade.name)
            if text is not None and version(text) == known:
                grade.needs_manual_grade = False
                cleared.append((student, assignment, grade.name))
        if cleared:
            try:
                gradebook.db.commit()
            except SQLAlchemyError:  # another machine wrote these rows at the same moment: it did the same
                gradebook.db.rollback()
                return []
    return cleared
