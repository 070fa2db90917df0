"""Command line: `python -m transformer_course.grading.batch` (the code: grading/classroom/batch.py)."""

import sys

from transformer_course.grading.classroom.batch import main

if __name__ == "__main__":
    sys.exit(main())
