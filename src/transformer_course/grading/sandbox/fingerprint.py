"""What a piece of code *is*, independent of where it was compiled: the fingerprint used to recognise the
reference solution's code however it reached a notebook.

`fingerprint(code)` is the sequence of a code object's instructions with their arguments (names,
constants, nested code), without line numbers, jump offsets or file names, so the same function
compiled from a lesson cell, from `exec` of the reference's source, or loaded from a pickle gives the
same fingerprint. `digest` is a short hash of it. `exercise_code(names)` finds the reference solution's
functions of a notebook's exercises: their code objects (to recognise the reference's own code running)
and the fingerprints of those a student writes (the `### BEGIN SOLUTION` regions; given code such as a
constructor is the same in every notebook and says nothing).
"""

from __future__ import annotations

import dis
import hashlib
import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any

MIN_INSTRUCTIONS = 20  # a shorter function may well be written the same way by anyone


def fingerprint(code: types.CodeType) -> tuple:
    """The instructions of `code` with their arguments, leaving out what says nothing about what it computes:
    line numbers, jump offsets, NOPs, and calls of a constant whose result is thrown away (`watch.Probe`, which
    the grader puts into the reference's code: a copy with or without it is the same code)."""
    instructions = [instruction for instruction in dis.get_instructions(code)
                    if instruction.opname not in ("PRECALL", "CACHE", "RESUME", "NOP")]
    steps: list[Any] = []
    index = 0
    while index < len(instructions):
        if _calls_a_constant(instructions, index):
            index += 4
            continue
        instruction = instructions[index]
        index += 1
        name = "LOAD_ATTR" if instruction.opname == "LOAD_METHOD" else instruction.opname
        if instruction.opcode in dis.hasjrel or instruction.opcode in dis.hasjabs:
            steps.append(name)
        elif isinstance(instruction.argval, types.CodeType):
            steps.append((name, fingerprint(instruction.argval)))
        else:
            argument = instruction.argrepr.removeprefix("NULL + ").removeprefix("NULL|self + ")
            steps.append((name, argument))
    return tuple(steps)


def _calls_a_constant(instructions: list[dis.Instruction], index: int) -> bool:
    """PUSH_NULL, LOAD_CONST, CALL 0, POP_TOP: a constant called without arguments, its result dropped."""
    window = instructions[index:index + 4]
    return (len(window) == 4 and [each.opname for each in window] == ["PUSH_NULL", "LOAD_CONST", "CALL", "POP_TOP"]
            and window[2].arg == 0 and not isinstance(window[1].argval, types.CodeType))


def digest(code: types.CodeType) -> str:
    return hashlib.sha256(repr(fingerprint(code)).encode()).hexdigest()[:24]


def substantial(code: types.CodeType) -> bool:
    return sum(1 for _ in dis.get_instructions(code)) >= MIN_INSTRUCTIONS


def code_tree(code: types.CodeType) -> list[types.CodeType]:
    """A code object and every code object nested in it (inner functions, comprehensions)."""
    found, pending = [], [code]
    while pending:
        each = pending.pop()
        found.append(each)
        pending += [constant for constant in each.co_consts if isinstance(constant, types.CodeType)]
    return found


def unwrap(value: Any) -> Any:
    """The function behind decorators and wrappers: `__wrapped__` chains (functools.wraps, torch.no_grad),
    bound methods, staticmethod/classmethod, functools.partial."""
    for _ in range(20):
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        elif isinstance(value, types.MethodType):
            value = value.__func__
        elif hasattr(value, "func") and type(value).__name__ == "partial":
            value = value.func
        elif isinstance(getattr(value, "__wrapped__", None), types.FunctionType | types.MethodType):
            value = value.__wrapped__
        else:
            break
    return value


def functions_of(value: Any) -> list[types.FunctionType]:
    """The functions of a function (itself, unwrapped) or of a class (its own methods and properties)."""
    value = unwrap(value)
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, type):
        found = []
        for member in list(vars(value).values()):
            member = unwrap(member)
            if isinstance(member, property):
                found += [unwrap(f) for f in (member.fget, member.fset) if f is not None]
            elif isinstance(member, types.FunctionType):
                found.append(member)
        return [function for function in found if isinstance(function, types.FunctionType)]
    return []


def written_by_students(function: types.FunctionType) -> bool:
    """Whether a reference function holds a `### BEGIN SOLUTION` region (what students write)."""
    try:
        return "### BEGIN SOLUTION" in inspect.getsource(function)
    except (OSError, TypeError):
        return False


@dataclass
class ExerciseCode:
    """The reference solution of one notebook's exercises, as the watcher of running code needs it."""

    objects: dict[int, str] = field(default_factory=dict)  # id(class or function) -> exercise name
    classes: list[tuple[type, str]] = field(default_factory=list)
    functions: list[tuple[Any, str]] = field(default_factory=list)  # (function students write, "Name.method")
    codes: dict[int, str] = field(default_factory=dict)  # id(code) of what students write -> "Name.method"
    digests: dict[str, str] = field(default_factory=dict)  # digest of what students write -> "Name.method"
    keep: list[Any] = field(default_factory=list)  # keeps the code objects alive, so that ids stay unique


def reference_exercises(names: list[str]) -> dict[str, Any]:
    """The reference objects (transformer_course.reference.*, already imported) named like the exercises."""
    found: dict[str, Any] = {}
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("transformer_course.reference.") or module is None:
            continue
        for name in names:
            value = vars(module).get(name)
            if value is not None and getattr(value, "__module__", "") == module.__name__:
                found.setdefault(name, value)
    return found


def exercise_code(names: list[str]) -> ExerciseCode:
    found = ExerciseCode()
    for name, value in reference_exercises(names).items():
        found.objects[id(value)] = name
        found.keep.append(value)
        if isinstance(value, type):
            found.classes.append((value, name))
        for function in functions_of(value):
            if not written_by_students(function):
                continue
            label = f"{name}.{function.__name__}" if isinstance(value, type) else name
            found.functions.append((function, label))
            for code in code_tree(function.__code__):
                found.codes[id(code)] = label
                found.keep.append(code)
            if substantial(function.__code__):
                found.digests[digest(function.__code__)] = label
    return found


def exercise_labels(names: list[str]) -> list[str]:
    """The names the watcher may give parts of the reference ("MultiHeadAttention.forward", "collate")."""
    found = exercise_code(names)
    return sorted({*found.codes.values(), *found.objects.values()})


def notebook_digests(notebook: Any, max_characters: int = 200_000) -> set[str]:
    """Digests of every substantial function written in the notebook's code cells (compiled here, never
    run), so that code a student typed, even a copy of the reference, is told apart from code that was
    made while the notebook ran."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        transform = TransformerManager().transform_cell
    except ImportError:  # plain Python cells still compile
        def transform(source: str) -> str:
            return source
    found: set[str] = set()
    for cell in notebook.get("cells", []):
        source = cell.get("source") if cell.get("cell_type") == "code" else None
        if not isinstance(source, str) or len(source) > max_characters:
            continue
        try:
            code = compile(transform(source), "<cell>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            continue
        for each in code_tree(code):
            if each.co_name != "<module>" and substantial(each):
                found.add(digest(each))
    return found
