"""Grading that student code cannot reach: the grader under attack from the notebook it grades.

Each test grades a small stage-1 notebook with the real grader's Execute step (`JudgedExecute`: ordinary
cells in a runner, every grade cell judged in this process against a servant, hidden parts at the end
against snapshots), in a zygote of its own started without a sandbox (the sandbox has its own tests in
test_isolation.py). The student's `PositionalEncoding` has a real bug (a base-10 logarithm where the
natural one belongs) unless a test says otherwise; whatever the notebook does around it, its grade cell
must still fail for the bug, the hidden test's inputs must never reach anything the student is shown, and
an answer that reaches for the reference solution finds none (the grading build leaves it out) and earns
nothing, while an honest notebook carries no flag.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from quality.inprocess import run_notebook
from transformer_course.grading.sandbox.executor import FINDINGS_KEY, GradeCellError, parse_grade_cell
from transformer_course.grading.sandbox.session import Session

pytestmark = pytest.mark.xdist_group("boundary")

CHECKS = "transformer_course.checks.positional_encoding"
SETUP = ("import math\nimport torch\nfrom torch import nn\n"
         "from transformer_course.checks import positional_encoding as check\n")
CORRECT = textwrap.dedent("""
    class PositionalEncoding(nn.Module):
        def __init__(self, d_model, max_seq_length, dropout):
            super().__init__()
            self.dropout = nn.Dropout(dropout)
            rows = torch.arange(max_seq_length, dtype=torch.float64)[:, None]
            rates = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
            table = torch.zeros(max_seq_length, d_model)
            table[:, 0::2] = torch.sin(rows * rates)
            table[:, 1::2] = torch.cos(rows * rates)
            self.register_buffer("pe", table.unsqueeze(0))

        def forward(self, x):
            return self.dropout(x + self.pe[:, : x.size(1)])
""")
BUGGY = CORRECT.replace("math.log(10000.0)", "math.log10(10000.0)")
GRADE = "assert check.table_values(PositionalEncoding)\n"
SECRET_D, SECRET_N = 10, 23
HIDDEN_GRADE = (
    "assert check.buffer_shape(PositionalEncoding)\n"
    "### BEGIN HIDDEN TESTS\n"
    f"assert check.table_values(PositionalEncoding, d_model={SECRET_D}, max_seq_length={SECRET_N})\n"
    "### END HIDDEN TESTS\n"
)


def grade_cell(source: str, grade_id: str) -> nbformat.NotebookNode:
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "points": 1, "locked": True,
                                 "solution": False, "schema_version": 3}
    return cell


def notebook(cells: list[str], grades: list[str] | None = None, after: list[str] = ()) -> nbformat.NotebookNode:
    solution = new_code_cell(cells[0])
    solution.metadata["nbgrader"] = {"grade": False, "grade_id": "pe", "locked": False, "solution": True,
                                     "schema_version": 3}
    body = [new_code_cell(SETUP), solution, *(new_code_cell(source) for source in cells[1:])]
    body += [grade_cell(source, f"grade_{index}") for index, source in enumerate(grades or [GRADE])]
    body += [new_code_cell(source) for source in after]
    return new_notebook(cells=body)


def unsandboxed_session() -> Session:
    """A zygote for these tests, without a sandbox (test_isolation.py tests the sandbox); a context manager."""
    environment = {**os.environ, "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg"}
    return Session([CHECKS, "IPython.core.interactiveshell", "torch", "math", "inspect"], environment=environment)


@pytest.fixture(scope="module")
def session():
    with unsandboxed_session() as running:
        yield running


def run(session, nb: nbformat.NotebookNode, tmp_path: Path, timeout: float = 60) -> tuple[list, list[str], str]:
    """(grade cells, findings, everything the student is shown) of the graded notebook (`timeout`: a cell's)."""
    graded = run_notebook(nb, tmp_path, timeout=timeout, session=session)
    grades = [cell for cell in graded.cells if cell.metadata.get("nbgrader", {}).get("grade")]
    shown = "\n".join(repr(cell.get("outputs", [])) for cell in graded.cells if cell.cell_type == "code")
    return grades, graded.metadata.get(FINDINGS_KEY, {}).get("findings", []), shown


def failed(cell: nbformat.NotebookNode) -> str | None:
    error = next((o for o in cell.outputs if o.get("output_type") == "error"), None)
    return f"{error['ename']}: {error['evalue']}" if error is not None else None


def test_the_honest_notebook_passes_without_findings(session, tmp_path):
    grades, findings, _ = run(session, notebook([CORRECT], [GRADE, HIDDEN_GRADE]), tmp_path)
    assert [failed(cell) for cell in grades] == [None, None]
    assert findings == []
    assert "(hidden test)" in grades[1].outputs[0]["text"]


def test_the_bug_alone_fails_for_its_cause(session, tmp_path):
    grades, findings, _ = run(session, notebook([BUGGY]), tmp_path)
    assert "log₁₀ e" in failed(grades[0])
    assert findings == []


ATTACKS = {
    "a thread re-patches the checks' helpers every half millisecond": """
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
    """,
    "the student's constructor re-patches the checks each time it runs": """
        from transformer_course.checks import framework, positional_encoding
        _Buggy = PositionalEncoding
        class PositionalEncoding(_Buggy):
            def __init__(self, *args):
                framework.expect_close = lambda *a, **k: None
                framework.fail = lambda *a, **k: None
                positional_encoding.expect_close = lambda *a, **k: None
                torch.Tensor.__le__ = lambda self, other: torch.ones(self.shape, dtype=torch.bool)
                super().__init__(*args)
    """,
    "an IPython input transformer rewrites later cells into pass": """
        shell = globals()["get_" + "ipy" + "thon"]()
        getattr(shell, "input_" + "transformers_post").append(lambda lines: ["pass\\n"])
    """,
    "replaced context managers swallow failures": """
        import contextlib, warnings
        torch.no_grad.__exit__ = lambda *a: True
        warnings.catch_warnings.__exit__ = lambda *a: True
        contextlib._GeneratorContextManager.__exit__ = lambda *a: True
    """,
    "the check's code is swapped": """
        from transformer_course.checks import positional_encoding
        positional_encoding.table_values.__wrapped__.__code__ = (lambda *a, **k: None).__code__
    """,
    "a torch function mode rewrites every result": """
        from torch.overrides import TorchFunctionMode
        class Liar(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        Liar().__enter__()
    """,
    "signal handlers and audit hooks": """
        import signal, sys
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.addaudithook(lambda event, args: None)
    """,
    "the checks module is replaced in sys.modules": """
        import sys, types
        fake = types.ModuleType("transformer_course.checks.positional_encoding")
        fake.table_values = lambda *a, **k: True
        sys.modules["transformer_course.checks.positional_encoding"] = fake
        check = fake
    """,
    "a thread writes forged results into every descriptor": """
        import os, struct, threading, time
        def forge():
            payload = b"d" + struct.pack("<I", 2) + b"s" + struct.pack("<I", 2) + b"op" + b"s" + struct.pack("<I", 6)
            payload += b"result" + b"s" + struct.pack("<I", 2) + b"id" + b"i" + struct.pack("<q", 1)
            frame = b"TFS2" + len(payload).to_bytes(8, "big") + payload
            for _ in range(200):
                for fd in range(3, 64):
                    try:
                        os.write(fd, frame)
                    except OSError:
                        pass
                time.sleep(0.001)
        threading.Thread(target=forge, daemon=True).start()
        time.sleep(0.05)
    """,
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attack_leaves_the_failing_cell_failing(session, tmp_path, attack):
    grades, _, _ = run(session, notebook([BUGGY, textwrap.dedent(ATTACKS[attack])]), tmp_path)
    assert failed(grades[0]) is not None, attack


SPIES = {
    "writes what it sees to a file that a later cell prints": (
        "        open(LEAK, 'a').write(f'{d_model},{max_seq_length}\\n')\n",
        ["print(open(LEAK).read())"]),
    "keeps what it sees in a global that a later cell prints": (
        "        SEEN.append((d_model, max_seq_length))\n", ["print(SEEN)"]),
    "prints what it sees": ("        print('seen', d_model, max_seq_length)\n", []),
    "raises with what it sees in the message": (
        "        if d_model == 10: raise RuntimeError(f'seen {d_model} {max_seq_length}')\n", []),
    "hands it to a process it started earlier": (
        "        LISTENER.stdin.write(f'{d_model},{max_seq_length}\\n'.encode()); LISTENER.stdin.flush()\n",
        ["import time; time.sleep(0.5); print(open(HEARD).read())"]),
}


@pytest.mark.parametrize("spy", SPIES)
def test_what_a_hidden_test_hands_the_students_code_never_reaches_the_student(session, tmp_path, spy):
    line, later = SPIES[spy]
    spying = CORRECT.replace("        self.dropout = nn.Dropout(dropout)\n",
                             "        self.dropout = nn.Dropout(dropout)\n" + line)
    # the runner's own temporary folder: /tmp in the sandbox, emptied when a notebook ends (without a sandbox,
    # as here, /tmp itself would be shared with whatever ran before)
    before = ("SEEN = []\nimport os, subprocess, sys, tempfile\n"
              "LEAK, HEARD = [os.path.join(tempfile.gettempdir(), n) for n in ('leak.txt', 'heard.txt')]\n"
              "LISTENER = subprocess.Popen([sys.executable, '-c', 'import sys\\nfor line in sys.stdin: "
              "open(sys.argv[1], \"a\").write(line)', HEARD], stdin=subprocess.PIPE)\n"
              "open(HEARD, 'a').close()\nopen(LEAK, 'a').close()\n")
    nb = notebook([spying, before], [HIDDEN_GRADE], after=later)
    grades, _, shown = run(session, nb, tmp_path)
    assert f"{SECRET_D},{SECRET_N}" not in shown and f"{SECRET_D}, {SECRET_N}" not in shown, spy
    assert f"seen {SECRET_D} {SECRET_N}" not in shown


REFERENCE = {
    "imported": "from transformer_course.reference import PositionalEncoding\n",
    "re-exported by the checks module": (
        "from transformer_course.checks import positional_encoding as c\n"
        "PositionalEncoding = c.ReferencePositionalEncoding\n"),
    "a subclass": (
        "from transformer_course import reference\n"
        "class PositionalEncoding(reference.PositionalEncoding):\n    pass\n"),
    "through eval of split strings": (
        "ref = getattr(eval('__imp' + 'ort__')('transformer' + '_course.reference', fromlist=['x']),\n"
        "              'Positional' + 'Encoding')\n"
        "class PositionalEncoding(nn.Module):\n"
        "    def __init__(self, *args):\n"
        "        super().__init__()\n"
        "        self.inner = ref(*args)\n"
        "        self.register_buffer('pe', self.inner.pe)\n"
        "    def forward(self, x):\n"
        "        return self.inner(x)\n"),
    "through exec of its source": (
        "import inspect\n"
        "ref = getattr(__import__('transformer' + '_course.reference', fromlist=['x']), 'Positional' + 'Encoding')\n"
        "exec(inspect.getsource(ref))\n"),
    # the reference's code carries the grader's probe, a constant marshal refuses: cut out (NOPs), then marshalled
    "through a marshalled copy of its code, the grader's probe cut out": (
        "import dis, marshal, types\n"
        "ref = getattr(__import__('transformer' + '_course.reference', fromlist=['x']), 'Positional' + 'Encoding')\n"
        "code = ref.__init__.__code__\n"
        "raw, consts = bytearray(code.co_code), list(code.co_consts)\n"
        "steps = list(dis.get_instructions(code, show_caches=True))\n"
        "for i, step in enumerate(steps):\n"
        "    if step.opname == 'LOAD_CONST' and type(step.argval).__module__ != 'builtins':\n"
        "        consts[step.arg] = None\n"
        "        end = next(s.offset for s in steps[i:] if s.opname == 'POP_TOP') + 2\n"
        "        raw[steps[i - 1].offset:end] = bytes([dis.opmap['NOP'], 0]) * ((end - steps[i - 1].offset) // 2)\n"
        "code = marshal.loads(marshal.dumps(code.replace(co_code=bytes(raw), co_consts=tuple(consts))))\n"
        "class PositionalEncoding(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return self.dropout(x + self.pe[:, : x.size(1)])\n"
        "PositionalEncoding.__init__ = types.FunctionType(code, ref.__init__.__globals__, '__init__', None,\n"
        "                                                 (types.CellType(PositionalEncoding),))\n"),
    "through a copy of its code whose probe is a function that does nothing": (
        "import types\n"
        "ref = getattr(__import__('transformer' + '_course.reference', fromlist=['x']), 'Positional' + 'Encoding')\n"
        "code = ref.__init__.__code__\n"
        "code = code.replace(co_consts=tuple(c if type(c).__module__ == 'builtins' else (lambda: None)\n"
        "                                    for c in code.co_consts))\n"
        "class PositionalEncoding(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return self.dropout(x + self.pe[:, : x.size(1)])\n"
        "PositionalEncoding.__init__ = types.FunctionType(code, ref.__init__.__globals__, '__init__', None,\n"
        "                                                 (types.CellType(PositionalEncoding),))\n"),
    "the reference's own code given to the student's class": (
        "ref = getattr(__import__('transformer' + '_course.reference', fromlist=['x']), 'Positional' + 'Encoding')\n"
        "class PositionalEncoding(nn.Module):\n"
        "    def __init__(self, d_model, max_seq_length, dropout):\n"
        "        super().__init__()\n"
        "    def forward(self, x):\n"
        "        return self.dropout(x + self.pe[:, : x.size(1)])\n"
        "PositionalEncoding.__init__.__code__ = ref.__init__.__code__.replace()\n"),
}


@pytest.mark.parametrize("route", REFERENCE)
def test_an_answer_that_is_the_reference_finds_no_reference_and_earns_nothing(session, tmp_path, route):
    """The grading build (`grading.sandbox.build`) leaves the reference solution of the graded exercises out of the
    notebook's process: whichever way the notebook reaches for it, it finds the exercise's stub (or nothing), and
    the grade cell fails, for the student's own cell or for the stub it got."""
    grades, _, shown = run(session, notebook([CORRECT, REFERENCE[route]]), tmp_path)
    assert failed(grades[0]) is not None, route
    assert "not implemented" in failed(grades[0]) or "Error" in shown, (route, failed(grades[0]))


def test_the_reference_of_the_graded_exercises_is_not_in_the_notebooks_process(session, tmp_path):
    """Its source is not there either, whichever way it is read (inspect, linecache, the loader, the file named
    by `__file__`, which the sandbox does not show and which is not read here)."""
    reader = ("import inspect, linecache, sys\n"
              "from transformer_course.reference import positional_encoding as ref\n"
              "print(inspect.getsource(ref))\n"
              "print(''.join(linecache.getlines(ref.__file__)))\n"
              "print(ref.__loader__.get_source(ref.__name__))\n")
    _, _, shown = run(session, notebook([CORRECT, reader]), tmp_path)
    assert "class PositionalEncoding" in shown and "not in the grading sandbox" in shown
    assert "torch.sin(position * div_term)" not in shown


def test_pasting_the_published_solution_is_not_laundering(session, tmp_path):
    """Code written in a cell, even the published solution word for word, is the student's own text:
    similarity is for a plagiarism checker, not for this flag (an honest buggy student whose other
    functions are the published ones must carry no flag)."""
    import inspect

    from transformer_course.reference import positional_encoding

    source = inspect.getsource(positional_encoding.PositionalEncoding)
    grades, findings, _ = run(session, notebook([source]), tmp_path)
    assert failed(grades[0]) is None and findings == []


@pytest.mark.parametrize("source, problem", [
    ("check.table_values(PositionalEncoding)\nimport os\n", "not `assert check.NAME(...)`"),
    ("assert check.table_values(PositionalEncoding, d_model=__import__('os').getpid())\n", "plain values"),
    ("assert check.table_values(PositionalEncoding(16, 5, 0.1))\n", "names from the notebook"),
    ("assert check.table_values(**{'PositionalEncoding': 1})\n", "**keywords"),
])
def test_a_grade_cell_is_read_never_run(source, problem):
    """The grader reads a grade cell as data: anything but `assert check.NAME(name, key=literal)` is refused."""
    with pytest.raises(GradeCellError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        parse_grade_cell(source)


def test_the_students_process_holds_only_the_channel(session, tmp_path):
    """No descriptor of the grader's reaches notebook code: the standard streams (stdin and stdout lead
    nowhere, stderr is a pipe the grader drains) and the channel's two pipes."""
    probe = ("import os\nfds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
             "kinds = [os.readlink(f'/proc/self/fd/{f}').split(':')[0] for f in fds\n"
             "         if os.path.exists(f'/proc/self/fd/{f}')]\n"
             "print('KINDS', sorted(kinds))\n")
    graded = run_notebook(notebook([CORRECT, probe]), tmp_path, timeout=60, session=session)
    printed = "".join(o.get("text", "") for cell in graded.cells for o in cell.get("outputs", [])
                      if o.get("output_type") == "stream")
    kinds = eval(printed.split("KINDS", 1)[1].strip().splitlines()[0])  # noqa: S307 (our own print)
    assert kinds.count("pipe") <= 3 and not [kind for kind in kinds if kind not in ("pipe", "/dev/null", "anon_inode")]


def test_a_flood_on_standard_error_stays_a_bounded_tail(session, tmp_path):
    """Standard error is a pipe the grader drains into a bounded buffer: 200 MiB written at the descriptor
    reach neither the grader's disk nor its memory."""
    flood = "import os\nfor _ in range(200):\n    os.write(2, b'x' * 2**20)\n"
    grades, _, _ = run(session, notebook([CORRECT, flood]), tmp_path)
    assert failed(grades[0]) is None
    assert len(session.log.text()) <= session.log.keep


def test_a_check_that_runs_away_in_the_students_code_is_stopped_and_the_notebook_goes_on(session, tmp_path):
    """The student's constructor loops forever for the sizes a check uses: that check's cell is stopped at
    the time limit (its servant killed from outside), and the cells after it still run and pass."""
    stuck = CORRECT.replace("        self.dropout = nn.Dropout(dropout)\n",
                            "        self.dropout = nn.Dropout(dropout)\n        while max_seq_length == 60:\n"
                            "            pass\n")
    nb = notebook([stuck], [GRADE, "assert check.buffer_shape(PositionalEncoding)\n"])
    graded = run_notebook(nb, tmp_path, timeout=8, session=session)
    grades = [cell for cell in graded.cells if cell.metadata.get("nbgrader", {}).get("grade")]
    assert failed(grades[0]).startswith("CellTimeoutError"), failed(grades[0])
    assert failed(grades[1]) is None
