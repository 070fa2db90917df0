"""Which checks a notebook's grade cells use, and the static scan for tampering.

The defences that decide grades live in `transformer_course.grading.seal` and `.runner` (grade
cells run in a sealed child, where notebook code can neither reach the checks' variables nor
forge their verdicts). This module adds what an instructor reads beside the score:
`suspicious_code` lists the lines a student added to the released notebook that reach for the
grading machinery (replacing attributes of torch or of the checks, editing function internals,
IPython hooks, frames, imports, the reference solution, processes), and `checks_module` finds the
checks module a notebook's grade cells call as `check`.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
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


# --- the static scan ------------------------------------------------------------------------------

_PATTERNS: list[tuple[str, str]] = [
    (r"(?<![\w.])(torch|F|nn|np|math|check|checks|framework|builtins|functools)(\.\w+)+\s*(=|\+=)(?!=)",
     "replaces an attribute of torch or of the checks"),
    (r"(?<![\w.])check\s*=(?!=)|(?<![\w.])(global|del)\s+check\b", "re-binds the name `check`"),
    (r"\b(setattr|delattr)\s*\(", "changes attributes with setattr/delattr"),
    (r"__(code|closure|globals|wrapped|defaults|kwdefaults|dict|class|bases|subclasses)__|cell_contents",
     "edits the insides of functions or classes"),
    (r"\bsys\.modules\b|\bimportlib\b|__import__|\bbuiltins\b|__builtins__", "manipulates imports or builtins"),
    (r"\bget_ipython\b|\binput_transformers|\bshowtraceback\b|\bevents\.register\b|\b_ih\b|\b_oh\b|\bIn\s*\[",
     "reaches into IPython (hooks, history, tracebacks)"),
    (r"\b(settrace|setprofile|_getframe|currentframe|excepthook)\b|\bf_(back|locals|globals)\b|\bgc\.get_",
     "inspects the running interpreter (frames, tracing, gc)"),
    (r"\btransformer_course\b", "imports the course package (its checks or the reference solution)"),
    (r"\b(ctypes|subprocess|socket|signal|multiprocessing)\b|\bos\.(system|_exit|kill|fork|exec\w*|popen)\b",
     "starts processes, signals or network connections"),
]


@dataclass(frozen=True)
class Finding:
    cell: str  # the cell's id (or index)
    line: str
    reason: str

    def __str__(self) -> str:
        return f"cell {self.cell}: {self.reason}: `{self.line.strip()[:80]}`"


def _without_comment(line: str) -> str:
    return re.sub(r"#.*$", "", line) if "'" not in line and '"' not in line else line


def suspicious_code(notebook: nbformat.NotebookNode,
                    release: nbformat.NotebookNode | None = None) -> list[Finding]:
    """Lines a student wrote (not in the released notebook) that reach for the grading machinery."""
    given = {line.strip() for cell in (release.cells if release else []) if cell.cell_type == "code"
             for line in cell.source.splitlines()}
    findings = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or is_grade_cell(cell):
            continue
        for line in cell.source.splitlines():
            if not line.strip() or line.strip() in given:
                continue
            for pattern, reason in _PATTERNS:
                if re.search(pattern, _without_comment(line)):
                    findings.append(Finding(str(cell.get("id", index)), line, reason))
                    break
    return findings
