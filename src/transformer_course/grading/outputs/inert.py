"""Text a student (or an instructor) wrote, made inert before any page shows it.

A written answer is markdown, and markdown passes raw HTML through: `<img src=x onerror=...>` or
`<script>` in an answer would run as script in nbgrader's feedback page and in the instructor's logged-in
formgrader, from where it could reach the Jupyter server. `inert_markdown` writes every `<` outside code
as `&lt;` (shown as `<`, never parsed as a tag) and turns links to `javascript:`, `vbscript:`, `data:` and
`file:` addresses into links to nowhere; everything else of the markdown (emphasis, lists, code, links,
`$...$` math as written) reads as before. It is idempotent: running it twice changes nothing more.

`InertNotebook` applies it to every markdown and raw cell of a notebook about to be rendered, and to the
comments nbgrader's GetGrades put into the cells' metadata; HTML, markdown and SVG outputs of code cells
are cleaned by nbconvert's `SanitizeHTML` (bleach), scripts and widgets among outputs removed.
"""

from __future__ import annotations

import html
import re

from nbconvert.preprocessors import Preprocessor
from nbconvert.preprocessors.sanitize import SanitizeHTML
from nbformat import NotebookNode
from traitlets import Bool

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.DOTALL)
_UNSAFE_SCHEME = re.compile(r"(?:java|vb)script:|data:|file:")
# the destination of [text](destination) or [label]: destination
_LINK = re.compile(r"(\]\(\s*<?|^\s{0,3}\[[^\]]+\]:\s*<?)([^\s)>]+)", re.M)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _safe_link(match: re.Match) -> str:
    """A link destination, or "#blocked-link" when a browser would read it as a script, data or file address
    (markdown decodes entities in it, browsers drop whitespace and control characters from a scheme)."""
    decoded = re.sub(r"[\s\x00-\x1f\x7f]", "", html.unescape(match.group(2))).lower()
    return match.group(1) + ("#blocked-link" if _UNSAFE_SCHEME.match(decoded) else match.group(2))


def _prose(text: str) -> str:
    return _LINK.sub(_safe_link, _CONTROL.sub("", text)).replace("<", "&lt;")


def _line(line: str) -> str:
    """One line outside a fenced block: code spans kept as written (markdown escapes them), the rest inert."""
    parts, last = [], 0
    for match in _CODE_SPAN.finditer(line):
        parts += [_prose(line[last:match.start()]), match.group(0)]
        last = match.end()
    return "".join([*parts, _prose(line[last:])])


def inert_markdown(text: str) -> str:
    """TEXT as markdown that renders no HTML element of its own and links to no script (see the module)."""
    out, fence = [], None
    for line in text.splitlines(keepends=True):
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            out.append(line)
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            out.append(line)
        else:
            out.append(_line(line))
    return "".join(out)


class InertNotebook(Preprocessor):
    """nbconvert preprocessor: every markdown and raw cell, nbgrader comment and rich output made inert.

    Enabled by default: nbgrader registers a converter's preprocessors without enabling them (its own
    preprocessors enable themselves), and an nbconvert preprocessor is off unless told otherwise."""

    enabled = Bool(True).tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: dict) -> tuple[NotebookNode, dict]:
        self._outputs = SanitizeHTML(parent=self)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int) -> tuple[NotebookNode, dict]:
        if cell.cell_type in ("markdown", "raw"):
            cell.source = inert_markdown(cell.source) if cell.cell_type == "markdown" else cell.source.replace(
                "<", "&lt;")
            cell.pop("attachments", None) if cell.cell_type == "raw" else None
        elif cell.cell_type == "code":
            cell.outputs = self._outputs.sanitize_code_outputs(cell.get("outputs", []))
        nbgrader = cell.get("metadata", {}).get("nbgrader", {})
        if isinstance(nbgrader.get("comment"), str):
            nbgrader["comment"] = inert_markdown(nbgrader["comment"])
        return cell, resources
