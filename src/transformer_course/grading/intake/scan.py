"""The static scan of a submission: lines a student added that reach for the grading machinery.

What an instructor reads beside the score (never a change of score): `suspicious_code` lists the lines
a student added to the released notebook that replace attributes of torch or of the checks, edit
function internals, reach into IPython, frames, imports, the reference solution or processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import nbformat

from transformer_course.grading.cells import is_grade_cell

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
    (r"\b(ctypes|subprocess|socket|signal|multiprocessing|threading|_thread)\b|"
     r"\bos\.(system|_exit|kill|fork|exec\w*|popen|write|dup2?|pipe|open)\b|/proc/",
     "starts processes, threads, signals or network connections, or writes to raw file descriptors"),
    (r"(?<![.\w])(eval|exec|compile)\s*\(|\b(marshal|pickle|dill|cloudpickle)\b|\b(FunctionType|CodeType|CellType)\b",
     "makes code at run time (eval, exec, compile, unpickled or rebuilt functions)"),
    (r"\baddaudithook\b|\bsys\.(settrace|setprofile|monitoring)\b|\bTorchFunctionMode\b|__torch_function__",
     "installs hooks on the interpreter or on torch"),
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
