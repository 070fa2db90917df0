"""The grading build (`grading.sandbox.build`): the checks and the reference as a notebook's sandbox gets them.

Each notebook's runner imports its build from memory: the checks cut down to their experiments (a public check is a
stub that says checks are judged by the grader), the reference without the solution of the graded stage's
exercises, stand-ins made of PyTorch's built-ins where an experiment plugs such a part in. Outside grading nothing
changes (the Colab self-check imports the package from its files).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from transformer_course.grading.sandbox import build, stand_ins

STAGES = [checks for checks, _ in build.stages()]
# reference parts of the graded stage that an experiment only builds (their constructors are given code, not an
# exercise) and never runs: model._plugged builds the reference Transformer to take its Encoder and Decoder
CONSTRUCTED_ONLY = {("transformer_course.checks.model", "Transformer")}


def in_build(checks: str, code: str) -> dict:
    """Run `code` in a fresh interpreter with the build for `checks` installed; its last line of JSON output."""
    program = textwrap.dedent("""
        import json, sys
        from transformer_course.grading.sandbox import build
        build.install({name: tuple(entry) for name, entry in json.loads(sys.stdin.read()).items()})
    """) + textwrap.dedent(code)
    done = subprocess.run([sys.executable, "-c", program], input=json.dumps(build.grading_build(checks)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_lesson_has_a_checks_module_and_exercises():
    assert len(STAGES) == 8 and all(STAGES)
    for checks in STAGES:
        assert build.own_exercises(checks), checks


def test_a_stage_build_holds_no_solution_of_its_own_exercises_and_keeps_the_earlier_ones():
    attention = build.grading_build("transformer_course.checks.attention")
    source = attention["transformer_course.reference.attention"][1]
    assert "torch.softmax(scores, dim=-1)" not in source  # stage 2's own exercise: gone
    assert "x.view(batch_size, seq_length, self.num_heads, self.d_k)" in source  # kept for an experiment
    blocks = build.grading_build("transformer_course.checks.blocks")
    assert "torch.softmax(scores, dim=-1)" in blocks["transformer_course.reference.attention"][1]  # stage 3 uses it
    assert "self.norm1(" not in blocks["transformer_course.reference.blocks"][1]
    for entries in (attention, blocks):  # line numbers as in the files, so tracebacks read right
        for name, (filename, text, _) in entries.items():
            assert text.count("\n") == open(filename, encoding="utf-8").read().count("\n"), name


def test_checks_keep_their_experiments_and_lose_their_judging_code():
    kept = build.student_side("transformer_course.checks.attention")
    assert "def _reference_parts(" in kept and "def _forward_observed(" in kept  # experiments and what they use
    assert "def diagnose_weights(" not in kept and "def _expect_attention(" not in kept  # judging
    assert "_read_scores" not in kept
    assert "sdpa_values = _judged_by_grader('sdpa_values'" in kept  # a public check: a stub


def test_a_check_called_in_the_sandbox_says_it_is_judged_by_the_grader_and_summary_still_works():
    results = in_build("transformer_course.checks.attention", """
        from transformer_course.checks import attention as check, framework
        from transformer_course.checks.boundary import JudgedByGrader
        try:
            check.sdpa_values(lambda *a: None)
            said = ""
        except JudgedByGrader as error:
            said = str(error)
        framework.record("sdpa_values", check.sdpa_values.check_title, True, "")
        experiments = [name for name, value in vars(check).items() if hasattr(value, "experiment")]
        from transformer_course.reference import attention as ref
        try:
            ref.scaled_dot_product_attention(*[__import__("torch").ones(1, 2, 2)] * 3)
            stub = ""
        except NotImplementedError as error:
            import traceback
            stub = traceback.format_exc()
        print(json.dumps({"said": said, "experiments": experiments, "stub": stub,
                          "recorded": list(framework.results())}))
    """)
    assert "judged by the grader" in results["said"]
    assert "_forward_observed" in results["experiments"] and "_attend" in results["experiments"]
    assert results["recorded"] == ["sdpa_values"]
    assert "reference/attention.py" in results["stub"] and "raise NotImplementedError" in results["stub"]


def test_experiments_plug_in_stand_ins_where_their_part_is_the_graded_exercise():
    plugged = build.stand_ins_for(build.own_exercises("transformer_course.checks.attention"))
    assert plugged == {"transformer_course.checks.attention": {"_reference_attention": "scaled_dot_product_attention"}}
    plugged = build.stand_ins_for(build.own_exercises("transformer_course.checks.training"))
    assert plugged["transformer_course.checks.training"] == {"reference_collate": "collate",
                                                             "reference_compute_loss": "compute_loss"}
    for checks in STAGES:  # every own-stage part an experiment's code uses has a stand-in or is kept on purpose
        own = build.own_exercises(checks)
        names = {name for _, name in own}
        stood_in = {value for table in build.stand_ins_for(own).values() for value in table.values()}
        kept = {qualname.split(".")[0] for _, qualname in build.KEPT_FOR_EXPERIMENTS}
        for name, module in build._checks_modules().items():
            if name in STAGES and name != checks:
                continue  # another stage's experiments never run while this stage is graded
            statements = build.kept_statements()[name] or ()
            used = {node.id for index in statements
                    if isinstance(module.tree.body[index], ast.FunctionDef | ast.ClassDef)
                    for node in ast.walk(module.tree.body[index]) if isinstance(node, ast.Name)}
            for local, original in _reference_imports(module).items():
                if local in used and original in names and (name, original) not in CONSTRUCTED_ONLY:
                    assert original in stood_in or original in kept, (checks, name, original)


def _reference_imports(module) -> dict[str, str]:
    """{local name: the reference definition it names} of a checks module's imports from the reference."""
    return {alias.asname or alias.name: alias.name for statement in module.tree.body
            if isinstance(statement, ast.ImportFrom) and (statement.module or "").startswith(build.REFERENCE)
            for alias in statement.names}


@pytest.mark.parametrize("masked", [False, True])
def test_the_attention_stand_in_computes_the_references_values(masked):
    from transformer_course.reference import attention

    generator = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(2, 3, 5, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    mask = None
    if masked:
        mask = torch.rand(2, 1, 5, 5, generator=generator) > 0.4
        mask[..., 0] = True  # every query sees a key
    expected = attention.scaled_dot_product_attention(Q, K, V, mask)
    got = stand_ins.scaled_dot_product_attention(Q, K, V, mask)
    for want, have in zip(expected, got, strict=True):
        assert torch.allclose(want, have, atol=1e-12, rtol=0)
    if masked:
        assert bool((got[1][~mask.expand_as(got[1])] == 0).all())


def test_the_loss_and_collate_stand_ins_compute_the_references_values():
    from transformer_course.reference import Transformer, training

    pairs = [([4, 5, 6], [1, 7, 8, 2]), ([4, 9], [1, 5, 2]), ([3], [1, 2])]
    expected, got = training.collate(pairs, 0), stand_ins.collate(pairs, 0)
    for field in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask"):
        assert torch.equal(getattr(expected, field), getattr(got, field)), field
    torch.manual_seed(0)
    model = Transformer(12, 12, 8, 2, 1, 16, 20, 0.0).double().eval()
    criterion = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    assert torch.equal(training.compute_loss(model, expected, criterion),
                       stand_ins.compute_loss(model, expected, criterion))


def test_outside_grading_the_checks_are_whole():
    """The Colab self-check: a normal import of the checks is the full module, from its file."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from transformer_course.checks import attention as check
        from transformer_course.reference import scaled_dot_product_attention
        import inspect
        print(hasattr(check, "diagnose_weights"), hasattr(check.sdpa_values, "__wrapped__"),
              "softmax" in inspect.getsource(scaled_dot_product_attention))
    """)], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["True", "True", "True"], done.stderr[-2000:]


def test_the_sandbox_is_told_the_warm_up_its_checks_name():
    assert build.warm_up_parts(["transformer_course.checks.attention"]) == ["shape checks", "optimiser step"]
    assert build.warm_up_parts(["torch"]) == []
