"""Derived, not dictated: from stage 1 on, no line of an exercise's solution stands in the student's notebook in the
open (prose, inline code, given code, comments); help comes as hints folded away in `<details>` blocks, and the
scaffolding fades (stage 7's beam search is given as its contract and its checks only)."""

from __future__ import annotations

import re

import nbformat
import pytest

from conftest import ASSIGNMENTS, ROOT
from quality import dictation

DETAILS = re.compile(r"<details\b.*?</details>", re.DOTALL | re.IGNORECASE)


def _release(assignment: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)


def test_no_solution_line_stands_in_the_open_in_any_student_notebook():
    found = dictation.dictated()
    assert not found, "solution lines students can read without opening a hint:\n" + "\n".join(
        f"  {item.stage} (solves {item.solution_stage}): {item.line}" for item in found)


def test_the_measure_finds_a_dictated_line_and_ignores_it_inside_a_folded_hint(tmp_path):
    """The measure itself can fail: a solution line written into the prose is found, the same line in a hint is not."""
    for folder in ("lessons", "solutions", "notebooks"):
        (tmp_path / folder).mkdir()
    for name in ("00_zero", "01_one"):
        (tmp_path / "lessons" / f"{name}.py").write_text("")
    solution = nbformat.v4.new_notebook()
    exercise = nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n"
                                         "    return torch.softmax(x, dim=-1)  # rows\n    ### END SOLUTION")
    exercise.metadata["nbgrader"] = {"solution": True, "grade": False}
    solution.cells = [exercise]
    for name in ("00_zero", "01_one"):
        (tmp_path / "solutions" / name).mkdir()
        (tmp_path / "notebooks" / name).mkdir()
        nbformat.write(solution, tmp_path / "solutions" / name / f"{name}.ipynb")
    release = nbformat.v4.new_notebook()

    def released(text: str) -> list[dictation.Dictated]:
        release.cells = [nbformat.v4.new_markdown_cell(text)]
        for name in ("00_zero", "01_one"):
            nbformat.write(release, tmp_path / "notebooks" / name / f"{name}.ipynb")
        return dictation.dictated(root=tmp_path)

    assert [item.line for item in released("Write `torch.softmax( x, dim = -1 )` here.")] == [
        "return torch.softmax(x, dim=-1)  # rows"]
    assert released("<details><summary>Hint 3</summary>\n\n`torch.softmax(x, dim=-1)`\n\n</details>") == []


def _exercises(notebook: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(cell id, the markdown a student reads from the previous exercise to this one's first check cell) per code
    exercise (a bug hunt's hints follow its broken code and the symptoms it shows)."""
    found, prose, pending = [], [], None
    for cell in notebook.cells:
        nbgrader = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "markdown":
            prose.append(cell.source)
        elif nbgrader.get("solution") and "def predict_" not in cell.source:  # a stub or a bug hunt
            pending = cell.id
        elif nbgrader.get("grade") and pending is not None:
            found.append((pending, "\n".join(prose)))
            prose, pending = [], None
    return found


@pytest.mark.parametrize("assignment", [name for name in ASSIGNMENTS if "01" <= name[:2] <= "06"])
def test_every_exercise_of_stages_1_to_6_has_folded_hints_before_it(assignment):
    for cell_id, prose in _exercises(_release(assignment)):
        hints = DETAILS.findall(prose)
        assert hints, f"{assignment}: exercise {cell_id} has no folded hint"
        assert all(re.search(r"<summary>", hint) for hint in hints)


def test_stage_7_gives_beam_search_as_its_contract_and_checks_only():
    """Scaffolding fades: the hints of the beam-search exercises hold no code."""
    exercises = dict(_exercises(_release("07_fast_and_better_decoding")))
    for cell_id, prose in exercises.items():
        if "beam" not in cell_id:
            continue
        for hint in DETAILS.findall(prose):
            assert "`" not in hint and "```" not in hint, f"{cell_id}: a hint with code: {hint[:200]}"
