"""The watch that is left (`grading.sandbox.watch`): a grade cell's argument that is a part of the reference
still in the grading build (its class, a subclass, a class made of its methods) is noted; honest code is not.
The probes, the copy fingerprints and the process note went with the grading build, which leaves the reference
of the graded exercises out of the sandbox (tests/test_grading_build.py, tests/test_boundary.py)."""

from __future__ import annotations

import torch

from transformer_course.grading.sandbox import watch
from transformer_course.reference import attention


def _kinds(value) -> list[str]:
    watcher = watch.Watcher(["MultiHeadAttention"])
    watcher.handed_in("MultiHeadAttention", value)
    return [note["kind"] for note in watcher.take()]


def test_the_reference_a_subclass_or_its_methods_handed_in_are_noted():
    class Subclass(attention.MultiHeadAttention):
        pass

    class MadeOf(torch.nn.Module):
        split_heads = attention.MultiHeadAttention.split_heads

    assert _kinds(attention.MultiHeadAttention) == ["reference"]
    assert _kinds(Subclass) == ["subclass"]
    assert _kinds(MadeOf) == ["reference"]


def test_honest_code_and_other_exercises_leave_no_note():
    class MultiHeadAttention(torch.nn.Module):
        def split_heads(self, x):
            return x

    assert _kinds(MultiHeadAttention) == []
    assert _kinds(attention.make_padding_mask) == []  # not an exercise this watcher was given
    assert _kinds(torch.nn.MultiheadAttention) == []
