"""Two runs of a loop compared call by call.

A loop (greedy decoding, beam search) is judged by what it does with the parts it calls. While the student's
loop runs, the names of those parts in its notebook point to the checks' own copies, which record every call
(`plugged`: the part's name, its arguments by parameter name, what it returned); the reference loop runs with
the same copies. Given the same parts, two loops that do the same make the same calls with the same arguments,
so the first call that differs is where the student's loop departs (`departure`): another part called, an
argument with other values (read by `compare.describe_difference`), the loop stopped early or went on after
the reference's ended, or, every call alike, another result. A check names the cause of a departure with
readings of its own, keyed by the part and argument ('select_beams.finished'), 'stopped', 'went on' or
'result'; what no reading names is said in the engine's words.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

import torch

from transformer_course.checks.boundary import supplied
from transformer_course.checks.compare import describe_difference
from transformer_course.checks.framework import describe


@dataclass
class Call:
    """One call of a plugged part: the part's name, its arguments by parameter name as they were when it was
    called and, where asked for, after it returned (a part may change them: a cache grows), and its result."""

    role: str
    args: dict[str, Any]
    after: dict[str, Any] | None = None
    output: Any = None


@dataclass
class Run:
    """What a loop did: its calls of the plugged parts, in order, the parts its notebook defines, and its
    result."""

    calls: list[Call] = field(default_factory=list)
    plugged: tuple[str, ...] = ()
    result: Any = None

    def of(self, part: str) -> list[Call]:
        """The calls of one part, in order."""
        return [call for call in self.calls if call.role == part]


def kept(value: Any) -> Any:
    """A value as a run keeps it: tensors detached and copied, lists item by item, anything else in words."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list | tuple):
        return [kept(item) for item in value]
    return value if isinstance(value, int | float | bool | str | None) else describe(value)


@contextmanager
def plugged(function: Callable, parts: Mapping[str, Callable | None], run: Run, keep: Callable[[Any], Any] = kept,
            after: bool = False) -> Iterator[Run]:
    """While `function` runs, each name of `parts` that its module defines calls that part instead (None: the
    module's own, recorded), and every call is recorded in `run` (arguments and result as `keep` keeps them,
    with `after` the arguments also as the part left them); the names are put back afterwards.
    Decorators (@torch.no_grad()) are looked through; the parts count as the check's code (`supplied`)."""
    try:
        inner = inspect.unwrap(function)
    except ValueError:  # a cycle of __wrapped__
        inner = function
    namespace = getattr(inner, "__globals__", None)
    saved: dict[str, Any] = {}

    def recording(name: str, part: Callable) -> Callable:
        signature = inspect.signature(part)

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:  # called with the wrong arguments: Python's own error names the function
                return part(*args, **kwargs)
            bound.apply_defaults()
            noted = Call(name, {key: keep(value) for key, value in bound.arguments.items()})
            result = part(*args, **kwargs)
            noted.output = keep(result)
            if after:
                noted.after = {key: keep(value) for key, value in bound.arguments.items()}
            run.calls.append(noted)
            return result

        return call

    if isinstance(namespace, dict):
        for name, part in parts.items():
            if callable(namespace.get(name)):
                saved[name] = namespace[name]
                namespace[name] = recording(name, part or saved[name])
                supplied(namespace[name])  # the check's doing, not the student's
    run.plugged = tuple(saved)
    try:
        yield run
    finally:
        if isinstance(namespace, dict):
            namespace.update(saved)


def same(a: Any, b: Any, atol: float = 1e-9) -> bool:
    """Equal values: tensors of equal shapes, exactly equal for integers and bools, close for floats (equal
    infinities included); lists item by item; anything else by ==."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape:
            return False
        if a.is_floating_point() or b.is_floating_point():
            return bool(torch.allclose(a.double().cpu(), b.double().cpu(), atol=atol, rtol=1e-7))
        return bool(torch.equal(a.long().cpu(), b.long().cpu()))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, atol) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    return a == b


@dataclass
class Departure:
    """The first place where the student's run leaves the reference's: `kind` is 'argument', 'part' (another
    part called), 'stopped', 'went on' or 'result'; `position` the index in the runs' calls; `argument` the
    argument that differs ('' when none)."""

    kind: str
    student: Run
    reference: Run
    position: int
    argument: str = ""

    @property
    def mine(self) -> Call | None:
        return self.student.calls[self.position] if self.position < len(self.student.calls) else None

    @property
    def theirs(self) -> Call | None:
        return self.reference.calls[self.position] if self.position < len(self.reference.calls) else None

    @property
    def step(self) -> int:
        """The departing call's number among the calls of its part (0 for the first)."""
        run = self.reference if self.theirs is not None else self.student
        role = run.calls[self.position].role if self.position < len(run.calls) else ""
        return sum(call.role == role for call in run.calls[:self.position])

    @property
    def key(self) -> str:
        return f"{self.theirs.role}.{self.argument}" if self.kind == "argument" else self.kind


Reading = Callable[[Departure], str]  # what a check sees at a departure ('' when nothing)


def _how(got: Any, expected: Any) -> str:
    """How a value departs from the reference's: its shape, or its values (shown when few) and where they
    differ."""
    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor):
        if got.shape != expected.shape:
            return f"shape {tuple(got.shape)} where the reference's has shape {tuple(expected.shape)}"
        how = describe_difference(got.double().cpu(), expected.double().cpu(), atol=1e-9, rtol=1e-7)
        shown = f"{got.tolist()} where the reference's is {expected.tolist()}" if got.numel() <= 12 else ""
        return "; ".join(part for part in (shown, how) if part)
    return f"{got} where the reference's is {expected}"


def find(student: Run, reference: Run) -> Departure | None:
    """The first call where the two runs part (its first argument that differs), or their results when every
    call is alike; None when nothing differs, or when the student's loop never calls
    a part the reference's calls (it computes that another way: the runs cannot be compared call by call)."""
    if {call.role for call in reference.calls} - {call.role for call in student.calls}:
        return None
    for position, (mine, theirs) in enumerate(zip_longest(student.calls, reference.calls)):
        if mine is None:
            return Departure("stopped", student, reference, position)
        if theirs is None:
            return Departure("went on", student, reference, position)
        if mine.role != theirs.role:
            return Departure("part", student, reference, position)
        for name in theirs.args:
            if not same(mine.args.get(name), theirs.args.get(name)):
                return Departure("argument", student, reference, position, name)
    if not same(student.result, reference.result):
        return Departure("result", student, reference, len(student.calls))
    return None


def departure(student: Run, reference: Run, readings: Mapping[str, Reading] | None = None) -> str:
    """Where the student's run departs from the reference's and why: the check's reading for that place
    (`readings`, keyed as `Departure.key`), else the engine's words; '' when the runs agree."""
    found = find(student, reference)
    if found is None:
        return ""
    reading = (readings or {}).get(found.key)
    said = reading(found) if reading is not None else ""
    if said:
        return said
    mine, theirs = found.mine, found.theirs
    if found.kind == "stopped":
        return (f"your loop stops after {found.position} call(s) of its parts; the reference loop, given the same "
                f"parts, goes on: its next call is {theirs.role} number {found.step}")
    if found.kind == "went on":
        more = len(student.calls) - found.position
        return (f"your loop goes on after the reference loop has stopped: it makes {more} more call(s) of its parts, "
                f"the first of {mine.role}")
    if found.kind == "part":
        return (f"call {found.position} of your loop is {mine.role} where the reference loop, given the same parts, "
                f"calls {theirs.role}")
    if found.kind == "result":
        how = _how(student.result, reference.result)
        return f"every call of the parts is the reference loop's, but your result differs: {how}"
    name = found.argument
    how = _how(mine.args.get(name), theirs.args.get(name))
    return (f"{theirs.role} call {found.step} is given another {name} than in the "
            f"reference loop (given the same parts): {how}")
