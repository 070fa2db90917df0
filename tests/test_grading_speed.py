"""What makes grading faster must not change what it decides: the grader reads the checks' titles from
their source (no torch in the grading process) exactly as the imported checks have them; the profile
that scripts/benchmark_grading.py reads is written only when asked for. Cheap: no notebook runs."""

import importlib
import json

import pytest

from conftest import ASSIGNMENTS, read, solution_path
from transformer_course.grading import profiling
from transformer_course.grading.executor import declared_titles, expected_titles
from transformer_course.grading.guard import checks_module, is_grade_cell


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_titles_read_from_the_source_are_those_of_the_imported_checks(assignment):
    notebook = read(solution_path(assignment))
    checks = checks_module(notebook)
    module = importlib.import_module(checks)
    imported = {name: value.check_title for name, value in vars(module).items() if hasattr(value, "check_title")}
    assert declared_titles(checks) == imported
    for cell in notebook.cells:
        if is_grade_cell(cell):
            names = [name for name in imported if f"check.{name}(" in cell.source]
            assert names and set(expected_titles(cell.source, checks)) <= set(imported.values())


def test_a_check_the_source_does_not_declare_is_asked_of_the_module():
    titles = expected_titles("assert check.summary()\n", "transformer_course.checks.attention")
    assert titles == ["check.summary"]


def test_the_profile_is_written_only_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv(profiling.ENVIRONMENT_VARIABLE, raising=False)
    with profiling.phase("ordinary cells"):
        pass
    profiling.dump("ada")
    target = tmp_path / "profile.jsonl"
    monkeypatch.setenv(profiling.ENVIRONMENT_VARIABLE, str(target))
    with profiling.phase("ordinary cells", lambda: 1.0):
        sum(range(1000))
    profiling.dump("ada")
    line = json.loads(target.read_text())
    wall, cpu, count, own = line["phases"]["ordinary cells"]
    assert line["student"] == "ada" and count == 1 and wall >= 0 and cpu >= own >= 0
