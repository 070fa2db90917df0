"""The checking stage of the batch command against malformed notebooks made mechanically.

The released and the solution notebook of stage 1 are mutated field by field: one field of every
kind at every level (per kind of cell: markdown, plain code, exercise, graded, locked) is deleted
and replaced by a value of each JSON type; a sample of fields also gets a huge string, deep nesting
(within and beyond what a JSON reader accepts) and a lone surrogate; whole files are truncated,
re-encoded (byte-order mark, UTF-16, UTF-32, Windows-1252), corrupted byte by byte, given duplicate
keys, cells and ids, or replaced by other JSON. `collect` must never raise and must give every file
its own row; a file it rejects must say why; a notebook it accepts must be one nbgrader can grade
(valid nbformat, every released nbgrader cell once with its metadata, writable as UTF-8).
Mutations inside one cell, or of the notebook's metadata, must be repaired, never rejected: a value
nested deeper than the JSON reader goes included (it is left out, see `intake/trim.py`).
"""

import copy
import json
import random

import nbformat

from conftest import ASSIGNMENTS, ROOT, read, solution_path, student_path
from transformer_course.grading.classroom.batch import collect
from transformer_course.grading.intake.submissions import Release, metadata_problems

SEED = 9
ASSIGNMENT = "01_positional_encoding"
DELETE = object()
DEEP = "@@deep@@"  # replaced in the JSON text: json.dumps cannot write 100,000 levels
TYPES = {"deleted": DELETE, "null": None, "true": True, "a number": -1.5, "text": "x", "a list": ["x", 1],
         "an object": {"x": {"y": []}}}
EXTRAS = {"a huge string": "A" * 2**18, "600 levels of lists": (DEEP, 600), "100,000 levels of lists": (DEEP, 100_000),
          "a lone surrogate": "\ud800=cmd|' /C calc'!A0"}


def role(cell: dict) -> str:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    for key in ("grade", "solution", "locked"):
        if nbgrader.get(key):
            return key
    return cell["cell_type"]


def fields(value: object, path: tuple = ()) -> list[tuple]:
    """The path of every field below VALUE (keys and list positions)."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    found = []
    for key, child in children:
        found += [(*path, key), *fields(child, (*path, key))]
    return found


def kind(path: tuple, notebook: dict) -> tuple:
    """A field's kind: its path with list positions left out and the cell's role in place of its index."""
    if len(path) >= 2 and path[0] == "cells":
        return ("cells", role(notebook["cells"][path[1]]),
                *("[]" if isinstance(part, int) else part for part in path[2:]))
    return tuple("[]" if isinstance(part, int) else part for part in path)


def replaced(notebook: dict, path: tuple, value: object) -> bytes:
    mutated = json.loads(json.dumps(notebook))  # a deep copy, faster
    parent = mutated
    for part in path[:-1]:
        parent = parent[part]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = DEEP if isinstance(value, tuple) else value
    text = json.dumps(mutated, ensure_ascii=False)
    if isinstance(value, tuple):
        text = text.replace(f'"{DEEP}"', "[" * value[1] + "]" * value[1])
    return text.encode("utf-8", "surrogatepass")


def field_mutations(bases: list[dict], rng: random.Random) -> list[tuple[str, bytes, bool]]:
    """(what, file content, must it be repaired rather than rejected): one field of each kind, from either base."""
    by_kind: dict[tuple, list[tuple[int, tuple]]] = {}
    for number, base in enumerate(bases):
        for path in fields(base):
            by_kind.setdefault(kind(path, base), []).append((number, path))
    mutations = []
    for field_kind in sorted(by_kind, key=str):
        number, path = rng.choice(by_kind[field_kind])
        changes = dict(TYPES)
        if rng.random() < 0.15 or field_kind[-1] in ("source", "grade_id", "cell_type", "id"):
            changes.update(EXTRAS)
        for what, value in changes.items():
            repairable = path != ("cells",)  # a value nested too deeply for the parser is left out (trim)
            mutations.append((f"notebook {number}: {'/'.join(map(str, path))} {what}",
                              replaced(bases[number], path, value), repairable))
    return mutations


def file_mutations(notebook: dict, rng: random.Random) -> list[tuple[str, bytes, bool]]:
    text = json.dumps(notebook, indent=1, ensure_ascii=False)
    raw = text.encode()
    accented = copy.deepcopy(notebook)
    accented["cells"][0]["source"] = "Café crème: é è à ü ß\n" + "".join(accented["cells"][0]["source"])
    grade = next(cell for cell in notebook["cells"] if role(cell) == "grade")
    twice = copy.deepcopy(notebook)
    twice["cells"].insert(0, copy.deepcopy(grade))
    same_ids = copy.deepcopy(notebook)
    for cell in same_ids["cells"]:
        cell["id"] = "same"
    mutations = [
        ("byte-order mark", b"\xef\xbb\xbf" + raw, True),
        ("UTF-16", text.encode("utf-16"), True),
        ("UTF-32 without a byte-order mark", text.encode("utf-32-le"), True),
        ("Windows-1252", json.dumps(accented, ensure_ascii=False).encode("cp1252", "replace"), True),
        ("a grade cell twice", json.dumps(twice).encode(), True),
        ("every cell id the same", json.dumps(same_ids).encode(), True),
        ("duplicate key, real cells last", b'{"cells": [], ' + raw[1:], True),
        ("duplicate key, empty cells last", raw.rstrip()[:-1] + b', "cells": []}', False),
        ("empty file", b"", False), ("only spaces", b" \n\t ", False), ("null", b"null", False),
        ("a list", b"[]", False), ("a number", b"42", False), ("a string", b'"x"', False), ("NaN", b"NaN", False),
        ("NUL bytes", raw[:100] + b"\0" * 64 + raw[100:], False),
        ("random bytes", rng.randbytes(4096), False),
        ("version 3 without worksheets", json.dumps({"nbformat": 3, "worksheets": None}).encode(), False),
        ("version 3, broken worksheets", json.dumps({"nbformat": 3, "worksheets": [{"cells": [1, None]}]}).encode(),
         False),
    ]
    for _ in range(8):
        cut = rng.randrange(len(raw))
        mutations.append((f"truncated at byte {cut}", raw[:cut], False))
    for _ in range(12):
        position = rng.randrange(len(raw))
        flipped = raw[:position] + bytes([raw[position] ^ (1 << rng.randrange(8))]) + raw[position + 1:]
        mutations.append((f"bit flipped at byte {position}", flipped, False))
    return mutations


def test_no_malformed_notebook_stops_the_checking_stage_and_each_gets_a_row(tmp_path):
    rng = random.Random(SEED)
    release = Release(ROOT / "notebooks", ASSIGNMENTS)
    bases = [json.loads(path.read_text(encoding="utf-8"))
             for path in (student_path(ASSIGNMENT), solution_path(ASSIGNMENT))]
    cases = field_mutations(bases, rng) + [case for base in bases for case in file_mutations(base, rng)]
    expected = {}
    for number, (what, content, repairable) in enumerate(cases):
        relative = f"s{number:05d}/{ASSIGNMENT}.ipynb"
        (tmp_path / relative).parent.mkdir()
        (tmp_path / relative).write_bytes(content)
        expected[f"s{number:05d}"] = (what, repairable)

    students = collect(tmp_path, release)

    assert set(students) == set(expected)
    released = read(student_path(ASSIGNMENT))
    rejected = 0
    for student, result in students.items():
        what, repairable = expected[student]
        assert len(result.submissions) == 1, what
        submission = result.submissions[0]
        if submission.status == "rejected":
            rejected += 1
            assert not repairable, f"{what}: rejected ({submission.reasons}) though it can be repaired"
            assert submission.reasons and submission.notebook is None, what
            assert not any("the grader could not check" in reason for reason in submission.reasons), (what, submission)
            continue
        assert submission.assignment == ASSIGNMENT, what
        assert metadata_problems(released, submission.notebook) == [], what  # valid nbformat included
        nbformat.writes(submission.notebook).encode("utf-8")
    assert len(cases) > 500 and 0 < rejected < len(cases) / 4, (len(cases), rejected)
