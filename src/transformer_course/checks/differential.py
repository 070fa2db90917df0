"""Differential diagnosis: where the student's computation first departs from the reference's, and how.

The student's component and the reference run on the same inputs (modules with the same weights), each
under a `Recorder`: every torch operation with a tensor result is written down (a `TorchFunctionMode`), with
where its tensor arguments came from (an input, a parameter, an earlier operation), its other arguments,
its result, the module whose `forward` was running and the line of code that called it. Then
`diagnose(student, reference)`:

1. *matches* every value of the reference computation with the student's values (same numbers, in any
   layout: a reshape or a transpose of the same values counts as the same value);
2. finds the *departure*: the first reference operation whose tensor arguments the student has but whose
   result the student never computes, and from which every path to the final result is unmatched (so a
   value the student simply computed in another order is not blamed);
3. finds what the student computed *instead* (the student's operation that takes the same arguments) and
   says what the difference is, derived from the values: a constant factor (named when it is a known
   quantity: 1/√d_k, √d_model, log₁₀ e, 1/(1−p), …) or a sign, axes swapped, a shift by one along an axis,
   columns in another order (halves instead of interleaved, pairs swapped), positions hidden or shown by
   a mask that should not be, a normalisation over another axis, an operation missing or added, another
   operation in its place, an argument that is another value of the computation (named);
4. points at the student's line that computed it.

Nothing here is a list of known mistakes: every phrase comes from comparing values.
"""

from __future__ import annotations

import linecache
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import permutations
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_course.checks.boundary import Frame, on_student_side
from transformer_course.checks.compare import as_float64, merged_axes, shifted
from transformer_course.checks.salt import salted_seed
from transformer_course.runtime import TORCH_DIR

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])
_CHECKS_DIR = str(Path(__file__).resolve().parent)
_REFERENCE_DIR = str(Path(__file__).resolve().parents[1] / "reference")
MAX_ELEMENTS = 2_000_000  # values kept per trace; beyond it results are not kept (the trace says so)

# operations that only move or relabel values (the same numbers in another layout)
LAYOUT = {"view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "flatten", "unflatten", "contiguous",
          "expand", "expand_as", "view_as", "reshape_as", "t", "T", "mT", "clone", "detach", "to", "float", "double",
          "type", "type_as", "__getitem__", "narrow", "select", "movedim", "swapaxes", "chunk", "split", "unbind",
          "broadcast_to", "repeat", "cpu", "cuda", "long", "int", "bool", "half"}
PERMUTING = {"transpose", "permute", "movedim", "swapaxes", "t", "T", "mT", "transpose_"}
IDENTITY_WHEN_SAME = {"dropout", "contiguous", "clone", "detach", "to", "float", "double", "type_as", "cpu"}
SKIPPED = {"__get__", "__set__", "size", "dim", "numel", "item", "tolist", "__len__", "__bool__", "__index__",
           "__format__", "__repr__", "__hash__", "data_ptr", "element_size", "stride", "is_contiguous",
           "__iter__", "requires_grad_", "retain_grad", "__reduce_ex__", "__deepcopy__", "storage_offset",
           "untyped_storage", "is_floating_point", "__array__", "numpy", "get_device", "is_complex"}


# --- recording ---------------------------------------------------------------------------------------------


@dataclass
class Op:
    """One operation of a computation."""

    index: int
    name: str  # "matmul", "softmax", "__setitem__", "linear", ...
    sources: tuple[str, ...]  # per tensor argument: "input:q", "leaf:W_q.weight", "op:3", "new"
    params: tuple[tuple[str, str], ...]  # the other arguments, as short text ("dim", "-1")
    output: torch.Tensor | None
    line: Frame | None  # the line of code that called it (student's or reference's)
    scope: str  # the module whose forward was running ("", "self_attn", "layers.0.norm1")
    variable: str = ""  # the name that line assigns, when it assigns one
    user: Frame | None = None  # the innermost line that is neither a library's nor the reference's


@dataclass
class Trace:
    """A recorded computation: its inputs by name, its leaves (parameters, buffers, other tensors it did
    not make), its operations in order and its result."""

    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    leaves: dict[str, torch.Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    output: Any = None
    truncated: bool = False
    error: Any = None  # with `traced(..., keep_error=True)`: what the call raised (a boundary.StudentError)


def _library(filename: str) -> bool:
    if filename.startswith(_REFERENCE_DIR):
        return False
    return (filename.startswith((TORCH_DIR, _CHECKS_DIR, "<frozen")) or "/lib/python" in filename
            or "/site-packages/" in filename or f"{_PACKAGE_DIR}/grading" in filename
            or f"{_PACKAGE_DIR}/runtime" in filename)


def frame_of(frame: Any) -> Frame:
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno, frame.f_globals).strip()
    return Frame(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, line[:200])


def _caller_lines() -> tuple[Frame | None, Frame | None]:
    """(the innermost line of code that is not a library's, the innermost that is not the reference's either:
    the student's own line, when reference parts plugged into the student's module made the call)."""
    frame, line = sys._getframe(2), None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _library(filename):
            if line is None:
                line = frame_of(frame)
            if not filename.startswith(_REFERENCE_DIR):
                return line, frame_of(frame)
        frame = frame.f_back
    return line, None


_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_][\w.]*(?:\s*\[[^\]]*\])?(?:\s*,\s*[A-Za-z_]\w*)*)\s*(?:[+\-*/@]?=)(?!=)")


def _assigned(line: str) -> str:
    match = _ASSIGNMENT.match(line)
    return match.group(1).strip() if match else ""


def _name_of(func: Any) -> str:
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # a property such as Tensor.T
        owner = getattr(func, "__self__", None)
        name = getattr(owner, "__name__", name)
    return name


def _short(value: Any) -> str:
    if isinstance(value, slice):
        parts = ["" if value.start is None else str(value.start), "" if value.stop is None else str(value.stop)]
        if value.step is not None:
            parts.append(str(value.step))
        return ":".join(parts)
    if isinstance(value, tuple):
        return "(" + ", ".join(_short(item) for item in value) + ")"
    if value is Ellipsis:
        return "..."
    if isinstance(value, float):
        return f"{value:.6g}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Recorder(TorchFunctionMode):
    """Records the torch operations run inside it (see the module docstring)."""

    def __init__(self, trace: Trace, modules: nn.Module | None = None) -> None:
        super().__init__()
        self.trace = trace
        self.origin: dict[int, str] = {}  # id(tensor) -> its source key
        self.alive: list[Any] = []  # keeps recorded tensors alive, so that ids are not reused
        self.kept = 0
        self.scopes: list[str] = []
        self.names: dict[int, str] = {}
        if modules is not None:
            for name, module in modules.named_modules():
                self.names[id(module)] = name
            for name, tensor in [*modules.named_parameters(), *modules.named_buffers()]:
                self._leaf(tensor, name)

    def input(self, name: str, tensor: Any) -> None:
        if isinstance(tensor, torch.Tensor):
            self.trace.inputs[name] = self._keep(tensor)
            self.origin[id(tensor)] = f"input:{name}"
            self.alive.append(tensor)

    def _keep(self, tensor: torch.Tensor) -> torch.Tensor | None:
        if tensor.device.type == "meta":
            return tensor.detach()
        self.kept += tensor.numel()
        if self.kept > MAX_ELEMENTS:
            self.trace.truncated = True
            return None
        return tensor.detach().clone()

    def _leaf(self, tensor: torch.Tensor, name: str) -> str:
        key = f"leaf:{name}"
        if key not in self.trace.leaves:
            value = self._keep(tensor)
            if value is not None:
                self.trace.leaves[name] = value
        self.origin[id(tensor)] = key
        self.alive.append(tensor)
        return key

    def _source(self, tensor: torch.Tensor) -> str:
        key = self.origin.get(id(tensor))
        if key is None:
            key = self._leaf(tensor, f"new {len(self.trace.leaves)}")
        return key

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = _name_of(func)
        if name in SKIPPED or name.startswith("_has_compatible") or name.startswith("__torch"):
            return result
        tensors, params = [], []
        for position, value in enumerate(args):
            if isinstance(value, torch.Tensor):
                tensors.append(self._source(value))
            elif isinstance(value, list | tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
                tensors += [self._source(v) for v in value]
            elif position or not isinstance(value, nn.Module):
                params.append((str(position), _short(value)))
        for key, value in kwargs.items():
            if isinstance(value, torch.Tensor):
                tensors.append(self._source(value))
            else:
                params.append((key, _short(value)))
        in_place = name.endswith("_") and not name.endswith("__") or name in ("__setitem__", "__iadd__", "__isub__",
                                                                                "__imul__", "__itruediv__")
        output = args[0] if in_place and args and isinstance(args[0], torch.Tensor) else result
        if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
            outputs = list(output)
        elif isinstance(output, torch.Tensor):
            outputs = [output]
        else:
            return result
        line, user = _caller_lines()
        for tensor in outputs:
            index = len(self.trace.ops)
            self.trace.ops.append(Op(index, name, tuple(tensors), tuple(params), self._keep(tensor), line,
                                     self.scopes[-1] if self.scopes else "", _assigned(line.line) if line else "",
                                     user))
            self.origin[id(tensor)] = f"op:{index}"
            self.alive.append(tensor)
        return result

    # module scopes, through global forward hooks
    def enter(self, module: nn.Module, _args: Any) -> None:
        self.scopes.append(self.names.get(id(module), type(module).__name__))

    def leave(self, module: nn.Module, _args: Any, output: Any) -> None:
        if self.scopes:
            self.scopes.pop()


@contextmanager
def recording(modules: nn.Module | None = None, inputs: Mapping[str, Any] | None = None) -> Iterator[Trace]:
    """Record the torch operations run inside the block. `modules`: the module whose parameters and submodules
    name leaves and scopes; `inputs`: the tensors handed in, by name."""
    trace = Trace()
    recorder = Recorder(trace, modules)
    for name, value in (inputs or {}).items():
        recorder.input(name, value)
    pre = nn.modules.module.register_module_forward_pre_hook(recorder.enter)
    post = nn.modules.module.register_module_forward_hook(recorder.leave)
    try:
        with recorder:
            yield trace
    finally:
        pre.remove()
        post.remove()


# --- matching values ---------------------------------------------------------------------------------------


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
    """Elementwise close: |a - b| <= atol * typical + rtol * |b|, where `typical` is the size of b's ordinary
    values (a fill of -1e9 does not make every other difference small); infinities must agree."""
    if a.shape != b.shape:
        return False
    a, b = as_float64(a), as_float64(b)
    finite = torch.isfinite(a) & torch.isfinite(b)
    ordinary = b[finite & (b.abs() < 1e6)]
    typical = max(ordinary.abs().mean().item() if ordinary.numel() else 1.0, 1e-3)
    same_inf = (a == b) & ~finite
    return bool((same_inf | (finite & ((a - b).abs() <= atol * typical + rtol * b.abs()))).all())


@dataclass
class _Value:
    key: str
    tensor: torch.Tensor
    square: float  # the sum of the squares of its finite entries (a quick first comparison)


def _value(key: str, tensor: torch.Tensor) -> _Value | None:
    if tensor is None or tensor.device.type == "meta" or tensor.numel() == 0 or tensor.is_complex():
        return None
    flat = as_float64(tensor)
    finite = flat[torch.isfinite(flat)]
    return _Value(key, tensor, float((finite * finite).sum()))


def same_values(a: torch.Tensor, b: torch.Tensor, permuted: bool = True) -> bool:
    """The same numbers, in this layout or another: equal, equal after a reshape, or (with `permuted`) equal
    after permuting axes (a transpose)."""
    if a.numel() != b.numel():
        return False
    return _close(a.reshape(-1), b.reshape(-1)) or (permuted and _permutation(a, b) is not None)


def _permutation(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...] | None:
    """The axis order that turns b into a's layout (a == b.permute(order)), if one does."""
    a, b = a.squeeze(), b.squeeze()
    if a.dim() != b.dim() or a.dim() < 2 or a.dim() > 5 or sorted(a.shape) != sorted(b.shape):
        return None
    for order in permutations(range(b.dim())):
        if order == tuple(range(b.dim())):
            continue
        if tuple(b.shape[i] for i in order) == tuple(a.shape) and _close(a, b.permute(order)):
            return order
    return None


class Index:
    """The values of one computation, for finding a given value among them quickly."""

    def __init__(self, trace: Trace) -> None:
        self.values: list[_Value] = []
        for name, tensor in trace.inputs.items():
            self._add(f"input:{name}", tensor)
        for name, tensor in trace.leaves.items():
            self._add(f"leaf:{name}", tensor)
        for op in trace.ops:
            self._add(f"op:{op.index}", op.output)

    def _add(self, key: str, tensor: Any) -> None:
        if isinstance(tensor, torch.Tensor):
            value = _value(key, tensor)
            if value is not None:
                self.values.append(value)

    def find(self, tensor: torch.Tensor | None, layout: bool = False) -> list[str]:
        """Keys of the values equal to `tensor` (in any layout, or with `layout` in this layout or a reshape of
        it: a transpose is then a different value), in order of computation."""
        target = _value("", tensor) if isinstance(tensor, torch.Tensor) else None
        if target is None:
            return []
        found = []
        for value in self.values:
            if value.tensor.numel() != target.tensor.numel():
                continue
            tolerance = 1e-4 * (abs(target.square) + value.tensor.numel()) + 1e-6
            if abs(value.square - target.square) > tolerance:
                continue
            if same_values(value.tensor, target.tensor, permuted=not layout):
                found.append(value.key)
        return found


# --- the departure -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Diagnosis:
    """Where the student's computation departs (`where`: the student's line and the value) and how (`how`)."""

    where: str
    how: str
    line: Frame | None = None

    def text(self) -> str:
        return f"{self.where}: {self.how}" if self.where else self.how


def producer_of(key: str) -> int | None:
    return int(key[3:]) if key.startswith("op:") else None


def _value_of(trace: Trace, key: str) -> torch.Tensor | None:
    kind, _, rest = key.partition(":")
    if kind == "op":
        return trace.ops[int(rest)].output
    return {"input": trace.inputs, "leaf": trace.leaves}.get(kind, {}).get(rest)


def _final_key(trace: Trace, final: torch.Tensor | None) -> int | None:
    """The reference operation whose result is the final value (the last one equal to it)."""
    if final is None:
        return len(trace.ops) - 1 if trace.ops else None
    for op in reversed(trace.ops):
        if op.output is not None and op.output.shape == final.shape and _close(op.output, final, 1e-9, 1e-12):
            return op.index
    return len(trace.ops) - 1 if trace.ops else None


def ancestors_of(trace: Trace, last: int) -> set[int]:
    found, pending = set(), [last]
    while pending:
        index = pending.pop()
        if index in found:
            continue
        found.add(index)
        for source in trace.ops[index].sources:
            producer = producer_of(source)
            if producer is not None:
                pending.append(producer)
    return found


@dataclass
class Context:
    """What the check knows that names things: sizes of axes by name ("query": 6), quantities that may be a
    factor ("d_k": 8, "d_model": 16, "p": 0.1), words for values (reference keys or variables -> words)."""

    sizes: Mapping[str, int] = field(default_factory=dict)
    quantities: Mapping[str, float] = field(default_factory=dict)
    words: Mapping[str, str] = field(default_factory=dict)
    # the reference's variable names the student's code does not have (set by `diagnose`): never said, since a
    # student who named their values otherwise has never seen them
    private: frozenset[str] = frozenset()

    def axis(self, size: int, dim: int) -> str:
        names = [name for name, value in self.sizes.items() if value == size]
        return f"the {names[0]} axis" if len(names) == 1 else f"axis {dim} (of size {size})"


def diagnose(student: Trace, reference: Trace, *, context: Context | None = None,
             student_final: torch.Tensor | None = None, reference_final: torch.Tensor | None = None
             ) -> Diagnosis | None:
    """Where and how the student's computation first departs from the reference's (None when it cannot say)."""
    context = context or Context()
    if not reference.ops:
        return None
    context = replace(context, private=frozenset(_names(reference) - _names(student)))
    widest = max((op.output.dim() for op in reference.ops if isinstance(op.output, torch.Tensor)), default=0)
    grown = axis_growth(student, widest)
    if grown is not None:
        return grown
    index = Index(student)
    final = _final_key(reference, reference_final)
    if final is None:
        return None
    useful = ancestors_of(reference, final)
    matched: dict[int, list[str]] = {}
    dropped: dict[int, set[str]] = {}  # per reference op: the student's values that are not its result
    for op in reference.ops:
        if op.index not in useful:
            continue
        found = index.find(op.output, layout=op.name in PERMUTING or op.name in IDENTITY_WHEN_SAME)
        if not found and op.name in IDENTITY_WHEN_SAME and op.sources:
            producer = producer_of(op.sources[0])
            if producer is not None and matched.get(producer):
                found = matched[producer]
        kept = _redone_otherwise(op, found, reference, student)
        producer = producer_of(op.sources[0]) if op.sources else None
        if op.name in LAYOUT and producer in dropped:  # a reshape of a step's input is not its result either
            kept = [key for key in found if key not in dropped[producer]]
        if len(kept) < len(found):
            dropped[op.index] = set(found) | dropped.get(producer, set())
        matched[op.index] = kept
    consumers: dict[int, list[int]] = {}
    for op in reference.ops:
        for source in op.sources:
            producer = producer_of(source)
            if producer is not None:
                consumers.setdefault(producer, []).append(op.index)
    bad: dict[int, bool] = {}
    for op in reversed(reference.ops):
        if op.index not in useful:
            continue
        unmatched = not matched.get(op.index)
        downstream = [c for c in consumers.get(op.index, []) if c in useful]
        bad[op.index] = unmatched and (op.index == final or any(bad.get(c, False) for c in downstream))
    if not bad.get(final, False):  # the final value is among the student's: anything after it?
        return _after_the_end(reference.ops[final], matched.get(final, []), student, student_final, context,
                              reference)
    departure = next((op for op in reference.ops if bad.get(op.index)  # the first whose arguments the student has
                      and all(producer_of(s) is None or matched.get(producer_of(s)) for s in op.sources)), None)
    if departure is None:
        return None
    return _explain(departure, reference, student, index, matched, context)


def _redone_otherwise(op: Op, found: list[str], reference: Trace, student: Trace) -> list[str]:
    """`found`, or nothing when `op` changes nothing on this input (a division by a length penalty of 1, a mask
    that masks nothing) and the student applies the same kind of operation to that value and gets something
    else: the values found are then the step's input, not its result."""
    if not found or op.name in LAYOUT or op.name in IDENTITY_WHEN_SAME or not isinstance(op.output, torch.Tensor):
        return found
    unchanged = any(isinstance(value, torch.Tensor) and value.shape == op.output.shape
                    and same_values(value, op.output, permuted=False)
                    for value in (_value_of(reference, source) for source in op.sources))
    redone = any(_same_kind(other, op) and f"op:{other.index}" not in found
                 and any(source in found for source in other.sources) for other in student.ops)
    return [] if unchanged and redone else found


def _names(trace: Trace) -> set[str]:
    """The variables a computation's lines assign (`pe` for `pe[:, 0::2] = ...`)."""
    return {name.strip() for op in trace.ops if op.variable
            for name in re.sub(r"\[.*\]", "", op.variable).split(",") if name.strip()}


def _shape_words(tensor: torch.Tensor) -> str:
    return "(" + ", ".join(map(str, tensor.shape)) + ")"


def _operand_words(key: str, student: Trace) -> str:
    """A value the student's code made: by its variable when the line's last operation made it, else by the
    operation that made it inside a longer line ('the comparison')."""
    producer = producer_of(key)
    if producer is not None and not _last_on_its_line(student.ops[producer], student):
        return f"the {operation_words(student.ops[producer].name)}'s result"
    return _student_value_words(key, student)


def axis_growth(student: Trace, widest: int | None = None) -> Diagnosis | None:
    """The first operation of the student's whose result gains an axis by broadcasting: its data argument has
    fewer axes than the result and another argument brings the extra ones (a mask with one axis too many, say),
    with the operation that gave that argument its extra axis. With `widest` (the most axes any value of the
    paper's computation has), only a result with more axes than that counts. None when there is none."""
    for op in student.ops:
        if not isinstance(op.output, torch.Tensor) or len(op.sources) < 2 or op.name in LAYOUT:
            continue
        data = _value_of(student, op.sources[0])
        if not isinstance(data, torch.Tensor) or op.output.dim() <= data.dim() or (
                widest is not None and op.output.dim() <= widest):
            continue
        wider = [key for key in op.sources[1:]
                 if isinstance(value := _value_of(student, key), torch.Tensor) and value.dim() == op.output.dim()]
        if not wider:
            continue
        key, made = wider[0], None
        while producer_of(key) is not None:  # back to the operation that gave it the extra axis
            producer = student.ops[producer_of(key)]
            before = _value_of(student, producer.sources[0]) if producer.sources else None
            if isinstance(before, torch.Tensor) and before.dim() < producer.output.dim():
                made = producer
                break
            if not producer.sources:
                break
            key = producer.sources[0]
        value = _value_of(student, wider[0])
        text = (f"the {operation_words(op.name)} meets {_operand_words(op.sources[0], student)}, shape "
                f"{_shape_words(data)}, and {_operand_words(wider[0], student)}, shape {_shape_words(value)}, "
                f"with {value.dim()} axes: broadcasting gives the result {value.dim() - data.dim()} axis too many, "
                f"{_shape_words(op.output)}, and every value computed from it keeps it")
        if made is not None:
            text += f"; the extra axis comes from the {operation_words(made.name)} {student_line(made)}"
        return Diagnosis(student_line(op), text, op.line)
    return None


OPERATION_WORDS = {
    "mul": "product", "__mul__": "product", "__rmul__": "product", "matmul": "matrix product",
    "__matmul__": "matrix product", "bmm": "matrix product", "add": "sum", "__add__": "sum", "__radd__": "sum",
    "sub": "difference", "__sub__": "difference", "__rsub__": "difference", "div": "division",
    "__truediv__": "division", "__rtruediv__": "division", "exp": "exponential", "log": "logarithm",
    "softmax": "softmax", "log_softmax": "log-softmax", "masked_fill": "masked fill", "__getitem__": "slice",
    "__setitem__": "assignment", "linear": "linear layer", "layer_norm": "layer norm", "dropout": "dropout",
    "relu": "ReLU", "tanh": "tanh", "sin": "sin", "cos": "cos", "pow": "power", "__pow__": "power",
    "__rpow__": "power", "sqrt": "square root", "arange": "arange", "transpose": "transpose", "view": "view",
    "reshape": "reshape", "permute": "permute", "sum": "sum", "mean": "mean", "embedding": "embedding lookup",
    "cat": "concatenation", "stack": "stack", "tril": "lower triangle", "triu": "upper triangle",
    "neg": "negation", "__neg__": "negation",
    "__invert__": "negation (~)", "logical_not": "negation (~)",
    "eq": "comparison", "__eq__": "comparison", "ne": "comparison",
    "__ne__": "comparison", "unsqueeze": "unsqueeze", "argmax": "argmax", "cross_entropy": "cross-entropy",
}


def operation_words(name: str) -> str:
    return OPERATION_WORDS.get(name, f"`{name}`")


def _last_on_its_line(op: Op, trace: Trace) -> bool:
    """Whether op makes the value its line assigns (the last operation run from that line)."""
    if op.line is None:
        return False
    following = trace.ops[op.index + 1:op.index + 2]
    return not (following and following[0].line == op.line)


def _module_output(op: Op, trace: Trace | None) -> bool:
    """Whether op is the last operation of a call of its module (its output)."""
    if not op.scope or trace is None:
        return False
    following = trace.ops[op.index + 1] if op.index + 1 < len(trace.ops) else None
    return following is None or not (following.scope == op.scope or following.scope.startswith(op.scope + "."))


def _after_the_end(last: Op, keys: list[str], student: Trace, student_final: torch.Tensor | None,
                   context: Context, reference: Trace) -> Diagnosis | None:
    """The student computes the expected result, then does more to it: which operations, on which lines."""
    if student_final is None or not keys or same_values(student_final, last.output):
        return None
    chain: list[Op] = []
    frontier = {keys[0]}
    for op in student.ops:
        if set(op.sources) & frontier:
            chain.append(op)
            frontier.add(f"op:{op.index}")
            if op.output is not None and same_values(op.output, student_final, permuted=False):
                break
    else:
        return None
    steps = [op for op in chain if op.name not in LAYOUT] or chain
    where = student_line(steps[0])
    # a step's line is said where it is not the line the message starts with (quoted twice, it reads as two)
    words = ", then ".join(f"a {operation_words(op.name)}" + (f" {on_line(op)}" if student_line(op) != where
                                                              else "") for op in steps[:3])
    return Diagnosis(where, f"your code computes {_reference_words(last, context, reference)} "
                     f"as the reference does, then applies {words} to it: the reference stops there", steps[0].line)


def _reference_words(op: Op, context: Context, trace: Trace | None = None) -> str:
    """How to call the result of a reference operation in a message."""
    function = op.line.name if op.line is not None else ""
    for key in (f"op:{op.index}", f"{function}:{op.variable}" if op.variable else "", op.variable, op.scope):
        if key and key in context.words:
            return context.words[key]
    if _module_output(op, trace):
        return f"the output of self.{op.scope}"
    variable = op.variable if op.variable and "," not in re.sub(r"\[.*\]", "", op.variable) else ""
    if re.sub(r"\[.*\]", "", variable).strip() in context.private:  # a name of the reference's own
        variable = ""
    if not variable and op.line is not None and op.line.line.startswith("return") and op.line.name != "forward" \
            and (trace is None or _last_on_its_line(op, trace)):
        return f"what `{op.line.name}` returns"
    if variable and op.name == "__setitem__":
        return f"`{variable.split('[')[0]}` once `{variable}` is written"
    if variable and (trace is None or _last_on_its_line(op, trace)):
        if trace is not None:
            lines = {}
            for o in trace.ops:  # the assignments of this name in this function, one per line
                if o.variable == variable and o.line is not None and o.line.name == function \
                        and _last_on_its_line(o, trace):
                    lines.setdefault(o.line.lineno, o)
            same = [lines[number] for number in sorted(lines)]
            if op not in same and op.line is not None and op.line.lineno in lines:
                op = lines[op.line.lineno]
            if len(same) > 1 and same[0] is op:
                return f"`{variable}` as first computed (before the {operation_words(same[1].name)})"
            if len(same) > 1 and op in same:
                return f"`{variable}` after the {operation_words(op.name)}"
        return f"`{variable}`"
    table = op.sources[0].removeprefix("leaf:") if op.name == "__getitem__" and op.sources else ""
    if table and table != op.sources[0] and not table.startswith("new") and table.split(".")[-1] not in context.private:
        return f"the slice of `{table}`"  # a parameter's or buffer's rows, named by the module that holds them
    if variable:
        return f"the {operation_words(op.name)} that goes into `{variable}`"
    if op.scope:
        return f"the output of `{op.scope}`"
    words = operation_words(op.name)
    return f"the result of {words}" if words.startswith("`") else f"the {words}"


def _source_words(key: str, trace: Trace, context: Context) -> str:
    kind, _, rest = key.partition(":")
    if kind == "input":
        return context.words.get(key, f"the input `{rest}`")
    if kind == "leaf":
        return context.words.get(key, f"`{rest}`" if not rest.startswith("new") else "a constant tensor")
    if kind == "op":
        return _reference_words(trace.ops[int(rest)], context, trace)
    return "a value"


def _frame(op: Op | None) -> Frame | None:
    """The student's line an operation ran on: the innermost line of the student's, else the calling line."""
    return (op.user or op.line) if op is not None else None


def student_line(op: Op | None) -> str:
    frame = _frame(op)
    if frame is None:
        return ""
    return f"in `{frame.name}`, line {frame.lineno}" + (f" (`{frame.line}`)" if frame.line else "")


def line_words(name: str, lineno: int | str, line: str, where: str = "on") -> str:
    """A line of the student's said inside a sentence, without nested brackets: "on line 21 of `score`
    (`scores = ...`)"; `where` "after" for the line after which a step is missing."""
    return f"{where} line {lineno} of `{name}`" + (f" (`{line}`)" if line else "")


def on_line(op: Op | None) -> str:
    frame = _frame(op)
    return line_words(frame.name, frame.lineno, frame.line) if frame is not None else ""


def _result_words(step: str) -> str:
    """What a missing step does to the value it is missing from, from `relation`'s words ("0.4472 × the expected
    values (the factor is 1/√d_k)" -> "which multiplies it by 0.4472 (the factor is 1/√d_k)")."""
    factor = re.fullmatch(r"(\S+) × the expected values(?: \(the factor is (.+)\))?", step)
    if factor:
        return f"which multiplies it by {factor.group(1)}" + (f" (the factor is {factor.group(2)})"
                                                              if factor.group(2) else "")
    return f"which gives {step.replace('the expected values', 'it')}"


def _after_line(op: Op) -> str:
    """Where a missing step belongs: "after line 3 of `forward` (`x = ...`)"."""
    frame = _frame(op)
    return line_words(frame.name, frame.lineno, frame.line, where="after")


def _wanted(sources: Sequence[str], reference: Trace, matched: dict[int, list[str]], index: Index) -> set[str]:
    """The student's values that stand for these arguments of a reference operation (the sources themselves, or
    what matched them)."""
    wanted: set[str] = set()
    for source in sources:
        producer = producer_of(source)
        if producer is not None:
            wanted.update(matched.get(producer, []))
        else:
            wanted.update([source, *index.find(_value_of(reference, source))])
    return wanted


def _direct(departure: Op, student: Trace, reference: Trace, matched: dict[int, list[str]], index: Index
            ) -> list[Op]:
    """The student's operations that take one of the departure's arguments (for a tensor made from nothing,
    such as `arange`, the student's operations of the same kind)."""
    if not departure.sources:
        return [op for op in student.ops if op.name == departure.name and not op.sources]
    wanted = _wanted(departure.sources, reference, matched, index)
    return [op for op in student.ops if set(op.sources) & wanted]


def _counterpart(departure: Op, student: Trace, reference: Trace, direct: list[Op], context: Context) -> Op | None:
    """The student's operation that does what the departure does: among the operations that take the same
    arguments (`direct`: or, for a tensor made from nothing such as `arange`, the student's operations of the same
    kind) and the unmatched ones right after them, the one whose value is most plainly related to the expected
    value; then the one of the same kind; then the first."""
    reference_index = Index(reference)
    fresh_keys = {f"op:{op.index}" for op in student.ops if not reference_index.find(op.output)}
    pool: list[Op] = []
    for op in direct:
        pool.append(op)
        frontier = [f"op:{op.index}"]
        for _ in range(3):  # what the student computes next from it, while it is still unmatched
            following = [o for o in student.ops if set(o.sources) & set(frontier) and f"op:{o.index}" in fresh_keys]
            pool += following
            frontier = [f"op:{o.index}" for o in following]
    pool = list({op.index: op for op in pool}.values())
    if not pool:
        return None
    expected = departure.output

    def rank(op: Op) -> tuple:
        how = relation(op.output, expected, context, departure) if op.output is not None and expected is not None \
            else ""
        fresh = f"op:{op.index}" in fresh_keys
        return (not fresh, "factor is" not in how, not how, op.name != departure.name,
                op.name in LAYOUT and departure.name not in LAYOUT, op.index)

    return min(pool, key=rank)


PARAMETERS = {  # positions of tensor methods' other arguments (0 is the tensor itself)
    "masked_fill": {"2": "value"}, "masked_fill_": {"2": "value"}, "softmax": {"1": "dim"},
    "log_softmax": {"1": "dim"}, "transpose": {"1": "dim0", "2": "dim1"}, "div": {"1": "divisor"},
    "__truediv__": {"1": "divisor"}, "__rtruediv__": {"1": "numerator"}, "mul": {"1": "factor"},
    "__mul__": {"1": "factor"}, "__rmul__": {"1": "factor"}, "add": {"1": "other"}, "__add__": {"1": "other"},
    "__radd__": {"1": "other"}, "sub": {"1": "other"}, "__sub__": {"1": "other"}, "__rsub__": {"1": "other"},
    "pow": {"1": "exponent"}, "__pow__": {"1": "exponent"}, "__rpow__": {"1": "base"}, "__getitem__": {"1": "index"},
    "__setitem__": {"1": "index"}, "unsqueeze": {"1": "dim"}, "sum": {"1": "dim"}, "mean": {"1": "dim"},
    "tril": {"1": "diagonal"}, "triu": {"1": "diagonal"}, "view": {"1": "shape"}, "reshape": {"1": "shape"},
    "topk": {"1": "k"}, "full": {"1": "fill_value"}, "__eq__": {"1": "other"}, "__ne__": {"1": "other"},
    "eq": {"1": "other"}, "ne": {"1": "other"}, "__lt__": {"1": "other"}, "__gt__": {"1": "other"},
}


def _parameter(name: str, key: str) -> str:
    if not key.isdigit():
        return f"`{key}`"
    named = PARAMETERS.get(name, {}).get(key)
    if named in ("divisor", "numerator", "factor", "base", "exponent"):  # words, not PyTorch's parameter names
        return f"the {named}"
    if named == "other":  # PyTorch's name for the second operand says nothing to a student
        return "the other operand"
    return f"`{named}`" if named else f"argument {int(key) + 1}"


def _creation_difference(departure: Op, counterpart: Op) -> str:
    """The arguments that differ between two operations of the same kind ('' when the same)."""
    if counterpart.name != departure.name:
        return ""
    mine, wanted = dict(counterpart.params), dict(departure.params)
    if set(mine) != set(wanted):
        return ""
    differ = [(key, mine[key], value) for key, value in wanted.items() if mine[key] != value
              and key not in ("dtype", "device", "requires_grad", "layout", "out")]
    if not differ or len(differ) > 2:
        return ""
    return "; ".join(f"{_parameter(departure.name, key)} {got} where {value} is expected"
                     for key, got, value in differ)


def _explain(departure: Op, reference: Trace, student: Trace, index: Index, matched: dict[int, list[str]],
             context: Context) -> Diagnosis:
    """What the student computed instead of the departure, tried in this order: the same operation with other
    settings; the same operation on another value; the step left out; the operation whose value is plainly
    related to the expected one; another operation in its place (or in another order)."""
    expected = departure.output
    what = _reference_words(departure, context, reference)
    direct = _direct(departure, student, reference, matched, index)
    same_kind = [op for op in direct if op.name == departure.name]
    place = _place(departure, reference)
    same_kind += [op for op in student.ops if op.name == departure.name and op not in same_kind
                  and _place(op, student) == place]
    whole = [op for op in direct if len(departure.sources) > 1 and op.name not in LAYOUT and all(
        set(op.sources) & _wanted([source], reference, matched, index) for source in departure.sources)]
    deferred = None
    for same in same_kind:  # 1. same operation, same arguments, other settings
        if _same_arguments(departure, same, reference, student) and same.output is not None and expected is not None:
            how = relation(same.output, expected, context, departure)
            settings = _creation_difference(departure, same)
            if settings or how:
                text = _is(what, how)
                if settings:
                    text += f": the {operation_words(departure.name)} has {settings}"
                found = Diagnosis(student_line(same), text, same.line)
                if _plain(how) or (settings and not how):
                    return found
                deferred = deferred or found
    unused = _computed_but_unused(departure, student, index, context, reference)  # a value made and dropped
    if unused is not None:
        return unused
    for same in same_kind:  # 2. same operation, another value
        if same not in direct and whole and _downstream(same, departure, student, reference):
            continue  # found by its place alone, it reads what the paper makes after the departure while another
            # operation takes the departure's arguments: a later step, not the departure's counterpart
        if _accounted_for(same, departure, student, reference):
            continue  # it makes another value of the paper's, and nothing else of the student's does: its own step
        argument = _wrong_argument(departure, same, reference, student, matched, context)
        if argument:
            # an operation found by its place alone (the n-th of its kind there), not by its arguments, is weak
            # evidence: with a step left out, the n-th is the next one's (a later layer's sum, on another line); a
            # later step of the paper's that receives, on another line, a value from before the departure says the
            # step is missing (on the same line, the step is there, in another order: the reading above)
            bypassed = _bypassed(departure, reference, student, index, context) if same not in direct else None
            if bypassed is not None and bypassed.line is not None and same.line is not None \
                    and bypassed.line.lineno != same.line.lineno:
                return bypassed
            return Diagnosis(student_line(same), argument + _likewise(departure, same, reference, student, matched,
                                                                     context), same.line)
    unused = _unused_input(departure, student, reference, context)
    if unused is not None:
        return unused
    uncalled = _uncalled_module(departure, student, reference, index, context)
    if uncalled is not None:
        return uncalled
    missing = _missing_step(departure, reference, student, index, context) or _bypassed(
        departure, reference, student, index, context)  # 3.
    if missing is not None:
        return missing
    again = _applied_again(direct, student, reference, matched)
    if again is not None:
        return again
    counterpart = _counterpart(departure, student, reference, direct, context)
    got = counterpart.output if counterpart is not None else None
    how = relation(got, expected, context, departure) if got is not None and expected is not None else ""
    if deferred is not None and (counterpart is None or not _plain(how)):
        return deferred
    if counterpart is None:
        return Diagnosis(f"the step that computes {what}",
                         f"your code never computes {what} (the {operation_words(departure.name)} of "
                         f"{_arguments_words(departure, reference, context)}): it is missing, or computed from "
                         "other values")
    where = student_line(counterpart)
    if counterpart.name == departure.name or (how and "factor is" in how):  # 4.
        text = _is(what, how)
        settings = _creation_difference(departure, counterpart)
        if settings and (not how or not departure.sources):
            text += f" ({operation_words(departure.name)} with {settings})"
        return Diagnosis(where, text, counterpart.line)
    first = _first_on(departure, student, reference, matched, index) or counterpart  # 5.
    if whole and first not in whole:  # an operation that takes every argument of the departure stands in its place
        first = counterpart = whole[0]
        where, got = student_line(first), first.output
        how = relation(got, expected, context, departure) if got is not None and expected is not None else ""
    if first.name == departure.name:
        return Diagnosis(where, _is(what, how), counterpart.line)
    later = next((op for op in student.ops if op.index > first.index and op.name == departure.name
                  and _takes_result(op, first, student)), None)
    text = (f"your code applies the {operation_words(first.name)} where the reference applies the "
            f"{operation_words(departure.name)} to {_arguments_words(departure, reference, context)}")
    if later is not None:
        text += (f"; your {operation_words(departure.name)} comes later, {on_line(later)}: the two steps "
                 "are in another order")
    elif how and first is counterpart and got is not None and expected is not None and got.shape != expected.shape:
        # two different steps: their shapes are compared, never one called the expected value of the other
        text += (f"; your {operation_words(first.name)} gives shape {tuple(got.shape)} where the reference's "
                 f"{operation_words(departure.name)} gives {tuple(expected.shape)}")
    elif how and first is counterpart:
        text += f"; the result is {how}"
    return Diagnosis(student_line(first), text, first.line)


def _likewise(departure: Op, same: Op, reference: Trace, student: Trace, matched: dict[int, list[str]],
              context: Context) -> str:
    """A second operation of the departure's kind that is fed another of the paper's values than the reference
    feeds it, while its own arguments are all there (keys and values both projected from the queries): the
    words that name it too, '; likewise, on line 48 of `forward` (...), ...'; '' when there is none."""
    for other in reference.ops:
        if other is departure or other.name != departure.name or other.index not in matched or matched[other.index]:
            continue  # only another step whose result the student lacks
        if not all(producer_of(source) is None or matched.get(producer_of(source)) for source in other.sources):
            continue  # its arguments are wrong already: a consequence of the first departure, not a second one
        twin = next((op for op in student.ops if op is not same and op.name == other.name
                     and _place(op, student) == _place(other, reference)), None)
        words = _wrong_argument(other, twin, reference, student, matched, context,
                                substitutions_only=True) if twin is not None else ""
        if words:
            return f"; likewise, {on_line(twin)}, {words}"
    return ""


def _applied_again(direct: list[Op], student: Trace, reference: Trace, matched: dict[int, list[str]]
                   ) -> Diagnosis | None:
    """A step of the reference's applied a second time to its own result: one of the student's operations on the
    departure's data is of the same kind as (and made with the same weights as) the reference's operation that
    made that data (`self.W_k(self.W_k(k))`)."""
    for op in direct:
        if op.name in LAYOUT or not isinstance(op.output, torch.Tensor):
            continue
        for position, source in enumerate(op.sources):
            value = _value_of(student, source)
            if value is None or (value.shape == op.output.shape and same_values(op.output, value, permuted=False)):
                continue  # an operation that changes nothing here (dropout in eval mode) is no step applied again
            made = [reference.ops[index] for index, keys in matched.items() if source in keys]
            if any(earlier.name == op.name and earlier.sources[:position] + earlier.sources[position + 1:]
                   == op.sources[:position] + op.sources[position + 1:] for earlier in made):
                return Diagnosis(student_line(op), f"your code applies the {operation_words(op.name)} again to its "
                                 "own result: the reference applies it once", op.line)
    return None


def _accounted_for(op: Op, departure: Op, student: Trace, reference: Trace) -> bool:
    """Whether the student's `op` computes a value the reference computes elsewhere (not the departure's), and no
    other operation of the student's computes it too: then `op` is the student's version of that other step (the
    query projection, say), not the departure's with another argument. With a twin (the query projection made
    twice, once where the value projection belongs), one of the two stands in the departure's place."""
    if op.output is None or not isinstance(op.output, torch.Tensor) or not _informative(op.output):
        return False
    if not [key for key in Index(reference).find(op.output) if key != f"op:{departure.index}"]:
        return False
    return not any(other is not op and other.name == op.name and isinstance(other.output, torch.Tensor)
                   and other.output.shape == op.output.shape and same_values(other.output, op.output)
                   for other in student.ops)


def _takes_result(op: Op, first: Op, student: Trace) -> bool:
    """Whether `op` receives the result of `first` (directly, or through reshapes and views only)."""
    made = {f"op:{first.index}"}
    for between in student.ops[first.index + 1:op.index]:
        if between.name in LAYOUT and set(between.sources) & made:
            made.add(f"op:{between.index}")
    return bool(set(op.sources) & made)


def _downstream(op: Op, departure: Op, student: Trace, reference: Trace) -> bool:
    """Whether the student's `op` is computed from a step that sits (same module, function and rank of its kind)
    where the reference has a step made from the departure's value: then `op` comes after the departure in the
    computation (the next layer's sum, when the departure's sum was written as a difference) and is not the
    student's version of the departure."""
    after, pending = set(), [departure.index]
    while pending:  # everything the departure's value flows into, in the reference
        current = pending.pop()
        for later in reference.ops[current + 1:]:
            if f"op:{current}" in later.sources and later.index not in after:
                after.add(later.index)
                pending.append(later.index)
    places = {_place(reference.ops[index], reference) for index in after}
    return any(_place(student.ops[index], student) in places for index in ancestors_of(student, op.index) - {op.index})


def _is(what: str, how: str) -> str:
    """'`scores` is 2 × the expected values', or '... has other values than expected' when no relation is found."""
    return f"{what} " + (f"is {how}" if how else "has other values than expected")


def _place(op: Op, trace: Trace) -> tuple[str, str, int]:
    """Where an operation sits: its module, its function and how many of its kind came before it there."""
    function = op.line.name if op.line is not None else ""
    count = sum(1 for o in trace.ops[:op.index] if o.name == op.name and o.scope == op.scope
                and (o.line.name if o.line is not None else "") == function)
    return op.scope, function, count


def _unused_input(departure: Op, student: Trace, reference: Trace, context: Context) -> Diagnosis | None:
    """The departure needs an input of the computation that the student's code never reads."""
    used = {source for op in student.ops for source in op.sources}
    for source in departure.sources:
        if source.startswith("input:") and source not in used and source in {f"input:{n}" for n in student.inputs}:
            words = _source_words(source, reference, context)
            made = _reference_words(departure, context, reference)
            if made == f"`{source.partition(':')[2]}`":  # `x = x + ...`: "uses `x` to compute `x`" says nothing
                made = f"the {operation_words(departure.name)} assigned to {made}"
            function = departure.line.name if departure.line is not None and departure.line.name else ""
            entry = next((op.line.name for op in reference.ops if op.line is not None), "")  # the checked function
            if function and entry and function != entry:  # used by a function the checked one calls
                return Diagnosis("", f"your code never uses {words}: the reference hands it on to `{function}`, "
                                 f"which uses it to compute {made}")
            inside = f" (in `{function}`)" if function else ""
            return Diagnosis("", f"your code never uses {words}: the reference uses it{inside} to compute {made}")
    return None


def _uncalled_module(departure: Op, student: Trace, reference: Trace, index: Index, context: Context
                     ) -> Diagnosis | None:
    """The departure runs inside a submodule the student's forward never calls."""
    if not departure.scope:
        return None
    top = departure.scope.split(".")[0]
    if any(op.scope == top or op.scope.startswith(top + ".") for op in student.ops):
        return None
    first = next(op for op in reference.ops if op.scope == top or op.scope.startswith(top + "."))
    data = _value_of(reference, first.sources[0]) if first.sources else None
    takes = ""
    if data is not None and student.ops and student.ops[-1].output is not None \
            and same_values(student.ops[-1].output, data):
        takes = f"; your code returns {_source_words(first.sources[0], reference, context)} as it is"
    return Diagnosis("", f"self.{top} is never called: the reference applies it to "
                         f"{_source_words(first.sources[0], reference, context) if first.sources else 'its input'}"
                         + takes)


def _plain(how: str) -> bool:
    """A relation worth stating on its own: anything but an unnamed factor."""
    return bool(how) and not (re.match(r"^-?[\d.]+(e[-+]?\d+)? × the expected values$", how) is not None)


def _same_arguments(departure: Op, op: Op, reference: Trace, student: Trace) -> bool:
    if len(op.sources) != len(departure.sources):
        return False
    for wanted, got in zip(departure.sources, op.sources, strict=True):
        wanted_value, got_value = _value_of(reference, wanted), _value_of(student, got)
        if wanted_value is None or got_value is None or not same_values(got_value, wanted_value):
            return False
    return True


def _computed_but_unused(departure: Op, student: Trace, index: Index, context: Context, reference: Trace
                         ) -> Diagnosis | None:
    """The student computes the departure's value and then never uses it (`scores.masked_fill(...)` without
    assigning the result): the value is there, nothing downstream reads it."""
    used = {source for op in student.ops for source in op.sources}
    values = [departure] + [reference.ops[producer] for source in departure.sources
                            if (producer := producer_of(source)) is not None]
    for value in values:  # the departure itself, or a value it needs
        keys = index.find(value.output)
        if not keys or any(key in used for key in keys):
            continue
        producer = producer_of(keys[-1])
        if producer is None or student.ops[producer].name in LAYOUT:
            continue
        op = student.ops[producer]
        if _returned(op.output, student):  # what the code returns is used: a step after it is missing instead
            continue
        return Diagnosis(student_line(op), f"your code computes {_reference_words(value, context, reference)} "
                         f"here, but nothing uses the result: it is not assigned, or a later line reads the value "
                         "from before it", op.line)
    return None


def _first_on(departure: Op, student: Trace, reference: Trace, matched: dict[int, list[str]], index: Index
              ) -> Op | None:
    """The student's first operation on the departure's first argument (the data it transforms)."""
    if not departure.sources:
        return None
    keys = _wanted(departure.sources[:1], reference, matched, index)
    for op in student.ops:  # the first operation that does something to it (reshapes and views pass it on)
        if set(op.sources) & keys:
            if op.name in LAYOUT:
                keys.add(f"op:{op.index}")
                continue
            return op
    return None


def _missing_step(departure: Op, reference: Trace, student: Trace, index: Index, context: Context
                  ) -> Diagnosis | None:
    """The departure left out: an operation the reference applies to the departure's result is applied, in the
    student's code, to the departure's argument itself."""
    if not departure.sources or departure.output is None:
        return None
    data = _value_of(reference, departure.sources[0])
    if data is None:
        return None
    keys = set(index.find(data))
    data_words = _source_words(departure.sources[0], reference, context)
    function = departure.line.name if departure.line is not None else None
    consumers = [op for op in reference.ops if f"op:{departure.index}" in op.sources]
    if not consumers:  # the departure is the last step: does the student's code return one of its arguments?
        ended = _ended_before(departure, reference, student, context)
        if ended is not None:
            return ended
    for consumer in consumers:
        position = consumer.sources.index(f"op:{departure.index}")
        for op in student.ops:
            if op.name != consumer.name or len(op.sources) != len(consumer.sources):
                continue
            if op.sources[position] not in keys:
                continue
            later = next((o for o in student.ops if o.index > op.index and o.name == departure.name
                          and (o.line.name if o.line is not None else None) == function), None)
            if later is not None:
                return Diagnosis(student_line(later),
                                 f"your {operation_words(departure.name)} comes after your "
                                 f"{operation_words(consumer.name)}, {on_line(op)}: the reference applies the "
                                 f"{operation_words(departure.name)} first, to {data_words}, and the "
                                 f"{operation_words(consumer.name)} to its result", later.line)
            step = relation(departure.output, data, context, departure) if departure.output.shape == data.shape else ""
            place = f"in `{function}`, " if function else ""
            made = producer_of(op.sources[position])  # where the student's code makes the value the step belongs to
            made_op = student.ops[made] if made is not None else None
            text = (f"a step is missing: {place}the reference applies a {operation_words(departure.name)} to "
                    f"{data_words}" + (f", {_result_words(step)}" if step else "")
                    + f"; your {operation_words(consumer.name)} {on_line(op)} receives it without the "
                    f"{operation_words(departure.name)}")
            if made_op is not None and made_op.line is not None and made_op.line.name == function:
                return Diagnosis(_after_line(made_op), text, made_op.line)
            return Diagnosis(student_line(op), text, op.line)
    return None


def _returned(value: torch.Tensor | None, student: Trace) -> bool:
    """Whether `value` is (in this layout or a reshape of it) what the student's code returns, or one of the
    tensors it returns."""
    output = student.output
    returned = [output] if isinstance(output, torch.Tensor) else \
        [item for item in output if isinstance(item, torch.Tensor)] if isinstance(output, tuple | list) else []
    return value is not None and any(
        item.numel() == value.numel() and same_values(item.detach(), value, permuted=False) for item in returned)


def _ended_before(departure: Op, reference: Trace, student: Trace, context: Context) -> Diagnosis | None:
    """The reference's last step left out: the student's code returns one of its arguments as it is (the
    division `x / rms` where the reference goes on to multiply it by the gain)."""
    for position, source in enumerate(departure.sources):
        data = _value_of(reference, source)
        if data is None or not _informative(data) or not _returned(data, student):
            continue
        last = next((op for op in reversed(student.ops) if op.output is not None
                     and same_values(op.output, data, permuted=False)), None)
        others = [_source_words(other, reference, context) for i, other in enumerate(departure.sources)
                  if i != position]
        using = f" with {', '.join(dict.fromkeys(others))}" if others else ""
        return Diagnosis(student_line(last), f"a step is missing at the end: your code returns "
                         f"{_source_words(source, reference, context)}, and the reference applies one more step to it, "
                         f"a {operation_words(departure.name)}{using}, to get its output", last.line if last else None)
    return None


def _bypassed(departure: Op, reference: Trace, student: Trace, index: Index, context: Context) -> Diagnosis | None:
    """Steps left out as a whole: a later operation of the paper's, downstream of the departure, that the student
    also performs at the same place, receives there a value the paper only had before the departure's steps
    (`lengths` where the paper gives `lengths + (~finished).long()`). Read from the values: the student's
    argument equals an ancestor of the paper's argument."""
    chain, pending = {departure.index}, [departure.index]
    while pending:  # everything the departure's value flows into
        current = pending.pop()
        for op in reference.ops[current + 1:]:
            if f"op:{current}" in op.sources and op.index not in chain:
                chain.add(op.index)
                pending.append(op.index)
    reference_index = Index(reference)
    for later in sorted(chain - {departure.index}):
        wanted_op = reference.ops[later]
        place = _place(wanted_op, reference)
        for op in student.ops:
            if op.name != wanted_op.name or _place(op, student) != place or len(op.sources) != len(wanted_op.sources):
                continue
            for position, source in enumerate(wanted_op.sources):
                producer = producer_of(source)
                if producer is None or producer not in chain:
                    continue
                got = _value_of(student, op.sources[position])
                if got is None or not _informative(got):
                    continue
                before = ancestors_of(reference, producer)  # what the paper's argument is made from
                ancestors = {f"op:{i}" for i in before} | {key for i in before for key in reference.ops[i].sources}
                earlier = [key for key in reference_index.find(got) if key in ancestors
                           and (producer_of(key) is None or producer_of(key) < departure.index)]
                if not earlier:
                    continue
                between = [reference.ops[i] for i in sorted(chain) if i < later]
                steps = [o for o in between if o.name not in LAYOUT] or between  # a transpose is a step too
                if _applied_later(op, steps, student):
                    return None  # the student's code has these steps before a later one of its kind: not missing
                kinds = list(dict.fromkeys(operation_words(o.name) for o in steps))
                named = (f"step in between, the {kinds[0]}, is" if len(kinds) == 1 else
                         f"steps in between ({', '.join(kinds)}) are")
                given = _source_words(earlier[-1], reference, context)
                return Diagnosis(student_line(op),
                                 f"{_operation_name(wanted_op)} receives {given}"
                                 f" where the reference gives it {_source_words(source, reference, context)}: the "
                                 f"reference's {named} missing from your code", op.line)
    return None


def _applied_later(op: Op, steps: list[Op], student: Trace) -> bool:
    """Whether the student's code, after `op`, has another operation of its kind at the same place (module and
    function) that receives a value made by steps of every kind in `steps`: then `op` is a step of the student's
    own (the mean of a centring before the mean of the squares), and the steps are there, not missing."""
    function = op.line.name if op.line is not None else ""
    for later in student.ops[op.index + 1:]:
        if later.name != op.name or later.scope != op.scope or (later.line.name if later.line else "") != function:
            continue
        before = [student.ops[i] for i in ancestors_of(student, later.index) if i > op.index]
        if all(any(_same_kind(mine, step) for mine in before) for step in steps):
            return True
    return False


def _same_kind(a: Op, b: Op) -> bool:
    """Two operations that do the same thing, however written (`x * y`, `torch.mul(x, y)`, `x.mul(y)`)."""
    return a.name == b.name or operation_words(a.name) == operation_words(b.name)


def _arguments_words(op: Op, trace: Trace, context: Context) -> str:
    words = [_source_words(source, trace, context) for source in op.sources]
    return ", ".join(dict.fromkeys(words)) or "its arguments"


def _operation_name(op: Op) -> str:
    """'self.feed_forward' when op is the first operation of a submodule's forward (its input), else the
    operation's words ('the linear layer')."""
    return f"the {operation_words(op.name)}" + (f" in self.{op.scope}" if op.scope else "")


def _student_value_words(key: str, student: Trace) -> str:
    """Words for a value of the student's computation that the reference never computes: what made it."""
    producer = producer_of(key)
    if producer is None:
        kind, _, rest = key.partition(":")
        return f"the input `{rest}`" if kind == "input" else "a value the reference never computes"
    op = student.ops[producer]
    where = student_line(op)
    made = (f"the output of self.{op.scope}" if _module_output(op, student) else
            f"`{op.variable}`" if op.variable and "[" not in op.variable and "," not in op.variable else
            f"the result of a {operation_words(op.name)}")
    return f"{made} ({where})" if where else made


def _extra_step(got: str, wanted: torch.Tensor, student: Trace) -> str:
    """'after an extra softmax (line …)' when the student's value is one more operation applied to the value the
    paper uses (a step done twice, or one too many); '' otherwise."""
    producer = producer_of(got)
    for _ in range(3):  # up to three steps back
        if producer is None:
            return ""
        op = student.ops[producer]
        inputs = [_value_of(student, source) for source in op.sources]
        if any(value is not None and same_values(value, wanted, permuted=False) for value in inputs):
            return f"after an extra {operation_words(op.name)} {on_line(op)}"
        producer = producer_of(op.sources[0]) if op.sources and op.name in LAYOUT else None
    return ""


def _non_finite(tensor: torch.Tensor | None) -> int:
    """How many entries of a floating tensor are inf or nan (0 for anything else)."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.device.type == "meta":
        return 0
    return int((~torch.isfinite(tensor)).sum())


def _informative(tensor: torch.Tensor) -> bool:
    """Whether a value says where it came from: a constant (all -inf, all 0, all True) equals many values by
    chance, so finding it among the reference's values is no evidence of which one the student used."""
    flat = tensor.detach().reshape(-1)
    return flat.numel() > 1 and not bool((flat == flat[0]).all()) and not bool(flat.isnan().all())


FILLS = {"full", "full_like", "new_full", "masked_fill", "masked_fill_", "fill_", "fill", "__setitem__", "where",
         "empty", "empty_like", "new_empty", "tensor", "as_tensor", "new_tensor", "index_put", "index_put_"}


def _deliberate(op: Op) -> bool:
    """An operation that writes inf or nan on purpose (a -inf fill, a mask), not one that makes them by arithmetic."""
    return op.name in FILLS or any("inf" in value or "nan" in value for _, value in op.params)


def _non_finite_origin(key: str, student: Trace, wanted: torch.Tensor, reference_index: Index) -> str:
    """When the student's value holds inf or nan where the paper's value is finite: how many, and the student's
    operation that first made them from finite arguments (read from the values, not guessed); '' otherwise."""
    got = _value_of(student, key)
    bad = _non_finite(got)
    if got is None or not bad or _non_finite(wanted) >= bad:
        return ""
    kinds = ", ".join(name for name, hit in (("-inf", torch.isneginf(got).any()), ("inf", torch.isposinf(got).any()),
                                            ("nan", torch.isnan(got).any())) if hit)
    origin, pending, seen = None, [producer_of(key)], set()
    while pending:
        producer = pending.pop()
        if producer is None or producer in seen:
            continue
        seen.add(producer)
        op = student.ops[producer]
        counts = [_non_finite(_value_of(student, source)) for source in op.sources]
        if op.sources and _non_finite(op.output) > max(counts) and not _deliberate(op) and not (
                _informative(op.output) and reference_index.find(op.output)):
            # made here by arithmetic from arguments with fewer of them, and not a value the paper makes too
            origin = op if origin is None or op.index < origin.index else origin
        pending += [producer_of(source) for source, count in zip(op.sources, counts, strict=True) if count]
    legit = _non_finite(wanted)
    text = (f"values of which {bad} of {got.numel()} are {kinds}, where the reference's "
            + (f"has only {legit}" if legit else "are all finite"))
    if origin is None:
        return text
    detail = ""
    if origin.name in ("div", "__truediv__", "__rtruediv__", "true_divide") and len(origin.sources) > 1:
        divisor = _value_of(student, origin.sources[1])
        if divisor is not None and bool((divisor == 0).any()):
            key = origin.sources[1]
            while producer_of(key) is not None and student.ops[producer_of(key)].name in LAYOUT \
                    and student.ops[producer_of(key)].sources:
                key = student.ops[producer_of(key)].sources[0]
            made = f"the {operation_words(student.ops[producer_of(key)].name)}" if producer_of(key) is not None \
                else _student_value_words(key, student)
            detail = f": its divisor, {made}, is 0 in {int((divisor == 0).sum())} of {divisor.numel()} places"
    elif origin.name in ("log", "log_"):
        detail = ": the logarithm of 0 or of a negative number"
    return f"{text}; they first appear in the {operation_words(origin.name)} {student_line(origin)}{detail}"


def non_finite(student: Trace, got: torch.Tensor, expected: torch.Tensor, reference: Trace | None = None) -> str:
    """When the student's result holds inf or nan where the expected one does not: how many, and the student's
    operation that first made them from finite arguments ("the division in `forward`, line 2: its divisor, the
    square root, is 0 in 3 of 6 places"); '' otherwise."""
    last = next((op for op in reversed(student.ops) if op.output is not None and op.output.shape == got.shape
                 and _non_finite(op.output) == _non_finite(got)), None)
    if last is None or not _non_finite(got):
        return ""
    return _non_finite_origin(f"op:{last.index}", student, expected, Index(reference or Trace()))


def _wrong_argument(departure: Op, counterpart: Op, reference: Trace, student: Trace, matched: dict[int, list[str]],
                    context: Context, substitutions_only: bool = False) -> str:
    """The same operation fed with another value of the computation than the reference feeds it, or with
    one of its values left out (a residual sum that adds nothing, say). With `substitutions_only`, only an
    argument replaced by another value (another of the reference's, or one the student made) is said: '' where
    the first reading is another (a value left out, swapped, non-finite, or changed by an extra step)."""
    if counterpart.name != departure.name:
        return ""

    def other_reading(words: str) -> str:
        return "" if substitutions_only else words

    what = _operation_name(departure)
    if len(counterpart.sources) < len(departure.sources):
        kept = [_value_of(student, source) for source in counterpart.sources]
        missing = [source for source in departure.sources
                   if not any(value is not None and _value_of(reference, source) is not None
                              and same_values(value, _value_of(reference, source)) for value in kept)]
        if missing and len(missing) == len(departure.sources) - len(counterpart.sources):
            words = " and ".join(_source_words(source, reference, context) for source in missing)
            return other_reading(f"{what} leaves out {words}: the reference combines "
                                 f"{_arguments_words(departure, reference, context)}")
        return ""
    if len(counterpart.sources) != len(departure.sources):
        return ""
    reference_index = Index(reference)
    for position, (wanted, got) in enumerate(zip(departure.sources, counterpart.sources, strict=True)):
        wanted_value = _value_of(reference, wanted)
        got_value = _value_of(student, got)
        if wanted_value is None or got_value is None or same_values(got_value, wanted_value):
            continue
        origin = _non_finite_origin(got, student, wanted_value, reference_index)
        if origin:
            return other_reading(f"{what} receives {origin}")
        equal = [key for key in reference_index.find(got_value) if key != wanted] if _informative(got_value) else []
        if len(departure.sources) == 2:
            other = departure.sources[1 - position]
            other_value = _value_of(reference, other)
            mine = _value_of(student, counterpart.sources[1 - position])
            if other_value is not None and mine is not None and same_values(got_value, other_value) \
                    and same_values(mine, wanted_value):
                return other_reading(f"the two arguments of {what} are swapped: "
                                     f"{_source_words(other, reference, context)} and "
                                     f"{_source_words(wanted, reference, context)}")
        if equal:
            instead = equal[-1]
            if wanted.startswith("leaf:") and instead.startswith("leaf:") and "." in wanted and "." in instead:
                mine, theirs = instead[5:].rpartition(".")[0], wanted[5:].rpartition(".")[0]
                if mine != theirs:
                    return (f"your code uses self.{mine} where the reference uses self.{theirs} (its "
                            f"{operation_words(departure.name)} gets `{instead[5:]}` instead of `{wanted[5:]}`)")
            return (f"{what} receives {_source_words(instead, reference, context)} "
                    f"where the reference gives it {_source_words(wanted, reference, context)}")
        extra = _extra_step(got, wanted_value, student)
        if extra:
            return other_reading(f"{what} receives {_source_words(wanted, reference, context)} {extra}")
        how = relation(got_value, wanted_value, context, None)
        if how:
            return other_reading(f"{what} receives {_source_words(wanted, reference, context)} changed: {how}")
        if producer_of(got) is not None:
            return (f"{what} receives {_student_value_words(got, student)} where the reference gives it "
                    f"{_source_words(wanted, reference, context)}")
    return ""


# --- how one value departs from another --------------------------------------------------------------------


def known_factor(factor: float, context: Context) -> str:
    """Words for a factor that equals a known quantity ('1/√d_k', 'log₁₀ e', '1/(1 − p)'), '' otherwise."""
    if abs(factor + 1) <= 1e-3:
        return "−1"
    candidates: list[tuple[float, str]] = [(1 / math.log(10), "log₁₀ e (a base-10 logarithm where the natural one "
                                                              "belongs)"),
                                           (math.log(10), "ln 10 (a natural logarithm where the base-10 one "
                                                          "belongs)")]
    for name, value in context.quantities.items():  # the quantities of this computation come first
        if not value:
            continue
        if name == "p":
            candidates += [(1 / (1 - value), "1/(1 − p), dropout's rescaling"), (1 - value, "1 − p")]
            continue
        candidates += [(value, name), (1 / value, f"1/{name}")]
        if value > 0:
            candidates += [(math.sqrt(value), f"√{name}"), (1 / math.sqrt(value), f"1/√{name}")]
    for value, words in candidates:
        if abs(factor - value) <= 1e-3 * max(1.0, abs(value)):
            return words
    named = [(name, value) for name, value in context.quantities.items() if value and value > 0 and name != "p"]
    for (first, x), (second, y) in permutations(named, 2):  # a quantity used where another belongs
        for power, root in ((0.5, "√"), (1.0, "")):
            if abs(factor - (x / y) ** power) <= 1e-3 * max(1.0, factor):
                return f"{root}{first}/{root}{second}: {root}{second} used where {root}{first} belongs"
    for value, words in ((2.0, "2"), (0.5, "1/2")):
        if abs(factor - value) <= 1e-3 * value:
            return words
    return ""


def relation(got: torch.Tensor, expected: torch.Tensor, context: Context, op: Op | None) -> str:
    """A relation that turns `expected` into `got`, derived from the values ('' when none is found)."""
    if got.dtype == torch.bool and expected.dtype == torch.bool and got.shape == expected.shape:
        return _bool_relation(got, expected, context)
    a, b = as_float64(got), as_float64(expected)
    if a.numel() == 0 or b.numel() == 0:
        return ""
    if a.shape != b.shape:
        return _shape_relation(a, b, context)
    if not torch.isfinite(a).all() and torch.isfinite(b).all():
        return "NaN or inf where numbers are expected"
    ordinary = b[torch.isfinite(b) & (b.abs() < 1e6)].abs()
    scale = max(ordinary.mean().item() if ordinary.numel() else 0.0, 1e-12)
    if a.abs().max().item() <= 1e-9 * scale and b.abs().max().item() > 1e-9:
        return "0 everywhere"
    masked = _mask_relation(a, b, context)
    if masked:
        return masked
    denominator = (b * b).sum().item()
    if denominator > 0:
        factor = (a * b).sum().item() / denominator
        if abs(factor - 1) > 1e-6 and _close(a, factor * b, 1e-4, 1e-9):
            # one number is some factor of any other: what the factor equals is then a coincidence, not a cause
            named = known_factor(factor, context) if b.numel() > 1 else ""
            if abs(factor + 1) < 1e-6:
                return "the expected values with the opposite sign"
            return f"{factor:.4g} × the expected values" + (f" (the factor is {named})" if named else "")
    offset = (a - b).mean().item()
    if abs(offset) > 1e-9 and _close(a - offset, b, 1e-4, 1e-9):
        return f"the expected values {offset:+.4g}"
    layout = _layout_relation(a, b, context)
    if layout:
        return layout
    if op is not None and op.name in ("softmax", "log_softmax"):
        axis = _reduction_axis(a, b, op, context)
        if axis:
            return axis
    return _power_relation(a, b)


def _bool_relation(a: torch.Tensor, b: torch.Tensor, context: Context) -> str:
    if torch.equal(a, ~b):
        return "the opposite: True exactly where False is expected"
    extra, missing = a & ~b, ~a & b
    parts = [f"True at {int(extra.sum())} positions where False is expected{_positions(extra, context)}"
             if extra.any() else "",
             f"False at {int(missing.sum())} positions where True is expected{_positions(missing, context)}"
             if missing.any() else ""]
    return "; ".join(part for part in parts if part)


def _mask_relation(a: torch.Tensor, b: torch.Tensor, context: Context) -> str:
    """Values equal except where one side is 'hidden' (0 after a softmax, or a very negative fill)."""
    differ = ~(((a - b).abs() <= 1e-6 + 1e-4 * b.abs()) | ((a == b) & ~torch.isfinite(a)))
    if not differ.any() or differ.all():
        return ""
    hidden_a = (a == 0) | (a <= -1e8) | (a == float("-inf"))
    hidden_b = (b == 0) | (b <= -1e8) | (b == float("-inf"))
    shown = differ & hidden_b & ~hidden_a
    covered = differ & hidden_a & ~hidden_b
    if not (shown | covered).any() or (differ & ~(shown | covered)).any():
        return ""
    parts = []
    if shown.any():
        parts.append(f"visible at {int(shown.sum())} positions that should be hidden"
                     + _positions(shown, context))
    if covered.any():
        parts.append(f"hidden at {int(covered.sum())} positions that should be visible" + _positions(covered, context))
    return "; ".join(parts)


def _positions(where: torch.Tensor, context: Context) -> str:
    """' (query 2 -> key 4, ...)' for masks of attention: the last two axes read as query and key."""
    if where.dim() < 2:
        return ""
    pairs = where.reshape(-1, where.size(-2), where.size(-1)).any(dim=0).nonzero().tolist()
    shown = ", ".join(f"{q}→{k}" for q, k in pairs[:6]) + (", ..." if len(pairs) > 6 else "")
    return f" (row→column, that is query→key for a mask: {shown})"


def _layout_relation(a: torch.Tensor, b: torch.Tensor, context: Context) -> str:
    """Same values in another place: axes swapped, a shift by one, a reversal, entries of one axis reordered."""
    if a.dim() >= 2:
        for first in range(a.dim()):
            for second in range(first + 1, a.dim()):
                if a.size(first) == a.size(second) and _close(a, b.transpose(first, second)):
                    return (f"transposed: {context.axis(a.size(first), first)} and "
                            f"{context.axis(a.size(second), second)} swapped")
    for dim in range(a.dim()):
        size = a.size(dim)
        if size < 3:
            continue
        for step in (1, -1):
            if _close(*shifted(a, b, dim, step)):
                return (f"shifted by one along {context.axis(size, dim)}: entry i holds the expected entry "
                        f"i{step:+d}")
        if _close(a, b.flip(dim)):
            return f"reversed along {context.axis(size, dim)}"
        order = _reordering(a, b, dim)
        if order is not None:
            return f"the entries of {context.axis(size, dim)} in another order: {_describe_order(order)}"
    return ""


def _reordering(a: torch.Tensor, b: torch.Tensor, dim: int) -> list[int] | None:
    """order with a.select(dim, i) == b.select(dim, order[i]) for every i, when such an order exists."""
    size = a.size(dim)
    if size > 512:
        return None
    order: list[int] = []
    for i in range(size):
        slice_a = a.select(dim, i)
        match = next((j for j in range(size) if j not in order and _close(slice_a, b.select(dim, j))), None)
        if match is None:
            return None
        order.append(match)
    if order == list(range(size)) or len(set(order)) != size:
        return None
    return order


def _describe_order(order: list[int]) -> str:
    size = len(order)
    half = size // 2
    halves = [i // 2 if i % 2 == 0 else half + i // 2 for i in range(size)]  # interleaved expected, halves got
    if size % 2 == 0 and order == [halves.index(i) for i in range(size)]:
        return "the first half holds the even entries and the second half the odd ones (two halves instead of " \
               "interleaved)"
    if size % 2 == 0 and order == halves:
        return "even and odd entries interleaved where the expected values keep them in two halves"
    if size % 2 == 0 and order == [i + 1 if i % 2 == 0 else i - 1 for i in range(size)]:
        return "each pair of neighbouring entries (0 and 1, 2 and 3, ...) swapped"
    moved = [i for i, j in enumerate(order) if i != j][:8]
    return (f"entries {', '.join(map(str, moved))} hold the expected entries "
            f"{', '.join(str(order[i]) for i in moved)}")


def _shape_relation(a: torch.Tensor, b: torch.Tensor, context: Context) -> str:
    shapes = f"shape {tuple(a.shape)} where {tuple(b.shape)} is expected"
    if a.numel() == b.numel():
        merged = merged_axes(a.shape, b.shape)
        if merged is not None and _close(a.reshape(-1), b.reshape(-1)):
            return (f"the right values with two axes of the expected shape merged into one ({shapes}): a "
                    f"concatenation where a stack belongs, or a view that joins axes {merged} and {merged + 1}")
        merged = merged_axes(b.shape, a.shape)
        if merged is not None and _close(a.reshape(-1), b.reshape(-1)):
            return (f"the right values with one axis split in two ({shapes}): a stack where a concatenation "
                    f"belongs, or a view that splits axis {merged}")
        if _close(a.reshape(-1), b.reshape(-1)):
            return f"the right values, reshaped: {shapes}"
        if _permutation(a, b) is not None:
            return f"the right values with the axes in another order: {shapes}"
        return f"{shapes}, with other values"
    if a.dim() == b.dim() + 1 or a.dim() + 1 == b.dim():
        return f"{shapes}: an axis too many or too few"
    return shapes


def _reduction_axis(a: torch.Tensor, b: torch.Tensor, op: Op, context: Context) -> str:
    """For a softmax (or log-softmax) over one axis: the axis the student's values are normalised over instead."""
    params = dict(op.params)
    wanted = params.get("dim", params.get("1", ""))
    values = a.exp() if op.name == "log_softmax" else a
    for dim in range(values.dim()):
        one = torch.ones((), dtype=values.dtype)
        if values.size(dim) > 1 and torch.allclose(values.sum(dim=dim), one, atol=1e-5) \
                and str(dim) != wanted and str(dim - values.dim()) != wanted:
            try:
                expected_dim = int(wanted) % values.dim()
                instead = context.axis(values.size(expected_dim), expected_dim)
            except ValueError:
                instead = f"axis {wanted}"
            return (f"normalised over {context.axis(values.size(dim), dim)} (its entries sum to 1 there) "
                    f"instead of over {instead}")
    return ""


def _power_relation(a: torch.Tensor, b: torch.Tensor) -> str:
    """got = expected ** k or expected ** (1/k), for the few powers that mistakes make."""
    positive = (b > 0) & (a > 0)
    if positive.sum() < max(2, b.numel() // 2):
        return ""
    ratio = (a[positive].log() / b[positive].log()).median().item() if (b[positive] != 1).any() else 1.0
    for power, words in ((2.0, "squared"), (0.5, "square-rooted"), (-1.0, "inverted (1/x)")):
        if abs(ratio - power) < 1e-3 and _close(a, b.sign() * b.abs() ** power):
            return f"the expected values {words}"
    return ""




# --- on the student's side, and the message -----------------------------------------------------------------


@contextmanager
def seeded(seed: int | None = None) -> Iterator[None]:
    """Leave the global random stream as it was (the notebook's own draws); seed it inside when `seed` is given."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(salted_seed(seed))
        yield


def traced_call(target: Any, *args: Any, method: str | None = None, names: Sequence[str] = (),
                modules: Any = None, seed: int | None = None, keep_error: bool = False, **kwargs: Any) -> Trace:
    """Record `target(*args, **kwargs)` (or `target.method(...)`): the student's component on the student's
    side (`traced` sends it there), the reference here. `modules`: the module whose parameters and submodules
    name leaves and scopes (default: target itself when it is a module); `seed` seeds torch's global random
    stream for the call, without changing it outside."""
    function = getattr(target, method) if method else target
    root = modules if modules is not None else (target if isinstance(target, nn.Module) else None)
    inputs = {(names[i] if i < len(names) else f"x{i}"): value for i, value in enumerate(args)}
    inputs |= {key: value for key, value in kwargs.items() if isinstance(value, torch.Tensor)}
    with seeded(seed), recording(root, inputs) as trace:
        try:
            trace.output = function(*args, **kwargs)
        except Exception as error:
            if not keep_error:
                raise
            from transformer_course.checks.errors import as_record

            trace.error = as_record(error)  # the operations recorded up to the crash are kept
    return trace


class _OutOfTime(Exception):
    pass


@contextmanager
def _time_budget(seconds: float) -> Iterator[None]:
    """At most `seconds` for the block (main thread only; elsewhere no limit): whatever values a student's
    code returns, diagnosing them cannot hold the grader up for longer."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def explain(student: Trace, reference: Trace, got: torch.Tensor, expected: torch.Tensor,
            context: Context | None = None, axes: Sequence[str] | None = None) -> Any:
    """The framework's Diagnosis of `got` against `expected` from the two recorded computations: where the
    final values differ, and as the likely cause the student's line and what it computes differently. None
    when the engine finds no departure (the check then says what it can from the values alone)."""
    from transformer_course.checks.compare import describe_difference
    from transformer_course.checks.framework import Diagnosis as Said

    try:
        with _time_budget(20.0):
            found = diagnose(student, reference, context=context, student_final=got, reference_final=expected)
    except Exception:  # a diagnosis that cannot be made here (or in time) says nothing
        return None
    if found is None:
        return None
    where = describe_difference(got, expected, axes) if got.shape == expected.shape else ""
    return Said(where, (f"{found.where}: " if found.where else "") + found.how + ".")


def before_crash(student: Trace, reference: Trace, context: Context | None = None) -> Any:
    """The framework's Diagnosis of a computation that crashed (`student`, recorded up to the crash): where it
    first departs from the reference's, only when that is a line of the student's that ran (a departure found
    after the crash is not said); None otherwise, or when the engine cannot say in the time `explain` has."""
    from transformer_course.checks.framework import Diagnosis as Said

    try:
        with _time_budget(20.0):
            found = diagnose(student, reference, context=context)
    except Exception:  # a diagnosis that cannot be made here (or in time) says nothing
        return None
    return Said(found.where, found.how + ".") if found is not None and found.line is not None else None


@on_student_side
def traced(target: Any, *args: Any, method: str | None = None, names: Sequence[str] = (), modules: Any = None,
           seed: int | None = None, keep_error: bool = False, **kwargs: Any) -> Trace:
    """`traced_call` on the student's side (while grading): the student's component recorded where it runs.
    With `keep_error`, a crash does not raise: the trace comes back with what was recorded up to it and the
    error (`trace.error`, raise it with `boundary.as_exception` when needed)."""
    from transformer_course.checks.framework import student_code

    with student_code():
        return traced_call(target, *args, method=method, names=names, modules=modules, seed=seed,
                           keep_error=keep_error, **kwargs)


def combined(described: Any, engine: Any) -> Any:
    """A check's own reading of the values (`described`, where it departs) with the engine's (`engine`, the
    student's line and what it computes): the first's place, both causes. Either may be None."""
    from transformer_course.checks.framework import Diagnosis as Said

    if engine is None:
        return described
    if described is None or described.cause.rstrip(".") in engine.cause:
        return engine
    first, second = engine.cause.rstrip("."), described.cause
    said = at_the_line(first, second) if not second.startswith("in `") and _in_words(second) else None
    if said:
        return Said(described.where or engine.where, said)
    place = PLACE.match(first)
    if place:  # the student's line is named once, at the start: not again inside either reading
        first = first[:place.end()] + first[place.end():].replace(f" ({place[1]})", "")
        second = second.removeprefix(f"{place[1]}: ")
    return Said(described.where or engine.where, f"{first}; {second}".strip())


RETOLD = ("where the reference applies", "in between", "a step is missing", "is normalised over",
          "in the other order", "after an extra")


def at_the_line(engine_cause: str, reading: str) -> str | None:
    """A check's own reading of a recognised mistake, said at the student's line the engine found, when the
    engine's account only tells the same mistake again in the reference's operations (`RETOLD`: an operation
    put where the reference has another, steps missing, a normalisation over another axis), which a student
    does not see; None otherwise (the engine's accounts of a wrong argument or constant, `value` 0 where -1e9 is
    expected, say, add what the reading leaves out, and stay)."""
    place = PLACE.match(engine_cause)
    after = AFTER.match(engine_cause)  # a missing step, said after the line that makes its value: that line
    if (place is None and after is None) or not any(words in engine_cause for words in RETOLD):
        return None
    return f"{place[1]}: {reading}" if place else f"in `{after[2]}`, line {after[1]} (`{after[3]}`): {reading}"


def _in_words(cause: str) -> bool:
    """Whether a cause says something in words, not only in code (what a notebook shows before the code rung)."""
    from transformer_course.checks.framework import split_cause

    return bool(split_cause(cause)[0].strip())


PLACE = re.compile(r"(in `[^`]+`, line \d+ \(`.*?`\)): ")  # how a reading starts with the student's line
AFTER = re.compile(r"after line (\d+) of `([^`]+)` \(`(.*?)`\): ")  # how a missing step's reading starts
