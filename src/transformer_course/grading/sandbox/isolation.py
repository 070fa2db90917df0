"""Start one program fully confined: the isolation under a student's grading processes (issue 9).

    sandbox = Sandbox(readable=(*python_paths(), *course_paths(checkout), str(multi30k_folder)),
                      environment={"MULTI30K_DIR": str(multi30k_folder)})
    with start(sandbox, [sys.executable, "-m", "some.runner"], pass_fds=(channel,)) as confined:
        ...                                   # talk to it over its stdin/stdout and `channel`
        status = confined.wait(timeout=600)   # its exit status (a signal N reads 128 + N under bubblewrap)
        why = confined.reason()               # None, or a sentence for the student: which limit stopped it
    # leaving the block kills every process of the sandbox and removes its cgroup

`start(sandbox, argv, *, stdin=PIPE, stdout=PIPE, stderr=DEVNULL, pass_fds=())` returns a `Confined`:
`.process` (the `subprocess.Popen` of bubblewrap, or of the program when unconfined), `.pid` (that
process's; a signal to bubblewrap does not reach the program: use `.kill()`), `.isolated` (bubblewrap
used), `.mechanism` (what holds
the limits: "cgroup v2", "cgroup v1" or "watchdog"), `.wait(timeout)`, `.kill()` (every process of
the sandbox), `.reason()`, `.memory_peak_bytes()`, `.close()`; it is a context manager. Inherited
file descriptors (`pass_fds`, the standard streams) reach the program at the same numbers.

What the program gets, when bubblewrap works here (`bubblewrap_problem()` is None):
- Files: only `sandbox.readable` (read-only, at their paths and through any symlink on the way, so a
  checkout or venv under /tmp, or ../shared a symlink, still works), the system folders (/usr, and
  /bin, /sbin, /lib* as they are: symlinks or folders), `HOST_FILES` (the loader's cache, the time
  zone, fontconfig's configuration, the CPUs' list), a generated /etc/passwd, group, nsswitch.conf
  and hosts for the user `student`, its own /proc (the kernel's tunables read-only) and a minimal
  /dev. Nothing else: no home folders, no lessons/, solutions/, autograde/, tests/ or
  .git of a checkout, no /var, /run or host /tmp.
- Writable: only three private tmpfs, each bounded: the working folder `sandbox.workdir` (also HOME
  and the current folder), /tmp and /dev/shm. They vanish with the sandbox, so nothing it writes
  (a symlink to the gradebook included) is ever seen by the grader. One file may not exceed
  `limits.file_bytes` (RLIMIT_FSIZE), no core dumps.
- Environment: exactly `base_environment()` (PATH, HOME and PWD the working folder, USER, LANG=C.UTF-8,
  TMPDIR, XDG_CACHE_HOME and MPLCONFIGDIR in /tmp, PYTHONDONTWRITEBYTECODE, PYTHONNOUSERSITE) updated
  with `sandbox.environment`; nothing of the grader's.
- Identity: uid/gid 1000 (`student`) in its own user namespace, no capabilities, no new privileges,
  no further user namespaces; a seccomp filter refuses ptrace, process_vm_readv/writev, pidfd_getfd
  and the like (one process of the sandbox cannot read another's memory through them; /proc/PID/mem
  still follows the usual rules, so a process holding secrets should make itself non-dumpable),
  kernel keyrings, perf, bpf, userfaultfd, io_uring and the kernel log. Outside the namespace the
  processes keep the grader's uid (root under CI): which is why the kernel's tunables are mounted
  read-only and nothing of the host is writable.
- Own network namespace (no network, not the host's loopback, no abstract Unix socket of the host),
  pid namespace (host processes invisible), IPC and UTS namespaces; it dies with its parent. A Unix
  socket inside a readable folder would still be reachable (a read-only mount does not stop
  connect), so readable folders should hold programs and data only.
- Limits for all its processes together, through a cgroup made for it: memory (tmpfs pages count)
  and processes + threads (bubblewrap's own two processes included). Over memory, the kernel kills
  inside the sandbox; over processes, fork and thread creation fail inside (`reason()` then returns
  `memory_reason(limits)` or `processes_reason(limits)`). Each process also has
  an address-space limit of `limits.memory_bytes`, so one huge allocation is a MemoryError.
  Where no cgroup can be made here, a watchdog thread polls the sandbox's process tree every 0.1 s
  (proportional memory, threads) and kills it all when over; `mechanism` says which.

Without bubblewrap (not installed, namespaces refused, or `sandbox.isolate` False) the program runs
unconfined in a private temporary working folder (removed afterwards) with the same environment and
limits (cgroup or watchdog, address space, file size); the caller prints the loud warning. There the
program joins its cgroup just after it starts (a native program could fork before that; Python
cannot run any code that early).

The parent-death signal is tied to the thread that calls `start`: call it from a thread that lives
as long as the sandbox should.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import re
import resource
import shutil
import signal
import site
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from itertools import count
from pathlib import Path
from subprocess import DEVNULL, PIPE

WORKDIR = "/home/student/work"
STUDENT = "student"
STUDENT_ID = 1000  # uid and gid inside the sandbox
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# found by tracing torch, numpy, matplotlib (which runs fc-list) and spaCy: the loader's cache, the time
# zone, fontconfig's configuration, the CPUs' list and topology (torch's cpuinfo)
HOST_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/fonts", "/sys/devices/system/cpu")
GENERATED_FILES = {
    "/etc/passwd": f"{STUDENT}:x:{STUDENT_ID}:{STUDENT_ID}:student:{{home}}:/bin/sh\n",
    "/etc/group": f"{STUDENT}:x:{STUDENT_ID}:\n",
    "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    "/etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
}
CGROUP_PREFIX = "course-sandbox-"


class SandboxError(RuntimeError):
    """The sandbox could not be started; the message says why."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 6 * 2**30  # all processes together; also each process's address space
    processes: int = 512  # processes and threads together
    file_bytes: int = 2**30  # the largest single file
    work_bytes: int = 512 * 2**20  # the working folder (tmpfs)
    tmp_bytes: int = 256 * 2**20  # /tmp (tmpfs)
    shared_memory_bytes: int = 64 * 2**20  # /dev/shm (tmpfs)
    cpus: float = 0.0  # CPU time for all processes together, in cores (0: no limit); needs a cpu cgroup


@dataclass(frozen=True)
class Sandbox:
    readable: tuple[str, ...]  # folders and files the program may read (see python_paths, course_paths)
    environment: Mapping[str, str] = field(default_factory=dict)  # added to base_environment()
    workdir: str = WORKDIR
    limits: Limits = Limits()
    isolate: bool = True  # use bubblewrap when it works here


def python_paths() -> list[str]:
    """The Python installation this process runs: the interpreter's own tree (standard library,
    shared library) and the virtual environment with its site-packages."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             str(Path(sys.executable).resolve().parent), *site.getsitepackages()]
    return [path for path in dict.fromkeys(paths) if os.path.exists(path)]


HIDDEN_FOLDERS = ("checks", "reference")  # never on the sandbox's disk: each runner gets its own build (`build`)


def course_paths(root: Path | None = None) -> list[str]:
    """What the sandbox may read of the course: the package's files and folders (src/transformer_course of an
    editable install, or its folder in site-packages) except the checks and the reference solution, which each
    runner receives as its notebook's grading build (`build`), and the checkout's assets/checkpoint when there is
    one. `root` is the checkout; None means the one holding this package when it is an editable install."""
    package = Path(__file__).resolve().parents[2]
    if root is None and package.parent.name == "src":
        root = package.parent.parent
    checkpoint = Path(root) / "assets" / "checkpoint" if root is not None else None
    shown = [str(entry) for entry in sorted(package.iterdir())
             if entry.name not in (*HIDDEN_FOLDERS, "__pycache__") and not entry.name.startswith(".")]
    return [*shown, *([str(checkpoint)] if checkpoint is not None and checkpoint.is_dir() else [])]


def own_copies(sandbox: Sandbox) -> tuple[dict[str, str], str]:
    """({course path: its copy}, the folder holding the copies) for the course files `sandbox` may read: every
    sandbox reads its own copy of them, shown at their usual paths, so no two sandboxes share a course file
    (its locks, its page cache, its access times). The copies go with the sandbox (`Confined.close`)."""
    folder = tempfile.mkdtemp(prefix=CGROUP_PREFIX + "course-")
    course = set(course_paths())
    copies = {}
    try:
        for path in sandbox.readable:
            where, _ = _walk(path)
            if where not in course or not os.path.exists(where):
                continue
            copy = os.path.join(folder, str(len(copies)), os.path.basename(where))
            if os.path.isdir(where):
                shutil.copytree(where, copy, ignore=shutil.ignore_patterns("__pycache__", ".*"), symlinks=False)
            else:
                os.makedirs(os.path.dirname(copy))
                shutil.copy2(where, copy)
            copies[where] = copy
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return copies, folder


def base_environment(home: str, tmp: str = "/tmp") -> dict[str, str]:
    """The whole environment a confined program starts from (the caller's `environment` is added)."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": home, "PWD": home,
            "USER": STUDENT, "LOGNAME": STUDENT, "LANG": "C.UTF-8", "TMPDIR": tmp, "XDG_CACHE_HOME": f"{tmp}/cache",
            "MPLCONFIGDIR": f"{tmp}/matplotlib", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}


# ---------------------------------------------------------------------------------------------
# The file system


def _walk(path: str) -> tuple[str, dict[str, str]]:
    """(where `path` really is, {symlink: its target} for each symlink met on the way), resolving `..`
    physically as the kernel does, so the sandbox can show the path both as given and as it is."""
    links: dict[str, str] = {}
    pending = [part for part in reversed(os.path.join(os.getcwd(), path).split("/")) if part]
    current = "/"
    for _ in range(1024):
        if not pending:
            return current, links
        part = pending.pop()
        if part == "..":
            current = os.path.dirname(current)
        elif part != ".":
            candidate = os.path.join(current, part)
            if os.path.islink(candidate):
                links[candidate] = target = os.readlink(candidate)
                current = "/" if target.startswith("/") else current
                pending += [step for step in reversed(target.split("/")) if step]
            else:
                current = candidate
    raise SandboxError(f"too many symbolic links on the way to {path}")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _outermost(folders: list[str]) -> list[str]:
    """The folders not inside another one of the list, without repeats, sorted."""
    unique = sorted(set(folders))
    return [folder for folder in unique if not any(other != folder and _inside(folder, other) for other in unique)]


def _system() -> tuple[list[str], dict[str, str]]:
    """(system folders to bind, {system symlink: target}) as this host has them (/lib a folder or a link)."""
    folders = [folder for folder in SYSTEM_FOLDERS if os.path.isdir(folder) and not os.path.islink(folder)]
    return folders, {folder: os.readlink(folder) for folder in SYSTEM_FOLDERS if os.path.islink(folder)}


def _layout(sandbox: Sandbox) -> tuple[list[str], dict[str, str]]:
    """(real paths to bind read-only, {symlink path: target} to recreate) for `sandbox.readable`."""
    private = ("/tmp", "/proc", "/dev", "/sys", sandbox.workdir)
    system_folders, system_links = _system()
    real, links = [], {}
    for path in sandbox.readable:
        where, met = _walk(path)
        if not os.path.exists(where):
            continue
        holds_private = any(_inside(folder, where) for folder in private)
        in_private = any(_inside(where, folder) for folder in private if folder != "/tmp")
        if holds_private or in_private:
            raise ValueError(f"{path} ({where}) cannot be made readable: the sandbox has its own {', '.join(private)}")
        real.append(where)
        links.update(met)
    binds = [folder for folder in _outermost([*system_folders, *real]) if folder not in system_folders]
    shown = [*system_folders, *binds]
    recreated = {link: target for link, target in links.items()
                 if link not in system_links and not any(_inside(link, folder) for folder in shown)}
    return binds, recreated


@lru_cache(maxsize=1)
def _kernel_tunables() -> tuple[str, ...]:
    """Entries of /proc (not per process) that hold writable files: mounted read-only over the
    sandbox's /proc, since the kernel lets uid 0 outside the namespace (the grader run as root) write
    many of them without any capability (kernel.core_pattern among them)."""
    entries = []
    for name in sorted(os.listdir("/proc")):
        path = f"/proc/{name}"
        if name.isdigit() or name in ("self", "thread-self") or os.path.islink(path):
            continue
        try:
            if os.path.isdir(path) or os.stat(path).st_mode & 0o222:
                entries.append(path)
        except OSError:
            continue
    return tuple(entries)


# Machine-wide counters a process can read in /proc: how busy the machine is, how many processes and threads
# it runs, how much memory is free, how many files are open. Two students' sandboxes graded at the same time
# could talk through them (300 idle threads in one, the thread count read in the other: issue 39), so each is
# shown with fixed contents. Per-process files (/proc/self, the sandbox's own processes) stay as they are.
MACHINE_COUNTERS = ("/proc/loadavg", "/proc/stat", "/proc/uptime", "/proc/meminfo", "/proc/vmstat",
                    "/proc/diskstats", "/proc/interrupts", "/proc/softirqs", "/proc/schedstat", "/proc/zoneinfo",
                    "/proc/buddyinfo", "/proc/pagetypeinfo", "/proc/locks", "/proc/swaps", "/proc/timer_list",
                    "/proc/sys/fs/file-nr", "/proc/sys/fs/inode-nr", "/proc/sys/fs/dentry-state",
                    "/proc/sys/fs/aio-nr", "/proc/sys/kernel/random/entropy_avail", "/proc/pressure/cpu",
                    "/proc/pressure/io", "/proc/pressure/memory", "/proc/pressure/irq")


def counter_files(limits: Limits) -> dict[str, str]:
    """{path: the fixed text the sandbox reads there} for the MACHINE_COUNTERS this host has: an idle machine of
    os.cpu_count() CPUs with the sandbox's memory limit all free; the boot time and the uptime as they are when
    the sandbox starts (a clock, the same for everyone: no counter of what others do)."""
    cpus = os.cpu_count() or 1
    zeros = " 0" * 10
    boot = 0
    with contextlib.suppress(OSError, ValueError, StopIteration):
        boot = int(next(line.split()[1] for line in Path("/proc/stat").read_text().splitlines()
                        if line.startswith("btime ")))
    uptime = "0.00"
    with contextlib.suppress(OSError, IndexError):
        uptime = Path("/proc/uptime").read_text().split()[0]
    memory = limits.memory_bytes // 1024
    pressure = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    fixed = {
        "/proc/loadavg": "0.00 0.00 0.00 1/1 1\n",
        "/proc/stat": (f"cpu {zeros}\n" + "".join(f"cpu{number}{zeros}\n" for number in range(cpus))
                       + f"intr 0\nctxt 0\nbtime {boot}\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n"
                       + f"softirq 0{zeros}\n"),
        "/proc/uptime": f"{uptime} 0.00\n",
        "/proc/meminfo": "".join(f"{key}:{value:>16} kB\n" for key, value in (
            ("MemTotal", memory), ("MemFree", memory), ("MemAvailable", memory), ("Buffers", 0), ("Cached", 0),
            ("SwapCached", 0), ("Active", 0), ("Inactive", 0), ("SwapTotal", 0), ("SwapFree", 0), ("Dirty", 0),
            ("Shmem", 0))),
        "/proc/sys/fs/file-nr": "0\t0\t0\n", "/proc/sys/fs/inode-nr": "0\t0\n",
        "/proc/sys/fs/dentry-state": "0\t0\t45\t0\t0\t0\n", "/proc/sys/fs/aio-nr": "0\n",
        "/proc/sys/kernel/random/entropy_avail": "256\n",
        **{f"/proc/pressure/{kind}": pressure for kind in ("cpu", "io", "memory", "irq")},
    }
    return {path: fixed.get(path, "") for path in MACHINE_COUNTERS if os.path.exists(path)}


# ---------------------------------------------------------------------------------------------
# Seccomp: a classic BPF program, written here so that no library is needed

SECCOMP_DENIED = {  # machine: (AUDIT_ARCH_*, system call numbers refused with EPERM, fcntl's number)
    # ptrace, syslog, process_vm_readv, process_vm_writev, kcmp, perf_event_open, userfaultfd, bpf,
    # add_key, request_key, keyctl, pidfd_getfd, process_madvise, io_uring_setup/enter/register,
    # move_pages, migrate_pages; then what lets two sandboxes observe each other through a file both can read
    # (the Python installation, the virtual environment): flock, inotify_init, inotify_init1, fanotify_init
    "x86_64": (0xC000003E, (101, 103, 310, 311, 312, 298, 323, 321, 248, 249, 250, 438, 440, 425, 426, 427,
                            279, 256, 73, 253, 294, 300), 72),
    "aarch64": (0xC00000B7, (117, 116, 270, 271, 272, 241, 282, 280, 217, 218, 219, 438, 440, 425, 426, 427,
                             239, 238, 32, 26, 262), 25),
}
# fcntl's commands that lock a file, ask about another process's lock, take a lease or watch a folder (dnotify):
# F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY
FCNTL_DENIED = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The filter's BPF instructions for this machine, None where its system call numbers are unknown.
    System calls of another ABI (32-bit, x32) are refused altogether; fcntl is refused for the commands of
    FCNTL_DENIED only (its second argument, an unsigned int: the low half of the 64-bit argument)."""
    entry = SECCOMP_DENIED.get(machine or platform.machine())
    if entry is None:
        return None
    arch, denied, fcntl = entry
    load, equal, at_least, give = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
    allow, refuse = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
    n, m = len(denied), len(FCNTL_DENIED)
    low_half = 16 + 8 * 1 + (0 if sys.byteorder == "little" else 4)  # seccomp_data.args[1]
    # layout: [0-4] architecture and ABI; [5, 5+n) refused calls -> EPERM; then "fcntl?" -> its command checks;
    # allow; the command checks; allow; EPERM
    program = [(load, 0, 0, 4), (equal, 1, 0, arch), (give, 0, 0, refuse | errno.ENOSYS), (load, 0, 0, 0),
               (at_least, n + m + 4, 0, 0x40000000),
               *[(equal, n + m + 3 - i, 0, number) for i, number in enumerate(denied)],
               (equal, 1, 0, fcntl), (give, 0, 0, allow),
               (load, 0, 0, low_half),
               *[(equal, m - i, 0, command) for i, command in enumerate(FCNTL_DENIED)],
               (give, 0, 0, allow), (give, 0, 0, refuse | errno.EPERM)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# ---------------------------------------------------------------------------------------------
# The bubblewrap command


def _data_fd(data: bytes) -> int:
    """A pipe's read end holding `data` (small enough for the pipe's buffer)."""
    read, write = os.pipe()
    try:
        os.write(write, data)
    finally:
        os.close(write)
    return read


def _bubblewrap_command(sandbox: Sandbox, argv: Sequence[str], info_fd: int, block_fd: int | None,
                        copies: Mapping[str, str] | None = None) -> tuple[list[str], list[int]]:
    """(the bwrap command line, the descriptors it reads that the caller must pass and then close)."""
    limits = sandbox.limits
    binds, links = _layout(sandbox)  # first: it may refuse the sandbox before any descriptor is open
    fds: list[int] = []
    command = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--uid", str(STUDENT_ID), "--gid", str(STUDENT_ID),
               "--disable-userns", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
               "--hostname", "sandbox", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
               "--cap-drop", "ALL", "--info-fd", str(info_fd)]
    if block_fd is not None:
        command += ["--block-fd", str(block_fd)]
    program = seccomp_program()
    if program is not None:
        fds.append(_data_fd(program))
        command += ["--seccomp", str(fds[-1])]
    system_folders, system_links = _system()
    for folder in system_folders:
        command += ["--ro-bind", folder, folder]
    for link, target in system_links.items():
        command += ["--symlink", target, link]
    command += [argument for path in HOST_FILES if os.path.exists(path) for argument in ("--ro-bind", path, path)]
    for path, text in GENERATED_FILES.items():
        fds.append(_data_fd(text.replace("{home}", sandbox.workdir).encode()))
        command += ["--perms", "0444", "--ro-bind-data", str(fds[-1]), path]
    command += ["--dev", "/dev", "--size", str(limits.shared_memory_bytes), "--perms", "1777", "--tmpfs", "/dev/shm",
                "--remount-ro", "/dev", "--proc", "/proc"]
    command += [argument for path in _kernel_tunables() for argument in ("--ro-bind", path, path)]
    for path, text in counter_files(limits).items():  # after the tunables: /proc/sys and /proc/pressure are among them
        fds.append(_data_fd(text.encode()))
        command += ["--perms", "0444", "--ro-bind-data", str(fds[-1]), path]
    command += ["--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
    copies = copies or {}
    command += [argument for path in binds for argument in ("--ro-bind", copies.get(path, path), path)]
    command += [argument for link, target in sorted(links.items()) for argument in ("--symlink", target, link)]
    command += ["--size", str(limits.work_bytes), "--perms", "0755", "--tmpfs", sandbox.workdir,
                "--remount-ro", "/", "--chdir", sandbox.workdir, "--", *argv]
    return command, fds


@lru_cache(maxsize=1)
def bubblewrap_problem() -> str | None:
    """None when bubblewrap can confine a Python program here exactly as `start` does, else why not
    (for the batch's loud warning)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (`bwrap`) is not installed; install Debian's `bubblewrap` package"
    probe = Sandbox(readable=tuple(python_paths()))
    try:
        process, _ = _launch(probe, [sys.executable, "-c", "pass"], None, DEVNULL, DEVNULL, PIPE, ())
        _, error = process.communicate(timeout=60)
    except (SandboxError, OSError, subprocess.TimeoutExpired) as problem:
        return f"bubblewrap cannot start a sandbox here: {problem}"
    if process.returncode != 0:
        return f"bubblewrap cannot create the sandbox here: {error.decode(errors='replace').strip()[:300]}"
    return None


def _limit_process(pid: int, limits: Limits) -> None:
    """Per-process limits, inherited by everything `pid` starts from now on."""
    for which, value in ((resource.RLIMIT_AS, limits.memory_bytes), (resource.RLIMIT_FSIZE, limits.file_bytes),
                         (resource.RLIMIT_CORE, 0)):
        resource.prlimit(pid, which, (value, value))


WAIT4 = {"x86_64": "61", "aarch64": "260"}  # the wait4 system call's number


def _await_reaper(pid: int, timeout: float = 2.0) -> None:
    """Return once the sandbox's first process (bubblewrap's reaper, pid 1 inside) waits for its
    children. It sets its parent-death signal just before: a grader that dies after this takes the
    sandbox with it, one that died a few milliseconds earlier would leave it orphaned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            waiting = Path(f"/proc/{pid}/wchan").read_text() == "do_wait" or \
                Path(f"/proc/{pid}/syscall").read_text().split()[0] == WAIT4.get(platform.machine())
        except (OSError, IndexError):
            waiting = False
        if waiting or process_state(pid) in ("", "Z", "X"):  # waiting, or already ended: nothing left to orphan
            return
        time.sleep(0.0005)


def _launch(sandbox: Sandbox, argv: Sequence[str], cgroup: _Cgroup | None, stdin, stdout, stderr,
            pass_fds: Sequence[int], copies: Mapping[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    """Start `argv` under bubblewrap; it runs only once it is in `cgroup` and limited. Returns
    (the bwrap process, the host pid of the sandbox's first process)."""
    command_fds: list[int] = []
    info_read, info_write = os.pipe()
    block_read, block_write = os.pipe()
    try:
        command, command_fds = _bubblewrap_command(sandbox, argv, info_write, block_read, copies)
        environment = {**base_environment(sandbox.workdir), **sandbox.environment}
        process = subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, env=environment,
                                   pass_fds=(info_write, block_read, *command_fds, *pass_fds))
    except BaseException:
        os.close(info_read)
        os.close(block_write)
        raise
    finally:
        for fd in (info_write, block_read, *command_fds):
            os.close(fd)
    inner = None
    try:
        with os.fdopen(info_read, "rb") as info:
            text = info.read()
        try:
            inner = int(json.loads(text)["child-pid"])
        except (ValueError, KeyError, TypeError):
            said = process.stderr.read().decode(errors="replace").strip()[:300] if process.stderr else ""
            raise SandboxError(f"bubblewrap stopped before the sandbox existed (exit status {process.wait()})"
                               + (f": {said}" if said else "")) from None
        if cgroup is not None:
            cgroup.add(process.pid)
            cgroup.add(inner)
        _limit_process(inner, sandbox.limits)
        os.write(block_write, b"go")
    except BaseException as problem:
        if inner is not None:  # before it sees the end of the block pipe and runs unlimited
            _signal(inner)
        process.kill()
        process.wait()
        if isinstance(problem, OSError):
            raise SandboxError(f"could not limit the sandbox: {problem}") from problem
        raise
    finally:
        os.close(block_write)
    _await_reaper(inner)
    return process, inner


# ---------------------------------------------------------------------------------------------
# Cgroups


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside its file system, type, super options) of every mount."""
    mounts = []
    with open("/proc/self/mountinfo", encoding="utf-8") as table:
        for line in table:
            left, _, right = line.partition(" - ")
            fields, details = left.split(), right.split()
            if len(fields) >= 5 and len(details) >= 3:
                point, root = (re.sub(r"\\([0-7]{3})", lambda code: chr(int(code[1], 8)), field)
                               for field in (fields[4], fields[3]))
                mounts.append((point, root, details[0], set(details[2].split(","))))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """{controller: this process's cgroup path}; the key "" is the cgroup v2 path."""
    own = {}
    with open("/proc/self/cgroup", encoding="utf-8") as table:
        for line in table:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(","):
                own[controller if hierarchy != "0" else ""] = path
    return own


def _folder(point: str, root: str, path: str) -> Path:
    relative = os.path.relpath(path, root) if _inside(path, root) else path.lstrip("/")
    return Path(point) / ("" if relative == "." else relative)


def _v2_parent(mounts, own) -> Path | None:
    """A cgroup v2 folder with the memory and pids controllers given to its children, where this
    process may create children: its own cgroup (the root, or one we may enable them in), else its
    parent's (the sandboxes become siblings of the grader's cgroup)."""
    for point, root, kind, _ in mounts:
        if kind != "cgroup2" or "" not in own:
            continue
        folder = _folder(point, root, own[""])
        for candidate in dict.fromkeys([folder, folder.parent if _inside(str(folder.parent), point) else folder]):
            try:
                if not {"memory", "pids"} <= set((candidate / "cgroup.controllers").read_text().split()):
                    continue
                if not {"memory", "pids"} <= set((candidate / "cgroup.subtree_control").read_text().split()):
                    (candidate / "cgroup.subtree_control").write_text("+memory +pids")
            except OSError:
                continue
            if os.access(candidate, os.W_OK):
                return candidate
    return None


def _v1_parents(mounts, own) -> tuple[Path, Path] | None:
    folders = {}
    for controller in ("memory", "pids"):
        for point, root, kind, options in mounts:
            if kind == "cgroup" and controller in options and controller in own:
                folders[controller] = _folder(point, root, own[controller])
    if len(folders) == 2 and all(os.access(folder, os.W_OK) for folder in folders.values()):
        return folders["memory"], folders["pids"]
    return None


@lru_cache(maxsize=1)
def _cgroup_parents() -> tuple[int, Path, Path] | None:
    """(cgroup version, folder for memory cgroups, folder for pids cgroups), or None where this
    process cannot make cgroups. Sandboxes left by graders that died are removed on the way."""
    try:
        mounts, own = _mounts(), _own_cgroups()
    except (OSError, ValueError):
        return None
    v2 = _v2_parent(mounts, own)
    v1 = None if v2 else _v1_parents(mounts, own)
    parents = (2, v2, v2) if v2 else (1, *v1) if v1 else None
    if parents is not None:
        for parent in dict.fromkeys(parents[1:]):
            _remove_abandoned(parent)
    return parents


def _remove_abandoned(parent: Path) -> None:
    """Empty cgroups of ours whose grader died (its sandboxes died with it). Never one with processes:
    a pid alone does not say whose it is (another pid namespace may share this cgroup parent)."""
    for folder in parent.glob(f"{CGROUP_PREFIX}*"):
        owner = folder.name[len(CGROUP_PREFIX):].split("-")[0]
        if owner.isdigit() and not _alive(int(owner)):
            try:
                folder.rmdir()
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@lru_cache(maxsize=1)
def _cpu_parent() -> Path | None:
    """The folder for cpu cgroups (the same as for memory under cgroup v2, the cpu hierarchy under v1), or
    None where no CPU share can be set here (the sandbox then runs without one)."""
    parents = _cgroup_parents()
    if parents is None:
        return None
    if parents[0] == 2:
        folder = parents[1]
        try:
            if "cpu" not in (folder / "cgroup.controllers").read_text().split():
                return None
            if "cpu" not in (folder / "cgroup.subtree_control").read_text().split():
                (folder / "cgroup.subtree_control").write_text("+cpu")
        except OSError:
            return None
        return folder
    try:
        mounts, own = _mounts(), _own_cgroups()
    except (OSError, ValueError):
        return None
    for point, root, kind, options in mounts:
        if kind == "cgroup" and "cpu" in options and "cpu" in own:
            folder = _folder(point, root, own["cpu"])
            return folder if os.access(folder, os.W_OK) else None
    return None


_sequence = count()


@dataclass
class _Cgroup:
    version: int
    memory: Path
    pids: Path
    cpu: Path | None = None

    @classmethod
    def create(cls, limits: Limits) -> _Cgroup | None:
        parents = _cgroup_parents()
        if parents is None:
            return None
        version, memory_parent, pids_parent = parents
        name = f"{CGROUP_PREFIX}{os.getpid()}-{next(_sequence)}"
        cpu_parent = _cpu_parent() if limits.cpus > 0 else None
        cgroup = cls(version, memory_parent / name, pids_parent / name,
                     cpu_parent / name if cpu_parent is not None else None)
        try:
            for folder in cgroup.folders:
                folder.mkdir(exist_ok=True)
            cgroup.configure(limits)
        except OSError:
            cgroup.remove()
            return None
        return cgroup

    @property
    def folders(self) -> list[Path]:
        return list(dict.fromkeys([self.memory, self.pids, *([self.cpu] if self.cpu is not None else [])]))

    def configure(self, limits: Limits) -> None:
        if self.version == 2:
            (self.memory / "memory.max").write_text(str(limits.memory_bytes))
            if (self.memory / "memory.swap.max").exists():
                (self.memory / "memory.swap.max").write_text("0")
        else:
            (self.memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            if (self.memory / "memory.memsw.limit_in_bytes").exists():  # no escape into swap
                (self.memory / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
        (self.pids / "pids.max").write_text(str(limits.processes))
        if self.cpu is not None:  # a share of the machine: a busy student cannot slow the others' cells
            period = 100_000
            quota = max(1_000, int(limits.cpus * period))
            if self.version == 2:
                (self.cpu / "cpu.max").write_text(f"{quota} {period}")
            else:
                (self.cpu / "cpu.cfs_period_us").write_text(str(period))
                (self.cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(pid))

    def processes(self) -> set[int]:
        found: set[int] = set()
        for folder in self.folders:
            try:
                found |= {int(pid) for pid in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def _counter(self, path: Path, key: str) -> int:
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def oom_kills(self) -> int:
        events = "memory.events" if self.version == 2 else "memory.oom_control"
        return self._counter(self.memory / events, "oom_kill")

    def fork_failures(self) -> int:
        return self._counter(self.pids / "pids.events", "max")

    def peak(self) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.memory / name).read_text())
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        if self.version == 2 and (self.memory / "cgroup.kill").exists():
            try:
                (self.memory / "cgroup.kill").write_text("1")
            except OSError:
                pass
        for _ in range(200):  # a fork bomb may still add processes between two rounds
            remaining = self.processes()
            if not remaining:
                return
            for pid in remaining:
                _signal(pid)
            time.sleep(0.005)

    def remove(self) -> None:
        self.kill()
        for folder in self.folders:
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy for a moment while the last processes exit
                    time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# The watchdog, where no cgroup can be made


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children = []
    for task in tasks:
        try:
            children += [int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: look at every process's parent
            return [other for other in map(int, filter(str.isdigit, os.listdir("/proc"))) if _parent(other) == pid]
        except OSError:
            continue
    return children


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants that exist now."""
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        if os.path.exists(f"/proc/{pid}"):
            found.append(pid)
            pending += _children(pid)
    return found


def process_state(pid: int) -> str:
    """The process's state letter (R, S, D, Z...), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _memory_of(pid: int) -> int:
    """Proportional set size in bytes (pages shared by forked processes counted once in all)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def _threads_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


class _Watchdog(threading.Thread):
    """Polls the sandbox's process tree every `period` seconds; over a limit, kills it all."""

    def __init__(self, root: int, limits: Limits, kill, period: float = 0.1):
        super().__init__(name=f"sandbox-watchdog-{root}", daemon=True)
        self.root, self.limits, self.kill, self.period = root, limits, kill, period
        self.reason: str | None = None
        self.peak = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            tree = process_tree(self.root)
            if not tree or (tree == [self.root] and process_state(self.root) == "Z"):  # the sandbox has ended
                return
            memory = sum(_memory_of(pid) for pid in tree)
            self.peak = max(self.peak, memory)
            if memory > self.limits.memory_bytes:
                self.reason = memory_reason(self.limits)
            elif sum(_threads_of(pid) for pid in tree) > self.limits.processes:
                self.reason = processes_reason(self.limits)
            if self.reason:
                self.kill()
                return
            self.stopped.wait(self.period)


def _amount(size: int) -> str:
    for unit, name in ((2**30, "GB"), (2**20, "MB"), (2**10, "KB")):
        if size >= unit:
            return f"{size / unit:.3g} {name}"
    return f"{size} bytes"


def memory_reason(limits: Limits) -> str:
    return f"the notebook's processes together used more than {_amount(limits.memory_bytes)} of memory"


def processes_reason(limits: Limits) -> str:
    return (f"the notebook's processes together tried to run more than {limits.processes} processes and "
            "threads at once")


# ---------------------------------------------------------------------------------------------
# Starting and ending


class Confined:
    """A program started by `start`: the handle to wait for it, end it and learn why it stopped."""

    def __init__(self, process: subprocess.Popen, limits: Limits, *, isolated: bool, cgroup: _Cgroup | None,
                 inner: int | None, private_folder: str | None, workdir: str = WORKDIR):
        self.process, self.pid, self.limits, self.isolated = process, process.pid, limits, isolated
        self._cgroup, self._inner, self._private_folder, self._workdir = cgroup, inner, private_folder, workdir
        self._proc: int | None = None  # /proc/<the sandbox's first process>, held open: that process, no other
        if isolated and inner is not None:
            with contextlib.suppress(OSError):
                self._proc = os.open(f"/proc/{inner}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.mechanism = f"cgroup v{cgroup.version}" if cgroup else "watchdog"
        self._watchdog = None if cgroup else _Watchdog(process.pid, limits, self.kill)
        self._closed = False
        self._final: tuple[str | None, int | None] | None = None
        if self._watchdog is not None:
            self._watchdog.start()

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def kill(self) -> None:
        """Kill every process of the sandbox (the call returns at once; `close` waits)."""
        if self._cgroup is not None:
            self._cgroup.kill()
        elif self._inner is not None:  # the sandbox's first process: its pid namespace dies with it
            _signal(self._inner)
        else:  # unconfined: stop the whole tree first so that nothing forks away, then kill it
            seen: set[int] = set()
            for _ in range(50):
                fresh = set(process_tree(self.process.pid)) - seen
                if not fresh:
                    break
                for pid in fresh:
                    _signal(pid, signal.SIGSTOP)
                seen |= fresh
            for pid in seen:
                _signal(pid)
        _signal(self.process.pid)

    def reason(self) -> str | None:
        """Which limit the sandbox's processes ran into, as a sentence for the student, or None: memory
        (the kernel, or the watchdog, killed processes) or processes (a fork or a new thread failed
        inside, or the watchdog killed the sandbox)."""
        if self._final is not None:
            return self._final[0]
        if self._watchdog is not None:
            return self._watchdog.reason
        if self._cgroup.oom_kills():
            return memory_reason(self.limits)
        if self._cgroup.fork_failures():
            return processes_reason(self.limits)
        return None

    def memory_peak_bytes(self) -> int | None:
        """The most memory the sandbox's processes used together, in bytes (cgroup: the kernel's peak,
        page cache and tmpfs included; watchdog: the largest sum of proportional set sizes it saw)."""
        if self._final is not None:
            return self._final[1]
        return self._watchdog.peak if self._watchdog is not None else self._cgroup.peak()

    def writable_folders(self) -> list[tuple[str, int]]:
        """[(the folder as the program sees it, a descriptor of it, open here)] for each folder the program may
        write (its working folder, /tmp, /dev/shm; unconfined: its private working folder and TMPDIR), for the
        grader to empty (`scratch`). [] once the sandbox has ended. The caller closes the descriptors.

        Under bubblewrap the folders are reached through the root of the sandbox's first process, as its
        /proc entry was opened when the sandbox started: a pid used again by another process after the sandbox
        ended is never followed (the entry held refers to the process it was opened for), and a folder that is
        the host's own is refused."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        found: list[tuple[str, int]] = []
        if not self.isolated:
            for name in (("work", "tmp") if self._private_folder is not None else ()):
                with contextlib.suppress(OSError):
                    path = os.path.join(self._private_folder, name)
                    found.append((path, os.open(path, flags)))
            return found
        if self._proc is None or self._closed:
            return found
        try:
            root = os.open("root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self._proc)
        except OSError:
            return found
        try:
            for inside, mode in ((self._workdir, 0o755), ("/tmp", 0o1777), ("/dev/shm", 0o1777)):  # as bwrap made them
                try:
                    descriptor = _open_own_folder(root, inside.lstrip("/"), flags, mode)
                except OSError:
                    continue
                try:
                    host = os.stat(inside).st_dev if os.path.exists(inside) else None
                except OSError:
                    host = None
                if os.fstat(descriptor).st_dev in (host, os.fstat(root).st_dev):  # not the sandbox's own tmpfs
                    os.close(descriptor)
                    continue
                found.append((inside, descriptor))
        finally:
            os.close(root)
        return found

    def close(self) -> None:
        """Kill what is left, wait, remove the cgroup and the private folder."""
        if self._closed:
            return
        self._closed = True
        if self._proc is not None:
            os.close(self._proc)
            self._proc = None
        try:
            self.kill()
            self.process.wait()
            if self._watchdog is not None:
                self._watchdog.stopped.set()
                self._watchdog.join()
            self._final = (self.reason(), self.memory_peak_bytes())
        finally:
            if self._cgroup is not None:
                self._cgroup.remove()
            if self._private_folder is not None:
                shutil.rmtree(self._private_folder, ignore_errors=True)
            for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
                if stream is not None:
                    stream.close()

    def __enter__(self) -> Confined:
        return self

    def __exit__(self, *exception) -> None:
        self.close()


def _open_own_folder(parent: int, path: str, flags: int, mode: int) -> int:
    """A descriptor of the folder `path` below `parent`, its permissions set back to `mode` first (the student owns
    it inside the sandbox and may have made it unreadable; outside, the grader's uid is its owner)."""
    handle = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        with contextlib.suppress(OSError):
            if stat.S_IMODE(os.fstat(handle).st_mode) != mode:
                os.chmod(f"/proc/self/fd/{handle}", mode)
        return os.open(path, flags, dir_fd=parent)
    finally:
        os.close(handle)


def _signal(pid: int, number: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, number)
    except OSError:
        pass


def start(sandbox: Sandbox, argv: Sequence[str], *, stdin=PIPE, stdout=PIPE, stderr=DEVNULL,
          pass_fds: Sequence[int] = ()) -> Confined:
    """Start `argv` confined by `sandbox` (see the module's docstring); raises SandboxError when the
    sandbox cannot be made although bubblewrap works here."""
    cgroup = _Cgroup.create(sandbox.limits)
    try:
        if sandbox.isolate and bubblewrap_problem() is None:
            copies, folder = own_copies(sandbox)
            try:
                process, inner = _launch(sandbox, argv, cgroup, stdin, stdout, stderr, pass_fds, copies)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            return Confined(process, sandbox.limits, isolated=True, cgroup=cgroup, inner=inner, private_folder=folder,
                            workdir=sandbox.workdir)
        return _start_unconfined(sandbox, argv, cgroup, stdin, stdout, stderr, pass_fds)
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise


def _start_unconfined(sandbox: Sandbox, argv: Sequence[str], cgroup: _Cgroup | None, stdin, stdout, stderr,
                      pass_fds: Sequence[int]) -> Confined:
    """Without bubblewrap: a private working folder and /tmp of our own, the limits, nothing more."""
    private = tempfile.mkdtemp(prefix=CGROUP_PREFIX)
    work, tmp = os.path.join(private, "work"), os.path.join(private, "tmp")
    os.mkdir(work)
    os.mkdir(tmp)
    try:
        environment = {**base_environment(work, tmp), **sandbox.environment}
        process = subprocess.Popen(list(argv), stdin=stdin, stdout=stdout, stderr=stderr, env=environment,
                                   cwd=work, pass_fds=tuple(pass_fds), start_new_session=True,
                                   preexec_fn=partial(_limit_process, 0, sandbox.limits))  # before it runs
    except subprocess.SubprocessError as problem:  # the limits could not be set in the child
        shutil.rmtree(private, ignore_errors=True)
        raise SandboxError(f"could not limit the program: {problem}") from problem
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    confined = Confined(process, sandbox.limits, isolated=False, cgroup=cgroup, inner=None, private_folder=private)
    try:
        if cgroup is not None:
            cgroup.add(process.pid)
    except OSError as problem:
        confined.close()
        raise SandboxError(f"could not limit the program: {problem}") from problem
    return confined
