"""Write what every catalogued mistake's grade cells say: the messages a hostile reader reviews and that
`python -m quality.dictation --messages FILE` measures (what a student reads before opening a hint).

Every mistake of the catalog (quality/mistakes) is applied to its stage's solution notebook and run through the
real grade cells up to the cell it must fail (quality.inprocess.run_grade_cells, as tests/test_mistakes.py
does). One JSON entry per mistake: its stage, description, grade cell, catalogued cause, the message of that
cell (`message`), the messages of the other cells that failed (`others`, by grade cell) and whether the cell
grades a bug hunt (`bug_hunt`).

    python scripts/catalog_messages.py OUT.json [--stages 02 03]
    python -m quality.dictation --messages OUT.json            # what shows before a hint is opened
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # quality/ lives at the repository root
from quality.inprocess import run_grade_cells  # noqa: E402
from quality.measure import reduced  # noqa: E402
from quality.mistakes import catalog  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument("--stages", nargs="*", default=[], help="assignments or their numbers (default: all)")
    options = parser.parse_args()
    os.environ.setdefault("MULTI30K_DIR", str(ROOT.parent / "shared" / "data" / "multi30k"))
    mistakes, _ = catalog()
    entries = []
    for mistake in mistakes:
        if options.stages and not any(mistake.assignment.startswith(stage) for stage in options.stages):
            continue
        path = ROOT / "solutions" / mistake.assignment / f"{mistake.assignment}.ipynb"
        notebook = reduced(mistake.apply(nbformat.read(path, as_version=4)))
        outcomes = run_grade_cells(notebook, path.parent, stop_after=mistake.fails)
        cell = next((c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == mistake.fails),
                    None)
        outcome = outcomes.get(mistake.fails)
        entries.append({
            "stage": mistake.assignment, "desc": mistake.description, "cell": mistake.fails, "cause": mistake.cause,
            "message": outcome.message if outcome is not None else "",
            "others": {grade_id: other.message for grade_id, other in outcomes.items()
                       if grade_id != mistake.fails and not other.passed},
            "bug_hunt": cell is not None and "bug_hunt=" in cell.source,
        })
        print(f"{mistake.assignment} {mistake.description}: "
              f"{'passes!' if outcome is None or outcome.passed else 'fails'}", file=sys.stderr)
    options.out.write_text(json.dumps(entries, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
