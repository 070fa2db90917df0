"""Attacks on who a notebook belongs to, as a student who wants a classmate's place would try them.

A student chooses the name of the file they upload (and, in a Moodle submission, its folders), never
the participant folder or the ids the LMS puts in front of it. Each test builds the download the
LMS would give, adds the attacker's file, and requires that the victim keeps their own notebook,
that the attacker gets a row of their own, and that nobody's grade depends on who else is in the
class. The checking stage only (`collect`): no notebook is run, so these cost a second or two.
"""

import json
import os
import time
import unicodedata
from pathlib import PurePosixPath

import pytest

from conftest import ASSIGNMENTS, ROOT, solution_path, student_path
from transformer_course.grading.classroom.batch import collect, spreadsheet_cell
from transformer_course.grading.intake.identities import MAX_ID_BYTES, identify, lookalike_notes, student_ids
from transformer_course.grading.intake.submissions import Release

ASSIGNMENT = "01_positional_encoding"
NOW = time.time()


@pytest.fixture(scope="module")
def release():
    return Release(ROOT / "notebooks", ASSIGNMENTS)


def save(folder, relative: str, source, modified: float) -> None:
    """The file at FOLDER/RELATIVE with the bytes of SOURCE (a notebook's path), last changed at MODIFIED."""
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(source.read_bytes())
    os.utime(path, (modified, modified))


def owner(students, relative: str):
    """The student whose graded notebook is the file RELATIVE."""
    [result] = [result for result in students.values() for s in result.submissions if s.relative == relative]
    return result


def collision_free(ids) -> bool:
    """No two ids are the same folder on a file system that ignores case or Unicode normalisation."""
    keys = {unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold()) for name in ids}
    return len(keys) == len(ids) and all(0 < len(name.encode()) <= MAX_ID_BYTES for name in ids)


VICTIMS = {  # the honest file the LMS wrote, whose student the attacker wants to be
    "canvas": f"smithjohn_12345_67890_{ASSIGNMENT}.ipynb",
    "moodle": f"Jane Doe_501_assignsubmission_file_/{ASSIGNMENT}.ipynb",
}
ATTACKS = {  # the attacker's file: a name they chose, newer than the victim's, a blank notebook
    "plain folder, file named as a Canvas download": ("canvas", f"mallory/smithjohn_12345_67890_{ASSIGNMENT}.ipynb"),
    "plain folder, file named as a Moodle download": (
        "moodle", f"mallory/Jane Doe_501_assignsubmission_file_{ASSIGNMENT}.ipynb"),
    "plain folder, subfolder named as a Moodle folder": (
        "moodle", f"mallory/Jane Doe_501_assignsubmission_file_/{ASSIGNMENT}.ipynb"),
    "Moodle folder, file named as the victim's Moodle folder": (
        "moodle", f"Mal Lory_222_assignsubmission_file_/Jane Doe_501_assignsubmission_file_{ASSIGNMENT}.ipynb"),
    "Moodle folder, subfolder named as the victim's Moodle folder": (
        "moodle", f"Mal Lory_222_assignsubmission_file_/Jane Doe_501_assignsubmission_file_/{ASSIGNMENT}.ipynb"),
    "Moodle prefix, file named as a Canvas download": (
        "canvas", f"Mal Lory_222_assignsubmission_file_smithjohn_12345_67890_{ASSIGNMENT}.ipynb"),
    "Canvas prefix, file named as a Moodle download": (
        "moodle", f"mallory_222_68000_Jane Doe_501_assignsubmission_file_{ASSIGNMENT}.ipynb"),
    "Canvas prefix, file named as the victim's Canvas download": (
        "canvas", f"mallory_222_68001_smithjohn_12345_67890_{ASSIGNMENT}.ipynb"),
    "plain folder named as the victim in capitals": ("plain", f"ADA/{ASSIGNMENT}.ipynb"),
}


@pytest.mark.parametrize("attack", ATTACKS, ids=list(ATTACKS))
def test_a_name_a_student_chose_never_takes_a_classmates_place(tmp_path, release, attack):
    lms, attacker = ATTACKS[attack]
    victim = VICTIMS.get(lms, f"ada/{ASSIGNMENT}.ipynb")
    save(tmp_path, victim, solution_path(ASSIGNMENT), NOW - 3600)
    save(tmp_path, attacker, student_path(ASSIGNMENT), NOW)  # newer: it would win a merge
    students = collect(tmp_path, release)
    honest, other = owner(students, victim), owner(students, attacker)
    assert honest is not other and len(students) == 2, list(students)
    assert not any("two notebooks" in reason for reason in honest.reasons + other.reasons)
    assert honest.submissions[0].status == "ok" and other.submissions[0].assignment == ASSIGNMENT
    save(tmp_path / "alone", victim, solution_path(ASSIGNMENT), NOW)  # the class without the attacker
    assert set(collect(tmp_path / "alone", release)) == {honest.student}, "the attacker changed the victim's id"


def test_names_that_differ_only_by_case_or_unicode_form_are_different_students(tmp_path, release):
    """Folders that an instructor (or an attacker, in a flat layout) named ada, ADA, Ada, ａｄａ (fullwidth),
    ada with a zero-width space or a trailing space, аda with a Cyrillic а, and José composed and
    decomposed: each keeps
    its own notebook and row. `ada` keeps the id `ada`; the others get ids that no file system that
    ignores case or normalisation confuses; the instructor is told which names read the same, and
    which one mixes alphabets within a word."""
    twins = ["ada", "ADA", "Ada", "ａｄａ", "ada\u200b", "ada ", "\u0430da", "Jos\u00e9", "Jose\u0301"]
    for number, name in enumerate(twins):
        save(tmp_path, f"{name}/{ASSIGNMENT}.ipynb", solution_path(ASSIGNMENT) if number == 0 else
             student_path(ASSIGNMENT), NOW - 3600 * (number == 0))
    students = collect(tmp_path, release)
    assert len(students) == len(twins) and collision_free(list(students)), list(students)
    for name in twins:
        result = owner(students, f"{name}/{ASSIGNMENT}.ipynb")
        assert len(result.submissions) == 1 and result.submissions[0].status == "ok"
    ada = students["ada"]
    assert ada.submissions[0].relative == f"ada/{ASSIGNMENT}.ipynb"
    alike = [note for note in ada.reasons if "reads the same" in note]
    assert len(alike) == 1 and all(owner(students, f"{name}/{ASSIGNMENT}.ipynb").student in alike[0]
                                   for name in ["ADA", "Ada"]), ada.reasons
    mixed = owner(students, f"\u0430da/{ASSIGNMENT}.ipynb")
    assert any("flagged for review" in note and "Cyrillic and Latin" in note for note in mixed.reasons)
    flagged = [result.student for result in students.values() if any("flagged" in note for note in result.reasons)]
    assert flagged == [mixed.student]  # a name in one script is never flagged


def test_two_students_with_the_same_name_in_any_script_are_told_apart_and_flagged_only_when_mixed():
    """Honest names in one script, or Japanese mixing kanji and kana, are never flagged."""
    honest = ["山田たろう", "Ольга", "Αλέξης", "फ़ातिमा", "O'Brien-Smith", "Zoë", "ａｄａ"]
    identities = [identify(PurePosixPath(f"{name}/x.ipynb"), [])[0] for name in honest]
    notes = lookalike_notes(identities, student_ids(identities))
    assert not any(note.startswith("flagged") for found in notes.values() for note in found), notes


@pytest.mark.parametrize("name", ["=HYPERLINK(\"http://x\",\"ok\")", "+1-2", "-2+3", "@SUM(A1:A2)", "\t=1+1",
                                  "\r=1+1", "＝1+1", " =1+1", "=cmd|' /C calc'!A0", "a\n=1+1", "a\u2028=1"])
def test_a_name_made_to_be_run_by_a_spreadsheet_is_inert_in_every_field_taken_in(tmp_path, release, name):
    """CSV and LMS injection through the name of a folder or a file: the readable name and the id
    begin with a letter or digit, so they are inert even where an output forgot to escape them, and
    every field is a printable cell that starts no formula once written (OWASP's characters)."""
    save(tmp_path, f"{name}/{ASSIGNMENT}.ipynb", student_path(ASSIGNMENT), NOW)
    save(tmp_path, f"{name}_7_8_{ASSIGNMENT}.ipynb".replace("\n", " "), student_path(ASSIGNMENT), NOW)
    for result in collect(tmp_path, release).values():
        for field in (result.student, result.name, result.lms_id, result.submissions[0].relative):
            cell = spreadsheet_cell(field)
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), (name, field, cell)
            assert cell.isprintable(), (name, field, cell)
        assert result.student[0].isalnum() and (not result.name or result.name[0].isalnum()), result


def test_a_canvas_file_keeps_canvas_lower_case_late_mark_and_an_old_download_without_a_name():
    """Canvas writes `late` in lower case in some versions, and no name at all in old anonymous downloads;
    a student's own file name starting with digits does not move the id."""
    late, notes = identify(PurePosixPath(f"smithjohn_late_12345_67890_{ASSIGNMENT}.ipynb"), ASSIGNMENTS)
    assert (late.lms_id, late.name) == ("12345", "smithjohn") and "late" in notes[0]
    nameless, _ = identify(PurePosixPath("12345_67890_2_attention.ipynb"), ASSIGNMENTS)
    assert (nameless.lms, nameless.lms_id) == ("canvas", "12345")
    anonymous, _ = identify(PurePosixPath(f"anon_Xy3zQ_68000_{ASSIGNMENT}.ipynb"), ASSIGNMENTS)
    assert anonymous.lms_id == "anon_Xy3zQ"
    for digits in ("\uff11\uff12\uff13", "\u0661\u0662\u0663"):  # fullwidth and Arabic-Indic 123: not an LMS's id
        assert identify(PurePosixPath(f"smithjohn_{digits}_67890_x.ipynb"), ASSIGNMENTS)[0].lms == ""
        assert identify(PurePosixPath(f"Jane Doe_{digits}_assignsubmission_file_/x.ipynb"), ASSIGNMENTS)[0].lms == ""


def test_canvas_anonymous_ids_that_differ_only_by_case_get_ids_no_file_system_confuses(tmp_path, release):
    """anon_Xy3zQ and anon_xY3Zq are two students; on macOS' default file system their folders would be one."""
    save(tmp_path, f"anon_Xy3zQ_68000_{ASSIGNMENT}.ipynb", solution_path(ASSIGNMENT), NOW - 3600)
    save(tmp_path, f"anon_xY3Zq_68001_{ASSIGNMENT}.ipynb", student_path(ASSIGNMENT), NOW)
    students = collect(tmp_path, release)
    assert len(students) == 2 and collision_free(list(students)), list(students)
    assert {result.lms_id for result in students.values()} == {"anon_Xy3zQ", "anon_xY3Zq"}
    assert owner(students, f"anon_Xy3zQ_68000_{ASSIGNMENT}.ipynb").submissions[0].status == "ok"


def test_every_file_in_the_folder_is_accounted_for(tmp_path, release):
    """A notebook is a row; another file is named on its student's rows; a student who handed in no
    notebook gets a rejected row naming their files; only what machines add is passed over."""
    save(tmp_path, f"ada/{ASSIGNMENT}.ipynb", solution_path(ASSIGNMENT), NOW)
    (tmp_path / "ada" / "report.pdf").write_bytes(b"%PDF-1.4")
    (tmp_path / "ada" / ".ipynb_checkpoints").mkdir()
    save(tmp_path, f"ada/.ipynb_checkpoints/{ASSIGNMENT}-checkpoint.ipynb", student_path(ASSIGNMENT), NOW + 60)
    save(tmp_path, f"bo/.draft {ASSIGNMENT}.ipynb", student_path(ASSIGNMENT), NOW)  # hidden, but handed in
    (tmp_path / "cy").mkdir()
    (tmp_path / "cy" / "homework.zip").write_bytes(b"PK\x03\x04")
    (tmp_path / "dee_homework.py").write_text("print(1)")
    save(tmp_path, f".eve_{ASSIGNMENT}.ipynb", student_path(ASSIGNMENT), NOW)  # a flat file saved hidden
    for litter in ("ada/.DS_Store", "ada/._report.pdf", "ada/Thumbs.db", "__MACOSX/ada/._report.pdf", ".git/HEAD"):
        (tmp_path / litter).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / litter).write_bytes(b"\0")
    students = collect(tmp_path, release)
    assert set(students) == {"ada", "bo", "cy", "dee_homework", "eve"}
    ada = students["ada"]
    assert [s.relative for s in ada.submissions] == [f"ada/{ASSIGNMENT}.ipynb"]  # the checkpoint is not graded
    assert any("ada/report.pdf" in note and "checkpoint" in note for note in ada.reasons), ada.reasons
    assert students["bo"].submissions[0].assignment == ASSIGNMENT
    for name, file in (("cy", "cy/homework.zip"), ("dee_homework", "dee_homework.py")):
        [row] = students[name].submissions
        assert row.status == "rejected" and row.relative == file and "no notebook" in row.reasons[0], row
    named = " ".join(reason for result in students.values() for s in result.submissions
                     for reason in [s.relative, *s.reasons, *result.reasons])
    for path in tmp_path.rglob("*"):
        relative = str(path.relative_to(tmp_path))
        machine_made = any(part in ("__MACOSX", ".git", ".DS_Store", "Thumbs.db") or part.startswith("._")
                           for part in path.parts)
        assert path.is_dir() or machine_made or relative in named, relative


def test_notebooks_saved_by_a_student_twice_keep_the_newer_and_name_the_other_file(tmp_path, release):
    save(tmp_path, f"ada/{ASSIGNMENT}.ipynb", student_path(ASSIGNMENT), NOW - 3600)
    save(tmp_path, f"ada/work/{ASSIGNMENT} (1).ipynb", solution_path(ASSIGNMENT), NOW)
    [result] = collect(tmp_path, release).values()
    assert [s.relative for s in result.submissions] == [f"ada/work/{ASSIGNMENT} (1).ipynb"]
    assert any(f"ignored ada/{ASSIGNMENT}.ipynb" in reason for reason in result.reasons), result.reasons


def test_identities_and_ids_do_not_depend_on_the_order_files_are_found(tmp_path, release):
    names = ["ada", "ADA", "Ada", "josé", "Jose\u0301"]
    for name in names:
        save(tmp_path, f"{name}/{ASSIGNMENT}.ipynb", student_path(ASSIGNMENT), NOW)
    first = {result.submissions[0].relative: student for student, result in collect(tmp_path, release).items()}
    for name in names[1:]:
        (tmp_path / name).rename(tmp_path / f"{name}.tmp")
        (tmp_path / f"{name}.tmp").rename(tmp_path / name)
    again = {result.submissions[0].relative: student for student, result in collect(tmp_path, release).items()}
    assert first == again and first[f"ada/{ASSIGNMENT}.ipynb"] == "ada" and first[f"josé/{ASSIGNMENT}.ipynb"] == "josé"
    assert json.dumps(first, ensure_ascii=False)  # ids are text
