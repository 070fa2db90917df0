"""Notebook code that tampers with the grading cannot turn a failing property into a pass.

A submission of stage 2 with a real bug (attention scores not divided by sqrt(d_k)) adds one cell
of tampering before the grade cells: replacing torch.allclose and Tensor comparisons, the check
helpers, the checks' code and closures, or the name `check` itself. Under the grader every grade cell is
judged in the grader's own process (test_boundary.py attacks that design directly), so the bug's grade
cell must still fail, naming the bug; honest notebooks are left alone (no finding, full marks). Nothing
flags the tampering itself: the static scan that did was removed in issue 39 (a sieve any motivated student
passes, guarding nothing the grader's design does not; website/instructor/threat-model.md). In a student's own
notebook (Colab, no grader) tampering only fools the student's own self-check: nothing is at stake there, and
the checks do not defend themselves.
"""

import csv

import nbformat
import pytest

from conftest import ASSIGNMENTS, ROOT, read, solution_path
from quality.inprocess import run_grade_cells
from quality.mistakes import catalog
from transformer_course.grading.cells import checks_module

ASSIGNMENT = "02_attention"
BUG = next(m for m in catalog()[0] if m.description == "scores not scaled by 1/sqrt(d_k)")

ATTACKS = {
    "torch comparisons": (
        "torch.allclose = lambda *args, **kwargs: True\n"
        "torch.equal = lambda *args, **kwargs: True\n"
        "torch.isclose = lambda a, b, *args, **kwargs: torch.ones_like(a, dtype=torch.bool)\n"
        "torch.testing.assert_close = lambda *args, **kwargs: None\n"
        "torch.Tensor.all = lambda self, *args, **kwargs: torch.tensor(True)\n"
        "torch.Tensor.__le__ = lambda self, other: torch.ones(self.shape, dtype=torch.bool)\n"
    ),
    "check helpers": (
        "from transformer_course.checks import framework\n"
        "framework.fail = lambda *args, **kwargs: None\n"
        "framework.tensors_close = lambda *args, **kwargs: True\n"
        "framework.expect_close = lambda *args, **kwargs: None\n"
        "check.sdpa_values = lambda *args, **kwargs: True\n"
        "check.fail = lambda *args, **kwargs: None\n"
        "check.expect_close = lambda *args, **kwargs: None\n"
    ),
    "function internals": (
        "def always_true(*args, **kwargs):\n"
        "    return True\n"
        "check.sdpa_values.__wrapped__.__code__ = (lambda *args, **kwargs: None).__code__\n"
        "check.sdpa_values.__closure__[0].cell_contents = always_true\n"
    ),
    "re-bound check": (
        "class Lenient:\n"
        "    def __getattr__(self, name):\n"
        "        return lambda *args, **kwargs: True\n"
        "check = Lenient()\n"
    ),
}


def tampered(attack: str, base: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    notebook = base if base is not None else BUG.apply(read(solution_path(ASSIGNMENT)))
    first_grade = next(i for i, cell in enumerate(notebook.cells)
                       if cell.get("metadata", {}).get("nbgrader", {}).get("grade"))
    notebook.cells.insert(first_grade, nbformat.v4.new_code_cell(attack))
    return notebook


def test_the_bug_alone_fails_its_cell():
    outcome = run_grade_cells(BUG.apply(read(solution_path(ASSIGNMENT))), solution_path(ASSIGNMENT).parent,
                              stop_after=BUG.fails)[BUG.fails]
    assert not outcome.passed and BUG.cause in outcome.message


@pytest.mark.parametrize("attack", ATTACKS)
def test_tampering_does_not_turn_the_failing_cell_into_a_pass(attack):
    path = solution_path(ASSIGNMENT)
    outcomes = run_grade_cells(tampered(ATTACKS[attack]), path.parent, stop_after=BUG.fails)
    outcome = outcomes[BUG.fails]
    assert not outcome.passed, f"{attack}: the bug passes after tampering"
    assert BUG.cause in outcome.message, outcome.message


def test_harmless_patching_in_a_correct_notebook_still_gets_full_marks():
    wrapper = ("original_allclose = torch.allclose\n"
               "torch.allclose = lambda *args, **kwargs: original_allclose(*args, **kwargs)  # a debugging wrapper\n")
    path = solution_path(ASSIGNMENT)
    outcomes = run_grade_cells(tampered(wrapper, read(path)), path.parent)
    assert outcomes and all(outcome.passed for outcome in outcomes.values())


def test_the_untampered_solution_has_no_finding():
    path = solution_path(ASSIGNMENT)
    outcomes = run_grade_cells(read(path), path.parent)
    assert all(o.passed and not o.findings for o in outcomes.values())


def test_each_stage_names_its_checks_module():
    for assignment in ASSIGNMENTS:
        module = checks_module(read(solution_path(assignment)))
        assert module and module.startswith("transformer_course.checks."), (assignment, module)


@pytest.mark.slow
def test_real_nbgrader_gives_the_tamperer_the_buggy_score(tmp_path):
    """Through the batch command: every attack at once, plus two on IPython itself (hiding the
    traceback of a failing cell, and re-binding `check` in a hook before each cell)."""
    from transformer_course.grading.classroom.batch import BatchGrader
    from transformer_course.grading.sandbox.isolation import bubblewrap_problem

    ipython_attacks = (
        "ip = get_ipython()\n"
        "ip.showtraceback = lambda *args, **kwargs: None\n"
        "ip.events.register('pre_run_cell', lambda *args: globals().update(check=Lenient()))\n"
    )
    notebook = BUG.apply(read(solution_path(ASSIGNMENT)))
    for attack in (*ATTACKS.values(), ipython_attacks):
        notebook = tampered(attack, notebook)
    for student, submission in (("plain_bug", BUG.apply(read(solution_path(ASSIGNMENT)))), ("tamperer", notebook)):
        (tmp_path / "downloads" / student).mkdir(parents=True)
        nbformat.write(submission, tmp_path / "downloads" / student / f"{ASSIGNMENT}.ipynb")
    grader = BatchGrader(ROOT, tmp_path / "class", tmp_path / "downloads", jobs=2, assignment_ids=[ASSIGNMENT],
                         sandbox=bubblewrap_problem() is None)
    students = grader.run()
    with open(tmp_path / "class" / "scores.csv", encoding="utf-8-sig") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert rows["tamperer"]["attn_sdpa_values"] == "0.0"
    assert float(rows["tamperer"]["total"]) <= float(rows["plain_bug"]["total"]) < float(rows["plain_bug"]["max"])
    assert "flagged for review" not in rows["plain_bug"]["reasons"]
    assert students["tamperer"].status == "graded"
