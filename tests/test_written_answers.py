"""Written answers graded by hand: the questions in the lessons (model answer and rubric in the
solutions only), and the instructors' workflow after the batch command: scores.csv says what still
waits for a person, export writes a page per question, import puts scores and comments into the
gradebook, the feedback and scores.csv; the formgrader configuration points at the class."""

import contextlib
import csv
import html as htmllib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import ASSIGNMENTS, EXAMPLE_ASSIGNMENT, ROOT, read, solution_path, student_path
from transformer_course.authoring import _nbgrader_metadata
from transformer_course.grading.intake.submissions import rebuild
from transformer_course.grading.outputs import answers

pytestmark = pytest.mark.xdist_group("example_class")  # one worker: the shared example class


def answer_cells(notebook):
    return [(index, cell) for index, cell in enumerate(notebook.cells) if answers.is_answer_cell(cell)]


# --- the questions in the lessons (cheap) -----------------------------------------------------------

@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_stage_asks_two_or_three_questions_with_a_rubric_that_adds_up(assignment):
    notebook = read(solution_path(assignment))
    found = answers.questions(notebook, assignment)
    assert 2 <= len(found) <= 3, f"{assignment}: {len(found)} written questions"
    for (index, cell), question in zip(answer_cells(notebook), found, strict=True):
        metadata = cell.metadata["nbgrader"]
        assert cell.cell_type == "markdown" and not metadata["locked"] and metadata["schema_version"] == 3
        assert question.points > 0 and question.model_answer, question.grade_id
        assert sum(points for points, _ in question.rubric) == question.points, (question.grade_id, question.rubric)
        assert all(text for _, text in question.rubric)
        prompt = notebook.cells[index - 1]
        assert prompt.cell_type == "markdown" and "nbgrader" not in prompt.metadata, question.grade_id
        assert f"({question.points:g} points)" in prompt.source, "the question states its points"
        assert question.grade_id in {c.metadata.get("nbgrader", {}).get("grade_id") for c in notebook.cells}


def test_answer_ids_are_unique_across_the_course():
    ids = [cell.metadata["nbgrader"]["grade_id"] for a in ASSIGNMENTS
           for _, cell in answer_cells(read(solution_path(a)))]
    graded = [cell.metadata["nbgrader"]["grade_id"] for a in ASSIGNMENTS for cell in read(solution_path(a)).cells
              if cell.metadata.get("nbgrader", {}).get("grade")]
    assert len(ids) == len(set(ids)) and len(graded) == len(set(graded))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_model_answers_and_rubrics_never_reach_the_student_release(assignment):
    solution, release = read(solution_path(assignment)), read(student_path(assignment))
    released_text = "\n".join(cell.source for cell in release.cells)
    assert "Model answer" not in released_text and "Rubric" not in released_text
    written = answer_cells(release)
    assert [c.metadata["nbgrader"]["grade_id"] for _, c in written] == [
        c.metadata["nbgrader"]["grade_id"] for _, c in answer_cells(solution)]
    assert all(cell.source == "YOUR ANSWER HERE" for _, cell in written)
    for question in answers.questions(solution, assignment):
        texts = [question.model_answer, *(text for _, text in question.rubric)]
        fragments = [piece.strip() for text in texts for piece in re.split(r"[.;:]", text) if len(piece.strip()) > 30]
        assert fragments
        leaked = [fragment for fragment in fragments if fragment in released_text]
        assert not leaked, f"{question.grade_id}: model answer text in the student notebook: {leaked[:2]}"


def test_answer_pages_typeset_math_as_the_feedback_pages_do():
    """TeX in the question, the model answer, the rubric and a student's answer is MathML on the answer page
    (as on the feedback pages, outputs/mathml.py), with no script; the student's text as typed stays beside it
    and their HTML is text."""
    question = answers.Question("02_attention", "attn_q_scale", 1, 3.0, "Why divide by $\\sqrt{d_k}$?",
                                "The variance of $q \\cdot k$ grows with $d_k$.", ((3.0, "names $d_k$"),))
    typed = "Because $\\mathrm{Var}(q \\cdot k) = d_k$, so <script>alert(1)</script> we scale."
    sheet = answers.Sheet(question, [answers.Answer("ada", "Ada", "", typed, None, False, "")])
    page = answers._question_page(sheet)
    assert page.count("<math") == 5 and "$" not in page.split("<details>")[0].split("<h2>Question</h2>")[1]
    assert 'alttext="\\mathrm{Var}(q \\cdot k) = d_k"' in page
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # text, not HTML
    assert htmllib.escape(typed) in page.split("<details>")[1]  # as typed, escaped


def test_an_emptied_answer_counts_as_left_blank_not_to_grade(tmp_path):
    """A student who deletes the answer's placeholder and writes nothing (or only spaces) left it blank:
    intake puts the released text back, so nbgrader scores it as an answer left as released (0, "No
    response"), never "needs manual grading". A real answer is kept as written."""
    from nbgrader.utils import determine_grade

    from transformer_course.grading.intake.submissions import Found, Release, load

    notebook = read(student_path(EXAMPLE_ASSIGNMENT))
    cells = [cell for _, cell in answer_cells(notebook)]
    assert len(cells) == 3
    cells[0].source, cells[1].source, cells[2].source = "", "  \n\n ", "Because the variance grows with d_k."
    path = tmp_path / "ada" / "02.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(notebook), encoding="utf-8")
    release = Release(ROOT / "notebooks", [EXAMPLE_ASSIGNMENT])
    loaded = load(release, Found(path, path.relative_to(tmp_path)))
    graded = [cell for _, cell in answer_cells(loaded.notebook)]
    assert [determine_grade(cell)[0] for cell in graded] == [0, 0, None]  # blank, blank, waits for a person
    assert graded[2].source == "Because the variance grows with d_k." and loaded.status == "ok"


def test_answer_cell_header_needs_points():
    assert _nbgrader_metadata({"answer": "q", "points": 2}) == {
        "schema_version": 3, "task": False, "grade": True, "solution": True, "locked": False, "points": 2,
        "grade_id": "q"}
    with pytest.raises(ValueError, match="no points"):
        _nbgrader_metadata({"answer": "q"})


def test_a_stripped_notebook_keeps_its_written_answers_when_rebuilt():
    release, solution = read(student_path(EXAMPLE_ASSIGNMENT)), read(solution_path(EXAMPLE_ASSIGNMENT))
    for number, (_, cell) in enumerate(answer_cells(solution)):
        cell.source = f"my own answer {number}"
    for cell in solution.cells:
        cell.metadata = {}  # what an editor that drops metadata hands in
    rebuilt, lost = rebuild(release, solution)
    assert not lost
    assert [cell.source for _, cell in answer_cells(rebuilt)] == [f"my own answer {n}" for n in range(3)]


# --- refusals of a sheet name the row as the spreadsheet shows it, the student and the question (cheap) ---

STAGE_CELLS = [("attn_shape", False, 2.0), ("attn_q_scale", True, 3.0), ("attn_q_mask", True, 2.0)]


def small_gradebook(folder, students):
    """A gradebook of one stage (a check and two written answers) with a submission per student."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{folder / 'gradebook.db'}") as gradebook:
        gradebook.add_assignment(EXAMPLE_ASSIGNMENT)
        gradebook.add_notebook(EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT)
        for name, written, points in STAGE_CELLS:
            gradebook.add_grade_cell(name, EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, max_score=points,
                                     cell_type="markdown" if written else "code")
            if written:
                gradebook.add_solution_cell(name, EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT)
        for student in students:
            gradebook.add_student(student)
            gradebook.add_submission(EXAMPLE_ASSIGNMENT, student)
    return f"sqlite:///{folder / 'gradebook.db'}"


LONG_ANSWER = "Dividing by sqrt(d_k)\nkeeps the variance at 1,\nso the softmax\ndoes not saturate."


def test_every_refusal_names_the_spreadsheet_row_the_student_and_the_question(tmp_path):
    """Answers on four text lines each: the refusals cite rows 11, 23 and 38 as the spreadsheet shows them
    (the text lines would be 41, 89 and 149), each with the student and the question; nothing is imported."""
    db_url = small_gradebook(tmp_path, ["ada", "bo"])
    bad = {11: ["ada", "attn_q_scale", "9"], 23: ["nobody", "attn_q_mask", "1"], 30: ["bo", "attn_q_mask", "x"],
           38: ["ada", "attn_shape", "1"]}
    sheet = tmp_path / "grading.csv"
    with open(sheet, "w", newline="", encoding="utf-8-sig") as handle:
        writer = csv.writer(handle)
        writer.writerow(["assignment", "question", "student", "score", "answer"])
        for number in range(2, 40):
            student, question, score = bad.get(number, ["bo", "attn_q_scale", ""])
            writer.writerow([EXAMPLE_ASSIGNMENT, question, student, score, LONG_ANSWER])
    with pytest.raises(answers.SheetProblems) as refused:
        answers.import_scores(tmp_path, [sheet], db_url)
    message = str(refused.value)
    assert "grading.csv row 11 (student 'ada', question 'attn_q_scale'): score 9 is outside 0 to 3 points" in message
    assert "grading.csv row 23 (student 'nobody', question 'attn_q_mask'): no answer" in message
    assert "grading.csv row 30 (student 'bo', question 'attn_q_mask'): score 'x' is not a number" in message
    assert "grading.csv row 38 (student 'ada', question 'attn_shape'): 'attn_shape' is graded by the checks" in message
    assert not re.search(r"line \d", message)
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gradebook:
        assert gradebook.find_grade("attn_q_scale", EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, "bo").manual_score is None


def test_a_filled_xlsx_sheet_imports_into_the_gradebook(tmp_path):
    """A workbook as a person fills it (a number, a text score with a decimal comma, a comment beginning with
    "="): its scores and comment reach the gradebook; a bad cell in it is refused with its row."""
    from nbgrader.api import Gradebook

    from transformer_course.grading.outputs.workbook import write_workbook

    db_url = small_gradebook(tmp_path, ["ada", "bo"])
    sheet = write_workbook(tmp_path / "grading.xlsx", ["assignment", "question", "student", "score", "comment"], [
        [EXAMPLE_ASSIGNMENT, "attn_q_scale", "ada", 2.5, "=why the variance?"],
        [EXAMPLE_ASSIGNMENT, "attn_q_mask", "bo", "1,5", ""]])
    imported = answers.import_scores(tmp_path, [sheet], db_url)
    assert (imported.scores, imported.comments) == (2, 1)
    with Gradebook(db_url) as gradebook:
        find = gradebook.find_grade
        assert find("attn_q_scale", EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, "ada").manual_score == 2.5
        assert find("attn_q_mask", EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, "bo").manual_score == 1.5
        assert gradebook.find_comment("attn_q_scale", EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT,
                                      "ada").manual_comment == "=why the variance?"
    bad = write_workbook(tmp_path / "bad.xlsx", ["assignment", "question", "student", "score"], [
        [EXAMPLE_ASSIGNMENT, "attn_q_scale", "ada", 1], [EXAMPLE_ASSIGNMENT, "attn_q_mask", "bo", 7]])
    with pytest.raises(answers.SheetProblems, match=r"bad.xlsx row 3 \(student 'bo', question 'attn_q_mask'\): "
                                                    r"score 7 is outside 0 to 2 points"):
        answers.import_scores(tmp_path, [bad], db_url)


# --- grading them, on the example class graded once per session (slow) ------------------------------

@pytest.fixture(scope="module")
def class_copy(graded_example_class, tmp_path_factory):
    """A copy of the graded example class, so importing scores leaves the shared one as it was."""
    grader = graded_example_class[0]
    copy = tmp_path_factory.mktemp("answers") / "class"
    shutil.copytree(grader.class_dir, copy, ignore=shutil.ignore_patterns("submitted"))
    return copy


def rows_of(class_dir):
    with open(class_dir / "scores.csv", encoding="utf-8-sig") as handle:
        return {row["student"]: row for row in csv.DictReader(handle)}


QUESTIONS = ("attn_q_scale", "attn_q_mask", "attn_q_heads")


@pytest.mark.slow
def test_unread_answers_say_so_and_blank_ones_score_zero_with_a_reason(graded_example_class):
    rows = graded_example_class[2]
    ada, blake = rows["ada"], rows["blake"]
    assert all(ada[q] == answers.NEEDS_MANUAL_GRADING for q in QUESTIONS)  # the model answers, handed in
    assert ada["manual_status"].startswith("needs manual grading: 3 of 3 written answers (7 points")
    assert float(ada["total"]) == float(ada["autograded"]) and float(ada["max"]) == float(ada["autograded_max"]) + 7
    assert all(float(blake[q]) == 0 for q in QUESTIONS) and "3 written answer(s) left blank" in blake["manual_status"]
    assert rows["dana_12345"][QUESTIONS[0]] == answers.NEEDS_MANUAL_GRADING  # stripped metadata: answers kept
    assert rows["finn"]["status"] == "rejected" and not rows["finn"].get("manual_status")


@pytest.mark.slow
def test_export_import_scores_comments_feedback_and_totals(class_copy):
    folder = answers.export(class_copy, ROOT)
    page = (folder / EXAMPLE_ASSIGNMENT / "attn_q_scale.html").read_text(encoding="utf-8")
    assert "Rubric" in page and "saturate" in page and "<script" not in page and "needs manual grading" in page
    assert (folder / "index.html").exists()
    assert (folder / "grading.csv").read_bytes().startswith(b"\xef\xbb\xbf")  # Excel reads it as UTF-8
    with open(folder / "grading.csv", encoding="utf-8-sig") as handle:
        sheet = list(csv.DictReader(handle))
    assert {row["question"] for row in sheet} == set(QUESTIONS)
    ada_rows = [row for row in sheet if row["student"] == "ada"]
    assert len(ada_rows) == 3 and all("Model answer" in row["answer"] and row["score"] == "" for row in ada_rows)
    given = {"attn_q_scale": "2.5", "attn_q_mask": "2", "attn_q_heads": "0"}
    for row in sheet:
        if row["student"] in ("ada", "chen"):
            row["score"] = given[row["question"]]
            row["comment"] = f"Comment for {row['student']} on {row['question']}: mention the gradient."
    filled = class_copy / "filled.csv"
    with open(filled, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(sheet[0]))
        writer.writeheader()
        writer.writerows(sheet)

    bad = class_copy / "bad.csv"
    bad.write_text("assignment,question,student,score,comment\n"
                   f"{EXAMPLE_ASSIGNMENT},attn_q_scale,ada,9,too many\n"
                   f"{EXAMPLE_ASSIGNMENT},attn_q_scale,nobody,1,\n"
                   f"{EXAMPLE_ASSIGNMENT},attn_sdpa_values,ada,1,\n", encoding="utf-8")
    before = (class_copy / "scores.csv").read_bytes()
    assert answers.main(["import", str(class_copy), str(bad)]) == 1  # all or nothing
    assert (class_copy / "scores.csv").read_bytes() == before

    earlier = rows_of(class_copy)
    assert answers.main(["import", str(class_copy), str(filled)]) == 0
    rows = rows_of(class_copy)
    for name in ("ada", "chen"):
        row = rows[name]
        assert [float(row[q]) for q in QUESTIONS] == [2.5, 2.0, 0.0]
        assert float(row["manual"]) == 4.5 and row["manual_status"] == "graded by hand"
        assert float(row["total"]) == float(row["autograded"]) + 4.5
        kept = ("status", "reasons", "file", "name")
        assert [row[key] for key in kept] == [earlier[name][key] for key in kept]
        feedback = (class_copy / "feedback" / name / EXAMPLE_ASSIGNMENT / f"{EXAMPLE_ASSIGNMENT}.html").read_text()
        text = htmllib.unescape(re.sub(r"<[^>]+>", "", feedback))
        assert f"Comment for {name} on attn_q_scale: mention the gradient." in text
    assert rows["dana_12345"]["manual_status"].startswith(answers.NEEDS_MANUAL_GRADING)  # not in the sheet: waits
    report = (class_copy / "report.html").read_text(encoding="utf-8")
    assert 'data-key="mean_manual"' in report
    assert (class_copy / "scores.csv").read_bytes().startswith(b"\xef\xbb\xbf")  # rewritten for Excel


@pytest.mark.slow
def test_the_xlsx_sheet_round_trips_through_a_person_and_import(class_copy):
    """grading.xlsx, filled in as a person does in Excel (numbers typed as numbers, a comment that starts
    like a formula), imported back: eve's scores and comment reach the gradebook and scores.csv."""
    import openpyxl

    folder = answers.export(class_copy, ROOT)
    book = openpyxl.load_workbook(folder / "grading.xlsx")
    sheet = book.active
    header = [cell.value for cell in sheet[1]]
    assert header == list(answers.SHEET_COLUMNS)
    column = {name: header.index(name) + 1 for name in header}
    given = {"attn_q_scale": 3, "attn_q_mask": 1.5, "attn_q_heads": 0}
    eve = 0
    for number in range(2, sheet.max_row + 1):
        if sheet.cell(number, column["student"]).value == "eve":
            question = sheet.cell(number, column["question"]).value
            assert sheet.cell(number, column["points"]).data_type == "n"
            sheet.cell(number, column["score"]).value = given[question]
            comment = sheet.cell(number, column["comment"])
            comment.value, comment.data_type = f"=not a formula, {question}", "s"  # typed as text ('=...)
            eve += 1
    assert eve == 3
    book.save(class_copy / "filled.xlsx")
    assert answers.main(["import", str(class_copy), str(class_copy / "filled.xlsx")]) == 0
    row = rows_of(class_copy)["eve"]
    assert [float(row[q]) for q in QUESTIONS] == [3.0, 1.5, 0.0] and row["manual_status"] == "graded by hand"
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{class_copy / 'gradebook.db'}") as gradebook:
        comment = gradebook.find_comment("attn_q_mask", EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, "eve").manual_comment
    assert comment == "=not a formula, attn_q_mask"


def formgrader(class_dir):
    """A Jupyter server started in the class folder, as README says, with nbgrader's formgrader; yields a
    function that calls its REST API (the one the formgrader's pages use)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = "formgrader-test"
    environment = {**os.environ, "JUPYTER_CONFIG_DIR": str(class_dir / ".jupyter"),
                   "JUPYTER_RUNTIME_DIR": str(class_dir / ".jupyter" / "runtime")}
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "server", "--no-browser", "--ip=127.0.0.1",
                               f"--port={port}", f"--IdentityProvider.token={token}", "--allow-root"],
                              cwd=class_dir, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def call(path, method="GET", body=None):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read().decode()

    call.url = lambda path: f"http://127.0.0.1:{port}{path}{'&' if '?' in path else '?'}token={token}"  # a browser's

    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                call("/api/status")
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the Jupyter server did not start"
                time.sleep(0.5)
        yield call
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.mark.slow
def test_grading_in_the_formgrader_reaches_scores_and_feedback(class_copy):
    """The configuration the batch wrote, read by a real formgrader started in the class folder: it lists
    the submissions, shows a student's answer on its grading page, saves a score and a comment; then
    `answers refresh` puts them into scores.csv and the feedback."""
    assert (class_copy / "nbgrader_config.py").exists()  # written by the batch command
    answers.write_formgrader_config(class_copy, ROOT)  # the copy's own folders and gradebook
    with contextlib.contextmanager(formgrader)(class_copy) as call:
        listed = json.loads(call(f"/formgrader/api/submitted_notebooks/{EXAMPLE_ASSIGNMENT}/{EXAMPLE_ASSIGNMENT}"))
        dana = next(entry for entry in listed if entry["student"] == "dana_12345")
        assert dana["needs_manual_grade"]
        page = call(f"/formgrader/submissions/{dana['id']}/?index=0")
        assert "Dividing by" in htmllib.unescape(page)  # her answer (the model answer she handed in) is shown
        grades = {g["name"]: g for g in json.loads(call(f"/formgrader/api/grades?submission_id={dana['id']}"))}
        comments = {c["name"]: c for c in json.loads(call(f"/formgrader/api/comments?submission_id={dana['id']}"))}
        call(f"/formgrader/api/grade/{grades['attn_q_scale']['id']}", "PUT", {"manual_score": 1.5})
        call(f"/formgrader/api/comment/{comments['attn_q_scale']['id']}", "PUT",
             {"manual_comment": "Formgrader comment: say what the softmax does."})
    assert answers.main(["refresh", str(class_copy)]) == 0
    row = rows_of(class_copy)["dana_12345"]
    assert float(row["attn_q_scale"]) == 1.5 and row["attn_q_mask"] == answers.NEEDS_MANUAL_GRADING
    assert row["manual_status"].startswith("needs manual grading: 2 of 3")
    feedback = (class_copy / "feedback" / "dana_12345" / EXAMPLE_ASSIGNMENT / f"{EXAMPLE_ASSIGNMENT}.html")
    assert "Formgrader comment: say what the softmax does." in htmllib.unescape(feedback.read_text())


# --- sheets from any spreadsheet, and hand grades that survive a regrade (slow) ---------------------------

def sheet_rows(folder):
    with open(folder / "grading.csv", encoding="utf-8-sig") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_a_german_excel_sheet_imports_whole_and_its_protection_is_undone(class_copy):
    """Semicolons, Windows-1252, decimal commas and the `'` the export put before a comment that starts like
    a formula: the scores and the comment reach the gradebook and the feedback as the instructor wrote them."""
    folder = answers.export(class_copy, ROOT)
    exported = [row for row in sheet_rows(folder) if row["student"] == "gus"]
    assert {row["state"] for row in exported} == {"to grade"} and all(row["answer_version"] for row in exported)
    lines = [";".join(["assignment", "question", "student", "score", "comment", "answer_version"])]
    for row in exported:
        lines.append(";".join([row["assignment"], row["question"], row["student"], "1,5",
                               "'- fehlt: die Skalierung (Größe)", row["answer_version"]]))
    sheet = class_copy / "excel-de.csv"
    sheet.write_bytes(("\r\n".join(lines) + "\r\n").encode("cp1252"))
    assert answers.main(["import", str(class_copy), str(sheet)]) == 0
    row = rows_of(class_copy)["gus"]
    assert [float(row[q]) for q in QUESTIONS] == [1.5, 1.5, 1.5] and row["manual_status"] == "graded by hand"
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{class_copy / 'gradebook.db'}") as gradebook:
        comment = gradebook.find_comment(QUESTIONS[0], EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, "gus").manual_comment
    assert comment == "- fehlt: die Skalierung (Größe)"
    feedback = (class_copy / "feedback" / "gus" / EXAMPLE_ASSIGNMENT / f"{EXAMPLE_ASSIGNMENT}.html").read_text()
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", feedback))
    assert "fehlt: die Skalierung (Größe)" in text and "'" not in text.split("fehlt: die Skalierung")[0][-5:]

    broken = class_copy / "broken.csv"
    broken.write_bytes(lines[0].encode() + b"\r\n" + lines[1].encode() + b";extra;cells\r\n")
    before = (class_copy / "scores.csv").read_bytes()
    assert answers.main(["import", str(class_copy), str(broken)]) == 1
    assert (class_copy / "scores.csv").read_bytes() == before


@pytest.mark.slow
def test_regrading_a_changed_notebook_keeps_the_hand_grades_of_unchanged_answers(graded_example_class, tmp_path):
    """chen's three answers are graded by hand; chen hands in again with one answer rewritten; the real batch
    command regrades the notebook: the two unchanged answers keep their grades off the review list, the
    changed one waits for a person, and no old sheet can put it back as graded."""
    from nbgrader.api import Gradebook

    from transformer_course.grading.classroom.batch import BatchGrader
    from transformer_course.grading.sandbox.isolation import bubblewrap_problem

    grader, _, _, originals = graded_example_class
    class_dir = tmp_path / "class"
    shutil.copytree(grader.class_dir, class_dir)
    folder = answers.export(class_dir, ROOT)
    old_sheet = [row for row in sheet_rows(folder) if row["student"] == "chen"]
    for row in old_sheet:
        row["score"] = "2"
    graded_sheet = tmp_path / "old.csv"
    with open(graded_sheet, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(old_sheet[0]))
        writer.writeheader()
        writer.writerows(old_sheet)
    assert answers.main(["import", str(class_dir), str(graded_sheet)]) == 0

    chen = read(next(path for path in originals if path.parent.name == "chen"))
    changed = next(cell for cell in chen.cells if cell.metadata.get("nbgrader", {}).get("grade_id") == "attn_q_mask")
    changed.source = "The mask hides the future tokens, so the decoder cannot copy the next word."
    downloads = tmp_path / "downloads" / "chen"
    downloads.mkdir(parents=True)
    nbformat_write(chen, downloads / f"{EXAMPLE_ASSIGNMENT}.ipynb")
    BatchGrader(ROOT, class_dir, downloads.parent, jobs=1, timeout=30, assignment_ids=[EXAMPLE_ASSIGNMENT],
                sandbox=bubblewrap_problem() is None).run()
    with Gradebook(f"sqlite:///{class_dir / 'gradebook.db'}") as gradebook:
        grades = {q: gradebook.find_grade(q, EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, "chen") for q in QUESTIONS}
        assert {q: (g.manual_score, g.needs_manual_grade) for q, g in grades.items()} == {
            "attn_q_scale": (2, False), "attn_q_mask": (2, True), "attn_q_heads": (2, False)}
    row = rows_of(class_dir)["chen"]
    assert "review: 1 answer(s)" in row["manual_status"] and "attn_q_mask" in row["manual_status"]

    # the sheet graded before the new hand-in: its answer_version is the old text's, so it is left out
    assert answers.main(["import", str(class_dir), str(graded_sheet)]) == 0
    # a hand-made sheet repeating the old score says nothing about which text was read: the mark stays
    repeated = tmp_path / "repeated.csv"
    repeated.write_text(f"assignment,question,student,score\n{EXAMPLE_ASSIGNMENT},attn_q_mask,chen,2\n")
    assert answers.main(["import", str(class_dir), str(repeated)]) == 0
    with Gradebook(f"sqlite:///{class_dir / 'gradebook.db'}") as gradebook:
        assert gradebook.find_grade("attn_q_mask", EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, "chen").needs_manual_grade
    # a sheet exported now shows the new text with no score; giving one there takes it off the list
    fresh = [row for row in sheet_rows(answers.export(class_dir, ROOT))
             if row["student"] == "chen" and row["question"] == "attn_q_mask"]
    assert fresh[0]["state"].startswith("changed since graded: was 2 points") and fresh[0]["score"] == ""
    assert "decoder cannot copy the next word" in fresh[0]["answer"]
    fresh[0]["score"] = "1.5"
    regraded = tmp_path / "new.csv"
    with open(regraded, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fresh[0]))
        writer.writeheader()
        writer.writerows(fresh)
    assert answers.main(["import", str(class_dir), str(regraded)]) == 0
    row = rows_of(class_dir)["chen"]
    assert float(row["attn_q_mask"]) == 1.5 and row["manual_status"] == "graded by hand"


def nbformat_write(notebook, path):
    import nbformat

    nbformat.write(notebook, path)
