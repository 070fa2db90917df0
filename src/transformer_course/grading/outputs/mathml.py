"""Math in a page as MathML, which Chromium, Firefox and Safari draw themselves: no script, no network.

Markdown is rendered by `inert.markdown_html`, which keeps each formula as written inside a marker,
`<span class="math-tex">$\\sqrt{d_k}$</span>` (display math: `class="math-tex math-display"`). `render_math`
replaces each marker of a finished page by MathML converted from its TeX with latex2mathml.

The MathML is never copied from the converter's text: it is parsed as XML and written again element by
element, keeping only the presentation elements and the attributes that change layout (`ELEMENTS`,
`ATTRIBUTES`), with every text escaped. latex2mathml passes `\\href{...}` and `\\style{...}` through as
attributes; they are dropped here, so a formula a student wrote can link nowhere, style nothing and hold no
HTML. A formula the converter cannot read stays as written, in a `<code>` element.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ElementTree

from latex2mathml.converter import convert

NAMESPACE = "{http://www.w3.org/1998/Math/MathML}"
# MathML Core's presentation elements: no <maction>, <mglyph>, <semantics>/<annotation-xml>, nor anything
# that can hold HTML.
ELEMENTS = {"math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msqrt", "mroot", "mfrac", "msub", "msup",
            "msubsup", "munder", "mover", "munderover", "mmultiscripts", "mprescripts", "none", "mtable", "mtr",
            "mtd", "mstyle", "mpadded", "mphantom", "menclose", "merror"}
ATTRIBUTES = {"display", "mathvariant", "stretchy", "fence", "separator", "lspace", "rspace", "accent",
              "accentunder", "movablelimits", "symmetric", "minsize", "maxsize", "largeop", "linethickness",
              "columnalign", "rowalign", "columnspacing", "rowspacing", "columnlines", "rowlines", "frame",
              "width", "height", "depth", "voffset", "scriptlevel", "displaystyle", "form", "notation"}
_VALUE = re.compile(r"[-\w .%#]*\Z")  # lengths, keywords, numbers: never a url( ) or a quote
MARKER = re.compile(r'<span class="math-tex( math-display)?">(.*?)</span>', re.DOTALL)
MAX_TEX = 2000  # characters of one formula converted; a longer one is shown as written


def _write(element: ElementTree.Element, out: list[str]) -> None:
    tag = element.tag.removeprefix(NAMESPACE)
    if tag not in ELEMENTS:
        return  # dropped with what it holds
    kept = [(name, value) for name, value in sorted(element.attrib.items())
            if name in ATTRIBUTES and _VALUE.match(value)]
    out.append(f"<{tag}" + "".join(f' {name}="{html.escape(value)}"' for name, value in kept) + ">")
    out.append(html.escape(element.text or "", quote=False))
    for child in element:
        _write(child, out)
        out.append(html.escape(child.tail or "", quote=False))
    out.append(f"</{tag}>")


def tex_to_mathml(tex: str, display: bool = False) -> str | None:
    """TEX (without its `$` delimiters) as a `<math>` element of the allow-list above; None when it cannot be
    converted (the caller shows it as written)."""
    if not tex.strip() or len(tex) > MAX_TEX:
        return None
    try:
        root = ElementTree.fromstring(convert(tex, display="block" if display else "inline"))
    except Exception:  # latex2mathml raises many kinds of errors on TeX it does not know  # noqa: BLE001
        return None
    out: list[str] = []
    _write(root, out)
    label = html.escape(tex.strip())
    return out[0].replace("<math", f'<math alttext="{label}"', 1) + "".join(out[1:]) if out else None


def _delimited(text: str) -> tuple[str, bool]:
    """The TeX inside a marker's `$...$`, `$$...$$`, `\\(...\\)`, `\\[...\\]` or environment, and whether it is
    display math."""
    for start, end, display in (("$$", "$$", True), ("$", "$", False), ("\\[", "\\]", True), ("\\(", "\\)", False)):
        if text.startswith(start) and text.endswith(end) and len(text) >= len(start) + len(end):
            return text[len(start):len(text) - len(end)], display
    return text, True  # \begin{...}...\end{...}: latex2mathml reads environments itself


def render_math(page: str) -> str:
    """PAGE with every math marker (`inert.markdown_html`) replaced by MathML, or by the formula as written in
    `<code>` when it cannot be converted."""
    def replace(match: re.Match[str]) -> str:
        written = html.unescape(match.group(2))
        tex, display = _delimited(written)
        mathml = tex_to_mathml(tex, display or bool(match.group(1)))
        if mathml is None:
            return f'<code class="math-tex">{html.escape(written, quote=False)}</code>'
        return mathml

    return MARKER.sub(replace, page)
