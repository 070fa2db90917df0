"""Diagnosis that generalises: crashes explained by their kind with the student's own line, value
failures that say where and how they differ, and the stage 1-2 diagnoses of what a wrong table or a
wrong attention does (each case below is a formula, not a cataloged notebook edit)."""

import math

import pytest
import torch

from transformer_course.checks import attention, differential, positional_encoding
from transformer_course.checks.compare import describe_difference
from transformer_course.checks.framework import run_check

CELL = '''
def forward(x):
    y = x.transpose(0, 1)
    return y.view(-1)

def train_step(x):
    loss = (x * 2).sum()
    loss.backward()

def lookup(x):
    return x[10]

def unknown(x):
    raise KeyError("zzz")

def add(x):
    return x + torch.ones(7)
'''


def _crash(name, sources=None):
    namespace = {"torch": torch}
    exec(compile(CELL, "<cell 4>", "exec"), namespace)  # noqa: S102  (a notebook cell, as the grader runs it)

    def check_it():
        namespace[name](torch.randn(3, 4))

    return run_check(check_it, name, sources=sources).message


@pytest.mark.parametrize(("name", "kind"), [
    ("forward", "memory-layout problem"), ("train_step", "gradient problem"), ("lookup", "index out of range"),
    ("add", "shape mismatch"), ("unknown", "unknown"),
])
def test_a_crash_is_explained_by_its_kind_never_by_default_as_a_shape_problem(name, kind):
    message = _crash(name)
    cause = message.split("likely cause:")[1]
    assert cause.split(":")[0].strip() in (kind, f"a {kind}", f"an {kind}"), message
    assert f"in `{name}`, line" in message and "of <cell 4>" in message  # no source known: the line number


def test_the_students_line_is_quoted_when_the_cell_source_is_given():
    message = _crash("train_step", sources={"<cell 4>": CELL})
    assert "in `train_step`, line 8: loss.backward()" in message


def test_a_difference_is_described_by_place_and_relation():
    expected = torch.arange(24.0).reshape(2, 3, 4)
    heads = expected.clone()
    heads[:, 1] += 1
    assert "only at `head` index 1 (of 3)" in describe_difference(heads, expected, ("batch", "head", "key"))
    most = torch.arange(34.0).reshape(2, 17)
    most[:, [0, 1, 2, *range(4, 17)]] += 1  # all tokens but one differ: the one that agrees is named
    assert "it differs at every `token` index except 3 (of 17)" in describe_difference(most, torch.arange(34.0).reshape(
        2, 17), ("sentence", "token"))
    assert "opposite sign" in describe_difference(-expected, expected)
    assert "shifted by one along `key`" in describe_difference(expected.roll(-1, dims=2), expected,
                                                               ("batch", "head", "key"))


def _table(d_model, length, **changes):
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1) + changes.get("start", 0)
    exponent = changes.get("scale", 2.0) * torch.arange(d_model // 2, dtype=torch.float64) / d_model
    angle = position / torch.pow(changes.get("base", 10000.0), exponent)
    even, odd = changes.get("even", torch.sin), changes.get("odd", torch.cos)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = even(angle), odd(angle)
    if changes.get("cos_in_column_1_only"):
        table[:, 3::2] = 0
    return table.float()


@pytest.mark.parametrize(("changes", "says", "cause"), [
    ({"even": torch.cos, "odd": torch.sin}, "row 0 (position 0) reads 1, 0, 1, 0", "sin and cos are swapped"),
    ({"scale": 1.0}, "the later pairs oscillate faster", "frequency of pair i/2: the exponent is i / d_model"),
    ({"scale": 4.0}, "the later pairs oscillate more slowly", "frequency of pair 2i: the exponent is doubled"),
    ({"cos_in_column_1_only": True}, "only column 1 holds cos; the other odd columns", ""),
    ({"start": 1}, "row p holds the values of position p+1", "positions start at 1"),
    ({"even": torch.cos}, "the even columns hold cos of the angle", "cos is in the even columns too"),
    ({"odd": torch.sin}, "the odd columns hold sin of the angle", "sin is in the odd columns too"),
    ({"base": 1000.0}, "the later pairs oscillate faster", "frequency of pair 0.75 × i: the exponents are 0.75 ×"),
])
def test_each_wrong_table_is_told_by_what_it_does(changes, says, cause):
    """What the table does is what a student reads first (`where`); what that means for the code is the cause,
    which a notebook folds."""
    for d_model, length in ((16, 60), (34, 23)):
        diagnosis = positional_encoding.diagnose_table(_table(d_model, length, **changes), d_model, length)
        assert diagnosis is not None and says in diagnosis.where, (changes, d_model, diagnosis)
        assert cause in diagnosis.cause, (changes, d_model, diagnosis)
        assert "as if" not in diagnosis.where and "belongs" not in diagnosis.where, diagnosis


def test_the_right_table_has_no_diagnosis():
    assert positional_encoding.diagnose_table(_table(16, 60), 16, 60) is None


def _qkv():
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, 5, 4, generator=generator, dtype=torch.float64) * 1.5 for _ in range(3))


@pytest.mark.parametrize(("weights_of", "says"), [
    (lambda s, m: torch.softmax(s, dim=-2), "the weights sum to 1 over the query axis, not over the keys"),
    (lambda s, m: torch.softmax((s * 2.0).masked_fill(m == 0, -1e9), dim=-1), "the scores before the softmax are 2 ×"),
    (lambda s, m: torch.softmax(s, dim=-1), "hidden keys get weight"),
    (lambda s, m: torch.softmax(s.masked_fill(m == 0, -1e9), dim=-1) * 0.5,
     "the rows of weights do not sum to 1"),
])
def test_attention_names_the_first_place_it_departs(weights_of, says):
    Q, K, V = _qkv()
    mask = torch.ones(5, 5, dtype=torch.bool).tril().view(1, 1, 5, 5)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(4)
    diagnosis = attention.diagnose_weights(Q, K, V, mask, weights_of(scores, mask))
    assert diagnosis is not None and says in diagnosis.where, diagnosis


def test_the_students_line_is_quoted_from_an_ipython_cell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("import torch\ndef step(x):\n    loss = (x * 2).sum()\n    loss.backward()\n")
    shell.run_cell("from transformer_course.checks.framework import run_check\n"
                   "result = run_check(lambda: step(torch.ones(2)), 'a step')")
    message = shell.user_ns["result"].message
    assert "in `step`, line 4: loss.backward()" in message and "likely cause: a gradient problem" in message


def test_torchs_own_not_implemented_error_is_a_dtype_problem_not_an_unfinished_exercise():
    def softmax_of_a_bool_tensor():
        mask = torch.ones(2, 3, dtype=torch.bool)
        torch.softmax(mask.masked_fill(mask == 0, -1e9), dim=-1)

    def stub():
        raise NotImplementedError()

    assert "likely cause: a dtype mismatch" in run_check(softmax_of_a_bool_tensor, "bool softmax").message
    assert run_check(stub, "stub").message.startswith("not implemented yet")


def test_steps_after_the_expected_value_are_named_only_when_they_work_on_it():
    """`x + pe` computed and dropped, then dropout applied to x: the expected value is computed, but the result
    is not made from it, so nothing was 'added' to it (the engine speaks instead); `(x + pe) * 2` adds a step."""
    from transformer_course.checks import declared, differential

    x, pe = torch.randn(2, 5), torch.randn(2, 5)

    def reference(x, pe):
        return x + pe

    def dropped(x, pe):
        x + pe  # noqa: B018  (the mistake: the sum is never assigned)
        return torch.tanh(x)

    def doubled(x, pe):
        return (x + pe) * 2

    context = differential.Context(sizes={"batch": 2, "d_model": 5}, quantities={})
    expected = reference(x, pe)
    said = {function.__name__: declared.added_steps(differential.traced_call(function, x, pe, names=("x", "pe")),
                                                    function(x, pe), expected, context)
            for function in (dropped, doubled)}
    assert said["dropped"] == "", said
    assert "computes the expected values and then applies the product" in said["doubled"], said


def test_a_single_number_gets_its_factor_but_no_cause_a_coincidence_would_give():
    """Any number is some factor of any other: on a loss, 2 = tokens/d_model is a coincidence, not a cause."""
    context = differential.Context(quantities={"d_model": 16.0, "tokens": 32.0, "p": 0.1})
    for factor in (2.0, 4.0, 1 / 0.9):
        said = differential.relation(torch.tensor(2.3 * factor), torch.tensor(2.3), context, None)
        assert said == f"{factor:.4g} × the expected values", said
    # on a tensor the factor is evidence: every value carries it
    values = torch.linspace(0.5, 3.0, 12)
    assert "the factor is tokens/d_model" in differential.relation(2 * values, values, context, None)


def test_a_step_that_changes_nothing_on_this_input_is_not_matched_by_that_input():
    """A division by a penalty of 1 leaves the reference's candidates as they were; the student divides the other
    way round. The departure is the student's division, not the unchanged line that ranks its result."""
    namespace = {"torch": torch}
    exec(compile("def rank(candidates, penalty):\n"  # noqa: S102  (a student's cell)
                 "    ranking = penalty.unsqueeze(-1) / candidates\n"
                 "    return ranking.flatten(1).topk(2, dim=-1).indices\n", "<cell 3>", "exec"), namespace)

    def reference(candidates, penalty):
        return (candidates / penalty.unsqueeze(-1)).flatten(1).topk(2, dim=-1).indices

    candidates, penalty = -torch.rand(2, 3, 4) - 0.1, torch.ones(2, 3)
    student = differential.traced(namespace["rank"], candidates, penalty, names=("candidates", "penalty"))
    wanted = differential.traced_call(reference, candidates, penalty, names=("candidates", "penalty"))
    found = differential.diagnose(student, wanted, student_final=namespace["rank"](candidates, penalty),
                                  reference_final=reference(candidates, penalty))
    assert found is not None and "line 2" in found.where and "swapped" in found.how, found
