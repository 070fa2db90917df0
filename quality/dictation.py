"""Which lines of the reference solutions a student can read in the open (not inside a folded hint).

The lessons teach the idea and the exercise's contract; the solution's lines may appear only in the hints
folded away in `<details>` blocks, which a student opens when stuck. A solution line of stage S counts as
dictated when a notebook of stage 1..S shows it outside a `<details>` block: in prose (inline code
included), in given code, or in a code comment. Stage 0 is exempt (its exercise is a warm-up).

    python -m quality.dictation [--root FOLDER] [NN_name ...]
                                    one line per dictated solution line, and the counts

A line is compared without its comment and without any whitespace; the whole statement and, for an
assignment or a `return`, the expression alone are looked for. Lines too short to say anything
(under MINIMUM characters without whitespace, `return x`, `else:`), lines that are also given code in
the solution notebook (outside the solution markers) and the lines a bug hunt's broken code leaves as they
are (the student notebook's exercise cells hold them) are not counted.
"""

from __future__ import annotations

import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
MINIMUM = 14  # characters, whitespace removed: `x.transpose(1,2)` counts, `return x` does not
DETAILS = re.compile(r"<details\b.*?</details>", re.DOTALL | re.IGNORECASE)
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


@dataclass(frozen=True)
class Dictated:
    stage: str  # the notebook that shows the line
    solution_stage: str  # the notebook whose exercise the line solves
    line: str  # the solution line as written
    shown: str  # the snippet found in the open


def _without_comment(line: str) -> str:
    """The line without its trailing comment (strings that hold '#' stay whole)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return line.split("  #")[0].strip()
    for token in tokens:
        if token.type == tokenize.COMMENT:
            return line.strip()[: token.start[1]].rstrip()
    return line.strip()


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _snippets(line: str) -> list[str]:
    """What of a solution line would give it away: the statement, and the expression it assigns or returns."""
    statement = _without_comment(line)
    found = [statement]
    assigned = re.match(r"^[\w\s.,\[\]:*]+?(?<![=!<>+\-*/])[+\-*/]?=(?!=)(.+)$", statement)  # `a, b[:, 1] = ...`
    if statement.startswith("return "):
        found.append(statement.removeprefix("return "))
    elif assigned:
        found.append(assigned.group(1))
    return [_squash(snippet) for snippet in found if len(_squash(snippet)) >= MINIMUM]


def _regions(source: str) -> list[tuple[bool, str]]:
    """(inside the solution markers?, line) for every line of a cell but the markers themselves."""
    regions, inside = [], False
    for line in source.splitlines():
        if line.strip() in (BEGIN, END):
            inside = line.strip() == BEGIN
        else:
            regions.append((inside, line))
    return regions


def solution_lines(notebook: nbformat.NotebookNode) -> list[str]:
    """The lines between the solution markers of every solution cell."""
    return [line for cell in notebook.cells
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution")
            for inside, line in _regions(cell.source)
            if inside and line.strip() and not line.strip().startswith("#")]


def given_code(notebook: nbformat.NotebookNode) -> str:
    """Every code line of the solution notebook outside the solution markers, squashed."""
    return _squash("\n".join(_without_comment(line) for cell in notebook.cells if cell.cell_type == "code"
                             for inside, line in _regions(cell.source) if not inside))


def in_the_open(notebook: nbformat.NotebookNode) -> str:
    """What a student reads without opening a hint: every cell, with `<details>` blocks cut out, squashed."""
    return _squash("\n".join(DETAILS.sub("", cell.source) for cell in notebook.cells))


def assignments(root: Path = ROOT) -> list[str]:
    return sorted(path.stem for path in (root / "lessons").glob("[0-9][0-9]_*.py"))


def _read(root: Path, folder: str, name: str) -> nbformat.NotebookNode:
    return nbformat.read(root / folder / name / f"{name}.ipynb", as_version=4)


def dictated(only: list[str] | None = None, root: Path = ROOT) -> list[Dictated]:
    """Every solution line shown in the open, in the notebooks `only` names (all when None)."""
    names = assignments(root)
    solutions = {name: _read(root, "solutions", name) for name in names}
    releases = {name: _read(root, "notebooks", name) for name in names}
    found = []
    for solved in names[1:]:  # stage 0 is exempt
        given = given_code(solutions[solved])
        # a bug hunt gives its exercise's code with the bug planted: the lines it leaves as they are are given
        given += _squash("\n".join(_without_comment(line) for cell in releases[solved].cells
                                   if cell.metadata.get("nbgrader", {}).get("solution") and cell.cell_type == "code"
                                   for line in cell.source.splitlines()))
        for line in solution_lines(solutions[solved]):
            snippets = [snippet for snippet in _snippets(line) if snippet not in given]
            for shown_in in names[1: names.index(solved) + 1]:
                if only and shown_in not in only:
                    continue
                text = in_the_open(releases[shown_in])
                hit = next((snippet for snippet in snippets if snippet in text), None)
                if hit is not None:
                    found.append(Dictated(shown_in, solved, line.strip(), hit))
    return found


def main(argv: list[str]) -> int:
    root = ROOT
    if argv[:1] == ["--root"]:
        root, argv = Path(argv[1]), argv[2:]
    found = dictated(argv or None, root)
    for item in found:
        where = item.stage if item.stage == item.solution_stage else f"{item.stage} (solves {item.solution_stage})"
        print(f"{where}: {item.line}")
    total = {name: len(solution_lines(_read(root, "solutions", name))) for name in assignments(root)[1:]}
    print(f"{len(found)} solution lines in the open; solution lines per stage: {total}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
