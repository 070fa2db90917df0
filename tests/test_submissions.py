"""What the batch command reads from a submissions folder: no file stops it, every file gets a row
with a reason, students are told apart by their LMS ids (never merged, names in any script kept),
links are never followed, and scores.csv is safe to open in a spreadsheet. The checking stage is
fuzzed in test_submissions_fuzz.py; the last test here runs the real batch command on a small class."""

import csv
import json
import os
import time
import unicodedata

import nbformat
import pytest

from conftest import ASSIGNMENTS, ROOT, solution_path, student_path
from transformer_course.grading.classroom.batch import BatchGrader, collect, spreadsheet_cell, summary
from transformer_course.grading.intake import submissions as submissions_module
from transformer_course.grading.intake.identities import MAX_ID_BYTES
from transformer_course.grading.intake.submissions import Limits, Release, metadata_problems
from transformer_course.grading.sandbox.isolation import bubblewrap_problem

ASSIGNMENT = "01_positional_encoding"  # the cheapest stage to grade
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@pytest.fixture(scope="module")
def release():
    return Release(ROOT / "notebooks", ASSIGNMENTS)


def solution() -> dict:
    return json.loads(solution_path(ASSIGNMENT).read_text(encoding="utf-8"))


def blank() -> dict:
    return json.loads(student_path(ASSIGNMENT).read_text(encoding="utf-8"))


def first(notebook: dict, role: str) -> dict:
    return next(cell for cell in notebook["cells"] if cell["metadata"].get("nbgrader", {}).get(role))


def save(folder, relative: str, content: dict | bytes, modified: float | None = None):
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    if modified is not None:
        os.utime(path, (modified, modified))
    return path


def rows_of(students):
    return {name: [(s.status, s.assignment, s.reasons) for s in result.submissions]
            for name, result in students.items()}


def path_safe(student_id: str) -> bool:
    return (0 < len(student_id.encode()) <= MAX_ID_BYTES and not student_id.startswith(("-", "."))
            and all(unicodedata.category(char)[0] in "LMN" or char in "_-" for char in student_id))


# --- one notebook stops the whole batch (issue 9) -------------------------------------------------------

def graded_cell_mutations():
    def grade_id_list(nb): first(nb, "grade")["metadata"]["nbgrader"]["grade_id"] = ["pe_buffer_shape"]
    def grade_id_dict(nb): first(nb, "grade")["metadata"]["nbgrader"]["grade_id"] = {"id": "pe_buffer_shape"}
    def no_source(nb): del first(nb, "grade")["source"]
    def no_cell_type(nb): del first(nb, "grade")["cell_type"]
    def number_source(nb): first(nb, "grade")["source"] = 42
    return [grade_id_list, grade_id_dict, no_source, no_cell_type, number_source]


@pytest.mark.parametrize("mutate", graded_cell_mutations(), ids=lambda mutate: mutate.__name__)
def test_a_malformed_grade_cell_is_repaired_with_a_reason_and_the_class_goes_on(tmp_path, release, mutate):
    notebook = solution()
    mutate(notebook)
    save(tmp_path, f"mallory/{ASSIGNMENT}.ipynb", notebook)
    save(tmp_path, f"ada/{ASSIGNMENT}.ipynb", solution())
    students = collect(tmp_path, release)
    [ada], [mallory] = students["ada"].submissions, students["mallory"].submissions
    assert ada.status == "ok" and not ada.reasons
    assert mallory.status == "repaired" and mallory.assignment == ASSIGNMENT, mallory.reasons
    number = 1 + solution()["cells"].index(first(solution(), "grade"))
    assert any(f"cell {number}" in reason for reason in mallory.reasons), mallory.reasons  # names the cell it repaired
    assert metadata_problems(release.notebooks[ASSIGNMENT], mallory.notebook) == []  # nbgrader can grade it
    def checks(notebook):  # the locked grade cells (written answers are the student's own)
        return [cell.source for cell in notebook.cells if cell.metadata.get("nbgrader", {}).get("grade")
                and not cell.metadata["nbgrader"].get("solution")]
    assert checks(mallory.notebook) == checks(release.notebooks[ASSIGNMENT])


def test_an_unexpected_error_on_one_file_costs_that_file_only(tmp_path, release, monkeypatch):
    """The class of bugs not yet found: any exception while checking one file is that file's row."""
    real = submissions_module.metadata_problems

    def breaks_on_eve(released, notebook):
        if any("EVE" in cell.source for cell in notebook.cells):
            raise KeyError("a bug of ours")
        return real(released, notebook)

    monkeypatch.setattr(submissions_module, "metadata_problems", breaks_on_eve)
    eve = solution()
    eve["cells"].append(nbformat.v4.new_code_cell("# EVE"))
    save(tmp_path, f"eve/{ASSIGNMENT}.ipynb", eve)
    save(tmp_path, f"ada/{ASSIGNMENT}.ipynb", solution())
    rows = rows_of(collect(tmp_path, release))
    assert rows["ada"] == [("ok", ASSIGNMENT, [])]
    [(status, _, reasons)] = rows["eve"]
    assert status == "rejected" and "the grader could not check this file (KeyError" in reasons[0]


def test_a_253_character_folder_name_gets_a_short_path_safe_id(tmp_path, release):
    save(tmp_path, "x" * 253 + f"/{ASSIGNMENT}.ipynb", solution())
    save(tmp_path, "x" * 252 + f"y/{ASSIGNMENT}.ipynb", solution())  # same first 64 bytes: still two students
    students = collect(tmp_path, release)
    assert len(students) == 2 and all(path_safe(name) for name in students), list(students)
    assert all(result.name.startswith("xxx") for result in students.values())


# --- identities ------------------------------------------------------------------------------------------

def test_canvas_students_with_the_same_name_and_different_ids_are_never_merged(tmp_path, release):
    """Canvas: <lastfirst>[_LATE]_<user id>_<file id>_<name>. The same id twice keeps the newer file: the one
    Canvas received later (it numbers files as it receives them), whatever the times of the download's files
    (Canvas stamps them all when it makes the zip)."""
    now = time.time()
    save(tmp_path, f"smithjohn_12345_67999_{ASSIGNMENT}.ipynb", solution(), now - 3600)
    save(tmp_path, f"smithjohn_12346_67891_{ASSIGNMENT}.ipynb", blank(), now)
    save(tmp_path, f"smithjohn_LATE_12345_67890_{ASSIGNMENT}-1.ipynb", blank(), now)  # received earlier: ignored
    save(tmp_path, f"anon_Xy3zQ_68000_{ASSIGNMENT}.ipynb", blank(), now)  # anonymous grading
    students = collect(tmp_path, release)
    assert set(students) == {"smithjohn_12345", "smithjohn_12346", "anon_Xy3zQ"}
    first_john, second_john = students["smithjohn_12345"], students["smithjohn_12346"]
    assert (first_john.name, first_john.lms_id, second_john.lms_id) == ("smithjohn", "12345", "12346")
    [kept] = first_john.submissions
    assert kept.relative == f"smithjohn_12345_67999_{ASSIGNMENT}.ipynb"
    assert any("graded the newer" in reason and "LATE" in reason for reason in first_john.reasons)


def test_a_late_canvas_file_is_noted_when_it_is_the_one_graded(tmp_path, release):
    save(tmp_path, f"smithjohn_LATE_12345_67999_{ASSIGNMENT}.ipynb", solution())
    [submission] = collect(tmp_path, release)["smithjohn_12345"].submissions
    assert any("late" in reason for reason in submission.reasons)


def test_moodle_folders_and_flat_files_use_the_participant_id(tmp_path, release):
    """Moodle: '<Full Name>_<id>_assignsubmission_file_' as a folder (with the student's own folders in
    it) or as a prefix of each file; blind marking names everyone 'Participant'."""
    save(tmp_path, f"Jane Doe_501_assignsubmission_file_/{ASSIGNMENT}.ipynb", solution())
    save(tmp_path, f"Jane Doe_502_assignsubmission_file_/work/week 1/{ASSIGNMENT}.ipynb", blank())
    save(tmp_path, f"Ana María_503_assignsubmission_file_{ASSIGNMENT}.ipynb", blank())
    save(tmp_path, f"Participant_504_assignsubmission_file_/{ASSIGNMENT}.ipynb", blank())
    students = collect(tmp_path, release)
    assert set(students) == {"jane_doe_501", "jane_doe_502", "ana_maría_503", "participant_504"}
    assert students["ana_maría_503"].name == "Ana María" and students["jane_doe_502"].lms_id == "502"
    assert all(result.submissions[0].assignment == ASSIGNMENT for result in students.values())


def test_a_download_unpacked_into_a_folder_of_its_own_is_read_inside_it(tmp_path, release):
    """Unpacking submissions.zip often makes a folder `submissions/` around the download: the students
    are inside it. A folder holding one student's files is never taken for such a wrapper."""
    save(tmp_path, f"wrapped/course-Stage 1-4711/Jane Doe_501_assignsubmission_file_/{ASSIGNMENT}.ipynb", solution())
    save(tmp_path, f"wrapped/course-Stage 1-4711/John Roe_502_assignsubmission_file_/{ASSIGNMENT}.ipynb", blank())
    save(tmp_path, "wrapped/.DS_Store", b"\0\0\0\1Bud1")
    students = collect(tmp_path / "wrapped", release)
    assert set(students) == {"jane_doe_501", "john_roe_502"}
    assert students["jane_doe_501"].submissions[0].relative == f"Jane Doe_501_assignsubmission_file_/{ASSIGNMENT}.ipynb"
    save(tmp_path, f"alone/mallory/smithjohn_12345_67890_{ASSIGNMENT}.ipynb", blank())  # one student: no wrapper
    assert set(collect(tmp_path / "alone", release)) == {"mallory"}


def test_names_in_any_script_are_kept_and_told_apart(tmp_path, release):
    names = ["山田太郎", "田中花子", "Αλέξης", "Νίκος", "दिव्या", "فاطمه\u200cزهرا", "Ольга"]
    for name in names:
        save(tmp_path, f"{name}/{ASSIGNMENT}.ipynb", blank())
    save(tmp_path, f"Jose\u0301/{ASSIGNMENT}.ipynb", blank())  # decomposed é: another folder ...
    save(tmp_path, f"José/Copy of {ASSIGNMENT} (1).ipynb", solution())  # ... than composed é: two students
    students = collect(tmp_path, release)
    assert len(students) == len(names) + 2 and "unknown" not in students
    assert sorted(result.name for result in students.values()) == sorted([*names, "José", "José"])
    assert all(path_safe(name) for name in students), list(students)
    assert all(not result.reasons for result in students.values() if result.name in names)
    composed, decomposed = (next(result for result in students.values() if result.submissions[0].relative.startswith(
        folder)) for folder in ("José/", "Jose\u0301/"))
    assert composed.submissions[0].assignment == decomposed.submissions[0].assignment == ASSIGNMENT
    assert [s.relative for s in composed.submissions] == [f"José/Copy of {ASSIGNMENT} (1).ipynb"]
    assert decomposed.student in composed.reasons[0] and composed.student in decomposed.reasons[0]
    assert "reads the same" in composed.reasons[0]


def test_awkward_file_and_folder_names_get_distinct_path_safe_ids(tmp_path, release):
    awkward = ["-rf", "--help", "line\nbreak", "right\u202eto left", "[*]?glob", "a b", "ab", "名" * 84,
               "=2+3 HYPERLINK", "@SUM(A1)", "tab\tname", "CON", "-"]
    for name in awkward:
        save(tmp_path, f"{name}/{ASSIGNMENT}.ipynb", blank())
    save(tmp_path, f"=2+3 HYPERLINK_{ASSIGNMENT}.ipynb", blank())  # flat: the same name as the folder above
    os.makedirs(os.fsencode(tmp_path) + b"/caf\xe9")  # a name that is not UTF-8
    save(tmp_path, f"{os.fsdecode(b'caf' + bytes([0xe9]))}/{ASSIGNMENT}.ipynb", blank())
    students = collect(tmp_path, release)
    assert all(path_safe(name) for name in students), list(students)
    assert len(students) == len(awkward) + 1  # "a b", "ab" fold apart; the flat formula file joins its folder


# --- links and foreign files ------------------------------------------------------------------------------

def test_links_are_refused_and_never_followed(tmp_path, release):
    downloads, elsewhere = tmp_path / "downloads", tmp_path / "elsewhere"
    secret = save(elsewhere, f"ada/{ASSIGNMENT}.ipynb", solution())
    victim = save(downloads, f"victim/{ASSIGNMENT}.ipynb", solution())
    (downloads / "mallory").mkdir()
    (downloads / "mallory" / f"{ASSIGNMENT}.ipynb").symlink_to(victim)  # another student's notebook
    (downloads / f"trudy_{ASSIGNMENT}.ipynb").symlink_to(secret)  # a file outside the folder
    (downloads / "oscar").symlink_to(elsewhere / "ada")  # a folder reached through a link
    (downloads / "victim" / "nested").symlink_to(elsewhere)
    rows = rows_of(collect(downloads, release))
    assert rows["victim"][0] == ("ok", ASSIGNMENT, [])
    for name in ("mallory", "trudy", "oscar"):
        [(status, assignment, reasons)] = rows[name]
        assert status == "rejected" and assignment is None and "link" in reasons[0], rows[name]
    assert [status for status, _, _ in rows["victim"]] == ["ok", "rejected"]  # the nested link is named too
    assert set(rows) == {"victim", "mallory", "trudy", "oscar"}


def test_hard_links_and_identical_files_from_different_students_are_flagged_not_rejected(tmp_path, release):
    original = save(tmp_path, f"ada/{ASSIGNMENT}.ipynb", solution())
    os.link(original, tmp_path / f"bob_{ASSIGNMENT}.ipynb")
    save(tmp_path, f"cyd/{ASSIGNMENT}.ipynb", original.read_bytes())  # a copy, byte for byte
    save(tmp_path, f"dee/{ASSIGNMENT}.ipynb", student_path(ASSIGNMENT).read_bytes())  # the untouched release ...
    save(tmp_path, f"eli/{ASSIGNMENT}.ipynb", student_path(ASSIGNMENT).read_bytes())  # ... twice proves nothing
    students = collect(tmp_path, release)
    flags = {name: " ".join(result.submissions[0].reasons) for name, result in students.items()}
    assert all(result.submissions[0].status == "ok" for result in students.values())
    assert "hard links" in flags["ada"] and "hard link" in flags["bob"] and "bob" in flags["ada"]
    assert "byte for byte" in flags["cyd"] and "ada" in flags["cyd"] and "hard link" not in flags["cyd"]
    assert flags["dee"] == flags["eli"] == ""


# --- the CSV --------------------------------------------------------------------------------------------

def test_spreadsheet_cells_never_start_a_formula_and_numbers_stay_numbers():
    for start in FORMULA_STARTS:
        assert spreadsheet_cell(f"{start}2+3") == f"'{start}2+3".replace("\t", " ").replace("\r", " ")
    assert spreadsheet_cell("=HYPERLINK(\"http://x\")").startswith("'=")
    assert spreadsheet_cell("ada") == "ada" and spreadsheet_cell("a\u202eb\x1b[2J") == "a<U+202E>b<U+001B>[2J"
    assert spreadsheet_cell(-1.5) == -1.5 and spreadsheet_cell(3) == 3 and spreadsheet_cell(None) is None


# --- the real batch command on a small class --------------------------------------------------------------

@pytest.mark.slow
def test_the_batch_grades_honest_students_beside_malformed_and_identity_cases(tmp_path, monkeypatch):
    """The real batch command (nbgrader, sandboxed kernels) on a class of ten files: two honest
    students (the solution, the blank notebook), two Canvas students with the same Japanese name and
    different ids, a malformed solution in a 253-character folder, a broken file whose name is a
    spreadsheet formula, a link to another student's notebook, a student whose grading raises, a
    solution with a saved output larger than the grader reads whole (limits lowered: graded, its
    outputs left out) and one with more code cells than the grader runs (rejected)."""
    downloads, class_dir = tmp_path / "downloads", tmp_path / "class"
    long_name = "x" * 253
    malformed = solution()
    first(malformed, "grade")["metadata"]["nbgrader"]["grade_id"] = ["pe_buffer_shape"]
    next(cell for cell in malformed["cells"] if cell["cell_type"] == "markdown")["source"] = 42
    full = [f"ada/{ASSIGNMENT}.ipynb", f"山田太郎_12345_67890_{ASSIGNMENT}.ipynb", f"{long_name}/{ASSIGNMENT}.ipynb"]
    blank_ones = [f"blake/{ASSIGNMENT}.ipynb", f"山田太郎_12346_67891_{ASSIGNMENT}.ipynb"]
    for relative in full[:2] + [f"zed/{ASSIGNMENT}.ipynb"]:
        save(downloads, relative, solution())
    save(downloads, full[2], malformed)
    for relative in blank_ones:
        save(downloads, relative, blank())
    save(downloads, "=2+3 HYPERLINK.ipynb", b'{"cells": [')
    oversized = solution()
    next(cell for cell in oversized["cells"] if cell["cell_type"] == "code")["outputs"] = [
        {"output_type": "stream", "name": "stdout", "text": "0.5\n" * 2**19}]  # 2.5 MB of JSON
    save(downloads, f"olga/{ASSIGNMENT}.ipynb", oversized)
    save(downloads, f"cody/{ASSIGNMENT}.ipynb", {**solution(), "cells": solution()["cells"] + [
        {**nbformat.v4.new_code_cell(f"v{n} = {n}"), "id": f"v{n}"} for n in range(250)]})
    (downloads / "mallory").mkdir()
    (downloads / "mallory" / f"{ASSIGNMENT}.ipynb").symlink_to(downloads / full[0])

    real_place = BatchGrader.place

    def place(grader, result):  # an unexpected error while grading one student
        if result.student == "zed":
            raise OSError("disk full")
        return real_place(grader, result)

    monkeypatch.setattr(BatchGrader, "place", place)
    grader = BatchGrader(ROOT, class_dir, downloads, jobs=2, timeout=60, assignment_ids=[ASSIGNMENT],
                         sandbox=bubblewrap_problem() is None, limits=Limits(whole_bytes=2**20, code_cells=200))
    students = grader.run()
    with open(class_dir / "scores.csv", encoding="utf-8-sig", newline="") as handle:
        table = list(csv.reader(handle))
    for line in table:
        assert not any(cell.startswith(FORMULA_STARTS) for cell in line), line
    header, rows = table[0], [dict(zip(table[0], line, strict=True)) for line in table[1:]]
    assert {"name", "lms_id", "file", "total", "reasons"} <= set(header)
    by_file = {row["file"].removeprefix("'"): row for row in rows}
    assert set(by_file) == {str(path.relative_to(downloads)) for path in downloads.rglob("*.ipynb")}
    assert len(rows) == len({row["student"] for row in rows}) == 10  # a row for every file, no two merged
    maximum = float(by_file[full[0]]["autograded_max"])  # written answers wait for a person
    for relative in [*full, f"olga/{ASSIGNMENT}.ipynb"]:
        assert (by_file[relative]["status"], float(by_file[relative]["autograded"])) == ("graded", maximum), relative
    olga = by_file[f"olga/{ASSIGNMENT}.ipynb"]
    assert olga["notebook"] == "repaired" and "its saved outputs (2.5 MB) were left out" in olga["reasons"]
    assert (class_dir / "submitted" / olga["student"] / ASSIGNMENT / f"{ASSIGNMENT}.ipynb").stat().st_size < 2**17
    cody = by_file[f"cody/{ASSIGNMENT}.ipynb"]
    written = sum(cell["cell_type"] == "code" and bool("".join(cell["source"]).strip()) for cell in solution()["cells"])
    assert cody["status"] == "rejected" and f"{written + 250} code cells with code in them" in cody["reasons"]
    for relative in blank_ones:
        assert by_file[relative]["status"] == "graded" and float(by_file[relative]["autograded"]) < maximum, relative
    canvas = [by_file[blank_ones[1]], by_file[full[1]]]
    assert [(row["name"], row["lms_id"]) for row in canvas] == [("山田太郎", "12346"), ("山田太郎", "12345")]
    long_row = by_file[full[2]]
    assert len(long_row["student"].encode()) <= MAX_ID_BYTES and "rebuilt from the released" in long_row["reasons"]
    assert (class_dir / "feedback" / long_row["student"] / ASSIGNMENT / f"{ASSIGNMENT}.html").exists()
    formula = by_file["=2+3 HYPERLINK.ipynb"]
    assert formula["file"] == "'=2+3 HYPERLINK.ipynb" and formula["status"] == "rejected"
    assert "JSON is broken" in formula["reasons"]
    assert by_file[f"mallory/{ASSIGNMENT}.ipynb"]["status"] == "rejected"
    assert "link" in by_file[f"mallory/{ASSIGNMENT}.ipynb"]["reasons"]
    zed = by_file[f"zed/{ASSIGNMENT}.ipynb"]
    assert zed["status"] == "failed" and "OSError: disk full" in zed["reasons"]
    assert all(line.isprintable() for line in summary(students, class_dir / "scores.csv").splitlines())
