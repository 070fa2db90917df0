"""Which code runs in the student's process: the watch for the reference solution handed in as the student's work.

Nothing here traces the notebook (a trace or profile function would switch Python 3.11 to its slow path for every
line the notebook runs: it once cost ordinary cells more than half their time). Two events are watched instead:

- **the reference runs.** Before any notebook code, `install_probes` gives every exercise function of the
  reference (the code students write) a *probe*: its first statement calls a `Probe`, an object held in the
  function's own code as a constant, so no name the notebook could rebind reaches it. When the reference runs,
  the probe asks the watcher on duty whether the notebook's own code called it (ordinary cells), or anything but
  what the check supplied (a check's experiments). Code copied from a probed function (`code.replace`,
  `types.FunctionType`, marshal) carries its probe along.
- **a copy of it is made.** Python's audit events report every code object about to run through `exec` (cells,
  `exec`/`eval` of source, imports of a file the notebook wrote, code made with `compile`, `marshal` or
  `types.CodeType`), every function made with `types.FunctionType` and every function given a new `__code__`.
  Code from outside the installed libraries whose fingerprint is the reference's becomes a note; the
  fingerprint leaves probes out (`fingerprint.fingerprint`), so a copy with its probe cut out is still the
  reference's.

The notes go to the grader, which decides what to flag (`executor.findings_from`): a copy written in a cell of
the notebook is the student's own text, never flagged. The audit hook is installed in the zygote, before any
notebook code, and cannot be removed. Limits (README, *What is flagged for review*): the watch lives in the
student's process, so code that finds its objects (through `gc`) can blind it; a process the notebook starts
in an ordinary cell is not watched.
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

from transformer_course.grading.sandbox import fingerprint

PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
                            "subprocess.Popen"})
MADE_EVENTS = frozenset({"exec", "function.__new__"})  # their first argument is the code about to run
_MARK = "\x00transformer-course-probe:"  # the constant a probe replaces in freshly compiled reference code


class Probe:
    """The first statement of a probed reference function: tells the watcher on duty that this part ran."""

    __slots__ = ("label",)

    def __init__(self, label: str) -> None:
        self.label = label

    def __call__(self) -> None:
        watcher = GUARD.watcher
        if watcher is not None:
            watcher.ran(self.label, sys._getframe(1))

    def __repr__(self) -> str:
        return "<the grader's probe>"


class Known:
    """What the watchers of one notebook compare against, found once before any notebook code runs: its
    exercises (probed), the reference modules' own code, the folders of installed libraries."""

    def __init__(self, exercises: fingerprint.ExerciseCode) -> None:
        self.exercises = exercises
        self.probed = install_probes(exercises)  # id(code) of each probed function's own code
        self.library = tuple(_library_roots())
        self.reference_folder = _reference_folder()
        self.genuine = _reference_code_ids()  # the reference modules' own code objects, probed ones included

    def made_elsewhere(self, code: types.CodeType) -> bool:
        """Code not from an installed library (the notebook's cells, files its code wrote, source it ran), or
        code claiming a reference file that is not the reference's own (a copy compiled from its source)."""
        filename = code.co_filename
        return not filename.startswith(self.library) or (
            filename.startswith(self.reference_folder) and id(code) not in self.genuine)


class Watcher:
    """Notes for the grader while it is on duty (`watching`): the reference solution of this notebook's exercises
    running other than through what the check supplied (`checks.boundary.supplied`), and code with the
    reference's fingerprint being made (a copy of it, however it was made)."""

    def __init__(self, known: Known, direct: bool = False) -> None:
        self.known = known
        self.exercises = known.exercises
        # direct: a note only when notebook code itself runs the reference (past torch's module machinery), as
        # in ordinary cells, whose given code runs the course's checks and tools; else through any library
        self.direct = direct
        self.supplied_objects: set[int] = set()
        self.supplied_codes: set[int] = set()
        self.notes: list[dict[str, str]] = []
        self.seen: dict[int, str | None] = {}  # id(code) -> the reference it copies, or None

    def supply(self, value: Any) -> None:
        modules = getattr(value, "modules", None)
        if callable(modules) and type(value).__module__.startswith(("transformer_course", "torch")):
            with contextlib.suppress(Exception):
                for module in modules():
                    self.supplied_objects.add(id(module))
        self.supplied_objects.add(id(value))
        for function in fingerprint.functions_of(value):
            for code in fingerprint.code_tree(function.__code__):
                self.supplied_codes.add(id(code))

    def handed_in(self, name: str, value: Any) -> None:
        """A grade cell's argument: is it the reference itself, a subclass, or made of its methods?"""
        exercise = self.exercises.objects.get(id(fingerprint.unwrap(value)))
        if exercise is not None:
            self._note("reference", exercise, f"{name} is the course's reference solution ({exercise})")
            return
        if isinstance(value, type):
            for reference, exercise in self.exercises.classes:
                if value is not reference and issubclass(value, reference):
                    self._note("subclass", exercise, f"{name} is a subclass of the reference solution ({exercise})")
        for function in fingerprint.functions_of(value):
            label = self.exercises.codes.get(id(function.__code__))
            if label is not None:
                self._note("reference", label, f"{name} is made of the reference solution's code ({label})")
            elif fingerprint.substantial(function.__code__):
                digest = fingerprint.digest(function.__code__)
                copied = self.exercises.digests.get(digest)
                if copied is not None:
                    self._note("copy", copied, f"{name} holds a copy of the reference solution ({copied})", digest)

    def _note(self, kind: str, reference: str, text: str, digest: str = "") -> None:
        note = {"kind": kind, "reference": reference, "text": text, "digest": digest}
        if note not in self.notes:
            self.notes.append(note)

    def take(self) -> list[dict[str, str]]:
        notes, self.notes = self.notes, []
        return notes

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Put this watcher on duty for the block (in every thread: the probes and the audit hook ask GUARD)."""
        previous, GUARD.watcher = GUARD.watcher, self
        try:
            yield
        finally:
            GUARD.watcher = previous

    def foreign(self, filename: str) -> bool:
        """Code not from an installed library: the notebook's cells, or files the student's code wrote."""
        return not filename.startswith(self.known.library)

    def ran(self, label: str, frame: Any) -> None:
        """A probe: the reference's `label` runs in `frame`. Noted unless a check supplied it, or (direct) unless
        the course's own code called it; the reference calling itself is the reference."""
        code = frame.f_code
        if not self.direct and (id(code) in self.supplied_codes
                                or id(frame.f_locals.get("self")) in self.supplied_objects):
            return
        caller = frame.f_back
        passing = _TORCH if self.direct else self.known.library  # frames a call passes through on its way
        while caller is not None and caller.f_code.co_filename.startswith(passing):
            caller = caller.f_back
        if (caller is not None and id(caller.f_code) not in self.exercises.codes
                and (not self.direct or self.foreign(caller.f_code.co_filename))):
            self._note("runs", label, f"your code runs the course's reference solution ({label})")

    def made(self, code: types.CodeType) -> None:
        """Code about to run or become a function: a copy of the reference, made while the notebook ran?"""
        for each in fingerprint.code_tree(code):
            known = self.seen.get(id(each), False)
            if known is False:
                known = None
                if self.known.made_elsewhere(each) and fingerprint.substantial(each):
                    known = self.exercises.digests.get(fingerprint.digest(each))
                self.seen[id(each)] = known
                if len(self.seen) > 200_000:  # ids of freed code can be reused: forget, never misname
                    self.seen.clear()
            if known:
                self._note("copy", known, f"your code makes a copy of the reference solution ({known})",
                           fingerprint.digest(each))


class Guard:
    """The audit hook of the student's processes, installed in the zygote before any notebook code (an audit hook
    cannot be removed). While a watcher is on duty it hands it every code object about to run through `exec`
    and every function made or given new code, notes a probed function's code being replaced, and, while a check
    runs the student's code, notes a process started by the notebook's own code (directly, or through the
    standard library's process pools): nothing watches it."""

    def __init__(self) -> None:
        self.watcher: Watcher | None = None

    def hook(self, event: str, arguments: tuple) -> None:
        watcher = self.watcher
        if watcher is None:
            return
        if event in MADE_EVENTS:
            if arguments and isinstance(arguments[0], types.CodeType):
                watcher.made(arguments[0])
            return
        if event == "object.__setattr__":
            if len(arguments) == 3 and arguments[1] == "__code__" and isinstance(arguments[2], types.CodeType):
                if id(getattr(arguments[0], "__code__", None)) in watcher.known.probed:
                    label = watcher.exercises.codes.get(id(arguments[0].__code__), "")
                    watcher._note("trace", label, "your code replaces the code of the reference solution")
                watcher.made(arguments[2])
            return
        if event not in PROCESS_EVENTS or watcher.direct:
            return  # ordinary cells may start processes (a shell command, a download)
        caller = sys._getframe(1)
        while caller is not None and _in_standard_library(caller.f_code.co_filename):
            caller = caller.f_back
        if caller is not None and watcher.foreign(caller.f_code.co_filename):
            watcher._note("process", "", "your code starts another process while a check runs it")


GUARD = Guard()


# --- probes ---------------------------------------------------------------------------------------------------


def install_probes(exercises: fingerprint.ExerciseCode) -> set[int]:
    """Give every exercise function of the reference its probe: recompile its module's source with a probe call
    as the first statement of each such function (after its docstring, on its first statement's line, so
    tracebacks and line numbers stay as they were) and give each function the new code. `exercises.codes` is
    rebuilt for the probed code. Returns the ids of the probed functions' own code objects."""
    by_file: dict[str, list[tuple[types.FunctionType, str]]] = {}
    for function, label in exercises.functions:
        by_file.setdefault(function.__code__.co_filename, []).append((function, label))
    probed: set[int] = set()
    for filename, functions in by_file.items():
        fresh = _compiled_with_marks(filename, {function.__code__.co_firstlineno for function, _ in functions})
        if fresh is None:
            continue
        for function, label in functions:
            old = function.__code__
            new = fresh.get((old.co_qualname, old.co_firstlineno))
            marked = new is not None and any(isinstance(constant, str) and constant.startswith(_MARK)
                                             for constant in new.co_consts)
            if not marked or new.co_freevars != old.co_freevars:
                continue  # left as it was: tests/test_watch.py requires every exercise function probed
            function.__code__ = new.replace(co_consts=tuple(
                Probe(label) if isinstance(constant, str) and constant.startswith(_MARK) else constant
                for constant in new.co_consts))
            probed.add(id(function.__code__))
    exercises.codes.clear()
    exercises.keep[:] = [value for value in exercises.keep if not isinstance(value, types.CodeType)]
    for function, label in exercises.functions:
        for code in fingerprint.code_tree(function.__code__):
            exercises.codes[id(code)] = label
            exercises.keep.append(code)
    return probed


def _compiled_with_marks(filename: str, first_lines: set[int]) -> dict[tuple[str, int], types.CodeType] | None:
    """The module's code, recompiled with a marked call as the first statement of each function that starts on
    one of `first_lines`: (qualified name, first line) -> code."""
    try:
        with open(filename, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), filename)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.body:
            continue
        first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
        if first not in first_lines:
            continue
        documented = (isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
                      and isinstance(node.body[0].value.value, str))
        place = node.body[1] if documented and len(node.body) > 1 else node.body[0]
        mark = ast.Expr(ast.Call(ast.Constant(f"{_MARK}{first}"), [], []))
        ast.copy_location(mark, place)
        ast.copy_location(mark.value, place)
        ast.copy_location(mark.value.func, place)
        node.body.insert(1 if documented else 0, mark)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "'str' object is not callable": the mark is replaced before it runs
        module = compile(tree, filename, "exec", dont_inherit=True)
    return {(code.co_qualname, code.co_firstlineno): code for code in fingerprint.code_tree(module)}


# --- where code comes from ----------------------------------------------------------------------------------


def _torch_folder() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.abspath(locations[0]) + os.sep if locations else "<no torch>"


def _in_standard_library(filename: str) -> bool:
    return filename.startswith(_STANDARD_LIBRARY) and "-packages" + os.sep not in filename


_TORCH = _torch_folder()
_STANDARD_LIBRARY = (os.path.dirname(os.path.abspath(contextlib.__file__)) + os.sep, "<frozen")


def _reference_folder() -> str:
    import transformer_course.reference as reference

    return os.path.dirname(os.path.abspath(reference.__file__)) + os.sep


def _reference_code_ids() -> set[int]:
    """Every code object of the reference modules loaded now (code claiming their files but not among these
    was made elsewhere: a copy)."""
    found: set[int] = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith("transformer_course.reference") or module is None:
            continue
        for value in list(vars(module).values()):
            for function in fingerprint.functions_of(value) if isinstance(value, type | types.FunctionType) else []:
                found.update(id(code) for code in fingerprint.code_tree(function.__code__))
    return found


def _library_roots() -> list[str]:
    import site

    import transformer_course

    folders = [sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(),
               os.path.dirname(transformer_course.__file__), "<frozen"]
    roots = set()
    for folder in folders:
        if folder.startswith("<"):
            roots.add(folder)
            continue
        for form in (os.path.abspath(folder), os.path.realpath(folder)):
            roots.add(form.rstrip(os.sep) + os.sep)
    return sorted(roots)
