"""The honest class (`quality.honest`): three students who wrote every exercise of every stage themselves, in
the styles of the Annotated Transformer, of the PyTorch tutorials and d2l.ai, and of a careful reader of the
lesson. The course promises them two things: right code written differently passes every check, and no honest
student is flagged for review.

- through the grader: each student's notebook, graded as the batch grader grades it (`run_grade_cells`, hidden
  tests put back as nbgrader does), passes every grade cell and leaves no finding. A stage whose checks are not
  yet judged in the grader's process (the checks' experiments marked `@on_student_side`) cannot be graded on
  this design; its case is reported as an expected failure, not run, until its checks are converted;
- directly: every check call of every grade cell, hidden tests included, made as the undecorated check on the
  student's objects in this process, holds (every stage, whatever the grader's design; on one torch thread,
  which runs these tiny models several times faster than two threads per test process on a shared machine);
- the notebooks differ from the release only in the exercise cells, where the given code around each stub is
  kept; no answer is the reference solution.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest

from conftest import (
    ASSIGNMENTS,
    DATA_ASSIGNMENTS,
    bug_hunt_names,
    read,
    require_multi30k,
    solution_path,
    student_path,
)
from quality.honest import STAGES, STUB, STYLES, answers, student_notebook, with_hidden_tests, write_class
from quality.honest.direct import grade_calls, run_checks
from quality.inprocess import run_grade_cells
from quality.mistakes import is_solution

CASES = [(style, assignment) for assignment in ASSIGNMENTS for style in STYLES]


def case_id(style: str, assignment: str) -> str:
    return f"{assignment[:2]}-{style}"


@cache
def judged_by_the_grader(assignment: str) -> bool:
    """Whether the stage's checks run in the grader's process, their experiments on the student's side (the
    checks module marks them `@on_student_side`); read from the source, nothing imported."""
    spec = importlib.util.find_spec("transformer_course.checks")
    assert spec is not None and spec.submodule_search_locations
    source = Path(next(iter(spec.submodule_search_locations)), f"{STAGES[assignment]}.py").read_text(encoding="utf-8")
    return "@on_student_side" in source


# Checks that reject a correct honest answer: {(style, assignment): why the answer is right}. None so far.
REJECTED_BY_A_CHECK: dict[tuple[str, str], str] = {}


def grader_case(style: str, assignment: str) -> object:
    marks = []
    if not judged_by_the_grader(assignment):
        marks.append(pytest.mark.xfail(run=False, reason=(
            f"the checks of {assignment} are not converted to the judged design on this branch: graded here, a "
            "check that calls the student's object crashes ('StudentName' object is not callable)")))
    if (style, assignment) in REJECTED_BY_A_CHECK:
        marks.append(pytest.mark.xfail(strict=True, reason=REJECTED_BY_A_CHECK[style, assignment]))
    return pytest.param(style, assignment, marks=marks, id=case_id(style, assignment))


def direct_case(style: str, assignment: str) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=REJECTED_BY_A_CHECK[style, assignment])] \
        if (style, assignment) in REJECTED_BY_A_CHECK else []
    return pytest.param(style, assignment, marks=marks, id=case_id(style, assignment))


def honest_notebook(style: str, assignment: str):
    return student_notebook(style, assignment, read(student_path(assignment)))


def grade_ids(notebook) -> list[str]:
    return [cell.metadata["nbgrader"]["grade_id"] for cell in notebook.cells
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade")]


# --- the class itself ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("style", "assignment"), CASES, ids=[case_id(*case) for case in CASES])
def test_every_exercise_is_answered_and_the_given_code_kept(style, assignment):
    release = read(student_path(assignment))
    notebook = student_notebook(style, assignment, release)
    assert len(notebook.cells) == len(release.cells)
    for given, answered in zip(release.cells, notebook.cells, strict=True):
        if not (given.cell_type == "code" and is_solution(given)):
            assert answered == given
            continue
        answer = answers(style, assignment)[given.id]
        if not STUB.search(given.source):  # a bug hunt: the broken code given, repaired by the student
            assert answer.fixes and answered.source != given.source, given.id
            continue
        assert not STUB.search(answered.source), given.id
        assert "NotImplementedError" not in answered.source, given.id
        if answer.fixes:  # a bug hunt that leaves a step to the student: the repairs change given lines
            assert all(repaired in answered.source for _, repaired in answer.fixes), given.id
            continue
        lines, kept = iter(answered.source.splitlines()), STUB.sub("", given.source).splitlines()
        assert all(any(line == other for other in lines) for line in kept if line.strip()), (
            f"{given.id}: a line of the given code is missing or out of order")


def _normalised(code: str) -> list[str]:
    return [re.sub(r"\s+", "", re.sub(r"#.*$", "", line)) for line in code.splitlines()
            if re.sub(r"#.*$", "", line).strip()]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_answer_is_the_reference_solution(assignment):
    """Every answer region differs from the reference's region of that stub (comments and spaces aside), so the
    class stays written by its students even when an answer is edited later."""
    regions = {cell.id: re.findall(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", cell.source, re.DOTALL)
               for cell in read(solution_path(assignment)).cells if cell.cell_type == "code" and is_solution(cell)}
    predictions = {cell.id for cell in read(solution_path(assignment)).cells if "def predict_" in cell.source}
    for style in STYLES:
        for cell, answer in answers(style, assignment).items():
            if cell in predictions or answer.fixes:  # a predicted number is the number; a repair is a small edit
                continue
            assert len(answer.stubs) == len(regions[cell]), (style, cell)
            for number, (code, reference) in enumerate(zip(answer.stubs, regions[cell], strict=True)):
                assert _normalised(code) != _normalised(reference), f"{style} {cell}, stub {number}: the reference"


def test_the_class_is_written_as_a_downloads_folder(tmp_path, root):
    written = write_class(root, tmp_path, ["01_positional_encoding"])
    assert sorted(path.relative_to(tmp_path).as_posix() for path in written) == [
        f"{style}/01_positional_encoding.ipynb" for style in sorted(STYLES)]
    for path in written:
        assert read(path) == honest_notebook(path.parent.name, "01_positional_encoding")


# --- the checks called directly ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("style", "assignment"), [direct_case(*case) for case in CASES])
def test_every_check_holds_called_directly_on_the_students_code(style, assignment):
    source = read(solution_path(assignment))
    outcomes = run_checks(honest_notebook(style, assignment), source)
    assert len(outcomes) == len(grade_calls(source)) and set(grade_ids(source)) == {
        call.grade_id for call in grade_calls(source)}
    failed = {call: message for call, message in outcomes.items() if message is not None}
    assert not failed, "\n\n".join(f"{call}\n{message}" for call, message in failed.items())


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_check_called_directly_fails_on_the_blank_notebook(assignment):
    """The direct path can fail: the release notebook, stubs unanswered, fails every call (a bug hunt's broken code
    passes some checks, a shape say, and fails at least one call of each of its grade cells)."""
    outcomes = run_checks(read(student_path(assignment)), read(solution_path(assignment)))
    hunted = {call for call in outcomes if any(f"({name}" in call for name in bug_hunt_names(assignment))}
    assert outcomes and all(message is not None for call, message in outcomes.items() if call not in hunted), [
        call for call, message in outcomes.items() if message is None]
    for grade_id in {call.split(":")[0] for call in outcomes}:  # and so every grade cell fails
        assert any(message is not None for call, message in outcomes.items() if call.split(":")[0] == grade_id)


# --- the grader ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("style", "assignment"), [grader_case(*case) for case in CASES])
def test_the_grader_passes_every_grade_cell_and_flags_nothing(style, assignment, tmp_path):
    if assignment in DATA_ASSIGNMENTS:
        require_multi30k()
    notebook = with_hidden_tests(honest_notebook(style, assignment), read(solution_path(assignment)))
    expected = grade_ids(notebook)
    outcomes = run_grade_cells(notebook, tmp_path, stop_after=expected[-1])  # later cells change no grade
    assert list(outcomes) == expected
    failed = {grade_id: outcome.message[:500] for grade_id, outcome in outcomes.items() if not outcome.passed}
    assert not failed, failed
    assert {outcome.findings for outcome in outcomes.values()} == {()}


@pytest.mark.slow
def test_the_grader_path_fails_a_broken_answer_hidden_tests_included(tmp_path):
    """The grader test has teeth: the prose student's table with sin and cos swapped fails the visible and the
    hidden table check (the hidden tests are put back and run), and the shape check still passes."""
    assignment = "01_positional_encoding"
    answer = answers("prose", assignment)["positional_encoding"]
    table, forward = answer.stubs
    broken = dataclasses.replace(answer, stubs=(table.replace("math.sin(angle)", "math.COS(angle)").replace(
        "math.cos(angle)", "math.sin(angle)").replace("math.COS(angle)", "math.cos(angle)"), forward))
    assert broken.stubs[0] != table
    release = read(student_path(assignment))
    notebook = student_notebook("prose", assignment, release)
    given, exercise = (next(cell for cell in book.cells if cell.get("id") == "positional_encoding")
                       for book in (release, notebook))
    exercise.source = broken.fill(given.source)
    outcomes = run_grade_cells(with_hidden_tests(notebook, read(solution_path(assignment))), tmp_path)
    failed = {grade_id for grade_id, outcome in outcomes.items() if not outcome.passed}
    assert {"pe_table_values", "pe_table_values_hidden"} <= failed and "pe_buffer_shape" not in failed, failed
