"""Predict, then run: the prediction checks score a number or a choice, say what was expected, and every stage has
at least two of them whose truth the notebook does not write down."""

import re

import nbformat
import pytest

from conftest import ASSIGNMENTS, ROOT
from transformer_course.checks.framework import CheckFailed, run_check
from transformer_course.checks.predictions import expect_choice, expect_number

PREDICTION_CHECK = re.compile(r"\bcheck\.(predicted_\w+)\(")


def _number(predict, **kwargs):
    expect_number(predict, truth=1234.0, what="the count", cause="count again", **kwargs)


def _choice(predict):
    expect_choice(predict, truth="B", choices=("A", "B"), what="the race", cause="compare the two scores")


@pytest.mark.parametrize("answer", [1234, 1234.0, "1,234", "1_234", 1233.5])
def test_a_right_number_passes_in_any_plain_form(answer):
    if answer == 1233.5:
        _number(lambda: answer, absolute=1.0)
    else:
        _number(lambda: answer)


def test_a_wrong_number_says_what_was_expected_what_came_and_the_cause():
    with pytest.raises(CheckFailed) as failure:
        _number(lambda: 1300)
    message = str(failure.value)
    assert "expected: 1,234 (exactly)" in message and "got:      1,300" in message
    assert "likely cause: count again" in message


def test_a_relative_tolerance_credits_rounded_arithmetic_and_no_more():
    _number(lambda: 1240, tolerance=0.01)
    with pytest.raises(CheckFailed, match="within 1%"):
        _number(lambda: 1260, tolerance=0.01)


@pytest.mark.parametrize("answer", [None, ...])
def test_no_prediction_yet_is_said_as_such(answer):
    with pytest.raises(CheckFailed, match="no prediction yet"):
        _number(lambda: answer)


@pytest.mark.parametrize("answer", ["many", float("nan"), [1234]])
def test_what_is_not_a_number_fails_and_says_so(answer):
    with pytest.raises(CheckFailed, match="not a (finite )?number"):
        _number(lambda: answer)


def test_the_unfinished_stub_is_reported_as_not_implemented():
    def predict():
        raise NotImplementedError()

    result = run_check(_number, "t", (predict,))
    assert not result.passed and "not implemented yet" in result.message


def test_a_choice_is_read_without_case_or_quotes_and_a_wrong_one_names_the_right_one():
    _choice(lambda: " b ")
    _choice(lambda: "'B'")
    with pytest.raises(CheckFailed, match="expected: 'B'"):
        _choice(lambda: "a")
    with pytest.raises(CheckFailed, match="not one of the choices"):
        _choice(lambda: "C")


def _cells(folder: str, assignment: str) -> list:
    return nbformat.read(ROOT / folder / assignment / f"{assignment}.ipynb", as_version=4).cells


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_stage_has_two_graded_predictions_whose_truth_the_student_notebook_does_not_show(assignment):
    cells = _cells("notebooks", assignment)
    graded = [cell for cell in cells if cell.metadata.get("nbgrader", {}).get("grade")
              and PREDICTION_CHECK.search(cell.source)]
    assert len(graded) >= 2, f"{assignment}: {len(graded)} graded predictions"
    solutions = {cell.id: cell.source for cell in _cells("solutions", assignment)}
    for cell in cells:
        if cell.metadata.get("nbgrader", {}).get("solution") and "def predict_" in cell.source:
            assert "raise NotImplementedError()" in cell.source, f"{assignment}: {cell.id} shows its answer"
            assert "### BEGIN SOLUTION" in solutions[cell.id]

