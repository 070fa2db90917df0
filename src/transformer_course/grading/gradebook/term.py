"""The class folder's memory of the term: what each student handed in, week after week.

An instructor grades whatever the LMS gives this week (often only this week's new files) into the class folder
of the whole term. Nothing a downloads folder lacks is forgotten: every student's record keeps, per stage, the
notebook graded last and what was found about it, so scores.csv, the class report, the copy checks and the LMS
files always speak of the whole term.

    CLASS/records/<student>.json
    {"identity":  {"lms", "lms_id", "match", "name"}       who the student is (their id stays theirs all term)
     "notebooks": {stage: Entry}                              the notebook graded for each stage, the latest one
     "files":     {file: Entry}                               files no stage could be read from (rejected rows)
     "status", "reasons", "fingerprint", "seconds",           the last run that graded this student (as before
     "notebook_seconds"}                                      the term was kept: tools read them)

An Entry holds what a row of scores.csv says of the notebook beside its scores (`status`, `checked` for the
`notebook` column, `reasons`, `file`), when and from which bytes it was graded (`digest`, `modified`, `run`),
when it was handed in by the best time there was when it was read (`handed`: the LMS's time, Canvas's LATE mark
or the file time, for the late columns of every later week),
and what the similarity checks compare: the student's code of each exercise and their written answers,
normalised (names, comments and layout made uniform, `normalised`, with the version of the normaliser that
wrote it); never the student's whole file.

A record is replaced whole (a temporary file, then a rename), so a machine reading the class folder while
another writes it reads the old record or the new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Entry:
    """One notebook (or unreadable file) of a student, as the class folder remembers it."""

    file: str  # where it lay in the downloads folder it was graded from
    digest: str = ""  # sha256 of the bytes checked
    modified: float = 0.0  # the file's time
    inode: tuple[int, int] | None = None  # (device, inode) in the run that read it (hard links share it)
    run: str = ""  # when the run that read it started (ISO time): entries of one run compare inodes
    checked: str = "ok"  # ok | repaired | rejected | other: the `notebook` column
    status: str = "graded"  # graded | failed | rejected | pending
    reasons: list[str] = field(default_factory=list)
    untouched: bool = False  # the released notebook as handed out
    assignment: str = ""  # its stage ("" when none could be read)
    normalised: dict[str, str] = field(default_factory=dict)  # {exercise or question id: normalised text}
    normaliser: int = 0  # the version of the normaliser that wrote `normalised`
    handed: dict[str, object] = field(default_factory=dict)  # when it was handed in (`deadlines.HandedIn.to_json`)

    @classmethod
    def read(cls, data: object) -> Entry | None:
        if not isinstance(data, dict) or not isinstance(data.get("file"), str):
            return None
        inode = data.get("inode")
        return cls(
            file=data["file"], digest=str(data.get("digest", "")), modified=float(data.get("modified", 0.0) or 0.0),
            inode=tuple(inode) if isinstance(inode, list) and len(inode) == 2 else None,  # type: ignore[arg-type]
            run=str(data.get("run", "")), checked=str(data.get("checked", "ok")),
            status=str(data.get("status", "graded")),
            reasons=[str(reason) for reason in data.get("reasons", []) if isinstance(reason, str)],
            untouched=bool(data.get("untouched", False)), assignment=str(data.get("assignment", "")),
            normalised={str(key): str(value) for key, value in (data.get("normalised") or {}).items()},
            normaliser=int(data.get("normaliser", 0) or 0),
            handed=dict(data["handed"]) if isinstance(data.get("handed"), dict) else {})


@dataclass
class Record:
    """Everything the class folder remembers of one student."""

    student: str
    identity: dict[str, str] = field(default_factory=dict)  # lms, lms_id, match, name
    notebooks: dict[str, Entry] = field(default_factory=dict)  # {stage: the notebook graded last}
    files: dict[str, Entry] = field(default_factory=dict)  # {file: a file no stage could be read from}
    last_run: dict[str, object] = field(default_factory=dict)  # status, reasons, fingerprint, seconds, ...

    @property
    def name(self) -> str:
        return self.identity.get("name", "")

    @property
    def lms_id(self) -> str:
        return self.identity.get("lms_id", "")

    def entries(self) -> list[Entry]:
        return [*self.notebooks.values(), *self.files.values()]

    def to_json(self) -> dict[str, object]:
        return {**self.last_run, "identity": self.identity,
                "notebooks": {stage: asdict(entry) for stage, entry in sorted(self.notebooks.items())},
                "files": {name: asdict(entry) for name, entry in sorted(self.files.items())}}


def path(folder: Path, student: str) -> Path:
    return folder / f"{student}.json"


def load(folder: Path, student: str) -> Record:
    """The record of STUDENT in FOLDER (CLASS/records); an empty one when there is none or it cannot be read."""
    try:
        data = json.loads(path(folder, student).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Record(student)
    return _record(student, data) if isinstance(data, dict) else Record(student)


def _record(student: str, data: dict) -> Record:
    identity = data.get("identity") if isinstance(data.get("identity"), dict) else {}
    record = Record(student, {key: str(value) for key, value in identity.items()})
    for key, target in (("notebooks", record.notebooks), ("files", record.files)):
        for name, value in (data.get(key) or {}).items():
            entry = Entry.read(value)
            if entry is not None:
                target[str(name)] = entry
    record.last_run = {key: value for key, value in data.items() if key not in ("identity", "notebooks", "files")}
    return record


def load_all(folder: Path) -> dict[str, Record]:
    """Every student's record in FOLDER (records of files that cannot be read are left out)."""
    records = {}
    if not folder.is_dir():
        return records
    for item in sorted(folder.glob("*.json")):
        try:
            data = json.loads(item.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            records[item.stem] = _record(item.stem, data)
    return records


def save(folder: Path, record: Record) -> Path:
    """Write the record whole: a reader sees the old one or the new one, never half of either."""
    folder.mkdir(parents=True, exist_ok=True)
    target = path(folder, record.student)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{record.student}.", suffix=".part", dir=folder)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(record.to_json(), handle, indent=1, ensure_ascii=False)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
