"""Written answers: the questions graded by hand, their scores in the gradebook, and the two ways an
instructor grades them after the batch command.

    python -m transformer_course.grading.answers export CLASS_DIR        one HTML page per question
    python -m transformer_course.grading.answers import CLASS_DIR SHEET.csv|SHEET.xlsx [...]
    python -m transformer_course.grading.answers formgrader CLASS_DIR    config for nbgrader's formgrader
    python -m transformer_course.grading.answers refresh CLASS_DIR       after grading in the formgrader

A question is two markdown cells in a lesson: the question, then an answer cell
(`# %% [markdown] answer="id" points=2`, see `transformer_course.authoring`) whose text in the
solution notebook is the model answer and the rubric, and which students get empty. nbgrader
records it as a manually graded cell: an answer left as released scores 0 ("No response"), any
other answer waits for a person. Nothing waits silently: `score_rows` shows such a cell as
"needs manual grading" in scores.csv, never as 0.

`export` writes CLASS_DIR/answers/: index.html, one page per question (every student's answer
beside the model answer and the rubric) and grading.csv (UTF-8 with a byte-order mark, so Excel reads it
as UTF-8) and grading.xlsx, the same sheet as an Excel workbook, one row per (student, question) with the
answer text, its `state` (to grade, graded, changed since graded, left blank), the `score` and
`comment` so far and `answer_version` (which text the row shows). Fill those in (any spreadsheet; it
may save the sheet as .xlsx, or as CSV with commas or semicolons, in UTF-8 or Windows-1252), then
`import` checks every row
first (a sheet it cannot read, unknown students or questions, scores that are not numbers between 0
and the question's points: nothing is written and each problem is listed with its row, student and question), writes the
scores and comments into the gradebook, regenerates those students' feedback (comments included) and
rewrites scores.csv and report.html. A blank score leaves that answer as it was; a row whose answer
changed since the sheet was exported is left out, with a note (see `import_scores`).
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from transformer_course.grading.gradebook.config import ROOT, default_db_url, nbgrader_config
from transformer_course.grading.outputs import deadlines, hand_grades, inert
from transformer_course.grading.outputs.files import replace_atomically, write_text_atomically
from transformer_course.grading.outputs.inert import markdown_html
from transformer_course.grading.outputs.mathml import render_math
from transformer_course.grading.outputs.report import write_report
from transformer_course.grading.outputs.scores import (  # noqa: F401  (re-exported: answers.NEEDS_MANUAL_GRADING, ...)
    GRADEBOOK_COLUMNS,
    NEEDS_MANUAL_GRADING,
    is_answer_cell,
    pending,
    read_csv,
    score_rows,
)
from transformer_course.grading.outputs.spreadsheet import (
    EXCEL_BOM,
    SheetError,
    decimal,
    protect,
    read_sheet,
    who,
    write_csv,
)
from transformer_course.grading.outputs.workbook import write_workbook

SHEET_COLUMNS = ("assignment", "question", "student", "name", "lms_id", "points", "state", "score", "comment",
                 "answer_version", "answer")
REQUIRED_COLUMNS = ("assignment", "question", "student", "score")
_RUBRIC_LINE = re.compile(r"^\s*-\s*(\d+(?:\.\d+)?)\s+points?\s*:\s*(.*)$")


# --- the questions ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Question:
    assignment: str
    grade_id: str
    number: int  # 1, 2, ... in the notebook's order
    points: float
    prompt: str  # the markdown cell above the answer cell
    model_answer: str
    rubric: tuple[tuple[float, str], ...]  # (points, criterion)


def parse_answer(source: str) -> tuple[str, tuple[tuple[float, str], ...]]:
    """The model answer and the rubric of a solution's answer cell.

    The rubric starts at a line containing "Rubric"; each criterion is a `- N point(s): ...` line,
    continued by indented lines."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if "Rubric" in line), len(lines))
    model = "\n".join(lines[:start]).strip()
    model = re.sub(r"^\*\*Model answer\.\*\*\s*", "", model)
    rubric: list[list] = []
    for line in lines[start + 1:]:
        match = _RUBRIC_LINE.match(line)
        if match:
            rubric.append([float(match[1]), match[2].strip()])
        elif rubric and line.strip():
            rubric[-1][1] += " " + line.strip()
    return model, tuple((points, text) for points, text in rubric)


def questions(notebook: nbformat.NotebookNode, assignment: str) -> list[Question]:
    """The written questions of one solution notebook, in order."""
    found = []
    for index, cell in enumerate(notebook.cells):
        if not is_answer_cell(cell):
            continue
        nbgrader = cell.metadata["nbgrader"]
        prompt = notebook.cells[index - 1].source if index and notebook.cells[index - 1].cell_type == "markdown" else ""
        model, rubric = parse_answer(cell.source)
        found.append(Question(assignment, nbgrader["grade_id"], len(found) + 1, float(nbgrader["points"]),
                              prompt, model, rubric))
    return found


def course_questions(course: Path, assignment_ids: Iterable[str]) -> dict[tuple[str, str], Question]:
    """{(assignment, grade_id): question} from the course's solution notebooks."""
    found = {}
    for assignment in assignment_ids:
        path = course / "solutions" / assignment / f"{assignment}.ipynb"
        if path.exists():
            for question in questions(nbformat.read(path, as_version=4), assignment):
                found[assignment, question.grade_id] = question
    return found


# --- export: one page per question -----------------------------------------------------------------

@dataclass
class Answer:
    student: str
    name: str
    lms_id: str
    text: str | None  # None: no graded notebook to read it from
    score: float | None  # the score so far (a hand score, or nbgrader's 0 for a blank answer)
    by_hand: bool
    comment: str
    blank: bool = False
    review: bool = False  # graded by hand, then the notebook was graded again and this answer changed


@dataclass
class Sheet:
    question: Question
    answers: list[Answer] = field(default_factory=list)


def collect(class_dir: Path, course: Path, db_url: str | None = None) -> list[Sheet]:
    """Every question of the graded assignments with every student's answer and its score so far."""
    from nbgrader.api import Gradebook
    db_url = db_url or default_db_url(class_dir)
    people = _people(class_dir)
    sheets: dict[tuple[str, str], Sheet] = {}
    with Gradebook(db_url) as gradebook:
        assignment_ids = [assignment.name for assignment in gradebook.assignments]
        known = course_questions(course, assignment_ids)
        for assignment in gradebook.assignments:
            for submission in sorted(assignment.submissions, key=lambda s: s.student_id):
                notebook_cells = hand_grades.answer_texts(class_dir, submission.student_id, assignment.name)
                for notebook in submission.notebooks:
                    comments = {comment.name: comment for comment in notebook.comments}
                    for grade in notebook.grades:
                        question = known.get((assignment.name, grade.name))
                        if question is None:
                            continue
                        sheet = sheets.setdefault((assignment.name, grade.name), Sheet(question))
                        comment = comments.get(grade.name)
                        name, lms_id = people.get((submission.student_id, assignment.name), ("", ""))
                        score = grade.manual_score if grade.manual_score is not None else grade.auto_score
                        sheet.answers.append(Answer(
                            submission.student_id, name, lms_id, notebook_cells.get(grade.name), score,
                            grade.manual_score is not None, (comment.manual_comment or "") if comment else "",
                            blank=grade.manual_score is None and grade.auto_score is not None,
                            review=grade.manual_score is not None and bool(grade.needs_manual_grade)))
    order = {key: index for index, key in enumerate(known)}
    return [sheets[key] for key in sorted(sheets, key=lambda key: order.get(key, len(order)))]


def _people(class_dir: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """{(student, assignment): (name, LMS id)} from scores.csv (the gradebook knows only the student id)."""
    return {(row["student"], row["assignment"]): (row.get("name", ""), row.get("lms_id", ""))
            for row in read_csv(class_dir / "scores.csv")}


def export(class_dir: Path, course: Path, db_url: str | None = None) -> Path:
    """Write CLASS_DIR/answers/ (index.html, a page per question, grading.csv and grading.xlsx); returns the
    folder."""
    sheets = collect(class_dir, course, db_url)
    folder = class_dir / "answers"
    folder.mkdir(parents=True, exist_ok=True)
    links = []
    for sheet in sheets:
        question = sheet.question
        page = folder / question.assignment / f"{question.grade_id}.html"
        page.parent.mkdir(exist_ok=True)
        write_text_atomically(page, _question_page(sheet))
        waiting = sum(answer.score is None for answer in sheet.answers)
        links.append(f'<li><a href="{question.assignment}/{question.grade_id}.html">{question.assignment}, '
                     f"question {question.number} ({question.grade_id}, {question.points:g} points)</a>: "
                     f"{len(sheet.answers)} answers, {waiting} to grade</li>")
    index = (f"<h1>Written answers</h1><p>Grade in <code>grading.xlsx</code> or <code>grading.csv</code> (columns "
             f"<code>score</code> and <code>comment</code>), then run <code>python -m "
             f"transformer_course.grading.answers import {html.escape(str(class_dir))} grading.xlsx</code> (or the "
             f"CSV).</p><ul>{''.join(links)}</ul>")
    write_text_atomically(folder / "index.html", _page("Written answers", index))

    records = [(sheet.question, answer) for sheet in sheets for answer in sheet.answers]
    write_csv(folder / "grading.csv", [SHEET_COLUMNS, *([protect(value) for value in _sheet_row(question, answer)]
                                                        for question, answer in records)])
    try:
        write_workbook(folder / "grading.xlsx", SHEET_COLUMNS, (_workbook_row(question, answer)
                                                                for question, answer in records),
                       widths=WORKBOOK_WIDTHS, wrap=("answer", "comment", "state"))
    except ImportError:  # an environment installed before openpyxl joined the grading extra
        (folder / "grading.xlsx").unlink(missing_ok=True)  # never an older sheet beside the new CSV
        print("note: grading.xlsx not written: it needs openpyxl (pip install -e \".[grading]\"); grading.csv "
              "is the same sheet", file=sys.stderr)
    return folder


WORKBOOK_WIDTHS = {"assignment": 16, "question": 16, "student": 16, "name": 18, "state": 22, "comment": 40,
                   "answer_version": 16, "answer": 80}


def _sheet_row(question: Question, answer: Answer) -> list[str]:
    """The grading sheet's cells of one answer (SHEET_COLUMNS), as text."""
    state, score = _state(answer)
    text = "(no answer)" if answer.blank else answer.text if answer.text is not None else "(not graded)"
    return [question.assignment, question.grade_id, answer.student, answer.name, answer.lms_id, f"{question.points:g}",
            state, score, answer.comment, hand_grades.version(answer.text) if answer.text is not None else "", text]


def _workbook_row(question: Question, answer: Answer) -> list[str | float | None]:
    """The same cells for the workbook: points and score as numbers (a person types a number, in the
    decimal format of their Excel), every other cell as text."""
    cells: list[str | float | None] = list(_sheet_row(question, answer))
    points, score = SHEET_COLUMNS.index("points"), SHEET_COLUMNS.index("score")
    cells[points] = question.points
    cells[score] = float(cells[score]) if cells[score] else None
    return cells


def _state(answer: Answer) -> tuple[str, str]:
    """(the sheet's `state` of an answer, the score the sheet shows for it)."""
    if answer.blank:
        return "left blank (0 points)", ""
    if answer.review:  # the score must be given again, so the sheet shows none
        return f"changed since graded: was {answer.score:g} points, give a score again", ""
    if answer.by_hand and answer.score is not None:
        return "graded", f"{answer.score:g}"
    return "to grade", ""


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0; color: #1a1a1a; }
main { display: grid; grid-template-columns: minmax(280px, 34%) 1fr; gap: 1.5rem; padding: 1rem 1.5rem; }
aside { position: sticky; top: 0; align-self: start; max-height: 100vh; overflow: auto; background: #f4f6fa;
        padding: 0.5rem 1rem; border-radius: 6px; }
h1 { font-size: 1.3rem; padding: 0 1.5rem; } h2 { font-size: 1.05rem; }
table { border-collapse: collapse; width: 100%; } td, th { border-top: 1px solid #ddd; padding: 0.5rem;
        vertical-align: top; text-align: left; }
.answer { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.9rem; }
.rendered p:first-child { margin-top: 0; } details summary { color: #777; font-size: 0.85rem; cursor: pointer; }
.muted { color: #777; } .rubric li { margin-bottom: 0.4rem; }
"""


ANSWER_PAGE_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def _page(title: str, body: str) -> str:
    # No scripts and nothing fetched: the page shows students' text, made inert, and works offline; math is
    # MathML, which the browser draws itself (`mathml.render_math`, as on the feedback pages).
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{ANSWER_PAGE_POLICY}\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>{render_math(body)}</body></html>")


def _markdown(text: str) -> str:
    """Our own markdown (question, model answer) as HTML: raw HTML in it shown as text, the result sanitised
    like every student's text (`inert.markdown_html`)."""
    return markdown_html(text)


def _question_page(sheet: Sheet) -> str:
    question = sheet.question
    rubric = "".join(f"<li><b>{points:g}</b>: {_markdown(text).strip().removeprefix('<p>').removesuffix('</p>')}</li>"
                     for points, text in question.rubric)
    rows = []
    for number, answer in enumerate(sheet.answers, 1):
        if answer.text is None:
            text = "<span class='muted'>(no autograded notebook to read the answer from)</span>"
        elif answer.blank:
            text = "<span class='muted'>(no answer: the cell was left as released, or emptied)</span>"
        else:  # as the feedback page shows it (markdown, HTML as text, math typeset), and as typed
            text = (f"<div class='rendered'>{_markdown(answer.text)}</div><details><summary>as typed</summary>"
                    f"<div class='answer'>{html.escape(answer.text)}</div></details>")
        if answer.score is None:
            score = f"<b>{NEEDS_MANUAL_GRADING}</b>"
        elif answer.review:
            score = (f"<b>changed since graded</b>: was {answer.score:g} / {question.points:g}; give a score "
                     "again")
        else:
            score = f"{answer.score:g} / {question.points:g}" + (" (by hand)" if answer.by_hand else "")
        comment = f"<div class='muted'>{html.escape(answer.comment)}</div>" if answer.comment else ""
        who = html.escape(answer.student) + (f"<br><span class='muted'>{html.escape(answer.name)}</span>"
                                             if answer.name else "")
        rows.append(f"<tr id='{html.escape(answer.student)}'><td>{number}</td><td>{who}</td><td>{text}</td>"
                    f"<td>{score}{comment}</td></tr>")
    body = (f"<h1>{html.escape(question.assignment)}: question {question.number} "
            f"<span class='muted'>({html.escape(question.grade_id)}, {question.points:g} points)</span></h1>"
            f"<main><aside><h2>Question</h2>{_markdown(question.prompt)}<h2>Model answer</h2>"
            f"{_markdown(question.model_answer)}<h2>Rubric</h2><ul class='rubric'>{rubric}</ul></aside>"
            f"<section><table><tr><th>#</th><th>student</th><th>answer</th><th>score</th></tr>{''.join(rows)}"
            f"</table></section></main>")
    return _page(f"{question.assignment} {question.grade_id}", body)


# --- import: scores and comments back into the gradebook --------------------------------------------

class SheetProblems(ValueError):
    """The grading sheet has rows that cannot be imported; the message lists them."""


@dataclass
class Imported:
    scores: int = 0
    comments: int = 0
    students: set[tuple[str, str]] = field(default_factory=set)  # (student, assignment) whose grades changed
    notes: list[str] = field(default_factory=list)  # rows left out on purpose, and why


def import_scores(class_dir: Path, sheets: list[Path], db_url: str | None = None) -> Imported:
    """Write the sheets' scores and comments into the gradebook, all or nothing.

    A sheet that cannot be read whole, or any row that names an unknown answer or a score out of range,
    stops the import before anything is written (`SheetProblems`, with the file, row, student and
    question of each). A row whose answer changed since the sheet was exported (its `answer_version`
    is not the answer's now) is left out with a note: its score was given to another text. A score never
    clears nbgrader's review mark of an answer that changed after its hand score, unless the sheet shows
    that the grader saw the new text (an `answer_version` equal to it)."""
    from nbgrader.api import Gradebook, MissingEntry
    db_url = db_url or default_db_url(class_dir)
    rows = []
    problems: list[str] = []
    for path in sheets:
        try:
            rows += [(path, number, row) for number, row in read_sheet(path, REQUIRED_COLUMNS)]
        except SheetError as error:
            problems.append(str(error))
    if problems:
        raise SheetProblems("nothing was imported; fix these first:\n  " + "\n  ".join(problems))
    result = Imported()
    texts: dict[tuple[str, str], dict[str, str]] = {}
    with Gradebook(db_url) as gradebook:
        updates = []
        for path, number, row in rows:
            where = f"{path.name} row {number}{who(row)}"
            assignment, question, student = (row.get(key, "").strip() for key in ("assignment", "question", "student"))
            score_text, comment = row.get("score", "").strip(), row.get("comment", "").strip()
            if not (score_text or comment):
                continue
            try:
                grade = gradebook.find_grade(question, assignment, assignment, student)
            except MissingEntry:
                problems.append(f"{where}: no answer '{question}' of '{assignment}' by student '{student}' "
                                "in the gradebook (unknown student, question or assignment)")
                continue
            if grade.name not in {cell.name for cell in grade.notebook.notebook.solution_cells}:
                problems.append(f"{where}: '{question}' is graded by the checks, not by hand")
                continue
            note = gradebook.find_comment(question, assignment, assignment, student)
            score = None
            if score_text:
                try:
                    score = decimal(score_text)
                except ValueError:
                    problems.append(f"{where}: score '{score_text}' is not a number")
                    continue
                if not 0 <= score <= grade.max_score:
                    problems.append(f"{where}: score {score:g} is outside 0 to {grade.max_score:g} points")
                    continue
            seen = row.get("answer_version", "").strip()
            current = texts.setdefault((student, assignment), hand_grades.answer_texts(class_dir, student, assignment))
            now = hand_grades.version(current[question]) if question in current else ""
            if seen and now and seen != now:
                result.notes.append(f"{where}: {student}'s answer to {question} changed since this sheet was "
                                    "exported (a new hand-in was graded): not imported; export the sheet again and "
                                    "grade the answer as it is now")
                continue
            confirmed = bool(seen)  # the grader had this very text before them
            if score is not None and grade.needs_manual_grade and grade.manual_score == score and not confirmed:
                result.notes.append(f"{where}: {student}'s answer to {question} changed after its score was given; "
                                    f"the sheet repeats the old score ({score:g}), so it stays marked for review "
                                    "(grade it in a sheet exported now, or in the formgrader)")
                score = None
            updates.append((grade, note, score, comment, (student, assignment)))
        if problems:
            raise SheetProblems("nothing was imported; fix these rows first:\n  " + "\n  ".join(problems))
        for grade, note, score, comment, pair in updates:
            changed = False
            if score is not None and (grade.manual_score != score or grade.needs_manual_grade):
                grade.manual_score = score
                grade.needs_manual_grade = False  # as nbgrader's formgrader does when a grader saves a score
                result.scores += 1
                changed = True
            if comment and comment != (note.manual_comment or ""):
                note.manual_comment = comment
                result.comments += 1
                changed = True
            if changed:
                result.students.add(pair)
        gradebook.db.commit()
    hand_grades.remember(class_dir, db_url, result.students)
    return result


def graded_by_hand(db_url: str) -> set[tuple[str, str]]:
    """(student, assignment) of every submission with a written answer or comment given by a person."""
    from nbgrader.api import Gradebook
    found = set()
    with Gradebook(db_url) as gradebook:
        for assignment in gradebook.assignments:
            for submission in assignment.submissions:
                for notebook in submission.notebooks:
                    if any(grade.manual_score is not None for grade in notebook.grades) or any(
                            comment.manual_comment for comment in notebook.comments):
                        found.add((submission.student_id, assignment.name))
    return found


def regenerate_feedback(course: Path, class_dir: Path, who: Iterable[tuple[str, str]], db_url: str | None = None,
                        ) -> list[str]:
    """nbgrader generate_feedback for these (student, assignment) pairs; returns the failures.

    Feedback runs no student code (it renders the autograded notebook with its grades and comments,
    hidden tests removed), so it runs here, without the sandbox."""
    from nbgrader.apps import NbGraderAPI

    config = inert.configure(nbgrader_config(course, class_dir, db_url or default_db_url(class_dir)))
    api = NbGraderAPI(config=config)
    failures = []
    for student, assignment in sorted(who):
        outcome = api.generate_feedback(assignment, student, force=True)
        if not outcome["success"]:
            failures.append(f"{student} {assignment}: {(outcome.get('error') or outcome.get('log') or '?')[-300:]}")
    return failures


def refresh_scores_csv(class_dir: Path, db_url: str | None = None) -> Path:
    """scores.csv with the gradebook's current points (after hand grading); every other column as it was."""
    path = class_dir / "scores.csv"
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        rows = list(reader)
    fresh = {(row["student"], row["assignment"]): row for row in score_rows(db_url or default_db_url(class_dir))}
    columns = list(header)
    for row in fresh.values():
        for key in row:
            if key not in columns:
                columns.insert(columns.index("total") if "total" in columns else len(columns), key)
    position = {name: index for index, name in enumerate(header)}

    def write(handle) -> None:  # noqa: ANN001
        handle.write(EXCEL_BOM)  # Excel reads it as UTF-8 (names with umlauts stay whole)
        writer = csv.writer(handle)
        writer.writerow(columns)
        for values in rows:
            old = {name: values[position[name]] if position[name] < len(values) else "" for name in header}
            new = fresh.get((old.get("student", ""), old.get("assignment", "")), {})
            merged = {name: new[name] if name in new else old.get(name, "") for name in columns}
            deadlines.refresh(merged)  # a late penalty applies to the new total
            writer.writerow([merged[name] for name in columns])

    replace_atomically(path, write, newline="")
    return path


# --- formgrader ------------------------------------------------------------------------------------

# The formgrader's pages are nbgrader's: they run nbgrader's own inline scripts (the submission's ids in a
# <script>, onclick handlers) and JupyterLab's, so the policy must allow inline script; what it forbids is
# everything from elsewhere (scripts, styles, images, fonts, connections: nothing leaves for another host,
# not even MathJax from its CDN, so math reads as written), plugins, framing by other sites, other <base>
# addresses and form targets. Student text is made inert before nbgrader renders it (`inert.configure`).
FORMGRADER_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                     "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
                     "worker-src 'self' blob:; frame-src 'self'; object-src 'none'; base-uri 'self'; "
                     "form-action 'self'; frame-ancestors 'self'")
SERVER_CONFIG = "jupyter_server_config.py"


def formgrader_command(class_dir: Path) -> str:
    """The command that starts the formgrader with the class's configuration and policy (as the instructor's
    guide, website/instructor/written-answers.md, gives it)."""
    return f"cd {class_dir} && jupyter lab --config={SERVER_CONFIG}"


def write_formgrader_config(class_dir: Path, course: Path, db_url: str | None = None) -> Path:
    """CLASS_DIR/nbgrader_config.py: the course's nbgrader configuration pointed at this class, with every
    page nbconvert renders made inert, so that JupyterLab started there opens nbgrader's formgrader on its
    gradebook; and CLASS_DIR/jupyter_server_config.py, the Jupyter server's Content-Security-Policy, which
    applies when the server is started with `--config=jupyter_server_config.py` (`formgrader_command`)."""
    path = class_dir / "nbgrader_config.py"
    path.write_text(f'''"""nbgrader configuration for grading this class by hand in the formgrader.

Written by the course's batch command (python -m transformer_course.grading.answers formgrader
re-writes it). Start JupyterLab here, with the server configuration beside this file (its
Content-Security-Policy): `{formgrader_command(class_dir)}`, then open
Nbgrader > Formgrader > Manage Assignments > (assignment) > the number of submissions >
a student's notebook, and grade the written answers. Grade code with the batch command, not with
the formgrader's autograde button.
"""

load_subconfig({json.dumps(str(course / "autograde" / "nbgrader_config.py"))})  # noqa: F821

from transformer_course.grading.outputs.inert import configure  # noqa: E402

c = get_config()  # noqa: F821
# Student text in the grading pages: rendered, then sanitised (nh3), whatever the configuration above says.
configure(c)
c.CourseDirectory.root = {json.dumps(str(class_dir))}
c.CourseDirectory.source_directory = {json.dumps(str(course / "solutions"))}
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
c.CourseDirectory.db_url = {json.dumps(db_url or default_db_url(class_dir))}
''', encoding="utf-8")
    server_config = f'''"""The Jupyter server of this class's formgrader: a Content-Security-Policy on every page.

Written by the course's batch command. It applies only when the server is started with it:
    {formgrader_command(class_dir)}
"""

c = get_config()  # noqa: F821
c.ServerApp.tornado_settings = {{"headers": {{"Content-Security-Policy": {json.dumps(FORMGRADER_POLICY)}}}}}
'''
    (class_dir / SERVER_CONFIG).write_text(server_config, encoding="utf-8")
    return path


# --- helpers and the command -----------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["export", "import", "formgrader", "refresh"])
    parser.add_argument("class_dir", type=Path, help="the --class-dir of the batch command")
    parser.add_argument("sheets", type=Path, nargs="*", help="import: the filled-in grading sheet(s), .xlsx or CSV")
    parser.add_argument("--db-url", help="the gradebook, when the batch used --db-url")
    parser.add_argument("--course", type=Path, default=ROOT, help="the course repository (its solutions/)")
    arguments = parser.parse_args(argv)
    class_dir, course = arguments.class_dir.resolve(), arguments.course.resolve()
    if not (class_dir / "scores.csv").exists():
        parser.error(f"{class_dir} has no scores.csv: grade the class with the batch command first")
    if arguments.command == "export":
        folder = export(class_dir, course, arguments.db_url)
        print(f"one page per question: {folder / 'index.html'}\ngrading sheet: {folder / 'grading.csv'}")
        return 0
    if arguments.command == "formgrader":
        path = write_formgrader_config(class_dir, course, arguments.db_url)
        print(f"wrote {path} and {path.parent / SERVER_CONFIG}\nnow: {formgrader_command(class_dir)}   "
              "(then Nbgrader > Formgrader)")
        return 0
    if arguments.command == "refresh":
        imported = Imported(students=graded_by_hand(arguments.db_url or default_db_url(class_dir)))
        hand_grades.remember(class_dir, arguments.db_url or default_db_url(class_dir), imported.students)
    elif not arguments.sheets:
        parser.error("import needs the grading CSV file(s)")
    else:
        try:
            imported = import_scores(class_dir, arguments.sheets, arguments.db_url)
        except SheetProblems as problems:
            print(f"error: {problems}", file=sys.stderr)
            return 1
    failures = regenerate_feedback(course, class_dir, imported.students, arguments.db_url)
    refresh_scores_csv(class_dir, arguments.db_url)
    write_report(class_dir)
    done = "" if arguments.command == "refresh" else (
        f"imported {imported.scores} scores and {imported.comments} comments; ")
    print(f"{done}feedback regenerated for {len(imported.students)} submission(s) graded by hand; "
          "scores.csv and report.html rewritten")
    for note in imported.notes:
        print(f"note: {note}")
    for failure in failures:
        print(f"warning: feedback not regenerated for {failure}", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
