"""A failing check's message as a ladder (`framework.ladder`): what was observed in the open, then the likely cause,
the idea and the code folded one under the other; and the measure that keeps solution code out of the open part
(`quality.dictation.in_message`). The catalog's messages are measured in tests/test_mistakes.py."""

import pytest
import torch

from transformer_course.checks import attention, framework
from transformer_course.checks.framework import CheckFailed, ladder, run_check, split_cause, without_cause

STAGE = "02_attention"


def message_of(problem="the thing is wrong.", **parts):
    with pytest.raises(CheckFailed) as raised:
        framework.fail(problem, expected=parts.pop("expected", "(2, 3)"), got=parts.pop("got", "(3, 2)"), **parts)
    return str(raised.value)


def test_the_observation_is_visible_and_the_hints_are_folded_in_order():
    steps = ladder(message_of(cause="the axes are swapped", idea="the heads axis goes first",
                              code="x.transpose(1, 2)"))
    assert steps.visible == "the thing is wrong.\n  expected: (2, 3)\n  got:      (3, 2)"
    assert steps.rungs == (("the likely cause", "the axes are swapped."), ("the idea", "the heads axis goes first"),
                           ("in code", "x.transpose(1, 2)"))


def test_a_cause_written_in_one_piece_is_split_into_its_words_and_its_code():
    words, code = split_cause("the mask (batch, k_len) has no query axis, so it cannot line up with the scores "
                              "(batch, q_len, k_len): use mask.unsqueeze(1) -> (batch, 1, k_len) in masked_fill.")
    assert words == "the mask (batch, k_len) has no query axis, so it cannot line up with the scores (batch, q_len, " \
                    "k_len)."
    assert code == "use mask.unsqueeze(1) -> (batch, 1, k_len) in masked_fill."
    words, code = split_cause("the mask is inverted: it must be True where the token is real (token_ids != pad_idx).")
    assert words == "the mask is inverted: it must be True where the token is real."  # the code aside left out
    assert code == "it must be True where the token is real (token_ids != pad_idx)."
    # the student's own line, as the engine quotes it, is not code of the solution: it stays with the cause
    words, code = split_cause("in `forward`, line 3 (`w = torch.softmax(s, dim=1)`): the softmax has `dim` 1 where "
                              "-1 is expected; so use dim=-1.")
    assert words.startswith("in `forward`, line 3 (`w = torch.softmax(s, dim=1)`): the softmax has") and not code \
        .startswith("in `forward`")
    assert code == "so use dim=-1."
    assert split_cause("the scores are not divided by √d_k, and exp(x) grows") == (
        "", "the scores are not divided by √d_k, and exp(x) grows.")


def test_every_word_of_a_message_is_somewhere_on_the_ladder():
    message = ("x has the wrong values: it differs everywhere.\n  expected: the reference values\n"
               "  got:      largest difference 1\n  likely cause: in `f`, line 2 (`y = x.t()`): the transpose is "
               "missing; view as (batch, seq_len, num_heads, d_k), then transpose(1, 2). The rows mix.")
    steps = ladder(message)
    said = " ".join([steps.visible, *(text for _, text in steps.rungs)])
    for word in message.replace("likely cause:", "").split():
        assert word.strip(".;:") in said, word


def test_a_crash_shows_the_students_line_and_folds_what_would_fit():
    def attend(Q, K):
        return Q @ K.transpose(1, 2)

    def crashing():
        attend(torch.zeros(2, 3, 4, 5), torch.zeros(2, 3, 6, 5))

    message = run_check(crashing, "a crash").message
    assert framework.WOULD_FIT in message  # the grader's feedback keeps it
    steps = ladder(message)
    assert "return Q @ K.transpose(1, 2)" in steps.visible and "what happened there:" in steps.visible
    assert framework.WOULD_FIT not in steps.visible and "K.transpose(-2, -1)" not in steps.visible
    assert steps.rungs[0][0] == "the likely cause" and "shape mismatch" in steps.rungs[0][1]
    assert "the shapes that meet on that line (above)" in steps.rungs[0][1]  # shown already: not told again
    assert steps.rungs[-1][0] == "in code" and "`K.transpose(-2, -1)`" in steps.rungs[-1][1]


def test_a_bug_hunt_keeps_its_cause_for_the_student_to_find():
    message = message_of(cause="the masks are combined with `|`: use padding & look_ahead", code="a & b")
    steps = ladder(message, bug_hunt=True)
    assert steps.rungs == (("the likely cause", framework.BUG_HUNT_CAUSE),)
    assert "`|`" not in without_cause(message) and "a & b" not in without_cause(message)
    assert without_cause(message).startswith(steps.visible)


def test_a_bug_hunt_that_leaves_a_step_to_the_student_says_that_step_can_be_the_cause():
    message = message_of(cause="x is scaled after the positional encoding", code="a & b")
    steps = ladder(message, bug_hunt=framework.STEP_OF_YOURS)
    assert steps.rungs == (("the likely cause", f"{framework.BUG_HUNT_CAUSE} {framework.OWN_STEP_NOTE}"),)
    assert "scaled" not in steps.visible and steps.visible == ladder(message, bug_hunt=True).visible


def test_the_summary_note_is_the_first_observed_line():
    assert framework.summary_note(message_of(cause="c")) == "the thing is wrong."


# --- the measure ---------------------------------------------------------------------------------------------

def test_the_measure_finds_a_planted_dictating_message_and_ignores_it_in_a_folded_hint():
    from quality.dictation import in_first_hint, in_message

    fix = "K.transpose(-2, -1)"  # stage 2's solution: scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
    assert in_message(STAGE, message_of(f"the scores have the wrong shape: use {fix}.", cause="c"))
    assert in_message(STAGE, message_of(expected=f"the keys as {fix}", cause="c"))
    assert not in_message(STAGE, message_of(cause="the keys are transposed on the wrong axes", code=fix))
    assert not in_message(STAGE, message_of(cause=f"the keys are transposed on the wrong axes: use {fix}"))
    assert in_first_hint(STAGE, message_of(cause="", idea=f"the keys as {fix}"))  # the first hint a student opens
    # the student's own line, quoted by a crash message, is what they wrote: not dictated
    crash = f"your code raised RuntimeError: boom\n  in `attend`, line 3: scores = Q @ {fix}\n  likely cause: c"
    assert not in_message(STAGE, crash)
    # short or given code is no solution: `mask == 0` and `x.size(1)` are under the minimum
    assert not in_message(STAGE, message_of(expected="mask == 0 where x.size(1) > 2", cause="c"))


def test_the_measure_reads_solution_lines_and_their_parts():
    from quality.dictation import _stage_snippets

    snippets, _ = _stage_snippets(STAGE)
    assert {"K.transpose(-2,-1)", "transpose(-2,-1)", "scores.masked_fill(mask==0,-1e9)"} <= snippets
    assert all(len(snippet) >= 10 for snippet in snippets)


@pytest.mark.slow
def test_no_mutant_s_message_shows_solution_code_before_a_hint_is_opened():
    """A sample of mechanical mutants nobody wrote a message for (quality.mutations, seed 11, the first three drawn
    of every stage), graded up to their exercise's cells: no failing cell's open part holds solution code."""
    import nbformat

    from conftest import ASSIGNMENTS, solution_path
    from quality.dictation import in_message
    from quality.measure import reduced, run_mutants
    from quality.mistakes import is_solution
    from quality.mutations import generate, sample

    shown, failing = [], 0
    for stage in ASSIGNMENTS:
        path = solution_path(stage)
        notebook = reduced(nbformat.read(path, as_version=4))
        mutants = sample(generate(stage, [cell.source for cell in notebook.cells if is_solution(cell)]), 1, 11)[:3]
        for verdict in run_mutants(mutants, {stage: (notebook, path.parent)}, jobs=1, timeout=240, focused=True):
            for outcome in verdict.failing:
                failing += 1
                found = in_message(stage, outcome.message)
                if found:
                    shown.append((stage, verdict.mutant.mutated, outcome.grade_id, found))
    assert failing >= 10, failing  # the sample does exercise the messages
    assert not shown, shown


def test_the_padding_mask_message_says_where_seq_len_lies():
    def rows(token_ids, pad_idx):
        return (token_ids != pad_idx).unsqueeze(1).unsqueeze(-1)  # (batch, 1, seq_len, 1)

    message = run_check(attention.padding_mask_shape.__wrapped__, "padding mask", (rows,)).message
    assert "hides padded queries" in message and "broadcasts over the keys" in message
    steps = ladder(message)
    idea = dict(steps.rungs)["the idea"]
    assert "along the key axis" in idea and "over the heads and the queries" in idea
    assert "unsqueeze" not in steps.visible + dict(steps.rungs)["the likely cause"]


# --- what the engine may say -------------------------------------------------------------------------------------

def _reference_steps(x):
    doubled = x * 2
    shifted = doubled + 1
    return shifted


def _own_names(x):
    twice = x * 3
    out = twice + 1
    return out


def test_the_engine_never_names_a_variable_of_the_reference_the_student_does_not_have():
    from transformer_course.checks import differential

    x = torch.randn(3, 4, dtype=torch.float64)
    student = differential.traced_call(_own_names, x, names=("x",))
    reference = differential.traced_call(_reference_steps, x, names=("x",))
    said = differential.explain(student, reference, student.output, reference.output).cause
    assert "1.5 × the expected values" in said and "twice = x * 3" in said
    assert "doubled" not in said and "shifted" not in said


def test_the_engine_compares_two_different_steps_by_their_shapes_and_credits_the_reference():
    from transformer_course.reference import MultiHeadAttention

    class ReshapedTwice(MultiHeadAttention):
        def combine_heads(self, x):
            batch_size, _, seq_length, _ = x.size()
            x = x.reshape(batch_size, seq_length, self.num_heads, self.d_k)
            return x.reshape(batch_size, seq_length, self.d_model)

    from transformer_course.checks import differential

    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)  # (batch, heads, seq_len, d_k)
    student = differential.traced_call(ReshapedTwice(12, 3), x, method="combine_heads", names=("x",))
    reference = differential.traced_call(MultiHeadAttention(12, 3), x, method="combine_heads", names=("x",))
    said = differential.explain(student, reference, student.output, reference.output).cause
    assert "your reshape gives shape (2, 5, 12) where the reference's transpose gives (2, 5, 3, 4)" in said, said
    assert "where (2, 5, 3, 4) is expected" not in said and "the paper" not in said


def test_a_recognised_mistake_is_said_at_the_students_line_without_the_engine_retelling_it():
    """The check reads the mixed positions itself: its words go at the line the engine found, and the engine's
    account of the same mistake in the reference's operations (a reshape where a transpose belongs) is left out."""
    from transformer_course.reference import MultiHeadAttention

    class ReshapedTwice(MultiHeadAttention):
        def combine_heads(self, x):
            batch_size, _, seq_length, _ = x.size()
            x = x.reshape(batch_size, seq_length, self.num_heads, self.d_k)
            return x.reshape(batch_size, seq_length, self.d_model)

    message = run_check(attention.combine_heads_values.__wrapped__, "combine", (ReshapedTwice,)).message
    cause = message.split("likely cause:", 1)[1]
    assert "in `combine_heads`, line" in cause and "without moving the heads' axis back" in cause, message
    assert "where the reference applies" not in cause and cause.count("line ") == 1, message
