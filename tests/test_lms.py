"""Grades for Canvas and Moodle from scores.csv, read back the way each LMS's importer reads them.

`canvas_import` follows Canvas's gradebook import (Grades > Import): a header with Student and ID, the
"Points Possible" row, rows matched by the user id in `ID`, and every cell compared with the score Canvas
holds, an empty cell included (an empty cell against a score is a change). `moodle_import` follows
Moodle's offline grading worksheet import (mod/assign/feedback/offline: process_import_grades and its
grade_importer): the columns Identifier, Grade and Last modified (grade) by name, "Participant N" matched
by N, a row skipped when its grade is empty or equal to Moodle's, when Moodle's grade was modified more
than 60 s after the sheet's stamp (unless "ignore modified" is ticked), or when it exceeds the assignment's
maximum; a feedback column replaces the comments of every row that is not stale. Cheap: no grading."""

import csv
import html
import re
import zipfile
from datetime import datetime

import nbformat
import pytest

from transformer_course.grading.outputs import lms

COLUMNS = ["student", "name", "lms_id", "assignment", "autograded", "autograded_max", "manual", "manual_max",
           "manual_status", "total", "max", "status", "notebook", "reasons", "file"]


def write_scores(folder, rows, extra=()):
    folder.mkdir(parents=True, exist_ok=True)
    columns = [*COLUMNS[:4], *extra, *COLUMNS[4:]]
    with open(folder / "scores.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row.get(key, "") for key in columns})


def row(student, name, lms_id, assignment, total, maximum, file, status="graded", manual_status="graded by hand",
        **cells):
    return {"student": student, "name": name, "lms_id": lms_id, "assignment": assignment, "total": total,
            "max": maximum, "file": file, "status": status, "manual_status": manual_status, **cells}


def read(path):
    """The rows of one of our CSV files, which start with a UTF-8 byte-order mark (for Excel)."""
    assert path.read_bytes().startswith(b"\xef\xbb\xbf"), f"{path.name}: no byte-order mark"
    with open(path, newline="", encoding="utf-8-sig") as handle:
        return list(csv.reader(handle))


# --- the importers, as each LMS reads the file ---------------------------------------------------------

CANVAS_FIXED = {"Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Integration ID", "Root Account"}


def canvas_import(path, holds):
    """{(user id, column): (score Canvas holds, score after the import)} for every cell the import changes.
    HOLDS: {user id: {column: score}}."""
    with open(path, newline="", encoding="utf-8") as handle:  # Canvas reads the byte-order mark as part of "Student"
        table = list(csv.reader(handle))
    header = table[0]
    assert "Student" in header[0] and "ID" in header[1], "Canvas needs Student and ID first"  # it tests include?
    # Canvas drops the student columns by position (so "\ufeffStudent" is one of them), then its own totals
    assignments = [(index, title) for index, title in enumerate(header) if index > 1 and title not in CANVAS_FIXED]
    assert assignments
    body = table[1:]
    if body and body[0][0].strip() == "Points Possible":
        points = {title: float(body[0][index]) for index, title in assignments}
        assert all(value > 0 for value in points.values())
        body = body[1:]
    changes = {}
    for line in body:
        user = line[1]
        assert user.isdigit(), f"Canvas matches rows by user id: {line}"
        for index, title in assignments:
            new = line[index].strip() if index < len(line) else ""
            old = holds.get(user, {}).get(title, "")
            if (float(new) if new else None) != (float(old) if old else None):
                changes[user, title] = (old, new)
    return changes


def moodle_import(path, holds, maximum, ignore_modified=False):
    """What Moodle's worksheet import changes. HOLDS: {participant: (grade, modified datetime, comments)};
    returns ({participant: new grade}, {participant: new comments}). Moodle's csv_import_reader trims a
    UTF-8 byte-order mark."""
    table = read(path)
    columns = table[0]
    identifier, grade, modified = (columns.index(name) for name in ("Identifier", "Grade", "Last modified (grade)"))
    feedback = columns.index("Feedback comments") if "Feedback comments" in columns else None
    grades, comments = {}, {}
    for line in table[1:]:
        participant = line[identifier].removeprefix("Participant ")
        value, stamp = line[grade], datetime.strptime(line[modified], "%Y-%m-%d %H:%M:%S").timestamp()
        held = holds.get(participant)
        stale = held is not None and held[1].timestamp() > stamp + 60
        skip = (held is not None and held[0] == (float(value) if value else None)) or value == "" or float(value) < 0
        skip = skip or (stale and not ignore_modified) or float(value or 0) > maximum
        if not skip:
            grades[participant] = float(value)
        if feedback and (ignore_modified or not stale):
            old = held[2] if held else ""
            if line[feedback] != old:
                comments[participant] = line[feedback]
    return grades, comments


# --- Canvas ------------------------------------------------------------------------------------------

CANVAS_ROWS = [
    row("smithjohn_12345", "smithjohn", "12345", "01_positional_encoding", "14", "14",
        "smithjohn_12345_67890_01_positional_encoding.ipynb"),
    row("smithjohn_12345", "smithjohn", "12345", "02_attention", "30.5", "40",
        "smithjohn_12345_67891_02_attention.ipynb"),
    row("leeann_222", "leeann", "222", "02_attention", "20", "40", "leeann_LATE_222_67892_02_attention.ipynb",
        manual_status="needs manual grading: 1 of 3 written answers (3 points not counted yet)"),
    row("anon_x9", "", "anon_x9", "02_attention", "10", "40", "anon_x9_67893_02_attention.ipynb"),
    row("ada", "ada", "", "02_attention", "40", "40", "ada/02_attention.ipynb"),
    row("finn_333", "finn", "333", "02_attention", "", "", "finn_333_67894_02_attention.ipynb", status="rejected",
        manual_status=""),
    row("=cmd_444", "=HYPERLINK(\"x\")", "444", "02_attention", "12.5", "40", "=cmd_444_67895_02_attention.ipynb"),
]


PEOPLE = {"12345": ("Smith, John", "S-12345", "jsmith", "Section A"),
          "444": ("=HYPERLINK(\"x\")", "=1+1", "cmd@example.org", "Section B")}


def canvas_export(path, holds):
    """Canvas's own gradebook export: a padded "Points Possible" row and columns titled "Name (id)", with the
    student columns as Canvas's lib/gradebook_exporter.rb writes them (sortable name, SIS ids, section)."""
    with open(path, "w", newline="", encoding="utf-8-sig") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01_positional_encoding (901)",
                         "Stage 2 (4711)", "Current Score"])
        writer.writerow(["    Points Possible", "", "", "", "", "14", "40", "(read only)"])
        for user, scores in holds.items():
            name, sis_user, sis_login, section = PEOPLE.get(user, (f"student {user}", "", "", ""))
            writer.writerow([name, user, sis_user, sis_login, section, scores.get("01_positional_encoding (901)", ""),
                             scores.get("Stage 2 (4711)", ""), "50"])


def test_canvas_files_change_no_score_canvas_holds_and_have_no_empty_cell(tmp_path):
    write_scores(tmp_path, CANVAS_ROWS)
    titles = {"02_attention": "Stage 2 (4711)"}
    result = lms.export(tmp_path, titles)
    assert not list(tmp_path.glob("lms/canvas_*.csv"))
    assert any("--canvas-export" in note for note in result.notes)  # nothing written: says why and how

    holds = {"12345": {"01_positional_encoding (901)": "13", "Stage 2 (4711)": "25"}, "444": {}}
    canvas_export(tmp_path / "export.csv", holds)
    result = lms.export(tmp_path, titles, canvas_export=tmp_path / "export.csv")
    stage1 = tmp_path / "lms" / "canvas_01_positional_encoding.csv"
    stage2 = tmp_path / "lms" / "canvas_02_attention.csv"
    assert not stage1.exists()  # the only stage-1 score is one Canvas holds already
    table = read(stage2)
    assert table[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Stage 2 (4711)"]
    assert table[1] == ["Points Possible", "", "", "", "", "40"]
    assert all(line[5] != "" for line in table[2:])  # no empty cell anywhere
    assert table[2][:5] == ["'=HYPERLINK(\"x\")", "444", "'=1+1", "cmd@example.org", "Section B"]  # as Canvas has
    # them (its importer falls back on the SIS ids, then the name), and a cell that would be a formula is text
    changes = canvas_import(stage2, holds)
    assert changes == {("444", "Stage 2 (4711)"): ("", "12.5")}  # filled; smithjohn's 25 kept
    kept = {(d.stage, d.student): d for d in result.differences}  # who differs, and what was done, is listed
    assert kept["02_attention", "smithjohn_12345"].held == "25" and kept["02_attention", "smithjohn_12345"].now == 30.5
    assert kept["02_attention", "smithjohn_12345"].action.startswith("kept")
    assert kept["01_positional_encoding", "smithjohn_12345"].held == "13"
    assert kept["02_attention", "=cmd_444"].action == "written"
    assert any("leeann" in note for note in result.notes)  # pending: left out, said so
    assert any("anon_x9" in note for note in result.notes) and any("ada" in note for note in result.notes)

    lms.export(tmp_path, titles, canvas_export=tmp_path / "export.csv", overwrite=True)
    changes = {**canvas_import(stage1, holds), **canvas_import(stage2, holds)}
    assert changes == {("12345", "01_positional_encoding (901)"): ("13", "14"),
                       ("12345", "Stage 2 (4711)"): ("25", "30.5"),
                       ("444", "Stage 2 (4711)"): ("", "12.5")}


def test_canvas_scores_scaled_to_the_assignments_points(tmp_path):
    write_scores(tmp_path, CANVAS_ROWS)
    lms.export(tmp_path, scale_to=lms.parse_scale(["100", "01_positional_encoding=10"]), overwrite=True)
    stage2 = read(tmp_path / "lms" / "canvas_02_attention.csv")
    assert stage2[1][5] == "100" and {line[1]: line[5] for line in stage2[2:]} == {"12345": "76.25", "444": "31.25"}
    stage1 = read(tmp_path / "lms" / "canvas_01_positional_encoding.csv")
    assert stage1[1][5] == "10" and stage1[2][5] == "10"
    with pytest.raises(ValueError, match="positive number"):
        lms.parse_scale(["02_attention=zero"])


# --- Moodle ------------------------------------------------------------------------------------------

MOODLE_ROWS = [
    row("ann_lee_101", "Ann Lee", "101", "02_attention", "31", "40",
        "Ann Lee_101_assignsubmission_file_/02_attention.ipynb"),
    row("bo_chen_102", "Bo Chen", "102", "02_attention", "12", "40",
        "Bo Chen_102_assignsubmission_file_/Copy of 02_attention.ipynb",
        manual_status="needs manual grading: 3 of 3 written answers (7 points not counted yet)"),
    row("cy_103", "Cy", "103", "02_attention", "12.5", "40", "Cy_103_assignsubmission_file_/02_attention.ipynb"),
    row("ann_lee_7", "Ann Lee", "7", "03_blocks", "20", "30", "Ann Lee_7_assignsubmission_file_/03_blocks.ipynb"),
]


MOODLE_MAXIMA = {"02_attention": 40.0, "03_blocks": 30.0}  # the Moodle assignments' maximum grades


def test_moodle_worksheets_keep_what_moodle_holds_unless_asked(tmp_path):
    write_scores(tmp_path, MOODLE_ROWS)
    lms.export(tmp_path, scale_to=MOODLE_MAXIMA)
    sheet = tmp_path / "lms" / "moodle_02_attention.csv"
    table = read(sheet)
    assert table[0] == ["Identifier", "Full name", "Grade", "Maximum grade", "Last modified (grade)"]  # no comments
    assert [line[:4] for line in table[1:]] == [["Participant 101", "Ann Lee", "31", "40"],
                                               ["Participant 103", "Cy", "12.5", "40"]]  # 102 waits: left out
    assert read(tmp_path / "lms" / "moodle_03_blocks.csv")[1][:3] == ["Participant 7", "Ann Lee", "20"]
    assert not list((tmp_path / "lms").glob("canvas_*"))
    # Moodle holds a grade (given last week) and a comment for 101; 103 has none yet
    holds = {"101": (28.0, datetime(2026, 11, 18, 10, 0), "<p>Well argued.</p>")}
    grades, comments = moodle_import(sheet, holds, maximum=40)
    assert grades == {"103": 12.5} and comments == {}
    lms.export(tmp_path, overwrite=True, scale_to=MOODLE_MAXIMA)
    grades, comments = moodle_import(sheet, holds, maximum=40)
    assert grades == {"101": 31.0, "103": 12.5} and comments == {}  # no comments column: Moodle's stay
    lms.export(tmp_path, include_pending=True, overwrite=True, scale_to=MOODLE_MAXIMA)
    assert read(sheet)[2][2] == "12"


def test_moodle_grades_scaled_to_the_assignments_maximum(tmp_path):
    """Unscaled, 12.5 of 40 points lands as 12.5 on a 100-point Moodle assignment; scaled it is 31.25."""
    write_scores(tmp_path, MOODLE_ROWS)
    lms.export(tmp_path, scale_to={"02_attention": 100.0, "03_blocks": 30.0})
    sheet = tmp_path / "lms" / "moodle_02_attention.csv"
    grades, _ = moodle_import(sheet, {}, maximum=100)
    assert grades == {"101": 77.5, "103": 31.25}
    assert {line[3] for line in read(sheet)[1:]} == {"100"}


# --- comments ----------------------------------------------------------------------------------------

STAGE = "02_attention"
CELLS = [("attn_shape", False, 2.0), ("attn_values", False, 3.0), ("attn_q_scale", True, 3.0)]


def class_with_comments(folder, students):
    """A gradebook with one stage (two checks, one written answer) and a comment on each student's answer,
    and the release notebook the grade cells are read from."""
    from nbgrader.api import Gradebook

    release = nbformat.v4.new_notebook()
    for name, written, points in CELLS:
        metadata = {"nbgrader": {"grade": True, "solution": written, "locked": not written, "points": points,
                                 "grade_id": name, "schema_version": 3}}
        cell = (nbformat.v4.new_markdown_cell("answer") if written
                else nbformat.v4.new_code_cell(f"assert check.{name}(x)"))
        cell.metadata = metadata
        release.cells.append(cell)
    path = folder / "release" / STAGE / f"{STAGE}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(release, path)
    with Gradebook(f"sqlite:///{folder / 'gradebook.db'}") as gradebook:
        gradebook.add_assignment(STAGE)
        gradebook.add_notebook(STAGE, STAGE)
        for name, written, points in CELLS:
            gradebook.add_grade_cell(name, STAGE, STAGE, max_score=points, cell_type="markdown" if written else "code")
            if written:
                gradebook.add_solution_cell(name, STAGE, STAGE)
        for student, comment in students.items():
            gradebook.add_student(student)
            gradebook.add_submission(STAGE, student)
            gradebook.find_comment("attn_q_scale", STAGE, STAGE, student).manual_comment = comment
        gradebook.db.commit()


def test_comments_carry_the_instructors_words_and_the_checks_not_passed(tmp_path):
    hostile = "<script>alert(1)</script> fine; =HYPERLINK(\"http://x\")"
    class_with_comments(tmp_path, {"cy_103": "Say why the variance grows.", "dee_104": hostile})
    write_scores(tmp_path, [
        row("cy_103", "Cy", "103", STAGE, "6", "8", "Cy_103_assignsubmission_file_/02_attention.ipynb",
            attn_shape="2", attn_values="1", attn_q_scale="3"),
        row("dee_104", "Dee", "104", STAGE, "8", "8", "Dee_104_assignsubmission_file_/02_attention.ipynb",
            attn_shape="2", attn_values="3", attn_q_scale="3"),
        row("ed_55555", "ed", "55555", STAGE, "6", "8", "ed_55555_98765_02_attention.ipynb",
            attn_shape="2", attn_values="1", attn_q_scale="3"),
    ], extra=[cell for cell, _, _ in CELLS])
    result = lms.export(tmp_path, comments=True, overwrite=True, scale_to={STAGE: 8.0})
    sheet = tmp_path / "lms" / f"moodle_{STAGE}.csv"
    assert read(sheet)[0][-1] == "Feedback comments"
    _, comments = moodle_import(sheet, {"103": (5.0, datetime(2026, 11, 1), "<p>old</p>")}, maximum=8)
    cy = comments["103"]
    assert "Question 1 (attn_q_scale): Say why the variance grows." in html.unescape(cy)
    assert "Checks: 1 of 2 passed; not passed: attn_values" in html.unescape(cy)
    dee = comments["104"]
    assert "<script" not in dee and "Checks: 2 of 2 passed" in dee
    assert not any(re.match(r"[\s\"]*[=+\-@]", part) for part in dee.split(";"))  # no formula, split at ; either
    assert html.unescape(dee).startswith(f"<p>Question 1 (attn_q_scale): {hostile}</p>")  # every character kept
    # Canvas: a text file per student for "Re-upload submissions", found by the ids in its name as Canvas does
    archive = tmp_path / "lms" / f"canvas_comments_{STAGE}.zip"
    assert archive in result.files
    with zipfile.ZipFile(archive) as opened:
        (name,) = opened.namelist()
        user, attachment = [part for part in name.split("_") if re.fullmatch(r"\d+", part)][:2]
        assert (user, attachment) == ("55555", "98765")  # the user id and the downloaded file's id
        assert "not passed: attn_values" in opened.read(name).decode()


# --- headers as the LMSs write them, and their decimals -----------------------------------------------------

# Moodle's grading worksheet as its download writes it: the columns of mod/assign/gradingtable.php in download
# mode (recordid, fullname, the identity fields such as email, status, grade, grademax, gradecanbechanged,
# timesubmitted, timemarked, then the feedback plugins' fields) under the strings of mod/assign/lang/en/
# assign.php, where one version defines 'maxgrade' twice, the later as 'Maximum Grade' (moodle/moodle, commit
# 0085741f6f10a6c62f66ce4389fb1095d256f807); dates are userdate()'s default format.
MOODLE_REAL_HEADER = ["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade",
                      "Grade can be changed", "Last modified (submission)", "Last modified (grade)",
                      "Feedback comments"]


def moodle_worksheet(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


@pytest.mark.parametrize("maximum_header", ["Maximum Grade", "Maximum grade", "maximum  GRADE"])
def test_moodle_worksheets_are_read_as_moodle_versions_write_their_headers(tmp_path, maximum_header):
    write_scores(tmp_path, MOODLE_ROWS[:3])
    header = [maximum_header if name == "Maximum Grade" else name for name in MOODLE_REAL_HEADER]
    moodle_worksheet(tmp_path / "worksheet.csv", header, [
        ["Participant 101", "Ann Lee", "ann@example.org", "Submitted for grading - Graded", "28.00", "40.00", "Yes",
         "Tuesday, 14 October 2025, 10:03 AM", "Wednesday, 15 October 2025, 9:00 AM", "<p>Well argued.</p>"],
        ["Participant 103", "Cy", "cy@example.org", "Submitted for grading", "", "40.00", "Yes",
         "Monday, 13 October 2025, 11:59 PM", "-", ""],
    ])
    sheet = lms.read_moodle_worksheet(tmp_path / "worksheet.csv", "02_attention")
    assert sheet.maximum == 40 and sheet.decimals == 2 and sheet.grades == {"101": "28.00"}
    assert sheet.submitted["101"] == "Tuesday, 14 October 2025, 10:03 AM" and sheet.names["103"] == "Cy"
    lms.export(tmp_path, moodle_exports={"02_attention": tmp_path / "worksheet.csv"}, overwrite=True)
    written = read(tmp_path / "lms" / "moodle_02_attention.csv")
    # our file has Moodle's exact strings: its importer compares them exactly (assignfeedback_offline's
    # importgradeslib.php: `$column == get_string('grade')`, 'recordid' and 'lastmodifiedgrade' of assign)
    assert written[0] == ["Identifier", "Full name", "Grade", "Maximum grade", "Last modified (grade)"]
    assert [line[:4] for line in written[1:]] == [["Participant 101", "Ann Lee", "31", "40"],
                                                 ["Participant 103", "Cy", "12.5", "40"]]


def test_a_worksheet_without_a_maximum_is_named_with_its_columns(tmp_path):
    write_scores(tmp_path, MOODLE_ROWS[:1])
    moodle_worksheet(tmp_path / "scale.csv", ["Identifier", "Full name", "Status", "Grade", "Scale",
                                              "Last modified (grade)"],
                     [["Participant 101", "Ann Lee", "Submitted", "", "Fail\nPass", "-"]])
    with pytest.raises(lms.LmsError, match=r"scale\.csv has a 'Scale' column.*--scale-to 02_attention=40"):
        lms.export(tmp_path, moodle_exports={"02_attention": tmp_path / "scale.csv"})
    moodle_worksheet(tmp_path / "other.csv", ["Identifier", "Full name", "Grade"], [["Participant 101", "Ann", ""]])
    with pytest.raises(lms.LmsError, match=r"other\.csv has no 'Maximum grade' column \(its columns: 'Identifier'"):
        lms.export(tmp_path, moodle_exports={"02_attention": tmp_path / "other.csv"})
    assert not (tmp_path / "lms").exists()


def test_canvas_exports_with_first_and_last_names_and_no_sis_user_id(tmp_path):
    """Canvas's exporter writes `LastName, FirstName` instead of `Student` when the course shows them apart,
    `SIS User ID` only with SIS access, and a row of "Muted"/"Manual Posting" marks above Points Possible
    (instructure/canvas-lms lib/gradebook_exporter.rb; its importer, lib/gradebook_importer.rb, accepts both)."""
    write_scores(tmp_path, CANVAS_ROWS[1:2])
    with open(tmp_path / "export.csv", "w", newline="", encoding="utf-8-sig") as handle:
        writer = csv.writer(handle)
        writer.writerow(["LastName", "FirstName", "ID", "SIS Login ID", "Section", "Notes",
                         "Stage 2: Attention (4711)", "Current Score", "Unposted Final Score"])
        writer.writerow(["", "", "", "", "", "", "Manual Posting", "", ""])
        writer.writerow(["    Points Possible", "", "", "", "", "(read only)", "40", "(read only)", "(read only)"])
        writer.writerow(["Smith", "John", "12345", "jsmith", "Section A", "", "25", "50", "50"])
    export = lms.read_canvas_export(tmp_path / "export.csv")
    assert [column.header for column in export.columns] == ["Notes", "Stage 2: Attention (4711)"]
    assert export.people["12345"] == lms.CanvasPerson("Smith, John", "", "jsmith", "Section A")
    lms.export(tmp_path, canvas_export=tmp_path / "export.csv", overwrite=True)
    table = read(tmp_path / "lms" / "canvas_02_attention.csv")
    assert table[2] == ["Smith, John", "12345", "", "jsmith", "Section A", "30.5"]


def test_grades_round_half_up_to_the_lms_decimals(tmp_path):
    """32.5 of 40 points on a 10-point assignment is 8.125: 8.13 (Python's round gives 8.12); 1.005 is 1.01."""
    assert [lms.half_up(8.125), lms.half_up(1.005), lms.half_up(2.675), lms.half_up(-0.125)] == [8.13, 1.01, 2.68,
                                                                                                -0.13]
    assert round(8.125, 2) == 8.12 and round(2.675, 2) == 2.67  # why half_up exists
    write_scores(tmp_path, [row("smithjohn_12345", "smithjohn", "12345", "02_attention", "32.5", "40",
                                "smithjohn_12345_67891_02_attention.ipynb"),
                            *MOODLE_ROWS[:1]])
    lms.export(tmp_path, scale_to={"02_attention": 10.0}, overwrite=True)
    assert read(tmp_path / "lms" / "canvas_02_attention.csv")[2][5] == "8.13"
    # Moodle writes a grade item's decimals into Maximum grade: "7.0" is one decimal, so 31/40 x 7 = 5.425 is 5.4
    # and 32.5/40 x 7 = 5.6875 would be 5.7
    moodle_worksheet(tmp_path / "sheet.csv", MOODLE_REAL_HEADER, [
        ["Participant 101", "Ann Lee", "", "Submitted", "", "7.0", "Yes", "-", "-", ""]])
    lms.export(tmp_path, moodle_exports={"02_attention": tmp_path / "sheet.csv"}, overwrite=True)
    assert read(tmp_path / "lms" / "moodle_02_attention.csv")[1][2:4] == ["5.4", "7"]
