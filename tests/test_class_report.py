"""The class report of the built-in example class (graded once per session, see conftest), opened in a
real headless Chromium (tests/browser.py): what an instructor acts on comes first (the students who need a
person, linked to their feedback, then the distributions and the causes), its plots are drawn (the
screenshot has pixels of every plot's colour) and each fits on a screen, its tables sort in the page
without a network, the page fetches nothing and runs nothing but its own sorting script, and its numbers
are those of scores.csv."""

import csv
import re
import statistics
import urllib.parse
from html.parser import HTMLParser

import numpy as np
import pytest

from browser import Browser
from conftest import EXAMPLE_ASSIGNMENT
from transformer_course.grading.outputs.report import (
    COLOURS,
    GRADED,
    CauseGroup,
    cause_kind,
    causes_plot,
    grade_cells,
    named_causes,
    needs,
    policy,
    write_report,
)
from transformer_course.grading.outputs.scores import read_csv

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example_class")]  # one worker: shared fixtures
SCREEN = 900  # the first screen: a 1280 x 900 window


class Cells(HTMLParser):
    """Every <td data-key=...> of the page with its data attributes and text, the SVGs and the links."""

    def __init__(self):
        super().__init__()
        self.cells, self.current, self.svgs, self.links = [], None, [], []

    def handle_starttag(self, tag, attributes):
        attributes = dict(attributes)
        if tag == "td" and "data-key" in attributes:
            self.current = {**attributes, "text": ""}
        if tag == "svg":
            self.svgs.append(attributes)
        if tag == "a":
            self.links.append(attributes.get("href", ""))

    def handle_data(self, data):
        if self.current is not None:
            self.current["text"] += data

    def handle_endtag(self, tag):
        if tag == "td" and self.current is not None:
            self.cells.append(self.current)
            self.current = None


LAYOUT = """JSON.stringify({
  sortable: document.documentElement.dataset.sortable || null,
  height: document.documentElement.scrollHeight,
  sections: Object.fromEntries([...document.querySelectorAll('h2')].map(h => [h.id, h.getBoundingClientRect().top])),
  firstPerson: (r => r && r.getBoundingClientRect().bottom)(document.querySelector('#people tbody tr')),
})"""


@pytest.fixture(scope="module")
def rendered(graded_example_class, tmp_path_factory):
    import json

    grader = graded_example_class[0]
    page = grader.class_dir / "report.html"
    tmp_path = tmp_path_factory.mktemp("report")
    with Browser(tmp_path / "profile", 1280, SCREEN) as browser:
        browser.open(page.as_uri())
        layout = json.loads(browser.evaluate(LAYOUT))
        dom = browser.evaluate("document.documentElement.outerHTML")
        screenshot = browser.screenshot(tmp_path / "report.png")
    with open(grader.class_dir / "scores.csv", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    parser = Cells()
    parser.feed(dom)
    return grader.class_dir, page.read_text(encoding="utf-8"), dom, screenshot, rows, parser, layout


def test_what_an_instructor_acts_on_comes_first(rendered):
    """The students who need a person start on the first screen, with links to their feedback; the score
    missing and late notebooks, the score distributions and the causes follow, then the near-copies, before the
    pass rates of the checks."""
    class_dir, _, _, _, rows, parser, layout = rendered
    sections = layout["sections"]
    assert list(sections) == ["students", "missing", "distribution", "causes", "similarity", "checks"]
    assert sections["students"] < 300 and layout["firstPerson"] < SCREEN, layout
    assert sections["distribution"] < 2 * SCREEN and sections["causes"] < sections["checks"], layout
    print(f"report: {layout['height']} px tall; sections start at {sections} px")
    expected = {row["student"] for row in rows if needs(row)}
    assert {"hana", "finn", "dana_12345", "eve", "ada"} <= expected  # lost cells, rejected, repaired, answers waiting
    feedback = [urllib.parse.unquote(link) for link in parser.links if link.startswith("feedback/")]
    assert {link.split("/")[1] for link in feedback} >= expected - {"finn"}  # finn's file was rejected: no feedback
    assert all((class_dir / link).is_file() for link in feedback)


def test_the_plots_are_drawn_and_each_fits_on_a_screen(rendered):
    from PIL import Image

    _, _, _, screenshot, _, parser, _ = rendered
    pixels = np.asarray(Image.open(screenshot).convert("RGB"), dtype=np.int16)  # (height, width, 3)
    counts = {}
    for kind, colour in COLOURS.items():
        target = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
        counts[kind] = int((np.abs(pixels - target).sum(axis=-1) < 30).sum())  # pixels of this plot's colour
    assert all(count > 2000 for count in counts.values()), f"plot pixels per kind of plot: {counts}"
    assert len(parser.svgs) >= 3
    for svg in parser.svgs:  # sizes in CSS pixels (no unit): each plot fits a 1280 x 900 screen, with room around
        assert svg.get("role") == "img" and svg.get("aria-label"), svg
        assert 0 < float(svg["height"].removesuffix("px")) <= 675 and 0 < float(svg["width"].removesuffix("px")) <= 1100


def test_the_page_works_offline_and_runs_only_its_own_script(rendered):
    _, page, _, _, _, _, layout = rendered
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the report fetches something"
    assert page.count("<script") == 1 and policy() in page and "default-src 'none'" in policy()
    assert layout["sortable"] == "on"  # the sorting script ran: the policy lets its hash through


def test_tables_sort_by_the_heading_clicked(graded_example_class, tmp_path):
    page = graded_example_class[0].class_dir / "report.html"
    order = "[...document.querySelectorAll('#people tbody tr')].map(r => r.cells[{column}].textContent.trim())"
    click = "document.querySelectorAll('#people thead th')[{column}].click()"
    with Browser(tmp_path / "profile") as browser:
        browser.open(page.as_uri())
        names = browser.evaluate(order.format(column=0))
        assert len(names) >= 5
        browser.evaluate(click.format(column=0))
        assert browser.evaluate(order.format(column=0)) == sorted(names, key=str.lower)
        browser.evaluate(click.format(column=0))
        assert browser.evaluate(order.format(column=0)) == sorted(names, key=str.lower, reverse=True)
        cause_counts = "[...document.querySelectorAll('#causes tbody tr')].map(r => +r.cells[1].textContent)"
        browser.evaluate("document.querySelectorAll('#causes thead th')[1].click()")
        counts = browser.evaluate(cause_counts)
        assert counts == sorted(counts)  # numbers as numbers


def test_the_numbers_are_those_of_scores_csv(rendered):
    class_dir, _, dom, _, rows, parser, _ = rendered
    shown = {(cell.get("data-stage") or cell.get("data-check") or cell.get("data-cause"), cell["data-key"]):
             cell["text"].strip() for cell in parser.cells}
    graded = [row for row in rows if row["assignment"] == EXAMPLE_ASSIGNMENT and row["status"] in GRADED]
    totals = [float(row["total"]) for row in graded]
    assert len(graded) == 9  # finn's broken notebook is rejected
    expected = {"students": len(graded), "mean_total": statistics.fmean(totals),
                "median_total": statistics.median(totals), "min_total": min(totals), "max_total": max(totals),
                "mean_autograded": statistics.fmean(float(row["autograded"]) for row in graded),
                "pending": sum(row["manual_status"].startswith("needs manual grading") for row in graded)}
    for key, value in expected.items():
        assert float(shown[EXAMPLE_ASSIGNMENT, key]) == pytest.approx(value, abs=0.01), key
    cells = grade_cells(class_dir, [EXAMPLE_ASSIGNMENT])[EXAMPLE_ASSIGNMENT]
    assert len([cell for cell in cells if not cell.written]) >= 20
    for cell in cells:
        scores = [float(row[cell.grade_id]) for row in graded if row[cell.grade_id] != "needs manual grading"]
        assert int(shown[cell.grade_id, "students"]) == len(scores), cell.grade_id
        assert int(shown[cell.grade_id, "passed"]) == sum(score >= cell.points for score in scores), cell.grade_id
    causes = {key[0]: int(text) for key, text in shown.items() if key[1] == "students" and key[0] not in
              {cell.grade_id for cell in cells} and key[0] != EXAMPLE_ASSIGNMENT}
    assert any("d_k" in cause for cause in causes), causes  # chen's bug: scores not divided by sqrt(d_k)
    assert max(causes.values()) >= 1
    # the card counts written answers (not notebooks), as its label says
    answers = sum(value == "needs manual grading" for row in graded for value in row.values())
    card = re.search(r"data-key=\"written answers to grade\"><b>(\d+)</b>.*?\(in (\d+) notebooks\)", dom)
    assert (int(card.group(1)), int(card.group(2))) == (answers, expected["pending"]) and answers > expected["pending"]


def test_flagged_repaired_and_rejected_students_are_listed(rendered):
    _, _, dom, _, rows, _, _ = rendered
    text = re.sub(r"<[^>]+>", " ", dom)
    sections = dict(re.findall(r"(flagged for review|repaired|rejected|grading failed) \((\d+)\)", text))
    flagged = {row["student"] for row in rows if "flagged for review" in row["reasons"]}
    # the section counts exactly the flagged rows; hana's hostile lines are no flag since the static scan went
    # (issue 39; test_batch.test_no_honest_student_is_flagged_for_review)
    assert int(sections["flagged for review"]) == len(flagged) and "hana" not in flagged
    assert int(sections["rejected"]) == 1 and int(sections["repaired"]) >= 2  # finn; dana and eve


def test_the_near_copies_name_the_copies_of_the_reference_and_not_the_blank_notebooks(rendered):
    """The example class hands in the reference (ada; dana stripped, eve with a test cell deleted, gus looping, hana
    hostile) or the reference with one bug (chen): each is listed with the reference solution, on the exercises and
    written answers that can tell; the blank notebooks (blake, mallory, ADA) never are."""
    _, _, dom, _, rows, _, _ = rendered
    table = re.search(r"<table class=\"?sortable\"? id=\"?copies\"?.*?</table>", dom, re.DOTALL).group(0)
    assert "the reference solution" in table
    for student in ("ada", "chen", "dana_12345", "eve", "gus", "hana"):
        assert f">{student}</a>" in table, student
    blank = [row["student"] for row in rows if row["student"] in ("blake", "mallory") or row["name"] == "ADA"]
    assert len(blank) == 3 and not any(f">{student}<" in table for student in blank)
    assert "too short to tell" in dom


def test_plot_labels_draw_a_dollar_as_a_dollar():
    """A cause quoting a student's text with `$...$` is drawn as written, never parsed as mathtext."""
    cause = "the table uses $x^2$ and $$ where cos belongs"
    svg = causes_plot([CauseGroup("pe", cause, cause, {"pe_values"}, {("ada", "01")}, {("ada", "01"): cause})])
    assert "pe: the table uses $x^2$ and $$ where cos belongs" in svg


# --- issue 31: causes grouped by what went wrong; every student who needs a person listed ------------------

# chen's cause as the example class's checks write it (the engine's reading, then the check's named mistake)
CHEN = ("after line 13 of `scaled_dot_product_attention` (`scores = Q @ K.transpose(-2, -1)  # (..., q_len, k_len)`)"
        ": a step is missing: in `scaled_dot_product_attention`, the reference applies a division to the matrix "
        "product that goes into `scores`, which multiplies it by 0.3536 (the factor is 1/√d_k); your softmax on line "
        "16 of `scaled_dot_product_attention` (`weights = torch.softmax(scores, dim=-1)`) receives it without the "
        "division; the scores are not divided by √d_k: divide Q K^T by math.sqrt(d_k) before the softmax")


def _another_student(cause, shift, factor, name="s"):
    """CAUSE as another student with the same bug reads it: SHIFT more lines above, another FACTOR (the check's
    sizes), the product in a variable called NAME."""
    cause = re.sub(r"line (\d+)", lambda match: f"line {int(match.group(1)) + shift}", cause)
    return cause.replace("0.3536", factor).replace("`scores`", f"`{name}`").replace("scores = Q", f"{name} = Q")


def test_one_mistake_is_one_kind_whatever_the_lines_factors_and_names():
    key, words = cause_kind(CHEN)
    assert words == "the scores are not divided by √d_k: divide Q K^T by math.sqrt(d_k) before the softmax"
    for shift, factor, name in ((2, "0.4472", "s"), (40, "0.125", "attn"), (0, "0.3536", "scores")):
        assert cause_kind(_another_student(CHEN, shift, factor, name)) == (key, words)
    # the engine's reading alone (no named mistake): its kind without the student's lines, code and numbers
    engine = "; ".join(CHEN.split("; ")[:2])
    engine_key, engine_words = cause_kind(engine)
    assert engine_key == engine_words and "line" not in engine_key and "0.3536" not in engine_key
    assert engine_key.startswith("a step is missing: in `…`, the reference applies a division")
    assert cause_kind(_another_student(engine, 2, "0.4472", "s"))[0] == engine_key
    # another mistake never merges with it; a student's folder in a path is left out of the kind
    assert cause_kind("the mask is transposed: row i is the query")[0] != key
    assert cause_kind("in /home/ada/work/attention.py, line 3: a shape mismatch")[0] == cause_kind(
        "in /home/bob/course/attention.py, line 12: a shape mismatch")[0] == "in …, line N: a shape mismatch"


def test_a_class_with_one_bug_makes_one_row(graded_example_class, tmp_path):
    """150 students with chen's bug, each with other line numbers (comments added above), another factor and
    another name for the scores, make one row of 151 students (chen's own included): before issue 31 they made a
    row each per grade cell. The report lists them under it, and the row is on the page in Chromium."""
    import shutil

    class_dir = tmp_path / "class"
    shutil.copytree(graded_example_class[0].class_dir, class_dir, ignore=shutil.ignore_patterns("submitted"))
    rows = read_csv(class_dir / "scores.csv")
    chen = next(row for row in rows if row["student"] == "chen")
    source = class_dir / "autograded" / "chen" / EXAMPLE_ASSIGNMENT / f"{EXAMPLE_ASSIGNMENT}.ipynb"
    text = source.read_text(encoding="utf-8")
    factors = re.compile(r"\b\d\.\d{3,4}\b")  # the factors and values the message quotes
    assert "the scores are not divided by √d_k" in text and factors.search(text)
    for number in range(150):
        student = f"student{number:03d}"
        folder = class_dir / "autograded" / student / EXAMPLE_ASSIGNMENT
        folder.mkdir(parents=True)
        copy = re.sub(r"line (\d+)", lambda match, n=number: f"line {int(match.group(1)) + n % 7}", text)
        copy = factors.sub(lambda match, n=number: f"{float(match.group(0)) + n / 10000:.4f}", copy)
        (folder / source.name).write_text(copy.replace("`scores`", f"`scores_{number}`"), encoding="utf-8")
        rows.append({**chen, "student": student, "name": f"Student {number}"})
    with open(class_dir / "scores.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    groups = named_causes(class_dir, rows)
    ours = [group for group in groups if "not divided by √d_k" in group.words]
    assert len(ours) == 1, [(group.exercise, group.key[:80], len(group.who)) for group in ours]
    assert ours[0].exercise == "scaled_dot_product_attention" and len(ours[0].who) == 151
    assert ours[0].cells == {"attn_sdpa_values", "attn_sdpa_matches_pytorch"} and groups[0] is ours[0]
    write_report(class_dir)
    with Browser(tmp_path / "profile") as browser:
        browser.open((class_dir / "report.html").as_uri())
        first = browser.evaluate("[...document.querySelectorAll('#causes tbody tr')][0].innerText")
        assert "the scores are not divided by √d_k" in first and "\t151\t" in first, first


def test_zero_and_low_scores_need_a_person(rendered):
    """A notebook with 0 points (blank, or handed in as released) or under half the points graded so far is listed
    among the students who need a person, with its score; written answers waiting do not count against it."""
    _, _, dom, _, rows, _, _ = rendered
    zero = {row["student"] for row in rows if row["status"] in GRADED and float(row["total"]) == 0}
    assert zero >= {"blake", "mallory"}
    people = re.search(r"<table class=\"?sortable\"? id=\"?people\"?.*?</table>", dom, re.DOTALL).group(0)
    for student in zero:
        assert re.search(rf">{re.escape(student)}</td>.*?zero points: 0 of 44", people, re.DOTALL), student
    row = {"status": "graded", "total": "10", "max": "44", "reasons": "",
           "manual_status": "needs manual grading: 3 of 3 written answers (7 points not counted yet)"}
    assert "low score" in needs(row)  # 10 of the 37 points graded
    assert "low score" not in needs({**row, "total": "20"}) and "zero points" in needs({**row, "total": "0"})
    assert not {"low score", "zero points"} & set(needs({**row, "status": "rejected", "total": ""}))


def test_a_hidden_test_failed_alone_is_a_cause_of_its_own(tmp_path):
    """Its message names no cause (nothing computed from the hidden inputs may reach the notebook): where the
    exercise's visible checks all passed, the report says so (hard-coded sizes, typically); where they failed,
    their cause is the one listed."""
    import nbformat

    from transformer_course.grading.outputs.report import HIDDEN_ONLY

    hidden = ("CheckFailed", "✘ f is right (hidden test): fails on the hidden test's inputs (other sizes than the "
                             "visible checks'; they are not shown, and neither is what your code printed).")
    visible = ("CheckFailed", "✘ f is right: wrong values\n  expected: 1\n  got:      2\n  likely cause: f adds one")

    def notebook(*errors):
        cells = []
        for number, (ename, evalue) in enumerate(errors):
            cell = nbformat.v4.new_code_cell("### BEGIN HIDDEN TESTS\nassert check.f_values(f)\n### END HIDDEN TESTS",
                                             metadata={"nbgrader": {"grade": True, "grade_id": f"cell{number}"}})
            cell.outputs = [nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[])]
            cells.append(cell)
        return nbformat.v4.new_notebook(cells=cells)

    rows = []
    for student, errors in (("sizes", [hidden]), ("other", [hidden]), ("wrong", [visible, hidden])):
        folder = tmp_path / "autograded" / student / "01"
        folder.mkdir(parents=True)
        nbformat.write(notebook(*errors), folder / "01.ipynb")
        rows.append({"student": student, "assignment": "01", "status": "graded", "name": student})
    groups = {group.words: group for group in named_causes(tmp_path, rows)}
    assert set(groups) == {HIDDEN_ONLY, "f adds one"}
    assert groups[HIDDEN_ONLY].who == ["other", "sizes"] and groups[HIDDEN_ONLY].exercise == "f"
    assert groups["f adds one"].who == ["wrong"]
