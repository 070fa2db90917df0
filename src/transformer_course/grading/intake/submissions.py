"""Find, identify, check and repair student notebooks as they come from Colab or an LMS.

Accepted layouts of the submissions folder (who handed a file in: see `identities`):

    submissions/<student>/<any name>.ipynb          one folder per student (Moodle's folders too)
    submissions/<student>_<assignment>.ipynb       flat files; Canvas names such as
    submissions/smithjo_12345_67890_02_attention.ipynb   are understood too

Every file is accounted for: a notebook gets a row; another file (a PDF, a zip) is named on its
student's rows, and a student who handed in no notebook at all gets a row saying so. Only what
machines add is passed over: macOS' __MACOSX folders and `._` files, .DS_Store, Thumbs.db,
desktop.ini, and hidden folders and files other than notebooks at the top of the folder (the
instructor's own, such as .git). A download that lies in a single folder of its own (an archive
unpacked into a folder named after it) is read inside that folder. Links are never followed: a
notebook that is a symbolic link, or a folder that is one, gets a row with the reason and nothing
behind it is read. Which assignment a notebook is comes from its content (nbgrader ids, then the
title), so names like "Copy of 02_attention (1).ipynb" are fine.

Every field the grader and nbgrader read is checked before anything else looks at it: the file is
read as JSON (UTF-8 with or without a byte-order mark, UTF-16 or UTF-32), then rebuilt as a
current-format notebook keeping only well-typed fields: cells of a known type whose source is text
(or a list of texts), cell ids, metadata whose nbgrader part has the types nbgrader expects. What
can be repaired is, and each repair is reported; what cannot is rejected with a reason a student
understands. Outputs are dropped (nbgrader clears them before running the notebook anyway). A file
too large to parse whole (hundreds of MB of saved outputs), or nested deeper than the JSON parser
goes, is read without its outputs and deep values (`trim`, in a process of its own with a time and
memory limit), graded, and the row says what was left out. How much is read is bounded (`Limits`):
a notebook with more cells, code cells or text than a grader can run in reasonable time is rejected
with the reason.

The notebook is then checked against the released version: every graded, locked and exercise cell
present once with its nbgrader metadata, no other cell claiming to be one. A notebook that fails the
check is rebuilt from the release, with the student's answers put back where they belong (cells are
aligned by content), and every repair is reported, so nothing is scored zero in silence. Originals are
never modified. `load` never raises: an unexpected error costs that file, with the reason.
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import math
import os
import re
import stat
import subprocess
import sys
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import nbformat

from transformer_course.grading.intake.identities import Identity, identify, lms_identity

_GRADED_KEYS = ("grade", "solution", "locked", "points", "task")  # what nbgrader grades by
_COMPARED_KEYS = (*_GRADED_KEYS, "schema_version")  # an old schema makes nbgrader "upgrade" the cell away
_CELL_TYPES = ("code", "markdown", "raw")
_CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_SURROGATES = re.compile("[\ud800-\udfff]")


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_points(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


# what nbgrader's cell metadata schema (v3) allows for each field it reads
_NBGRADER_FIELDS = {
    "grade": _is_bool, "solution": _is_bool, "locked": _is_bool, "task": _is_bool,
    "grade_id": lambda value: isinstance(value, str) and re.fullmatch(r"[a-zA-Z0-9_-]{1,128}", value) is not None,
    "points": _is_points,
    "schema_version": _is_count,
    "checksum": lambda value: isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}", value) is not None,
    "cell_type": lambda value: value in _CELL_TYPES,
}
# the other cell metadata kept (the rest, e.g. Colab's, is dropped: nothing grades by it)
_CELL_METADATA = {
    "tags": lambda value: isinstance(value, list) and all(isinstance(tag, str) for tag in value)
    and len(set(value)) == len(value),
    "editable": _is_bool, "deletable": _is_bool, "collapsed": _is_bool,
    "scrolled": lambda value: isinstance(value, bool) or value == "auto",
    "name": lambda value: isinstance(value, str),
    "format": lambda value: isinstance(value, str),
}


@dataclass(frozen=True)
class Limits:
    """How much of a file the grader reads; a file over a limit is rejected with the reason.

    The course's notebooks have at most 119 cells, 64 code cells and 98 KB of JSON (stage 5); each
    limit leaves a wide margin. Measured on the shared 2-core machine: 4,000 one-line code cells added
    7.6 s to grading a notebook, 20,000 took 303 s (website/instructor/grading.md, "What it accepts")."""

    file_bytes: int = 2**30  # a larger file is not read at all
    whole_bytes: int = 16 * 2**20  # a larger file is read without its outputs (trim.py)
    kept_bytes: int = 8 * 2**20  # the cells' text, outputs left out
    cells: int = 5_000
    code_cells: int = 2_000  # cells with code in them: each runs
    depth: int = 100  # a value nested deeper is left out (only `trim` reads such a file)
    trim_seconds: float = 30.0  # 300 MB of outputs took 1.8 to 3.3 s


class Unreadable(ValueError):
    """A file that is not a notebook this grader can read; the message says why, to the student."""


class TooDeep(Unreadable):
    """JSON nested deeper than Python's parser goes (it stops near 1,000 levels)."""


@dataclass(frozen=True)
class Found:
    """A file in the submissions folder: a notebook, another kind of file (never read), or a reason it
    cannot be read (a link, a device...)."""

    path: Path
    relative: PurePosixPath
    problem: str = ""
    notebook: bool = True  # False: not a .ipynb file; it is named on its student's rows, never read


@dataclass
class Submission:
    student: str  # the student id, given by the batch once the whole class is known
    assignment: str | None
    path: Path
    notebook: nbformat.NotebookNode | None = None
    status: str = "ok"  # ok | repaired | rejected | other (not a notebook: named on the student's rows)
    reasons: list[str] = field(default_factory=list)
    relative: str = ""  # where it lies in the submissions folder
    identity: Identity | None = None
    digest: str = ""  # sha256 of the bytes that were checked
    inode: tuple[int, int] | None = None  # (device, inode): hard links share it
    modified: float = 0.0
    untouched: bool = False  # the released notebook as handed out (identical copies of it prove nothing)
    release: str | None = None  # the release tag its setup cell names ("v0.1.0"), None when it names none


def printable(text: str) -> str:
    """TEXT with control, format and undecodable characters shown as <U+XXXX> (tabs, newlines: spaces)."""
    def shown(char: str) -> str:
        if char in "\t\n\r\v\f":
            return " "
        category = unicodedata.category(char)
        visible = category[0] != "C" or category == "Cn" or char in "\u200c\u200d"
        return char if visible and category not in ("Zl", "Zp") else f"<U+{ord(char):04X}>"
    return "".join(shown(char) for char in text) if not text.isprintable() else text


def _describe(value: object) -> str:
    """A JSON value's type in a student's words."""
    if value is None:
        return "empty (null)"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    return "a list" if isinstance(value, list) else "a set of fields"


def nbgrader_metadata(cell: nbformat.NotebookNode) -> dict:
    metadata = cell.get("metadata", {})
    metadata = metadata.get("nbgrader", {}) if isinstance(metadata, dict) else {}
    return metadata if isinstance(metadata, dict) else {}


def _grade_id(cell: nbformat.NotebookNode) -> str | None:
    grade_id = nbgrader_metadata(cell).get("grade_id")
    return grade_id if isinstance(grade_id, str) else None


def _title(notebook: nbformat.NotebookNode) -> str | None:
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^# (Stage \d+)\b", cell.source, re.MULTILINE)
            if match:
                return match.group(1)
    return None


class Release:
    """The released student notebooks: the reference every submission is checked against."""

    def __init__(self, folder: Path, assignment_ids: list[str]) -> None:
        self.notebooks = {a: nbformat.read(folder / a / f"{a}.ipynb", as_version=4) for a in assignment_ids}
        self.keys = {a: [_key(cell) for cell in notebook.cells] for a, notebook in self.notebooks.items()}
        owners: dict[str, set[str]] = {}
        for assignment, notebook in self.notebooks.items():
            for cell in notebook.cells:
                if _grade_id(cell):
                    owners.setdefault(_grade_id(cell), set()).add(assignment)
        # only ids that belong to one assignment tell assignments apart ("setup" is in all of them)
        self.by_grade_id = {grade_id: next(iter(found)) for grade_id, found in owners.items() if len(found) == 1}
        self.by_title = {_title(nb): a for a, nb in self.notebooks.items()}

    def identify(self, notebook: nbformat.NotebookNode, name: str) -> str | None:
        """The assignment a notebook belongs to: by its course cells, else its title, else its file name."""
        votes = Counter(self.by_grade_id[_grade_id(cell)] for cell in notebook.cells
                        if _grade_id(cell) in self.by_grade_id)
        if votes:
            return votes.most_common(1)[0][0]
        if _title(notebook) in self.by_title:
            return self.by_title[_title(notebook)]
        matches = [a for a in self.notebooks if a in name]
        return matches[0] if len(matches) == 1 else None


# --- finding the files, without following links ---------------------------------------------------

_LINK = "it is a link (symlink) to another file, so it was not read: hand in the notebook file itself"
_FOLDER_LINK = "the folder '{}' is a link (symlink) to another folder, so nothing in it was read"


_MACHINE_MADE = frozenset({"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini"})  # never handed in by anyone
_CHECKPOINTS = ".ipynb_checkpoints"


def _visible(entry: os.DirEntry, top: bool) -> bool:
    """Whether ENTRY is something a student (or the LMS) put there: not what macOS, Windows or Finder
    add, nor a hidden folder or file at the top of the folder (the instructor's own, e.g. .git), unless
    it is a notebook (a student's file saved under a name that begins with a dot)."""
    if entry.name in _MACHINE_MADE or entry.name.startswith("._"):
        return False
    return not (top and entry.name.startswith(".") and not (
        entry.name.lower().endswith(".ipynb") and not entry.is_dir(follow_symlinks=False)))


def download_root(folder: Path) -> Path:
    """The folder that holds the students: FOLDER, or the one folder in it when that folder is not
    named by an LMS and holds entries of at least two LMS students (an archive unpacked into a
    folder named after it). A student's own folder never qualifies: a student is one LMS id."""
    with os.scandir(folder) as listing:
        entries = [entry for entry in listing if _visible(entry, True)]
    if len(entries) != 1 or not entries[0].is_dir(follow_symlinks=False) or lms_identity(entries[0].name):
        return folder
    with os.scandir(entries[0].path) as listing:
        students = {found[0] for entry in listing if _visible(entry, True) and (found := lms_identity(entry.name))}
    return Path(entries[0].path) if len(students) >= 2 else folder


def discover(folder: Path) -> list[Found]:
    """Every file in the submissions folder (see `download_root`): notebooks, other files, and links or
    odd files with the reason they are not read.

    Links are reported, never followed, so nothing outside the folder is ever read."""
    root = download_root(Path(os.path.realpath(folder)))  # the folder itself may be a link: the grader chose it
    found: list[Found] = []
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted((entry for entry in listing if _visible(entry, directory == root)),
                                 key=lambda entry: entry.name)
        except OSError as error:
            if directory == root:
                raise
            found.append(Found(directory, _relative(directory, root),
                               f"the folder could not be read ({error.strerror})"))
            continue
        for entry in entries:
            path = Path(entry.path)
            # Jupyter's automatic copies in .ipynb_checkpoints are named with the files, never graded
            notebook = entry.name.lower().endswith(".ipynb") and _CHECKPOINTS not in path.parts
            try:
                if entry.is_symlink():
                    if notebook or path.is_dir():
                        problem = _LINK if notebook else _FOLDER_LINK.format(printable(entry.name))
                        found.append(Found(path, _relative(path, root), problem))
                    else:
                        found.append(Found(path, _relative(path, root), notebook=False))
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(path)
                elif notebook:
                    problem = "" if entry.is_file(follow_symlinks=False) else (
                        "it is not a regular file (a pipe, socket or device), so it was not read")
                    if not problem and not os.path.realpath(path).startswith(str(root) + os.sep):
                        problem = "its real location is outside the submissions folder, so it was not read"
                    found.append(Found(path, _relative(path, root), problem))
                else:
                    found.append(Found(path, _relative(path, root), notebook=False))
            except OSError as error:
                found.append(Found(path, _relative(path, root), f"it could not be read ({error.strerror})"))
    return sorted(found, key=lambda item: item.relative.parts)


def _relative(path: Path, root: Path) -> PurePosixPath:
    return PurePosixPath(path.relative_to(root))


# --- reading and normalising one file ---------------------------------------------------------------

@dataclass
class Read:
    """What reading a file gave: its JSON, its size and checksum, and what was left out to read it."""

    data: object
    info: os.stat_result
    digest: str  # sha256 of the whole file
    notes: list[str]


def read(path: Path, limits: Limits) -> Read:
    """The JSON in the file at PATH, refusing a link (even one swapped in since it was found) and
    anything not a file. A file larger than limits.whole_bytes, or nested deeper than the parser goes,
    is read by `trim` (saved outputs and deep values left out, and said so in the notes)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise Unreadable(_LINK) from None
        raise Unreadable(f"the file could not be opened ({error.strerror})") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable("it is not a regular file (a pipe, socket or device), so it was not read")
        if info.st_size > limits.file_bytes:
            raise Unreadable(f"the file is {_size(info.st_size)}, more than the {_size(limits.file_bytes)} the "
                             "grader reads of a notebook (a course notebook with its outputs is well under 1 MB)")
        if info.st_size <= limits.whole_bytes:
            raw = handle.read(limits.whole_bytes + 1)
            if len(raw) <= limits.whole_bytes:  # else it grew since: read it as a large file
                try:
                    data, notes = parse(raw)
                    return Read(data, info, hashlib.sha256(raw).hexdigest(), notes)
                except TooDeep:
                    pass
        text, header = _trimmed(handle.fileno(), limits)
    data, notes = parse(text)
    return Read(data, info, str(header["digest"]), _trim_notes(header, info.st_size, limits) + notes)


def _trim_notes(header: dict, size: int, limits: Limits) -> list[str]:
    """What trim.py left out, in a student's words (the file was too large, or too deep, to parse)."""
    notes = []
    if size > limits.whole_bytes:
        parts = [f"{what} ({_size(int(header[key]))})" for key, what in
                 (("outputs", "its saved outputs"), ("attachments", "its pasted images")) if header.get(key)]
        left_out = " and ".join(parts) or "its notebook metadata"
        notes.append(f"the file is {_size(size)}, more than the grader reads whole: {left_out} were left out and "
                     "its code was graded (outputs are never graded: every cell runs again)")
    if header.get("deep"):
        notes.append(f"{header['deep']} value(s) nested more than {limits.depth} levels deep (no notebook field "
                     "is) were left out")
    elif size <= limits.whole_bytes:
        notes.append("the file is nested more deeply than a JSON reader goes, in its saved outputs or notebook "
                     "metadata: those were left out (nothing grades them)")
    return notes


_TRIM = Path(__file__).with_name("trim.py")


def _trimmed(descriptor: int, limits: Limits) -> tuple[bytes, dict]:
    """(the notebook's JSON without outputs and deep values, trim.py's header), from a process of its own."""
    command = [sys.executable, "-I", "-S", str(_TRIM), str(descriptor), str(limits.depth), str(limits.kept_bytes)]
    try:
        done = subprocess.run(command, pass_fds=(descriptor,), capture_output=True, timeout=limits.trim_seconds,
                              check=False)
    except subprocess.TimeoutExpired:
        raise Unreadable(f"reading it took more than {limits.trim_seconds:g} s (a notebook takes a fraction of a "
                         "second), so it was not read") from None
    if done.returncode == 3:
        raise Unreadable(printable(done.stderr.decode("utf-8", "replace").strip())[:300])
    header, _, text = done.stdout.partition(b"\n")
    try:
        found = json.loads(header) if done.returncode == 0 else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        why = printable(done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:][0][:150]
                        if done.stderr.strip() else f"exit status {done.returncode}")
        raise Unreadable(f"the grader could not read it ({why}); please tell the instructor")
    return text, found


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GB" if count >= 2**30 else f"{count / 2**20:.1f} MB" if count >= 2**20 else (
        f"{count / 2**10:.0f} KB" if count >= 2**10 else f"{count} bytes")


def parse(raw: bytes) -> tuple[object, list[str]]:
    """The JSON in RAW and the repairs made to read it.

    UTF-8 with or without a byte-order mark, UTF-16 and UTF-32 are read as they are; other text
    (a notebook saved by an editor as Windows-1252) is read as Windows-1252 with a note. NaN and
    Infinity, which are not JSON, are read as null."""
    if not raw.strip():
        raise Unreadable("the file is empty")
    notes = []
    try:
        try:
            return json.loads(raw, parse_constant=lambda name: None), notes
        except UnicodeDecodeError:
            if b"\0" in raw:
                raise Unreadable("the file is not text (is it really a .ipynb notebook?)") from None
            text = raw.decode("cp1252", errors="replace")
            notes.append("the file was not saved as UTF-8 text; it was read as Windows-1252, "
                         "so accented letters may look wrong")
            return json.loads(text, parse_constant=lambda name: None), notes
    except RecursionError:
        raise TooDeep("not a valid notebook: its JSON is nested far too deeply") from None
    except ValueError as error:
        raise Unreadable(f"not a valid notebook: the JSON is broken ({printable(str(error))[:120]})") from None


def normalise(data: object, limits: Limits | None = None) -> tuple[dict, list[str]]:
    """A notebook in the current format (4.5) with only well-typed fields, from any parsed JSON.

    Returns the notebook (as plain JSON, without outputs or notebook metadata) and the repairs
    made, in a student's words; raises Unreadable when there is no notebook to repair, or one with
    more cells, code cells or text than LIMITS allow (a grader could not run it in reasonable time)."""
    limits = limits or Limits()
    if isinstance(data, dict) and data.get("nbformat") == 3 and isinstance(data.get("worksheets"), list):
        _check_size(sum(len(sheet.get("cells", [])) for sheet in data["worksheets"]
                        if isinstance(sheet, dict) and isinstance(sheet.get("cells"), list)), 0, 0, limits)
        try:
            data = json.loads(json.dumps(nbformat.convert(nbformat.from_dict(data), 4)))
        except Exception:  # the converter trusts its input; a broken old notebook fails anywhere in it
            raise Unreadable("an old (version 3) notebook that could not be converted") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise Unreadable("the file is JSON but not a Jupyter notebook (it has no list of cells)")
    _check_size(len(data["cells"]), 0, 0, limits)
    notes: list[str] = []
    cells = []
    for number, cell in enumerate(data["cells"], 1):
        if isinstance(cell, dict):
            cells.append(_cell(cell, number, notes))
        else:
            notes.append(f"cell {number} is {_describe(cell)}, not a cell, and was left out")
    _check_size(len(cells), sum(cell["cell_type"] == "code" and bool(cell["source"].strip()) for cell in cells),
                sum(len(cell["source"].encode("utf-8", "surrogatepass")) for cell in cells), limits)
    taken = {cell["id"] for cell in cells if cell["id"]}
    if len(taken) < len(cells):  # missing, invalid or repeated ids: nbformat 4.5 needs unique ones
        seen: set[str] = set()
        for number, cell in enumerate(cells):
            if not cell["id"] or cell["id"] in seen:
                cell["id"] = next(f"cell-{number}-{n}" for n in range(len(cells) + 1)
                                  if f"cell-{number}-{n}" not in taken)
                taken.add(cell["id"])
            seen.add(cell["id"])
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}, notes


def _check_size(cells: int, code_cells: int, text_bytes: int, limits: Limits) -> None:
    """Reject a notebook with more cells, code cells or text than LIMITS: no grader runs it in reasonable time."""
    advice = "so it was not graded: hand in the course notebook with your answers"
    if cells > limits.cells:
        raise Unreadable(f"the notebook has {cells:,} cells; the grader reads at most {limits.cells:,} (a course "
                         f"notebook has about 100), {advice}")
    if code_cells > limits.code_cells:
        raise Unreadable(f"the notebook has {code_cells:,} code cells with code in them; the grader runs at most "
                         f"{limits.code_cells:,} (a course notebook has about 50), {advice}")
    if text_bytes > limits.kept_bytes:
        raise Unreadable(f"the notebook's cells hold {_size(text_bytes)} of text; the grader reads at most "
                         f"{_size(limits.kept_bytes)} (a course notebook has about 80 KB), {advice}")


def _cell(cell: dict, number: int, notes: list[str]) -> dict:
    metadata = _cell_metadata(cell.get("metadata", {}), number, notes)
    damaged = False  # a course cell whose type or text is lost is restored from the release, not trusted
    cell_type = cell.get("cell_type")
    if cell_type not in _CELL_TYPES:
        recorded = metadata.get("nbgrader", {}).get("cell_type")
        cell_type = recorded or ("code" if "outputs" in cell or "execution_count" in cell else "markdown")
        notes.append(f"cell {number} had no valid cell type; read as a {cell_type} cell")
        damaged = True
    source = cell.get("source")
    if isinstance(source, list) and not all(isinstance(line, str) for line in source):
        notes.append(f"cell {number}'s text held items that are not text; they were left out")
        source = [line for line in source if isinstance(line, str)]
        damaged = True
    if isinstance(source, list):
        source = "".join(source)
    if not isinstance(source, str):
        was = _describe(source) if "source" in cell else "missing"
        notes.append(f"cell {number} had no text (its source was {was}); read as empty")
        source = ""
        damaged = True
    if damaged:
        metadata.pop("nbgrader", None)
    identifier = cell.get("id")
    result = {"id": identifier if isinstance(identifier, str) and _CELL_ID.fullmatch(identifier) else "",
              "cell_type": cell_type, "metadata": metadata, "source": source}
    if cell_type == "code":
        result.update(outputs=[], execution_count=None)
    elif _attachments_ok(cell.get("attachments")):
        result["attachments"] = cell["attachments"]
    if _SURROGATES.search(json.dumps(result, ensure_ascii=False)):
        result = _without_surrogates(result)
    return result


def _without_surrogates(value: object) -> object:
    """VALUE with lone surrogates (valid JSON escapes, but not UTF-8) replaced; VALUE is a few levels deep."""
    if isinstance(value, str):
        return _SURROGATES.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_surrogates(key): _without_surrogates(item) for key, item in value.items()}
    return value


def _cell_metadata(metadata: object, number: int, notes: list[str]) -> dict:
    if not isinstance(metadata, dict):
        notes.append(f"cell {number}'s metadata was {_describe(metadata)}, not a set of fields; left out")
        return {}
    kept = {key: value for key, value in metadata.items() if key in _CELL_METADATA and _CELL_METADATA[key](value)}
    if "nbgrader" in metadata:
        nbgrader = metadata["nbgrader"]
        wrong = ([key for key, valid in _NBGRADER_FIELDS.items() if key in nbgrader and not valid(nbgrader[key])]
                 if isinstance(nbgrader, dict) else ["all"])
        if wrong:
            notes.append(f"cell {number}'s grading information (nbgrader metadata) was damaged "
                         f"({', '.join(wrong)}) and was left out")
        else:
            kept["nbgrader"] = {key: value for key, value in nbgrader.items() if key in _NBGRADER_FIELDS}
    return kept


def _attachments_ok(attachments: object) -> bool:
    """Pasted images of a markdown cell: {name: {mime type: text or list of texts}}."""
    return isinstance(attachments, dict) and all(
        isinstance(name, str) and isinstance(bundle, dict) and all(
            isinstance(data, str) or (isinstance(data, list) and all(isinstance(line, str) for line in data))
            for data in bundle.values())
        for name, bundle in attachments.items())


# --- one submission ------------------------------------------------------------------------------

def load(release: Release, found: Found, limits: Limits | None = None) -> Submission:
    """Read, identify, check and if needed repair one notebook. Never raises: a file that cannot be
    read, or that breaks the grader, is a rejected submission with the reason."""
    submission = Submission("", None, found.path, relative=str(found.relative))
    submission.identity, notes = _identify(release, found)
    try:
        _check(release, found, submission, notes, limits or Limits())
    except Unreadable as error:
        _reject(submission, str(error))
    except Exception as error:  # a bug of ours costs this file, not the class
        _reject(submission, f"the grader could not check this file ({type(error).__name__}: "
                            f"{printable(str(error))[:150]}); please tell the instructor")
    return submission


def other_file(release: Release, found: Found) -> Submission:
    """A file that is not a notebook (a PDF, a zip, Jupyter's checkpoint copy): whose it is. Never read."""
    submission = Submission("", None, found.path, status="other", relative=str(found.relative))
    submission.identity = _identify(release, found)[0]
    return submission


def _identify(release: Release, found: Found) -> tuple[Identity, list[str]]:
    try:
        return identify(found.relative, list(release.notebooks))
    except Exception:  # a name that breaks the parser must not cost the file: it is named by a hash
        return Identity("", "", f"raw:{found.relative}", ""), []


def _check(release: Release, found: Found, submission: Submission, notes: list[str], limits: Limits) -> None:
    if found.problem:
        raise Unreadable(found.problem)
    done = read(found.path, limits)
    info = done.info
    submission.digest = done.digest
    submission.inode, submission.modified = (info.st_dev, info.st_ino), info.st_mtime
    if info.st_nlink > 1:
        notes.append(f"flagged for review: the file has {info.st_nlink} names (hard links), "
                     "so the same file may have been handed in for someone else")
    data, repairs = normalise(done.data, limits)
    repairs = done.notes + repairs
    notebook = nbformat.from_dict(data)
    assignment = release.identify(notebook, found.path.name)
    if assignment is None:
        raise Unreadable("cannot tell which assignment this notebook is (no course cells or title found)")
    submission.assignment = assignment
    submission.release = notebook_release(notebook)  # before any rebuild puts the released setup cell back
    released = release.notebooks[assignment]
    notebook.metadata = nbformat.from_dict(json.loads(json.dumps(released.metadata)))  # kernel as released
    submission.untouched = [_key(cell) for cell in notebook.cells] == release.keys[assignment]
    reasons = repairs[:5] + ([f"{len(repairs) - 5} more such repairs"] if len(repairs) > 5 else [])
    problems = metadata_problems(released, notebook)
    if problems:
        notebook, lost = rebuild(released, notebook)
        reasons += problems[:3]
        reasons.append("rebuilt from the released notebook with the student's answers")
        reasons += lost
    if reasons:
        submission.status = "repaired"
    emptied_answers(released, notebook)
    submission.reasons += [f"{assignment}: {reason}" for reason in notes + reasons]
    submission.notebook = notebook


def emptied_answers(released: nbformat.NotebookNode, notebook: nbformat.NotebookNode) -> list[str]:
    """Written answers the student emptied (only spaces left), or left as released but for spaces, put back
    as released, so that nbgrader scores them as it scores an answer left as released: 0, "left blank",
    not "needs manual grading" (it compares the cell with the release's checksum). Returns their ids."""
    stubs = {_grade_id(cell): cell.source for cell in released.cells
             if cell.cell_type == "markdown" and nbgrader_metadata(cell).get("solution") and _grade_id(cell)}
    put_back = []
    for cell in notebook.cells:
        stub = stubs.get(_grade_id(cell))
        if stub is not None and cell.cell_type == "markdown" and cell.source != stub and (
                not cell.source.strip() or cell.source.split() == stub.split()):
            cell.source = stub
            put_back.append(_grade_id(cell))
    return put_back


_SETUP = re.compile(r'REPOSITORY, RELEASE = "[^"]*", "(?P<tag>v\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?)"')


def notebook_release(notebook: nbformat.NotebookNode) -> str | None:
    """The release tag a student notebook's setup cell names (None: no setup cell naming one)."""
    for cell in notebook.cells[:6]:
        if cell.cell_type == "code":
            found = _SETUP.search(cell.source)
            if found:
                return found["tag"]
    return None


def _reject(submission: Submission, reason: str) -> Submission:
    submission.status = "rejected"
    submission.notebook = None
    submission.reasons.append(reason)
    return submission


def metadata_problems(released: nbformat.NotebookNode, notebook: nbformat.NotebookNode) -> list[str]:
    """What is missing or altered among the nbgrader cells ([] when nbgrader can grade it as is)."""
    problems = []
    try:
        nbformat.validate(notebook)
    except Exception as error:  # nbformat's ValidationError, or anything its validator trips on
        problems.append(f"notebook format is invalid ({printable(str(getattr(error, 'message', error)))[:80]})")
    ours = {_grade_id(cell): cell for cell in released.cells if _grade_id(cell)}
    theirs: dict[str, list[nbformat.NotebookNode]] = {}
    strangers = 0
    for cell in notebook.cells:
        if _grade_id(cell) in ours:
            theirs.setdefault(_grade_id(cell), []).append(cell)
        elif "nbgrader" in cell.metadata:
            strangers += 1
    if strangers:
        problems.append(f"{strangers} cell(s) carry grading information (nbgrader metadata) "
                        "that the released notebook does not have")
    for grade_id, cell in ours.items():
        copies = theirs.get(grade_id, [])
        if not copies:
            problems.append(f"cell '{grade_id}' is missing or lost its nbgrader metadata")
        elif len(copies) > 1:
            problems.append(f"cell '{grade_id}' appears {len(copies)} times")
        elif copies[0].cell_type != cell.cell_type or any(
                nbgrader_metadata(copies[0]).get(key) != nbgrader_metadata(cell).get(key) for key in _COMPARED_KEYS):
            problems.append(f"cell '{grade_id}' has altered nbgrader metadata")
    return problems


def _key(cell: nbformat.NotebookNode) -> tuple[str, str]:
    return cell.cell_type, "\n".join(line.rstrip() for line in cell.source.strip().splitlines())


def rebuild(
    released: nbformat.NotebookNode, notebook: nbformat.NotebookNode
) -> tuple[nbformat.NotebookNode, list[str]]:
    """The released notebook with the student's answers in its exercise cells.

    Cells are aligned by content: released cells the student left alone match exactly; a run of
    student cells standing where a released exercise cell stands is that exercise's answer;
    other student cells are kept as extra cells. Returns the notebook and what could not be found.
    """
    result = nbformat.from_dict(json.loads(json.dumps(released)))
    ours, theirs = [_key(c) for c in released.cells], [_key(c) for c in notebook.cells]
    output, lost = [], []
    matcher = difflib.SequenceMatcher(a=ours, b=theirs, autojunk=False)
    for operation, i1, i2, j1, j2 in matcher.get_opcodes():
        released_block = result.cells[i1:i2]
        student_code = [c for c in notebook.cells[j1:j2] if c.cell_type == "code" and c.source.strip()]
        exercises = [c for c in released_block if nbgrader_metadata(c).get("solution")]
        if operation == "equal":
            output += released_block
            continue
        written = [c for c in exercises if c.cell_type == "markdown"]  # answers graded by hand
        if written:
            exercises = [c for c in exercises if c.cell_type != "markdown"]
            released_text = {_key(c) for c in released.cells}
            student_text = [c for c in notebook.cells[j1:j2] if c.cell_type == "markdown" and c.source.strip()
                            and _key(c) not in released_text]
            for answer_cell, answer in zip(written, student_text, strict=False):
                answer_cell.source = answer.source
            lost += [f"written answer '{_grade_id(c)}' not found: graded as not answered"
                     for c in written[len(student_text):]]
            if len(student_text) > len(written):
                written[-1].source = "\n\n".join(cell.source for cell in student_text[len(written) - 1:])
            if not exercises:
                output += released_block
                continue
        if exercises:
            if not student_code:
                lost += [f"exercise cell '{_grade_id(c)}' not found: graded as not answered" for c in exercises]
            elif len(exercises) == len(student_code):
                for exercise, answer in zip(exercises, student_code, strict=True):
                    exercise.source = answer.source
            else:
                exercises[0].source = "\n\n".join(cell.source for cell in student_code)
            output += released_block
        elif operation == "delete":
            output += released_block  # deleted given cells come back
        else:  # the student's own or edited plain cells stay theirs; graded and locked cells are restored
            output += [c for c in released_block if c.cell_type == "markdown" or nbgrader_metadata(c)]
            output += [nbformat.from_dict({"id": f"extra-{j1}-{n}", "cell_type": "code", "metadata": {}, "outputs": [],
                                           "execution_count": None, "source": cell.source})
                       for n, cell in enumerate(student_code)]
    result.cells = output
    return result, lost


# --- across the class ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Handed:
    """One notebook handed in, as the copy check compares them (this folder's, or an earlier week's record)."""

    student: str
    assignment: str
    relative: str  # where it lay in its downloads folder
    digest: str  # sha256 of its bytes
    inode: tuple[int, int] | None = None  # (device, inode) when it was read
    run: str = ""  # the run that read it: only files read in one run can be the same file on disk
    untouched: bool = False  # the released notebook as handed out


def shared_file_flags(handed: list[Handed]) -> list[list[str]]:
    """For each notebook of HANDED, the flags for review of one file handed in by several students: the same file
    through hard links, or byte-identical copies, in one downloads folder or across the weeks' (every student
    of a group is named, and each names the others). Copies of the untouched released notebook prove nothing."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for number, item in enumerate(handed):
        if item.digest and item.assignment and not item.untouched:
            groups[item.assignment, item.digest].append(number)
    flags: list[list[str]] = [[] for _ in handed]
    for members in groups.values():
        for number in members:
            item = handed[number]
            others = [handed[other] for other in members if handed[other].student != item.student]
            if not others:
                continue
            named = ", ".join(f"{other.student} ({printable(other.relative)})" for other in others[:3])
            more = f" and {len(others) - 3} more" if len(others) > 3 else ""
            linked = [other.student for other in others if other.inode is not None and other.inode == item.inode
                      and other.run == item.run]
            how = f"; it is the very same file on disk (a hard link) as {', '.join(linked[:3])}'s" if linked else ""
            flags[number].append(f"{item.assignment}: flagged for review: the same notebook, byte for byte, was "
                                 f"handed in by {len(others)} other student(s): {named}{more}{how}")
    return flags


def flag_shared_files(submissions: list[Submission]) -> None:
    """Flag for review (not reject) one file handed in by several students of one downloads folder: the same
    file through hard links, or byte-identical copies (`shared_file_flags`)."""
    handed = [Handed(s.student, s.assignment or "", s.relative, s.digest, s.inode, "", s.untouched)
              for s in submissions]
    for submission, flags in zip(submissions, shared_file_flags(handed), strict=True):
        submission.reasons += flags
