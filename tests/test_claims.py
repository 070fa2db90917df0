"""The checks say what they saw or nothing (issue 41): every cause a failing grade cell claims is read against the
edit a mechanical mutant planted (quality/claims.py), as the held-out catalog is judged, by what the edit did.

`scripts/measure_claims.py` measures a seeded sample of every stage (figures in website/authors/checks.md); this
runs a fixed, seeded sample across all eight stages plus the mutants that once drew a false claim, and fails on
any false claim."""

import dataclasses
import functools

import pytest

from conftest import read, solution_path
from quality.claims import causes, judge, judge_outcomes
from quality.inprocess import GradeOutcome
from quality.measure import reduced, run_mutants
from quality.mistakes import is_solution
from quality.mutations import STAGE_MODULES, generate, sample

# Mutants whose causes were false before the engine was fixed (each fix is general; these keep it in place).
ONCE_FALSE = [
    # an operation of the same kind that makes another value of the paper's read as the departure's:
    # "your code uses self.W_q where the reference uses self.W_v" for a W_v never called
    ("02_attention", "02:MultiHeadAttention.forward:drop_call:V = self.split_heads(self.W_v(v))  # (batch, heads, "
                     "k_len, d_k) -> V = self.split_heads(v) "),
    # a projection applied to its own result read as a later transpose of another line: "in line 49 (`heads, weights
    # = scaled_dot_product_attention(...)`): what `split_heads` returns is shape (2, 3, 5, 7) where (2, 3, 7, 5)..."
    ("02_attention", "02:MultiHeadAttention.forward:duplicate_call:K = self.split_heads(self.W_k(k))  # (batch, "
                     "heads, k_len, d_k) -> K = self.split_heads(self.W_k(self.W_k(k))) "),
    # the next sum (found by its place alone) read as the departure's: "the sum [line 34] receives the output of
    # self.norm2 where the reference gives it the output of self.norm1", and "your sum comes later"
    ("03_blocks", "03:DecoderBlock.forward:replace_operator:x = self.norm2(x + self.dropout(self.cross_attn(x, "
                  "enc_out, enc_out, enc_mask))) -> x = self.norm2((x - self.dropout("),
    # a step that changes nothing on the check's input (a division by a length penalty of 1) matched by its own
    # input: "the `topk` receives the `flatten` inside `best` after an extra division", blaming the unchanged topk
    ("07_fast_and_better_decoding", "07:select_beams:swap_operands:ranking = candidates / length_penalty("),
]
KINDS_READ = ("swap_variable", "drop_call", "replace_operator", "duplicate_call", "delete_statement")


@functools.cache
def _stage(assignment):
    notebook = reduced(read(solution_path(assignment)))
    return notebook, generate(assignment, [cell.source for cell in notebook.cells if is_solution(cell)])


def _mutant(assignment, prefix):
    (found,) = [mutant for mutant in _stage(assignment)[1] if mutant.identifier.startswith(prefix)]
    return found


def test_causes_are_read_from_the_likely_cause_lines():
    message = ("✘ a check: wrong values.\n  expected: the reference values\n  got: 1.0 instead of 2.0\n"
               "  likely cause: self.W_v is never called\n  the idea: project the values")
    assert causes(message) == ["self.W_v is never called"]


def test_a_cause_about_a_line_the_edit_did_not_change_is_false():
    mutant = _mutant(*ONCE_FALSE[0])
    untouched = "in `forward`, line 46 (`Q = self.split_heads(self.W_q(q)) # (batch, heads, q_len, d_k)`)"
    changed = f"in `forward`, line 48 (`{mutant.mutated}`)"
    assert judge(mutant, "g", f"{untouched}: your code uses self.W_q where the reference uses self.W_v").verdict \
        == "false"
    assert judge(mutant, "g", "self.W_v is never called: the reference applies it to the input `v`").verdict \
        == "vague"
    assert judge(mutant, "g", f"{changed}: the linear layer is missing").verdict == "correct"
    # right place, but a claim the edit does not make true: a dropped call is not a step done twice
    assert judge(mutant, "g", f"{changed}: the linear layer is applied twice").verdict == "false"
    # a clause on another line, after a right one, is read on its own
    assert judge(mutant, "g", f"{changed}: the linear layer is missing; {untouched}: the two are swapped").verdict \
        == "false"


def test_an_unused_value_claimed_of_a_returned_one_is_false():
    """Issue 41's RMSNorm report: a missing last step read as "nothing uses the result" of the line before it."""
    mutant = dataclasses.replace(_mutant(*ONCE_FALSE[0]), kind="delete_statement",
                                 mutated="pass")
    claim = ("in `forward`, line 46 (`Q = self.split_heads(self.W_q(q)) # (batch, heads, q_len, d_k)`): your code "
             "computes the linear layer here, but nothing uses the result")
    assert judge(mutant, "g", claim).verdict == "false"
    outcomes = {"g": GradeOutcome("g", False, f"✘ wrong\n  likely cause: {claim}"), "h": GradeOutcome("h", True, "")}
    assert [c.verdict for c in judge_outcomes(mutant, outcomes)] == ["false"]


def _sample():
    notebooks, drawn = {}, []
    for assignment in STAGE_MODULES:
        notebook, mutants = _stage(assignment)
        notebooks[assignment] = (notebook, solution_path(assignment).parent)
        read_here = [mutant for mutant in mutants if mutant.kind in KINDS_READ]
        drawn += sample(read_here, 1, seed=11)[:1]
        for stage, prefix in ONCE_FALSE:
            if stage == assignment:
                (once,) = [m for m in mutants if m.identifier.startswith(prefix)]  # exactly the mutant meant
                drawn.append(once)
    return notebooks, drawn


@pytest.mark.slow
def test_a_seeded_sample_across_every_stage_makes_no_false_claim():
    notebooks, drawn = _sample()
    assert {mutant.assignment for mutant in drawn} == set(STAGE_MODULES)
    assert len(drawn) == len(STAGE_MODULES) + len(ONCE_FALSE)
    verdicts = run_mutants(drawn, notebooks, jobs=2, timeout=180, focused=True)
    assert all(verdict.rejected for verdict in verdicts), [v.mutant.identifier for v in verdicts if not v.rejected]
    false = [(verdict.mutant.identifier, claim.text, claim.why) for verdict in verdicts
             for claim in judge_outcomes(verdict.mutant, verdict.outcomes) if claim.verdict == "false"]
    assert not false, false
