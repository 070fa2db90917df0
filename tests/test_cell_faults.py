"""A fault costs only its own cell: outputs the grader does not accept, a flood of output, and checks that run
out of time, graded by the real grader's Execute step (`JudgedExecute`) in a zygote without a sandbox (as in
test_boundary.py). Whatever the student's code does, the other cells still run and pass, and the notebook's
faults (which cell, what happened) reach its row."""

from __future__ import annotations

import pytest
from test_boundary import CORRECT, GRADE, HIDDEN_GRADE, failed, notebook, unsandboxed_session

from quality.inprocess import run_notebook
from transformer_course.grading.sandbox.executor import FINDINGS_KEY

pytestmark = pytest.mark.xdist_group("boundary")


@pytest.fixture(scope="module")
def session():
    with unsandboxed_session() as running:
        yield running


def graded(session, nb, tmp_path, **options):
    result = run_notebook(nb, tmp_path, session=session, **options)
    grades = [cell for cell in result.cells if cell.metadata.get("nbgrader", {}).get("grade")]
    return result, grades, result.metadata.get(FINDINGS_KEY, {}).get("faults", [])


# what the student's code can put into its own cell's outputs: the recorder behind sys.stdout
FORGED = {
    "a display whose data is a list": "{'output_type': 'display_data', 'data': [1, 2], 'metadata': {}}",
    "an output that is a number": "7",
    "an error whose traceback is a number": "{'output_type': 'error', 'ename': 'E', 'evalue': 'v', 'traceback': 3}",
    "a stream of another name": "{'output_type': 'stream', 'name': 'tty', 'text': 'x'}",
    "text that is bytes": "{'output_type': 'stream', 'name': 'stdout', 'text': b'x'}",
}


@pytest.mark.parametrize("forged", FORGED)
def test_outputs_the_grader_does_not_accept_fail_only_their_cell(session, tmp_path, forged):
    attack = f"import sys\nsys.stdout.recorder().outputs.append({FORGED[forged]})\n"
    result, grades, faults = graded(session, notebook([CORRECT, attack, "print('after')"], [GRADE, HIDDEN_GRADE]),
                                    tmp_path)
    attacked = next(cell for cell in result.cells if cell.get("source") == attack)
    assert failed(attacked).startswith("KernelDied") and "not in the grader's format" in failed(attacked)
    after = next(cell for cell in result.cells if cell.get("source") == "print('after')")
    assert after.outputs[0].get("text") == "after\n", after.outputs
    assert [failed(cell) for cell in grades] == [None, None]  # the definitions above were replayed
    assert len(faults) == 1 and "did not finish: crashed" in faults[0], faults


def test_a_notebook_past_its_output_budget_keeps_its_grades_and_its_row_says_so(session, tmp_path):
    flood = "print('y' * 600_000)\n"  # three cells of 0.6 MB each: the second passes a 1 MB budget
    result, grades, faults = graded(session, notebook([CORRECT, flood, flood, flood], [GRADE]), tmp_path,
                                    output_budget_mb=1)
    kept = sum(len(str(output)) for cell in result.cells for output in cell.get("outputs", []))
    assert kept < 1.2 * 2**20
    assert [failed(cell) for cell in grades] == [None]
    assert len(faults) == 1 and "budget of 1 MB at cell 4" in faults[0], faults


def test_checks_out_of_time_cost_their_own_cells_only(session, tmp_path):
    """Five grade cells whose checks loop forever in the student's constructor (each restart of the notebook's
    process is the grader's doing, not a crash of the notebook's) leave the sixth cell, visible and hidden
    part, graded as usual; each stopped cell is named in the faults."""
    stuck = CORRECT.replace("        self.dropout = nn.Dropout(dropout)\n",
                            "        self.dropout = nn.Dropout(dropout)\n        while max_seq_length == 60:\n"
                            "            pass\n")
    result, grades, faults = graded(session, notebook([stuck], [GRADE] * 5 + [HIDDEN_GRADE]), tmp_path, timeout=4)
    assert all(failed(cell).startswith("CellTimeoutError") for cell in grades[:5])
    assert failed(grades[5]) is None and "(hidden test)" in grades[5].outputs[0]["text"]
    assert [fault.split(" did not finish")[0] for fault in faults] == [f"cell {n} (grade_{n - 3})" for n in range(3, 8)]
