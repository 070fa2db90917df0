"""The isolation primitive (grading/isolation.py) on its own: each property of a confined program is
proved by a small probe run inside, which prints as JSON what it could and could not do.

Skipped, with the reason, where this machine cannot make a sandbox (no bubblewrap, namespaces
refused) or a cgroup; under CI (CI=true) a missing bubblewrap fails instead."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from subprocess import DEVNULL, PIPE

import pytest

from conftest import MULTI30K_COPY, ROOT
from transformer_course.grading.sandbox import isolation
from transformer_course.grading.sandbox.isolation import (
    WORKDIR,
    Limits,
    Sandbox,
    base_environment,
    bubblewrap_problem,
    course_paths,
    memory_reason,
    processes_reason,
    python_paths,
    start,
)

PROBLEM = bubblewrap_problem()
IN_CI = os.environ.get("CI") == "true"
needs_bubblewrap = pytest.mark.skipif(PROBLEM is not None and not IN_CI, reason=f"no sandbox here: {PROBLEM}")
needs_cgroups = pytest.mark.skipif(isolation._cgroup_parents() is None,
                                   reason="the grader may make no cgroup here (the watchdog tests cover this case)")
DATA = MULTI30K_COPY if MULTI30K_COPY.is_dir() else None

PRELUDE = """
import errno, json, os, sys
def report(**results):
    print(json.dumps(results), flush=True)
def attempt(action):
    try:
        action()
        return "done"
    except OSError as error:
        return errno.errorcode.get(error.errno, type(error).__name__)
"""


def readable(*extra) -> tuple[str, ...]:
    return (*python_paths(), *course_paths(ROOT), *(str(path) for path in extra))


def confine(code: str, sandbox: Sandbox | None = None, *, limits: Limits | None = None, environment=None,
            pass_fds=(), timeout: float = 120):
    """Run `code` (after PRELUDE) confined; (its last JSON line or None, its stderr, the closed Confined)."""
    sandbox = sandbox or Sandbox(readable=readable(*([DATA] if DATA else [])), limits=limits or Limits(),
                                 environment=environment or {})
    program = [sys.executable, "-c", PRELUDE + textwrap.dedent(code)]
    with start(sandbox, program, stdin=DEVNULL, stdout=PIPE, stderr=PIPE, pass_fds=pass_fds) as confined:
        output, error = confined.process.communicate(timeout=timeout)
    lines = output.decode().strip().splitlines()
    return (json.loads(lines[-1]) if lines else None), error.decode(), confined


def outside_tmp() -> Path:
    """A host folder outside /tmp (the sandbox has its own /tmp, which would hide a folder there anyway)."""
    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else ROOT
    return Path(tempfile.mkdtemp(dir=base, prefix=".isolation-test-"))


@pytest.mark.skipif(not IN_CI, reason="only CI must have bubblewrap")
def test_bubblewrap_works_in_ci():
    assert PROBLEM is None, PROBLEM


@needs_bubblewrap
def test_file_system_holds_only_what_the_program_needs(tmp_path):
    secret = outside_tmp()
    try:
        (secret / "instructor.txt").write_text("secret")
        (tmp_path / "grader.txt").write_text("secret")
        hidden = [ROOT / name for name in ("lessons", "solutions", "autograde", "tests", ".git", "README.md")]
        hidden += [secret / "instructor.txt", tmp_path / "grader.txt", Path("/var"), Path("/run"),
                   Path("/etc/hostname"), Path("/etc/shadow"), Path("/sys/fs/cgroup"), Path("/sys/class")]
        shown = [sys.prefix, sys.base_prefix, *course_paths(ROOT), "/etc/ld.so.cache", "/usr/bin/env",
                 *([DATA, DATA.resolve()] if DATA else [])]
        results, error, _ = confine(f"""
            paths = {[str(path) for path in [*hidden, *shown]]!r}
            report(exists={{path: os.path.exists(path) for path in paths}}, root=sorted(os.listdir("/")),
                   etc=sorted(os.listdir("/etc")), home=sorted(os.listdir("/home")),
                   checkout=sorted(os.listdir({str(ROOT)!r})),
                   host_root=sorted(os.listdir("/root")) if os.path.isdir("/root") else [])
        """)
    finally:
        shutil.rmtree(secret)
    assert results, error
    assert [path for path in map(str, hidden) if results["exists"][path]] == []
    assert [path for path in map(str, shown) if not results["exists"][path]] == []
    assert set(results["checkout"]) <= {"src", "assets", ".venv"}, results["checkout"]
    needed_in_root = {Path(path).relative_to("/root").parts[0] for path in python_paths()
                      if Path(path).is_relative_to("/root")}
    assert set(results["host_root"]) <= needed_in_root, results["host_root"]
    assert results["home"] == ["student"]
    assert set(results["etc"]) <= {"ld.so.cache", "localtime", "fonts", "passwd", "group", "nsswitch.conf", "hosts"}
    assert not {"var", "run", "srv", "opt", "mnt", "boot"} & set(results["root"]), results["root"]


def test_paths_are_walked_as_the_kernel_resolves_them(tmp_path):
    base = tmp_path.resolve()
    (base / "real" / "data").mkdir(parents=True)
    (base / "checkout").mkdir()
    (base / "checkout" / "shared").symlink_to("../real/data")
    where, links = isolation._walk(str(base / "checkout" / "shared" / ".." / "data"))
    assert where == str(base / "real" / "data")  # `..` after the link is real/, not checkout/ (no normpath)
    assert links == {str(base / "checkout" / "shared"): "../real/data"}


@needs_bubblewrap
def test_course_and_data_under_tmp_and_through_a_symlink():
    """A CI checkout lies under `mktemp -d` with ../shared a symlink: all of it must stay visible."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="isolation-checkout-"))
    try:
        package = base / "checkout" / "src" / "transformer_course"
        shutil.copytree(Path(isolation.__file__).resolve().parents[2], package,
                        ignore=shutil.ignore_patterns("__pycache__"))
        data = outside_tmp()
        (data / "data" / "multi30k").mkdir(parents=True)
        (data / "data" / "multi30k" / "val.de").write_text("Ein Hund.\n")
        (base / "shared").symlink_to(data)
        through_link = base / "checkout" / ".." / "shared" / "data" / "multi30k"
        sandbox = Sandbox(readable=(*python_paths(), str(package), str(through_link)))
        try:
            results, error, _ = confine(f"""
                sys.path.insert(0, {str(base / "checkout" / "src")!r})
                import transformer_course.data.multi30k as multi30k
                report(module=multi30k.__file__, through_link=open({str(through_link / "val.de")!r}).read(),
                       real=open({str(data / "data" / "multi30k" / "val.de")!r}).read(),
                       base=sorted(os.listdir({str(base)!r})), link=os.readlink({str(base / "shared")!r}))
            """, sandbox)
        finally:
            shutil.rmtree(data)
    finally:
        shutil.rmtree(base)
    assert results, error
    assert results["module"].startswith(str(base))
    assert results["through_link"] == results["real"] == "Ein Hund.\n"
    assert results["base"] == ["checkout", "shared"] and results["link"] == str(data)


@needs_bubblewrap
def test_nothing_written_reaches_the_host():
    marker = f"isolation-marker-{os.getpid()}"
    gradebook = ROOT / "autograde" / "class" / "gradebook.db"
    limits = Limits(file_bytes=2**20)
    results, error, _ = confine(f"""
        import resource
        marker, package = {marker!r}, {course_paths(ROOT)[0]!r}
        writes = {{}}
        for folder in (os.getcwd(), "/tmp", "/dev/shm", package, sys.prefix, "/", "/etc", "/dev", "/home/student",
                       "/usr", "/sys/devices/system/cpu"):
            writes[folder] = attempt(lambda: open(os.path.join(folder, marker), "w").write("x"))
        writes["link"] = attempt(lambda: os.symlink({str(gradebook)!r}, marker + ".ipynb"))
        writes["tunable"] = attempt(lambda: open("/proc/sys/kernel/hostname", "w").write("x"))
        writes["big"] = attempt(lambda: open("/tmp/big", "wb").write(b"x" * (2 * 2**20)))
        mounts = []
        for line in open("/proc/self/mountinfo"):
            fields, kind = line.split(" - ")[0].split(), line.split(" - ")[1].split()[0]
            if "rw" in fields[5].split(","):
                mounts.append((fields[4], kind))
        sizes = {{folder: os.statvfs(folder).f_blocks * os.statvfs(folder).f_frsize
                 for folder in (os.getcwd(), "/tmp", "/dev/shm")}}
        report(writes=writes, mounts=mounts, sizes=sizes, cwd=os.getcwd(),
               core=resource.getrlimit(resource.RLIMIT_CORE), file=resource.getrlimit(resource.RLIMIT_FSIZE))
    """, limits=limits)
    assert results, error
    writes = results.pop("writes")
    assert {folder for folder, outcome in writes.items() if outcome == "done"} == {WORKDIR, "/tmp", "/dev/shm", "link"}
    assert writes["tunable"] in ("EROFS", "EACCES", "EPERM") and writes["big"] == "EFBIG", writes
    writable_kinds = {(point, kind) for point, kind in results["mounts"] if kind not in ("proc", "devpts", "devtmpfs")}
    assert writable_kinds == {(WORKDIR, "tmpfs"), ("/tmp", "tmpfs"), ("/dev/shm", "tmpfs")}, results["mounts"]
    assert results["sizes"] == {WORKDIR: Limits().work_bytes, "/tmp": Limits().tmp_bytes,
                                "/dev/shm": Limits().shared_memory_bytes}
    assert results["core"] == [0, 0] and results["file"] == [2**20, 2**20]
    for folder in (Path("/tmp"), Path("/dev/shm"), ROOT, Path(course_paths(ROOT)[0]), Path(sys.prefix)):
        assert not (folder / marker).exists() and not (folder / f"{marker}.ipynb").exists()


@needs_bubblewrap
def test_filling_the_working_folder_or_tmp_gets_no_space_left():
    results, error, _ = confine("""
        def fill(path):
            written, block = 0, b"x" * 2**23
            with open(path, "wb") as file:
                try:
                    while written < 2**30:
                        written += file.write(block)
                        file.flush()
                except OSError as failure:
                    return errno.errorcode[failure.errno], written
            return "done", written
        report(work=fill("big"), tmp=fill("/tmp/big"))
    """)
    assert results, error
    assert results["work"][0] == "ENOSPC" and results["work"][1] <= Limits().work_bytes
    assert results["tmp"][0] == "ENOSPC" and results["tmp"][1] <= Limits().tmp_bytes


@pytest.mark.parametrize("isolate", [True, False])
def test_environment_is_made_from_scratch(monkeypatch, isolate):
    if isolate and PROBLEM is not None and not IN_CI:
        pytest.skip(f"no sandbox here: {PROBLEM}")
    monkeypatch.setenv("COURSE_GRADER_SECRET", "the gradebook password")
    given = {"MULTI30K_DIR": "/data/multi30k", "OMP_NUM_THREADS": "1"}
    sandbox = Sandbox(readable=readable(), environment=given, isolate=isolate)
    results, error, confined = confine("report(environment=dict(os.environ), cwd=os.getcwd())", sandbox)
    assert results, error
    assert confined.isolated is isolate
    if isolate:
        assert results["environment"] == {**base_environment(WORKDIR), **given}
    else:  # a private folder of the grader's machine, removed afterwards
        work = results["cwd"]
        assert results["environment"] == {**base_environment(work, str(Path(work).parent / "tmp")), **given}
        assert not Path(work).exists()


@needs_bubblewrap
def test_unprivileged_and_unable_to_trace_or_escalate():
    results, error, _ = confine("""
        import ctypes, signal, time
        libc = ctypes.CDLL(None, use_errno=True)
        status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
        def call(function, *arguments):
            return "done" if function(*arguments) == 0 else errno.errorcode[ctypes.get_errno()]
        child = os.fork()
        if child == 0:
            time.sleep(30)
            os._exit(0)
        traced = call(libc.ptrace, 16, child, None, None)  # PTRACE_ATTACH to a process of our own
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        keyring = "done" if libc.syscall(250 if os.uname().machine == "x86_64" else 219, 0, -3, 0) >= 0 \\
            else errno.errorcode[ctypes.get_errno()]  # keyctl(KEYCTL_GET_KEYRING_ID, user keyring)
        namespace = call(libc.unshare, 0x10000000)  # CLONE_NEWUSER
        writable = []
        for top in os.listdir("/proc"):
            if top.isdigit() or top in ("self", "thread-self"):
                continue
            if os.path.isfile("/proc/" + top) and os.access("/proc/" + top, os.W_OK):
                writable.append("/proc/" + top)
            for folder, _, files in os.walk(os.path.join("/proc", top)):
                writable += [os.path.join(folder, name) for name in files
                             if os.access(os.path.join(folder, name), os.W_OK)]
        report(uid=os.getuid(), gid=os.getgid(), groups=os.getgroups(), traced=traced, keyring=keyring,
               namespace=namespace, writable=writable, seccomp=status["Seccomp"].strip(),
               no_new_privileges=status["NoNewPrivs"].strip(),
               capabilities={name: status[name].strip() for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")})
    """)
    assert results, error
    assert results["traced"] == "EPERM" and results["keyring"] == "EPERM", results
    assert results["namespace"] in ("EPERM", "ENOSPC", "EUSERS"), results
    assert results["writable"] == [], "kernel files the sandbox may write: " + ", ".join(results["writable"][:10])
    assert (results["uid"], results["gid"]) == (1000, 1000) and set(results["groups"]) <= {1000}
    assert set(results["capabilities"].values()) == {"0000000000000000"}, results["capabilities"]
    assert results["no_new_privileges"] == "1" and results["seccomp"] == "2"


@needs_bubblewrap
def test_a_non_dumpable_process_keeps_its_memory_from_the_others():
    """What the runner's sealed child relies on: with ptrace refused and no capabilities, a process that
    made itself non-dumpable cannot be read through /proc/PID/mem by another process of the sandbox.
    (A dumpable one can: same user; the test shows both.)"""
    results, error, _ = confine("""
        import ctypes, time
        libc = ctypes.CDLL(None, use_errno=True)
        def peek(dumpable):
            read, write = os.pipe()
            child = os.fork()
            if child == 0:
                libc.prctl(4, dumpable, 0, 0, 0)  # PR_SET_DUMPABLE
                secret = b"hidden test source " * 4
                os.write(write, str(id(secret)).encode())
                time.sleep(30)
                os._exit(0)
            address = int(os.read(read, 100))
            try:
                with open(f"/proc/{child}/mem", "rb") as memory:
                    memory.seek(address)
                    outcome = "read" if b"hidden test" in memory.read(200) else "not found"
            except OSError as failure:
                outcome = errno.errorcode[failure.errno]
            os.kill(child, 9)
            os.waitpid(child, 0)
            return outcome
        report(dumpable=peek(1), sealed=peek(0))
    """)
    assert results, error
    assert results["dumpable"] == "read" and results["sealed"] in ("EACCES", "EPERM"), results


@needs_bubblewrap
def test_no_network_no_host_sockets():
    listener = socket.create_server(("127.0.0.1", 0))
    folder = outside_tmp()
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(folder / "grader.sock"))
    unix.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0course-isolation-test-{os.getpid()}")
    abstract.listen()
    try:
        results, error, _ = confine(f"""
            import socket
            def connect(family, address):
                with socket.socket(family) as client:
                    client.settimeout(3)
                    return attempt(lambda: client.connect(address))
            report(tcp=connect(socket.AF_INET, ("127.0.0.1", {listener.getsockname()[1]})),
                   internet=connect(socket.AF_INET, ("1.1.1.1", 53)),
                   unix=connect(socket.AF_UNIX, {str(folder / "grader.sock")!r}),
                   abstract=connect(socket.AF_UNIX, "\\0course-isolation-test-{os.getpid()}"))
        """)
    finally:
        for server in (listener, unix, abstract):
            server.close()
        shutil.rmtree(folder)
    assert results, error
    assert results["tcp"] == "ECONNREFUSED" and results["abstract"] == "ECONNREFUSED", results
    assert results["internet"] in ("ENETUNREACH", "EHOSTUNREACH"), results
    assert results["unix"] == "ENOENT", results


@needs_bubblewrap
def test_own_namespaces_hide_host_processes():
    host = {name: os.readlink(f"/proc/self/ns/{name}") for name in ("user", "net", "pid", "ipc", "uts", "mnt")}
    results, error, _ = confine(f"""
        try:
            os.kill({os.getpid()}, 0)
            signalled = "done"
        except OSError as failure:
            signalled = type(failure).__name__
        report(namespaces={{name: os.readlink("/proc/self/ns/" + name) for name in {sorted(host)!r}}},
               processes=sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit()), signalled=signalled)
    """)
    assert results, error
    assert [name for name in host if results["namespaces"][name] == host[name]] == []
    assert len(results["processes"]) <= 3 and os.getpid() not in results["processes"]  # bubblewrap's init, us
    assert results["signalled"] == "ProcessLookupError"


@needs_bubblewrap
def test_machine_wide_counters_read_the_same_whatever_the_machine_does():
    """A classmate's sandbox held 300 idle threads; another read the machine's thread count in /proc/loadavg
    (issue 39). Every machine-wide counter of /proc reads fixed text; the sandbox's own processes stay visible."""
    import threading

    probe = f"""
        counters = {{}}
        for path in {isolation.MACHINE_COUNTERS!r}:
            try:
                counters[path] = open(path).read()
            except OSError as error:
                counters[path] = type(error).__name__
        report(counters=counters, own=os.path.exists("/proc/self/status"))
    """
    quiet, error, _ = confine(probe)
    assert quiet, error
    stop = threading.Event()
    busy = [threading.Thread(target=stop.wait, daemon=True) for _ in range(300)]
    for thread in busy:
        thread.start()
    try:
        crowded, error, _ = confine(probe)
    finally:
        stop.set()
    assert crowded, error
    fixed = isolation.counter_files(Limits())
    for path, text in crowded["counters"].items():
        if path in fixed and path != "/proc/uptime":  # a clock, the same for everyone: read as it is at the start
            assert text == quiet["counters"][path] == fixed[path], path
    assert crowded["counters"]["/proc/loadavg"] == "0.00 0.00 0.00 1/1 1\n"
    assert crowded["own"]


@needs_bubblewrap
def test_descriptors_reach_the_program_and_nothing_else_does():
    read, write = os.pipe()
    sandbox = Sandbox(readable=readable())
    program = [sys.executable, "-c", textwrap.dedent(f"""
        import os, sys
        line = sys.stdin.readline()
        os.write({write}, line.upper().encode())
        print(sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
    """)]
    with start(sandbox, program, pass_fds=(write,)) as confined:
        os.close(write)
        output, _ = confined.process.communicate(b"hello from the grader\n", timeout=60)
    with os.fdopen(read, "rb") as channel:
        assert channel.read() == b"HELLO FROM THE GRADER\n"
    descriptors = set(json.loads(output))
    assert {0, 1, 2, write} < descriptors and len(descriptors) == 5  # the fifth: the listing's own


@needs_bubblewrap
def test_sandbox_dies_with_its_parent():
    read, write = os.pipe()
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from transformer_course.grading.sandbox.isolation import Sandbox, python_paths, start
        confined = start(Sandbox(readable=tuple(python_paths())),
                         [sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=({write},))
        print(confined.pid, flush=True)
        time.sleep(60)
    """)], pass_fds=(write,), stdout=PIPE)
    os.close(write)
    try:
        bubblewrap = int(parent.stdout.readline())
        parent.kill()
        parent.wait()
        # every holder of the pipe's other end (the program, bubblewrap) is gone: end of file
        assert select.select([read], [], [], 15)[0] and os.read(read, 1) == b"", "the sandbox outlived its parent"
        assert isolation.process_state(bubblewrap) in ("", "Z")
    finally:
        os.close(read)
        parent.kill()
        parent.stdout.close()
    parents = isolation._cgroup_parents()
    for folder in (parents[1:] if parents else ()):
        for leftover in folder.glob(f"{isolation.CGROUP_PREFIX}{parent.pid}-*"):
            for _ in range(100):  # exiting processes leave the cgroup a moment after closing their files
                if not (leftover / "cgroup.procs").read_text().split():
                    break
                select.select([], [], [], 0.05)
            assert not (leftover / "cgroup.procs").read_text().split()  # empty: its processes died too
            leftover.rmdir()


def _build_pipe(checks: str) -> int:
    """A pipe's read end from which a confined program reads a grading build (as a runner gets it on its channel)."""
    import threading

    from transformer_course.grading.sandbox import build

    data = json.dumps(build.grading_build(checks)).encode()
    read, write = os.pipe()

    def feed() -> None:
        with os.fdopen(write, "wb") as handle:
            handle.write(data)

    threading.Thread(target=feed, daemon=True).start()
    return read


BUILD_FROM_FD = """
from transformer_course.grading.sandbox import build
with os.fdopen({fd}, "rb") as handle:
    build.install({{name: tuple(entry) for name, entry in json.loads(handle.read()).items()}})
"""


@needs_bubblewrap
def test_the_sandbox_holds_neither_the_checks_nor_the_reference():
    """Only the runner's build (sent over its channel) brings them: the course's folders are not shown."""
    package = Path(isolation.__file__).resolve().parents[2]
    results, error, _ = confine(f"""
        import importlib
        found = {{}}
        for name in ("transformer_course.checks", "transformer_course.reference", "transformer_course.runtime"):
            try:
                importlib.import_module(name)
                found[name] = "imported"
            except ImportError as problem:
                found[name] = type(problem).__name__
        report(found=found, listed=sorted(os.listdir({str(package)!r})))
    """)
    assert results, error
    assert results["found"] == {"transformer_course.checks": "ModuleNotFoundError",
                                "transformer_course.reference": "ModuleNotFoundError",
                                "transformer_course.runtime": "imported"}
    assert not {"checks", "reference"} & set(results["listed"])


@needs_bubblewrap
def test_torch_and_the_checks_run_confined():
    fd = _build_pipe("transformer_course.checks.positional_encoding")
    results, error, _ = confine(BUILD_FROM_FD.format(fd=fd) + textwrap.dedent(f"""
        import torch, matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt, spacy
        from transformer_course.checks import framework
        from transformer_course.reference.checkpoint import pretrained_path
        plt.plot([1, 2])
        plt.savefig("/tmp/figure.png")
        report(product=float((torch.ones(2, 3) @ torch.ones(3)).sum()), run_check=hasattr(framework, "run_check"),
               words=[token.text for token in spacy.blank("de")("Ein Hund läuft.")],
               checkpoint=str(pretrained_path()), data=sorted(os.listdir({str(DATA)!r})) if {bool(DATA)} else [])
    """), timeout=300, pass_fds=(fd,))
    os.close(fd)
    assert results, error
    assert results["product"] == 6.0
    assert results["run_check"] and results["words"] == ["Ein", "Hund", "läuft", "."]
    assert results["checkpoint"].startswith(str(ROOT / "assets" / "checkpoint"))
    assert error == "", error  # no library complains about a file it looked for and did not find
    if DATA:
        assert "val.de.gz" in results["data"]


LOCKS = """
import ctypes, fcntl, struct, time
libc = ctypes.CDLL(None, use_errno=True)
shared = os.path.join(os.path.dirname(os.__file__), "os.py")  # a file every sandbox can read
handle = open(shared, "rb")
lock = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)
def raw(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), "refused")
results = dict(
    flock=attempt(lambda: fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)),
    setlk=attempt(lambda: fcntl.fcntl(handle, fcntl.F_SETLK, lock)),
    setlkw=attempt(lambda: fcntl.fcntl(handle, fcntl.F_SETLKW, lock)),
    getlk=attempt(lambda: fcntl.fcntl(handle, fcntl.F_GETLK, lock)),
    ofd_setlk=attempt(lambda: fcntl.fcntl(handle, 37, lock)),
    ofd_getlk=attempt(lambda: fcntl.fcntl(handle, 36, lock)),
    lease=attempt(lambda: fcntl.fcntl(handle, 1024, fcntl.F_RDLCK)),
    lockf=attempt(lambda: fcntl.lockf(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)),
    inotify=attempt(lambda: raw(libc.inotify_init1(0))),
    fanotify=attempt(lambda: raw(libc.fanotify_init(0, 0))),
    ordinary=attempt(lambda: fcntl.fcntl(handle, fcntl.F_GETFD)),
    nonblocking=attempt(lambda: fcntl.fcntl(handle, fcntl.F_SETFL, os.O_NONBLOCK)),
)
time.sleep({hold})
report(**results)
"""


@needs_bubblewrap
def test_files_both_sandboxes_read_carry_no_lock_and_no_watch():
    """flock, fcntl's locks and leases, inotify and fanotify are refused (EPERM), so two sandboxes that read the
    same file (the Python installation, the virtual environment) cannot see each other through it; fcntl's other
    commands still work."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda hold: confine(LOCKS.format(hold=hold)), (3, 0)))
    for results, error, _ in both:
        assert results, error
        refused = {name: value for name, value in results.items() if name not in ("ordinary", "nonblocking")}
        assert set(refused.values()) == {"EPERM"}, results
        assert results["ordinary"] == results["nonblocking"] == "done"


@needs_bubblewrap
def test_every_sandbox_reads_its_own_copy_of_the_course_files():
    """The course's files are shown at their usual paths, but each sandbox's are a copy of its own (another file
    than the host's and than the other sandbox's): nothing of them (a lock, the page cache, an access time) is
    shared; the copies go with the sandbox."""
    from concurrent.futures import ThreadPoolExecutor

    files = [str(Path(path) / "__init__.py") if Path(path).is_dir() else path for path in course_paths(ROOT)
             if Path(path).suffix == ".py" or (Path(path) / "__init__.py").is_file()]
    code = f"report(files={{path: [os.stat(path).st_dev, os.stat(path).st_ino] for path in {files!r}}})"
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: confine(code), range(2)))
    seen = []
    for results, error, confined in both:
        assert results, error
        assert confined._private_folder is not None and not os.path.exists(confined._private_folder)
        seen.append({path: tuple(value) for path, value in results["files"].items()})
    host = {path: (os.stat(path).st_dev, os.stat(path).st_ino) for path in files}
    assert set(seen[0]) == set(files) and files
    for path in files:
        assert len({host[path], seen[0][path], seen[1][path]}) == 3, path


@needs_bubblewrap
def test_ipython_and_the_course_need_no_lock():
    """The runner's shell keeps no history (IPython's history is an sqlite file, and sqlite locks it with fcntl)."""
    results, error, _ = confine("""
        from transformer_course.grading.sandbox.runner import CellRecorder, make_shell
        shell = make_shell({}, [CellRecorder()])
        result = shell.run_cell("1 + 1", store_history=True)
        report(ok=result.success, history=type(shell.history_manager).__name__ if shell.history_manager else None,
               enabled=bool(getattr(shell.history_manager, "enabled", False)))
    """)
    assert results, error
    assert results["ok"] and not results["enabled"], results


ALLOCATING_CHILDREN = """
import signal, time
children = []
for _ in range(3):
    child = os.fork()
    if child == 0:
        block = b"x" * (150 * 2**20)  # written, so really resident
        time.sleep(2)
        os._exit(0)
    children.append(child)
report(killed=[os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
               for status in (os.waitpid(child, 0)[1] for child in children)])
"""


@needs_cgroups
def test_memory_limit_holds_for_all_processes_together():
    """Three children of 150 MB each: each under the per-process limit, together over the sandbox's."""
    results, error, confined = confine(ALLOCATING_CHILDREN, limits=Limits(memory_bytes=300 * 2**20))
    assert confined.mechanism.startswith("cgroup")
    assert results, error
    assert -signal.SIGKILL in results["killed"], results
    assert confined.reason() == memory_reason(Limits(memory_bytes=300 * 2**20))
    assert confined.memory_peak_bytes() <= 300 * 2**20


FORKING = """
import time
children, failures = 0, []
for _ in range(300):  # bounded, so that a machine whose limit failed is not flooded
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        children += 1
    except OSError as failure:
        failures.append(type(failure).__name__)
    time.sleep(0.002)
report(children=children, failures=sorted(set(failures)))
"""


@needs_cgroups
def test_a_fork_bomb_meets_the_process_limit():
    limits = Limits(processes=48)
    results, error, confined = confine(FORKING, limits=limits)
    assert results, error
    assert results["failures"] == ["BlockingIOError"] and results["children"] < limits.processes, results
    assert confined.reason() == processes_reason(limits)
    assert not any(folder.exists() for folder in confined._cgroup.folders)  # all killed, the cgroup removed


@pytest.fixture
def watchdog_only(monkeypatch):
    """As on a machine where the grader may make no cgroup."""
    monkeypatch.setattr(isolation._Cgroup, "create", classmethod(lambda cls, limits: None))


def test_watchdog_stops_memory_across_forks(watchdog_only):
    limits = Limits(memory_bytes=300 * 2**20)
    sandbox = Sandbox(readable=readable(), limits=limits, isolate=PROBLEM is None)
    results, error, confined = confine(ALLOCATING_CHILDREN, sandbox)
    assert confined.mechanism == "watchdog"
    assert results is None, results  # the whole sandbox was killed before its children finished
    assert confined.reason() == memory_reason(limits)
    assert confined.memory_peak_bytes() > 300 * 2**20


def test_watchdog_stops_a_fork_bomb(watchdog_only):
    limits = Limits(processes=32)
    sandbox = Sandbox(readable=readable(), limits=limits, isolate=PROBLEM is None)
    results, error, confined = confine(FORKING, sandbox)
    assert results is None and confined.reason() == processes_reason(limits)


def test_without_bubblewrap_the_limits_still_apply():
    sandbox = Sandbox(readable=readable(), limits=Limits(memory_bytes=2**30), isolate=False)
    results, error, confined = confine(f"""
        import resource
        try:
            bytearray(2 * 2**30)
            memory = "allocated"
        except MemoryError:
            memory = "MemoryError"
        report(memory=memory, address_space=resource.getrlimit(resource.RLIMIT_AS)[0],
               sees_lessons=os.path.isdir({str(ROOT / "lessons")!r}))
    """, sandbox)
    assert results, (error, confined.reason(), confined.process.returncode, confined.mechanism)
    assert not confined.isolated
    assert results["memory"] == "MemoryError" and results["address_space"] == 2**30
    assert results["sees_lessons"]  # what the batch's loud warning is about


def test_missing_bubblewrap_is_reported_and_runs_unconfined(monkeypatch):
    isolation.bubblewrap_problem.cache_clear()
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    try:
        assert "not installed" in isolation.bubblewrap_problem()
        results, error, confined = confine("report(pid=os.getpid())")
        assert results and not confined.isolated
    finally:
        isolation.bubblewrap_problem.cache_clear()


def test_readable_paths_may_not_hide_what_the_sandbox_provides():
    for path in ("/", "/tmp", "/proc/self", "/home"):
        with pytest.raises(ValueError):
            isolation._layout(Sandbox(readable=(path,)))


BUSY = """
import time
children = []
for _ in range(4):
    child = os.fork()
    if child == 0:
        end = time.time() + 2.0
        while time.time() < end:
            pass
        os._exit(0)
    children.append(child)
for child in children:
    os.waitpid(child, 0)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
report(cpu=usage.ru_utime + usage.ru_stime)
"""


@needs_cgroups
def test_a_busy_student_gets_only_its_share_of_the_cpu():
    """Four processes spinning for 2 s under a share of half a core use about 1 CPU second, not 8: a
    student's busy loops cannot slow the other students' cells into their time limits."""
    import transformer_course.grading.sandbox.isolation as isolation_module

    if isolation_module._cpu_parent() is None:
        pytest.skip("no cpu cgroup can be made here")
    results, error, confined = confine("import resource\n" + BUSY, limits=Limits(cpus=0.5))
    assert results, error
    assert results["cpu"] < 1.6, results
