"""Sheets as Excel workbooks (.xlsx): written for a person to fill in, read back cell by cell.

A workbook needs none of the CSV's guesses (separator, encoding, decimal comma) and none of its
protection: every text cell is written as text (never a formula, whatever it begins with), numbers as
numbers, and the rows read back are numbered as the spreadsheet shows them (the header is row 1). Text
an .xlsx file cannot hold (control characters) is shown as U+FFFD, and text longer than the 32,767
characters a cell holds is cut, saying so.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time
from pathlib import Path

CELL_LIMIT = 32_767  # characters in one cell (Excel's limit)
_CUT = " … (cut: the whole text is on the answer pages)"
XLSX_MAGIC = b"PK\x03\x04"  # an .xlsx file is a zip archive


class WorkbookError(ValueError):
    """A workbook that cannot be read; the message names the file."""


def _text(value: str) -> str:
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE

    value = ILLEGAL_CHARACTERS_RE.sub("\ufffd", value)
    return value if len(value) <= CELL_LIMIT else value[: CELL_LIMIT - len(_CUT)] + _CUT


def write_workbook(path: Path, header: Sequence[str], rows: Iterable[Sequence[str | float | None]], *,
                   widths: dict[str, int] | None = None, wrap: Iterable[str] = ()) -> Path:
    """PATH: one worksheet with HEADER (bold, frozen) and ROWS; str values become text cells, numbers
    number cells, None an empty cell. WIDTHS: {column: width in characters}; WRAP: columns whose text
    wraps. The file is written beside PATH, then renamed over it (a reader never sees half of it)."""
    from openpyxl import Workbook
    from openpyxl.styles import Alignment, Font
    from openpyxl.utils import get_column_letter

    book = Workbook()
    sheet = book.active
    sheet.title = "grading"
    wrapped = set(wrap)
    for column, name in enumerate(header, 1):
        cell = sheet.cell(row=1, column=column)
        cell.value, cell.data_type, cell.font = _text(name), "s", Font(bold=True)
        sheet.column_dimensions[get_column_letter(column)].width = (widths or {}).get(name, max(10, len(name) + 2))
    for number, values in enumerate(rows, 2):
        for column, value in enumerate(values, 1):
            if value is None or value == "":
                continue
            cell = sheet.cell(row=number, column=column)
            if isinstance(value, str):
                cell.value = _text(value)
                cell.data_type = "s"  # text, even when it begins with "=": no formula is ever written
                cell.quotePrefix = True  # and Excel keeps it text when the cell is edited
            else:
                cell.value = value
            if header[column - 1] in wrapped:
                cell.alignment = Alignment(wrap_text=True, vertical="top")
    sheet.freeze_panes = "A2"
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(descriptor)
    try:
        book.save(temporary)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def _cell_text(value: object) -> str:
    """A cell's value as the text a CSV of it would hold (2.5 -> "2.5", 3.0 -> "3")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return str(value)


def read_workbook(path: Path) -> list[list[str]]:
    """The first worksheet's rows as text, row 1 first; an empty row is [] (so index + 1 is the row
    number the spreadsheet shows)."""
    try:
        from openpyxl import load_workbook
    except ImportError:
        raise WorkbookError(f"{path.name}: reading an Excel workbook needs openpyxl (pip install -e \".[grading]\"); "
                            "or save the sheet as CSV") from None
    try:
        book = load_workbook(path, data_only=True)
    except Exception as error:  # noqa: BLE001  (zipfile, XML and openpyxl errors alike: not a workbook)
        raise WorkbookError(f"{path.name}: cannot be read as an Excel workbook (.xlsx): {error} (save the sheet as "
                            ".xlsx or CSV)") from None
    try:
        sheet = book.worksheets[0]
        rows = []
        for values in sheet.iter_rows(values_only=True):
            cells = [_cell_text(value) for value in values]
            while cells and not cells[-1]:
                cells.pop()
            rows.append(cells)
        return rows
    finally:
        book.close()
