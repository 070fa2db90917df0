"""No student HTML runs anywhere an instructor looks (issue 19): a written answer, an instructor's comment,
a rich output and a student's name carrying `<img onerror>`, `<script>`, `<svg onload>` and a
`javascript:` link, opened in the real headless Chromium (tests/browser.py) on every page the course
writes or serves: the feedback page, the formgrader's grading page, the answer pages and the class report.
Each would mark the page if it ran; none may. A control page with the same text and no defences shows that
the browser runs such script, so the test can fail. Honest markdown and math in the same answer still read
well.

The hostile text is put where a hostile student's would land (the autograded notebook nbgrader keeps, the
gradebook's comment, scores.csv's name column) in a copy of the example class graded once per session
(conftest), so nothing is graded again here: a few seconds, plus a Jupyter server for the formgrader."""

import contextlib
import csv
import json
import re
import shutil

import nbformat
import pytest
from test_written_answers import formgrader

from browser import Browser
from conftest import EXAMPLE_ASSIGNMENT, ROOT
from transformer_course.grading.outputs import answers
from transformer_course.grading.outputs.report import write_report

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example_class")]  # one worker: shared fixtures
MARK = "document.documentElement.setAttribute('data-ran', '{}')"
PAYLOAD = (f"<img src=x onerror=\"{MARK.format('img')}\"> <script>{MARK.format('script')}</script> "
           f"<svg onload=\"{MARK.format('svg')}\"></svg> [click me](javascript:{MARK.format('link')})")
HONEST = "The **variance** of $q \\cdot k$ grows like $\\sqrt{d_k}$, so a < b:\n\n- first\n- second\n\n"
STUDENT, QUESTION, COMMENTED = "ada", "attn_q_scale", "attn_q_mask"
RAN = "document.documentElement.getAttribute('data-ran')"
JAVASCRIPT_LINKS = "[...document.links].filter(a => a.protocol === 'javascript:').length"


@pytest.fixture(scope="module")
def hostile_class(graded_example_class, tmp_path_factory):
    from nbgrader.api import Gradebook

    class_dir = tmp_path_factory.mktemp("inert") / "class"
    shutil.copytree(graded_example_class[0].class_dir, class_dir, ignore=shutil.ignore_patterns("submitted"))
    path = class_dir / "autograded" / STUDENT / EXAMPLE_ASSIGNMENT / f"{EXAMPLE_ASSIGNMENT}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    answer = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == QUESTION)
    answer.source = HONEST + PAYLOAD
    code = next(c for c in notebook.cells if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("grade"))
    code.outputs.append(nbformat.v4.new_output("display_data", data={
        "text/html": PAYLOAD, "application/javascript": MARK.format("output"), "text/plain": "a display"}))
    nbformat.write(notebook, path)
    with Gradebook(f"sqlite:///{class_dir / 'gradebook.db'}") as gradebook:
        comment = gradebook.find_comment(COMMENTED, EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, STUDENT)
        comment.manual_comment = "Instructor: " + PAYLOAD
        gradebook.db.commit()
    with open(class_dir / "scores.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        if row["student"] == STUDENT:
            row["name"] = PAYLOAD
            row["reasons"] = f"{row['reasons']}; likely cause: {PAYLOAD}"
    with open(class_dir / "scores.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert answers.regenerate_feedback(ROOT, class_dir, [(STUDENT, EXAMPLE_ASSIGNMENT)]) == []
    answers.export(class_dir, ROOT)
    write_report(class_dir)
    answers.write_formgrader_config(class_dir, ROOT)
    return class_dir


def test_the_browser_runs_the_payload_where_nothing_stops_it(tmp_path):
    """The control: the same text in a page with no policy and no escaping runs, so each check below can fail."""
    page = tmp_path / "control.html"
    link = f"<a href=\"javascript:{MARK.format('link')}\">click me</a>"  # what the markdown link would render as
    page.write_text(f"<!DOCTYPE html><html><body>{PAYLOAD} {link}</body></html>", encoding="utf-8")
    with Browser(tmp_path / "profile") as browser:
        browser.open(page.as_uri())
        assert browser.evaluate(RAN) in ("img", "script", "svg")
        assert browser.evaluate(JAVASCRIPT_LINKS) == 1


def test_the_feedback_page_runs_nothing_and_reads_well(hostile_class, tmp_path):
    page = hostile_class / "feedback" / STUDENT / EXAMPLE_ASSIGNMENT / f"{EXAMPLE_ASSIGNMENT}.html"
    source = page.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in source and not re.search(r"<script|\bsrc=[\"']?(https?:)?//", source, re.I)
    with Browser(tmp_path / "profile") as browser:
        browser.open(page.as_uri())
        assert browser.evaluate(RAN) is None
        assert browser.evaluate(JAVASCRIPT_LINKS) == 0
        text = browser.evaluate("document.body.innerText")
        assert "<img src=x onerror=" in text and "Instructor: <img src=x" in text  # shown as text
        assert "$\\sqrt{d_k}$" in text and "a < b" in text  # math and comparisons as written
        assert browser.evaluate("[...document.querySelectorAll('strong')].some(e => e.textContent === 'variance')")
        assert browser.evaluate("[...document.querySelectorAll('li')].some(e => e.textContent === 'second')")


def test_the_answer_pages_and_the_report_run_nothing(hostile_class, tmp_path):
    folder = hostile_class / "answers"
    pages = [folder / "index.html", folder / EXAMPLE_ASSIGNMENT / f"{QUESTION}.html",
             folder / EXAMPLE_ASSIGNMENT / f"{COMMENTED}.html", hostile_class / "report.html"]
    with Browser(tmp_path / "profile") as browser:
        for page in pages:
            browser.open(page.as_uri())
            assert browser.evaluate(RAN) is None, page
            assert browser.evaluate(JAVASCRIPT_LINKS) == 0, page
        assert "<img src=x onerror=" in browser.evaluate("document.body.innerText")  # the report shows the name
        assert browser.evaluate("document.documentElement.dataset.sortable") == "on"  # its own script did run


def test_the_formgraders_grading_page_runs_nothing(hostile_class, tmp_path):
    """nbgrader's formgrader renders the autograded notebook into the instructor's logged-in page (its own
    scripts run there, so it can have no policy): the answer, its outputs and the comments must be inert."""
    with contextlib.contextmanager(formgrader)(hostile_class) as call:
        listed = json.loads(call(f"/formgrader/api/submitted_notebooks/{EXAMPLE_ASSIGNMENT}/{EXAMPLE_ASSIGNMENT}"))
        submission = next(entry for entry in listed if entry["student"] == STUDENT)
        url = call.url(f"/formgrader/submissions/{submission['id']}/?index=0")
        with Browser(tmp_path / "profile") as browser:
            browser.open(url, settle=2)
            assert "formgrader" in browser.evaluate("document.body.innerHTML").lower()
            assert "<img src=x onerror=" in browser.evaluate("document.body.innerText")  # the answer, as text
            assert browser.evaluate(RAN) is None
            assert browser.evaluate(JAVASCRIPT_LINKS) == 0
