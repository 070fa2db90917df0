"""From solution notebook to web page: what the site changes in a notebook, before and after running it.

Before running (`page_from_solution`):
- the Open-in-Colab badge becomes a button drawn by the site's own CSS (the badge image lives on Google's
  servers, and the site must load nothing from the network); its link, the student notebook of the release
  tag, is kept as it is;
- every written question's model answer and rubric are folded into a dropdown, so a learner can answer
  first and then compare;
- stage 5 trains one epoch instead of ten and says so (`SITE_EDITS`), then prints what the full run of the
  course checkpoint recorded.

The class edition (`page_from_notebook(..., class_edition=True)`, `make site-class`) is built from the student
notebooks instead: the code of every graded exercise is the stub the student fills in, each written question's
answer cell is a line saying it is answered in the student's own notebook (the solutions hold the model answer
and rubric; the student notebooks none), and the site's edits of stage 5 are left out (they describe the
solution's training run).

After running (`finish_outputs`): every interactive (plotly) figure becomes the interactive map drawn by the
page's local plotly.js; the static picture the course draws of the same figure is kept inside it only as the
fallback for a reader without JavaScript (the script removes it when it draws the map).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path

import nbformat
from nbformat import NotebookNode

PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"
WIDGET_MIMETYPE = "application/vnd.jupyter.widget-view+json"
BADGE = re.compile(r'<a href="(?P<link>https://colab\.research\.google\.com/[^"]+)"[^>]*>\s*<img [^>]*>\s*</a>')
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def colab_button(link: str) -> str:
    """The page's Open-in-Colab button (local CSS, no image from the network) and what it opens."""
    return (f'<a class="colab-button" href="{escape(link)}">Open in Colab</a>\n\n'
            "*The button opens the exercise version of this notebook in Google Colab, from the same course "
            "release: the lesson you are reading, with the code for you to write.*")


CLASS_ANSWER = ("*Your answer to this question goes here, in your own notebook (Open in Colab at the top of the "
                "page): your instructor grades it.*")


def fold_answer(source: str) -> str:
    """A written question's model answer and rubric, folded away until the reader opens them."""
    return f"::::{{dropdown}} Model answer and rubric (open it after writing your own)\n{source.strip()}\n::::"


@dataclass(frozen=True)
class Edit:
    """One change the site makes to a stage's notebook: `replace` the code line `old` (which must occur
    exactly once) with `new`, or insert `cells` after the one cell whose source contains `anchor`."""

    anchor: str
    new: str = ""
    cells: tuple[NotebookNode, ...] = ()


STAGE_5_NOTE = """\
:::{note}
**On this website the training run below is one epoch, not ten.** The ten epochs take roughly 30 minutes
to an hour on a 2-core CPU (section 11 says how that was measured), longer on a busy machine, so the
website runs **one epoch** of the same model with the same settings, while it is built. The curves, the
saved model and the three translations below come from that one epoch: expect weak translations. What
the full run gives is recorded in the course's pretrained checkpoint; the cell after the translations
prints it. In your own copy of the notebook, `EPOCHS = 1 if short_run() else 10` trains all ten epochs.
:::"""

STAGE_5_RECORDED_INTRO = """\
**What the full run gives.** The course's pretrained checkpoint was trained with this model and these
settings (12 epochs, the weights of the last three averaged) by the course's training script. The cell
reads what that run recorded in the checkpoint: how long it took, on what, and its BLEU on the validation
and test sets (notebook 6 explains BLEU and reproduces the test score). Its per-epoch losses were not
recorded, so there is no curve of that run to show."""

STAGE_5_RECORDED_CODE = """\
from transformer_course.reference.checkpoint import pretrained_path, read_metadata

recorded = read_metadata(pretrained_path())  # written by scripts/train_checkpoint.py when it finished
for key in ("epochs", "averaged_epochs", "training_minutes", "device", "threads", "val_bleu", "test_bleu", "command"):
    print(f"{key:>17}: {recorded[key]}")"""

SITE_EDITS: dict[str, tuple[Edit, ...]] = {
    "05_training": (
        Edit(anchor="EPOCHS = 1 if short_run() else 10",
             new="EPOCHS = 1  # on the website: one epoch (see the note above)"),
        Edit(anchor="## 11. Training on Multi30k", cells=(nbformat.v4.new_markdown_cell(STAGE_5_NOTE),)),
        Edit(anchor='print("MT :", translate(model, german', cells=(
            nbformat.v4.new_markdown_cell(STAGE_5_RECORDED_INTRO),
            nbformat.v4.new_code_cell(STAGE_5_RECORDED_CODE))),
    ),
}


def _apply(cells: list[NotebookNode], edit: Edit, assignment: str) -> list[NotebookNode]:
    holders = [index for index, cell in enumerate(cells) if edit.anchor in cell.source]
    if len(holders) != 1:
        raise ValueError(f"{assignment}: the site's edit expects exactly one cell containing {edit.anchor!r}, "
                         f"found {len(holders)}; update website/pages.py (SITE_EDITS) to the changed lesson")
    index = holders[0]
    if edit.new:
        lines = cells[index].source.split("\n")
        matching = [number for number, line in enumerate(lines) if line.strip() == edit.anchor]
        if len(matching) != 1:
            raise ValueError(f"{assignment}: {edit.anchor!r} is not a line of its own; update SITE_EDITS")
        lines[matching[0]] = lines[matching[0]].replace(edit.anchor, edit.new)
        cells[index].source = "\n".join(lines)
    return cells[: index + 1] + [nbformat.from_dict(cell) for cell in edit.cells] + cells[index + 1:]


def is_answer_cell(cell: NotebookNode) -> bool:
    """A written question's answer cell: markdown that nbgrader grades by hand (its text is the model answer)."""
    grader = cell.get("metadata", {}).get("nbgrader", {})
    return cell.cell_type == "markdown" and bool(grader.get("grade")) and bool(grader.get("solution"))


def page_from_solution(notebook: NotebookNode, assignment: str) -> NotebookNode:
    """The web page of one stage, before it runs: Colab button, folded answers, the site's edits."""
    return page_from_notebook(notebook, assignment)


def page_from_notebook(notebook: NotebookNode, assignment: str, class_edition: bool = False) -> NotebookNode:
    """The web page of one stage from its solution notebook (the self-study edition: Colab button, folded model
    answers, the site's edits) or, with CLASS_EDITION, from its student notebook (Colab button, each answer cell
    a line saying where it is answered, no edits)."""
    page = nbformat.from_dict(json.loads(json.dumps(notebook)))  # a deep copy
    first = page.cells[0]
    badge = BADGE.search(first.source)
    if first.cell_type != "markdown" or badge is None:
        raise ValueError(f"{assignment}: the first cell has no Open-in-Colab badge")
    first.source = first.source.replace(badge.group(0), colab_button(badge.group("link")))
    for cell in page.cells:
        if is_answer_cell(cell):
            cell.source = CLASS_ANSWER if class_edition else fold_answer(cell.source)
    cells = list(page.cells)
    for edit in () if class_edition else SITE_EDITS.get(assignment, ()):
        cells = _apply(cells, edit, assignment)
    page.cells = cells
    page.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    page.nbformat, page.nbformat_minor = 4, 5
    for number, cell in enumerate(page.cells):
        cell.id = f"cell-{number}"  # the same ids at every build, so an unchanged page stays unchanged
    return page


def interactive_html(spec: dict, title: str, png: str | None = None) -> str:
    """The interactive figure: its plotly spec as JSON, drawn by the site's course-figures.js, and the static
    picture (base64 PNG) as the fallback that the script removes once the map is drawn."""
    payload = json.dumps(spec).replace("</", "<\\/")
    fallback = (f'<img class="course-static" src="data:image/png;base64,{escape(png)}" alt="{escape(title)}">'
                if png else "")
    return (f'<div class="course-interactive" role="figure" aria-label="{escape(title)} (interactive)">'
            f'<script type="application/json" class="course-spec">{payload}</script>'
            f'<div class="course-plot">{fallback}</div>'
            '<p class="course-caption">Drag the slider under the map to see each layer and head; hover over a '
            "cell to read its weight.</p></div>")


def _split_interactive(output: NotebookNode) -> list[NotebookNode]:
    data = output.get("data", {})
    if PLOTLY_MIMETYPE not in data:
        if WIDGET_MIMETYPE in data:  # a widget needs its JavaScript manager from the network: keep the text
            return [nbformat.v4.new_output("display_data", {"text/plain": data.get("text/plain", "")})]
        return [output]
    spec = data[PLOTLY_MIMETYPE]
    title = ((spec.get("layout") or {}).get("title") or {}).get("text") or "attention map"
    html = interactive_html(spec, title, data.get("image/png"))
    return [nbformat.v4.new_output("display_data", {"text/html": html, "text/plain": data.get("text/plain", title)})]


def finish_outputs(page: NotebookNode) -> NotebookNode:
    """After running: each interactive figure as the interactive map (its static picture only as a fallback)."""
    for cell in page.cells:
        if cell.cell_type == "code":
            cell.outputs = [part for output in cell.get("outputs", []) for part in _split_interactive(output)]
    return page


def stage_title(page: NotebookNode) -> str:
    """'Stage 1 — Positional encoding': the first level-1 heading of the page."""
    for cell in page.cells:
        if cell.cell_type == "markdown":
            found = re.search(r"^# (.+)$", cell.source, flags=re.MULTILINE)
            if found:
                return found.group(1).strip()
    raise ValueError("a stage page without a level-1 heading")


def working_time(page: NotebookNode) -> str:
    """The working times the notebook's header quotes for its two students, as scripts/working_time.py estimated
    them: 'about 1½ hours (at ease with PyTorch) to 2¾ hours (new to it)'."""
    for cell in page.cells[:2]:
        text = " ".join(cell.source.split())
        found = re.search(r"\*\*Working time:\*\* about (.+?) if you are at ease with PyTorch, about (.+?) if you are "
                          r"new to it", text)
        if found:
            return f"about {found.group(1)} (at ease with PyTorch) to {found.group(2)} (new to it)"
    raise ValueError("a stage page without its working time")


def stage_table(pages: dict[str, NotebookNode], link: Callable[[str], str]) -> str:
    """The landing page's table of stages: title (linked), working time, whether it is optional."""
    rows = ["| stage | working time |", "|---|---|"]
    for assignment, page in sorted(pages.items()):
        title = stage_title(page)
        optional = " (optional)" if assignment.startswith(("00_", "07_")) else ""
        rows.append(f"| [{title}]({link(assignment)}){optional} | {working_time(page)} |")
    return "\n".join(rows) + "\n"


def write_if_changed(path: Path, text: str) -> bool:
    """Write only when the content differs, so an unchanged page keeps its time stamp and Sphinx skips it."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True
