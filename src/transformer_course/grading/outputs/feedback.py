"""The feedback pages nbgrader writes for students: no hidden tests, nothing that runs, and what a student reads.

`HideHiddenTests` (a feedback preprocessor) strips hidden tests and the tracebacks that would quote them.
`InertNotebook` (see `inert`) makes written answers, comments and rich outputs inert before rendering, and
the exporter's markdown and HTML filters sanitise what the template renders (nh3, after rendering).
`SafeFeedbackExporter` is the HTML exporter of nbgrader's generate_feedback. The page it writes:
- has a Content-Security-Policy that allows no script, no connection and nothing fetched from elsewhere (the
  class's stylesheet and inline images only), and carries no script element at all;
- says first what the student got: the total ("37 of 44 points, written answers pending: 3 answers, 7
  points not graded yet") and a table of every grade cell, a written answer nobody has graded yet reading
  "pending", never 0 (`mark_pending` asks the gradebook, as scores.csv's "needs manual grading" does);
- shows the student's code and answers, the checks with their results, the questions, and the headings of the
  lesson (`shape_notebook`); the lesson's text and given code that the student left unchanged are not repeated
  (the headings of what was left out stay), a check with its full points is one line of the table (what it
  checked), and long outputs are cut (`OUTPUT_LINES`);
- renders math as MathML (`mathml`; no MathJax, nothing from a CDN), the Colab badge as a link, and links one
  stylesheet per class (`feedback.css` in the class's feedback folder, `STYLESHEET`) instead of nbgrader's
  inlined bootstrap and notebook CSS (about 120 KB a page); a page opened alone still reads, plainly styled.
"""

from __future__ import annotations

import html
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import nbformat
from nbconvert.exporters import HTMLExporter
from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor
from pygments.formatters import HtmlFormatter

from transformer_course.grading.cells import credit
from transformer_course.grading.outputs.files import write_text_atomically
from transformer_course.grading.outputs.inert import FILTERS, InertNotebook  # noqa: F401  (nbgrader_config.py uses it)
from transformer_course.grading.outputs.mathml import render_math

HIDDEN_REGION = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", re.DOTALL)
HIDDEN_NOTE = "# (hidden tests: their source is not shown in feedback)"
# 'self': the class's stylesheet beside the pages (a file: page may read file: styles, a served one its server's)
POLICY = ("default-src 'none'; style-src 'self' 'unsafe-inline'; img-src data:; font-src data:; base-uri 'none'; "
          "form-action 'none'")
CSP_META = f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script\s*>", re.DOTALL | re.IGNORECASE)
STYLESHEET = "feedback.css"  # in the class's feedback folder, linked by every page below it
OUTPUT_LINES = 30  # an output longer than this shows its first OUTPUT_LINES - 5 lines and its last 5
OUTPUT_CHARACTERS = 3000  # and at most about this many characters


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


# --- what a student reads -----------------------------------------------------------------------------------

def _nbgrader(cell: NotebookNode) -> dict:
    metadata = cell.get("metadata", {}).get("nbgrader", {})
    return metadata if isinstance(metadata, dict) else {}


def _kept_always(cell: NotebookNode) -> bool:
    """The student's own cells and the graded ones: answers, code to complete, checks, tasks."""
    nbgrader = _nbgrader(cell)
    return bool(nbgrader.get("grade") or nbgrader.get("solution") or nbgrader.get("task"))


def _normalised(source: Any) -> str:
    text = "".join(source) if isinstance(source, list) else str(source)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


# A line that is a link and nothing else, such as the Colab badge: `<a href=...><img ...></a>` or `[![..](..)](..)`
_LINK_LINE = re.compile(r"\s*(<a\s[^>]*>.*</a>|\[!\[[^\]]*\]\([^)]*\)\]\([^)]*\))\s*\Z", re.IGNORECASE)


def _headings(cells: list[NotebookNode], links: bool = False) -> list[str]:
    """The markdown headings of CELLS (`## 5. Exercise: ...`) as written, and with LINKS the lines that are a link
    alone (the Colab badge)."""
    found = []
    for cell in cells:
        if cell.cell_type != "markdown":
            continue
        in_code = False
        for line in _normalised(cell.source).splitlines():
            in_code ^= line.lstrip().startswith("```")
            if not in_code and (re.match(r"#{1,4} \S", line) or (links and _LINK_LINE.match(line))):
                found.append(line)
    return found


def _omitted(cells: list[NotebookNode]) -> NotebookNode:
    """One markdown cell standing for CELLS, left out: their headings, and what was left out."""
    what = "lesson text and given code" if any(c.cell_type == "code" for c in cells) else "lesson text"
    note = f"*{len(cells)} cell{'s' if len(cells) != 1 else ''} of {what}, unchanged: not repeated here*"
    cell = nbformat.v4.new_markdown_cell("\n\n".join([*_headings(cells, links=True), note]))
    cell.metadata["course_feedback"] = {"omitted": len(cells)}
    return cell


def _question(cells: list[NotebookNode], index: int) -> bool:
    """Whether cell INDEX is the question just before a cell the student writes in: the text before a written
    answer, or before code to complete when it is not a section of the lesson (no heading) nor a hint."""
    following = cells[index + 1] if index + 1 < len(cells) else None
    if following is None or not _nbgrader(following).get("solution"):
        return False
    text = _normalised(cells[index].source)
    return following.cell_type == "markdown" or not (text.startswith("<details") or _headings([cells[index]]))


def _first_line(cell: NotebookNode, limit: int = 200) -> str:
    """The first line a code cell printed (a check's "✔ what it checked"), "" when it printed nothing."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream" and output.get("name") == "stdout":
            text = "".join(output.text) if isinstance(output.text, list) else str(output.text)
            line = next((line.strip() for line in text.splitlines() if line.strip()), "")
            return line[:limit] + ("…" if len(line) > limit else "")
    return ""


def cut_text(text: str, lines: int = OUTPUT_LINES, characters: int = OUTPUT_CHARACTERS) -> str:
    """TEXT with its middle left out when it has more than LINES lines or CHARACTERS characters, saying how much
    was left out."""
    rows = text.splitlines(keepends=True)
    if len(rows) <= lines and len(text) <= characters:
        return text
    head, tail = rows[:lines - 5], rows[-5:] if len(rows) > lines else []
    shown = "".join(head)[:characters - 500] + "".join(tail)[-500:]
    return ("".join(head)[:characters - 500] + f"\n… ({len(rows) - len(head) - len(tail)} lines, "
            f"{len(text) - len(shown):,} characters left out of the feedback) …\n" + "".join(tail)[-500:])


def cut_outputs(cell: NotebookNode) -> None:
    """CELL's long text outputs (streams, plain text) cut in the middle (`cut_text`)."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            output.text = cut_text("".join(output.text) if isinstance(output.text, list) else output.text)
        elif "data" in output and "text/plain" in output.data:
            plain = output.data["text/plain"]
            output.data["text/plain"] = cut_text("".join(plain) if isinstance(plain, list) else plain)


def shape_notebook(nb: NotebookNode, release: NotebookNode | None) -> NotebookNode:
    """NB as a student reads it in feedback: their own and graded cells, the question before each answer and the
    cells they changed or added; each run of other cells (the lesson's text and given code, unchanged from
    RELEASE, whose outputs the checks explain when they fail) becomes one cell with their headings. Long outputs
    are cut. Without RELEASE nothing is left out."""
    given = {_normalised(cell.source) for cell in release.cells} if release is not None else None
    cells, left_out = [], []
    for index, cell in enumerate(nb.cells):
        keep = (given is None or _kept_always(cell) or _normalised(cell.source) not in given
                or (cell.cell_type == "markdown" and _question(nb.cells, index)))
        if not keep:
            left_out.append(cell)
            continue
        if left_out:
            cells.append(_omitted(left_out))
            left_out = []
        cut_outputs(cell)
        if _nbgrader(cell).get("grade") and cell.cell_type == "code":
            cell.metadata["course_feedback"] = {"line": _first_line(cell)}
        cells.append(cell)
    if left_out:
        cells.append(_omitted(left_out))
    nb.cells = cells
    return nb


def mark_pending(nb: NotebookNode, db_url: str, notebook: str, assignment: str, student: str) -> tuple[int, float]:
    """Mark each written answer nobody has graded yet (`nbgrader.pending`, as scores.csv's "needs manual
    grading"); returns how many, and their points."""
    from nbgrader.api import Gradebook, MissingEntry

    count, points = 0, 0.0
    with Gradebook(db_url) as gradebook:
        for cell in nb.cells:
            nbgrader = _nbgrader(cell)
            if not (nbgrader.get("grade") and nbgrader.get("solution")):
                continue
            try:
                grade = gradebook.find_grade(nbgrader["grade_id"], notebook, assignment, student)
            except MissingEntry:
                continue
            if grade.manual_score is None and grade.auto_score is None:
                nbgrader["pending"] = True
                count, points = count + 1, points + float(grade.max_score or 0)
    return count, points


def mark_credit(nb: NotebookNode) -> tuple[float, int]:
    """Mark each extra-credit and optional grade cell (`grading.cells.credit`, from its first line, which the
    gradebook restored): `nbgrader.credit`, `credit_points` (what it can add) and `credit_passed` (nbgrader's
    reading of its outputs: no error, nothing on stderr). Returns the extra-credit points there are and how many
    optional cells."""
    extra, optional = 0.0, 0
    for cell in nb.cells:
        nbgrader = _nbgrader(cell)
        marked = credit(cell.source) if nbgrader.get("grade") and cell.cell_type == "code" else None
        if not marked:
            continue
        nbgrader["credit"], nbgrader["credit_points"] = marked
        nbgrader["credit_passed"] = not any(output.get("output_type") == "error" or output.get("name") == "stderr"
                                            for output in cell.get("outputs", []))
        extra, optional = extra + marked[1], optional + (marked[0] == "optional")
    return extra, optional


def stylesheet() -> str:
    """The class's feedback.css: the page, the grade cells' headings and scores, code, outputs, math."""
    return _STYLE + HtmlFormatter(style="default").get_style_defs(".highlight")


# Enough for a page opened alone (sent by mail, without its folder): readable, scores and pending visible.
_FALLBACK = ("body{font:15px/1.5 system-ui,sans-serif;max-width:62rem;margin:auto;padding:0 1rem}"
             "pre{white-space:pre-wrap;overflow-x:auto}.pending{color:#8a5a00;font-weight:bold}")
_STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1a1a1a; max-width: 62rem;
  margin: 0 auto; padding: 0 1rem 3rem; }
h1 { font-size: 1.4rem; margin: 1rem 0 0.2rem; } .rendered_html h1, .rendered_html h2 { font-size: 1.2rem; }
.rendered_html h3, .rendered_html h4 { font-size: 1.05rem; } .anchor-link { display: none; }
.total { font-size: 1.1rem; margin: 0.3rem 0 0.8rem; } .total b { font-size: 1.25rem; }
table.scores { border-collapse: collapse; font-size: 0.9rem; margin-bottom: 1rem; }
table.scores td, table.scores th { border-bottom: 1px solid #e3e3e3; padding: 0.15rem 0.6rem; text-align: left; }
.cell { margin: 0.6rem 0; } .graded { border: 1px solid #c9d3e3; border-radius: 6px; }
.graded > .head { background: #eef2f8; padding: 0.25rem 0.6rem; border-radius: 6px 6px 0 0; display: flex;
  justify-content: space-between; font-size: 0.9rem; } .graded > .body { padding: 0.2rem 0.6rem; }
.score.full { color: #1b6e2a; font-weight: bold; } .score.partial { color: #8a5a00; font-weight: bold; }
.score.zero { color: #b42318; font-weight: bold; } .pending { color: #8a5a00; font-weight: bold; }
.comment { border-top: 1px dashed #c9d3e3; padding: 0.3rem 0.6rem; background: #fffbea; }
.omitted-cells em { color: #666; font-size: 0.85rem; } .omitted-cells p { margin: 0.2rem 0; }
.omitted-cells h1, .omitted-cells h2, .omitted-cells h3, .omitted-cells h4 { font-size: 1rem; margin: 0.8rem 0 0; }
pre { white-space: pre-wrap; overflow-x: auto; margin: 0.2rem 0; font-size: 0.85rem; }
.highlight { border-radius: 4px; padding: 0.1rem 0.5rem; }
.output_area pre { background: #fafafa; padding: 0.2rem 0.5rem; border-left: 3px solid #e3e3e3; }
.output_error pre, .output_stderr pre { border-left-color: #b42318; }
.output_area img { max-width: 100%; height: auto; }
.rendered_html table { border-collapse: collapse; } .rendered_html td, .rendered_html th { border: 1px solid #ddd;
  padding: 0.15rem 0.4rem; }
math[display="block"] { margin: 0.4rem 0; } code.math-tex { color: #555; }
.ansi-red-fg { color: #b42318; } .ansi-green-fg { color: #1b6e2a; } .ansi-yellow-fg { color: #8a5a00; }
.ansi-blue-fg { color: #1f5fa8; } .ansi-cyan-fg { color: #0e7490; } .ansi-bold { font-weight: bold; }
.remote-image { border: 1px solid #c9d3e3; border-radius: 3px; padding: 0 0.3rem; }
@media print { .cell { break-inside: avoid; } }
"""

# The page: the classic template's cells (outputs, highlighting, sanitising filters), with the course's head, the
# scores first and a plain heading on each graded cell. Everything a student wrote reaches it made inert.
TEMPLATE = r"""{%- extends 'base.html.j2' -%}
{%- set feedback = resources.course_feedback or {} -%}
{%- macro score(cell) -%}
{%- set nbgrader = cell.metadata.nbgrader -%}
{%- if nbgrader.pending -%}
<span class="score pending">pending: not graded yet ({{ "%g" | format(nbgrader.points | float) }} points)</span>
{%- elif nbgrader.credit == 'optional' -%}
<span class="score optional">optional, no points: {{ 'passed' if nbgrader.credit_passed else 'not passed' }}</span>
{%- elif nbgrader.credit == 'extra' and nbgrader.score is defined and nbgrader.score is not none -%}
{%- set got, of = nbgrader.score | float, nbgrader.credit_points | float -%}
<span class="score {{ 'full' if got >= of else 'partial' }}">extra credit: {{ "%g" | format(got) }} of
{{- " %g" | format(of) }} points</span>
{%- elif nbgrader.score is defined and nbgrader.score is not none -%}
{%- set got, of = nbgrader.score | float, nbgrader.points | float -%}
<span class="score {{ 'full' if got >= of else ('zero' if got <= 0 else 'partial') }}">
{{- "%g" | format(got) }} of {{ "%g" | format(of) }} points</span>
{%- endif -%}
{%- endmacro -%}
{%- macro label(cell) -%}
{%- set nbgrader = cell.metadata.nbgrader -%}
{%- if nbgrader.solution and cell.cell_type == 'markdown' -%}Your written answer
{%- elif nbgrader.solution -%}Your code
{%- elif nbgrader.task -%}Task
{%- else -%}Check <code>{{ nbgrader.grade_id | escape }}</code>{%- endif -%}
{%- endmacro -%}
{%- macro heading(cell) -%}
<div class="head"><span>{{ label(cell) }}</span>
{%- if cell.metadata.nbgrader.grade or cell.metadata.nbgrader.task %}{{ score(cell) }}{% endif %}</div>
{%- endmacro -%}
{%- macro passed(cell) -%}
{%- set nbgrader = cell.metadata.nbgrader -%}
{%- if cell.cell_type == 'code' and nbgrader and nbgrader.grade and not nbgrader.solution and not nbgrader.comment
      and (nbgrader.credit_passed if nbgrader.credit else nbgrader.score is not none
           and (nbgrader.score | float) >= (nbgrader.points | float)) -%}passed{%- endif -%}
{%- endmacro -%}
{%- macro comment(cell) -%}
{%- if cell.metadata.nbgrader.comment -%}
<div class="comment"><b>Comment:</b> {{ cell.metadata.nbgrader.comment | markdown2html }}</div>
{%- endif -%}
{%- endmacro -%}

{%- block header -%}
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ ((resources.nbgrader or {}).notebook or resources.metadata.name) | escape }} — feedback</title>
{%- if feedback.stylesheet %}
<link rel="stylesheet" href="{{ feedback.stylesheet | escape }}">
{%- endif %}
<style>{{ feedback.fallback }}</style>
</head>
{%- endblock header -%}

{%- block body_header -%}
<body>
<main id="notebook">
<h1>{{ ((resources.nbgrader or {}).notebook or resources.metadata.name) | escape }}: feedback</h1>
{%- if resources.nbgrader and resources.nbgrader.max_score is defined %}
{%- set got, of = resources.nbgrader.score | float, resources.nbgrader.max_score | float %}
<p class="total">Total: <b>{{ "%g" | format(got) }} of {{ "%g" | format(of) }} points</b>
{%- if feedback.pending %}, <span class="pending">written answers pending</span>: {{ feedback.pending }} answer
{{- 's' if feedback.pending != 1 }} ({{ "%g" | format(feedback.pending_points) }} points) not graded yet, not counted
in the total
{%- endif %}
{%- if resources.nbgrader.late_penalty %}; late penalty:
−{{ "%g" | format(resources.nbgrader.late_penalty | float) }} points{% endif %}
{%- if feedback.extra_points %}; extra credit (up to {{ "%g" | format(feedback.extra_points) }} points) is counted
in the total and not in the maximum{% endif %}
{%- if feedback.optional %}; optional checks count for no points{% endif %}.</p>
{%- endif %}
<table class="scores"><thead><tr><th>graded cell</th><th>score</th></tr></thead><tbody>
{%- for cell in nb.cells if cell.metadata.nbgrader and (cell.metadata.nbgrader.grade or cell.metadata.nbgrader.task) %}
<tr><td>
{%- if passed(cell) -%}
{{ label(cell) }}{% if cell.metadata.course_feedback %} {{ cell.metadata.course_feedback.line | escape }}{% endif %}
{%- else -%}
<a href="#{{ cell.metadata.nbgrader.grade_id | escape }}">{{ label(cell) }}</a>
{%- if cell.metadata.nbgrader.solution %} <code>{{ cell.metadata.nbgrader.grade_id | escape }}</code>{% endif %}
{%- endif -%}
</td><td>{{ score(cell) }}</td></tr>
{%- endfor %}
</tbody></table>
{%- endblock body_header -%}

{%- block body_footer -%}
</main>
</body>
{%- endblock body_footer -%}

{%- block footer -%}
</html>
{%- endblock footer -%}

{%- block in_prompt -%}{%- endblock in_prompt -%}
{%- block empty_in_prompt -%}{%- endblock empty_in_prompt -%}
{%- block output_area_prompt -%}{%- endblock output_area_prompt -%}

{%- block input_group -%}
{#- a check's code is the course's (`assert check.name(...)`, or a note for hidden tests): its message says it all -#}
{%- if not (cell.metadata.nbgrader and cell.metadata.nbgrader.grade and not cell.metadata.nbgrader.solution) -%}
{{ super.super() }}
{%- endif -%}
{%- endblock input_group -%}

{#- super.super(): the cells' content without the classic template's layers of <div> around it -#}
{%- block output_group -%}
{%- if cell.outputs -%}<div class="output">{{ super.super() }}</div>{%- endif -%}
{%- endblock output_group -%}

{%- block output -%}
<div class="output_area">{{ super.super() }}</div>
{%- endblock output -%}

{%- block input -%}
<div class="input_area">{{ cell.source | highlight_code(metadata=cell.metadata) | clean_html }}</div>
{%- endblock input -%}

{%- block codecell -%}
{%- set nbgrader = cell.metadata.nbgrader -%}
{%- if passed(cell) -%}
{#- a check with its full points: its line in the table at the top says what it checked -#}
{%- elif nbgrader and (nbgrader.grade or nbgrader.solution or nbgrader.task) -%}
<section class="cell code_cell graded" id="{{ nbgrader.grade_id | escape }}">{{ heading(cell) -}}
<div class="body">{{ super.super() }}</div>{{ comment(cell) }}</section>
{%- else -%}
<section class="cell code_cell">{{ super.super() }}</section>
{%- endif -%}
{%- endblock codecell -%}

{%- block markdowncell scoped -%}
{%- set nbgrader = cell.metadata.nbgrader -%}
{%- if nbgrader and (nbgrader.grade or nbgrader.solution or nbgrader.task) -%}
<section class="cell text_cell graded" id="{{ nbgrader.grade_id | escape }}">{{ heading(cell) -}}
<div class="body rendered_html">{{ cell.source | markdown2html }}</div>{{ comment(cell) }}</section>
{%- elif cell.metadata.course_feedback and cell.metadata.course_feedback.omitted -%}
<div class="cell omitted-cells rendered_html">{{ cell.source | markdown2html }}</div>
{%- else -%}
<section class="cell text_cell rendered_html">{{ cell.source | markdown2html }}</section>
{%- endif -%}
{%- endblock markdowncell -%}
"""


def _remote_image(match: re.Match[str]) -> str:
    """An image from the web as its alt text (escaped again: an attribute's value may hold a raw "<")."""
    alt = re.search(r'\balt="([^"]*)"', match.group(0))
    text = html.unescape(alt.group(1)).strip() if alt else ""
    return f'<span class="remote-image">{html.escape(text or "image", quote=False)}</span>'


_REMOTE_IMAGE = re.compile(r"<img\b[^>]*\bsrc=\"https?:[^\"]*\"[^>]*>", re.IGNORECASE)


# Pygments' tokens that its default style leaves in the text's colour (names, punctuation, whitespace) or
# nearly (operators, #666): their spans are a third of a highlighted cell's bytes and change (almost) nothing.
_PLAIN_TOKEN = re.compile(r'<span class="(?:n|p|w|o)">([^<]*)</span>')


def finished_page(page: str) -> str:
    """A rendered page as it is written: math as MathML, images from the web (which the policy would not load,
    such as the Colab badge's) as their alt text, code without the spans of plain tokens, no script, the policy
    first in its head."""
    return without_scripts(render_math(_PLAIN_TOKEN.sub(r"\1", _REMOTE_IMAGE.sub(_remote_image, page))))


class SafeFeedbackExporter(HTMLExporter):
    """nbgrader's feedback HTML: what a student reads, with a Content-Security-Policy and without scripts (see the
    module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.template_name = "classic"
        self.extra_loaders = [jinja2.DictLoader({"course_feedback.html.j2": TEMPLATE})]
        self.template_file = "course_feedback.html.j2"

    def _create_environment(self) -> jinja2.Environment:
        environment = super()._create_environment()
        environment.bytecode_cache = COMPILED_TEMPLATES
        return environment

    def default_filters(self):  # noqa: ANN201  (nbconvert's generator of (name, filter))
        """nbconvert's filters, with markdown and HTML sanitised after rendering (`inert`) whatever the config."""
        yield from super().default_filters()
        yield from FILTERS.items()

    def _course_directory(self) -> Any:
        from nbgrader.coursedir import CourseDirectory

        return CourseDirectory(config=self.config)

    def _release(self, assignment: str, notebook: str) -> NotebookNode | None:
        """The released notebook the student started from, or None when it is not to be had."""
        coursedir = self._course_directory()
        path = Path(coursedir.format_path(coursedir.release_directory, ".", assignment)) / f"{notebook}.ipynb"
        try:
            return nbformat.read(path, as_version=4)
        except (OSError, ValueError):
            return None

    def _stylesheet(self, assignment: str, student: str) -> str:
        """The class's feedback.css, written when missing or stale; returns its address relative to the page."""
        coursedir = self._course_directory()
        folder = Path(coursedir.format_path(coursedir.feedback_directory, ".", ".")).resolve()
        page_folder = Path(coursedir.format_path(coursedir.feedback_directory, student, assignment)).resolve()
        path, text = folder / STYLESHEET, stylesheet()
        try:
            current = path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != text:
            folder.mkdir(parents=True, exist_ok=True)
            write_text_atomically(path, text)
        return Path(os.path.relpath(path, page_folder)).as_posix()

    def _preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        """The configured preprocessors (grades, hidden tests, inert text), after the page is shaped for the student
        (`shape_notebook`, `mark_pending`) where nbgrader says whose notebook this is."""
        about = resources.get("nbgrader") or {}
        shown: dict[str, Any] = {"fallback": _FALLBACK, "pending": 0, "pending_points": 0.0}
        if all(about.get(key) for key in ("assignment", "notebook", "student")):
            nb = shape_notebook(nb, self._release(about["assignment"], about["notebook"]))
            if about.get("db_url"):
                shown["pending"], shown["pending_points"] = mark_pending(
                    nb, about["db_url"], about["notebook"], about["assignment"], about["student"])
            shown["stylesheet"] = self._stylesheet(about["assignment"], about["student"])
        shown["extra_points"], shown["optional"] = mark_credit(nb)
        resources["course_feedback"] = shown
        return super()._preprocess(nb, resources)

    def from_notebook_node(self, nb: NotebookNode, resources: dict | None = None, **kw: object) -> tuple[str, dict]:
        page, resources = super().from_notebook_node(nb, resources, **kw)
        return finished_page(page), resources
