"""Grading layer: nbgrader plug-ins and instructor tools (top of the package)."""
