"""Interactive figures show everywhere: the plotly JSON for JupyterLab and VS Code, HTML for Colab and
nbconvert (a static picture that plotly.js replaces when it loads), and a PNG for GitHub, drawn with
matplotlib from the same data."""

import base64
import io
import subprocess
import sys

import matplotlib.pyplot as plt
import nbformat
import numpy as np
import torch
from nbconvert import HTMLExporter

from transformer_course.visualisation.attention_maps import plot_attention_interactive
from transformer_course.visualisation.interactive import PLOTLY_MIMETYPE, draw_static


def figure():
    weights = torch.rand(2, 1, 3, 4, 5, generator=torch.Generator().manual_seed(0)).softmax(-1)
    return plot_attention_interactive(weights, ["a", "dog", "runs", "."], ["ein", "hund", "läuft", ".", "<eos>"],
                                      title="Cross-attention", query_label="English", key_label="German")


def test_the_bundle_carries_plotly_json_html_with_a_picture_and_a_png():
    bundle = figure()._repr_mimebundle_()
    assert bundle[PLOTLY_MIMETYPE]["data"][0]["type"] == "heatmap"
    png = base64.b64decode(bundle["image/png"])
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    html = bundle["text/html"]
    assert f'src="data:image/png;base64,{bundle["image/png"]}"' in html  # visible with scripts stripped
    assert "Plotly.newPlot" in html and "cdn.plot.ly/plotly-" in html
    assert html.count("</script>") == 1 and html.rstrip().endswith("</script>")  # the data cannot end it early


def test_the_static_picture_draws_the_figure_s_own_data():
    interactive = figure()
    static = draw_static(interactive.figure)
    image = static.axes[0].images[0]
    assert np.allclose(image.get_array(), np.asarray(interactive.figure.data[0].z, dtype=float))
    assert [t.get_text() for t in static.axes[0].get_xticklabels()] == ["ein", "hund", "läuft", ".", "<eos>"]
    assert "Cross-attention" in static.axes[0].get_title()
    plt.close(static)


def test_nbconvert_html_and_a_plain_reader_show_the_figure():
    interactive = figure()
    bundle = interactive._repr_mimebundle_()
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("figure.show()")
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    notebook.cells.append(cell)
    html, _ = HTMLExporter().from_notebook_node(notebook)
    assert "data:image/png;base64," in html and "Plotly.newPlot" in html
    plain = {key: value for key, value in bundle.items() if key in ("image/png", "text/plain")}  # e.g. GitHub
    assert plt.imread(io.BytesIO(base64.b64decode(plain["image/png"]))).shape[-1] in (3, 4)


def test_stage_0_alignment_heatmap_also_carries_html_and_a_png():
    from transformer_course.visualisation.why_attention import plot_alignment_interactive

    weights = torch.rand(3, 4, generator=torch.Generator().manual_seed(1)).softmax(-1)  # (tgt_len, src_len)
    interactive = plot_alignment_interactive(weights, ["ein", "hund", "läuft", "."], ["a", "dog", "runs"])
    bundle = interactive._repr_mimebundle_()
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    assert f'src="data:image/png;base64,{bundle["image/png"]}"' in bundle["text/html"]
    assert np.allclose(np.asarray(interactive.figure.data[0].z, dtype=float), weights.numpy())


def test_importing_the_figure_modules_does_not_import_plotly():
    """Grading imports the notebooks' modules in every student's sandbox: plotly would cost a second there."""
    code = ("import sys\nimport transformer_course.visualisation.why_attention, "
            "transformer_course.visualisation.attention_maps\nprint('plotly' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-1000:]


def test_an_interactive_figure_shows_nothing_while_grading(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objects, **keywords: shown.append(objects))
    monkeypatch.setattr("IPython.get_ipython", lambda: object())  # as if in a notebook
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    figure().show()
    assert shown == []
    monkeypatch.delenv("NBGRADER_EXECUTION")
    figure().show()
    assert len(shown) == 1
