"""Mistakes nobody wrote for the checks: mechanical mutants of the reference solutions.

The generator must make mutants of every kind in every stage, each an edit of exactly one exercise
cell; equivalent mutants must be told apart by behaviour; and a fixed sample of non-equivalent
mutants across the stages must be rejected by the grade cells; mutants that are catalogued mistakes are left
out of the measure; the naming rule asks for both the operation and the relation (scripts/measure_checks.py
measures the full figures; this is its cheap, always-on part: about 30-60 s on two cores)."""

import ast
import copy
import dataclasses
from collections import Counter

import pytest

from conftest import ASSIGNMENTS, read, solution_path
from quality.behaviour import equivalent, load, observe
from quality.measure import (
    catalogued_edits,
    check_titles,
    in_catalog,
    names_operation_and_relation,
    reduced,
    run_mutants,
)
from quality.mistakes import is_solution
from quality.mutations import KINDS, STAGE_MODULES, generate, sample


def _mutants(assignment):
    notebook = reduced(read(solution_path(assignment)))
    return notebook, generate(assignment, [cell.source for cell in notebook.cells if is_solution(cell)])


def test_every_stage_gets_mutants_and_every_kind_occurs():
    kinds, total = Counter(), 0
    assert set(STAGE_MODULES) == set(ASSIGNMENTS)  # all eight stages, the optional 0 and 7 included
    for assignment in STAGE_MODULES:
        _, mutants = _mutants(assignment)
        assert len(mutants) >= 50, (assignment, len(mutants))
        total += len(mutants)
        kinds.update(mutant.kind for mutant in mutants)
        original = read(solution_path(assignment))
        for mutant in mutants[:: max(1, len(mutants) // 15)]:  # a spread of them, each fully checked
            ast.parse(mutant.module_source)
            edited = mutant.edit.apply(copy.deepcopy(original))
            changed = [new.source for old, new in zip(original.cells, edited.cells, strict=True)
                       if old.source != new.source]
            assert len(changed) == 1 and mutant.mutated.split("#")[0].strip() in changed[0], mutant
    assert set(kinds) == set(KINDS), kinds
    assert all(kinds[kind] >= 5 for kind in KINDS), kinds
    assert total >= 300, total


def test_a_stage_spanning_two_modules_is_mutated_in_both():
    _, mutants = _mutants("07_fast_and_better_decoding")
    modules = Counter(mutant.module for mutant in mutants)
    assert set(modules) == set(STAGE_MODULES["07_fast_and_better_decoding"]) and min(modules.values()) >= 10, modules


def test_mutants_that_are_catalogued_mistakes_are_left_out_of_the_measure():
    catalogued = catalogued_edits()
    _, mutants = _mutants("02_attention")
    found = [mutant for mutant in mutants if in_catalog(mutant, catalogued)]
    assert found and len(found) < len(mutants) / 4, [m.identifier for m in found]


MESSAGES = {  # (kind, function, mutated line, message, named by the rule?)
    "a factor on its line": ("change_constant", "PositionalEncoding.__init__", "x",
                             "likely cause: in `__init__`, line 4 (`div_term = ...`): the product inside "
                             "`div_term` is 0.4343 × the expected values", True),
    "the line but no relation": ("drop_call", "MultiHeadAttention.combine_heads", "x",
                                 "likely cause: in `combine_heads`, line 2: other values", False),
    "a relation but no place": ("swap_arguments", "MultiHeadAttention.forward", "x",
                                "likely cause: two values are swapped somewhere", False),
}


@pytest.mark.parametrize("case", MESSAGES)
def test_the_naming_rule_asks_for_the_operation_and_the_relation(case):
    kind, function, mutated, message, named = MESSAGES[case]
    _, mutants = _mutants("01_positional_encoding" if function.startswith("Positional") else "02_attention")
    mutant = next(m for m in mutants if m.function == function)
    probe = dataclasses.replace(mutant, kind=kind, mutated=mutated)
    assert names_operation_and_relation(probe, message, []) is named


def test_sampling_is_fixed_by_the_seed_and_leaves_out_the_tuning_set():
    _, mutants = _mutants("02_attention")
    first, again = sample(mutants, 3, seed=0), sample(mutants, 3, seed=0)
    assert [m.identifier for m in first] == [m.identifier for m in again]
    held_out = sample(mutants, 3, seed=1, exclude={m.identifier for m in first})
    assert held_out and not {m.identifier for m in held_out} & {m.identifier for m in first}


def test_equivalent_mutants_are_told_apart_by_behaviour():
    _, mutants = _mutants("02_attention")
    by_text = {mutant.mutated.split("#")[0].strip(): mutant for mutant in mutants}
    same = by_text["scores = Q @ K.transpose(-1, -2) / math.sqrt(d_k)"]  # transpose(-1, -2) == transpose(-2, -1)
    different = by_text["weights = torch.softmax(scores, dim=(-2))"]
    assert equivalent(same)
    assert not equivalent(different)
    reference = observe("02_attention", load(same.module_source, "probe_check"))
    assert any(key.startswith("mha") for key in reference) and any(key.startswith("sdpa") for key in reference)


# A fixed, time-bounded sample across the six stages: grading stops after the grade cells of the
# mutated exercise, and stages 1-2 (whose checks locate the first departure) are also held to
# naming the mutation's place or cause. Stages 3-6 take a mutant of their first exercise; it was
# checked once to be no equivalent mutant (the filter has its own test above).
SAMPLE = {"01_positional_encoding": 6, "02_attention": 3, "03_blocks": 1, "04_transformer": 1, "05_training": 1,
          "06_decoding": 1}


def _fixed_sample(assignment, mutants, count):
    if assignment[:2] in ("01", "02"):
        drawn = []
        for mutant in sample(mutants, 1, seed=7):
            if len(drawn) < count and not equivalent(mutant):
                drawn.append(mutant)
        return drawn
    first = [m for m in mutants if m.function == mutants[0].function]  # the stage's first exercise
    return ([m for m in first if m.kind == "drop_call"] or [m for m in first if m.kind == "delete_statement"])[:count]


@pytest.mark.slow
def test_a_fixed_sample_of_mutants_is_rejected_with_the_place_named():
    notebooks, drawn = {}, []
    for assignment, count in SAMPLE.items():
        notebook, mutants = _mutants(assignment)
        notebooks[assignment] = (notebook, solution_path(assignment).parent)
        chosen = _fixed_sample(assignment, mutants, count)
        assert len(chosen) == count, assignment
        drawn += chosen
    verdicts = run_mutants(drawn, notebooks, jobs=2, timeout=120, focused=True)
    passing = [verdict.mutant.identifier for verdict in verdicts if not verdict.rejected]
    assert len(passing) <= 0.1 * len(verdicts), passing
    early = [verdict for verdict in verdicts if verdict.mutant.assignment[:2] in ("01", "02")]
    named = [verdict for verdict in early if verdict.named(check_titles(verdict.mutant.assignment))]
    assert len(named) >= 0.75 * len(early), [v.mutant.identifier for v in early if v not in named]
