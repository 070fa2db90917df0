"""Checks declared on the diagnosis engine: a property says what it compares, and the engine says why it differs.

A value check is declared with `values(...)`: the name of the value, the student's and the reference's values,
how to record the two computations (for the engine), the axes' names, the quantities a wrong factor may equal,
the recipe (said only when nothing could be read from the values) and, where a property needs it, readings of
its own (`own`: functions of the student's value that return what they see, or ''). Every failure then says,
in this order, what the check's own readings saw, what the two recorded computations show when compared step
by step (one step replaced by another, two steps swapped, steps added after the expected value), and otherwise
the engine's departure (`differential.explain`). A shape check is declared with `shape(...)`: the expected
shape, and the shapes a known mistake gives with what each means (`known`); any other shape is read by
`compare.describe_shape` (permuted, cut short, repeated, merged).

The author's guide (website, "Adding an exercise") walks through stage 0's checks, which are written this way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from transformer_course.checks import differential
from transformer_course.checks.compare import describe_difference
from transformer_course.checks.differential import student_line
from transformer_course.checks.framework import Diagnosis, expect_close, expect_shape, fail

Reading = Callable[[torch.Tensor], str]  # what a check sees in the student's value ('' when nothing)
Traces = Callable[[], tuple[differential.Trace, differential.Trace]]  # (the student's, the reference's) recorded


def shape(name: str, got: Any, expected: tuple[int, ...], *, recipe: str,
          known: Mapping[tuple[int, ...], str] | None = None) -> torch.Tensor:
    """The student's tensor when it has the expected shape; otherwise a failure that names what a known wrong
    shape means (`known`), or reads the shape against the expected one, and gives the recipe."""
    if isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(expected) and known \
            and tuple(got.shape) in known:
        fail(f"{name} has the wrong shape.", expected=tuple(expected), got=tuple(got.shape),
             cause=known[tuple(got.shape)])
    return expect_shape(name, got, tuple(expected), cause=recipe)


def values(name: str, got: Any, expected: torch.Tensor, *, traces: Traces, context: differential.Context,
           axes: Sequence[str], recipe: str, own: Sequence[Reading] = (), atol: float = 1e-7,
           rtol: float = 1e-5, engine: bool = True, steps: bool = True) -> None:
    """Compare the student's value with the reference's; on a difference, say what was seen (see the module).
    With `steps=False` the two computations are not compared step by step (only the engine's departure is read):
    for a value whose steps may run on something else than the expected value (a forward that drops a result)."""

    def diagnose(value: torch.Tensor) -> Diagnosis | None:
        seen = [reading(value) for reading in own]
        student, reference = traces()
        return read(student, reference, value, expected, context, tuple(axes), *seen, engine=engine, steps=steps)

    expect_close(name, got, expected, atol=atol, rtol=rtol, axes=tuple(axes), diagnose=diagnose, cause=recipe)


def read(student: differential.Trace, reference: differential.Trace, got: torch.Tensor, expected: torch.Tensor,
         context: differential.Context, axes: tuple[str, ...], *own: str, engine: bool = True,
         steps: bool = True) -> Diagnosis | None:
    """What the check's own readings saw (`own`), then the first of: the steps compared in order, steps added at
    the end (both left out with `steps=False`), the engine's departure (left out with `engine=False`). None when
    nothing was seen."""
    where = describe_difference(got, expected, axes) if got.shape == expected.shape else ""
    traced = steps and (steps_reading(student, reference, got, expected)
                        or added_steps(student, got, expected, context))
    if traced:
        return joined(where, *own, traced)
    found = _engine(student, reference, got, expected, context, axes) if engine else None
    if found is not None:
        return joined(found.where or where, *own, found.cause)
    return joined(where, *own)


def joined(where: str, *causes: str) -> Diagnosis | None:
    said = [cause.rstrip(".") for cause in causes if cause]
    return Diagnosis(where, "; ".join(said) + ".") if said else None


# --- the steps of two computations, compared -------------------------------------------------------------------


def result_op(trace: differential.Trace, value: torch.Tensor) -> differential.Op | None:
    """The last operation of a computation whose result is `value` (in this layout or a reshape of it)."""
    for op in reversed(trace.ops):
        if op.output is not None and op.output.numel() == value.numel() \
                and differential.same_values(op.output, value, permuted=False):
            return op
    return None


def _step_words(op: differential.Op) -> str:
    """A step in the lesson's words: a linear layer by its name (`self.v`), another operation by its kind."""
    if op.name == "linear":
        layer = next((source[5:].rsplit(".", 1)[0] for source in op.sources if source.startswith("leaf:")), "")
        return f"`self.{layer}`" if layer else "a linear layer"
    return f"the {differential.operation_words(op.name)}"


def _steps(trace: differential.Trace, last: differential.Op) -> list[differential.Op]:
    """The computing steps that lead to `last` (layout changes left out), in a canonical order: by depth (how
    many steps lie before each), then by kind, so two independent steps written in another order compare equal."""
    depth: dict[int, int] = {}
    for op in trace.ops[:last.index + 1]:
        before = [depth.get(differential.producer_of(source), 0) for source in op.sources]  # 0 for an input
        depth[op.index] = max(before, default=0) + (0 if op.name in differential.LAYOUT else 1)
    steps = [trace.ops[index] for index in differential.ancestors_of(trace, last.index)
             if trace.ops[index].name not in differential.LAYOUT and trace.ops[index].sources]
    return sorted(steps, key=lambda op: (depth[op.index], _step_words(op), op.index))


def steps_reading(student: differential.Trace, reference: differential.Trace, got: torch.Tensor,
                  expected: torch.Tensor) -> str:
    """What the student's steps do differently, when the two computations take the same number of steps and
    differ in one of them (another operation in its place) or in the order of two neighbouring ones."""
    mine, theirs = result_op(student, got), result_op(reference, expected)
    if mine is None or theirs is None:
        return ""
    a, b = _steps(student, mine), _steps(reference, theirs)
    if len(a) != len(b):
        return ""
    words_a, words_b = [_step_words(op) for op in a], [_step_words(op) for op in b]
    differ = [i for i, (x, y) in enumerate(zip(words_a, words_b, strict=True)) if x != y]
    if len(differ) == 1:
        i = differ[0]
        before = f" to the result of {words_b[i - 1]}" if i else ""
        return f"{student_line(a[i])}: your code applies {words_a[i]} where the reference applies {words_b[i]}{before}"
    if len(differ) == 2 and differ[1] == differ[0] + 1 and words_a[differ[0]] == words_b[differ[1]] \
            and words_a[differ[1]] == words_b[differ[0]]:
        first, second = differ
        return (f"{student_line(a[second])}: your code applies {words_a[second]} after {words_a[first]}; the reference "
                f"applies {words_b[first]} first, then {words_b[second]} to its result (the two steps are in the other "
                "order)")
    return ""


def added_steps(student: differential.Trace, got: torch.Tensor, expected: torch.Tensor,
                context: differential.Context) -> str:
    """Steps added after the expected value: the student's code computes the expected value, then goes on."""
    how = differential.relation(got, expected, context, None)
    found = result_op(student, expected)
    last = result_op(student, got)
    if found is None or last is None or last.index <= found.index:
        return f"your result is {how}" if how else ""
    # only the steps between the two that work on the expected value: a later line may compute from something
    # else (a result that was never assigned), and then nothing was added to the expected value
    on_the_way = differential.ancestors_of(student, last.index)
    if found.index not in on_the_way:
        return ""
    after_found = {found.index}
    for op in student.ops[found.index + 1:last.index + 1]:
        if any(differential.producer_of(source) in after_found for source in op.sources):
            after_found.add(op.index)
    steps = [op for op in student.ops[found.index + 1:last.index + 1]
             if op.index in after_found and op.index in on_the_way and op.name not in differential.LAYOUT]
    if not steps:
        return ""
    names = " and then ".join(dict.fromkeys(_step_words(op) for op in steps))
    result = f": the result is {how}" if how else ""
    if found.line == last.line and found.user == last.user:
        return f"{student_line(last)}: this line computes the expected values and then applies {names}{result}"
    return (f"{student_line(last)}: your code computes the expected values "
            f"({student_line(found).removeprefix('in ')}) and then applies {names}{result}")


_SAME_WORDS = re.compile(r"receives (.+) where the reference gives it \1(?=[.;]|$)")
_LOCATION = re.compile(r"in `\w+`, line \d+ \(`.*?`\)(?=: )")


def _engine(student: differential.Trace, reference: differential.Trace, got: torch.Tensor, expected: torch.Tensor,
            context: differential.Context, axes: tuple[str, ...]) -> Diagnosis | None:
    """The engine's reading, left out when it names the same value twice (it then says nothing); a line it
    quotes twice is quoted once."""
    found = differential.explain(student, reference, got, expected, context, axes)
    if found is None or _SAME_WORDS.search(found.cause):
        return None
    location = _LOCATION.match(found.cause)
    if location is None:
        return found
    rest = found.cause[location.end():].replace(f" ({location.group(0)})", " (on the same line)")
    return Diagnosis(found.where, location.group(0) + rest)
