"""Where a student's module first departs from the computation it should do.

Used by the checks of stages 5 and 6 (stages 3 and 4 have moved to `checks.parts`, which finds parts by role
and works across the grader's boundary): a check plugs reference parts into the student's code, so everything
the student's code does with them is visible as calls of those parts. `recorded_calls` records
every call with forward hooks (its arguments by name, and its output once it returns);
`first_departure` replays the calls against the intended computation, written as `Step`s, and names
the first argument that is not what it should be, in words: "feed_forward receives the block's
input x as its input, instead of norm1's output". The values it can name are the inputs and every
output recorded so far, their sums of two, and their multiples (so a missing √d_model shows as
"1 × embedding's output instead of 4 × embedding's output").
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

Tensor = torch.Tensor
Term = tuple[float, str]  # coefficient, value key


@dataclass
class Call:
    """One call of a sublayer: its arguments by parameter name and, once it returned, its output."""

    name: str
    args: dict[str, Any]
    output: Any = None
    returned: bool = False


@contextmanager
def recorded_calls(module: nn.Module, names: Sequence[str]) -> Iterator[list[Call]]:
    """Record, in order, every call of the submodules `names` (dotted paths) of `module`."""
    calls: list[Call] = []
    handles = []
    children = dict(module.named_modules())
    for name in names:
        child = children.get(name)
        if child is None:
            continue
        try:
            signature = inspect.signature(child.forward)
        except (TypeError, ValueError):
            signature = None
        pending: list[Call] = []

        def before(_module: nn.Module, args: tuple, kwargs: dict[str, Any], name: str = name,
                   signature: inspect.Signature | None = signature, pending: list[Call] = pending) -> None:
            try:
                bound = dict(signature.bind_partial(*args, **kwargs).arguments) if signature else {}
            except TypeError:
                bound = {f"argument {index}": value for index, value in enumerate(args)} | kwargs
            call = Call(name, bound)
            calls.append(call)
            pending.append(call)

        def after(_module: nn.Module, _args: tuple, _kwargs: dict[str, Any], output: Any,
                  pending: list[Call] = pending) -> None:
            if pending:
                call = pending.pop()
                call.output, call.returned = output, True

        handles.append(child.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(child.register_forward_hook(after, with_kwargs=True))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


# --- naming values ----------------------------------------------------------------------------------------


def _close(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape:
        return False
    a64, b64 = a.detach().to(torch.float64).cpu(), b.detach().to(torch.float64).cpu()
    return bool(torch.isfinite(a64).all()) and bool(((a64 - b64).abs() <= 1e-7 + 1e-6 * b64.abs()).all())


def _same_mask(a: Tensor, b: Tensor) -> bool:
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)
        return bool(torch.equal((a.detach().cpu() != 0).expand(shape), (b.detach().cpu() != 0).expand(shape)))
    except RuntimeError:
        return False


def _factor(c: float) -> str:
    return f"{c:.4g}".rstrip("0").rstrip(".") if abs(c - round(c)) > 1e-9 else str(int(round(c)))


@dataclass
class Values:
    """The named values a traced computation has seen: its inputs and the outputs recorded so far.

    `masks` are compared as masks (same allowed positions after broadcasting), everything else as numbers.
    """

    names: dict[str, str] = field(default_factory=dict)  # key -> words
    tensors: dict[str, Any] = field(default_factory=dict)
    masks: set[str] = field(default_factory=set)

    def add(self, key: str, words: str, value: Any, mask: bool = False) -> None:
        self.names[key], self.tensors[key] = words, value
        if mask:
            self.masks.add(key)

    def words(self, terms: Sequence[Term]) -> str:
        parts = [self.names[key] if abs(c - 1) < 1e-12 else f"{_factor(c)} × {self.names[key]}" for c, key in terms]
        return " + ".join(parts)

    def value(self, terms: Sequence[Term]) -> Any:
        if len(terms) == 1 and abs(terms[0][0] - 1) < 1e-12:
            return self.tensors[terms[0][1]]
        return sum(c * self.tensors[key] for c, key in terms)

    def matches(self, got: Any, terms: Sequence[Term]) -> bool:
        want = self.value(terms)
        if got is want:
            return True
        if want is None or got is None or not isinstance(got, Tensor) or not isinstance(want, Tensor):
            return False
        if len(terms) == 1 and terms[0][1] in self.masks:
            return _same_mask(got, want)
        if got.is_floating_point() != want.is_floating_point() and not got.is_floating_point():
            return False
        return _close(got, want)

    def name(self, got: Any) -> str | None:
        """Words for `got`: a known value, a sum of two, or a multiple of one; None if none fits."""
        if got is None:
            return "None"
        for key, value in self.tensors.items():  # the very same object first (masks, ids)
            if value is got:
                return self.names[key]
        if not isinstance(got, Tensor):
            return None
        plain = [key for key, value in self.tensors.items() if isinstance(value, Tensor) and key not in self.masks]
        for key in self.masks:
            value = self.tensors[key]
            if isinstance(value, Tensor) and not got.is_floating_point() and _same_mask(got, value):
                return self.names[key]
        for key in plain:
            if self.matches(got, [(1.0, key)]):
                return self.names[key]
        for index, first in enumerate(plain):
            for second in plain[index + 1:]:
                a, b = self.tensors[first], self.tensors[second]
                if a.shape == b.shape == got.shape and _close(got, a.double() + b.double()):
                    return f"{self.names[first]} + {self.names[second]}"
        for key in plain:
            value = self.tensors[key]
            if value.shape != got.shape:
                continue
            reference = value.detach().double().cpu()
            norm = float((reference * reference).sum())
            if norm == 0:
                continue
            c = float((got.detach().double().cpu() * reference).sum()) / norm
            if abs(c) > 1e-6 and _close(got, c * reference):
                return f"{_factor(c)} × {self.names[key]}"
        return None


# --- the intended computation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One call the intended computation makes: sublayer `call` gets these arguments; its output is `output`."""

    call: str
    inputs: dict[str, tuple[Term, ...]]
    output: str
    words: str = ""  # how to call its output ("norm1's output"); default "<call>'s output"


def terms(*keys: str | tuple[float, str]) -> tuple[Term, ...]:
    """terms("x", "self_attn") = x + self_attn; terms((4.0, "embedding")) = 4 × embedding."""
    return tuple(key if isinstance(key, tuple) else (1.0, key) for key in keys)


ARGUMENT_WORDS = {"q": "its query", "k": "its keys", "v": "its values", "input": "its input", "x": "its input"}


def _argument(name: str) -> str:
    return ARGUMENT_WORDS.get(name, f"its {name} argument")


def _ordinal(index: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(index, f"{index}th")


def first_departure(calls: list[Call], steps: Sequence[Step], values: Values, *, where: str,
                    result: Any = None, result_key: str | None = None, ordered: Sequence[Sequence[str]] = (),
                    complete: bool = True) -> str | None:
    """Replay the recorded calls along `steps`; describe the first place they depart from it.

    `ordered`: groups of sublayers whose first calls must come in the order of `steps`. `result`: what the
    student's forward returned, compared with the output of `result_key` at the end. Every recorded
    output is named (so a value can be recognised even when it comes from a call no step expects).
    With `complete=False` (the forward crashed), calls missing after the last recorded one are not a
    departure.
    """
    counts: dict[str, int] = {}
    for call in calls:
        counts[call.name] = counts.get(call.name, 0) + 1
        if call.returned:
            values.add(f"call {len(values.names)}", f"the output of {call.name}'s {_ordinal(counts[call.name])} call"
                       if sum(c.name == call.name for c in calls) > 1 else f"{call.name}'s output", call.output)
    for group in ordered:
        order = _order(calls, steps, group)
        if order:
            return f"in {where}: {order}"
    used: dict[str, int] = {}
    expected_count = {name: sum(step.call == name for step in steps) for name in counts | {s.call: 0 for s in steps}}
    for step in steps:
        index = used.get(step.call, 0)
        made = [call for call in calls if call.name == step.call]
        if index >= len(made):
            if not complete:
                return None
            if not made:
                return f"in {where}: self.{step.call} is never called."
            return (f"in {where}: self.{step.call} is called {len(made)} time(s); the intended computation calls it "
                    f"{expected_count[step.call]} times.")
        call = made[index]
        used[step.call] = index + 1
        for argument, wanted_terms in step.inputs.items():
            got = call.args.get(argument, call.args.get("input") if argument == "x" else None)
            if not values.matches(got, wanted_terms):
                swapped = next((other for other, other_terms in step.inputs.items() if other != argument
                                and values.matches(got, other_terms)
                                and values.matches(call.args.get(other), wanted_terms)), None)
                if swapped:
                    return (f"in {where}: the {argument} and {swapped} arguments of {call.name} are swapped: it "
                            f"receives {values.words(step.inputs[swapped])} as {_argument(argument)} and "
                            f"{values.words(wanted_terms)} as {_argument(swapped)}.")
                seen_as = values.name(got) or "a value that is none of the expected ones"
                return (f"in {where}: {call.name}{'' if made[:1] == [call] else f' (call {index + 1})'} receives "
                        f"{seen_as} as {_argument(argument)}, instead of {values.words(wanted_terms)}."
                        + _hint(values, got, wanted_terms))
        if not call.returned:
            return None  # it crashed inside a reference part although its arguments were right
        values.add(step.output, step.words or f"{step.call}'s output", call.output)
    if not complete:
        return None
    for name, count in counts.items():
        if count > expected_count.get(name, 0) and expected_count.get(name, 0):
            return (f"in {where}: self.{name} is called {count} times; the intended computation calls it "
                    f"{expected_count[name]} times.")
    if result_key is not None and not values.matches(result, terms(result_key)):
        returned = values.name(result) or "a value that is none of the expected ones"
        unchanged = " unchanged" if values.matches(result, terms(next(iter(values.names)))) else ""
        return (f"in {where}: forward returns {returned}{unchanged}, instead of {values.names[result_key]}"
                + (": the results of its sublayers never reach the variable it returns." if unchanged else "."))
    return None


def _order(calls: list[Call], steps: Sequence[Step], ordered: Sequence[str]) -> str | None:
    """Describe sublayers called in another order than the steps (two swapped, or the first one out of place)."""
    seen = list(dict.fromkeys(call.name for call in calls if call.name in ordered))
    wanted = list(dict.fromkeys(step.call for step in steps if step.call in seen))
    if seen == wanted:
        return None
    differ = [index for index, (a, b) in enumerate(zip(seen, wanted, strict=True)) if a != b]
    if len(differ) == 2:
        a, b = (wanted[index] for index in differ)
        return (f"{a} and {b} are swapped: {b} runs where {a} belongs (after "
                f"{wanted[differ[0] - 1] if differ[0] else 'the start'}), and {a} where {b} belongs.")
    return f"the sublayers run in the order {', '.join(seen)}; the intended order is {', '.join(wanted)}."


def _hint(values: Values, got: Any, wanted: Sequence[Term]) -> str:
    """A short reading of a departure whose value is part of the intended sum."""
    if len(wanted) != 2 or not isinstance(got, Tensor):
        return ""
    for kept, dropped in (wanted, wanted[::-1]):
        if values.matches(got, [kept]):
            return f" ({values.words([dropped])} is not added.)"
    return ""
