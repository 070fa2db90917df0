"""The feedback pages nbgrader writes for students: no hidden tests, and nothing that runs.

`HideHiddenTests` (a feedback preprocessor) strips hidden tests and the tracebacks that would quote them.
`InertNotebook` (see `inert`) makes written answers, comments and rich outputs inert before rendering, and
the exporter's markdown and HTML filters sanitise what the template renders (nh3, after rendering).
`SafeFeedbackExporter` is the HTML exporter of nbgrader's generate_feedback: the page it writes has a
Content-Security-Policy that allows no script, no connection and nothing fetched from elsewhere (styles and
inline images only), and carries no script element at all: nbgrader's template would load MathJax and
require.js from a CDN, so math in answers reads as written ($\\sqrt{d_k}$) instead of being typeset.
"""

from __future__ import annotations

import re

import jinja2
from nbconvert.exporters import HTMLExporter
from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

from transformer_course.grading.outputs.inert import FILTERS, InertNotebook  # noqa: F401  (nbgrader_config.py uses it)

HIDDEN_REGION = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.DOTALL)
HIDDEN_NOTE = "# (hidden tests: their source is not shown in feedback)"
POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; font-src data:; base-uri 'none'; "
          "form-action 'none'")
CSP_META = f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script\s*>", re.DOTALL | re.IGNORECASE)


class HideHiddenTests(NbGraderPreprocessor):
    """Replace hidden-test regions with a note and keep only the final error line of such cells."""

    def preprocess_cell(
        self, cell: NotebookNode, resources: ResourcesDict, cell_index: int
    ) -> tuple[NotebookNode, ResourcesDict]:
        if cell.cell_type != "code" or not HIDDEN_REGION.search(cell.source):
            return cell, resources
        cell.source = HIDDEN_REGION.sub(HIDDEN_NOTE, cell.source)
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                output.traceback = [f"{output.ename}: {output.evalue}"]
        return cell, resources


def without_scripts(page: str) -> str:
    """PAGE with its script elements removed and the policy as the first element of its head.

    What a student wrote was sanitised (`inert`: no script element survives it), so each script element left
    in the page is the template's own; the policy forbids any that would remain."""
    page = _SCRIPT.sub("", page)
    head = re.search(r"<head\b[^>]*>", page, re.IGNORECASE)
    return page[:head.end()] + CSP_META + page[head.end():] if head else CSP_META + page


class CompiledTemplates(jinja2.BytecodeCache):
    """Templates compiled once per process: nbgrader makes a new exporter, with a new template environment, for
    every feedback page, and compiling nbconvert's templates was about a third of a page's time. Jinja checks
    each template's source against the one compiled, so a changed template is compiled again."""

    def __init__(self) -> None:
        self.compiled: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if bucket.key in self.compiled:
            bucket.bytecode_from_string(self.compiled[bucket.key])

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self.compiled[bucket.key] = bucket.bytecode_to_string()


COMPILED_TEMPLATES = CompiledTemplates()


class SafeFeedbackExporter(HTMLExporter):
    """nbgrader's feedback HTML with a Content-Security-Policy and without scripts (see the module)."""

    def _create_environment(self) -> jinja2.Environment:
        environment = super()._create_environment()
        environment.bytecode_cache = COMPILED_TEMPLATES
        return environment

    def default_filters(self):  # noqa: ANN201  (nbconvert's generator of (name, filter))
        """nbconvert's filters, with markdown and HTML sanitised after rendering (`inert`) whatever the config."""
        yield from super().default_filters()
        yield from FILTERS.items()

    def from_notebook_node(self, nb: NotebookNode, resources: dict | None = None, **kw: object) -> tuple[str, dict]:
        page, resources = super().from_notebook_node(nb, resources, **kw)
        return without_scripts(page), resources
