"""What the student's failing line was doing when it crashed, worked out from the values where it crashed.

`errors.explain_crash` says which kind of error a crash is and shows the student's line. This module
adds what only the live frames know: the exact part of the line that failed (Python 3.11 records its
columns), what each of its operands holds (a tensor's dtype and shape, a layer's class, None, a number,
an optimiser), and the relations those values show:
- a call applied to its own result (`f(f(x))`, `x.m().m()`);
- an attribute missing on one variable but present on another variable of the same function;
- a value that cannot be called, or of the kind the error names, that came in as a parameter: the
  caller's line and the argument it passed there;
- a name that is not defined while a variable with almost the same spelling is.

It runs where the frames are alive: in the student's process (`errors.as_record`, whose record carries
the text to the grader) or in the notebook itself. It never runs the student's code again: values are
read from the frames (names, attributes, indexing, a few pure tensor methods), and what would need a
call is described by its expression only. It never raises and its text is bounded: a failure of its
own leaves the message as it was.
"""

from __future__ import annotations

import ast
import builtins
import contextvars
import difflib
import functools
import inspect
import linecache
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from types import FrameType, FunctionType, MethodType, ModuleType, TracebackType
from typing import Any

import torch
from torch import nn

# whether a float32 or float64 tensor is described with its dtype (`describe` sets it per error)
_FLOAT_DTYPES_SAID: contextvars.ContextVar[bool] = contextvars.ContextVar("float_dtypes_said", default=True)
_DTYPE_ERROR = re.compile(r"dtype|scalar type|Double|Float|Half", re.IGNORECASE)

MAX_DETAIL = 1000  # characters of the whole description
MAX_OPERANDS = 4  # operands described per failing call
MAX_OTHERS = 2  # other variables suggested
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
# Tensor methods that only compute a new view or a small fact of their receiver: safe to run again.
PURE_TENSOR_METHODS = {"transpose", "view", "reshape", "unsqueeze", "squeeze", "permute", "flatten", "contiguous",
                       "t", "float", "long", "bool", "int", "double", "size", "dim", "detach", "unflatten"}
_UNKNOWN = object()  # a value that cannot be known without running the student's code
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.FloorDiv: operator.floordiv, ast.Pow: lambda base, exponent: _small_power(base, exponent),
               ast.Mod: operator.mod}
def _small_power(base: Any, exponent: Any) -> Any:
    """base ** exponent when it stays small (a line's `10 ** 10 ** 9` is never worked out here), else unknown."""
    if abs(exponent) > 64 or abs(base) > 1e6:
        return _UNKNOWN
    return base ** exponent


_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Pow: "**",
            ast.Mod: "%", ast.MatMult: "@"}


def describe(error: BaseException, students: Callable[[str], bool],
             sources: Mapping[str, str] | None = None) -> str:
    """What the innermost line of the student's (the frames whose file `students` accepts) did when
    `error` was raised, from the values in its frame; "" when nothing can be said."""
    try:
        entries = [(tb.tb_frame, tb.tb_lasti) for tb in _walk(error.__traceback__)]
        mine = [index for index, (frame, _) in enumerate(entries) if students(frame.f_code.co_filename)]
        if not mine:
            return ""
        frame, lasti = entries[mine[-1]]
        caller = entries[mine[-2]] if len(mine) > 1 else None
        # the checks run in float64, whatever dtype the lesson asks for: a float dtype is said only where the
        # error is about dtypes (it would read as a claim about the student's tensors)
        token = _FLOAT_DTYPES_SAID.set(bool(_DTYPE_ERROR.search(str(error))))
        try:
            text = " ".join(_sentences(error, frame, lasti, caller, sources))
        finally:
            _FLOAT_DTYPES_SAID.reset(token)
        return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL - 1] + "…"
    except Exception:  # the explainer must never hide the student's error behind one of its own
        return ""


def _walk(tb: TracebackType | None) -> Iterator[TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


# --- the failing part of the line ----------------------------------------------------------------------


def failing_node(frame: FrameType, lasti: int, sources: Mapping[str, str] | None = None) -> ast.expr | None:
    """The sub-expression of the frame's line whose instruction failed, parsed (Python 3.11's columns);
    the whole line's expression when the columns are not recorded."""
    lines = _source_lines(frame, sources)
    positions = list(frame.f_code.co_positions())
    start, end, first_column, last_column = positions[lasti // 2] if 0 <= lasti // 2 < len(positions) else (
        None, None, None, None)
    if start and end and first_column is not None and last_column is not None and end <= len(lines):
        chunk = [line.encode() for line in lines[start - 1:end]]
        if len(chunk) == 1:
            text = chunk[0][first_column:last_column]
        else:
            text = b"".join([chunk[0][first_column:], *chunk[1:-1], chunk[-1][:last_column]])
        node = _parsed(text.decode(errors="replace"))
        if node is not None:
            return node
    line = lines[frame.f_lineno - 1].strip() if 0 < frame.f_lineno <= len(lines) else ""
    try:
        statement = ast.parse(line).body[0]
    except (SyntaxError, IndexError):  # a line of a longer statement
        return None
    if isinstance(statement, ast.AugAssign):  # `a &= b` fails in its operation, which writes into a
        return InPlace(left=statement.target, op=statement.op, right=statement.value)
    value = getattr(statement, "value", None)
    return value if isinstance(value, ast.expr) else None


def _source_lines(frame: FrameType, sources: Mapping[str, str] | None) -> list[str]:
    """The lines of the frame's code: linecache's, or `sources`' for code compiled from a string linecache does
    not know."""
    filename = frame.f_code.co_filename
    lines = linecache.getlines(filename, frame.f_globals)
    if not lines and sources and filename in sources:
        lines = sources[filename].splitlines(keepends=True)
    return lines


def _printed_shapes(pattern: str, error: BaseException) -> tuple[tuple[int, ...], ...] | None:
    """The shapes an error's text prints as [a, b, ...], one per group of `pattern` (None when it does not
    match)."""
    found = re.search(pattern, str(error))
    if found is None:
        return None
    return tuple(tuple(int(size) for size in group.split(",") if size.strip()) for group in found.groups())


class InPlace(ast.BinOp):
    """The operation of an augmented assignment (`a += b`, `a &= b`), which writes its result into `a`."""


def _parsed(text: str) -> ast.expr | None:
    text = " ".join(text.split())  # a segment over several lines, inside brackets
    try:
        return ast.parse(text, mode="eval").body
    except SyntaxError:
        return None


# --- values, read without running the student's code ---------------------------------------------------


def value_of(node: ast.expr, frame: FrameType) -> Any:
    """The value of a simple expression in `frame` (names, attributes, constant indexing, arithmetic on
    numbers, a few pure tensor methods), or _UNKNOWN when knowing it needs a call of the student's."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        for space in (frame.f_locals, frame.f_globals, vars(builtins)):
            if node.id in space:
                return space[node.id]
        return _UNKNOWN
    if isinstance(node, ast.Attribute) and not node.attr.startswith("__"):
        base = value_of(node.value, frame)
        if base is _UNKNOWN or not _plain_attributes(base, node.attr):
            return _UNKNOWN
        return getattr(base, node.attr, _UNKNOWN)
    if isinstance(node, ast.Subscript):
        base, index = value_of(node.value, frame), value_of(node.slice, frame)
        plain = type(base) in (list, tuple, dict) or isinstance(base, torch.Tensor)
        if plain and isinstance(index, int | str | slice):
            return base[index]
        if isinstance(base, torch.Tensor) and type(index) is tuple \
                and all(item is None or item is Ellipsis or isinstance(item, int | slice) for item in index):
            return base[index]  # `pe[:, :n]`: basic indexing, a view
        return _UNKNOWN
    if isinstance(node, ast.Tuple):
        items = tuple(value_of(item, frame) for item in node.elts)
        return _UNKNOWN if any(item is _UNKNOWN for item in items) else items
    if isinstance(node, ast.Slice):
        parts = [value_of(part, frame) if part is not None else None for part in (node.lower, node.upper, node.step)]
        return slice(*parts) if all(part is None or isinstance(part, int) for part in parts) else _UNKNOWN
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = value_of(node.operand, frame)
        return -operand if _number(operand) else _UNKNOWN
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = value_of(node.left, frame), value_of(node.right, frame)
        return _ARITHMETIC[type(node.op)](left, right) if _number(left) and _number(right) else _UNKNOWN
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PURE_TENSOR_METHODS:
        receiver = value_of(node.func.value, frame)
        arguments = [value_of(argument, frame) for argument in node.args]
        if isinstance(receiver, torch.Tensor) and all(isinstance(a, int) for a in arguments) and not node.keywords:
            return getattr(receiver, node.func.attr)(*arguments)
    return _UNKNOWN


def _plain_attributes(base: Any, name: str) -> bool:
    """Whether reading `base.name` runs no code of the student's: no property of theirs, no __getattr__ or
    __getattribute__ of their own (nn.Module's and torch's are plain look-ups)."""
    kind = type(base)
    if isinstance(inspect.getattr_static(kind, name, None), property):
        return False
    for hook in ("__getattr__", "__getattribute__"):
        found = inspect.getattr_static(kind, hook, None)
        if found is None:
            continue
        owner = getattr(found, "__module__", None) or getattr(getattr(found, "__objclass__", None), "__module__", "")
        if not (owner or "").startswith(("torch", "builtins")):
            return False
    return True


def _known(node: ast.expr, frame: FrameType) -> Any:
    try:
        return value_of(node, frame)
    except Exception:  # an index out of range, a view that does not fit: not known
        return _UNKNOWN


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _public_name(kind: type) -> str:
    """The class's name, or its first public base's for a class of the checks' own (`_SpyAdam` -> Adam)."""
    return next((cls.__name__ for cls in kind.__mro__ if not cls.__name__.startswith("_")), kind.__name__)


def _article(text: str) -> str:
    return f"an {text}" if text[:1].lower() in "aeio" else f"a {text}"


def _shape(size: torch.Size) -> str:
    """'(2, 3)', and '(5,)' for one axis, as Python writes a tuple."""
    return "(" + ", ".join(map(str, size)) + ("," if len(size) == 1 else "") + ")"


def kind_of_value(value: Any) -> str:
    """What a value is, in a few words: 'a float32 tensor of shape (2, 5, 16)', 'a Linear layer (16 -> 11
    features)', 'None', 'the int 50', 'an Adam optimiser'."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return f"the bool {value}"
    if _number(value):
        return f"the {type(value).__name__} {value:.4g}" if isinstance(value, float) else f"the int {value}"
    if isinstance(value, str):
        return f"the text {value[:30]!r}"
    if isinstance(value, torch.Tensor):
        said = value.dtype not in (torch.float32, torch.float64) or _FLOAT_DTYPES_SAID.get()
        dtype = str(value.dtype).removeprefix("torch.") + " " if said else ""
        if value.dim() == 0:
            return f"{_article(dtype + 'tensor')} holding one number"
        return (f"{'an empty ' + dtype + 'tensor' if value.numel() == 0 else _article(dtype + 'tensor')} of shape "
                f"{_shape(value.shape)}")
    if isinstance(value, nn.Linear):
        return f"a Linear layer from {value.in_features} to {value.out_features} features"
    if isinstance(value, nn.Embedding):
        return f"an Embedding layer for {value.num_embeddings} token ids, {value.embedding_dim} features each"
    if isinstance(value, nn.Module):
        return f"{_article(_public_name(type(value)))} module"
    if isinstance(value, torch.optim.Optimizer):
        return f"{_article(_public_name(type(value)))} optimiser"
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return f"{_article(_public_name(type(value)))} learning-rate scheduler"
    if isinstance(value, list | tuple):
        tensors = value and all(isinstance(item, torch.Tensor) for item in value)
        return f"{_article(type(value).__name__)} of {len(value)} {'tensors' if tensors else 'values'}"
    if isinstance(value, dict):
        return f"a dict of {len(value)} entries"
    if isinstance(value, FunctionType | MethodType):
        return f"the function `{value.__name__}`"
    if isinstance(value, type):
        return f"the class `{_public_name(value)}`"
    if isinstance(value, ModuleType):
        return f"the module `{value.__name__}`"
    return f"{_article(_public_name(type(value)))} object"


def _code(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _operand(node: ast.expr, frame: FrameType) -> str:
    """'`x` (a float32 tensor of shape (2, 3))', or 'the result of `f(x)`' when the value is not known."""
    value = _known(node, frame)
    if value is _UNKNOWN:
        return f"the result of `{_code(node)}`" if isinstance(node, ast.Call) else f"`{_code(node)}`"
    if isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant)):
        return f"the constant `{_code(node)}`"
    return f"`{_code(node)}` ({kind_of_value(value)})"


# --- the sentences ---------------------------------------------------------------------------------------


def _sentences(error: BaseException, frame: FrameType, lasti: int,
               caller: tuple[FrameType, int] | None, sources: Mapping[str, str] | None) -> list[str]:
    if isinstance(error, NameError) and not isinstance(error, UnboundLocalError):
        return _undefined_name(error, frame)
    node = failing_node(frame, lasti, sources)
    if node is None:
        return []
    said = list(dict.fromkeys(applied_to_own_result(node)))

    def passed(suspect: ast.expr) -> list[str]:
        return _passed_by_caller(suspect, frame, caller, sources)

    if isinstance(error, AttributeError) and isinstance(node, ast.Attribute | ast.Call):
        attribute = node if isinstance(node, ast.Attribute) else node.func
        if isinstance(attribute, ast.Attribute) and attribute.attr == getattr(error, "name", None):
            followed = passed(attribute.value)
            said += [_missing_attribute(attribute, error, frame, others=not followed), *followed]
    elif isinstance(node, ast.Call):
        function = _known(node.func, frame)
        if function is not _UNKNOWN and not callable(function):
            followed = passed(node.func)
            said += [_not_callable(node.func, function, frame, others=not followed), *followed]
        else:
            said.append(_receives(node, function, error, frame))
            said += [sentence for suspect in _suspects(node.args, error, frame) for sentence in passed(suspect)]
    elif isinstance(node, ast.Subscript):
        said.append(_written_into(node, error, frame, sources)
                    or f"{_operand(node.value, frame)} is indexed with {_operand(node.slice, frame)}.")
    elif isinstance(node, InPlace) and type(node.op) in _SYMBOLS:
        said.append(_in_place(node, error, frame))
        return [sentence for sentence in said if sentence]
    elif isinstance(node, ast.BinOp) and type(node.op) in _SYMBOLS:
        said.append(f"`{_SYMBOLS[type(node.op)]}` meets {_operand(node.left, frame)} and "
                    f"{_operand(node.right, frame)}.")
    pair = _tensor_pair(node)
    if pair is not None:
        said += shape_clash(*pair, frame)
    return [sentence for sentence in said if sentence]


def _written_into(node: ast.Subscript, error: BaseException, frame: FrameType,
                  sources: Mapping[str, str] | None) -> str:
    """'the result of `f(x)`, of shape (50, 16), is written into `pe[:, 0::2]`, of shape (50, 8)' when the
    failing subscript is the target of an assignment whose value does not fit it ('' otherwise)."""
    sizes = _printed_shapes(r"Target sizes: \[([\d, ]*)\]\.\s+Tensor sizes: \[([\d, ]*)\]", error)
    lines = _source_lines(frame, sources)
    if sizes is None or not 0 < frame.f_lineno <= len(lines):
        return ""
    try:
        statement = ast.parse(lines[frame.f_lineno - 1].strip()).body[0]
    except (SyntaxError, IndexError):
        return ""
    if not isinstance(statement, ast.Assign) or ast.unparse(statement.targets[0]) != ast.unparse(node):
        return ""
    target, value = sizes
    return (f"{_operand(statement.value, frame)}, of shape {_shape(value)}, is written into `{_code(node)}`, of "
            f"shape {_shape(target)}.")


def _in_place(node: InPlace, error: BaseException, frame: FrameType) -> str:
    """What an augmented assignment that failed did: it writes its result into its left operand, whose shape
    and dtype the result must keep."""
    symbol = _SYMBOLS[type(node.op)] + "="
    said = (f"`{symbol}` combines {_operand(node.left, frame)} with {_operand(node.right, frame)} and writes the "
            f"result into `{_code(node.left)}` itself (in place)")
    shapes = _printed_shapes(r"output with shape \[([\d, ]*)\] doesn't match the broadcast shape \[([\d, ]*)\]",
                             error)
    if shapes is None:
        return said + "."
    own, combined = shapes
    return said + (f": the combined shape is {_shape(combined)}, and a tensor written in place keeps its own shape "
                   f"{_shape(own)}.")


# --- two tensors whose shapes do not fit -------------------------------------------------------------------

_SYMBOLS |= {ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^"}
_MATRIX_PRODUCTS = {"matmul", "bmm", "mm"}
_LAYOUT_CALLS = {"transpose", "permute", "swapaxes", "t", "mT", "T", "movedim"}


def _tensor_pair(node: ast.expr) -> tuple[ast.expr, ast.expr, bool] | None:
    """(left, right, is a matrix product) for `a OP b`, `torch.matmul(a, b)` and `a.matmul(b)`."""
    if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOLS:
        return node.left, node.right, isinstance(node.op, ast.MatMult)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MATRIX_PRODUCTS:
        if len(node.args) == 2:
            return node.args[0], node.args[1], True
        if len(node.args) == 1:
            return node.func.value, node.args[0], True
    return None


def _fits(left: torch.Size, right: torch.Size, product: bool) -> bool:
    """Whether tensors of these shapes combine: broadcast elementwise, or as a (batched) matrix product."""
    try:
        if not product:
            torch.broadcast_shapes(left, right)
            return True
        if len(left) < 1 or len(right) < 1:
            return False
        inner_left, inner_right = left[-1], right[-2] if len(right) > 1 else right[0]
        if inner_left != inner_right:
            return False
        torch.broadcast_shapes(left[:-2], right[:-2])
        return True
    except RuntimeError:
        return False


def _where_sizes_come_from(size: int, frame: FrameType, skip: set[int]) -> str:
    """'`tgt`'s axis 0' for the function's input tensors with an axis of this size (parameters first)."""
    if size == 1:
        return ""
    code = frame.f_code
    parameters = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    found = []
    for name in [*parameters, *(n for n in frame.f_locals if n not in parameters)]:
        value = frame.f_locals.get(name)
        if not isinstance(value, torch.Tensor) or id(value) in skip or name.startswith("_"):
            continue
        axes = [axis for axis, length in enumerate(value.shape) if length == size]
        if axes and value.dim() > 1:
            found.append(f"`{name}`'s axis {axes[0]}" + (f" (of {_shape(value.shape)})" if len(found) < 1 else ""))
        if len(found) == 2:
            break
    return " and ".join(found)


def _clash(left_code: str, left: torch.Size, right_code: str, right: torch.Size, product: bool) -> tuple[str, tuple]:
    """Which axis does not fit, in words, and the two sizes that meet there."""
    if product and len(left) >= 1 and len(right) >= 2 and left[-1] != right[-2]:
        return (f"in a matrix product the last axis of the left factor must equal the second-to-last of the right "
                f"one: `{left_code}` has {left[-1]} there, `{right_code}` has {right[-2]}", (left[-1], right[-2]))
    first, second = (left[:-2], right[:-2]) if product else (left, right)
    for back in range(1, max(len(first), len(second)) + 1):
        a = first[-back] if back <= len(first) else 1
        b = second[-back] if back <= len(second) else 1
        if a != b and a != 1 and b != 1:
            axis = -back - (2 if product else 0)
            return (f"axis {axis} (counted from the end) does not fit: `{left_code}` has {a} there, `{right_code}` "
                    f"has {b} (sizes that meet must be equal, or one of them 1)", (a, b))
    return "", ()


def _alternatives(node: ast.expr, value: torch.Tensor, other: torch.Size, left_side: bool, product: bool,
                  frame: FrameType) -> list[str]:
    """What the same operand, written with its axes elsewhere, would be and whether it fits: the base without
    its transpose, the base with another single transpose, the same slice one axis further right."""
    def fits(shape: torch.Size) -> bool:
        return _fits(shape, other, product) if left_side else _fits(other, shape, product)

    found: list[str] = []
    base_node = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _LAYOUT_CALLS:
        base_node = node.func.value
    elif isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
        base_node = node.value
    if base_node is not None:
        base = _known(base_node, frame)
        if isinstance(base, torch.Tensor):
            name = _code(base_node, 30)
            if fits(base.shape):
                found.append(f"`{name}` itself, {_shape(base.shape)}, without the {_code(node, 40)[len(name):]}")
            for first in range(base.dim()):
                for second in range(first + 1, base.dim()):
                    swapped = list(base.shape)
                    swapped[first], swapped[second] = swapped[second], swapped[first]
                    code = f"{name}.transpose({first - base.dim()}, {second - base.dim()})"
                    if fits(torch.Size(swapped)) and _code(node, 60) != code:
                        found.append(f"`{code}`, {_shape(torch.Size(swapped))}")
    elif isinstance(node, ast.Subscript):
        base = _known(node.value, frame)
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if isinstance(base, torch.Tensor) and all(isinstance(e, ast.Slice) for e in elements):
            index = [_known(e, frame) for e in elements]
            if all(isinstance(i, slice) for i in index):
                for shift in range(1, base.dim() - len(index) + 1):
                    try:
                        shape = base[(slice(None),) * shift + tuple(index)].shape
                    except Exception:
                        continue
                    if fits(shape):
                        text = ", ".join([":"] * shift + [ast.unparse(e) for e in elements])
                        found.append(f"`{_code(node.value, 30)}[{text}]`, {_shape(shape)}, the same slice on axis "
                                     f"{shift}")
    return found[:3]


def shape_clash(left_node: ast.expr, right_node: ast.expr, product: bool, frame: FrameType) -> list[str]:
    """For two tensors that do not fit (elementwise or as a matrix product): the axis where they clash, where
    the two sizes meeting there come from among the function's inputs, and which rewriting of one operand, found
    by trying them on the live shapes, would fit. [] when the shapes fit or are not known."""
    left, right = _known(left_node, frame), _known(right_node, frame)
    if not isinstance(left, torch.Tensor) or not isinstance(right, torch.Tensor) or \
            _fits(left.shape, right.shape, product):
        return []
    left_code, right_code = _code(left_node, 40), _code(right_node, 40)
    clash, sizes = _clash(left_code, left.shape, right_code, right.shape, product)
    said = [clash[0].upper() + clash[1:] + "." if clash else ""]
    skip = {id(left), id(right)}
    origins = [(size, _where_sizes_come_from(size, frame, skip)) for size in dict.fromkeys(sizes)]
    origins = [f"{size} is the size of {words}" for size, words in origins if words]
    if origins:
        said.append("; ".join(origins) + ".")
    fixes = _alternatives(left_node, left, right.shape, True, product, frame) + \
        _alternatives(right_node, right, left.shape, False, product, frame)
    if fixes:
        said.append("These would fit: " + "; ".join(fixes) + ".")
    return said


def applied_to_own_result(node: ast.expr) -> Iterator[str]:
    """'`f` is applied to its own result (twice in a row)' for every f(f(x)), x.m().m() and (a + b) + b
    inside `node`."""
    for part in ast.walk(node):
        if isinstance(part, ast.Call) and any(isinstance(argument, ast.Call)
                                              and ast.dump(argument.func) == ast.dump(part.func)
                                              for argument in part.args):
            yield f"`{_code(part.func)}` is applied to its own result here (twice in a row)."
        if (isinstance(part, ast.Attribute) and isinstance(part.value, ast.Call)
                and isinstance(part.value.func, ast.Attribute) and part.value.func.attr == part.attr):
            yield f"`.{part.attr}(…)` is called on the result of `.{part.attr}(…)` (twice in a row)."
        if (isinstance(part, ast.BinOp) and isinstance(part.left, ast.BinOp) and type(part.left.op) is type(part.op)
                and ast.dump(part.left.right) == ast.dump(part.right) and type(part.op) in _SYMBOLS):
            yield f"`{_code(part.right)}` comes in twice: `{_code(part)}`."


def _missing_attribute(attribute: ast.Attribute, error: AttributeError, frame: FrameType, others: bool) -> str:
    """'`progress` is the bool False, which has no `zero_grad`', and (with `others`) the other variables of
    the frame that have one."""
    name, receiver = attribute.attr, getattr(error, "obj", _UNKNOWN)
    if receiver is _UNKNOWN:
        receiver = _known(attribute.value, frame)
    if receiver is _UNKNOWN:
        return ""
    what = f"`{_code(attribute.value)}` {'returns' if isinstance(attribute.value, ast.Call) else 'is'} " \
           f"{kind_of_value(receiver)}, which has no `{name}`."
    having = [variable for variable, value in _locals(frame) if value is not receiver and _has(value, name)]
    if not others or not having or isinstance(attribute.value, ast.Call):  # a result is no variable
        return what
    listed = " and ".join(f"`{variable}`" for variable in having[:MAX_OTHERS])
    return f"{what} {listed} {'has' if len(having) == 1 else 'have'} one: was another variable meant here?"


def _has(value: Any, name: str) -> bool:
    try:
        return inspect.getattr_static(value, name, _UNKNOWN) is not _UNKNOWN or (
            isinstance(value, nn.Module) and name in value._modules)
    except Exception:
        return False


def _locals(frame: FrameType) -> list[tuple[str, Any]]:
    return [(name, value) for name, value in frame.f_locals.items() if not name.startswith("_")]


def _not_callable(function_node: ast.expr, function: Any, frame: FrameType, others: bool) -> str:
    """'`enc_out` is a float32 tensor …, which cannot be called', and (with `others`) the frame's few layers
    and functions that could have been meant."""
    what = f"`{_code(function_node)}` is {kind_of_value(function)}, which cannot be called like a function or layer."
    callables = [variable for variable, value in _locals(frame) if variable != "self" and value is not function
                 and isinstance(value, nn.Module | FunctionType)]
    if not others or not callables or len(callables) > MAX_OTHERS:
        return what
    listed = " or ".join(f"`{variable}` ({kind_of_value(value)})" for variable, value in _locals(frame)
                         if variable in callables)
    return f"{what} Was another variable meant, such as {listed}?"


def _receives(call: ast.Call, function: Any, error: BaseException, frame: FrameType) -> str:
    positional = [argument for argument in call.args if not isinstance(argument, ast.Starred)]
    names = _parameter_names(function, len(positional))
    arguments = [(names[index] if index < len(names) else "", argument) for index, argument in enumerate(positional)]
    arguments += [(keyword.arg, keyword.value) for keyword in call.keywords if keyword.arg]
    if not arguments:
        return ""
    described = []
    for parameter, argument in arguments[:MAX_OPERANDS]:
        as_what = f" as `{parameter}`" if parameter and not (
            isinstance(argument, ast.Name) and argument.id == parameter) else ""
        described.append(_operand(argument, frame) + as_what)
    more = ", …" if len(arguments) > MAX_OPERANDS else ""
    owner = f" ({kind_of_value(function)})" if isinstance(function, nn.Module) else ""
    receiver = _known(call.func.value, frame) if isinstance(call.func, ast.Attribute) else _UNKNOWN
    called_on = f", called on `{_code(call.func.value)}`, {kind_of_value(receiver)}" if isinstance(
        receiver, torch.Tensor) else ""
    listed = ", ".join(described[:-1]) + (" and " if len(described) > 1 else "") + described[-1]
    sentence = f"`{_code(call.func)}`{owner} receives {listed}{more}{called_on}."
    integers = re.search(r"indices|Long|converted to an index|must be an integer", str(error))
    floats = [argument for _, argument in arguments if isinstance(value := _known(argument, frame), torch.Tensor)
              and value.is_floating_point()]
    if integers and floats and (isinstance(function, nn.Embedding) or "indices" in str(error)):
        sentence += f" Integer indices (token ids) are needed where `{_code(floats[0])}` holds floats."
    return sentence


def _parameter_names(function: Any, count: int) -> list[str]:
    """The names of the first `count` positional parameters of `function` (a module: its forward)."""
    if function is _UNKNOWN or count == 0:
        return []
    skip = 0
    target = function.forward if isinstance(function, nn.Module) else function
    if isinstance(getattr(function, "__self__", None), torch.Tensor) and not isinstance(function, MethodType):
        target, skip = getattr(torch.Tensor, getattr(function, "__name__", ""), None), 1  # x.gather: Tensor.gather
    target = _TORCH_SIGNATURES().get(target, target)  # torch's built-ins, by their documented signatures
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a built-in without a signature
        return []
    positional = [parameter.name for parameter in signature.parameters.values()
                  if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)]
    return positional[skip:skip + count]


@functools.cache
def _TORCH_SIGNATURES() -> dict[Any, Callable[..., Any]]:  # noqa: N802 (a constant, computed once)
    """torch's functions and tensor methods with stand-ins of their signatures (torch's own table)."""
    try:
        return torch.overrides.get_testing_overrides()
    except Exception:
        return {}


def _suspects(arguments: list[ast.expr], error: BaseException, frame: FrameType) -> list[ast.expr]:
    """The arguments that look wrong by their values alone: an empty tensor, or a value whose type the
    error's text names (`'Transformer'`, `not KVCache`)."""
    text = str(error)
    found = []
    for argument in arguments:
        value = _known(argument, frame)
        if isinstance(value, torch.Tensor):
            if value.numel() == 0:
                found.append(argument)
        elif value is not _UNKNOWN and value is not None and not isinstance(value, int | float | str) \
                and re.search(rf"\b{re.escape(type(value).__name__)}\b", text):
            found.append(argument)
    return found


def _passed_by_caller(suspect: ast.expr, frame: FrameType, caller: tuple[FrameType, int] | None,
                      sources: Mapping[str, str] | None) -> list[str]:
    """For a suspect that is a parameter of the failing function: which argument the caller's line
    passed for it ('`criterion` receives `optimizer` (an Adam optimiser), the third argument given in
    `train_epoch`, line 18')."""
    if caller is None or not isinstance(suspect, ast.Name):
        return []
    code = frame.f_code
    parameters = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    if suspect.id not in parameters or suspect.id not in frame.f_locals:
        return []
    received = frame.f_locals[suspect.id]
    caller_frame, caller_lasti = caller
    call = failing_node(caller_frame, caller_lasti, sources)
    if not isinstance(call, ast.Call):
        return []
    positional = list(parameters[:code.co_argcount])
    if positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    place = f"given in `{caller_frame.f_code.co_name}`, line {caller_frame.f_lineno}"
    for index, argument in enumerate(call.args):
        if isinstance(argument, ast.Starred):
            return []
        if index < len(positional) and positional[index] == suspect.id and _known(argument, caller_frame) is received:
            ordinal = ORDINALS[index] if index < len(ORDINALS) else f"number {index + 1}"
            return [f"`{suspect.id}` receives {_operand(argument, caller_frame)}, the {ordinal} argument {place}."]
    for keyword in call.keywords:
        if keyword.arg == suspect.id and _known(keyword.value, caller_frame) is received:
            return [f"`{suspect.id}` receives {_operand(keyword.value, caller_frame)}, {place}."]
    return []


def _undefined_name(error: NameError, frame: FrameType) -> list[str]:
    """A name that is not defined, and the one variable with almost the same spelling, if there is one."""
    name = getattr(error, "name", None)
    if not name:
        return []
    known = [variable for variable in [*frame.f_locals, *frame.f_globals] if not variable.startswith("_")]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    if not close:
        return []
    return [f"`{name}` is not defined here; `{close[0]}`, spelled almost the same, is: was it meant?"]
