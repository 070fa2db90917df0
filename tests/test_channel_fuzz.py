"""Property-based fuzzing (Hypothesis) of everything the grader reads from the student's side: whatever the
student's process sends, decoding and checking it raises nothing but the refusals meant for it, and what is
accepted has exactly the shape the grader then uses."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_course.grading.sandbox import channel
from transformer_course.grading.sandbox.executor import _node
from transformer_course.grading.sandbox.outputs import OUTPUT_KINDS, MalformedOutputs, OutputBudget, cell_outputs
from transformer_course.grading.sandbox.session import _is_student_error, keep_notes, status_of

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = st.sampled_from(["output_type", "name", "text", "data", "metadata", "execution_count", "ename", "evalue",
                        "traceback", "op", "id", "kind", "status", "notes", "outputs", "reference", "digest"])
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
           | st.binary(max_size=10) | st.sampled_from([*OUTPUT_KINDS, "stdout", "stderr", "text/plain", "image/png",
                                                       "exit 0", "signal 9"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(KEYS | st.text(max_size=5) | st.integers(), inner, max_size=5), max_leaves=25)
# outputs close to the runner's shape, each field possibly of the wrong type: the cases a fuzzer rarely reaches
NEAR_OUTPUT = st.fixed_dictionaries({"output_type": st.sampled_from(OUTPUT_KINDS) | SCALARS}, optional={
    "name": st.sampled_from(["stdout", "stderr"]) | SCALARS, "text": st.text(max_size=30) | VALUES,
    "data": st.dictionaries(st.sampled_from(["text/plain", "image/png", "text/html"]), st.text(max_size=30))
            | VALUES,
    "execution_count": st.integers() | SCALARS, "ename": st.text(max_size=10) | SCALARS,
    "evalue": st.text(max_size=10) | SCALARS, "traceback": st.lists(st.text(max_size=10), max_size=5) | VALUES})


@SETTINGS
@given(st.lists(NEAR_OUTPUT | VALUES, max_size=6) | VALUES)
def test_cell_outputs_accept_the_runners_shape_and_refuse_everything_else(value):
    try:
        outputs = cell_outputs(value)
    except MalformedOutputs:
        return
    for output in outputs:
        assert output["output_type"] in OUTPUT_KINDS
        texts = ([output["text"]] if output["output_type"] == "stream" else
                 [output["ename"], output["evalue"], *output["traceback"]] if output["output_type"] == "error" else
                 [*output["data"], *output["data"].values()])
        assert all(isinstance(text, str) for text in texts)
        node = _node(output)  # what the executor makes of it: never an error of the grader's
        assert node["output_type"] == output["output_type"]


@SETTINGS
@given(st.lists(NEAR_OUTPUT, max_size=8), st.integers(min_value=0, max_value=400))
def test_the_output_budget_keeps_what_fits_and_names_the_cell_that_spent_it(value, limit):
    try:
        outputs = cell_outputs(value)
    except MalformedOutputs:
        return
    budget = OutputBudget(limit=limit)
    kept = budget.keep(outputs, "cell 4 (x)")
    assert budget.used <= limit
    assert (budget.reason() is None) == (len(kept) == len(outputs) and kept == outputs)
    if budget.reason():
        assert "cell 4 (x)" in budget.reason()


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes_decode_to_a_value_or_the_channels_refusal(payload):
    try:
        channel.decode(payload)
    except channel.ChannelError:
        pass


@SETTINGS
@given(VALUES, st.data())
def test_a_message_with_any_byte_changed_or_cut_decodes_to_a_value_or_the_refusal(value, data):
    """Real messages (encoded by the channel itself) then damaged: a byte replaced, the end cut off."""
    try:
        payload = channel.encode({"op": "cell-done", "id": 1, "outputs": [value]})[channel.HEADER:]
    except channel.ChannelError:
        return
    position = data.draw(st.integers(min_value=0, max_value=max(0, len(payload) - 1)))
    damaged = [payload[:position] + bytes([data.draw(st.integers(0, 255))]) + payload[position + 1:],
               payload[:position]]
    for candidate in damaged:
        try:
            channel.decode(candidate)
        except channel.ChannelError:
            pass


@SETTINGS
@given(st.binary(min_size=channel.HEADER, max_size=channel.HEADER))
def test_any_header_reads_as_a_size_or_the_refusal(header):
    try:
        size = channel.read_header(header)
    except channel.ChannelError:
        return
    assert 0 <= size <= channel.LIMITS.message_bytes


@SETTINGS
@given(VALUES)
def test_the_other_fields_the_grader_reads_never_raise(value):
    """Notes, a process's exit status, an error record: each checked field by field before it is used."""
    kept: list[dict[str, str]] = []
    keep_notes(kept, value)
    keep_notes(kept, [value, {"kind": "reference", "reference": "x"}])
    assert all(isinstance(note, dict) and all(isinstance(v, str) for v in note.values()) for note in kept)
    assert isinstance(status_of({"status": value}), str)
    assert _is_student_error(value) in (True, False)


@pytest.mark.parametrize("text", ["", "exit 0", "signal 9", *string.ascii_letters[:3]])
def test_a_status_is_repeated_only_in_its_own_shape(text):
    assert status_of({"status": text}) in ("exit 0", "signal 9", "?")
