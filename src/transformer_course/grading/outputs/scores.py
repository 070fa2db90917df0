"""The class's scores as the gradebook and scores.csv hold them, for every output an instructor reads.

`score_rows` reads every grade cell's score from the gradebook (a written answer nobody graded yet is
"needs manual grading", an autograded cell not scored yet "not scored yet": never 0); `read_csv` reads
scores.csv or a sheet saved by a spreadsheet.
"""

from __future__ import annotations

import csv
from pathlib import Path

import nbformat

NEEDS_MANUAL_GRADING = "needs manual grading"
NOT_SCORED_YET = "not scored yet"  # an autograded cell nbgrader has not scored: its grading is under way (or broke)
GRADEBOOK_COLUMNS = ("autograded", "autograded_max", "manual", "manual_max", "manual_status", "total", "max")


def is_answer_cell(cell: nbformat.NotebookNode) -> bool:
    """A cell graded by hand: nbgrader's "manually graded answer" (grade and solution)."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return bool(nbgrader.get("grade")) and bool(nbgrader.get("solution"))


# --- scores from the gradebook ---------------------------------------------------------------------

def score_rows(db_url: str) -> list[dict[str, object]]:
    """One row per (student, assignment) in the gradebook: every grade cell's score, written answers
    not yet graded shown as "needs manual grading", and the autograded, manual and total points."""
    from nbgrader.api import Gradebook
    rows = []
    with Gradebook(db_url) as gradebook:
        for assignment in gradebook.assignments:
            for submission in assignment.submissions:
                row: dict[str, object] = {"student": submission.student_id, "assignment": assignment.name}
                auto = auto_max = manual = manual_max = 0.0
                pending, changed, blank, answers = [], [], [], 0
                for notebook in submission.notebooks:
                    written = {cell.name for cell in notebook.notebook.solution_cells}
                    for grade in notebook.grades:
                        if grade.name not in written:
                            auto_max += grade.max_score
                            if grade.auto_score is None and grade.manual_score is None:
                                row[grade.name] = NOT_SCORED_YET  # never a silent 0
                                continue
                            row[grade.name] = grade.score
                            auto += grade.score
                            continue
                        answers += 1
                        manual_max += grade.max_score
                        if grade.manual_score is None and grade.auto_score is None:
                            row[grade.name] = NEEDS_MANUAL_GRADING
                            pending.append(grade.max_score)
                            continue
                        row[grade.name] = grade.score
                        manual += grade.score
                        if grade.manual_score is None:
                            blank.append(grade.name)  # nbgrader's 0 for an answer left as released
                        elif grade.needs_manual_grade:
                            changed.append(grade.name)  # regraded after a hand score: the answer may differ
                row.update(autograded=auto, autograded_max=auto_max, manual=manual, manual_max=manual_max,
                           manual_status=_manual_status(answers, pending, changed, blank),
                           total=auto + manual, max=auto_max + manual_max)
                rows.append(row)
    return sorted(rows, key=lambda row: (str(row["student"]), str(row["assignment"])))


def _manual_status(answers: int, pending: list[float], changed: list[str], blank: list[str]) -> str:
    if not answers:
        return ""
    parts = []
    if pending:
        parts.append(f"{NEEDS_MANUAL_GRADING}: {len(pending)} of {answers} written answers "
                     f"({sum(pending):g} points not counted yet)")
    if changed:
        parts.append(f"review: {len(changed)} answer(s) graded by hand before the last autograde "
                     f"({', '.join(changed)})")
    if blank:
        parts.append(f"{len(blank)} written answer(s) left blank (0 points)")
    return "; ".join(parts) or "graded by hand"


def scored(row: dict[str, object]) -> bool:
    """Whether nbgrader has scored every autograded cell of this row (`score_rows`)."""
    return NOT_SCORED_YET not in row.values()


def pending(row: dict[str, object]) -> bool:
    """Whether this scores.csv row still has written answers nobody graded."""
    return str(row.get("manual_status", "")).startswith(NEEDS_MANUAL_GRADING)


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV as written by us or saved by a spreadsheet (UTF-8, with or without a byte-order mark)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            return list(csv.DictReader(handle))
    except FileNotFoundError:
        return []
