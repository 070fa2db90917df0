"""The class report's plots, drawn as small SVG by plain string building: horizontal bar charts (the pass
rate of every check, the most frequent causes) and a grid of histograms (the totals of every stage).

Text is measured by its number of characters (about 0.6 of the font size each), never by a font engine,
so a plot costs milliseconds. Every text that reaches the SVG, a student's included, goes through
`html.escape`: it is drawn as written (a "$" as a "$"), and it cannot open an element, run or fetch
anything. A plot is an image with a name (`role="img"`, `aria-label` and a `<title>`), at most
MAX_WIDTH x MAX_HEIGHT pixels, so it fits on a screen; a label too long for the left margin is cut with
"…", and its full text is the tooltip (`<title>`) of its bar.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

MAX_WIDTH, MAX_HEIGHT = 1100, 675  # pixels: a plot fits a 1280 x 900 screen with room around it
CHARACTER_WIDTH = 0.6  # the width of a character, as a share of the font size (a generous estimate)
LABEL_CHARACTERS = 70  # longer labels are cut, their full text kept in the tooltip
FONT = "system-ui, sans-serif"
INK, MUTED, GRID = "#1a1a1a", "#555555", "#dddddd"


def escape(text: object) -> str:
    """The text, safe inside an element or a quoted attribute."""
    return html.escape(str(text), quote=True)


def text_width(text: str, size: float) -> float:
    """The estimated width in pixels of `text` drawn at font `size`."""
    return CHARACTER_WIDTH * size * len(text)


def shorten(text: str, characters: int) -> str:
    """The text, cut to at most `characters` characters with a final "…" when longer."""
    return text if len(text) <= characters else text[: max(0, characters - 1)] + "…"


def axis_ticks(maximum: float, most: int = 6) -> list[float]:
    """Round tick values from 0 to at least `maximum` (steps of 1, 2 or 5 times a power of ten, at least
    1: the axes count students or percentages), at most `most` + 1 of them."""
    if maximum <= 0:
        return [0.0, 1.0]
    power = 1.0
    while True:
        for factor in (1, 2, 5):
            step = factor * power
            if math.ceil(maximum / step - 1e-9) <= most:
                return [step * index for index in range(math.ceil(maximum / step - 1e-9) + 1)]
        power *= 10


def _number(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, content: str, size: float, anchor: str = "start", fill: str = INK,
          extra: str = "") -> str:
    return (f'<text x="{_number(x)}" y="{_number(y)}" font-size="{_number(size)}" text-anchor="{anchor}" '
            f'fill="{fill}"{extra}>{escape(content)}</text>')


def _line(x1: float, y1: float, x2: float, y2: float, colour: str) -> str:
    return (f'<line x1="{_number(x1)}" y1="{_number(y1)}" x2="{_number(x2)}" y2="{_number(y2)}" '
            f'stroke="{colour}" stroke-width="1"/>')


def _rectangle(x: float, y: float, width: float, height: float, colour: str, kind: str) -> str:
    return (f'<rect class="{kind}" x="{_number(x)}" y="{_number(y)}" width="{_number(max(0.0, width))}" '
            f'height="{_number(max(0.0, height))}" fill="{colour}"/>')


def _svg(width: float, height: float, title: str, body: str) -> str:
    width, height = math.ceil(width), math.ceil(height)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" font-family="{FONT}">'
            f"<title>{escape(title)}</title>{body}</svg>")


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], colour: str, axis_label: str,
              value_labels: Sequence[str], axis_maximum: float | None = None,
              tooltips: Sequence[str] | None = None) -> str:
    """A horizontal bar per label, top to bottom in the order given, with its value label beside the bar.

    `axis_maximum` is the value of a full bar (100 for percentages); by default the largest value, rounded
    up to a tick. `tooltips` are the bars' hover texts (by default the full label and the value label).
    Rows shrink to fit MAX_HEIGHT down to 9 pixels (font 7): up to 65 bars fit, more make a taller image
    (a stage has at most 25 checks).
    """
    count = len(labels)
    title_size = 14
    row = min(24.0, max(9.0, (MAX_HEIGHT - 36 - 46) / max(1, count)))
    size = min(12.0, max(7.0, row * 0.55))
    shown = [shorten(label, LABEL_CHARACTERS) for label in labels]
    left = 10 + max((text_width(label, size) for label in shown), default=0) + 8
    right = 10 + max((text_width(label, size) for label in value_labels), default=0) + 6
    ticks = axis_ticks(max(values, default=0) if axis_maximum is None else axis_maximum)
    maximum = axis_maximum if axis_maximum is not None else ticks[-1]
    plot = max(120.0, min(600.0, MAX_WIDTH - left - right))
    width = max(left + plot + right, min(MAX_WIDTH, 10 + text_width(title, title_size) + 10))
    top, height = 36.0, 36 + count * row + 46
    parts = [_text(10, 20, title, title_size, extra=' font-weight="600"')]
    bottom = top + count * row
    for tick in ticks:
        x = left + plot * tick / maximum if maximum else left
        parts.append(_line(x, top, x, bottom, GRID))
        parts.append(_text(x, bottom + 15, _number(tick), 10, "middle", MUTED))
    parts.append(_line(left, top, left, bottom, MUTED))
    parts.append(_text(left + plot / 2, bottom + 36, axis_label, 11, "middle"))
    for index, (label, value, value_label) in enumerate(zip(shown, values, value_labels, strict=True)):
        middle = top + (index + 0.5) * row
        length = plot * min(value, maximum) / maximum if maximum else 0.0
        tooltip = tooltips[index] if tooltips is not None else f"{labels[index]}: {value_label}"
        parts.append(f"<g><title>{escape(tooltip)}</title>"
                     + _text(left - 8, middle + size * 0.35, label, size, "end")
                     + _rectangle(left, middle - row * 0.35, length, row * 0.7, colour, "bar")
                     + _text(left + length + 4, middle + size * 0.35, value_label, size) + "</g>")
    return _svg(width, height, title, "".join(parts))


def histogram_counts(values: Sequence[float], edges: Sequence[float]) -> list[int]:
    """How many values fall in each bin [edges[i], edges[i + 1]) (the last bin includes its right edge;
    a value outside the edges counts in the nearest bin)."""
    counts = [0] * (len(edges) - 1)
    for value in values:
        index = sum(value >= edge for edge in edges[1:-1])
        counts[index] += 1
    return counts


def histogram_grid(title: str, panels: Sequence[tuple[str, Sequence[float]]], edges: Sequence[float],
                   colour: str, x_label: str, y_label: str, columns: int = 4) -> str:
    """A small histogram per (panel title, values), at most `columns` to a line, every panel with the same
    bins (`edges`) and its own integer count axis. `title` names the whole image (not drawn)."""
    count = max(1, len(panels))
    columns = min(columns, count)
    lines = math.ceil(count / columns)
    panel_width = min(270.0, MAX_WIDTH / columns)
    panel_height = min(200.0, MAX_HEIGHT / lines)
    left, right, top, bottom = 42.0, 12.0, 26.0, 36.0
    plot_width, plot_height = panel_width - left - right, panel_height - top - bottom
    parts = []
    for index, (name, values) in enumerate(panels):
        x0, y0 = (index % columns) * panel_width, (index // columns) * panel_height
        x, y = x0 + left, y0 + top
        counts = histogram_counts(values, edges)
        ticks = axis_ticks(max(counts, default=0), 4)
        highest = ticks[-1]
        shown = shorten(name, int((panel_width - 8) / (CHARACTER_WIDTH * 10)))
        parts.append(f"<g><title>{escape(name)}</title>"
                     + _text(x0 + panel_width / 2, y0 + 15, shown, 10, "middle", extra=' font-weight="600"') + "</g>")
        for tick in ticks:
            ty = y + plot_height - plot_height * tick / highest
            parts.append(_line(x, ty, x + plot_width, ty, GRID))
            parts.append(_text(x - 5, ty + 3.5, _number(tick), 9, "end", MUTED))
        span = edges[-1] - edges[0]
        for low, high, number in zip(edges, edges[1:], counts, strict=False):
            bar_x = x + plot_width * (low - edges[0]) / span
            bar_width = plot_width * (high - low) / span
            bar_height = plot_height * number / highest
            parts.append(f"<g><title>{escape(f'{name}: {number} in {_number(low)}–{_number(high)}')}</title>"
                         + _rectangle(bar_x + 0.5, y + plot_height - bar_height, bar_width - 1, bar_height, colour,
                                      "bar") + "</g>")
        parts.append(_line(x, y + plot_height, x + plot_width, y + plot_height, MUTED))
        for tick in axis_ticks(span, 5):
            tx = x + plot_width * tick / span
            parts.append(_text(tx, y + plot_height + 12, _number(edges[0] + tick), 9, "middle", MUTED))
        parts.append(_text(x + plot_width / 2, y + plot_height + 28, x_label, 10, "middle"))
        label_x, label_y = x0 + 11, y + plot_height / 2
        parts.append(_text(label_x, label_y, y_label, 10, "middle",
                           extra=f' transform="rotate(-90 {_number(label_x)} {_number(label_y)})"'))
    return _svg(columns * panel_width, lines * panel_height, title, "".join(parts))
