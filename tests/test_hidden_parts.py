"""Hidden parts that cannot talk, and one deadline per notebook (issue 39), graded by the real grader's Execute step
(`JudgedExecute`) in a zygote without a sandbox, as in test_boundary.py (tests/test_hostile_fourth.py grades the
same attacks through the batch command, sandboxed).

The student's PositionalEncoding is correct; what it does when it is built with sizes no visible check uses (a
hidden part's) is the attack: leave a note in TMPDIR for the next hidden part, stop its process, sleep past the
cell's time, or end the notebook's own process.
"""

from __future__ import annotations

import textwrap

import pytest
from test_boundary import CORRECT, failed, notebook, unsandboxed_session

from quality.inprocess import run_notebook
from transformer_course.grading.sandbox.executor import FINDINGS_KEY, HIDDEN_FAILED

pytestmark = pytest.mark.xdist_group("boundary")

VISIBLE_SIZES = "{(16, 50), (16, 60), (16, 40)}"  # (d_model, max_seq_length) of stage 1's visible checks


def hidden(d_model: int, max_seq_length: int) -> str:
    """A grade cell whose hidden part builds the module with these sizes."""
    return ("assert check.table_values(PositionalEncoding)\n### BEGIN HIDDEN TESTS\n"
            f"assert check.table_values(PositionalEncoding, d_model={d_model}, max_seq_length={max_seq_length})\n"
            "### END HIDDEN TESTS\n")


HIDDEN_SIZES = [(10, 23), (12, 30), (14, 31), (18, 27)]


def attacking(body: str) -> str:
    """The correct PositionalEncoding, whose constructor runs `body` when a hidden part builds it."""
    body = textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 12) + "\n"
    return CORRECT.replace("        self.dropout = nn.Dropout(dropout)\n",
                           "        self.dropout = nn.Dropout(dropout)\n"
                           f"        if (d_model, max_seq_length) not in {VISIBLE_SIZES}:\n" + body)


@pytest.fixture(scope="module")
def session():
    with unsandboxed_session() as running:
        yield running


def graded(session, cells, tmp_path, **options):
    result = run_notebook(notebook(cells, [hidden(*sizes) for sizes in HIDDEN_SIZES]), tmp_path, session=session,
                          **options)
    grades = [cell for cell in result.cells if cell.metadata.get("nbgrader", {}).get("grade")]
    return grades, result.metadata.get(FINDINGS_KEY, {}).get("faults", [])


def test_a_hidden_part_reads_nothing_another_one_wrote(session, tmp_path):
    """The first hidden part leaves its size in TMPDIR; a later one that finds a note there fails. Each hidden part
    starts with the sandbox's writable folders emptied by the grader, so every one passes."""
    note = """
        import os, tempfile
        path = os.path.join(tempfile.gettempdir(), 'note')
        if os.path.exists(path):
            raise ValueError('received ' + open(path).read())
        with open(path, 'w') as note:
            note.write(str(max_seq_length))
    """
    grades, faults = graded(session, [attacking(note)], tmp_path)
    assert [failed(cell) for cell in grades] == [None] * len(HIDDEN_SIZES), [failed(cell) for cell in grades]
    assert faults == []


def test_stopped_timed_out_and_failed_hidden_parts_read_the_same(session, tmp_path):
    """One hidden part stops its process, one runs out of time, one fails its check: the student's code chose each
    outcome, so each reads the same (a hidden part says pass or fail, nothing else); the instructor's faults say
    what happened."""
    outcomes = """
        import os, time
        if max_seq_length == 23:
            os._exit(0)
        if max_seq_length == 30:
            time.sleep(10 ** 6)
        if max_seq_length == 31:
            raise ValueError('failed on purpose')
    """
    grades, faults = graded(session, [attacking(outcomes)], tmp_path, timeout=5)
    errors = [failed(cell) for cell in grades]
    assert errors[3] is None, errors  # the fourth hidden part, untouched by the attack, passes
    assert len(set(errors[:3])) == 1, errors  # the same grade cell's check: the same title, the same words
    assert errors[0] == f"CheckFailed: ✘ {title(grades[0])} (hidden test): {HIDDEN_FAILED}", errors[0]
    assert [fault.split(" did not finish: ")[1] for fault in faults] == [
        "stopped: the process running your code for its checks ended (hidden tests)",
        "ran longer than 5 s and was stopped (hidden tests)"], faults


def title(cell) -> str:
    return cell.outputs[0]["text"].splitlines()[0].removeprefix("✔ ")  # the visible part's verdict line


def counting(session, monkeypatch) -> list[str]:
    """Every cell source the session runs, in order (a replay runs the clean cells above again)."""
    ran: list[str] = []
    run_cell = session.run_cell

    def counted(source, timeout):
        ran.append(source)
        return run_cell(source, timeout)

    monkeypatch.setattr(session, "run_cell", counted)
    return ran


SLEEPING = "import time\ntime.sleep(1)\n"  # a cell that a replay would run again


def test_a_hidden_part_that_ends_the_notebooks_process_fails_the_rest_without_a_replay(session, tmp_path, monkeypatch):
    """Each hidden part ends the notebook's process (its runner: unsandboxed, the test kills no more than that). It
    used to buy a replay of every clean cell, sleeps included, uncounted; now the hidden parts after it fail."""
    ran = counting(session, monkeypatch)
    ending = "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(60)"
    grades, faults = graded(session, [attacking(ending), SLEEPING], tmp_path)
    assert ran.count(SLEEPING) == 1, len(ran)  # run once, never replayed
    assert all(failed(cell).startswith("CheckFailed: ✘") for cell in grades), [failed(cell) for cell in grades]
    ended = [fault for fault in faults if "an earlier hidden test of this notebook ended" in fault]
    assert len(ended) == len(HIDDEN_SIZES) - 1, faults


def test_replays_count_against_the_notebooks_one_deadline(session, tmp_path, monkeypatch):
    """Each hidden part sleeps past its cell's time: the grader ends the sandbox and replays the notebook (a 3-second
    sleep among its cells), which used to happen after every hidden part but the last, each replay uncounted: the
    sleep ran four times. One deadline now covers the notebook's cells, its replays and its hidden parts (20 s here,
    which the sleeps and the stopped parts fill during the third replay): what has not run by then is not run, and
    fails. A cell may run 5 s, so the 3-second sleep itself is never stopped, however loaded the machine (with 3 s
    it was, once in CI, and the notebook never reached its deadline)."""
    ran = counting(session, monkeypatch)
    sleeping = "import time\ntime.sleep(3)\n"
    grades, faults = graded(session, [attacking("import time\ntime.sleep(10 ** 6)"), sleeping], tmp_path,
                            timeout=5, notebook_timeout=20)
    assert ran.count(sleeping) < len(HIDDEN_SIZES), len(ran)
    assert all(failed(cell) is not None for cell in grades), [failed(cell) for cell in grades]
    assert any("the notebook's 20 s in all had run out" in fault for fault in faults), faults


def test_cells_after_the_deadline_are_not_run(session, tmp_path):
    grades, faults = graded(session, [CORRECT, "import time\ntime.sleep(4)\n"], tmp_path, notebook_timeout=2)
    assert all(failed(cell) == "NotRun: not run: the notebook had run for more than 2 s in all" for cell in grades)
    assert any("was stopped: the notebook's 2 s in all had run out" in fault for fault in faults), faults
