"""nbgrader configuration for the course (nbgrader reads it from this folder).

Run nbgrader from here (`cd autograde && nbgrader ...`), or use the course's tools, which do.
Paths: solutions/ is the nbgrader *source*, notebooks/ the *release*; student submissions,
autograded copies, feedback and the gradebook live under autograde/class/ (not committed).
"""

from pathlib import Path

from nbgrader.converters import Autograde

from transformer_course.grading.outputs.feedback import HideHiddenTests, InertNotebook, SafeFeedbackExporter
from transformer_course.grading.sandbox.executor import autograde_pipeline

c = get_config()  # noqa: F821  (injected by traitlets)

course = Path(__file__).resolve().parent.parent
classroom = course / "autograde" / "class"

c.CourseDirectory.course_id = "transformers-from-scratch"
c.CourseDirectory.root = str(course)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = str(classroom / "submitted")
c.CourseDirectory.autograded_directory = str(classroom / "autograded")
c.CourseDirectory.feedback_directory = str(classroom / "feedback")
c.CourseDirectory.db_url = f"sqlite:///{classroom / 'gradebook.db'}"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "*.py"]

# What students see where they write code.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Autograding: nbgrader's Execute is replaced by the course's JudgedExecute
# (transformer_course.grading.sandbox.executor): every notebook runs in the student's sandboxed runner, and
# every grade cell is judged in the grader's own process, which runs no student code (only values come back
# from the student's side); a cell that runs away is stopped after the timeout, a runner that dies costs one
# cell, huge outputs are cut.
c.JudgedExecute.timeout = 120
c.Autograde.autograde_preprocessors = autograde_pipeline(
    Autograde.class_traits()["autograde_preprocessors"].default())

# A library warning printed on stderr would otherwise zero a passing grade cell.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"\w*Warning\b"

# Short tracebacks and bounded output in autograded copies and feedback.
c.LimitOutput.max_lines = 200
c.LimitOutput.max_traceback = 12

# Feedback never shows hidden test source (nor its tracebacks, which would quote it), and nothing a student
# or an instructor wrote runs: answers, comments and rich outputs are made inert (InertNotebook, after
# GetGrades has put the comments in), and the page has a Content-Security-Policy and no script
# (SafeFeedbackExporter; MathJax is not loaded: the course typesets math as MathML itself, offline).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    HideHiddenTests,
    InertNotebook,
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.GenerateFeedback.exporter_class = SafeFeedbackExporter
# Every notebook page nbgrader renders with an HTML exporter, the formgrader's grading pages included,
# shows answers, comments and outputs made inert (the formgrader's own scripts must run, so it gets no CSP).
c.HTMLExporter.preprocessors = [InertNotebook]
