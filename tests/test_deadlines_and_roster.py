"""The files an instructor keeps for a term (a deadlines file, a roster) and what the LMS records of when a
notebook came: late penalties and extensions per student and stage, LMS times before file times, notebooks
that came by email or USB given their LMS id, the missing submissions of each stage in the report, and one
student or one notebook graded again. The first tests are cheap (no grading); the last grades a small class."""

from __future__ import annotations

import csv
import json
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conftest import ROOT, solution_path, student_path
from transformer_course.grading.intake.identities import Identity
from transformer_course.grading.intake.submissions import Submission
from transformer_course.grading.outputs import deadlines, lms, report
from transformer_course.grading.outputs.roster import Roster, RosterError

DEADLINES = """\
timezone = "Europe/Berlin"

[penalty]
per_day = 10
maximum = 30
grace_minutes = 15

[due]
01_positional_encoding = 2026-11-03T23:59:00
02_attention = 2026-11-10T23:59:00

[extensions]
"12345" = "2 days"
ada = { 02_attention = 2026-11-14T12:00:00 }
"Bo Chen" = { 01_positional_encoding = "36 hours" }
"""


def submission(relative, assignment="02_attention", modified=0.0, lms="", lms_id="", name="", match=""):
    handed = Submission(match or lms_id or name, assignment, Path("/downloads") / relative, relative=relative,
                        modified=modified)
    handed.identity = Identity(lms, lms_id, match, name)
    return handed


def at(text):
    return datetime.fromisoformat(text).replace(tzinfo=deadlines.ZoneInfo("Europe/Berlin"))


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "deadlines.toml"
    path.write_text(DEADLINES, encoding="utf-8")
    return deadlines.Deadlines.load(path)


def test_due_dates_extensions_and_the_penalty(rules):
    assert rules.due_for("02_attention", ["nobody"]) == (at("2026-11-10T23:59:00"), "")
    assert rules.due_for("02_attention", ["x_12345", "12345"])[0] == at("2026-11-12T23:59:00")  # all stages, +2 days
    assert rules.due_for("02_attention", ["ada"]) == (at("2026-11-14T12:00:00"), "extension to 2026-11-14 12:00")
    assert rules.due_for("01_positional_encoding", ["ada"])[0] == at("2026-11-03T23:59:00")  # only stage 2 moved
    assert rules.due_for("01_positional_encoding", ["Bo Chen"])[0] == at("2026-11-05T11:59:00")
    assert rules.due_for("03_blocks", ["ada"]) == (None, "")  # no due date: never late
    # 10 % per day or part of a day, after 15 minutes of grace, at most 30 %
    assert [rules.penalty(timedelta(minutes=minutes)) for minutes in (10, 15, 16, 24 * 60 + 15, 24 * 60 + 16)] == [
        0, 0, 10, 10, 20]
    assert rules.penalty(timedelta(days=9)) == 30
    assert deadlines.penalised(32.5, 10) == 29.25 and deadlines.penalised(8.125, 0) == 8.13


def test_a_deadlines_file_with_a_mistake_names_it(tmp_path):
    path = tmp_path / "deadlines.toml"
    for text, message in (("[due]\n02_atention = 2026-11-10T23:59:00\n", "02_atention, which is no stage"),
                          ('[extensions]\nada = "two days"\n', "'two days' is neither a date"),
                          ('timezone = "Mars/Olympus"\n', "not a time zone name"),
                          ("[penalty]\nper_day = 200\n", "percentages from 0 to 100"),
                          ("[due\n", "not a TOML file")):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(deadlines.DeadlineError, match=message):
            deadlines.Deadlines.load(path).check_stages(["01_positional_encoding", "02_attention"])


# Moodle's grading worksheet as its download writes it (the columns of mod/assign/gradingtable.php in download
# mode; 'Last modified (submission)' is userdate()'s default format, in the downloading user's time zone)
WORKSHEET = [["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade", "Grade can be changed",
              "Last modified (submission)", "Last modified (grade)"],
             ["Participant 501", "Ann Lee", "ann@example.org", "Submitted for grading", "", "40.00", "Yes",
              "Wednesday, 11 November 2026, 1:30 AM", "-"],
             ["Participant 502", "Cy Diaz", "cy@example.org", "No submission", "", "40.00", "Yes", "-", "-"]]


def test_lms_times_come_before_file_times_and_canvas_says_only_late(rules, tmp_path):
    sheet = tmp_path / "worksheet.csv"
    with open(sheet, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(WORKSHEET)
    times = deadlines.SubmissionTimes.load([sheet], rules.zone)
    moodle = submission("Ann Lee_501_assignsubmission_file_/02.ipynb", lms="moodle", lms_id="501", name="Ann Lee",
                        modified=at("2026-11-01T10:00:00").timestamp())  # a file time that would say "on time"
    row = deadlines.columns(moodle, rules, times, 40.0)
    assert row["submitted"] == "2026-11-11 01:30 (Moodle)"  # Moodle's own record, not the file's time
    assert (row["late"], row["late_penalty"], row["total_after_penalty"]) == ("1 h 31 min late", 10, 36.0)
    without_sheet = deadlines.columns(moodle, rules, None, 40.0)
    assert without_sheet["late_penalty"] == "" and "time unknown" in without_sheet["late"]  # never a guess

    canvas_late = submission("smithjohn_LATE_777_90001_02_attention.ipynb", lms="canvas", lms_id="777",
                             modified=at("2026-11-01T10:00:00").timestamp())
    row = deadlines.columns(canvas_late, rules, None, 40.0)
    assert row["submitted"] == "Canvas: LATE" and "its time is not in Canvas's download" in row["late"]
    assert row["late_penalty"] == "" and row["total_after_penalty"] == 40.0
    on_time = submission("smithjohn_777_90001_02_attention.ipynb", lms="canvas", lms_id="777")
    assert deadlines.columns(on_time, rules, None, 40.0)["late"] == "on time (by Canvas)"

    plain = tmp_path / "times.csv"  # the instructor's own record, for any other source
    plain.write_text("student,assignment,submitted\n777,02_attention,2026-11-13T00:30:00+01:00\n", encoding="utf-8")
    row = deadlines.columns(canvas_late, rules, deadlines.SubmissionTimes.load([plain], rules.zone), 40.0)
    assert row["submitted"] == "2026-11-13 00:30 (times.csv)" and row["late"] == "2 days 31 min late"
    assert row["late_penalty"] == 30  # three days begun after the grace: 30 %, the maximum

    emailed = submission("ada/02.ipynb", match="ada", name="ada", modified=at("2026-11-14T11:00:00").timestamp())
    row = deadlines.columns(emailed, rules, None, 10.0)
    assert row["submitted"] == "2026-11-14 11:00 (file time)" and row["late"] == "on time"  # her extension
    assert row["due"] == "2026-11-14 12:00 (extension to 2026-11-14 12:00)"


def test_the_newer_of_two_notebooks_is_the_later_upload(tmp_path):
    """Canvas numbers files as it receives them; its download stamps every file with the time of the zip."""
    same_time = at("2026-11-20T09:00:00").timestamp()
    first = submission("smithjohn_777_90001_02_attention.ipynb", lms="canvas", lms_id="777", modified=same_time + 5)
    second = submission("smithjohn_LATE_777_90012_02_attention-1.ipynb", lms="canvas", lms_id="777",
                        modified=same_time)
    assert max([first, second], key=deadlines.newer_key) is second
    mine = submission("ada/a.ipynb", match="ada", modified=1000.0)
    later = submission("ada/b.ipynb", match="ada", modified=2000.0)
    assert max([later, mine], key=deadlines.newer_key) is later
    plain = tmp_path / "times.csv"
    plain.write_text("student,submitted\nada,2026-11-01T10:00:00\n", encoding="utf-8")
    times = deadlines.SubmissionTimes.load([plain], UTC)
    assert deadlines.newer_key(mine, times) > deadlines.newer_key(submission("x/y.ipynb", match="x"), times)


ROSTER = """\
name;email;lms_id;sis_user_id;sis_login_id;section
Ada Lovelace;ada@example.org;12346;S-0002;alovelace;Section A
Bo Chen;bo@example.org;12347;;;Section B
Smith, John;;12345;S-0001;jsmith;Section A
"""


def test_a_roster_maps_names_without_an_lms_id_and_refuses_a_doubtful_sheet(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_text(ROSTER, encoding="utf-8")  # as German Excel saves it: semicolons
    roster = Roster.load(path)
    mapped, note = roster.identity(Identity("", "", "Ada Lovelace", "Ada Lovelace"))
    assert mapped == Identity("canvas", "12346", "", "Ada Lovelace") and "roster's Canvas user 12346" in note
    assert roster.identity(Identity("", "", "BO@example.org", "BO@example.org"))[0].lms_id == "12347"
    assert roster.identity(Identity("", "", "ada lovelace", "ada lovelace"))[1] == ""  # a name exactly as written
    canvas = Identity("canvas", "999", "", "someone")
    assert roster.identity(canvas) == (canvas, "")  # the LMS's own id is never replaced
    path.write_text("name,lms_id\nAda,1\nAda,2\nBo,\n", encoding="utf-8")
    with pytest.raises(RosterError, match=r"(?s)row 3: the name 'Ada' is also in row 2.*row 4: a row needs an lms_id"):
        Roster.load(path)


def scores(folder, rows, extra=()):
    columns = ["student", "name", "lms_id", "lms", "assignment", "total", "max", "status", "manual_status",
               *extra, "file"]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "scores.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows({key: row.get(key, "") for key in columns} for row in rows)


def test_the_report_lists_missing_submissions_per_stage_and_late_ones(tmp_path, rules):
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "term.json").write_text(json.dumps({"roster": str(roster), "deadlines": str(rules.path)}))
    scores(tmp_path / "class", [
        {"student": "smithjohn_12345", "lms_id": "12345", "lms": "canvas", "assignment": "01_positional_encoding",
         "total": "14", "max": "14", "status": "graded", "late": "on time", "late_penalty": "0"},
        {"student": "ada_12346", "lms_id": "12346", "lms": "canvas", "assignment": "01_positional_encoding",
         "total": "10", "max": "14", "status": "graded", "late": "1 day 2 h late", "late_penalty": "20",
         "total_after_penalty": "8", "submitted": "2026-11-05 02:00 (file time)", "due": "2026-11-03 23:59"},
        {"student": "ada_12346", "lms_id": "12346", "lms": "canvas", "assignment": "02_attention",
         "status": "rejected"},
    ], extra=deadlines.TERM_COLUMNS)
    gaps, enrolled = report.missing(tmp_path / "class", report.read_csv(tmp_path / "class" / "scores.csv"))
    assert enrolled and gaps == {"01_positional_encoding": ["Bo Chen"],
                                 "02_attention": ["Bo Chen", "Smith, John"]}  # a rejected file counts as handed in
    page = report.render(tmp_path / "class")
    missing_table = page.split("id=missing_students")[1].split("</table>")[0]
    assert "Bo Chen" in missing_table and "Smith, John" in missing_table
    late_table = page.split("id=late_notebooks")[1].split("</table>")[0]
    assert "ada_12346" in late_table and "1 day 2 h late" in late_table and "smithjohn" not in late_table


def test_lms_files_use_the_total_after_the_penalty_and_the_rosters_sis_ids(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER, encoding="utf-8")
    (tmp_path / "term.json").write_text(json.dumps({"roster": str(roster)}))
    scores(tmp_path, [
        {"student": "ada_12346", "name": "Ada Lovelace", "lms_id": "12346", "lms": "canvas",
         "assignment": "02_attention", "total": "32.5", "max": "40", "status": "graded", "manual_status": "",
         "late_penalty": "10", "total_after_penalty": "29.25", "file": "Ada Lovelace/02.ipynb"},
    ], extra=deadlines.TERM_COLUMNS)
    result = lms.export(tmp_path, overwrite=True, scale_to={"02_attention": 10.0})
    table = list(csv.reader(open(tmp_path / "lms" / "canvas_02_attention.csv", encoding="utf-8-sig")))
    assert table[2] == ["Ada Lovelace", "12346", "S-0002", "alovelace", "Section A", "7.31"]  # 29.25/40 x 10
    assert any("late penalty" in note for note in result.notes)


# --- the batch command with a roster, a deadlines file and --regrade (grades a small class) --------------------

@pytest.mark.slow
def test_a_term_with_a_roster_deadlines_and_a_regrade_of_one_notebook(tmp_path, capsys):
    from transformer_course.grading.classroom.batch import BatchGrader, GradingUnavailable, main
    from transformer_course.grading.sandbox.isolation import bubblewrap_problem

    stage = "01_positional_encoding"
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    canvas = downloads / f"smithjohn_LATE_12345_90001_{stage}.ipynb"
    shutil.copy(solution_path(stage), canvas)  # Canvas's download: LATE, no time
    (downloads / "Ada Lovelace").mkdir()  # came by email: a folder named after her
    emailed = downloads / "Ada Lovelace" / f"{stage}.ipynb"
    shutil.copy(solution_path(stage), emailed)
    late = at("2026-11-05T02:00:00").timestamp()  # 1 day 2 hours after the due time: 20 % off
    os.utime(emailed, (late, late))
    roster, rules = tmp_path / "roster.csv", tmp_path / "deadlines.toml"
    roster.write_text(ROSTER, encoding="utf-8")
    rules.write_text(DEADLINES.replace('"12345" = "2 days"\n', ""), encoding="utf-8")
    class_dir = tmp_path / "class"
    sandbox = [] if bubblewrap_problem() is None else ["--no-sandbox"]
    common = [str(downloads), "--class-dir", str(class_dir), "--assignment", stage, "--jobs", "2", *sandbox]
    assert main([*common, "--roster", str(roster), "--deadlines", str(rules)]) == 0
    rows = {row["student"]: row for row in csv.DictReader(open(class_dir / "scores.csv", encoding="utf-8-sig"))}
    ada, john = rows["ada_lovelace_12346"], rows["smithjohn_12345"]
    assert (ada["lms"], ada["lms_id"], ada["file"]) == ("canvas", "12346", f"Ada Lovelace/{stage}.ipynb")
    assert "roster's Canvas user 12346" in ada["reasons"]
    assert ada["late"] == "1 day 2 h 1 min late" and float(ada["late_penalty"]) == 20
    assert float(ada["total_after_penalty"]) == pytest.approx(float(ada["total"]) * 0.8) and float(ada["total"]) > 0
    assert "its time is not in Canvas's download" in john["late"] and john["late_penalty"] == ""
    page = (class_dir / "report.html").read_text(encoding="utf-8")
    assert "Bo Chen" in page.split("id=missing_students")[1].split("</table>")[0]  # enrolled, handed in nothing
    assert json.loads((class_dir / "term.json").read_text())["roster"] == str(roster)

    # week 2: the same folder, no option repeated; one notebook graded again, the other student untouched
    records = {path.name: path.stat().st_mtime_ns for path in (class_dir / "records").glob("*.json")}
    capsys.readouterr()
    assert main([*common, "--regrade", f"12346/{stage}"]) == 0
    out = capsys.readouterr().out
    assert "using the roster file of this class folder" in out and "using the deadlines file" in out
    after = {path.name: path.stat().st_mtime_ns for path in (class_dir / "records").glob("*.json")}
    assert after["smithjohn_12345.json"] == records["smithjohn_12345.json"]  # skipped
    assert after["ada_lovelace_12346.json"] > records["ada_lovelace_12346.json"]  # graded again
    rows = {row["student"]: row for row in csv.DictReader(open(class_dir / "scores.csv", encoding="utf-8-sig"))}
    assert float(rows["ada_lovelace_12346"]["late_penalty"]) == 20 and rows["ada_lovelace_12346"]["lms_id"] == "12346"
    with pytest.raises(GradingUnavailable, match="names no student"):
        BatchGrader(ROOT, class_dir, downloads, assignment_ids=[stage], regrade=["nobody"],
                    sandbox=not sandbox).run()
    assert student_path(stage).exists()
