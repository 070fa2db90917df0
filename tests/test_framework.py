"""The check machinery itself: messages, diagnosis, the built-in guard, demo-cell skipping."""

import pytest
import torch
import torch.nn.functional as F

from transformer_course.checks import framework
from transformer_course.checks.framework import CheckFailed, check, expect_close, student_code


def test_expect_close_names_the_suspect_that_reproduces_the_output():
    expected = torch.arange(6.0).reshape(2, 3)
    with pytest.raises(CheckFailed, match="transposed"):
        expect_close("x", expected.flip(1), expected, cause="generic",
                      suspects={"nope": lambda: expected * 7, "transposed": lambda: expected.flip(1)})


def test_expect_close_falls_back_to_the_generic_cause_and_reports_the_difference():
    with pytest.raises(CheckFailed, match=r"(?s)largest difference 1.*likely cause: not one of the mistakes the "
                                          r"checks recognise; what is expected: generic"):
        expect_close("x", torch.ones(3), torch.zeros(3), cause="generic")


def test_check_records_and_prints_pass(capsys):
    @check("a property")
    def always():
        pass

    assert always() is True
    assert "✔ a property" in capsys.readouterr().out
    assert framework.results()["always"].passed


def test_check_turns_not_implemented_and_crashes_into_plain_messages(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_COURSE_STRICT", "1")  # raise, as while grading (test_lenient_checks: Colab)

    @check("stub")
    def stub():
        raise NotImplementedError()

    @check("crash")
    def crash():
        torch.zeros(2) + torch.zeros(3)

    with pytest.raises(CheckFailed, match="not implemented yet"):
        stub()
    with pytest.raises(CheckFailed, match="your code raised RuntimeError"):
        crash()
    assert not framework.results()["stub"].passed


def test_builtin_attention_is_rejected_inside_student_code():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(CheckFailed, match="built-in attention"), student_code():
        F.scaled_dot_product_attention(q, q, q)
