"""Hidden tests whose inputs come from the instructor's secret (`grading.sandbox.hidden_inputs`): the rules
that draw them keep every hidden test valid on the reference solution, the student's code receives the drawn
inputs and never the published ones, the same secret draws the same inputs, and the batch keeps the secret
outside the class folder."""

from __future__ import annotations

import copy
import hashlib
import os
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import nbformat
import pytest
from test_boundary import CHECKS, CORRECT, SECRET_D, SECRET_N, failed, notebook

from conftest import ASSIGNMENTS, ROOT, graded_part, read, solution_path
from quality.examples import write_example_class
from quality.inprocess import run_grade_cells, run_notebook
from transformer_course.grading.classroom.batch import main
from transformer_course.grading.sandbox import executor, hidden_inputs
from transformer_course.grading.sandbox.executor import CheckCall, parse_grade_cell
from transformer_course.grading.sandbox.session import Session

pytestmark = pytest.mark.xdist_group("boundary")
SECRET, OTHER = hashlib.sha256(b"one class").digest(), hashlib.sha256(b"another class").digest()


def call(**kwargs) -> CheckCall:
    return CheckCall("mha_values", ("MultiHeadAttention",), tuple(kwargs.items()))


def test_the_same_secret_draws_the_same_inputs_and_another_secret_others():
    written = call(d_model=24, num_heads=3, batch=2, seq_len=9)
    assert hidden_inputs.draw(written, SECRET, "m:cell:0") == hidden_inputs.draw(written, SECRET, "m:cell:0")
    others = {hidden_inputs.draw(written, secret, "m:cell:0")[0] for secret in (SECRET, OTHER)}
    places = {hidden_inputs.draw(written, SECRET, place)[0] for place in ("m:cell:0", "m:cell:1", "m:other:0")}
    assert len(others) == 2 and len(places) == 3


@pytest.mark.parametrize("number", range(200))
def test_drawn_sizes_keep_what_the_written_ones_promise(number):
    secret = hashlib.sha256(f"secret {number}".encode()).digest()
    written = call(d_model=24, num_heads=3, batch=1, heads=0, q_len=7, k_len=2, src_len=8, tgt_len=8, pad_idx=0,
                   tgt_vocab=9, seed=4, alpha=0.6, sizes=(2, 6))
    drawn = dict(hidden_inputs.draw(written, secret, f"m:c:{number}")[0].kwargs)
    assert (drawn["batch"], drawn["heads"], drawn["pad_idx"], drawn["tgt_vocab"]) == (1, 0, 0, 9)  # edges kept
    assert (drawn["alpha"], drawn["sizes"]) == (0.6, (2, 6))  # not sizes: as written
    assert drawn["d_model"] % drawn["num_heads"] == 0 and drawn["d_model"] % 2 == 0
    sizes = [drawn[name] for name in ("d_model", "num_heads", "q_len", "k_len", "src_len", "tgt_len")]
    assert len(set(sizes)) == len(sizes), drawn  # every two sizes differ (equal as written or not): axes apart
    assert isinstance(drawn["seed"], int)
    assert list(drawn) == list(dict(written.kwargs))


@pytest.mark.parametrize("number", range(100))
def test_a_sequence_is_drawn_shorter_than_the_table_of_positions(number):
    """The free point of issue 40: seq_len drawn equal to max_seq_length let `x + self.pe` (no slice) pass."""
    secret = hashlib.sha256(f"secret {number}".encode()).digest()
    written = CheckCall("forward_adds_encoding", ("PositionalEncoding",),
                        (("d_model", 12), ("max_seq_length", 9), ("seq_len", 9)))
    drawn = dict(hidden_inputs.draw(written, secret, f"m:c:{number}", CHECKS)[0].kwargs)
    assert drawn["seq_len"] < drawn["max_seq_length"] and drawn["d_model"] % 2 == 0


def test_a_checks_own_default_sizes_are_drawn_too():
    """A size the hidden call leaves to the check's default is drawn like a written one (the defaults are
    published too), under the same relations: here the table's 40 positions, longer than the drawn sequence."""
    written = CheckCall("forward_adds_encoding", ("PositionalEncoding",), (("seq_len", 9),))
    draws = [dict(hidden_inputs.draw(written, hashlib.sha256(bytes([n])).digest(), "m:c:0", CHECKS)[0].kwargs)
             for n in range(50)]
    assert all(list(drawn) == ["seq_len", "d_model", "max_seq_length"] for drawn in draws)
    assert all(drawn["seq_len"] < drawn["max_seq_length"] for drawn in draws)
    assert len({drawn["max_seq_length"] for drawn in draws}) > 10


def test_every_hidden_call_of_the_lessons_draws_its_sizes():
    """No hidden call of any lesson falls back to its published sizes: the rules (by name and `RULES`) leave a
    draw for each, for many secrets."""
    kept = []
    for assignment in ASSIGNMENTS:
        solution = read(solution_path(assignment))
        checks = executor.checks_module(solution)
        for grade_id, line, hidden in hidden_inputs.hidden_calls(solution, parse_grade_cell):
            for number in range(40):
                key = hashlib.sha256(f"{assignment} {number}".encode()).digest()
                if not hidden_inputs.draw_explained(hidden, key, f"{checks}:{grade_id}:{line}", checks)[2]:
                    kept.append((assignment, grade_id, hidden.name))
    assert kept == []


def test_no_hidden_call_of_the_lessons_draws_two_of_its_whole_numbers_equal():
    """Issue 40: a hidden call whose draw keeps two of its whole numbers equal (seq_len and max_seq_length, q_len
    and k_len, tgt_len and tgt_vocab, batch and beam_size...) is blind to a mistake that confuses them. Over 40
    secrets, no hidden call of any lesson draws two of its whole numbers (its sizes, the check's own defaults
    and the numbers it keeps as written) equal, 0 and 1 aside (the cases a call is written for)."""
    equal = set()
    for assignment in ASSIGNMENTS:
        solution = read(solution_path(assignment))
        checks = executor.checks_module(solution)
        for grade_id, line, hidden in hidden_inputs.hidden_calls(solution, parse_grade_cell):
            published = {**hidden_inputs.check_defaults(checks, hidden.name), **dict(hidden.kwargs)}
            for number in range(40):
                key = hashlib.sha256(f"equal sizes {assignment} {number}".encode()).digest()
                drawn, _ = hidden_inputs.draw(hidden, key, f"{checks}:{grade_id}:{line}", checks)
                values = {name: value for name, value in {**published, **dict(drawn.kwargs)}.items()
                          if name != "seed" and isinstance(value, int) and not isinstance(value, bool) and value > 1}
                names = sorted(values)
                equal |= {(assignment, grade_id, line, a, b) for index, a in enumerate(names)
                          for b in names[index + 1:] if values[a] == values[b]}
    assert not equal, sorted(equal)


def test_without_a_width_beside_it_the_number_of_heads_is_kept():
    """A check's own default d_model would not be a multiple of a drawn num_heads."""
    for number in range(50):
        drawn = dict(hidden_inputs.draw(call(num_heads=2, batch=3), SECRET, f"m:c:{number}")[0].kwargs)
        assert drawn["num_heads"] == 2


def test_the_secret_file_is_made_once_for_its_owner_only(tmp_path):
    path = tmp_path / "keys" / "class.key"
    secret, created = hidden_inputs.read_or_create(path)
    assert created and len(secret) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert hidden_inputs.read_or_create(path) == (secret, False)
    path.write_text("not a secret")
    with pytest.raises(hidden_inputs.SecretError):
        hidden_inputs.read_secret(path)


RACE = """
import os, sys, time
from pathlib import Path
from transformer_course.grading.sandbox import hidden_inputs
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
secret, created = hidden_inputs.read_or_create(Path(sys.argv[1]))
print(secret.hex(), int(created))
"""


def test_ten_tasks_starting_at_once_make_one_secret(tmp_path):
    """Ten grading tasks of a cluster start at once on a shared folder where the secret is not yet: one makes
    it, and all ten use it (none fails on the file the others made, none reads it half-written)."""
    path, go = tmp_path / "shared" / "hidden-inputs.key", tmp_path / "go"
    tasks = [subprocess.Popen([sys.executable, "-c", RACE, str(path), str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(10)]
    time.sleep(3)  # every task started and waiting
    go.touch()
    found = [task.communicate(timeout=120) for task in tasks]
    assert [task.returncode for task in tasks] == [0] * 10, [error for _, error in found]
    answers = [output.split() for output, _ in found]
    assert len({secret for secret, _ in answers}) == 1 and sum(int(made) for _, made in answers) == 1
    assert hidden_inputs.read_secret(path).hex() == answers[0][0] and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [entry.name for entry in path.parent.iterdir()] == [path.name]  # no task's own file is left


def test_without_hard_links_the_secret_is_still_made_once(tmp_path, monkeypatch):
    """A file system without hard links: the secret is created exclusively; a reader that finds it empty waits for
    the writer instead of refusing it."""
    def no_links(*_arguments):
        raise PermissionError("hard links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "hidden-inputs.key"
    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(lambda _: hidden_inputs.read_or_create(path), range(8)))
    assert len({secret for secret, _ in found}) == 1 and sum(created for _, created in found) == 1
    path.write_text("")
    timer = threading.Timer(0.3, lambda: path.write_text("ab" * 32 + "\n"))
    timer.start()
    assert hidden_inputs.read_or_create(path) == (bytes.fromhex("ab" * 32), False)
    timer.join()


def test_the_secret_is_made_by_a_command_of_its_own(tmp_path, capsys):
    path = tmp_path / "keys" / "class.key"
    assert hidden_inputs.main(["--secret-file", str(path)]) == 0
    made = capsys.readouterr().out
    secret = hidden_inputs.read_secret(path)
    assert hidden_inputs.main(["--secret-file", str(path)]) == 0
    assert made.startswith("made") and capsys.readouterr().out.startswith("found")
    assert hidden_inputs.secret_id(secret) in made and secret.hex() not in made


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_hidden_test_holds_for_the_reference_with_drawn_inputs(assignment, tmp_path):
    """The reference solution passes every grade cell, hidden parts drawn from a secret (scripts/
    check_hidden_draws.py does the same for many secrets), and the secret changes most hidden calls."""
    notebook_ = graded_part(read(solution_path(assignment)))
    hidden = [(cell, call) for cell in notebook_.cells if cell.metadata.get("nbgrader", {}).get("grade")
              for call in parse_grade_cell(cell.source)[1]]
    checks = executor.checks_module(notebook_)
    moved = sum(hidden_inputs.draw(call, SECRET, f"{checks}:{cell.metadata.nbgrader.grade_id}:{line}")[0] != call
                for line, (cell, call) in enumerate(hidden))
    assert hidden and moved >= len(hidden) // 3
    executor.use_secret(SECRET)
    try:
        outcomes = run_grade_cells(notebook_, tmp_path)
    finally:
        executor.use_secret(None)
    assert {grade_id: outcome.message for grade_id, outcome in outcomes.items() if not outcome.passed} == {}


@pytest.fixture(scope="module")
def session():
    environment = {**os.environ, "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg"}
    with Session([CHECKS, "IPython.core.interactiveshell", "torch", "math"], environment=environment) as running:
        yield running


def seen_by_the_students_code(session, tmp_path, secret: bytes | None) -> list[str]:
    """The (d_model, max_seq_length) the hidden part handed the student's constructor (written to a host file:
    this test's zygote has no sandbox), and whether the cell passed. The file is the same for every run (its path
    is part of the code, and the code is part of what the inputs are drawn from)."""
    log = tmp_path.parent / "seen.txt"
    log.unlink(missing_ok=True)
    spy = CORRECT.replace("        super().__init__()\n",
                          f"        super().__init__()\n        open({str(log)!r}, 'a').write(f'{{d_model}},"
                          "{max_seq_length}\\n')\n")
    hidden = ("### BEGIN HIDDEN TESTS\n"
              f"assert check.table_values(PositionalEncoding, d_model={SECRET_D}, max_seq_length={SECRET_N})\n"
              "### END HIDDEN TESTS\n")
    executor.use_secret(secret)
    try:
        graded = run_notebook(notebook([spy], [hidden]), tmp_path, session=session)
    finally:
        executor.use_secret(None)
    grades = [cell for cell in graded.cells if cell.metadata.get("nbgrader", {}).get("grade")]
    assert failed(grades[0]) is None, grades[0].outputs
    return log.read_text().split()


def test_the_students_code_receives_the_drawn_inputs_never_the_published_ones(session, tmp_path):
    published = f"{SECRET_D},{SECRET_N}"
    assert published in seen_by_the_students_code(session, tmp_path / "as_written", None)
    first = seen_by_the_students_code(session, tmp_path / "first", SECRET)
    again = seen_by_the_students_code(session, tmp_path / "again", SECRET)
    other = seen_by_the_students_code(session, tmp_path / "other", OTHER)
    assert published not in first and first == again and first != other, (first, other)


def test_the_batch_keeps_the_secret_outside_the_class_folder(tmp_path, capsys):
    submissions = tmp_path / "downloads"
    write_example_class(ROOT, submissions, "01_positional_encoding", tmp_path / "class", submissions)
    code = main([str(submissions), "--class-dir", str(tmp_path / "class"), "--assignment", "01_positional_encoding",
                 "--secret-file", str(tmp_path / "class" / "secret.key")])
    assert code == 2 and "keep it outside the class folder" in capsys.readouterr().err
    assert not (tmp_path / "class" / "secret.key").exists()


def test_a_notebook_graded_with_its_published_inputs_still_names_its_hidden_tests():
    """nbgrader run on its own (no secret) grades the inputs as written: the lessons' hidden tests stay valid."""
    solution = nbformat.read(solution_path("02_attention"), as_version=4)
    assert any(parse_grade_cell(cell.source)[1] for cell in solution.cells
               if cell.metadata.get("nbgrader", {}).get("grade"))


# --- per submission: the round trip of a leaked hidden size (issue 39, items 3 and 8) ---------------------------

PLACE = f"{CHECKS}:pe_forward_hidden:0"
FORWARD_HIDDEN = next(cell.source for cell in read(solution_path("01_positional_encoding")).cells
                      if cell.metadata.get("nbgrader", {}).get("grade_id") == "pe_forward_hidden")
PUBLISHED = dict(parse_grade_cell(FORWARD_HIDDEN)[1][0].kwargs)  # seq_len 9 = max_seq_length 9, d_model 12


def forward_notebook(code: str) -> nbformat.NotebookNode:
    """Stage 1's forward as graded: the student's class, the visible check, the lesson's hidden cell (its grade id,
    so its place, as in the lesson)."""
    graded = notebook([code], ["assert check.forward_adds_encoding(PositionalEncoding)\n", FORWARD_HIDDEN])
    graded.cells[-1].metadata["nbgrader"]["grade_id"] = "pe_forward_hidden"
    return graded


def drawn_for(student: str, graded: nbformat.NotebookNode, secret: bytes = SECRET) -> dict:
    """The hidden call's keywords as the grader draws them for this student's submission."""
    call = parse_grade_cell(FORWARD_HIDDEN)[1][0]
    key = hidden_inputs.submission_key(secret, student, graded)
    return dict(hidden_inputs.draw(call, key, PLACE, CHECKS)[0].kwargs)


def spying(code: str, log) -> str:
    """`code` whose forward writes the (seq_len, max_seq_length) it is given to `log`: the channel by which a
    student learns a hidden size and tells a classmate. (This test's zygote has no sandbox, so a file is the
    simplest channel; the sandbox closes files, but not the one this stands for: the wall clock, or a student
    who times their own hidden part and says what they saw.)"""
    header = "    def forward(self, x):\n"
    assert code.count(header) == 1  # the spy must be planted, or the test would prove nothing
    return code.replace(header, f"{header}        open({str(log)!r}, 'a').write("
                                "f'{x.size(1)},{self.pe.size(1)}\\n')\n")


def cheating(seq_len: int, comment: str = "") -> str:
    """A forward that is right only for sequences of `seq_len` positions (the slice written as a number the
    student was told): it fails the visible check (7 positions), and passes a hidden call that draws `seq_len`."""
    return CORRECT.replace("self.pe[:, : x.size(1)]", f"self.pe[:, :{seq_len}]") + comment


def cheat_for_its_own_draw(student: str) -> nbformat.NotebookNode:
    """A cheat whose number is the seq_len drawn for its own file (the number is part of the code the draw
    reads: found by trying numbers and comments, which only a holder of the secret can do)."""
    for attempt in range(1000):
        for size in [size for size in range(2, 40) if size != 7]:  # 7: the visible check's length
            graded = forward_notebook(cheating(size, f"# version {attempt}\n"))
            if drawn_for(student, graded)["seq_len"] == size:
                return graded
    raise AssertionError("no file draws its own number")


def grade_as(session, student: str, graded: nbformat.NotebookNode, folder) -> list[str | None]:
    """The failure of each grade cell (None: passed) when `student` hands in `graded`, hidden inputs drawn from
    the class's SECRET."""
    executor.use_secret(SECRET)
    try:
        done = run_notebook(graded, folder, session=session, student=student)
    finally:
        executor.use_secret(None)
    return [failed(cell) for cell in done.cells if cell.metadata.get("nbgrader", {}).get("grade")]


def test_a_hidden_size_one_student_leaks_gains_a_classmate_nothing(session, tmp_path):
    """Alice's hidden part tells what it was given; Bob hard-codes it. Bob's draw is his own: his cheat fails the
    hidden check, and the visible one unless the leaked size is the visible check's own 7. A cheat hard-coded to
    its *own* draw passes the hidden check (the point is at stake), but only someone who holds the secret can
    write it. Honest work passes everything."""
    log = tmp_path / "told.txt"
    alice = forward_notebook(spying(CORRECT, log))
    assert grade_as(session, "alice", alice, tmp_path / "alice") == [None, None]
    told = [tuple(map(int, line.split(","))) for line in log.read_text().split()]
    leaked = drawn_for("alice", alice)
    assert told[-1] == (leaked["seq_len"], leaked["max_seq_length"])  # the hidden part ran last, on her draw
    assert told[-1] != (PUBLISHED["seq_len"], PUBLISHED["max_seq_length"])

    # Bob's draw is independent of Alice's, so it equals hers by chance about once in the range's size (it did in
    # a CI run of 2026-11-29): such a file's cheat would pass by luck, not by the leak, and this test is about the
    # leak. Bob's file is taken as the first of his versions (a comment apart) whose draw differs.
    bob = next(candidate for version in range(50)
               if drawn_for("bob", candidate := forward_notebook(
                   cheating(leaked["seq_len"], f"# version {version}\n" if version else "")))["seq_len"]
               != leaked["seq_len"])
    visible, hidden = grade_as(session, "bob", bob, tmp_path / "bob")
    assert hidden is not None, "the leaked size earned Bob the hidden point"
    assert "hidden test" in hidden
    # Alice's log path is in her code, so her draw changes from run to run; when it is 7 (a CI run of 2026-11-29),
    # Bob's cheat is right for the visible check's 7 positions and passes it, fairly: that point was never hidden.
    assert visible is not None or leaked["seq_len"] == 7

    # the control inside the attack: the same cheat, hard-coded to the draw of its own file, earns the point
    visible, hidden = grade_as(session, "bob", cheat_for_its_own_draw("bob"), tmp_path / "mirror")
    assert visible is not None and hidden is None

    for student in ("alice", "bob"):  # the honest controls
        assert grade_as(session, student, forward_notebook(CORRECT), tmp_path / f"{student}-honest") == [None, None]


def test_a_resubmission_draws_anew_and_a_regrade_draws_the_same(session, tmp_path):
    """What Alice learnt of her hidden part helps her next submission no more than a classmate: any change of
    code draws anew. The same file graded again draws the same sizes and gets the same scores, and so does the
    same code saved again (Windows line endings, trailing spaces, outputs, counts, metadata, markdown)."""
    log = tmp_path / "told.txt"
    alice = forward_notebook(spying(CORRECT, log))
    first = grade_as(session, "alice", alice, tmp_path / "first")
    seen = log.read_text().split()
    assert grade_as(session, "alice", alice, tmp_path / "again") == first == [None, None]
    assert log.read_text().split() == seen + seen  # the regrade saw the same sizes, in the same order

    saved = copy.deepcopy(alice)
    for cell in saved.cells:
        cell.source = cell.source.replace("\n", "   \r\n") + "\r\n\r\n"
        if cell.cell_type == "code":
            cell.execution_count = 7
            cell.outputs = [nbformat.v4.new_output("stream", text="printed\n")]
            cell.metadata["collapsed"] = True
    saved.cells.insert(1, nbformat.v4.new_markdown_cell("My notes, written after the first hand-in."))
    saved.metadata["colab"] = {"provenance": []}
    assert hidden_inputs.code_of(saved) == hidden_inputs.code_of(alice)
    assert drawn_for("alice", saved) == drawn_for("alice", alice)

    # A new draw equals the old one by chance about once in the range's size (Alice's code holds her log's path,
    # so her draw changes from run to run; a CI run of 2026-11-29 drew 7 twice). That the chance is no more than
    # a guess's is test_a_leaked_size_is_worth_no_more_than_a_guess; here the resubmission is the first of its
    # versions (a comment apart) whose draw differs, and the point is that it is then graded on that draw.
    leaked = drawn_for("alice", alice)["seq_len"]
    resubmitted = next(candidate for version in range(50)
                       if drawn_for("alice", candidate := forward_notebook(
                           cheating(leaked, f"# version {version}\n" if version else "")))["seq_len"] != leaked)
    visible, hidden = grade_as(session, "alice", resubmitted, tmp_path / "resubmitted")
    assert hidden is not None  # what she learnt of her hidden part is worth nothing to her next file
    assert visible is not None or leaked == 7  # the visible check is on 7 positions: a leaked 7 passes it, fairly


def test_a_leaked_size_is_worth_no_more_than_a_guess():
    """Over many secrets: the chance that a classmate's draw (the same file handed in under another name, or
    their own) or one's own next submission (one comment added) has the leaked seq_len is that of the best fixed
    guess, and the published value is no better. The draw spans a wide range."""
    secrets_ = [hashlib.sha256(f"class {number}".encode()).digest() for number in range(1500)]
    alice, copied = forward_notebook(CORRECT), forward_notebook(CORRECT)
    own, bobs, again, next_ = [], [], [], []
    for secret in secrets_:
        own.append(drawn_for("alice", alice, secret)["seq_len"])
        bobs.append(drawn_for("bob", copied, secret)["seq_len"])
        again.append(drawn_for("alice", alice, secret)["seq_len"])
        next_.append(drawn_for("alice", forward_notebook(CORRECT + "# tidied\n"), secret)["seq_len"])
    assert own == again  # a regrade draws the same

    def rate(hits: list[bool]) -> float:
        return sum(hits) / len(hits)

    best_guess = max(rate([value == guess for value in bobs]) for guess in set(bobs))
    assert rate([b == a for a, b in zip(own, bobs, strict=True)]) <= best_guess + 0.03
    assert rate([b == a for a, b in zip(own, next_, strict=True)]) <= best_guess + 0.03
    assert rate([value == PUBLISHED["seq_len"] for value in bobs]) <= best_guess
    assert best_guess < 0.15 and min(own) <= 3 and max(own) >= 15 and len(set(own)) >= 14


def test_a_reader_that_catches_the_secret_half_written_waits_for_the_rest(tmp_path):
    """The text read is what is judged: a reader that reads the file empty or half-written, after which the writer
    finishes, reads it again (it once looked at the file's size after the writer had finished and refused what
    it had read)."""
    path = tmp_path / "hidden-inputs.key"
    path.write_text("ab" * 10)
    timer = threading.Timer(0.3, lambda: path.write_text("ab" * 32 + "\n"))
    timer.start()
    assert hidden_inputs.read_or_create(path) == (bytes.fromhex("ab" * 32), False)
    timer.join()
    path.write_text("not a secret")
    started = time.monotonic()
    with pytest.raises(hidden_inputs.SecretError):
        hidden_inputs.read_or_create(path)
    assert time.monotonic() - started < 1  # a file that is no secret is refused at once
