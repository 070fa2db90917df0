"""The batch grading command on a class as an instructor receives it: correct, blank, buggy,
metadata-stripped, cell-deleted, broken, looping and hostile submissions, and two students who try to
take a classmate's place, graded by real nbgrader in sandboxed kernels, two at a time. Everyone gets a
score or a clear reason under their own name; nothing leaks."""

import csv
import html as htmllib
import json
import re
import shutil
import sqlite3

import nbformat
import pytest

from conftest import ASSIGNMENTS, ROOT, read, solution_path
from quality.examples import write_example_class
from transformer_course.grading.classroom.batch import BatchGrader, main
from transformer_course.grading.intake.identities import Identity
from transformer_course.grading.intake.submissions import Release
from transformer_course.grading.sandbox.isolation import bubblewrap_problem

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example_class")]  # one worker: shared fixtures
ASSIGNMENT = "02_attention"
needs_bubblewrap = pytest.mark.skipif(bubblewrap_problem() is not None,
                                      reason=f"no sandbox here: {bubblewrap_problem()}")
ADA_IN_CAPITALS = f"ada-{Identity('', '', 'ADA', 'ADA').digest}"  # the id of the folder ADA beside ada


@pytest.fixture(scope="module")
def graded(graded_example_class):
    return graded_example_class  # graded once per session (conftest), shared with the report's tests


def outputs(grader, student):
    notebook = nbformat.read(grader.class_dir / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb",
                             as_version=4)
    return [(cell.source, output) for cell in notebook.cells for output in cell.get("outputs", [])]


def test_every_student_gets_a_score_or_a_reason(graded):
    _, students, rows, _ = graded
    assert set(rows) == {"ada", "blake", "chen", "dana_12345", "eve", "finn", "gus", "hana",  # dana: Canvas user 12345
                         "mallory", ADA_IN_CAPITALS}
    for name, row in rows.items():
        assert row["total"] or row["reasons"], f"{name} has neither a score nor a reason: {row}"
    assert {name for name, result in students.items() if result.status == "graded"} == set(rows) - {"finn"}


def test_scores_reflect_the_work(graded):
    _, _, rows, _ = graded
    full = float(rows["ada"]["autograded_max"])  # written answers wait for a person (test_written_answers)
    assert full > 0 and float(rows["ada"]["autograded"]) == full
    assert float(rows["blake"]["total"]) == 0
    assert 0 < float(rows["chen"]["autograded"]) < full


def test_a_file_or_folder_named_after_a_classmate_takes_nobodys_place(graded):
    """mallory's file is named as Canvas names dana's, in mallory's own folder; the folder ADA differs
    from ada's only by case. Both are blank and handed in later, so before issue 19 each replaced the
    classmate's notebook as the newer one of the same student. Now each is a student of their own,
    graded on their own notebook, and the classmates keep their marks and their ids."""
    grader, _, rows, _ = graded
    full = float(rows["ada"]["autograded_max"])
    for victim, impostor, file in (("dana_12345", "mallory", f"mallory/dana_12345_67890_{ASSIGNMENT}.ipynb"),
                                   ("ada", ADA_IN_CAPITALS, f"ADA/{ASSIGNMENT}.ipynb")):
        assert float(rows[victim]["autograded"]) == full and rows[victim]["file"] != file, rows[victim]
        assert rows[impostor]["file"] == file and float(rows[impostor]["autograded"]) == 0, rows[impostor]
        assert (grader.class_dir / "feedback" / impostor / ASSIGNMENT / f"{ASSIGNMENT}.html").exists()
        assert "two notebooks" not in rows[victim]["reasons"] + rows[impostor]["reasons"]
    assert (rows["mallory"]["name"], rows["mallory"]["lms_id"], rows[ADA_IN_CAPITALS]["name"]) == ("mallory", "", "ADA")
    assert ADA_IN_CAPITALS in rows["ada"]["reasons"] and "reads the same" in rows[ADA_IN_CAPITALS]["reasons"]


def test_stripped_metadata_and_deleted_test_cells_are_restored_not_zeroed(graded):
    _, _, rows, _ = graded
    for name in ("dana_12345", "eve"):
        assert float(rows[name]["autograded"]) == float(rows["ada"]["autograded_max"]), rows[name]
        assert "rebuilt from the released notebook" in rows[name]["reasons"]
    assert "missing or lost its nbgrader metadata" in rows["dana_12345"]["reasons"]


def test_broken_notebook_is_rejected_with_a_reason_and_originals_are_untouched(graded):
    _, _, rows, originals = graded
    assert rows["finn"]["status"] == "rejected"
    assert "not a valid notebook" in rows["finn"]["reasons"]
    assert all(path.read_bytes() == content for path, content in originals.items())


def test_a_runaway_loop_costs_only_its_cell(graded):
    grader, _, rows, _ = graded
    assert float(rows["gus"]["autograded"]) == float(rows["ada"]["autograded_max"])
    errors = [output.ename for source, output in outputs(grader, "gus") if output.output_type == "error"]
    assert "CellTimeoutError" in errors or "KeyboardInterrupt" in errors


def test_hostile_submission_crashes_and_bombs_cost_only_their_cells(graded):
    grader, _, rows, _ = graded
    assert float(rows["hana"]["autograded"]) == float(rows["ada"]["autograded_max"])
    cells = outputs(grader, "hana")
    died = [o for source, o in cells if "os._exit" in source and o.output_type == "error"]
    assert died and died[0].ename == "KernelDied"
    bomb = [o for source, o in cells if "bytearray(64" in source and o.output_type == "error"]
    assert bomb and bomb[0].ename == "MemoryError"
    flood = [o for source, o in cells if "spam" in source and o.output_type == "stream"]
    assert flood and len(flood[0].text) < 25_000 and "cut by the grader" in flood[0].text


@needs_bubblewrap
def test_hostile_submission_cannot_read_others_write_the_gradebook_or_reach_the_network(graded):
    grader, _, _, _ = graded
    printed = "".join(o.get("text", "") for source, o in outputs(grader, "hana") if "HISTORY" not in source)
    assert "LEAKED: []" in printed, printed[:2000]
    assert "GRADER ENVIRONMENT: []" in printed and "do-not-leak" not in printed
    assert "gradebook write blocked" in printed and "WROTE GRADEBOOK" not in printed
    assert "network blocked: []" in printed and "NETWORK REACHED" not in printed
    assert "disk full in . after" in printed and "disk full in /tmp after" in printed


def test_the_hostile_student_leaves_the_others_and_the_gradebook_untouched(graded):
    """Her symlinks, her threads re-patching the checks and her crashes change nothing for anyone
    else: no link anywhere in the class folder, the gradebook is a sound database, the honest
    students have full marks in it and feedback of their own."""
    grader, _, rows, _ = graded
    links = [path for path in grader.class_dir.rglob("*") if path.is_symlink()]
    assert not links, links
    gradebook = grader.class_dir / "gradebook.db"
    with sqlite3.connect(gradebook) as database:
        assert database.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    for name in ("ada", "dana_12345", "eve", "gus"):  # written answers wait for the instructor
        assert float(rows[name]["autograded"]) == float(rows[name]["autograded_max"]), (name, rows[name]["reasons"])
        feedback = grader.class_dir / "feedback" / name / ASSIGNMENT / f"{ASSIGNMENT}.html"
        assert feedback.is_file() and name not in ("hana",) and "hana" not in feedback.read_text()


def test_nothing_the_hostile_student_starts_outlives_her_grading(graded):
    """Her daemon, her zombies and her busy threads end with her grading; nothing of hers runs on the host."""
    import subprocess

    running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "while True: time.sleep(0.1)" not in running


def test_her_outputs_are_text_and_pictures_only(graded):
    """HTML, JavaScript and Markdown she displays are dropped, terminal escapes taken out: the formgrader shows
    these outputs on the instructor's logged-in page."""
    grader, _, _, _ = graded
    for source, output in outputs(grader, "hana"):
        data = output.get("data", {})
        assert set(data) <= {"text/plain", "image/png", "image/jpeg"}, (source[:80], set(data))
        text = output.get("text", "") + data.get("text/plain", "") + output.get("evalue", "")
        assert "\x1b" not in text and "\x07" not in text


def test_feedback_for_every_graded_student_without_hidden_tests(graded):
    grader, students, _, _ = graded
    solution = nbformat.read(ROOT / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    hidden_lines = [line for cell in solution.cells if "BEGIN HIDDEN TESTS" in cell.source
                    for line in cell.source.splitlines() if line.startswith("assert")]
    for name, result in students.items():
        if result.status != "graded":
            continue
        html = (grader.class_dir / "feedback" / name / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
        assert len(html) < 2_000_000
        text = htmllib.unescape(re.sub(r"<[^>]+>", "", html))  # code is split into highlighted spans
        assert not any(line.split("(", 1)[1][:50] in text for line in hidden_lines), f"{name}: hidden test in feedback"


def test_second_run_resumes_without_regrading(graded, capsys):
    grader, _, _, _ = graded
    again = BatchGrader(ROOT, grader.class_dir, grader.submissions, jobs=2, timeout=30,
                        assignment_ids=[ASSIGNMENT], sandbox=grader.sandbox)
    students = again.run()
    assert {result.status for name, result in students.items() if name != "finn"} == {"skipped"}


def test_shards_share_one_gradebook(tmp_path):
    submissions = tmp_path / "downloads"
    for name in ("ada", "blake", "chen"):
        source = ROOT / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        (submissions / name).mkdir(parents=True)
        shutil.copy(source, submissions / name / f"{ASSIGNMENT}.ipynb")
    db_url = f"sqlite:///{tmp_path / 'shared.db'}"
    seen = set()
    for shard in ("1/2", "2/2"):
        main([str(submissions), "--class-dir", str(tmp_path / f"machine{shard[0]}"), "--db-url", db_url,
              "--shard", shard, "--assignment", ASSIGNMENT, "--jobs", "2"])
        records = (tmp_path / f"machine{shard[0]}" / "records").glob("*.json")
        graded_here = {path.stem for path in records if json.loads(path.read_text())["status"] == "graded"}
        assert not graded_here & seen, "a student was graded by two shards"
        seen |= graded_here
    assert seen == {"ada", "blake", "chen"}
    with open(tmp_path / "machine2" / "scores.csv", encoding="utf-8-sig") as handle:
        assert {row["student"] for row in csv.DictReader(handle)} >= {"ada", "blake", "chen"}
    # a UTF-8 byte-order mark first, once: Excel then reads the file as UTF-8 (umlauts in names stay whole)
    raw = (tmp_path / "machine2" / "scores.csv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfstudent,") and raw.count(b"\xef\xbb\xbf") == 1


def test_self_check_summary_agrees_with_the_grade(graded):
    """The last cell's summary (what a Colab student sees) is all green exactly when marks are full."""
    grader, _, rows, _ = graded
    for name in ("ada", "chen", "blake"):
        printed = [o.get("text", "") or o.get("data", {}).get("text/plain", "")  # printed, or displayed
                   for source, o in outputs(grader, name) if "check.summary()" in source]
        assert printed, f"{name}: the summary cell printed nothing"
        all_green = "✘" not in printed[-1]
        full_marks = float(rows[name]["autograded"]) == float(rows[name]["autograded_max"])
        assert all_green == full_marks, (name, printed[-1][-300:])


def test_each_stage_is_recognised_by_its_own_cells_then_its_title():
    release = Release(ROOT / "notebooks", ASSIGNMENTS)
    for assignment in ASSIGNMENTS:
        notebook = read(solution_path(assignment))
        assert release.identify(notebook, "download.ipynb") == assignment  # "setup" is in every stage
        for cell in notebook.cells:
            cell.metadata.pop("nbgrader", None)  # Colab-stripped: the "# Stage N" title decides
        assert release.identify(notebook, "download.ipynb") == assignment


def test_no_honest_student_is_flagged_for_review(graded):
    """The hostile student is not flagged either: the static scan that flagged her lines was removed (issue 39,
    website/instructor/threat-model.md, *No static scan*); what she did cost her nothing but her own cells."""
    _, _, rows, _ = graded
    assert "flagged for review" not in rows["hana"]["reasons"]
    for name in ("ada", "blake", "chen", "dana_12345", "eve", "gus"):
        # honest work carries no flag: not the blank notebook, not the published solution typed into the
        # notebook (ada, and chen's correct functions): only code made from the course's reference while the
        # notebook runs is laundering (test_boundary.py), and copying is a plagiarism checker's question
        assert "flagged for review" not in rows[name]["reasons"], (name, rows[name]["reasons"])


def test_the_grader_fetches_multi30k_for_the_sandboxed_kernels(multi30k, tmp_path, monkeypatch):
    """Kernels have no network: the grader provides the data folder (here from its cache) to them."""
    from transformer_course.data import multi30k

    cache = tmp_path / "cache"
    shutil.copytree(multi30k.file_path("train", "de").parent, cache / "transformer_course" / "multi30k")
    monkeypatch.delenv(multi30k.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    grader = BatchGrader(ROOT, tmp_path / "class", tmp_path / "downloads", jobs=1)
    assert grader.provide_data(["01_positional_encoding"]) is None  # this stage reads no data
    for reader in ("05_training", "06_decoding"):  # loads the data directly; through the translation helpers
        assert grader.provide_data([reader]) == str(cache / "transformer_course" / "multi30k")


def test_no_multi30k_for_the_kernels_is_said_loudly(tmp_path, monkeypatch, capsys):
    from transformer_course.data import multi30k

    def offline(name, *arguments, **keywords):
        raise multi30k.DataUnavailable("Could not download (offline)")

    monkeypatch.delenv(multi30k.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(multi30k, "_download", offline)
    grader = BatchGrader(ROOT, tmp_path / "class", tmp_path / "downloads", jobs=1)
    assert grader.provide_data(["05_training"]) is None
    assert "WARNING: Multi30k is not available" in capsys.readouterr().err


def test_a_machine_where_no_kernel_starts_stops_the_batch_with_the_cause(tmp_path, capsys):
    """Better one clear error than a class of 'failed' rows: with 0.3 GB of address space torch cannot
    even be imported, so the preflight kernel fails and nobody is graded."""
    submissions = tmp_path / "downloads"
    write_example_class(ROOT, submissions, "01_positional_encoding", tmp_path / "class", submissions)
    code = main([str(submissions), "--class-dir", str(tmp_path / "class"), "--assignment", "01_positional_encoding",
                 "--memory-gb", "0.3", "--jobs", "1"])
    error = capsys.readouterr().err
    assert code == 2 and "runner cannot start" in error and "nobody was graded" in error, error
    assert not (tmp_path / "class" / "scores.csv").exists()
    assert not (tmp_path / "class" / "autograded" / ".preflight").exists()


def test_where_sandboxes_start_the_start_up_test_never_runs(graded):
    """Every worker starts its sandbox before grading and says when it could not; only then does the batch run
    its start-up test (the test above shows that path). A class graded normally costs no test."""
    grader, _, _, _ = graded
    assert grader.start_up is None


def test_the_tests_sharing_the_graded_class_stay_on_one_worker(request):
    """Under `make test` (pytest-xdist, --dist loadgroup) this module's tests carry their group, so the
    example class is graded once, not once per worker (pytest 9 broke this: xdist's suffix was ignored)."""
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@example_class"), request.node.nodeid


FAKE_WORKER = """
import sys, time
if sys.stdin.readline().strip() != "go":
    sys.exit(3)
time.sleep(float(sys.argv[1]))
print("visible", time.time(), file=sys.stderr, flush=True)
if sys.argv[2] == "fail":
    sys.exit(1)
print("visible-done", flush=True)
sys.stdin.readline()
print("hidden", time.time(), file=sys.stderr, flush=True)
print('{"done": true}')
"""


def _talk_to_fakes(tmp_path, plan: list[tuple[float, str]]) -> list[tuple[str, str]]:
    """(standard output, standard error) of fake workers, one per (seconds of visible cells, 'ok' or 'fail'),
    talked to as the batch talks to the workers grading one student (BatchGrader._talk), at the same time."""
    import subprocess
    import sys
    import threading
    import time
    from types import SimpleNamespace

    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    barrier, results = threading.Barrier(len(plan)), {}

    def talk(number: int, seconds: float, outcome: str) -> None:
        with subprocess.Popen([sys.executable, str(script), str(seconds), outcome], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
            try:
                results[number] = BatchGrader._talk(SimpleNamespace(sandbox_per_notebook=False), process, True,
                                                    barrier, time.monotonic() + 60)
            finally:
                barrier.abort()

    threads = [threading.Thread(target=talk, args=(number, *step)) for number, step in enumerate(plan)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return [results[number] for number in range(len(plan))]


def _times(stderr: str, kind: str) -> list[float]:
    return [float(line.split()[1]) for line in stderr.splitlines() if line.startswith(kind + " ")]


def test_no_hidden_part_runs_before_every_worker_of_the_student_has_run_its_visible_cells(tmp_path):
    """A student's notebooks split between two workers: the quick one waits at the barrier until the slow one's
    visible cells have all run, so that nothing a hidden part does can reach the other worker's visible outputs
    (not even through the time it takes)."""
    talks = _talk_to_fakes(tmp_path, [(0.1, "ok"), (1.5, "ok")])
    visible = [t for _, stderr in talks for t in _times(stderr, "visible")]
    hidden = [t for _, stderr in talks for t in _times(stderr, "hidden")]
    assert len(visible) == 2 and len(hidden) == 2, talks
    assert min(hidden) >= max(visible), (visible, hidden)
    assert all(json.loads(stdout.splitlines()[-1]) == {"done": True} for stdout, _ in talks)


def test_a_worker_that_fails_before_the_barrier_holds_nobody_up(tmp_path):
    import time

    started = time.monotonic()
    talks = _talk_to_fakes(tmp_path, [(0.1, "ok"), (0.5, "fail")])
    assert time.monotonic() - started < 30
    assert _times(talks[0][1], "hidden") and json.loads(talks[0][0].splitlines()[-1]) == {"done": True}
    assert not _times(talks[1][1], "hidden")


def test_without_a_sandbox_nobody_is_graded_unless_the_instructor_says_no_sandbox(tmp_path, capsys, monkeypatch):
    """Secure by default: where bubblewrap cannot isolate (here: told it cannot), the command says why and
    stops with exit status 2 before any notebook runs; only `--no-sandbox`, said by name, grades unconfined."""
    import transformer_course.grading.classroom.batch as batch
    monkeypatch.setattr(batch, "bubblewrap_problem", lambda: "bubblewrap (`bwrap`) is not installed")
    submissions = tmp_path / "downloads"
    write_example_class(ROOT, submissions, "01_positional_encoding", tmp_path / "class", submissions)
    code = main([str(submissions), "--class-dir", str(tmp_path / "class"), "--assignment", "01_positional_encoding",
                 "--jobs", "1"])
    error = capsys.readouterr().err
    assert code == 2, error
    assert "cannot be isolated here: bubblewrap (`bwrap`) is not installed" in error and "--no-sandbox" in error
    assert not (tmp_path / "class" / "scores.csv").exists() and not (tmp_path / "class" / "autograded").exists()


def test_a_cell_that_did_not_finish_is_named_in_the_row_and_the_report(graded):
    """gus's exercise cell loops forever: the row names that cell and why, honest students' rows name none,
    and the class report lists gus among the rows that need a person."""
    from transformer_course.grading.outputs.report import needs

    _, _, rows, _ = graded
    stopped = r"cell \d+ \(\w+\) did not finish: ran longer than \d+ s and was stopped"
    assert re.search(stopped, rows["gus"]["reasons"]), rows["gus"]["reasons"]
    assert "cells that did not finish" in needs(rows["gus"])
    assert all("did not finish" not in rows[name]["reasons"] for name in ("ada", "blake", "chen", "dana_12345"))
