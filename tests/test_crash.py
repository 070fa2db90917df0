"""What a crash's line was doing, worked out from the live values (checks.crash): each case is a small
student-like function that really crashes; the message must name the variable and the relation the values
show, and claim no relation the values do not show."""

import pytest
import torch
from torch import nn

from transformer_course.checks import crash
from transformer_course.checks.boundary import Frame, StudentError, as_exception
from transformer_course.checks.errors import as_record, explain_crash
from transformer_course.checks.framework import CheckFailed, run_check
from transformer_course.grading.sandbox import session as sandbox_session


def _message(function, *args) -> str:
    result = run_check(function, "a check", args)
    assert not result.passed
    return result.message


def _detail(message: str) -> str:
    lines = [line for line in message.splitlines() if "what happened there:" in line]
    return lines[0] if lines else ""


# --- student-like code that crashes -----------------------------------------------------------------------


def clear_gradients(model, optimizer, progress=False):
    progress.zero_grad()


def clear_twice(optimizer):
    optimizer.zero_grad().zero_grad()


def compute_loss(model, batch, criterion):
    return criterion(model(batch), batch)


def train_step(model, batch, optimizer):
    loss = compute_loss(model, batch, optimizer)
    return loss


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(11, 16)
        self.pred_layer = nn.Linear(16, 11)

    def call_a_tensor(self, x, enc_out):
        layer = nn.Identity()
        x = enc_out(x, enc_out)
        return layer(x)

    def predict_twice(self, x):
        return self.pred_layer(self.pred_layer(x))

    def embed(self, x):
        return self.embedding(x)


def misspelled(values):
    return valeus + 1  # noqa: F821 (the crash under test)


def undefined(values):
    return completely_unknown_name + 1  # noqa: F821 (the crash under test)


def no_such_method(x):
    return x.shape_of_it()


def zeros_with_a_tensor(max_seq_length, div_term):
    return torch.zeros(max_seq_length, div_term)


def scores(Q, K):
    return Q @ K.transpose(-2, -1).transpose(-2, -1)


# --- the relations ------------------------------------------------------------------------------------------


def test_a_missing_attribute_names_the_variable_that_has_it():
    model = nn.Linear(3, 3)
    detail = _detail(_message(clear_gradients, model, torch.optim.Adam(model.parameters())))
    assert "`progress` is the bool False, which has no `zero_grad`" in detail
    assert "`optimizer`" in detail and "another variable" in detail


def test_a_method_called_on_its_own_result_is_said_twice():
    model = nn.Linear(3, 3)
    detail = _detail(_message(clear_twice, torch.optim.SGD(model.parameters(), lr=0.1)))
    assert "`.zero_grad(…)` is called on the result of `.zero_grad(…)` (twice in a row)" in detail
    assert "`optimizer.zero_grad()` returns None" in detail
    assert "another variable" not in detail  # a call's result is no variable that could be swapped


def test_a_layer_applied_to_its_own_result_is_said_twice():
    detail = _detail(_message(Decoder().predict_twice, torch.zeros(2, 3, 16)))
    assert "`self.pred_layer` is applied to its own result here (twice in a row)" in detail
    assert "a Linear layer from 16 to 11 features" in detail


def test_a_wrong_argument_is_followed_to_the_callers_line():
    model = nn.Linear(3, 3)
    message = _message(train_step, model, torch.zeros(2, 3), torch.optim.Adam(model.parameters()))
    detail = _detail(message)
    assert "in `compute_loss`, line" in message
    assert "`criterion` is an Adam optimiser, which cannot be called" in detail
    assert "`criterion` receives `optimizer` (an Adam optimiser), the third argument given in `train_step`, line" \
        in detail
    assert "such as" not in detail  # the caller's argument explains it: no guesses among the locals


def test_a_tensor_called_like_a_layer_says_what_it_holds_and_which_layer_is_there():
    detail = _detail(_message(Decoder().call_a_tensor, torch.zeros(2, 3, 16), torch.zeros(2, 5, 16)))
    assert "`enc_out` is a tensor of shape (2, 5, 16), which cannot be called" in detail
    assert "another variable meant, such as `layer` (an Identity module)" in detail


def test_an_embedding_given_floats_names_the_variable_and_its_shape():
    detail = _detail(_message(Decoder().embed, torch.zeros(2, 3, 16)))
    assert "`self.embedding` (an Embedding layer for 11 token ids, 16 features each) receives `x` " \
           "(a float32 tensor of shape (2, 3, 16))" in detail
    assert "Integer indices (token ids) are needed" in detail


def test_the_operands_of_a_call_and_of_an_operator_are_described():
    detail = _detail(_message(zeros_with_a_tensor, 50, torch.zeros(8)))
    assert "`torch.zeros` receives `max_seq_length` (the int 50) and `div_term` (a tensor of shape (8,))" \
        in detail
    detail = _detail(_message(scores, torch.zeros(6, 5, 4), torch.zeros(6, 6, 4)))
    assert "`.transpose(…)` is called on the result of `.transpose(…)`" in detail
    assert "`Q` (a tensor of shape (6, 5, 4))" in detail
    assert "`K.transpose(-2, -1).transpose(-2, -1)` (a tensor of shape (6, 6, 4))" in detail


# --- honest crashes: no relation the values do not show -------------------------------------------------


def test_a_typo_names_the_close_spelling_only_when_there_is_one():
    assert "`values`, spelled almost the same" in _detail(_message(misspelled, [1]))
    message = _message(undefined, [1])
    assert "what happened there" not in message and "meant" not in message


def test_a_missing_method_that_no_other_variable_has_claims_no_other_variable():
    detail = _detail(_message(no_such_method, torch.zeros(2)))
    assert "`x` is a tensor of shape (2,), which has no `shape_of_it`" in detail
    assert "another" not in detail and "twice" not in detail


def test_a_correct_looking_call_claims_nothing_twice_or_swapped():
    detail = _detail(_message(Decoder().embed, torch.zeros(2, 3, dtype=torch.long) + 20))  # ids past the table
    assert "receives `x` (an int64 tensor of shape (2, 3))" in detail
    assert "twice" not in detail and "another" not in detail and "Integer indices" not in detail


# --- bounded, and never in the way ----------------------------------------------------------------------------


def linear_on_doubles(layer, x):
    return layer(x)


def test_a_float_dtype_is_said_only_where_the_error_is_about_dtypes():
    """The checks run in float64 whatever the lesson asks for: "a float64 tensor" in a shape error would read as
    a claim about the student's own tensors; in a dtype error the dtypes are what matters."""
    detail = _detail(_message(linear_on_doubles, nn.Linear(4, 3), torch.zeros(2, 4, dtype=torch.float64)))
    assert "`x` (a float64 tensor of shape (2, 4))" in detail
    doubles = torch.zeros(6, 5, 4, dtype=torch.float64), torch.zeros(6, 6, 4, dtype=torch.float64)
    detail = _detail(_message(scores, *doubles))
    assert "float" not in detail and "`Q` (a tensor of shape (6, 5, 4))" in detail


def test_large_values_are_described_by_their_shape_only():
    assert crash.kind_of_value(torch.zeros(3000, 3000)) == "a float32 tensor of shape (3000, 3000)"
    assert crash.kind_of_value(list(range(10**5))) == "a list of 100000 values"
    assert len(crash.kind_of_value("x" * 10**5)) < 60


def test_the_explainer_never_raises_and_says_nothing_without_frames():
    assert crash.describe(ValueError("no traceback"), lambda filename: True) == ""

    class Hostile:
        def __getattr__(self, name):
            raise RuntimeError("a property of the student's that fails")

    def use(thing):
        return thing.forward()

    message = _message(use, Hostile())
    assert "your code raised RuntimeError" in message and "likely cause" in message


def test_the_detail_crosses_as_part_of_the_record_and_stays_bounded():
    try:
        Decoder().predict_twice(torch.zeros(2, 3, 16))
    except RuntimeError as error:
        record = as_record(error)
    assert "applied to its own result" in record.detail
    remote = as_exception(record, CheckFailed)
    assert "what happened there: `self.pred_layer` is applied to its own result" in explain_crash(remote)
    long = StudentError("ValueError", ("ValueError",), "boom", (Frame("f", 1, "g", "x = 1"),), False, "y" * 10**5)
    assert len(explain_crash(as_exception(long, CheckFailed))) < crash.MAX_DETAIL + 1000


@pytest.mark.parametrize("detail", [3, None, b"bytes", ("a",)])
def test_the_grader_refuses_a_record_whose_detail_is_not_text(detail):
    record = StudentError("ValueError", ("ValueError",), "boom", (Frame("f", 1, "g", "x = 1"),), False, detail)
    assert not sandbox_session._is_student_error(record)
    assert sandbox_session._is_student_error(
        StudentError("ValueError", ("ValueError",), "boom", (Frame("f", 1, "g", "x = 1"),), False, "text"))


class Counting:
    """An object of the student's whose attributes are computed by their own code."""

    reads = 0

    def __getattr__(self, name):
        Counting.reads += 1
        return torch.zeros(2)


def call_an_attribute(thing):
    return thing.layer(1)


def test_the_explainer_runs_none_of_the_students_code_again():
    message = _message(call_an_attribute, Counting())
    assert "'Tensor' object is not callable" in message
    assert Counting.reads == 1  # the student's own line read it once; the explainer did not read it again


def gather_on_a_wrong_axis(finished, parents):
    return finished.gather(2, parents)


def test_a_tensor_method_names_its_parameters_and_the_tensor_it_is_called_on():
    detail = _detail(_message(gather_on_a_wrong_axis, torch.zeros(5, 1, dtype=torch.bool),
                              torch.zeros(5, 1, dtype=torch.long)))
    assert "`finished.gather` receives the constant `2` as `dim` and `parents` (an int64 tensor of shape (5, 1)) " \
           "as `index`, called on `finished`, a bool tensor of shape (5, 1)." in detail
