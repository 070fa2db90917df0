"""An honest class: three students who wrote every exercise of every stage themselves, each in a style of their own.

The checks promise two things to honest work: right code written differently passes every check, and no honest
student is flagged for review. This class measures both on code the course did not write for its checks:

    annotated   in the style of Harvard NLP's "The Annotated Transformer": its attention helper, sublayers passed
                as lambdas to a residual helper, comprehensions over zip(layers, inputs), einsum where it
                reads naturally, its `rate` schedule and `greedy_decode`
    tutorial    in the style of the PyTorch tutorials and d2l.ai: reshape/permute, `torch.where` masks with -inf,
                `F.` functional calls, d2l's heads folded into the batch axis for `torch.bmm`, its add & norm
                and hand-written gradient clipping
    prose       a careful student who worked from the lesson's prose alone: explicit loops over positions, heads,
                key positions, layers, sentences and beams, hand-written softmax, 0/1 masks, tensors allocated
                and filled in place

The constructors are given (the lessons ask to keep them), so the styles differ in the code of the stubs and in
the helpers a student adds at the top of a cell.

Each style is a package with one module per stage (named like the stage's checks module) whose `ANSWERS` maps an
exercise cell's id to an `Answer`: the code that replaces each `# YOUR CODE HERE / raise NotImplementedError()`
stub of that cell, in order, and the helpers the student put at the top of the cell. Nothing else of the
release notebook changes: `student_notebook` builds the student's notebook from the release, as nbgrader's
students hand it in. None of this code was taken from the course's reference solutions or copied from public
code; `tests/test_honest_class.py` grades it.
"""

from __future__ import annotations

import copy
import importlib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import nbformat

from quality.mistakes import is_solution

STYLES = ("annotated", "tutorial", "prose")

# The stage's checks module (transformer_course.checks.<name>) for each assignment, and so the module of each style.
STAGES = {
    "00_why_attention": "why_attention",
    "01_positional_encoding": "positional_encoding",
    "02_attention": "attention",
    "03_blocks": "blocks",
    "04_transformer": "model",
    "05_training": "training",
    "06_decoding": "decoding",
    "07_fast_and_better_decoding": "fast_decoding",
}

STUB = re.compile(r"^(?P<indent>[ \t]*)# YOUR CODE HERE\n(?P=indent)raise NotImplementedError\(\)[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class Answer:
    """One exercise cell as a student completed it.

    stubs: the code that replaces each stub of the cell, in order (written without indentation: it is indented
    to the stub's own); helpers: code the student added at the top of the cell (imports, helper functions);
    fixes: for a bug hunt (a cell given broken), the student's repairs; a bug hunt may also leave a stub."""

    stubs: tuple[str, ...] = ()
    helpers: str = ""
    fixes: tuple[tuple[str, str], ...] = ()  # a bug hunt: (broken text, the student's repair), each found once

    def fill(self, source: str) -> str:
        """The cell's released source with every stub replaced by the student's code (a bug hunt's broken code
        repaired)."""
        if self.fixes:
            for broken, repaired in self.fixes:
                if source.count(broken) != 1:
                    raise ValueError(f"the bug hunt's text {broken!r} must occur once in the cell")
                source = source.replace(broken, repaired)
        places = list(STUB.finditer(source))
        if len(places) != len(self.stubs):
            raise ValueError(f"the cell has {len(places)} stubs, the answer fills {len(self.stubs)}")
        filled, end = [], 0
        for place, code in zip(places, self.stubs, strict=True):
            body = textwrap.indent(textwrap.dedent(code).strip("\n"), place.group("indent"))
            filled += [source[end:place.start()], body]
            end = place.end()
        filled.append(source[end:])
        text = "".join(filled)
        helpers = textwrap.dedent(self.helpers).strip("\n")
        return f"{helpers}\n\n\n{text}" if helpers else text


def answers(style: str, assignment: str) -> dict[str, Answer]:
    """{exercise cell id: the student's answer} of one style and stage."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; the styles are {STYLES}")
    return importlib.import_module(f"quality.honest.{style}.{STAGES[assignment]}").ANSWERS


def student_notebook(style: str, assignment: str, release: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The release notebook with every exercise cell completed by the student of `style`; every other cell as
    released. Fails when an exercise cell has no answer or an answer has no cell: the class must stay complete."""
    notebook = copy.deepcopy(release)
    given = answers(style, assignment)
    exercises = [cell for cell in notebook.cells if cell.cell_type == "code" and is_solution(cell)]
    missing = {cell.get("id") for cell in exercises} ^ set(given)
    if missing:
        raise ValueError(f"{style} {assignment}: exercise cells and answers differ: {sorted(missing)}")
    for cell in exercises:
        cell.source = given[cell.id].fill(cell.source)
    return notebook


def with_hidden_tests(notebook: nbformat.NotebookNode, source: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook as nbgrader's autograde runs it: every grade cell's source put back from the source notebook
    (solutions/), hidden tests included, matched by grade id (what nbgrader's OverwriteCells does)."""
    graded = copy.deepcopy(notebook)
    sources = {cell.metadata["nbgrader"]["grade_id"]: cell.source for cell in source.cells
               if cell.cell_type == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("grade")}
    for cell in graded.cells:
        nbgrader = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and nbgrader.get("grade"):
            cell.source = sources[nbgrader["grade_id"]]
    return graded


def release_path(root: Path, assignment: str) -> Path:
    return root / "notebooks" / assignment / f"{assignment}.ipynb"


def write_class(root: Path, folder: Path, assignments: list[str] | None = None) -> list[Path]:
    """Write every honest student's notebooks as `folder/<style>/<assignment>.ipynb` (a downloads folder the batch
    grader accepts: one folder per student); returns the paths written."""
    written = []
    for style in STYLES:
        for assignment in assignments or list(STAGES):
            release = nbformat.read(release_path(root, assignment), as_version=4)
            path = folder / style / f"{assignment}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(student_notebook(style, assignment, release), path)
            written.append(path)
    return written


__all__ = ["STAGES", "STUB", "STYLES", "Answer", "answers", "release_path", "student_notebook", "with_hidden_tests",
           "write_class"]
