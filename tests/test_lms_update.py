"""LMS uploads that refuse mistakes and lose nothing (issue 31): a name that is no stage, a Canvas assignment the
export does not hold, a Moodle maximum nobody knows are errors that write nothing; the column is Canvas's existing
assignment under its exact header; a weekly --update writes only what differs from what the LMS holds, keeps and
lists grades changed in the LMS, and a run leaves no earlier file beside its own. Each LMS file is read back by
the importers of tests/test_lms.py (Canvas's gradebook import, Moodle's worksheet import). Cheap: no grading."""

import csv
import json
import zipfile
from datetime import datetime

import pytest
from test_lms import canvas_import, moodle_import, read, row, write_scores

from transformer_course.grading.outputs import lms
from transformer_course.grading.outputs.lms_exports import LmsError

STAGE1, STAGE2 = "01_positional_encoding", "02_attention"
HEADER1, HEADER2 = "Stage 1: Positional encoding (901)", "Stage 2: Attention (4711)"


def canvas_rows(**totals):
    """Three Canvas students with stage 2 (and smithjohn with stage 1); TOTALS: {user id: stage-2 total}."""
    people = {"12345": "smithjohn", "444": "cmd", "555": "newton"}
    found = [row("smithjohn_12345", "smithjohn", "12345", STAGE1, "14", "14",
                 "smithjohn_12345_67890_01_positional_encoding.ipynb")]
    for user, total in totals.items():
        found.append(row(f"{people[user]}_{user}", people[user], user, STAGE2, str(total), "40",
                         f"{people[user]}_{user}_6{user}_02_attention.ipynb"))
    return found


def canvas_export(path, holds, headers=(HEADER1, HEADER2), points=("14", "40")):
    """Canvas's gradebook export as Canvas writes it: a byte-order mark, assignments titled "Title (id)", its own
    totals (which are not assignments), a padded Points Possible row. HOLDS: {user id: {header: score}}."""
    with open(path, "w", newline="", encoding="utf-8-sig") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *headers, "Current Score",
                         "Unposted Final Score"])
        writer.writerow(["    Points Possible", "", "", "", "", *points, "(read only)", "(read only)"])
        for user in ("12345", "444", "555"):
            scores = holds.get(user, {})
            writer.writerow([f"student {user}", user, "", "", "", *(scores.get(h, "") for h in headers), "50", "50"])
    return path


def files(folder):
    return {path.name: path.read_bytes() for path in sorted((folder / "lms").glob("*"))}


# --- mistakes: an error that names the bad name and the good ones, and nothing written ------------------------

def test_a_typo_in_a_stage_name_is_an_error_that_replaces_nothing(tmp_path, capsys):
    write_scores(tmp_path, canvas_rows(**{"12345": 30.5, "444": 12.5}))
    assert lms.main([str(tmp_path), "--overwrite", "--scale-to", f"{STAGE2}=20"]) == 0
    (tmp_path / "lms" / f"canvas_comments_{STAGE2}.zip").write_bytes(b"an earlier run's comments")
    before = files(tmp_path)
    assert read(tmp_path / "lms" / f"canvas_{STAGE2}.csv")[1][5] == "20"  # scaled
    for typo in (["--scale-to", "02_atention=20"], ["--title", "02_atention=Stage 2 (4711)"],
                 ["--moodle-export", f"02_atention={tmp_path / 'sheet.csv'}"]):
        capsys.readouterr()
        assert lms.main([str(tmp_path), "--overwrite", *typo]) == 2
        error = capsys.readouterr().err
        assert "'02_atention'" in error and f"{STAGE1}, {STAGE2}" in error and "nothing was written" in error
        assert files(tmp_path) == before  # the scaled file is not replaced by raw points, nothing added
    assert lms.main([str(tmp_path), "--overwrite", "--title", "no equals sign"]) == 2
    assert files(tmp_path) == before


def test_a_run_leaves_no_earlier_file_beside_its_own(tmp_path):
    write_scores(tmp_path, canvas_rows(**{"12345": 30.5}))
    stale = tmp_path / "lms" / f"canvas_comments_{STAGE2}.zip"
    stale.parent.mkdir()
    stale.write_bytes(b"comments of an earlier run")
    (tmp_path / "lms" / "moodle_03_blocks.csv").write_text("an earlier run's worksheet")
    (tmp_path / "lms" / "notes.txt").write_text("the instructor's own file")
    result = lms.export(tmp_path, overwrite=True)
    assert sorted(path.name for path in result.removed) == [f"canvas_comments_{STAGE2}.zip", "moodle_03_blocks.csv"]
    assert sorted(files(tmp_path)) == [f"canvas_{STAGE1}.csv", f"canvas_{STAGE2}.csv", "notes.txt", "uploaded.json"]
    assert "Canvas grades are the course's points (01_positional_encoding: of 14, 02_attention: of 40)" in " ".join(
        result.notes)  # without the export nobody knows Canvas's points possible: said so


# --- Canvas: the export's own assignment, under its exact header -----------------------------------------------

def test_the_canvas_column_is_the_exports_assignment_under_its_exact_header(tmp_path):
    write_scores(tmp_path, canvas_rows(**{"12345": 30.5, "444": 12.5}))
    export = canvas_export(tmp_path / "export.csv", {})
    lms.export(tmp_path, canvas_export=export)
    stage2 = tmp_path / "lms" / f"canvas_{STAGE2}.csv"
    assert read(stage2)[0][5] == HEADER2 and read(tmp_path / "lms" / f"canvas_{STAGE1}.csv")[0][5] == HEADER1
    assert canvas_import(stage2, {}) == {("12345", HEADER2): ("", "30.5"), ("444", HEADER2): ("", "12.5")}
    for title in ("4711", "Stage 2: Attention", HEADER2):  # the id, the title, the header: the same column
        lms.export(tmp_path, {STAGE2: title}, canvas_export=export, overwrite=True)
        assert read(stage2)[0][5] == HEADER2


@pytest.mark.parametrize(("headers", "titles", "message"), [
    ((HEADER1, "Stage 3: Blocks (4712)"), {}, r"02_attention: Canvas's export export.csv has no assignment for this "
     r"stage \(its assignments: 'Stage 1: Positional encoding \(901\)', 'Stage 3: Blocks \(4712\)'\)"),
    ((HEADER1, HEADER2, "Attention, part 2 (4713)"), {}, r"several columns .* could be this stage \("
     r"'Stage 2: Attention \(4711\)', 'Attention, part 2 \(4713\)'\): name one with --title"),
    ((HEADER1, HEADER2), {STAGE2: "Stage 2 (4711)"}, r"--title 02_attention='Stage 2 \(4711\)': Canvas's export "
     r"export.csv has no assignment of that title or id \(its assignments: .*'Stage 2: Attention \(4711\)'"),
])
def test_a_column_the_canvas_export_does_not_hold_is_an_error(tmp_path, headers, titles, message):
    write_scores(tmp_path, canvas_rows(**{"12345": 30.5}))
    export = canvas_export(tmp_path / "export.csv", {}, headers, ("14", "40", "40")[:len(headers)])
    with pytest.raises(LmsError, match=message):
        lms.export(tmp_path, titles, canvas_export=export)
    assert not (tmp_path / "lms").exists()  # nothing written, no new assignment for Canvas to create


def test_the_canvas_points_possible_are_the_maximum_and_a_contradiction_is_refused(tmp_path):
    write_scores(tmp_path, canvas_rows(**{"12345": 30.5}))
    export = canvas_export(tmp_path / "export.csv", {}, points=("14", "100"))
    lms.export(tmp_path, canvas_export=export)
    table = read(tmp_path / "lms" / f"canvas_{STAGE2}.csv")
    assert table[1][5] == "100" and table[2][5] == "76.25"  # 30.5 of 40 points on Canvas's 100-point assignment
    before = files(tmp_path)
    with pytest.raises(LmsError, match=r"02_attention: --scale-to says 20, but the Canvas assignment's maximum is 100"):
        lms.export(tmp_path, scale_to={STAGE2: 20.0}, canvas_export=export, overwrite=True)
    assert files(tmp_path) == before


# --- weekly: --update ------------------------------------------------------------------------------------

def test_a_weekly_canvas_update_writes_what_changed_and_keeps_what_was_changed_in_canvas(tmp_path):
    write_scores(tmp_path, canvas_rows(**{"12345": 30.5, "444": 12.5}))
    with pytest.raises(LmsError, match="--update compares with what Canvas holds: give .*--canvas-export"):
        lms.export(tmp_path, update=True)
    # week 1: Canvas holds nothing yet; the upload fills it
    week1 = canvas_export(tmp_path / "week1.csv", {})
    lms.export(tmp_path, canvas_export=week1, update=True)
    stage2 = tmp_path / "lms" / f"canvas_{STAGE2}.csv"
    assert canvas_import(stage2, {}) == {("12345", HEADER2): ("", "30.5"), ("444", HEADER2): ("", "12.5")}
    record = json.loads((tmp_path / "lms" / "uploaded.json").read_text())["uploads"]["canvas"][STAGE2]
    assert record["12345"]["values"] == [30.5] and record["444"]["values"] == [12.5]
    # the week: the instructor changes smithjohn's grade in Canvas to 35; cmd's notebook is regraded (12.5 -> 20),
    # smithjohn's written answers are graded by hand (30.5 -> 32), and newton hands in
    write_scores(tmp_path, canvas_rows(**{"12345": 32, "444": 20, "555": 8}))
    holds = {"12345": {HEADER1: "14", HEADER2: "35"}, "444": {HEADER2: "12.5"}}
    week2 = canvas_export(tmp_path / "week2.csv", holds)
    result = lms.export(tmp_path, canvas_export=week2, update=True)
    assert canvas_import(stage2, holds) == {("444", HEADER2): ("12.5", "20"), ("555", HEADER2): ("", "8")}
    assert not (tmp_path / "lms" / f"canvas_{STAGE1}.csv").exists()  # Canvas holds stage 1's 14 already
    listed = result.by_student()
    assert sorted(listed) == ["cmd_444", "newton_555", "smithjohn_12345"]
    (edit,) = listed["smithjohn_12345"]
    assert (edit.held, edit.sent, edit.now) == ("35", f"30.5 ({datetime.now():%Y-%m-%d})", 32.0)
    assert edit.action.startswith("kept: changed in Canvas after the last upload")
    assert listed["cmd_444"][0].action == "written (replaces an earlier upload of ours)"
    # the instructor asks for the edit to be replaced
    lms.export(tmp_path, canvas_export=week2, update=True, replace_lms_edits=True)
    assert canvas_import(stage2, holds)[("12345", HEADER2)] == ("35", "32")
    # a week where nothing changed: no file to upload, and last week's files are gone
    synced = {"12345": {HEADER1: "14", HEADER2: "32"}, "444": {HEADER2: "20"}, "555": {HEADER2: "8"}}
    result = lms.export(tmp_path, canvas_export=canvas_export(tmp_path / "week3.csv", synced), update=True)
    assert result.files == [] and result.differences == [] and not list((tmp_path / "lms").glob("canvas_*"))


def test_without_update_a_first_upload_keeps_what_canvas_holds_and_names_who_differs(tmp_path, capsys):
    write_scores(tmp_path, canvas_rows(**{"12345": 32, "444": 20}))
    export = canvas_export(tmp_path / "export.csv", {"12345": {HEADER2: "35"}})
    assert lms.main([str(tmp_path), "--canvas-export", str(export)]) == 0
    out = capsys.readouterr().out
    listed = out.split("what differs from what the LMS holds, per student:\n")[1]
    assert "  smithjohn_12345:\n    01_positional_encoding: Canvas has no grade, course now 14: written\n" in listed
    assert "    02_attention: Canvas holds 35, course now 32: kept: given in Canvas, never uploaded by us" in listed
    assert canvas_import(tmp_path / "lms" / f"canvas_{STAGE2}.csv", {"12345": {HEADER2: "35"}}) == {
        ("444", HEADER2): ("", "20")}


# --- Moodle: its maximum, and --update -----------------------------------------------------------------------

MOODLE_HEADER = ["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum grade", "Grade can be changed",
                 "Last modified (submission)", "Last modified (grade)", "Feedback comments"]


def moodle_rows(**totals):
    names = {"101": "Ann Lee", "102": "Bo Chen", "103": "Cy"}
    return [row(f"p{user}", names[user], user, STAGE2, str(total), "41",
                f"{names[user]}_{user}_assignsubmission_file_/02_attention.ipynb") for user, total in totals.items()]


def moodle_worksheet(path, holds, maximum="100.00"):
    """The grading worksheet Moodle downloads. HOLDS: {participant: grade as Moodle shows it}."""
    with open(path, "w", newline="", encoding="utf-8-sig") as handle:
        writer = csv.writer(handle)
        writer.writerow(MOODLE_HEADER)
        for user, name in (("101", "Ann Lee"), ("102", "Bo Chen"), ("103", "Cy")):
            writer.writerow([f"Participant {user}", name, f"{user}@example.org", "Submitted for grading",
                             holds.get(user, ""), maximum, "Yes", "Monday, 23 November 2026, 10:00 AM", "-", ""])
    return path


def test_moodle_grades_of_an_unknown_maximum_are_refused_not_sent_as_points_of_100(tmp_path):
    write_scores(tmp_path, moodle_rows(**{"101": 39.5}))
    with pytest.raises(LmsError, match=r"Moodle's maximum grade of 02_attention is unknown .*--moodle-export "
                                       r"STAGE=WORKSHEET.csv.*--scale-to 02_attention=41"):
        lms.export(tmp_path)
    assert not (tmp_path / "lms").exists()
    lms.export(tmp_path, scale_to={STAGE2: 41.0})  # the Moodle assignment's maximum is the course's 41 points
    assert read(tmp_path / "lms" / f"moodle_{STAGE2}.csv")[1][2:4] == ["39.5", "41"]
    worksheet = moodle_worksheet(tmp_path / "worksheet.csv", {})  # Moodle's default: 100
    lms.export(tmp_path, moodle_exports={STAGE2: worksheet})
    sheet = tmp_path / "lms" / f"moodle_{STAGE2}.csv"
    assert read(sheet)[1][2:4] == ["96.34", "100"]
    assert moodle_import(sheet, {}, maximum=100)[0] == {"101": 96.34}
    with pytest.raises(LmsError, match=r"--scale-to says 41, but the Moodle assignment's maximum is 100"):
        lms.export(tmp_path, scale_to={STAGE2: 41.0}, moodle_exports={STAGE2: worksheet})


def test_a_weekly_moodle_update_writes_regrades_and_keeps_grades_changed_in_moodle(tmp_path):
    write_scores(tmp_path, moodle_rows(**{"101": 30, "103": 12.5}))
    sheet = tmp_path / "lms" / f"moodle_{STAGE2}.csv"
    with pytest.raises(LmsError, match="give the grading worksheet of 02_attention with --moodle-export"):
        lms.export(tmp_path, update=True, scale_to={STAGE2: 41.0})
    lms.export(tmp_path, update=True, moodle_exports={STAGE2: moodle_worksheet(tmp_path / "w1.csv", {}, "41.00")})
    grades, _ = moodle_import(sheet, {}, maximum=41)
    assert grades == {"101": 30.0, "103": 12.5}
    uploaded = datetime.now()
    # the week: Cy's grade is changed in Moodle to 20; Ann's notebook is regraded (30 -> 33)
    holds = {"101": (30.0, uploaded, ""), "103": (20.0, uploaded.replace(microsecond=0), "")}
    write_scores(tmp_path, moodle_rows(**{"101": 33, "103": 12.5}))
    worksheet = moodle_worksheet(tmp_path / "w2.csv", {"101": "30.00", "103": "20.00"}, "41.00")
    result = lms.export(tmp_path, update=True, moodle_exports={STAGE2: worksheet})
    assert [line[0] for line in read(sheet)[1:]] == ["Participant 101"]  # only the regrade
    grades, _ = moodle_import(sheet, holds, maximum=41)
    assert grades == {"101": 33.0}  # Moodle takes it: the sheet's stamp is now, not 2000-01-01
    (kept,) = result.by_student()["p103"]
    assert (kept.held, kept.now) == ("20.00", 12.5) and kept.action.startswith("kept: changed in Moodle")
    lms.export(tmp_path, update=True, replace_lms_edits=True, moodle_exports={STAGE2: worksheet})
    assert moodle_import(sheet, holds, maximum=41)[0] == {"101": 33.0, "103": 12.5}


def test_update_and_overwrite_contradict_and_a_worksheet_of_another_assignment_is_refused(tmp_path):
    write_scores(tmp_path, moodle_rows(**{"101": 30}))
    with pytest.raises(LmsError, match="--update and --overwrite contradict each other"):
        lms.export(tmp_path, update=True, overwrite=True)
    with pytest.raises(LmsError, match="--replace-lms-edits goes with --update"):
        lms.export(tmp_path, replace_lms_edits=True)
    other = tmp_path / "other.csv"
    other.write_text("Identifier,Grade,Maximum grade\nParticipant 9001,,41\n", encoding="utf-8")
    with pytest.raises(LmsError, match=r"--moodle-export 02_attention=other.csv: none of its participants"):
        lms.export(tmp_path, moodle_exports={STAGE2: other})
    with pytest.raises(LmsError, match=r"not Moodle's grading worksheet"):
        lms.export(tmp_path, moodle_exports={STAGE2: canvas_export(tmp_path / "canvas.csv", {})})
    assert not (tmp_path / "lms").exists()


def test_canvas_comments_go_only_when_new_or_changed(tmp_path):
    """The re-upload zip adds a comment to the submission each time: a weekly run sends only comments that
    changed since the last upload."""
    from test_lms import class_with_comments

    class_with_comments(tmp_path, {"ed_55555": "Say why the variance grows."})
    write_scores(tmp_path, [row("ed_55555", "ed", "55555", STAGE2, "6", "8", "ed_55555_98765_02_attention.ipynb",
                                attn_shape="2", attn_values="1", attn_q_scale="3")],
                 extra=["attn_shape", "attn_values", "attn_q_scale"])
    export = tmp_path / "export.csv"
    header = f"Student,ID,SIS User ID,SIS Login ID,Section,{STAGE2} (77)\nPoints Possible,,,,,8\n"
    export.write_text(header + "ed,55555,,,,\n")
    archive = tmp_path / "lms" / f"canvas_comments_{STAGE2}.zip"
    lms.export(tmp_path, comments=True, canvas_export=export, update=True)
    with zipfile.ZipFile(archive) as opened:
        assert opened.namelist() == ["ed_55555_98765_02_attention_comments.txt"]
    export.write_text(header + "ed,55555,,,,6\n")  # Canvas holds the grade uploaded
    result = lms.export(tmp_path, comments=True, canvas_export=export, update=True)
    assert not archive.exists() and archive in result.removed  # the same comment is not attached twice


def test_moodle_comments_changed_in_moodle_are_sent_back_as_moodle_holds_them(tmp_path):
    """Moodle's import replaces the comment of every row of a sheet with a comments column: a comment changed in
    Moodle is written back as Moodle holds it (and said), while a grade regraded goes; a comment changed here
    goes alone, with the grade Moodle holds."""
    from nbgrader.api import Gradebook
    from test_lms import CELLS, class_with_comments

    class_with_comments(tmp_path, {"cy_103": "Say why the variance grows."})
    extra = [cell for cell, _, _ in CELLS]

    def scores(total):
        write_scores(tmp_path, [row("cy_103", "Cy", "103", STAGE2, str(total), "8",
                                    "Cy_103_assignsubmission_file_/02_attention.ipynb", attn_shape="2",
                                    attn_values="1", attn_q_scale="3")], extra=extra)

    def worksheet(grade, comment):
        path = tmp_path / "worksheet.csv"
        with open(path, "w", newline="", encoding="utf-8-sig") as handle:
            writer = csv.writer(handle)
            writer.writerow(MOODLE_HEADER)
            writer.writerow(["Participant 103", "Cy", "", "", grade, "8.00", "Yes", "", "", comment])
        return {STAGE2: path}

    sheet = tmp_path / "lms" / f"moodle_{STAGE2}.csv"
    scores(6)
    lms.export(tmp_path, comments=True, update=True, moodle_exports=worksheet("", ""))
    ((ours,),) = [[line[5]] for line in read(sheet)[1:]]
    assert "Say why the variance grows." in ours
    edited = "<p>Edited in Moodle: see me.</p>"
    holds = {"103": (6.0, datetime(2026, 11, 1), edited)}
    scores(7)  # regraded
    result = lms.export(tmp_path, comments=True, update=True, moodle_exports=worksheet("6.00", edited))
    grades, comments = moodle_import(sheet, holds, maximum=8)
    assert grades == {"103": 7.0} and comments == {}  # the grade goes, Moodle's comment stays
    assert any("cy_103 02_attention: the feedback comment was changed in Moodle" in note for note in result.notes)
    # back to our comment in Moodle; then the instructor rewrites it in the gradebook: the comment goes alone
    holds = {"103": (7.0, datetime(2026, 11, 1), ours)}
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gradebook:
        gradebook.find_comment("attn_q_scale", STAGE2, STAGE2, "cy_103").manual_comment = "Now with the gradient."
        gradebook.db.commit()
    lms.export(tmp_path, comments=True, update=True, moodle_exports=worksheet("7.00", ours))
    grades, comments = moodle_import(sheet, holds, maximum=8)
    assert grades == {} and "Now with the gradient." in comments["103"]


def test_a_canvas_export_saved_with_semicolons_and_decimal_commas_reads_the_same(tmp_path):
    """Canvas exports with ";" and "30,5" for a German user (or after Excel saved it): the held grades are read
    as numbers, so an unchanged 30.5 is not listed nor written again."""
    write_scores(tmp_path, canvas_rows(**{"12345": 30.5, "444": 12.5}))
    lms.export(tmp_path, canvas_export=canvas_export(tmp_path / "week1.csv", {}), update=True)
    lines = [f"Student;ID;SIS User ID;SIS Login ID;Section;{HEADER1};{HEADER2}", "Points Possible;;;;;14;40",
             "smithjohn;12345;;;;14;30,5", "cmd;444;;;;;11,5"]
    export = tmp_path / "week2.csv"
    export.write_bytes(("\r\n".join(lines) + "\r\n").encode("cp1252"))
    result = lms.export(tmp_path, canvas_export=export, update=True)
    (difference,) = result.differences
    assert (difference.student, difference.held) == ("cmd_444", "11,5") and difference.action.startswith("kept")


def test_an_unreadable_upload_record_is_an_error_that_writes_nothing(tmp_path):
    write_scores(tmp_path, canvas_rows(**{"12345": 30.5}))
    (tmp_path / "lms").mkdir()
    (tmp_path / "lms" / "uploaded.json").write_text("{not json")
    with pytest.raises(LmsError, match=r"uploaded.json cannot be read .*move it away"):
        lms.export(tmp_path, overwrite=True)
    assert sorted(files(tmp_path)) == ["uploaded.json"]


def test_every_stage_of_the_course_finds_its_own_canvas_assignment(tmp_path):
    """Titles as an instructor gives them in Canvas: each stage of the course matches its own column, and no
    other, by its words and its number."""
    from conftest import ASSIGNMENTS
    from transformer_course.grading.outputs.lms_exports import canvas_column, read_canvas_export

    titles = ["Stage 0: Why attention? (4700)", "Stage 1: Positional encoding (4701)", "Stage 2: Attention (4702)",
              "Stage 3: Encoder and decoder blocks (4703)", "Stage 4: The whole transformer (4704)",
              "Stage 5: Training (4705)", "Stage 6: Decoding (4706)", "Stage 7: Fast and better decoding (4707)",
              "Attendance (4708)"]
    export = canvas_export(tmp_path / "export.csv", {}, titles, ["10"] * len(titles))
    columns = read_canvas_export(export)
    found = [canvas_column(columns, stage).header for stage in ASSIGNMENTS]
    assert found == titles[:8]


def test_a_grade_changed_in_moodle_after_the_worksheet_was_downloaded_is_kept_by_moodle(tmp_path):
    """--update can only see what the worksheet says; its sheet is stamped with the worksheet's download time,
    so Moodle's own rule keeps a grade changed in Moodle after that."""
    import os

    write_scores(tmp_path, moodle_rows(**{"101": 33, "103": 14}))  # both regraded since week 1 (30 and 12.5)
    lms.export(tmp_path, update=True, moodle_exports={STAGE2: moodle_worksheet(tmp_path / "w0.csv", {}, "41.00")})
    (tmp_path / "lms" / "uploaded.json").write_text(json.dumps({"uploads": {"moodle": {STAGE2: {
        "101": {"values": [30.0], "comment": "", "at": "2026-11-20T10:00:00"},
        "103": {"values": [12.5], "comment": "", "at": "2026-11-20T10:00:00"}}}}}))
    downloaded = datetime(2026, 11, 27, 9, 0)
    worksheet = moodle_worksheet(tmp_path / "w1.csv", {"101": "30.00", "103": "12.50"}, "41.00")
    os.utime(worksheet, (downloaded.timestamp(), downloaded.timestamp()))
    lms.export(tmp_path, update=True, moodle_exports={STAGE2: worksheet})
    sheet = tmp_path / "lms" / f"moodle_{STAGE2}.csv"
    assert {line[4] for line in read(sheet)[1:]} == {"2026-11-27 09:00:00"}
    holds = {"101": (30.0, datetime(2026, 11, 20, 10, 5), ""),  # our upload of week 1
             "103": (20.0, datetime(2026, 11, 27, 11, 0), "")}  # changed in Moodle after the download
    assert moodle_import(sheet, holds, maximum=41)[0] == {"101": 33.0}


# --- nobody left out in silence (issue 40) ---------------------------------------------------------------------

def test_every_student_left_out_is_named_with_why_and_a_removed_file_says_what_it_held(tmp_path, capsys):
    """Issue 40 saw `--update` say "nothing to upload", remove the earlier Canvas file and drop a regrade (Canvas
    32.50, course 38.5) without naming anyone: the rows had lost their status. Now every row of scores.csv that is
    in no file is named with why, and an earlier file removed says which of its grades this upload lacks."""
    rows = canvas_rows(**{"12345": 32.5, "444": 12.5})
    write_scores(tmp_path, rows)
    lms.export(tmp_path, canvas_export=canvas_export(tmp_path / "week1.csv", {}), update=True)
    assert (tmp_path / "lms" / f"canvas_{STAGE2}.csv").exists()
    # a week later: smithjohn's stage 2 regraded to 38.5 but its row has no status (what a lost record gave), cmd's
    # written answers wait for a person, newton handed in without an LMS id
    rows[1].update(total="38.5", status="")
    rows[2].update(manual_status="needs manual grading: 1 of 3 written answers (2 points not counted yet)")
    rows.append(row("newton", "newton", "", STAGE2, "8", "40", f"newton/{STAGE2}.ipynb"))
    write_scores(tmp_path, rows)
    holds = {"12345": {HEADER1: "14", HEADER2: "32.5"}}  # Canvas holds what was uploaded of week 1, not cmd's
    assert lms.main([str(tmp_path), "--update", "--canvas-export", str(canvas_export(tmp_path / "w2.csv", holds))]) == 0
    out = capsys.readouterr().out
    left = out.split("left out of this upload, per student:\n")[1]
    assert f"  smithjohn_12345: {STAGE2}: not graded (status: none)" in left
    assert f"  cmd_444: {STAGE2}: written answers not graded yet" in left
    assert f"  newton: {STAGE2}: no LMS id in the file's name (newton/{STAGE2}.ipynb)" in left
    assert "nothing to upload (3 row(s) left out, listed above)" in out
    removed = next(line for line in out.splitlines() if line.startswith("removed") and f"canvas_{STAGE2}" in line)
    assert "it held grades that this upload does not carry: cmd_444 (444): 12.5, 02_attention: written" in removed
    assert "12345" not in removed  # Canvas holds smithjohn's 32.5 of week 1: nothing of it is lost
    assert f"{STAGE1}: 1 grade(s) the LMS holds already" in out
