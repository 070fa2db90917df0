"""The grader's side of the channel to one student's sandboxed processes (`runner`).

`Session` starts the student's zygote (by default confined by `isolation`), reads its messages through
`channel` (nothing but plain values, every size bounded) and drives it: a runner per notebook, its
ordinary cells, a `Servant` per grade cell (the grader's proxy of the throwaway process that runs the
checks' experiments), snapshots for hidden tests. It holds no descriptor the student's processes could
use against it: they get the two pipes of the channel and nothing else (their standard error is a pipe
this side drains into a bounded buffer), and it stops them from outside, with signals to their processes
(a cell out of time, a servant that does not answer) and by ending, after every cell, whatever process the
cell left behind.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_course.checks.boundary import Frame, StudentError, as_exception
from transformer_course.grading.sandbox import channel, profiling, scratch
from transformer_course.grading.sandbox.isolation import process_state, process_tree
from transformer_course.grading.sandbox.outputs import MalformedOutputs, cell_outputs
from transformer_course.grading.sandbox.runner import PRIVATE_FOLDERS, PRIVATE_SHM

MAX_CELL_MESSAGE = 16 * 2**20  # a cell's outputs, as the runner sends them
WRITE_STALL = 30.0  # seconds the student's side may leave a request of the grader's unread before it is ended
MAX_NOTES = 64  # notes of the watcher kept per servant (a flood of forged notes costs the grader nothing)
NOTE_KINDS = frozenset({"reference", "subclass"})  # the watch notes nothing else (executor.NOTE_WORDS)
_STATUS = re.compile(r"(?:signal|exit) -?[0-9]{1,4}|interrupted|no such snapshot|no such runner|\?")
KERNEL_DIED = ("the Python process running your notebook stopped while running this cell (os._exit, a crash in "
               "native code, or more memory than allowed); this cell scores 0, the cells after it still ran")


class ChannelBroken(Exception):
    """The student's side sent something that is not a message of the protocol (or nothing at all)."""


class RunnerDied(Exception):
    """The notebook's runner process ended (the message says how)."""


class CellTimedOut(TimeoutError):
    """A cell ran past its time limit and was stopped; args[0] holds the outputs it had by then."""


SERVANT_ENDED = "the process running this cell's checks ended"  # its end reported: the runner is sound


class ServantFailed(BaseException):
    """The process running a grade cell's experiments ended, broke the protocol or ran out of time. A
    BaseException, so that no check's `except Exception` mistakes it for the student's code crashing."""


# --- launching a zygote --------------------------------------------------------------------------------------


Launcher = Callable[..., Any]


class PlainProcess(subprocess.Popen):
    """The zygote without a sandbox, in a private working folder and TMPDIR removed at close."""

    def __init__(self, argv: list[str], private: str, **kwargs: Any) -> None:
        self.private = private
        super().__init__(argv, **kwargs)

    def close(self) -> None:
        shutil.rmtree(self.private, ignore_errors=True)

    def writable_folders(self) -> list[tuple[str, int]]:
        """The private working folder and TMPDIR, open here (see `isolation.Confined.writable_folders`)."""
        found = []
        for name in ("work", "tmp"):
            path = os.path.join(self.private, name)
            with contextlib.suppress(OSError):
                found.append((path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)))
        return found


def plain_launcher(argv: list[str], *, environment: dict[str, str], stderr: Any) -> subprocess.Popen:
    """Start the zygote without a sandbox (tests of the runner itself), in folders of its own."""
    private = tempfile.mkdtemp(prefix="course-runner-")
    work, tmp = os.path.join(private, "work"), os.path.join(private, "tmp")
    os.mkdir(work)
    os.mkdir(tmp)
    environment = {**environment, "TMPDIR": tmp, PRIVATE_FOLDERS: "1"}
    return PlainProcess(argv, private, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                        env=environment, cwd=work, start_new_session=True)


class ConfinedProcess:
    """`isolation.Confined` with the Popen-like face `Session` talks to."""

    def __init__(self, confined: Any) -> None:
        self.confined = confined
        self.stdin, self.stdout = confined.process.stdin, confined.process.stdout
        self.pid = confined.pid

    def poll(self) -> int | None:
        return self.confined.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.confined.wait(timeout)

    def kill(self) -> None:
        self.confined.kill()

    def reason(self) -> str | None:
        return self.confined.reason()

    def writable_folders(self) -> list[tuple[str, int]]:
        return self.confined.writable_folders()

    def close(self) -> None:
        self.confined.close()


def sandboxed_launcher(readable: list[str] | None = None, limits: Any = None, isolate: bool = True,
                       course_root: Any = None) -> Launcher:
    """A launcher that confines the zygote (`isolation`): it reads only the Python environment, the course
    package and checkpoint, and the data folder it is given."""
    from transformer_course.grading.sandbox import isolation

    def launch(argv: list[str], *, environment: dict[str, str], stderr: Any) -> Any:
        from transformer_course.data import multi30k, token_cache

        data = [environment[name] for name in (multi30k.ENVIRONMENT_VARIABLE, token_cache.ENVIRONMENT_VARIABLE)
                if environment.get(name)]  # the data folders the notebooks may read
        if isolate and isolation.bubblewrap_problem() is None:
            environment = {**environment, PRIVATE_SHM: "1"}  # the sandbox's own /dev/shm: emptied between notebooks
        sandbox = isolation.Sandbox(
            readable=tuple(readable or [*isolation.python_paths(), *isolation.course_paths(course_root), *data]),
            environment=environment, limits=limits or isolation.Limits(), isolate=isolate)
        return ConfinedProcess(isolation.start(sandbox, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=stderr))

    return launch


def grading_environment(threads: int, data_folder: str | None = None) -> dict[str, str]:
    """The whole environment of a student's runner (added to the sandbox's base environment)."""
    from transformer_course.data.multi30k import ENVIRONMENT_VARIABLE as MULTI30K_DIR
    from transformer_course.data.token_cache import ENVIRONMENT_VARIABLE as TOKENS

    environment = {"NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg", "PLOTLY_RENDERER": "plotly_mimetype",
                   "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                   PRIVATE_FOLDERS: "1"}
    data = data_folder or os.environ.get(MULTI30K_DIR)
    if data:
        environment[MULTI30K_DIR] = data
        tokens = os.environ.get(TOKENS)  # Multi30k tokenised by the grader (data.token_cache), read-only here
        if tokens and os.path.isdir(tokens):
            environment[TOKENS] = tokens
    return environment


# --- processes seen from outside -----------------------------------------------------------------------------


def namespace_pid(host_pid: int) -> int | None:
    """The innermost pid of a process (its pid inside the sandbox's pid namespace), from /proc/PID/status."""
    try:
        for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def kill_all(pids: list[int], wait: float = 2.0) -> None:
    """SIGKILL each of `pids`, then wait (up to `wait` seconds) until each is dead. Every process of the student's
    holds the channel's request pipe: one that was preempted inside read() when the signal came still takes the
    bytes waiting there before it dies, so the grader's next request must not be written before it is gone (a
    request half read by a dying runner left the zygote reading from the middle of a message)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait
    for pid in pids:
        while process_state(pid) not in ("", "Z", "X") and time.monotonic() < deadline:
            time.sleep(0.001)


class BoundedLog(threading.Thread):
    """Drains a pipe (the sandbox's standard error) into the last `keep` bytes: nothing the student's
    processes write there reaches the grader's disk, and a flood costs only the time to read it."""

    def __init__(self, fd: int, keep: int = 20_000) -> None:
        super().__init__(daemon=True)
        self.fd, self.keep, self.tail = fd, keep, collections.deque()
        self.size, self.lock = 0, threading.Lock()

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
                return
            with self.lock:
                self.tail.append(chunk)
                self.size += len(chunk)
                while self.size - len(self.tail[0]) >= self.keep:
                    self.size -= len(self.tail.popleft())

    def text(self) -> str:
        with self.lock:
            return b"".join(self.tail)[-self.keep:].decode("utf-8", "replace")

    def clear(self) -> None:
        """Forget what was written so far (a new notebook: what an earlier one's hidden tests made its code
        write must not show in this one's messages)."""
        with self.lock:
            self.tail.clear()
            self.size = 0


# --- a session -----------------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    identity: int
    host_pid: int | None


class Session:
    """One student's zygote. Use as a context manager; `notebook()` opens a runner for one notebook."""

    def __init__(self, preload: list[str], environment: dict[str, str] | None = None,
                 launcher: Launcher | None = None, warm_up: bool = True) -> None:
        self.preload, self.warm_up = preload, warm_up
        self.environment = dict(environment if environment is not None else os.environ)
        self.launcher = launcher or plain_launcher
        self.process: Any = None
        self.buffer = b""
        self.log: BoundedLog | None = None
        self.zygote: int | None = None  # host pids
        self.runner: int | None = None
        self.runner_inner: int | None = None  # the runner's pid in the sandbox
        self.snapshots: dict[int, Snapshot] = {}
        self.requests = 0
        self.cell_notes: list[dict[str, str]] = []  # the watcher's notes from ordinary cells (see runner.Watcher)
        self.write_stall = WRITE_STALL
        # the notebook's deadline (time.monotonic()), set by the executor: no wait for the student's side lasts
        # past it, whatever its own limit (a cell's, a check's, a snapshot's, a request left unread)
        self.deadline: float | None = None
        self.runner_cwd: str | None = None  # the runner's working folder, as it said before any notebook code ran
        self.too_many_for: int | None = None  # the runner whose folders held too much to inventory

    # lifecycle ----------------------------------------------------------------------------------------------

    def start(self, timeout: float = 600) -> Session:
        """Start the zygote and wait until it is ready (imports done)."""
        from transformer_course.grading.sandbox import build

        self.deadline = None  # starting the zygote is the grader's own work (the executor sets the notebook's after)
        argv = [sys.executable, "-m", "transformer_course.grading.sandbox.runner", "--preload", ",".join(self.preload),
                "--warm-up", ",".join(build.warm_up_parts(self.preload)),  # the zygote cannot read the checks
                *([] if self.warm_up else ["--no-warm-up"])]
        log_read, log_write = os.pipe()
        with profiling.phase("zygote start (sandbox, imports)", self.cpu_seconds):
            try:
                self.process = self.launcher(argv, environment=self.environment, stderr=log_write)
            finally:
                os.close(log_write)
            self.log = BoundedLog(log_read)
            self.log.start()
            self.buffer = b""
            ready = self._await("ready", timeout)
            self.zygote = self._host_pid(ready.get("pid"), among=process_tree(self.process.pid))
        return self

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the sandbox's processes (see profiling.tree_cpu_seconds)."""
        return profiling.tree_cpu_seconds(self.process.pid) if self.process is not None else 0.0

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def close(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if hasattr(self.process, "close"):
            self.process.close()
        self.process, self.runner, self.zygote, self.snapshots = None, None, None, {}

    def __enter__(self) -> Session:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stderr_tail(self, lines: int = 5) -> str:
        text = self.log.text() if self.log is not None else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def reason(self) -> str | None:
        """Why the sandbox ended, when its launcher knows (e.g. the memory limit)."""
        explain = getattr(self.process, "reason", None)
        return explain() if callable(explain) else None

    # messages -----------------------------------------------------------------------------------------------

    def send(self, request: dict[str, Any]) -> None:
        """Write one request. The student's side may stop reading (a shrunk pipe, a forged reply and a
        process that sleeps): a request it leaves unread for `write_stall` seconds ends the whole sandbox
        (a half-written request cannot be taken back), and the grader goes on (RunnerDied)."""
        data = memoryview(channel.encode(request, requests=True))
        try:
            fd = self.process.stdin.fileno()
            os.set_blocking(fd, False)
            progress = time.monotonic()
            while data:
                try:
                    written = os.write(fd, data)
                except BlockingIOError:
                    written = 0
                if written:
                    data, progress = data[written:], time.monotonic()
                    continue
                if time.monotonic() - progress > self.write_stall or self._past_deadline():
                    self.abandon()
                    raise RunnerDied(f"{KERNEL_DIED} [the notebook's processes stopped reading the grader's "
                                     f"requests for {time.monotonic() - progress:.0f} s]")
                select.select([], [fd], [], 1.0)
        except (OSError, ValueError, AttributeError) as error:
            raise RunnerDied(f"the grading process is gone ({error})") from None

    def abandon(self) -> None:
        """End every process of the sandbox now (the session is dead afterwards: `alive()` is False)."""
        if self.process is None:
            return
        kill_all(process_tree(self.process.pid))
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.process.wait(timeout=10)
        self.runner, self.snapshots = None, {}

    def messages(self, deadline: float, limit: int = channel.LIMITS.message_bytes) -> Iterator[dict[str, Any]]:
        """Decoded messages as they arrive until `deadline` (then TimeoutError). Bytes that are not a message
        end the sandbox (ChannelBroken): what follows them cannot be read as messages again, and the notebooks
        that share the sandbox go on in a new one."""
        fd = self.process.stdout.fileno()
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)
        while True:
            while len(self.buffer) >= channel.HEADER:
                try:
                    size = channel.read_header(self.buffer[:channel.HEADER])
                except channel.ChannelError as error:
                    raise self._broken(str(error)) from None
                if size > limit:
                    raise self._broken(f"a message of {size} bytes is too large here")
                if len(self.buffer) < channel.HEADER + size:
                    break
                payload = self.buffer[channel.HEADER:channel.HEADER + size]
                self.buffer = self.buffer[channel.HEADER + size:]
                try:
                    message = channel.decode(payload)
                except channel.ChannelError as error:
                    raise self._broken(f"an unreadable message ({error})") from None
                if not isinstance(message, dict) or not isinstance(message.get("op"), str):
                    raise self._broken("a message without an operation")
                yield message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RunnerDied(f"the grading process ended ({self.reason() or self.stderr_tail()})")
            self.buffer += chunk

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    # the sandbox's writable folders, changed by the grader from outside (`scratch`) ------------------------------

    def _folders(self) -> list[tuple[str, int]]:
        opener = getattr(self.process, "writable_folders", None)
        return opener() if callable(opener) and self.alive() else []

    @contextlib.contextmanager
    def _opened_folders(self) -> Iterator[list[tuple[str, int]]]:
        folders = self._folders()
        try:
            yield folders
        finally:
            for _, descriptor in folders:
                with contextlib.suppress(OSError):
                    os.close(descriptor)

    def scratch_inventory(self) -> Any:
        """What the writable folders hold now (for `scratch_restore`), None when there is nothing to restore or too
        much to record (then not tried again for this runner: a notebook that made a hundred thousand files does
        not pay for their walk at every grade cell)."""
        if self.runner is not None and self.runner == self.too_many_for:
            return None
        with self._opened_folders() as folders:
            found = scratch.inventory(folders) if folders else None
        if folders and found is None:
            self.too_many_for = self.runner
        return found

    def scratch_restore(self, kept: Any) -> None:
        """Remove what the writable folders gained or changed since `scratch_inventory` returned `kept`; a
        folder holding more than `scratch.MAX_ENTRIES` new entries ends the sandbox instead."""
        if kept is None:
            return
        with self._opened_folders() as folders:
            try:
                scratch.restore(folders, kept)
            except scratch.TooMuch:
                self.abandon()

    def empty_scratch(self) -> bool:
        """Empty the writable folders (the folders on the way to the runner's working folder stay, emptied).
        False when they held too much to empty by the notebook's deadline: the sandbox has then been ended."""
        with self._opened_folders() as folders:
            keep: dict[str, list[str]] = {}
            cwd = self.runner_cwd or ""
            for name, _ in folders:
                if cwd.startswith(name.rstrip("/") + "/"):
                    keep[name] = [part for part in cwd[len(name.rstrip("/")) + 1:].split("/") if part]
            try:
                scratch.empty(folders, keep, limit=scratch.MAX_EMPTIED, deadline=self.deadline)
            except scratch.TooMuch:
                self.abandon()
                return False
        return True

    def _broken(self, why: str) -> ChannelBroken:
        self.abandon()
        self.buffer = b""
        return ChannelBroken(why)

    def _await(self, op: str, timeout: float, identity: Any = None) -> dict[str, Any]:
        try:
            for message in self.messages(time.monotonic() + timeout):
                if message["op"] == op and (identity is None or message.get("id") == identity):
                    return message
                if message["op"] == "runner-exit":
                    raise RunnerDied(self._death(message))
                raise ChannelBroken(f"an unexpected message {message['op'][:40]!r} while waiting for {op!r}")
        except TimeoutError:
            raise RunnerDied(f"the grading process was not {op} after {timeout:g} s ({self.stderr_tail()})") from None
        raise RunnerDied("unreachable")

    def _death(self, message: dict[str, Any]) -> str:
        return f"{KERNEL_DIED} [{self.reason() or status_of(message)}]"

    def _next_id(self) -> int:
        self.requests += 1
        return self.requests

    # processes ----------------------------------------------------------------------------------------------

    def _host_pid(self, inner: Any, among: list[int] | None = None) -> int | None:
        """The host pid of the process the sandbox knows as `inner`, among the sandbox's processes."""
        if not isinstance(inner, int) or self.process is None:
            return None
        for pid in among if among is not None else process_tree(self.process.pid):
            if namespace_pid(pid) == inner and pid != self.process.pid:
                return pid
        return None

    def reap(self) -> None:
        """End every process of the student's that is neither the zygote, the runner nor a snapshot: what a
        cell started dies with the cell."""
        if self.zygote is None:
            return
        keep = {self.zygote, self.runner, *(s.host_pid for s in self.snapshots.values())}
        kill_all([pid for pid in process_tree(self.zygote) if pid not in keep])

    def _continue_zygote(self) -> None:
        """SIGCONT to the zygote: a notebook's code may have stopped it (SIGSTOP to its parent), and a stopped
        zygote neither reports its runner's end nor forks the next one, so that every later notebook of the
        student would wait out its time limit."""
        for pid in {self.zygote, self.process.pid if self.process is not None else None} - {None}:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)

    def kill_runner(self) -> None:
        """End the runner and everything below it (its snapshots and servants too)."""
        if self.runner is not None:
            kill_all(process_tree(self.runner))
        self.runner, self.runner_inner, self.snapshots = None, None, {}

    # notebooks ----------------------------------------------------------------------------------------------

    def notebook(self, checks: str, exercises: list[str], cwd: str, timeout: float = 300) -> None:
        """Fork a runner for one notebook and wait until it is ready for its first cell."""
        if self.log is not None:
            self.log.clear()  # an earlier notebook's standard error never shows in this one's messages
        self.cell_notes = []
        self._continue_zygote()
        self.send({"op": "notebook", "checks": checks, "exercises": exercises, "cwd": cwd})
        try:
            for started in self.messages(time.monotonic() + timeout):
                if started["op"] == "runner-started":
                    break
                if started["op"] != "runner-exit":  # the late report of a runner already ended: no runner runs now
                    raise ChannelBroken(f"an unexpected message {started['op'][:40]!r} while waiting for the runner")
        except TimeoutError:
            raise RunnerDied(f"the grading process was not runner-started after {timeout:g} s "
                             f"({self.stderr_tail()})") from None
        self.runner = self._host_pid(started.get("pid"))
        self.runner_inner = started.get("pid") if isinstance(started.get("pid"), int) else None
        self.snapshots = {}
        from transformer_course.grading.sandbox import build

        self.build_for = (checks, tuple(exercises))
        with profiling.phase("grading build", self.cpu_seconds):  # this notebook's checks and reference, to the runner
            self.send({"op": "build", "modules": build.grading_build(checks, exercises)})
        ready = self._await("runner-ready", timeout)
        self.runner_cwd = ready.get("cwd") if isinstance(ready.get("cwd"), str) else None

    def parts_for(self, module: str, qualname: str) -> tuple[tuple[str, str, str], ...]:
        """The graded stage's parts the experiment `module.qualname` plugs in (`build.experiment_parts`)."""
        from transformer_course.grading.sandbox import build

        checks, exercises = getattr(self, "build_for", ("", ()))
        return build.experiment_parts(checks, exercises, module, qualname) if checks else ()

    def end_notebook(self, timeout: float = 30) -> str:
        self.send({"op": "end"})
        self._continue_zygote()
        try:
            for message in self.messages(time.monotonic() + timeout):
                if message["op"] == "runner-exit":
                    self.kill_runner()
                    return status_of(message)
        except (TimeoutError, ChannelBroken):
            self.kill_runner()
        return "?"

    def wait_runner_exit(self, timeout: float = 10) -> str:
        with contextlib.suppress(TimeoutError, ChannelBroken):
            for message in self.messages(time.monotonic() + timeout):
                if message["op"] == "runner-exit":
                    self.kill_runner()
                    return status_of(message)
        return "?"

    def run_cell(self, source: str, timeout: float) -> list[dict[str, Any]]:
        """Outputs of an ordinary cell. Raises RunnerDied, or CellTimedOut after interrupting it (with the
        outputs it had when it stopped; a runner that ignores the interrupt is ended)."""
        identity = self._next_id()
        self.send({"op": "cell", "id": identity, "source": source})
        deadline = time.monotonic() + timeout
        interrupted = False
        while True:
            try:
                message = next(self.messages(deadline, MAX_CELL_MESSAGE))
            except ChannelBroken as error:
                self.kill_runner()
                raise RunnerDied(f"{KERNEL_DIED} [the notebook wrote into the grader's channel: {error}]") from None
            except TimeoutError:
                if interrupted:
                    self.kill_runner()
                    self.wait_runner_exit()
                    raise CellTimedOut([]) from None
                interrupted = True
                if self.runner is not None:
                    with contextlib.suppress(OSError):
                        os.kill(self.runner, signal.SIGINT)
                deadline = time.monotonic() + 10
                continue
            if message["op"] == "runner-exit":
                self.kill_runner()
                raise RunnerDied(self._death(message))
            if message["op"] != "cell-done" or message.get("id") != identity:
                self.kill_runner()
                raise RunnerDied(f"{KERNEL_DIED} [a message that is not the grader's arrived]")
            self.reap()
            keep_notes(self.cell_notes, message.get("notes"))
            try:
                outputs = cell_outputs(message.get("outputs", []))
            except MalformedOutputs as malformed:  # only the student's code writes such outputs: this cell pays
                self.kill_runner()
                raise RunnerDied(f"{KERNEL_DIED} [the cell's outputs are not in the grader's format: {malformed}]"
                                 ) from None
            if interrupted:
                raise CellTimedOut(outputs)
            return outputs

    # grade cells ----------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def servant(self, deadline: float, snapshot: int | None = None) -> Iterator[Servant]:
        """A process running this grade cell's experiments: forked now from the notebook's state, or the
        snapshot taken earlier. It is ended, with everything it started, when the block ends."""
        if snapshot is None:
            identity = self._next_id()
            self.send({"op": "serve", "id": identity})
        else:
            identity = snapshot
            self.send({"op": "resume", "id": identity})
            self.snapshots.pop(identity, None)
        servant = Servant(self, identity, deadline)
        try:
            try:
                ready = self._await_servant("servant-ready", identity, deadline)
            except ServantFailed as error:
                servant.broken, servant.exited = str(error), getattr(error, "exited", False)
                raise
            servant.host_pid = self._host_pid(ready.get("pid"))
            yield servant
        finally:
            servant.finish()

    def _await_servant(self, op: str, identity: int, deadline: float) -> dict[str, Any]:
        try:
            for message in self.messages(deadline):
                if message["op"] == "runner-exit":
                    self.kill_runner()
                    raise RunnerDied(self._death(message))
                if message["op"] == op and message.get("id") == identity:
                    return message
                if message["op"] == "servant-exit" and message.get("id") == identity:
                    failed = ServantFailed(f"{SERVANT_ENDED} ({status_of(message)})")
                    failed.exited = True  # type: ignore[attr-defined]
                    raise failed
                raise ServantFailed(f"an unexpected message {message['op'][:40]!r} from the process running the checks")
        except ChannelBroken as error:
            raise ServantFailed(f"the process running this cell's checks broke the grader's protocol ({error})") \
                from None
        except TimeoutError:
            raise ServantFailed("timeout") from None
        raise ServantFailed("unreachable")

    def snapshot(self, timeout: float = 60) -> int:
        """Fork, asleep, a copy of the notebook's state now (for a grade cell's hidden part)."""
        identity = self._next_id()
        self.send({"op": "snapshot", "id": identity})
        taken = self._await("snapshot-taken", timeout, identity)
        self.snapshots[identity] = Snapshot(identity, self._host_pid(taken.get("pid")))
        return identity

    def send_results(self, results: list[list[Any]]) -> None:
        """The grader's verdicts, for the notebook's own summary cell."""
        if results:
            self.send({"op": "results", "results": results})


def status_of(message: dict[str, Any]) -> str:
    """How a process of the student's ended, as its parent reported it ("exit 0", "signal 9"): anything else
    in that field was written by the student's code (the hidden tests' inputs, say) and is not repeated."""
    status = message.get("status")
    return status if isinstance(status, str) and _STATUS.fullmatch(status) else "?"


def _is_student_error(error: Any) -> bool:
    """Whether a decoded error has the shape `checks.boundary.StudentError` promises, field by field: the
    record is rebuilt here from whatever the student's side sent, and the messages made from it must not
    fail on a frame that is a number, say."""
    def texts(values: Any) -> bool:
        return isinstance(values, tuple) and all(isinstance(value, str) for value in values)

    return (isinstance(error, StudentError) and isinstance(error.type_name, str) and texts(error.bases)
            and isinstance(error.message, str) and isinstance(error.stub, bool) and isinstance(error.detail, str)
            and isinstance(error.frames, tuple)
            and all(isinstance(frame, Frame) and texts((frame.filename, frame.name, frame.line))
                    and isinstance(frame.lineno, int) for frame in error.frames))


def keep_notes(kept: list[dict[str, str]], notes: Any) -> None:
    """Add to `kept` the watcher's notes that have its shape (a few short strings of known kinds), at most
    MAX_NOTES in all: they come from the student's process, which may send any number of anything."""
    if not isinstance(notes, list):
        return
    known = {tuple(sorted(note.items())) for note in kept}
    for note in notes[:MAX_NOTES]:
        if len(kept) >= MAX_NOTES:
            return
        if not (isinstance(note, dict) and isinstance(note.get("kind"), str) and note["kind"] in NOTE_KINDS
                and len(note) <= 4
                and all(isinstance(key, str) and isinstance(value, str) and len(value) <= 500
                        for key, value in note.items())):
            continue
        key = tuple(sorted(note.items()))
        if key not in known:
            known.add(key)
            kept.append(note)


class Servant:
    """The grader's proxy of a servant: `run` sends one experiment and returns its value (or raises the
    student's error). Implements `checks.boundary.Remote`."""

    def __init__(self, session: Session, identity: int, deadline: float) -> None:
        self.session, self.identity, self.deadline = session, identity, deadline
        self.host_pid: int | None = None
        self.notes: list[dict[str, str]] = []
        self.broken: str | None = None
        self.exited = False  # its end was already reported
        self.timed_out = False
        self.calls = 0

    def run(self, module: str, qualname: str, args: tuple, kwargs: dict) -> Any:
        from transformer_course.checks.framework import CheckFailed

        if self.broken:
            raise ServantFailed(self.broken)
        self.calls += 1
        number = self.calls
        from transformer_course.checks.salt import current

        request = {"op": "run", "id": number, "module": module, "function": qualname, "args": list(args),
                   "kwargs": dict(kwargs)}
        if current() is not None:  # a hidden part: the experiment draws from the same salt (checks.salt)
            request["salt"] = current()
        parts = self.session.parts_for(module, qualname)
        if parts:  # the graded stage's parts this experiment plugs in: only its servant gets them (build)
            request["parts"] = [list(part) for part in parts]
        self.session.send(request)
        try:
            for message in self.session.messages(self.deadline):
                if message["op"] == "runner-exit":
                    self.session.kill_runner()
                    self.broken = self.session._death(message)
                    raise ServantFailed(self.broken)
                if message["op"] == "servant-exit" and message.get("id") == self.identity:
                    self.broken = f"{SERVANT_ENDED} ({status_of(message)})"
                    self.exited = True
                    raise ServantFailed(self.broken)
                if message["op"] not in ("result", "raised") or message.get("id") not in (number, -1):
                    # an answer to nothing this side asked: only the student's own code writes those (and a flood
                    # of them would keep this process decoding until the cell's time is up)
                    self.broken = "the process running this cell's checks sent a message the grader did not ask for"
                    raise ServantFailed(self.broken)
                self._take_notes(message.get("notes"))
                if message["op"] == "result":
                    return message.get("value")
                error = message.get("error")
                if not _is_student_error(error):
                    self.broken = "the process running the checks sent an error that is not one"
                    raise ServantFailed(self.broken)
                raise as_exception(error, CheckFailed)
        except ChannelBroken as error:
            self.broken = f"the process running this cell's checks broke the grader's protocol ({error})"
            raise ServantFailed(self.broken) from None
        except TimeoutError:
            self.timed_out = True
            self.broken = "timeout"
            raise ServantFailed("timeout") from None
        raise ServantFailed("unreachable")

    def _take_notes(self, notes: Any) -> None:
        keep_notes(self.notes, notes)

    def finish(self) -> None:
        """End the servant: ask it, then make sure (it and everything it started), and wait for the runner."""
        session = self.session
        if session.runner is None:
            return
        if self.exited:
            session.reap()
            return
        if not self.broken:
            with contextlib.suppress(RunnerDied, OSError):
                session.send({"op": "end"})
        elif self.host_pid is not None:
            kill_all(process_tree(self.host_pid))
        try:
            for message in session.messages(time.monotonic() + (10 if not self.broken else 5)):
                if message["op"] == "servant-exit" and message.get("id") == self.identity:
                    break
                if message["op"] == "runner-exit":
                    session.kill_runner()
                    return
        except (TimeoutError, ChannelBroken, RunnerDied):
            session.kill_runner()
            session.wait_runner_exit()
            return
        session.reap()
