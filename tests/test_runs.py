"""Loops compared call by call (`checks.runs`): what a plugged part records, and a call with the wrong
arguments failing in Python's own words (which name the function), not in the recorder's."""

import pytest
import torch

from transformer_course.checks import runs

NOTEBOOK = '''
def step(ys, pad_idx):
    return ys + pad_idx

def loop(ys):
    for _ in range(2):
        ys = step(ys, 1)
    return ys

def careless_loop(ys):
    return step(ys)
'''


def _notebook() -> dict:
    namespace: dict = {}
    exec(compile(NOTEBOOK, "<cell 3>", "exec"), namespace)  # noqa: S102  (a notebook cell, as the grader runs it)
    return namespace


def test_every_call_of_a_plugged_part_is_recorded_by_parameter_name_and_the_name_is_put_back():
    namespace = _notebook()
    own = namespace["step"]
    run = runs.Run()
    with runs.plugged(namespace["loop"], {"step": None}, run):
        run.result = namespace["loop"](torch.zeros(2))
    assert [call.role for call in run.calls] == ["step", "step"] and run.plugged == ("step",)
    assert run.calls[1].args["pad_idx"] == 1 and torch.equal(run.calls[1].args["ys"], torch.ones(2))
    assert torch.equal(run.result, torch.full((2,), 2.0)) and namespace["step"] is own


def test_a_call_with_the_wrong_arguments_raises_pythons_own_error_naming_the_function():
    namespace = _notebook()
    with pytest.raises(TypeError, match=r"step\(\) missing 1 required positional argument: 'pad_idx'"), \
            runs.plugged(namespace["careless_loop"], {"step": None}, runs.Run()):
        namespace["careless_loop"](torch.zeros(2))
