"""The class report: what the class got wrong, on one page, written beside scores.csv.

    python -m transformer_course.grading.report CLASS_DIR     (the batch command writes it after grading)

CLASS_DIR/report.html holds, in the order an instructor acts on it:
1. the students who need a person: a row per student and stage that was flagged for review, rejected,
   repaired, whose grading failed, that scored 0 or under half the points graded so far (`LOW_SCORE`), whose
   written answers wait for a grade or changed since graded, with the reasons and a link to the student's
   feedback page (and to the answer pages once exported);
   then, per stage, the students with no submission (the roster's, else everyone who handed in something) and
   the late notebooks with their penalties (`term_section`);
2. the score distribution of every stage (a histogram per stage, and a table of the numbers);
3. the most frequent causes: the "likely cause:" lines of the checks' failure messages in the autograded
   notebooks, grouped by the exercise the checks call and by what went wrong (`cause_kind`: the check's named
   mistake, the kind of crash, or the engine's reading with the student's line numbers, code, names and
   numbers left out), counted once per student ("scaled_dot_product_attention: the scores are not divided
   by √d_k: 31 students"), with one student's message as an example;
4. the pass rate of every check (grade cell): the share of graded notebooks with its full points;
   written answers show their mean score instead, with how many still wait for a person.
5. near-copies: per exercise and written answer, the submissions of the whole term that are near-copies of the
   reference solution or of each other (`similarity`, written by the batch command to similarity.json), both
   students of a pair named; the exercises too short to tell honest work from a copy are said to be so.

Everything comes from scores.csv (the numbers), the class's release notebooks (points and order of
the grade cells) and the autograded notebooks (the failure messages). Plots are small SVG drawn by
`svg_plots` and inlined in the page (every text escaped: a "$" drawn as a "$"); each fits on one
screen. The page works offline: its only script sorts a table by the heading clicked, and its
Content-Security-Policy allows that script alone (by its hash), so no text in the page can ever run.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import re
import statistics
import urllib.parse
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import nbformat

from transformer_course.grading.cells import credit
from transformer_course.grading.outputs import similarity, svg_plots
from transformer_course.grading.outputs.deadlines import class_deadlines
from transformer_course.grading.outputs.files import write_text_atomically
from transformer_course.grading.outputs.roster import class_roster
from transformer_course.grading.outputs.scores import NEEDS_MANUAL_GRADING, is_answer_cell, read_csv

# one colour per kind of plot (the report's browser test finds the plots by them)
COLOURS = {"distribution": "#3b6fb6", "pass_rate": "#2a9d8f", "causes": "#e76f51"}
GRADED = ("graded", "skipped")  # statuses whose scores count (skipped: graded in an earlier run)
_CAUSE = re.compile(r"likely cause:\s*(.+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class GradeCell:
    assignment: str
    grade_id: str
    points: float
    written: bool  # graded by hand
    title: str  # what it checks (the check's name in the cell, or "written answer")
    extra: bool = False  # extra credit (credit="extra"): `points` add to the score, not to the maximum


def grade_cells(class_dir: Path, assignment_ids: list[str]) -> dict[str, list[GradeCell]]:
    """The grade cells of each assignment, in notebook order, from the class's release."""
    cells: dict[str, list[GradeCell]] = {}
    for assignment in assignment_ids:
        path = class_dir / "release" / assignment / f"{assignment}.ipynb"
        if not path.exists():
            continue
        for cell in nbformat.read(path, as_version=4).cells:
            nbgrader = cell.metadata.get("nbgrader", {})
            if not nbgrader.get("grade"):
                continue
            marked = credit(cell.source)
            if marked and marked[0] == "optional":
                continue  # counts for nothing, and its score (0 of 0) says nothing of whether it passed
            names = re.findall(r"\bcheck\.(\w+)", cell.source)
            title = "written answer" if is_answer_cell(cell) else (
                ", ".join(dict.fromkeys(names)) if names else "hidden tests")
            points = marked[1] if marked else float(nbgrader.get("points", 0))
            cells.setdefault(assignment, []).append(GradeCell(
                assignment, nbgrader["grade_id"], points, is_answer_cell(cell),
                title + (" (extra credit)" if marked else ""), extra=bool(marked)))
    return cells


def _number(value: object) -> float | None:
    try:
        return float(str(value))
    except ValueError:
        return None


@dataclass
class StageSummary:
    assignment: str
    students: int  # graded rows
    maximum: float
    totals: list[float]
    autograded: list[float]
    manual: list[float]
    pending: int  # rows with written answers nobody graded yet

    def mean(self, values: list[float]) -> float:
        return statistics.fmean(values) if values else 0.0


def summarise(rows: list[dict[str, str]]) -> dict[str, StageSummary]:
    stages: dict[str, StageSummary] = {}
    for row in rows:
        total, maximum = _number(row.get("total")), _number(row.get("max"))
        if row.get("status") not in GRADED or total is None or maximum is None:
            continue
        stage = stages.setdefault(row["assignment"], StageSummary(row["assignment"], 0, maximum, [], [], [], 0))
        stage.students += 1
        stage.maximum = max(stage.maximum, maximum)
        stage.totals.append(total)
        stage.autograded.append(_number(row.get("autograded")) or 0.0)
        stage.manual.append(_number(row.get("manual")) or 0.0)
        stage.pending += str(row.get("manual_status", "")).startswith(NEEDS_MANUAL_GRADING)
    return dict(sorted(stages.items()))


def pass_rates(rows: list[dict[str, str]], cells: dict[str, list[GradeCell]]) -> dict[str, list[dict]]:
    """Per assignment, per grade cell: graded students, how many got its full points, mean score."""
    result: dict[str, list[dict]] = {}
    for assignment, stage_cells in cells.items():
        graded = [row for row in rows if row.get("assignment") == assignment and row.get("status") in GRADED
                  and _number(row.get("total")) is not None]
        entries = []
        for cell in stage_cells:
            scores = [_number(row.get(cell.grade_id)) for row in graded]
            scored = [score for score in scores if score is not None]
            waiting = sum(str(row.get(cell.grade_id, "")) == NEEDS_MANUAL_GRADING for row in graded)
            entries.append({"cell": cell, "students": len(scored), "passed": sum(s >= cell.points for s in scored),
                            "mean": statistics.fmean(scored) if scored else 0.0, "waiting": waiting})
        result[assignment] = entries
    return result


# What in a cause is the student's own, left out of its key: quoted code and names (`scores`, the student's line),
# numbers (line numbers, factors, sizes), file paths (where a student's name or folder shows). A student's name is
# not looked for elsewhere: the checks write none, and an id that is a word ("max", "sizes") would split a kind.
_CODE = re.compile(r"`[^`\n]*`")
_NUMBER = re.compile(r"(?<![\w.])[-+−]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?(?![\w])")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][\w.@~-]+){2,}")
_LOCATION = re.compile(r"^(?:after line N of `…`|in `…`, line N|line N)(?: \(`…`\))?: ")  # where it starts
# "your softmax (in `f`, line 16 (`...`))", "your softmax on line 16 of `f` (`...`)"
_INNER_LOCATION = re.compile(r" \((?:in `…`, )?line N(?: \(`…`\))?\)| on line N of `…`(?: \(`…`\))?")
_STUDENT_LINE = re.compile(r"\bline \d+")  # a part of a cause that points into the student's code
_EXERCISE = re.compile(r"\bcheck\.\w+\(\s*(\w+)")  # `assert check.sdpa_values(scaled_dot_product_attention)`
# A hidden test's failure names no cause (its message may say nothing computed from the hidden inputs: the
# grader's executor writes these words alone); it is a cause of its own where the visible checks all passed.
_HIDDEN_FAILED = "fails on the hidden test's inputs"
HIDDEN_ONLY = ("passes the visible checks but fails on the hidden tests' inputs (other sizes): a size written as a "
               "number, an axis or a length taken from the wrong place, a shape that only works when two sizes "
               "are equal")


def normalised(text: str) -> str:
    """TEXT with what differs from one student to the next made the same: file paths, quoted code and numbers
    become "…" and "N" (`after line 13 of `f` (`x = 1`)` and `after line 15 of `g` (`y = 2`)` read alike)."""
    text = _CODE.sub("`…`", _PATH.sub("…", text))
    return re.sub(r"\s+", " ", _NUMBER.sub("N", text)).strip().rstrip(".")


def cause_kind(cause: str) -> tuple[str, str]:
    """(key, words) of what went wrong, the same for every student with the same mistake.

    A check's cause is its own named mistake ("the scores are not divided by √d_k: ..."), the meaning of a kind
    of crash, or the differential engine's reading of the student's code ("after line 13 of `f` (`...`): a step
    is missing: ..., the result is 0.3536 × it"), or the engine's reading and the check's, joined by "; ". The
    named parts (those that point at no line of the student's) are the key when there are any; otherwise the
    engine's text with the student's lines, code, paths and numbers left out. WORDS is the named parts as
    written, or that key."""
    parts = [part.strip() for part in cause.split("; ") if part.strip()]
    named = [part for part in parts if not _STUDENT_LINE.search(part)]
    if named:
        words = "; ".join(named).rstrip(".")
        return normalised(words), words
    key = _INNER_LOCATION.sub("", _LOCATION.sub("", normalised(cause)))
    return key, key


@dataclass
class CauseGroup:
    """Students whose checks failed for the same reason in the same exercise."""

    exercise: str  # the function or class the checks call, or the grade cell when they call none
    key: str  # `cause_kind`'s key
    words: str  # what went wrong, as most of these students were told
    cells: set[str]  # grade cells that failed with it
    students: set[tuple[str, str]]  # (student, assignment)
    examples: dict[tuple[str, str], str]  # (student, assignment): the cause as that student read it

    @property
    def who(self) -> list[str]:
        return sorted({student for student, _ in self.students})


def _failures(notebook: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """(grade cell, exercise, likely cause) for every "likely cause:" line of a failed grade cell, and HIDDEN_ONLY
    for a hidden test that failed."""
    found = []
    for cell in notebook.cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not nbgrader.get("grade"):
            continue
        grade_id = nbgrader.get("grade_id", "?")
        exercise = next(iter(_EXERCISE.findall(cell.source)), grade_id)
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            text = _ANSI.sub("", "\n".join([str(output.get("evalue", "")), *output.get("traceback", [])]))
            causes = dict.fromkeys(match.strip().rstrip(".") for match in _CAUSE.findall(text))
            if not causes and _HIDDEN_FAILED in text:
                causes = {HIDDEN_ONLY: None}
            for cause in causes:
                found.append((grade_id, exercise, cause))
    return found


def named_causes(class_dir: Path, rows: list[dict[str, str]]) -> list[CauseGroup]:
    """Every failed check's "likely cause", grouped by exercise and what went wrong (`cause_kind`: line numbers,
    factors, code and names left out), most students first; a student counts once per group, whatever the number
    of cells or stages it failed."""
    groups: dict[tuple[str, str], CauseGroup] = {}
    for student, assignment in sorted({(row["student"], row["assignment"]) for row in rows
                                       if row.get("status") in GRADED}):
        path = class_dir / "autograded" / student / assignment / f"{assignment}.ipynb"
        try:
            notebook = nbformat.read(path, as_version=4)
        except (OSError, ValueError):
            continue
        failures = _failures(notebook)
        visible = {exercise for _, exercise, cause in failures if cause != HIDDEN_ONLY}
        for grade_id, exercise, cause in failures:
            if cause == HIDDEN_ONLY and exercise in visible:
                continue  # what the visible checks say comes first
            key, words = cause_kind(cause)
            group = groups.setdefault((exercise, key), CauseGroup(exercise, key, words, set(), set(), {}))
            group.cells.add(grade_id)
            group.students.add((student, assignment))
            group.examples.setdefault((student, assignment), cause)
    for group in groups.values():  # in words most of them read (a check's words may carry their numbers)
        told = [cause_kind(cause)[1] for cause in group.examples.values()]
        group.words = max(sorted(set(told)), key=told.count)
    return sorted(groups.values(), key=lambda group: (-len(group.who), group.exercise, group.key))


NEEDS = ("flagged for review", "rejected", "repaired", "grading failed", "cells that did not finish",
         "another release", "zero points", "low score", "answers to grade", "answers changed since graded")
LOW_SCORE = 0.5  # a graded notebook under half the points graded so far is a "low score"


def share_of_points(row: dict[str, str]) -> float | None:
    """The row's total as a share of the points graded so far (written answers waiting for a person left out of
    the maximum); None when the row has no total or no points graded."""
    total, maximum = _number(row.get("total")), _number(row.get("max"))
    if row.get("status") not in GRADED or total is None or maximum is None:
        return None
    waiting = re.search(r"\(([\d.]+) points not counted yet\)", str(row.get("manual_status", "")))
    graded = maximum - (float(waiting.group(1)) if waiting else 0.0)
    return total / graded if graded > 0 else None


def needs(row: dict[str, str]) -> list[str]:
    """What a person must do about this row of scores.csv (one or more of NEEDS; [] when nothing)."""
    reasons, status = row.get("reasons", ""), str(row.get("manual_status", ""))
    share = share_of_points(row)
    found = []
    if "flagged for review" in reasons:
        found.append("flagged for review")
    if row.get("status") == "rejected":
        found.append("rejected")
    if row.get("notebook") == "repaired" or "rebuilt from the released notebook" in reasons:
        found.append("repaired")
    if row.get("status") == "failed":
        found.append("grading failed")
    if "did not finish:" in reasons or "passed the grader's budget" in reasons:  # executor.FAULT_WORDS, OutputBudget
        found.append("cells that did not finish")
    if "checks, which may differ from the ones the notebook ran" in reasons:  # batch.own_releases
        found.append("another release")
    if share is not None and _number(row.get("total")) == 0:
        found.append("zero points")
    elif share is not None and share < LOW_SCORE:
        found.append("low score")
    if row.get("status") in GRADED and status.startswith(NEEDS_MANUAL_GRADING):
        found.append("answers to grade")
    if row.get("status") in GRADED and "review:" in status:
        found.append("answers changed since graded")
    return found


def flagged_students(rows: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """{what must be done (NEEDS): the rows of scores.csv that need it}."""
    groups: dict[str, list[dict[str, str]]] = {name: [] for name in NEEDS}
    for row in rows:
        for name in needs(row):
            groups[name].append(row)
    return groups


def waiting_answers(row: dict[str, str]) -> int:
    """How many written answers of this row nobody graded yet."""
    match = re.match(rf"{NEEDS_MANUAL_GRADING}: (\d+) of", str(row.get("manual_status", "")))
    return int(match.group(1)) if match else 0


# --- plots ---------------------------------------------------------------------------------------

def distribution_plot(stages: dict[str, StageSummary]) -> str:
    """A histogram per stage of its totals as a percentage of the maximum, in bins of 10 %."""
    panels = [(f"{stage.assignment} ({stage.students} notebooks)",
               [100 * total / stage.maximum if stage.maximum else 0 for total in stage.totals])
              for stage in stages.values()]
    return svg_plots.histogram_grid("Score distribution per stage: students per 10 % of the maximum", panels,
                                    list(range(0, 101, 10)), COLOURS["distribution"], "total, % of the maximum",
                                    "students")


def pass_rate_plot(assignment: str, entries: list[dict]) -> str:
    """A bar per autograded grade cell: the share of graded notebooks with its full points."""
    entries = [entry for entry in entries if not entry["cell"].written]
    rates = [100 * entry["passed"] / entry["students"] if entry["students"] else 0 for entry in entries]
    tooltips = [f"{entry['cell'].grade_id} ({entry['cell'].title}): {entry['passed']} of {entry['students']} "
                f"notebooks, {rate:.0f}%" for entry, rate in zip(entries, rates, strict=True)]
    return svg_plots.bar_chart(f"{assignment}: pass rate of every check", [entry["cell"].grade_id for entry in entries],
                               rates, COLOURS["pass_rate"], "students with full points on the check (%)",
                               [f"{rate:.0f}%" for rate in rates], axis_maximum=100, tooltips=tooltips)


def causes_plot(causes: list[CauseGroup], top: int = 8) -> str:
    """A bar per cause (exercise and what went wrong), the `top` most frequent first: how many students it
    concerns."""
    shown = causes[:top]
    counts = [len(group.who) for group in shown]
    return svg_plots.bar_chart(f"The {len(shown)} most frequent causes of failed checks",
                               [f"{group.exercise}: {group.words}" for group in shown], counts, COLOURS["causes"],
                               "students", [str(count) for count in counts])


def near_copies(class_dir: Path, rows: list[dict[str, str]]) -> tuple[str, set[str]]:
    """The section of near-copies (similarity.json, `similarity`) and the students it names."""
    found = similarity.read(class_dir)
    groups, too_short = found.get("groups", []), found.get("too_short", [])
    names = {row["student"]: row.get("name", "") for row in rows}
    named: set[str] = set()
    parts = ["<h2 id=similarity>Near-copies</h2><p class=muted>Per exercise and written answer, the submissions of "
             "the whole term (every week's) that are near-copies of the reference solution or of each other, with "
             "names, comments and layout set aside (winnowing fingerprints, copydetect; each exercise's threshold "
             "measured on honest work). A list for you to look at: no score was changed.</p>"]
    if not found:
        parts.append("<p>Not compared yet (the batch command compares when it grades).</p>")
        return "".join(parts), named
    entries = []
    for group in groups:
        members = group.get("members", [])
        students = [member for member in members if member != similarity.REFERENCE]
        named.update(students)
        shown = [html.escape(member) if member == similarity.REFERENCE else (
            _feedback_link(class_dir, member, group["assignment"], member) or html.escape(member))
            + (f" <span class=muted>({html.escape(names[member])})</span>" if names.get(member) else "")
            for member in members]
        pairs = "; ".join(f"{first} ~ {second}: {score:.2f}" for first, second, score in group.get("pairs", []))
        top = max((score for _, _, score in group.get("pairs", [])), default=0.0)
        kind = "written answer" if group.get("written") else "exercise"
        entries.append("<tr>" + _cell(group["assignment"]) + _cell(f"{group['grade_id']} ({kind})")
                       + f"<td data-value='{len(students)}'>{', '.join(shown)}</td>"
                       + _cell(f"{top:.2f}", "similarity", True, stage=group["assignment"], cell=group["grade_id"])
                       + f"<td class=reasons><details><summary>{len(group.get('pairs', []))} pairs</summary>"
                       f"{html.escape(pairs)}</details></td></tr>")
    if entries:
        parts.append(_table(["stage", "exercise or question", "near-copies (the reference solution, students)",
                             "highest similarity", "pairs"], entries, "copies"))
    else:
        compared = sum(item.get("submissions", 0) for item in found.get("compared", []))
        parts.append(f"<p>None: no submission is a near-copy of the reference solution or of another ({compared} "
                     "exercise cells and written answers compared).</p>")
    if too_short:
        listed = ", ".join(f"{item['assignment']} {item['grade_id']}" for item in too_short)
        parts.append(f"<details><summary class=muted>{len(too_short)} exercises too short to tell honest work from a "
                     "copy: not compared</summary><p class=muted>On these, honest solutions written independently "
                     f"come as close to the reference (or to each other) as a copy does: {html.escape(listed)}.</p>"
                     "</details>")
    return "".join(parts), named


# --- the page --------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1150px; padding: 0 1rem 3rem; color: #1a1a1a; }
h1 { font-size: 1.4rem; margin: 0.8rem 0 0.2rem; } h2 { font-size: 1.15rem; margin-top: 1.6rem;
  border-bottom: 1px solid #ddd; } h3 { font-size: 1rem; } .muted { color: #666; } p { margin: 0.3rem 0; }
table { border-collapse: collapse; margin: 0.4rem 0; font-size: 0.88rem; }
td, th { border-bottom: 1px solid #e3e3e3; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f4f6fa; position: sticky; top: 0; cursor: pointer; user-select: none; white-space: nowrap; }
th[aria-sort=ascending]::after { content: " \\25B2"; } th[aria-sort=descending]::after { content: " \\25BC"; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.scroll { max-height: 45vh; overflow: auto; border: 1px solid #e3e3e3; border-radius: 4px; }
.scroll table { margin: 0; width: 100%; }
figure { margin: 0.4rem 0; } figure svg { max-width: 100%; height: auto; max-height: 80vh; }
.cards { display: flex; gap: 0.6rem; flex-wrap: wrap; margin: 0.5rem 0; } .card { background: #f4f6fa;
  padding: 0.35rem 0.8rem; border-radius: 6px; font-size: 0.85rem; } .card b { font-size: 1.2rem; display: block; }
.card.act { background: #fdecea; } .tag { display: inline-block; background: #fdecea; border-radius: 3px;
  padding: 0 0.3rem; margin: 0 0.2rem 0.1rem 0; font-size: 0.8rem; white-space: nowrap; }
details summary { cursor: pointer; } .reasons { max-width: 34rem; }
"""

# Sorts a table by the column whose heading is clicked (or focused and Enter); numbers as numbers. The page's
# Content-Security-Policy allows this script alone, by its hash: nothing else on the page can run.
_SORT = """
document.documentElement.dataset.sortable = "on";
for (const table of document.querySelectorAll("table.sortable")) {
  const heads = [...table.tHead.rows[0].cells];
  heads.forEach((th, column) => {
    th.tabIndex = 0;
    const sort = () => {
      const up = th.getAttribute("aria-sort") !== "ascending";
      heads.forEach(other => other.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", up ? "ascending" : "descending");
      const key = row => {
        const cell = row.cells[column], text = cell ? (cell.dataset.value ?? cell.textContent.trim()) : "";
        return /^-?\\d+(\\.\\d+)?%?$/.test(text) ? parseFloat(text) : text.toLowerCase();
      };
      const order = (a, b) => {
        const x = key(a), y = key(b);
        if (typeof x !== typeof y) return typeof x === "number" ? -1 : 1;
        return x < y ? -1 : x > y ? 1 : 0;
      };
      const body = table.tBodies[0];
      body.append(...[...body.rows].sort((a, b) => up ? order(a, b) : order(b, a)));
    };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", event => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sort(); }
    });
  });
}
"""


def policy() -> str:
    """The report's Content-Security-Policy: its own sorting script (by hash), inline styles and images."""
    digest = base64.b64encode(hashlib.sha256(_SORT.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:; "
            "base-uri 'none'; form-action 'none'")


def _cell(value: object, key: str = "", numeric: bool = False, **data: str) -> str:
    attributes = "".join(f' data-{name}="{html.escape(str(value_))}"' for name, value_ in data.items())
    attributes += f' data-key="{key}"' if key else ""
    return f"<td{' class=n' if numeric else ''}{attributes}>{html.escape(str(value))}</td>"


def _table(headings: list[str], rows: list[str], table_id: str = "") -> str:
    """A sortable table: its headings and its rows (each "<tr>...</tr>")."""
    identity = f" id={table_id}" if table_id else ""
    head = "".join(f"<th scope=col>{html.escape(heading)}</th>" for heading in headings)
    return f"<table class=sortable{identity}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _fmt(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _feedback_link(class_dir: Path, student: str, assignment: str, text: str = "feedback") -> str:
    """A link to the student's feedback page for this stage, relative to report.html ("" when there is none)."""
    relative = f"feedback/{student}/{assignment}/{assignment}.html"
    if not student or not assignment or not (class_dir / relative).is_file():
        return ""
    return f'<a href="{html.escape(urllib.parse.quote(relative))}">{html.escape(text)}</a>'


def _people(class_dir: Path, rows: list[dict[str, str]]) -> tuple[str, dict[str, int]]:
    """The table of rows that need a person, and how many students each kind of need concerns."""
    entries, students = [], defaultdict(set)
    for row in rows:
        found = needs(row)
        if not found:
            continue
        for name in found:
            students[name].add(row["student"])
        links = [_feedback_link(class_dir, row["student"], row.get("assignment", ""))]
        if "answers to grade" in found or "answers changed since graded" in found:
            links.append('<a href="answers/index.html">answers</a>' if (class_dir / "answers" / "index.html").is_file()
                         else "<span class=muted>answers: run answers export</span>")
        waiting = waiting_answers(row)
        score = f": {_fmt(_number(row.get('total')) or 0)} of {_fmt(_number(row.get('max')) or 0)}"
        tags = "".join(f"<span class=tag>{html.escape(name)}" + (f": {waiting}" if name == "answers to grade" else "")
                       + (score if name in ("zero points", "low score") else "") + "</span>" for name in found)
        reasons = "; ".join(filter(None, [row.get("reasons", ""), row.get("manual_status", "")]))
        shown = html.escape(svg_plots.shorten(reasons, 150))
        if len(reasons) > 150:
            shown = f"<details><summary>{shown}</summary>{html.escape(reasons)}</details>"
        entries.append("<tr>" + _cell(row["student"]) + _cell(row.get("name", "")) + _cell(row.get("assignment", ""))
                       + f"<td data-value='{html.escape(' '.join(found))}'>{tags}</td>"
                       + f"<td class=reasons>{shown}</td><td>{' '.join(filter(None, links))}</td></tr>")
    table = _table(["student", "name", "stage", "needs", "reasons", "open"], entries, "people") if entries else ""
    return table, {name: len(students[name]) for name in NEEDS}


def missing(class_dir: Path, rows: list[dict[str, str]]) -> tuple[dict[str, list[str]], bool]:
    """({stage: the students with no row for it}, whether the class's roster says who is enrolled). Stages are
    those of scores.csv and of the deadlines file whose due time has passed; without a roster, the class is
    whoever handed in something."""
    roster = class_roster(class_dir)
    due = class_deadlines(class_dir)
    now = datetime.now().astimezone()
    stages = {row["assignment"] for row in rows if row.get("assignment") not in (None, "", "?")}
    if due is not None:
        stages |= {stage for stage, when in due.due.items() if when <= now}
        stages -= {stage for stage, when in due.due.items() if when > now}  # not due yet: nobody is missing it
    if roster is not None:
        handed = {(row.get("lms_id", ""), row.get("assignment", "")) for row in rows}
        enrolled = {person.lms_id: person.name or person.email or person.lms_id for person in roster.people}
        return {stage: sorted(name for lms_id, name in enrolled.items() if (lms_id, stage) not in handed)
                for stage in sorted(stages)}, True
    by_stage = defaultdict(set)
    for row in rows:
        by_stage[row.get("assignment", "")].add(row["student"])
    everyone = {row["student"] for row in rows}
    return {stage: sorted(everyone - by_stage[stage]) for stage in sorted(stages)}, False


def term_section(class_dir: Path, rows: list[dict[str, str]]) -> str:
    """Late notebooks (with their penalty) and, per stage, the students with no submission."""
    gaps, enrolled = missing(class_dir, rows)
    parts = ["<h2 id=missing>Missing and late</h2>"]
    who = ("the class's roster" if enrolled else "the students who handed in something (give the batch command "
           "--roster to list those who handed in nothing at all)")
    lines = [f"<tr>{_cell(stage)}{_cell(len(names), 'missing', True, stage=stage)}<td class=reasons>"
             f"{html.escape(', '.join(names)) or '<span class=muted>none</span>'}</td></tr>"
             for stage, names in gaps.items()]
    parts.append(f"<p class=muted>Per stage, who of {who} has no submission (a rejected file counts as one).</p>")
    parts.append(_table(["stage", "missing", "students"], lines, "missing_students") if lines
                 else "<p>No stage yet.</p>")
    late = [row for row in rows if (_number(row.get("late_penalty")) or 0) > 0 or "late" in row.get("late", "")
            .replace("on time", "")]
    if late:
        entries = ["<tr>" + "".join([_cell(row["student"]), _cell(row.get("assignment", "")),
                                     _cell(row.get("submitted", "")), _cell(row.get("due", "")),
                                     _cell(row.get("late", "")), _cell(row.get("late_penalty", ""), numeric=True),
                                     _cell(row.get("total", ""), numeric=True),
                                     _cell(row.get("total_after_penalty", ""), numeric=True)]) + "</tr>"
                   for row in sorted(late, key=lambda row: (row.get("assignment", ""), row["student"]))]
        parts.append("<p class=muted>Late notebooks, as the deadlines file and the submission times say "
                     "(scores.csv: submitted, due, late, late_penalty, total_after_penalty).</p>")
        parts.append(_table(["student", "stage", "submitted", "due", "late", "penalty %", "points",
                             "after the penalty"], entries, "late_notebooks"))
    return "".join(parts)


def render(class_dir: Path) -> str:
    rows = read_csv(class_dir / "scores.csv")
    stages = summarise(rows)
    cells = grade_cells(class_dir, sorted({row["assignment"] for row in rows if row.get("assignment")}))
    rates = pass_rates(rows, cells)
    causes = named_causes(class_dir, rows)
    people, concerned = _people(class_dir, rows)
    copies, copied = near_copies(class_dir, rows)
    students = {row["student"] for row in rows}
    waiting = [waiting_answers(row) for row in rows if row.get("status") in GRADED]
    parts = [f"<h1>Class report</h1><p class=muted>{html.escape(str(class_dir))}, written "
             f"{datetime.now():%Y-%m-%d %H:%M} from scores.csv ({len(rows)} rows: one per student and stage, "
             "and one per file that could not be graded).</p><div class=cards>"]
    cards = [("students", len(students), ""), ("notebooks graded", sum(s.students for s in stages.values()), ""),
             ("written answers to grade", sum(waiting), f"in {sum(1 for n in waiting if n)} notebooks")]
    cards += [(f"students: {name}", concerned[name], "") for name in NEEDS if name != "answers to grade"]
    cards.append(("students: near-copies", len(copied), ""))
    parts += [f"<div class='card{' act' if count and index > 1 else ''}' data-key='{html.escape(name)}'><b>{count}</b>"
              f"{html.escape(name)}{f' <span class=muted>({html.escape(note)})</span>' if note else ''}</div>"
              for index, (name, count, note) in enumerate(cards)]
    parts.append("</div>")

    parts.append("<h2 id=students>Students who need a person</h2>")
    summary = " · ".join(f"{html.escape(name)} ({concerned[name]})" for name in NEEDS)
    parts.append(f"<p class=muted>Students per kind: {summary}. A row per student and stage; click a heading to "
                 "sort.</p>")
    parts.append(f"<div class=scroll>{people}</div>" if people else "<p>Nobody: no flag, no rejected, repaired "
                 "or failed notebook, no written answer waiting.</p>")

    parts.append(term_section(class_dir, rows))

    parts.append("<h2 id=distribution>Score distribution per stage</h2>")
    if stages:
        parts.append(f"<figure>{distribution_plot(stages)}</figure>")
        if sum(waiting):
            parts.append(f"<p class=muted>{sum(waiting)} written answers in {sum(1 for n in waiting if n)} graded "
                         "notebooks wait for a person: those totals count them as 0 until they are graded "
                         "(python -m transformer_course.grading.answers export CLASS_DIR).</p>")
        stage_rows = []
        for stage in stages.values():
            name = stage.assignment
            stage_rows.append("<tr>" + "".join([
                _cell(name), _cell(stage.students, "students", True, stage=name),
                _cell(_fmt(stage.maximum), "max", True, stage=name),
                _cell(_fmt(stage.mean(stage.totals)), "mean_total", True, stage=name),
                _cell(_fmt(statistics.median(stage.totals)), "median_total", True, stage=name),
                _cell(_fmt(min(stage.totals)), "min_total", True, stage=name),
                _cell(_fmt(max(stage.totals)), "max_total", True, stage=name),
                _cell(_fmt(stage.mean(stage.autograded)), "mean_autograded", True, stage=name),
                _cell(_fmt(stage.mean(stage.manual)), "mean_manual", True, stage=name),
                _cell(stage.pending, "pending", True, stage=name)]) + "</tr>")
        parts.append(_table(["stage", "notebooks graded", "max points", "mean total", "median", "lowest", "highest",
                             "mean from checks", "mean from written answers", "notebooks with answers to grade"],
                            stage_rows, "stages"))
    else:
        parts.append("<p>No graded notebooks yet.</p>")

    parts.append("<h2 id=causes>Most frequent causes</h2><p class=muted>The \"likely cause\" of every failed "
                 "check, grouped by exercise and by what went wrong (the student's line numbers, code, names and "
                 "numbers left out), each student counted once; open a row's example for the message as one "
                 "student read it.</p>")
    if causes:
        cause_rows = []
        for group in causes:
            links = ", ".join(_feedback_link(class_dir, student, assignment, student) or html.escape(student)
                              for student, assignment in sorted(group.students))
            (student, assignment), example = min(group.examples.items())
            cause_rows.append(
                "<tr>" + _cell(group.words) + _cell(len(group.who), "students", True, cause=group.words,
                                                    exercise=group.exercise)
                + _cell(group.exercise) + _cell(", ".join(sorted(group.cells)))
                + f"<td><details><summary>{len(group.who)} students</summary>{links}</details></td>"
                + f"<td class=reasons><details><summary>{html.escape(student)} ({html.escape(assignment)})</summary>"
                f"{html.escape(example)}</details></td></tr>")
        parts.append(f"<figure>{causes_plot(causes)}</figure>")
        parts.append(_table(["what went wrong", "students", "exercise", "grade cells", "who (their feedback)",
                             "example"], cause_rows, "causes"))
    else:
        parts.append("<p>No check failed with a named cause.</p>")

    parts.append(copies)

    parts.append("<h2 id=checks>Pass rate of every check</h2><p class=muted>Share of graded notebooks with the "
                 "check's full points. Written answers: mean score, and how many wait for a person.</p>")
    for assignment, entries in rates.items():
        parts.append(f"<h3>{html.escape(assignment)}</h3>")
        if any(not entry["cell"].written for entry in entries):
            parts.append(f"<figure>{pass_rate_plot(assignment, entries)}</figure>")
        check_rows = []
        for entry in entries:
            cell = entry["cell"]
            rate = f"{100 * entry['passed'] / entry['students']:.0f}%" if entry["students"] else "-"
            check_rows.append("<tr>" + "".join([
                _cell(cell.grade_id), _cell(cell.title), _cell(_fmt(cell.points), numeric=True),
                _cell(entry["passed"], "passed", True, check=cell.grade_id),
                _cell(entry["students"], "students", True, check=cell.grade_id),
                _cell(rate, numeric=True), _cell(_fmt(entry["mean"]), "mean", True, check=cell.grade_id),
                _cell(entry["waiting"] if cell.written else "", "waiting", True, check=cell.grade_id)]) + "</tr>")
        parts.append("<details><summary>the numbers</summary>" + _table(
            ["grade cell", "checks", "points", "notebooks with full points", "notebooks graded", "pass rate",
             "mean score", "answers waiting"], check_rows) + "</details>")
    body = "".join(parts)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta http-equiv='Content-Security-Policy' content=\"{policy()}\">"
            f"<title>Class report</title><style>{_STYLE}</style></head><body>{body}"
            f"<script>{_SORT}</script></body></html>")


def write_report(class_dir: Path) -> Path:
    """CLASS_DIR/report.html, replaced whole (several machines may write it at once: the last one wins)."""
    return write_text_atomically(class_dir / "report.html", render(class_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("class_dir", type=Path)
    arguments = parser.parse_args(argv)
    if not (arguments.class_dir / "scores.csv").exists():
        parser.error(f"{arguments.class_dir} has no scores.csv: grade the class first")
    print(write_report(arguments.class_dir.resolve()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
