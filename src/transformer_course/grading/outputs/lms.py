"""Grades for the LMS: files that Canvas's and Moodle's own CSV imports read, from scores.csv.

    python -m transformer_course.grading.lms CLASS_DIR [--title 02_attention="Stage 2 (4711)"] [--include-pending]

Students are matched by the LMS ids the batch command read from the download's file names (the
`lms_id` column of scores.csv, and the `file` column, which tells which LMS named the file).

**Canvas** (Grades > Import): CLASS_DIR/lms/canvas_gradebook.csv, in the layout of Canvas's own
gradebook export: `Student, ID, SIS User ID, SIS Login ID, Section`, then one column per stage,
and a second row `Points Possible` with each stage's maximum. `ID` is the Canvas user id from the
download (`name_<user id>_<file id>_...`), which is what Canvas matches a row by. A column whose
title is an existing assignment's (or "Title (assignment id)", see --title) fills that
assignment; any other title makes Canvas create a new assignment with those points. Students
under anonymous grading (`anon_...` ids) cannot be matched and are left out, with a note.

**Moodle** (Assignment > View all submissions > Grading action: Upload grading worksheet, with the
"Offline grading worksheet" feedback type on): CLASS_DIR/lms/moodle_<assignment>.csv per stage,
Moodle's worksheet layout: `Identifier` ("Participant N"), `Full name`, `Grade`, `Maximum grade`,
`Last modified (grade)`, `Feedback comments`. A Moodle download names students by a participant
id that belongs to one assignment (see `identities`), so each stage is its own worksheet; Moodle's
gradebook-wide CSV import needs user fields (email, id number) that the downloads do not carry.
The column names are Moodle's English strings: use an English Moodle session for the upload.

A stage whose written answers are not all graded yet is left empty (an empty cell changes nothing
in either LMS) and listed; --include-pending exports the points so far instead.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath

from transformer_course.grading.intake.identities import identify
from transformer_course.grading.outputs.scores import pending, read_csv

CANVAS_STUDENT_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
MOODLE_COLUMNS = ("Identifier", "Full name", "Grade", "Maximum grade", "Last modified (grade)", "Feedback comments")
GRADED = ("graded", "skipped")


@dataclass
class Export:
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _lms(row: dict[str, str], assignment_ids: list[str]) -> str:
    """Which LMS named this student's file ("canvas", "moodle" or "")."""
    if not row.get("file"):
        return ""
    return identify(PurePosixPath(row["file"]), assignment_ids)[0].lms


def _points(value: float) -> str:
    return f"{value:g}"


def export(class_dir: Path, titles: dict[str, str] | None = None, include_pending: bool = False) -> Export:
    rows = read_csv(class_dir / "scores.csv")
    titles = titles or {}
    assignment_ids = sorted({row["assignment"] for row in rows if row.get("assignment") not in ("", "?")})
    folder = class_dir / "lms"
    folder.mkdir(parents=True, exist_ok=True)
    result = Export()
    maximum: dict[str, float] = {}
    scores: dict[tuple[str, str], tuple[float | None, dict[str, str]]] = {}
    for row in rows:
        total, top = _number(row.get("total", "")), _number(row.get("max", ""))
        if top is not None:
            maximum[row["assignment"]] = max(maximum.get(row["assignment"], 0.0), top)
        score = total if row.get("status") in GRADED else None
        if score is not None and pending(row) and not include_pending:
            result.notes.append(f"{row['student']} {row['assignment']}: written answers not graded yet, left empty")
            score = None
        scores[row["student"], row["assignment"]] = (score, row)

    by_lms: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        by_lms[_lms(row, assignment_ids)].append(row)
    stages = [a for a in assignment_ids if a in maximum]

    canvas = {}  # Canvas user id -> (name, {assignment: score})
    for row in by_lms["canvas"]:
        if row["lms_id"].startswith("anon_"):
            result.notes.append(f"{row['student']}: anonymous Canvas id {row['lms_id']}, not importable by id; "
                                "left out of the Canvas file")
            continue
        name, grades = canvas.setdefault(row["lms_id"], (row.get("name", ""), {}))
        score = scores[row["student"], row["assignment"]][0]
        if score is not None:
            grades[row["assignment"]] = score
    if canvas:
        path = folder / "canvas_gradebook.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow([*CANVAS_STUDENT_COLUMNS, *(titles.get(a, a) for a in stages)])
            writer.writerow(["Points Possible", "", "", "", "", *(_points(maximum[a]) for a in stages)])
            for lms_id, (name, grades) in sorted(canvas.items()):
                writer.writerow([_safe(name), lms_id, "", "", "",
                                 *(_points(grades[a]) if a in grades else "" for a in stages)])
        result.files.append(path)

    moodle: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in by_lms["moodle"]:
        moodle[row["assignment"]].append(row)
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    for assignment, members in sorted(moodle.items()):
        if assignment not in maximum:
            continue
        path = folder / f"moodle_{assignment}.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(MOODLE_COLUMNS)
            for row in sorted(members, key=lambda row: int(row["lms_id"]) if row["lms_id"].isdigit() else 0):
                score = scores[row["student"], assignment][0]
                writer.writerow([f"Participant {row['lms_id']}", _safe(row.get("name", "")),
                                 "" if score is None else _points(score), _points(maximum[assignment]), stamp, ""])
        result.files.append(path)

    others = sorted({row["student"] for row in by_lms[""]})
    if others:
        result.notes.append(f"{len(others)} student(s) have no LMS id in their file names (not in any LMS file): "
                            + ", ".join(others[:10]) + (" ..." if len(others) > 10 else ""))
    return result


def _safe(text: str) -> str:
    return "'" + text if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("class_dir", type=Path)
    parser.add_argument("--title", action="append", default=[], metavar="ASSIGNMENT=TITLE",
                        help="the LMS column title of a stage, e.g. 02_attention=\"Stage 2 (4711)\"")
    parser.add_argument("--include-pending", action="store_true",
                        help="export totals even where written answers are not graded yet")
    arguments = parser.parse_args(argv)
    if not (arguments.class_dir / "scores.csv").exists():
        parser.error(f"{arguments.class_dir} has no scores.csv: grade the class first")
    titles = dict(item.split("=", 1) for item in arguments.title if "=" in item)
    result = export(arguments.class_dir.resolve(), titles, arguments.include_pending)
    for path in result.files:
        print(f"wrote {path}")
    for note in result.notes:
        print(f"note: {note}")
    if not result.files:
        print("no student's file names carry a Canvas or Moodle id: nothing to export")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
