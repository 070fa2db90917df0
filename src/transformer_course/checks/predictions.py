"""Predict, then run: a student's prediction of a number or a choice, scored when the notebook is graded.

A prediction exercise is a function the student completes so that it returns their prediction (the stub
raises NotImplementedError until they do):

    def predict_encoder_block_parameters() -> int:
        return 4 * (512 * 512 + 512) + ...    # the student's number, or the arithmetic they worked out

and a grade cell that scores it with a check of the stage's checks module:

    @check("your prediction: the parameters of one encoder block")
    def predicted_encoder_block_parameters(predict):
        expect_number(predict, truths=lambda: (with_biases, without_attention_biases), tolerance=0.0,
                      what="the parameters of EncoderBlock(512, 8, 2048, 0.1)",
                      cause="the reasoning step to check (never the value, nor a formula that gives it)")

**Two modes.** In the student's own notebook (outside grading) the check gives no verdict: it checks that the
prediction is well formed (a number, or one of the choices, that the student wrote) and says that it is
noted and scored when the notebook is graded (`framework.ScoredWhenGraded`; the summary lists it apart). So a
retry tells nothing, and no first answer needs recording: what is graded is what the function returns when
the notebook is graded. While grading (`grading_mode()`, or the checks judged in the grader's process, or
`scored()` in a test) the check scores it against the truth, which it works out itself (from the paper's
formulas or by building the reference modules on the meta device), never written in the notebook. A wrong
prediction's message then says what was asked, what the student returned, the tolerance and the reasoning
step to check, never the truth, its ratio to the student's value or its direction.

**A written value.** The prediction function may hold only literals, arithmetic, a few arithmetic built-ins
(`ALLOWED_BUILTINS`) and the `math` module: a prediction is worked out before anything runs. The function's
code is read on the student's side (`_describe`: global names, attributes and imports of its code and every
nested code object, its defaults and closure), and the grader's process judges what was read: a call of the
course, of torch or of any other notebook name is refused with a message that says so.

**Several conventions.** Where the truth depends on a convention the question does not fix (a parameter count
with or without the `nn.Linear` biases of the attention projections, which the paper's formulas do not have),
the check gives every reasonable truth (`truths=lambda: (a, b)`) and any of them scores.

The notebook's cell after the grade cells shows the truth for *another* configuration (other sizes, another
sentence, another step), so the student can test the method but not copy the graded number; tests hold the
graded truths out of every notebook's text and out of the outputs of those cells (tests/test_predictions.py,
tests/test_teeth.py).
"""

from __future__ import annotations

import builtins
import dis
import math
import re
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from transformer_course.checks.boundary import judged, on_student_side
from transformer_course.checks.framework import ScoredWhenGraded, fail, student_code
from transformer_course.reference import count_parameters
from transformer_course.runtime import grading_mode

# What a prediction function may name besides its own local variables: the math module and these built-ins
# (arithmetic on literals; NotImplementedError is the unfinished stub's).
ALLOWED_BUILTINS = ("abs", "divmod", "float", "int", "len", "max", "min", "pow", "range", "round", "str", "sum",
                    "NotImplementedError")
_GENUINE_BUILTINS = {name: getattr(builtins, name) for name in ALLOWED_BUILTINS}  # as imported, before any cell ran
_NAME_LOADS = ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS")
_ATTRIBUTE_LOADS = ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM")

WORKED_OUT = ("a prediction is a value you work out before running anything: write the number (or the "
              "arithmetic that gives it, with `math` if you like) after `return`")
SCORED_LATER = ("It is scored when your notebook is graded; until then nothing says whether it is right, so "
                "trying again tells you nothing. A cell after the checks shows the truth for another configuration: "
                "use it to test your method.")


# --- the student's side: what the function is and what it returns --------------------------------------------


@on_student_side
def _describe(predict: Callable[[], Any]) -> dict[str, Any]:
    """What a prediction function's code uses, as plain data (the grader judges it, `_refused`): its name, whether
    it is a plain Python function, whether it carries values from outside (defaults, a closure), every global name
    it reads with what that name is here (the math module, one of the allowed built-ins as Python has it, or
    something else), every attribute it reads, the modules it imports and the names it writes outside itself."""
    if not isinstance(predict, types.FunctionType):
        return {"name": getattr(predict, "__name__", ""), "function": False, "type": type(predict).__name__}
    globals_, names, attributes, imports, writes = predict.__globals__, {}, set(), set(), set()
    codes = [predict.__code__]
    while codes:
        code = codes.pop()
        codes += [constant for constant in code.co_consts if isinstance(constant, types.CodeType)]
        for instruction in dis.get_instructions(code):
            if instruction.opcode not in dis.hasname:
                continue
            name = str(instruction.argval)
            if instruction.opname in _NAME_LOADS:
                value = globals_[name] if name in globals_ else getattr(builtins, name, None)
                names[name] = ("math" if value is math else
                               "builtin" if name in _GENUINE_BUILTINS and value is _GENUINE_BUILTINS[name] else
                               "missing" if name not in globals_ and not hasattr(builtins, name) else
                               type(value).__name__)
            elif instruction.opname in _ATTRIBUTE_LOADS:
                attributes.add(name)
            elif instruction.opname == "IMPORT_NAME":
                imports.add(name)
            else:  # STORE_GLOBAL, DELETE_ATTR, ...: the function changes something outside itself
                writes.add(f"{instruction.opname} {name}")
    replaced = sorted(name for name in attributes if hasattr(math, name) and not name.startswith("_")
                      and not isinstance(getattr(math, name), float)
                      and getattr(getattr(math, name), "__module__", None) != "math")
    return {"name": predict.__name__, "function": True, "type": "function",
            "outside": bool(predict.__defaults__ or predict.__kwdefaults__ or predict.__closure__),
            "names": names, "attributes": sorted(attributes), "imports": sorted(imports), "writes": sorted(writes),
            "math_replaced": replaced}


@on_student_side
def _answer(predict: Callable[[], Any]) -> Any:
    """What the student's prediction function returns, as a plain number or text (anything else as its repr)."""
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


# --- the grader's side: the form, then (while grading) the score ----------------------------------------------


def _refused(description: dict[str, Any]) -> list[str]:
    """What a prediction function uses that a worked-out value does not: [] when it holds only literals,
    arithmetic, the allowed built-ins and `math`."""
    found = [f"`{name}`" for name, kind in description["names"].items()
             if not ((name == "math" and kind == "math") or (name in ALLOWED_BUILTINS and kind == "builtin"))]
    found += [f"`.{name}`" for name in description["attributes"] if name.startswith("_")]
    found += [f"`import {name}`" for name in description["imports"] if name != "math"]
    found += [f"a change outside the function ({write})" for write in description["writes"]]
    found += [f"`math.{name}` replaced by the notebook" for name in description["math_replaced"]]
    if description["outside"]:
        found.append("values held from outside the function (default arguments or a closure)")
    return found


def _written_value(predict: Callable[[], Any]) -> Any:
    """The value the student's prediction function returns, once its code is seen to hold only a value worked out
    by hand (the check fails otherwise, saying what it uses)."""
    description = _describe(predict)
    if not description["function"]:
        fail("the prediction is not the given function.", expected="the given `def predict_...():` with your value "
             "returned", got=description["type"], cause="keep the given function and put your prediction after "
             "`return`.")
    refused = _refused(description)
    if refused:
        fail("your prediction is computed by running code, not worked out.",
             expected="a value worked out by hand: literals, arithmetic, `math` and the built-ins " + ", ".join(
                 f"`{name}`" for name in ALLOWED_BUILTINS[:-1]),
             got=f"`{description['name']}` uses " + ", ".join(refused[:6]),
             cause=f"{WORKED_OUT}. A name of the notebook, the course or torch is refused in the function even "
                   "when the value it gives would be right.")
    return _answer(predict)


def scoring() -> bool:
    """Whether a prediction is scored now: while grading (nbgrader's run, or the checks judged in the grader's
    process), or inside `scored()`. Otherwise a check only looks at the prediction's form."""
    return grading_mode() or judged() or _SCORED.get()


_SCORED: ContextVar[bool] = ContextVar("transformer_course_prediction_scored", default=False)


@contextmanager
def scored() -> Iterator[None]:
    """Inside: prediction checks score (a test, the honest class called directly) as they do while grading."""
    token = _SCORED.set(True)
    try:
        yield
    finally:
        _SCORED.reset(token)


@dataclass(frozen=True)
class Graded:
    """What a prediction check scores against: every accepted truth, and the tolerance (numbers), or the right
    choice among the choices. Made only while scoring, and for the tests (`graded_truths`)."""

    truths: tuple[float | str, ...]
    tolerance: float = 0.0
    absolute: float = 0.0
    choices: tuple[str, ...] = ()

    def accepts(self, value: float | str) -> bool:
        if self.choices:
            return str(value).strip().strip("\"'").strip().lower() == str(self.truths[0]).lower()
        return any(abs(float(value) - float(truth)) <= max(self.absolute, self.tolerance * abs(float(truth)))
                   + 1e-12 * max(1.0, abs(float(truth))) for truth in self.truths)


class _Collected(Exception):
    def __init__(self, graded: Graded) -> None:
        super().__init__("collected")
        self.graded = graded


_COLLECTING: ContextVar[bool] = ContextVar("transformer_course_prediction_collecting", default=False)


def graded_truths(check_function: Callable[..., Any]) -> Graded:
    """What a prediction check (decorated or not) scores against, for the tests and the authors: its truths and
    tolerance, or its choices and the right one, without a prediction to score."""
    function = getattr(check_function, "__wrapped__", check_function)
    token = _COLLECTING.set(True)
    try:
        function(None)
    except _Collected as collected:
        return collected.graded
    finally:
        _COLLECTING.reset(token)
    raise ValueError(f"{getattr(function, '__name__', function)} is not a prediction check")


def _values(truths: Any) -> tuple[Any, ...]:
    value = truths() if callable(truths) else truths
    return tuple(value) if isinstance(value, list | tuple) else (value,)


def expect_number(predict: Callable[[], Any], *, truths: Any, what: str, cause: str,
                  tolerance: float = 0.0, absolute: float = 0.0) -> None:
    """The student's written number; while scoring it must be within `tolerance` (relative) or `absolute` of one
    of `truths` (a number, several, or a function giving them, called only while scoring)."""
    if _COLLECTING.get():
        raise _Collected(Graded(tuple(float(t) for t in _values(truths)), tolerance, absolute))
    value = _written_value(predict)
    if isinstance(value, str):
        try:
            value = float(value.replace(",", "").replace("_", ""))
        except ValueError:
            fail(f"your prediction of {what} is not a number.", expected="a number", got=repr(value)[:80],
                 cause="return a number (an int or a float), not text.")
    if not math.isfinite(value):
        fail(f"your prediction of {what} is not a finite number.", expected="a finite number", got=repr(value),
             cause="return the number you predict.")
    if not scoring():
        raise ScoredWhenGraded(f"noted: your prediction is a number, as asked. {SCORED_LATER}")
    graded = Graded(tuple(float(t) for t in _values(truths)), tolerance, absolute)
    if graded.accepts(value):
        return
    target = "any accepted value (one per convention the question allows)" if len(graded.truths) > 1 else \
        "the true value"
    within = (f"within {tolerance:.0%} of {target}" if tolerance else f"within {absolute:g} of {target}" if absolute
              else f"{target}, exactly")
    fail(f"your prediction of {what} is not {within}.", expected=f"{within} (not shown here)", got=_show(value),
         cause=cause)


def expect_choice(predict: Callable[[], Any], *, truth: Any, choices: Sequence[str], what: str, cause: str) -> None:
    """The student's written choice (one of `choices`, compared without case or surrounding quotes); while scoring
    it must be `truth` (or what the function `truth` gives, called only while scoring)."""
    if _COLLECTING.get():
        raise _Collected(Graded((str(_values(truth)[0]),), choices=tuple(choices)))
    value = _written_value(predict)
    given = str(value).strip().strip("\"'").strip().lower()
    known = {choice.lower(): choice for choice in choices}
    if given not in known:
        fail(f"your answer to {what} is not one of the choices.", expected=" or ".join(repr(c) for c in choices),
             got=repr(value)[:80], cause="return one of the choices, as text.")
    if not scoring():
        raise ScoredWhenGraded(f"noted: your answer is one of the choices, as asked. {SCORED_LATER}")
    if not Graded((str(_values(truth)[0]),), choices=tuple(choices)).accepts(given):
        fail(f"your answer to {what} is not the right choice.", expected="the right one of "
             + " or ".join(repr(c) for c in choices), got=repr(known[given]), cause=cause)


def parameters_of(build: Callable[[], nn.Module], *, attention_biases: bool = True) -> int:
    """The trainable parameters of the module `build()` makes, built on the meta device: shapes only, no memory
    and no computation, and the random generator of the student's kernel (where a check runs in Colab) is left
    as it was. `attention_biases=False`: without the biases of the attention projections `W_q`, `W_k`, `W_v`
    and `W_o` (the paper's formulas have none)."""
    with torch.device("meta"):
        module = build()
    total = count_parameters(module)
    if not attention_biases:
        total -= sum(parameter.numel() for name, parameter in module.named_parameters()
                     if re.search(r"(^|\.)W_[qkvo]\.bias$", name))
    return total


# --- what a text shows: the numbers a prediction would accept ---------------------------------------------------

NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:[,_ ]\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])"
                    r"|(?<![\w.])-?\.\d+(?![\w])")


def numbers_in(text: str) -> list[tuple[str, float]]:
    """Every number written in `text` (1,050,624, 1_050_624, 1 050 624, 0.72, 7.0e-04, LaTeX's 1{,}050{,}624), with
    its value."""
    text = text.replace("{,}", ",").replace("\\,", ",").replace("\u2009", " ")
    found = []
    for match in NUMBER.finditer(text):
        written = match.group(0)
        try:
            found.append((written, float(re.sub(r"[,_ ]", "", written))))
        except ValueError:
            continue
    return found


def leaked(graded: Graded, text: str) -> list[str]:
    """The numbers (or, for a choice, the words) of `text` that the prediction would accept."""
    if graded.choices:
        return [word for word in re.findall(r"(?<![\w'\"])[\"']?\w+[\"']?(?![\w])", text)
                if word.strip("\"'") == str(graded.truths[0])]
    return [written for written, value in numbers_in(text) if graded.accepts(value)]


def distinctive(graded: Graded) -> bool:
    """Whether no short number (two significant digits or fewer) would score: then a number that scores, anywhere
    in a notebook, is the truth written down; otherwise it may be an unrelated 2 or 0.7."""
    if graded.choices:
        return False
    for truth in graded.truths:
        allowed = max(graded.absolute, graded.tolerance * abs(float(truth)))
        exponent = math.floor(math.log10(abs(float(truth)))) if truth else 0
        for digits in (1, 2):
            unit = 10.0 ** (exponent - digits + 1)
            if abs(round(float(truth) / unit) * unit - float(truth)) <= allowed + 1e-12 * max(1.0, abs(float(truth))):
                return False
    return True


def _show(number: float) -> str:
    if float(number).is_integer() and abs(number) < 1e15:
        return f"{int(number):,}"
    return f"{number:.6g}"
