"""The grader's verdicts: nbgrader's Execute step, with every grade cell judged where no student code runs.

`JudgedExecute` replaces nbgrader's Execute in the autograde pipeline. It runs a notebook's ordinary cells
in the student's sandboxed runner (`session`, `runner`) and keeps their outputs, as a kernel would. A grade
cell is never run there: its source (nbgrader restores it from the gradebook, so it is the instructor's) is
read here, and must be a list of `assert check.NAME(name, ..., keyword=literal, ...)` lines. Each check runs
in *this* process, against a throwaway servant forked from the notebook's state at that cell: whatever
the check needs from the student's objects it asks for as an experiment (`checks.boundary`), and only
values come back. The verdict, the message and the cell's outputs are made here. A grade cell's hidden
part runs the same way after the notebook's last cell, against a snapshot taken at that cell; with a gate
(`use_gate`, the batch worker's), only after the last cell of every notebook of the student, whose runners
sleep in one sandbox meanwhile.

A runner that dies (os._exit, a crash, the memory limit) costs the cell that killed it: a new runner is
forked, the cells above that ran cleanly are run again (and the snapshots retaken), and the notebook goes
on. A cell that runs past the time limit is stopped. One deadline (`notebook_timeout`) covers a notebook's
cells, its replays and its hidden parts. Each hidden part starts with the sandbox's folders emptied by the
grader (`scratch`) and reads pass or fail only, in the same words whatever happened; one that ends the
notebook's processes fails the hidden parts after it instead of buying a replay (issue 39). What the grader
flags for review (the reference solution handed in, run, or copied in at run time) is written to the
notebook's metadata for the batch grader.
"""

from __future__ import annotations

import ast
import importlib
import logging
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Integer

from transformer_course.grading.cells import checks_module, credit, is_grade_cell, reference_modules, split_hidden
from transformer_course.grading.sandbox import hidden_inputs, profiling
from transformer_course.grading.sandbox.channel import StudentName
from transformer_course.grading.sandbox.outputs import OutputBudget
from transformer_course.grading.sandbox.session import (
    SERVANT_ENDED,
    CellTimedOut,
    ChannelBroken,
    RunnerDied,
    ServantFailed,
    Session,
    grading_environment,
    sandboxed_launcher,
)

FINDINGS_KEY = "transformer_course"  # notebook metadata key holding the findings for the batch grader


# --- grade cells as the grader reads them ----------------------------------------------------------------


class GradeCellError(ValueError):
    """A grade cell that is not a list of `assert check.NAME(...)` lines."""


@dataclass(frozen=True)
class CheckCall:
    """`assert check.NAME(arg, ..., key=value, ...)`: notebook names as arguments, literals as keywords."""

    name: str
    args: tuple[str, ...]
    kwargs: tuple[tuple[str, Any], ...]


def parse_checks(source: str) -> list[CheckCall]:
    """The check calls of (one part of) a grade cell, in order; GradeCellError for anything else."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise GradeCellError(f"the grade cell cannot be read ({type(error).__name__})") from None
    calls = []
    for statement in tree.body:
        node = statement.test if isinstance(statement, ast.Assert) else (
            statement.value if isinstance(statement, ast.Expr) else None)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "check"):
            raise GradeCellError(f"line {statement.lineno} of the grade cell is not `assert check.NAME(...)`")
        if not all(isinstance(arg, ast.Name) for arg in node.args):
            raise GradeCellError(f"line {statement.lineno}: a check's arguments must be names from the notebook")
        try:
            kwargs = tuple((keyword.arg, ast.literal_eval(keyword.value)) for keyword in node.keywords
                           if keyword.arg is not None)
        except ValueError:
            raise GradeCellError(f"line {statement.lineno}: a check's keywords must be plain values") from None
        if len(kwargs) != len(node.keywords):
            raise GradeCellError(f"line {statement.lineno}: **keywords are not allowed in a grade cell")
        calls.append(CheckCall(node.func.attr, tuple(arg.id for arg in node.args), kwargs))
    return calls


def parse_grade_cell(source: str) -> tuple[list[CheckCall], list[CheckCall]]:
    """(visible calls, hidden calls) of a grade cell."""
    visible, hidden = split_hidden(source)
    return parse_checks(visible), parse_checks(hidden) if hidden.strip() else []


# --- judging -------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    name: str
    title: str
    passed: bool
    message: str = ""


@dataclass
class Judged:
    """What the checks of one part of a grade cell decided."""

    verdicts: list[Verdict] = field(default_factory=list)
    error: tuple[str, str] | None = None  # (ename, evalue) of the cell's error, None when every check passed
    notes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.error is None


def judge(calls: list[CheckCall], checks: str | None, servant: Any, timeout: float,
          salts: list[int] | None = None) -> Judged:
    """Run each check here, its experiments in the servant; stop at the first that fails (as `assert` does).
    `salts`: for a hidden part drawn from the class's secret, each call's salt (`checks.salt`)."""
    from transformer_course.checks.boundary import judging
    from transformer_course.checks.framework import run_check
    from transformer_course.checks.salt import salted
    judged = Judged()
    module = importlib.import_module(checks) if checks else None
    for number, call in enumerate(calls):
        function = getattr(module, call.name, None) if module is not None else None
        inner, title = getattr(function, "__wrapped__", None), getattr(function, "check_title", None)
        if inner is None or not isinstance(title, str):
            judged.error = ("AttributeError", f"the checks have no check named {call.name!r}")
            break
        args = tuple(StudentName(name) for name in call.args)
        try:
            with judging(servant), salted(salts[number] if salts else None):
                result = run_check(inner, title, args, dict(call.kwargs))
        except ServantFailed as failure:
            judged.error = (("CellTimeoutError", f"this cell ran longer than {timeout:g} s and was stopped")
                            if str(failure) == "timeout" else
                            ("KernelDied", f"the process running your code for this check stopped ({failure}); "
                                           "this cell scores 0"))
            break
        except Exception as error:  # the check itself failed on what the student's side sent: this cell, not the grader
            logging.getLogger(__name__).warning("check %s could not judge the student's values", call.name,
                                                exc_info=True)
            judged.error = ("GradingError", f"the grader could not judge what your code sent back "
                                            f"({type(error).__name__}); this cell scores 0")
            break
        judged.verdicts.append(Verdict(call.name, title, result.passed, result.message))
        if not result.passed:
            judged.error = ("CheckFailed", f"✘ {title}: {result.message}")
            break
    judged.notes = list(getattr(servant, "notes", []))
    return judged


NOTE_WORDS = {  # the watch's notes (`watch.Watcher.handed_in`): all that can still be noted, since the grading
    # build leaves the graded stage's reference out (nothing of it can be run, copied or replaced any more)
    "reference": "hands in the course's reference solution itself ({reference})",
    "subclass": "hands in a subclass of the course's reference solution ({reference})",
}


def findings_from(notes: list[dict[str, Any]], labels: set[str]) -> list[str]:
    """What to flag from the servants' notes: a note of a known kind about one of the notebook's exercises
    (`labels`: their names, as `watch.Watcher` gives them), each once."""
    found = []
    for note in notes:
        kind, reference = note.get("kind"), note.get("reference")
        if kind not in NOTE_WORDS or reference not in labels:
            continue
        text = NOTE_WORDS[kind].format(reference=reference)
        if text not in found:
            found.append(text)
    return found


def preload_modules(notebooks: list[NotebookNode]) -> list[str]:
    """What the zygote should import before arming: every module the notebooks import at top level
    and the checks their grade cells use."""
    found: list[str] = ["IPython.core.interactiveshell"]
    for notebook in notebooks:
        checks = checks_module(notebook)
        if checks:
            found.append(checks)
        found += reference_modules(exercise_names(notebook))
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
    """The exercises the reference solution must not stand in for: the names the grade cells hand to the checks
    (grade cells are the instructor's: nbgrader restores them), and top-level functions and classes of the
    notebook's exercise (solution) cells."""
    names: list[str] = []
    for cell in notebook.cells:
        metadata = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or not isinstance(metadata, dict):
            continue
        if metadata.get("grade") and isinstance(cell.get("source"), str):
            with suppress(GradeCellError):
                visible, hidden = parse_grade_cell(cell.source)
                names += [name for call in visible + hidden for name in call.args]
        if not metadata.get("solution"):
            continue
        source = cell.get("source") if isinstance(cell.get("source"), str) else ""
        try:
            tree = ast.parse(source)
            names += [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)]
        except SyntaxError:
            names += re.findall(r"^(?:def|class)\s+(\w+)", source, re.MULTILINE)
    return list(dict.fromkeys(names))




# --- nbgrader's Execute, judged ----------------------------------------------------------------------------

_SESSION: list[Session | None] = [None]
_SESSION_FACTORY: list[Callable[[NotebookNode], Session] | None] = [None]
_GATE: list[Any] = [None]
_SECRET: list[bytes | None] = [None]


def use_secret(secret: bytes | None) -> None:
    """Draw every hidden part's inputs from `secret` (the class's, `hidden_inputs.read_or_create`); None: the
    inputs written in the grade cells (nbgrader run on its own, the tests)."""
    _SECRET[0] = secret


def use_gate(gate: Any) -> None:
    """Hold each notebook between its visible cells and its hidden parts: `gate.pause()` is called there and
    returns when the notebook may go on. The caller (the batch worker, `classroom.worker`) lets the hidden parts
    run only once every visible cell of the student has: then nothing a hidden part does, leaves or takes time
    over can reach anything the student is shown. Each notebook has a sandbox of its own, with or without a
    gate: with one, the student's sandboxes wait side by side between the phases, and no file, process, lock,
    counter or limit of one notebook's sandbox is another's."""
    _GATE[0] = gate


def use_session_factory(factory: Callable[[NotebookNode], Session] | None) -> None:
    """Make JudgedExecute use sessions from `factory` (the batch worker sets its sandboxed one)."""
    close_session()
    _SESSION_FACTORY[0] = factory


def close_session() -> None:
    if _SESSION[0] is not None:
        _SESSION[0].close()
        _SESSION[0] = None


def open_session(notebook: NotebookNode) -> Session:
    """The session the next notebook will use, started now if there is none (the worker starts it before
    grading, to know at once when no sandbox can start)."""
    return _session_for(notebook)


# Sandboxes are started from this one thread, which lives as long as the grader: a sandbox dies with the thread
# that started it (bubblewrap's parent-death signal), and with the gate a notebook's thread ends while the
# sandbox it may have had to replace still serves the student's other notebooks.
_STARTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-starter")


def _session_for(notebook: NotebookNode) -> Session:
    session = _SESSION[0]
    if session is not None and session.alive():
        return session
    factory = _SESSION_FACTORY[0] or default_session
    session = _STARTER.submit(factory, notebook).result()
    _SESSION[0] = session
    return session


def _own_session(notebook: NotebookNode) -> Session:
    """A sandbox for this notebook alone (with a gate): the one the worker started to see that sandboxes start
    (`open_session`), when it is still unused, else a new one. Nobody else's: the caller closes it."""
    session, _SESSION[0] = _SESSION[0], None
    if session is not None and session.alive():
        return session
    if session is not None:
        session.close()
    return _STARTER.submit(_SESSION_FACTORY[0] or default_session, notebook).result()


def default_session(notebook: NotebookNode) -> Session:
    """A sandboxed session for nbgrader used on its own, outside the batch grader (which sets a factory of
    its own through `use_session_factory`)."""
    return Session(preload_modules([notebook]), environment=grading_environment(1),
                   launcher=sandboxed_launcher()).start()


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
    """nbgrader's autograde pipeline with JudgedExecute for Execute and LimitOutputSize after it, and
    SaveExtraCredit after SaveAutoGrades."""
    replaced = []
    for preprocessor in preprocessors:
        name = preprocessor if isinstance(preprocessor, str) else preprocessor.__name__
        if name.rsplit(".", 1)[-1] == "Execute":
            replaced += [JudgedExecute, LimitOutputSize]
        else:
            replaced.append(preprocessor)
        if name.rsplit(".", 1)[-1] == "SaveAutoGrades":
            replaced.append(SaveExtraCredit)
    return replaced


class SaveExtraCredit(NbGraderPreprocessor):
    """An extra-credit grade cell (`credit="extra"` in its lesson) has 0 nbgrader points, so nbgrader's maximum
    leaves it out; its points are the number on its first line (`grading.cells.credit`), read from the
    gradebook's copy of the cell (the release's, never the student's). After SaveAutoGrades this gives each such
    cell nbgrader's `extra_credit`: those points when the cell passed (nbgrader's own reading of its outputs:
    no error, nothing on stderr), 0 when it failed. A grade's score is then its autograded score plus its extra
    credit (nbgrader's `Grade.score`), so the notebook's score counts it and its maximum does not. An optional
    cell (0 points, no extra credit) is left as nbgrader scored it: 0 of 0."""

    writes_gradebook = True  # its writes are tried again when the gradebook refuses them (`gradebook.retries`)

    def preprocess(self, nb: NotebookNode, resources: dict[str, Any]) -> tuple[NotebookNode, dict[str, Any]]:
        from nbgrader.api import Gradebook
        from nbgrader.utils import determine_grade

        if not any(is_grade_cell(cell) and credit(cell.source) for cell in nb.cells):
            # no cell says it is marked: the gradebook is not opened (a student who deletes the marker line of
            # an extra-credit cell loses only that cell's extra credit; one who adds it gains nothing, as the
            # gradebook's copy decides)
            return nb, resources
        ids = resources["nbgrader"]
        with Gradebook(ids["db_url"]) as gradebook:
            for cell in nb.cells:
                if not is_grade_cell(cell):
                    continue
                grade_id = cell.metadata.nbgrader["grade_id"]
                kept = gradebook.find_source_cell(grade_id, ids["notebook"], ids["assignment"])
                marked = credit(kept.source)
                if not marked or marked[0] != "extra":
                    continue
                scored = NotebookNode({**cell, "metadata": {**cell.metadata, "nbgrader": {
                    **cell.metadata.nbgrader, "points": marked[1]}}})
                earned, _ = determine_grade(scored, self.log)
                grade = gradebook.find_grade(grade_id, ids["notebook"], ids["assignment"], ids["student"])
                grade.extra_credit = float(earned or 0.0)
            gradebook.db.commit()
        return nb, resources


@dataclass
class _Hidden:
    """A grade cell whose hidden part waits for the end of the notebook, in a snapshot."""

    index: int
    calls: list[CheckCall]
    snapshot: int | None = None


class JudgedExecute(NbGraderPreprocessor):
    """nbgrader's Execute replaced (see the module docstring)."""

    timeout = Integer(120, help="Seconds a cell may run.").tag(config=True)
    max_kernel_deaths = Integer(10, help="Crashes of the notebook's process in its own ordinary cells tolerated "
                                         "before the rest is not run (each costs a replay of the cells above; "
                                         "restarts the grader makes after a check's time-out are not counted)").tag(
        config=True)
    output_budget_mb = Integer(16, help="Megabytes of output one notebook may keep; past it outputs are left "
                                        "out and the row says so").tag(config=True)
    notebook_timeout = Integer(1800, help="Seconds a whole notebook may run in all: its cells, the replays after a "
                                          "crash and its hidden parts (one deadline: what is not run by then is "
                                          "not run, and scores 0)").tag(config=True)
    interrupt_on_timeout = Bool(True, help="Kept for nbgrader's configuration; cells are always stopped.").tag(
        config=True)
    sandbox_per_notebook = Bool(True, help="A fresh sandbox for every notebook: nothing one notebook's hidden tests "
                                           "leave (files, processes, counters) reaches the next").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: dict[str, Any]) -> tuple[NotebookNode, dict[str, Any]]:
        self.nb, self.checks = nb, checks_module(nb)
        self.student = str((resources.get("nbgrader") or {}).get("student") or "")  # whose hidden inputs to draw
        self.cwd = str(resources.get("cwd") or os.path.join(
            "work", re.sub(r"[^\w.-]", "_", str(resources.get("unique_key", "notebook")))[:60]))
        self.exercises = exercise_names(nb)
        self.notes: list[dict[str, Any]] = []
        self.replay: list[tuple[str, Any]] = []  # what to run again after a runner died: cells, snapshots
        self.hidden: list[_Hidden] = []
        self.deaths = 0
        self.faults: list[str] = []  # cells that did not finish, and why: the row's reasons and the class report
        self.budget = OutputBudget(limit=self.output_budget_mb * 2**20)
        self.deadline = float("inf")  # set below, once the notebook's runner is ready
        gate = self.gate = _GATE[0]
        if gate is None and self.sandbox_per_notebook:  # the previous notebook's hidden tests ran in the last one
            close_session()
        self.session = _own_session(nb) if gate is not None else _session_for(nb)
        with profiling.phase("runner fork", self.session.cpu_seconds):
            try:
                self._open()
            except (RunnerDied, ChannelBroken) as failure:  # a sandbox an earlier notebook broke: a new one
                self.log.warning("the sandbox could not start this notebook (%s): starting a new one", failure)
                self.session.abandon()
                self.session.close()
                self.session = self._new_session()
                self._open()
        # one deadline for everything this notebook runs from here: its cells, the replays after a crash (a new
        # sandbox's start included) and its hidden parts; the time it waits between the phases, while the student's
        # other notebooks run, is not its own
        self.deadline = time.monotonic() + self.notebook_timeout
        self.session.deadline = self.deadline
        count = 0
        for index, cell in enumerate(nb.cells):
            if cell.get("cell_type") != "code":
                continue
            count += 1
            cell.execution_count = count
            if self.deaths > self.max_kernel_deaths:
                cell.outputs = [_error("NotRun", f"not run: the notebook's process crashed "
                                       f"{self.deaths} times above ({self._crashed_cells()})")]
                continue
            if self._out_of_time():  # many slow cells, or many crashes and replays, must not hold a class up
                cell.outputs = [_error("NotRun", f"not run: the notebook had run for more than "
                                       f"{_duration(self.notebook_timeout)} in all")]
                if not any("not run, nor any cell after it: the notebook's" in fault for fault in self.faults):
                    self._fault(index, f"not run, nor any cell after it: the notebook's "
                                       f"{_duration(self.notebook_timeout)} in all had run out")
                continue
            if is_grade_cell(cell):
                self._grade_cell(index, cell)
            else:
                self._ordinary_cell(index, cell)
        if gate is not None:
            left = self.deadline - time.monotonic()
            gate.pause()  # the student's other notebooks run their visible cells, each in a sandbox of its own
            self.deadline = time.monotonic() + max(0.0, left)
            self.session.deadline = self.deadline
        self._hidden_parts()
        with suppress(RunnerDied, ChannelBroken, OSError), profiling.phase("runner end", self.session.cpu_seconds):
            self.session.deadline = None  # ending the runner is the grader's own work: it has 30 s
            self.session.end_notebook()
        if gate is not None:
            self.session.close()
        findings = findings_from(self.notes, set(self.exercises))  # the watch names an exercise by its own name
        nb.metadata.setdefault(FINDINGS_KEY, {})["findings"] = findings
        nb.metadata[FINDINGS_KEY]["faults"] = self.faults + [reason for reason in [self.budget.reason()] if reason]
        return nb, resources

    def _new_session(self) -> Session:
        """A sandbox for this notebook, after its last one ended (with a gate: of its own, never shared)."""
        session = _own_session(self.nb) if self.gate is not None else _session_for(self.nb)
        session.deadline = self.deadline
        return session

    def _out_of_time(self) -> bool:
        return time.monotonic() >= self.deadline

    def _limit(self) -> float:
        """Seconds the next cell, check or replayed cell may run: its own limit, or what is left of the notebook's."""
        return max(0.0, min(float(self.timeout), self.deadline - time.monotonic()))

    def _stopped_words(self) -> str:
        """Why a cell that ran out of time was stopped: its own limit, or the notebook's."""
        if self._out_of_time():
            return f"was stopped: the notebook's {_duration(self.notebook_timeout)} in all had run out"
        return f"ran longer than {self.timeout} s and was stopped"

    # cells ------------------------------------------------------------------------------------------------

    def _fault(self, index: int, why: str) -> None:
        """Remember that the cell at `index` did not finish, and why (for the row's reasons)."""
        text = f"{_label(self.nb.cells[index])} {FAULT_WORDS} {why}"
        if text not in self.faults:
            self.faults.append(text)

    def _crashed_cells(self) -> str:
        crashed = [fault.split(f" {FAULT_WORDS} ")[0] for fault in self.faults if "crashed" in fault]
        return ", ".join(crashed[:5]) + (" ..." if len(crashed) > 5 else "")

    def _keep(self, index: int, outputs: list[dict[str, Any]]) -> list[NotebookNode]:
        return [_node(o) for o in self.budget.keep(outputs, _label(self.nb.cells[index]))]

    def _ordinary_cell(self, index: int, cell: NotebookNode) -> None:
        try:
            with profiling.phase("ordinary cells", self.session.cpu_seconds):
                cell.outputs = self._keep(index, self.session.run_cell(cell.source, self._limit()))
            self.notes += [note for note in self.session.cell_notes if note not in self.notes]
            if not any(o.get("output_type") == "error" for o in cell.outputs):
                self.replay.append(("cell", index))
        except CellTimedOut as stopped:
            partial = stopped.args[0] if stopped.args and isinstance(stopped.args[0], list) else []
            cell.outputs = self._keep(index, [o for o in partial if o.get("output_type") != "error"])
            words = self._stopped_words()
            cell.outputs.append(_error("CellTimeoutError", f"this cell {words}"))
            self._fault(index, words)
            if self.session.runner is None:
                self._died(index, None)
        except RunnerDied as died:
            self._fault(index, "crashed: its process stopped (os._exit, a crash in native code, more memory than "
                               "allowed, or outputs the grader does not accept)")
            self._died(index, died)
            cell.outputs = [_error("KernelDied", str(died))]
        except Exception:  # whatever the student's side sent, it costs this cell, never the notebook or the batch
            self.log.warning("cell %d could not be read back from the student's process", index, exc_info=True)
            self.session.kill_runner()
            self._fault(index, "crashed: the grader could not read back what it did")
            self._died(index, None)
            cell.outputs = [_error("GradingError", "the grader could not read back what this cell did; it scores "
                                                   "nothing, the cells after it still ran")]

    def _grade_cell(self, index: int, cell: NotebookNode) -> None:
        try:
            visible, hidden = parse_grade_cell(cell.source)
        except GradeCellError as problem:
            cell.outputs = [_error("GradingError", str(problem))]
            return
        if not visible and not hidden:
            cell.outputs = [_error("GradingError", "this grade cell runs no check")]
            return
        kind = "grade cells with hidden tests" if hidden else "grade cells"
        with profiling.phase(kind, self.session.cpu_seconds):
            judged, lost = self._judge(visible, None, index) if visible else (Judged(), None)
            if lost is not None:  # a grade cell's checks cost that cell only: the cells above are run again
                self._died(index, None, counted=False)
        cell.outputs = _outputs(judged, hidden=False)
        self.session_results(judged)
        if judged.passed and hidden:
            entry = _Hidden(index, hidden)
            self.hidden.append(entry)
            self._take_snapshot(entry)

    def _drawn(self, calls: list[CheckCall], index: int) -> tuple[list[CheckCall], list[int] | None]:
        """A hidden part's calls with their inputs drawn for this submission (the class's secret, the student, the
        notebook's code: `hidden_inputs.submission_key`), and their salts."""
        secret = _SECRET[0]
        if secret is None:
            return calls, None
        key = hidden_inputs.submission_key(secret, self.student, self.nb)
        metadata = self.nb.cells[index].get("metadata", {}).get("nbgrader", {})
        place = f"{self.checks}:{metadata.get('grade_id') if isinstance(metadata, dict) else index}"
        drawn = [hidden_inputs.draw(call, key, f"{place}:{line}", self.checks) for line, call in enumerate(calls)]
        return [call for call, _ in drawn], [salt for _, salt in drawn]

    def _judge(self, calls: list[CheckCall], snapshot: int | None, index: int,
               salts: list[int] | None = None) -> tuple[Judged, str | None]:
        """(what the checks decided, how the notebook's runner was lost: None when it was not, "timeout" when the
        grader ended the sandbox because the checks ran out of time, "ended" when the student's processes ended
        or broke the protocol). The caller decides whether to replay."""
        if self.session.runner is None:
            self._died(index if snapshot is None else len(self.nb.cells), None, counted=False)
            if self.session.runner is None:
                return Judged(error=("NotRun", f"not run: the notebook's process crashed {self.deaths} times above "
                                               f"({self._crashed_cells()})")), None
        if self.checks:  # the grader's own import of the checks (once per process) is not the cell's time
            with suppress(Exception):
                importlib.import_module(self.checks)
        limit = self._limit()
        deadline = time.monotonic() + limit
        # what this cell's process writes in the sandbox's folders goes with it (a storm costs this cell only)
        kept = self.session.scratch_inventory() if snapshot is None else None
        lost: str | None = None
        servant = None
        try:
            with self.session.servant(deadline, snapshot) as servant:
                judged = judge(calls, self.checks, servant, limit, salts)
            if servant.broken and not servant.exited:
                # it ran out of time or broke the protocol: what the student's code did to its sandbox (pipes
                # shrunk, forged replies queued, processes asleep) is not to be trusted by the next cell, which
                # gets a new sandbox with the cells above replayed
                self.session.abandon()
        except ServantFailed as failure:
            if not str(failure).startswith(SERVANT_ENDED):
                self.session.abandon()  # as above: the next cell gets a new sandbox
            judged = Judged(error=(("CellTimeoutError", f"this cell ran longer than {limit:g} s and was stopped")
                                   if str(failure) == "timeout" else
                                   ("KernelDied", f"the process running your code for this check stopped "
                                                  f"({failure}); this cell scores 0")))
        except RunnerDied as died:
            judged = Judged(error=("KernelDied", str(died)))
        if judged.error is not None and judged.error[0] == "CellTimeoutError" and self._out_of_time():
            judged.error = ("CellTimeoutError", f"this cell {self._stopped_words()}")
        if judged.error is not None and judged.error[0] in ("KernelDied", "CellTimeoutError"):
            self._fault(index, (self._stopped_words() if judged.error[0] == "CellTimeoutError" else
                                "stopped: the process running your code for its checks ended")
                        + (" (hidden tests)" if snapshot is not None else ""))
        self.notes += [note for note in judged.notes if note not in self.notes]
        if self.session.runner is not None and not self.session.alive():  # the whole sandbox ended meanwhile
            self.session.kill_runner()
        if self.session.runner is None:
            timed_out = servant is not None and servant.timed_out or (
                judged.error is not None and judged.error[0] == "CellTimeoutError")
            lost = "timeout" if timed_out else "ended"
        elif kept is not None:
            self.session.scratch_restore(kept)
            if self.session.runner is None:  # the cell's process left more than the grader removes: sandbox ended
                lost = "ended"
        return judged, lost

    def session_results(self, judged: Judged) -> None:
        results = [[v.name, v.title, v.passed, v.message] for v in judged.verdicts]
        with suppress(RunnerDied, OSError):
            if self.session.runner is not None:
                self.session.send_results(results)

    def _take_snapshot(self, entry: _Hidden) -> None:
        try:
            entry.snapshot = self.session.snapshot()
            self.replay.append(("snapshot", entry))
        except (RunnerDied, ChannelBroken) as died:
            entry.snapshot = None
            self._died(entry.index, died if isinstance(died, RunnerDied) else None)

    def _hidden_parts(self) -> None:
        """Every hidden part, in a snapshot of the notebook at its cell. Each starts with the sandbox's folders
        emptied by the grader (no hidden part reads what another wrote), and reads pass or fail only: a failing
        check, a process that stopped, time that ran out and a part not run read the same (`_hidden_outcome`),
        so that no hidden part can spell anything in the feedback but its one verdict. A hidden part that ends
        the notebook's processes fails the ones after it instead of buying a replay; one the grader stopped for
        running out of time is replayed, within the notebook's deadline."""
        ended: str | None = None  # why the remaining hidden parts do not run
        for entry in self.hidden:
            cell = self.nb.cells[entry.index]
            if ended is None and self._out_of_time():
                ended = f"not run: the notebook's {_duration(self.notebook_timeout)} in all had run out"
            if ended is None and self.session.runner is None:  # lost to the grader's own stop: replayed, counted
                self._died(len(self.nb.cells), None, counted=False)  # in the notebook's time
                if self.session.runner is None:
                    ended = (f"not run: the notebook's process crashed {self.deaths} times above"
                             if self.deaths > self.max_kernel_deaths else
                             f"not run: the notebook's {_duration(self.notebook_timeout)} in all had run out"
                             if self._out_of_time() else "not run: the notebook's process could not start again")
            if ended is None and entry.snapshot is not None and not self.session.empty_scratch():
                ended = "not run: the notebook's folders held too many files to be emptied; its sandbox was ended"
            if ended is not None:
                judged = Judged(error=("NotRun", ended))
                self._fault(entry.index, f"{ended} (hidden tests)")
            elif entry.snapshot is None:
                judged = Judged(error=("KernelDied", "the hidden tests could not run: the notebook's process "
                                       "stopped after this cell"))
            else:
                calls, salts = self._drawn(entry.calls, entry.index)
                with profiling.phase("hidden tests", self.session.cpu_seconds):
                    judged, lost = self._judge(calls, entry.snapshot, entry.index, salts)
                if lost == "ended":
                    ended = ("not run: an earlier hidden test of this notebook ended the notebook's processes "
                             f"({_label(cell)})")
            cell.outputs = _merge(cell.outputs, _hidden_outcome(judged, self.checks, entry.calls))

    # a runner that died ----------------------------------------------------------------------------------

    def _open(self) -> None:
        self.session.notebook(self.checks or "transformer_course.checks.framework", self.exercises, self.cwd)

    def _died(self, upto: int, died: RunnerDied | None, counted: bool = True) -> None:
        """A new runner: fork it, run the clean cells above `upto` again and retake their snapshots, within the
        notebook's deadline. `counted`: the death counts towards `max_kernel_deaths` (not when the grader ended
        the runner because a check ran out of time, or another notebook's code ended it)."""
        self.deaths += counted
        if died is not None:
            self.log.warning("runner died in cell %d: %s", upto, died)
        if self.deaths > self.max_kernel_deaths or self._out_of_time():
            self.session.kill_runner()
            return
        session = self.session
        session.kill_runner()
        if not session.alive():
            session.close()
            session = self.session = self._new_session()
        try:
            self._open()
            for kind, item in list(self.replay):
                if self._out_of_time():  # what is left of the notebook's time is spent: no runner half replayed
                    session.kill_runner()
                    return
                if kind == "cell" and item < upto:
                    with suppress(CellTimedOut):
                        session.run_cell(self.nb.cells[item].source, self._limit())
                elif kind == "snapshot" and item.index < upto:
                    item.snapshot = session.snapshot()
        except (RunnerDied, ChannelBroken):
            self.session.kill_runner()


def _duration(seconds: float) -> str:
    """'30 minutes', '90 s'."""
    return f"{seconds / 60:g} minutes" if seconds >= 120 and seconds % 60 == 0 else f"{seconds:g} s"


FAULT_WORDS = "did not finish:"  # "cell 12 (attn_split_heads) did not finish: ran longer than 120 s ..."


def _label(cell: NotebookNode) -> str:
    """How a row's reason names a cell: its number as the notebook showed it, and its nbgrader id."""
    number = cell.get("execution_count")
    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") if isinstance(
        cell.get("metadata", {}).get("nbgrader"), dict) else None
    return f"cell {number if isinstance(number, int) else '?'}" + (f" ({grade_id})" if isinstance(grade_id, str)
                                                                   else "")


HIDDEN_FAILED = ("fails on the hidden test's inputs (other sizes than the visible checks'; they are not shown, and "
                 "neither is what your code printed, raised or did with them: a hidden test that failed, stopped, ran "
                 "out of time, or did not run because an earlier one ended your notebook's processes, reads the "
                 "same). Fix what the visible checks of these properties say first; if they pass, look for what "
                 "holds only for their sizes: a size written as a number, an axis or a length taken from the wrong "
                 "place, a shape that only works when two sizes are equal.")


def _title(checks: str | None, call: CheckCall) -> str:
    """The title of the check a grade cell calls (its name when the checks have no such check)."""
    with suppress(Exception):
        title = getattr(getattr(importlib.import_module(checks), call.name, None), "check_title", None) \
            if checks else None
        if isinstance(title, str):
            return title
    return call.name


def _hidden_outcome(judged: Judged, checks: str | None, calls: list[CheckCall]) -> Judged:
    """What a hidden part shows: pass, or fail in the grader's own fixed words, the same whatever happened.

    Nothing computed from the hidden inputs may reach the notebook: a failing check's message (its numbers,
    shapes, whatever the student's code raised), the words of a crash (an exit status, a refused message,
    standard error: written by the code that had the inputs), and which of the part's checks failed, or whether
    it failed, stopped, ran out of time or did not run, all of which the student's code chooses. So a failed
    hidden part names the properties its checks test (fixed by the grade cell) and says it failed; a passed one
    lists them as passed. Its one bit, pass or fail, is all a hidden part can spell (issue 39)."""
    if judged.error is None:
        return judged
    titles = "; ".join(dict.fromkeys(_title(checks, call) for call in calls)) or "a hidden test"
    return Judged(error=("CheckFailed", f"✘ {titles} (hidden test): {HIDDEN_FAILED}"), notes=judged.notes)


def _outputs(judged: Judged, hidden: bool) -> list[NotebookNode]:
    text = _plain("".join(f"✔ {v.title}{' (hidden test)' if hidden else ''}\n" for v in judged.verdicts if v.passed))
    outputs = [new_output("stream", name="stdout", text=text)] if text else []
    if judged.error is not None:
        outputs.append(_error(*judged.error))
    return outputs


def _merge(outputs: list[NotebookNode], judged: Judged) -> list[NotebookNode]:
    """A passing visible part's outputs with the hidden part's verdicts added."""
    added = _outputs(judged, hidden=True)
    streams = [o for o in outputs if o.get("output_type") == "stream"]
    if streams and added and added[0].get("output_type") == "stream":
        streams[-1]["text"] += added.pop(0)["text"]
    return [*outputs, *added]


def _error(ename: str, evalue: str) -> NotebookNode:
    ename, evalue = _plain(ename), _plain(evalue)  # a message may quote what the student's code raised
    return NotebookNode({"output_type": "error", "ename": ename, "evalue": evalue,
                         "traceback": [f"{ename}: {evalue}"]})


# What a student's cell may show in the graded notebook, the feedback and the formgrader: text and pictures.
# Anything a browser would run or lay out as markup (HTML, SVG, JavaScript, Markdown, widgets) is dropped:
# the formgrader shows these outputs on the instructor's logged-in page.
INERT_OUTPUTS = ("text/plain", "image/png", "image/jpeg")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[\]PX^_].*?(?:\x07|\x1b\\)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _plain(text: str) -> str:
    """Text without terminal control sequences (ANSI colours, cursor moves, title changes) or control
    characters other than tabs and newlines."""
    return _ANSI.sub("", text)


def _node(output: dict[str, Any]) -> NotebookNode:
    """An nbformat output from the runner's plain dict (only the fields nbformat knows, as strings; only inert
    kinds of data, see INERT_OUTPUTS; no terminal control sequences)."""
    kind = str(output.get("output_type"))
    if kind == "error":
        return new_output("error", ename=_plain(str(output.get("ename", "Error")))[:200],
                          evalue=_plain(str(output.get("evalue", ""))),
                          traceback=[_plain(str(line)) for line in output.get("traceback", [])][:60])
    if kind in ("display_data", "execute_result"):
        data = {str(mime): (_plain(value) if mime == "text/plain" else value)
                for mime, value in (output.get("data") or {}).items()
                if isinstance(value, str) and mime in INERT_OUTPUTS}
        if not data:
            data = {"text/plain": "[an output the grader does not show: only text and pictures are kept]"}
        if kind == "execute_result":
            count = output.get("execution_count")
            return new_output(kind, data=data, execution_count=count if isinstance(count, int) else None)
        return new_output(kind, data=data)
    name = "stderr" if output.get("name") == "stderr" else "stdout"
    return new_output("stream", name=name, text=_plain(str(output.get("text", ""))))
