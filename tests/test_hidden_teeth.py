"""Hidden tests that see what they test (issue 40, item 4): every catalogued mistake that fails a check's visible
calls fails that check's hidden calls too, on inputs drawn as the grader draws them; every alternative correct
solution passes every hidden call so drawn.

The hidden calls run alone: each grade cell is split into one cell per visible call and, for each hidden call,
DRAWS hidden-only cells, each under a place of its own (a grade cell id with `~line~draw` added), so that each is
an independent draw from the secret (HMAC-SHA256 under the key makes different places as unrelated as different
secrets would). A check's hidden test passes when every hidden call of that check passes in one draw; the
property fails visibly when any visible call of the check fails. A hidden call whose draw keeps equal two sizes
its property needs different (the positional encoding's seq_len and max_seq_length, two axes a mistake
confuses) lets a mistake through, and this test names it (`grading.sandbox.hidden_inputs.RULES` then declares
what the check needs).
"""

from __future__ import annotations

import ast
import copy
import hashlib

import nbformat
import pytest

from conftest import graded_part, read, solution_path
from quality.inprocess import run_notebook
from quality.mistakes import Edit, catalog
from transformer_course.grading.cells import is_grade_cell, split_hidden
from transformer_course.grading.sandbox import executor

pytestmark = pytest.mark.xdist_group("boundary")
MISTAKES, ALTERNATIVES = catalog()
DRAWS = 3
SECRETS = [hashlib.sha256(f"hidden teeth {number}".encode()).digest() for number in range(2)]


def _statements(source: str) -> list[str]:
    """The source of each statement of (one part of) a grade cell."""
    tree = ast.parse(source)
    return [ast.get_source_segment(source, statement) or "" for statement in tree.body]


def split_grade_cells(notebook: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[tuple[str, str, int]]]:
    """The notebook with each grade cell replaced by one cell per visible call and DRAWS hidden-only cells per
    hidden call; and, for each new cell in order, (kind "visible" or "hidden", check name, draw number)."""
    cells, labels = [], []
    for cell in notebook.cells:
        if not is_grade_cell(cell):
            cells.append(cell)
            continue
        grade_id = cell.metadata["nbgrader"]["grade_id"]
        visible, hidden = split_hidden(cell.source)
        visible_calls, hidden_calls = executor.parse_grade_cell(cell.source)
        for statement, call in zip(_statements(visible), visible_calls, strict=True):
            cells.append(_grade_cell(cell, grade_id, statement))
            labels.append(("visible", call.name, 0))
        for line, (statement, call) in enumerate(zip(_statements(hidden), hidden_calls, strict=True)):
            for draw in range(DRAWS):
                source = f"### BEGIN HIDDEN TESTS\n{statement}\n### END HIDDEN TESTS\n"
                cells.append(_grade_cell(cell, f"{grade_id}~{line}~{draw}", source))
                labels.append(("hidden", call.name, draw))
    split = copy.deepcopy(notebook)
    split.cells = cells
    return split, labels


def _grade_cell(cell: nbformat.NotebookNode, grade_id: str, source: str) -> nbformat.NotebookNode:
    new = copy.deepcopy(cell)
    new.source = source
    new.metadata["nbgrader"]["grade_id"] = grade_id
    return new


def verdicts(edit: Edit | None, assignment: str, secret: bytes, tmp_path) -> tuple[dict, dict]:
    """({check: whether a visible call failed}, {check: [whether every hidden call passed, per draw]}) for the
    reference solution of `assignment` with `edit` applied."""
    notebook = read(solution_path(assignment))
    notebook = graded_part(edit.apply(notebook) if edit is not None else notebook)
    split, labels = split_grade_cells(notebook)
    executor.use_secret(secret)
    try:
        graded = run_notebook(split, tmp_path)
    finally:
        executor.use_secret(None)
    outcomes = [not any(output.get("output_type") == "error" for output in cell.get("outputs", []))
                for cell in graded.cells if is_grade_cell(cell)]
    assert len(outcomes) == len(labels)
    visible_failed: dict[str, bool] = {}
    hidden_passed: dict[str, list[bool]] = {}
    for (kind, name, draw), passed in zip(labels, outcomes, strict=True):
        if kind == "visible":
            visible_failed[name] = visible_failed.get(name, False) or not passed
        else:
            hidden_passed.setdefault(name, [True] * DRAWS)[draw] &= passed
    return visible_failed, hidden_passed


@pytest.mark.slow
@pytest.mark.parametrize("number,mistake", list(enumerate(MISTAKES)),
                         ids=lambda item: f"{item.assignment[:2]}-{item.description}" if isinstance(item, Edit) else "")
def test_a_mistake_that_fails_visible_checks_fails_their_hidden_calls(number, mistake, tmp_path):
    visible_failed, hidden_passed = verdicts(mistake, mistake.assignment, SECRETS[number % len(SECRETS)], tmp_path)
    assert any(visible_failed.values()), f"no visible call fails with the mistake: {mistake.description}"
    free = {name: [draw for draw, passed in enumerate(passes) if passed]
            for name, passes in hidden_passed.items() if visible_failed.get(name) and any(passes)}
    assert not free, (f"{mistake.description}: fails the visible calls of these checks but passes their hidden "
                      f"calls in these draws: {free}")


@pytest.mark.slow
@pytest.mark.parametrize("number,alternative", list(enumerate(ALTERNATIVES)),
                         ids=lambda item: f"{item.assignment[:2]}-{item.description}" if isinstance(item, Edit) else "")
def test_an_alternative_solution_passes_every_hidden_call_as_drawn(number, alternative, tmp_path):
    visible_failed, hidden_passed = verdicts(alternative, alternative.assignment,
                                             SECRETS[number % len(SECRETS)], tmp_path)
    failing = {name: passes for name, passes in hidden_passed.items() if not all(passes)}
    assert not any(visible_failed.values()) and not failing, (visible_failed, failing)
