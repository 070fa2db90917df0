"""Command line: `python -m transformer_course.grading.report` (the code: grading/outputs/report.py)."""

import sys

from transformer_course.grading.outputs.report import main

if __name__ == "__main__":
    sys.exit(main())
