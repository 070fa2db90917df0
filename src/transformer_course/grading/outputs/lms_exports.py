"""What the LMS holds now, read from its own exports, and which of its columns is which stage.

**Canvas** (Grades > Export > Export Entire Gradebook): a header `Student, ID, SIS User ID, ...`, then the
assignments, each titled `Title (assignment id)`, and Canvas's own totals (Current Score, Final Grade, ...,
which are not assignments); a row `Points Possible`; a row per student with the Canvas user id in `ID`.
`canvas_column` finds the column of a stage: the title given with --title (the exact header, the title
without its id, or the id alone), else the column titled like the stage (`02_attention`), else the one
column whose words hold the stage's words and whose number, if it has one, is the stage's ("Stage 2:
Attention (4711)" is 02_attention). No column, or several, is an error that lists the assignments.

**Moodle** (Assignment > View all submissions > Grading action: Download grading worksheet): columns
`Identifier` ("Participant N"), `Grade`, `Maximum grade`, `Feedback comments` (when that feedback type is
on), read by name (Moodle in English).

Both are read as a spreadsheet may have saved them (`spreadsheet.read_table`): UTF-8 with or without a
byte-order mark, comma or semicolon separated, a decimal comma in numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from transformer_course.grading.outputs.spreadsheet import decimal, read_table

_TITLED = re.compile(r"^(?P<title>.*?)\s*\((?P<id>\d+)\)\s*$")
# Canvas's own columns, which are not assignments (its importer's NON_ASSIGNMENT_COLUMN_HEADERS, "Unposted ..."
# and assignment groups' "... Current Score" included)
_NOT_ASSIGNMENT = re.compile(r"(Current|Final|Override|Unposted) (Score|Points|Grade|Status)")
_STUDENT_COLUMNS = {"Student", "LastName", "FirstName", "ID", "SIS User ID", "SIS Login ID", "Section",
                    "Integration ID", "Root Account"}


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


def same(first: float | None, second: float | None) -> bool:
    """Equal as the LMS shows them (two decimals)."""
    return first is not None and second is not None and round(first, 2) == round(second, 2)


# --- Canvas ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CanvasColumn:
    header: str  # exactly as in the export: what our file must call it
    title: str  # without " (id)"
    assignment_id: str  # "" when the header has none
    points: float | None  # its Points Possible
    scores: dict[str, str]  # {Canvas user id: the score Canvas holds, as exported}: empty cells left out


@dataclass(frozen=True)
class CanvasExport:
    name: str
    columns: tuple[CanvasColumn, ...]
    users: frozenset[str]  # every Canvas user id in it

    def listing(self) -> str:
        return ", ".join(repr(column.header) for column in self.columns) or "none"


def read_canvas_export(path: Path) -> CanvasExport:
    """Canvas's gradebook export (`LmsError` when it is not one)."""
    try:
        table = read_table(path.read_bytes())
    except OSError as error:
        raise LmsError(f"--canvas-export {path}: cannot be read ({error.strerror or error})") from None
    header = [cell.strip() for cell in table[0]] if table else []
    if "ID" not in header or not any("Student" in cell for cell in header[:1]):
        raise LmsError(f"--canvas-export {path.name}: row 1 has no 'Student' and 'ID' columns: not Canvas's "
                       "gradebook export (Grades > Export > Export Entire Gradebook)")
    user = header.index("ID")
    points_row = next((row for row in table[1:5] if row and "Points Possible" in row[0]), [])
    students = [row for row in table[1:] if len(row) > user and row[user].strip().isdigit()]
    columns = []
    for index, cell in enumerate(header):
        if index <= user or not cell or cell in _STUDENT_COLUMNS or _NOT_ASSIGNMENT.search(cell):
            continue
        match = _TITLED.match(cell)
        scores = {row[user].strip(): row[index].strip() for row in students if len(row) > index and row[index].strip()}
        columns.append(CanvasColumn(cell, match["title"] if match else cell, match["id"] if match else "",
                                    number(points_row[index]) if len(points_row) > index else None, scores))
    return CanvasExport(path.name, tuple(columns), frozenset(row[user].strip() for row in students))


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

@dataclass(frozen=True)
class MoodleWorksheet:
    name: str
    maximum: float | None  # the assignment's maximum grade (None when the worksheet does not say)
    grades: dict[str, str]  # {participant number: the grade Moodle holds, as exported}: empty ones left out
    comments: dict[str, str]  # {participant number: the feedback comment Moodle holds}: empty ones left out
    participants: frozenset[str]
    downloaded: datetime  # when the file was saved (its modification time): what it says is as of then


def read_moodle_worksheet(path: Path, stage: str) -> MoodleWorksheet:
    """Moodle's grading worksheet of STAGE's assignment (`LmsError` when it is not one)."""
    try:
        table = read_table(path.read_bytes())
    except OSError as error:
        raise LmsError(f"--moodle-export {stage}={path}: cannot be read ({error.strerror or error})") from None
    header = [cell.strip() for cell in table[0]] if table else []
    if "Identifier" not in header or "Grade" not in header:
        raise LmsError(f"--moodle-export {stage}={path.name}: row 1 has no 'Identifier' and 'Grade' columns: not "
                       "Moodle's grading worksheet (View all submissions > Grading action > Download grading "
                       "worksheet, with Moodle in English)")
    column = {name: header.index(name) for name in header if name}

    def cell(row: list[str], name: str) -> str:
        index = column.get(name)
        return row[index].strip() if index is not None and index < len(row) else ""

    grades, comments, participants, maxima = {}, {}, set(), set()
    for row in table[1:]:
        match = re.search(r"(\d+)\s*$", cell(row, "Identifier"))
        if not match:
            continue
        participant = match[1]
        participants.add(participant)
        if cell(row, "Grade") not in ("", "-"):
            grades[participant] = cell(row, "Grade")
        if cell(row, "Feedback comments"):
            comments[participant] = cell(row, "Feedback comments")
        top = number(cell(row, "Maximum grade"))
        if top is not None:
            maxima.add(round(top, 2))
    if len(maxima) > 1:
        raise LmsError(f"--moodle-export {stage}={path.name}: its 'Maximum grade' column says "
                       + ", ".join(f"{value:g}" for value in sorted(maxima)) + ": one assignment's worksheet has one")
    return MoodleWorksheet(path.name, maxima.pop() if maxima else None, grades, comments, frozenset(participants),
                           datetime.fromtimestamp(path.stat().st_mtime))
