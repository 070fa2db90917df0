"""Predict, then run: a student's prediction of a number or a choice, scored by a grade cell.

A prediction exercise is a function the student completes so that it returns their prediction (the stub
raises NotImplementedError until they do):

    def predict_encoder_block_parameters() -> int:
        return 3_150_000        # the student's number (an expression they worked out is fine too)

and a grade cell that scores it with a check of the stage's checks module:

    @check("your prediction: the parameters of one encoder block")
    def predicted_encoder_block_parameters(predict):
        expect_number(predict, truth=..., tolerance=0.01, what="the parameters of one encoder block",
                      cause="count each nn.Linear as in_features * out_features weights plus out_features biases")

The truth is worked out by the check (from the paper's formulas or by building the module), never written
in the notebook; the cell after the grade cell computes and shows it. The student's function runs on the
student's side (an experiment); only the value it returns comes back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from transformer_course.checks.boundary import on_student_side
from transformer_course.checks.framework import fail, student_code
from transformer_course.reference import count_parameters


@on_student_side
def _answer(predict: Callable[[], Any]) -> Any:
    """What the student's prediction function returns, as a plain number or text (anything else as its repr)."""
    if not callable(predict):
        fail("the prediction is not a function.", expected="the given `def predict_...():` with your value returned",
             got=f"{type(predict).__name__}", cause="keep the given function and put your prediction after `return`.")
    with student_code():
        value = predict()
    if value is None or value is Ellipsis:
        fail("no prediction yet.", expected="your prediction after `return`", got=repr(value),
             cause="write the value you predict (work it out before you run the cell below the check).")
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int | float | str):
        return value
    try:  # a 0-d tensor or a numpy number
        return float(value)
    except (TypeError, ValueError):
        return repr(value)[:100]


def expect_number(predict: Callable[[], Any], *, truth: float, what: str, cause: str,
                  tolerance: float = 0.0, absolute: float = 0.0) -> None:
    """The student's number must be within `tolerance` (relative) or `absolute` of `truth`."""
    value = _answer(predict)
    if isinstance(value, str):
        try:
            value = float(value.replace(",", "").replace("_", ""))
        except ValueError:
            fail(f"your prediction of {what} is not a number.", expected="a number", got=repr(value)[:80],
                 cause="return a number (an int or a float), not text.")
    if not math.isfinite(value):
        fail(f"your prediction of {what} is not a finite number.", expected="a finite number", got=repr(value),
             cause="return the number you predict.")
    allowed = max(absolute, tolerance * abs(truth))
    if abs(value - truth) <= allowed + 1e-12 * max(1.0, abs(truth)):
        return
    ratio = f" ({value / truth:.3g} × the true value)" if truth and value else ""
    within = (f"within {tolerance:.0%}" if tolerance else f"within {absolute:g}" if absolute else "exactly")
    fail(f"your prediction of {what} is off.", expected=f"{_show(truth)} ({within})", got=f"{_show(value)}{ratio}",
         cause=cause)


def expect_choice(predict: Callable[[], Any], *, truth: str, choices: Sequence[str], what: str, cause: str) -> None:
    """The student's choice (one of `choices`, compared without case or surrounding spaces) must be `truth`."""
    value = _answer(predict)
    given = str(value).strip().strip("\"'").strip().lower()
    known = {choice.lower(): choice for choice in choices}
    if given not in known:
        fail(f"your answer to {what} is not one of the choices.", expected=" or ".join(repr(c) for c in choices),
             got=repr(value)[:80], cause="return one of the choices, as text.")
    if known[given] != truth:
        fail(f"your answer to {what} is not the right choice.", expected=repr(truth), got=repr(known[given]),
             cause=cause)


def parameters_of(build: Callable[[], nn.Module]) -> int:
    """The trainable parameters of the module `build()` makes, built on the meta device: shapes only, no memory
    and no computation, and the random generator of the student's kernel (where a check runs in Colab) is left
    as it was."""
    with torch.device("meta"):
        return count_parameters(build())


def _show(number: float) -> str:
    if float(number).is_integer() and abs(number) < 1e15:
        return f"{int(number):,}"
    return f"{number:.4g}"
