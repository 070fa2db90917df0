"""The parts of a student's module, by role: found, given the reference's weights or modules, recorded call by
call, and compared with what the paper does with them.

Stages 3 and 4 grade one `forward` at a time: the student's block runs the reference attention and
feed-forward network, the stacks run reference blocks, the Transformer runs the reference Encoder and
Decoder. So everything the student's `forward` does is visible as calls of its parts. Stages 5 and 6 record
a whole model the same way: how compute_loss calls it, what greedy_decode gives its decoder.

- On the student's side: `pair` finds which of the student's parts plays each role of the reference
  module (by the given attribute name, else by kind in the order the constructor made them, so a renamed
  LayerNorm or a plain list of blocks is still found); `recorded` records every call of those parts (its
  arguments by name, its output, the student's line that made it) and every dropout the module applies,
  whatever its name (an `nn.Dropout`, several of them, or `F.dropout`).
- In the grader: `Values` names values (the inputs, every recorded output, sums of two, multiples), and
  `departure` replays the calls along the paper's computation (`Step`s) and says, in the student's own
  attribute names, the first place they depart: "self.feed_forward receives the block's input x where
  the paper gives it the output of self.norm1". `dropout_reading` says what each dropout was applied to.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_course.checks import differential
from transformer_course.checks.boundary import Frame, on_student_side
from transformer_course.checks.compare import close_elements, describe_difference
from transformer_course.checks.differential import seeded
from transformer_course.checks.errors import _from_the_course, crash_lines, first_line
from transformer_course.checks.framework import CheckFailed, Diagnosis, fail, student_code

Tensor = torch.Tensor
Term = tuple[float, str]  # coefficient, value key
UNNAMED = "a value that is none of the inputs and none of the parts' outputs"


# --- finding the parts (the student's side) -------------------------------------------------------------------


def kind(value: Any) -> str:
    """What a part is, for pairing: its class name; a ModuleList or plain list by what it holds."""
    if isinstance(value, nn.ModuleList | list | tuple):
        items = list(value)
        return f"list of {kind(items[0])}" if items else "empty list"
    return type(value).__name__


def candidates(module: nn.Module) -> list[tuple[str, Any]]:
    """The student's parts: registered children, then plain lists of modules kept as attributes (which
    PyTorch does not see, but `forward` may still use)."""
    found: list[tuple[str, Any]] = list(module.named_children())
    for name, value in vars(module).items():
        if isinstance(value, list | tuple) and value and all(isinstance(item, nn.Module) for item in value):
            found.append((name, value))
    return found


def nested(module: nn.Module, prefix: str = "", depth: int = 3) -> list[tuple[str, Any]]:
    """Every part of the student's module tree, parents before their parts, as dotted paths ('norm1',
    'sublayer.0.norm', 'layers.1'): a part kept inside a wrapper (the Annotated Transformer's
    `self.sublayer[i].norm`) is found as well as one kept directly."""
    found: list[tuple[str, Any]] = []
    for name, value in candidates(module):
        path = f"{prefix}{name}"
        found.append((path, value))
        if depth <= 1:
            continue
        items = list(enumerate(value)) if isinstance(value, nn.ModuleList | nn.Sequential | list | tuple) else []
        for index, item in items:
            if isinstance(item, nn.Module):
                found.append((f"{path}.{index}", item))
                found += nested(item, f"{path}.{index}.", depth - 1)
        if isinstance(value, nn.Module) and not items:
            found += nested(value, f"{path}.", depth - 1)
    return found


def _norm_like(value: Any) -> bool:
    """A layer normalisation written by hand (the Annotated Transformer's `LayerNorm` with a_2 and b_2): a module
    whose name says it normalises and whose parameters are two vectors of one size (a gain and a bias)."""
    if not isinstance(value, nn.Module) or "norm" not in type(value).__name__.lower():
        return False
    shapes = [tuple(parameter.shape) for parameter in value.parameters(recurse=False)]
    return len(shapes) == 2 and len(shapes[0]) == 1 and shapes[0] == shapes[1]


def same_kind(part: Any, child: Any) -> bool:
    """Whether the student's part can play the role of the reference's child: the same kind, or a hand-written
    layer normalisation for a LayerNorm."""
    return kind(part) == kind(child) or (isinstance(child, nn.LayerNorm) and _norm_like(part))


def pair(reference: nn.Module, student: nn.Module) -> dict[str, str]:
    """For every child of `reference`, the student's part in that role: the part with the same name (a module
    for a module, a list for a list), else the first unpaired part of the same kind anywhere in the student's
    module tree, in the order the student's constructor made them, outside the parts already paired (so a
    LayerNorm inside a wrapper module is found); '' when there is none."""
    parts = nested(student)
    taken: set[str] = set()
    paired: dict[str, str] = {}
    children = list(reference.named_children())

    def listed(value: Any) -> bool:
        return isinstance(value, nn.ModuleList | list | tuple)

    def inside_taken(path: str) -> bool:
        return any(path.startswith(f"{other}.") for other in taken if other)

    for name, child in children:
        same = next((path for path, part in parts if path == name and listed(part) == listed(child)), None)
        if same is not None:
            paired[name] = same
            taken.add(same)
    for name, child in children:
        if name not in paired:
            paired[name] = next((path for path, part in parts if path not in taken and not inside_taken(path)
                                 and same_kind(part, child)), "")
            taken.add(paired[name])
    return paired


def put(module: nn.Module, path: str, value: nn.Module) -> None:
    """Put `value` at the student's part path ('self_attn', 'sublayer.0.norm', 'layers.1')."""
    owner_path, _, last = path.rpartition(".")
    owner = locate(module, owner_path) if owner_path else module
    if last.isdigit() and isinstance(owner, nn.ModuleList | nn.Sequential | list):
        owner[int(last)] = value
    else:
        setattr(owner, last, value)


def extras(module: nn.Module, paths: Mapping[str, str]) -> dict[str, str]:
    """The student's parts that play no role of the reference module (an extra LayerNorm, say), as roles
    'extra:<path>', so that their calls are recorded and their outputs named too."""
    taken = {path for path in paths.values() if path}
    return {f"extra:{path}": path for path, value in candidates(module)
            if path not in taken and isinstance(value, nn.Module) and not isinstance(value, nn.Dropout)
            and not any(other.startswith(f"{path}.") for other in taken)}  # a wrapper of paired parts is none


def load(target: nn.Module, source: nn.Module, what: str) -> None:
    """Give the student's part `target` the weights of the reference part `source` (same layout)."""
    wanted, have = source.state_dict(), target.state_dict()
    if isinstance(source, nn.LayerNorm) and _norm_like(target) and wanted.keys() != have.keys():
        gain, bias = target.parameters(recurse=False)  # a hand-written LayerNorm: its gain, then its bias
        with torch.no_grad():
            gain.copy_(source.weight)
            bias.copy_(source.bias)
        return
    if wanted.keys() != have.keys() or any(wanted[key].shape != have[key].shape for key in wanted):
        fail(f"{what} does not hold what the given constructor puts there.",
             expected=", ".join(f"{key} {tuple(value.shape)}" for key, value in wanted.items()),
             got=", ".join(f"{key} {tuple(value.shape)}" for key, value in have.items()) or "no weights",
             cause="keep the given constructor: this check gives your parts the reference's weights and compares "
                   "the numbers.")
    target.load_state_dict(wanted)


def locate(module: nn.Module, path: str) -> Any:
    """The student's part at `path`: a submodule ('norm1', 'net.0', 'layers.1'), a plain list attribute
    ('layers') or an item of one ('layers.1')."""
    head, _, rest = path.partition(".")
    value = getattr(module, head)
    for index in rest.split(".") if rest else ():
        value = value[int(index)] if isinstance(value, list | tuple | nn.ModuleList | nn.Sequential) \
            else getattr(value, index)
    return value


def words(path: str) -> str:
    """self.norm1, self.layers[0] for the student's attribute path 'norm1', 'layers.0' (as the differential
    engine names parts: "the output of self.norm1")."""
    head, *rest = path.split(".")
    return "self." + head + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in rest)


# --- recording the calls (the student's side) ---------------------------------------------------------------


@dataclass(eq=False)
class Call:
    """One call of a part: its role, the student's path, its arguments by parameter name, its output (once it
    returned) and the student's line that made it. Dropout calls have role 'dropout' and argument 'input'."""

    role: str
    path: str
    args: dict[str, Any]
    output: Any = None
    returned: bool = False
    line: Frame | None = None


def student_line() -> Frame | None:
    """The innermost line on the stack that is neither torch's, the standard library's (nor an installed
    package's) nor the course's."""
    frame = sys._getframe(1)
    while frame is not None and (_from_the_course(frame.f_code.co_filename)
                                 or "/site-packages/" in frame.f_code.co_filename):
        frame = frame.f_back
    return differential.frame_of(frame) if frame is not None else None


def _kept(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_kept(item) for item in value)
    return value


class _Dropouts(TorchFunctionMode):
    """Records every dropout that drops (F.dropout with training on, which nn.Dropout calls too)."""

    def __init__(self, calls: list[Call]) -> None:
        super().__init__()
        self.calls = calls

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func is F.dropout and args:
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            if training:
                self.calls.append(Call("dropout", "dropout", {"input": _kept(args[0])}, _kept(result), True,
                                       student_line()))
        return result


@contextmanager
def recorded(module: nn.Module, roles: Mapping[str, str], dropout: bool = True,
             itself: str = "") -> Iterator[list[Call]]:
    """Record, in order, every call of the student's parts (`roles`: the student's path -> role; a part that
    sits at several paths is recorded once, under the first), with `itself` the calls of `module` itself (as
    that role, at path ''), and with `dropout` every dropout applied."""
    calls: list[Call] = []
    handles = []
    seen: set[int] = set()
    targets = [("", itself, module)] if itself else []
    for path, role, target in targets + [(path, role, locate(module, path)) for path, role in roles.items() if path]:
        if not isinstance(target, nn.Module) or id(target) in seen:
            continue
        seen.add(id(target))
        try:
            signature = inspect.signature(target.forward)
        except (TypeError, ValueError):
            signature = None
        pending: list[Call] = []

        def before(_module: nn.Module, args: tuple, kwargs: dict[str, Any], role: str = role, path: str = path,
                   signature: inspect.Signature | None = signature, pending: list[Call] = pending) -> None:
            try:
                bound = dict(signature.bind_partial(*args, **kwargs).arguments) if signature else {}
            except TypeError:
                bound = {f"argument {index}": value for index, value in enumerate(args)} | kwargs
            call = Call(role, path, {key: _kept(value) for key, value in bound.items()}, line=student_line())
            calls.append(call)
            pending.append(call)

        def after(_module: nn.Module, _args: tuple, _kwargs: dict[str, Any], output: Any,
                  pending: list[Call] = pending) -> None:
            if pending:
                call = pending.pop()
                call.output, call.returned = _kept(output), True

        handles.append(target.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(target.register_forward_hook(after, with_kwargs=True))
    try:
        with _Dropouts(calls) if dropout else nullcontext():
            yield calls
    finally:
        for handle in handles:
            handle.remove()


def everything(module: nn.Module) -> list[nn.Module]:
    """Every module of `module`, those kept in plain lists (which PyTorch does not see) and theirs included."""
    found: dict[int, nn.Module] = {}
    pending = [module]
    while pending:
        each = pending.pop()
        if id(each) in found:
            continue
        found[id(each)] = each
        pending += [child for _, child in candidates(each) if isinstance(child, nn.Module)]
        pending += [item for _, value in candidates(each) if isinstance(value, list | tuple) for item in value]
    return list(found.values())


@dataclass
class Run:
    """What the student's module did on one input: its output for each random seed (two equal outputs in eval
    mode), and the calls of its parts in the first run (when recorded)."""

    outputs: list[Any]
    calls: list[Call]


def copies(inputs: tuple) -> list[Any]:
    """The inputs with every tensor cloned, so that a call that writes into its arguments leaves the caller's."""
    return [t.clone() if isinstance(t, Tensor) else t for t in inputs]


def _plain(value: Any) -> Any:
    """What the student's forward returned, as data: tensors, numbers and containers of them; anything else
    (a module, say) as a short description, so that a message can say what it was."""
    if value is None or isinstance(value, Tensor | bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return type(value)(_plain(item) for item in value)
    return f"a {type(value).__name__} object"


@on_student_side
def run(module: nn.Module, inputs: tuple, train: bool = False, seeds: tuple[int, ...] = (7, 8),
        roles: dict[str, str] | None = None) -> Run:
    """Run the student's module on copies of the inputs (an in-place `+=` must not spoil them), in train or eval
    mode, once per seed, without gradients; record the calls of its parts (`roles`: path -> role) in the first
    run. A crash goes back as it is."""
    for each in everything(module):
        each.train(train)
    done = Run([], [])
    for number, seed in enumerate(seeds):
        record = recorded(module, roles) if roles is not None and number == 0 else nullcontext([])
        with seeded(seed), torch.no_grad(), student_code(), record as calls:
            done.outputs.append(_plain(module(*copies(inputs))))
        if number == 0:
            done.calls = list(calls)
    return done


@on_student_side
def calls_before_crash(module: nn.Module, inputs: tuple, roles: dict[str, str], train: bool = False,
                       seed: int = 7) -> list[Call]:
    """The calls of the parts recorded until the student's module crashes on these inputs."""
    for each in everything(module):
        each.train(train)
    with seeded(seed), torch.no_grad(), student_code(), recorded(module, roles) as calls:
        try:
            module(*copies(inputs))
        except (NotImplementedError, CheckFailed):
            raise
        except Exception:  # noqa: BLE001  (the crash itself is reported by the check)
            pass
    return list(calls)


def observe(module: Any, inputs: tuple, what: str, roles: dict[str, str] | None,
            explain: Callable[[list[Call]], str | None], *, train: bool = False,
            seeds: tuple[int, ...] = (7, 8)) -> Run:
    """`run` (in the grader), with a crash explained by the calls made before it when `explain` can name the
    place; otherwise the crash is let through, for the check to explain by its kind."""
    try:
        return run(module, inputs, train, seeds, roles)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as crash:
        if roles is None:
            raise
        cause = safely(explain, calls_before_crash(module, inputs, roles, train, seeds[0]))
        if cause is None:
            raise
        fail(f"{what} crashed.", expected=f"{what} to run on these inputs",
             got=f"{type(crash).__name__}: {first_line(crash, 160)}" + crash_lines(crash),
             cause=cause)
        raise  # fail raises


def safely(read: Callable[..., str | None], *args: Any, **kwargs: Any) -> str | None:
    """A check's reading of what it observed, or None when it cannot make one (a reading that fails on values
    nobody foresaw says nothing, rather than failing the check on its own account)."""
    try:
        return read(*args, **kwargs)
    except Exception:  # noqa: BLE001
        return None


def diagnosis(reading: str | None, got: Tensor, expected: Tensor, engine: Callable[[], Any] | None,
              axes: Sequence[str], atol: float = 1e-6, rtol: float = 1e-5) -> Diagnosis | None:
    """The check's reading of the calls (`reading`, the cause) with where the values differ; the differential
    engine's reading (`engine()`, the operation by operation comparison) when the calls show nothing, or show
    an argument that is none of the values they know."""
    own = Diagnosis(describe_difference(got, expected, axes, atol, rtol), reading) if reading else None
    if engine is None or (reading is not None and UNNAMED not in reading):
        return own
    return differential.combined(own, engine())


def engine(module: Any, reference: nn.Module, inputs: tuple, names: Sequence[str], got: Tensor, expected: Tensor,
           context: differential.Context, axes: Sequence[str]) -> Any:
    """The differential engine on the student's module (recorded on the student's side) and the reference."""
    student = differential.traced(module, *inputs, names=names, seed=7)
    recorded = differential.traced_call(reference, *inputs, names=names, seed=7)
    return differential.explain(student, recorded, got, expected, context, axes)


# --- naming values (the grader) --------------------------------------------------------------------------------


def _close(a: Any, b: Any) -> bool:
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.shape != b.shape:
        return False
    if a.dtype == torch.bool or b.dtype == torch.bool:
        return bool(torch.equal(a.bool(), b.bool()))
    return bool(close_elements(a, b, 1e-7, 1e-6).all())


def same_mask(a: Any, b: Any) -> bool:
    """The same allowed positions, after broadcasting (bool and 0/1 masks alike)."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        return False
    try:
        shape = torch.broadcast_shapes(a.shape, b.shape)
        return bool(torch.equal((a != 0).expand(shape), (b != 0).expand(shape)))
    except RuntimeError:
        return False


def _same(a: Any, b: Any) -> bool:
    """The same value: both None, or tensors with the same numbers (masks as masks)."""
    if a is None or b is None:
        return a is None and b is None
    return _close(a, b) or (isinstance(a, Tensor) and not a.is_floating_point() and same_mask(a, b))


def _factor(c: float) -> str:
    return f"{c:.4g}" if abs(c - round(c)) > 1e-9 else str(int(round(c)))


@dataclass
class Values:
    """The named values of one run: its inputs and the outputs recorded so far. `masks` compare as masks."""

    names: dict[str, str] = field(default_factory=dict)  # key -> words
    tensors: dict[str, Any] = field(default_factory=dict)
    masks: set[str] = field(default_factory=set)

    def add(self, key: str, words: str, value: Any, mask: bool = False) -> None:
        self.names[key], self.tensors[key] = words, value
        if mask:
            self.masks.add(key)

    def words(self, wanted: Sequence[Term]) -> str:
        return " + ".join(self.names[key] if abs(c - 1) < 1e-12 else f"{_factor(c)} × {self.names[key]}"
                          for c, key in wanted)

    def value(self, wanted: Sequence[Term]) -> Any:
        if len(wanted) == 1 and abs(wanted[0][0] - 1) < 1e-12:
            return self.tensors[wanted[0][1]]
        return sum(c * self.tensors[key].double() for c, key in wanted)

    def matches(self, got: Any, wanted: Sequence[Term]) -> bool:
        want = self.value(wanted)
        if want is None or got is None:
            return want is None and got is None
        if len(wanted) == 1 and wanted[0][1] in self.masks:
            return same_mask(got, want)
        if isinstance(got, Tensor) and not got.is_floating_point() and isinstance(want, Tensor) \
                and want.is_floating_point():
            return False
        return _close(got, want)

    def name(self, got: Any) -> str | None:
        """Words for `got`: a known value, a sum of two, or a multiple of one; None when none fits."""
        if got is None:
            return "None (nothing)"
        if not isinstance(got, Tensor):
            return None
        plain = [key for key, value in self.tensors.items() if isinstance(value, Tensor) and key not in self.masks]
        if not got.is_floating_point():
            for key in self.masks:
                if same_mask(got, self.tensors[key]):
                    return self.names[key]
        for key in plain:
            if self.matches(got, [(1.0, key)]):
                return self.names[key]
        if not got.is_floating_point():
            return None
        for index, first in enumerate(plain):
            for second in plain[index + 1:]:
                a, b = self.tensors[first], self.tensors[second]
                if a.shape == b.shape == got.shape and _close(got, a.double() + b.double()):
                    return f"{self.names[first]} + {self.names[second]}"
        for key in plain:
            value = self.tensors[key]
            if value.shape != got.shape:
                continue
            reference = value.detach().double()
            norm = float((reference * reference).sum())
            c = float((got.detach().double() * reference).sum()) / norm if norm else 0.0
            if abs(c) > 1e-6 and _close(got, c * reference):
                return f"{_factor(c)} × {self.names[key]}"
        return None


# --- the paper's computation, and where the calls depart from it (the grader) ------------------------------


@dataclass(frozen=True)
class Step:
    """One call the paper's computation makes: the part in `role` gets these arguments (value terms); its output
    is value `output`, called `label` in messages (default: 'the output of <the student's part>')."""

    role: str
    inputs: dict[str, tuple[Term, ...]]
    output: str
    label: str = ""


def terms(*keys: str | tuple[float, str]) -> tuple[Term, ...]:
    """terms("x", "self_attn") = x + self_attn; terms((4.0, "embedding")) = 4 × embedding."""
    return tuple(key if isinstance(key, tuple) else (1.0, key) for key in keys)


ARGUMENT_WORDS = {"q": "its query", "k": "its keys", "v": "its values", "input": "its input", "x": "its input",
                  "mask": "its mask"}


def argument_words(name: str) -> str:
    return ARGUMENT_WORDS.get(name, f"its argument `{name}`")


def _arguments(names: Sequence[str]) -> str:
    """'its query', 'its keys and values', 'its query, keys and values'."""
    bare = [argument_words(name).removeprefix("its ") for name in names]
    return "its " + (bare[0] if len(bare) == 1 else f"{', '.join(bare[:-1])} and {bare[-1]}")


def _ordinal(index: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(index, f"{index}th")


@dataclass(frozen=True)
class Reading:
    """What the calls show: `text` (the departure, in words) at the student's `line` (when known)."""

    text: str
    line: Frame | None = None
    kind: str = ""  # what departs: "order", "missing", "count", "argument", "result"
    argument: str = ""  # the argument that departs ("q", "input", ...)
    role: str = ""  # the role of the part whose call departs
    got: str = ""  # words for what it received
    wanted: str = ""  # words for what the paper gives it

    def cause(self) -> str:
        return f"{at(self.line)}{self.text}"


def at(line: Frame | None) -> str:
    """'in `forward`, line 12 (`x = ...`): ' for the student's line ('' when unknown)."""
    if line is None:
        return ""
    return f"in `{line.name}`, line {line.lineno}" + (f" (`{line.line}`)" if line.line else "") + ": "


class Replay:
    """The recorded calls of one run replayed along the paper's steps."""

    def __init__(self, calls: Sequence[Call], steps: Sequence[Step], values: Values, paths: Mapping[str, str],
                 authority: str = "the reference") -> None:
        """`authority`: whose computation the steps are, in messages ("the reference", or "the pre-LN block" for an
        arrangement the paper does not have)."""
        self.calls, self.steps, self.values, self.paths = list(calls), list(steps), values, paths
        self.authority = authority
        self.counts: dict[str, int] = {}
        made: dict[str, int] = {}
        for call in self.calls:  # every output gets a name, so that any value can be recognised
            self.counts[call.role] = self.counts.get(call.role, 0) + 1
            made[call.path] = made.get(call.path, 0) + 1
            if call.returned:
                many = sum(c.path == call.path for c in self.calls) > 1
                label = f"the output of {self.part(call)}" + (
                    f" (its {_ordinal(made[call.path])} call)" if many else "")
                self.values.add(f"call {len(self.values.names)}", label, call.output)

    def part(self, call_or_role: Call | str) -> str:
        if isinstance(call_or_role, Call):
            if call_or_role.role == "dropout":
                return "dropout"
            if call_or_role.path:
                return words(call_or_role.path)
            call_or_role = call_or_role.role  # the recorded module itself: 'the model'
        path = self.paths.get(call_or_role, "")
        return words(path) if path else f"the {call_or_role}"

    def order(self, group: Sequence[str]) -> Reading | None:
        """Parts of `group` called (first) in another order than the steps."""
        seen = list(dict.fromkeys(call.role for call in self.calls if call.role in group))
        wanted = list(dict.fromkeys(step.role for step in self.steps if step.role in seen))
        if seen == wanted:
            return None
        differ = [index for index, (a, b) in enumerate(zip(seen, wanted, strict=True)) if a != b]
        early = next(call for call in self.calls if call.role == seen[differ[0]])
        if len(differ) == 2:
            first, second = (self.part(wanted[index]) for index in differ)
            text = f"{first} and {second} are swapped: {self.authority} applies {first} before {second}"
        else:
            text = (f"your forward calls {', '.join(self.part(role) for role in seen)} in this order; "
                    f"{self.authority}'s order is {', '.join(self.part(role) for role in wanted)}")
        return Reading(text, early.line, "order", role=seen[differ[0]])

    def _assigned(self) -> list[tuple[Step, Call | None, int]]:
        """Each step with the call that plays it (the n-th call of its role for the n-th such step)."""
        used: dict[str, int] = {}
        found = []
        for step in self.steps:
            index = used.get(step.role, 0)
            used[step.role] = index + 1
            made = [call for call in self.calls if call.role == step.role]
            found.append((step, made[index] if index < len(made) else None, index))
        return found

    def departure(self, *, result: Any = None, result_key: str | None = None,
                  ordered: Sequence[Sequence[str]] = (), complete: bool = True) -> Reading | None:
        """The first place the calls depart from the steps. `result`: what forward returned, compared at the end
        with value `result_key`. With `complete=False` (forward crashed), calls missing after the last
        recorded one are no departure."""
        for group in ordered:
            found = self.order(group)
            if found is not None:
                return found
        expected = {role: sum(step.role == role for step in self.steps) for role in {s.role for s in self.steps}}
        assigned = self._assigned()
        for number, (step, call, index) in enumerate(assigned):
            if call is None:  # missing; after a crash only when a later part ran
                later = any(other is not None for _, other, _ in assigned[number + 1:])
                return self._missing(step, expected) if complete or later else None
            for argument, wanted in step.inputs.items():
                got = call.args.get(argument, call.args.get("input") if argument == "x" else None)
                if not self.values.matches(got, wanted):
                    return self._argument(call, index, step, argument, got, wanted, assigned[number + 1:])
            if not call.returned:
                return None  # it crashed inside a reference part although its arguments were right
            self.values.add(step.output, step.label or f"the output of {self.part(call)}", call.output)
        if not complete:
            return None
        extra = self._extra(expected)
        if extra is not None:
            return extra
        if result_key is not None and not self.values.matches(result, terms(result_key)):
            got = self.values.name(result) or UNNAMED
            wanted = self.values.names[result_key]
            text = f"forward returns {got} where {self.authority} returns {wanted}"
            if self.values.matches(result, terms(next(iter(self.values.names)))):
                text += ": the results of its parts never reach the variable it returns"
            return Reading(text, None, "result", got=got, wanted=wanted)
        return None

    def _over(self, expected: Mapping[str, int]) -> list[tuple[str, int]]:
        return [(role, count) for role, count in self.counts.items() if expected.get(role) and count > expected[role]]

    @staticmethod
    def _times(count: int) -> str:
        return {1: "once", 2: "twice"}.get(count, f"{count} times")

    def _extra(self, expected: Mapping[str, int]) -> Reading | None:
        for role, count in self._over(expected):
            extra = [call for call in self.calls if call.role == role][expected[role]]
            return Reading(f"{self.part(role)} is called {self._times(count)} where {self.authority} calls it "
                           f"{self._times(expected[role])}", extra.line, "count", role=role)
        return None

    def _missing(self, step: Step, expected: Mapping[str, int]) -> Reading:
        made = [call for call in self.calls if call.role == step.role]
        kind = step.role.rstrip("0123456789")  # norm2 and norm3 are parts of one kind
        uncalled = [role for role in dict.fromkeys(other.role for other in self.steps)
                    if role != step.role and role.rstrip("0123456789") == kind
                    and not any(call.role == role for call in self.calls)]
        text = (f"{self.part(step.role)} is never called" + "".join(f", nor is {self.part(role)}" for role in uncalled)
                if not made else
                f"{self.part(step.role)} is called {self._times(len(made))} where {self.authority} calls it "
                f"{self._times(expected[step.role])}")
        over = [f"{self.part(role)} is called {self._times(count)} where {self.authority} calls it "
                f"{self._times(expected[role])}" for role, count in self._over(expected)]
        line = next((call.line for role, _ in self._over(expected) for call in
                     [c for c in self.calls if c.role == role][expected[role]:]), made[-1].line if made else None)
        return Reading("; ".join([text, *over]), line, "missing", role=step.role)

    def _argument(self, call: Call, index: int, step: Step, argument: str, got: Any, wanted: tuple[Term, ...],
                  later: Sequence[tuple[Step, Call | None, int]]) -> Reading:
        values = self.values
        target = self.part(call) + ("" if index == 0 else f" (its {_ordinal(index + 1)} call)")
        def received(name: str) -> Any:
            return call.args.get(name, call.args.get("input") if name == "x" else None)

        alike = [argument] + [name for name, other in step.inputs.items()
                              if name != argument and other == wanted and _same(received(name), got)]
        swapped = [other for other, other_terms in step.inputs.items() if other not in alike
                   and values.matches(got, other_terms) and values.matches(received(other), wanted)]
        these = _arguments(alike)
        if swapped:
            others = _arguments(swapped)
            return Reading(f"{target} receives {values.words(step.inputs[swapped[0]])} as {these} and "
                           f"{values.words(wanted)} as {others}: the two are swapped", call.line, "argument", argument,
                           step.role, values.words(step.inputs[swapped[0]]), values.words(wanted))
        extra = [name for name in call.args if name.startswith("argument ")]  # arguments its forward does not take
        if got is None and extra:
            text = (f"{target} is called with {len(call.args)} arguments, which its forward does not take, where "
                    f"{self.authority} gives it {len(step.inputs)}: {values.words(wanted)}")
            return Reading(text, call.line, "argument", argument, step.role, f"{len(call.args)} arguments",
                           values.words(wanted))
        if got is None and argument not in call.args and not (argument == "x" and "input" in call.args):
            seen = "nothing (it is called without it)"  # left to the forward's default
        else:
            seen = "None" if got is None else values.name(got) or UNNAMED
        text = f"{target} receives {seen} as {these} where {self.authority} gives it {values.words(wanted)}"
        if len(wanted) == 2:
            for kept, dropped in (wanted, wanted[::-1]):
                if values.matches(got, [kept]):
                    text += f" ({values.words([dropped])} is not added before {target}, where the sum belongs)"
                    break
            else:
                text += self._replaced(got, wanted)
        exchanged = self._exchanged(got, wanted, later)
        if exchanged:
            text = f"{values.words(wanted)} and {seen} are swapped: {text}; {exchanged}"
        return Reading(text, call.line, "argument", argument, step.role, seen, values.words(wanted))

    def _replaced(self, got: Any, wanted: tuple[Term, ...]) -> str:
        """' (... is added where ... belongs ...)' when `got` is the wanted sum with one of its two terms replaced by
        another known value (a stream overwritten by its normalised copy, say), naming the line that computed that
        value."""
        for index, (factor, key) in enumerate(wanted):
            for other in self.values.names:
                if other in self.values.masks or other == key or other.startswith("call "):
                    continue
                changed = list(wanted)
                changed[index] = (factor, other)
                try:
                    fits = self.values.matches(got, changed)
                except Exception:  # noqa: BLE001  (values that cannot be added say nothing)
                    fits = False
                if fits:
                    made = next((call for call in self.calls if call.output is not None
                                 and self.values.tensors.get(other) is call.output), None)
                    where = (f", computed in line {made.line.lineno} (`{made.line.line}`)"
                             if made is not None and made.line is not None else "")
                    return (f" ({self.values.names[other]}{where} is added where {self.values.names[key]} belongs: "
                            f"is {self.values.names[key]} kept in a variable that a later line overwrote, or is "
                            "another variable added?)")
        return ""

    def _exchanged(self, got: Any, wanted: tuple[Term, ...], later: Sequence[tuple[Step, Call | None, int]]) -> str:
        """A later call that receives what this one should have, where it should have what this one got."""
        key = next((k for k in self.values.names if len(wanted) == 1 and self.values.matches(got, terms(k))
                    and not k.startswith("call ")), None)
        if key is None:
            return ""
        for step, call, _ in later:
            for argument, other in step.inputs.items():
                if call is not None and other == terms(key) and self.values.matches(call.args.get(argument), wanted):
                    return (f"{self.part(call)} receives {self.values.words(wanted)} as {argument_words(argument)} "
                            f"where {self.authority} gives it {self.values.names[key]}")
        return ""


def dropout_reading(calls: Sequence[Call], sublayers: Mapping[str, str], values: Values) -> Reading | None:
    """In train mode: what each dropout was applied to, when that is not once each sublayer's output (None
    when it is). `sublayers`: role -> words for the sublayer; `values`: the run's named values. The reading's
    `got` lists what every dropout was applied to."""
    outputs = [call for call in calls if call.role in sublayers and call.returned]
    if not outputs:
        return None
    named = Values(dict(values.names), dict(values.tensors), set(values.masks))
    for number, call in enumerate(calls):
        if call.role == "dropout":
            named.add(f"dropped {number}", "the output of a dropout (dropout twice in a row)", call.output)
    done: set[int] = set()
    applied: list[str] = []
    wrong: list[str] = []
    for call in (call for call in calls if call.role == "dropout"):
        source = next((out for out in outputs if id(out) not in done and _close(call.args.get("input"), out.output)),
                      None)
        if source is not None:
            done.add(id(source))
            applied.append(f"the output of {sublayers[source.role]}")
            continue
        what = named.name(call.args.get("input")) or "a value that is no sublayer's output"
        applied.append(what)
        wrong.append(f"{at(call.line)}dropout is applied to {what}")
    missed = [f"the output of {sublayers[out.role]} is not dropped out" for out in outputs if id(out) not in done]
    if not wrong and not missed:
        return None
    got = f"dropout applied to: {'; '.join(applied)}" if applied else "no dropout at all"
    return Reading("; ".join([*missed, *wrong]), None, "dropout", got=got)
