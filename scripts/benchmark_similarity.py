"""What the near-copies list of the class report costs (grading/outputs/similarity.py), for a class of N students
handing in all eight stages.

    python scripts/benchmark_similarity.py [--students 8 150] [--repeat 3]

Two costs, in CPU seconds of this process (`time.process_time`), the median of --repeat runs:
- intake: normalising one notebook's exercise cells and written answers (the batch command does it once per notebook
  graded, in its own process, while it reads the download);
- comparison: fingerprinting every cell of every student's notebooks with copydetect and comparing the pairs that
  share a fingerprint, per stage and cell, against the reference (what the batch command does once per run, after
  grading, for the whole term), plus importing copydetect (once per run).

The class is a worst case for the comparison: its students are the honest class's three styles and the reference
pasted with its names changed, repeated, each made distinct by a line (and a word) of its own in every cell, so every
student's cell shares most of its fingerprints with a quarter of the class or more and every such pair is compared
in full. (Students whose normalised cells are identical cost one fingerprint between them: `--identical` measures
that class.) Cells too short to tell are not compared, as in grading.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from quality.honest import STAGES, STYLES, student_notebook  # noqa: E402
from quality.honest.written import WRITTEN  # noqa: E402
from quality.similarity import paste  # noqa: E402
from transformer_course.grading.outputs import similarity  # noqa: E402


def notebooks(stage: str) -> list[nbformat.NotebookNode]:
    """The four kinds of student of a stage: three honest styles (with their written answers) and a paste."""
    released = nbformat.read(ROOT / "notebooks" / stage / f"{stage}.ipynb", as_version=4)
    solution = nbformat.read(ROOT / "solutions" / stage / f"{stage}.ipynb", as_version=4)
    found = []
    for style in STYLES:
        notebook = student_notebook(style, stage, released)
        for cell in notebook.cells:
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if cell.cell_type == "markdown" and grade_id in WRITTEN[style]:
                cell.source = WRITTEN[style][grade_id]
        found.append(notebook)
    pasted = nbformat.reads(nbformat.writes(released), as_version=4)
    solved = similarity.compared_cells(solution)
    for grade_id, cell in similarity.compared_cells(pasted).items():
        if cell.cell_type == "code":
            cell.source = paste(similarity._SOLUTION_MARKERS.sub("", solved[grade_id].source), cell.source)
    found.append(pasted)
    return found


def distinct(text: str, number: int, written: bool) -> str:
    """TEXT made this student's own: a word (a written answer) or a line (code) nobody else has."""
    return f"{text} student{number}" if written else f"{text}\nv = {number}"


def run(students: int, identical: bool = False) -> dict[str, float]:
    submissions: dict[tuple[str, str], dict[str, str]] = {}
    references, boilerplate, written = {}, {}, set()
    intake = []
    for stage in STAGES:
        released = nbformat.read(ROOT / "notebooks" / stage / f"{stage}.ipynb", as_version=4)
        solution = nbformat.read(ROOT / "solutions" / stage / f"{stage}.ipynb", as_version=4)
        kinds = notebooks(stage)
        for number in range(students):
            start = time.process_time()
            texts = similarity.normalised_cells(kinds[number % len(kinds)], released)
            intake.append(time.process_time() - start)
            for grade_id, text in texts.items():
                written_cell = similarity.compared_cells(released)[grade_id].cell_type == "markdown"
                submissions.setdefault((stage, grade_id), {})[f"student{number:03d}"] = (
                    text if identical else distinct(text, number, written_cell))
        references.update({(stage, g): t for g, t in similarity.reference_cells(solution).items()})
        boilerplate.update({(stage, g): t for g, t in similarity.boilerplate_cells(released).items()})
        written |= {(stage, g) for g, c in similarity.compared_cells(released).items() if c.cell_type == "markdown"}
    start = time.process_time()
    findings = similarity.compare(submissions, {key: references[key] for key in submissions}, boilerplate,
                                  similarity.calibration(), written)
    comparison = time.process_time() - start
    return {"intake_per_notebook": statistics.median(intake), "comparison": comparison,
            "groups": len(findings.groups)}


def import_seconds() -> float:
    """Importing copydetect (and with it matplotlib.pyplot) in a fresh process, CPU seconds."""
    code = ("import time; s = time.process_time(); import copydetect; print(time.process_time() - s)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, nargs="+", default=[8, 150])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--identical", action="store_true", help="students of a kind hand in identical cells")
    arguments = parser.parse_args(argv)
    load = open("/proc/loadavg").read().split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"load average before: {load}")
    imports = statistics.median(import_seconds() for _ in range(arguments.repeat))
    print(f"import copydetect: {imports:.2f} s of CPU (once per batch run)")
    for students in arguments.students:
        runs = [run(students, arguments.identical) for _ in range(arguments.repeat)]
        intake = statistics.median(r["intake_per_notebook"] for r in runs)
        comparison = statistics.median(r["comparison"] for r in runs)
        print(f"{students} students x {len(STAGES)} stages: intake {intake * 1000:.1f} ms of CPU per notebook "
              f"({intake * students * len(STAGES):.2f} s for the class), comparison {comparison:.2f} s of CPU "
              f"({runs[0]['groups']} groups of near-copies); median of {arguments.repeat}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
