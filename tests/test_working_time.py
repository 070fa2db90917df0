"""The reading times each notebook's header quotes are the ones `scripts/working_time.py` estimates from the
notebook as it is now (they drifted as the prose changed; the run times need a run of the script and are not
tested here)."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from conftest import ASSIGNMENTS, ROOT, read, solution_path

spec = importlib.util.spec_from_file_location("working_time", ROOT / "scripts" / "working_time.py")
working_time = sys.modules["working_time"] = importlib.util.module_from_spec(spec)  # its dataclass needs it
spec.loader.exec_module(working_time)
QUOTED = re.compile(r"reading \((\d+) minutes at 150 words a minute without the folded hints, (\d+) at 100 words a "
                    r"minute with them, and the given code at 10 lines a minute\)")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_header_quotes_the_reading_time_the_script_estimates(assignment):
    notebook = read(solution_path(assignment))
    header = " ".join(notebook.cells[0].source.split())
    quoted = QUOTED.search(header)
    assert quoted, f"{assignment}: the header's reading time is not in the form the course uses"
    hunts = set(working_time.bug_edits(ROOT, assignment))
    estimated = [round(working_time.estimate(notebook, hunts, student)["reading"])
                 for student in (working_time.AT_EASE, working_time.STRUGGLING)]
    assert [int(quoted[1]), int(quoted[2])] == estimated, (
        f"{assignment}: the header says {quoted[1]} and {quoted[2]} minutes of reading, the notebook as it is "
        f"now takes {estimated[0]} and {estimated[1]} (python scripts/working_time.py --skip-run --only "
        f"{assignment}; redo its hours too, website/authors/measurements.md)")
    assert working_time.AT_EASE.words_per_minute == 150 and working_time.STRUGGLING.words_per_minute == 100
    assert working_time.AT_EASE.code_lines_per_minute == 10
