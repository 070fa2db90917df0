"""Due dates, extensions and late penalties, from a small file the instructor keeps, and when each notebook
was handed in, from the LMS where it says so.

    python -m transformer_course.grading.batch DOWNLOADS --deadlines deadlines.toml [--submission-times FILE ...]

**The file** (TOML; times without a UTC offset are in `timezone`, else this machine's time zone):

    timezone = "Europe/Berlin"

    [penalty]
    per_day = 10        # percent of the points earned, for each day or part of a day late
    maximum = 50        # percent at most (100: a notebook late by 10 days or more earns nothing)
    grace_minutes = 15  # handed in this long after the due time still counts as on time

    [due]
    02_attention = 2026-11-10T23:59:00
    03_blocks = 2026-11-17T23:59:00

    [extensions]        # per student (student id, LMS id or name, as scores.csv has them)
    "12345" = "2 days"                                   # every stage two days later
    ada = { 03_blocks = 2026-11-21T12:00:00 }            # one stage: a new due time
    "Bo Chen" = { 02_attention = "36 hours", 03_blocks = "1 day" }

**When a notebook was handed in** (`submission_time`), best source first:
1. the LMS's own record, given with --submission-times: Moodle's grading worksheet of the assignment (its
   `Last modified (submission)`, per participant: Moodle writes it in the downloading user's time zone, so set
   `timezone` to the one of your Moodle profile), or a CSV with the columns `student`, `submitted` (ISO 8601)
   and optionally `assignment`, for any other source;
2. Canvas's download carries no time (its zip's entries are stamped when the zip is made: lib/content_zipper.rb
   of canvas-lms), only its own verdict in the name, `LATE`, against the due date Canvas holds for the student
   (its overrides included): a LATE file without a time from (1) is said to be late with its time unknown and
   gets no computed penalty; an unmarked one is on time;
3. a Moodle download without its worksheet: the time is not known either (Moodle's zip stamps each file with
   the time of the stored content, which is not the submission's: lib/filestorage/zip_packer.php stores files
   from its content-addressed file pool), so no penalty is computed and the row says what to give;
4. otherwise (email, USB, a folder per student) the file's modification time, said to be one.
Which of two notebooks of one student for the same stage is newer follows the same order (`newer_key`):
the LMS's times, else Canvas's file ids (Canvas numbers files as they are uploaded), else the file times.

scores.csv then gets the columns `submitted` (the time and its source), `due` (with the extension, if any),
`late` (how late, or "on time"), `late_penalty` (percent) and `total_after_penalty`, which the LMS files use;
`total` stays the points the work earned. The class report lists the late notebooks and, per stage, the students
without a submission.
"""

from __future__ import annotations

import csv
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path, PurePosixPath
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from transformer_course.grading.intake.identities import Identity, canvas_upload, lms_identity
from transformer_course.grading.intake.submissions import Submission
from transformer_course.grading.outputs.lms_exports import LmsError, half_up, moodle_worksheet
from transformer_course.grading.outputs.spreadsheet import decode, read_table

TERM_COLUMNS = ("submitted", "due", "late", "late_penalty", "total_after_penalty")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(day|days|d|hour|hours|h)\s*$", re.IGNORECASE)
# how Moodle's userdate() writes a time by default ('strftimedaydatetime'), and shorter forms a sheet may hold
_MOODLE_FORMATS = ("%A, %d %B %Y, %I:%M %p", "%A, %d %B %Y, %H:%M", "%d %B %Y, %I:%M %p", "%d %B %Y, %H:%M")


class DeadlineError(ValueError):
    """The deadlines file or a times file cannot be used as written; the message names the entry."""


def _zone(name: str | None) -> tzinfo:
    if not name:
        return datetime.now().astimezone().tzinfo or UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise DeadlineError(f"timezone {name!r} is not a time zone name such as 'Europe/Berlin'") from None


def _duration(text: str, where: str) -> timedelta:
    found = _DURATION.match(text)
    if not found:
        raise DeadlineError(f"{where}: {text!r} is neither a date and time (2026-11-10T23:59:00) nor a duration "
                            "such as '2 days' or '36 hours'")
    amount = float(found[1])
    return timedelta(days=amount) if found[2].lower().startswith("d") else timedelta(hours=amount)


@dataclass
class Deadlines:
    """The instructor's file: due dates per stage, extensions per student, the late penalty."""

    due: dict[str, datetime] = field(default_factory=dict)
    extensions: dict[str, dict[str, datetime | timedelta]] = field(default_factory=dict)  # {who: {stage|"all": ...}}
    per_day: float = 0.0
    maximum: float = 100.0
    grace: timedelta = timedelta()
    zone: tzinfo = UTC
    path: Path | None = None

    @classmethod
    def load(cls, path: Path) -> Deadlines:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as error:
            raise DeadlineError(f"{path}: cannot be read ({error.strerror or error})") from None
        except tomllib.TOMLDecodeError as error:
            raise DeadlineError(f"{path.name}: not a TOML file ({error})") from None
        zone = _zone(data.get("timezone"))
        penalty = data.get("penalty", {})
        deadlines = cls(zone=zone, path=path, per_day=float(penalty.get("per_day", 0)),
                        maximum=float(penalty.get("maximum", 100)),
                        grace=timedelta(minutes=float(penalty.get("grace_minutes", 0))))
        if not 0 <= deadlines.per_day <= 100 or not 0 <= deadlines.maximum <= 100:
            raise DeadlineError(f"{path.name} [penalty]: per_day and maximum are percentages from 0 to 100")
        for stage, when in data.get("due", {}).items():
            deadlines.due[stage] = deadlines.when(when, f"{path.name} [due] {stage}")
        for who, given in data.get("extensions", {}).items():
            stages = given if isinstance(given, dict) else {"all": given}
            deadlines.extensions[str(who)] = {
                str(stage): (_duration(value, f"{path.name} [extensions] {who} {stage}") if isinstance(value, str)
                             else deadlines.when(value, f"{path.name} [extensions] {who} {stage}"))
                for stage, value in stages.items()}
        return deadlines

    def when(self, value: object, where: str) -> datetime:
        """A time of the file, with its zone (a time without a UTC offset is in `timezone`)."""
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=self.zone)
        raise DeadlineError(f"{where}: {value!r} is not a date and time such as 2026-11-10T23:59:00")

    def check_stages(self, stages: list[str]) -> None:
        """Every stage the file names is one of the course's (a typo would silently give no due date)."""
        named = set(self.due) | {stage for given in self.extensions.values() for stage in given if stage != "all"}
        unknown = sorted(named - set(stages))
        if unknown:
            raise DeadlineError(f"{self.path.name if self.path else 'the deadlines'} names {', '.join(unknown)}, "
                                f"which is no stage of the course; the stages are {', '.join(stages)}")

    def due_for(self, stage: str, who: list[str]) -> tuple[datetime | None, str]:
        """(the due time of STAGE for the student known by any of WHO, what it is: "" or the extension's words)."""
        base = self.due.get(stage)
        for name in who:
            given = self.extensions.get(name, {})
            extension = given.get(stage, given.get("all"))
            if isinstance(extension, datetime):
                return extension, f"extension to {_shown(extension, self.zone)}"
            if isinstance(extension, timedelta) and base is not None:
                return base + extension, f"extension of {_span(extension)}"
        return base, ""

    def penalty(self, late: timedelta) -> float:
        """Percent off the points earned for a notebook handed in LATE after its due time."""
        if late <= self.grace:
            return 0.0
        days = math.ceil((late - self.grace) / timedelta(days=1))
        return min(self.maximum, days * self.per_day)


def _shown(when: datetime, zone: tzinfo) -> str:
    return when.astimezone(zone).strftime("%Y-%m-%d %H:%M")


def _span(delta: timedelta) -> str:
    """'1 day 2 h 1 min', to the minute."""
    minutes = round(delta.total_seconds() / 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = ([f"{days} day{'s' if days != 1 else ''}"] if days else []) + ([f"{hours} h"] if hours else []) + (
        [f"{minutes} min"] if minutes else [])
    return " ".join(parts) or "0 min"


# --- when a notebook was handed in ----------------------------------------------------------------------------

@dataclass
class SubmissionTimes:
    """Times the LMS (or the instructor) recorded: {(who, stage or ""): (time, source)}."""

    times: dict[tuple[str, str], tuple[datetime, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, paths: list[Path], zone: tzinfo) -> SubmissionTimes:
        found = cls()
        for path in paths:
            try:
                table = read_table(path.read_bytes())
            except OSError as error:
                raise DeadlineError(f"{path}: cannot be read ({error.strerror or error})") from None
            header = {" ".join(cell.split()).casefold() for cell in (table[0] if table else [])}
            if "identifier" in header:
                try:
                    sheet = moodle_worksheet(table, path, f"--submission-times {path.name}")
                except LmsError as error:
                    raise DeadlineError(str(error)) from None
                for participant, text in sheet.submitted.items():
                    found.times["moodle:" + participant, ""] = (_moodle_time(text, zone, path.name), "Moodle")
            elif {"student", "submitted"} <= header:
                found._read_plain(path, zone)
            else:
                raise DeadlineError(f"--submission-times {path.name}: neither Moodle's grading worksheet (Identifier, "
                                    "Last modified (submission)) nor a sheet with the columns student, submitted")
        return found

    def _read_plain(self, path: Path, zone: tzinfo) -> None:
        text = decode(path.read_bytes())
        rows = list(csv.DictReader(text.splitlines(), delimiter=";" if text.split("\n", 1)[0].count(";") >
                                   text.split("\n", 1)[0].count(",") else ","))
        for number, row in enumerate(rows, 2):
            row = {" ".join((key or "").split()).casefold(): (value or "").strip() for key, value in row.items()}
            if not row.get("student") or not row.get("submitted"):
                continue
            try:
                when = datetime.fromisoformat(row["submitted"])
            except ValueError:
                raise DeadlineError(f"{path.name} row {number}: submitted {row['submitted']!r} is not a time such "
                                    "as 2026-11-10T23:59:00") from None
            self.times[row["student"], row.get("assignment", "")] = (
                when if when.tzinfo else when.replace(tzinfo=zone), path.name)

    def get(self, who: list[str], stage: str) -> tuple[datetime, str] | None:
        for name in who:
            for key in ((name, stage), (name, "")):
                if key in self.times:
                    return self.times[key]
        return None


def _moodle_time(text: str, zone: tzinfo, sheet: str) -> datetime:
    for form in _MOODLE_FORMATS:
        try:
            return datetime.strptime(text, form).replace(tzinfo=zone)
        except ValueError:
            continue
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise DeadlineError(f"{sheet}: 'Last modified (submission)' {text!r} is not a time as Moodle writes it in "
                            "English (Tuesday, 14 October 2025, 10:03 AM)") from None
    return when if when.tzinfo else when.replace(tzinfo=zone)


@dataclass(frozen=True)
class HandedIn:
    when: datetime | None  # None: not known (a Canvas file marked LATE, with no time given)
    source: str  # "Moodle", a times file's name, "Canvas: LATE", "Canvas: on time", "file time"
    late_by_lms: bool | None = None  # Canvas's own verdict, when that is all there is

    def to_json(self) -> dict[str, object]:
        """What the class folder's record keeps of it (`gradebook.term`), so later weeks' rows still say it."""
        return {"when": self.when.isoformat() if self.when else "", "source": self.source,
                "late_by_lms": self.late_by_lms}

    @classmethod
    def read(cls, data: object) -> HandedIn | None:
        if not isinstance(data, dict) or not isinstance(data.get("source"), str):
            return None
        try:
            when = datetime.fromisoformat(data["when"]) if data.get("when") else None
        except (TypeError, ValueError):
            when = None
        late = data.get("late_by_lms")
        return cls(when, data["source"], late if isinstance(late, bool) else None)


def names_of(submission: Submission) -> list[str]:
    """Every name a student goes by in the files an instructor keeps: student id, LMS id (Moodle's as
    moodle:N in the times), the name as written."""
    return person_names(submission.student, submission.identity)


def person_names(student: str, identity: Identity | None) -> list[str]:
    """`names_of` for a student id and their identity (as the class folder's records keep them)."""
    names = [student]
    if identity is not None:
        names += [f"moodle:{identity.lms_id}" if identity.lms == "moodle" else identity.lms_id, identity.lms_id,
                  identity.name, identity.match]
    return [name for name in dict.fromkeys(names) if name]


def submission_time(submission: Submission, times: SubmissionTimes | None) -> HandedIn:
    """When SUBMISSION was handed in, from the best source there is (see the module's text)."""
    recorded = times.get(names_of(submission), submission.assignment or "") if times else None
    if recorded is not None:
        return HandedIn(recorded[0], recorded[1])
    top = PurePosixPath(submission.relative).parts[0] if submission.relative else ""
    canvas = canvas_upload(top) if top else None
    if canvas is not None:
        return HandedIn(None, "Canvas: LATE" if canvas[1] else "Canvas: on time", canvas[1])
    if top and lms_identity(top) is not None:
        return HandedIn(None, "Moodle: its time is in the assignment's grading worksheet")
    return HandedIn(datetime.fromtimestamp(submission.modified, UTC) if submission.modified else None, "file time")


def newer_key(submission: Submission, times: SubmissionTimes | None = None) -> tuple:
    """Sort key of two notebooks of one student for one stage, the newer last: the LMS's time, else Canvas's
    file id (its files are numbered as they are uploaded), else the file time."""
    recorded = times.get(names_of(submission), submission.assignment or "") if times else None
    top = PurePosixPath(submission.relative).parts[0] if submission.relative else ""
    canvas = canvas_upload(top) if top else None
    return (recorded[0].timestamp() if recorded else float("-inf"), canvas[0] if canvas else -1,
            submission.modified, submission.relative)


def columns(submission: Submission, deadlines: Deadlines, times: SubmissionTimes | None,
            total: float | None) -> dict[str, object]:
    """The row's TERM_COLUMNS for SUBMISSION, whose points are TOTAL."""
    return handed_columns(submission_time(submission, times), submission.assignment or "", names_of(submission),
                          deadlines, total)


def handed_columns(handed: HandedIn, stage: str, names: list[str], deadlines: Deadlines,
                   total: float | None) -> dict[str, object]:
    """The row's TERM_COLUMNS for a notebook of STAGE handed in at HANDED by the student known by NAMES."""
    due, extension = deadlines.due_for(stage, names)
    row: dict[str, object] = {
        "submitted": (f"{_shown(handed.when, deadlines.zone)} ({handed.source})" if handed.when else handed.source),
        "due": (_shown(due, deadlines.zone) + (f" ({extension})" if extension else "")) if due else "",
        "late": "", "late_penalty": "", "total_after_penalty": total if total is not None else ""}
    if due is None:
        return row
    if handed.when is None:
        if handed.late_by_lms is False:
            row["late"], row["late_penalty"] = "on time (by Canvas)", 0
        elif handed.late_by_lms:
            row["late"] = ("late by Canvas's due date; its time is not in Canvas's download: no penalty computed "
                           "(give the times with --submission-times)")
        else:
            row["late"] = ("time unknown: no penalty computed (give Moodle's grading worksheet, or a times sheet, "
                           "with --submission-times)")
        return row
    late = handed.when - due
    percent = deadlines.penalty(late) if late > timedelta() else 0.0
    row["late"] = "on time" if late <= deadlines.grace else f"{_span(late)} late"
    row["late_penalty"] = percent
    if total is not None:
        row["total_after_penalty"] = penalised(total, percent)
    return row


def penalised(total: float, percent: float) -> float:
    """TOTAL less PERCENT of it, rounded half up to two decimals."""
    return half_up(total * (100 - percent) / 100)


def refresh(row: dict[str, str]) -> None:
    """ROW's total_after_penalty again from its total and late_penalty (after hand grades changed the total)."""
    if "total_after_penalty" not in row:
        return
    try:
        total = float(row.get("total") or "")
    except ValueError:
        return
    try:
        percent = float(row.get("late_penalty") or 0)
    except ValueError:
        percent = 0.0
    row["total_after_penalty"] = f"{penalised(total, percent):g}"


def class_deadlines(class_dir: Path) -> Deadlines | None:
    """The deadlines file the batch command was given for this class (CLASS/term.json), None when there is none
    or it cannot be read now."""
    try:
        term = json.loads((class_dir / "term.json").read_text(encoding="utf-8"))
        path = term.get("deadlines") if isinstance(term, dict) else None
        return Deadlines.load(Path(path)) if path else None
    except (OSError, ValueError):
        return None
