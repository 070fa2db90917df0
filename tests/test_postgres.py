"""A class graded by two machines at once against one real PostgreSQL gradebook.

A throwaway server (tests/postgres_server.py) holds the gradebook. The two machines are two tasks of
a Slurm job array, run here as two processes of the course's own recipe (autograde/cluster/slurm.sbatch)
with Slurm's variables set, each with its own class folder. Task 1 is killed half-way (after its first
student) and started again, as Slurm does when it requeues a task. Then: the scores equal those of a
single-machine run; the restarted task regraded none of the students it had finished; the gradebook
and scores.csv hold no duplicate; and scores.csv, written by either machine, lists every student.

Then the same class through the Slurm recipe as the instructor's guide gives it (website/instructor/cluster.md),
on a single-node Slurm cluster started by the test (tests/slurm_cluster.py): the job array and the final scores
job, whose scores.csv must equal the single-machine run's.

Cost: one cheap stage (01_positional_encoding), four students: about a minute on two cores for the two
machines, and about as much for the Slurm run. Outside CI a machine without PostgreSQL (or psycopg2), or
without Slurm, skips with the reason; in CI (CI=true) that is a failure."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import nbformat
import pytest

from conftest import ROOT
from postgres_server import PostgresServer, unavailable
from quality.examples import student_submissions
from slurm_cluster import SlurmCluster
from slurm_cluster import unavailable as slurm_unavailable
from transformer_course.grading.classroom.batch import in_shard, main
from transformer_course.grading.sandbox.isolation import bubblewrap_problem

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("postgres")]  # one worker: shared fixtures
STAGE = "01_positional_encoding"
NAMES = ["ada", "blake", "chen", "dana", "eve", "finn", "gus", "hana", "ivan", "jo", "kai", "lea"]


def require(reason: str | None) -> None:
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run this test: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def postgres():
    require(unavailable())
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    """Four students, two in each shard of two, each handing in a correct, blank or buggy notebook."""
    kinds = student_submissions(ROOT, [STAGE])
    order = ["ada", "chen", "blake"]  # correct, one bug, blank
    chosen = {1: [], 2: []}
    for name in NAMES:
        shard = 1 if in_shard(name, (1, 2)) else 2
        if len(chosen[shard]) < 2:
            chosen[shard].append(name)
    folder = tmp_path_factory.mktemp("postgres") / "downloads"
    for number, name in enumerate(sorted(chosen[1] + chosen[2])):
        path = folder / name / f"{STAGE}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(kinds[order[number % 3]][STAGE], path)
    return folder, chosen


def read_scores(path):
    with open(path, encoding="utf-8-sig") as handle:
        return list(csv.DictReader(handle))


def start_task(task: int, class_dir, downloads_folder, db_url, log, secret):
    """One task of the array `--array=1-2`, as Slurm starts it: the course's batch script with Slurm's variables."""
    environment = {**os.environ, "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": str(task),
                   "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_TASK_STEP": "1",
                   "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_CPUS_PER_TASK": "1", "SLURM_SUBMIT_DIR": str(ROOT),
                   "PYTHON": sys.executable, "SUBMISSIONS": str(downloads_folder), "CLASS_DIR": str(class_dir),
                   "GRADEBOOK_URL": db_url, "SECRET_FILE": str(secret)}
    return subprocess.Popen(["bash", str(ROOT / "autograde" / "cluster" / "slurm.sbatch"), "--assignment", STAGE,
                             "--timeout", "60"], env=environment, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def graded_records(class_dir) -> dict[str, tuple[float, str]]:
    found = {}
    for path in (class_dir / "records").glob("*.json"):
        try:
            if json.loads(path.read_text())["status"] == "graded":
                found[path.stem] = (path.stat().st_mtime_ns, path.read_text())
        except (OSError, ValueError, KeyError):
            continue
    return found


@pytest.fixture(scope="module")
def graded(postgres, downloads, tmp_path_factory):
    require(bubblewrap_problem())  # the recipe grades only in the sandbox (--require-sandbox)
    folder, chosen = downloads
    base = folder.parent
    secret = base / "secrets" / "hidden-inputs.key"  # not there yet: the two tasks, started at once, make one
    db_url = postgres.create_database("gradebook")
    machines = {task: base / f"machine{task}" for task in (1, 2)}
    logs = {task: open(base / f"task{task}.log", "wb") for task in (1, 2)}
    try:
        tasks = {task: start_task(task, machines[task], folder, db_url, logs[task], secret) for task in (1, 2)}
        deadline = time.monotonic() + 600
        while not graded_records(machines[1]) and tasks[1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        finished_before_kill = graded_records(machines[1])
        assert tasks[1].poll() is None, "task 1 ended before it could be killed half-way: " + (
            base / "task1.log").read_text(errors="replace")[-2000:]
        os.killpg(tasks[1].pid, signal.SIGKILL)  # the whole task: batch command, worker, sandbox
        tasks[1].wait()
        # task 2 ends before task 1 is requeued, so that task 1 writes the last scores.csv, which the tests read as
        # the whole class's (written while task 2 still grades, it would show task 2's student in progress as pending)
        assert tasks[2].wait(timeout=900) == 0, (base / "task2.log").read_text(errors="replace")[-3000:]
        tasks[1] = start_task(1, machines[1], folder, db_url, logs[1], secret)  # requeued: same task id
        for task in (1, 2):
            assert tasks[task].wait(timeout=900) == 0, (base / f"task{task}.log").read_text(errors="replace")[-3000:]
    finally:
        for handle in logs.values():
            handle.close()
    # the single-machine run everything is compared with, on the class's secret the tasks made
    assert main([str(folder), "--class-dir", str(base / "single"), "--assignment", STAGE, "--jobs", "2",
                 "--timeout", "60", "--secret-file", str(secret)]) == 0
    single = {(row["student"], row["assignment"]): row for row in read_scores(base / "single" / "scores.csv")}
    return {"single": single, "machines": machines, "db_url": db_url, "chosen": chosen, "secret": secret,
            "finished_before_kill": finished_before_kill, "log1": (base / "task1.log").read_text(errors="replace"),
            "log2": (base / "task2.log").read_text(errors="replace")}


def test_two_tasks_started_at_once_make_one_secret_and_both_draw_from_it(graded):
    """The recipe's tasks name one SECRET_FILE, which is not there yet: one task makes it, the other (started at
    the same moment) and the requeued one read it, and each machine's class folder records the one secret."""
    from transformer_course.grading.classroom.batch import SECRET_ID_FILE
    from transformer_course.grading.sandbox import hidden_inputs

    made = [task for task in (1, 2) if "made the class's secret" in graded[f"log{task}"]]
    assert len(made) == 1, (graded["log1"][-2000:], graded["log2"][-2000:])
    secret = hidden_inputs.read_secret(graded["secret"])
    for machine in graded["machines"].values():
        assert (machine / SECRET_ID_FILE).read_text().strip() == hidden_inputs.secret_id(secret)


def test_two_shards_at_once_give_the_scores_of_one_machine(graded):
    for machine in graded["machines"].values():
        rows = {(row["student"], row["assignment"]): row for row in read_scores(machine / "scores.csv")}
        graded_here = {key for key, row in rows.items() if row["status"] == "graded"}
        for key in graded_here:
            assert rows[key]["total"] == graded["single"][key]["total"], (key, rows[key], graded["single"][key])
    last = {(row["student"], row["assignment"]): row for row in read_scores(graded["machines"][1] / "scores.csv")}
    assert {key: row["total"] for key, row in last.items()} == {
        key: row["total"] for key, row in graded["single"].items()}
    assert len({row["total"] for row in last.values()}) > 1  # full, partial and zero marks: a real comparison


def test_scores_csv_from_either_machine_lists_every_student(graded):
    everyone = set(graded["chosen"][1] + graded["chosen"][2])
    for machine in graded["machines"].values():
        assert {row["student"] for row in read_scores(machine / "scores.csv")} == everyone


def test_a_killed_shard_resumes_without_regrading_or_duplicating(graded):
    from nbgrader.api import Gradebook

    before = graded["finished_before_kill"]
    assert before, "task 1 was killed before it finished anyone"
    after = graded_records(graded["machines"][1])
    assert set(after) == set(graded["chosen"][1])
    for student, record in before.items():
        assert after[student] == record, f"{student} was graded again after the restart"
    for machine in graded["machines"].values():
        rows = read_scores(machine / "scores.csv")
        keys = [(row["student"], row["assignment"]) for row in rows]
        assert len(keys) == len(set(keys)), "a row appears twice in scores.csv"
    with Gradebook(graded["db_url"]) as gradebook:
        submissions = [(s.student_id, a.name) for a in gradebook.assignments for s in a.submissions]
        assert sorted(submissions) == sorted(set(submissions)) and len(submissions) == 4
        assert len(gradebook.students) == 4


def test_scores_only_writes_the_whole_class_from_the_gradebook(graded):
    machine = graded["machines"][2]
    folder = machine.parent / "downloads"
    assert main([str(folder), "--class-dir", str(machine), "--db-url", graded["db_url"], "--assignment", STAGE,
                 "--scores-only"]) == 0
    rows = {(row["student"], row["assignment"]): row for row in read_scores(machine / "scores.csv")}
    assert {key: row["total"] for key, row in rows.items()} == {
        key: row["total"] for key, row in graded["single"].items()}
    assert {row["status"] for row in rows.values()} == {"graded"}


def test_one_students_notebooks_graded_at_once_by_two_workers(postgres, tmp_path, monkeypatch):
    """With fewer students at once than cores, a student's notebooks are split between workers that
    write the same student's rows at the same moment (nbgrader creates the student in each)."""
    require(bubblewrap_problem())
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    stages = [STAGE, "02_attention"]
    correct = student_submissions(ROOT, stages)["ada"]
    for stage in stages:
        path = tmp_path / "downloads" / "ada" / f"{stage}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(correct[stage], path)
    db_url = postgres.create_database("split")
    arguments = [str(tmp_path / "downloads"), "--class-dir", str(tmp_path / "class"), "--db-url", db_url, "--jobs", "1",
                 "--timeout", "60", *(f"--assignment={stage}" for stage in stages)]
    assert main(arguments) == 0
    rows = read_scores(tmp_path / "class" / "scores.csv")
    assert sorted(row["assignment"] for row in rows) == stages
    assert all(row["status"] == "graded" and float(row["autograded"]) == float(row["autograded_max"]) > 0
               for row in rows), rows  # written answers wait for the instructor


# --- the Slurm recipe on a real (single-node) Slurm cluster ------------------------------------------------

@pytest.fixture(scope="module")
def slurm():
    require(slurm_unavailable())
    with SlurmCluster(cpus=8) as cluster:  # the recipe's four CPUs per task, as written
        yield cluster


def test_the_slurm_recipe_runs_as_documented(slurm, postgres, downloads, graded, tmp_path):
    """The instructor's guide's three Slurm lines (website/instructor/cluster.md), run as written from the
    course's folder on a real slurmctld and slurmd, in a shell with no PYTHON and no virtualenv on the PATH:
    the recipe finds the course's .venv itself. The array (two tasks here, through a `sbatch` that adds
    `--array=1-2`; four CPUs each as written) grades the class into a shared class folder and the PostgreSQL
    gradebook named by the guide's `postgresql://` URL as written (the psycopg driver); the scores job, which
    depends on the array, runs once after it and writes the scores.csv of one machine. Only the placeholders
    (/shared/..., dbhost's URL), the logs' folder, the memory and GRADE_OPTIONS (one stage) come from the test."""
    from slurm_cluster import recipe, recipe_environment, submit

    require(bubblewrap_problem())  # the recipe grades only in the sandbox (--require-sandbox)
    folder, _ = downloads
    db_url = postgres.create_database("slurm").replace("postgresql+psycopg2://", "postgresql://")
    class_dir = tmp_path / "class"
    from transformer_course.data import multi30k
    lines = recipe(ROOT / "website" / "instructor" / "cluster.md", {
        "/shared/downloads": str(folder), "/shared/class": str(class_dir),
        "/shared/secrets/hidden-inputs.key": str(graded["secret"]),  # the class's one secret, as the tasks above
        "/shared/multi30k": os.environ.get(multi30k.ENVIRONMENT_VARIABLE) or str(multi30k.cache_directory()),
        "postgresql://grader@dbhost/gradebook": db_url})
    environment = recipe_environment(slurm, ROOT, tmp_path / "bin", tmp_path / "grade-%A_%a.log",
                                     GRADE_OPTIONS=f"--assignment {STAGE} --timeout 60")
    array, scores = submit(lines, environment, ROOT)
    slurm.wait([array, scores], timeout=900)
    logs = {path.name: path.read_text(errors="replace") for path in tmp_path.glob("grade-*.log")}
    assert slurm.state(array) == {"1": "COMPLETED", "2": "COMPLETED"}, logs
    assert slurm.state(scores) == {scores: "COMPLETED"}, logs
    final = f"grade-{scores}_4294967294.log"  # %a of a job that is no array
    assert sorted(logs) == sorted([f"grade-{array}_1.log", f"grade-{array}_2.log", final])
    assert "grades shard 1/2" in logs[f"grade-{array}_1.log"] and "grades shard 2/2" in logs[f"grade-{array}_2.log"]
    assert "grades shard" not in logs[final]  # the final step grades nobody
    rows = {(row["student"], row["assignment"]): row for row in read_scores(class_dir / "scores.csv")}
    assert {key: row["total"] for key, row in rows.items()} == {
        key: row["total"] for key, row in graded["single"].items()}
    assert {row["status"] for row in rows.values()} == {"graded"}
    assert (class_dir / "report.html").exists() and not list(class_dir.glob(".*.part"))
