"""A throwaway single-node Slurm cluster for the tests (Debian's `slurm-wlm` and `munge`; `.ci/run` installs
them): munged, slurmctld and slurmd on localhost, each with its own socket, ports, state and logs in a
temporary folder, started and stopped by the test.

    with SlurmCluster() as cluster:
        job = cluster.sbatch(["--array=1-2", "script.sbatch"], cwd=folder, environment=...)
        cluster.wait([job])
        cluster.state(job)    # {"1": "COMPLETED", "2": "COMPLETED"} for an array

The node has this machine's cores and most of its memory, or as many CPUs as asked for (`SlurmCluster(cpus=8)`,
so that a recipe's `--cpus-per-task=4` runs as written on a small machine: slurmd takes the configured
counts, `SlurmdParameters=config_overrides`); jobs run as the submitting user (root in CI)
with no cgroup or accounting plugin, so nothing of the host's configuration is needed or touched.
`unavailable()` says in one line why no cluster can start here (None when one can); the tests skip with it,
except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((str(Path(folder) / name) for folder in ("/usr/sbin", "/sbin")
                                       if (Path(folder) / name).exists()), None)


@lru_cache(maxsize=1)
def unavailable() -> str | None:
    missing = [name for name in DAEMONS if _which(name) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; Debian: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root here (slurmd starts jobs as their user)"
    return None


def recipe(page: Path, replace: dict[str, str]) -> str:
    """The shell lines of the page's block that submits `slurm.sbatch`, as written there, with each of the
    page's placeholders (`/shared/downloads`, `dbhost`'s URL, ...) replaced by the test's own."""
    blocks = re.findall(r"^```bash\n(.*?)^```", page.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    [block] = [block for block in blocks if "autograde/cluster/slurm.sbatch" in block]
    for placeholder, value in replace.items():
        assert placeholder in block, placeholder
        block = block.replace(placeholder, value)
    return block


def environment_without_the_course(environment: dict[str, str], root: Path) -> dict[str, str]:
    """An instructor's shell: no PYTHON, no virtualenv active (its bin folder not on the PATH)."""
    venv = str(root / ".venv")
    kept = {name: value for name, value in environment.items()
            if name not in ("PYTHON", "VIRTUAL_ENV", "PYTHONPATH", "GRADE_OPTIONS", "GRADING_RUN")}
    kept["PATH"] = os.pathsep.join(part for part in environment.get("PATH", "").split(os.pathsep)
                                   if part and not part.startswith(venv))
    return kept


def smaller_array(folder: Path, array: str) -> Path:
    """A `sbatch` for the front of the PATH that submits the recipe's array (`slurm.sbatch`) with `--array=ARRAY`
    (a class of four needs no ten tasks) and everything else as it comes. Not SBATCH_ARRAY_INX: that would
    make every job an array, the scores job included."""
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "sbatch"
    wrapper.write_text(f"""#!/bin/sh
case "$*" in
    *autograde/cluster/slurm.sbatch*) exec {_which("sbatch")} --array={array} "$@" ;;
esac
exec {_which("sbatch")} "$@"
""")
    wrapper.chmod(0o755)
    return folder


def recipe_environment(cluster: SlurmCluster, root: Path, bin_folder: Path, output: Path,
                       **extra: str) -> dict[str, str]:
    """The environment an instructor's shell has when pasting the recipe: the cluster's, without the course's
    virtualenv on PATH, the recipe's array cut to two tasks (`smaller_array`, in `bin_folder`), 2 GB per node,
    the jobs' logs at `output` (an sbatch pattern), plus `extra` (GRADE_OPTIONS, say)."""
    environment = environment_without_the_course(cluster.environment(), root)
    environment.update(PATH=f"{smaller_array(bin_folder, '1-2')}{os.pathsep}{environment['PATH']}",
                       SBATCH_MEM_PER_NODE="2G", SBATCH_OUTPUT=str(output), **extra)
    return environment


def submit(lines: str, environment: dict[str, str], cwd: Path) -> tuple[str, str]:
    """Run a recipe's lines with bash, as an instructor would paste them (the array's job id is in `$job`):
    the job ids of the grading array and of the final scores job."""
    submitted = subprocess.run(["bash", "-e", "-c", lines + 'echo "array $job"\n'], cwd=cwd, env=environment,
                               capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    array = re.search(r"^array (\d+)$", submitted.stdout, re.MULTILINE).group(1)
    scores = re.search(r"Submitted batch job (\d+)", submitted.stdout).group(1)
    return array, scores


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _memory_mb() -> int:
    with open("/proc/meminfo") as handle:
        total_kb = int(re.search(r"MemTotal:\s+(\d+)", handle.read()).group(1))
    return int(total_kb / 1024 * 0.8)


class SlurmCluster:
    NODE = "localnode"

    def __init__(self, cpus: int | None = None) -> None:
        self.cpus = max(cpus or 0, os.cpu_count() or 1)
        self.base = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # short: socket paths have 107 bytes
        self.conf = self.base / "slurm.conf"
        self.socket = self.base / "munge.socket"
        self.started = False

    def environment(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def _run(self, command: list[str], timeout: float = 60, **keywords) -> str:
        process = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                 env=keywords.pop("env", self.environment()), **keywords)
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:2])} failed: {process.stderr.strip()[-1500:]}\n{self.logs()}")
        return process.stdout

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}"
                         for path in sorted(self.base.glob("*.log")))

    def start(self) -> SlurmCluster:
        os.chmod(self.base, 0o755)
        for folder in ("state", "spool"):
            (self.base / folder).mkdir()
        key = self.base / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._run([_which("munged"), "--force", f"--socket={self.socket}", f"--key-file={key}",
                   f"--log-file={self.base / 'munged.log'}", f"--pid-file={self.base / 'munged.pid'}",
                   f"--seed-file={self.base / 'munged.seed'}"])
        self.started = True
        b = self.base
        self.conf.write_text(f"""ClusterName=coursetest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
StateSaveLocation={b / 'state'}
SlurmdSpoolDir={b / 'spool'}
SlurmctldPidFile={b / 'slurmctld.pid'}
SlurmdPidFile={b / 'slurmd.pid'}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmctldLogFile={b / 'slurmctld.log'}
SlurmdLogFile={b / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MinJobAge=3600
ReturnToService=2
MpiDefault=none
SlurmdParameters=config_overrides
NodeName={self.NODE} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={_memory_mb()} State=UNKNOWN
PartitionName=test Nodes={self.NODE} Default=YES MaxTime=INFINITE State=UP
""")
        self._run([_which("slurmctld"), "-i"])
        self._run([_which("slurmd"), "-N", self.NODE])
        deadline = time.monotonic() + 60
        while "idle" not in self._run([_which("sinfo"), "-h", "-o", "%T"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm node did not become idle\n{self.logs()}")
            time.sleep(0.5)
        return self

    def sbatch(self, arguments: list[str], cwd: Path, environment: dict[str, str]) -> str:
        """Submit a job; returns its id."""
        return self._run([_which("sbatch"), "--parsable", *arguments], cwd=cwd, env=environment).strip().split(";")[0]

    def wait(self, jobs: list[str], timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while self._run([_which("squeue"), "-h", "-j", ",".join(jobs)]).strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm jobs {jobs} still running after {timeout} s\n{self.logs()}")
            time.sleep(1)

    def state(self, job: str) -> dict[str, str]:
        """{array task id (or the job id): its JobState} of a job, read from scontrol."""
        text = self._run([_which("scontrol"), "-o", "show", "job", job])
        found = {}
        for line in text.splitlines():
            task = re.search(r"\bArrayTaskId=(\S+)", line)
            found[task.group(1) if task else job] = re.search(r"\bJobState=(\S+)", line).group(1)
        return found

    def stop(self) -> None:
        if self.started:
            subprocess.run([_which("scontrol"), "shutdown"], env=self.environment(), capture_output=True, timeout=60)
            for name in ("slurmctld.pid", "slurmd.pid"):
                _wait_gone(self.base / name)
            subprocess.run([_which("munged"), "--stop", f"--socket={self.socket}"], capture_output=True, timeout=60)
            self.started = False
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exception: object) -> None:
        self.stop()


def _wait_gone(pid_file: Path, timeout: float = 30) -> None:
    """Wait until the daemon whose pid the file holds has exited (scontrol shutdown does not wait)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
