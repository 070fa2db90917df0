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

The checks' failure messages are measured the same way (`in_message`): what a student reads of a failing check
before opening a hint (the ladder's visible part, `framework.ladder`: the title, the problem, expected and got,
a crash's error and line) must hold no solution line of the stage, no expression a solution line assigns or
returns, and no sub-expression of one (a call, a subscript, an operation, a comparison, a method call without
its receiver) of at least MINIMUM_PART characters. Given code does not count, nor a snippet inside a line of the
student's own code that the message quotes (a crash's line, the engine's "line 3 (`...`)"). tests/test_mistakes.py
runs it on every catalogued mistake, tests/test_message_ladder.py on a sample of mutants;
`python -m quality.dictation --messages FILE` counts it in a dump of messages (scripts/catalog_messages.py).
"""

from __future__ import annotations

import ast
import functools
import io
import json
import re
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
MINIMUM = 14  # characters, whitespace removed: `x.transpose(1,2)` counts, `return x` does not
MINIMUM_PART = 10  # characters of a sub-expression in a message: `tgt[:,:-1]` counts, `mask==0` and `x.size(1)` not
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


# --- the checks' messages ----------------------------------------------------------------------------------


def _regions_of(notebook: nbformat.NotebookNode) -> list[str]:
    """The code between the solution markers of every solution cell, one region each, dedented."""
    found = []
    for cell in notebook.cells:
        if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        lines: list[str] = []
        for inside, line in _regions(cell.source):
            if inside:
                lines.append(line)
            elif lines:
                found.append(textwrap.dedent("\n".join(lines)))
                lines = []
        if lines:
            found.append(textwrap.dedent("\n".join(lines)))
    return found


def _parts(node: ast.AST) -> list[str]:
    """The sub-expressions of a solution's code that would give it away, squashed: calls (and a method call
    without its receiver, `transpose(1,2)`), subscripts, operations and comparisons."""
    found = []
    for part in ast.walk(node):
        if isinstance(part, ast.Call | ast.Subscript | ast.BinOp | ast.Compare | ast.BoolOp):
            found.append(ast.unparse(part))
        if isinstance(part, ast.Call) and isinstance(part.func, ast.Attribute):
            found.append(ast.unparse(part)[len(ast.unparse(part.func.value)) + 1:])
    squashed = [_squash(text) for text in found]
    return squashed + [text.replace("self.", "") for text in squashed if "self." in text]  # `W_q(query)...` too


def solution_snippets(notebook: nbformat.NotebookNode) -> set[str]:
    """What of a stage's solutions a message must not show in the open: each solution line and the expression it
    assigns or returns (`_snippets`, MINIMUM), and their sub-expressions (`_parts`, MINIMUM_PART)."""
    found = {snippet for line in solution_lines(notebook) for snippet in _snippets(line)}
    for region in _regions_of(notebook):
        try:
            trees = [ast.parse(region)]
        except SyntaxError:  # a region that is not a whole block: its lines one by one
            trees = []
            for line in region.splitlines():
                try:
                    trees.append(ast.parse(line.strip()))
                except SyntaxError:
                    continue
        found |= {part for tree in trees for part in _parts(tree) if len(part) >= MINIMUM_PART}
    return found


@functools.cache
def _stage_snippets(stage: str, root: Path = ROOT) -> tuple[frozenset[str], str]:
    """(the stage's solution snippets, its given code squashed: the solution notebook's code outside the markers
    and the student notebook's exercise cells, which hold a bug hunt's given code)."""
    solution, release = _read(root, "solutions", stage), _read(root, "notebooks", stage)
    given = given_code(solution) + _squash("\n".join(
        _without_comment(line) for cell in release.cells
        if cell.metadata.get("nbgrader", {}).get("solution") and cell.cell_type == "code"
        for line in cell.source.splitlines()))
    return frozenset(snippet for snippet in solution_snippets(solution) if snippet not in given), given


# the student's own lines as messages quote them: a crash's "in `forward`, line 3: x = ..." and the engine's
# "in `forward`, line 3 (`x = ...`)"; a snippet inside one of them is what the student wrote, not a dictated fix
_QUOTED = re.compile(r"^\s*in `[^`\n]+`, line \d+: (.*)$|line \d+(?: of `[^`\n]*`)? \(`([^`\n]*)`\)", re.MULTILINE)


def quoted_lines(text: str) -> list[str]:
    """The student's lines a message quotes, squashed."""
    return [_squash(match.group(1) or match.group(2) or "") for match in _QUOTED.finditer(text)]


def in_text(stage: str, text: str, root: Path = ROOT) -> list[str]:
    """The stage's solution snippets (`solution_snippets`, given code left out) that `text` shows, leaving out
    those inside a line of the student's own code that the text quotes."""
    snippets, _ = _stage_snippets(stage, root)
    shown, own = _squash(text), quoted_lines(text)
    found = sorted(snippet for snippet in snippets
                   if snippet in shown and not any(snippet in line for line in own))
    return [snippet for snippet in found if not any(snippet != other and snippet in other for other in found)]


def in_message(stage: str, message: str, root: Path = ROOT) -> list[str]:
    """What a failing check's message shows of the stage's solutions before any hint is opened (the visible part
    of its ladder, title included): `in_text` of it. [] is what the course requires."""
    from transformer_course.checks.framework import ladder

    return in_text(stage, ladder(message).visible, root)


def in_first_hint(stage: str, message: str, root: Path = ROOT) -> list[str]:
    """What the first folded hint (the likely cause, in words) shows of the stage's solutions: only the last hint
    may show code. Reported, not required: a cause may name a call in words ("the softmax")."""
    from transformer_course.checks.framework import HINT_TITLES, ladder

    rungs = [text for title, text in ladder(message).rungs if title != HINT_TITLES["in code:"]]
    return in_text(stage, rungs[0], root) if rungs else []


def messages_report(path: Path, whole: bool = False) -> int:
    """Count the messages of a dump (a JSON list of {stage, desc, message, others: {cell: message}, bug_hunt}) that
    show solution code in the open: their visible part, or with `whole` the whole message (what a notebook showed
    before the ladder: all of it but a bug hunt's cause)."""
    from transformer_course.checks.framework import without_cause

    entries = json.loads(path.read_text())
    showing = hinting = total = 0
    for entry in entries:
        messages = [entry["message"], *entry.get("others", {}).values()]
        for message in messages:
            total += 1
            if whole:
                text = without_cause(message) if entry.get("bug_hunt") else message
                found = in_text(entry["stage"], text)
            else:
                found = in_message(entry["stage"], message)
                first = in_first_hint(entry["stage"], message)
                if first:
                    hinting += 1
                    print(f"first hint | {entry['stage']} | {entry.get('desc', '')}: {', '.join(first)}")
            if found:
                showing += 1
                print(f"{entry['stage']} | {entry.get('desc', '')}: {', '.join(found)}")
    print(f"{showing} of {total} messages show solution code before a hint is opened"
          + (" (whole messages)" if whole else f" (visible parts); {hinting} in their first hint"))
    return showing


def main(argv: list[str]) -> int:
    root = ROOT
    if argv[:1] == ["--root"]:
        root, argv = Path(argv[1]), argv[2:]
    if argv[:1] == ["--messages"]:
        return 1 if messages_report(Path(argv[1]), whole="--whole" in argv) else 0
    found = dictated(argv or None, root)
    for item in found:
        where = item.stage if item.stage == item.solution_stage else f"{item.stage} (solves {item.solution_stage})"
        print(f"{where}: {item.line}")
    total = {name: len(solution_lines(_read(root, "solutions", name))) for name in assignments(root)[1:]}
    print(f"{len(found)} solution lines in the open; solution lines per stage: {total}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
