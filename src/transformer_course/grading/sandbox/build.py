"""The grading build: the course package as one notebook's sandbox gets it, made in the grader, kept in memory.

While grading, a student's code runs in a sandbox (`isolation`) that must not *hold* what decides or answers:
the checks' judging code (expected values, comparisons, messages) and the reference solution of the exercises
being graded. The sandbox therefore sees neither `checks/` nor `reference/` on disk (`isolation.course_paths`),
and its zygote imports neither (`runner.preload`). Each runner, right after the zygote forked it, receives from
the grader over the channel the sources of *its* build (`grading_build`) and imports them from memory
(`BuildFinder`), so no other notebook's build is ever on disk or in this runner's memory:

- every checks module that defines checks or experiments is cut down to its student side: the
  `@on_student_side` experiments (`checks.boundary`), the checks' records (dataclasses, which the channel
  carries), module constants and imports, and whatever module-level name these use, followed across checks
  modules (`student_side`). Every other function is gone; a public check becomes a stub that raises, when an
  ordinary cell calls it while grading, that checks are judged by the grader (`boundary.judged_by_grader`); a
  helper marked `shown_in_the_notebook` (a demonstration's, not a check) hands back its argument instead. The
  checks' shared machinery that computes no expected value (framework, errors, crash, compare, boundary) is kept
  whole: the runner and the notebook's summary cell use it. Nothing here is a list of checks: a new check or
  experiment is found by its decorator.
- in the reference modules, the `### BEGIN SOLUTION` / `### END SOLUTION` regions of the exercises of the stage
  being graded are replaced by `raise NotImplementedError(...)` (`strip_solutions`); the stage is the lesson
  whose checks module the notebook's grade cells call, and its exercises are the definitions the lesson
  includes (`lessons/NN_*.py`, `#| include`). Earlier stages' parts, which a notebook builds on, stay.
- where an experiment plugs a part of the graded stage's reference into the student's objects (reference
  attention inside the student's MultiHeadAttention, say), the checks build imports a stand-in from
  `stand_ins`, made of PyTorch's own built-ins, instead (tests/test_grading_build.py: same values).

Every source keeps the line numbers of the file it comes from (what is left out becomes blank lines), and
`BuildFinder` gives each module its real `__file__` and puts its text into `linecache`, so tracebacks show the
lines as they are. Outside grading (a student's own kernel, Colab) none of this is used.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import re
import sys
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = "transformer_course"
CHECKS = f"{PACKAGE}.checks"
REFERENCE = f"{PACKAGE}.reference"
HIDDEN_PACKAGES = (CHECKS, REFERENCE)  # not on the sandbox's disk: each runner gets its own build of them
STAND_INS = f"{CHECKS}.stand_ins"
SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*$", re.MULTILINE | re.DOTALL)
STUB_HELPER = "_judged_by_grader"  # put into a reduced checks module's namespace by BuildFinder
PART_HELPER = "_supplied_part"  # likewise: a part of the graded stage that only a servant gets (`experiment_parts`)

Build = dict[str, tuple[str, str, bool]]  # module name -> (file name, source, is a package)


# --- where the sources are ------------------------------------------------------------------------------------


def package_folder() -> Path:
    """src/transformer_course (or its folder in site-packages), found without importing the checks."""
    return Path(__file__).resolve().parents[2]


def _modules(package: str) -> dict[str, Path]:
    """{module name: file} of one package of the course (its __init__ as the package's own name)."""
    folder = package_folder().joinpath(*package.split(".")[1:])
    found = {}
    for path in sorted(folder.glob("*.py")):
        found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


# --- the checks: their student side -----------------------------------------------------------------------------


def _decorator_name(decorator: ast.expr) -> str:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def _bound_names(statement: ast.stmt) -> list[str]:
    """The module-level names a statement binds."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [statement.name]
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return [(alias.asname or alias.name).split(".")[0] for alias in statement.names]
    targets: list[ast.expr] = []
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, ast.AnnAssign | ast.AugAssign):
        targets = [statement.target]
    return [node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name)]


class _Module:
    """One checks module as the build reads it: its statements, what binds each name, what it imports."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path
        self.text = path.read_text(encoding="utf-8")
        self.tree = ast.parse(self.text, str(path))
        self.binders: dict[str, list[int]] = {}
        for index, statement in enumerate(self.tree.body):
            for bound in _bound_names(statement):
                self.binders.setdefault(bound, []).append(index)
        self.aliases: dict[str, str] = {}  # local name -> a checks module it names
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (checks module, its name there)
        for statement in self.tree.body:
            if isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0:
                for alias in statement.names:
                    local = alias.asname or alias.name
                    if f"{statement.module}.{alias.name}".startswith(f"{CHECKS}.") and statement.module == CHECKS:
                        self.aliases[local] = f"{CHECKS}.{alias.name}"
                    elif statement.module.startswith(f"{CHECKS}."):
                        self.imported[local] = (statement.module, alias.name)
            elif isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.name.startswith(f"{CHECKS}.") and alias.asname:
                        self.aliases[alias.asname] = alias.name

    def experiments_or_checks(self) -> bool:
        return any(_decorator_name(decorator) in ("on_student_side", "check")
                   for statement in self.tree.body if isinstance(statement, ast.FunctionDef)
                   for decorator in statement.decorator_list)

    def roots(self) -> set[int]:
        """Statements kept whatever uses them: experiments, records, constants, imports, the docstring."""
        kept = set()
        for index, statement in enumerate(self.tree.body):
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                if any(_decorator_name(decorator) == "on_student_side" for decorator in statement.decorator_list):
                    kept.add(index)
            elif isinstance(statement, ast.ClassDef):
                if any(_decorator_name(decorator) == "dataclass" for decorator in statement.decorator_list):
                    kept.add(index)  # a record the channel may carry
            elif isinstance(statement, ast.Assign | ast.AnnAssign):
                if any(name.isupper() or name.startswith("__") for name in _bound_names(statement)):
                    kept.add(index)
            elif not isinstance(statement, ast.AugAssign):
                kept.add(index)  # imports, the docstring, module-level blocks
        return kept

    def uses(self, index: int) -> Iterable[tuple[str, str]]:
        """(module, name) of every module-level name of the checks that statement `index` uses."""
        for node in ast.walk(self.tree.body[index]):
            if isinstance(node, ast.Name):
                if node.id in self.imported:
                    yield self.imported[node.id]
                elif node.id in self.binders:
                    yield self.name, node.id
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.aliases:
                yield self.aliases[node.value.id], node.attr


@cache
def _checks_modules() -> dict[str, _Module]:
    return {name: _Module(name, path) for name, path in _modules(CHECKS).items()}


@cache
def kept_statements() -> dict[str, frozenset[int] | None]:
    """{checks module: the indices of the statements its student side keeps}, None for a module kept whole: the
    transitive closure, across the checks modules, of what the experiments, records and constants use."""
    modules = _checks_modules()
    whole = {name for name, module in modules.items() if not module.experiments_or_checks()}
    kept: dict[str, set[int]] = {name: set() for name in modules}
    pending: list[tuple[str, int]] = []
    for name, module in modules.items():
        if name not in whole:
            pending += [(name, index) for index in module.roots()]
    while pending:
        name, index = pending.pop()
        if index in kept[name]:
            continue
        kept[name].add(index)
        for used_module, used in modules[name].uses(index):
            if used_module in whole or used_module not in modules:
                continue
            pending += [(used_module, binder) for binder in modules[used_module].binders.get(used, [])]
    return {name: None if name in whole else frozenset(kept[name]) for name in modules}


def student_side(name: str, own_stage: Mapping[str, str] | None = None) -> str:
    """The source of checks module `name` as the sandbox gets it (same line numbers): what `kept_statements`
    keeps, a stub for every public function it leaves out, and, for the names in `own_stage` ({name bound by an
    import from the reference: the stand-in's name}), an import of the stand-in instead."""
    module = _checks_modules()[name]
    kept = kept_statements()[name]
    lines = module.text.split("\n")
    if kept is None:
        return module.text
    output = [""] * len(lines)
    for index, statement in enumerate(module.tree.body):
        first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", []))]) - 1
        last = statement.end_lineno or statement.lineno
        if index in kept and isinstance(statement, ast.FunctionDef) and statement.name.endswith("_stand_in"):
            output[first] = f"{statement.name} = {PART_HELPER}({name + ':' + statement.name!r})"  # `experiment_parts`
        elif index in kept:
            output[first:last] = _with_stand_ins(statement, lines[first:last], own_stage or {})
        elif isinstance(statement, ast.FunctionDef) and not statement.name.startswith("_"):
            output[first] = _stub(statement)
    return "\n".join(output)


def _stub(function: ast.FunctionDef) -> str:
    """One line standing for a public function the build leaves out (a check, or a helper the grader uses)."""
    title = ""
    for decorator in function.decorator_list:
        if _decorator_name(decorator) == "shown_in_the_notebook":  # a demonstration's helper: its argument back
            return f"{function.name} = {STUB_HELPER}({function.name!r}, unchanged=True)"
        if (_decorator_name(decorator) == "check" and isinstance(decorator, ast.Call) and decorator.args
                and isinstance(decorator.args[0], ast.Constant) and isinstance(decorator.args[0].value, str)):
            title = decorator.args[0].value
    return f"{function.name} = {STUB_HELPER}({function.name!r}, {title!r})"


def _with_stand_ins(statement: ast.stmt, lines: list[str], own_stage: Mapping[str, str]) -> list[str]:
    """An import from the reference of a part the graded stage's students write, made an import of its stand-in
    (the rest of the statement's lines blank); any other statement as it is."""
    if not (isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith(REFERENCE)):
        return lines
    replaced = [alias for alias in statement.names if (alias.asname or alias.name) in own_stage]
    if not replaced:
        return lines
    names = [f"{own_stage[alias.asname or alias.name]} as {alias.asname or alias.name}" for alias in replaced]
    others = [f"{alias.name} as {alias.asname or alias.name}" for alias in statement.names if alias not in replaced]
    text = f"from {STAND_INS} import {', '.join(names)}"
    if others:
        text += f"; from {statement.module} import {', '.join(others)}"
    return [text] + [""] * (len(lines) - 1)


# --- the reference: the graded stage's exercises taken out ----------------------------------------------------


@cache
def stages() -> tuple[tuple[str, frozenset[tuple[str, str]]], ...]:
    """Per lesson, in the course's order: (its checks module, the (reference module, definition) it includes),
    read from lessons/NN_*.py next to the package (an editable install, as the grader runs). Empty when there is
    no lessons folder (see `own_exercises`)."""
    folder = package_folder().parent.parent / "lessons"
    found = []
    for path in sorted(folder.glob("[0-9][0-9]_*.py")):
        text = path.read_text(encoding="utf-8")
        checks = re.search(rf"^from {re.escape(CHECKS)} import (\w+) as check\b", text, re.MULTILINE)
        included = frozenset(tuple(match.groups()) for match in
                             re.finditer(r"^\s*#\| include ([\w.]+):(\w+)\s*$", text, re.MULTILINE))
        found.append((f"{CHECKS}.{checks.group(1)}" if checks else "", included))
    return tuple(found)


# Exercise parts an experiment plugs into the student's objects whose solution regions stay in the build of their
# own stage. None: every experiment that plugs in a part of the graded stage uses a stand-in with the reference's
# values (`stand_ins`, or one written beside the experiment in its checks module: the checks may not import the
# grading package), so no reference part can be handed in (website/instructor/threat-model.md, *Isolation*).
KEPT_FOR_EXPERIMENTS: frozenset[tuple[str, str]] = frozenset()


def _enclosing(tree: ast.Module, line: int) -> str:
    """The qualified name of the innermost function or class of `tree` around `line`."""
    names: list[str] = []
    body: list[ast.stmt] = tree.body
    while True:
        inside = next((node for node in body if isinstance(node, ast.FunctionDef | ast.ClassDef)
                       and node.lineno <= line <= (node.end_lineno or node.lineno) + 1), None)
        if inside is None:
            return ".".join(names)
        names.append(inside.name)
        body = inside.body


@cache
def _definitions_with_solutions() -> dict[tuple[str, str], tuple[int, int]]:
    """(reference module, top-level definition) -> its lines, for every definition holding a solution region."""
    found = {}
    for name, path in _modules(REFERENCE).items():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        regions = [text.count("\n", 0, match.start()) + 1 for match in SOLUTION.finditer(text)]
        for statement in tree.body:
            if isinstance(statement, ast.FunctionDef | ast.ClassDef):
                first, last = statement.lineno, statement.end_lineno or statement.lineno
                if any(first <= line <= last + 1 for line in regions):
                    found[name, statement.name] = (first, last)
    return found


def own_exercises(checks: str, exercises: Iterable[str] = ()) -> set[tuple[str, str]]:
    """The reference definitions whose solution regions the notebook graded with `checks` must not hold: those its
    lesson includes; without lessons (or for a notebook of no known lesson), those named like its `exercises`."""
    solved = _definitions_with_solutions()
    for module, included in stages():
        if module == checks and checks:
            return {definition for definition in included if definition in solved}
    wanted = set(exercises)
    return {definition for definition in solved if definition[1] in wanted}


def later_exercises(checks: str) -> set[tuple[str, str]]:
    """The reference definitions holding a solution region of an exercise of a stage after the one graded with
    `checks` (an earlier notebook may use them: stage 0 collates with stage 5's `collate`); empty for a notebook of
    no known lesson."""
    solved = _definitions_with_solutions()
    order = [module for module, _ in stages()]
    if not checks or checks not in order:
        return set()
    return {definition for _, included in stages()[order.index(checks) + 1:]
            for definition in included if definition in solved}


def available_stand_ins() -> set[str]:
    """The names of the functions of `stand_ins` (read from its source: the grader imports no reference for this)."""
    return {statement.name for statement in ast.parse((package_folder() / "checks" / "stand_ins.py").read_text(
        encoding="utf-8")).body if isinstance(statement, ast.FunctionDef) and not statement.name.startswith("_")}


def stand_in_definitions(text: str, definitions: Mapping[str, tuple[int, int]]) -> str:
    """`text` with each named top-level definition ({name: its lines}) replaced by an import of the stand-in of
    that name (same number of lines): a later stage's exercise that the graded notebook uses keeps its values,
    not its solution."""
    lines = text.split("\n")
    decorated = {statement.name: min(decorator.lineno for decorator in statement.decorator_list)
                 for statement in ast.parse(text).body
                 if isinstance(statement, ast.FunctionDef | ast.ClassDef) and statement.decorator_list}
    for name, (first, last) in definitions.items():
        first = min(first, decorated.get(name, first))  # its decorators go with it
        lines[first - 1:last] = [f"from {STAND_INS} import {name}  # a stand-in: the reference solution of a later "
                                 f"stage's exercise is not in this build"] + [""] * (last - first)
    return "\n".join(lines)


def strip_solutions(text: str, definitions: Iterable[tuple[int, int]], keep: Iterable[str] = ()) -> str:
    """`text` with every solution region inside the given line ranges replaced by `raise NotImplementedError`
    (same number of lines), except those inside the functions named in `keep` (qualified names)."""
    ranges, kept = list(definitions), set(keep)
    tree = ast.parse(text) if kept else None

    def replace(match: re.Match[str]) -> str:
        line = text.count("\n", 0, match.start()) + 1
        if not any(first <= line <= last + 1 for first, last in ranges):
            return match.group(0)
        if tree is not None and _enclosing(tree, line) in kept:
            return match.group(0)
        indent = match.group(1)
        return (f"{indent}raise NotImplementedError('the reference solution of this exercise is not in the grading "
                f"sandbox')" + "\n" * match.group(0).count("\n"))

    return SOLUTION.sub(replace, text)


# --- one notebook's build --------------------------------------------------------------------------------------


def stand_ins_for(stripped: set[tuple[str, str]]) -> dict[str, dict[str, str]]:
    """{checks module: {local name: stand-in}} for every reference part of `stripped` that a checks module's student
    side imports: the stand-in is `stand_ins.<definition name>` (tests require one for each such part)."""
    available = available_stand_ins()
    names = {definition for _, definition in stripped}
    found: dict[str, dict[str, str]] = {}
    for name, module in _checks_modules().items():
        kept = kept_statements()[name]
        for index, statement in enumerate(module.tree.body):
            if kept is not None and index not in kept:
                continue
            if isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith(REFERENCE):
                for alias in statement.names:
                    if alias.name in names and alias.name in available:
                        found.setdefault(name, {})[alias.asname or alias.name] = alias.name
    return found


def grading_build(checks: str, exercises: Iterable[str] = ()) -> Build:
    """The checks and reference packages for the runner of one notebook (graded with `checks`, its exercises
    `exercises`): {module name: (file name, source, is a package)}. The reference holds no solution of an exercise
    of the graded stage (`raise NotImplementedError`) nor of a later stage (a stand-in where `stand_ins` has one of
    that name, else `raise NotImplementedError`)."""
    stripped = own_exercises(checks, exercises)
    later = later_exercises(checks) - stripped
    solved = _definitions_with_solutions()
    available = available_stand_ins()
    plugged = stand_ins_for(stripped | later)
    build: Build = {}
    for name, path in _modules(CHECKS).items():
        text = student_side(name, plugged.get(name))
        if name == STAND_INS:  # the graded stage's stand-ins reach only the servants whose experiments plug them
            text = _parts_as_proxies(text, own_parts(checks, exercises))
        build[name] = (str(path), text, path.stem == "__init__")
    for name, path in _modules(REFERENCE).items():
        text = path.read_text(encoding="utf-8")
        replaced = {definition: solved[module, definition] for module, definition in later
                    if module == name and definition in available}
        ranges = [solved[module, definition] for module, definition in stripped | later
                  if module == name and definition not in replaced]
        keep = [qualname for module, qualname in KEPT_FOR_EXPERIMENTS if module == name]
        if ranges:
            text = strip_solutions(text, ranges, keep)
        if replaced:
            text = stand_in_definitions(text, replaced)
        build[name] = (str(path), text, path.stem == "__init__")
    return build


# --- the graded stage's parts: only in the servant of an experiment that plugs them ------------------------------
#
# Where an experiment plugs a part of the graded stage into the student's objects (the stand-in attention inside
# their MultiHeadAttention, the stand-in loss inside their train_epoch), that part has the values of an exercise
# the notebook is graded on. In the runner it is a proxy (`checks.boundary.supplied_part`) that nothing can call;
# its code reaches a servant with the request of an experiment that uses it (`experiment_parts`), and is gone with
# the experiment. So no ordinary cell, and no experiment that runs the student's own version of that exercise, can
# reach it.


def own_parts(checks: str, exercises: Iterable[str] = ()) -> frozenset[str]:
    """The functions of `stand_ins` that stand for exercises of the graded stage."""
    return frozenset(definition for _, definition in own_exercises(checks, exercises)) & available_stand_ins()


def _function_lines(text: str) -> dict[str, tuple[int, int]]:
    """{top-level function: (first line with its decorators, last line)} of a module's source."""
    found = {}
    for statement in ast.parse(text).body:
        if isinstance(statement, ast.FunctionDef):
            first = min([statement.lineno, *(decorator.lineno for decorator in statement.decorator_list)])
            found[statement.name] = (first, statement.end_lineno or statement.lineno)
    return found


def _parts_as_proxies(text: str, parts: Iterable[str]) -> str:
    """`stand_ins`'s source with each function of `parts` made a proxy (same number of lines)."""
    lines = text.split("\n")
    for name, (first, last) in _function_lines(text).items():
        if name in parts:
            lines[first - 1:last] = [f"{name} = {PART_HELPER}({STAND_INS + ':' + name!r})"] + [""] * (last - first)
    return "\n".join(lines)


def _source_of(key: str) -> tuple[str, str]:
    """(file name, source) defining the part `key` ("module:function") at its own lines (blank lines above)."""
    module, name = key.split(":")
    path = _modules(CHECKS)[module]
    text = path.read_text(encoding="utf-8")
    first, last = _function_lines(text)[name]
    lines = text.split("\n")
    return str(path), "\n" * (first - 1) + "\n".join(lines[first - 1:last]) + "\n"


@cache
def experiment_parts(checks: str, exercises: tuple[str, ...], module: str, qualname: str
                     ) -> tuple[tuple[str, str, str], ...]:
    """(key, file name, source) of every part of the graded stage that the experiment `module.qualname` uses,
    followed through the checks modules' functions: the in-module stand-ins (`_..._stand_in`) and the stand-ins
    the build's checks import for the graded stage's reference parts, with the stand-ins these call."""
    modules = _checks_modules()
    if module not in modules:
        return ()
    own = own_parts(checks, exercises)
    plugged = stand_ins_for(own_exercises(checks, exercises))
    found: set[str] = set()
    pending = [(module, index) for index in modules[module].binders.get(qualname.split(".")[0], [])]
    seen: set[tuple[str, int]] = set()
    while pending:
        name, index = pending.pop()
        if (name, index) in seen or name not in modules:
            continue
        seen.add((name, index))
        statement = modules[name].tree.body[index]
        if isinstance(statement, ast.FunctionDef) and statement.name.endswith("_stand_in"):
            found.add(f"{name}:{statement.name}")
        if isinstance(statement, ast.ImportFrom):
            continue  # an import binds many names: only the ones used are followed (below)
        for used_module, used in modules[name].uses(index):
            if used_module in modules and used in plugged.get(used_module, {}):
                found.add(f"{STAND_INS}:{plugged[used_module][used]}")
            elif used_module in modules:
                pending += [(used_module, binder) for binder in modules[used_module].binders.get(used, [])]
    stand_ins = modules.get(STAND_INS)
    if stand_ins is not None:  # a stand-in that calls another of the graded stage's gets that one too
        queue = [key.split(":")[1] for key in found if key.startswith(f"{STAND_INS}:")]
        while queue:
            for index in stand_ins.binders.get(queue.pop(), []):
                for _, used in stand_ins.uses(index):
                    if used in own and f"{STAND_INS}:{used}" not in found:
                        found.add(f"{STAND_INS}:{used}")
                        queue.append(used)
    return tuple((key, *_source_of(key)) for key in sorted(found))


def warm_up_parts(modules: Iterable[str]) -> list[str]:
    """The parts of PyTorch the named checks modules' grade cells meet (their `WARM_UP`, read from the source:
    the zygote cannot import the checks), all of them for a checks module that names none. The package itself and
    the machinery beside the checks (no check, no experiment: framework, compare, ...) name no grade cell's parts:
    counting them as "names none" warmed up every part for every stage."""
    parts: list[str] = []
    everything = ["shape checks", "optimiser step"]
    for name in modules:
        module = _checks_modules().get(name)
        if module is None or not module.experiments_or_checks():
            continue
        named = everything
        for statement in module.tree.body:
            if "WARM_UP" in _bound_names(statement) and getattr(statement, "value", None) is not None:
                try:
                    named = list(ast.literal_eval(statement.value))  # type: ignore[arg-type]
                except ValueError:
                    named = everything
        parts += [part for part in named if part not in parts]
    return parts


# --- the runner's side: importing a build from memory ---------------------------------------------------------


class BuildFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of a build (and only those) in memory; first on `sys.meta_path` in a runner."""

    def __init__(self, build: Mapping[str, Any]) -> None:
        self.build = {str(name): (str(entry[0]), str(entry[1]), bool(entry[2])) for name, entry in build.items()}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        entry = self.build.get(fullname)
        if entry is None:
            if fullname.startswith(tuple(f"{package}." for package in HIDDEN_PACKAGES)):
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None
        filename, _, package = entry
        spec = importlib.util.spec_from_loader(fullname, self, origin=filename, is_package=package)
        assert spec is not None
        spec.has_location = True
        if package:
            spec.submodule_search_locations = [str(Path(filename).parent)]
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        filename, source, _ = self.build[module.__name__]
        module.__file__ = filename
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)  # no mtime: checkcache keeps it
        if module.__name__.startswith(f"{CHECKS}.") and f"{STUB_HELPER}(" in source:
            from transformer_course.checks.boundary import judged_by_grader

            module.__dict__[STUB_HELPER] = judged_by_grader
        if module.__name__.startswith(f"{CHECKS}.") and f"{PART_HELPER}(" in source:
            from transformer_course.checks.boundary import supplied_part

            module.__dict__[PART_HELPER] = supplied_part
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)  # noqa: S102 (the course's code)

    def get_source(self, fullname: str) -> str:
        return self.build[fullname][1]


def install(build: Mapping[str, Any]) -> BuildFinder:
    """Import the checks and reference packages from `build` from now on (in a runner, before any notebook code)."""
    for name in [name for name in sys.modules if name in HIDDEN_PACKAGES or name.startswith(
            tuple(f"{package}." for package in HIDDEN_PACKAGES))]:
        del sys.modules[name]  # nothing of the course's files may stay in use (the zygote imports none)
    finder = BuildFinder(build)
    sys.meta_path.insert(0, finder)
    return finder
