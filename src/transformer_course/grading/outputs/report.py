"""The class report: what the class got wrong, on one page, written beside scores.csv.

    python -m transformer_course.grading.report CLASS_DIR     (the batch command writes it after grading)

CLASS_DIR/report.html holds
1. the score distribution of every stage (a histogram per stage, and a table of the numbers);
2. the pass rate of every check (grade cell): the share of graded students with its full points;
   written answers show their mean score instead, with how many still wait for a person;
3. the most frequent named causes: the "likely cause:" lines of the checks' failure messages in the
   autograded notebooks, counted once per student ("scores not divided by sqrt(d_k): 31 students");
4. the students whose notebook was flagged for review, repaired, rejected, or whose grading failed.

Everything comes from scores.csv (the numbers), the class's release notebooks (points and order of
the grade cells) and the autograded notebooks (the failure messages). Plots are matplotlib SVG inlined
in the page, so it works offline and has no scripts; each plot fits on one screen.
"""

from __future__ import annotations

import argparse
import html
import io
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import nbformat

from transformer_course.grading.outputs.files import write_text_atomically
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
            names = re.findall(r"\bcheck\.(\w+)", cell.source)
            title = "written answer" if is_answer_cell(cell) else (
                ", ".join(dict.fromkeys(names)) if names else "hidden tests")
            cells.setdefault(assignment, []).append(GradeCell(
                assignment, nbgrader["grade_id"], float(nbgrader.get("points", 0)), is_answer_cell(cell), title))
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


def named_causes(class_dir: Path, rows: list[dict[str, str]]) -> list[tuple[str, list[str], list[str]]]:
    """(cause, grade cells, students) for every "likely cause" of a failed check, most students first."""
    students: dict[str, set[str]] = defaultdict(set)
    where: dict[str, set[str]] = defaultdict(set)
    seen = {(row["student"], row["assignment"]) for row in rows if row.get("status") in GRADED}
    for student, assignment in sorted(seen):
        path = class_dir / "autograded" / student / assignment / f"{assignment}.ipynb"
        try:
            notebook = nbformat.read(path, as_version=4)
        except (OSError, ValueError):
            continue
        for cell in notebook.cells:
            nbgrader = cell.metadata.get("nbgrader", {})
            if cell.cell_type != "code" or not nbgrader.get("grade"):
                continue
            for output in cell.get("outputs", []):
                if output.get("output_type") != "error":
                    continue
                text = _ANSI.sub("", "\n".join([str(output.get("evalue", "")), *output.get("traceback", [])]))
                for cause in dict.fromkeys(match.strip().rstrip(".") for match in _CAUSE.findall(text)):
                    students[cause].add(student)
                    where[cause].add(nbgrader.get("grade_id", "?"))
    ranked = sorted(students, key=lambda cause: (-len(students[cause]), cause))
    return [(cause, sorted(where[cause]), sorted(students[cause])) for cause in ranked]


def flagged_students(rows: list[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    groups: dict[str, list[dict[str, str]]] = {"flagged for review": [], "repaired": [], "rejected": [],
                                               "grading failed": []}
    for row in rows:
        reasons = row.get("reasons", "")
        if "flagged for review" in reasons:
            groups["flagged for review"].append(row)
        if row.get("notebook") == "repaired" or "rebuilt from the released notebook" in reasons:
            groups["repaired"].append(row)
        if row.get("status") == "rejected":
            groups["rejected"].append(row)
        if row.get("status") == "failed":
            groups["grading failed"].append(row)
    return groups


# --- plots ---------------------------------------------------------------------------------------

def _svg(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 10, "axes.spines.top": False,
                         "axes.spines.right": False})
    return plt


def distribution_plot(stages: dict[str, StageSummary]) -> str:
    plt = _pyplot()
    count = max(1, len(stages))
    columns = min(3, count)
    lines = (count + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(3.6 * columns, 2.4 * lines), squeeze=False)
    for axis in axes.flat[count:]:
        axis.set_visible(False)
    for axis, stage in zip(axes.flat, stages.values(), strict=False):
        percent = [100 * total / stage.maximum if stage.maximum else 0 for total in stage.totals]
        axis.hist(percent, bins=[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.001], color=COLOURS["distribution"],
                  edgecolor="white")
        axis.set_title(f"{stage.assignment} ({stage.students} students)", fontsize=10)
        axis.set_xlim(0, 100)
        axis.set_xlabel("total, % of the maximum")
        axis.set_ylabel("students")
        axis.yaxis.get_major_locator().set_params(integer=True)
    figure.tight_layout()
    return _svg(figure)


def pass_rate_plot(assignment: str, entries: list[dict]) -> str:
    plt = _pyplot()
    entries = [entry for entry in entries if not entry["cell"].written]
    figure, axis = plt.subplots(figsize=(9, min(7.0, 0.8 + 0.24 * len(entries))))
    labels = [entry["cell"].grade_id for entry in entries][::-1]
    rates = [100 * entry["passed"] / entry["students"] if entry["students"] else 0 for entry in entries][::-1]
    axis.barh(labels, rates, color=COLOURS["pass_rate"])
    for y, rate in enumerate(rates):
        axis.text(min(rate + 1, 93), y, f"{rate:.0f}%", va="center", fontsize=8)
    axis.set_xlim(0, 100)
    axis.set_xlabel("students with full points on the check (%)")
    axis.set_title(f"{assignment}: pass rate of every check", fontsize=10)
    axis.tick_params(axis="y", labelsize=8)
    figure.tight_layout()
    return _svg(figure)


def causes_plot(causes: list[tuple[str, list[str], list[str]]], top: int = 12) -> str:
    plt = _pyplot()
    shown = causes[:top][::-1]
    figure, axis = plt.subplots(figsize=(10, min(6.5, 0.9 + 0.36 * len(shown))))
    labels = [_shorten(cause, 70) for cause, _, _ in shown]
    axis.barh(range(len(shown)), [len(students) for _, _, students in shown], color=COLOURS["causes"])
    axis.set_yticks(range(len(shown)), labels, fontsize=8)
    axis.set_xlabel("students")
    axis.xaxis.get_major_locator().set_params(integer=True)
    axis.set_title("Most frequent named causes of failed checks", fontsize=10)
    figure.tight_layout()
    return _svg(figure)


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# --- the page --------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1150px; padding: 0 1rem 3rem; color: #1a1a1a; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
h3 { font-size: 1rem; } .muted { color: #666; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.9rem; }
td, th { border-bottom: 1px solid #e3e3e3; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0.5rem 0; } figure svg { max-width: 100%; height: auto; max-height: 88vh; }
.cards { display: flex; gap: 0.8rem; flex-wrap: wrap; } .card { background: #f4f6fa; padding: 0.5rem 0.9rem;
  border-radius: 6px; } .card b { font-size: 1.3rem; display: block; }
details summary { cursor: pointer; }
"""


def _cell(value: object, key: str = "", numeric: bool = False, **data: str) -> str:
    attributes = "".join(f' data-{name}="{html.escape(str(value_))}"' for name, value_ in data.items())
    attributes += f' data-key="{key}"' if key else ""
    return f"<td{' class=n' if numeric else ''}{attributes}>{html.escape(str(value))}</td>"


def _fmt(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def render(class_dir: Path) -> str:
    rows = read_csv(class_dir / "scores.csv")
    stages = summarise(rows)
    cells = grade_cells(class_dir, sorted({row["assignment"] for row in rows if row.get("assignment")}))
    rates = pass_rates(rows, cells)
    causes = named_causes(class_dir, rows)
    groups = flagged_students(rows)
    students = {row["student"] for row in rows}
    parts = [f"<h1>Class report</h1><p class=muted>{html.escape(str(class_dir))}, written "
             f"{datetime.now():%Y-%m-%d %H:%M} from scores.csv ({len(rows)} rows).</p><div class=cards>"]
    cards = [("students", len(students)), ("graded notebooks", sum(s.students for s in stages.values())),
             ("written answers to grade", sum(s.pending for s in stages.values()))]
    cards += [(name, len({row["student"] for row in members})) for name, members in groups.items()]
    parts += [f"<div class=card data-key='{html.escape(name)}'><b>{count}</b>{html.escape(name)}</div>"
              for name, count in cards]
    parts.append("</div>")

    parts.append("<h2 id=distribution>Score distribution per stage</h2>")
    if stages:
        parts.append(f"<figure>{distribution_plot(stages)}</figure>")
        waiting = sum(stage.pending for stage in stages.values())
        if waiting:
            parts.append(f"<p class=muted>{waiting} graded notebooks still have written answers nobody graded: "
                         "their totals count those answers as 0 until they are graded "
                         "(python -m transformer_course.grading.answers export CLASS_DIR).</p>")
        parts.append("<table id=stages><tr><th>stage</th><th>graded</th><th>max points</th><th>mean total</th>"
                     "<th>median</th><th>lowest</th><th>highest</th><th>mean autograded</th><th>mean manual</th>"
                     "<th>answers to grade</th></tr>")
        for stage in stages.values():
            name = stage.assignment
            parts.append("<tr>" + "".join([
                _cell(name), _cell(stage.students, "students", True, stage=name),
                _cell(_fmt(stage.maximum), "max", True, stage=name),
                _cell(_fmt(stage.mean(stage.totals)), "mean_total", True, stage=name),
                _cell(_fmt(statistics.median(stage.totals)), "median_total", True, stage=name),
                _cell(_fmt(min(stage.totals)), "min_total", True, stage=name),
                _cell(_fmt(max(stage.totals)), "max_total", True, stage=name),
                _cell(_fmt(stage.mean(stage.autograded)), "mean_autograded", True, stage=name),
                _cell(_fmt(stage.mean(stage.manual)), "mean_manual", True, stage=name),
                _cell(stage.pending, "pending", True, stage=name)]) + "</tr>")
        parts.append("</table>")
    else:
        parts.append("<p>No graded notebooks yet.</p>")

    parts.append("<h2 id=checks>Pass rate of every check</h2><p class=muted>Share of graded students with the "
                 "check's full points. Written answers: mean score, and how many wait for a person.</p>")
    for assignment, entries in rates.items():
        if any(not entry["cell"].written for entry in entries):
            parts.append(f"<h3>{html.escape(assignment)}</h3><figure>{pass_rate_plot(assignment, entries)}</figure>")
        parts.append("<details><summary>the numbers</summary><table><tr><th>grade cell</th><th>checks</th>"
                     "<th>points</th><th>full points</th><th>of</th><th>pass rate</th><th>mean score</th>"
                     "<th>waiting</th></tr>")
        for entry in entries:
            cell = entry["cell"]
            rate = f"{100 * entry['passed'] / entry['students']:.0f}%" if entry["students"] else "-"
            parts.append("<tr>" + "".join([
                _cell(cell.grade_id), _cell(cell.title), _cell(_fmt(cell.points), numeric=True),
                _cell(entry["passed"], "passed", True, check=cell.grade_id),
                _cell(entry["students"], "students", True, check=cell.grade_id),
                _cell(rate, numeric=True), _cell(_fmt(entry["mean"]), "mean", True, check=cell.grade_id),
                _cell(entry["waiting"] if cell.written else "", "waiting", True, check=cell.grade_id)]) + "</tr>")
        parts.append("</table></details>")

    parts.append("<h2 id=causes>Most frequent named causes</h2><p class=muted>The \"likely cause\" of every "
                 "failed check, counted once per student.</p>")
    if causes:
        parts.append(f"<figure>{causes_plot(causes)}</figure><table><tr><th>likely cause</th><th>students</th>"
                     "<th>grade cells</th><th>who</th></tr>")
        for cause, where, who in causes:
            names = ", ".join(who)
            parts.append("<tr>" + _cell(cause) + _cell(len(who), "students", True, cause=cause)
                         + _cell(", ".join(where)) + f"<td><details><summary>{len(who)} students</summary>"
                         f"{html.escape(names)}</details></td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p>No check failed with a named cause.</p>")

    parts.append("<h2 id=students>Students to look at</h2>")
    for name, members in groups.items():
        parts.append(f"<h3>{html.escape(name)} ({len({row['student'] for row in members})})</h3>")
        if not members:
            parts.append("<p class=muted>none</p>")
            continue
        parts.append("<table><tr><th>student</th><th>name</th><th>assignment</th><th>status</th><th>reasons</th>"
                     "</tr>")
        for row in members:
            parts.append("<tr>" + "".join(_cell(row.get(key, "")) for key in
                                          ("student", "name", "assignment", "status", "reasons")) + "</tr>")
        parts.append("</table>")
    body = "".join(parts)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>Class report</title><style>{_STYLE}</style></head><body>{body}</body></html>")


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
