"""Doing nothing never earns points (issue 29, item 6): every exercise of every stage, its function and method
bodies replaced mechanically by a "do nothing" variant, fails every grade cell that grades it.

A grade cell grades an exercise when one of its check calls (visible or hidden) names a definition of the
exercise's solution cell. The variants, made from the solution cell's syntax tree, not by hand:
- `identity`: every function returns its first argument after `self` unchanged (None when it has none); a
  class's `__init__` only calls `super().__init__()`, so a module holds nothing and its forward returns its input;
- `zeros`: every function returns zeros shaped like its first argument (`torch.zeros_like`, when that is a
  tensor; else None); `__init__` as above;
- `none`: every body is `pass` (returns None); `__init__` as above.
Each is graded by the real grade cells (`run_grade_cells` on `graded_part`, as tests/test_mistakes.py does).
`identity` runs in the fast suite for every exercise; `zeros` and `none` are marked slow.
"""

from __future__ import annotations

import ast
import copy

import pytest

from conftest import ASSIGNMENTS, DATA_ASSIGNMENTS, graded_part, read, require_multi30k, solution_path
from quality.inprocess import grade_id, run_grade_cells
from quality.mistakes import is_solution
from transformer_course.grading.sandbox.executor import parse_grade_cell

VARIANTS = ("identity", "zeros", "none")


def _body(function: ast.FunctionDef, variant: str, in_class: bool) -> list[ast.stmt]:
    """The do-nothing body of `function` for `variant`."""
    if in_class and function.name == "__init__":
        return ast.parse("super().__init__()").body
    arguments = [argument.arg for argument in function.args.posonlyargs + function.args.args]
    if in_class and arguments and not any(_decorator(d) == "staticmethod" for d in function.decorator_list):
        arguments = arguments[1:]
    first = arguments[0] if arguments else None
    if variant == "none" or first is None:
        return [ast.Pass()]
    if variant == "identity":
        return ast.parse(f"return {first}").body
    return ast.parse(f"import torch\nreturn torch.zeros_like({first}) if isinstance({first}, torch.Tensor) "
                     "else None").body


def _decorator(node: ast.expr) -> str:
    return getattr(node, "id", getattr(node, "attr", ""))


def do_nothing(source: str, variant: str) -> str:
    """`source` (an exercise cell) with every function's and method's body replaced by `variant`'s."""
    tree = ast.parse(source)
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef):
            statement.body = _body(statement, variant, in_class=False)
        elif isinstance(statement, ast.ClassDef):
            for member in statement.body:
                if isinstance(member, ast.FunctionDef):
                    member.body = _body(member, variant, in_class=True)
    return ast.unparse(ast.fix_missing_locations(tree))


def _defined(source: str) -> set[str]:
    return {statement.name for statement in ast.parse(source).body
            if isinstance(statement, ast.FunctionDef | ast.ClassDef)}


def exercises() -> list[tuple[str, int, tuple[str, ...]]]:
    """(assignment, index of the solution cell, the names it defines) for every exercise that defines code."""
    found = []
    for assignment in ASSIGNMENTS:
        for index, cell in enumerate(read(solution_path(assignment)).cells):
            if cell.cell_type == "code" and is_solution(cell) and not (cell.metadata.get("nbgrader") or {}).get(
                    "grade"):
                names = _defined(cell.source)
                if names:
                    found.append((assignment, index, tuple(sorted(names))))
    return found


def grading(notebook, names: tuple[str, ...]) -> list[str]:
    """The grade ids of the grade cells whose check calls name one of `names`."""
    wanted = set(names)
    graded = []
    for cell in notebook.cells:
        identifier = grade_id(cell) if cell.cell_type == "code" else None
        if identifier is None:
            continue
        visible, hidden = parse_grade_cell(cell.source)
        if any(wanted & set(call.args) for call in (*visible, *hidden)):
            graded.append(identifier)
    return graded


# Grade cells that doing nothing still passes, not fixed yet: {(assignment, exercise names, variant): why}.
# Each is a strict expected failure, so fixing the check makes the test say so.
NOT_YET_FIXED: dict[tuple[str, tuple[str, ...], str], str] = {}  # every do-nothing variant fails its cells


def _marks(variant: str, exercise: tuple[str, int, tuple[str, ...]]) -> list:
    marks = [] if variant == "identity" else [pytest.mark.slow, pytest.mark.extended]  # `pytest -m extended`
    why = NOT_YET_FIXED.get((exercise[0], exercise[2], variant))
    return marks + ([pytest.mark.xfail(strict=True, reason=why)] if why else [])


EXERCISES = exercises()
CASES = [pytest.param(variant, *exercise, id=f"{exercise[0][:2]}-{'+'.join(exercise[2])}-{variant}",
                      marks=_marks(variant, exercise))
         for exercise in EXERCISES for variant in VARIANTS]


def test_every_stage_has_exercises_to_do_nothing_in():
    assert {assignment for assignment, _, _ in EXERCISES} == set(ASSIGNMENTS)
    graded_somewhere = [exercise for exercise in EXERCISES
                        if grading(read(solution_path(exercise[0])), exercise[2])]
    assert len(graded_somewhere) >= len(ASSIGNMENTS)


@pytest.mark.parametrize(("variant", "assignment", "index", "names"), CASES)
def test_doing_nothing_fails_every_grade_cell_of_the_exercise(variant, assignment, index, names):
    if assignment in DATA_ASSIGNMENTS:
        require_multi30k()
    notebook = read(solution_path(assignment))
    expected = grading(notebook, names)
    if not expected:
        pytest.skip(f"no grade cell names {names}")
    notebook = copy.deepcopy(notebook)
    notebook.cells[index].source = do_nothing(notebook.cells[index].source, variant)
    part = graded_part(notebook)
    part.cells = [cell for cell in part.cells if grade_id(cell) is None or grade_id(cell) in expected]
    outcomes = run_grade_cells(part, solution_path(assignment).parent)
    passed = [identifier for identifier in expected if identifier in outcomes and outcomes[identifier].passed]
    assert not passed, f"doing nothing ({variant}) in {'/'.join(names)} passes {passed}"
    assert all(identifier in outcomes for identifier in expected)
