"""Outside grading a failing check shows a red block and lets the notebook go on; while grading, or
when the student asks for it, it raises. The summary lists every check of the notebook with its points.
(Whole notebooks, run top to bottom, are in test_teeth.py.)"""

import pytest

from transformer_course import runtime
from transformer_course.checks import framework
from transformer_course.checks.framework import CheckFailed, check
from transformer_course.runtime import configure, skip_until_implemented


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
        framework.fail("the thing is wrong.", expected="(2, 3)", got="(3, 2)", cause="axes <swapped> & more")

    return wrong


def test_outside_grading_a_failure_is_a_red_block_and_the_cell_goes_on(shown):
    assert failing_check()() is True  # so `assert check.x(...)` holds and Run all carries on
    (text, html), = shown
    assert text.startswith("✘ a property that does not hold") and "expected: (2, 3)" in text
    assert "likely cause: axes <swapped> & more" in text and "carries on" in text
    assert "#c62828" in html and "✘" in html and "<b>expected:</b>" in html
    assert "axes &lt;swapped&gt; &amp; more" in html  # the message is escaped, not interpreted
    assert not framework.results()["wrong"].passed  # and the summary knows it failed


def test_without_a_notebook_the_failure_is_printed_as_text(capsys):
    assert failing_check()() is True
    assert "✘ a property that does not hold" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["settings cell", "environment", "grading"])
def test_a_failure_raises_when_asked_or_while_grading(how, monkeypatch, shown):
    if how == "settings cell":
        configure(stop_at_first_failure=True)
    elif how == "environment":
        monkeypatch.setenv(runtime.STRICT_VARIABLE, "1")
    else:
        monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(CheckFailed, match=r"(?s)✘ a property.*expected: \(2, 3\).*likely cause"):
        failing_check()()
    assert not shown


def test_checks_imported_while_grading_stay_strict_when_the_variable_is_removed(monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    wrong = failing_check()  # decorated (imported) while grading
    monkeypatch.delenv("NBGRADER_EXECUTION")  # what a submission could do in a cell
    with pytest.raises(CheckFailed):
        wrong()


def test_skip_until_implemented_skips_stubs_and_shows_other_errors_without_stopping(shown, capsys):
    with skip_until_implemented("the figure"):
        raise NotImplementedError
    assert "skipped" in capsys.readouterr().out
    with skip_until_implemented("your encoder"):
        raise RuntimeError("shape mismatch (3) vs (4)")
    (text, html), = shown
    assert "your encoder raised RuntimeError" in text and "shape mismatch" in text and "<details>" in html
    configure(stop_at_first_failure=True)
    with pytest.raises(RuntimeError), skip_until_implemented("your encoder"):
        raise RuntimeError("now it stops")


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
    assert [line[0] for line in marks] == ["✘", "·", "·", "·"] and "not run yet" in marks[1]
    assert "(2 points)" in marks[1]
    assert any("0 of 6 points from the visible checks" in line for line in lines)
    assert any("Hidden tests: 2 more cells worth 2 points" in line for line in lines)
