"""Command line: `python -m transformer_course.grading.lms` (the code: grading/outputs/lms.py)."""

import sys

from transformer_course.grading.outputs.lms import main

if __name__ == "__main__":
    sys.exit(main())
