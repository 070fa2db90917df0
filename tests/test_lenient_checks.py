"""Outside grading a failing check shows a red block and lets the notebook go on; while grading, or
when the student asks for it, it raises. The summary lists every check of the notebook with its points.
(Whole notebooks, run top to bottom, are in test_teeth.py.)"""

import pytest

from transformer_course import runtime
from transformer_course.checks import framework
from transformer_course.checks.framework import CheckFailed, check
from transformer_course.runtime import configure


@pytest.fixture(autouse=True)
def outside_grading(monkeypatch):
    for name in ("NBGRADER_EXECUTION", runtime.STRICT_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(runtime._settings, "stop_at_first_failure", False)


@pytest.fixture
def shown(monkeypatch):
    """What runtime.show would display: (text, html) pairs."""
    displayed = []
    monkeypatch.setattr(runtime, "_in_notebook", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda bundle, raw=False: displayed.append(
        (bundle["text/plain"], bundle["text/html"])))
    return displayed


def failing_check():
    @check("a property that does not hold")
    def wrong():
        framework.fail("the thing is wrong.", expected="(2, 3)", got="(3, 2)", cause="axes <swapped> & more",
                       idea="the heads go first", code="x.transpose(1, 2)")

    return wrong


def test_outside_grading_a_failure_is_a_red_block_and_the_cell_goes_on(shown):
    assert failing_check()() is True  # so `assert check.x(...)` holds and Run all carries on
    (text, html), = shown
    assert text.startswith("✘ a property that does not hold") and "expected: (2, 3)" in text and "carries on" in text
    assert "#c62828" in html and "✘" in html and "<b>expected:</b>" in html
    assert "axes &lt;swapped&gt; &amp; more" in html  # the message is escaped, not interpreted
    assert not framework.results()["wrong"].passed  # and the summary knows it failed


def test_the_hints_are_folded_one_inside_the_other_and_absent_from_the_text(shown):
    failing_check()()
    (text, html), = shown
    for hidden in ("likely cause", "swapped", "the heads go first", "transpose"):
        assert hidden not in text  # a front end without HTML, and the summary, show what was observed only
    observed = html.index("<b>got:</b>")
    cause, idea, code = (html.index(f"Hint {n}: ") for n in (1, 2, 3))
    assert observed < cause < idea < code
    assert "Hint 1: the likely cause" in html and "Hint 3: in code" in html
    # each hint is inside the one before: the second's <details> opens before the first's closes
    assert html.index("<details", cause - 200) < cause and html.rindex("</details>") > code
    assert html.count("<details") == 3 and html[code:].count("</details>") == 3
    assert html.index("axes &lt;swapped&gt;") < idea < html.index("the heads go first") < code \
        < html.index("x.transpose(1, 2)")
    assert framework.summary_note(framework.results()["wrong"].message) == "the thing is wrong."


def test_without_a_notebook_the_failure_is_printed_as_text(capsys):
    assert failing_check()() is True
    assert "✘ a property that does not hold" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["settings cell", "environment"])
def test_a_failure_raises_when_asked_with_what_was_observed_and_shows_the_hints_folded(how, monkeypatch, shown):
    if how == "settings cell":
        configure(stop_at_first_failure=True)
    else:
        monkeypatch.setenv(runtime.STRICT_VARIABLE, "1")
    with pytest.raises(CheckFailed, match=r"(?s)✘ a property.*expected: \(2, 3\)") as raised:
        failing_check()()
    assert "likely cause" not in str(raised.value) and "transpose" not in str(raised.value)  # no hint in a traceback
    (text, html), = shown  # the red block above the traceback holds the hints, folded
    assert "Stopped here" in text and "Hint 3: in code" in html and "transpose" not in text


def test_while_grading_a_failure_raises_with_the_whole_message(monkeypatch, shown):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(CheckFailed, match=r"(?s)✘ a property.*expected: \(2, 3\).*likely cause: axes <swapped> & "
                                          r"more\n  the idea: the heads go first\n  in code: x.transpose\(1, 2\)"):
        failing_check()()
    assert not shown


def test_checks_imported_while_grading_stay_strict_when_the_variable_is_removed(monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    wrong = failing_check()  # decorated (imported) while grading
    monkeypatch.delenv("NBGRADER_EXECUTION")  # what a submission could do in a cell
    with pytest.raises(CheckFailed):
        wrong()


def test_summary_lists_every_check_of_the_notebook_with_points(monkeypatch, capsys):
    import transformer_course.checks.positional_encoding as stage

    monkeypatch.setattr(framework, "_LATEST", {})

    class Stub:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError

    try:  # fails (not implemented); the other visible checks are not run
        stage.buffer_shape(Stub)
    except CheckFailed:  # the stage was first imported under grading by an earlier test: strict
        pass
    capsys.readouterr()
    framework.summary()
    lines = capsys.readouterr().out.splitlines()
    marks = [line for line in lines if line and line[0] in "✔✘·"]
    assert marks[0].startswith("✘ " + stage.buffer_shape.check_title) and "(1 point)" in marks[0]
    cells = framework.GRADE_CELLS[stage.__name__]  # (grade id, points, check names) from the build
    visible = [(points, names) for _grade_id, points, names in cells if names]
    hidden = [points for _grade_id, points, names in cells if names == ()]
    assert len(visible) > 1 and hidden  # the stage has more than one visible check and hidden tests
    assert [line[0] for line in marks] == ["✘"] + ["·"] * (len(visible) - 1) and "not run yet" in marks[1]
    assert f"({visible[1][0]:g} point" in marks[1]
    assert any(f"0 of {sum(points for points, _ in visible):g} points from the visible checks" in line
               for line in lines)
    assert any(f"Hidden tests: {len(hidden)} more cells worth {sum(hidden):g} point" in line for line in lines)


def _run_in_a_kernel(sources: list[str], environment: dict[str, str] | None = None) -> list:
    """Run cells in a real Jupyter kernel, as "Run all" does (stopping at the first cell that errs)."""
    import os

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    for name in ("NBGRADER_EXECUTION", runtime.STRICT_VARIABLE):
        os.environ.pop(name, None)
    saved = dict(os.environ)
    os.environ.update(environment or {})
    try:
        NotebookClient(notebook, kernel_name="python3", timeout=120).execute()
    except CellExecutionError:
        pass
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return notebook.cells


def _text(cell) -> str:
    return "".join(output.get("text", "") or output.get("data", {}).get("text/plain", "") or output.get("ename", "")
                   for output in cell.get("outputs", []))


UNFINISHED = ["from transformer_course.runtime import configure\nconfigure(stop_at_first_failure=False)",
              "class PositionalEncoding:\n    def __init__(self):\n"
              "        # YOUR CODE HERE\n        raise NotImplementedError()",
              "encoding = PositionalEncoding()\nprint('not reached')",
              "import torch\ntorch.zeros(2) @ torch.zeros(3)",
              "print('the end')"]


def test_run_all_carries_on_past_an_unfinished_exercise_and_a_crash_without_any_wrapper_in_the_cell():
    cells = _run_in_a_kernel(UNFINISHED)
    assert "skipped: this cell uses PositionalEncoding, which is not written yet" in _text(cells[2])
    assert "not reached" not in _text(cells[2])
    assert "✘ this cell stopped: RuntimeError" in _text(cells[3]) and "inconsistent tensor size" in _text(cells[3])
    assert _text(cells[4]) == "the end\n"


@pytest.mark.parametrize("how", ["setting", "grading"])
def test_when_asked_to_stop_or_while_grading_a_crash_stops_but_an_unfinished_exercise_still_only_skips(how):
    cells = list(UNFINISHED)
    if how == "setting":
        cells[0] = cells[0].replace("=False", "=True")
    ran = _run_in_a_kernel(cells, {"NBGRADER_EXECUTION": "autograde"} if how == "grading" else {})
    assert "skipped: this cell uses PositionalEncoding" in _text(ran[2])
    assert [output.get("output_type") for output in ran[3].outputs] == ["error"]
    assert "outputs" not in ran[4] or not ran[4].outputs  # "Run all" stopped at the crash


def test_a_bug_hunt_check_shows_the_symptom_but_not_the_cause_until_grading(shown, monkeypatch):
    @check("a mask")
    def mask_values(mask):
        framework.fail("the mask has wrong entries.", expected="key 1 hidden", got="allowed",
                       cause="the two masks are combined with `|`")

    mask_values(None, bug_hunt=True)
    (text, html), = shown
    assert "expected: key 1 hidden" in text and "got:      allowed" in text
    assert "`|`" not in html and "the cause is for you to find" in html and html.count("<details") == 1
    mask_values(None)  # the same check outside a bug hunt names the cause, in its first hint
    assert "combined with `|`" in shown[-1][1] and "combined with `|`" not in shown[-1][0]
    result = framework.run_check(mask_values.__wrapped__, "a mask", (None,), {"bug_hunt": True})
    assert "combined with `|`" in result.message  # what the grader and the feedback see
