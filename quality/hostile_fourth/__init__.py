"""The fourth hostile class: students who attack the hidden parts and the time of the two-phase grader (issue 39).

Each attack starts from the honest tutorial student's stage-2 notebook (`quality.honest`, full points, no flag) and
changes as little as it needs. Stage 2 has five hidden parts, in this order: scaled dot-product attention
(attn_sdpa_hidden), the masks (attn_masks_hidden), split and combine heads (attn_heads_hidden), multi-head
attention (attn_mha_hidden) and its attention weights (attn_mha_weights_hidden). Every attack tells a hidden part
from a visible check the same way (`HIDDEN`): a hidden part runs in a copy of the notebook made at its grade cell
and woken after the notebook's last cell, which writes a byte into a pipe that every process of the notebook holds;
a visible check's process has ended before the last cell runs, and never sees the byte.
`write_class(folder)` writes them as a downloads folder; `tests/test_hostile_fourth.py` grades it once, with the
limits lowered (LIMITS), and asserts the promises.

    honest  stage 2 as the honest tutorial student wrote it: the control (full points, no flag, no fault)

    eve     ATTACK "digits": the first hidden part writes the q_len it was called with in /tmp, /dev/shm and the
            working folder; each later hidden part takes the next base-3 digit of it and passes (0), fails (1: its
            code raises) or stops its process (2: os._exit). Would gain: the hidden q_len, spelt in her own
            feedback by the verdicts of the four later hidden parts ("stopped, fails, fails, pass" read 14).

    frank   ATTACK "words": his hidden parts stop their process (attention), run out of time (the masks) or fail
            (the heads, and both multi-head parts): had the three read differently, one hidden part would carry
            three values instead of two.

    stan    ATTACK "stall": three cells sleeping SLEEP s each, and every exercise of his kills every process of
            its sandbox when a hidden part calls it (os.kill(-1, SIGKILL)). Each kill used to buy a replay of the
            whole notebook, sleeps included, uncounted: five hidden parts made stage 2 take 362 s instead of 30 s.

    tim     ATTACK "stall by time": the same three sleeps; every exercise of his sleeps for ever when a hidden part
            calls it. Each hidden part runs out of its cell's time, the grader ends the sandbox, and the notebook is
            replayed, sleeps included: five times, then the notebook's own deadline used to be checked only between
            its visible cells.

    sandy   ATTACK "storm": an ordinary cell fills /tmp, /dev/shm and the working folder and then takes memory until
            the sandbox's limit ends its process, and her make_padding_mask does the same when a hidden part calls
            it. Every other exercise of hers is correct: it must keep its points.
"""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path

import nbformat

from quality.honest import release_path, student_notebook

ROOT = Path(__file__).resolve().parents[2]
STYLE = "tutorial"
ATTENTION = "02_attention"
SLEEP = 3  # seconds each of the stallers' three sleeping cells takes
# lowered (from 120 s a cell, 1,800 s a notebook, 6 GB) so that the class is quick, with room for a loaded machine
LIMITS = {"timeout": 30, "notebook_timeout": 180, "memory_gb": 2.0}
HIDDEN_CELLS = ("attn_sdpa_hidden", "attn_masks_hidden", "attn_heads_hidden", "attn_mha_hidden",
                "attn_mha_weights_hidden")


def honest(assignment: str) -> nbformat.NotebookNode:
    """The honest tutorial student's notebook of `assignment`, built from the release."""
    release = nbformat.read(release_path(ROOT, assignment), as_version=4)
    return student_notebook(STYLE, assignment, release)


def _index(notebook: nbformat.NotebookNode, cell_id: str) -> int:
    return next(index for index, cell in enumerate(notebook.cells) if cell.get("id") == cell_id)


def _imports_index(notebook: nbformat.NotebookNode) -> int:
    """The release's imports cell (the one that imports the stage's checks as `check`)."""
    return next(index for index, cell in enumerate(notebook.cells)
                if cell.cell_type == "code" and "as check" in cell.source)


def _insert_after(notebook: nbformat.NotebookNode, index: int, source: str) -> None:
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(textwrap.dedent(source).strip("\n") + "\n"))


HIDDEN = """
    import os, select, signal, time

    # the notebook's last cell writes a byte here. Every process of the notebook holds this pipe; a hidden part
    # runs in a copy of the notebook made at its grade cell and woken after the last cell: it finds the byte,
    # where a visible check's process, made and ended before the last cell ran, finds nothing
    _OVER_READ, _OVER_WRITE = os.pipe()

    def _hidden_part():
        return bool(select.select([_OVER_READ], [], [], 0)[0])
"""

LAST = """
    os.write(_OVER_WRITE, b'x')  # the notebook is over: what runs from now on is a hidden part
"""


def _attacked(cells: dict[str, str], before: str = "", after: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The honest stage-2 notebook with HIDDEN after its imports (then `before`), `cells[exercise cell id]` after
    that exercise's cell (so that its grade cells, and the snapshots taken there, see it) and LAST at the end."""
    notebook = copy.deepcopy(honest(ATTENTION))
    for cell_id, source in {**cells, **(after or {})}.items():
        _insert_after(notebook, _index(notebook, cell_id), source)
    _insert_after(notebook, _imports_index(notebook), textwrap.dedent(HIDDEN).strip("\n") + "\n\n" + before)
    _insert_after(notebook, len(notebook.cells) - 1, LAST)
    return notebook


def _wrapping(behaviour: str) -> dict[str, str]:
    """Cells that wrap each exercise of stage 2 (attention, the padding mask, the heads, the module's forward) in
    `behaviour(name, call)`, a function of the notebook, which decides what a hidden part's call does."""
    return {
        "attention_function": """
            scaled_dot_product_attention = _wrap('attention', scaled_dot_product_attention)
        """,
        "padding_mask": """
            make_padding_mask = _wrap('masks', make_padding_mask)
        """,
        "multi_head_attention": """
            MultiHeadAttention.split_heads = _wrap('heads', MultiHeadAttention.split_heads)
            MultiHeadAttention.combine_heads = _wrap('heads', MultiHeadAttention.combine_heads)
            MultiHeadAttention.forward = _wrap('module', MultiHeadAttention.forward)
        """,
    }


def _wrap_definition(behaviour: str) -> str:
    return textwrap.dedent(behaviour).strip("\n") + "\n\n" + textwrap.dedent("""
        def _wrap(name, function):
            def wrapped(*args, **kwargs):
                if _hidden_part():
                    _behave(name, args)
                return function(*args, **kwargs)
            return wrapped
    """).strip("\n") + "\n"


# --- eve: the hidden q_len spelt in base 3 by the verdicts of the later hidden parts -----------------------------

EVE = """
    _DROPS = ('/tmp/.eve', '/dev/shm/.eve', os.path.join(os.getcwd(), '.eve'))
    _DIGIT = {}  # this process's digit, decided at its first call

    def _receive():
        # a later hidden part: (q_len, the place of my digit), and the next place for the next one; None when the
        # first hidden part's drop is nowhere
        for path in _DROPS:
            try:
                with open(path) as drop:
                    text = drop.read()
                with open(path, 'a') as drop:
                    drop.write('+')
                return int(text.rstrip('+')), text.count('+')
            except (OSError, ValueError):
                continue
        return None

    def _behave(name, args):
        if os.getpid() not in _DIGIT:
            received = _receive()
            if received is None:  # the first hidden part: drop the q_len it is called with
                if name == 'attention' and args and hasattr(args[0], 'shape'):
                    for path in _DROPS:
                        try:
                            with open(path, 'w') as drop:
                                drop.write(str(args[0].shape[-2]))
                        except OSError:
                            pass
                _DIGIT[os.getpid()] = 0
            else:
                q_len, place = received
                _DIGIT[os.getpid()] = (q_len // 3 ** place) % 3
        digit = _DIGIT[os.getpid()]
        if digit == 1:
            raise ValueError('a digit: 1')
        if digit == 2:
            os._exit(0)
"""


def eve_stage_2() -> nbformat.NotebookNode:
    return _attacked(_wrapping(EVE), _wrap_definition(EVE))


def decode(verdicts: list[bool | None]) -> int | None:
    """What eve reads in her feedback: the later hidden parts' verdicts (True pass, False fail, None stopped) as
    base-3 digits, lowest first; None when every one passed (nothing was received)."""
    if all(verdict is True for verdict in verdicts):
        return None
    digits = [0 if verdict is True else 1 if verdict is False else 2 for verdict in verdicts]
    return sum(digit * 3 ** place for place, digit in enumerate(digits))


# --- frank: a hidden part that stops, one that runs out of time, one that fails ----------------------------------

FRANK = """
    def _behave(name, args):
        if name == 'attention':
            os._exit(0)  # stopped
        if name == 'masks':
            time.sleep(10 ** 6)  # out of time
        if name in ('heads', 'module'):
            raise ValueError('failed')  # the heads' hidden part, and both multi-head parts
"""


def frank_stage_2() -> nbformat.NotebookNode:
    return _attacked(_wrapping(FRANK), _wrap_definition(FRANK))


# --- stan and tim: stalls --------------------------------------------------------------------------------------

SLEEPING = f"""

    time.sleep({SLEEP})  # three of these
"""

STAN = """
    def _behave(name, args):
        os.kill(-1, signal.SIGKILL)  # every process of the sandbox but this one (and its first, which outlives none)
        time.sleep(60)
"""

TIM = """
    def _behave(name, args):
        time.sleep(10 ** 6)
"""


def _stalling(behaviour: str) -> nbformat.NotebookNode:
    notebook = _attacked(_wrapping(behaviour), _wrap_definition(behaviour))
    first = _imports_index(notebook) + 1  # the HIDDEN cell
    for _ in range(3):
        _insert_after(notebook, first, SLEEPING)
    return notebook


def stan_stage_2() -> nbformat.NotebookNode:
    return _stalling(STAN)


def tim_stage_2() -> nbformat.NotebookNode:
    return _stalling(TIM)


# --- sandy: a storm in an ordinary cell and in one exercise's hidden part ----------------------------------------

SANDY = """
    def _storm():
        # fill the three folders the sandbox may write, then take memory until the sandbox's limit ends this process
        for folder in ('/tmp', '/dev/shm', os.getcwd()):
            number = 0
            try:
                while True:
                    with open(os.path.join(folder, f'storm{number}'), 'wb') as filler:
                        filler.write(b'x' * (32 << 20))
                    number += 1
            except OSError:
                pass
        hog = []
        while True:
            hog.append(bytearray(b'y' * (64 << 20)))

    def _behave(name, args):
        if name == 'masks':
            _storm()
"""

STORM_CELL = """
    _storm()
"""


def sandy_stage_2() -> nbformat.NotebookNode:
    cells = _wrapping(SANDY)
    return _attacked({"padding_mask": cells["padding_mask"]}, _wrap_definition(SANDY),
                     after={"look_ahead_mask": STORM_CELL})


# --- the class --------------------------------------------------------------------------------------------------

STUDENTS = {
    "honest": {ATTENTION: lambda: honest(ATTENTION)},
    "eve": {ATTENTION: eve_stage_2},
    "frank": {ATTENTION: frank_stage_2},
    "stan": {ATTENTION: stan_stage_2},
    "tim": {ATTENTION: tim_stage_2},
    "sandy": {ATTENTION: sandy_stage_2},
}


def write_class(folder: Path, students: dict | None = None) -> list[Path]:
    """The fourth hostile class as a downloads folder: folder/<student>/<assignment>.ipynb; the paths written."""
    from quality import hostile_third

    return hostile_third.write_class(folder, students or STUDENTS)


__all__ = ["ATTENTION", "HIDDEN_CELLS", "LIMITS", "SLEEP", "STUDENTS", "decode", "eve_stage_2",
           "frank_stage_2", "honest", "sandy_stage_2", "stan_stage_2", "tim_stage_2", "write_class"]
