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

import math
import re
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from transformer_course.checks import differential
from transformer_course.checks.boundary import on_student_side
from transformer_course.checks.compare import describe_difference, tensors_close
from transformer_course.checks.differential import student_line
from transformer_course.checks.framework import (
    RECIPE,
    REFERENCE_VALUES,
    Builtins,
    Diagnosis,
    copy_weights,
    crash_explained,
    describe,
    expect_close,
    expect_shape,
    fail,
    randn,
    reject_builtin_modules,
    student_code,
)

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
           rtol: float = 1e-5, engine: bool = True, steps: bool = True, expected_words: str = REFERENCE_VALUES
           ) -> None:
    """Compare the student's value with the reference's; on a difference, say what was seen (see the module).
    `engine=False` leaves the engine's departure out (say, when the check's expected value is not the reference's
    computation); `steps=False` leaves out the comparison of the two computations step by step (for a value whose
    steps may run on something else than the expected value: a forward that drops a result). `expected_words`:
    the message's "expected:" line (the reference's values unless the check says otherwise)."""

    def diagnose(value: torch.Tensor) -> Diagnosis | None:
        seen = [reading(value) for reading in own]
        if not (engine or steps):
            return joined(describe_difference(value, expected, axes) if value.shape == expected.shape else "", *seen)
        student, reference = traces()
        return read(student, reference, value, expected, context, tuple(axes), *seen, engine=engine, steps=steps)

    expect_close(name, got, expected, atol=atol, rtol=rtol, axes=tuple(axes), diagnose=diagnose, cause=recipe,
                 expected_words=expected_words)


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
        return _retold(where, traced, own)
    found = _engine(student, reference, got, expected, context, axes) if engine else None
    if found is not None:
        return _retold(found.where or where, found.cause, own)
    return joined(where, *own)


def _retold(where: str, account: str, own: Sequence[str]) -> Diagnosis | None:
    """The steps' or the engine's `account` after the check's own readings; when it only retells a recognised
    mistake (`differential.at_the_line`), the first reading's words at the student's line instead."""
    seen = [reading for reading in own if reading]
    said = differential.at_the_line(account, seen[0]) if seen else None
    if said:
        return joined(where, said, *seen[1:])
    return joined(where, *own, account)


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
            f"{differential.on_line(found)} and then applies {names}{result}")


_SAME_WORDS = re.compile(r"receives (.+) where the reference gives it \1(?=[.;]|$)")
_LOCATION = re.compile(r"in `(\w+)`, line (\d+) \(`(.*?)`\)(?=: )")


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
    function, number, code = location.groups()
    rest = (found.cause[location.end():].replace(f" ({location.group(0)})", " (on the same line)")
            .replace(f" {differential.line_words(function, number, code)}", " on the same line"))
    return Diagnosis(found.where, location.group(0) + rest)


# --- a module exercise, declared: the student's module beside the reference's, and beside itself --------------------
#
# For an exercise that is one nn.Module (a normalisation, an embedding, a small network), a check builds a
# `ModuleCase`: the reference module with random parameters (gains and biases too, so a parameter left out shows),
# the student's module built on the student's side with the same parameters, the inputs, and the built-ins that
# would do the exercise's work (`framework.Builtins`: their use fails the check and names them). A case checks:
# - `values`: against the reference, with the engine's reading on a difference. Parameters the check sets
#   (`parameters={"gain": 1.0}`) are set on both sides, so a property that another grade cell checks is neutral
#   here and one omission is charged once;
# - against itself (no reference value needed): `scales_with` (the output with a parameter p is the output with p
#   set to 1, times p), `unchanged` (a change of the input that must leave the output as it is: scaling, say),
#   `follows` (a change of the input the output must follow: a permutation of positions), `finite` (no inf or
#   nan on the given inputs, with the operation that first makes them). The message's "expected:" line says what
#   the student's own outputs say, never "the reference values". The engine reads the changed run beside the
#   reference's only where the student's unchanged run equals the reference's (else its departure would be about
#   another grade cell's property).


@on_student_side
def _build_module(student_class: Any, args: tuple, kwargs: dict, state: dict[str, torch.Tensor], builtins: Builtins,
                  what: str) -> Any:
    """The student's module in float64 and eval mode, holding the parameters `state` (see `_load_by_role`)."""
    with torch.random.fork_rng(devices=[]), student_code(builtins):
        module = student_class(*args, **kwargs)
    reject_builtin_modules(module, what, builtins)
    module = module.double()
    _load_by_role(module, state, what)
    return module.eval()


def _load_by_role(module: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """Put the reference's parameters `state` into the student's module: by name when the names agree, otherwise
    each entry into the student's one entry of the same shape. So a layout of the student's choice passes (an
    `nn.Embedding`'s `table.weight` for an `nn.Parameter` named `table`, a gain named `weight`) as long as no two
    entries share a shape; where two do (a gain and a bias, two square matrices) they are told apart by name, and
    the failure lists both sides' names and shapes. A matrix the student stores transposed matches nothing."""
    target = module.state_dict()
    if set(target) == set(state):
        copy_weights(SimpleNamespace(state_dict=lambda: dict(state)), module, what)
        return
    renamed = {name: name for name in state if name in target and target[name].shape == state[name].shape}
    left, free = [name for name in state if name not in renamed], [name for name in target if name not in renamed]
    for name in left:
        same = [other for other in free if tuple(target[other].shape) == tuple(state[name].shape)]
        rivals = [other for other in left if tuple(state[other].shape) == tuple(state[name].shape)]
        if len(same) == 1 and len(rivals) == 1:
            renamed[name] = same[0]
    if len(renamed) == len(state) == len(target):
        module.load_state_dict({renamed[name]: value for name, value in state.items()})
        return

    def listed(entries: Mapping[str, torch.Tensor]) -> str:
        return ", ".join(f"`{name}` {tuple(value.shape)}" for name, value in entries.items()) or "none"

    fail(f"{what}: this check puts the reference's parameters into your module, by name or else by shape, and "
         "your module's parameters match neither.",
         expected=f"parameters and buffers {listed(state)}", got=listed(target),
         cause="keep the sizes the given `__init__` builds each parameter with, and no parameter or buffer "
               "beyond the ones the exercise asks for.")


@on_student_side
def _run_module(module: Any, inputs: tuple, builtins: Builtins, what: str) -> Any:
    """The student's module called on `inputs`: its result (detached) when it is a tensor."""
    shapes = ", ".join(str(tuple(value.shape)) for value in inputs if isinstance(value, torch.Tensor))
    with torch.no_grad(), student_code(builtins), crash_explained(
            f"{what} crashed on an input of shape {shapes}.", expected="an output",
            cause=f"read the line of your {what} named above: what does it receive, and what does it need?"):
        result = module(*inputs)
    if not isinstance(result, torch.Tensor):
        fail(f"{what} returned {describe(result)}.", expected="a tensor", got=describe(result),
             cause="return the result tensor from forward.")
    return result.detach()


def random_parameters(module: nn.Module, seed: int) -> nn.Module:
    """Reproducible random values for every parameter: a matrix is drawn anew (scaled by 1/sqrt of its input
    width), a vector moves away from its initial value (a gain of ones becomes 1 ± 0.3, a bias of zeros ± 0.3), so
    a gain or bias left out, or one parameter used for another, changes the output."""
    with torch.no_grad():
        for index, (_name, parameter) in enumerate(sorted(module.named_parameters())):
            noise = randn(*parameter.shape, seed=seed + index)
            if parameter.dim() > 1:
                parameter.copy_(noise / math.sqrt(parameter.shape[1]))
            else:
                parameter.add_(0.3 * noise)
    return module


class ModuleCase:
    """One check of a module exercise: the reference module (float64, random parameters, `parameters` set), the
    student's module with the same parameters (built on the student's side), and the inputs (by name, in the order
    `forward` takes them). `sizes` names the axes by their size for the messages; `quantities` are the numbers a
    wrong factor may equal (default: the sizes)."""

    def __init__(self, student_class: Any, reference_class: type[nn.Module], *args: Any,
                 inputs: Mapping[str, torch.Tensor], seed: int, axes: Sequence[str], builtins: Builtins,
                 parameters: Mapping[str, float | torch.Tensor] | None = None, sizes: Mapping[str, int] | None = None,
                 quantities: Mapping[str, float] | None = None, **kwargs: Any) -> None:
        self.student_class, self.reference_class = student_class, reference_class
        self.args, self.kwargs, self.builtins = args, kwargs, builtins
        self.what = getattr(reference_class, "__name__", "your module")
        self.inputs, self.axes = dict(inputs), tuple(axes)
        with torch.random.fork_rng(devices=[]):
            drawn = random_parameters(reference_class(*args, **kwargs).double(), seed)
        self.state = {name: value.detach().clone() for name, value in drawn.state_dict().items()}
        self.state = self.with_parameters(parameters or {})
        self.context = differential.Context(sizes=dict(sizes or {}), quantities=dict(quantities or sizes or {}))
        self._students: dict[int, Any] = {}

    def with_parameters(self, parameters: Mapping[str, float | torch.Tensor]) -> dict[str, torch.Tensor]:
        """The case's parameters with some set: a number fills the parameter, a tensor replaces it."""
        state = dict(self.state)
        for name, value in parameters.items():
            if name not in state:
                raise KeyError(f"{self.what} has no parameter {name!r} (it has {', '.join(state)})")
            state[name] = torch.full_like(state[name], float(value)) if isinstance(value, int | float) \
                else value.to(state[name].dtype).expand_as(state[name]).clone()
        return state

    # --- the two modules, run -------------------------------------------------------------------------------

    def reference(self, state: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            module = self.reference_class(*self.args, **self.kwargs).double()
        module.load_state_dict(dict(state or self.state))
        return module.eval()

    def student(self, state: Mapping[str, torch.Tensor] | None = None) -> Any:
        """The student's module (an object on the student's side) holding `state` (default: the case's)."""
        state = dict(state or self.state)
        key = hash(tuple((name, value.numpy().tobytes()) for name, value in sorted(state.items())))
        if key not in self._students:
            self._students[key] = _build_module(self.student_class, self.args, self.kwargs, state, self.builtins,
                                                self.what)
        return self._students[key]

    def output(self, inputs: Mapping[str, torch.Tensor] | None = None,
               state: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The student's output on `inputs` (default: the case's), with `state`."""
        return _run_module(self.student(state), tuple((inputs or self.inputs).values()), self.builtins, self.what)

    def expected(self, inputs: Mapping[str, torch.Tensor] | None = None,
                 state: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The reference's output on `inputs`, with `state`."""
        with torch.no_grad():
            return self.reference(state)(*(inputs or self.inputs).values())

    def traces(self, inputs: Mapping[str, torch.Tensor] | None = None,
               state: Mapping[str, torch.Tensor] | None = None) -> tuple[differential.Trace, differential.Trace]:
        """(the student's forward, the reference's), recorded on the same inputs."""
        values, names = tuple((inputs or self.inputs).values()), tuple(inputs or self.inputs)
        student = differential.traced(self.student(state), *values, names=names)
        return student, differential.traced_call(self.reference(state), *values, names=names)

    # --- against the reference ------------------------------------------------------------------------------

    def values(self, *, recipe: str, name: str = "output", own: Sequence[Reading] = (), atol: float = 1e-7,
               rtol: float = 1e-5, inputs: Mapping[str, torch.Tensor] | None = None) -> None:
        """The student's output equals the reference's on the same inputs, with the same parameters."""
        got, expected = self.output(inputs), self.expected(inputs)
        values(name, got, expected, traces=lambda: self.traces(inputs), context=self.context, axes=self.axes,
               recipe=recipe, own=own, atol=atol, rtol=rtol)

    # --- against itself -------------------------------------------------------------------------------------

    def scales_with(self, parameter: str, *, recipe: str, name: str = "output", atol: float = 1e-7,
                    rtol: float = 1e-5) -> None:
        """The output with `parameter` (a vector over the last axis) equals the output with the parameter set to
        1, times the parameter, feature by feature: the parameter is a gain, applied once, at the end."""
        gain = self.state[parameter]
        ones = self.with_parameters({parameter: 1.0})
        base, got = self.output(state=ones), self.output()
        expected = base * gain  # (..., features) * (features,): the student's own output, scaled

        def unused(value: torch.Tensor) -> str:
            if tensors_close(value, base, atol, rtol):
                return (f"your output is the same whatever `{parameter}` holds: with `{parameter}` set to 1 and with "
                        "the values it has here, it does not change")  # what was seen; not why
            if value.shape == base.shape and tensors_close(value - base, (gain - 1).expand_as(base), atol, rtol):
                return (f"your output changes by `{parameter}` − 1 when `{parameter}` changes from 1: `{parameter}` is "
                        "added to it, not multiplied")
            return ""

        self._itself(name, got, expected, base, ones, unused, recipe=recipe, atol=atol, rtol=rtol,
                     words=f"your own output with `{parameter}` set to 1, times `{parameter}` feature by feature")

    def unchanged(self, change: Callable[[torch.Tensor], torch.Tensor], *, change_words: str, recipe: str,
                  name: str = "output", atol: float = 1e-7, rtol: float = 1e-5) -> None:
        """Changing the (first) input by `change` (in words: `change_words`, "every vector scaled by 3") leaves the
        output as it is."""
        first = next(iter(self.inputs))
        changed = {**self.inputs, first: change(self.inputs[first])}
        base, got = self.output(), self.output(changed)
        self._itself(name, got, base, base, self.state, lambda value: "", recipe=recipe, atol=atol, rtol=rtol,
                     words=f"your own output for the input as it was: {change_words} must not change it",
                     inputs=changed)

    def follows(self, change: Callable[[torch.Tensor], torch.Tensor], *, change_words: str, recipe: str,
                name: str = "output", atol: float = 1e-7, rtol: float = 1e-5) -> None:
        """Changing the (first) input by `change` (in words: `change_words`, "the positions in another order")
        changes the output the same way: f(change(x)) = change(f(x))."""
        first = next(iter(self.inputs))
        changed = {**self.inputs, first: change(self.inputs[first])}
        base = self.output()
        got = self.output(changed)
        self._itself(name, got, change(base), base, self.state, lambda value: "", recipe=recipe, atol=atol,
                     rtol=rtol, words=f"your own output for the input as it was, with {change_words} too",
                     inputs=changed)

    def finite(self, inputs: Mapping[str, torch.Tensor], *, inputs_words: str, recipe: str,
               name: str = "output") -> None:
        """The output on `inputs` (in words: `inputs_words`, "a vector of zeros") holds no inf or nan; when it
        does, the message says how many and the operation of the student's code that first made them."""
        got = self.output(inputs)
        if bool(torch.isfinite(got).all()):
            return
        expected = self.expected(inputs)
        student, reference = self.traces(inputs)
        origin = differential.non_finite(student, got, expected, reference)
        bad = int((~torch.isfinite(got)).sum())
        fail(f"{name} holds inf or nan for {inputs_words}.", expected="finite values",
             got=f"{bad} of {got.numel()} values inf or nan", cause=origin or f"{RECIPE} {recipe}")

    def _itself(self, name: str, got: torch.Tensor, expected: torch.Tensor, base: torch.Tensor,
                base_state: Mapping[str, torch.Tensor], reading: Reading, *, recipe: str, words: str, atol: float,
                rtol: float, inputs: Mapping[str, torch.Tensor] | None = None) -> None:
        """Compare with what the student's own outputs say; the engine speaks only where the student's unchanged
        run (`base`, with `base_state`) equals the reference's."""
        agrees = isinstance(base, torch.Tensor) and tensors_close(base, self.expected(state=base_state), atol, rtol)
        values(name, got, expected, traces=lambda: self.traces(inputs), context=self.context, axes=self.axes,
               recipe=recipe, own=[reading], atol=atol, rtol=rtol, engine=agrees, steps=agrees,
               expected_words=words)
