"""Predict, then run: a prediction is a value the student wrote, noted without a verdict in the student's notebook
and scored when the notebook is graded; no message, notebook text or revealed output gives the graded truth away;
every stage has at least two graded predictions. (The outputs of the reveal cells when the solution notebooks run
are held to the same in tests/test_teeth.py, which runs them.)"""

from __future__ import annotations

import functools
import importlib
import json
import math
import re
import types

import nbformat
import pytest

from conftest import ASSIGNMENTS, ROOT
from quality.honest import STAGES, STYLES, answers
from transformer_course.checks import framework
from transformer_course.checks.boundary import judging
from transformer_course.checks.framework import CheckFailed, ScoredWhenGraded, check, run_check
from transformer_course.checks.predictions import (
    Graded,
    distinctive,
    expect_choice,
    expect_number,
    graded_truths,
    leaked,
    numbers_in,
    scored,
)

PREDICTION_CHECK = re.compile(r"\bcheck\.(predicted_\w+)\(")
TRUTH = 1234.0


def _number(predict, truths=TRUTH, **kwargs):
    expect_number(predict, truths=truths, what="the count", cause="count again", **kwargs)


def _choice(predict):
    expect_choice(predict, truth="B", choices=("A", "B"), what="the race", cause="compare the two scores")


def _returning(value):
    """A prediction function that returns `value` as a constant of its code (no closure, no default)."""
    return types.FunctionType((lambda: None).__code__.replace(co_consts=(value,)), {})


def _scored_message(function, *args) -> str:
    with scored():
        result = run_check(function, "t", args)
    assert not result.passed and not result.deferred
    return result.message


# --- scored (while grading) -----------------------------------------------------------------------------------


def _right_int():
    return 1234


def _right_float():
    return 1234.0


def _right_text():
    return "1,234"


def _right_underscores():
    return "1_234"


def _right_arithmetic():
    return 2 * 600 + 34 + math.floor(0.5)


@pytest.mark.parametrize("predict", [_right_int, _right_float, _right_text, _right_underscores, _right_arithmetic])
def test_a_right_number_scores_in_any_plain_form(predict):
    with scored():
        _number(predict)


def test_a_relative_tolerance_credits_rounded_arithmetic_and_no_more():
    def rounded():
        return 1240

    def too_far():
        return 1260

    with scored():
        _number(rounded, tolerance=0.01)
        with pytest.raises(CheckFailed, match="within 1%"):
            _number(too_far, tolerance=0.01)


def test_an_absolute_tolerance_credits_rounded_arithmetic_and_no_more():
    def half_a_step_off():
        return 1233.5

    def a_step_off():
        return 1233

    with scored():
        _number(half_a_step_off, absolute=1.0)
        with pytest.raises(CheckFailed, match="within 0.5"):
            _number(a_step_off, absolute=0.5)


def test_any_accepted_convention_scores():
    def with_biases():
        return 4 * (512 * 512 + 512)

    def without_biases():
        return 4 * 512 * 512

    def neither():
        return 4 * 512 * 512 + 512

    truths = (4 * (512 * 512 + 512), 4 * 512 * 512)
    with scored():
        _number(with_biases, truths=truths)
        _number(without_biases, truths=truths)
        with pytest.raises(CheckFailed, match="any accepted value"):
            _number(neither, truths=truths)


def _wrong():
    return 1300


@pytest.mark.parametrize("options", [{}, {"tolerance": 0.01}, {"absolute": 2.0}])
def test_a_wrong_prediction_says_nothing_the_truth_can_be_found_from(options):
    """The message is the same whatever the truth (so it holds neither the truth, nor its ratio or difference to
    the prediction, nor its direction), and says what was asked, what came, the tolerance and the step to check."""
    messages = {_scored_message(functools.partial(_number, _wrong, truth, **options)) for truth in (1234.0, 987.5, 5e6)}
    assert len(messages) == 1, messages
    message = messages.pop()
    assert "got:      1,300" in message and "likely cause: count again" in message
    assert "not shown" in message and not re.search(r"\b(too (high|low)|larger|smaller|×|ratio)\b", message)
    assert {value for _, value in numbers_in(message)} <= {1300.0, 1.0, 2.0}  # the prediction and the tolerance


def test_a_choice_is_read_without_case_or_quotes_and_a_wrong_one_does_not_say_which_is_right():
    with scored():
        _choice(lambda: " b ")
        _choice(lambda: "'B'")
    message = _scored_message(_choice, lambda: "a")
    assert "not the right choice" in message and "got:      'A'" in message
    assert "expected: the right one of 'A' or 'B'" in message
    with pytest.raises(CheckFailed, match="not one of the choices"), scored():
        _choice(lambda: "C")


# --- the form, in both modes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [None, ...])
def test_no_prediction_yet_is_said_as_such(answer):
    with pytest.raises(CheckFailed, match="no prediction yet"):
        _number(_returning(answer))


@pytest.mark.parametrize("answer", ["many", float("nan"), [1234]])
def test_what_is_not_a_number_fails_and_says_so(answer):
    with pytest.raises(CheckFailed, match="not a (finite )?number"):
        _number(_returning(answer))


def test_the_unfinished_stub_is_reported_as_not_implemented():
    def predict():
        raise NotImplementedError()

    result = run_check(_number, "t", (predict,))
    assert not result.passed and not result.deferred and "not implemented yet" in result.message


def test_what_is_not_the_given_function_is_refused():
    class Predictor:
        def __call__(self):
            return 1234

    with pytest.raises(CheckFailed, match="not the given function"):
        _number(Predictor())


# --- a written value: what a prediction function may use -----------------------------------------------------

import torch  # noqa: E402  (what the refused predictions call)

from transformer_course.reference import MultiHeadAttention, count_parameters  # noqa: E402

CALLS = []


def _calls_torch():
    return sum(p.numel() for p in torch.nn.Linear(3, 3).parameters())


def _calls_the_course():
    CALLS.append("ran")
    return count_parameters(MultiHeadAttention(8, 2))


def _reads_a_notebook_variable():
    return TRUTH


def _imports_a_module():
    import os

    return len(os.sep)


def _reaches_behind_a_literal():
    return len((1).__class__.__mro__)


def _holds_a_default(value=TRUTH):
    return value


def _closure():
    computed = TRUTH

    def predict():
        return computed

    return predict


def _shadowed_round():
    round = lambda number: TRUTH  # noqa: E731, A001  (a notebook name that shadows the built-in)
    return round


def _with_shadowed_round():
    return round(1234.2)


@pytest.mark.parametrize(("predict", "named"), [
    (_calls_torch, "`torch`"), (_calls_the_course, "`count_parameters`"), (_reads_a_notebook_variable, "`TRUTH`"),
    (_imports_a_module, "`import os`"), (_reaches_behind_a_literal, "`.__class__`"),
    (_holds_a_default, "default arguments or a closure"), (_closure(), "default arguments or a closure")])
def test_a_prediction_that_runs_code_is_refused_before_it_runs_in_both_modes(predict, named):
    CALLS.clear()
    for mode in (lambda: __import__("contextlib").nullcontext(), scored):
        with mode():
            with pytest.raises(CheckFailed) as failure:
                _number(predict)
        message = str(failure.value)
        assert "a prediction is a value you work out before running anything" in message, message
        assert named in message, message
    assert not CALLS, "the refused prediction ran"


def test_a_built_in_shadowed_by_the_notebook_is_refused():
    namespace = {"round": _shadowed_round()}
    predict = type(_with_shadowed_round)(_with_shadowed_round.__code__, namespace)
    with pytest.raises(CheckFailed, match="`round`"):
        _number(predict)


def test_literals_arithmetic_math_and_the_arithmetic_built_ins_are_a_written_value():
    def worked_out() -> float:
        import math as m
        from math import sqrt

        d = 64
        rows = [min(i + 1, 3) for i in range(6)]
        return float(int(m.exp(0)) * (sum(rows) + sqrt(d) * 0 + abs(-1) - 1 + round(1219.4) + max(0, 0)))

    with scored():
        _number(worked_out)


# --- the two modes: no verdict in the student's notebook, a score while grading ---------------------------------


@check("your prediction: the count (a test)")
def predicted_count(predict):
    _number(predict)


def test_outside_grading_a_prediction_gets_no_verdict_right_or_wrong(capsys, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    notes = []
    for predict in (_right_int, _wrong):
        with pytest.raises(ScoredWhenGraded) as note:
            _number(predict)
        notes.append(str(note.value))
    assert notes[0] == notes[1] and "scored when your notebook is graded" in notes[0]
    assert not numbers_in(notes[0]), "the note shows no number, not even the prediction (in solutions/ the truth)"
    assert "✘" not in notes[0] and "✔" not in notes[0]
    assert predicted_count(_wrong) is True  # the grade cell's assert holds, and no ✔ or ✘ is shown
    shown = capsys.readouterr().out
    assert shown.startswith("○ your prediction: the count (a test)") and "✔" not in shown and "✘" not in shown
    latest = framework.results()["predicted_count"]
    assert latest.deferred and not latest.passed


def test_while_grading_the_same_check_scores(capsys):
    with scored():
        assert predicted_count(_right_int) is True
        assert framework.results()["predicted_count"].passed
        predicted_count(_wrong)  # raises while grading; shown in red where a test imported the checks
    latest = framework.results()["predicted_count"]
    assert not latest.passed and not latest.deferred and "is not the true value" in latest.message
    assert "✘ your prediction: the count (a test)" in capsys.readouterr().out


def test_while_grading_a_note_raised_by_the_students_code_fails_the_cell(monkeypatch):
    """A student's code that raises the note itself gains nothing: while grading, a noted check is a failed one."""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")

    @check("a property (a test)")
    def graded_property(function):
        function()

    def pretends():
        raise ScoredWhenGraded("noted")

    with pytest.raises(CheckFailed, match="noted"):
        graded_property(pretends)


def test_the_summary_lists_a_noted_prediction_apart_from_passing_and_failing_checks(monkeypatch, capsys):
    import transformer_course.checks.positional_encoding as stage

    monkeypatch.setattr(framework, "_LATEST", {})
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    stage.predicted_self_dot_product(_returning(256.0))
    capsys.readouterr()
    framework.summary(stage)
    lines = capsys.readouterr().out.splitlines()
    noted = [line for line in lines if line.startswith("○")]
    assert len(noted) == 1 and "scored when your notebook is graded" in noted[0] and "(1 point)" in noted[0]
    total = sum(points for _, points, names in framework.GRADE_CELLS[stage.__name__] if names)
    assert any(f"0 of {total - 1:g} points from the visible checks" in line for line in lines), lines
    assert any("Predictions: 1 noted, worth 1 point, scored when your notebook is graded." in line for line in lines)


class _LocalServant:
    """The grader's channel to the student's side, in one process: every experiment's answer goes through JSON, as
    plain data goes through the real channel, so the verdict is reached on data alone."""

    def run(self, module, qualname, args, kwargs):
        experiment = getattr(importlib.import_module(module), qualname).experiment
        return json.loads(json.dumps(experiment(*args, **kwargs)))


def test_judged_in_the_graders_process_a_prediction_is_scored_from_plain_data():
    with judging(_LocalServant()):
        assert run_check(_number, "t", (_right_arithmetic,)).passed
        refused = run_check(_number, "t", (_calls_torch,))
        wrong = run_check(_number, "t", (_wrong,))
    assert "a prediction is a value you work out" in refused.message
    assert not wrong.passed and not wrong.deferred and "is not the true value" in wrong.message


# --- the lessons' predictions ------------------------------------------------------------------------------------


def _cells(folder: str, assignment: str) -> list:
    return nbformat.read(ROOT / folder / assignment / f"{assignment}.ipynb", as_version=4).cells


def _nbgrader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def predictions(assignment: str, folder: str = "solutions") -> list[tuple[str, Graded, int, int]]:
    """(check name, what it scores against, index of its grade cell, index of its reveal cell) for each graded
    prediction of a notebook. The reveal cell is the first code cell after the grade cell that is neither a
    solution nor a grade cell: the cell that shows the truth for another configuration."""
    cells = _cells(folder, assignment)
    module = importlib.import_module(f"transformer_course.checks.{STAGES[assignment]}")
    found = []
    for index, cell in enumerate(cells):
        match = PREDICTION_CHECK.search(cell.source) if _nbgrader(cell).get("grade") else None
        if match is None:
            continue
        reveal = next(later for later in range(index + 1, len(cells)) if cells[later].cell_type == "code"
                      and not _nbgrader(cells[later]).get("grade") and not _nbgrader(cells[later]).get("solution"))
        found.append((match.group(1), graded_truths(getattr(module, match.group(1))), index, reveal))
    return found


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_stage_has_two_graded_predictions_whose_stubs_hold_no_answer(assignment):
    assert len(predictions(assignment, "notebooks")) >= 2, assignment
    solutions = {cell.id: cell.source for cell in _cells("solutions", assignment)}
    for cell in _cells("notebooks", assignment):
        if _nbgrader(cell).get("solution") and "def predict_" in cell.source:
            assert "raise NotImplementedError()" in cell.source, f"{assignment}: {cell.id} shows its answer"
            assert "### BEGIN SOLUTION" in solutions[cell.id]


def _prediction_functions(sources: list[str]) -> list:
    """The prediction functions a notebook's predict cells define, in a namespace that holds only `math`."""
    namespace = {"math": math, "__name__": "notebook"}
    for source in sources:
        exec(compile(source, "<predict cell>", "exec"), namespace)  # noqa: S102  (the course's own answers)
    return [value for name, value in namespace.items() if name.startswith("predict_")]


def _scores(assignment: str, sources: dict[str, str]) -> None:
    module = importlib.import_module(f"transformer_course.checks.{STAGES[assignment]}")
    cells = _cells("solutions", assignment)
    for index, cell in enumerate(cells):
        match = PREDICTION_CHECK.search(cell.source) if _nbgrader(cell).get("grade") else None
        if match is None:
            continue
        answer_id = next(cells[before].id for before in range(index - 1, -1, -1) if "def predict_" in
                         cells[before].source)
        (predict,) = _prediction_functions([sources[answer_id]])
        with scored():
            result = run_check(getattr(module, match.group(1)).__wrapped__, match.group(1), (predict,))
        assert result.passed, f"{assignment} {answer_id}: {result.message}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_solutions_and_the_honest_class_predictions_are_written_values_that_score(assignment):
    solutions = {cell.id: cell.source for cell in _cells("solutions", assignment)}
    _scores(assignment, solutions)
    released = {cell.id: cell.source for cell in _cells("notebooks", assignment)}
    for style in STYLES:
        written = {cell: answer.fill(released[cell]) for cell, answer in answers(style, assignment).items()
                   if "def predict_" in released[cell]}
        _scores(assignment, written)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_a_wrong_prediction_of_a_lesson_says_only_what_was_asked_what_came_and_the_step(assignment):
    """Scored wrong, each lesson's prediction message holds no number but those of its question (its title), the
    student's value and the tolerance: no truth, ratio or difference."""
    module = importlib.import_module(f"transformer_course.checks.{STAGES[assignment]}")
    for name, graded, _, _ in predictions(assignment):
        function = getattr(module, name)
        wrong = (("A" if graded.truths[0] == "B" else "B") if graded.choices else
                 float(graded.truths[0]) * 1.37 + 11)
        message = _scored_message(function.__wrapped__, _returning(wrong))
        assert not distinctive(graded) or not leaked(graded, message), (name, message)
        if graded.choices:
            continue
        allowed = ({value for _, value in numbers_in(function.check_title)}
                   | {wrong, 100 * graded.tolerance, graded.absolute, 0.0})
        unexplained = [written for written, value in numbers_in(message)
                       if not any(math.isclose(value, other, rel_tol=1e-5) for other in allowed)]
        assert not unexplained, (name, unexplained, message)


def _text(folder: str, assignment: str) -> str:
    return "\n".join(cell.source for cell in _cells(folder, assignment))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_graded_truth_is_written_in_the_student_or_solution_notebook(assignment):
    """A truth no short number could match (1,050,624, not 2) appears nowhere in the text of the stage's notebooks,
    in any of the usual ways of writing it; the solutions write the arithmetic, never the number."""
    for name, graded, _, _ in predictions(assignment):
        if not distinctive(graded):
            continue
        for folder in ("notebooks", "solutions"):
            found = leaked(graded, _text(folder, assignment))
            assert not found, f"{assignment} ({folder}): {name}'s truth is written as {found}"


@pytest.mark.parametrize("written", ["1050624", "1,050,624", "1_050_624", "1 050 624", "1{,}050{,}624",
                                     "1.050624e6", "(1050624)"])
def test_a_truth_is_found_however_it_is_written(written):
    graded = Graded((1_050_624.0,))
    assert distinctive(graded) and leaked(graded, f"the count is {written} here")
    assert not leaked(graded, "10506240 or 2,050,624 or 1050.624")


def test_short_truths_are_not_searched_in_whole_notebooks_but_reveal_outputs_are():
    assert not distinctive(Graded((2.0,), tolerance=0.03)) and not distinctive(Graded((0.7165,), absolute=0.01))
    assert leaked(Graded((9.0,)), "max_len=12: 9 decoder calls") == ["9"]
    assert leaked(Graded(("A",), choices=("A", "B")), "alpha 1.0: A -2.000 -> A first") == ["A", "A"]
    assert distinctive(Graded((252.0,), absolute=0.5)) and not distinctive(Graded((250.0,), absolute=0.5))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_prediction_is_followed_by_a_reveal_cell_that_does_not_hold_its_truth(assignment):
    cells = _cells("solutions", assignment)
    for name, graded, grade_index, reveal in predictions(assignment):
        assert reveal > grade_index
        if distinctive(graded):
            assert not leaked(graded, cells[reveal].source), (assignment, name)
