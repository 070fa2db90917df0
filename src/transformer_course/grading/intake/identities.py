"""Who handed a notebook in: the name and LMS id that the LMS (or the instructor) wrote into a download's
names, and the path-safe student id the class folder and the gradebook use.

What the LMSs write (read from their download code, Canvas' ContentZipper and Moodle's assign module):

    Canvas  <lastfirst>[_LATE]_<user id>_<file id>_<file name>, every file at the top of the download:
            smithjohn_12345_67890_02_attention.ipynb, smithjohn_LATE_12345_67891_02_attention-1.ipynb;
            anonymous grading: anon_<anonymous id>_<file id>_<file name>. The name is the sortable
            name with everything but word characters removed (any script is kept), and Canvas takes
            every `_<digits>_` out of it, so the first `_<id>_<id>_` of a name is Canvas' own.
    Moodle  <Full Name>_<participant id>_assignsubmission_file_/<the student's files, in the student's
            own folders> (the default), or the same prefix on each file at the top; underscores in
            names become spaces. The participant id belongs to one assignment.
    Other   SUBMISSIONS/<student>/<any name>.ipynb, or flat SUBMISSIONS/<student>_<assignment>.ipynb.

Only the first part of a path is read for who it is: the file at the top of the download, or the
folder there. Below it, the names are the student's own (a Moodle participant folder keeps the
folders the student uploaded), so a file or folder that a student names after a classmate's
download (`smithjohn_12345_67890_...`, `Jane Doe_501_assignsubmission_file_`) is still theirs. When a
name could be read as both Canvas' and Moodle's, the one whose prefix ends first wins: the LMS writes
its prefix before the student's file name, never after.

A student is their LMS id when the download has one, else their name exactly as written: two ids
never merge, even with the same name, and two names merge only when they are the same text. Names
that differ only by letter case, Unicode normalisation (NFC/NFD), compatibility forms (fullwidth
letters, ligatures) or invisible characters are different names, so different students: nobody can
take a classmate's place by spelling their name another way. The readable name shown beside a
student is NFC. The student id is made of letters, marks and digits of any script joined by `_` (no
separators, dots, control characters or glob characters; never starting with `-`), at most 64
bytes of UTF-8 (a longer one is cut and gets a short hash), and unique in the class even on a
file system that ignores case or normalisation: students whose ids would coincide there get a hash
suffix, except one whose name is exactly the id (a folder `ada` stays `ada` beside a folder `ADA`).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePath

MAX_ID_BYTES = 64  # the id is a folder and file name (records/<id>.json) and a gradebook key
_JOINERS = "\u200c\u200d"  # zero-width (non-)joiners are part of words in Persian, Indic scripts...
_NAME_PUNCTUATION = "'’-.,()"

# Canvas: no name at all is tried first (old anonymous downloads start with the user id); the name
# is the shortest prefix followed by `_[LATE_]<id>_<id>_` (Canvas removes `_<digits>_` from names).
# Ids are ASCII digits, as the LMSs write them (`\d` would also take fullwidth or Arabic-Indic digits).
_CANVAS = re.compile(r"^(?:(?P<name>.*?)_)??(?P<late>(?i:late)_)?(?P<id>[1-9][0-9]*|anon_[A-Za-z0-9]+)_"
                     r"(?P<file_id>[1-9][0-9]*)_(?P<file>.+)$", re.DOTALL)
_MOODLE = re.compile(r"^(?P<name>[^_]*)_(?P<id>[0-9]+)_assignsubmission_[a-z]+_(?P<file>.*)$", re.DOTALL)
_DOWNLOAD_NOISE = re.compile(r"^\s*copy of\s+|\s*\(\d+\)|\s*-\s*copy\b", re.IGNORECASE)
_SEPARATORS = " \t_-."
# scripts that honest names mix within one word (Japanese, Korean, Chinese with Bopomofo)
_SCRIPTS_TOGETHER = [{"HAN", "HIRAGANA", "KATAKANA"}, {"HAN", "HANGUL"}, {"HAN", "BOPOMOFO"}]


@dataclass(frozen=True)
class Identity:
    """One student. Equal identities are the same student; the name is for people, not for matching."""

    lms: str  # "canvas", "moodle" or "" (no LMS id in the names)
    lms_id: str  # the LMS's user (or participant, or anonymous) id, "" when there is none
    match: str  # without an id: the name exactly as written ("raw:<file>" when it has no letters); "" with one
    name: str = field(compare=False)  # readable, NFC; "" when unknown

    @property
    def natural_id(self) -> str:
        """The student id this student gets unless another student's would coincide with it."""
        if self.lms_id:
            lms_id = "_".join(re.findall(r"[A-Za-z0-9]+", self.lms_id))
            if len(lms_id) > 24:
                lms_id = "id" + self.digest
            base = _fold(self.name)
            return f"{_cut(base, MAX_ID_BYTES - len(lms_id) - 1, self)}_{lms_id}" if base else lms_id
        if self.match.startswith("raw:"):
            return "student-" + self.digest
        return _cut(_fold(self.match), MAX_ID_BYTES, self)

    @property
    def digest(self) -> str:
        """A short hash of what makes this student this student (the readable name is not part of it)."""
        return _digest(f"{self.lms}\0{self.lms_id}\0{self.match}")


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
    """A name as people write it: letters of any script, spaces and name punctuation, NFC, beginning
    with a letter or digit (so no spreadsheet or LMS import reads it as a formula, even unescaped)."""
    kept = "".join(char if unicodedata.category(char)[0] in "LMN" or char in _NAME_PUNCTUATION + _JOINERS
                   else " " for char in unicodedata.normalize("NFC", text))
    return " ".join(kept.split()).lstrip(_NAME_PUNCTUATION + _JOINERS + " ")[:limit].strip()


def identify(relative: PurePath, assignment_ids: Iterable[str]) -> tuple[Identity, list[str]]:
    """The student who handed in SUBMISSIONS/relative, and notes for the CSV (e.g. Canvas' LATE mark).

    Only the first part of RELATIVE is read (see the module's text). assignment_ids: the course's
    assignments, taken out of flat file names ("ada_02_attention")."""
    top = relative.parts[0]
    lms = lms_identity(top)
    if lms:
        return lms
    if len(relative.parts) > 1:
        return _by_name(top)  # exactly: "ada " is not "ada"
    stem = top[:-len(".ipynb")] if top.lower().endswith(".ipynb") else top.rsplit(".", 1)[0] or top
    for assignment in assignment_ids:
        stem = stem.replace(assignment, " ")
    name = _DOWNLOAD_NOISE.sub(" ", stem).strip(_SEPARATORS)
    return _by_name(name, raw=top)


def lms_identity(name: str) -> tuple[Identity, list[str]] | None:
    """The LMS identity in a name at the top of a download, when it has one (the earliest-ending prefix)."""
    candidates = [(match.start("file"), kind, match) for kind, pattern in (("canvas", _CANVAS), ("moodle", _MOODLE))
                  if (match := pattern.match(name))]
    if not candidates:
        return None
    _, kind, match = min(candidates, key=lambda candidate: candidate[0])
    if kind == "moodle":
        return Identity("moodle", match["id"], "", readable(match["name"])), []
    notes = ["handed in late (the file is marked LATE by Canvas)"] if match["late"] else []
    return Identity("canvas", match["id"], "", readable(match["name"] or "")), notes


def canvas_upload(name: str) -> tuple[int, bool] | None:
    """(the file id, whether it is marked LATE) of a Canvas download's name at the top of the folder, None for
    any other name. Canvas numbers the files as they are uploaded, so of two files of one student the one with
    the larger id was uploaded later; LATE is Canvas's verdict against the due date it holds for the student."""
    found = lms_identity(name)
    match = _CANVAS.match(name)
    if found is None or found[0].lms != "canvas" or match is None:
        return None
    return int(match["file_id"]), bool(match["late"])


def _by_name(text: str, raw: str | None = None) -> tuple[Identity, list[str]]:
    if _fold(text):
        return Identity("", "", text, readable(text)), []
    return Identity("", "", f"raw:{raw or text}", ""), [
        "no student name could be read from the file or folder name, so the student id is a hash of it"]


def _fold(text: str) -> str:
    """The words of TEXT in lower case, joined by `_`, compatibility forms made plain (NFKC: fullwidth
    `ｊ` is `j`), without zero-width joiners: what a student id is made of."""
    plain = unicodedata.normalize("NFKC", text)
    return "_".join(word.lower() for word in words(plain)).replace(_JOINERS[0], "").replace(_JOINERS[1], "")


def _collision_key(student_id: str) -> str:
    """What a file system that ignores case, normalisation or compatibility forms sees of an id."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", student_id).casefold())


def student_ids(identities: Iterable[Identity], known: dict[Identity, str] | None = None) -> dict[Identity, str]:
    """A path-safe, bounded, unique id for each student.

    Ids that would coincide (also when compared as a file system that ignores case and normalisation
    does) get a hash suffix, except the one student whose name is exactly that id, if there is one:
    nobody can change a classmate's id by spelling their name another way.

    KNOWN: the ids the class folder gave in earlier runs (week after week). A student known there keeps
    that id, and a new student never takes one of them: a newcomer whose id would coincide with a known
    id gets the hash suffix, even when the name is exactly that id (the earlier student keeps it)."""
    known = dict(known or {})
    taken = {_collision_key(chosen) for chosen in known.values()}
    natural = {identity: identity.natural_id for identity in set(identities) if identity not in known}
    groups: dict[str, list[Identity]] = defaultdict(list)
    for identity, chosen in natural.items():
        groups[_collision_key(chosen)].append(identity)
    ids: dict[Identity, str] = {identity: known[identity] for identity in set(identities) if identity in known}
    for key, members in groups.items():
        for identity in members:
            chosen = natural[identity]
            if (len(members) > 1 and identity.match != chosen) or key in taken:
                chosen = _cut(chosen, MAX_ID_BYTES - 9, identity) + "-" + identity.digest
            ids[identity] = chosen
    assert len({_collision_key(chosen) for chosen in ids.values()}) == len(ids), "two students were given one id"
    assert not {_collision_key(ids[identity]) for identity in natural} & taken, "a newcomer was given a known id"
    return ids


def lookalike_notes(identities: Iterable[Identity], ids: dict[Identity, str]) -> dict[Identity, list[str]]:
    """Notes for the instructor on names that read alike: students whose readable names are the same
    text once case, normalisation and compatibility forms are set aside (they are two students, and
    the note says which other one), and names whose letters mix scripts within one word, as names made
    to look like another's do (Latin `a` and Cyrillic `а`)."""
    by_reading: dict[str, list[Identity]] = defaultdict(list)
    for identity in set(identities):
        if identity.name:
            by_reading[_collision_key(identity.name)].append(identity)
    notes: dict[Identity, list[str]] = defaultdict(list)
    for members in by_reading.values():
        for identity in members:
            others = sorted(ids[other] for other in members if other != identity)
            if others:
                more = f" and {len(others) - 5} more" if len(others) > 5 else ""
                notes[identity].append(f"another student's name reads the same ({', '.join(others[:5])}{more}): "
                                       "they are different students, told apart by their LMS id or exact name")
    for identity in set(identities):
        mixed = [word for word in words(identity.name) if len(_scripts(word)) > 1]
        if mixed and not identity.lms_id:
            scripts = " and ".join(script.capitalize() for script in sorted(_scripts(mixed[0])))
            notes[identity].append(f"flagged for review: the name mixes {scripts} letters within one word "
                                   f"({mixed[0]}), as names made to look like another's do")
    return notes


def _scripts(word: str) -> set[str]:
    """The scripts of a word's letters (after NFKC, so fullwidth and mathematical letters are plain)."""
    found = set()
    for char in unicodedata.normalize("NFKC", word):
        if unicodedata.category(char)[0] != "L":
            continue
        script = unicodedata.name(char, "").split(" ")[0]
        found.add({"CJK": "HAN"}.get(script, script))
    found.discard("")
    found.discard("MODIFIER")
    return set() if any(found <= together for together in _SCRIPTS_TOGETHER) else found


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _cut(text: str, room: int, identity: Identity) -> str:
    """TEXT when it fits in ROOM bytes of UTF-8, else its start and a hash of the whole identity."""
    if len(text.encode()) <= room:
        return text
    start = text.encode()[:room - 9].decode("utf-8", "ignore").rstrip("_")
    return f"{start or 'student'}-{identity.digest}"
