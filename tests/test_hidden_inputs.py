"""Hidden tests whose inputs come from the instructor's secret (`grading.sandbox.hidden_inputs`): the rules
that draw them keep every hidden test valid on the reference solution, the student's code receives the drawn
inputs and never the published ones, the same secret draws the same inputs, and the batch keeps the secret
outside the class folder."""

from __future__ import annotations

import hashlib
import os
import stat

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
    assert drawn["src_len"] == drawn["tgt_len"] and drawn["k_len"] < drawn["q_len"] < drawn["tgt_vocab"]
    assert isinstance(drawn["seed"], int)
    assert list(drawn) == list(dict(written.kwargs))


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
    this test's zygote has no sandbox), and whether the cell passed."""
    log = tmp_path / "seen.txt"
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
