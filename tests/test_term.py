"""A class folder that remembers the term (issue 40): an instructor grades each week's download, often holding only
the week's new files, into the class folder of the whole term. Nothing the download lacks is forgotten.

The real batch command grades week 1 (a Canvas student, a repaired notebook, a blank one with a cell that never
finishes, a broken file, and a stage-2 notebook that will be copied), then week 2, a folder with one new file: the
Canvas student's stage 2, byte for byte the other student's. Every row of scores.csv and the class report must then
be what grading both folders at once gives. A third week resubmits one notebook: only its row changes."""

import csv
import json
import os
import re
import shutil
import time

import nbformat
import pytest

from conftest import ROOT, solution_path, student_path
from quality.examples import KNOWN_BUGS
from transformer_course.grading.classroom.batch import BatchGrader
from transformer_course.grading.intake.identities import Identity, student_ids
from transformer_course.grading.outputs import lms
from transformer_course.grading.sandbox.isolation import bubblewrap_problem

sandboxed = pytest.mark.skipif(bubblewrap_problem() is not None, reason=f"no sandbox here: {bubblewrap_problem()}")
pytestmark = pytest.mark.xdist_group("term")  # one worker: the term (three gradings) is made once, not per worker
STAGE1, STAGE2 = "01_positional_encoding", "02_attention"
WEEK = 7 * 24 * 3600
START = time.time() - 3 * WEEK
CANVAS = "smithjohn_12345"  # the Canvas student's id


def _save(folder, relative, notebook, modified):
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(notebook, bytes):
        path.write_bytes(notebook)
    else:
        nbformat.write(notebook, path)
    os.utime(path, (modified, modified))
    return path


def _week_one(folder):
    solution = nbformat.read(solution_path(STAGE1), as_version=4)
    _save(folder, f"smithjohn_12345_67890_{STAGE1}.ipynb", solution, START)  # Canvas: an LMS id
    stripped = nbformat.read(solution_path(STAGE1), as_version=4)
    for cell in stripped.cells:
        cell.metadata = {}
    _save(folder, f"dana/{STAGE1}.ipynb", stripped, START)  # repaired from the release
    blank = nbformat.read(student_path(STAGE1), as_version=4)
    blank.cells.append(nbformat.v4.new_code_cell("import os\nos._exit(1)  # a cell that does not finish"))
    _save(folder, f"blake/{STAGE1}.ipynb", blank, START)  # 0 points, and a cell that did not finish
    _save(folder, f"finn/{STAGE1}.ipynb", solution_path(STAGE1).read_bytes()[:3000], START)  # not JSON: rejected
    buggy = KNOWN_BUGS[STAGE2].apply(nbformat.read(solution_path(STAGE2), as_version=4))
    return _save(folder, f"chen/{STAGE2}.ipynb", buggy, START)


def _week_two(folder, chen):
    """One new file: the Canvas student's stage 2, a byte-for-byte copy of chen's of week 1."""
    _save(folder, f"smithjohn_12345_67891_{STAGE2}.ipynb", chen.read_bytes(), START + WEEK)


def _grade(folder, class_dir):
    grader = BatchGrader(ROOT, class_dir, folder, jobs=2, assignment_ids=[STAGE1, STAGE2])
    return grader.run()


def _rows(class_dir):
    with open(class_dir / "scores.csv", encoding="utf-8-sig") as handle:
        return {(row["student"], row["assignment"], row["file"]): row for row in csv.DictReader(handle)}


def _report(class_dir):
    """report.html without the line that names the class folder and the time it was written."""
    page = (class_dir / "report.html").read_text(encoding="utf-8")
    return re.sub(r"<p class=muted>[^<]*, written \d{4}-\d\d-\d\d \d\d:\d\d from scores.csv", "", page)


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    base = tmp_path_factory.mktemp("term")
    week1, week2, both = base / "week1", base / "week2", base / "both"
    chen = _week_one(week1)
    _week_two(week2, chen)
    shutil.copytree(week1, both)
    shutil.copytree(week2, both, dirs_exist_ok=True)
    weekly, together = base / "weekly", base / "together"
    _grade(week1, weekly)
    after_week_one = _rows(weekly)
    second = _grade(week2, weekly)
    _grade(both, together)
    return base, weekly, together, after_week_one, second


@pytest.mark.slow
@sandboxed
def test_a_week_with_one_new_file_gives_the_rows_and_report_of_grading_both_weeks_at_once(term):
    _, weekly, together, _, _ = term
    rows, expected = _rows(weekly), _rows(together)
    assert set(rows) == set(expected), set(rows) ^ set(expected)
    for key, row in expected.items():
        assert rows[key] == row, (key, {column: (rows[key].get(column), value) for column, value in row.items()
                                        if rows[key].get(column) != value})
    assert _report(weekly) == _report(together)
    similar = [json.loads((folder / "similarity.json").read_text()) for folder in (weekly, together)]
    assert similar[0] == similar[1]


@pytest.mark.slow
@sandboxed
def test_students_and_notebooks_absent_from_the_week_keep_every_field_flag_and_pending_answer(term):
    """What the issue saw vanish: status, notebook, reasons, file and lms_id; a copy flag, pending answers, a zero and
    an unfinished cell in the report."""
    _, weekly, _, after_week_one, second = term
    assert set(second) == {CANVAS}  # week 2 holds only the Canvas student
    rows = _rows(weekly)
    for key, before in after_week_one.items():
        now = rows[key]
        for column in ("status", "notebook", "file", "lms_id", "name", "total", "manual_status"):
            assert now[column] == before[column], (key, column, before[column], now[column])
        assert before["reasons"] in now["reasons"], (key, before["reasons"], now["reasons"])
    by_student = {(student, stage): row for (student, stage, _), row in rows.items()}
    assert by_student[CANVAS, STAGE1]["lms_id"] == "12345" and by_student[CANVAS, STAGE1]["status"] == "graded"
    assert by_student["dana", STAGE1]["notebook"] == "repaired" and float(by_student["blake", STAGE1]["total"]) == 0
    assert re.search(r"did not finish: crashed", by_student["blake", STAGE1]["reasons"])
    assert by_student["finn", "?"]["status"] == "rejected"
    assert by_student[CANVAS, STAGE1]["manual_status"].startswith("needs manual grading")
    # the copy of last week's notebook is flagged on both rows, each naming the other
    copied, original = by_student[CANVAS, STAGE2]["reasons"], by_student["chen", STAGE2]["reasons"]
    assert "byte for byte" in copied and "chen" in copied and "byte for byte" in original and CANVAS in original
    page = (weekly / "report.html").read_text(encoding="utf-8")
    people = re.search(r"<table class=sortable id=people>.*?</table>", page, re.DOTALL).group(0)
    for student, need in (("blake", "cells that did not finish"), ("blake", "zero points"), ("finn", "rejected"),
                          ("dana", "repaired"), ("chen", "flagged for review"), (CANVAS, "answers to grade")):
        assert re.search(rf">{student}</td>.*?{need}", people, re.DOTALL), (student, need)


@pytest.mark.slow
@sandboxed
def test_the_copied_notebook_of_an_earlier_week_is_listed_as_a_near_copy(term):
    _, weekly, _, _, _ = term
    found = json.loads((weekly / "similarity.json").read_text())
    pairs = [group for group in found["groups"] if group["assignment"] == STAGE2]
    assert pairs and all({"chen", CANVAS} <= set(group["members"]) for group in pairs), pairs


@pytest.mark.slow
@sandboxed
def test_a_resubmission_replaces_only_what_it_resubmits(term, tmp_path):
    base, weekly, _, _, _ = term
    class_dir = tmp_path / "class"
    shutil.copytree(weekly, class_dir)  # the other tests read the class folder of week 2
    weekly, week3 = class_dir, tmp_path / "week3"
    redone = nbformat.read(solution_path(STAGE1), as_version=4)
    redone.cells.append(nbformat.v4.new_markdown_cell("Done again."))  # other bytes than the Canvas student's
    _save(week3, f"blake/{STAGE1}.ipynb", redone, START + 2 * WEEK)
    before = _rows(weekly)
    graded = _grade(week3, weekly)
    assert graded["blake"].to_grade == [STAGE1]
    after = _rows(weekly)
    assert set(after) == set(before)
    changed = {key for key in before if after[key] != before[key]}
    assert changed == {("blake", STAGE1, f"blake/{STAGE1}.ipynb")}, changed
    assert float(after["blake", STAGE1, f"blake/{STAGE1}.ipynb"]["total"]) > 0
    # the same download again: nothing to grade, nothing changes
    again = _grade(week3, weekly)
    assert again["blake"].status == "skipped" and _rows(weekly) == after


def test_a_student_keeps_their_id_all_term_and_a_newcomer_never_takes_it():
    """ADA alone in week 1 is `ada`; in week 2 a folder `ada` appears: before the term was kept it would have taken
    the id `ada` (its name is exactly it) and ADA's rows; now ADA keeps `ada` and the newcomer gets a suffix."""
    upper, lower = Identity("", "", "ADA", "ADA"), Identity("", "", "ada", "ada")
    week1 = student_ids([upper])
    assert week1 == {upper: "ada"}
    week2 = student_ids([lower, upper], known=week1)
    assert week2[upper] == "ada" and week2[lower].startswith("ada-") and week2[lower] != "ada"
    assert student_ids([lower], known=week1)[lower] == week2[lower]  # whether or not ADA is in the folder


@pytest.mark.slow
@sandboxed
def test_lms_update_after_the_second_week_names_everyone_it_leaves_out(term, tmp_path):
    _, weekly, _, _, _ = term
    export = tmp_path / "export.csv"
    export.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Stage 1 (901),Stage 2 (902)\n"
                      "Points Possible,,,,,14,44\nsmith john,12345,,,,,\n", encoding="utf-8")
    class_dir = tmp_path / "class"
    shutil.copytree(weekly, class_dir)
    result = lms.export(class_dir, canvas_export=export, update=True)
    left = result.left_out
    assert {"dana", "blake", "chen", "finn"} <= set(left), left  # no LMS id in their file names, answers waiting ...
    assert "no LMS id in the file's name" in " ".join(left["blake"])  # blake's answers were left blank: none wait
    assert "rejected" in " ".join(left["finn"])
    assert any("written answers not graded yet" in reason for reason in left[CANVAS]), left[CANVAS]


# --- without grading: what a run decides from the class folder's records ------------------------------------------

def _planned(tmp_path, record, files):
    """BatchGrader.plan for a download holding FILES ({relative: (notebook, time)}) against RECORD."""
    from transformer_course.grading.classroom.batch import collect
    from transformer_course.grading.intake.submissions import Release

    downloads = tmp_path / "downloads"
    for relative, (notebook, modified) in files.items():
        _save(downloads, relative, notebook, modified)
    grader = BatchGrader(ROOT, tmp_path / "class", downloads, assignment_ids=[STAGE1])
    grader.release = Release(ROOT / "notebooks", [STAGE1])
    [result] = collect(downloads, grader.release, flag_copies=False).values()
    grader.plan(result, record)
    return grader, result


def test_an_older_notebook_in_a_later_download_is_not_graded_and_the_row_says_so(tmp_path):
    from transformer_course.grading.gradebook import term

    record = term.Record("ada", notebooks={STAGE1: term.Entry(f"ada/{STAGE1}.ipynb", digest="newer", modified=START,
                                                              status="graded")})
    _, result = _planned(tmp_path, record, {f"ada/{STAGE1}.ipynb": (
        nbformat.read(student_path(STAGE1), as_version=4), START - WEEK)})
    assert result.to_grade == [] and result.changed
    assert "an older notebook" in record.notebooks[STAGE1].reasons[0] and "stays" in record.notebooks[STAGE1].reasons[0]
    _, newer = _planned(tmp_path / "again", record, {f"ada/{STAGE1}.ipynb": (
        nbformat.read(student_path(STAGE1), as_version=4), START + WEEK)})
    assert newer.to_grade == [STAGE1]  # a resubmission: graded, and its row replaces the stage's


def test_a_record_from_before_the_term_was_kept_is_taken_over_when_the_same_files_come_again(tmp_path):
    """Records written before this change hold the fingerprint of the student's files and the status: the same
    download graded again grades nobody and keeps the reasons."""
    from transformer_course.grading.classroom.batch import fingerprint
    from transformer_course.grading.gradebook import term

    notebook = nbformat.read(solution_path(STAGE1), as_version=4)
    grader, result = _planned(tmp_path, term.Record("ada"), {f"ada/{STAGE1}.ipynb": (notebook, START)})
    legacy = term.Record("ada", last_run={"fingerprint": fingerprint(result.submissions), "status": "graded",
                                          "reasons": [f"{STAGE1}: handed in late"]})
    grader.plan(result, legacy)
    assert result.to_grade == [] and legacy.notebooks[STAGE1].reasons == [f"{STAGE1}: handed in late"]
    assert legacy.notebooks[STAGE1].normalised  # the near-copies can compare it
