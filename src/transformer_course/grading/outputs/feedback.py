"""nbgrader feedback preprocessor: strip hidden tests and the tracebacks that would quote them."""

from __future__ import annotations

import re

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor

HIDDEN_REGION = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.DOTALL)
HIDDEN_NOTE = "# (hidden tests: their source is not shown in feedback)"


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
