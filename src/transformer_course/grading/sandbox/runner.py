"""The process that runs one student's notebooks for the grader (inside that student's sandbox).

    python -m transformer_course.grading.sandbox.runner --preload MODULE[,MODULE...]

One process per student, the *zygote*, imports torch, IPython and the course once, arms the
defences of `transformer_course.grading.sandbox.seal`, and then serves the grader
(`transformer_course.grading.sandbox.executor`) over two pipes:

- requests arrive on stdin, encoded with `marshal` (they come from the grader, so they are
  trusted; decoding them calls no Python code a notebook could have replaced);
- replies leave on stdout as `seal.frame_record`s of `seal.make_packer` (hex-JSON: the grader
  never decodes anything richer from a student's process);
- `--control FD` is the grader's control line: one byte `i` interrupts the running notebook (a
  cell ran out of time), `k` kills it.

For each notebook the zygote forks a *runner*, which executes the ordinary cells with IPython
(magics, `display`, the last expression's value, as in Colab) in a fresh namespace. A grade cell
never goes through IPython: the runner forks a *sealed child* which blocks signals, installs
seccomp (no threads, no processes), registers the result channel and a one-time nonce with the
audit hook, restores the checks' tools, compiles the cell itself (the hidden part arrives only in
this request and runs with its output discarded) and runs it with `check` bound to a strict proxy
of the stage's checks. The audit hook writes the records (`fail` notes, `verdict`s, `done`); the
runner reports the child's exit status. When a runner dies (os._exit, a crash, the memory limit)
the zygote says so and the grader starts another and replays the cells above.

Everything that runs after notebook code has run here is *sealed* (see `seal`): it uses only
names bound when the zygote started, never module globals a notebook could rebind.
"""

from __future__ import annotations

import functools
import importlib
import io
import marshal
import os
import pkgutil
import shutil
import signal
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from typing import Any

from transformer_course.grading.sandbox import seal

MAX_OUTPUT = 1_000_000  # characters of text one cell may print before the rest is cut


# --- requests and replies ----------------------------------------------------------------------


def make_channel(requests: int, replies: int) -> tuple[Callable[[], Any], Callable[[dict], None]]:
    """Sealed reader of requests and writer of replies over the two pipes."""
    pack = seal.make_packer()

    def receive(_read=os.read, _fd=requests, _loads=marshal.loads, _len=len, _from=int.from_bytes,
                _magic=seal.RECORD_MAGIC, _EOFError=EOFError):
        header = b""
        while _len(header) < 12:
            chunk = _read(_fd, 12 - _len(header))
            if not chunk:
                raise _EOFError
            header += chunk
        if header[:4] != _magic:
            raise _EOFError
        size = _from(header[4:], "big")
        body = b""
        while _len(body) < size:
            chunk = _read(_fd, size - _len(body))
            if not chunk:
                raise _EOFError
            body += chunk
        return _loads(body)

    def send(message, _write=os.write, _fd=replies, _pack=pack, _len=len, _magic=seal.RECORD_MAGIC):
        payload = _pack(message)
        data = _magic + _len(payload).to_bytes(8, "big") + payload
        while data:
            data = data[_write(_fd, data):]

    return receive, send


def encode_request(request: dict[str, Any]) -> bytes:
    """Grader side: one request as the runner reads it."""
    payload = marshal.dumps(request)
    return seal.RECORD_MAGIC + len(payload).to_bytes(8, "big") + payload


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


# --- the strict check proxy of a grade cell ----------------------------------------------------


def proxy_call(inner: Callable, title: str, name: str, run: Callable, audit: Callable, integrity: Callable,
               reference_use: Callable, findings: list, captured: Any, failed: type, kind: type, text: type,
               *args: Any, **kwargs: Any) -> bool:
    """One check called from a grade cell: tools restored, the check run by `framework.run_check`,
    the verdict reported to the audit hook (which accepts it from this function only), a failure
    stops the cell. Sealed: called through a functools.partial that binds everything but the
    check's own arguments."""
    replaced = integrity()
    if replaced:
        line = "replaced the checks' tools before this cell: " + ", ".join(replaced[:4])
        if line not in findings:
            findings.append(line)
    reference_use(args, kwargs, findings)
    result = run(inner, title, args, kwargs)
    integrity()
    passed = result.passed is True
    message = result.message if kind(result.message) is text else "?"
    audit("transformer_course.seal.verdict", title, passed, message, name)
    if not passed:
        raise failed(f"✘ {title}: {message}")
    captured.write(f"✔ {title}\n")
    return True


def check_entries(module: types.ModuleType) -> tuple[tuple[str, Callable, str], ...]:
    """(name, undecorated check, title) of every decorated check of a checks module."""
    entries = []
    for name, value in vars(module).items():
        inner = getattr(value, "__wrapped__", None)
        title = getattr(value, "check_title", None)
        if callable(inner) and isinstance(title, str):
            entries.append((name, inner, title))
    return tuple(entries)


def make_reference_use(exercises: dict[str, Any]) -> Callable[[tuple, dict, list], None]:
    """A sealed function flagging grade-cell arguments that are, subclass, or copy the reference
    solution of one of this notebook's exercises (`exercises`: name -> reference object)."""
    fingerprints: dict[tuple, str] = {}
    identities: dict[int, str] = {}
    classes: list[tuple[type, str]] = []
    for name, value in exercises.items():
        identities[id(value)] = name
        if isinstance(value, type):
            classes.append((value, name))
        for function in seal._functions_of(value):
            if not _written_by_students(function):
                continue  # given code (a constructor, say) is the same in every notebook
            code = function.__code__
            print_ = _fingerprint(code)
            if len(print_) >= 20:  # a one-liner may well be written the same way by anyone
                fingerprints[print_] = f"{name}.{function.__name__}" if isinstance(value, type) else name

    def reference_use(args, kwargs, findings, _identities=identities, _classes=tuple(classes),
                      _fingerprints=fingerprints, _fp=_fingerprint, _functions=seal._functions_of, _id=id,
                      _isinstance=isinstance, _type=type, _subclass=type.__subclasscheck__, _list=list,
                      _Exception=Exception):
        for value in (*args, *_list(kwargs.values())):
            lines = []
            name = _identities.get(_id(value))
            if name is not None:
                lines.append(f"hands in the course's reference solution itself ({name})")
            elif _isinstance(value, _type):
                for reference, reference_name in _classes:
                    if _subclass(reference, value):
                        lines.append(f"hands in a subclass of the reference solution ({reference_name})")
            try:
                for function in _functions(value):
                    copied = _fingerprints.get(_fp(function.__code__))
                    if copied is not None:
                        lines.append(f"contains a copy of the reference solution's code ({copied})")
            except _Exception:
                pass
            for line in lines:
                if line not in findings:
                    findings.append(line)

    return reference_use


def _written_by_students(function: types.FunctionType) -> bool:
    """Whether a reference function holds a `### BEGIN SOLUTION` region (what students write)."""
    import inspect

    try:
        return "### BEGIN SOLUTION" in inspect.getsource(function)
    except (OSError, TypeError):
        return False


def _fingerprint(code: types.CodeType) -> tuple:
    """The instructions of a code object, without what depends on where it was compiled (line
    numbers, jump offsets, whether `math` was imported in the same file: LOAD_ATTR vs LOAD_METHOD)."""
    import dis

    steps = []
    for instruction in dis.get_instructions(code):
        name = {"LOAD_METHOD": "LOAD_ATTR", "PRECALL": None, "CACHE": None, "RESUME": None}.get(
            instruction.opname, instruction.opname)
        if name is None:
            continue
        if instruction.opcode in dis.hasjrel or instruction.opcode in dis.hasjabs:
            steps.append(name)
        elif isinstance(instruction.argval, types.CodeType):
            steps.append((name, _fingerprint(instruction.argval)))
        else:
            argument = instruction.argrepr.removeprefix("NULL + ").removeprefix("NULL|self + ")
            steps.append((name, argument))
    return tuple(steps)


def reference_exercises(names: list[str]) -> dict[str, Any]:
    """The reference objects (transformer_course.reference.*, imported by the zygote) named like this
    notebook's exercises."""
    found: dict[str, Any] = {}
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("transformer_course.reference.") or module is None:
            continue
        for name in names:
            value = vars(module).get(name)
            if value is not None and getattr(value, "__module__", "") == module.__name__:
                found.setdefault(name, value)
    return found


def reference_codes(exercises: dict[str, Any]) -> dict[int, str]:
    codes: dict[int, str] = {}
    for name, value in exercises.items():
        for function in seal._functions_of(value):
            for code in seal._code_tree(function.__code__):
                codes[id(code)] = f"{name}.{function.__name__}" if isinstance(value, type) else name
    return codes


# --- the zygote ----------------------------------------------------------------------------------


def preload(modules: list[str], warm_up: bool = True) -> None:
    """Import what the notebooks will use (and, with warm_up, the course's reference modules and the
    parts of PyTorch that load more of themselves on first use) before any notebook code runs."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("PLOTLY_RENDERER", "plotly_mimetype")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401

    import transformer_course.checks.framework  # noqa: F401
    import transformer_course.reference as reference

    if not warm_up:
        return
    prefix = "transformer_course.reference."
    modules = [*modules, *(info.name for info in pkgutil.iter_modules(reference.__path__, prefix))]
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # a module that cannot load now will fail in the cell that uses it
            print(f"runner: could not preload {name}: {error}", file=sys.stderr)
    warm_up_torch()


def warm_up_torch() -> None:
    """Use once, here, the parts of PyTorch that import more of PyTorch on first use: otherwise every
    grade cell's child would import them again (and throw them away with it). `torch._check`, which
    nn.MultiheadAttention calls on a padding mask, imports the symbolic-shapes machinery (and sympy);
    the first optimiser step imports some 800 modules. Measured: 0.3 s + 0.6 s here, once per
    student, against about 1.5 s in each grade cell that would meet them (scripts/benchmark_grading.py).
    The first progress bar makes tqdm's lock, which imports multiprocessing's synchronisation module.
    tests/test_mistakes.py fails when a grade cell of any stage imports a module."""
    import torch
    from tqdm.auto import tqdm

    tqdm.get_lock()
    torch._check(True)
    layer = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    layer(torch.ones(1, 2)).sum().backward()
    torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def serve(preloaded: list[str], control: int | None = None, warm_up: bool = True) -> None:
    """The zygote: prepare, arm, then fork one runner per notebook the grader asks for."""
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # notebook code writing to fd 1 must not reach the grader's channel
    control = control if control is not None and _is_open(control) else None
    preload(preloaded, warm_up)
    receive, send = make_channel(requests, replies)
    tools = _zygote_tools(requests, replies, null)
    running: list[int] = [0]
    if control is not None:
        threading.Thread(target=_control_loop, args=(control, running), daemon=True).start()
    scratch = _scratch_folders()
    send({"op": "ready"})
    while True:
        try:
            request = receive()
        except EOFError:
            os._exit(0)
        if request.get("op") != "notebook":
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            _run_notebook(tools, receive, send, request)  # never returns
        running[0] = pid
        _, status = os.waitpid(pid, 0)
        running[0] = 0
        _clean_up(scratch)
        send({"op": "runner-exit", "status": _describe_status(status)})


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


PRIVATE_FOLDERS = "COURSE_RUNNER_PRIVATE"  # set by the launchers when cwd and TMPDIR belong to this runner alone


def _scratch_folders() -> dict[str, set[str]]:
    """The runner's own writable folders (working folder, TMPDIR) with what the zygote put there;
    none unless the launcher said they are private to this student (`PRIVATE_FOLDERS`)."""
    folders: dict[str, set[str]] = {}
    if os.environ.get(PRIVATE_FOLDERS) != "1":
        return folders
    for folder in {os.getcwd(), tempfile.gettempdir()}:
        try:
            folders[folder] = set(os.listdir(folder))
        except OSError:
            continue
    return folders


def _clean_up(scratch: dict[str, set[str]]) -> None:
    """After a runner ended: end every process it left behind and remove what it wrote, so one
    notebook (a full /tmp, a stray process) cannot break the next one or the runner's own start."""
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
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name in kept:
                continue
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _zygote_tools(requests: int, replies: int, null: int) -> dict[str, Any]:
    """Everything a runner and its sealed children use, bound before any notebook code runs, and the
    audit hook armed. A plain dict (a builtin type: no method of it can be replaced)."""
    import builtins

    import torch

    from transformer_course.checks import framework

    code_kind, file_kind, trusted, grader = seal.make_provenance(seal.library_roots())
    seal.trust_loaded_code(trusted, file_kind)
    integrity = seal.make_integrity_check(seal.frozen_tools())
    hook = seal.make_audit_hook(code_kind, file_kind, trusted, grader, seal.allowed_frame_users(),
                                proxy_call.__code__, _report_done.__code__)
    current: list[CellRecorder] = [CellRecorder()]
    user_ns: dict[str, Any] = {}
    tools = {
        "requests": requests, "replies": replies, "null": null, "code_kind": code_kind, "integrity": integrity,
        "install_seccomp": seal.make_seccomp_installer(), "block_signals": seal.make_signal_blocker(),
        "shell": make_shell(user_ns, current), "user_ns": user_ns, "current": current,
        "run_check": framework.run_check, "failed": framework.CheckFailed, "set_threads": torch.set_num_threads,
        "audit": sys.audit, "event_child": seal.EVENT + ".child", "event_grader": seal.EVENT + ".grader",
        "report_done": _report_done, "proxy_call": proxy_call, "partial": functools.partial,
        "namespace_type": types.SimpleNamespace, "StringIO": io.StringIO, "dict": dict, "list": list,
        "type": type, "str": str, "compile": compile, "exec": exec, "builtins": builtins, "sys": sys,
        "setprofile": sys.setprofile, "dup2": os.dup2, "exit": os._exit, "text": _text, "join": ", ".join,
        "SyntaxError": SyntaxError, "BaseException": BaseException, "make_guard": seal.make_profile_guard,
        "make_reference_use": make_reference_use, "reference_codes": reference_codes,
        "reference_exercises": reference_exercises, "check_entries": check_entries,
        "import_module": importlib.import_module, "record": framework.record,
        "disable_gc": __import__("gc").disable, "max_output": MAX_OUTPUT, "modules": sys.modules, "len": len,
    }
    _not_dumpable()
    seal.arm(hook)
    return tools


def _not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): no other process of the sandbox may read this one's memory through
    /proc/PID/mem (they share a uid); runners and grade cells' children inherit it. Also
    PR_SET_CHILD_SUBREAPER: what a runner leaves running is re-parented here, to be ended."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(4, 0, 0, 0, 0)
        prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        print("runner: could not make the process non-dumpable", file=sys.stderr)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _control_loop(control: int, running: list[int]) -> None:
    while True:
        command = os.read(control, 1)
        if not command:
            return
        pid = running[0]
        if pid:
            try:
                os.kill(pid, signal.SIGINT if command == b"i" else signal.SIGKILL)
            except ProcessLookupError:
                pass


def _describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


# --- a runner: one notebook ----------------------------------------------------------------------


def _run_notebook(zygote: dict[str, Any], receive: Callable, send: Callable, request: dict[str, Any]) -> None:
    """The runner's loop, in the process forked for one notebook. Everything it and its grade
    cells' children use is bound here, before the notebook's first cell runs."""
    t = dict(zygote)
    exercises = t["reference_exercises"](list(request.get("exercises", [])))
    module = t["import_module"](request["checks"])
    t["checks"] = t["check_entries"](module)
    t["reference_use"] = t["make_reference_use"](exercises)
    t["findings"] = []
    t["guard"] = t["make_guard"](t["code_kind"], t["integrity"], t["reference_codes"](exercises), {}, t["findings"])
    shell, user_ns, current = t["shell"], t["user_ns"], t["current"]
    run_cell, fork, waitpid, kill, exit_now = shell.run_cell, os.fork, os.waitpid, os.kill, os._exit
    describe, close_figures, recorder = _describe_status, _figure_closer(), CellRecorder
    sigkill, interrupted, base, system, kind, text = signal.SIGKILL, KeyboardInterrupt, BaseException, sys, type, str
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        os.makedirs(request["cwd"], exist_ok=True)
        os.chdir(request["cwd"])
        t["set_threads"](max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    except (OSError, ValueError):
        pass
    stdout, stderr = _Writer(lambda: current[0], "stdout"), _Writer(lambda: current[0], "stderr")
    user_ns["__name__"] = "__main__"
    send({"op": "runner-ready"})
    while True:
        try:
            message = receive()
        except (EOFError, interrupted):
            exit_now(0)
        op = message.get("op")
        if op == "cell":
            current[0] = recorder()
            saved = system.stdout, system.stderr
            system.stdout, system.stderr = stdout, stderr
            try:
                run_cell(message["source"], store_history=True)
            except interrupted:
                current[0].outputs.append({"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "",
                                           "traceback": ["KeyboardInterrupt"]})
            except base as error:  # SystemExit and the like end the cell, not the runner
                current[0].outputs.append({"output_type": "error", "ename": kind(error).__name__,
                                           "evalue": text(error)[:1000], "traceback": [kind(error).__name__]})
            finally:
                system.stdout, system.stderr = saved
                close_figures()
            system.last_type = system.last_value = system.last_traceback = None
            try:
                send({"op": "cell-done", "index": message["index"], "nonce": message["nonce"],
                      "outputs": current[0].outputs})
            except (OSError, interrupted):
                exit_now(3)
        elif op == "grade":
            pid = fork()
            if pid == 0:
                _grade_in_child(t, message)  # never returns
            status = "?"
            try:
                status = describe(waitpid(pid, 0)[1])
            except interrupted:
                kill(pid, sigkill)
                waitpid(pid, 0)
                status = "interrupted"
            try:
                send({"op": "grade-exit", "index": message["index"], "nonce": message["nonce"], "status": status})
            except (OSError, interrupted):
                exit_now(3)
        elif op == "results":  # what the grade cells decided, for the notebook's own summary cell
            for name, title, passed, text_ in message.get("results", []):
                t["record"](name, title, passed, text_)
        else:
            exit_now(0)


def _figure_closer() -> Callable[[], None]:
    import matplotlib.pyplot as plt

    return functools.partial(plt.close, "all")


def _grade_in_child(t: dict[str, Any], message: dict[str, Any]) -> None:
    """The sealed child of one grade cell (see the module docstring); ends with os._exit.

    Sealed: it reads only `t` (a plain dict filled before any notebook code ran) and its locals."""
    t["block_signals"]()
    t["disable_gc"]()
    t["dup2"](t["null"], 1)
    t["dup2"](t["null"], 2)
    t["set_threads"](1)
    t["install_seccomp"]()
    t["audit"](t["event_child"], t["replies"], message["nonce"])
    loaded = t["len"](t["modules"])  # modules this cell imports are imported again by every cell: the warm-up's job
    findings = t["findings"]
    replaced = t["integrity"]()
    if replaced:
        findings.append("replaced the checks' tools before this cell: " + t["join"](replaced[:4]))
    captured, discarded = t["StringIO"](), t["StringIO"]()
    bound = (t["run_check"], t["audit"], t["integrity"], t["reference_use"], findings, captured, t["failed"],
             t["type"], t["str"])
    check = t["namespace_type"]()
    partial = t["partial"]
    for name, inner, title in t["checks"]:
        check.__dict__[name] = partial(t["proxy_call"], inner, title, name, *bound)
    namespace = t["dict"](t["user_ns"])
    namespace["check"] = check
    namespace["__builtins__"] = t["builtins"]
    error = []
    parts = [(message["visible"], captured)]
    if message.get("hidden"):
        parts.append((message["hidden"], discarded))
    system, setprofile, guard = t["sys"], t["setprofile"], t["guard"]
    for source, output in parts:
        try:
            code = t["compile"](source, "<grade cell>", "exec")
        except t["SyntaxError"] as problem:
            error = ["SyntaxError", t["text"](problem)]
            break
        t["audit"](t["event_grader"], code)
        system.stdout = system.stderr = output
        setprofile(guard)
        try:
            t["exec"](code, namespace)
        except t["BaseException"] as problem:
            setprofile(None)
            error = [t["type"](problem).__name__, t["text"](problem)]
        finally:
            setprofile(None)
            system.stdout = system.stderr = discarded
        if error:
            break
    for line in t["integrity"]():
        line = "replaced the checks' tools while a check ran: " + line
        if line not in findings:
            findings.append(line)
    t["report_done"]({"error": error, "output": captured.getvalue()[:t["max_output"]], "findings": findings,
                      "imported": t["len"](t["modules"]) - loaded})
    t["exit"](0)


def _text(problem: BaseException, _str=str, _type=type, _Exception=Exception) -> str:
    try:
        text = _str(problem)
    except _Exception:  # a notebook exception whose str() fails
        return "?"
    return text[:4000] if _type(text) is _str else "?"


def _report_done(fields: dict[str, Any], _audit=sys.audit, _event=seal.EVENT + ".done") -> None:
    _audit(_event, fields)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preload", default="", help="modules to import before the first notebook")
    parser.add_argument("--control", type=int, help="file descriptor of the grader's control line")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="import only matplotlib, torch and the checks' framework: no notebook modules, no "
                             "warm-up (the batch grader's start-up test)")
    arguments = parser.parse_args(argv)
    serve([name for name in arguments.preload.split(",") if name], arguments.control, not arguments.no_warm_up)


if __name__ == "__main__":
    main()
