"""Who handed a notebook in: the name and LMS id in a download's file and folder names, and the
path-safe student id the class folder and the gradebook use.

What the LMSs write (read from their download code):

    Canvas  <lastfirst>[_LATE]_<user id>_<file id>_<file name>
            smithjohn_12345_67890_02_attention.ipynb, smithjohn_LATE_12345_67891_02_attention-1.ipynb;
            anonymous grading: anon_<anonymous id>_<file id>_<file name>. The name is the sortable
            name in lower case with everything but word characters removed (any script is kept).
    Moodle  <Full Name>_<participant id>_assignsubmission_file_/<file name>   (a folder per student,
            the default) or the same prefix on each file; underscores in names become spaces. The
            participant id belongs to one assignment: another assignment's download numbers anew.
    Other   SUBMISSIONS/<student>/<any name>.ipynb, or flat SUBMISSIONS/<student>_<assignment>.ipynb.

A student is their LMS id when the download has one, else their name: two ids never merge, even
with the same name. Names in any script are kept (NFC-normalised). The student id is made of
letters, marks and digits of any script joined by `_` (no separators, dots, control characters or
glob characters; never starting with `-`), at most 64 bytes of UTF-8 (a longer one is cut and gets a
short hash), and unique in the class: two students whose ids would coincide both get a hash suffix.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePath

MAX_ID_BYTES = 64  # the id is a folder and file name (records/<id>.json) and a gradebook key
_JOINERS = "\u200c\u200d"  # zero-width (non-)joiners are part of words in Persian, Indic scripts...
_NAME_PUNCTUATION = "'’-.,()"

_CANVAS = re.compile(r"^(?:(?P<name>.*?)_)?(?P<late>LATE_)?(?P<id>[1-9]\d*|anon_[A-Za-z0-9]+)_[1-9]\d*_(?P<file>.+)$",
                     re.DOTALL)
_MOODLE = re.compile(r"^(?P<name>[^_]*)_(?P<id>\d+)_assignsubmission_[a-z]+_(?P<file>.*)$", re.DOTALL)
_DOWNLOAD_NOISE = re.compile(r"^\s*copy of\s+|\s*\(\d+\)|\s*-\s*copy\b", re.IGNORECASE)


@dataclass(frozen=True)
class Identity:
    """One student. Equal identities are the same student; the name is for people, not for matching."""

    lms: str  # "canvas", "moodle" or "" (no LMS id in the names)
    lms_id: str  # the LMS's user (or participant, or anonymous) id, "" when there is none
    match: str  # without an id: the folded name ("raw:<name>" when it has no letters); "" with one
    name: str = field(compare=False)  # readable, NFC; "" when unknown

    @property
    def natural_id(self) -> str:
        if self.lms_id:
            lms_id = "_".join(re.findall(r"[A-Za-z0-9]+", self.lms_id))
            if len(lms_id) > 24:
                lms_id = "id" + _digest(lms_id)
            base = _fold(self.name)
            return f"{_cut(base, MAX_ID_BYTES - len(lms_id) - 1, self)}_{lms_id}" if base else lms_id
        if self.match.startswith("raw:"):
            return "student-" + _digest(repr(self))
        return _cut(self.match, MAX_ID_BYTES, self)


def words(text: str) -> list[str]:
    """The runs of letters, marks and digits (any script) in a name, NFC-normalised."""
    found, current = [], []
    for char in unicodedata.normalize("NFC", text):
        if unicodedata.category(char)[0] in "LMN" or (char in _JOINERS and current):
            current.append(char)
        elif current:
            found.append("".join(current))
            current = []
    if current:
        found.append("".join(current))
    return found


def readable(text: str, limit: int = 200) -> str:
    """A name as people write it: letters of any script, spaces and name punctuation, NFC."""
    kept = "".join(char if unicodedata.category(char)[0] in "LMN" or char in _NAME_PUNCTUATION + _JOINERS
                   else " " for char in unicodedata.normalize("NFC", text))
    return " ".join(kept.split())[:limit].strip()


def identify(relative: PurePath, assignment_ids: Iterable[str]) -> tuple[Identity, list[str]]:
    """The student who handed in SUBMISSIONS/relative, and notes for the CSV (e.g. Canvas' LATE mark).

    assignment_ids: the course's assignments, taken out of flat file names ("ada_02_attention")."""
    stem = relative.name[:-len(".ipynb")] if relative.name.lower().endswith(".ipynb") else relative.name
    canvas = _CANVAS.match(stem)
    if canvas:
        name = canvas["name"] or ""
        late = bool(canvas["late"]) or name == "LATE"  # Canvas writes names in lower case
        notes = ["handed in late (the file is marked LATE by Canvas)"] if late else []
        return Identity("canvas", canvas["id"], "", "" if name == "LATE" else readable(name)), notes
    for part in [stem, *reversed(relative.parts[:-1])]:
        moodle = _MOODLE.match(part)
        if moodle:
            return Identity("moodle", moodle["id"], "", readable(moodle["name"])), []
    if len(relative.parts) > 1:
        return _by_name(relative.parts[0])
    for assignment in assignment_ids:
        stem = stem.replace(assignment, " ")
    return _by_name(_DOWNLOAD_NOISE.sub(" ", stem), raw=relative.name)


def _by_name(text: str, raw: str | None = None) -> tuple[Identity, list[str]]:
    if _fold(text):
        return Identity("", "", _fold(text), readable(text)), []
    return Identity("", "", f"raw:{raw or text}", ""), [
        "no student name could be read from the file or folder name, so the student id is a hash of it"]


def _fold(text: str) -> str:
    return "_".join(word.lower() for word in words(text)).replace(_JOINERS[0], "").replace(_JOINERS[1], "")


def student_ids(identities: Iterable[Identity]) -> dict[Identity, str]:
    """A path-safe, bounded, unique id for each student (identities that would share one get hashes)."""
    natural = {identity: identity.natural_id for identity in set(identities)}
    counts = Counter(natural.values())
    ids: dict[Identity, str] = {}
    for identity in sorted(natural, key=repr):
        chosen = natural[identity]
        if counts[chosen] > 1:
            chosen = _cut(chosen, MAX_ID_BYTES - 9, identity) + "-" + _digest(repr(identity))
        ids[identity] = chosen
    assert len(set(ids.values())) == len(ids), "two students were given one id"
    return ids


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _cut(text: str, room: int, identity: Identity) -> str:
    """TEXT when it fits in ROOM bytes of UTF-8, else its start and a hash of the whole identity."""
    if len(text.encode()) <= room:
        return text
    start = text.encode()[:room - 9].decode("utf-8", "ignore").rstrip("_")
    return f"{start or 'student'}-{_digest(repr(identity))}"
