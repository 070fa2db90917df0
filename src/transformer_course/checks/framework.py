"""The machinery every check shares: failure messages, tensor comparison with diagnosis,
the built-in guard (PyTorch's own version of what an exercise asks for), the pass/fail record behind the
self-check summary, and the checks' defence against notebook code that replaces the tools they grade with."""

from __future__ import annotations

import functools
import inspect
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from html import escape
from types import ModuleType
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_course.checks._grade_cells import CREDIT, GRADE_CELLS
from transformer_course.checks.compare import as_float64, describe_difference, describe_shape, tensors_close
from transformer_course.checks.errors import crash_lines, explain_crash, first_line, is_stub
from transformer_course.checks.salt import salted_seed
from transformer_course.runtime import grading_mode, show, show_failure, stop_at_first_failure

CheckFunction = TypeVar("CheckFunction", bound=Callable[..., Any])


class CheckFailed(AssertionError):
    """A graded property does not hold; the message is written for the student."""


class ScoredWhenGraded(Exception):  # noqa: N818  (a note, not an error)
    """Raised by a check that gives no verdict outside grading (a prediction, `checks.predictions`): the message
    says what was noted; the check scores it when the notebook is graded."""


@dataclass
class Result:
    title: str
    passed: bool
    message: str = ""
    deferred: bool = False  # no verdict here: scored when the notebook is graded (ScoredWhenGraded)


_RESULTS: dict[str, Result] = {}
_LATEST: dict[tuple[str, str], Result] = {}  # (checks module, check name) -> latest outcome


def results() -> dict[str, Result]:
    """Latest outcome of every check run in this kernel, keyed by check name."""
    return dict(_RESULTS)


def record(name: str, title: str, passed: bool, message: str = "", module: str | None = None,
           deferred: bool = False) -> None:
    """Note a check's outcome decided elsewhere: the grader runs grade cells in a separate process
    and reports them here, so that a notebook's `check.summary()` lists them. `module` is the
    checks module the check belongs to (found by the check's name and title when not given)."""
    result = Result(title, passed, message, deferred)
    _RESULTS[name] = result
    if module is None:
        module = next((module_name for module_name, checks in list(sys.modules.items())
                       if module_name.startswith("transformer_course.checks.") and checks is not None
                       and getattr(getattr(checks, name, None), "check_title", None) == title), None)
    if module is not None:
        _LATEST.pop((module, name), None)  # keep the latest run last
        _LATEST[module, name] = result


def failing(module: str) -> list[str]:
    """The titles of the checks of checks module `module` (a module name) whose latest outcome in this kernel
    is a failure (a prediction noted for grading is not one)."""
    return [result.title for (name_of_module, _name), result in _LATEST.items()
            if name_of_module == module and not result.passed and not result.deferred]


DEFERRED = "○"  # the summary's and the check's mark for a prediction noted here and scored when graded
DEFERRED_STYLE = "border-left: 6px solid #5c6bc0; background: #eef0fa; padding: 6px 12px; margin: 4px 0"


def _points(value: float) -> str:
    number = f"{value:g}"
    return f"{number} point" + ("" if value == 1 else "s")


def _summary_module(module: str | ModuleType | None) -> str | None:
    """The checks module to summarise: the one given, else the one whose check ran last, else the
    only stage module imported in this kernel."""
    if isinstance(module, ModuleType):
        return module.__name__
    if module:
        return module if module.startswith("transformer_course.") else f"transformer_course.checks.{module}"
    if _LATEST:
        return next(reversed(_LATEST))[0]
    imported = [name for name in GRADE_CELLS if name in sys.modules]
    return imported[0] if len(imported) == 1 else None


def _cell_state(outcomes: list[Any]) -> tuple[str, Any]:
    """("passed", None), ("failed", the first failed outcome), ("deferred", None) (none failed, every check ran,
    a prediction noted for grading) or ("not run", None) for the latest outcomes of one grade cell's checks."""
    if all(outcome is not None and outcome.passed for outcome in outcomes):
        return "passed", None
    failed = next((o for o in outcomes if o is not None and not o.passed and not o.deferred), None)
    if failed is not None:
        return "failed", failed
    return ("deferred" if all(outcome is not None for outcome in outcomes) else "not run"), None


def _own_mark(outcome: Any) -> str:
    """One check's mark inside a grade cell of several checks."""
    if outcome is None:
        return "·"
    return "✔" if outcome.passed else DEFERRED if outcome.deferred else "✘"


def summary(module: str | ModuleType | None = None) -> None:
    """Show every check of this notebook with ✔ (passes), ✘ (fails), ○ (a prediction: noted, scored when the
    notebook is graded) or · (not run yet) and its points, then the hidden tests' points and the total.

    The grade cells and their points come from the table the build writes beside this module
    (`_grade_cells.py`, from each grade cell's nbgrader metadata); `module` is the stage's checks
    module, found by itself in a notebook."""
    name = _summary_module(module)
    cells = GRADE_CELLS.get(name or "", ())
    if not cells:
        print("No checks have run yet: run the graded cells above first." if not _RESULTS else
              "\n".join(f"{'✔' if r.passed else DEFERRED if r.deferred else '✘'} {r.title}"
                        for r in _RESULTS.values()))
        return
    checks_module = sys.modules.get(name) if name else None
    rows, earned, visible_points, hidden_points, hidden_cells = [], 0.0, 0.0, 0.0, 0
    deferred_points, deferred_cells, failing, counted = 0.0, 0, 0, 0
    credits = CREDIT.get(name or "", {})  # cells marked credit="extra" or "optional" by the lesson
    extra, extra_earned, hidden_extra = 0.0, 0.0, 0.0
    written = [points for _grade_id, points, names in cells if names is None]
    shared = False  # a cell with several checks: its points need every one of them
    for grade_id, points, names in cells:
        kind = credits.get(grade_id)
        if names is None:
            continue
        if not names:
            if kind == "extra":
                hidden_extra += points
            elif kind is None:
                hidden_points, hidden_cells = hidden_points + points, hidden_cells + 1
            continue
        outcomes = [_LATEST.get((name, check_name)) for check_name in names]
        state, failed = _cell_state(outcomes)
        titles = "; ".join(getattr(getattr(checks_module, n, None), "check_title", n)
                           + (f" [{_own_mark(outcome)}]" if len(names) > 1 and state != "passed" else "")
                           for n, outcome in zip(names, outcomes, strict=True))
        shared |= len(names) > 1
        if state == "passed":
            mark, note = "✔", ""
        elif state == "failed":
            mark, note = "✘", summary_note(failed.message)
        elif state == "deferred" and kind is None:  # passing, and a prediction noted for grading
            mark, note = DEFERRED, "noted; scored when your notebook is graded"
        else:
            mark, note = "·", "not run yet"
        if kind is not None:  # never part of the visible checks' total
            if kind == "extra":
                extra, extra_earned = extra + points, extra_earned + (points if state == "passed" else 0.0)
            rows.append((mark, titles, f"extra credit, +{_points(points)}" if kind == "extra"
                         else "optional, no points", note))
            continue
        visible_points, counted = visible_points + points, counted + 1
        earned += points if state == "passed" else 0.0
        if mark == DEFERRED:
            deferred_points, deferred_cells = deferred_points + points, deferred_cells + 1
        failing += mark not in ("✔", DEFERRED)
        rows.append((mark, titles, _points(points), note))
    verdict = (f"{earned:g} of {visible_points - deferred_points:g} points from the visible checks"
               + (" — all green." if not failing else f"; {failing} of {counted - deferred_cells} graded cells not "
                  "passing yet." + (" A cell with several checks earns its points when every one of them passes "
                                    "(each check's own mark is in brackets)." if shared else "")))
    if extra:
        verdict += (f" Extra credit: {extra_earned:g} of {extra:g} points from the visible checks, added to your "
                    "score and not part of its maximum.")
    if any(row[2].startswith("optional") for row in rows):
        verdict += " Optional checks count for no points."
    if deferred_cells:
        verdict += (f" Predictions: {deferred_cells} noted, worth {_points(deferred_points)}, scored when your "
                    "notebook is graded.")
    hidden = (f"Hidden tests: {hidden_cells} more cells worth {_points(hidden_points)}, run only when your "
              "notebook is graded (the same properties on other sizes)." if hidden_cells else "")
    if hidden_extra:
        hidden += ("\n" if hidden else "") + (
            f"Hidden extra credit: {_points(hidden_extra)} more, run only when your notebook is graded.")
    if written:
        hidden += ("\n" if hidden else "") + (
            f"Written answers: {len(written)} question{'s' if len(written) != 1 else ''} worth "
            f"{_points(sum(written))}, graded by your instructor.")
    text = "\n".join([*(f"{mark} {title}  ({points})" + (f"  — {note}" if note else "")
                        for mark, title, points, note in rows), "", verdict, hidden])
    colours = {"✔": "#2e7d32", "✘": "#c62828", "·": "#777", DEFERRED: "#3949ab"}
    table = "".join(
        f'<tr><td style="color: {colours[mark]}; font-weight: bold">{mark}</td><td>{escape(title)}</td>'
        f'<td style="white-space: nowrap">{points}</td><td style="color: #555">{escape(note)}</td></tr>'
        for mark, title, points, note in rows)
    html = (f'<table style="border-collapse: collapse; text-align: left">{table}</table>'
            f"<p><b>{escape(verdict)}</b><br>{escape(hidden).replace(chr(10), '<br>')}</p>")
    show(text, html)


# --- the hint ladder ----------------------------------------------------------------------------------
#
# A failure message is written whole (the grader's feedback after the deadline shows every line); a notebook
# shows it as a ladder (`ladder`): first what was observed, then folded hints a student opens one after the
# other when stuck: the likely cause in words, the idea or the shapes, and last the code that would fit.

CAUSE_LABEL, IDEA_LABEL, CODE_LABEL = "likely cause:", "the idea:", "in code:"  # the folded lines of a message
WOULD_FIT = "These would fit:"  # the crash explainer's rewritings of an operand (`crash.shape_clash`): code
HINT_TITLES = {CAUSE_LABEL: "the likely cause", IDEA_LABEL: "the idea", CODE_LABEL: "in code"}
# the student's own line as the engine quotes it, "in `forward`, line 3 (`x = ...`)": their code, not a fix
_STUDENT_LINE = re.compile(r"(line \d+(?: of `[^`\n]*`)?) \(`[^`\n]*`\)")
# code in a sentence: a call or a subscript (`f(x)`, `x.t()`, `pe[:, 0::2]`), a comparison or an assignment
# (`mask == 0`, `x = y...`, `finished |= ...`), a keyword argument (`dim=-1`), an operator between names
# (`weights @ keys`, `padding & look_ahead`); "j <= i", "d_k = 5" and shapes "(batch, 1, k_len)" are words
_CODE = re.compile(r"[\w\])]\(|[\w\])]\[(?!\d+\])|\w\s*(?:==|!=|[|&+\-*/]=)\s*\S|\w\s=\s[A-Za-z_(\[]"
                   r"|\b[a-z_]\w*=[-\w'\".]|[\w)]\s(?:[@&|%]|//)\s[\w(]")
_LEAD_INS = ("what is expected", "for example", "e.g.")  # a clause that only introduces the next one


@dataclass(frozen=True)
class Ladder:
    """A failure message as a notebook shows it: `visible`, what was observed (the problem, expected and got, a
    crash's error, the student's own line and what it was doing), then `rungs`, the folded hints in the order a
    student opens them: (title, text), the likely cause in words first, code (if any) last."""

    visible: str
    rungs: tuple[tuple[str, str], ...] = ()


def _is_code(text: str) -> bool:
    return _CODE.search(_STUDENT_LINE.sub(r"\1", text)) is not None


def _clauses(text: str) -> list[tuple[str, str]]:
    """The text cut at its top-level "; ", ": " and sentence ends (outside brackets and `code`): (clause, the
    separator that followed it)."""
    found, start, depth, quoted, index = [], 0, 0, False, 0
    while index < len(text):
        char = text[index]
        if char == "`":
            quoted = not quoted
        elif not quoted and char in "([{":
            depth += 1
        elif not quoted and char in ")]}":
            depth = max(0, depth - 1)
        elif not quoted and depth == 0 and text.startswith((": ", "; "), index):
            found.append((text[start:index], text[index:index + 2]))
            start = index = index + 2
            continue
        elif (not quoted and depth == 0 and char in ".?!" and text[index + 1:index + 2] == " "
              and text[index + 2:index + 3][:1].isupper() and not text[max(0, index - 3):index + 1].endswith("e.g.")):
            found.append((text[start:index + 1], " "))
            start = index = index + 2
            continue
        index += 1
    if text[start:].strip():
        found.append((text[start:], ""))
    merged: list[tuple[str, str]] = []  # "what is expected: <recipe>" stays one clause
    for clause, separator in found:
        if merged and merged[-1][1] == ": " and merged[-1][0].strip().endswith(_LEAD_INS):
            merged[-1] = (merged[-1][0] + ": " + clause, separator)
        else:
            merged.append((clause, separator))
    return merged


def _without_code_asides(clause: str) -> str:
    """The clause without its top-level parentheses that hold code ("... is real (token_ids != pad_idx)")."""
    kept, depth, quoted, start = [], 0, False, 0
    for index, char in enumerate(clause):
        if char == "`":
            quoted = not quoted
        elif not quoted and char == "(":
            if depth == 0 and (index == 0 or clause[index - 1] == " "):  # an aside, not a call's arguments
                kept.append(clause[start:index])
                start = index
                depth += 1
            elif depth:
                depth += 1
        elif not quoted and char == ")" and depth:
            depth -= 1
            if depth == 0:
                aside = clause[start:index + 1]
                if not _is_code(aside) or _STUDENT_LINE.search(clause[max(0, start - 40):index + 1]):
                    kept.append(aside)
                start = index + 1
    kept.append(clause[start:])
    text = re.sub(r"\s+([,.;:])", r"\1", re.sub(r" {2,}", " ", "".join(kept))).strip()
    return re.sub(r"[,;:]+([.;:]|$)", r"\1", text)  # "compare with pad_idx, (code)." -> "compare with pad_idx."


def _joined(parts: list[tuple[str, str]]) -> str:
    """Clauses put back together with their separators, ending with a full stop."""
    text = "".join(clause.strip() + (separator if index < len(parts) - 1 else "")
                   for index, (clause, separator) in enumerate(parts)).strip()
    return text if not text or text[-1] in ".?!" else text + "."


def split_cause(cause: str) -> tuple[str, str]:
    """A likely cause written in one piece, split into (the cause in words, the code it suggests): every clause
    that writes code goes to the second part whole, and a clause whose code is only an aside in parentheses
    goes to both (without the aside to the first)."""
    words: list[tuple[str, str]] = []
    code: list[tuple[str, str]] = []
    for clause, separator in _clauses(cause.strip()):
        if not _is_code(clause):
            words.append((clause, separator))
            continue
        code.append((clause, separator if separator == " " else "; "))
        plain = _without_code_asides(clause)
        if plain and plain != clause.strip() and not _is_code(plain):
            words.append((plain, separator))
        elif words and separator == " ":  # the left-out clause ended a sentence: so does the clause before it
            words[-1] = (words[-1][0].rstrip(".") + ".", " ")
        elif words and words[-1][1] == ": ":  # what the left-out clause explained reads on as a clause of its own
            words[-1] = (words[-1][0], "; ")
    return _joined(words), _joined(code)


def _message_blocks(message: str) -> list[tuple[str, list[str]]]:
    """The message's lines grouped: (label, lines) where label is CAUSE_LABEL, IDEA_LABEL or CODE_LABEL for the
    folded lines (with the lines indented under them) and "" for everything else."""
    blocks: list[tuple[str, list[str]]] = []
    indent_of = None  # the indent of the folded line being continued
    for line in message.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        label = next((label for label in (CAUSE_LABEL, IDEA_LABEL, CODE_LABEL) if stripped.startswith(label)), "")
        if label:
            blocks.append((label, [stripped[len(label):].strip()]))
            indent_of = indent
        elif indent_of is not None and indent > indent_of and stripped:
            blocks[-1][1].append(stripped)  # the folded line goes on
        else:
            indent_of = None
            if blocks and not blocks[-1][0]:
                blocks[-1][1].append(line)
            else:
                blocks.append(("", [line]))
    return blocks


def ladder(message: str, bug_hunt: bool | str = False) -> Ladder:
    """A failure message as the rungs of a ladder (see `Ladder`). Any message of the course's layout splits:
    the folded lines (`likely cause:`, `the idea:`, `in code:`) leave the visible part, a likely cause written in
    one piece is split into its words and its code (`split_cause`), and a crash's "These would fit: ..." (code)
    joins the code. A bug hunt's hints keep the cause for the student to find (the feedback names it); one whose
    cell also holds a step the student wrote (`bug_hunt=STEP_OF_YOURS`) says that step can be the cause too."""
    visible: list[str] = []
    causes: list[str] = []
    ideas: list[str] = []
    codes: list[str] = []
    for label, lines in _message_blocks(message):
        text = " ".join(line.strip() for line in lines if line.strip())
        if label == CAUSE_LABEL:
            words, code = split_cause(text)
            causes.append(words)
            codes.append(code)
        elif label == IDEA_LABEL:
            ideas.append(text)
        elif label == CODE_LABEL:
            codes.append(text)
        else:
            for line in lines:
                at = line.find(WOULD_FIT)
                if at >= 0:
                    codes.append(line[at:].strip())
                    line = line[:at].rstrip()
                visible.append(line)
    if bug_hunt:
        cause = BUG_HUNT_CAUSE + (f" {OWN_STEP_NOTE}" if bug_hunt == STEP_OF_YOURS else "")
        return Ladder("\n".join(visible), ((HINT_TITLES[CAUSE_LABEL], cause),))
    rungs = [(HINT_TITLES[label], " ".join(part for part in parts if part))
             for label, parts in ((CAUSE_LABEL, causes), (IDEA_LABEL, ideas), (CODE_LABEL, codes))]
    return Ladder("\n".join(visible), tuple((title, text) for title, text in rungs if text))


def fail(problem: str, *, expected: Any, got: Any, cause: str, idea: str = "", code: str = "") -> None:
    """Raise CheckFailed in the course's one message layout: the problem, what was expected and what came out
    (what the student reads first), then the hints a notebook folds away (`ladder`): the likely cause in words,
    the idea or the shapes behind the fix (`idea`), and code that would fit (`code`, the only hint that may
    show code). The grader's feedback keeps every line."""
    message = f"{problem}\n  expected: {expected}\n  got:      {got}\n  {CAUSE_LABEL} {cause}"
    if idea:
        message += f"\n  {IDEA_LABEL} {idea}"
    if code:
        message += f"\n  {CODE_LABEL} {code}"
    raise CheckFailed(message)


@contextmanager
def crash_explained(problem: str, *, expected: Any, cause: str | Callable[[], str] | Callable[[RuntimeError], str],
                    when: Callable[[RuntimeError], bool] = lambda error: True) -> Iterator[None]:
    """Turn a RuntimeError raised inside (a shape mismatch in the student's code, typically) into a
    failure in the course's layout when `when(error)`, with the student's line; `cause` may be worked
    out at that moment (a callable, given the error if it takes an argument).
    NotImplementedError, a RuntimeError too, passes through: `check` explains it."""
    try:
        yield
    except NotImplementedError:
        raise
    except RuntimeError as error:
        if not when(error):
            raise
        fail(problem, expected=expected, got=f"RuntimeError: {first_line(error, 160)}" + crash_lines(error),
             cause=(cause(error) if inspect.signature(cause).parameters else cause()) if callable(cause) else cause)


NOT_IMPLEMENTED = (
    "not implemented yet: a function or method this check calls still raises "
    "NotImplementedError.\n  likely cause: the exercise is not written yet: replace the line that raises "
    "NotImplementedError with your code and run that cell again."
)


def run_check(function: Callable[..., Any], title: str, args: tuple[Any, ...] = (),
              kwargs: Mapping[str, Any] | None = None, *, sources: Mapping[str, str] | None = None) -> Result:
    """Run one check function (undecorated) and say whether its property holds, with the message
    a student reads when it does not. Never raises for a failing property or a crash in the
    student's code; the decorator (notebooks) and the grader (sealed grade cells) both use this.

    A crash is explained by its kind (`checks.errors`) with the student's own line. The line is read
    with linecache (files, IPython cells); for code compiled from a string that linecache does not
    know (`compile(source, "<cell 3>", "exec")`), pass `sources={"<cell 3>": source}`, or only the
    line number is shown."""
    kwargs = check_arguments(kwargs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a warning on stderr would zero the grade cell
            function(*args, **kwargs)
    except CheckFailed as error:
        return Result(title, False, str(error))
    except ScoredWhenGraded as note:
        return Result(title, False, str(note), deferred=True)
    except Exception as error:  # the student's code crashed inside the check, or is not written yet
        if isinstance(error, NotImplementedError) and is_stub(error):
            return Result(title, False, NOT_IMPLEMENTED)
        return Result(title, False, explain_crash(error, sys.exc_info()[2], sources))
    return Result(title, True)


BUG_HUNT = "bug_hunt"  # a grade cell's keyword: the check grades a bug hunt (an exercise given with a bug planted)
BUG_HUNT_CAUSE = ("this is a bug hunt: the cause is for you to find, from what was expected and what came out "
                  "(the hints under the exercise help; your feedback after grading names it).")
STEP_OF_YOURS = "with a step of yours"  # `bug_hunt=` of a bug hunt whose cell also leaves a step to the student
OWN_STEP_NOTE = ("The step you wrote in this cell can be the cause too: if the hints under the exercise no longer "
                 "match what you see, compare that step with the same step where you wrote it before.")


def check_arguments(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """A grade cell's keywords without the options meant for the message (`bug_hunt`): what the check takes."""
    return {key: value for key, value in (kwargs or {}).items() if key != BUG_HUNT}


def without_cause(message: str) -> str:
    """A failure message with its hints replaced: a bug hunt's student reads the symptom, not the fix (the likely
    cause says the cause is theirs to find; the idea, the code and a crash's "These would fit" are left out)."""
    kept, replaced = [], False
    for label, lines in _message_blocks(message):
        if label == CAUSE_LABEL and not replaced:
            indent = next((line[: len(line) - len(line.lstrip())] for line in message.splitlines()
                           if line.strip().startswith(CAUSE_LABEL)), "  ")
            kept.append(f"{indent}{CAUSE_LABEL} {BUG_HUNT_CAUSE}")
            replaced = True
        elif not label:
            kept.extend(line[: line.find(WOULD_FIT)].rstrip() if WOULD_FIT in line else line for line in lines)
    return "\n".join(kept)


def summary_note(message: str) -> str:
    """The first line a student reads of a failure (the summary's note beside a ✘): never a hint."""
    return (ladder(message).visible.splitlines() or [""])[0]


def check(title: str) -> Callable[[CheckFunction], CheckFunction]:
    """Turn a function that raises CheckFailed into a graded check with a pass line.

    A passing check prints `✔ title` and returns True. A failing one, outside grading, shows a red
    ✘ block with what was observed (the problem, expected and got, a crash's line) and, folded under it, the
    hints of its `ladder` (the likely cause, then the idea, then code), and returns True, so the grade cell's
    `assert` holds and "Run all" carries on (the summary lists the failure again). While grading it raises
    CheckFailed with the whole message instead, so the cell fails (and scores 0) and the feedback says
    everything. When the student asked to stop at the first failure (`runtime.configure`) it shows the block
    and raises CheckFailed with the observed part alone (a traceback cannot fold the hints away).

    A grade cell of a bug hunt passes `bug_hunt=True`: outside grading, the failure message then keeps what
    was expected and what came out but not the likely cause, which would name the planted bug's fix; while
    grading the message is whole (the feedback explains the mistake). `bug_hunt=STEP_OF_YOURS` marks a bug hunt whose
    cell also leaves a step to the student: the folded cause then says that step can be at fault too.

    The decorated function keeps the original as `__wrapped__` and its title as `check_title`."""

    def decorate(function: CheckFunction) -> CheckFunction:
        graded = grading_mode()  # checks imported while grading stay strict

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> bool:
            __tracebackhide__ = True  # IPython and pytest hide this frame
            result = run_check(function, title, args, kwargs)
            record(function.__name__, title, result.passed, result.message, function.__module__, result.deferred)
            if result.passed:
                print(f"✔ {title}")
                return True
            if result.deferred and not graded:  # no verdict outside grading, and nothing to stop for
                show(f"{DEFERRED} {title}: {result.message}", f'<div style="{DEFERRED_STYLE}"><b>{DEFERRED} '
                     f'{escape(title)}</b>: {escape(result.message)}</div>')
                return True
            if graded or grading_mode():  # the grader's cell fails with everything the feedback will say
                raise CheckFailed(f"✘ {title}: {result.message}") from None
            steps = ladder(result.message, bug_hunt=kwargs.get(BUG_HUNT) or False)
            if stop_at_first_failure():  # the student asked to stop here
                show_failure(title, steps.visible, "Stopped here (STOP_AT_FIRST_FAILURE is True): fix the code "
                             "above, rerun its cell, then this one.", hints=steps.rungs)
                raise CheckFailed(f"✘ {title}: {steps.visible}") from None
            show_failure(title, steps.visible,
                         "The notebook carries on; fix the code above, rerun its cell, then this one.",
                         hints=steps.rungs)
            return True

        run.check_title = title  # type: ignore[attr-defined]
        return run  # type: ignore[return-value]

    return decorate


# --- tensors ------------------------------------------------------------------------------------


def generator(seed: int = 0) -> torch.Generator:
    """A private random stream, so expected values never depend on other random draws."""
    return torch.Generator().manual_seed(salted_seed(seed))


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=generator(seed), dtype=dtype)


def describe(tensor: Any) -> str:
    if isinstance(tensor, torch.Tensor):
        return f"tensor of shape {tuple(tensor.shape)}, dtype {tensor.dtype}"
    return f"{type(tensor).__name__} {tensor!r}"[:200]


def expect_tensor(name: str, got: Any, cause: str) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        fail(f"{name} is not a tensor.", expected="a torch.Tensor", got=describe(got), cause=cause)
    return got


def expect_shape(name: str, got: Any, shape: tuple[int, ...], cause: str) -> torch.Tensor:
    tensor = expect_tensor(name, got, cause)
    if tuple(tensor.shape) != tuple(shape):
        seen = describe_shape(tensor.shape, shape)
        fail(f"{name} has the wrong shape.", expected=tuple(shape),
             got=f"{tuple(tensor.shape)}: {seen}" if seen else tuple(tensor.shape), cause=cause)
    return tensor


RECIPE = "what is expected:"  # marks a cause that only restates the recipe (nothing was diagnosed)
# `expect_close`'s "expected:" line unless told otherwise
REFERENCE_VALUES = "the values of the course's reference implementation (same inputs)"


@dataclass(frozen=True)
class Diagnosis:
    """How a value departs from the reference (`where`: place, then how) and what probably causes it."""

    where: str
    cause: str = ""


Diagnose = Callable[[torch.Tensor], "Diagnosis | None"]


def _diagnosed(diagnose: Diagnose, got: torch.Tensor) -> Diagnosis | None:
    try:
        return diagnose(got)
    except CheckFailed:
        raise
    except Exception:  # a diagnosis that cannot be made here says nothing
        return None


def expect_close(
    name: str,
    got: Any,
    expected: torch.Tensor,
    *,
    cause: str,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    suspects: Mapping[str, Callable[[], torch.Tensor]] | None = None,
    axes: Sequence[str] | None = None,
    diagnose: Diagnose | None = None,
    expected_words: str = REFERENCE_VALUES,
) -> None:
    """Compare got with expected. On a mismatch say where and how got departs (`axes` names the axes;
    `diagnose` adds what only the check knows, the first place its computation departs, say), and
    name the first suspect mistake that reproduces got, else the diagnosed cause, else `cause`. A result of
    another shape is diagnosed too; when nothing is read from it, `cause` is given as the recipe it is.
    `expected_words` is the message's "expected:" line: what `expected` is (the reference's values by default;
    for a property of the student's module against itself, what its own outputs say)."""
    if isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(expected.shape) and diagnose is not None:
        read = _diagnosed(diagnose, got)
        cause = read.cause if read is not None and read.cause else f"{RECIPE} {cause}"
    got = expect_shape(name, got, tuple(expected.shape), cause)
    if tensors_close(got, expected, atol, rtol):
        return
    suspected = None
    for suspected_cause, make_wrong in (suspects or {}).items():
        try:
            wrong = make_wrong()
        except Exception:  # a suspect that cannot be built here is simply not the answer
            continue
        if tensors_close(got, wrong, max(atol, 1e-5), max(rtol, 1e-4)):
            suspected = suspected_cause
            break
    diagnosis = _diagnosed(diagnose, got) if diagnose is not None else None
    where = diagnosis.where if diagnosis and diagnosis.where else describe_difference(got, expected, axes, atol, rtol)
    if suspected:
        cause = suspected
    elif diagnosis and diagnosis.cause:
        cause = diagnosis.cause
    else:  # nothing pinned it down: say so, and show what is expected
        cause = f"not one of the mistakes the checks recognise; {RECIPE} {cause}"
    got64, expected64 = as_float64(got), as_float64(expected)
    difference = (got64 - expected64).abs()
    if got64.dim() == 0:  # one number: no index to point at
        detail = f"{got64.item():.6g} instead of {expected64.item():.6g}"
    elif not torch.isfinite(got64).all():
        index = tuple(int(i) for i in (~torch.isfinite(got64)).nonzero()[0])
        detail = f"NaN or inf at index {index}"
    else:
        index = tuple(int(i) for i in (difference == difference.max()).nonzero()[0])
        detail = (
            f"largest difference {difference.max().item():.3g} at index {index}: "
            f"{got64[index].item():.6g} instead of {expected64[index].item():.6g}"
        )
    problem = f"{name} {_has(name)} the wrong values" + (f": {where}." if where else ".")
    fail(problem, expected=expected_words, got=detail, cause=cause)


def _has(name: str) -> str:
    """'have' after a plural English noun ("weights", "the logits of step 2"), else 'has' ("output",
    "cache.self_keys[0]", "self.attn_weights": names of code are singular)."""
    words = name.split()
    head = words[1] if len(words) > 1 and words[0] == "the" else words[0] if words else ""
    plural = head.isalpha() and head.endswith("s") and not head.endswith(("ss", "us", "is"))
    return "have" if plural else "has"


def parameter_names(keys: Sequence[str]) -> str:
    """['W_q.weight', 'W_q.bias', 'W_k.weight'] -> '`W_q` (weight, bias), `W_k` (weight)'."""
    grouped: dict[str, list[str]] = {}
    for key in keys:
        owner, _, leaf = key.rpartition(".")
        grouped.setdefault(owner, []).append(leaf)
    return ", ".join(f"`{owner}` ({', '.join(leaves)})" if owner else f"`{', '.join(leaves)}`"
                     for owner, leaves in grouped.items())


def copy_weights(source: nn.Module, target: nn.Module, what: str) -> None:
    """Load source's parameters into target by name, explaining a layout mismatch in course terms:
    which names this check needs, which are missing and which are extra."""
    source_state, target_state = source.state_dict(), target.state_dict()
    missing = [key for key in source_state if key not in target_state]
    extra = [key for key in target_state if key not in source_state]
    if missing or extra:
        fail(
            f"{what}: this check copies the reference weights into your module by parameter name, and "
            "your module's names differ.",
            expected=f"the parameters {parameter_names(list(source_state))}",
            got="; ".join(part for part in (f"missing {parameter_names(missing)}" if missing else "",
                                            f"not expected {parameter_names(extra)}" if extra else "") if part),
            cause="keep the given `__init__` and its attribute names: only the checks that compare values with "
                  "the same weights need them.",
        )
    for key, value in source_state.items():
        if tuple(target_state[key].shape) != tuple(value.shape):
            fail(
                f"{what}: the parameter `{key}` has another shape than the reference's.",
                expected=tuple(value.shape), got=tuple(target_state[key].shape),
                cause="keep the given `__init__`: build each layer with the sizes it is given.",
            )
    target.load_state_dict(source_state)


# --- the built-in guard: PyTorch's own version of what an exercise asks for --------------------------------------


@dataclass(frozen=True)
class Builtins:
    """PyTorch's built-ins that would do an exercise's work for the student, by the names a student would use:
    `functions` (caught when the student's code calls them, directly or through a PyTorch module), `modules`
    (module classes, caught in the student's module tree), and `work`, what the exercise asks the student to
    write, in words. Made with `Builtins.of(F.rms_norm, nn.RMSNorm, work="RMS normalisation")`; a check runs the
    student's code under `student_code(builtins)`, and the failure names the built-in. Plain strings, so the
    record crosses to the student's side as it is."""

    functions: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    work: str = "attention"

    @classmethod
    def of(cls, *builtins: Any, work: str) -> Builtins:
        """The built-ins given as objects: functions of torch or torch.nn.functional, classes of torch.nn."""
        functions = tuple(name_of(item) for item in builtins if not isinstance(item, type))
        modules = tuple(name_of(item) for item in builtins if isinstance(item, type))
        return cls(functions, modules, work)

    def function_objects(self) -> tuple[Callable[..., Any], ...]:
        return tuple(found for name in self.functions if (found := _torch_object(name)) is not None)

    def module_classes(self) -> tuple[type, ...]:
        return tuple(found for name in self.modules if isinstance(found := _torch_object(name), type))


def name_of(builtin: Any) -> str:
    """Where a student would find a built-in: `torch.nn.functional.rms_norm`, `torch.nn.RMSNorm`."""
    short = getattr(builtin, "__name__", str(builtin))
    for place, namespace in (("torch.nn.functional", F), ("torch.nn", nn), ("torch", torch)):
        if getattr(namespace, short, None) is builtin:
            return f"{place}.{short}"
    return f"{getattr(builtin, '__module__', 'torch')}.{short}"


def _torch_object(name: str) -> Any:
    """The object a built-in's name stands for (None when this PyTorch has no such thing)."""
    place, _, short = name.rpartition(".")
    namespace = {"torch.nn.functional": F, "torch.nn": nn, "torch": torch}.get(place)
    return getattr(namespace, short, None) if namespace is not None else None


ATTENTION = Builtins.of(F.scaled_dot_product_attention, F.multi_head_attention_forward, nn.MultiheadAttention,
                        nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder, nn.TransformerEncoderLayer,
                        nn.TransformerDecoderLayer, work="attention")


_COURSE_CODE: ContextVar[bool] = ContextVar("transformer_course_course_code", default=False)


@contextmanager
def course_code() -> Iterator[None]:
    """Inside: code the check supplied runs (a part plugged into the student's module, which may be built on
    PyTorch's own attention where the reference is not in the grading build): the guard below lets it be. Only
    the student's own calls are theirs to answer for."""
    token = _COURSE_CODE.set(True)
    try:
        yield
    finally:
        _COURSE_CODE.reset(token)


def _reject_call(builtins: Builtins, function: Callable[..., Any]) -> None:
    name = name_of(function)
    if builtins == ATTENTION:  # the course's first guard, in its own words
        fail("your code calls PyTorch's built-in attention.",
             expected="attention written with matrix products and softmax", got=f"a call to {name}",
             cause="this course asks you to build attention yourself; the built-in is only the yardstick.")
    fail(f"your code calls PyTorch's built-in {name}, which does this exercise's work.",
         expected=f"{builtins.work} written by your own code", got=f"a call to {name}",
         cause=f"this exercise asks you to write {builtins.work} yourself; PyTorch's {name} is only the yardstick.")


class _RejectBuiltins(TorchFunctionMode):
    def __init__(self, builtins: Builtins = ATTENTION) -> None:
        super().__init__()
        self.builtins = builtins
        self.functions = builtins.function_objects()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func in self.functions and not _COURSE_CODE.get():
            _reject_call(self.builtins, func)
        return func(*args, **(kwargs or {}))


def reject_builtin_modules(module: nn.Module, what: str, builtins: Builtins = ATTENTION) -> None:
    classes = builtins.module_classes()
    for name, child in module.named_modules():
        if isinstance(child, classes):
            kind = type(child).__name__
            fail(
                f"{what} contains PyTorch's built-in {kind}.",
                expected="only the course's own modules" if builtins == ATTENTION
                else f"{builtins.work} written by your own code",
                got=f"`{name or 'self'}` is a torch.nn.{kind}",
                cause="this course asks you to build the Transformer yourself; the built-in is only the yardstick."
                if builtins == ATTENTION else
                f"this exercise asks you to write {builtins.work} yourself; PyTorch's torch.nn.{kind} is only the "
                "yardstick.",
            )


@contextmanager
def student_code(builtins: Builtins = ATTENTION) -> Iterator[None]:
    """Run the student's code with PyTorch's built-ins for the exercise rejected (by default, attention's)."""
    with _RejectBuiltins(builtins):
        yield
