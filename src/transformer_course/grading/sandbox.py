"""Run a student's kernel in a sandbox: no network, no view of other students, bounded resources.

nbgrader itself runs outside (it must read the gradebook, which holds the hidden tests); only the
kernel that executes the student's code is confined. The batch grader installs a kernelspec named
`python3` in a private JUPYTER_PATH whose command is this module:

    python -m transformer_course.grading.sandbox -- python -m ipykernel_launcher -f {connection_file}

It reads the policy from the environment variable `COURSE_SANDBOX` (JSON, see `Policy`), sets
resource limits (address space, file size, no core dumps), then, when bubblewrap works on this
machine, execs the kernel inside `bwrap` with

- the whole file system read-only, with an empty private /tmp (the course, its Python environment
  and the data folder are mounted back where they lie under /tmp), and the class folder, the
  submissions folder, the source solutions (hidden tests) and the gradebook replaced by empty folders;
- write access only to the student's own autograded folder, a private /tmp and the kernel's
  connection folder (the kernel talks to nbgrader over Unix sockets there, since the kernel's
  network namespace has no route out, not even to the grader's loopback);
- its own network namespace (no network at all) and its own process namespace.

Without bubblewrap the kernel still gets the resource limits, and the batch grader prints a loud
warning that submissions are not isolated from each other (see README, "Grading a class").
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import site
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

ENVIRONMENT_VARIABLE = "COURSE_SANDBOX"


@dataclass
class Policy:
    hide: list[str] = field(default_factory=list)  # folders the kernel must not see (emptied)
    writable: list[str] = field(default_factory=list)  # folders the kernel may write (the student's own)
    visible: list[str] = field(default_factory=list)  # folders the kernel must read (course, data), even under /tmp
    memory_bytes: int = 6 * 2**30  # address-space limit: a memory bomb fails in its cell
    file_bytes: int = 2 * 2**30  # largest file the kernel may write
    isolate: bool = True  # use bubblewrap when it works here

    def to_environment(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_environment(cls) -> Policy:
        return cls(**json.loads(os.environ.get(ENVIRONMENT_VARIABLE, "{}")))


@lru_cache(maxsize=1)
def bubblewrap_problem() -> str | None:
    """None when bubblewrap can confine a process here, else why not (for the loud warning)."""
    executable = shutil.which("bwrap")
    if executable is None:
        return "bubblewrap (`bwrap`) is not installed; install Debian's `bubblewrap` package"
    probe = [executable, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
             "--unshare-pid", "--die-with-parent", "true"]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {result.stderr.strip()[:200]}"
    return None


def _outermost(folders: list[str]) -> list[str]:
    """The folders not inside another one of the list, without repeats, in order."""
    unique = list(dict.fromkeys(folders))
    return [folder for folder in unique if not any(
        Path(folder) != Path(other) and Path(folder).is_relative_to(other) for other in unique)]


def kept_under_tmp(policy: Policy) -> list[str]:
    """Folders under /tmp the kernel needs read-only: the Python environment and `policy.visible`.

    The sandbox gives the kernel an empty private /tmp, so a course cloned under /tmp (a CI checkout),
    its virtual environment or a data folder there would vanish; these are mounted back, read-only.
    """
    python = [sys.prefix, sys.exec_prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent),
              *site.getsitepackages()]
    kept = []
    for folder in filter(os.path.isdir, [*python, *policy.visible]):
        # both the path as given (a symlink there, e.g. ../shared, leads elsewhere) and where it leads
        for path in (Path(os.path.abspath(folder)), Path(folder).resolve()):
            if _under_tmp(path):
                kept.append(str(path))
    return _outermost(kept)


def _under_tmp(path: Path) -> bool:
    return any(path != Path(tmp) and path.is_relative_to(tmp) for tmp in {"/tmp", str(Path("/tmp").resolve())})


def bubblewrap_command(policy: Policy, command: list[str], runtime_folder: str | None) -> list[str]:
    """The bwrap command line that runs `command` under `policy`."""
    arguments = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for folder in kept_under_tmp(policy):
        arguments += ["--ro-bind", folder, folder]
    # a folder inside another hidden one is hidden with it (the default class folder autograde/class
    # lies inside the hidden autograde/); mounting over it again would break the read-only remount
    outermost = _outermost(policy.hide)
    hidden = [folder for folder in outermost if Path(folder).is_dir()]
    for folder in outermost:
        if Path(folder).exists():
            arguments += ["--tmpfs", folder] if Path(folder).is_dir() else ["--ro-bind", "/dev/null", folder]
    for folder in [*policy.writable, *([runtime_folder] if runtime_folder else [])]:
        arguments += ["--bind", folder, folder]
    for folder in hidden:  # empty and read-only: nothing written there could be mistaken for the real thing
        arguments += ["--remount-ro", folder]
    arguments += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent",
                  "--setenv", "MPLCONFIGDIR", "/tmp/matplotlib", "--setenv", "HOME", "/tmp",
                  # ipykernel exits when its parent pid changes; in the new pid namespace it does, so
                  # rely on --die-with-parent instead
                  "--unsetenv", "JPY_PARENT_PID", "--", *command]
    return arguments


def limit_resources(policy: Policy) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (policy.memory_bytes, policy.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (policy.file_bytes, policy.file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def connection_folder(command: list[str]) -> str | None:
    """The folder of the kernel's connection file (its Unix sockets live beside it), if any."""
    return str(Path(command[command.index("-f") + 1]).resolve().parent) if "-f" in command else None


def install_kernelspec(folder: Path) -> Path:
    """Write a `python3` kernelspec that starts kernels through this module; returns the JUPYTER_PATH entry."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "transformer_course.grading.sandbox", "--",
            sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "Python 3 (sandboxed grading)", "language": "python",
              "interrupt_mode": "message"}
    (spec / "kernel.json").write_text(json.dumps(kernel, indent=1), encoding="utf-8")
    return folder


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    policy = Policy.from_environment()
    os.environ.pop(ENVIRONMENT_VARIABLE, None)
    if policy.isolate and bubblewrap_problem() is None:
        command = bubblewrap_command(policy, command, connection_folder(command))
    limit_resources(policy)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
