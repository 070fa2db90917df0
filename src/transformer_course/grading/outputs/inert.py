"""Text a student (or an instructor) wrote, made inert before any page shows it.

A written answer is markdown, and markdown passes raw HTML through: `<img src=x onerror=...>` or
`<script>` in an answer would run as script in nbgrader's feedback page and in the instructor's logged-in
formgrader, from where it could reach the Jupyter server. Rules on the markdown's lines cannot see what the
renderer will make of it (a link whose destination starts on the next line, `[x](\\njavascript:...)`, got
through such rules: issue 29), so the course sanitises the *rendered HTML* instead, with nh3 (the Rust
sanitiser ammonia, built on a real HTML5 parser) and a short allow-list (`sanitize_html`): text formatting,
lists, code, tables, links to http(s), mailto and `#` only, images from http(s) or PNG/JPEG `data:`
addresses, no attribute that runs or styles anything, no SVG, MathML, form, frame or script.

`markdown_html` renders markdown with nbconvert's own renderer (the one feedback and the formgrader use) with
raw HTML shown as text, then sanitises. Math is kept as written inside a marker, `<span class="math-tex">$...$
</span>`, which reads as the TeX where nothing else is done and which the feedback pages turn into MathML
(`mathml.render_math`, after sanitising: the sanitiser itself lets no MathML through). `inert_markdown` wraps
that HTML as markdown that any CommonMark renderer passes through unchanged: one HTML block on one line (every
newline written `&#10;`, which HTML reads as a newline), so no later markdown pass can find a link or a tag in it.

`InertNotebook` (an nbconvert preprocessor) puts every markdown cell, raw cell, nbgrader comment and rich
output of a notebook through this before it is rendered (a written answer and a comment with their raw HTML
shown as text, as written; the notebook's other markdown cells, such as the Colab badge of the first, with it
parsed, and the sanitiser keeps what is safe); `configure` also replaces the exporter's
`markdown2html` and `clean_html` filters with sanitising ones, so whatever a template renders from
markdown or HTML is sanitised again after rendering, even text no preprocessor saw.
"""

from __future__ import annotations

import re
from typing import Any

import jinja2
import nh3
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath
from nbconvert.preprocessors import Preprocessor
from nbformat import NotebookNode
from traitlets import Bool
from traitlets.config import Config

# What a student's text may become: text formatting, lists, code, tables, links and images. No style
# attribute (a fixed overlay could dress a fake button over the formgrader), no form, frame, SVG or MathML.
TAGS = {"a", "abbr", "b", "blockquote", "br", "caption", "code", "dd", "del", "details", "div", "dl", "dt",
        "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "ol", "p", "pre", "q",
        "s", "samp", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th",
        "thead", "tr", "u", "ul", "var"}
ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title", "width", "height"}, "ol": {"start"},
              "td": {"align", "colspan", "rowspan"}, "th": {"align", "colspan", "rowspan", "scope"},
              "abbr": {"title"}}
# Classes only of the renderers' own making: pygments' token classes in highlighted code, pandas' tables,
# the wrapper of `inert_markdown`; never a class of the page around it (bootstrap's in the formgrader).
_PYGMENTS = {"highlight", "hll", "c", "err", "k", "l", "n", "o", "x", "p", "ch", "cm", "cp", "cpf", "c1", "cs",
             "gd", "ge", "gr", "gh", "gi", "go", "gp", "gs", "gu", "gt", "kc", "kd", "kn", "kp", "kr", "kt", "ld",
             "m", "s", "na", "nb", "nc", "no", "nd", "ni", "ne", "nf", "nl", "nn", "nx", "py", "nt", "nv", "ow",
             "w", "mb", "mf", "mh", "mi", "mo", "sa", "sb", "sc", "dl", "sd", "s2", "se", "sh", "si", "sx", "sr",
             "s1", "ss", "bp", "fm", "vc", "vg", "vi", "vm", "il"}
CLASSES = {"div": {"highlight", "inert-markdown"}, "span": _PYGMENTS | {"math-tex", "math-display"},
           "pre": {"highlight"}, "code": _PYGMENTS | {"math-tex"}, "table": {"dataframe"}}
URL_SCHEMES = {"http", "https", "mailto", "data"}
_IMAGE_DATA = re.compile(r"data:image/(?:png|jpeg);base64,[A-Za-z0-9+/=\s]*\Z", re.IGNORECASE)
_WEB = re.compile(r"(?:https?:|mailto:)", re.IGNORECASE)
WRAPPER = '<div class="inert-markdown">'
# The mimetypes of a code cell's output that a page may show, each made inert below; everything else
# (javascript, widgets, SVG, PDF, other HTML-ish types a template might inline) is dropped.
OUTPUT_TYPES = ("text/plain", "text/html", "text/markdown", "text/latex", "image/png", "image/jpeg")


def _attribute(tag: str, attribute: str, value: str) -> str | None:
    """An allowed attribute's value, or None to drop it: a link goes to the web, mail or this page only (nh3
    lets `data:` through for images, so it is refused here for links), an image is the web or PNG/JPEG."""
    if attribute == "href":
        return value if _WEB.match(value) or value.startswith("#") else None
    if attribute == "src":
        return value if re.match(r"https?:", value, re.IGNORECASE) or _IMAGE_DATA.match(value) else None
    return value


def sanitize_html(fragment: str) -> str:
    """FRAGMENT with only the allow-list's tags, attributes, classes and addresses left (see the module).

    A relative address other than `#fragment` is dropped: in the formgrader it would be a request to the
    Jupyter server with the instructor's rights."""
    return nh3.clean(fragment, tags=TAGS, clean_content_tags={"script", "style"}, attributes=ATTRIBUTES,
                     attribute_filter=_attribute, url_schemes=URL_SCHEMES, allowed_classes=CLASSES,
                     url_relative=lambda url: url if url.startswith("#") else None, strip_comments=True)


class MarkedMathRenderer(IPythonRenderer):
    """nbconvert's markdown renderer with each formula kept as written inside a marker `mathml.render_math`
    finds: `<span class="math-tex">$...$</span>`, with `math-display` for display math."""

    def inline_math(self, body: str) -> str:
        return f'<span class="math-tex">{super().inline_math(body)}</span>'

    def block_math(self, body: str) -> str:
        return f'<span class="math-tex math-display">{super().block_math(body)}</span>'

    def latex_environment(self, name: str, body: str) -> str:
        return f'<span class="math-tex math-display">{super().latex_environment(name, body)}</span>'


def markdown_html(text: str, attachments: dict | None = None, raw_html: bool = False) -> str:
    """TEXT rendered as nbconvert renders markdown (math kept as written, in a `math-tex` marker), then
    sanitised.

    Raw HTML in TEXT is shown as text unless RAW_HTML (then it is parsed, and the sanitiser decides)."""
    renderer = MarkedMathRenderer(escape=not raw_html, allow_harmful_protocols=False, attachments=attachments or {},
                                  exclude_anchor_links=True)  # no "¶" after every heading
    return sanitize_html(MarkdownWithMath(renderer=renderer).render(text))


def as_markdown(fragment: str) -> str:
    """Sanitised HTML as markdown that renders to exactly that HTML (one HTML block on one line)."""
    return WRAPPER + fragment.replace("\r", "").replace("\n", "&#10;") + "</div>"


def inert_markdown(text: str, attachments: dict | None = None, raw_html: bool = False) -> str:
    """TEXT as markdown that renders to TEXT's sanitised HTML and nothing else; idempotent. Raw HTML in TEXT is
    shown as text unless RAW_HTML (see `markdown_html`)."""
    if text.startswith(WRAPPER) and as_markdown(sanitize_html(text)[len(WRAPPER):-len("</div>")]) == text:
        return text  # already inert (sanitised HTML on one line): sanitising again would change nothing
    return as_markdown(markdown_html(text, attachments, raw_html))


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def inert_outputs(outputs: list) -> list:
    """A code cell's outputs with only inert rich data (see OUTPUT_TYPES) and no metadata a template would
    write into the page, except an image's numeric size."""
    kept = []
    for output in outputs:
        if "data" in output:
            data = {kind: value for kind, value in output.data.items() if kind in OUTPUT_TYPES}
            if "text/html" in data:
                data["text/html"] = sanitize_html(_text(data["text/html"]))
            if "text/markdown" in data:
                data["text/markdown"] = inert_markdown(_text(data["text/markdown"]))
            for kind in ("image/png", "image/jpeg"):  # base64 only: the template writes it into src="data:..."
                if kind in data and not re.fullmatch(r"[A-Za-z0-9+/=\s]*", _text(data[kind])):
                    del data[kind]
            if not data:
                continue
            sizes = {kind: {key: value for key, value in output.get("metadata", {}).get(kind, {}).items()
                            if key in ("width", "height") and isinstance(value, int | float)}
                     for kind in ("image/png", "image/jpeg") if kind in data}
            output.data = NotebookNode(data)
            output.metadata = NotebookNode({kind: size for kind, size in sizes.items() if size})
        kept.append(output)
    return kept


class InertNotebook(Preprocessor):
    """nbconvert preprocessor: every markdown and raw cell, nbgrader comment and rich output made inert.

    Enabled by default: nbgrader registers a converter's preprocessors without enabling them (its own
    preprocessors enable themselves), and an nbconvert preprocessor is off unless told otherwise."""

    enabled = Bool(True).tag(config=True)

    def preprocess_cell(self, cell: NotebookNode, resources: dict, index: int) -> tuple[NotebookNode, dict]:
        if cell.cell_type == "markdown":
            # A written answer reads as written (its HTML as text); other markdown (the lesson's, with its Colab
            # badge) is parsed, and the sanitiser keeps what is safe.
            cell.source = inert_markdown(cell.source, cell.get("attachments"), raw_html=not _written_answer(cell))
            cell.pop("attachments", None)  # already inlined as data: images where they were used
        elif cell.cell_type == "raw":
            # Shown as text whatever its format says (a template renders text/html raw cells as HTML).
            cell.source = sanitize_html("<pre>" + _escape(cell.source) + "</pre>")
            cell.metadata["raw_mimetype"] = "text/html"
            cell.pop("attachments", None)
        elif cell.cell_type == "code":
            cell.outputs = inert_outputs(cell.get("outputs", []))
        nbgrader = cell.get("metadata", {}).get("nbgrader", {})
        if isinstance(nbgrader.get("comment"), str):
            nbgrader["comment"] = inert_markdown(nbgrader["comment"])
        return cell, resources


def _written_answer(cell: NotebookNode) -> bool:
    """A cell a student writes in (nbgrader's solution cells: written answers), whose text is shown as written."""
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return not isinstance(nbgrader, dict) or bool(nbgrader.get("solution"))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@jinja2.pass_context
def markdown2html(context: jinja2.runtime.Context, source: str) -> str:
    """The `markdown2html` filter of a template, sanitised after rendering (raw HTML is parsed here, so the
    HTML `InertNotebook` made is kept; the sanitiser removes anything else that could run)."""
    cell = context.get("cell", {}) or {}
    return markdown_html(source, cell.get("attachments", {}) if hasattr(cell, "get") else {}, raw_html=True)


def clean_html(source: str | bytes) -> str:
    """The `clean_html` filter of a template (raw cells, HTML outputs when sanitising), with nh3."""
    return sanitize_html(source.decode("utf-8", "replace") if isinstance(source, bytes) else _text(source))


FILTERS = {"markdown2html": markdown2html, "clean_html": clean_html}


def configure(config: Config) -> Config:
    """CONFIG with every HTML page nbconvert renders (feedback, the formgrader's grading pages) made inert:
    InertNotebook first among its preprocessors, the sanitising filters in place of nbconvert's, and its
    HTML outputs sanitised. Returns CONFIG."""
    preprocessors = list(config.HTMLExporter.get("preprocessors", []))
    if InertNotebook not in preprocessors and "transformer_course.grading.outputs.inert.InertNotebook" not in [
            str(p) for p in preprocessors]:
        preprocessors.insert(0, InertNotebook)
    config.HTMLExporter.preprocessors = preprocessors
    config.HTMLExporter.filters = {**config.HTMLExporter.get("filters", {}), **FILTERS}
    config.HTMLExporter.sanitize_html = True
    return config

