"""Interactive (plotly) figures that show everywhere.

A plain plotly figure appears only where a front end runs plotly.js: JupyterLab, VS Code, Colab. In
nbconvert's HTML and on GitHub (self-learners reading `solutions/`) it is blank. `InteractiveFigure`
therefore displays one bundle with three versions of the same figure, and each front end picks the
richest it can show:

- `application/vnd.plotly.v1+json`: the plotly figure (JupyterLab, VS Code: interactive);
- `text/html`: the static picture, replaced by the interactive figure once plotly.js has loaded from
  its CDN (Colab, nbconvert HTML when online; offline and where scripts are stripped, the picture
  stays). plotly.js itself (about 3.5 MB) is not inlined into every output;
- `image/png`: the same data drawn with matplotlib (GitHub, PDF, anything else). No Chrome, no Kaleido.
"""

from __future__ import annotations

import base64
import io
import json
import re
import uuid
from html import escape
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from matplotlib.colors import Colormap, LinearSegmentedColormap
from matplotlib.figure import Figure
from plotly.offline import get_plotlyjs_version

from transformer_course.visualisation.unseen import not_drawn_while_grading

PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"


def _ticks(axis: Any) -> tuple[list[float], list[str]] | None:
    if axis.tickvals is not None and axis.ticktext is not None:
        return [float(v) for v in axis.tickvals], [str(t) for t in axis.ticktext]
    return None


def _title(layout: Any) -> str:
    return (layout.title.text or "") if layout.title is not None else ""


def _colour(text: str) -> tuple[float, ...] | str:
    """plotly's 'rgb(8, 48, 107)' (or a named / hex colour) as matplotlib understands it."""
    match = re.fullmatch(r"\s*rgba?\(([^)]*)\)\s*", text)
    if not match:
        return text
    parts = [float(part) for part in match.group(1).split(",")]
    return tuple(value / 255 for value in parts[:3]) + tuple(parts[3:4])


def _colour_map(scale: Any) -> Colormap | str:
    """The trace's plotly colour scale as a matplotlib colour map (same stops, same colours)."""
    if not scale:
        return "viridis"
    return LinearSegmentedColormap.from_list("plotly", [(float(stop), _colour(colour)) for stop, colour in scale])


def draw_static(figure: go.Figure) -> Figure:
    """A matplotlib drawing of a plotly figure's visible heatmap and line traces, with its colour
    scale, axis labels, tick labels and title (a slider shows the step the figure opens with)."""
    layout = figure.layout
    width, height = (layout.width or 640) / 100, (layout.height or 480) / 100
    static, axis = plt.subplots(figsize=(min(width, 14), min(height, 12)), layout="constrained")
    for trace in figure.data:
        if trace.visible is False:
            continue
        if isinstance(trace, go.Heatmap):
            top_down = layout.yaxis.autorange == "reversed"  # else plotly puts row 0 at the bottom
            image = axis.imshow(np.asarray(trace.z, dtype=float), cmap=_colour_map(trace.colorscale),
                                vmin=trace.zmin, vmax=trace.zmax, aspect="auto",
                                origin="upper" if top_down else "lower")
            label = trace.colorbar.title.text if trace.colorbar and trace.colorbar.title else None
            static.colorbar(image, ax=axis, label=label or "")
        elif isinstance(trace, go.Scatter):
            axis.plot(trace.x if trace.x is not None else range(len(trace.y)), trace.y, label=trace.name)
    x_ticks, y_ticks = _ticks(layout.xaxis), _ticks(layout.yaxis)
    if x_ticks:
        axis.set_xticks(x_ticks[0], x_ticks[1], rotation=60, ha="right", fontsize=8)
    if y_ticks:
        axis.set_yticks(y_ticks[0], y_ticks[1], fontsize=8)
    if layout.xaxis.title and layout.xaxis.title.text:
        axis.set_xlabel(layout.xaxis.title.text)
    if layout.yaxis.title and layout.yaxis.title.text:
        axis.set_ylabel(layout.yaxis.title.text)
    axis.set_title(_title(layout), fontsize=10)
    if any(isinstance(trace, go.Scatter) and trace.name for trace in figure.data):
        axis.legend()
    return static


def _png(static: Figure) -> bytes:
    buffer = io.BytesIO()
    static.savefig(buffer, format="png", dpi=90)
    plt.close(static)
    return buffer.getvalue()


class InteractiveFigure:
    """A plotly figure with an HTML and a PNG version of itself (see the module docstring).

    Show it as a cell's last expression or with `.show()`; `.figure` is the plotly figure."""

    def __init__(self, figure: go.Figure) -> None:
        self.figure = figure

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        png = base64.b64encode(_png(draw_static(self.figure))).decode("ascii")
        spec = json.loads(pio.to_json(self.figure, validate=False))
        spec["config"] = {"responsive": True}
        return {
            PLOTLY_MIMETYPE: spec,
            "text/html": self.html(png, spec),
            "image/png": png,
            "text/plain": f"<interactive figure: {_title(self.figure.layout) or 'plotly'}>",
        }

    def html(self, png: str, spec: dict[str, Any]) -> str:
        """The static picture in a div, and a script that swaps in the interactive figure once plotly.js
        has loaded (hiding an AMD `define`, as classic notebooks have, so plotly.js sets window.Plotly)."""
        target = f"figure-{uuid.uuid4().hex}"
        title = escape(_title(self.figure.layout) or "figure")
        source = f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"
        payload = json.dumps(spec).replace("</", "<\\/")
        return (
            f'<div id="{target}"><img src="data:image/png;base64,{png}" alt="{title}" '
            f'style="max-width: 100%"></div>\n'
            "<script>(function () {\n"
            f'  var target = document.getElementById("{target}"), spec = {payload};\n'
            "  function draw() { target.innerHTML = \"\"; "
            "window.Plotly.newPlot(target, spec.data, spec.layout, spec.config); }\n"
            "  if (window.Plotly) { draw(); return; }\n"
            "  var script = document.createElement(\"script\"), define = window.define;\n"
            f'  script.src = "{source}"; window.define = undefined;\n'
            "  script.onload = function () { window.define = define; draw(); };\n"
            "  script.onerror = function () { window.define = define; };\n"
            "  document.head.appendChild(script);\n"
            "})();</script>"
        )

    @not_drawn_while_grading  # nobody sees it, and drawing its PNG would cost every student's grading time
    def show(self) -> None:
        """Display in a notebook; elsewhere print a one-line description; while grading, nothing."""
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            print(self._repr_mimebundle_()["text/plain"])
            return
        if get_ipython() is None:
            print(f"<interactive figure: {_title(self.figure.layout) or 'plotly'}>")
            return
        display(self)
