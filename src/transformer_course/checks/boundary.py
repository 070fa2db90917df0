"""Where the student's code runs: the checks' side of the boundary between the student and the grader.

A check is two kinds of code. Most of it compares values with the reference and words the message;
the parts that touch the student's objects (build the student's module, call their function, record what
their `forward` does) are *experiments*, marked with `@on_student_side`. In a student's own notebook both
run together, in one process. When the course grades a notebook, the check runs in the grader's process,
which never runs student code: every call of an experiment is sent to the student's sandboxed process,
runs there, and only its values come back (tensors and plain data; anything else stays behind as an
opaque handle). So a verdict is decided where no student code has ever run.

Rules for experiments (tests/test_boundary.py and the real grader hold the checks to them):
- they take and return values the channel can carry: numbers, strings, tensors, lists, tuples, dicts, the
  checks' own dataclasses, and objects of the student's side (passed back as they came);
- they never decide that a property holds: they observe, the check judges (an experiment may *fail* a
  check, e.g. "your module has no attribute W_q", because a failure it reports can only cost the student);
- what they plug into the student's objects (reference parts, a model handed to `train_epoch`) is declared
  with `supplied(...)`, so that its running is never counted as the student running the reference.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

Function = TypeVar("Function", bound=Callable[..., Any])


class Remote(Protocol):
    """The grader's connection to the student's process (`grading.sandbox.executor.Servant`)."""

    def run(self, module: str, qualname: str, args: tuple, kwargs: dict) -> Any: ...


_REMOTE: ContextVar[Remote | None] = ContextVar("transformer_course_remote", default=None)


@contextlib.contextmanager
def judging(remote: Remote) -> Iterator[None]:
    """Inside: every experiment runs in the student's process through `remote` (the grader's side)."""
    token = _REMOTE.set(remote)
    try:
        yield
    finally:
        _REMOTE.reset(token)


def judged() -> bool:
    """Whether checks are running in the grader's process, away from the student's code."""
    return _REMOTE.get() is not None


def on_student_side(function: Function) -> Function:
    """Mark an experiment: a function that touches the student's objects and returns what it observed.

    Called while judging, it runs in the student's process (see the module docstring); otherwise here."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        remote = _REMOTE.get()
        if remote is None:
            return function(*args, **kwargs)
        return remote.run(function.__module__, function.__qualname__, args, kwargs)

    run.experiment = function  # type: ignore[attr-defined]  (what the student's side calls)
    return run  # type: ignore[return-value]
    # (the student's side finds an experiment by its module and qualified name: define experiments with the
    # decorator syntax, so that the name leads to this wrapper)


# --- what the checks plug in -------------------------------------------------------------------------------

_SUPPLIED: list[Callable[[Any], None]] = []  # the student's side registers its watcher here


def supplied(*objects: Any) -> None:
    """Declare objects (modules with all their submodules, functions) that a check hands to the student's
    code. The grader's watcher of reference code counts their running as the check's doing, not the
    student's. Outside grading this does nothing."""
    for watcher in _SUPPLIED:
        for value in objects:
            watcher(value)


# --- parts of the graded stage, in a servant only ------------------------------------------------------------

_PARTS: dict[str, Callable[..., Any]] = {}  # key ("module:function") -> the part, in a servant that was sent it
_PROXIES: dict[str, list[Callable[..., Any]]] = {}  # key -> the proxies standing for it (their signature follows)


class PartNotHere(RuntimeError):
    """A part the grader supplies only to its own experiments was called from elsewhere."""


def supplied_part(key: str) -> Callable[..., Any]:
    """What the grading build puts in place of a part of the graded stage that an experiment plugs into the
    student's objects (`grading.sandbox.build.experiment_parts`): a proxy to the part the grader sent with the
    running experiment's request, and nothing otherwise (an ordinary cell, another experiment)."""
    name = key.rpartition(":")[2]

    def part(*args: Any, **kwargs: Any) -> Any:
        found = _PARTS.get(key)
        if found is None:
            raise PartNotHere(f"{name} is a part the grader's checks plug into your code while they run; it is not "
                              "there for your notebook's own code")
        return found(*args, **kwargs)

    part.__name__ = part.__qualname__ = name
    _PROXIES.setdefault(key, []).append(part)
    return part


def _show_lines(filename: str, source: str) -> None:
    """Put a part's lines into linecache's copy of its file (the build left them blank there), so tracebacks and
    the checks' recorder read the part's own lines, in this servant only."""
    import linecache

    entry = linecache.cache.get(filename)
    if entry is None or len(entry) != 4:
        return
    lines = list(entry[2])
    for number, line in enumerate(source.splitlines(keepends=True)):
        if line.strip() and number < len(lines):
            lines[number] = line
    linecache.cache[filename] = (entry[0], entry[1], lines, entry[3])


@contextlib.contextmanager
def parts_sent(parts: Any) -> Iterator[None]:
    """Inside: the parts the grader sent with one experiment's request ([key, file name, source], ...), each
    defined in a copy of its module's namespace (so that it finds that module's helpers). They stay in this
    servant, which ends with its grade cell: a student's module an experiment built with a part plugged in is
    run again by the next experiments of the same cell."""
    import sys

    made: dict[str, Callable[..., Any]] = {}
    for entry in parts if isinstance(parts, list) else []:
        if not (isinstance(entry, list | tuple) and len(entry) == 3 and all(isinstance(x, str) for x in entry)):
            continue
        key, filename, source = entry
        module_name, _, name = key.rpartition(":")
        module = sys.modules.get(module_name)
        if module is None:
            continue
        namespace = dict(vars(module))
        exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # noqa: S102 (the grader's code)
        made[key] = namespace[name]
        _show_lines(filename, source)
    _PARTS.update(made)  # kept for the servant's life (one grade cell): a module it built keeps its parts plugged
    for key, found in made.items():  # the checks' recorder reads a plugged part's parameters through its proxy
        for proxy in _PROXIES.get(key, []):
            proxy.__wrapped__ = found  # type: ignore[attr-defined]  (inspect.signature follows it)
    yield


# --- errors from the student's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One frame of a traceback: file, line number, function and the line as written."""

    filename: str
    lineno: int
    name: str
    line: str


@dataclass(frozen=True)
class StudentError:
    """An exception raised on the student's side, as plain data: its type (and the built-in types it
    derives from), its text, its frames (innermost last) and whether it is an unfinished exercise's
    `raise NotImplementedError()`, and what the failing line was doing, worked out from the values in its frame
    while they were alive (`checks.crash`; "" when nothing could be said)."""

    type_name: str
    bases: tuple[str, ...]
    message: str
    frames: tuple[Frame, ...]
    stub: bool
    detail: str = ""


def as_exception(error: StudentError, check_failed: type[BaseException]) -> BaseException:
    """The exception to raise in the grader for an error of the student's side: the built-in type it
    derives from (a student's own exception class becomes a subclass of its nearest built-in base, with
    its name), CheckFailed for a check that failed there. It carries the record as `.student_error`."""
    if error.type_name == "CheckFailed":
        exception: BaseException = check_failed(error.message)
    else:
        base = next((getattr(builtins, name) for name in error.bases
                     if isinstance(getattr(builtins, name, None), type)
                     and issubclass(getattr(builtins, name), Exception)), Exception)
        if base.__name__ != error.type_name:
            base = type(error.type_name, (base,), {"__module__": "student"})
        try:
            exception = base(error.message)
        except Exception:  # a built-in whose constructor wants more (UnicodeDecodeError, say)
            exception = type(error.type_name, (Exception,), {"__module__": "student"})(error.message)
    exception.student_error = error  # type: ignore[attr-defined]
    return exception


def student_error_of(exception: BaseException) -> StudentError | None:
    return getattr(exception, "student_error", None)


# --- the grading build -------------------------------------------------------------------------------------


class JudgedByGrader(RuntimeError):
    """A check called by notebook code inside the grading sandbox, where only its experiments exist."""


def shown_in_the_notebook(function: Function) -> Function:
    """Mark a public helper of a checks module that ordinary cells call to *show* something, not to judge it (the
    course's parts swapped into the notebook's loop for a demonstration, say). While the notebook is graded, what
    an ordinary cell shows earns nothing, and the helper's parts are not in the sandbox: the grading build puts in
    its place one that hands back its first argument unchanged (`judged_by_grader(..., unchanged=True)`), so the
    cell still runs, with the notebook's own parts."""
    function.shown_in_the_notebook = True  # type: ignore[attr-defined]
    return function


def judged_by_grader(name: str, title: str = "", unchanged: bool = False) -> Callable[..., Any]:
    """What the grading build (`grading.sandbox.build`) puts in place of a check or judging helper: calling it
    says that checks are judged by the grader, in its own process, not in the notebook's. For a helper marked
    `shown_in_the_notebook` (`unchanged`), one that returns its first argument as it is."""
    if unchanged:
        def same(first: Any, *args: Any, **kwargs: Any) -> Any:
            return first

        same.__name__ = same.__qualname__ = name
        return same

    def stub(*args: Any, **kwargs: Any) -> Any:
        raise JudgedByGrader(f"check.{name} is judged by the grader, outside your notebook: while your notebook is "
                             "graded, checks run only in the grade cells, and your code cannot call them")

    stub.__name__ = stub.__qualname__ = name
    if title:
        stub.check_title = title  # type: ignore[attr-defined]  (framework.record finds a check by its title)
    return stub
