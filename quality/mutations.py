"""Mistakes nobody wrote by hand: mechanical mutations of the reference solutions.

The student regions (`### BEGIN SOLUTION` … `### END SOLUTION`) of each stage's reference module
are parsed, and every small syntactic change of a few kinds is made, one at a time:

    swap_operands      a - b -> b - a (non-commutative operators)
    swap_arguments     f(a, b) -> f(b, a)
    change_axis        dim=-1 -> dim=-2, x.transpose(1, 2) -> x.transpose(0, 2), x.size(1) -> x.size(2)
    off_by_one         slice bounds and steps, indices, range()/arange() bounds moved by one
    drop_call          self.dropout(x) -> x, x.contiguous() -> x, torch.softmax(s, dim=-1) -> s
    change_constant    10000.0 -> 1000.0, -1e9 -> 1e9, 0.5 -> 1.0, True -> False
    swap_comparison    != -> ==, < -> <=
    delete_statement   a statement replaced by `pass`
    swap_variable      one use of a variable (or of `self.<attribute>`) replaced by another in scope
    duplicate_call     an operation applied twice: self.dropout(self.dropout(x)), softmax(softmax(s)), a + b + b
    replace_operator   another operator or function of the same kind: + <-> -, * <-> /, @ -> *, sin <-> cos,
                       exp <-> log, softmax <-> log_softmax, relu -> tanh, sum <-> mean, max <-> min, tril <-> triu

Each mutant is an `Edit` of the solution notebook's exercise cell (like the mistake catalog's) plus
the mutated module source, so its behaviour can be compared with the reference's without a
notebook (`quality.behaviour`) and equivalent mutants left out.
"""

from __future__ import annotations

import ast
import importlib.util
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from quality.mistakes import Edit

KINDS = ("swap_operands", "swap_arguments", "change_axis", "off_by_one", "drop_call", "change_constant",
         "swap_comparison", "delete_statement", "swap_variable", "duplicate_call", "replace_operator")

# The reference modules whose student regions each stage's exercises are (a stage may span several).
STAGE_MODULES: dict[str, tuple[str, ...]] = {
    "00_why_attention": ("transformer_course.reference.additive_attention",),
    "01_positional_encoding": ("transformer_course.reference.positional_encoding",),
    "02_attention": ("transformer_course.reference.attention",),
    "03_blocks": ("transformer_course.reference.blocks",),
    "04_transformer": ("transformer_course.reference.model",),
    "05_training": ("transformer_course.reference.training",),
    "06_decoding": ("transformer_course.reference.decoding",),
    "07_fast_and_better_decoding": ("transformer_course.reference.kv_cache",
                                    "transformer_course.reference.beam_search"),
}
# Operators and functions that a mistake may put in each other's place.
OPERATOR_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.MatMult: ast.Mult,
                  ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv}
FUNCTION_SWAPS = {"sin": "cos", "cos": "sin", "exp": "log", "log": "exp", "softmax": "log_softmax",
                  "log_softmax": "softmax", "relu": "tanh", "tanh": "relu", "sum": "mean", "mean": "sum",
                  "max": "min", "min": "max", "amax": "amin", "amin": "amax", "tril": "triu", "triu": "tril",
                  "argmax": "argmin", "argmin": "argmax", "sqrt": "log", "topk": "kthvalue", "unsqueeze": "squeeze",
                  "masked_fill": "masked_fill", "cat": "stack", "stack": "cat", "exp_": "log_"}

# Methods and functions whose integer arguments are axes.
AXIS_CALLS = {"transpose", "softmax", "log_softmax", "size", "unsqueeze", "squeeze", "sum", "mean", "amax",
              "amin", "argmax", "argmin", "max", "min", "cat", "stack", "flatten", "narrow", "permute",
              "unflatten", "norm", "cumsum", "flip", "roll", "movedim", "swapaxes"}
AXIS_KEYWORDS = {"dim", "dims", "start_dim", "end_dim", "axis", "dim0", "dim1"}
NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.MatMult, ast.Pow, ast.Mod, ast.FloorDiv, ast.LShift, ast.RShift)
COMPARISON_SWAPS = {ast.Eq: [ast.NotEq], ast.NotEq: [ast.Eq], ast.Lt: [ast.LtE, ast.GtE], ast.LtE: [ast.Lt, ast.Gt],
                    ast.Gt: [ast.GtE, ast.LtE], ast.GtE: [ast.Gt, ast.Lt], ast.Is: [ast.IsNot],
                    ast.IsNot: [ast.Is]}
MODULE_NAMES = {"torch", "nn", "F", "math", "self", "tqdm", "functools"}


@dataclass(frozen=True)
class Mutant:
    """One mechanical mistake in one stage."""

    assignment: str
    kind: str
    description: str
    function: str  # qualified name of the function or method it is in: "MultiHeadAttention.split_heads"
    line: str  # the statement as written in the reference (first line, stripped)
    mutated: str  # the statement after the mutation (first line, stripped)
    targets: tuple[str, ...]  # what the statement assigns (or returns): the intermediate values it changes
    edit: Edit = field(repr=False)
    module_source: str = field(repr=False)
    module: str = ""  # the reference module it mutates (a stage may span several)

    @property
    def identifier(self) -> str:
        return f"{self.assignment[:2]}:{self.function}:{self.kind}:{self.line} -> {self.mutated}"


def _regions(lines: list[str]) -> list[tuple[int, int]]:
    """1-based inclusive line ranges strictly between the solution markers."""
    regions, start = [], None
    for number, line in enumerate(lines, start=1):
        if line.strip() == "### BEGIN SOLUTION":
            start = number + 1
        elif line.strip() == "### END SOLUTION" and start is not None:
            regions.append((start, number - 1))
            start = None
    return regions


def _inside(node: ast.AST, regions: list[tuple[int, int]]) -> bool:
    first, last = getattr(node, "lineno", 0), getattr(node, "end_lineno", 0)
    return any(start <= first and last <= end for start, end in regions)


def _is_atom(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return not (isinstance(node.value, int | float) and node.value < 0)
    return isinstance(node, ast.Name | ast.Attribute | ast.Call | ast.Subscript | ast.List | ast.Tuple)


def _number(node: ast.AST) -> float | int | bool | None:
    """The value of a numeric literal, `-1` (a unary minus on a literal) included."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, int | float) and not isinstance(node.operand.value, bool):
        return -node.operand.value
    return None


def _literal(value: float | int | bool) -> str:
    return repr(value)


def _call_name(call: ast.Call) -> str:
    function = call.func
    if isinstance(function, ast.Attribute):
        return function.attr
    if isinstance(function, ast.Name):
        return function.id
    return ""


class _Source:
    """The module text with helpers to replace a node's span inside its statement."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines()

    def offset(self, lineno: int, col: int) -> int:
        """Character offset in the text of (1-based line, byte column)."""
        before = sum(len(line) + 1 for line in self.lines[: lineno - 1])
        return before + len(self.lines[lineno - 1].encode("utf-8")[:col].decode("utf-8"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset))

    def statement_lines(self, statement: ast.stmt) -> tuple[int, int]:
        """Character range of the statement's full lines (compound statements: the header only)."""
        last = statement.end_lineno
        if isinstance(statement, ast.For | ast.While | ast.If | ast.With):
            body = statement.body[0]
            last = body.lineno - 1
        start = self.offset(statement.lineno, 0)
        end = self.offset(last, len(self.lines[last - 1].encode("utf-8")))
        return start, end


@dataclass
class _Site:
    """One change: replace characters [start, end) of the module text by `text`."""

    kind: str
    description: str
    statement: ast.stmt
    start: int
    end: int
    text: str


class _Finder(ast.NodeVisitor):
    """Walk one function and collect the mutation sites inside the student regions."""

    def __init__(self, source: _Source, regions: list[tuple[int, int]], qualname: str,
                 function: ast.FunctionDef, attributes: dict[str, str]) -> None:
        self.source, self.regions, self.qualname = source, regions, qualname
        self.attributes = attributes
        self.sites: list[_Site] = []
        self.statement: ast.stmt | None = None
        self.axis_nodes: set[int] = set()
        self.bound_nodes: set[int] = set()
        self.target_names: set[int] = set()  # names being assigned to are not swapped for others
        arguments = [argument.arg for argument in function.args.args + function.args.kwonlyargs]
        assigned = [node.id for node in ast.walk(function) if isinstance(node, ast.Name)
                    and isinstance(node.ctx, ast.Store)]
        self.variables = [name for name in dict.fromkeys(arguments + assigned)
                          if name not in MODULE_NAMES and name != "_"]
        self.defined_at = {name: 0 for name in arguments}
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.defined_at.setdefault(node.id, node.lineno)

    # --- recording ---
    def replace(self, kind: str, node: ast.AST, text: str, description: str) -> None:
        assert self.statement is not None
        start, end = self.source.span(node)
        if self.source.text[start:end] == text:
            return
        self.sites.append(_Site(kind, description, self.statement, start, end, text))

    def replace_node(self, kind: str, node: ast.AST, new: ast.AST, description: str) -> None:
        text = ast.unparse(new)
        self.replace(kind, node, text if _is_atom(new) else f"({text})", description)

    # --- statements ---
    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt):
            if not _inside(node, self.regions) and not isinstance(node, ast.For | ast.If | ast.With | ast.While):
                return
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                return
            previous, self.statement = self.statement, node
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                self.target_names |= {id(name) for target in targets for name in ast.walk(target)
                                      if isinstance(name, ast.Name)}
            if _inside(node, self.regions) and not isinstance(node, ast.For | ast.If | ast.With | ast.While | ast.Try):
                self.delete(node)
            if isinstance(node, ast.For | ast.If | ast.With | ast.While):
                header = [node.iter, node.target] if isinstance(node, ast.For) else (
                    [node.test] if isinstance(node, ast.If | ast.While) else [item.context_expr for item in node.items])
                if _inside(node, self.regions):
                    for child in header:
                        self.visit(child)
                for child in node.body + getattr(node, "orelse", []):
                    self.visit(child)
            else:
                super().generic_visit(node)
            self.statement = previous
            return
        if self.statement is None or not _inside(self.statement, self.regions):
            return
        super().generic_visit(node)

    def delete(self, statement: ast.stmt) -> None:
        start, end = self.source.statement_lines(statement)
        indent = re.match(r"\s*", self.source.lines[statement.lineno - 1]).group(0)
        self.sites.append(_Site("delete_statement", "statement deleted", statement, start, end, indent + "pass"))

    # --- expressions ---
    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, NON_COMMUTATIVE):
            new = ast.BinOp(left=node.right, op=node.op, right=node.left)
            self.replace_node("swap_operands", node, new, f"operands of `{ast.unparse(node)}` swapped")
        replacement = OPERATOR_SWAPS.get(type(node.op))
        if replacement is not None:
            new = ast.BinOp(left=node.left, op=replacement(), right=node.right)
            self.replace_node("replace_operator", node, new, f"`{ast.unparse(node)}` -> `{ast.unparse(new)}`")
        if isinstance(node.op, ast.Add | ast.Mult | ast.Sub | ast.Div):
            new = ast.BinOp(left=node, op=node.op, right=node.right)
            self.replace_node("duplicate_call", node, new, f"`{ast.unparse(node)}` -> `{ast.unparse(new)}` "
                              "(the operation applied twice)")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if len(node.ops) == 1:
            for replacement in COMPARISON_SWAPS.get(type(node.ops[0]), []):
                new = ast.Compare(left=node.left, ops=[replacement()], comparators=node.comparators)
                self.replace_node("swap_comparison", node, new, f"`{ast.unparse(node)}` -> `{ast.unparse(new)}`")
            if isinstance(node.ops[0], ast.Lt | ast.LtE | ast.Gt | ast.GtE):
                new = ast.Compare(left=node.comparators[0], ops=node.ops, comparators=[node.left])
                self.replace_node("swap_operands", node, new, f"operands of `{ast.unparse(node)}` swapped")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node)
        positional = [argument for argument in node.args if not isinstance(argument, ast.Starred)]
        if len(positional) == len(node.args) >= 2:
            for index in range(len(node.args) - 1):
                swapped = list(node.args)
                swapped[index], swapped[index + 1] = swapped[index + 1], swapped[index]
                new = ast.Call(func=node.func, args=swapped, keywords=node.keywords)
                self.replace_node("swap_arguments", node, new, f"arguments {index + 1} and {index + 2} of "
                                  f"`{name}` swapped")
        if name in AXIS_CALLS:
            for argument in node.args:
                self._axis(argument, name)
        for keyword in node.keywords:
            if keyword.arg in AXIS_KEYWORDS:
                self._axis(keyword.value, name)
        if name in {"range", "arange"}:
            for argument in node.args[:2]:
                self._bound(argument, f"`{name}` bound")
        self._drop(node, name)
        self._duplicate(node, name)
        self._replace_function(node, name)
        self.generic_visit(node)

    def _duplicate(self, node: ast.Call, name: str) -> None:
        """f(x) -> f(f(x)) for a call of one tensor argument; x.f(...) -> x.f(...).f(...)."""
        function = node.func
        if isinstance(function, ast.Attribute) and not (isinstance(function.value, ast.Name)
                                                        and function.value.id in MODULE_NAMES):
            new = ast.Call(func=ast.Attribute(value=node, attr=function.attr, ctx=ast.Load()), args=node.args,
                           keywords=node.keywords)
            self.replace_node("duplicate_call", node, new, f"`.{name}(...)` applied twice")
        elif node.args and not isinstance(node.args[0], ast.Starred) and name not in {"range", "len", "zip",
                                                                                           "enumerate", "isinstance"}:
            new = ast.Call(func=node.func, args=[node, *node.args[1:]], keywords=node.keywords)
            self.replace_node("duplicate_call", node, new, f"`{name}` applied twice")

    def _replace_function(self, node: ast.Call, name: str) -> None:
        other = FUNCTION_SWAPS.get(name)
        if other is None or other == name:
            return
        function = node.func
        if isinstance(function, ast.Attribute):
            new_function: ast.expr = ast.Attribute(value=function.value, attr=other, ctx=ast.Load())
        elif isinstance(function, ast.Name):
            new_function = ast.Name(id=other, ctx=ast.Load())
        else:
            return
        new = ast.Call(func=new_function, args=node.args, keywords=node.keywords)
        self.replace_node("replace_operator", node, new, f"`{name}` -> `{other}`")

    def _drop(self, node: ast.Call, name: str) -> None:
        function = node.func
        if isinstance(function, ast.Attribute) and not (isinstance(function.value, ast.Name)
                                                        and function.value.id in MODULE_NAMES):
            self.replace_node("drop_call", node, function.value, f"call of `.{name}(...)` dropped")
        elif len(node.args) == 1 and not isinstance(node.args[0], ast.Starred):
            self.replace_node("drop_call", node, node.args[0], f"call of `{name}` dropped (its argument kept)")
        elif name in {"max", "min"} and node.args:
            self.replace_node("drop_call", node, node.args[0], f"call of `{name}` dropped (first argument kept)")

    def _axis(self, node: ast.AST, name: str) -> None:
        value = _number(node)
        if not isinstance(value, int) or isinstance(value, bool):
            if isinstance(node, ast.Tuple | ast.List):
                for element in node.elts:
                    self._axis(element, name)
            return
        self.axis_nodes.add(id(node))
        for other in dict.fromkeys((value + 1, value - 1, -value - 1 if value >= 0 else -value - 1)):
            if other != value:
                self.replace("change_axis", node, _literal(other) if other >= 0 else f"({other})",
                             f"axis {value} -> {other} in `{name}`")

    def _bound(self, node: ast.AST, what: str) -> None:
        self.bound_nodes.add(id(node))
        for step in (1, -1):
            value = _number(node)
            if value is not None and not isinstance(value, bool):
                text = _literal(value + step)
                text = text if value + step >= 0 else f"({text})"
            else:
                text = f"({ast.unparse(node)} {'+' if step > 0 else '-'} 1)"
            self.replace("off_by_one", node, text, f"{what} {'+1' if step > 0 else '-1'}")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for part in parts:
            if isinstance(part, ast.Slice):
                for bound, label in ((part.lower, "slice start"), (part.upper, "slice end"), (part.step, "step")):
                    if bound is not None:
                        self._bound(bound, label)
            elif _number(part) is not None:
                self._bound(part, "index")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        self._constant(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if _number(node) is not None:
            self._constant(node)
            return
        self.generic_visit(node)

    def _constant(self, node: ast.AST) -> None:
        if id(node) in self.axis_nodes or id(node) in self.bound_nodes:
            return
        value = node.value if isinstance(node, ast.Constant) else _number(node)
        if isinstance(value, bool):
            candidates = [not value]
        elif isinstance(value, int):
            candidates = [value + 1, value - 1] if value not in (0, 1) else [1 - value, 2]
        elif isinstance(value, float):
            candidates = [value * 10, value / 10, -value] if value else [1.0]
        else:
            return
        for other in candidates:
            text = _literal(other)
            self.replace("change_constant", node, text if not str(text).startswith("-") else f"({text})",
                         f"constant {value!r} -> {other!r}")

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load) or node.id not in self.variables or id(node) in self.target_names:
            return
        for other in self.variables:
            if other != node.id and self.defined_at.get(other, 10**9) < node.lineno:
                self.replace("swap_variable", node, other, f"`{node.id}` -> `{other}`")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr in self.attributes:
            for other, kind in self.attributes.items():
                if other != node.attr and kind == self.attributes[node.attr]:
                    self.replace("swap_variable", node, f"self.{other}", f"`self.{node.attr}` -> `self.{other}`")
            return
        self.generic_visit(node)


def _targets(statement: ast.stmt, qualname: str) -> tuple[str, ...]:
    names: list[str] = []
    targets = []
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.AugAssign | ast.AnnAssign):
        targets = [statement.target]
    elif isinstance(statement, ast.For):
        targets = [statement.target]
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.append(node.id)
            elif isinstance(node, ast.Attribute):
                names.append(node.attr)
    if isinstance(statement, ast.Return):
        names.append(qualname.rpartition(".")[2])
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        names.append(_call_name(statement.value))
    return tuple(dict.fromkeys(names))


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef, dict[str, str]]]:
    """(qualified name, function, the class's `self.` attributes) for every function and method."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, node, []
        elif isinstance(node, ast.ClassDef):
            kinds: dict[str, str] = {}  # self.<attribute> -> "module" (built by a call) or "value"
            for method in node.body:
                if not (isinstance(method, ast.FunctionDef) and method.name == "__init__"):
                    continue
                for statement in ast.walk(method):
                    if not isinstance(statement, ast.Assign | ast.AnnAssign):
                        continue
                    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                    for target in targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                and target.value.id == "self":
                            kinds.setdefault(target.attr, "module" if isinstance(statement.value, ast.Call)
                                             else "value")
            for method in node.body:
                if isinstance(method, ast.FunctionDef):
                    yield f"{node.name}.{method.name}", method, kinds


def module_source(module_name: str) -> str:
    spec = importlib.util.find_spec(module_name)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).read_text(encoding="utf-8")


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def generate(assignment: str, solution_cells: list[str] | None = None) -> list[Mutant]:
    """Every mutant of one stage, in a fixed order. With `solution_cells` (the sources of the solution
    notebook's exercise cells), only mutants whose edit applies to exactly one cell are kept."""
    mutants: dict[str, Mutant] = {}
    for module_name in STAGE_MODULES[assignment]:
        for mutant in _generate_module(assignment, module_name, solution_cells):
            mutants.setdefault(mutant.identifier, mutant)
    return list(mutants.values())


def _generate_module(assignment: str, module_name: str, solution_cells: list[str] | None) -> Iterator[Mutant]:
    text = module_source(module_name)
    source = _Source(text)
    tree = ast.parse(text)
    regions = _regions(source.lines)
    for qualname, function, attributes in _functions(tree):
        if not any(function.lineno <= start and end <= function.end_lineno for start, end in regions):
            continue
        finder = _Finder(source, regions, qualname, function, attributes)
        for statement in function.body:
            finder.visit(statement)
        for site in finder.sites:
            line_start, line_end = source.statement_lines(site.statement)
            line_start = min(line_start, site.start)
            original = text[line_start:line_end]
            changed = text[line_start:site.start] + site.text + text[site.end:line_end]
            if site.kind == "delete_statement":
                changed = site.text
            mutated_text = text[:line_start] + changed + text[line_end:]
            try:
                ast.parse(mutated_text)
            except SyntaxError:
                continue
            edit = _edit(assignment, original, changed, text, line_start, solution_cells)
            if edit is None:
                continue
            yield Mutant(assignment, site.kind, site.description, qualname, _first_line(original),
                         _first_line(changed), _targets(site.statement, qualname), edit, mutated_text, module_name)


def _edit(assignment: str, original: str, changed: str, text: str, start: int,
          solution_cells: list[str] | None) -> Edit | None:
    """An Edit whose `find` occurs once in one solution cell: the statement, widened by the lines
    before it until it is unique."""
    before = text[:start]
    find, replace = original, changed
    for _ in range(6):
        if solution_cells is None:
            return Edit(assignment, "mutant", find, replace)
        hits = [cell for cell in solution_cells if find in cell]
        if len(hits) == 1 and hits[0].count(find) == 1:
            return Edit(assignment, "mutant", find, replace)
        if not hits or not before:
            return None
        previous = before.rstrip("\n").rpartition("\n")
        line = previous[2] + "\n"
        before = previous[0] + ("\n" if previous[0] else "")
        find, replace = line + find, line + replace
    return None


def sample(mutants: list[Mutant], per_kind: int, seed: int, exclude: set[str] | None = None) -> list[Mutant]:
    """Up to `per_kind` mutants of every kind, drawn at random with `seed`, leaving out `exclude` ids."""
    generator = random.Random(seed)
    chosen: list[Mutant] = []
    for kind in KINDS:
        pool = [mutant for mutant in mutants if mutant.kind == kind and mutant.identifier not in (exclude or set())]
        generator.shuffle(pool)
        chosen.extend(pool[:per_kind])
    return chosen
