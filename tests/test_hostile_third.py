"""The third hostile class (quality/hostile_third) graded by the real batch command, in one run: each test asserts
a promise of issue 29 (README, *Grading a class*). Both attacks that broke their promise when the class
was written (a regrade alone carrying the hidden input through the clock; a later notebook's build handing the
reference to an earlier notebook's hidden part through /tmp) hold since every notebook has a sandbox of its own
and nothing is graded again alone.

One batch run (--jobs 2, a secret made for the run, stages 1 and 2) grades three students:
    honest   stages 1 and 2, honest work: the control
    mallory  stage 1: ends its own runner in an ungraded cell to be graded again alone, after its hidden parts,
             and leaks the hidden seq_len through the wall clock into the regraded notebook's feedback
    trudy    stages 1 and 2: the stage-2 notebook shelves stage 1's reference (from its own build) in /tmp for
             the stage-1 notebook's hidden parts, which run later in the same sandbox
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from quality.hostile_third import HOLD, honest, write_class
from transformer_course.grading.sandbox import executor, hidden_inputs, isolation, profiling

ROOT = Path(__file__).resolve().parents[1]
PE, ATTENTION = "01_positional_encoding", "02_attention"
pytestmark = pytest.mark.xdist_group("hostile_third")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """(rows by (student, assignment), the folder of the class, the secret, each student's profile: the grader's
    phases as its workers recorded them, `profiling`'s format, one line per worker)."""
    if isolation.bubblewrap_problem() is not None:
        pytest.skip(isolation.bubblewrap_problem())
    folder = tmp_path_factory.mktemp("hostile_third")
    write_class(folder / "submissions")
    secret_file = folder / "keys" / "class.key"
    profile = folder / "profile.jsonl"  # the workers record when each phase of the grading began
    done = subprocess.run([sys.executable, "-m", "transformer_course.grading.batch", str(folder / "submissions"),
                           "--class-dir", str(folder / "class"), "--assignment", PE, "--assignment", ATTENTION,
                           "--jobs", "2", "--secret-file", str(secret_file)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, profiling.ENVIRONMENT_VARIABLE: str(profile)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {(row["student"], row["assignment"]): row
            for row in csv.DictReader(open(folder / "class" / "scores.csv", encoding="utf-8-sig"))}
    profiles: dict[str, list[dict]] = {}
    for line in profile.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        profiles.setdefault(entry["student"], []).append(entry)
    return rows, folder / "class", hidden_inputs.read_secret(secret_file), profiles


def points(row: dict, cell: str) -> float:
    return float(row[cell] or 0)


# --- the control ------------------------------------------------------------------------------------------------


def test_an_honest_classmate_graded_beside_the_attackers_gets_full_points_and_no_flag(graded):
    rows, _, _, _ = graded
    for assignment in (PE, ATTENTION):
        row = rows["honest", assignment]
        assert row["status"] == "graded" and row["notebook"] == "ok", row
        assert float(row["autograded"]) == float(row["autograded_max"]) > 0, row
        assert row["reasons"] == "", row  # no flag, no fault, no repair


def test_every_notebook_gets_a_row(graded):
    rows, _, _, _ = graded
    assert set(rows) == {("honest", PE), ("honest", ATTENTION), ("mallory", PE), ("trudy", PE),
                         ("trudy", ATTENTION)}
    assert all(row["status"] == "graded" for row in rows.values()), rows


# --- mallory: graded again alone on her own say-so, after her hidden parts ------------------------------------


def _clock(class_dir: Path) -> tuple[float, float]:
    page = (class_dir / "feedback" / "mallory" / PE / f"{PE}.html").read_text(encoding="utf-8")
    found = re.search(r"CLOCK ([0-9.]+) SANDBOX_STARTED ([0-9.-]+)", page)
    assert found, "the clock cell's output is not in the feedback"
    return float(found.group(1)), float(found.group(2))


def test_a_fault_of_her_own_costs_mallory_only_that_cell(graded):
    """Held (promise 5): the ungraded cell that ends its runner is named in the reasons, every grade cell scores."""
    rows, _, _, _ = graded
    row = rows["mallory", PE]
    assert float(row["autograded"]) == float(row["autograded_max"]), row
    assert "did not finish: crashed" in row["reasons"], row


def test_no_output_mallory_is_shown_was_made_after_her_hidden_part_ran(graded):
    """Every output a student is shown must be made before a hidden input reaches their code. Mallory's first cell
    prints when it ran and when the sandbox running it started; her worker records when her first hidden part began
    (`profiling`'s phase "hidden tests", on the same wall clock). Both times must come before it: had her feedback
    come from a runner or a sandbox (re)started after her hidden part (a replay or a regrade whose outputs were kept),
    the clock it shows would have been read after her hidden part, which sleeps HOLD s and then until the clock's
    second modulo PERIOD is the hidden seq_len. The times are the grader's and the sandbox's own, so the test does not
    depend on when the batch got round to her notebook (another student's, the gradebook's set-up, the load)."""
    _, class_dir, secret, profiles = graded
    clock, sandbox_started = _clock(class_dir)
    assert sandbox_started > 0, "the clock cell could not read when its sandbox started"
    workers = profiles["mallory"]
    hidden_began = min(worker["first_started"]["hidden tests"] for worker in workers
                       if "hidden tests" in worker["first_started"])
    hidden_seconds = sum(worker["phases"]["hidden tests"][0] for worker in workers
                         if "hidden tests" in worker["phases"])
    hidden = executor.parse_grade_cell(_hidden_cell("pe_forward_hidden"))[1][0]
    drawn, _ = hidden_inputs.draw(hidden, secret, "transformer_course.checks.positional_encoding:pe_forward_hidden:0")
    seq_len = dict(drawn.kwargs)["seq_len"]
    print(f"hidden seq_len {seq_len}; relative to the start of mallory's first hidden part: the sandbox whose outputs "
          f"she is shown started at {sandbox_started - hidden_began:+.1f} s, her clock cell ran at "
          f"{clock - hidden_began:+.1f} s; her hidden parts took {hidden_seconds:.1f} s")
    assert hidden_seconds >= HOLD, "the attack did not run: her hidden part did not see the hidden call and sleep"
    assert clock < hidden_began, "an output she is shown was made after her hidden part began"
    assert sandbox_started < hidden_began, "the sandbox whose outputs she is shown started after her hidden part began"


def _hidden_cell(grade_id: str) -> str:
    solution = json.loads((ROOT / "solutions" / PE / f"{PE}.ipynb").read_text(encoding="utf-8"))
    return next("".join(cell["source"]) for cell in solution["cells"]
                if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)


# --- trudy: the reference of stage 1 shelved by her stage-2 notebook ------------------------------------------


def test_trudys_absent_work_fails_its_visible_checks(graded):
    """The control inside the attack: with no shelf (the stage-1 notebook's visible cells run before the stage-2
    notebook's), the table of zeros fails the visible table check."""
    rows, _, _, _ = graded
    assert points(rows["trudy", PE], "pe_table_values") == 0, rows["trudy", PE]


def test_absent_work_earns_no_hidden_points_from_another_notebooks_build(graded):
    rows, _, _, _ = graded
    assert points(rows["trudy", PE], "pe_table_values_hidden") == 0, rows["trudy", PE]


def test_the_shelving_notebook_itself_is_graded_as_its_own_work(graded):
    rows, _, _, _ = graded
    row = rows["trudy", ATTENTION]
    assert float(row["autograded"]) == float(row["autograded_max"]), row


# --- promise 6: no sandbox, no grading --------------------------------------------------------------------------


def test_the_batch_refuses_to_grade_without_bubblewrap(tmp_path):
    """Held (promise 6): with no bwrap on the PATH and no --no-sandbox, nobody is graded (exit status 2)."""
    write_class(tmp_path / "submissions", {"honest": {PE: lambda: honest(PE)}})
    environment = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    done = subprocess.run([sys.executable, "-m", "transformer_course.grading.batch", str(tmp_path / "submissions"),
                           "--class-dir", str(tmp_path / "class"), "--assignment", PE,
                           "--secret-file", str(tmp_path / "keys" / "class.key")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert not (tmp_path / "class" / "scores.csv").exists() or "graded" not in (
        tmp_path / "class" / "scores.csv").read_text(encoding="utf-8")
