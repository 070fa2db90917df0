"""What a notebook's cells are to the grader: grade cells, the checks module they call, hidden parts.

Read from the notebook and the checks' source only (nothing is imported: no torch). Every folder of
the grading package may use this module; it uses nothing of the grading package.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

import nbformat


@cache
def _check_names() -> dict[str, frozenset[str]]:
    """{checks module: the public names it defines}, read from the source (nothing imported)."""
    spec = importlib.util.find_spec("transformer_course.checks")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations)))
    names = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_") or path.stem == "framework":
            continue
        text = path.read_text(encoding="utf-8")
        defined = set(re.findall(r"^def (\w+)\(", text, re.MULTILINE))
        defined |= set(re.findall(r"^(\w+)\s*=", text, re.MULTILINE))
        defined.add("summary")  # every stage re-exports the framework's summary
        names[f"transformer_course.checks.{path.stem}"] = frozenset(defined)
    return names


@cache
def _reference_definitions() -> dict[str, frozenset[str]]:
    """{reference module: the classes and functions it defines at top level}, read from the source."""
    spec = importlib.util.find_spec("transformer_course.reference")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations)))
    return {f"transformer_course.reference.{path.stem}": frozenset(
                re.findall(r"^(?:class|def) (\w+)\b", path.read_text(encoding="utf-8"), re.MULTILINE))
            for path in sorted(folder.glob("*.py")) if not path.stem.startswith("_")}


def reference_modules(names: list[str]) -> list[str]:
    """The reference modules that define any of `names` (a notebook's exercises): what its zygote imports so
    that the watcher knows the reference of every exercise before any notebook code runs."""
    wanted = set(names)
    return [module for module, defined in _reference_definitions().items() if defined & wanted]


def is_grade_cell(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and bool(cell.get("metadata", {}).get("nbgrader", {}).get("grade"))


def checks_module(notebook: nbformat.NotebookNode) -> str | None:
    """The checks module the grade cells call as `check` (found from the names they use)."""
    used = {name for cell in notebook.cells if is_grade_cell(cell)
            for name in re.findall(r"\bcheck\.(\w+)", cell.source)}
    if not used:
        return None
    matches = [module for module, defined in _check_names().items() if used <= defined]
    return matches[0] if len(matches) == 1 else None


HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n?(.*?)### END HIDDEN TESTS\n?", re.DOTALL)


def split_hidden(source: str) -> tuple[str, str]:
    """(visible part, hidden part) of a grade cell's source."""
    hidden = "\n".join(match.group(1) for match in HIDDEN.finditer(source))
    return HIDDEN.sub("", source), hidden


# --- optional and extra-credit checks ------------------------------------------------------------------
#
# A lesson marks a grade cell `credit="extra"` (its points can raise the score, and are not part of the
# maximum) or `credit="optional"` (it counts for nothing). The build gives such a cell 0 nbgrader points, so
# nbgrader's maximum (and every maximum read from it) leaves it out, and writes one of these lines first in
# its source, which students read and the gradebook keeps with the cell (nbgrader restores a locked cell's
# source from there). The grader reads the line to give a passing extra-credit cell its points as nbgrader's
# `extra_credit` of that grade (`grading.sandbox.executor.SaveExtraCredit`).

EXTRA_CREDIT_LINE = ("# Extra credit: {points:g} point{plural}, added to your score when this cell's checks pass; "
                     "they are not part of the notebook's maximum.")
OPTIONAL_LINE = "# Optional: this cell's checks count for no points; they are here for you to practise."
_EXTRA = re.compile(r"^# Extra credit: (\d+(?:\.\d+)?) points?, ")


def credit_line(credit: str, points: float) -> str:
    """The first line of an extra-credit (`credit="extra"`) or optional (`credit="optional"`) grade cell."""
    if credit == "optional":
        return OPTIONAL_LINE
    return EXTRA_CREDIT_LINE.format(points=points, plural="" if points == 1 else "s")


def credit(source: str) -> tuple[str, float] | None:
    """("extra", its points) or ("optional", 0.0) for a grade cell's source that starts with a credit line;
    None for a cell that counts as usual."""
    first = source.split("\n", 1)[0]
    if first == OPTIONAL_LINE:
        return "optional", 0.0
    found = _EXTRA.match(first)
    return ("extra", float(found.group(1))) if found else None
