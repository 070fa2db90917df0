"""Graded checks: one property per function, shared by nbgrader and the Colab self-check.

Each stage has its own module (`positional_encoding`, `attention`, `blocks`, `model`, `training`,
`decoding`). A check
takes the student's class or function, returns True when the property holds and prints a
pass line, or raises `CheckFailed` whose message says what was expected, what came out and
the likely cause. Grade cells call them as `assert check.name(StudentThing)`.
"""

from transformer_course.checks.framework import CheckFailed, results, summary

__all__ = ["CheckFailed", "results", "summary"]
