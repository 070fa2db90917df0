"""What a crash in the student's code means, by its kind, and where in the student's code it happened.

`framework.run_check` turns any exception a check lets through into the student's message with
`explain_crash`: the error as Python wrote it, the student's own line ("in `forward`, line 3: …"),
then what that kind of error means in this course. Errors of a kind not listed here are said to be
unknown, never guessed to be a shape problem.
"""

from __future__ import annotations

import linecache
import re
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from transformer_course.checks import crash
from transformer_course.checks.boundary import Frame, StudentError, student_error_of
from transformer_course.runtime import TORCH_DIR, unfinished_exercise

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class ErrorKind:
    """A family of errors: which exceptions belong to it, and what it means for the student."""

    name: str
    types: tuple[type[BaseException], ...]
    patterns: tuple[str, ...]  # regular expressions searched in the error text; () = every error of `types`
    meaning: str

    def matches(self, error: BaseException) -> bool:
        if not isinstance(error, self.types):
            return False
        text = str(error)
        return not self.patterns or any(re.search(pattern, text, re.IGNORECASE) for pattern in self.patterns)


# Order matters: the first kind that matches explains the error.
KINDS: tuple[ErrorKind, ...] = (
    ErrorKind(
        "container called", (NotImplementedError,), (r'missing the required "forward" function',),
        "a container of modules (an `nn.ModuleList` or `nn.ModuleDict`) is called as if it were one module: a "
        "container has no `forward` of its own, so each module it holds has to be called in turn.",
    ),
    ErrorKind(
        "not contiguous", (RuntimeError,), (r"view size is not compatible", r"use \.reshape\(\.\.\.\) instead"),
        "a memory-layout problem: `.view` on a tensor whose memory is no longer in row order (after "
        "`transpose` or `permute`): call `.contiguous()` before `.view(...)`, or use `.reshape(...)`.",
    ),
    ErrorKind(
        "autograd", (RuntimeError,), (r"does not require grad and does not have a grad_fn",),
        "a gradient problem: the loss does not depend on anything that requires a gradient. It was computed "
        "under `torch.no_grad()`, from a `.detach()`ed tensor, or from `.item()` numbers turned back into a tensor.",
    ),
    ErrorKind(
        "autograd", (RuntimeError,), (r"leaf Variable that requires grad", r"is being used in an in-place"),
        "a gradient problem: a parameter (a leaf tensor that requires grad) is changed in place. Change "
        "parameters only through the optimizer, or inside `with torch.no_grad():`.",
    ),
    ErrorKind(
        "autograd", (RuntimeError,), (r"modified by an inplace operation",),
        "a gradient problem: a tensor needed for the backward pass was changed in place afterwards "
        "(`x += …`, `masked_fill_`, `relu_`, …): use the out-of-place form, `x = x + …`, `masked_fill(…)`.",
    ),
    ErrorKind(
        "autograd", (RuntimeError,), (r"backward through the graph a second time",),
        "a gradient problem: `backward()` ran twice through the same graph: compute the loss anew for every "
        "batch and call `loss.backward()` once per loss.",
    ),
    ErrorKind(
        "autograd", (RuntimeError,), (r"grad can be implicitly created only for scalar outputs",),
        "a gradient problem: `backward()` was called on a tensor with more than one element: reduce the loss "
        "to one number (the criterion's mean) first.",
    ),
    ErrorKind(
        "autograd", (RuntimeError,), (r"numpy\(\) on Tensor that requires grad",),
        "a gradient problem: a tensor that is part of the graph was turned into numpy: use `.detach()` or "
        "`.item()`.",
    ),
    ErrorKind(
        "device", (RuntimeError,), (r"same device", r"Expected all tensors to be on", r"device type", r"cuda"),
        "a device mismatch: tensors on different devices meet (CPU and GPU): create every new tensor on the "
        "device of the inputs, e.g. `torch.ones(..., device=x.device)`.",
    ),
    ErrorKind(
        "dtype", (RuntimeError, TypeError),
        (r"expected scalar type", r"scalar type", r"dtype", r"not implemented for '",
         r"result type .* can't be cast", r"only supports boolean masks", r"boolean tensor", r"must be a bool",
         r"Found dtype", r"to be a bool"),
        "a dtype mismatch: tensors of different dtypes meet, or an operation got a dtype it does not support "
        "(integers where floats are needed, a float where a bool mask is needed, `~` on a float): create new "
        "tensors with the dtype of the inputs (`dtype=x.dtype`) and keep masks bool or integer 0/1.",
    ),
    ErrorKind(
        "axis out of range", (IndexError, RuntimeError), (r"Dimension out of range", r"dim(ension)? .* out of range"),
        "an axis out of range: an axis number the tensor does not have. Count axes from the end (`dim=-1`, "
        "`transpose(-2, -1)`) so the code works with and without a heads axis, and check each tensor's axes.",
    ),
    ErrorKind(
        "range", (RuntimeError,), (r"bound inconsistent with step sign", r"upper bound and larger bound"),
        "an impossible range: `arange(start, end, step)` with the start beyond the end for this step (swapped "
        "arguments?).",
    ),
    ErrorKind(
        "math domain", (ValueError,), (r"math domain error",),
        "a math domain error: the log or square root of a negative number (or of 0).",
    ),
    ErrorKind(
        "shape", (RuntimeError, ValueError),
        (r"must match the size", r"size of tensor a", r"size mismatch", r"shapes cannot be multiplied",
         r"is invalid for input of size", r"expected size", r"doesn't match the broadcast shape",
         r"inconsistent tensor size", r"sizes of tensors must match", r"shape mismatch", r"number of dimensions",
         r"Expected .*D", r"input and target", r"Expected input batch_size", r"must match except in dimension",
         r"expected .* dims", r"mismatch in shape", r"cannot be broadcast", r"target size", r"expanded size",
         r"Trying to resize", r"shape '\["),
        "a shape mismatch: two tensors whose sizes must agree do not, or a view/reshape asks for sizes the "
        "tensor does not have; compare each line's result with the shapes in the docstring.",
    ),
    ErrorKind(
        "unpacking", (ValueError,), (r"values to unpack",),
        "an unpacking mismatch: the value on the right has another number of items than there are names on the "
        "left (for a tensor's `.shape`, another number of axes), or a function returned another number of values.",
    ),
    ErrorKind(
        "index", (IndexError, RuntimeError),
        (r"out of bounds", r"index out of range", r"out of range", r"index \d+ is out of"),
        "an index out of range: an index past the end of a tensor or list. An off-by-one in a slice, a range "
        "or a loop, a position beyond the table's length, or a token id not below the vocabulary size.",
    ),
    ErrorKind(
        "arguments", (TypeError,),
        (r"positional argument", r"unexpected keyword argument", r"required positional", r"takes \d+",
         r"missing \d+ required", r"got multiple values", r"argument .* must be",
         r"received an invalid combination"),
        "an argument mismatch: a function or method called with other arguments than it takes; compare the "
        "call with its signature (order, number and names of the arguments, and their types).",
    ),
    ErrorKind(
        "wrong type", (TypeError,),
        (r"NoneType", r"not subscriptable", r"converted to an index", r"not iterable", r"cannot unpack non-iterable",
         r"not callable", r"unsupported operand", r"not supported between", r"object cannot be interpreted"),
        "a value of the wrong type: often `None` from a function or method that does not `return` its result, "
        "a tuple where a tensor is expected, or a module used where its output is meant.",
    ),
    ErrorKind(
        "attribute", (AttributeError,), (),
        "a missing attribute: a misspelled name, a tensor method called on something that is not a tensor "
        "(a tuple or `None` returned by mistake), or an attribute the constructor never set.",
    ),
    ErrorKind(
        "recursion", (RecursionError,), (),
        "endless recursion: a function calls itself without end (`forward` calling `self(...)`, a method "
        "calling itself instead of another, a property that reads itself).",
    ),
    ErrorKind(
        "name", (NameError,), (),
        "an undefined name: a name used before it is given a value (a typo, a variable assigned only in one "
        "branch, or a name from another cell or function).",
    ),
    ErrorKind(
        "division by zero", (ZeroDivisionError,), (),
        "a division by zero: a count or a step that can be 0 here (the first step of a schedule counts from 1).",
    ),
    ErrorKind(
        "memory", (MemoryError,), (),
        "out of memory: a tensor far larger than needed, e.g. built over the vocabulary or the positions twice.",
    ),
)


def kind_of(error: BaseException) -> ErrorKind | None:
    """The first kind that explains `error`, or None for an error of a kind we do not know."""
    return next((kind for kind in KINDS if kind.matches(error)), None)


def _from_the_course(filename: str) -> bool:
    return filename.startswith((_PACKAGE_DIR, TORCH_DIR, "<frozen")) or "/lib/python" in filename


def _source_line(filename: str, lineno: int, module_globals: Mapping[str, object],
                 sources: Mapping[str, str] | None) -> str:
    """The line as written: linecache (files, IPython cells), else the cell source the caller gave."""
    line = linecache.getline(filename, lineno, dict(module_globals)).strip()
    if not line and sources and filename in sources:
        lines = sources[filename].splitlines()
        line = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    return line


def frames_of(where: BaseException | TracebackType | None,
              sources: Mapping[str, str] | None = None) -> list[Frame]:
    """The frames of an exception (or a traceback), innermost last, each with its line as written. An
    exception that came from the student's process carries them (`boundary.StudentError`)."""
    if isinstance(where, BaseException):
        remote = student_error_of(where)
        if remote is not None:
            return list(remote.frames)
        where = where.__traceback__
    frames = []
    for frame, lineno in traceback.walk_tb(where):
        filename = frame.f_code.co_filename
        line = "" if _from_the_course(filename) else _source_line(filename, lineno, frame.f_globals, sources)
        frames.append(Frame(filename, lineno, frame.f_code.co_name, line[:200]))
    return frames


def student_frame(where: BaseException | TracebackType | None, sources: Mapping[str, str] | None = None) -> str:
    """'in `forward`, line 3: x = …' for the innermost frame that is the student's (neither torch, the
    standard library nor this package); the line number alone when the source is nowhere to be had.
    `where` is the exception (also one from the student's process) or its traceback."""
    described = ""
    for frame in frames_of(where, sources):
        if _from_the_course(frame.filename):
            continue
        where_ = f"in `{frame.name}`, line {frame.lineno}"
        if frame.line:
            described = f"{where_}: {frame.line[:160]}"
        else:
            cell = f" of {frame.filename}" if frame.filename.startswith("<") else ""
            described = f"{where_}{cell}"
    return described


def crash_lines(error: BaseException, sources: Mapping[str, str] | None = None) -> str:
    """The student's line (`student_frame`) and what it was doing when it failed (`crash_detail`), each on a line
    of its own, to follow the "got:" part of a crash's message; "" when neither is known."""
    return _where_lines(student_frame(error, sources), crash_detail(error, sources), plugged_part(error))


def plugged_part(error: BaseException) -> str:
    """'`_combine_heads_stand_in`' when the error was raised inside the course's own code that a check put in place
    of a part of the student's (the innermost frame is the course's, called from the student's line), else ''."""
    frames = [frame for frame in frames_of(error)
              if not frame.filename.startswith(TORCH_DIR) and "/lib/python" not in frame.filename
              and not frame.filename.startswith("<frozen")]  # the course's and the student's frames, outermost first
    course = [index for index, frame in enumerate(frames) if frame.filename.startswith(_PACKAGE_DIR)]
    if not course or course[-1] != len(frames) - 1:
        return ""  # raised in the student's code
    first = course[-1]
    while first - 1 in course:
        first -= 1  # the start of the innermost run of the course's frames
    part = frames[first].name
    plugged = "stand_in" in part or part.startswith(("reference_", "_reference"))
    if first == 0 or not plugged:
        return ""  # not called from the student's code, or the check's own code rather than a part it plugged in
    return part.removeprefix("_").removeprefix("reference_").removesuffix("_stand_in")


def _where_lines(where: str, detail: str, plugged: str = "") -> str:
    said = (f"\n  {where}" if where else "") + (f"\n  what happened there: {detail}" if detail else "")
    if plugged:
        said += (f"\n  the error was raised inside the course's own `{plugged}`, which this check runs in place of "
                 "yours so that only the part under test is graded: the line above handed it a value it does not take")
    return said


def is_stub(error: BaseException) -> bool:
    """A NotImplementedError the student's code raised itself (an exercise not done yet), as opposed to
    one from inside torch ('"softmax_lastdim_kernel_impl" not implemented for 'Bool'': a dtype problem)."""
    remote = student_error_of(error)
    if remote is not None:
        return remote.stub
    return unfinished_exercise(error) is not None  # torch's own NotImplementedErrors say which operation and dtype


def as_record(error: BaseException) -> StudentError:
    """An exception as plain data (its type and built-in bases, text, frames, whether it is an unfinished
    exercise): what crosses from the student's side to the grader."""
    bases = tuple(cls.__name__ for cls in type(error).__mro__ if cls.__module__ == "builtins")
    try:
        text = str(error)[:4000]
    except Exception:  # a notebook's exception whose str() fails
        text = "?"
    return StudentError(type(error).__name__, bases, text, tuple(frames_of(error))[-40:], is_stub(error),
                        crash_detail(error))


def crash_detail(error: BaseException, sources: Mapping[str, str] | None = None) -> str:
    """What the student's failing line was doing (`checks.crash`): carried by an error from the student's
    process, worked out from the live frames otherwise; "" when nothing can be said."""
    remote = student_error_of(error)
    if remote is not None:
        return remote.detail[:crash.MAX_DETAIL]
    return crash.describe(error, _students, sources)


def _students(filename: str) -> bool:
    return not _from_the_course(filename)


def first_line(error: BaseException, limit: int = 240) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    return text[:limit] + ("…" if len(text) > limit else "")


def explain_crash(error: BaseException, tb: TracebackType | None = None,
                  sources: Mapping[str, str] | None = None) -> str:
    """The student's message for a crash inside a check: the error, the student's line, what it means."""
    where = student_frame(tb if tb is not None and student_error_of(error) is None else error, sources)
    kind = kind_of(error)
    meaning = kind.meaning if kind else (
        "unknown: the checks do not recognise this kind of error; read it together with the line shown."
    )
    plugged = plugged_part(error)
    detail = crash_detail(error, sources)
    if kind is not None and kind.name == "shape" and "shape (" in detail:
        meaning = SHAPES_SHOWN  # the line's shapes are in the visible part: the general words would repeat them
    return (f"{'the check' if plugged else 'your code'} raised {type(error).__name__}: {first_line(error)}"
            + _where_lines(where, detail, plugged)
            + f"\n  likely cause: {meaning}")


SHAPES_SHOWN = ("a shape mismatch: the shapes that meet on that line (above) do not fit. Work out the shape each of "
                "them should have there, then follow the one that differs back to the line that made it.")
