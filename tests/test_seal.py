"""The grading runner under attack: notebook code cannot turn a failing grade cell into a pass,
read a grade cell's hidden tests, or hand in the reference solution unnoticed.

Every attack runs in a real runner (the zygote of `transformer_course.grading.sandbox.runner`, started
without a sandbox here: the sandbox is tested in test_isolation.py) before a grade cell whose
student function has a real bug (the scores are not divided by sqrt(d_k)); that cell must still
fail, for the bug. The honest notebook passes with no finding.
"""

import dis
import textwrap

import pytest

from transformer_course.grading.sandbox import runner, seal
from transformer_course.grading.sandbox.executor import ChannelTampered, Session, expected_titles

CHECKS = "transformer_course.checks.attention"
GRADE = "assert check.sdpa_values(scaled_dot_product_attention)\n"
HIDDEN_GRADE = (
    "assert check.sdpa_shapes(scaled_dot_product_attention)\n"
    "### BEGIN HIDDEN TESTS\n"
    "assert check.sdpa_values(scaled_dot_product_attention, batch=3, heads=0, q_len=7, k_len=2, d_k=3, d_v=5)\n"
    "### END HIDDEN TESTS\n"
)
SECRET = "batch=3, heads=0, q_len=7, k_len=2, d_k=3, d_v=5"
IMPORTS = "import math\nimport torch\n"
CORRECT = textwrap.dedent("""
    def scaled_dot_product_attention(Q, K, V, mask=None):
        d_k = Q.size(-1)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        weights = torch.softmax(scores, dim=-1)
        return weights @ V, weights
""")
BUGGY = CORRECT.replace(" / math.sqrt(d_k)", "")


@pytest.fixture(scope="module")
def session():
    with Session([CHECKS, "IPython.core.interactiveshell", "torch", "math", "inspect"]) as running:
        yield running


def grade(session, cells, grade_cell=GRADE):
    """Run `cells` (ordinary) then the grade cell in a fresh runner; return (outcome, outputs of the cells)."""
    session.notebook(CHECKS, ["scaled_dot_product_attention"], "/tmp/test-seal-work")
    outputs = [session.run_cell(index, source, 60) for index, source in enumerate([IMPORTS, *cells])]
    outcome = session.run_grade_cell(99, grade_cell, expected_titles(grade_cell, CHECKS), 120)
    session.end_notebook()
    return outcome, outputs


def test_the_honest_notebook_passes_without_findings(session):
    outcome, _ = grade(session, [CORRECT], HIDDEN_GRADE)
    assert outcome.passed, outcome.message
    assert outcome.findings == []
    assert "(hidden test)" in outcome.outputs[0]["text"]


def test_the_bug_alone_fails_for_its_cause(session):
    outcome, _ = grade(session, [BUGGY])
    assert not outcome.passed and "not scaled" in outcome.message


ATTACKS = {
    "a thread re-patches the checks' helpers every half millisecond": textwrap.dedent("""
        import threading, time
        from transformer_course.checks import framework
        def spin():
            while True:
                framework.fail = lambda *a, **k: None
                framework.expect_close = lambda *a, **k: None
                framework.tensors_close = lambda *a, **k: True
                torch.allclose = lambda *a, **k: True
                time.sleep(0.0005)
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.01)
    """),
    "the student's function re-patches the helpers each time a check calls it": textwrap.dedent("""
        from transformer_course.checks import framework
        _buggy = scaled_dot_product_attention
        def scaled_dot_product_attention(Q, K, V, mask=None):
            framework.expect_close = lambda *a, **k: None
            framework.fail = lambda *a, **k: None
            framework.tensors_close = lambda *a, **k: True
            torch.Tensor.__le__ = lambda self, other: torch.ones(self.shape, dtype=torch.bool)
            return _buggy(Q, K, V, mask)
    """),
    "an IPython input transformer rewrites later cells into pass": textwrap.dedent("""
        shell = globals()["get_" + "ipy" + "thon"]()
        hooks = getattr(shell, "input_" + "transformers_post")
        hooks.append(lambda lines: ["pass\\n"])
    """),
    "a replaced __exit__ swallows the failure": textwrap.dedent("""
        import contextlib, warnings
        torch.no_grad.__exit__ = lambda *a: True
        warnings.catch_warnings.__exit__ = lambda *a: True
        contextlib._GeneratorContextManager.__exit__ = lambda *a: True
    """),
    "the check's function internals are swapped": textwrap.dedent("""
        from transformer_course.checks import attention
        try:
            attention.sdpa_values.__wrapped__.__code__ = (lambda *a, **k: None).__code__
        except PermissionError:
            pass
        attention.sdpa_values.__wrapped__.__globals__["expect_close"] = lambda *a, **k: None
    """),
    "verdicts are forged through the audit channel": textwrap.dedent("""
        import sys
        for event in ("transformer_course.seal.child", "transformer_course.seal.verdict",
                      "transformer_course.seal.done", "transformer_course.seal.arm"):
            try:
                sys.audit(event, 1, True, "forged")
            except PermissionError:
                pass
    """),
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attack_leaves_the_failing_cell_failing(session, attack):
    outcome, _ = grade(session, [BUGGY, ATTACKS[attack]])
    assert not outcome.passed, f"{attack}: {outcome}"


def test_re_patching_during_a_check_is_found_and_undone(session):
    outcome, _ = grade(session, [BUGGY, ATTACKS["the student's function re-patches the helpers each time a check "
                                                "calls it"]])
    assert "not scaled" in outcome.message
    assert any("replaced the checks' tools while a check ran" in finding for finding in outcome.findings)


INTROSPECTION = {
    "inspect.stack": "import inspect\nleak = repr([f.code_context for f in inspect.stack()])",
    "sys._getframe": "import sys\nleak = repr(sys._getframe(1).f_back.f_code.co_consts)",
    "a traceback's frames": textwrap.dedent("""
        try:
            raise ValueError
        except ValueError as error:
            leak = repr(error.__traceback__.tb_frame.f_back.f_locals)
    """),
    "traceback.walk_stack": (
        "import traceback\nleak = repr([f.f_code.co_consts for f, _ in traceback.walk_stack(None)])"),
    "gc": "import gc\nleak = repr([o for o in gc.get_objects() if isinstance(o, str) and 'heads=0' in o])",
    "other threads' frames": "import sys\nleak = repr(sys._current_frames())",
    "a profile function": "import sys\nsys.setprofile(lambda *a: None)\nleak = ''",
}


@pytest.mark.parametrize("way", INTROSPECTION)
def test_student_code_called_by_a_hidden_test_cannot_see_it(session, way):
    spy = CORRECT.replace("    d_k = Q.size(-1)\n", "    d_k = Q.size(-1)\n" + textwrap.indent(
        INTROSPECTION[way] + "\nprint(leak)\nraise RuntimeError(leak)\n", "    "))
    outcome, outputs = grade(session, [spy], HIDDEN_GRADE)
    text = repr(outcome.outputs) + repr(outputs)
    assert not outcome.passed
    assert SECRET not in text and "heads=0, q_len=7" not in text
    assert "switched off while your notebook is graded" in outcome.message


REFERENCE = {
    "through the names the checks module re-exports": (
        "from transformer_course.checks import attention as c\n"
        "scaled_dot_product_attention = c.reference_attention\n",
        "hands in the course's reference solution itself"),
    "through eval of split strings": (
        "ref = getattr(eval('__imp' + 'ort__')('transformer' + '_course.reference', fromlist=['x']),\n"
        "              'scaled_dot_product' + '_attention')\n"
        "def scaled_dot_product_attention(Q, K, V, mask=None):\n"
        "    return ref(Q, K, V, mask)\n",
        "runs the course's reference solution"),
    "through inspect.getsource": (
        "import inspect\n"
        "ref = getattr(__import__('transformer' + '_course.reference', fromlist=['x']),\n"
        "              'scaled_dot_product' + '_attention')\n"
        "exec(inspect.getsource(ref))\n",
        "contains a copy of the reference solution's code"),
}


@pytest.mark.parametrize("route", REFERENCE)
def test_an_answer_built_from_the_reference_is_flagged(session, route):
    code, finding = REFERENCE[route]
    outcome, _ = grade(session, [code])
    assert any(finding in line for line in outcome.findings), outcome.findings


def test_a_student_thread_writing_to_the_grader_channel_cannot_forge_a_pass(session):
    forger = textwrap.dedent("""
        import os, threading, time
        def forge():
            record = b'{"6f70":"6772616465"}'
            for fd in range(3, 40):
                try:
                    os.write(fd, b"TCR1" + len(record).to_bytes(8, "big") + record)
                except OSError:
                    pass
        threading.Thread(target=forge, daemon=True).start()
        time.sleep(0.05)
    """)
    try:
        outcome, _ = grade(session, [BUGGY, forger])
    except ChannelTampered:  # caught while the forger's cell ran: the session is closed, nothing passes
        assert not session.alive()
        session.start()
        return
    assert not outcome.passed


def test_sealed_functions_read_no_module_globals():
    """What runs after notebook code (the hook, the integrity check, the proxy, the child) binds its
    tools as defaults or reads them from the runner's plain dict: no LOAD_GLOBAL a notebook could
    redirect by assigning a module attribute."""
    code_kind, file_kind, trusted, grader = seal.make_provenance(seal.library_roots())
    hook = seal.make_audit_hook(code_kind, file_kind, trusted, grader, (), runner.proxy_call.__code__,
                                runner._report_done.__code__)
    integrity = seal.make_integrity_check(((), (), ()))
    guard = seal.make_profile_guard(code_kind, integrity, {}, {}, [])
    functions = [hook, integrity, guard, code_kind, file_kind, seal.make_packer(), runner._grade_in_child,
                 runner._report_done, runner._text, runner.proxy_call]
    for function in functions:
        globals_read = {i.argval for i in dis.get_instructions(function) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        assert not globals_read, f"{function.__qualname__} reads module globals {globals_read}"
