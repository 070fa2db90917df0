"""Sphinx configuration of the course website (built by `python -m website.build`, never run by hand).

The pages arrive already run (website/build.py runs them with jupyter-cache), so MyST-NB only renders them.
Everything a page loads is in the site itself: MathJax (SVG output, one file, from the PyPI package
sphinx-mathjax-offline), plotly.js (from the plotly package the course already uses) and the theme's fonts.
"""

from __future__ import annotations

import shutil
import tomllib
from importlib import metadata
from pathlib import Path

import plotly

from transformer_course import __version__
from website.build import ROOT  # noqa: E402  (this file is copied into the build folder; build.py sets PYTHONPATH)

REPOSITORY = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Repository"]

project = "Transformers from Scratch"
author = "the course authors"
copyright = "the course authors"
version = release = __version__
html_title = f"Transformers from Scratch (release v{__version__})"

extensions = ["myst_nb", "sphinx_design"]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "stage_table.md"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

nb_execution_mode = "off"  # website/build.py has run every page (and cached it) before Sphinx reads it
nb_merge_streams = True  # one block per cell for text printed in several pieces
nb_ipywidgets_js: dict = {}  # no widget manager (it would come from a CDN); the pages have no widgets
# The lessons are notebooks first: some jump from a level-2 heading to a level-4 one.
suppress_warnings = ["myst.header"]

mathjax_path = "mathjax/tex-svg-full.js"  # copied from sphinx-mathjax-offline below: no CDN
html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_last_updated_fmt = None
html_use_index = False  # no API to index: an empty "Index" page would only confuse
html_copy_source = False  # the .ipynb sources are large; the Colab button opens the exercise notebook instead
html_show_sourcelink = False
html_favicon = "_static/favicon.svg"
html_context = {"default_mode": "light"}  # the theme logs an error in a fresh browser when this is empty
html_theme_options = {
    "repository_url": REPOSITORY,
    "use_repository_button": True,
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "navigation_with_keys": False,
    "use_download_button": False,
    "use_fullscreen_button": False,
}


def mathjax_file() -> Path:
    """MathJax 3's SVG bundle with every TeX extension (nothing loaded later), from sphinx-mathjax-offline."""
    distribution = metadata.distribution("sphinx-mathjax-offline")
    return Path(str(distribution.locate_file("sphinx-mathjax-offline/static/mathjax/tex-svg-full.js")))


def copy_scripts(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        static = Path(app.outdir) / "_static"
        (static / "mathjax").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mathjax_file(), static / "mathjax" / "tex-svg-full.js")
        shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", static / "plotly.min.js")


def interactive_scripts(app, pagename, templatename, context, doctree) -> None:
    """plotly.js (4.6 MB) only on the pages that have an interactive figure."""
    if "course-interactive" in context.get("body", ""):
        app.add_js_file("plotly.min.js")
        app.add_js_file("course-figures.js")


def setup(app):
    app.connect("html-page-context", interactive_scripts)
    app.connect("build-finished", copy_scripts)
    return {"parallel_read_safe": True}
