"""CSV files that spreadsheets open safely, and sheets read back from whatever spreadsheet saved them.

**Writing.** Text a student controls (names, answers, file names, reasons) must never become a formula
(OWASP's CSV injection). A cell that begins with `=`, `+`, `-`, `@`, a tab or a carriage return gets a
leading `'`. A spreadsheet that reads the comma-separated file with `;` as its separator (Excel and
LibreOffice set to German, French, ... do) starts a new cell after every `;` outside quotes, so the same
protection goes after every `;` (and tab) that a formula character follows, spaces and quotes between
them included. `unprotect` undoes exactly
this when a sheet comes back.

**Reading.** `read_sheet` takes a sheet as any spreadsheet saves it: comma, semicolon or tab separated;
UTF-8 with or without a byte-order mark, UTF-16 with one, or Windows-1252 / Latin-1; quoted or not. A
sheet it cannot read whole (no header with the needed columns, broken quoting, a row with more cells than
the header) raises `SheetError`, whose message names the file and the line.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_FORMULA = r"[=+\-@\t\r]"
_LEADING = re.compile(rf"[\s\"]*{_FORMULA}")  # spaces or quotes before it do not stop every spreadsheet
_AFTER_SEPARATOR = re.compile(rf"([;\t])(?=[\s\"]*{_FORMULA})")
_PROTECTED = re.compile(rf"([;\t])'(?=[\s\"]*{_FORMULA})")
SEPARATORS = (",", ";", "\t")


def protect(text: str) -> str:
    """TEXT as a cell that no spreadsheet runs as a formula, whether it splits cells at `,` or `;`."""
    text = _AFTER_SEPARATOR.sub(r"\1'", text)
    return "'" + text if _LEADING.match(text) else text


def unprotect(text: str) -> str:
    """The text `protect` was given (a sheet saved back by a spreadsheet keeps the added quotes)."""
    if text.startswith("'") and _LEADING.match(text, 1):
        text = text[1:]
    return _PROTECTED.sub(r"\1", text)


class SheetError(ValueError):
    """A sheet that cannot be read whole; the message names the file and the line."""


def decode(data: bytes) -> str:
    """The text of a file saved by a spreadsheet: UTF-8 (with or without a byte-order mark), UTF-16 with
    a byte-order mark, else Windows-1252 (Excel's "CSV" on Western Windows), else Latin-1."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:  # the five bytes Windows-1252 leaves undefined
        return data.decode("latin-1")


def read_sheet(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """[(line number where the row starts, {column: text})] of a sheet whose header has REQUIRED.

    Values are stripped of the protection `protect` added; empty lines are skipped."""
    try:
        text = decode(path.read_bytes())
    except OSError as error:
        raise SheetError(f"{path.name}: cannot be read ({error.strerror or error})") from None
    if "\x00" in text:
        raise SheetError(f"{path.name} line {text[: text.index(chr(0))].count(chr(10)) + 1}: a NUL byte: this is "
                         "not a text file (save the sheet as CSV)")
    header, separator = _header(text)
    names = [unprotect(name.strip()) for name in header]
    missing = [column for column in required if column not in names]
    if missing:
        found = ", ".join(repr(name) for name in names[:12] if name) or "nothing"
        raise SheetError(f"{path.name} line 1: the header has no column {', '.join(map(repr, missing))} (found "
                         f"{found}); the first line must name the columns, separated by commas or semicolons")
    rows = []
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=separator, strict=True)
    start = 1
    try:
        next(reader)
        start = reader.line_num + 1
        for values in reader:
            line, start = start, reader.line_num + 1
            if not any(value.strip() for value in values):
                continue
            if len(values) > len(names):
                raise SheetError(f"{path.name} line {line}: {len(values)} cells, but the header names "
                                 f"{len(names)} columns (a {_name(separator)} inside a cell that is not quoted?)")
            rows.append((line, {name: unprotect(value) for name, value in zip(names, values, strict=False) if name}))
    except csv.Error as error:
        raise SheetError(f"{path.name} line {start}: {error} (a quote that is never closed?)") from None
    return rows


def _header(text: str) -> tuple[list[str], str]:
    """The header row and the separator that splits it into the most cells."""
    best: tuple[list[str], str] = ([], ",")
    for separator in SEPARATORS:
        try:
            header = next(csv.reader(io.StringIO(text, newline=""), delimiter=separator), [])
        except csv.Error:
            continue
        if len(header) > len(best[0]):
            best = (header, separator)
    return best


def _name(separator: str) -> str:
    return {",": "comma", ";": "semicolon", "\t": "tab"}[separator]
