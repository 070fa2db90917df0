"""CSV cells no spreadsheet runs, whatever its separator, and sheets read back from any spreadsheet: comma or
semicolon, UTF-8 with or without a byte-order mark, UTF-16, Windows-1252, quoted or not; what cannot be read
whole is refused with its line. Cheap: no grading."""

import csv
import io
import re

import pytest

from transformer_course.grading.outputs.spreadsheet import SheetError, protect, read_sheet, unprotect

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


def test_a_cell_on_several_lines_keeps_the_line_numbers_right(tmp_path):
    rows = read_sheet(write(tmp_path / "sheet.csv", [SHEET[0], ["a", "q", "s", "1", "two\nlines"], [], SHEET[2]]),
                      ("score",))
    assert [line for line, _ in rows] == [2, 5]


@pytest.mark.parametrize(("content", "message"), [
    (b"assignment|question|student|score\n02|q|ada|1\n", r"sheet.csv line 1: the header has no column 'assignment'"),
    (b"assignment,question,student,score\n02,q,ada,1\n02,q,\"bo,1\n", r"sheet.csv line 3: .*quote"),
    (b"assignment,question,student,score\n02,q,ada,1\n02,q,bo,1,5,extra\n", r"sheet.csv line 3: 6 cells"),
    (b"assignment,question,student,score\n02,q,ada,1\x00\n", r"sheet.csv line 2: a NUL byte"),
    (b"", r"sheet.csv line 1: the header has no column"),
])
def test_a_sheet_that_cannot_be_read_whole_is_refused_with_its_line(tmp_path, content, message):
    (tmp_path / "sheet.csv").write_bytes(content)
    with pytest.raises(SheetError, match=message):
        read_sheet(tmp_path / "sheet.csv", ("assignment", "question", "student", "score"))
