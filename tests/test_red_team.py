"""The grader attacked as a motivated student would attack it: each test is one class of attack, and asserts the
safe outcome (it fails while the attack works). Built on tests/test_boundary.py's stage-1 notebooks: a zygote
per module, started without a sandbox, except where the sandbox itself is what is attacked.

An attack that still worked would be marked xfail(strict=True) with the weakness (README, *How a notebook runs,
and who decides* and *What is flagged for review*), so that a fix had to remove its mark; none is marked now.
"""

from __future__ import annotations

import os
import random
import struct
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from nbformat.v4 import new_code_cell
from test_boundary import CHECKS, CORRECT, GRADE, HIDDEN_GRADE, SECRET_D, SECRET_N, failed, notebook, run

from transformer_course.checks.boundary import Frame, StudentError
from transformer_course.grading.sandbox import channel, isolation
from transformer_course.grading.sandbox.session import Servant as ServantProxy
from transformer_course.grading.sandbox.session import ServantFailed, Session, kill_all

pytestmark = pytest.mark.xdist_group("red_team")

SECRET = f"{SECRET_D},{SECRET_N}"
VISIBLE_SIZES = "{(16, 50), (16, 60), (16, 40)}"  # (d_model, max_seq_length) of stage 1's visible checks


def spying(line: str) -> str:
    """The correct PositionalEncoding, whose constructor runs `line` (indented into an `if`) when it is built
    with sizes no visible check uses: the hidden test's."""
    body = textwrap.indent(textwrap.dedent(line).strip("\n"), " " * 12) + "\n"
    return CORRECT.replace("        self.dropout = nn.Dropout(dropout)\n",
                           "        self.dropout = nn.Dropout(dropout)\n"
                           f"        if (d_model, max_seq_length) not in {VISIBLE_SIZES}:\n" + body)


# Notebook code that writes a frame of the grader's channel into every descriptor it may hold (the channel's
# reply pipe among them), as the student's own code may in any process of theirs.
FORGE = textwrap.dedent("""
    import os, struct
    from transformer_course.grading.sandbox import channel as _channel
    def forge(data):
        for fd in range(3, 64):
            try:
                os.write(fd, data)
            except OSError:
                pass
    def frame(payload):
        return b"TFS2" + len(payload).to_bytes(8, "big") + payload
""")


@pytest.fixture(scope="module")
def session():
    environment = {**os.environ, "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg"}
    with Session([CHECKS, "IPython.core.interactiveshell", "torch", "math", "inspect"],
                 environment=environment) as running:
        yield running


# --- 1. the hidden tests' inputs, carried out in the words of a crash ------------------------------------------

LEAKS = {
    # the servant's end, as its runner reports it, is written by the student's code first
    "a forged exit status of the process running the checks": """
        forge(_channel.encode({"op": "servant-exit", "id": 0, "status": f"LEAK {d_model},{max_seq_length}"}))
        os._exit(0)
    """,
    "a forged exit status of the notebook's process": """
        forge(_channel.encode({"op": "runner-exit", "status": f"LEAK {d_model},{max_seq_length}"}))
        os._exit(0)
    """,
    # a refused message is quoted in the grader's error (here: a record kind the grader does not know)
    "a message the grader refuses, quoted in its error": """
        kind = f"LEAK {d_model},{max_seq_length}".encode()
        forge(frame(b"R" + struct.pack("<I", len(kind)) + kind + b"d" + struct.pack("<I", 0)))
        os._exit(0)
    """,
}


@pytest.mark.parametrize("leak", LEAKS)
def test_a_hidden_tests_crash_message_carries_nothing_the_students_code_wrote(session, tmp_path, leak):
    """A hidden part that stops (KernelDied) used to keep its message whole: the exit status the student's
    process reported, or the message it sent that the grader refused. All of it is written by the code that
    had the hidden inputs, so the student read them in the feedback."""
    nb = notebook([spying(LEAKS[leak]), FORGE], [HIDDEN_GRADE])
    grades, _, shown = run(session, nb, tmp_path)
    assert failed(grades[0]) is not None  # the hidden part fails: the student broke it on purpose
    assert "LEAK" not in shown and SECRET not in shown, failed(grades[0])


# --- 2. a student's side that stops reading the grader's requests ------------------------------------------

STALL = textwrap.dedent("""
    import fcntl, os, sys, time
    from transformer_course.grading.sandbox import channel as _channel
    def stall():
        # the request being served: the servant's own frame, a few calls up
        frame = sys._getframe()
        while frame is not None and not (isinstance(frame.f_locals.get("message"), dict)
                                         and frame.f_locals["message"].get("op") == "run"):
            frame = frame.f_back
        if frame is None:
            return
        for fd in range(3, 64):  # the smallest pipes the kernel allows: the grader's next request does not fit
            try:
                fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ
            except OSError:
                pass
        reply = {"op": "result", "id": frame.f_locals["message"]["id"], "value": _channel.Handle(1, "module"),
                 "notes": []}
        data = _channel.encode(reply)
        for fd in range(3, 64):
            try:
                os.write(fd, data)
            except OSError:
                pass
        time.sleep(10**6)  # ... and never read the next one
""")


def test_a_student_who_stops_reading_cannot_hang_the_grader(session, tmp_path):
    """The student's constructor answers the grader's request itself and then sleeps, its pipes shrunk to a
    page: the grader's next request (the dropout check's input, 5 KB) blocked in write() with no time limit,
    and the batch held that student's job slot until the worker's own limit (hours). Now a request left
    unread ends the sandbox after `write_stall`, and one left unanswered costs the cell its time limit (15 s
    here) and the sandbox with it (it shrank the zygote's pipes too): the next cell runs in a new one."""
    stalling = spying("stall()").replace(f"if (d_model, max_seq_length) not in {VISIBLE_SIZES}:", "if dropout == 0.5:")
    nb = notebook([stalling, STALL], ["assert check.dropout_behaviour(PositionalEncoding)\n",
                                      "assert check.buffer_shape(PositionalEncoding)\n"])
    nb.cells.append(new_code_cell("print('after', 6 * 7)"))
    session.write_stall = 3.0
    done = threading.Event()

    def watchdog() -> None:  # keeps a regression from hanging the test suite: it fails instead
        if not done.wait(120) and session.process is not None:
            kill_all(isolation.process_tree(session.process.pid))

    threading.Thread(target=watchdog, daemon=True).start()
    started = time.monotonic()
    try:
        grades, _, shown = run(session, nb, tmp_path, timeout=15)
    finally:
        done.set()
        session.write_stall = 30.0
    assert time.monotonic() - started < 60
    assert failed(grades[0]) is not None
    assert failed(grades[1]) is None and "after 42" in shown  # the notebook went on, in a new sandbox


def test_a_notebook_that_stops_its_zygote_costs_the_next_notebook_nothing(session, tmp_path):
    """A cell sends SIGSTOP to its parent, the zygote: its runner's end was never reported (30 s lost), the
    next notebook's runner was never forked (300 s lost), and the RunnerDied that followed escaped
    JudgedExecute, so every later notebook of the student crashed nbgrader after five minutes."""
    stop = "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n"
    started = time.monotonic()
    run(session, notebook([CORRECT, stop]), tmp_path / "first")
    grades, _, _ = run(session, notebook([CORRECT]), tmp_path / "second")
    assert failed(grades[0]) is None and time.monotonic() - started < 60


# --- 3. bytes on the channel that crash the grader's decoder -------------------------------------------------


def _text(tag: bytes, text: str) -> bytes:
    data = text.encode()
    return tag + struct.pack("<I", len(data)) + data


def _record(kind: str) -> bytes:
    return _text(b"R", kind) + b"d" + struct.pack("<I", 0)


def _tensor(sizes: tuple[int, ...]) -> bytes:
    return b"X" + struct.pack("<BBB", 0, 0, len(sizes)) + struct.pack(f"<{len(sizes)}Q", *sizes)


MALFORMED = {
    "a big integer of Unicode digits": _text(b"I", "²"),
    "a big integer past Python's limit on digits": _text(b"I", "9" * 4500),
    "a big integer with two signs": _text(b"I", "--5"),
    "a tensor with an empty axis and an axis of 2^64 - 1": _tensor((0, 2**64 - 1)),
    "a tensor whose strides overflow": _tensor((0, 2**40, 2**40)),
    "a record of a class reached through torch": _record("transformer_course.checks.framework:torch.nn.Module"),
    "a record of a class defined outside the checks": _record("transformer_course.checks.boundary:dataclass"),
}


def test_the_graders_decoder_refuses_malformed_messages_and_runs_nothing(monkeypatch):
    """The channel promises that a hostile message is refused (ChannelError, which fails only the student's
    cell). Some bytes raised ValueError, TypeError or RuntimeError instead, which escaped `Session.messages`
    and crashed the grader's Execute step; and a record's kind was looked up with getattr through anything a
    checks module imports, so naming `...:torch._dynamo.X` imported torch._dynamo (800 modules) in the judge."""
    for name, payload in MALFORMED.items():
        with pytest.raises(channel.ChannelError):
            channel.decode(payload)
        assert name
    looked_up = []

    def spy(name: str) -> None:
        looked_up.append(name)
        raise AttributeError(name)

    monkeypatch.setattr(torch, "__getattr__", spy, raising=False)
    with pytest.raises(channel.ChannelError):
        channel.decode(_record("transformer_course.checks.framework:torch._dynamo.eval_frame.X"))
    assert looked_up == []
    # the course's own records still cross, and a fuzz of real messages raises nothing but ChannelError
    message = {"op": "raised", "id": 2, "notes": [{"kind": "reference"}],
               "value": (torch.zeros(0, 5, dtype=torch.int64),
               torch.empty(2, 3, device="meta"), torch.float32, 2**70, -1.5, b"xy", None, True, torch.ones(2, 2)),
               "error": StudentError("ValueError", ("ValueError",), "boom", (Frame("f", 1, "g", "x = 1"),), False)}
    data = channel.encode(message)[channel.HEADER:]
    assert channel.decode(data)["error"].frames[0].line == "x = 1"
    generator = random.Random(0)
    for _ in range(3000):
        mutated = bytearray(data)
        for _ in range(generator.randint(1, 3)):
            at = generator.randrange(len(mutated))
            if generator.random() < 0.6:
                mutated[at] = generator.randrange(256)
            else:
                size = generator.choice([0, 2**63, 2**64 - 1, 2**32 - 1, 2**40])
                mutated[at:at + 8] = struct.pack("<Q", size)[:len(mutated[at:at + 8])]
        try:
            channel.decode(bytes(mutated))
        except channel.ChannelError:
            pass


ODD_ERROR = textwrap.dedent("""
    import os, sys
    from transformer_course.checks.boundary import StudentError
    from transformer_course.grading.sandbox import channel as _channel
    def odd_error():
        frame = sys._getframe()
        while frame is not None and not (isinstance(frame.f_locals.get("message"), dict)
                                         and frame.f_locals["message"].get("op") == "run"):
            frame = frame.f_back
        error = StudentError("ValueError", ("ValueError",), "odd", (1, 2), False)  # frames that are not frames
        data = _channel.encode({"op": "raised", "id": frame.f_locals["message"]["id"], "error": error, "notes": []})
        for fd in range(3, 64):
            try:
                os.write(fd, data)
            except OSError:
                pass
        os._exit(0)
""")


def test_a_record_with_odd_fields_fails_the_cell_not_the_grader(session, tmp_path):
    """Records are rebuilt in the grader with whatever fields the student's side sent: an error whose frames
    were numbers made the grader's explanation of the crash raise AttributeError, which escaped run_check,
    the judge and JudgedExecute: nbgrader's Execute step itself crashed on the student's bytes."""
    odd = CORRECT.replace("        self.dropout = nn.Dropout(dropout)\n",
                          "        self.dropout = nn.Dropout(dropout)\n        odd_error()\n")
    nb = notebook([odd, ODD_ERROR], ["assert check.buffer_shape(PositionalEncoding)\n"])
    nb.cells.append(new_code_cell("print('after', 6 * 7)"))
    grades, _, shown = run(session, nb, tmp_path)
    assert failed(grades[0]) is not None and "after 42" in shown


# --- 4. floods that the grader's side paid for ----------------------------------------------------------------


class _Session:
    """What `Servant.run` needs of a session: messages to read, requests written nowhere."""

    def __init__(self, messages: list[dict]) -> None:
        self.pending, self.read = messages, 0

    def send(self, request: dict) -> None:
        pass

    def parts_for(self, module: str, qualname: str) -> tuple:
        return ()

    def messages(self, deadline: float):
        while self.pending:
            self.read += 1
            yield self.pending.pop(0)
        raise TimeoutError


def test_a_flood_of_messages_or_notes_costs_the_grader_nothing():
    """Notes (what the watcher saw) were compared with every note kept so far: two replies of 20,000 forged
    notes each took minutes of the grader's time (600,000 fit in one message: days). And a reply to nothing
    the grader asked was skipped and the next one read, so a student's experiment could keep the grader
    decoding 64-MiB messages until the cell's time ran out, on the grader's CPU, outside the student's cgroup."""
    notes = [[{"kind": "reference", "reference": f"r{part}{i}", "text": "", "digest": ""} for i in range(20_000)]
             for part in range(2)]
    fake = _Session([{"op": "result", "id": 1, "value": 1, "notes": notes[0]},
                     {"op": "result", "id": 2, "value": 2, "notes": notes[1]}])
    servant = ServantProxy(fake, 7, time.monotonic() + 60)
    started = time.monotonic()
    assert servant.run("m", "f", (), {}) == 1 and servant.run("m", "f", (), {}) == 2
    assert time.monotonic() - started < 5 and len(servant.notes) <= 64

    junk = [{"op": "junk", "id": 5, "payload": "x" * 1000} for _ in range(1000)]
    fake = _Session([*junk, {"op": "result", "id": 1, "value": 1, "notes": []}])
    servant = ServantProxy(fake, 7, time.monotonic() + 60)
    with pytest.raises(ServantFailed):
        servant.run("m", "f", (), {})
    assert fake.read == 1  # refused at the first message nobody asked for


# --- 5. the hidden tests' inputs, carried to the student's next notebook --------------------------------------

SPILL = textwrap.dedent("""
    import ctypes, os, tempfile
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    def spill(text, count):
        data = text.encode()
        os.write(2, b"SPILL " + data + b"\\n")  # standard error: the grader keeps its tail for crash messages
        base = tempfile.gettempdir()  # the caches the zygote made there stay for the next notebook
        for name in os.listdir(base):
            if os.path.isdir(os.path.join(base, name)):
                try:
                    with open(os.path.join(base, name, ".spill"), "w") as handle:
                        handle.write(text)
                except OSError:
                    pass
        ident = libc.shmget(0x5EC2E7, 4096, 0o1666)  # System V shared memory outlives its processes
        if ident >= 0:
            ctypes.memmove(libc.shmat(ident, None, 0), data + b"\\0", len(data) + 1)
        for _ in range(count):  # the pid counter of the sandbox's pid namespace
            child = os.fork()
            if child == 0:
                os._exit(0)
            os.waitpid(child, 0)
""")
READ = textwrap.dedent("""
    import ctypes, os, tempfile
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        path = os.path.join(base, name, ".spill")
        if os.path.exists(path):
            print("file:", open(path).read())
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    ident = libc.shmget(0x5EC2E7, 4096, 0)
    if ident >= 0:
        print("shared memory:", ctypes.string_at(libc.shmat(ident, None, 0)).decode())
    print("PID", os.getpid())
""")
@pytest.fixture(scope="module")
def next_notebook():
    """(what a student's second notebook shows, the standard error a crash of it would quote) when their first
    notebook's hidden test spilled its inputs everywhere it could, graded as nbgrader on its own (and the batch
    with --sandbox-per-notebook) grades a student: a sandbox of its own for each notebook
    (`JudgedExecute.sandbox_per_notebook`). The batch's own design, two phases, is tested below."""
    from transformer_course.grading.sandbox.session import grading_environment, sandboxed_launcher

    if isolation.bubblewrap_problem() is not None:
        pytest.skip(isolation.bubblewrap_problem())

    def sandbox() -> Session:
        return Session([CHECKS, "IPython.core.interactiveshell", "torch", "math"],
                       environment=grading_environment(1), launcher=sandboxed_launcher(), warm_up=False)

    with tempfile.TemporaryDirectory() as folder:
        with sandbox() as sandboxed:
            first = notebook([spying("spill(f'SECRET {d_model},{max_seq_length}', d_model * 30 + max_seq_length)"),
                              SPILL], [HIDDEN_GRADE])
            grades, _, _ = run(sandboxed, first, Path(folder) / "first")
            assert failed(grades[0]) is None
        with sandbox() as sandboxed:
            _, _, shown = run(sandboxed, notebook([CORRECT, READ]), Path(folder) / "second")
            return shown, sandboxed.stderr_tail(lines=1000)


def test_a_hidden_tests_inputs_never_reach_the_students_next_notebook(next_notebook):
    """What the first notebook's hidden test wrote (files in the folders the zygote made: torch's and
    matplotlib's caches in /tmp, System V shared memory, the tail of standard error, which the grader quotes
    when the sandbox dies) never shows in the second notebook, whose outputs the student reads."""
    shown, standard_error = next_notebook
    assert "SECRET" not in shown and SECRET not in shown, shown
    assert "SECRET" not in standard_error, standard_error


def test_a_hidden_tests_inputs_never_reach_the_next_notebook_through_counters(next_notebook):
    """The first notebook's hidden test forks d_model * 30 + max_seq_length processes; had the second notebook
    shared its sandbox, its pid, printed, would be that many higher (some 20 without them). Closed by a
    sandbox per notebook, whose pid namespace starts again."""
    shown, _ = next_notebook
    pid = int(shown.split("PID ", 1)[1].split("\\n", 1)[0])
    assert pid < 200, pid


LAST_RUN: dict[str, bool] = {}


def graded_in_phases(sandbox, notebooks: list, folder: Path) -> list:
    """`notebooks` graded as the batch's worker grades a student's notebooks (`worker.Phases`): a sandbox for each
    of them (`sandbox()` makes one), every visible cell first, then the hidden parts. The graded notebooks, in
    order."""
    import copy
    import logging

    from transformer_course.grading.classroom.worker import Phases
    from transformer_course.grading.sandbox import executor

    phases, graded = Phases(), {}
    executor._SESSION_FACTORY[0] = lambda _notebook: sandbox()
    executor.use_gate(phases)
    saved = os.environ.get("NBGRADER_EXECUTION")
    try:
        for number, nb in enumerate(notebooks):
            def grade(number: int = number, nb=nb) -> dict:
                preprocessor = executor.JudgedExecute(timeout=60)
                preprocessor.log = logging.getLogger("phased")
                graded[number] = preprocessor.preprocess(copy.deepcopy(nb), {"cwd": str(folder / str(number))})[0]
                return {"success": True}
            phases.visible(str(number), grade)
        for number in reversed(range(len(notebooks))):
            assert phases.finish(str(number))["success"]
        LAST_RUN["sandboxes left"] = executor._SESSION[0] is not None  # each notebook closes its own at its end
    finally:
        executor.use_gate(None)
        executor.close_session()
        executor._SESSION_FACTORY[0] = None
        if saved is None:
            os.environ.pop("NBGRADER_EXECUTION", None)
    return [graded[number] for number in range(len(notebooks))]


def shown_and_grades(graded) -> tuple[str, list]:
    grades = [cell for cell in graded.cells if cell.metadata.get("nbgrader", {}).get("grade")]
    return "\n".join(repr(cell.get("outputs", [])) for cell in graded.cells if cell.cell_type == "code"), grades


def phased_sandbox() -> Session:
    from transformer_course.grading.sandbox.session import grading_environment, sandboxed_launcher

    if isolation.bubblewrap_problem() is not None:
        pytest.skip(isolation.bubblewrap_problem())
    return Session([CHECKS, "IPython.core.interactiveshell", "torch", "math"], environment=grading_environment(1),
                   launcher=sandboxed_launcher(), warm_up=False).start()


def test_in_phases_a_hidden_tests_inputs_never_reach_the_students_next_notebook(tmp_path):
    """The batch's design: every visible cell first, each notebook in a sandbox of its own. The first notebook's
    hidden test spills its inputs (files, shared memory, standard error, the pid counter) where the second notebook
    looks: it has run by then, in another sandbox, so nothing shows; and the hidden test did run, and passed."""
    first = notebook([spying("spill(f'SECRET {d_model},{max_seq_length}', d_model * 30 + max_seq_length)"), SPILL],
                     [HIDDEN_GRADE])
    second = notebook([CORRECT, READ, "import time\nprint('CLOCK', time.monotonic())"])
    graded = graded_in_phases(phased_sandbox, [first, second], tmp_path)
    shown, _ = shown_and_grades(graded[1])
    assert "SECRET" not in shown and SECRET not in shown, shown
    assert int(shown.split("PID ", 1)[1].split("\\n", 1)[0]) < 200, shown
    _, grades = shown_and_grades(graded[0])
    assert failed(grades[0]) is None and "(hidden test)" in grades[0].outputs[0]["text"], grades[0].outputs
    assert not LAST_RUN["sandboxes left"]


def limited_sandbox() -> Session:
    """A sandbox with a 2 GiB memory limit (for one notebook)."""
    from transformer_course.grading.sandbox.session import grading_environment, sandboxed_launcher

    if isolation.bubblewrap_problem() is not None:
        pytest.skip(isolation.bubblewrap_problem())
    return Session([CHECKS, "IPython.core.interactiveshell", "torch", "math"], environment=grading_environment(1),
                   launcher=sandboxed_launcher(limits=isolation.Limits(memory_bytes=2 * 2**30)),
                   warm_up=False).start()


def test_in_phases_each_notebook_has_its_limits_to_itself(tmp_path):
    """The limits are one notebook's: the first notebook keeps 900 MiB while it waits between the phases, the
    second needs 1,000 MiB for a moment; under a 2 GiB limit each, neither is killed (in one shared sandbox,
    before issue 29, one was, and the worker graded it again alone after the hidden parts: a channel)."""
    first = notebook([CORRECT, "KEEP = b'k' * (900 * 2**20)"], [HIDDEN_GRADE])
    second = notebook([CORRECT, "NEEDED = b'n' * (1000 * 2**20)\ndel NEEDED"], [GRADE])
    graded = graded_in_phases(limited_sandbox, [first, second], tmp_path)
    for nb in graded:
        _, grades = shown_and_grades(nb)
        assert [failed(cell) for cell in grades] == [None], [cell.outputs for cell in grades]
        assert nb.metadata["transformer_course"]["faults"] == []


def test_in_phases_a_hidden_part_that_runs_into_the_limits_gets_no_notebook_graded_again(tmp_path):
    """A hidden part that allocates past the memory limit for one hidden size only (it stands for any hidden
    input) costs its own cell; the notebook beside it is graded as usual, and nothing is graded again (before
    issue 29, the limit counter the kill left in the shared sandbox made the grader regrade a notebook alone,
    after the hidden parts: one bit of the hidden input, shown in that notebook's outputs as the time it ran)."""
    bomb = CORRECT.replace("        self.dropout = nn.Dropout(dropout)\n",
                           "        self.dropout = nn.Dropout(dropout)\n"
                           f"        if max_seq_length == {SECRET_N}:\n"
                           "            bytearray(3 * 2**30)\n")
    first = notebook([CORRECT], [HIDDEN_GRADE])
    second = notebook([bomb], [HIDDEN_GRADE])
    graded = graded_in_phases(limited_sandbox, [first, second], tmp_path)
    _, grades = shown_and_grades(graded[0])
    assert failed(grades[0]) is None, grades[0].outputs
    _, grades = shown_and_grades(graded[1])
    assert failed(grades[0]) is not None and "hidden" in failed(grades[0]), grades[0].outputs


def test_in_phases_the_order_is_what_closes_the_channel(tmp_path):
    """The same two notebooks with the second one's cells run after the first one's hidden test, in one sandbox
    (what the phases prevent): the zygote empties the folders between them, but the pid counter carries the
    inputs (d_model * 30 + max_seq_length forks). The test above would catch the order being lost."""
    from transformer_course.grading.sandbox import executor

    first = notebook([spying("spill(f'SECRET {d_model},{max_seq_length}', d_model * 30 + max_seq_length)"), SPILL],
                     [HIDDEN_GRADE])
    second = notebook([CORRECT, READ])
    sandbox = phased_sandbox()
    try:
        executor._SESSION[0] = sandbox
        executor._SESSION_FACTORY[0] = lambda _notebook: sandbox
        for number, nb in enumerate([first, second]):
            import copy
            import logging

            preprocessor = executor.JudgedExecute(timeout=60, sandbox_per_notebook=False)
            preprocessor.log = logging.getLogger("unphased")
            graded = preprocessor.preprocess(copy.deepcopy(nb), {"cwd": str(tmp_path / str(number))})[0]
    finally:
        executor._SESSION[0], executor._SESSION_FACTORY[0] = None, None
        sandbox.close()
    shown, _ = shown_and_grades(graded)
    assert int(shown.split("PID ", 1)[1].split("\\n", 1)[0]) >= SECRET_D * 30 + SECRET_N, shown


KILL_THE_OTHERS = textwrap.dedent("""
    import os, signal
    mine, killed = {os.getpid(), os.getppid(), 1}, 0
    for entry in os.listdir('/proc'):
        if entry.isdigit() and int(entry) not in mine:
            try:
                if open(f'/proc/{entry}/cmdline', 'rb').read():
                    os.kill(int(entry), signal.SIGKILL)
                    killed += 1
            except OSError:
                pass
    print('KILLED', killed)
""")


def test_in_phases_a_later_notebook_cannot_reach_the_waiting_ones(tmp_path):
    """The second notebook kills every other process it can see: in its own sandbox, none is the first notebook's
    (whose runner and snapshot wait in theirs), so the first notebook's hidden test runs and passes."""
    first = notebook([CORRECT], [HIDDEN_GRADE])
    second = notebook([CORRECT, KILL_THE_OTHERS], [GRADE])
    graded = graded_in_phases(phased_sandbox, [first, second], tmp_path)
    assert "KILLED 0" in shown_and_grades(graded[1])[0]
    for nb in graded:
        _, grades = shown_and_grades(nb)
        assert [failed(cell) for cell in grades] == [None] * len(grades), [cell.outputs for cell in grades]
    _, grades = shown_and_grades(graded[0])
    assert "(hidden test)" in grades[0].outputs[0]["text"]


FORGE_BYTES = textwrap.dedent("""
    import os
    for fd in range(3, 64):  # every pipe this process may write: the channel, standard error
        try:
            if os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:'):
                os.write(fd, b'p' * 16)
        except OSError:
            pass
""")


def test_in_phases_a_notebook_that_writes_into_its_pipes_costs_only_itself(tmp_path):
    """The second notebook writes bytes into every pipe it holds (the channel among them): the grader reads bytes
    that are not messages, its sandbox ends and a new one serves on. That notebook's own cells pay for it; the
    first notebook, waiting in a sandbox of its own, is graded in full, hidden test included (a sandbox dies
    with the thread that started it: the grader starts every sandbox from one thread that lives as long as it
    does, so the first notebook's outlives the thread of the second's)."""
    first = notebook([CORRECT], [HIDDEN_GRADE])
    second = notebook([CORRECT, FORGE_BYTES], [GRADE])
    started = time.monotonic()
    graded = graded_in_phases(phased_sandbox, [first, second], tmp_path)
    assert time.monotonic() - started < 120
    _, grades = shown_and_grades(graded[0])
    assert failed(grades[0]) is None and "(hidden test)" in grades[0].outputs[0]["text"], grades[0].outputs


# --- 6. the reference solution laundered past a watch: not there to be laundered ------------------------------

LAUNDERED = {
    # the checks module re-exports the reference; an ordinary cell is never watched: every table in advance
    "tables computed in an ordinary cell": (
        "R = check.ReferencePositionalEncoding\n"
        "TABLES = {d: R(d, 128, 0.0).pe for d in range(2, 33, 2)}\n"
        "class PositionalEncoding(nn.Module):\n"
        "    def __init__(self, d_model, max_seq_length, dropout):\n"
        "        super().__init__()\n"
        "        self.dropout = nn.Dropout(dropout)\n"
        "        self.register_buffer('pe', TABLES[d_model][:, :max_seq_length].clone())\n"
        "    def forward(self, x):\n"
        "        return self.dropout(x + self.pe[:, : x.size(1)])\n"),
    # an earlier watcher was a trace function of the student's process: one call, spelled past the scan, ended it;
    # the probes in the reference's own code do not depend on tracing
    "tracing switched off by name": (
        "import sys\n"
        "R = check.ReferencePositionalEncoding\n"
        "class PositionalEncoding(nn.Module):\n"
        "    def __init__(self, *args):\n"
        "        getattr(sys, 'set' + 'trace')(None)\n"
        "        super().__init__()\n"
        "        self.inner = R(*args)\n"
        "        self.register_buffer('pe', self.inner.pe)\n"
        "    def forward(self, x):\n"
        "        return self.inner(x)\n"),
    # a forked worker process is watched by nobody
    "the reference run in a process pool": (
        "from concurrent.futures import ProcessPoolExecutor\n"
        "R = check.ReferencePositionalEncoding\n"
        "def table(*args):\n"
        "    return R(*args).pe\n"
        "class PositionalEncoding(nn.Module):\n"
        "    def __init__(self, d_model, max_seq_length, dropout):\n"
        "        super().__init__()\n"
        "        self.dropout = nn.Dropout(dropout)\n"
        "        with ProcessPoolExecutor(1) as pool:\n"
        "            self.register_buffer('pe', pool.submit(table, d_model, max_seq_length, 0.0).result())\n"
        "    def forward(self, x):\n"
        "        return self.dropout(x + self.pe[:, : x.size(1)])\n"),
}


@pytest.mark.parametrize("route", LAUNDERED)
def test_the_reference_laundered_finds_no_reference_and_earns_nothing(session, tmp_path, route):
    """Routes past an earlier design's watch (tables computed in an ordinary cell, tracing switched off, a process
    pool): the grading build leaves the reference of the graded exercises out of the notebook's process, so each
    finds only the exercise's stub, and neither the visible nor the hidden part of the grade cell passes."""
    handed_in = notebook(["", LAUNDERED[route]], [HIDDEN_GRADE])
    grades, _, _ = run(session, handed_in, tmp_path)
    assert all(failed(cell) is not None for cell in grades), (route, [cell.outputs for cell in grades])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
