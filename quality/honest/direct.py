"""The checks of a stage called directly on a student's objects, in this process, outside the grader.

Outside grading a check calls the student's objects itself, so this works whatever the grader's design: the
student's notebook is reduced to the cells that only define things (imports, functions, classes) and its
exercise cells, executed in a fresh namespace, and every `assert check.<name>(...)` of the stage's grade cells
(hidden tests included, read from the source notebook in `solutions/`) is made as the undecorated check,
`check.<name>.__wrapped__(<the student's objects>, **keywords)`, which raises `CheckFailed` when the property
does not hold (a prediction is scored, as while grading: outside grading its check only notes it). No cell that
loads data, trains or draws runs here.
"""

from __future__ import annotations

import ast
import importlib
import linecache
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nbformat
import torch

from quality.mistakes import is_solution
from transformer_course.grading.cells import checks_module, is_grade_cell

_HIDDEN_MARKERS = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


@dataclass(frozen=True)
class Call:
    """One `assert check.<name>(<objects>, **keywords)` of a grade cell."""

    grade_id: str
    name: str  # the check function
    objects: tuple[str, ...]  # the notebook names passed positionally (the student's class or function)
    keywords: dict[str, Any]

    def __str__(self) -> str:
        arguments = [*self.objects, *(f"{key}={value!r}" for key, value in self.keywords.items())]
        return f"{self.grade_id}: check.{self.name}({', '.join(arguments)})"


def grade_calls(source_notebook: nbformat.NotebookNode) -> list[Call]:
    """Every check call of every grade cell of a source notebook (solutions/), hidden tests included, in order."""
    calls = []
    for cell in source_notebook.cells:
        if not is_grade_cell(cell):
            continue
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        code = "\n".join(line for line in cell.source.splitlines() if line.strip() not in _HIDDEN_MARKERS)
        for statement in ast.parse(code).body:
            if not (isinstance(statement, ast.Assert) and isinstance(statement.test, ast.Call)
                    and isinstance(statement.test.func, ast.Attribute)
                    and isinstance(statement.test.func.value, ast.Name) and statement.test.func.value.id == "check"):
                raise ValueError(f"grade cell {grade_id}: not an `assert check.<name>(...)`: {ast.unparse(statement)}")
            test = statement.test
            objects = tuple(argument.id for argument in test.args if isinstance(argument, ast.Name))
            if len(objects) != len(test.args):
                raise ValueError(f"grade cell {grade_id}: positional arguments other than names: {ast.unparse(test)}")
            keywords = {keyword.arg: ast.literal_eval(keyword.value) for keyword in test.keywords if keyword.arg}
            calls.append(Call(grade_id, test.func.attr, objects, keywords))
    return calls


def _defines_only(source: str) -> bool:
    """Whether a code cell only imports and defines (so running it loads, trains and draws nothing)."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
    return bool(body) and all(isinstance(statement, allowed) for statement in body)


def student_namespace(notebook: nbformat.NotebookNode) -> dict[str, Any]:
    """The notebook's definitions and exercise cells, executed in order in a fresh namespace."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or is_grade_cell(cell):
            continue
        if not (is_solution(cell) or _defines_only(cell.source)):
            continue
        filename = f"<honest notebook cell {index}: {cell.get('id', '')}>"
        linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
        exec(compile(cell.source, filename, "exec"), namespace)  # noqa: S102  (our own students' code)
    return namespace


def run_checks(notebook: nbformat.NotebookNode, source_notebook: nbformat.NotebookNode,
               ) -> dict[str, str | None]:
    """{call as text: None when the property holds, else the check's message} for every check call of the
    stage's grade cells, made on the objects `notebook` defines."""
    module_name = checks_module(source_notebook)
    if module_name is None:
        raise ValueError("the notebook's grade cells call no checks module")
    checks = importlib.import_module(module_name)
    from transformer_course.checks.framework import CheckFailed, check_arguments
    from transformer_course.checks.predictions import scored

    namespace = student_namespace(notebook)
    outcomes: dict[str, str | None] = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the checks' models are tiny: one thread runs them several times faster
    try:
        for call in grade_calls(source_notebook):
            undecorated: Callable[..., Any] = getattr(checks, call.name).__wrapped__
            try:
                with scored():  # a prediction is scored, as while grading (outside grading it is only noted)
                    undecorated(*(namespace[name] for name in call.objects), **check_arguments(call.keywords))
            except CheckFailed as failure:
                outcomes[str(call)] = str(failure)
            except Exception as error:  # the student's code crashed inside the check: keep where
                outcomes[str(call)] = "".join(traceback.format_exception(error))[-3000:]
            else:
                outcomes[str(call)] = None
    finally:
        torch.set_num_threads(threads)
    return outcomes


__all__ = ["Call", "grade_calls", "run_checks", "student_namespace"]
