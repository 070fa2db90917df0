"""Write the honest class as a downloads folder for the batch grader (one folder per student):

    python -m quality.honest FOLDER [--assignment 02_attention ...]
    python -m transformer_course.grading.batch FOLDER
"""

from __future__ import annotations

import argparse
from pathlib import Path

from quality.honest import STAGES, write_class

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--assignment", nargs="+", choices=sorted(STAGES), help="these stages only (default: all)")
    arguments = parser.parse_args(argv)
    for path in write_class(ROOT, arguments.folder, arguments.assignment):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
