"""Transformers from Scratch: shared code for the graded course.

Layers, lowest first (nothing imports upward):
runtime -> reference (the model) -> visualisation -> checks -> grading.
"""

# The one place the version lives (pyproject.toml reads it). Students' notebooks install, link to and
# download the checkpoint from the git tag "v" + __version__: see website/instructor/releasing.md.
__version__ = "0.1.0"
