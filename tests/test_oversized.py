"""Oversized and pathological notebooks (issue 19): hundreds of MB of saved outputs, tens of thousands
of cells, JSON nested deeper than a parser goes. Each gets a row with its reason; where its code is
sane it is graded with its outputs left out; none costs a classmate anything or takes minutes.

The limits are lowered through `Limits` so that a few MB show what hundreds of MB do (the same code
path: a file over `whole_bytes` is read by trim.py without its outputs); the realistic 300 MB run is
measured in the README, not here. The checking stage only (`collect`): the real batch command grades
such a notebook in test_submissions.py's class.
"""

import copy
import json
import os
import re
import time

import nbformat
import pytest

from conftest import ASSIGNMENTS, ROOT, read, solution_path, student_path
from transformer_course.grading.classroom.batch import collect
from transformer_course.grading.intake.submissions import Limits, Release, metadata_problems
from transformer_course.grading.intake.trim import TrimError, Trimmer

ASSIGNMENT = "01_positional_encoding"
LIMITS = Limits(file_bytes=6 * 2**20, whole_bytes=256 * 2**10, kept_bytes=512 * 2**10, cells=400, code_cells=200,
                trim_seconds=20)


@pytest.fixture(scope="module")
def release():
    return Release(ROOT / "notebooks", ASSIGNMENTS)


def solution() -> dict:
    return json.loads(solution_path(ASSIGNMENT).read_text(encoding="utf-8"))


def with_output(notebook: dict, output: dict) -> dict:
    """NOTEBOOK with OUTPUT saved in its first code cell."""
    notebook = copy.deepcopy(notebook)
    next(cell for cell in notebook["cells"] if cell["cell_type"] == "code")["outputs"] = [output]
    return notebook


def printed(megabytes: float, lines: bool = False) -> dict:
    text = "tensor([0.1234, 0.5678])\n" * int(megabytes * 2**20 / 25)
    return {"output_type": "stream", "name": "stdout", "text": text.splitlines(keepends=True) if lines else text}


def code_cells(notebook) -> list[str]:
    return [cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            for cell in (notebook.cells if hasattr(notebook, "cells") else notebook["cells"])
            if cell["cell_type"] == "code"]


def write(folder, student: str, content: dict | bytes) -> str:
    relative = f"{student}/{ASSIGNMENT}.ipynb"
    (folder / student).mkdir(parents=True)
    (folder / relative).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return relative


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_pathological_files_get_a_row_each_and_sane_code_is_graded_with_outputs_left_out(tmp_path, release):
    """Beside an honest student: outputs over the size read whole (one string, or a million lines);
    saved outputs nested 100,000 levels deep; a grade cell's metadata nested 100,000 levels deep;
    too many cells; too many code cells; too much code; a file over the size read at all; a large
    file cut short; a large file saved as UTF-16. Every one has a row and a reason in a student's
    words; the first four are graded."""
    honest = write(tmp_path, "ada", solution())
    cases = {
        "olga": with_output(solution(), printed(2)),  # 8 x whole_bytes, one string
        "otto": with_output(solution(), printed(2, lines=True)),  # the same as 80,000 lines
        "nora": json.dumps(with_output(solution(), {"output_type": "execute_result", "metadata": {},
                                                    "execution_count": 1, "data": {"text/plain": "@@"}}))
        .replace('"@@"', deep(100_000)).encode(),
        "gail": json.dumps(solution()).replace('"grade_id": "pe_buffer_shape"',
                                               f'"grade_id": {deep(100_000)}').encode(),
        "manny": {**solution(), "cells": solution()["cells"] + [nbformat.v4.new_markdown_cell("x")] * 400},
        "cody": {**solution(), "cells": solution()["cells"] + [
            {**nbformat.v4.new_code_cell(f"v{n} = {n}"), "id": f"v{n}"} for n in range(250)]},
        "tess": {**solution(), "cells": solution()["cells"] + [nbformat.v4.new_code_cell("x = 1\n" * 100_000)]},
        "huge": with_output(solution(), printed(7)),
        "cut": json.dumps(with_output(solution(), printed(1))).encode()[:-300_000],
        "wide": json.dumps(with_output(solution(), printed(1))).encode("utf-16"),
        "zero": b"",  # made 2 MB of zero bytes below, as a file of holes
    }
    files = {student: write(tmp_path, student, content) for student, content in cases.items()}
    os.truncate(tmp_path / files["zero"], 2 * 2**20)
    started = time.perf_counter()
    students = collect(tmp_path, release, LIMITS)
    seconds = time.perf_counter() - started
    assert set(students) == {"ada", *cases}
    assert students["ada"].submissions[0].status == "ok" and not students["ada"].submissions[0].reasons
    assert students["ada"].submissions[0].relative == honest
    rows = {name: result.submissions for name, result in students.items()}
    assert all(len(found) == 1 and found[0].relative == files.get(name, honest) for name, found in rows.items())
    released = read(student_path(ASSIGNMENT))
    for name in ("olga", "otto", "nora", "gail"):
        [submission] = rows[name]
        assert submission.status == "repaired" and submission.assignment == ASSIGNMENT, (name, submission.reasons)
        assert metadata_problems(released, submission.notebook) == [], name  # nbgrader can grade it
        assert all(not cell.get("outputs") for cell in submission.notebook.cells)
        assert len(submission.digest) == 64
        if name != "gail":  # every code cell of the student's is there, as written
            assert code_cells(submission.notebook) == code_cells(solution()), name
    for name in ("olga", "otto"):
        assert re.search(r"the file is 2\.\d MB, more than the grader reads whole: its saved outputs \(2\.\d MB\) "
                         "were left out and its code was graded", rows[name][0].reasons[0]), rows[name][0].reasons
    assert "nested more deeply than a JSON reader goes" in rows["nora"][0].reasons[0]
    assert any("nested more than 100 levels deep" in reason for reason in rows["gail"][0].reasons)
    assert any("rebuilt from the released notebook" in reason for reason in rows["gail"][0].reasons)
    cells = solution()["cells"]
    written = sum(cell["cell_type"] == "code" and bool("".join(cell["source"]).strip()) for cell in cells)
    expected = {"manny": f"{len(cells) + 400} cells; the grader reads at most 400",
                "cody": f"{written + 250} code cells with code in them",
                "tess": "more than 0.5 MB", "huge": "more than the 6.0 MB the grader reads",
                "cut": "cut short", "wide": "UTF-16", "zero": "zero bytes"}
    for name, reason in expected.items():
        [submission] = rows[name]
        assert submission.status == "rejected" and reason in submission.reasons[0], (name, submission.reasons)
    assert seconds < 60, seconds  # each file alone: its parse or trim.py's seconds


def test_a_file_over_a_gigabyte_is_rejected_without_being_read(tmp_path, release):
    """With the default limits: 1.5 GB of holes (no disk used) is refused by its size alone."""
    os.truncate(tmp_path / write(tmp_path, "gigi", b""), 3 * 2**29)
    started = time.perf_counter()
    [gigi] = collect(tmp_path, release)["gigi"].submissions
    assert time.perf_counter() - started < 10 and gigi.status == "rejected" and gigi.digest == ""
    assert gigi.reasons == ["the file is 1.5 GB, more than the 1.0 GB the grader reads of a notebook (a course "
                            "notebook with its outputs is well under 1 MB)"]


def test_a_file_that_would_take_minutes_to_read_costs_its_time_limit_only(tmp_path, release):
    """Five MB of empty lists in one output: trim.py counts brackets in Python, one step per run of
    them, so a file made of nothing but short runs is its slowest input. The time limit stops it; the
    student beside it is checked as usual."""
    write(tmp_path, "ada", solution())
    slow = json.dumps(with_output(solution(), {"output_type": "stream", "name": "stdout", "text": "@@"}))
    write(tmp_path, "bram", slow.replace('"@@"', "[" + "[]," * (5 * 2**20 // 3) + "[]]").encode())
    started = time.perf_counter()
    students = collect(tmp_path, release, Limits(whole_bytes=2**20, trim_seconds=1))
    assert time.perf_counter() - started < 30
    [bram] = students["bram"].submissions
    assert bram.status == "rejected" and "took more than 1 s" in bram.reasons[0], bram.reasons
    assert students["ada"].submissions[0].status == "ok"


def test_trimming_keeps_every_field_but_outputs_byte_for_byte():
    """What trim.py keeps parses to the same notebook as the whole file with its outputs emptied, for
    every course notebook, written compactly or indented; it refuses what is not one JSON value."""
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")) + sorted((ROOT / "notebooks").glob("*/*.ipynb")):
        whole = json.loads(path.read_bytes())
        for text in (path.read_bytes(), json.dumps(whole, indent=4).encode(), json.dumps(whole).encode()):
            trimmed = json.loads(Trimmer(text, 100, 2**20).trim())
            expected = copy.deepcopy(whole)
            for cell in expected["cells"]:
                cell.update({"outputs": []} if "outputs" in cell else {})
                cell.update({"attachments": {}} if "attachments" in cell else {})
            assert trimmed == {**expected, "metadata": {}}, path
    for broken in (b'{"cells": [', b'{"cells": []} {}', b'{"cells": ["x]}', b'{"cells" []}', b"",
                   b'{"cells": [{"outputs": ["]"}]', b'\xff\xfe{\x00}\x00'):
        with pytest.raises(TrimError):
            Trimmer(broken, 100, 2**20).trim()
