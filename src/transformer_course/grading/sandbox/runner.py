"""The student's side of grading: the process that runs one student's notebooks, inside their sandbox.

    python -m transformer_course.grading.sandbox.runner --preload MODULE[,MODULE...]

It holds no grading secret and decides nothing. It talks to the grader over one channel
(`channel`: requests on stdin, replies on stdout, both framed and typed) and answers with values only:

- the **zygote** imports torch, IPython and what the notebook imports once, then forks the notebook's
  *runner* (and a new one if the grader replaces it after a crash) and, when a runner has ended, ends every
  process it left behind and empties the scratch folders. The zygote never runs notebook code. Every
  notebook has a sandbox, and so a zygote, of its own: the batch grades every visible cell of a student
  before any hidden part, and the notebooks' sandboxes wait side by side meanwhile.
- a **runner** executes the notebook's ordinary cells with IPython (magics, `display`, the last
  expression's value, as in Colab) and sends back their outputs. For a grade cell the grader asks it to
  fork a **servant**: a throwaway copy of the notebook's state at that cell, which runs the experiments
  the grader's checks ask for (`checks.boundary`: build the student's module, call their function,
  record what it computes) and sends back what they return. A grade cell's hidden part runs later, in a
  **snapshot** forked at that cell and woken only after the notebook's last cell has run, so nothing it
  sees, writes or keeps can reach anything the student is shown.

Verdicts are decided by the grader (`executor`), in a process that never runs student code, from the
values the servant sends. Whatever the notebook does to this process (patching torch, the checks or this
module, threads, hooks) can only change the values its own code appears to return.

Neither the zygote nor a runner holds the checks' judging code or the reference solution of the notebook's
exercises: the sandbox does not see the course's `checks/` and `reference/` folders, the zygote imports neither,
and each runner, right after it was forked, receives its notebook's *grading build* of both packages over the
channel and imports them from memory (`build`). A grade cell's argument that is one of the few reference parts
still in the build becomes a note for the grader (`watch`), which decides what to flag.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from transformer_course.grading.sandbox import build, channel
from transformer_course.grading.sandbox.watch import Watcher

MAX_OUTPUT = 1_000_000  # characters of text one cell may print before the rest is cut
PRIVATE_FOLDERS = "COURSE_RUNNER_PRIVATE"  # set by the launchers when cwd and TMPDIR belong to this runner alone
PRIVATE_SHM = "COURSE_RUNNER_PRIVATE_SHM"  # set when /dev/shm is the sandbox's own (never the host's)
REPORT_IMPORTS = "TRANSFORMER_COURSE_REPORT_IMPORTS"  # "1": a servant that imported modules says so on stderr


# --- the channel ------------------------------------------------------------------------------------------


class Channel:
    """Framed messages: requests read from `requests`, replies written to `replies`. Handles of the
    servant's table are resolved in requests; `names` resolves a notebook name."""

    def __init__(self, requests: int, replies: int) -> None:
        self.requests, self.replies = requests, replies
        self.resolve: Callable[[int], Any] | None = None
        self.names: Callable[[str], Any] | None = None
        self.keep: Callable[[Any], channel.Handle] | None = None

    def _read(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = os.read(self.requests, count - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def receive(self) -> Any:
        size = channel.read_header(self._read(channel.HEADER))
        payload = self._read(size)
        return channel.decode(payload, requests=True, resolve=self.resolve, names=self.names)

    def send(self, message: dict[str, Any]) -> None:
        data = channel.encode(message, self.keep)
        while data:
            data = data[os.write(self.replies, data):]

# --- IPython for ordinary cells ------------------------------------------------------------------


class CellRecorder:
    """Collects one ordinary cell's outputs in nbformat's shape (streams, results, displays, error)."""

    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []
        self.characters = 0

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        room = MAX_OUTPUT - self.characters
        if room <= 0:
            return
        if len(text) > room:
            text = text[:room] + "\n... [output cut by the grader]\n"
        self.characters += len(text)
        if self.outputs and self.outputs[-1]["output_type"] == "stream" and self.outputs[-1]["name"] == name:
            self.outputs[-1]["text"] += text
        else:
            self.outputs.append({"output_type": "stream", "name": name, "text": text})

    def data(self, kind: str, bundle: dict[str, Any], count: int | None = None) -> None:
        kept = {mime: value for mime, value in bundle.items() if isinstance(value, str) and len(value) < 2_000_000}
        output: dict[str, Any] = {"output_type": kind, "data": kept, "metadata": {}}
        if kind == "execute_result":
            output["execution_count"] = count
        self.outputs.append(output)


class _Writer(io.TextIOBase):
    def __init__(self, recorder: Callable[[], CellRecorder], name: str) -> None:
        self.recorder, self.name_ = recorder, name

    def write(self, text: str) -> int:
        self.recorder().stream(self.name_, str(text))
        return len(text)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False


def make_shell(user_ns: dict[str, Any], current: list[CellRecorder]) -> Any:
    """An IPython shell (no kernel, no history file) whose outputs go to `current[0]`."""
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):  # noqa: ANN001
            current[0].data("display_data", dict(data or {}))

        def clear_output(self, wait=False):  # noqa: ANN001
            current[0].outputs.clear()

    class Results(DisplayHook):
        def write_output_prompt(self) -> None:
            pass

        def write_format_data(self, format_dict, md_dict=None) -> None:  # noqa: ANN001
            current[0].data("execute_result", dict(format_dict or {}), self.prompt_count)

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "NoColor"
    config.InteractiveShell.xmode = "Context"
    shell = InteractiveShell(config=config, user_ns=user_ns, display_pub_class=Publisher, displayhook_class=Results)

    def show_traceback(etype, evalue, stb) -> None:  # noqa: ANN001
        name = getattr(etype, "__name__", "Error")
        try:
            value = str(evalue)
        except Exception:  # a notebook's exception whose str() fails is still an error
            value = "?"
        current[0].outputs.append({"output_type": "error", "ename": name, "evalue": value,
                                   "traceback": [str(line) for line in stb][-40:]})

    shell._showtraceback = show_traceback
    return shell


# --- before the first notebook ----------------------------------------------------------------------------


def preload(modules: list[str], warm_up: bool = True, parts: list[str] | None = None) -> None:
    """Import what the notebook will use (with warm_up: `modules`, and `parts` of PyTorch its checks meet, which
    load more of themselves on first use) before any notebook code runs. The course's checks and reference
    packages are never imported here: each runner imports its own build of them (`build`)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("PLOTLY_RENDERER", "plotly_mimetype")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401

    if not warm_up:
        return
    for name in modules:
        if name in build.HIDDEN_PACKAGES or name.startswith(tuple(f"{hidden}." for hidden in build.HIDDEN_PACKAGES)):
            continue  # not in this sandbox: each runner gets its own build
        try:
            module = importlib.import_module(name)
        except Exception as error:  # a module that cannot load now will fail in the cell that uses it
            print(f"runner: could not preload {name}: {error}", file=sys.stderr)
            continue
        del module
    warm_up_torch(set(WARM_UP_PARTS if parts is None else parts))


WARM_UP_PARTS = ("shape checks", "optimiser step")


def warm_up_torch(parts: set[str] | tuple[str, ...] = WARM_UP_PARTS) -> None:
    """Use once, here, the parts of PyTorch that import more of PyTorch on first use: otherwise every
    grade cell's servant would import them again (and throw them away with it). A checks module names the
    parts its grade cells meet (`WARM_UP`, all of them when it says nothing): "shape checks" is
    `torch._check`, which nn.MultiheadAttention calls on a padding mask and which imports the
    symbolic-shapes machinery (and sympy), 0.36 s; "optimiser step", the first step imports some 800
    modules, 0.7 s (scripts/benchmark_grading.py). tqdm's lock (its first progress bar imports
    multiprocessing's synchronisation module) costs nothing and is always made.
    tests/test_grading_speed.py fails when a grade cell of any stage imports a module."""
    import torch
    from tqdm.auto import tqdm

    tqdm.get_lock()
    if "shape checks" in parts:
        torch._check(True)
    if "optimiser step" in parts:
        layer = torch.nn.Linear(2, 2)
        optimizer = torch.optim.Adam(layer.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        layer(torch.ones(1, 2)).sum().backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


# --- the zygote ---------------------------------------------------------------------------------------------


def serve(preloaded: list[str], warm_up: bool = True, parts: list[str] | None = None) -> None:
    """The zygote: prepare, then fork one runner per notebook the grader asks for (one at a time: the batch gives
    every notebook a sandbox of its own; a runner the grader replaced is the only other one a zygote serves)."""
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # notebook code writing to fd 1 must not reach the grader's channel
    preload(preloaded, warm_up, parts)
    _subreaper()
    link = Channel(requests, replies)
    scratch = _scratch_folders()
    link.send({"op": "ready", "pid": os.getpid()})
    while True:
        try:
            request = link.receive()
        except (EOFError, channel.ChannelError):
            os._exit(0)
        op = request.get("op") if isinstance(request, dict) else None
        if op != "notebook":
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            try:
                Runner(link, request).loop()
            finally:
                os._exit(0)
        link.send({"op": "runner-started", "pid": pid})
        ended = _await_runner(pid)
        _clean_up(scratch)
        link.send({"op": "runner-exit", "status": ended})


def _await_runner(pid: int) -> str:
    """How the runner ended (the zygote reads nothing meanwhile: the runner owns the channel)."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # already reaped
            return "?"
        except InterruptedError:
            continue
        return _describe_status(status)


def _subreaper() -> None:
    """prctl(PR_SET_CHILD_SUBREAPER): what a runner leaves running is re-parented here, to be ended."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        print("runner: could not become a subreaper", file=sys.stderr)


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


def _descendants(root: int) -> list[int]:
    """Every process below `root` (the zygote is a child subreaper, so a runner's orphans are too)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, pending = [], [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


Inventory = dict[str, tuple[Any, ...]]  # path below a scratch folder -> what it was when the zygote was ready
MAX_INVENTORY = 20_000  # entries recorded per folder (the zygote's imports make a few dozen)
HASHED_BYTES = 64 * 2**20  # file contents compared in all (larger files are compared by inode and times)


def _scratch_folders() -> dict[str, Inventory]:
    """The runner's own writable folders (working folder, TMPDIR) with everything the zygote put there,
    down to the last file (the caches that torch and matplotlib make while the zygote imports them);
    none unless the launcher said they are private to this student (`PRIVATE_FOLDERS`)."""
    folders: dict[str, Inventory] = {}
    if os.environ.get(PRIVATE_FOLDERS) != "1":
        return folders
    private = {os.getcwd(), tempfile.gettempdir()} | ({"/dev/shm"} if os.environ.get(PRIVATE_SHM) == "1" else set())
    for folder in private:
        if os.path.isdir(folder):
            folders[folder] = _inventory(folder)
    return folders


def _inventory(folder: str) -> Inventory:
    found: Inventory = {}
    budget = [HASHED_BYTES]
    for root, directories, files in os.walk(folder):
        for name in [*directories, *files]:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = _entry(path, budget)
            if len(found) >= MAX_INVENTORY:
                return found
    return found


def _entry(path: str, budget: list[int]) -> tuple[Any, ...]:
    """What an entry is: a folder by its inode and mode (what it holds is compared entry by entry), a link by
    its target, a file by its inode, size and contents (or times, past the budget): a file written in any way
    (also through a shared mapping, which leaves tmpfs' times alone) differs."""
    import hashlib
    import stat

    try:
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            return ("folder", info.st_ino, stat.S_IMODE(info.st_mode))
        if stat.S_ISLNK(info.st_mode):
            return ("link", info.st_ino, os.readlink(path))
        if stat.S_ISREG(info.st_mode) and info.st_size <= budget[0]:
            budget[0] -= info.st_size
            with open(path, "rb") as handle:
                return ("file", info.st_ino, info.st_size, hashlib.sha256(handle.read()).hexdigest())
        return ("other", info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode)
    except OSError:
        return ("gone",)


def _wipe(folder: str, kept: Inventory) -> None:
    """Remove from `folder` whatever is not as it was in `kept`: new entries, changed files, replaced folders,
    at any depth (a folder the zygote made, such as torch's cache, is no hiding place for one notebook's data)."""
    budget = [HASHED_BYTES]
    with contextlib.suppress(OSError):
        os.chmod(folder, os.lstat(folder).st_mode & 0o7777 | 0o700)  # its owner may list and empty it again
    for root, directories, files in os.walk(folder, onerror=lambda error: None):
        for name in [*directories, *files]:
            path = os.path.join(root, name)
            before = kept.get(os.path.relpath(path, folder))
            now = _entry(path, budget) if before is not None else (
                "folder" if os.path.isdir(path) and not os.path.islink(path) else "new",)
            if before is not None and before[0] == "folder" and now[:2] == before[:2]:
                with contextlib.suppress(OSError):
                    os.chmod(path, before[2])  # a folder made unreadable must still be emptied
                continue
            if before is not None and now == before:
                continue
            if name in directories:
                directories.remove(name)
            if now[0] == "folder":
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o700)
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _remove_ipc_objects() -> None:
    """Remove every System V shared memory segment, message queue and semaphore set of the sandbox's own IPC
    namespace: they outlive the processes that made them, so one notebook could leave data there for the next."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    removers = {"shm": lambda ident: libc.shmctl(ident, 0, None), "msg": lambda ident: libc.msgctl(ident, 0, None),
                "sem": lambda ident: libc.semctl(ident, 0, 0)}  # IPC_RMID is 0
    for kind, remove in removers.items():
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii", errors="replace") as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                remove(int(fields[1]))


def _clean_up(scratch: dict[str, Inventory]) -> None:
    """After a runner ended: end every process it left behind and remove what it wrote, so that a runner the
    grader starts again (after a crash) starts as the first did: no full /tmp, no stray process."""
    for pid in _descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break
    for folder, kept in scratch.items():
        _wipe(folder, kept)
    if os.environ.get(PRIVATE_SHM) == "1":  # the sandbox's own IPC namespace (never the host's)
        _remove_ipc_objects()


# --- a runner: one notebook ---------------------------------------------------------------------------------


class Runner:
    """One notebook: ordinary cells in IPython; servants and snapshots forked for grade cells."""

    def __init__(self, link: Channel, request: dict[str, Any]) -> None:
        self.link = link
        self.checks = str(request.get("checks") or "")
        # this notebook's build of the checks and the reference, sent by the grader right after the fork: nothing
        # of another notebook's build is on disk here or in this process's memory
        sources = link.receive()
        if not isinstance(sources, dict) or sources.get("op") != "build" or not isinstance(sources.get("modules"),
                                                                                                dict):
            os._exit(3)
        build.install(sources["modules"])
        del sources
        self.exercises = [str(name) for name in request.get("exercises", [])]
        self.watcher = Watcher(self.exercises)
        self.snapshots: dict[int, tuple[int, int]] = {}  # id -> (pid, write end of its wake-up pipe)
        self.current: list[CellRecorder] = [CellRecorder()]
        self.user_ns: dict[str, Any] = {"__name__": "__main__"}
        self.shell = make_shell(self.user_ns, self.current)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with contextlib.suppress(OSError, ValueError):
            os.makedirs(str(request.get("cwd") or "work"), exist_ok=True)
            os.chdir(str(request.get("cwd") or "work"))
            import torch

            torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        if self.checks:
            with contextlib.suppress(Exception):
                __import__(self.checks)
        import matplotlib.pyplot as plt

        self.close_figures = lambda: plt.close("all")
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = ""
        link.send({"op": "runner-ready", "pid": os.getpid(), "cwd": cwd})  # before any notebook code has run

    def loop(self) -> None:
        while True:
            try:
                message = self.link.receive()
            except (EOFError, KeyboardInterrupt, channel.ChannelError):
                return
            op = message.get("op") if isinstance(message, dict) else None
            if op == "cell":
                self.cell(message)
            elif op == "serve":
                self.fork_servant(message["id"])
            elif op == "snapshot":
                self.snapshot(message["id"])
            elif op == "resume":
                self.resume(message["id"])
            elif op == "results":  # what the grader decided, for the notebook's own summary cell
                from transformer_course.checks import framework

                for name, title, passed, text in message.get("results", []):
                    framework.record(name, title, passed, text)
            else:
                return

    def cell(self, message: dict[str, Any]) -> None:
        self.current[0] = CellRecorder()
        saved = sys.stdout, sys.stderr
        sys.stdout = _Writer(lambda: self.current[0], "stdout")
        sys.stderr = _Writer(lambda: self.current[0], "stderr")
        try:
            self.shell.run_cell(message["source"], store_history=True)
        except KeyboardInterrupt:
            self.current[0].outputs.append({"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "",
                                            "traceback": ["KeyboardInterrupt"]})
        except BaseException as error:  # SystemExit and the like end the cell, not the runner
            self.current[0].outputs.append({"output_type": "error", "ename": type(error).__name__,
                                            "evalue": _text(error), "traceback": [type(error).__name__]})
        finally:
            sys.stdout, sys.stderr = saved
            with contextlib.suppress(Exception):
                self.close_figures()
        sys.last_type = sys.last_value = sys.last_traceback = None
        self.link.send({"op": "cell-done", "id": message["id"], "outputs": self.current[0].outputs,
                        "notes": self.watcher.take()})

    def fork_servant(self, identity: int) -> None:
        pid = os.fork()
        if pid == 0:
            Servant(self, identity).loop()  # never returns
        self._wait(pid, identity)

    def snapshot(self, identity: int) -> None:
        """Fork a copy of the notebook's state now, asleep until `resume`: a grade cell's hidden part runs
        in it after the notebook's last cell (see the module docstring)."""
        wake_read, wake_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(wake_write)
            for _, other in self.snapshots.values():
                os.close(other)
            _sleep_until_woken(wake_read)
            Servant(self, identity).loop()  # never returns
        os.close(wake_read)
        self.snapshots[identity] = (pid, wake_write)
        self.link.send({"op": "snapshot-taken", "id": identity, "pid": pid})

    def resume(self, identity: int) -> None:
        pid, wake = self.snapshots.pop(identity, (0, -1))
        if not pid:
            self.link.send({"op": "servant-exit", "id": identity, "status": "no such snapshot"})
            return
        os.write(wake, b"g")
        os.close(wake)
        self._wait(pid, identity)

    def _wait(self, pid: int, identity: int) -> None:
        status = "?"
        try:
            status = _describe_status(os.waitpid(pid, 0)[1])
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            status = "interrupted"
        self.link.send({"op": "servant-exit", "id": identity, "status": status})


def _sleep_until_woken(wake: int) -> None:
    """Block until b"g" arrives on the pipe `wake`; anything else (the pipe closed: whoever would wake this
    process has gone) ends the process."""
    try:
        woken = os.read(wake, 1)
    except BaseException:
        os._exit(0)
    if woken != b"g":
        os._exit(0)


# --- a servant: the experiments of one grade cell -------------------------------------------------------------


class Servant:
    """Runs the experiments the grader's checks ask for, on the notebook's objects, and sends their values."""

    def __init__(self, runner: Runner, identity: int) -> None:
        self.runner, self.identity, self.link = runner, identity, runner.link
        self.table: dict[int, Any] = {}
        self.ids: dict[int, int] = {}
        self.watcher = Watcher(runner.exercises)
        self.link.resolve, self.link.names, self.link.keep = self.table.__getitem__, self.name, self.keep
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        with contextlib.suppress(OSError):  # out of memory during a check: the kernel ends this process, not the
            with open("/proc/self/oom_score_adj", "w") as adjust:  # notebook's (only this cell fails, no replay)
                adjust.write("1000")
        null = open(os.devnull, "w")  # noqa: SIM115 (lives as long as this process)
        sys.stdout = sys.stderr = null
        import warnings

        warnings.simplefilter("ignore")
        from transformer_course.checks import boundary

        boundary._SUPPLIED[:] = [self.watcher.supply]
        self.modules_before = set(sys.modules)

    def keep(self, value: Any) -> channel.Handle:
        number = self.ids.get(id(value))
        if number is None:
            number = len(self.table) + 1
            self.table[number], self.ids[id(value)] = value, number
        return channel.Handle(number, _describe(value))

    def name(self, name: str) -> Any:
        if name not in self.runner.user_ns:
            raise NameError(f"name '{name}' is not defined")
        value = self.runner.user_ns[name]
        self.watcher.handed_in(name, value)
        return value

    def loop(self) -> None:
        try:
            self.link.send({"op": "servant-ready", "id": self.identity, "pid": os.getpid()})
            while True:
                try:
                    message = self.link.receive()
                except (EOFError, channel.ChannelError):
                    break
                except BaseException as error:  # a request naming something the notebook lacks
                    self.link.send({"op": "raised", "id": -1, "error": student_error(error), "notes": []})
                    continue
                if not isinstance(message, dict) or message.get("op") != "run":
                    break
                self.run(message)
        finally:
            if os.environ.get(REPORT_IMPORTS) == "1":
                imported = sorted(set(sys.modules) - self.modules_before)
                if imported:
                    with contextlib.suppress(OSError):
                        os.write(2, f"servant imported {len(imported)} modules: {', '.join(imported[:8])}\n".encode())
            os._exit(0)

    def run(self, message: dict[str, Any]) -> None:
        number = message.get("id")
        try:
            function = channel._lookup(str(message["module"]), str(message["function"]))
            experiment = getattr(function, "experiment", None)
            if experiment is None:
                raise TypeError(f"{message['module']}.{message['function']} is not an experiment")
            from transformer_course.checks.boundary import parts_sent
            from transformer_course.checks.salt import salted

            with self.watcher.watching(), salted(message.get("salt")), parts_sent(message.get("parts")):
                value = experiment(*message.get("args", ()), **message.get("kwargs", {}))
            reply = {"op": "result", "id": number, "value": value, "notes": self.watcher.take()}
        except BaseException as error:  # everything the student's code raises goes back as data
            reply = {"op": "raised", "id": number, "error": student_error(error), "notes": self.watcher.take()}
        try:
            self.link.send(reply)
        except channel.ChannelError as problem:
            self.link.send({"op": "raised", "id": number, "notes": [],
                            "error": student_error(ValueError(f"what your code returned cannot be graded: {problem}"))})


def student_error(error: BaseException) -> Any:
    from transformer_course.checks import errors

    return errors.as_record(error)


def _describe(value: Any) -> str:
    kind = type(value)
    name = getattr(value, "__qualname__", None) if isinstance(value, type) or callable(value) else None
    return f"{kind.__name__} {name}" if name and not isinstance(value, type) else f"{kind.__name__}"


def _text(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # a notebook exception whose str() fails
        return "?"
    return text[:4000]


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preload", default="", help="modules to import before the first notebook")
    parser.add_argument("--warm-up", default=None, help="the parts of PyTorch to use once (runner.warm_up_torch), "
                        "comma-separated; all of them when not given")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="import only matplotlib, torch and the checks' framework: no notebook modules, no "
                             "warm-up (the batch grader's start-up test)")
    arguments = parser.parse_args(argv)
    parts = None if arguments.warm_up is None else [part for part in arguments.warm_up.split(",") if part]
    serve([name for name in arguments.preload.split(",") if name], not arguments.no_warm_up, parts)


if __name__ == "__main__":
    main()
