"""The kernel sandbox on its own: a process started through it cannot see hidden folders, write
outside its own folder, reach the network, or allocate without limit."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT
from transformer_course.grading import sandbox
from transformer_course.grading.sandbox import ENVIRONMENT_VARIABLE, Policy, bubblewrap_problem

PROBE = """
import os, socket
results = {}
try:
    results["secret"] = open(os.environ["SECRET_FILE"]).read()
except OSError as error:
    results["secret"] = type(error).__name__
for name, path in (("own", os.environ["OWN_FILE"]), ("elsewhere", os.environ["ELSEWHERE_FILE"])):
    try:
        open(path, "w").write("x")
        results[name] = "written"
    except OSError as error:
        results[name] = type(error).__name__
try:
    socket.create_connection(("1.1.1.1", 53), timeout=3)
    results["network"] = "reached"
except OSError as error:
    results["network"] = type(error).__name__
try:
    bytearray(16 * 2**30)
    results["memory"] = "allocated"
except MemoryError:
    results["memory"] = "MemoryError"
print(results)
"""


@pytest.fixture
def outside_tmp():
    """A folder outside /tmp (the sandbox replaces /tmp, which would hide everything there anyway).
    /var/tmp where it exists: the checkout itself may lie under /tmp (CI)."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() and os.access("/var/tmp", os.W_OK) else ROOT
    with tempfile.TemporaryDirectory(dir=base, prefix=".sandbox-test-") as folder:
        yield Path(folder)


def run_probe(tmp_path, isolate, nested=False):
    """With `nested`, the layout of the default class folder: autograde/ (hidden) holds class/ (hidden),
    which holds the student's own writable folder."""
    secret_folder, own, elsewhere = tmp_path / "class", tmp_path / "own", tmp_path / "elsewhere"
    hide = [secret_folder]
    if nested:
        outer = tmp_path / "autograde"
        secret_folder, own = outer / "class", outer / "class" / "autograded" / "ada"
        hide = [secret_folder, outer]
    for folder in (secret_folder, own, elsewhere):
        folder.mkdir(parents=True, exist_ok=True)
    (secret_folder / "gradebook.db").write_text("hidden tests")
    policy = Policy(hide=[str(folder) for folder in hide], writable=[str(own)], memory_bytes=4 * 2**30,
                    isolate=isolate)
    environment = {**os.environ, ENVIRONMENT_VARIABLE: policy.to_environment(),
                   "SECRET_FILE": str(secret_folder / "gradebook.db"), "OWN_FILE": str(own / "notes.txt"),
                   "ELSEWHERE_FILE": str(elsewhere / "notes.txt")}
    command = [sys.executable, "-m", "transformer_course.grading.sandbox", "--", sys.executable, "-c", PROBE]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert result.returncode == 0, result.stderr
    return eval(result.stdout.strip().splitlines()[-1])  # noqa: S307  (our own probe's dict)


@pytest.mark.skipif(bubblewrap_problem() is not None, reason=f"no sandbox here: {bubblewrap_problem()}")
def test_sandboxed_process_is_confined(outside_tmp):
    results = run_probe(outside_tmp, isolate=True)
    assert results["secret"] in ("FileNotFoundError", "PermissionError"), results
    assert results["own"] == "written" and results["elsewhere"] == "OSError"  # read-only, results
    assert results["network"] != "reached" and results["memory"] == "MemoryError", results


@pytest.mark.skipif(bubblewrap_problem() is not None, reason=f"no sandbox here: {bubblewrap_problem()}")
def test_hidden_folders_inside_hidden_folders(outside_tmp):
    results = run_probe(outside_tmp, isolate=True, nested=True)
    assert results["secret"] in ("FileNotFoundError", "PermissionError"), results
    assert results["own"] == "written" and results["elsewhere"] == "OSError", results


def test_without_bubblewrap_limits_still_apply(outside_tmp):
    results = run_probe(outside_tmp, isolate=False)
    assert results["memory"] == "MemoryError", results
    assert results["secret"] == "hidden tests"  # what the loud warning is about


def test_missing_bubblewrap_is_reported(monkeypatch):
    sandbox.bubblewrap_problem.cache_clear()
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    try:
        assert "not installed" in sandbox.bubblewrap_problem()
    finally:
        sandbox.bubblewrap_problem.cache_clear()


def test_loud_warning_when_grading_without_isolation(capsys):
    from transformer_course.grading.batch import _warn_unsandboxed

    _warn_unsandboxed("bubblewrap (`bwrap`) is not installed")
    printed = capsys.readouterr().out
    assert "WITHOUT isolation" in printed and "apt install bubblewrap" in printed


LISTING = """
import os, pathlib
course = pathlib.Path(os.environ["COURSE"])
results = {"lesson": (course / "lesson.py").read_text(), "solutions": sorted(os.listdir(course / "solutions")),
           "neighbour": os.path.exists(os.environ["NEIGHBOUR"]),
           "data": (pathlib.Path(os.environ["DATA"]) / "train.de").read_text()}
try:
    (course / "lesson.py").write_text("changed")
    results["write"] = "written"
except OSError as error:
    results["write"] = type(error).__name__
print(results)
"""


@pytest.mark.skipif(bubblewrap_problem() is not None, reason=f"no sandbox here: {bubblewrap_problem()}")
def test_a_course_under_tmp_stays_readable_and_its_secrets_hidden(tmp_path, outside_tmp):
    """A CI checkout may lie under /tmp, which the sandbox replaces by an empty private /tmp: the course
    (and the Python environment, the data) are mounted back read-only; everything else there is gone.
    The data folder is reached through a symlink under /tmp to a folder elsewhere (as ../shared may be)."""
    assert str(tmp_path.resolve()).startswith("/tmp/"), "this test is about folders under /tmp"
    course, neighbour = tmp_path / "course", tmp_path / "another-student.ipynb"
    (outside_tmp / "train.de").write_text("Ein Hund")
    (tmp_path / "shared").symlink_to(outside_tmp, target_is_directory=True)
    (course / "solutions").mkdir(parents=True)
    (course / "solutions" / "hidden_tests.ipynb").write_text("hidden")
    (course / "lesson.py").write_text("lesson")
    neighbour.write_text("not yours")
    policy = Policy(hide=[str(course / "solutions")], visible=[str(course), str(tmp_path / "shared")], isolate=True)
    environment = {**os.environ, ENVIRONMENT_VARIABLE: policy.to_environment(), "COURSE": str(course),
                   "NEIGHBOUR": str(neighbour), "DATA": str(tmp_path / "shared")}
    command = [sys.executable, "-m", "transformer_course.grading.sandbox", "--", sys.executable, "-c", LISTING]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert result.returncode == 0, result.stderr
    results = eval(result.stdout.strip().splitlines()[-1])  # noqa: S307  (our own probe's dict)
    assert results == {"lesson": "lesson", "solutions": [], "neighbour": False, "data": "Ein Hund",
                       "write": "OSError"}, results


def test_the_python_environment_under_tmp_is_kept(monkeypatch, tmp_path):
    environment = tmp_path / "venv"
    environment.mkdir()
    monkeypatch.setattr(sandbox.sys, "prefix", str(environment))
    kept = sandbox.kept_under_tmp(Policy(visible=[str(tmp_path / "venv"), "/tmp", "/usr"]))
    assert str(environment.resolve()) in kept  # (with the real environment too, when it lies under /tmp)
    assert "/tmp" not in kept and "/usr" not in kept  # never all of /tmp; nothing outside it (already there)
    command = sandbox.bubblewrap_command(Policy(), ["python"], None)
    bind = command.index(str(environment.resolve()))
    assert command[bind - 1] == "--ro-bind" and command.index("/tmp") < bind
