"""The fourth hostile class (quality/hostile_fourth) graded by the real batch command, in one run: each test asserts
a promise of issue 39 about hidden parts and time (website/instructor/threat-model.md, website/instructor/grading.md:
*Robustness*). Every attack broke its promise when the class was written: eve's later hidden parts read the first
one's q_len from /tmp and spelt it in base 3; frank's stopped, timed-out and failed hidden parts read three
different ways; stan's and tim's notebooks bought a full replay with every hidden part; sandy's storm was repeated.

One batch run (--jobs 2, a secret made for the run, the limits lowered: hostile_fourth.LIMITS) grades six students'
stage-2 notebooks: honest (the control), eve, frank, stan, tim and sandy.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from quality.hostile_fourth import ATTENTION, HIDDEN_CELLS, LIMITS, decode, write_class
from transformer_course.grading.sandbox import isolation

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group("hostile_fourth")
SLACK = 60  # seconds of the grader's own work on a notebook (its sandbox's start, nbgrader, its feedback), loaded


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """(rows by (student, assignment), the folder of the class)."""
    if isolation.bubblewrap_problem() is not None:
        pytest.skip(isolation.bubblewrap_problem())
    folder = tmp_path_factory.mktemp("hostile_fourth")
    write_class(folder / "submissions")
    done = subprocess.run([sys.executable, "-m", "transformer_course.grading.batch", str(folder / "submissions"),
                           "--class-dir", str(folder / "class"), "--assignment", ATTENTION,
                           "--jobs", "2", "--secret-file", str(folder / "keys" / "class.key"),
                           "--timeout", str(LIMITS["timeout"]), "--notebook-timeout", str(LIMITS["notebook_timeout"]),
                           "--memory-gb", str(LIMITS["memory_gb"])],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {(row["student"], row["assignment"]): row
            for row in csv.DictReader(open(folder / "class" / "scores.csv", encoding="utf-8-sig"))}
    return rows, folder / "class"


def hidden_outputs(class_dir: Path, student: str) -> dict[str, tuple[str, str] | None]:
    """{hidden grade cell: (ename, evalue) of its error, None when it passed} of the student's graded notebook."""
    notebook = nbformat.read(class_dir / "autograded" / student / ATTENTION / f"{ATTENTION}.ipynb", as_version=4)
    found = {}
    for cell in notebook.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in HIDDEN_CELLS:
            error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
            found[grade_id] = (error["ename"], error["evalue"]) if error is not None else None
    return found


def seconds(class_dir: Path, student: str) -> float:
    return json.loads((class_dir / "records" / f"{student}.json").read_text())["notebook_seconds"][ATTENTION]


def visible_cells_lost(rows: dict, student: str) -> dict[str, str]:
    """{visible grade cell: the student's points} for those that score less than the honest classmate's."""
    row, honest = rows[student, ATTENTION], rows["honest", ATTENTION]
    return {cell: row[cell] for cell in honest if cell.startswith("attn_") and cell not in HIDDEN_CELLS
            and honest[cell] != row[cell]}


# --- the control ------------------------------------------------------------------------------------------------


def test_an_honest_classmate_graded_beside_the_attackers_gets_full_points_and_no_flag(graded):
    rows, _ = graded
    row = rows["honest", ATTENTION]
    assert row["status"] == "graded" and row["notebook"] == "ok", row
    assert float(row["autograded"]) == float(row["autograded_max"]) > 0, row
    assert row["reasons"] == "", row  # no flag, no fault, no repair


def test_every_notebook_gets_a_row(graded):
    rows, _ = graded
    assert set(rows) == {(student, ATTENTION) for student in ("honest", "eve", "frank", "stan", "tim", "sandy")}
    assert all(row["status"] == "graded" for row in rows.values()), rows


# --- eve: hidden parts that talk through the sandbox's folders --------------------------------------------------


def test_no_hidden_part_reads_what_another_wrote(graded):
    """Eve's later hidden parts pass unless the first one's drop reaches them (then they spell its q_len, whose
    base-3 digits are not all 0): each hidden part starts with the sandbox's folders emptied."""
    rows, class_dir = graded
    outputs = hidden_outputs(class_dir, "eve")
    verdicts = [outputs[cell] is None for cell in HIDDEN_CELLS[1:]]
    assert decode(verdicts) is None, (f"the later hidden parts spelt {decode(verdicts)}", outputs)
    row = rows["eve", ATTENTION]
    assert float(row["autograded"]) == float(row["autograded_max"]), row  # her code is the honest one otherwise


# --- frank: stopped, out of time and failed read the same ---------------------------------------------------------


def test_a_stopped_a_timed_out_and_a_failed_hidden_part_read_the_same(graded):
    rows, class_dir = graded
    outputs = hidden_outputs(class_dir, "frank")
    assert all(outputs[cell] is not None for cell in HIDDEN_CELLS), outputs  # each one failed, one way or another
    words = {(ename, evalue.split("(hidden test): ", 1)[-1]) for ename, evalue in outputs.values()}
    assert len(words) == 1, words  # only the properties' names differ, and they are the grade cells'
    assert all(evalue.startswith("✘ ") and "(hidden test): fails on the hidden test's inputs" in evalue
               for _, evalue in outputs.values()), outputs
    reasons = rows["frank", ATTENTION]["reasons"]  # the instructor is told what happened
    assert "attn_sdpa_hidden) did not finish: stopped" in reasons, reasons
    assert f"attn_masks_hidden) did not finish: ran longer than {LIMITS['timeout']} s" in reasons, reasons
    assert visible_cells_lost(rows, "frank") == {}


# --- stan and tim: one deadline per notebook ------------------------------------------------------------------------


def test_a_hidden_part_that_ends_its_sandbox_fails_the_rest_instead_of_buying_replays(graded):
    rows, class_dir = graded
    row = rows["stan", ATTENTION]
    assert all(float(row[cell]) == 0 for cell in HIDDEN_CELLS), row
    assert row["reasons"].count("an earlier hidden test of this notebook ended the notebook's processes") == 4, row
    assert visible_cells_lost(rows, "stan") == {}, row  # his visible cells, sleeps and all, are graded as usual
    assert seconds(class_dir, "stan") < LIMITS["notebook_timeout"] + SLACK, seconds(class_dir, "stan")


def test_replays_count_against_the_notebooks_deadline(graded):
    """Tim's hidden parts each run out of time: the grader ends the sandbox and replays the notebook, sleeps
    included, until the notebook's one deadline (which covers its visible cells, replays and hidden parts) has
    passed; the rest is not run. Without it, five replays took about four times the deadline."""
    rows, class_dir = graded
    row = rows["tim", ATTENTION]
    assert all(float(row[cell]) == 0 for cell in HIDDEN_CELLS), row
    ran_out = r"not run: the notebook.s \d+ (s|minutes) in all had run out \(hidden tests\)"
    assert re.search(ran_out, row["reasons"]), row
    assert seconds(class_dir, "tim") < LIMITS["notebook_timeout"] + SLACK, seconds(class_dir, "tim")


# --- sandy: a storm costs only its own exercise ---------------------------------------------------------------------


def test_a_storm_costs_only_its_own_cells(graded):
    """Sandy fills /tmp, /dev/shm and the working folder and takes memory until her process is ended, in an
    ordinary cell and in make_padding_mask's hidden part: every other exercise of hers keeps its points."""
    rows, _ = graded
    row, honest = rows["sandy", ATTENTION], rows["honest", ATTENTION]
    lost = {cell: row[cell] for cell in honest if cell.startswith("attn_") and honest[cell] != row[cell]}
    assert lost == {"attn_masks_hidden": "0.0"}, lost
    assert "did not finish: crashed" in row["reasons"], row  # the storm's ordinary cell, named
