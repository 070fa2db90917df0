"""Find, identify, check and repair student notebooks as they come from Colab or an LMS.

Accepted layouts of the submissions folder:

    submissions/<student>/<any name>.ipynb          one folder per student
    submissions/<student>_<assignment>.ipynb       flat files; Canvas-style names such as
    submissions/smithjo_12345_67890_02_attention.ipynb   are understood too

Which assignment a notebook is comes from its content (nbgrader ids, then the title), so names
like "Copy of 02_attention (1).ipynb" are fine. Each notebook is then checked against the
released version: valid JSON and nbformat, every graded, locked and exercise cell present once
with its nbgrader metadata. A notebook that fails the check is rebuilt from the release, with the
student's answers put back where they belong (cells are aligned by content), and every repair is
reported, so nothing is scored zero in silence. Originals are never modified.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

from transformer_course.grading.guard import suspicious_code

_GRADED_KEYS = ("grade", "solution", "locked", "points", "task")  # what nbgrader grades by
_NOISE = {"copy", "of", "late", "submission", "ipynb"}


@dataclass
class Submission:
    student: str
    assignment: str | None
    path: Path
    notebook: nbformat.NotebookNode | None = None
    status: str = "ok"  # ok | repaired | rejected
    reasons: list[str] = field(default_factory=list)


def nbgrader_metadata(cell: nbformat.NotebookNode) -> dict:
    metadata = cell.get("metadata", {}).get("nbgrader", {})
    return metadata if isinstance(metadata, dict) else {}


def _grade_id(cell: nbformat.NotebookNode) -> str | None:
    return nbgrader_metadata(cell).get("grade_id")


def _title(notebook: nbformat.NotebookNode) -> str | None:
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            match = re.search(r"^# (Stage \d+)\b", cell.source, re.MULTILINE)
            if match:
                return match.group(1)
    return None


def student_name(text: str) -> str:
    """A safe student id from a folder or file name: lower case, [a-z0-9_.-]."""
    tokens = [t for t in re.split(r"[^A-Za-z0-9.]+", text.lower()) if t and t not in _NOISE and not t.isdigit()]
    return "_".join(tokens).strip(".") or "unknown"


class Release:
    """The released student notebooks: the reference every submission is checked against."""

    def __init__(self, folder: Path, assignment_ids: list[str]) -> None:
        self.notebooks = {a: nbformat.read(folder / a / f"{a}.ipynb", as_version=4) for a in assignment_ids}
        owners: dict[str, set[str]] = {}
        for assignment, notebook in self.notebooks.items():
            for cell in notebook.cells:
                if _grade_id(cell):
                    owners.setdefault(_grade_id(cell), set()).add(assignment)
        # only ids that belong to one assignment tell assignments apart ("setup" is in all of them)
        self.by_grade_id = {grade_id: next(iter(found)) for grade_id, found in owners.items() if len(found) == 1}
        self.by_title = {_title(nb): a for a, nb in self.notebooks.items()}

    def identify(self, notebook: nbformat.NotebookNode, name: str) -> str | None:
        """The assignment a notebook belongs to: by its course cells, else its title, else its file name."""
        votes = Counter(self.by_grade_id[_grade_id(cell)] for cell in notebook.cells
                        if _grade_id(cell) in self.by_grade_id)
        if votes:
            return votes.most_common(1)[0][0]
        if _title(notebook) in self.by_title:
            return self.by_title[_title(notebook)]
        matches = [a for a in self.notebooks if a in name]
        return matches[0] if len(matches) == 1 else None


def discover(folder: Path) -> list[tuple[str, Path]]:
    """(student, path) for every notebook in the submissions folder (checkpoints ignored)."""
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") or part == "__MACOSX" for part in relative.parts):
            continue
        if len(relative.parts) > 1:
            found.append((student_name(relative.parts[0]), path))
        else:
            found.append((path.stem, path))  # flat: the name is cleaned once the assignment is known
    return found


def load(release: Release, student: str, path: Path, flat: bool) -> Submission:
    """Read, identify, check and if needed repair one notebook."""
    submission = Submission(student, None, path)
    try:
        text = path.read_text(encoding="utf-8")
        notebook = nbformat.reads(text, as_version=4)
    except UnicodeDecodeError:
        return _reject(submission, "the file is not text (is it really a .ipynb notebook?)")
    except (json.JSONDecodeError, nbformat.reader.NotJSONError) as error:
        return _reject(submission, f"not a valid notebook: the JSON is broken ({str(error)[:120]})")
    except Exception as error:  # nbformat raises several types for structurally wrong files
        return _reject(submission, f"not a valid notebook: {type(error).__name__}: {str(error)[:120]}")
    assignment = release.identify(notebook, path.name)
    if assignment is None:
        return _reject(submission, "cannot tell which assignment this notebook is (no course cells or title found)")
    submission.assignment = assignment
    if flat:
        submission.student = student_name(path.stem.replace(assignment, " "))
    problems = metadata_problems(release.notebooks[assignment], notebook)
    if problems:
        notebook, lost = rebuild(release.notebooks[assignment], notebook)
        submission.status = "repaired"
        submission.reasons += [f"{assignment}: {problem}" for problem in problems[:3]]
        submission.reasons.append(f"{assignment}: rebuilt from the released notebook with the student's answers")
        submission.reasons += [f"{assignment}: {item}" for item in lost]
    findings = suspicious_code(notebook, release.notebooks[assignment])
    submission.reasons += [f"{assignment}: flagged for review: {finding}" for finding in findings[:3]]
    if len(findings) > 3:
        submission.reasons.append(f"{assignment}: flagged for review: {len(findings) - 3} more such lines")
    submission.notebook = notebook
    return submission


def _reject(submission: Submission, reason: str) -> Submission:
    submission.status = "rejected"
    submission.reasons.append(reason)
    return submission


def metadata_problems(released: nbformat.NotebookNode, notebook: nbformat.NotebookNode) -> list[str]:
    """What is missing or altered among the nbgrader cells ([] when nbgrader can grade it as is)."""
    problems = []
    try:
        nbformat.validate(notebook)
    except nbformat.ValidationError as error:
        problems.append(f"notebook format is invalid ({error.message[:80]})")
    theirs: dict[str, list[dict]] = {}
    for cell in notebook.cells:
        if _grade_id(cell):
            theirs.setdefault(_grade_id(cell), []).append(nbgrader_metadata(cell))
    for cell in released.cells:
        grade_id = _grade_id(cell)
        if not grade_id:
            continue
        copies = theirs.get(grade_id, [])
        if not copies:
            problems.append(f"cell '{grade_id}' is missing or lost its nbgrader metadata")
        elif len(copies) > 1:
            problems.append(f"cell '{grade_id}' appears {len(copies)} times")
        elif any(copies[0].get(key) != nbgrader_metadata(cell).get(key) for key in _GRADED_KEYS):
            problems.append(f"cell '{grade_id}' has altered nbgrader metadata")
    return problems


def _key(cell: nbformat.NotebookNode) -> tuple[str, str]:
    return cell.cell_type, "\n".join(line.rstrip() for line in cell.source.strip().splitlines())


def rebuild(
    released: nbformat.NotebookNode, notebook: nbformat.NotebookNode
) -> tuple[nbformat.NotebookNode, list[str]]:
    """The released notebook with the student's answers in its exercise cells.

    Cells are aligned by content: released cells the student left alone match exactly; a run of
    student cells standing where a released exercise cell stands is that exercise's answer;
    other student cells are kept as extra cells. Returns the notebook and what could not be found.
    """
    result = nbformat.from_dict(json.loads(json.dumps(released)))
    ours, theirs = [_key(c) for c in released.cells], [_key(c) for c in notebook.cells]
    output, lost = [], []
    matcher = difflib.SequenceMatcher(a=ours, b=theirs, autojunk=False)
    for operation, i1, i2, j1, j2 in matcher.get_opcodes():
        released_block = result.cells[i1:i2]
        student_code = [c for c in notebook.cells[j1:j2] if c.cell_type == "code" and c.source.strip()]
        exercises = [c for c in released_block if nbgrader_metadata(c).get("solution")]
        if operation == "equal":
            output += released_block
            continue
        if exercises:
            if not student_code:
                lost += [f"exercise cell '{_grade_id(c)}' not found: graded as not answered" for c in exercises]
            elif len(exercises) == len(student_code):
                for exercise, answer in zip(exercises, student_code, strict=True):
                    exercise.source = answer.source
            else:
                exercises[0].source = "\n\n".join(cell.source for cell in student_code)
            output += released_block
        elif operation == "delete":
            output += released_block  # deleted given cells come back
        else:  # the student's own or edited plain cells stay theirs; graded and locked cells are restored
            output += [c for c in released_block if c.cell_type == "markdown" or nbgrader_metadata(c)]
            output += [new_code_cell(c.source) for c in student_code]
    result.cells = output
    return result, lost
