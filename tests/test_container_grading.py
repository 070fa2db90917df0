"""Grading from macOS or Windows (issue 31): the batch command in the course's container image, run by
Podman or Docker, with bubblewrap's sandbox inside the container.

`autograde/cluster/grade-in-container.sh` builds the command; the instructor's guide
(website/instructor/macos-windows.md) prints it for typing by hand. Here: the guide's command is the one the
script builds, and, where Podman can run containers, the script grades a student for real in a container,
confined, while the same container without the guide's three security options grades nobody.

The course's image cannot be built on the machines the course is developed on (no registry for its base
image), so the real run uses the host's own root file system as the container's (`--rootfs /:O`, an
overlay: nothing is written to the host) and the course's virtualenv in it. What is tested is the
container's side: the security options, the folders mounted, the secret kept outside, the sandbox
starting inside."""

from __future__ import annotations

import csv
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "autograde" / "cluster" / "grade-in-container.sh"
GUIDE = ROOT / "website" / "instructor" / "macos-windows.md"
STAGE = "01_positional_encoding"


def guide_command(shell: str) -> list[str]:
    """The command of the guide's block for SHELL (bash: macOS and Linux), as words."""
    text = GUIDE.read_text(encoding="utf-8")
    [block] = re.findall(rf"^```{shell}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    lines = [line.rstrip("\\").strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]
    command = " ".join(lines)
    return shlex.split(command[command.index("podman run"):])


def as_macos_user(tmp_path: Path) -> dict[str, str]:
    """The script's environment as on a Mac: a user who is not root (an `id` that says 501), HOME ~."""
    folder = tmp_path / "mac"
    folder.mkdir()
    (folder / "id").write_text("#!/bin/sh\necho 501\n")
    (folder / "id").chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "HOME": "/Users/ada", "ENGINE": "podman"}


def test_the_guides_command_is_the_one_the_script_builds(tmp_path):
    """The macOS command of the guide, word for word, is what the script runs for rootless Podman (what a Mac's
    podman machine is), with the guide's folders."""
    documented = guide_command("bash")
    built = subprocess.run(["bash", str(SCRIPT), "--print", "/Users/ada/Downloads/week2", "/Users/ada/grading/class",
                            "--jobs", "2"], env=as_macos_user(tmp_path), capture_output=True, text=True, check=True)
    assert shlex.split(built.stdout) == documented
    for option in ("seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined",
                   "--userns=keep-id:uid=1000,gid=1000", "/secret/hidden-inputs.key"):
        assert option in documented, option


def test_the_windows_command_is_the_same_command():
    """PowerShell's line (one line, Windows paths) has the same options, folders and batch command."""
    [block] = re.findall(r"^```powershell\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    line = next(line for line in block.splitlines() if "run --rm" in line)
    words = line.split()
    mac = guide_command("bash")
    assert [word for word in words if not word.startswith(("C:", "-v"))] == \
        [word for word in mac if not word.startswith(("/Users", "-v"))]
    assert sum(word == "-v" for word in words) == sum(word == "-v" for word in mac) == 4


def podman_problem() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (Debian: apt-get install podman runc)"
    if os.geteuid() != 0:
        return "the test runs Podman as root (rootful, with the host's root file system as the container's)"
    if not (ROOT / ".venv" / "bin" / "python").exists():
        return "the course's virtualenv .venv is missing"
    return None


@pytest.fixture
def podman():
    """Podman with storage of its own (its run folder's path must be short), and runc: crun refuses cgroups in
    hybrid mode (v1 and v2 together), as on the course's development machines."""
    folder = Path(tempfile.mkdtemp(prefix="pm-", dir="/tmp"))
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    yield ["podman", "--root", str(folder / "storage"), "--runroot", str(folder / "run"), "--storage-driver", "vfs",
           *runtime]
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_class_is_graded_confined_in_a_podman_container(tmp_path, podman):
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    downloads = tmp_path / "downloads" / "ada"
    downloads.mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / STAGE / f"{STAGE}.ipynb", downloads)
    limits = "--ulimit nofile=1024:1024 --ulimit nproc=4096:4096"  # at most this machine's hard limits
    environment = {**os.environ, "ENGINE": " ".join(podman), "IMAGE": "--rootfs /:O",
                   "PYTHON_IN_IMAGE": str(ROOT / ".venv" / "bin" / "python"), "CONTAINER_OPTIONS": limits,
                   "SECRET_DIR": str(tmp_path / "secret"), "CACHE_DIR": str(tmp_path / "cache")}
    probe = subprocess.run([*podman, "run", "--rm", *limits.split(), "--rootfs", "/:O", "true"],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {probe.stderr.strip()[-300:]}")
    arguments = [str(tmp_path / "downloads"), str(tmp_path / "class"), "--assignment", STAGE, "--jobs", "1"]
    run = subprocess.run(["bash", str(SCRIPT), *arguments], env=environment, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [row] = list(csv.DictReader(open(tmp_path / "class" / "scores.csv", encoding="utf-8-sig")))
    assert row["status"] == "graded" and float(row["autograded"]) == float(row["autograded_max"]) > 0, row
    assert (tmp_path / "secret" / "hidden-inputs.key").exists()  # kept outside the container for the next run
    assert "WITHOUT" not in run.stdout + run.stderr  # confined: the batch command refuses to grade otherwise

    # the same container without the guide's three security options: bubblewrap cannot start, nobody is graded
    printed = subprocess.run(["bash", str(SCRIPT), "--print", *arguments], env=environment, capture_output=True,
                             text=True, check=True).stdout
    words = shlex.split(printed)
    for option in ("seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"):
        at = words.index(option)
        del words[at - 1:at + 1]
    (tmp_path / "class2").mkdir()
    words[words.index(f"{tmp_path / 'class'}:/class")] = f"{tmp_path / 'class2'}:/class"
    refused = subprocess.run(words, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "cannot be isolated here" in refused.stderr and not (tmp_path / "class2" / "scores.csv").exists()
