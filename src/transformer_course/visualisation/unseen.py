"""Figures nobody will see are not drawn.

While a notebook is graded, matplotlib draws into the Agg backend and the grader closes every figure
after each cell, so no figure reaches the autograded notebook or the feedback page. Building one still
costs time (the attention grids of stage 6 take about a second each, ticks and labels of every panel),
time every student's grading would pay. The course's drawing functions are therefore decorated with
`not_drawn_while_grading`: under the grader they return an empty `Figure` (None for those that return
nothing, and for an interactive figure one whose `.show()` shows nothing) without building anything.
Outside grading (Colab, Jupyter, the tests) they draw as always. The figures' inputs are computed by the
notebook before the call, so the notebook's own code runs exactly as it would anyway.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from matplotlib.figure import Figure

from transformer_course.runtime import grading_mode

Drawing = TypeVar("Drawing", bound=Callable[..., Any])
MARK = "not_drawn_while_grading"


class Unseen:
    """What an interactive figure's function returns while grading: `.show()` shows nothing."""

    figure = None

    def show(self) -> None:
        return None


def not_drawn_while_grading(draw: Drawing) -> Drawing:
    """Decorate a function that draws a figure: skipped (an empty Figure, None, or `Unseen` for an
    interactive figure) while grading."""
    returns = draw.__annotations__.get("return")

    @functools.wraps(draw)
    def drawing(*arguments: Any, **keywords: Any) -> Any:
        if grading_mode():
            return None if returns in ("None", None) else Unseen() if returns == "InteractiveFigure" else Figure()
        return draw(*arguments, **keywords)

    setattr(drawing, MARK, True)
    return drawing  # type: ignore[return-value]
