"""CSV files that spreadsheets open safely, and sheets read back from whatever spreadsheet saved them.

**Writing.** Text a student controls (names, answers, file names, reasons) must never become a formula
(OWASP's CSV injection). A cell that begins with `=`, `+`, `-`, `@`, a tab or a carriage return gets a
leading `'`. A spreadsheet that reads the comma-separated file with `;` as its separator (Excel and
LibreOffice set to German, French, ... do) starts a new cell after every `;` outside quotes, so the same
protection goes after every `;` (and tab) that a formula character follows, spaces and quotes between
them included. `unprotect` undoes exactly
this when a sheet comes back. A CSV for people starts with a UTF-8 byte-order mark (`EXCEL_BOM`): without
it Excel reads UTF-8 as the Windows code page of its language, so "Größe" shows as "GrÃ¶ÃŸe".

**Reading.** `read_sheet` takes a sheet as any spreadsheet saves it: an Excel workbook (.xlsx, see
`workbook`), or a CSV: comma, semicolon or tab separated; UTF-8 with or without a byte-order mark, UTF-16
with one, or Windows-1252 / Latin-1; quoted or not. Rows are numbered as the spreadsheet shows them: the
header is row 1 and every record one row, however many lines a quoted cell spans. A sheet it cannot read
whole (no header with the needed columns, broken quoting, a row with more cells than the header) raises
`SheetError`, whose message names the file, the row and, where the row says, the student and question.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from transformer_course.grading.outputs.files import replace_atomically
from transformer_course.grading.outputs.workbook import XLSX_MAGIC, WorkbookError, read_workbook

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_FORMULA = r"[=+\-@\t\r]"
_LEADING = re.compile(rf"[\s\"]*{_FORMULA}")  # spaces or quotes before it do not stop every spreadsheet
_AFTER_SEPARATOR = re.compile(rf"([;\t])(?=[\s\"]*{_FORMULA})")
_PROTECTED = re.compile(rf"([;\t])'(?=[\s\"]*{_FORMULA})")
SEPARATORS = (",", ";", "\t")
EXCEL_BOM = "\ufeff"  # written first, as UTF-8: Excel then reads the file as UTF-8
CITED = ("student", "question")  # the columns a refusal names, besides the row


def protect(text: str) -> str:
    """TEXT as a cell that no spreadsheet runs as a formula, whether it splits cells at `,` or `;`."""
    text = _AFTER_SEPARATOR.sub(r"\1'", text)
    return "'" + text if _LEADING.match(text) else text


def unprotect(text: str) -> str:
    """The text `protect` was given (a sheet saved back by a spreadsheet keeps the added quotes)."""
    if text.startswith("'") and _LEADING.match(text, 1):
        text = text[1:]
    return _PROTECTED.sub(r"\1", text)


def write_csv(path: Path, rows: Iterable[Iterable[object]]) -> Path:
    """PATH: ROWS as a CSV a person opens in Excel (a UTF-8 byte-order mark first, comma separated), replaced
    whole (`replace_atomically`). The caller protects text a student controls (`protect`)."""
    def write(handle) -> None:  # noqa: ANN001
        handle.write(EXCEL_BOM)
        csv.writer(handle).writerows(rows)

    return replace_atomically(path, write, newline="")


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


def decimal(text: str) -> float:
    """A number as a spreadsheet or an LMS writes it: 2.5, 2,5 (a decimal comma) or 2 (ValueError otherwise)."""
    return float(text.replace(",", ".") if text.count(",") == 1 and "." not in text else text)


def read_sheet(path: Path, required: tuple[str, ...], cite: tuple[str, ...] = CITED,
               ) -> list[tuple[int, dict[str, str]]]:
    """[(the row as the spreadsheet numbers it, {column: text})] of a sheet whose header has REQUIRED.

    An .xlsx workbook is read as such, anything else as CSV. CSV values are stripped of the protection
    `protect` added; empty rows are skipped (and counted). A refusal names the columns CITE of its row."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SheetError(f"{path.name}: cannot be read ({error.strerror or error})") from None
    if data.startswith(b"\xd0\xcf\x11\xe0"):  # an OLE file: Excel 97-2003's .xls
        raise SheetError(f"{path.name}: an Excel 97-2003 workbook (.xls): save the sheet as .xlsx or CSV")
    if data.startswith(XLSX_MAGIC) or path.suffix.lower() == ".xlsx":
        try:
            records = read_workbook(path)
        except WorkbookError as error:
            raise SheetError(str(error)) from None
        return _rows(path, records[0] if records else [], enumerate(records[1:], 2), required, cite,
                     clean=lambda value: value, separator="")
    text = decode(data)
    if "\x00" in text:
        row, values = _record_at(text, text.index("\x00"))
        raise SheetError(f"{path.name} row {row}{_who(_header(text)[0], values, cite)}: a NUL byte: this is not a "
                         "text file (save the sheet as CSV or .xlsx)")
    header, separator = _header(text)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=separator, strict=True)

    def records():  # noqa: ANN202  (row number, cells), the header being row 1
        number, start = 1, 1
        try:
            next(reader, None)
            while True:
                number, start = number + 1, reader.line_num + 1
                values = next(reader, None)
                if values is None:
                    return
                yield number, values
        except csv.Error as error:
            lines = io.StringIO(text, newline="").readlines()
            started = _loose(lines[start - 1], separator) if start <= len(lines) else []
            raise SheetError(f"{path.name} row {number}{_who(header, started, cite)}: {error} (a quote that is "
                             "never closed?)") from None

    return _rows(path, header, records(), required, cite, separator=separator, clean=unprotect)


def _rows(path: Path, header: list[str], records: Iterable[tuple[int, list[str]]], required: tuple[str, ...],
          cite: tuple[str, ...], *, clean: Callable[[str], str], separator: str,
          ) -> list[tuple[int, dict[str, str]]]:
    names = [clean(name.strip()) for name in header]
    missing = [column for column in required if column not in names]
    if missing:
        found = ", ".join(repr(name) for name in names[:12] if name) or "nothing"
        raise SheetError(f"{path.name} row 1: the header has no column {', '.join(map(repr, missing))} (found "
                         f"{found}); the first row must name the columns, separated by commas or semicolons")
    rows = []
    for number, values in records:
        if not any(value.strip() for value in values):
            continue
        if len(values) > len(names):
            hint = f" (a {_name(separator)} inside a cell that is not quoted?)" if separator else ""
            raise SheetError(f"{path.name} row {number}{_who(names, values, cite)}: {len(values)} cells, but the "
                             f"header names {len(names)} columns{hint}")
        rows.append((number, {name: clean(value) for name, value in zip(names, values, strict=False) if name}))
    return rows


def who(row: dict[str, str], cite: tuple[str, ...] = CITED) -> str:
    """" (student 'ada', question 'attn_q_scale')": what a refusal of ROW names besides its row number."""
    named = [f"{column} {row[column].strip()!r}" for column in cite if row.get(column, "").strip()]
    return f" ({', '.join(named)})" if named else ""


def _who(header: list[str], values: list[str], cite: tuple[str, ...]) -> str:
    names = [unprotect(name.strip()) for name in header]
    return who(dict(zip(names, values, strict=False)), cite)


def _loose(line: str, separator: str) -> list[str]:
    """The cells of one line, read without insisting on closed quotes."""
    try:
        return next(csv.reader([line], delimiter=separator), [])
    except csv.Error:
        return []


def _record_at(text: str, position: int) -> tuple[int, list[str]]:
    """(the row number, the cells so far) of the record at POSITION in TEXT."""
    before = text[:position]
    separator = _header(text)[1] if before.strip() else ","
    try:
        records = list(csv.reader(io.StringIO(before, newline=""), delimiter=separator))
    except csv.Error:
        records = [[]] * (before.count("\n") + 1)
    if not before or before.endswith(("\n", "\r")):
        return len(records) + 1, []
    return len(records), records[-1] if records else []


def read_table(data: bytes) -> list[list[str]]:
    """Every record of a CSV as a spreadsheet saved it (any encoding `decode` reads; comma, semicolon or tab
    separated, the separator that splits the header into the most cells), row 1 first."""
    text = decode(data)
    return list(csv.reader(io.StringIO(text, newline=""), delimiter=_header(text)[1]))


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
