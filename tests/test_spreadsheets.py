"""CSV cells no spreadsheet runs, whatever its separator, and sheets read back from any spreadsheet: an Excel
workbook, or CSV with comma or semicolon, UTF-8 with or without a byte-order mark, UTF-16, Windows-1252, quoted
or not; what cannot be read whole is refused with the row the spreadsheet shows, the student and the question.
Our CSVs start with a byte-order mark, so Excel reads them as UTF-8. Cheap: no grading."""

import csv
import io
import re
import zipfile

import openpyxl
import pytest

from transformer_course.grading.outputs.spreadsheet import SheetError, protect, read_sheet, unprotect, write_csv
from transformer_course.grading.outputs.workbook import CELL_LIMIT, write_workbook

HOSTILE = ["=1+1", "+SUM(A1)", "-2+3", "@SUM(A1)", "\tx", "\rx", "ok; =HYPERLINK(\"http://x\")", "a;\"=1\"",
           "a;\t=1", "x;-1", " =1", "- missing the embedding scale"]
HONEST = ["ada", "plain; text", "3 points", "it's fine", "v1e5", "Ünïcödé; ok", "line one\nline two"]


def spreadsheet_cells(line: str, separator: str) -> list[str]:
    """The cells a spreadsheet makes of one line of the file with SEPARATOR (quotes respected)."""
    return next(csv.reader(io.StringIO(line), delimiter=separator))


@pytest.mark.parametrize("separator", [",", ";"])
def test_no_cell_starts_a_formula_whichever_separator_the_spreadsheet_uses(separator):
    for text in HOSTILE + HONEST:
        buffer = io.StringIO()
        csv.writer(buffer).writerow(["name", protect(text), "3"])
        for cell in spreadsheet_cells(re.sub(r"[\r\n]", " ", buffer.getvalue()), separator):
            assert not re.match(r"[\s\"]*[=+\-@]", cell) and not cell.startswith(("\t", "\r")), (text, cell)


def test_protection_is_undone_exactly_and_honest_text_is_untouched():
    for text in HOSTILE + HONEST:
        assert unprotect(protect(text)) == text
    for text in HONEST:
        assert protect(text) == text


def write(path, rows, separator=",", encoding="utf-8", quoting=csv.QUOTE_MINIMAL):
    buffer = io.StringIO()
    csv.writer(buffer, delimiter=separator, quoting=quoting).writerows(rows)
    path.write_bytes(buffer.getvalue().encode(encoding))
    return path


SHEET = [["assignment", "question", "student", "score", "comment"],
         ["02_attention", "attn_q_scale", "ada", "2,5", "'- missing the embedding scale"],
         ["02_attention", "attn_q_mask", "björn", "3", "Très bien; =not a formula"]]


@pytest.mark.parametrize(("separator", "encoding", "quoting"), [
    (",", "utf-8", csv.QUOTE_MINIMAL), (";", "utf-8-sig", csv.QUOTE_ALL), (";", "cp1252", csv.QUOTE_MINIMAL),
    (",", "latin-1", csv.QUOTE_NONNUMERIC), ("\t", "utf-16", csv.QUOTE_MINIMAL), (",", "utf-8-sig", csv.QUOTE_ALL)])
def test_a_sheet_from_any_spreadsheet_reads_the_same(tmp_path, separator, encoding, quoting):
    rows = read_sheet(write(tmp_path / "sheet.csv", SHEET, separator, encoding, quoting),
                      ("assignment", "question", "student", "score"))
    assert [line for line, _ in rows] == [2, 3]
    assert rows[0][1]["comment"] == "- missing the embedding scale"  # the export's protection undone
    assert rows[1][1]["student"] == "björn" and rows[1][1]["comment"] == "Très bien; =not a formula"
    assert rows[0][1]["score"] == "2,5"


def test_rows_are_numbered_as_the_spreadsheet_shows_them_not_by_text_line(tmp_path):
    """A quoted cell on several lines is one row, and an empty line is an (empty) row: the header is row 1."""
    rows = read_sheet(write(tmp_path / "sheet.csv", [SHEET[0], ["a", "q", "s", "1", "two\nlines\nand\nfour"], [],
                                                     SHEET[2]]), ("score",))
    assert [line for line, _ in rows] == [2, 4]


ANSWER = "Because the\nvariance grows\nwith d_k.\n\nSo we divide."  # five text lines, one cell


def long_sheet(bad_rows):
    """A grading sheet whose answers span five text lines each; BAD_ROWS: {spreadsheet row: cells}."""
    rows = [["assignment", "question", "student", "score", "answer"]]
    for number in range(2, max(bad_rows) + 1):
        rows.append(bad_rows.get(number, ["02_attention", "attn_q_scale", f"s{number}", "1", ANSWER]))
    return rows


@pytest.mark.parametrize(("bad", "message"), [
    (["02_attention", "attn_q_mask", "ada", "1", ANSWER, "extra", "cells"],
     r"sheet.csv row 11 \(student 'ada', question 'attn_q_mask'\): 7 cells, but the header names 5 columns"),
    (["02_attention", "attn_q_heads", "bo", "1", "x\x00y"],
     r"sheet.csv row 11 \(student 'bo', question 'attn_q_heads'\): a NUL byte"),
])
def test_a_refusal_names_the_row_the_spreadsheet_shows_the_student_and_the_question(tmp_path, bad, message):
    path = write(tmp_path / "sheet.csv", long_sheet({11: bad}))
    assert path.read_text().count("\n") > 40  # row 11 starts on text line 46
    with pytest.raises(SheetError, match=message):
        read_sheet(path, ("assignment", "question", "student", "score"))


def test_a_quote_never_closed_is_refused_at_the_row_where_it_opens(tmp_path):
    before, after = io.StringIO(), io.StringIO()
    csv.writer(before).writerows(long_sheet({5: ["02_attention", "attn_q_scale", "s5", "1", ANSWER]}))
    csv.writer(after).writerows(long_sheet({9: ["02_attention", "attn_q_scale", "s9", "1", ANSWER]})[1:])
    opened = '02_attention,attn_q_mask,s6,1,"an answer that\nnever closes its quote\r\n'
    path = tmp_path / "sheet.csv"
    path.write_text(before.getvalue() + opened + after.getvalue(), newline="")
    with pytest.raises(SheetError, match=r"sheet.csv row 6 \(student 's6', question 'attn_q_mask'\): .*quote"):
        read_sheet(path, ("assignment", "question", "student", "score"))


@pytest.mark.parametrize(("content", "message"), [
    (b"assignment|question|student|score\n02|q|ada|1\n", r"sheet.csv row 1: the header has no column 'assignment'"),
    (b"assignment,question,student,score\n02,q,ada,1\n02,q,\"bo,1\n", r"sheet.csv row 3 \(.*question 'q'\): .*quote"),
    (b"assignment,question,student,score\n02,q,ada,1\n02,q,bo,1,5,extra\n",
     r"sheet.csv row 3 \(student 'bo', question 'q'\): 6 cells"),
    (b"assignment,question,student,score\n02,q,ada,1\x00\n", r"sheet.csv row 2 \(student 'ada', question 'q'\): a NUL"),
    (b"", r"sheet.csv row 1: the header has no column"),
])
def test_a_sheet_that_cannot_be_read_whole_is_refused_with_its_row(tmp_path, content, message):
    (tmp_path / "sheet.csv").write_bytes(content)
    with pytest.raises(SheetError, match=message):
        read_sheet(tmp_path / "sheet.csv", ("assignment", "question", "student", "score"))


# --- what we write: a byte-order mark for Excel, and workbooks --------------------------------------------

def test_our_csv_starts_with_a_byte_order_mark_and_reads_back(tmp_path):
    """Without the mark a German Excel reads UTF-8 as Windows-1252 ("GrÃ¶ÃŸe"); our own reader takes both."""
    path = write_csv(tmp_path / "out.csv", [["assignment", "question", "student", "score", "comment"],
                                            ["02", "q", "björn", "2.5", protect("=Größe; -1")]])
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and data.count(b"\xef\xbb\xbf") == 1
    assert data[3:].decode("utf-8").startswith("assignment,question")
    ((row, cells),) = read_sheet(path, ("assignment", "question", "student", "score"))
    assert row == 2 and cells["student"] == "björn" and cells["comment"] == "=Größe; -1"


HEADER = ["assignment", "question", "student", "points", "score", "comment", "answer"]


def exported_workbook(path):
    rows = [["02_attention", "attn_q_scale", "ada", 3.0, None, "", "=HYPERLINK(\"http://x\")"],
            ["02_attention", "attn_q_mask", "björn", 2.0, 1.5, "graded before", "line one\nline two\x07"],
            ["02_attention", "attn_q_heads", "@cy", 2.0, None, "", "x" * (CELL_LIMIT + 10)]]
    return write_workbook(path, HEADER, rows, wrap=("answer",))


def test_an_xlsx_sheet_round_trips_what_a_person_fills_in(tmp_path):
    """Export to .xlsx, a person fills in scores (numbers, or text with a decimal comma) and comments in
    Excel, import reads them back with the rows the spreadsheet shows; no text ever became a formula."""
    path = exported_workbook(tmp_path / "grading.xlsx")
    with zipfile.ZipFile(path) as archive:
        xml = archive.read("xl/worksheets/sheet1.xml").decode()
    assert "<f>" not in xml  # "=HYPERLINK(...)" is stored as text, not as a formula
    book = openpyxl.load_workbook(path)
    sheet = book.active
    assert sheet["G2"].data_type == "s" and sheet["G2"].value == "=HYPERLINK(\"http://x\")"
    assert sheet["D2"].value == 3 and sheet["E3"].value == 1.5  # numbers stay numbers
    sheet["E2"] = 2.5  # what Excel stores when a person types 2,5 (German) or 2.5
    sheet["F2"] = "- missing the scale; =not a formula"
    sheet["E4"] = "1,5"  # a score typed as text
    for column, value in enumerate(["02_attention", "attn_q_scale", "dee", 3, 0, "Größe"], 1):
        sheet.cell(row=6, column=column, value=value)  # row 5 left empty
    book.save(path)
    rows = read_sheet(path, ("assignment", "question", "student", "score"))
    assert [number for number, _ in rows] == [2, 3, 4, 6]
    first, second, third, fourth = (cells for _, cells in rows)
    assert first["score"] == "2.5" and first["comment"] == "- missing the scale; =not a formula"
    assert first["answer"] == "=HYPERLINK(\"http://x\")" and first["points"] == "3"
    assert second["student"] == "björn" and second["score"] == "1.5" and second["answer"] == "line one\nline two\ufffd"
    assert third["student"] == "@cy" and third["score"] == "1,5" and len(third["answer"]) == CELL_LIMIT
    assert third["answer"].endswith("(cut: the whole text is on the answer pages)")
    assert fourth["comment"] == "Größe" and fourth["score"] == "0"


def test_a_workbook_refusal_names_the_row_the_student_and_the_question(tmp_path):
    path = exported_workbook(tmp_path / "grading.xlsx")
    book = openpyxl.load_workbook(path)
    book.active["J3"] = "stray"  # a cell beyond the header's columns
    book.save(path)
    with pytest.raises(SheetError, match=r"grading.xlsx row 3 \(student 'björn', question 'attn_q_mask'\): 10 cells"):
        read_sheet(path, ("assignment", "question", "student", "score"))
    (tmp_path / "broken.xlsx").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(SheetError, match=r"broken.xlsx: cannot be read as an Excel workbook"):
        read_sheet(tmp_path / "broken.xlsx", ("score",))
    (tmp_path / "old.xls").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504))
    with pytest.raises(SheetError, match=r"old.xls: an Excel 97-2003 workbook \(.xls\): save the sheet as .xlsx"):
        read_sheet(tmp_path / "old.xls", ("score",))


def test_without_openpyxl_a_workbook_is_refused_saying_what_to_install(tmp_path, monkeypatch):
    path = exported_workbook(tmp_path / "grading.xlsx")
    monkeypatch.setitem(__import__("sys").modules, "openpyxl", None)  # an environment from before the extra had it
    with pytest.raises(SheetError, match=r"grading.xlsx: reading an Excel workbook needs openpyxl"):
        read_sheet(path, ("score",))
