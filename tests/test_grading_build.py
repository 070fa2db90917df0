"""The grading build (`grading.sandbox.build`): the checks and the reference as a notebook's sandbox gets them.

Each notebook's runner imports its build from memory: the checks cut down to their experiments (a public check is a
stub that says checks are judged by the grader), the reference without the solution of the graded stage's
exercises, stand-ins made of PyTorch's built-ins where an experiment plugs such a part in. Outside grading nothing
changes (the Colab self-check imports the package from its files).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from transformer_course.checks import stand_ins
from transformer_course.grading.sandbox import build

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
    assert "x.view(batch_size, seq_length, self.num_heads, self.d_k)" not in source  # no part kept for experiments
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


def test_a_demonstration_helper_hands_its_argument_back_in_the_sandbox_and_swaps_parts_outside_it():
    """`check.with_course_parts`, which the bug hunt of stage 7 calls in an ordinary cell, needs the course's own
    start_cache and decoder_step: the build of stage 7 has neither, so there it returns the notebook's loop as it
    is (the cell runs; what it shows earns nothing), where a check's stub would stop the cell with an error."""
    results = in_build("transformer_course.checks.fast_decoding", """
        from transformer_course.checks import fast_decoding as check
        from transformer_course.checks.boundary import JudgedByGrader
        def loop(*args):
            return ("the notebook's loop", args)
        try:
            check.cached_greedy_matches_greedy(loop)
            said = ""
        except JudgedByGrader as error:
            said = str(error)
        print(json.dumps({"same": check.with_course_parts(loop) is loop, "said": said}))
    """)
    assert results == {"same": True, "said": results["said"]} and "judged by the grader" in results["said"]
    from transformer_course.checks import fast_decoding
    swapped = fast_decoding.with_course_parts(lambda: None)
    assert swapped.__name__ == "run"  # outside grading: the swapping wrapper, not the loop


def test_experiments_plug_in_stand_ins_where_their_part_is_the_graded_exercise():
    plugged = build.stand_ins_for(build.own_exercises("transformer_course.checks.attention"))
    assert plugged["transformer_course.checks.attention"] == {
        "_reference_attention": "scaled_dot_product_attention", "_reference_padding_mask": "make_padding_mask",
        "_reference_look_ahead_mask": "make_look_ahead_mask"}
    plugged = build.stand_ins_for(build.own_exercises("transformer_course.checks.training"))
    assert plugged["transformer_course.checks.training"] == {"reference_collate": "collate",
                                                             "reference_compute_loss": "compute_loss",
                                                             "reference_train_epoch": "train_epoch"}
    assert build.KEPT_FOR_EXPERIMENTS == frozenset()  # no reference part stays for an experiment
    for checks in STAGES:  # every own- or later-stage part an experiment's code uses has a stand-in
        own = build.own_exercises(checks) | build.later_exercises(checks)
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
    # a notebook's preload names the package and the machinery beside the checks too: they name no grade cell's
    # parts (counting them as "names none" warmed up everything for every stage, about 1.3 s of CPU a zygote)
    assert build.warm_up_parts(["transformer_course.checks", "transformer_course.checks.framework",
                                "transformer_course.checks.blocks"]) == []


@pytest.mark.parametrize("checks", STAGES)
def test_no_build_holds_a_solution_of_its_own_or_a_later_stage(checks):
    """For every stage, the reference modules of its build hold no solution region of an exercise of that stage
    or of a later one (neither its text nor its markers); the earlier stages' stay, and a later exercise that an
    earlier notebook uses is a stand-in's import."""
    entries = build.grading_build(checks)
    order = STAGES.index(checks)
    for stage, (_, included) in enumerate(build.stages()):
        for module, definition in sorted(included & set(build._definitions_with_solutions())):
            filename, text, _ = entries[module]
            original = open(filename, encoding="utf-8").read()
            first, last = build._definitions_with_solutions()[module, definition]
            regions = [match for match in build.SOLUTION.finditer(original)
                       if first <= original.count("\n", 0, match.start()) + 1 <= last + 1]
            assert regions, (module, definition)
            inside = "\n".join(text.split("\n")[first - 1:last])
            for region in regions:
                body = textwrap.dedent("\n".join(region.group(0).split("\n")[1:-1])).strip()
                if stage >= order:
                    assert "### BEGIN SOLUTION" not in inside, (checks, module, definition)
                    assert body not in textwrap.dedent(text), (checks, module, definition)
                else:
                    assert region.group(0) in text, (checks, module, definition)  # the notebook builds on it
    training = entries["transformer_course.reference.training"][1]
    if order < STAGES.index("transformer_course.checks.training"):
        assert "from transformer_course.checks.stand_ins import collate" in training


def test_the_reference_run_with_a_stage_0_build_uses_the_later_stages_stand_ins():
    """Stage 0's notebook collates with stage 5's `collate` and translates with stage 6's `greedy_decode`: its build
    gives it the stand-ins, which work without any later stage's solution (masks included)."""
    results = in_build("transformer_course.checks.why_attention", """
        from transformer_course.reference import Transformer, make_target_mask
        from transformer_course.reference.training import collate
        from transformer_course.reference.decoding import greedy_decode
        batch = collate([([4, 5, 6], [1, 7, 8, 2]), ([4, 9], [1, 5, 2])], 0)
        try:
            Transformer(12, 12, 8, 2, 1, 16, 20, 0.0)  # stage 1's positional encoding: not in this build
            stripped = False
        except NotImplementedError:
            stripped = True
        print(json.dumps({"mask": make_target_mask(batch.tgt_in, 0).tolist(), "stripped": stripped,
                          "stand-ins": [collate.__module__, greedy_decode.__module__]}))
    """)
    assert results["stand-ins"] == ["transformer_course.checks.stand_ins"] * 2 and results["stripped"]
    assert results["mask"][1][0] == [[True, False, False], [True, True, False], [True, True, True]]


def _model(seed: int = 0):
    from transformer_course.reference import Transformer

    torch.manual_seed(seed)
    return Transformer(12, 11, 8, 2, 2, 16, 20, 0.0).double().eval()


def test_the_mask_collate_and_greedy_decode_stand_ins_compute_the_references_values():
    from transformer_course.reference import attention, decoding, model, training

    ids = torch.tensor([[4, 5, 0, 0], [3, 0, 0, 0], [7, 8, 9, 6]])
    assert torch.equal(stand_ins.make_padding_mask(ids, 0), attention.make_padding_mask(ids, 0))
    for size in (0, 1, 5):
        assert torch.equal(stand_ins.make_look_ahead_mask(size), attention.make_look_ahead_mask(size))
    assert torch.equal(stand_ins.make_target_mask(ids, 0), model.make_target_mask(ids, 0))
    pairs = [([4, 5, 6], [1, 7, 8, 2]), ([4, 9], [1, 5, 2]), ([3], [1, 2])]
    expected, got = training.collate(pairs, 0), stand_ins.collate(pairs, 0)
    for field in ("src", "tgt_in", "tgt_out", "src_mask", "tgt_mask"):
        assert torch.equal(getattr(expected, field), getattr(got, field)), field
    for seed, max_len in ((0, 6), (1, 0), (2, 12)):
        transformer = _model(seed)
        src = torch.tensor([[4, 5, 6, 0], [3, 0, 0, 0], [7, 8, 9, 10]])
        assert torch.equal(stand_ins.greedy_decode(transformer, src, 0, 1, 2, max_len),
                           decoding.greedy_decode(transformer, src, 0, 1, 2, max_len)), (seed, max_len)


def test_the_method_stand_ins_beside_the_experiments_compute_the_references_values():
    """The parts an experiment plugs into the student's module (stage 0's score, stage 2's split and combine heads,
    stage 3's feed-forward network, stage 4's stacks): the stand-ins in the checks give exactly the reference's
    values, so the reference solutions of those parts are in no build."""
    from transformer_course.checks import attention as attention_checks
    from transformer_course.checks import blocks as block_checks
    from transformer_course.checks import model as model_checks
    from transformer_course.checks import why_attention
    from transformer_course.reference import MultiHeadAttention, PositionWiseFeedForward
    from transformer_course.reference.additive_attention import AdditiveAttention

    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    additive = AdditiveAttention(6, 8, 10).double()
    query = torch.randn(3, 4, 6, generator=generator, dtype=torch.float64)
    keys = torch.randn(3, 5, 8, generator=generator, dtype=torch.float64)
    assert torch.equal(why_attention._score_stand_in(additive, query, keys), additive.score(query, keys))

    heads = MultiHeadAttention(12, 3).double()
    sizes = attention_checks._Sizes(12, 3, 4)
    x = torch.randn(2, 5, 12, generator=generator, dtype=torch.float64)
    split = attention_checks._split_heads_stand_in(sizes, x)
    assert torch.equal(split, heads.split_heads(x))
    assert torch.equal(attention_checks._combine_heads_stand_in(sizes, split), heads.combine_heads(split))

    network = PositionWiseFeedForward(12, 20).double()
    assert torch.equal(block_checks._feed_forward_stand_in(network, x), network(x))

    transformer = _model()
    src = torch.tensor([[4, 5, 6, 0], [3, 0, 0, 0]])
    tgt = torch.tensor([[1, 7, 8], [1, 5, 0]])
    src_mask, tgt_mask = stand_ins.make_padding_mask(src, 0), stand_ins.make_target_mask(tgt, 0)
    memory = transformer.encoder(src, src_mask)
    assert torch.equal(model_checks._encoder_stand_in(transformer.encoder, src, src_mask), memory)
    assert torch.equal(model_checks._decoder_stand_in(transformer.decoder, tgt, memory, src_mask, tgt_mask),
                       transformer.decoder(tgt, memory, src_mask, tgt_mask))


def test_the_train_epoch_stand_in_trains_as_the_reference_does():
    """Stage 0 trains its recurrent models with stage 5's `train_epoch`: the stand-in in its build takes the same
    steps (same loss, same weights after them)."""
    from transformer_course.reference import training

    pairs = [([4, 5, 6], [1, 7, 8, 2]), ([4, 9], [1, 5, 2]), ([3], [1, 2]), ([5, 5, 4], [1, 9, 9, 9, 2])]
    batches = [training.collate(pairs[:2], 0), training.collate(pairs[2:], 0), training.collate(pairs, 0)]
    trained = []
    for train_epoch in (training.train_epoch, stand_ins.train_epoch):
        model = _model().train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
        criterion = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
        loss = train_epoch(model, batches, criterion, optimizer, scheduler, "cpu", 0.5, max_steps=2, progress=False)
        trained.append((loss, model.state_dict()))
    (loss, state), (stand_in_loss, stand_in_state) = trained
    assert loss == stand_in_loss
    assert all(torch.equal(state[name], stand_in_state[name]) for name in state)


HANDED_IN = {  # the checks' own part for an exercise, handed in as the student's answer
    "05_training": ("compute_loss", "compute_loss = check.reference_compute_loss\n"),
    "02_attention": ("MultiHeadAttention", "MultiHeadAttention.split_heads = check._split_heads_stand_in\n"
                                           "MultiHeadAttention.combine_heads = check._combine_heads_stand_in\n"),
}


@pytest.mark.parametrize("assignment", sorted(HANDED_IN))
def test_a_part_the_checks_plug_in_cannot_be_handed_in(assignment, tmp_path):
    """In the runner, the graded stage's parts that experiments plug in are proxies that only an experiment's
    servant can call (`build.experiment_parts`): handed in as the answer, they fail the exercise's checks."""
    import nbformat

    from conftest import graded_part, read, solution_path
    from quality.inprocess import run_grade_cells

    exercise, line = HANDED_IN[assignment]
    notebook = graded_part(read(solution_path(assignment)))
    defined = min(index for index, cell in enumerate(notebook.cells)  # the cell that defines the exercise
                  if cell.metadata.get("nbgrader", {}).get("solution")
                  and re.search(rf"^(class|def) {exercise}\b", cell.source, re.MULTILINE))
    notebook.cells.insert(defined + 1, nbformat.v4.new_code_cell(line))
    outcomes = run_grade_cells(notebook, tmp_path)
    judged = {grade_id: outcome for grade_id, outcome in outcomes.items()
              if any(f"({exercise}" in cell.source for cell in notebook.cells
                     if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id)}
    checked = {grade_id for grade_id in judged if "split" in grade_id or "combine" in grade_id
               or "heads" in grade_id} if exercise == "MultiHeadAttention" else set(judged)
    assert checked and all(not judged[grade_id].passed for grade_id in checked), {
        grade_id: judged[grade_id].message[:200] for grade_id in checked}
