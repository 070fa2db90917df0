"""Grades for the LMS: files that Canvas's and Moodle's own imports read, from scores.csv.

    python -m transformer_course.grading.lms CLASS_DIR [--scale-to 100 | --scale-to 02_attention=20 ...]
        [--comments] [--canvas-export EXPORT.csv] [--overwrite] [--title 02_attention="Stage 2 (4711)"]
        [--include-pending] [--db-url URL]

Students are matched by the LMS ids the batch command read from the download's file names (the
`lms_id` column of scores.csv, and the `file` column, which tells which LMS named the file).

**Nothing the LMS already holds is overwritten unless the instructor asks (--overwrite).**

**Canvas** (Grades > Import): CLASS_DIR/lms/canvas_<stage>.csv, one file per stage, in the layout of
Canvas's own gradebook export: `Student, ID, SIS User ID, SIS Login ID, Section`, the stage's column, and
a second row `Points Possible`. `ID` is the Canvas user id from the download (`name_<user id>_<file
id>_...`), which is what Canvas matches a row by. A file lists only students with a grade to give, so it
has no empty cell: Canvas counts an empty cell as a change against a score it holds. Which scores Canvas
holds comes from its own export (Grades > Export > Export Entire Gradebook, given with --canvas-export):
cells Canvas already has a score in are left out; without that export, only --overwrite writes the Canvas
files. The column title is the stage's name, or --title's (an existing assignment's title, or "Title
(assignment id)", fills that assignment; any other title makes Canvas create one). Students under
anonymous grading (`anon_...` ids) cannot be matched and are left out, with a note. With --comments,
CLASS_DIR/lms/canvas_comments_<stage>.zip holds one text file per student for the assignment's
"Re-upload submissions", named like the student's downloaded file (Canvas attaches each to the
submission of the user and file ids in its name).

**Moodle** (Assignment > View all submissions > Grading action: Upload grading worksheet, with the
"Offline grading worksheet" feedback type on): CLASS_DIR/lms/moodle_<stage>.csv per stage, Moodle's
worksheet layout: `Identifier` ("Participant N"), `Full name`, `Grade`, `Maximum grade`, `Last modified
(grade)`, and `Feedback comments` only with --comments (Moodle's import replaces the comments of every row
of a sheet that has that column). Moodle skips a row whose grade it changed after the sheet's `Last
modified (grade)`: the sheet says 2000-01-01, so Moodle keeps every grade it already holds and fills only
the others; --overwrite says now, so the sheet's grades replace Moodle's. A Moodle download names students
by a participant id of that one assignment (see `identities`), so each stage is its own worksheet. The
column names are Moodle's English strings: use an English Moodle session for the upload.

**Points or the LMS's scale.** Grades are the course's points (a stage's maximum is its number of
points) unless --scale-to gives the LMS assignment's maximum: `--scale-to 100` for every stage, or
`--scale-to 02_attention=20` per stage; the grade is then total / maximum x that, to 2 decimals.

**Comments** (--comments): the instructor's comments on the written answers (from the gradebook) and a
one-line summary of the checks not passed, as HTML text for Moodle (every character a student or
instructor typed is escaped) and plain text for Canvas.

A stage whose written answers are not all graded is left out for that student and listed;
--include-pending exports the points so far. Students with no LMS id in their file names are listed,
not exported.
"""

from __future__ import annotations

import argparse
import csv
import html
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath

from transformer_course.grading.gradebook.config import default_db_url
from transformer_course.grading.intake.identities import identify
from transformer_course.grading.outputs.files import replace_atomically
from transformer_course.grading.outputs.report import grade_cells
from transformer_course.grading.outputs.scores import pending, read_csv
from transformer_course.grading.outputs.spreadsheet import SheetError, decode, protect

CANVAS_STUDENT_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
MOODLE_COLUMNS = ("Identifier", "Full name", "Grade", "Maximum grade", "Last modified (grade)")
MOODLE_COMMENTS = "Feedback comments"
MOODLE_KEEP = "2000-01-01 00:00:00"  # older than any grade Moodle holds: its import keeps them all
GRADED = ("graded", "skipped")


@dataclass
class Export:
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Grade:
    student: str
    assignment: str
    name: str
    lms_id: str
    file: str
    value: float  # as exported: points, or scaled to the LMS assignment's maximum
    maximum: float  # of the same
    comment: str = ""  # plain text, one item a line


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
    return f"{round(value, 2):g}"


def parse_scale(items: list[str]) -> dict[str, float]:
    """{stage or "": maximum} from --scale-to values ("100" for every stage, "02_attention=20")."""
    scale = {}
    for item in items:
        stage, _, number = item.rpartition("=")
        value = _number(number.strip())
        if value is None or value <= 0:
            raise ValueError(f"--scale-to {item!r}: give a positive number, or STAGE=NUMBER")
        scale[stage.strip()] = value
    return scale


def export(class_dir: Path, titles: dict[str, str] | None = None, include_pending: bool = False, *,
           scale_to: dict[str, float] | None = None, comments: bool = False, overwrite: bool = False,
           canvas_export: Path | None = None, db_url: str | None = None) -> Export:
    rows = read_csv(class_dir / "scores.csv")
    titles, scale_to = titles or {}, scale_to or {}
    assignment_ids = sorted({row["assignment"] for row in rows if row.get("assignment") not in ("", "?")})
    folder = class_dir / "lms"
    result = Export()
    unknown = sorted(set(scale_to) - {""} - set(assignment_ids))
    if unknown:
        result.notes.append(f"--scale-to names stages nobody handed in: {', '.join(unknown)}")
    maximum: dict[str, float] = {}
    for row in rows:
        top = _number(row.get("max", ""))
        if top is not None:
            maximum[row["assignment"]] = max(maximum.get(row["assignment"], 0.0), top)
    notes = _comments(class_dir, rows, db_url) if comments else {}

    grades: dict[str, dict[str, list[Grade]]] = defaultdict(lambda: defaultdict(list))  # lms -> stage -> grades
    for row in rows:
        lms = _lms(row, assignment_ids)
        total = _number(row.get("total", ""))
        if row.get("status") not in GRADED or total is None or row["assignment"] not in maximum:
            continue
        if pending(row) and not include_pending:
            result.notes.append(f"{row['student']} {row['assignment']}: written answers not graded yet, left out")
            continue
        top = maximum[row["assignment"]]
        target = scale_to.get(row["assignment"], scale_to.get(""))
        value, shown = (total, top) if target is None else (total / top * target if top else 0.0, target)
        grades[lms][row["assignment"]].append(Grade(
            row["student"], row["assignment"], row.get("name", ""), row.get("lms_id", ""), row.get("file", ""),
            round(value, 2), shown, notes.get((row["student"], row["assignment"]), "")))
    if not scale_to and grades:
        result.notes.append("grades are the course's points (" + ", ".join(
            f"{a}: of {_points(maximum[a])}" for a in assignment_ids if a in maximum) + "); if an LMS assignment has "
            "another maximum, pass --scale-to its maximum")

    _canvas(folder, grades["canvas"], titles, overwrite, canvas_export, comments, result)
    _moodle(folder, grades["moodle"], overwrite, comments, result)
    others = sorted({row["student"] for row in rows if _lms(row, assignment_ids) == ""})
    if others:
        result.notes.append(f"{len(others)} student(s) have no LMS id in their file names (not in any LMS file): "
                            + ", ".join(others[:10]) + (" ..." if len(others) > 10 else ""))
    return result


# --- Canvas ------------------------------------------------------------------------------------------

def read_canvas_export(path: Path) -> dict[str, dict[str, str]]:
    """{column title: {Canvas user id: score}} of Canvas's own gradebook export (empty scores left out).

    A title "Name (12345)" is also known as "Name"; the export's "Points Possible" and other rows without
    a user id are skipped."""
    try:
        lines = list(csv.reader(decode(path.read_bytes()).splitlines()))
    except (OSError, csv.Error) as error:
        raise SheetError(f"{path.name}: cannot be read as Canvas's gradebook export ({error})") from None
    if not lines or "ID" not in lines[0]:
        raise SheetError(f"{path.name} line 1: no column 'ID': not Canvas's gradebook export "
                         "(Grades > Export > Export Entire Gradebook)")
    header = lines[0]
    position = header.index("ID")
    held: dict[str, dict[str, str]] = {}
    for index, title in enumerate(header):
        if index <= position or not title:
            continue
        scores = {line[position].strip(): line[index].strip() for line in lines[1:]
                  if len(line) > index and line[position].strip().isdigit() and line[index].strip()}
        held[title] = scores
        short = title.rsplit(" (", 1)[0] if title.endswith(")") else title
        held.setdefault(short, scores)
    return held


def _canvas(folder: Path, by_stage: dict[str, list[Grade]], titles: dict[str, str], overwrite: bool,
            canvas_export: Path | None, comments: bool, result: Export) -> None:
    if not by_stage:
        return
    if canvas_export is None and not overwrite:
        result.notes.append("Canvas files not written: to leave the scores Canvas holds as they are, give Canvas's "
                            "own export (Grades > Export > Export Entire Gradebook) with --canvas-export, or pass "
                            "--overwrite to replace them")
        return
    held = read_canvas_export(canvas_export) if canvas_export is not None else {}
    for stage, stage_grades in sorted(by_stage.items()):
        title = titles.get(stage, stage)
        there = held.get(title, {})
        rows, kept = {}, []
        for grade in stage_grades:
            if grade.lms_id.startswith("anon_"):
                result.notes.append(f"{grade.student}: anonymous Canvas id {grade.lms_id}, not importable by id; "
                                    "left out of the Canvas file")
                continue
            current = there.get(grade.lms_id)
            if current is not None and (not overwrite or _number(current) == grade.value):
                if not overwrite:
                    kept.append(grade.student)
                continue
            rows[grade.lms_id] = grade
        if kept:
            result.notes.append(f"{stage}: {len(kept)} student(s) already have a score in Canvas, left as it is "
                                "(--overwrite replaces it)")
        if not rows:
            continue
        top = next(iter(rows.values())).maximum

        def write(handle, rows=rows, title=title, top=top) -> None:  # noqa: ANN001
            writer = csv.writer(handle)
            writer.writerow([*CANVAS_STUDENT_COLUMNS, protect(title)])
            writer.writerow(["Points Possible", "", "", "", "", _points(top)])
            for lms_id, grade in sorted(rows.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0):
                writer.writerow([protect(grade.name), lms_id, "", "", "", _points(grade.value)])

        result.files.append(replace_atomically(folder / f"canvas_{stage}.csv", write, newline=""))
        if comments:
            _canvas_comments(folder / f"canvas_comments_{stage}.zip", list(rows.values()), result)


def _canvas_comments(path: Path, grades: list[Grade], result: Export) -> None:
    """A zip for Canvas's "Re-upload submissions": a text file per student, named like their download (the
    user id and the file id Canvas reads from the name come first)."""
    written = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.part")
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as archive:
        for grade in grades:
            if not grade.comment:
                continue
            stem = PurePosixPath(grade.file).name.rsplit(".", 1)[0]
            archive.writestr(f"{stem}_comments.txt", grade.comment + "\n")
            written += 1
    if written:
        temporary.replace(path)
        result.files.append(path)
    else:
        temporary.unlink()


# --- Moodle ------------------------------------------------------------------------------------------

def _moodle(folder: Path, by_stage: dict[str, list[Grade]], overwrite: bool, comments: bool, result: Export) -> None:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S") if overwrite else MOODLE_KEEP
    for stage, stage_grades in sorted(by_stage.items()):
        def write(handle, stage_grades=stage_grades) -> None:  # noqa: ANN001
            writer = csv.writer(handle)
            writer.writerow([*MOODLE_COLUMNS, *([MOODLE_COMMENTS] if comments else [])])
            for grade in sorted(stage_grades, key=lambda g: int(g.lms_id) if g.lms_id.isdigit() else 0):
                writer.writerow([f"Participant {grade.lms_id}", protect(grade.name), _points(grade.value),
                                 _points(grade.maximum), stamp, *([_moodle_html(grade.comment)] if comments else [])])

        result.files.append(replace_atomically(folder / f"moodle_{stage}.csv", write, newline=""))
    if by_stage and not overwrite:
        result.notes.append("Moodle worksheets say 'Last modified (grade)' 2000-01-01: Moodle keeps every grade it "
                            "already holds and fills the others (--overwrite replaces them)")


_FORMULA_CHARACTERS = str.maketrans({"=": "&#61;", "+": "&#43;", "-": "&#45;", "@": "&#64;", "\t": " "})


def _moodle_html(text: str) -> str:
    """Plain text as Moodle's HTML feedback text: escaped, a paragraph a line. The characters that start a
    formula are written as entities too (Moodle shows them as they were), so no cell a spreadsheet splits off
    at a `;` begins a formula."""
    return "".join(f"<p>{html.escape(line).translate(_FORMULA_CHARACTERS)}</p>"
                   for line in text.splitlines() if line.strip())


# --- comments ----------------------------------------------------------------------------------------

def _comments(class_dir: Path, rows: list[dict[str, str]], db_url: str | None) -> dict[tuple[str, str], str]:
    """{(student, stage): the instructor's comments on the written answers and the checks not passed}."""
    from nbgrader.api import Comment, Gradebook

    written: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    with Gradebook(db_url or default_db_url(class_dir)) as gradebook:
        for note in gradebook.db.query(Comment).filter(Comment.manual_comment.isnot(None)):
            if note.manual_comment.strip():
                written[note.student.id, note.assignment.name].append((note.name, note.manual_comment.strip()))
    cells = grade_cells(class_dir, sorted({row["assignment"] for row in rows if row.get("assignment")}))
    found = {}
    for row in rows:
        key = (row["student"], row["assignment"])
        stage_cells = cells.get(row["assignment"], [])
        number = {cell.grade_id: index for index, cell in enumerate((c for c in stage_cells if c.written), 1)}
        lines = [f"Question {number.get(name, '?')} ({name}): {text}"
                 for name, text in sorted(written.get(key, []), key=lambda item: number.get(item[0], 99))]
        checks = [cell for cell in stage_cells if not cell.written]
        failed = [cell.grade_id for cell in checks if (_number(row.get(cell.grade_id, "")) or 0.0) < cell.points]
        if checks and row.get("status") in GRADED:
            lines.append(f"Checks: {len(checks) - len(failed)} of {len(checks)} passed"
                         + (f"; not passed: {', '.join(failed)}" if failed else "")
                         + " (details in your feedback file)")
        if lines:
            found[key] = "\n".join(lines)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("class_dir", type=Path)
    parser.add_argument("--title", action="append", default=[], metavar="ASSIGNMENT=TITLE",
                        help="the LMS column title of a stage, e.g. 02_attention=\"Stage 2 (4711)\"")
    parser.add_argument("--scale-to", action="append", default=[], metavar="[STAGE=]MAXIMUM",
                        help="the LMS assignment's maximum: grades become total / maximum x this (all stages, or one)")
    parser.add_argument("--comments", action="store_true",
                        help="add the comments on written answers and a summary of the checks not passed")
    parser.add_argument("--overwrite", action="store_true", help="replace the grades the LMS already holds")
    parser.add_argument("--canvas-export", type=Path, help="Canvas's own gradebook export (what Canvas holds now)")
    parser.add_argument("--include-pending", action="store_true",
                        help="export totals even where written answers are not graded yet")
    parser.add_argument("--db-url", help="the gradebook, when the batch used --db-url (for --comments)")
    arguments = parser.parse_args(argv)
    if not (arguments.class_dir / "scores.csv").exists():
        parser.error(f"{arguments.class_dir} has no scores.csv: grade the class first")
    titles = dict(item.split("=", 1) for item in arguments.title if "=" in item)
    try:
        scale = parse_scale(arguments.scale_to)
        result = export(arguments.class_dir.resolve(), titles, arguments.include_pending, scale_to=scale,
                        comments=arguments.comments, overwrite=arguments.overwrite,
                        canvas_export=arguments.canvas_export, db_url=arguments.db_url)
    except (ValueError, SheetError) as error:
        parser.error(str(error))
    for path in result.files:
        print(f"wrote {path}")
    for note in result.notes:
        print(f"note: {note}")
    if not result.files:
        print("no LMS file written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
