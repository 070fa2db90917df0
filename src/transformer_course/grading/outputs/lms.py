"""Grades for the LMS: files that Canvas's and Moodle's own imports read, from scores.csv.

    python -m transformer_course.grading.lms CLASS_DIR [--update [--replace-lms-edits] | --overwrite]
        [--canvas-export EXPORT.csv] [--moodle-export STAGE=WORKSHEET.csv ...]
        [--scale-to 100 | --scale-to 02_attention=20 ...] [--title 02_attention="Stage 2 (4711)"]
        [--comments] [--include-pending] [--db-url URL]

Students are matched by the LMS ids the batch command read from the download's file names (the
`lms_id` column of scores.csv, and the `file` column, which tells which LMS named the file).

**Mistakes are refused, and nothing is written then.** A stage name that is no stage of scores.csv (in
--scale-to, --title or --moodle-export), a --title or a stage that Canvas's export has no assignment for, a
maximum that contradicts the LMS's, a Moodle maximum nobody gave: the command says what is wrong, with the
valid names, exits with status 2 and leaves CLASS_DIR/lms/ as it was. A run that succeeds leaves in lms/
exactly the files of this upload: a file an earlier run wrote and this one does not (a comments zip, a
stage with nothing to upload now) is removed, so nothing stale is uploaded by mistake.

**Weekly: --update.** CLASS_DIR/lms/uploaded.json records every grade written for upload (`lms_ledger`).
With the LMS's exports of now (--canvas-export; --moodle-export per stage), --update writes only what
differs from what the LMS holds: a grade the LMS has none of, or a grade this command wrote before (a
regrade, hand grades since). A grade the LMS holds that this command never wrote was given or changed in
the LMS: it is kept, and listed; --replace-lms-edits replaces those too. Every difference from what the LMS
holds is listed per student, with what was done. Without --update, the first upload fills what the LMS
has no grade for and keeps every grade it holds (listed when its export is given), and --overwrite
replaces every grade it holds.

**Canvas** (Grades > Import): CLASS_DIR/lms/canvas_<stage>.csv, one file per stage, in the layout of
Canvas's own gradebook export: `Student, ID, SIS User ID, SIS Login ID, Section`, the stage's column, and
a second row `Points Possible`. `ID` is the Canvas user id from the download (`name_<user id>_<file
id>_...`), which is what Canvas matches a row by; the name, SIS ids and section are filled from Canvas's
export when it is given (its importer falls back on them), else the name is the download's. A file lists
only students with a grade to give, so it has no empty score: Canvas counts an empty score as a change
against a score it holds. With Canvas's export
(Grades > Export > Export Entire Gradebook, --canvas-export), the column is the stage's existing assignment
under the export's exact header (`lms_exports.canvas_column`: "Stage 2: Attention (4711)" is 02_attention)
and its points possible are the maximum; without it, only --overwrite writes Canvas files, titled by the
stage or --title (a title Canvas does not know makes it create an assignment). Students under anonymous
grading (`anon_...` ids) cannot be matched and are left out, with a note. With --comments,
CLASS_DIR/lms/canvas_comments_<stage>.zip holds one text file per student whose comment is new or changed
since the last upload, for the assignment's "Re-upload submissions", named like the student's downloaded
file (Canvas attaches each to the submission of the user and file ids in its name).

**Moodle** (Assignment > View all submissions > Grading action: Upload grading worksheet, with the
"Offline grading worksheet" feedback type on): CLASS_DIR/lms/moodle_<stage>.csv per stage, Moodle's
worksheet layout: `Identifier` ("Participant N"), `Full name`, `Grade`, `Maximum grade`, `Last modified
(grade)`, and `Feedback comments` only with --comments (Moodle's import replaces the comments of every row
of a sheet that has that column; a comment changed in Moodle is written back as Moodle holds it, and
listed). Moodle skips a row whose grade it changed after the sheet's `Last modified (grade)`: without
--update or --overwrite the sheet says 2000-01-01, so Moodle keeps every grade it already holds and fills
only the others; with --overwrite it says now, and the rows written replace Moodle's; with --update it says
when Moodle's worksheet was downloaded (its file's time), so a grade changed in Moodle after that, which
the run could not see, is kept by Moodle as well. Moodle's maximum grade
(100 unless the assignment says otherwise) must be known: from the worksheet Moodle downloads
(--moodle-export STAGE=FILE, its `Maximum grade`), or given with --scale-to; without either the command
refuses, rather than send 39.5 of 41 points as 39.5/100. Each stage is its own worksheet (a Moodle
download names students by a participant id of that one assignment). Upload with Moodle in English.

**Points or the LMS's scale.** A grade is total / the stage's points x the LMS assignment's maximum,
computed in decimal and rounded half up to the LMS's decimals (8.125 is 8.13: `lms_exports.half_up`): the
maximum is --scale-to's (`--scale-to 100` for every stage, `--scale-to 02_attention=20` for one), else the
LMS export's (Canvas's points possible, Moodle's maximum grade), else (Canvas only) the course's points.
A --scale-to that differs from the export's maximum is refused. Extra credit (a grade cell marked
`credit="extra"`) is in the total and not in the stage's points, so a grade may exceed the maximum: Canvas gets
it as it is (scaled like any other; Canvas keeps a score above points possible), Moodle gets the maximum (its
worksheet import skips a grade above the maximum), and a note lists them; optional cells count in neither.

**Comments** (--comments): the instructor's comments on the written answers (from the gradebook) and a
one-line summary of the checks not passed, as HTML text for Moodle (every character a student or
instructor typed is escaped) and plain text for Canvas.

CSV files start with a UTF-8 byte-order mark (Excel opens them as UTF-8; Canvas's and Moodle's imports
accept it, as Canvas's own export carries one). A stage whose written answers are not all graded is left
out for that student and listed; --include-pending exports the points so far. Students with no LMS id in
their file names are listed, not exported.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import io
import os
import sys
import tempfile
import zipfile
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path, PurePosixPath

from transformer_course.grading.gradebook.config import default_db_url
from transformer_course.grading.intake.identities import identify
from transformer_course.grading.outputs.lms_exports import (
    LMS_DECIMALS,
    CanvasColumn,
    CanvasExport,
    CanvasPerson,
    LmsError,
    MoodleWorksheet,
    canvas_column,
    half_up,
    number,
    read_canvas_export,
    read_moodle_worksheet,
    same,
    shown,
)
from transformer_course.grading.outputs.lms_ledger import EDITED, EMPTY, OURS, SAME, Ledger, compare, digest
from transformer_course.grading.outputs.report import grade_cells
from transformer_course.grading.outputs.roster import Roster, RosterError, class_roster
from transformer_course.grading.outputs.scores import pending, read_csv
from transformer_course.grading.outputs.spreadsheet import protect, read_table, write_csv

CANVAS_STUDENT_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
MOODLE_COLUMNS = ("Identifier", "Full name", "Grade", "Maximum grade", "Last modified (grade)")
MOODLE_COMMENTS = "Feedback comments"
MOODLE_KEEP = "2000-01-01 00:00:00"  # older than any grade Moodle holds: its import keeps them all
GRADED = ("graded", "skipped")
OUR_FILES = ("canvas_*.csv", "canvas_comments_*.zip", "moodle_*.csv")  # what lms/ holds of ours, but the record
FILL, OVERWRITE, UPDATE = "fill", "overwrite", "update"


@dataclass
class Difference:
    """A grade the LMS holds (or lacks) that is not the course's grade now, and what this upload does."""

    lms: str
    stage: str
    student: str
    lms_id: str
    held: str  # what the LMS holds, as exported ("" none)
    sent: str  # what this command last wrote ("" never)
    now: float  # the course's grade now, on the LMS's scale
    action: str

    def line(self) -> str:
        lms = self.lms.capitalize()
        held = f"{lms} holds {self.held}" if self.held else f"{lms} has no grade"
        sent = f", last uploaded {self.sent}" if self.sent else ""
        return f"{self.stage}: {held}{sent}, course now {_points(self.now)}: {self.action}"


@dataclass
class Export:
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)  # files of an earlier run, not part of this upload
    differences: list[Difference] = field(default_factory=list)
    left_out: dict[str, list[str]] = field(default_factory=dict)  # {student: why a row of theirs is in no file}
    held: set[tuple[str, str]] = field(default_factory=set)  # (stage, LMS id): the LMS holds the course's grade
    who: dict[str, str] = field(default_factory=dict)  # {LMS id: student}, of every row of scores.csv
    holds: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # {(lms, stage): what its export holds}
    dropped: dict[Path, list[str]] = field(default_factory=dict)  # {removed file: what it held this upload lacks}

    def leave_out(self, student: str, why: str) -> None:
        """Note that a row of STUDENT is in no file of this upload, and WHY."""
        reasons = self.left_out.setdefault(student, [])
        if why not in reasons:
            reasons.append(why)

    def by_student(self) -> dict[str, list[Difference]]:
        grouped: dict[str, list[Difference]] = defaultdict(list)
        for difference in self.differences:
            grouped[difference.student].append(difference)
        return dict(sorted(grouped.items()))


@dataclass
class Grade:
    student: str
    assignment: str
    name: str
    lms_id: str
    file: str
    total: float  # the course's points
    points: float  # the stage's maximum, in the course's points
    comment: str = ""  # plain text, one item a line

    def on(self, maximum: float, decimals: int = LMS_DECIMALS) -> float:
        """The grade on an LMS assignment whose maximum is MAXIMUM, rounded half up to DECIMALS (the LMS's):
        computed in decimal, so 32.5 of 40 points on a 10-point assignment is 8.125, which is 8.13."""
        if not self.points:
            return 0.0
        total = Decimal(repr(self.total))
        exact = total if maximum == self.points else total / Decimal(repr(self.points)) * Decimal(repr(maximum))
        return half_up(exact, decimals)


def _points(value: float, decimals: int = LMS_DECIMALS) -> str:
    return shown(value, decimals)


def _lms(row: dict[str, str], assignment_ids: list[str]) -> str:
    """Which LMS the student's id is of ("canvas", "moodle" or ""): scores.csv's `lms` (the batch writes it,
    also for a student the roster named), else the LMS that named the file."""
    if row.get("lms") and row.get("lms_id"):
        return row["lms"]
    if not row.get("file"):
        return ""
    return identify(PurePosixPath(row["file"]), assignment_ids)[0].lms


def parse_scale(items: list[str]) -> dict[str, float]:
    """{stage or "": maximum} from --scale-to values ("100" for every stage, "02_attention=20")."""
    scale = {}
    for item in items:
        stage, _, text = item.rpartition("=")
        value = number(text)
        if value is None or value <= 0:
            raise LmsError(f"--scale-to {item!r}: give a positive number, or STAGE=NUMBER")
        scale[stage.strip()] = value
    return scale


def parse_pairs(option: str, items: list[str]) -> dict[str, str]:
    """{stage: value} from STAGE=VALUE items of OPTION (`LmsError` for an item without "=")."""
    pairs = {}
    for item in items:
        stage, equals, value = item.partition("=")
        if not equals or not stage.strip() or not value.strip():
            raise LmsError(f"{option} {item!r}: give STAGE=VALUE, e.g. {option} 02_attention=...")
        pairs[stage.strip()] = value.strip()
    return pairs


def _check_stages(stages: list[str], named: dict[str, dict]) -> None:
    """Every stage an option names is a stage of scores.csv."""
    for option, values in named.items():
        unknown = sorted(stage for stage in values if stage and stage not in stages)
        if unknown:
            raise LmsError(f"{option} names {', '.join(map(repr, unknown))}, which is no stage of scores.csv; the "
                           f"stages are {', '.join(stages) or 'none'}")


def export(class_dir: Path, titles: dict[str, str] | None = None, include_pending: bool = False, *,
           scale_to: dict[str, float] | None = None, comments: bool = False, overwrite: bool = False,
           canvas_export: Path | None = None, moodle_exports: dict[str, Path] | None = None,
           update: bool = False, replace_lms_edits: bool = False, db_url: str | None = None,
           now: datetime | None = None) -> Export:
    """Write CLASS_DIR/lms/ for this upload (see the module's docstring). A mistake raises `LmsError` before
    anything is written."""
    rows = read_csv(class_dir / "scores.csv")
    titles, scale_to, moodle_exports = titles or {}, scale_to or {}, moodle_exports or {}
    stages = sorted({row["assignment"] for row in rows if row.get("assignment") not in (None, "", "?")})
    _check_stages(stages, {"--scale-to": scale_to, "--title": titles, "--moodle-export": moodle_exports})
    if update and overwrite:
        raise LmsError("--update and --overwrite contradict each other: --update keeps the grades changed in the "
                       "LMS (and lists them), --overwrite replaces every grade the LMS holds")
    if replace_lms_edits and not update:
        raise LmsError("--replace-lms-edits goes with --update (--overwrite replaces every grade anyway)")
    folder = class_dir / "lms"
    try:
        ledger = Ledger.load(folder)
    except ValueError as error:
        raise LmsError(str(error)) from None
    canvas = read_canvas_export(canvas_export) if canvas_export is not None else None
    worksheets = {stage: read_moodle_worksheet(Path(path), stage) for stage, path in moodle_exports.items()}
    result = Export()
    grades = _grades(class_dir, rows, stages, include_pending, comments, db_url, result)
    if update and grades["canvas"] and canvas is None:
        raise LmsError("--update compares with what Canvas holds: give Canvas's gradebook export of now with "
                       "--canvas-export (Grades > Export > Export Entire Gradebook)")
    missing = sorted(set(grades["moodle"]) - set(worksheets)) if update else []
    if missing:
        raise LmsError("--update compares with what Moodle holds: give the grading worksheet of "
                       + ", ".join(missing) + " with --moodle-export STAGE=WORKSHEET.csv (the assignment's View all "
                       "submissions > Grading action > Download grading worksheet)")
    plan = Plan(folder, UPDATE if update else OVERWRITE if overwrite else FILL, replace_lms_edits, comments, ledger,
                now or datetime.now(), result, _roster(class_dir))
    outputs = [*_canvas(plan, grades["canvas"], titles, scale_to, canvas),
               *_moodle(plan, grades["moodle"], scale_to, worksheets)]
    for stage in stages:  # what the LMS holds now: an earlier file's grade it holds is not lost with the file
        if canvas is not None:
            with contextlib.suppress(LmsError):
                result.holds["canvas", stage] = canvas_column(canvas, stage, titles.get(stage)).scores
        if stage in worksheets:
            result.holds["moodle", stage] = worksheets[stage].grades
    _write(folder, outputs, result)  # nothing was written before this line
    ledger.save(folder)
    return result


def _grades(class_dir: Path, rows: list[dict[str, str]], stages: list[str], include_pending: bool, comments: bool,
            db_url: str | None, result: Export) -> dict[str, dict[str, list[Grade]]]:
    """{"canvas" / "moodle": {stage: [Grade]}} of every graded row with an LMS id."""
    points: dict[str, float] = {}
    for row in rows:
        top = number(row.get("max", ""))
        if top is not None:
            points[row["assignment"]] = max(points.get(row["assignment"], 0.0), top)
    notes = _comments(class_dir, rows, db_url) if comments else {}
    grades: dict[str, dict[str, list[Grade]]] = {"canvas": defaultdict(list), "moodle": defaultdict(list)}
    others = set()
    penalised = 0
    for row in rows:
        total = number(row.get("total", ""))
        stage = row.get("assignment") or "?"
        if row.get("lms_id"):
            result.who[row["lms_id"]] = row["student"]
        if row.get("status") not in GRADED or total is None or stage not in points:
            why = (row.get("reasons") or "").split("; ")[0][:160]
            result.leave_out(row["student"], f"{stage}: not graded (status: {row.get('status') or 'none'}"
                                             + (f": {why}" if why else "") + ")")
            continue
        after = number(row.get("total_after_penalty", ""))  # a late penalty (outputs/deadlines.py)
        if after is not None and after != total:
            total, penalised = after, penalised + 1
        if pending(row) and not include_pending:
            result.notes.append(f"{row['student']} {stage}: written answers not graded yet, left out")
            result.leave_out(row["student"], f"{stage}: written answers not graded yet (--include-pending exports "
                                             "the points so far)")
            continue
        lms = _lms(row, stages)
        if lms not in grades:
            others.add(row["student"])
            result.leave_out(row["student"], f"{stage}: no LMS id in the file's name ({row.get('file', '')}), so no "
                                             "LMS row to match")
            continue
        grades[lms][row["assignment"]].append(Grade(
            row["student"], row["assignment"], row.get("name", ""), row.get("lms_id", ""), row.get("file", ""), total,
            points[row["assignment"]], notes.get((row["student"], row["assignment"]), "")))
    over = sorted(f"{grade.student} {grade.assignment}" for lms in grades.values() for stage in lms.values()
                  for grade in stage if grade.total > grade.points)
    if over:  # extra credit (a grade cell marked credit="extra"): in the score, not in the maximum
        result.notes.append(f"{len(over)} grade(s) above the stage's maximum through extra credit, sent as they are: "
                            + ", ".join(over) + " (Canvas keeps a score above points possible; Moodle's worksheet "
                            "import skips a grade above the maximum, so Moodle gets the maximum)")
    if penalised:
        result.notes.append(f"{penalised} grade(s) carry a late penalty (scores.csv: late, late_penalty, "
                            "total_after_penalty)")
    if others:
        result.notes.append(f"{len(others)} student(s) have no LMS id in their file names (not in any LMS file): "
                            + ", ".join(sorted(others))
                            + " (a roster, the batch command's --roster, gives notebooks that came by email or on a "
                            "USB stick their LMS id)")
    return grades


def _maximum(lms: str, stage: str, scale_to: dict[str, float], held: float | None, source: str) -> float | None:
    """The LMS assignment's maximum: --scale-to's, else the export's (HELD); `LmsError` when they differ."""
    given = scale_to.get(stage, scale_to.get(""))
    if given is not None and held is not None and half_up(given) != half_up(held):
        raise LmsError(f"{stage}: --scale-to says {given:g}, but the {lms} assignment's maximum is {held:g} "
                       f"({source}): pass --scale-to {stage}={held:g}, or leave --scale-to out for this stage")
    return given if given is not None else held


# --- deciding, cell by cell ----------------------------------------------------------------------------

@dataclass
class Plan:
    folder: Path
    mode: str  # FILL, OVERWRITE or UPDATE
    replace_edits: bool
    comments: bool
    ledger: Ledger
    now: datetime
    result: Export
    roster: Roster | None = None  # the class's roster (CLASS/term.json): SIS columns when no Canvas export is given

    def decide(self, lms: str, grade: Grade, value: float, held: str | None, known: bool) -> bool:
        """Whether this upload writes VALUE for GRADE's student; lists what differs from what the LMS holds
        (HELD; KNOWN: from its export) and records what is written."""
        sent = self.ledger.get(lms, grade.assignment, grade.lms_id)
        if not known:
            self.ledger.record(lms, grade.assignment, grade.lms_id, value, at=self.now)
            return True
        state = compare(value, held, sent)
        if state == SAME:
            self.result.held.add((grade.assignment, grade.lms_id))
        else:
            write, action = self._action(lms, state, sent is not None and bool(sent.values))
            last = f"{_points(sent.values[0])} ({sent.at[:10]})" if sent and sent.values else ""
            self.result.differences.append(Difference(lms, grade.assignment, grade.student, grade.lms_id,
                                                      (held or "").strip(), last, value, action))
            if not write:
                self.result.leave_out(grade.student, f"{grade.assignment}: {lms.capitalize()} holds "
                                                     f"{(held or '').strip()}, course now {_points(value)}: {action}")
                return False
        self.ledger.record(lms, grade.assignment, grade.lms_id, value, at=self.now)
        return state != SAME

    def _action(self, lms: str, state: str, uploaded: bool) -> tuple[bool, str]:
        name = lms.capitalize()
        if state == EMPTY:
            return True, "written"
        if state == OURS:
            if self.mode == FILL:
                return False, "kept (an earlier upload of ours): --update writes the grade now"
            return True, "written (replaces an earlier upload of ours)"
        assert state == EDITED
        how = f"changed in {name} after the last upload" if uploaded else f"given in {name}, never uploaded by us"
        if self.mode == OVERWRITE:
            return True, f"replaced (--overwrite), although {how}"
        if self.mode == UPDATE and self.replace_edits:
            return True, f"replaced (--replace-lms-edits), although {how}"
        if self.mode == UPDATE:
            return False, f"kept: {how} (--replace-lms-edits replaces it)"
        return False, f"kept: {how} (--update --replace-lms-edits, or --overwrite, replaces it)"

    def new_comment(self, lms: str, grade: Grade, text: str) -> bool:
        """Whether TEXT is not the comment last written for this student (then it is recorded as written)."""
        sent = self.ledger.get(lms, grade.assignment, grade.lms_id)
        if not digest(text) or digest(text) == (sent.comment if sent else ""):
            return False
        self.ledger.record(lms, grade.assignment, grade.lms_id, comment=text, at=self.now)
        return True


@dataclass
class Output:
    path: Path
    rows: list[list[str]] | None = None  # a CSV
    data: bytes = b""  # else these bytes


def _write(folder: Path, outputs: list[Output], result: Export) -> None:
    """Write this upload's files, then remove the files of ours that it does not have (an earlier run's)."""
    folder.mkdir(parents=True, exist_ok=True)
    for output in outputs:
        if output.rows is not None:
            write_csv(output.path, output.rows)
        else:
            descriptor, temporary = tempfile.mkstemp(prefix=f".{output.path.name}.", suffix=".part", dir=folder)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(output.data)
            os.chmod(temporary, 0o644)
            os.replace(temporary, output.path)
        result.files.append(output.path)
    written = {output.path for output in outputs}
    for pattern in OUR_FILES:
        for path in sorted(folder.glob(pattern)):
            if path not in written:
                lacking = _not_carried(path, outputs, result)
                if lacking:
                    result.dropped[path] = lacking
                path.unlink()
                result.removed.append(path)


def _grades_in(path: Path) -> dict[str, str]:
    """{LMS id: grade} of one of our upload files (Canvas: the `ID` column; Moodle: `Participant N`)."""
    if path.suffix != ".csv":
        return {}
    try:
        table = read_table(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not table:
        return {}
    header = table[0]
    if header[:1] == ["Identifier"] and "Grade" in header:
        column = header.index("Grade")
        return {line[0].removeprefix("Participant ").strip(): line[column] for line in table[1:]
                if len(line) > column and line[0].startswith("Participant ")}
    if "ID" in header and len(header) > len(CANVAS_STUDENT_COLUMNS):
        position, column = header.index("ID"), len(CANVAS_STUDENT_COLUMNS)
        return {line[position]: line[column] for line in table[2:] if len(line) > column and line[position]}
    return {}


def _not_carried(path: Path, outputs: list[Output], result: Export) -> list[str]:
    """What an earlier run's file held that this upload carries neither in its files nor as held by the LMS (its
    export): each grade with who it is and why it is not here (`Export.left_out`, or what the LMS holds)."""
    earlier = _grades_in(path)
    if not earlier:
        return []
    lms, _, stage = path.stem.partition("_")
    held = result.holds.get((lms, stage), {})
    now = next((_rows_of(output) for output in outputs if output.path == path), {})
    differences = {difference.lms_id: difference for difference in result.differences if difference.stage == stage}
    lacking = []
    for lms_id, value in sorted(earlier.items()):
        if lms_id in now or (stage, lms_id) in result.held or same(number(held.get(lms_id)), number(value)):
            continue  # in this upload, the LMS holds the course's grade now, or it holds this very grade
        student = result.who.get(lms_id, "")
        reasons = [reason for reason in result.left_out.get(student, []) if reason.startswith(f"{stage}:")]
        reason = (differences[lms_id].line() if lms_id in differences else "; ".join(reasons)
                  or "no row of scores.csv has this LMS id any more")
        lacking.append(f"{student or 'LMS id'} ({lms_id}): {value}, {reason}")
    return lacking


def _rows_of(output: Output) -> dict[str, str]:
    return {} if output.rows is None else {str(line[1]): str(line[-1]) for line in output.rows[2:]}


# --- Canvas ------------------------------------------------------------------------------------------

def _canvas(plan: Plan, by_stage: dict[str, list[Grade]], titles: dict[str, str], scale_to: dict[str, float],
            export: CanvasExport | None) -> list[Output]:
    if not by_stage:
        return []
    if export is None and plan.mode == FILL:
        plan.result.notes.append("Canvas files not written: to leave the scores Canvas holds as they are, give "
                                 "Canvas's own export (Grades > Export > Export Entire Gradebook) with "
                                 "--canvas-export, or pass --overwrite to replace them")
        return []
    if export is None and not scale_to:
        plan.result.notes.append("Canvas grades are the course's points (" + ", ".join(
            f"{stage}: of {_points(grades[0].points)}" for stage, grades in sorted(by_stage.items())) + "); if a "
            "Canvas assignment has another maximum, give --canvas-export (its points possible are used) or --scale-to")
    outputs = []
    for stage, grades in sorted(by_stage.items()):
        column: CanvasColumn | None = canvas_column(export, stage, titles.get(stage)) if export else None
        held_maximum = column.points if column else None
        maximum = _maximum("Canvas", stage, scale_to, held_maximum, f"Points Possible in {export.name}"
                           if export else "") or grades[0].points
        _scaled_note(plan, "Canvas", stage, grades[0], maximum, held_maximum, scale_to)
        rows: dict[str, tuple[Grade, float]] = {}
        attach = []
        for grade in grades:
            if grade.lms_id.startswith("anon_"):
                plan.result.notes.append(f"{grade.student}: anonymous Canvas id {grade.lms_id}, not importable by id; "
                                         "left out of the Canvas file")
                plan.result.leave_out(grade.student, f"{stage}: anonymous Canvas id {grade.lms_id}, which Canvas's "
                                                     "import cannot match")
                continue
            if export is not None and grade.lms_id not in export.users:
                plan.result.notes.append(f"{grade.student}: Canvas user {grade.lms_id} is not in Canvas's export "
                                         f"{export.name} (dropped, or in another course?): left out")
                plan.result.leave_out(grade.student, f"{stage}: Canvas user {grade.lms_id} is not in Canvas's "
                                                     f"export {export.name}")
                continue
            value = grade.on(maximum)
            if plan.decide("canvas", grade, value, column.scores.get(grade.lms_id) if column else None,
                           known=export is not None):
                rows[grade.lms_id] = (grade, value)
            if plan.comments and plan.new_comment("canvas", grade, grade.comment):
                attach.append(grade)
        if rows:
            header = column.header if column else protect(titles.get(stage, stage))  # the export's, exactly
            table = [[*CANVAS_STUDENT_COLUMNS, header], ["Points Possible", "", "", "", "", _points(maximum)]]
            for lms_id, (grade, value) in sorted(rows.items(), key=lambda item: _order(item[0])):
                person = _canvas_person(grade, export, plan.roster)
                table.append([protect(person.name), lms_id, protect(person.sis_user_id), protect(person.sis_login_id),
                              protect(person.section), _points(value)])
            outputs.append(Output(plan.folder / f"canvas_{stage}.csv", table))
        if attach:
            outputs.append(Output(plan.folder / f"canvas_comments_{stage}.zip", data=_canvas_comments(attach)))
    return outputs


def _canvas_person(grade: Grade, export: CanvasExport | None, roster: Roster | None = None) -> CanvasPerson:
    """The student columns of GRADE's row in a Canvas file: as Canvas's export has them (its sortable name,
    SIS ids, section), else as the class's roster has them, else the name the download gave. Canvas matches the
    row by ID; its importer falls back on the SIS ids, then on the name, so these columns are what a person and
    Canvas recognise the row by."""
    held = export.people.get(grade.lms_id) if export is not None else None
    if held is not None and held.name:
        return held
    listed = roster.by_id.get(grade.lms_id) if roster is not None else None
    if listed is not None:
        return CanvasPerson(listed.name or grade.name, listed.sis_user_id, listed.sis_login_id, listed.section)
    return CanvasPerson(grade.name, *((held.sis_user_id, held.sis_login_id, held.section) if held is not None else ()))


def _roster(class_dir: Path) -> Roster | None:
    try:
        return class_roster(class_dir)
    except RosterError as error:
        raise LmsError(f"the class's roster (recorded in {class_dir / 'term.json'}): {error}") from None


def _order(lms_id: str) -> int:
    return int(lms_id) if lms_id.isdigit() else 0


def _scaled_note(plan: Plan, lms: str, stage: str, grade: Grade, maximum: float, held: float | None,
                 scale_to: dict[str, float]) -> None:
    if maximum == grade.points:
        return
    source = "--scale-to" if stage in scale_to or "" in scale_to else f"the maximum in {lms}'s export"
    plan.result.notes.append(f"{stage} ({lms}): grades on {_points(maximum)} points ({source}), not the course's "
                             f"{_points(grade.points)}: {_points(grade.total)} points is {_points(grade.on(maximum))}")


def _canvas_comments(grades: list[Grade]) -> bytes:
    """A zip for Canvas's "Re-upload submissions": a text file per student, named like their download (the
    user id and the file id Canvas reads from the name come first)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for grade in grades:
            stem = PurePosixPath(grade.file).name.rsplit(".", 1)[0]
            archive.writestr(f"{stem}_comments.txt", grade.comment + "\n")
    return buffer.getvalue()


# --- Moodle ------------------------------------------------------------------------------------------

def _moodle(plan: Plan, by_stage: dict[str, list[Grade]], scale_to: dict[str, float],
            worksheets: dict[str, MoodleWorksheet]) -> list[Output]:
    unknown = {stage: grades[0].points for stage, grades in by_stage.items()
               if _maximum("Moodle", stage, scale_to, worksheets[stage].maximum if stage in worksheets else None,
                           worksheets[stage].name if stage in worksheets else "") is None}
    given = [worksheets[stage].lacks_maximum() for stage in unknown if stage in worksheets]
    if given:
        raise LmsError("Moodle's maximum grade is not in the worksheet given: " + "; ".join(given) + ". Give the "
                       "assignment's maximum grade with " + " ".join(
                           f"--scale-to {stage}={_points(points)}" for stage, points in unknown.items()
                           if stage in worksheets) + " (the course's points; write the maximum Moodle shows for it)")
    if unknown:
        raise LmsError("Moodle's maximum grade of " + ", ".join(unknown) + " is unknown (Moodle's default is 100, "
                       "so 39.5 of 41 points would arrive as 39.5/100): give each stage's grading worksheet, which "
                       "says it (--moodle-export STAGE=WORKSHEET.csv), or the assignment's maximum grade ("
                       + " ".join(f"--scale-to {stage}={_points(points)}" for stage, points in unknown.items())
                       + " when it is the course's points)")
    outputs = []
    for stage, grades in sorted(by_stage.items()):
        sheet = worksheets.get(stage)
        stamp = _moodle_stamp(plan, sheet)
        maximum = _maximum("Moodle", stage, scale_to, sheet.maximum if sheet else None, sheet.name if sheet else "")
        assert maximum is not None
        decimals = sheet.decimals if sheet is not None and sheet.decimals is not None else LMS_DECIMALS
        _scaled_note(plan, "Moodle", stage, grades[0], maximum, sheet.maximum if sheet else None, scale_to)
        if sheet is not None and not sheet.participants & {grade.lms_id for grade in grades}:
            raise LmsError(f"--moodle-export {stage}={sheet.name}: none of its participants handed in {stage}: "
                           "is it the worksheet of another assignment? (Moodle numbers participants per assignment)")
        lines = []
        for grade in sorted(grades, key=lambda g: _order(g.lms_id)):
            if sheet is not None and grade.lms_id not in sheet.participants:
                plan.result.notes.append(f"{grade.student}: Participant {grade.lms_id} is not in Moodle's worksheet "
                                         f"{sheet.name} of {stage}: left out")
                plan.result.leave_out(grade.student, f"{stage}: Participant {grade.lms_id} is not in Moodle's "
                                                     f"worksheet {sheet.name}")
                continue
            value = grade.on(maximum, decimals)
            if value > maximum:  # extra credit: Moodle's worksheet import skips a grade above the maximum
                plan.result.notes.append(f"{grade.student} {stage} (moodle): {_points(value, decimals)} with extra "
                                         f"credit, sent as the maximum {_points(maximum, decimals)}")
                value = maximum
            held = sheet.grades.get(grade.lms_id) if sheet else None
            write = plan.decide("moodle", grade, value, held, known=sheet is not None)
            comment, changed = _moodle_comment(plan, grade, sheet) if plan.comments else ("", False)
            if not (write or (changed and plan.mode != FILL)):
                continue
            cell = _points(value, decimals) if write or held is None else held  # a kept grade: as Moodle holds it
            name = sheet.names.get(grade.lms_id, grade.name) if sheet is not None else grade.name
            lines.append([f"Participant {grade.lms_id}", protect(name), cell, _points(maximum, decimals), stamp,
                          *([comment] if plan.comments else [])])
            if plan.comments and changed:
                plan.ledger.record("moodle", stage, grade.lms_id, comment=comment, at=plan.now)
        if lines:
            header = [*MOODLE_COLUMNS, *([MOODLE_COMMENTS] if plan.comments else [])]
            outputs.append(Output(plan.folder / f"moodle_{stage}.csv", [header, *lines]))
    if outputs and plan.mode == FILL:
        plan.result.notes.append("Moodle worksheets say 'Last modified (grade)' 2000-01-01: Moodle keeps every grade "
                                 "it already holds and fills the others (--update writes regrades, --overwrite "
                                 "replaces them)")
    return outputs


def _moodle_stamp(plan: Plan, sheet: MoodleWorksheet | None) -> str:
    """The sheet's `Last modified (grade)`. Moodle skips a row whose grade it changed after it: 2000-01-01
    keeps every grade Moodle holds (the first upload); --overwrite says now; --update says when the worksheet
    was downloaded, so a grade changed in Moodle after the download, which this run could not see, is kept
    by Moodle too."""
    if plan.mode == FILL:
        return MOODLE_KEEP
    when = min(plan.now, sheet.downloaded) if plan.mode == UPDATE and sheet is not None else plan.now
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _moodle_comment(plan: Plan, grade: Grade, sheet: MoodleWorksheet | None) -> tuple[str, bool]:
    """(the row's `Feedback comments`, whether it is ours and differs from what Moodle holds or, without its
    worksheet, from what was last written). A comment changed in Moodle since the last upload is sent back
    as Moodle holds it (Moodle's import replaces the comment of every row), unless --overwrite or
    --replace-lms-edits."""
    ours = _moodle_html(grade.comment)
    sent = plan.ledger.get("moodle", grade.assignment, grade.lms_id)
    last = sent.comment if sent else ""
    held = sheet.comments.get(grade.lms_id, "") if sheet else ""
    edited = bool(held) and digest(held) not in (last, digest(ours))
    if edited and not (plan.mode == OVERWRITE or plan.replace_edits):
        plan.result.notes.append(f"{grade.student} {grade.assignment}: the feedback comment was changed in Moodle "
                                 "since the last upload: sent back as Moodle holds it (--replace-lms-edits replaces "
                                 "it)")
        return held, False
    return ours, digest(ours) != (digest(held) if sheet is not None else last)


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
        position = {cell.grade_id: index for index, cell in enumerate((c for c in stage_cells if c.written), 1)}
        lines = [f"Question {position.get(name, '?')} ({name}): {text}"
                 for name, text in sorted(written.get(key, []), key=lambda item: position.get(item[0], 99))]
        checks = [cell for cell in stage_cells if not cell.written and not cell.extra]
        failed = [cell.grade_id for cell in checks if (number(row.get(cell.grade_id, "")) or 0.0) < cell.points]
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
    parser.add_argument("--update", action="store_true",
                        help="weekly: write only what differs from what the LMS holds (its exports), keep and list "
                             "grades changed in the LMS")
    parser.add_argument("--replace-lms-edits", action="store_true",
                        help="with --update: replace the grades changed in the LMS too")
    parser.add_argument("--overwrite", action="store_true", help="replace every grade the LMS already holds")
    parser.add_argument("--canvas-export", type=Path, help="Canvas's own gradebook export (what Canvas holds now)")
    parser.add_argument("--moodle-export", action="append", default=[], metavar="STAGE=WORKSHEET.csv",
                        help="the grading worksheet Moodle downloads for a stage's assignment (what it holds, its "
                             "maximum grade)")
    parser.add_argument("--scale-to", action="append", default=[], metavar="[STAGE=]MAXIMUM",
                        help="the LMS assignment's maximum: grades become total / maximum x this (all stages, or one)")
    parser.add_argument("--title", action="append", default=[], metavar="STAGE=TITLE",
                        help="the Canvas column of a stage: its exact header, its title or its assignment id")
    parser.add_argument("--comments", action="store_true",
                        help="add the comments on written answers and a summary of the checks not passed")
    parser.add_argument("--include-pending", action="store_true",
                        help="export totals even where written answers are not graded yet")
    parser.add_argument("--db-url", help="the gradebook, when the batch used --db-url (for --comments)")
    arguments = parser.parse_args(argv)
    if not (arguments.class_dir / "scores.csv").exists():
        parser.error(f"{arguments.class_dir} has no scores.csv: grade the class first")
    try:
        result = export(arguments.class_dir.resolve(), parse_pairs("--title", arguments.title),
                        arguments.include_pending, scale_to=parse_scale(arguments.scale_to),
                        comments=arguments.comments, overwrite=arguments.overwrite,
                        canvas_export=arguments.canvas_export,
                        moodle_exports={stage: Path(path) for stage, path in
                                        parse_pairs("--moodle-export", arguments.moodle_export).items()},
                        update=arguments.update, replace_lms_edits=arguments.replace_lms_edits,
                        db_url=arguments.db_url)
    except LmsError as error:
        print(f"error: {error}\nnothing was written", file=sys.stderr)
        return 2
    for path in result.files:
        print(f"wrote {path}")
    for path in result.removed:
        lacking = result.dropped.get(path)
        print(f"removed {path} (an earlier run's, not part of this upload)" + (
            ": it held grades that this upload does not carry: " + "; ".join(lacking) if lacking else ""))
    grouped = result.by_student()
    if grouped:
        print("what differs from what the LMS holds, per student:")
        for student, differences in grouped.items():
            print(f"  {student}:")
            for difference in differences:
                print(f"    {difference.line()}")
    for note in result.notes:
        print(f"note: {note}")
    if result.left_out:
        print("left out of this upload, per student:")
        for student, reasons in sorted(result.left_out.items()):
            print(f"  {student}: " + "; ".join(reasons))
    for stage in sorted({stage for stage, _ in result.held}):
        count = sum(held == stage for held, _ in result.held)
        print(f"{stage}: {count} grade(s) the LMS holds already, as the course gives them now (not written again)")
    if not result.files:
        print("no LMS file written: nothing to upload" + (
            f" ({sum(len(reasons) for reasons in result.left_out.values())} row(s) left out, listed above)"
            if result.left_out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
