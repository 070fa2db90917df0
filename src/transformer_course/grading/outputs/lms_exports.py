"""What the LMS holds now, read from its own exports, and which of its columns is which stage.

**Canvas** (Grades > Export > Export Entire Gradebook): a header `Student, ID, SIS User ID, SIS Login ID,
Section` (`LastName, FirstName, ID, ...` when the course shows first and last names apart; `SIS User ID`,
`Integration ID` and `Root Account` only in some exports: Canvas's lib/gradebook_exporter.rb), then the
instructor's own gradebook columns, the assignments, each titled `Title (assignment id)`, and Canvas's own
totals (Current Score, Final Grade, ..., which are not assignments); a row `Points Possible`; a row per
student with the Canvas user id in `ID`, their sortable name, SIS ids and section (`CanvasPerson`, which
our upload files repeat).
`canvas_column` finds the column of a stage: the title given with --title (the exact header, the title
without its id, or the id alone), else the column titled like the stage (`02_attention`), else the one
column whose words hold the stage's words and whose number, if it has one, is the stage's ("Stage 2:
Attention (4711)" is 02_attention). No column, or several, is an error that lists the assignments.

**Moodle** (Assignment > View all submissions > Grading action: Download grading worksheet): columns
`Identifier` ("Participant N"), `Full name`, `Grade`, `Maximum grade`, `Last modified (submission)`, `Last
modified (grade)`, `Feedback comments` (when that feedback type is on), read by name (Moodle in English).

**Headers as the LMSs write them.** Columns are found by name with letter case and runs of spaces ignored,
so `Maximum Grade` (as some Moodle versions write it: mod/assign/lang/en/assign.php defined `maxgrade` twice,
the second `'Maximum Grade'`) is `Maximum grade`. Our own files use each LMS's exact strings, because their
importers compare them exactly (Moodle's assignfeedback_offline importer: `$column == get_string(...)`).

**Decimals.** A grade is rounded half up (8.125 is 8.13, where Python's `round` gives 8.12) to the LMS's
decimals: Canvas keeps two (its exporter and importer compare scores at two decimals); Moodle shows a grade
item's decimals in the worksheet's `Maximum grade` (`40.00`: two), which are used when the worksheet is given.

Both are read as a spreadsheet may have saved them (`spreadsheet.read_table`): UTF-8 with or without a
byte-order mark, comma or semicolon separated, a decimal comma in numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from transformer_course.grading.outputs.spreadsheet import decimal, read_table

_TITLED = re.compile(r"^(?P<title>.*?)\s*\((?P<id>\d+)\)\s*$")
# Canvas's own columns, which are not assignments (its importer's NON_ASSIGNMENT_COLUMN_HEADERS, "Unposted ..."
# and assignment groups' "... Current Score" included)
_NOT_ASSIGNMENT = re.compile(r"(Current|Final|Override|Unposted) (Score|Points|Grade|Status)")
_STUDENT_COLUMNS = {"student", "lastname", "firstname", "id", "sis user id", "sis login id", "section",
                    "integration id", "root account"}  # Canvas's GRADEBOOK_IMPORTER_RESERVED_NAMES, as `header_key`s
LMS_DECIMALS = 2  # Canvas's, and Moodle's default


def header_key(text: str) -> str:
    """A column header as compared: letter case and runs of spaces ignored ("Maximum  Grade" is "maximum grade")."""
    return " ".join(text.split()).casefold()


class LmsError(ValueError):
    """What the instructor asked for cannot be done as asked; nothing was written. The message names the bad
    name and the valid ones."""


def number(text: str | None) -> float | None:
    """A grade as an LMS or a spreadsheet writes it ("30.5", "30,5", "30.50"); None for none ("", "-") or
    for text that is no number ("EX")."""
    try:
        return decimal((text or "").strip().rstrip("%"))
    except ValueError:
        return None


def half_up(value: float | Decimal, decimals: int = LMS_DECIMALS) -> float:
    """VALUE rounded half up to DECIMALS places, as a person and an LMS round (8.125 -> 8.13; Python's `round`
    rounds half to even and works on the binary float, which gives 8.12). A float is taken as the shortest
    decimal that reads back as it (`repr`), so 1.005 is 1.005, not 1.00499999..."""
    exact = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
    return float(exact.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))


def shown(value: float, decimals: int = LMS_DECIMALS) -> str:
    """VALUE as an LMS file writes it: rounded half up, no trailing zeros ("8.13", "40", "31.25")."""
    text = f"{half_up(value, decimals):.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def same(first: float | None, second: float | None, decimals: int = LMS_DECIMALS) -> bool:
    """Equal as the LMS shows them (two decimals, rounded half up)."""
    return first is not None and second is not None and half_up(first, decimals) == half_up(second, decimals)


# --- Canvas ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CanvasColumn:
    header: str  # exactly as in the export: what our file must call it
    title: str  # without " (id)"
    assignment_id: str  # "" when the header has none
    points: float | None  # its Points Possible
    scores: dict[str, str]  # {Canvas user id: the score Canvas holds, as exported}: empty cells left out


@dataclass(frozen=True)
class CanvasPerson:
    """A student's row of Canvas's export, as Canvas's importer matches it: by `ID`, else the SIS ids."""

    name: str  # Canvas's sortable name ("Smith, John"), or "LastName, FirstName" from those two columns
    sis_user_id: str = ""
    sis_login_id: str = ""
    section: str = ""


@dataclass(frozen=True)
class CanvasExport:
    name: str
    columns: tuple[CanvasColumn, ...]
    users: frozenset[str]  # every Canvas user id in it
    people: dict[str, CanvasPerson] = field(default_factory=dict)  # {Canvas user id: their row's student columns}

    def listing(self) -> str:
        return ", ".join(repr(column.header) for column in self.columns) or "none"


def read_canvas_export(path: Path) -> CanvasExport:
    """Canvas's gradebook export (`LmsError` when it is not one)."""
    try:
        table = read_table(path.read_bytes())
    except OSError as error:
        raise LmsError(f"--canvas-export {path}: cannot be read ({error.strerror or error})") from None
    header = [cell.strip() for cell in table[0]] if table else []
    keys = [header_key(cell) for cell in header]
    named = keys[:1] == ["student"] or keys[:2] == ["lastname", "firstname"]
    if "id" not in keys or not named:
        raise LmsError(f"--canvas-export {path.name}: row 1 has no 'Student' (or 'LastName', 'FirstName') and 'ID' "
                       "columns: not Canvas's gradebook export (Grades > Export > Export Entire Gradebook)")
    user = keys.index("id")
    points_row = next((row for row in table[1:5] if row and "points possible" in header_key(row[0])), [])
    students = [row for row in table[1:] if len(row) > user and row[user].strip().isdigit()]

    def cell(row: list[str], name: str) -> str:
        index = keys.index(name) if name in keys else -1
        return row[index].strip() if 0 <= index < len(row) else ""

    people = {}
    for row in students:
        name = cell(row, "student") or ", ".join(part for part in (cell(row, "lastname"), cell(row, "firstname"))
                                                 if part)
        people[row[user].strip()] = CanvasPerson(name, cell(row, "sis user id"), cell(row, "sis login id"),
                                                 cell(row, "section"))
    columns = []
    for index, title in enumerate(header):
        if index <= user or not title or keys[index] in _STUDENT_COLUMNS or _NOT_ASSIGNMENT.search(title):
            continue
        match = _TITLED.match(title)
        scores = {row[user].strip(): row[index].strip() for row in students if len(row) > index and row[index].strip()}
        columns.append(CanvasColumn(title, match["title"] if match else title, match["id"] if match else "",
                                    number(points_row[index]) if len(points_row) > index else None, scores))
    return CanvasExport(path.name, tuple(columns), frozenset(people), people)


def _words(text: str) -> tuple[set[str], set[int]]:
    tokens = re.findall(r"[^\W_]+", text.lower())
    return {token for token in tokens if not token.isdigit()}, {int(token) for token in tokens if token.isdigit()}


def _names_stage(column: CanvasColumn, stage: str) -> bool:
    stage_words, stage_numbers = _words(stage)
    words, numbers = _words(column.title)
    return bool(stage_words) and stage_words <= words and (not numbers or bool(stage_numbers & numbers))


def canvas_column(export: CanvasExport, stage: str, title: str | None = None) -> CanvasColumn:
    """The column of EXPORT that is STAGE's assignment (see the module's docstring)."""
    if title is not None:
        wanted = title.strip()
        found = [c for c in export.columns if wanted in (c.header, c.title) or (wanted.isdigit() and
                                                                               wanted == c.assignment_id)]
        if len(found) != 1:
            what = "no assignment" if not found else f"{len(found)} assignments"
            raise LmsError(f"--title {stage}={title!r}: Canvas's export {export.name} has {what} of that title or id "
                           f"(its assignments: {export.listing()}); give the exact column header or assignment id")
        return found[0]
    exact = [c for c in export.columns if stage in (c.header, c.title)]
    found = exact or [c for c in export.columns if _names_stage(c, stage)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise LmsError(f"{stage}: Canvas's export {export.name} has no assignment for this stage (its assignments: "
                       f"{export.listing()}): create it in Canvas and export again, or name its column with "
                       f"--title {stage}=\"TITLE (ID)\"; a new column would make Canvas create a new assignment")
    raise LmsError(f"{stage}: several columns of Canvas's export {export.name} could be this stage ("
                   + ", ".join(repr(c.header) for c in found) + f"): name one with --title {stage}=\"TITLE (ID)\"")


# --- Moodle ------------------------------------------------------------------------------------------

MOODLE_IDENTIFIER, MOODLE_GRADE, MOODLE_MAXIMUM = "identifier", "grade", "maximum grade"
MOODLE_SUBMITTED, MOODLE_NAME, MOODLE_EMAIL = "last modified (submission)", "full name", "email address"
MOODLE_FEEDBACK, MOODLE_SCALE = "feedback comments", "scale"


@dataclass(frozen=True)
class MoodleWorksheet:
    name: str
    maximum: float | None  # the assignment's maximum grade (None when the worksheet does not say)
    grades: dict[str, str]  # {participant number: the grade Moodle holds, as exported}: empty ones left out
    comments: dict[str, str]  # {participant number: the feedback comment Moodle holds}: empty ones left out
    participants: frozenset[str]
    downloaded: datetime  # when the file was saved (its modification time): what it says is as of then
    decimals: int | None = None  # the grade item's decimals, as `Maximum grade` shows them (None: not shown)
    submitted: dict[str, str] = field(default_factory=dict)  # {participant: `Last modified (submission)`, as written}
    names: dict[str, str] = field(default_factory=dict)  # {participant: `Full name`}
    emails: dict[str, str] = field(default_factory=dict)  # {participant: `Email address`}, when the sheet has it
    header: tuple[str, ...] = ()  # its columns, as written

    def lacks_maximum(self) -> str:
        """Why this worksheet gives no maximum ("" when it does)."""
        if self.maximum is not None:
            return ""
        keys = {header_key(name) for name in self.header}
        if MOODLE_SCALE in keys:
            return f"{self.name} has a 'Scale' column instead: the assignment is graded on a scale, not in points"
        if MOODLE_MAXIMUM in keys:
            return f"{self.name}'s 'Maximum grade' column is empty"
        return f"{self.name} has no 'Maximum grade' column (its columns: {', '.join(map(repr, self.header))})"


def read_moodle_worksheet(path: Path, stage: str) -> MoodleWorksheet:
    """Moodle's grading worksheet of STAGE's assignment (`LmsError` when it is not one)."""
    try:
        table = read_table(path.read_bytes())
    except OSError as error:
        raise LmsError(f"--moodle-export {stage}={path}: cannot be read ({error.strerror or error})") from None
    return moodle_worksheet(table, path, f"--moodle-export {stage}={path.name}")


def moodle_worksheet(table: list[list[str]], path: Path, said: str) -> MoodleWorksheet:
    """The worksheet in TABLE (read from PATH); SAID names it in an error (`LmsError` when it is not one)."""
    header = [cell.strip() for cell in table[0]] if table else []
    column = {}
    for index, name in enumerate(header):
        column.setdefault(header_key(name), index)
    if MOODLE_IDENTIFIER not in column or MOODLE_GRADE not in column:
        raise LmsError(f"{said}: row 1 has no 'Identifier' and 'Grade' columns (its columns: "
                       + ", ".join(repr(name) for name in header[:12] if name) + "): not Moodle's grading "
                       "worksheet (View all submissions > Grading action > Download grading worksheet, with "
                       "Moodle in English)")

    def cell(row: list[str], name: str) -> str:
        index = column.get(name)
        return row[index].strip() if index is not None and index < len(row) else ""

    grades, comments, participants, maxima, places = {}, {}, set(), set(), set()
    submitted, names, emails = {}, {}, {}
    for row in table[1:]:
        match = re.search(r"(\d+)\s*$", cell(row, MOODLE_IDENTIFIER))
        if not match:
            continue
        participant = match[1]
        participants.add(participant)
        if cell(row, MOODLE_GRADE) not in ("", "-"):
            grades[participant] = cell(row, MOODLE_GRADE)
        if cell(row, MOODLE_FEEDBACK):
            comments[participant] = cell(row, MOODLE_FEEDBACK)
        for found, name in ((submitted, MOODLE_SUBMITTED), (names, MOODLE_NAME), (emails, MOODLE_EMAIL)):
            if cell(row, name) not in ("", "-"):
                found[participant] = cell(row, name)
        written = cell(row, MOODLE_MAXIMUM)
        top = number(written)
        if top is not None:
            maxima.add(half_up(top))
            decimal_places = re.search(r"[.,](\d+)$", written)
            places.add(len(decimal_places[1]) if decimal_places else None)
    if len(maxima) > 1:
        raise LmsError(f"{said}: its 'Maximum grade' column says "
                       + ", ".join(f"{value:g}" for value in sorted(maxima)) + ": one assignment's worksheet has one")
    decimals = places.pop() if len(places) == 1 else None
    return MoodleWorksheet(path.name, maxima.pop() if maxima else None, grades, comments, frozenset(participants),
                           datetime.fromtimestamp(path.stat().st_mtime), decimals, submitted, names, emails,
                           tuple(name for name in header if name))
