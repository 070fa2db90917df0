"""The grader's side of notebook execution: a student's sandboxed runner and nbgrader's Execute step.

`Session` starts one student's zygote (`transformer_course.grading.sandbox.runner`), by default confined by
`transformer_course.grading.sandbox.isolation`, and talks to it over pipes: ordinary cells come back with
their outputs, grade cells with the records the child's audit hook wrote. `judge` decides a grade
cell from those records alone: it passes only when the cell ended normally, every check the cell
calls reported a verdict in the order the cell calls them, every verdict passed, and no check
announced a failure on the way (even one that notebook code swallowed). Anything else on the
channel — bytes that are not records, a record with a wrong nonce, a second end — is tampering:
the cell fails and the submission is flagged.

`SealedExecute` is the nbgrader preprocessor (it replaces nbgrader's Execute in the autograde
pipeline): it runs every code cell through a session, restarts a runner that died (os._exit, a
crash, the memory limit) and replays the cells above it, stops a cell that runs past the time
limit, and records the findings (reference solution used, tools replaced, tampering) in the
notebook's metadata for the batch grader's CSV.
"""

from __future__ import annotations

import ast
import functools
import importlib
import os
import re
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Integer

from transformer_course.grading.cells import checks_module, is_grade_cell, split_hidden
from transformer_course.grading.sandbox import profiling, seal
from transformer_course.grading.sandbox.runner import PRIVATE_FOLDERS, encode_request

MAX_RECORD = 64 * 2**20
KERNEL_DIED = ("the Python process running your notebook stopped while running this cell (os._exit, a crash in "
               "native code, or more memory than allowed); this cell scores 0, the cells after it still ran")
FINDINGS_KEY = "transformer_course"  # notebook metadata key holding the findings for the batch grader


class ChannelBroken(Exception):
    """The runner's replies are not what the protocol says (tampering, or the runner is gone)."""


class RunnerDied(Exception):
    """The notebook's runner process ended (the zygote said how)."""


class ChannelTampered(RunnerDied):
    """Notebook code wrote into the grader's channel: the session is closed and must be restarted."""


CHANNEL_TAMPERED = ("your notebook wrote into the grader's own channel, so its process was stopped and this "
                    "cell scores 0")


class CellTimedOut(TimeoutError):
    """A cell ran past its time limit and was stopped; args[0] holds the outputs it had by then."""


@dataclass
class GradeOutcome:
    passed: bool
    outputs: list[dict[str, Any]]
    findings: list[str] = field(default_factory=list)
    message: str = ""
    imported: int = 0  # modules the cell's sealed child imported (thrown away with it; see runner.warm_up_torch)


# --- launching a zygote --------------------------------------------------------------------------


Launcher = Callable[..., Any]


class PlainProcess(subprocess.Popen):
    """The zygote without a sandbox, in a private working folder and TMPDIR removed at close."""

    def __init__(self, argv: list[str], private: str, **kwargs: Any) -> None:
        self.private = private
        super().__init__(argv, **kwargs)

    def close(self) -> None:
        shutil.rmtree(self.private, ignore_errors=True)


def plain_launcher(argv: list[str], *, environment: dict[str, str], pass_fds: tuple[int, ...],
                   stderr: Any) -> subprocess.Popen:
    """Start the zygote without a sandbox (tests of the runner itself), in folders of its own."""
    private = tempfile.mkdtemp(prefix="course-runner-")
    work, tmp = os.path.join(private, "work"), os.path.join(private, "tmp")
    os.mkdir(work)
    os.mkdir(tmp)
    environment = {**environment, "TMPDIR": tmp, PRIVATE_FOLDERS: "1"}
    return PlainProcess(argv, private, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                        env=environment, cwd=work, pass_fds=pass_fds, start_new_session=True)


def preload_modules(notebooks: list[NotebookNode]) -> list[str]:
    """What the zygote should import before arming: every module the notebooks import at top level
    and the checks their grade cells use."""
    found: list[str] = ["IPython.core.interactiveshell"]
    for notebook in notebooks:
        checks = checks_module(notebook)
        if checks:
            found.append(checks)
        for cell in notebook.cells:
            if cell.get("cell_type") != "code" or not isinstance(cell.get("source"), str):
                continue
            if re.search(r"\boptim\b|\boptimizer\b", cell.source):
                found.append("torch.optim")  # the first optimiser step imports hundreds of modules: warm up once
            for match in re.finditer(r"^(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", cell.source, re.MULTILINE):
                name = match.group(1) or match.group(2)
                if name.split(".")[0] in ("transformer_course", "torch", "numpy", "matplotlib", "plotly", "spacy",
                                          "sacrebleu", "tqdm", "math", "collections", "itertools", "functools"):
                    found.append(name)
    return list(dict.fromkeys(found))


def exercise_names(notebook: NotebookNode) -> list[str]:
    """Top-level functions and classes of the notebook's exercise (solution) cells."""
    names: list[str] = []
    for cell in notebook.cells:
        metadata = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or not isinstance(metadata, dict) or not metadata.get("solution"):
            continue
        source = cell.get("source") if isinstance(cell.get("source"), str) else ""
        try:
            tree = ast.parse(source)
            names += [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)]
        except SyntaxError:
            names += re.findall(r"^(?:def|class)\s+(\w+)", source, re.MULTILINE)
    return list(dict.fromkeys(names))


# --- a session ------------------------------------------------------------------------------------


class Session:
    """One student's zygote. Use as a context manager; `notebook()` opens a runner for one notebook."""

    def __init__(self, preload: list[str], environment: dict[str, str] | None = None,
                 launcher: Launcher | None = None, warm_up: bool = True) -> None:
        self.preload, self.warm_up = preload, warm_up
        self.environment = dict(environment if environment is not None else os.environ)
        self.launcher = launcher or plain_launcher
        self.process: Any = None
        self.buffer = b""
        self.control_write: int | None = None
        self.log = tempfile.TemporaryFile()

    # lifecycle -------------------------------------------------------------------------------------

    def start(self, timeout: float = 600) -> Session:
        """Start the zygote and wait until it is ready (imports done, defences armed)."""
        control_read, control_write = os.pipe()
        argv = [sys.executable, "-m", "transformer_course.grading.sandbox.runner", "--preload", ",".join(self.preload),
                *([] if self.warm_up else ["--no-warm-up"]),
                "--control", str(control_read)]
        self.log.seek(0)
        self.log.truncate()
        with profiling.phase("zygote start (sandbox, imports, arming)", self.cpu_seconds):
            self.process = self.launcher(argv, environment=self.environment, pass_fds=(control_read,),
                                         stderr=self.log)
            os.close(control_read)
            self.control_write = control_write
            self.buffer = b""
            self._await("ready", timeout)
        return self

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the sandbox's processes (see profiling.tree_cpu_seconds)."""
        return profiling.tree_cpu_seconds(self.process.pid) if self.process is not None else 0.0

    def _await(self, op: str, timeout: float) -> None:
        try:
            for record in self.records(time.monotonic() + timeout):
                if record.get("op") == op:
                    return
                if record.get("op") == "runner-exit":
                    raise RunnerDied(self._death(record))
                raise ChannelBroken(f"an unexpected record arrived while waiting for '{op}'")
        except TimeoutError:
            raise RunnerDied(f"the grading process was not {op} after {timeout:g} s ({self.stderr_tail()})") from None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def close(self) -> None:
        if self.process is None:
            return
        with suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if hasattr(self.process, "close"):
            self.process.close()
        if self.control_write is not None:
            with suppress(OSError):
                os.close(self.control_write)
        self.control_write = None
        self.process = None

    def __enter__(self) -> Session:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stderr_tail(self, lines: int = 5) -> str:
        self.log.seek(0)
        text = self.log.read()[-20_000:].decode("utf-8", "replace")
        return " | ".join(text.strip().splitlines()[-lines:])

    def reason(self) -> str | None:
        """Why the sandbox ended, when its launcher knows (e.g. the memory limit)."""
        explain = getattr(self.process, "reason", None)
        return explain() if callable(explain) else None

    # protocol -----------------------------------------------------------------------------------

    def send(self, request: dict[str, Any]) -> None:
        try:
            self.process.stdin.write(encode_request(request))
            self.process.stdin.flush()
        except (OSError, ValueError) as error:
            raise RunnerDied(f"the grading process is gone ({error})") from None

    def control(self, command: bytes) -> None:
        if self.control_write is not None:
            with suppress(OSError):
                os.write(self.control_write, command)

    def records(self, deadline: float) -> Iterator[dict[str, Any]]:
        """Decoded records as they arrive until `deadline` (then TimeoutError)."""
        fd = self.process.stdout.fileno()
        while True:
            while len(self.buffer) >= 12:
                if self.buffer[:4] != seal.RECORD_MAGIC:
                    raise ChannelBroken("bytes that are not the grader's records arrived on its channel")
                size = int.from_bytes(self.buffer[4:12], "big")
                if size > MAX_RECORD:
                    raise ChannelBroken(f"a record of {size} bytes arrived on the grader's channel")
                if len(self.buffer) < 12 + size:
                    break
                payload, self.buffer = self.buffer[12:12 + size], self.buffer[12 + size:]
                try:
                    record = seal.unpack(payload)
                except (ValueError, UnicodeDecodeError) as error:
                    raise ChannelBroken(f"an unreadable record arrived on the grader's channel ({error})") from None
                if not isinstance(record, dict):
                    raise ChannelBroken("a record that is not a message arrived on the grader's channel")
                yield record
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

    # notebooks ----------------------------------------------------------------------------------

    def notebook(self, checks: str, exercises: list[str], cwd: str, timeout: float = 300) -> None:
        """Fork a runner for one notebook and wait until it is ready for its first cell."""
        self.send({"op": "notebook", "checks": checks, "exercises": exercises, "cwd": cwd})
        self._await("runner-ready", timeout)

    def end_notebook(self, timeout: float = 30) -> None:
        self.send({"op": "end"})
        try:
            for record in self.records(time.monotonic() + timeout):
                if record.get("op") == "runner-exit":
                    return
        except (TimeoutError, ChannelBroken):
            self.control(b"k")

    def wait_runner_exit(self, timeout: float = 10) -> str:
        with suppress(TimeoutError, ChannelBroken):
            for record in self.records(time.monotonic() + timeout):
                if record.get("op") == "runner-exit":
                    return str(record.get("status"))
        return "?"

    def next_record(self, deadline: float) -> dict[str, Any]:
        """The next record, waiting until `deadline` at most (then TimeoutError)."""
        return next(self.records(deadline))

    def run_cell(self, index: int, source: str, timeout: float) -> list[dict[str, Any]]:
        """Outputs of an ordinary cell. Raises RunnerDied, or CellTimedOut after interrupting it (with the
        outputs it had when it stopped; a runner that ignored the interrupt is killed)."""
        nonce = secrets.token_hex(16)
        self.send({"op": "cell", "index": index, "source": source, "nonce": nonce})
        deadline = time.monotonic() + timeout
        interrupted = False
        while True:
            try:
                record = self.next_record(deadline)
            except ChannelBroken as error:
                self.close()
                raise ChannelTampered(f"{CHANNEL_TAMPERED} ({error})") from None
            except TimeoutError:
                if interrupted:
                    self.control(b"k")
                    self.wait_runner_exit()
                    raise CellTimedOut([]) from None
                interrupted = True
                self.control(b"i")
                deadline = time.monotonic() + 10
                continue
            if record.get("op") == "runner-exit":
                raise RunnerDied(self._death(record))
            if record.get("op") != "cell-done" or record.get("nonce") != nonce:
                self.close()
                raise ChannelTampered(f"{CHANNEL_TAMPERED} (a record that is not the grader's arrived)")
            outputs = [dict(output) for output in record.get("outputs", []) if isinstance(output, dict)]
            if interrupted:
                raise CellTimedOut(outputs)
            return outputs

    def run_grade_cell(self, index: int, source: str, titles: list[str], timeout: float) -> GradeOutcome:
        """Run a grade cell in a sealed child and judge it from the records (see `judge`)."""
        nonce = secrets.token_hex(16)
        visible, hidden = split_hidden(source)
        self.send({"op": "grade", "index": index, "visible": visible, "hidden": hidden, "nonce": nonce})
        records: list[dict[str, Any]] = []
        problems: list[str] = []
        deadline = time.monotonic() + timeout
        timed_out = False
        try:
            for record in self.records(deadline):
                if record.get("op") == "runner-exit":
                    raise RunnerDied(self._death(record))
                if record.get("nonce") != nonce:
                    problems.append("a record without the grader's nonce arrived while this cell ran")
                    continue
                if record.get("op") == "grade-exit":
                    records.append({"record": "exit", "status": record.get("status")})
                    break
                records.append(record)
        except TimeoutError:
            timed_out = True
            self.control(b"i")
            with suppress(TimeoutError):
                for record in self.records(time.monotonic() + 10):
                    if record.get("op") == "runner-exit":
                        raise RunnerDied(self._death(record)) from None
                    if record.get("op") == "grade-exit" and record.get("nonce") == nonce:
                        break
        except ChannelBroken as error:
            self.close()
            raise ChannelTampered(f"{CHANNEL_TAMPERED} ({error})") from None
        outcome = judge(records, titles, problems, timed_out, timeout, hidden_count=_hidden_calls(hidden, titles))
        results = [[str(r.get("name")), str(r.get("title")), r.get("passed") is True, str(r.get("message"))]
                   for r in records if r.get("record") == "verdict" and r.get("name")]
        if results:
            self.send({"op": "results", "results": results})
        return outcome

    def _death(self, record: dict[str, Any]) -> str:
        reason = self.reason()
        status = record.get("status", "?")
        return f"{KERNEL_DIED} [{reason or status}]"


def _hidden_calls(hidden: str, titles: list[str]) -> int:
    return len(re.findall(r"\bcheck\.\w+\s*\(", hidden)) if hidden else 0


def expected_titles(source: str, checks: str | None) -> list[str]:
    """The titles of the checks a grade cell calls, in the order it calls them (visible part, then hidden)."""
    if not checks:
        return []
    visible, hidden = split_hidden(source)
    names = [name for part in (visible, hidden) for name in re.findall(r"\bcheck\.(\w+)\s*\(", part)]
    titles = declared_titles(checks)
    if not all(name in titles for name in names):  # a check the source does not declare plainly: ask the module
        module = importlib.import_module(checks)
        return [getattr(getattr(module, name, None), "check_title", f"check.{name}") for name in names]
    return [titles[name] for name in names]


def module_source_path(name: str) -> str | None:
    """The source file of module `name`, found without importing it or its parent packages
    (`importlib.util.find_spec("a.b.c")` imports `a.b`, and the checks package imports torch)."""
    import importlib.util

    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return spec.origin if spec is not None and not rest else None
    for folder in spec.submodule_search_locations:
        base = os.path.join(folder, *rest)
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


@functools.lru_cache(maxsize=32)
def declared_titles(checks: str) -> dict[str, str]:
    """{function: title} of the checks a module declares with `@check("title")`, read from its source:
    the grader need not import torch and the checks to know what a grade cell's verdicts must say
    (tests/test_grading_speed.py compares this with the titles the imported module has)."""
    try:
        path = module_source_path(checks)
        tree = ast.parse(open(path, encoding="utf-8").read()) if path else None
    except (ImportError, OSError, SyntaxError, ValueError):
        return {}
    titles: dict[str, str] = {}
    for node in tree.body if tree else []:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name)
                    and decorator.func.id == "check" and len(decorator.args) == 1):
                continue
            title = decorator.args[0]
            if isinstance(title, ast.Constant) and isinstance(title.value, str):
                titles[node.name] = title.value
    return titles


def judge(records: list[dict[str, Any]], titles: list[str], problems: list[str], timed_out: bool,
          timeout: float, hidden_count: int = 0) -> GradeOutcome:
    """A grade cell's outcome from its records (see the module docstring)."""
    notes = [r for r in records if r.get("record") == "fail"]
    verdicts = [r for r in records if r.get("record") == "verdict"]
    dones = [r for r in records if r.get("record") == "done"]
    exits = [r for r in records if r.get("record") == "exit"]
    findings: list[str] = []
    done = dones[0] if len(dones) == 1 else {}
    for finding in done.get("findings", []) if isinstance(done.get("findings"), list) else []:
        if isinstance(finding, str):
            findings.append(finding)
    if len(dones) > 1:
        problems.append("the grade cell reported its end more than once")
    error = done.get("error") if isinstance(done.get("error"), list) else []
    imported = done.get("imported") if type(done.get("imported")) is int else 0
    shown_titles = [str(v.get("title")) for v in verdicts]
    outputs: list[dict[str, Any]] = []
    text = done.get("output") if isinstance(done.get("output"), str) else ""
    visible_count = len(titles) - hidden_count
    for position, verdict in enumerate(verdicts):
        if position >= visible_count and verdict.get("passed") is True:
            text += f"✔ {verdict.get('title')} (hidden test)\n"
    if text:
        outputs.append({"output_type": "stream", "name": "stdout", "text": text})

    def failed(ename: str, evalue: str) -> GradeOutcome:
        outputs.append({"output_type": "error", "ename": ename, "evalue": evalue,
                        "traceback": [f"{ename}: {evalue}"]})
        return GradeOutcome(False, outputs, findings + [f"tampering: {p}" for p in problems], evalue, imported=imported)

    failing = next((v for v in verdicts if v.get("passed") is not True), None)
    if timed_out:
        return failed("CellTimeoutError", f"this cell ran longer than {timeout:g} s and was stopped")
    if failing is not None:
        return failed("CheckFailed", f"✘ {failing.get('title')}: {failing.get('message')}")
    if error:
        name, value = (str(error[0]), str(error[1])) if len(error) > 1 else ("Error", str(error[0]))
        return failed(name, value)
    if notes:
        return failed("CheckFailed", "a check failed although the notebook's code hid the failure: "
                      + str(notes[0].get("message", "")).splitlines()[0])
    if problems:
        return failed("GradingError", "the notebook interfered with the grader: " + problems[0])
    if not dones:
        status = exits[0].get("status") if exits else "?"
        return failed("GradingError", f"the grade cell ended without reporting ({status})")
    if shown_titles != titles:
        return failed("GradingError", "the checks that ran are not the ones this cell calls "
                      f"(expected {len(titles)}, got {len(shown_titles)})")
    if not titles:
        return failed("GradingError", "this grade cell ran no check")
    return GradeOutcome(True, outputs, findings, imported=imported)


# --- nbgrader's Execute, through a session --------------------------------------------------------

_SESSION: list[Session | None] = [None]
_SESSION_FACTORY: list[Callable[[NotebookNode], Session] | None] = [None]


def use_session_factory(factory: Callable[[NotebookNode], Session] | None) -> None:
    """Make SealedExecute use sessions from `factory` (the batch worker sets its sandboxed one)."""
    close_session()
    _SESSION_FACTORY[0] = factory


def close_session() -> None:
    if _SESSION[0] is not None:
        _SESSION[0].close()
        _SESSION[0] = None


def _session_for(notebook: NotebookNode) -> Session:
    session = _SESSION[0]
    if session is not None and session.alive():
        return session
    factory = _SESSION_FACTORY[0] or default_session
    session = factory(notebook)
    _SESSION[0] = session
    return session


def default_session(notebook: NotebookNode) -> Session:
    """A sandboxed session for nbgrader used on its own, outside the batch grader (which sets a
    factory of its own through `use_session_factory`)."""
    return Session(preload_modules([notebook]), environment=grading_environment(1),
                   launcher=sandboxed_launcher()).start()


def grading_environment(threads: int, data_folder: str | None = None) -> dict[str, str]:
    """The whole environment of a student's runner (added to the sandbox's base environment)."""
    from transformer_course.data.multi30k import ENVIRONMENT_VARIABLE as MULTI30K_DIR

    environment = {"NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg", "PLOTLY_RENDERER": "plotly_mimetype",
                   "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
                   PRIVATE_FOLDERS: "1"}
    data = data_folder or os.environ.get(MULTI30K_DIR)
    if data:
        environment[MULTI30K_DIR] = data
    return environment


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

    def close(self) -> None:
        self.confined.close()


def sandboxed_launcher(readable: list[str] | None = None, limits: Any = None, isolate: bool = True,
                       course_root: Any = None) -> Launcher:
    """A launcher that confines the zygote (transformer_course.grading.sandbox.isolation): it reads only the
    Python environment, the course package and checkpoint, and the data folder it is given."""
    from transformer_course.grading.sandbox import isolation

    def launch(argv: list[str], *, environment: dict[str, str], pass_fds: tuple[int, ...], stderr: Any) -> Any:
        data = [environment[name] for name in ("MULTI30K_DIR",) if environment.get(name)]
        sandbox = isolation.Sandbox(
            readable=tuple(readable or [*isolation.python_paths(), *isolation.course_paths(course_root), *data]),
            environment=environment, limits=limits or isolation.Limits(), isolate=isolate)
        return ConfinedProcess(isolation.start(sandbox, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=stderr, pass_fds=pass_fds))

    return launch


class LimitOutputSize(NbGraderPreprocessor):
    """Cut every text output to `max_characters` (nbgrader's LimitOutput counts lines only, so one
    10-MB line would land whole in the autograded notebook, the gradebook and the feedback)."""

    max_characters = Integer(20_000, help="Characters kept per output.").tag(config=True)

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int) -> tuple[NotebookNode, dict]:
        for output in cell.get("outputs", []):
            if isinstance(output.get("text"), str) and len(output.text) > self.max_characters:
                cut = len(output.text) - self.max_characters
                output.text = output.text[: self.max_characters] + f"\n... [{cut} more characters cut by the grader]\n"
            for kind, value in list(output.get("data", {}).items()):
                if isinstance(value, str) and len(value) > 10 * self.max_characters:
                    output.data[kind] = f"[{kind} output of {len(value)} characters removed by the grader]"
        return cell, resources


def autograde_pipeline(preprocessors: list) -> list:
    """nbgrader's autograde pipeline with SealedExecute for Execute and LimitOutputSize after it."""
    replaced = []
    for preprocessor in preprocessors:
        name = preprocessor if isinstance(preprocessor, str) else preprocessor.__name__
        if name.rsplit(".", 1)[-1] == "Execute":
            replaced += [SealedExecute, LimitOutputSize]
        else:
            replaced.append(preprocessor)
    return replaced


class SealedExecute(NbGraderPreprocessor):
    """nbgrader's Execute replaced: cells run in the student's sandboxed runner (see module docstring)."""

    timeout = Integer(120, help="Seconds a cell may run.").tag(config=True)
    max_kernel_deaths = Integer(3, help="Runner crashes tolerated per notebook before giving up.").tag(config=True)
    interrupt_on_timeout = Bool(True, help="Kept for nbgrader's configuration; cells are always stopped.").tag(
        config=True)

    def preprocess(self, nb: NotebookNode, resources: dict[str, Any]) -> tuple[NotebookNode, dict[str, Any]]:
        checks = checks_module(nb)
        cwd = os.path.join("work", re.sub(r"[^\w.-]", "_", str(resources.get("unique_key", "notebook")))[:60])
        exercises = exercise_names(nb)
        findings: list[str] = []
        clean: list[int] = []
        deaths = 0
        session = _session_for(nb)
        with profiling.phase("runner fork", session.cpu_seconds):
            self._open(session, checks, exercises, cwd)
        count = 0
        for index, cell in enumerate(nb.cells):
            if cell.get("cell_type") != "code":
                continue
            count += 1
            cell.execution_count = count
            if deaths > self.max_kernel_deaths:
                cell.outputs = [_error("NotRun", "not run: the notebook's process crashed too often above")]
                continue
            try:
                if is_grade_cell(cell):
                    kind = "grade cells with hidden tests" if split_hidden(cell.source)[1] else "grade cells"
                    with profiling.phase(kind, session.cpu_seconds):
                        outcome = session.run_grade_cell(index, cell.source, expected_titles(cell.source, checks),
                                                         self.timeout)
                    cell.outputs = [_node(o) for o in outcome.outputs]
                    findings += [f for f in outcome.findings if f not in findings]
                else:
                    with profiling.phase("ordinary cells", session.cpu_seconds):
                        cell.outputs = [_node(o) for o in session.run_cell(index, cell.source, self.timeout)]
                    if not any(o.get("output_type") == "error" for o in cell.outputs):
                        clean.append(index)
            except CellTimedOut as stopped:
                partial = stopped.args[0] if stopped.args and isinstance(stopped.args[0], list) else []
                cell.outputs = [_node(o) for o in partial if o.get("output_type") != "error"]
                cell.outputs.append(_error("CellTimeoutError", f"this cell ran longer than {self.timeout} s "
                                           "and was stopped"))
                if not session.alive() or not self._runner_answers(session):
                    deaths += 1
                    session = self._restart(session, nb, checks, exercises, cwd, clean, index)
            except RunnerDied as died:
                deaths += 1
                cell.outputs = [_error("KernelDied", str(died))]
                if isinstance(died, ChannelTampered) and "tampering: wrote into the grader's channel" not in findings:
                    findings.append("tampering: wrote into the grader's channel")
                self.log.warning("runner died in cell %d: %s", index, died)
                if deaths <= self.max_kernel_deaths:
                    session = self._restart(session, nb, checks, exercises, cwd, clean, index)
        with suppress(RunnerDied, OSError), profiling.phase("runner end", session.cpu_seconds):
            session.end_notebook()
        nb.metadata.setdefault(FINDINGS_KEY, {})["findings"] = findings
        return nb, resources

    def _open(self, session: Session, checks: str | None, exercises: list[str], cwd: str) -> None:
        session.notebook(checks or "transformer_course.checks.framework", exercises, cwd)

    def _runner_answers(self, session: Session) -> bool:
        try:
            session.run_cell(-1, "pass", 10)
            return True
        except (TimeoutError, RunnerDied, ChannelBroken):
            return False

    def _restart(self, session: Session, nb: NotebookNode, checks: str | None, exercises: list[str], cwd: str,
                 clean: list[int], upto: int) -> Session:
        if not session.alive():
            session.close()
            session = _session_for(nb)
        self._open(session, checks, exercises, cwd)
        for index in clean:
            if index >= upto:
                break
            with suppress(TimeoutError, RunnerDied, ChannelBroken):
                session.run_cell(index, nb.cells[index].source, self.timeout)
        return session


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode({"output_type": "error", "ename": ename, "evalue": evalue,
                         "traceback": [f"{ename}: {evalue}"]})


def _node(output: dict[str, Any]) -> NotebookNode:
    """An nbformat output from the runner's plain dict (only the fields nbformat knows, as strings)."""
    kind = str(output.get("output_type"))
    if kind == "error":
        return new_output("error", ename=str(output.get("ename", "Error")), evalue=str(output.get("evalue", "")),
                          traceback=[str(line) for line in output.get("traceback", [])][:60])
    if kind in ("display_data", "execute_result"):
        data = {str(mime): value for mime, value in (output.get("data") or {}).items() if isinstance(value, str)}
        if kind == "execute_result":
            count = output.get("execution_count")
            return new_output(kind, data=data, execution_count=count if isinstance(count, int) else None)
        return new_output(kind, data=data)
    name = "stderr" if output.get("name") == "stderr" else "stdout"
    return new_output("stream", name=name, text=str(output.get("text", "")))
