"""Command line: `python -m transformer_course.grading.answers` (the code: grading/outputs/answers.py)."""

import sys

from transformer_course.grading.outputs.answers import main

if __name__ == "__main__":
    sys.exit(main())
