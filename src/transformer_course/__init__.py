"""Transformers from Scratch: shared code for the graded course.

Layers, lowest first (nothing imports upward):
runtime -> reference (the model) -> visualisation -> checks -> grading.
"""

__version__ = "0.1.0"
