"""Grades for Canvas and Moodle from scores.csv: the files follow each LMS's import layout, students are
keyed by the LMS ids read from the download names, ungraded written answers leave a stage empty."""

import csv

from transformer_course.grading.outputs import lms

COLUMNS = ["student", "name", "lms_id", "assignment", "autograded", "autograded_max", "manual", "manual_max",
           "manual_status", "total", "max", "status", "notebook", "reasons", "file"]


def write_scores(folder, rows):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "scores.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row.get(key, "") for key in COLUMNS})


def row(student, name, lms_id, assignment, total, maximum, file, status="graded", manual_status="graded by hand"):
    return {"student": student, "name": name, "lms_id": lms_id, "assignment": assignment, "total": total,
            "max": maximum, "file": file, "status": status, "manual_status": manual_status}


def read(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def test_canvas_gradebook_has_canvas_layout_one_column_per_stage_keyed_by_user_id(tmp_path):
    write_scores(tmp_path, [
        row("smithjohn_12345", "smithjohn", "12345", "01_positional_encoding", "14", "14",
            "smithjohn_12345_67890_01_positional_encoding.ipynb"),
        row("smithjohn_12345", "smithjohn", "12345", "02_attention", "30.5", "40",
            "smithjohn_12345_67891_02_attention.ipynb"),
        row("leeann_222", "leeann", "222", "02_attention", "20", "40", "leeann_LATE_222_67892_02_attention.ipynb",
            manual_status="needs manual grading: 1 of 3 written answers (3 points not counted yet)"),
        row("anon_x9", "", "anon_x9", "02_attention", "10", "40", "anon_x9_67893_02_attention.ipynb"),
        row("ada", "ada", "", "02_attention", "40", "40", "ada/02_attention.ipynb"),
        row("finn_333", "finn", "333", "02_attention", "", "", "finn_333_67894_02_attention.ipynb",
            status="rejected", manual_status=""),
    ])
    result = lms.export(tmp_path, titles={"02_attention": "Stage 2 (4711)"})
    table = read(tmp_path / "lms" / "canvas_gradebook.csv")
    header, points, *students = table
    # what Canvas's gradebook importer requires: Student, ID, then SIS User ID, SIS Login ID and Section
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01_positional_encoding",
                      "Stage 2 (4711)"]
    assert points == ["Points Possible", "", "", "", "", "14", "40"]
    assert {line[1]: line[5:] for line in students} == {"12345": ["14", "30.5"], "222": ["", ""], "333": ["", ""]}
    assert any("222" in note or "leeann" in note for note in result.notes)  # pending: left empty, said so
    assert any("anon_x9" in note for note in result.notes) and any("ada" in note for note in result.notes)


def test_moodle_worksheets_per_stage_keyed_by_participant(tmp_path):
    write_scores(tmp_path, [
        row("ann_lee_101", "Ann Lee", "101", "02_attention", "31", "40",
            "Ann Lee_101_assignsubmission_file_/02_attention.ipynb"),
        row("bo_chen_102", "Bo Chen", "102", "02_attention", "12", "40",
            "Bo Chen_102_assignsubmission_file_/Copy of 02_attention.ipynb",
            manual_status="needs manual grading: 3 of 3 written answers (7 points not counted yet)"),
        row("ann_lee_7", "Ann Lee", "7", "03_blocks", "20", "30", "Ann Lee_7_assignsubmission_file_/03_blocks.ipynb"),
    ])
    lms.export(tmp_path)
    attention = read(tmp_path / "lms" / "moodle_02_attention.csv")
    assert attention[0] == ["Identifier", "Full name", "Grade", "Maximum grade", "Last modified (grade)",
                            "Feedback comments"]
    assert [line[:4] for line in attention[1:]] == [["Participant 101", "Ann Lee", "31", "40"],
                                                   ["Participant 102", "Bo Chen", "", "40"]]
    assert read(tmp_path / "lms" / "moodle_03_blocks.csv")[1][:3] == ["Participant 7", "Ann Lee", "20"]
    assert not (tmp_path / "lms" / "canvas_gradebook.csv").exists()
    lms.export(tmp_path, include_pending=True)
    assert read(tmp_path / "lms" / "moodle_02_attention.csv")[2][2] == "12"
