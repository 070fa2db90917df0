"""Where the code runs: device choice, grading mode, the student's settings and where checkpoints go."""

from __future__ import annotations

import os
import re
import tempfile
import traceback
from collections.abc import Sequence
from html import escape
from pathlib import Path

import torch

STRICT_VARIABLE = "TRANSFORMER_COURSE_STRICT"  # "1": every failing check stops the notebook
SHORT_RUN_VARIABLE = "TRANSFORMER_COURSE_SHORT_RUN"  # "1": training and decoding demos take the grading path
RUNS_VARIABLE = "TRANSFORMER_COURSE_RUNS"  # the folder for checkpoints, overriding the default
DRIVE_MOUNT = Path("/content/drive")
DRIVE_FOLDER = DRIVE_MOUNT / "MyDrive" / "transformers_from_scratch"
LOCAL_FOLDER = Path.home() / "transformers_from_scratch"

_settings = {"stop_at_first_failure": False}


def pick_device(verbose: bool = True) -> torch.device:
    """Return the CUDA device when a GPU is present, else the CPU."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if verbose:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(f"Using {device} ({name}), torch {torch.__version__}")
    return device


def grading_mode() -> bool:
    """True while nbgrader autogrades (or validates) a notebook: it sets NBGRADER_EXECUTION."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def short_run() -> bool:
    """True when the long demos (training on Multi30k, BLEU on the whole test set) should take their
    short path: while grading, or when TRANSFORMER_COURSE_SHORT_RUN=1 (the tests use it)."""
    return grading_mode() or os.environ.get(SHORT_RUN_VARIABLE, "") not in ("", "0")


def configure(*, stop_at_first_failure: bool | None = None) -> None:
    """The student's settings cell calls this. stop_at_first_failure=True makes a failing check raise
    (so "Run all" stops there); False, the default, shows the failure in red and carries on.

    In a notebook it also installs the cell guard (`guard_cells`), so that cells which use an exercise
    not written yet say so and "Run all" carries on."""
    if stop_at_first_failure is not None:
        _settings["stop_at_first_failure"] = bool(stop_at_first_failure)
    guard_cells()


def stop_at_first_failure() -> bool:
    """Whether a failing check must raise: always while grading, else as configured (or
    TRANSFORMER_COURSE_STRICT=1)."""
    return (grading_mode() or _settings["stop_at_first_failure"]
            or os.environ.get(STRICT_VARIABLE, "") not in ("", "0"))


def in_colab() -> bool:
    try:
        import google.colab  # noqa: F401  (only importable inside Google Colab)
    except ImportError:
        return False
    return True


def checkpoint_folder(use_google_drive: bool = False, verbose: bool = True) -> Path:
    """The folder where notebook 5 saves its checkpoints and notebook 6 looks for them.

    - while grading: a fresh temporary folder (a submission never reads or writes a student's files);
    - $TRANSFORMER_COURSE_RUNS when set;
    - in Colab with use_google_drive=True: `MyDrive/transformers_from_scratch` in your Google Drive
      (Colab asks once for permission to mount it), so checkpoints survive a disconnect;
    - elsewhere: `~/transformers_from_scratch` (in Colab without Drive that folder is lost when
      the machine is recycled).
    """
    if grading_mode():
        return Path(tempfile.mkdtemp(prefix="checkpoints-"))
    if os.environ.get(RUNS_VARIABLE):
        folder = Path(os.environ[RUNS_VARIABLE])
    elif use_google_drive and in_colab():
        from google.colab import drive  # type: ignore[import-not-found]

        if not (DRIVE_MOUNT / "MyDrive").exists():
            drive.mount(str(DRIVE_MOUNT))
        folder = DRIVE_FOLDER
    else:
        if use_google_drive and verbose:
            print("(Google Drive is only available in Colab: using a local folder instead)")
        folder = LOCAL_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    if verbose:
        print(f"checkpoints folder: {folder}")
    return folder


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter or Colab kernel, which can show HTML."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def show(text: str, html: str | None = None) -> None:
    """Show HTML in a notebook (with the text as the fallback every front end understands), else print."""
    if html is not None and _in_notebook():
        from IPython.display import display

        display({"text/plain": text, "text/html": html}, raw=True)
    else:
        print(text)


FAILURE_STYLE = ("border-left: 6px solid #c62828; background: #fdecea; color: #3b0a0a; padding: 6px 12px; "
                 "margin: 4px 0; font-family: monospace; white-space: pre-wrap; line-height: 1.35")


HINT_STYLE = "margin: 6px 0 0 0; padding: 0 0 0 10px; border-left: 3px solid #e6a5a5"


def _hints_html(hints: Sequence[tuple[str, str]]) -> str:
    """Folded hints, each inside the one before: a student opens the first, and only then sees the next."""
    html = ""
    for number, (title, text) in reversed(list(enumerate(hints, start=1))):
        html = (f'<details style="{HINT_STYLE}"><summary style="cursor: pointer; color: #8a1c1c">'
                f"<b>Hint {number}: {escape(title)}</b>{' (open it when stuck)' if number == 1 else ''}</summary>"
                f"{escape(text)}{html}</details>")
    return html


def show_failure(title: str, body: str, footer: str = "", details: str = "",
                 hints: Sequence[tuple[str, str]] = ()) -> None:
    """A visibly red block: a ✘ title line, the body (what was observed: expected / got, a crash's line), a
    footer, the `hints` (title, text) folded one inside the other in HTML (the likely cause first, code last),
    and optionally details (a traceback) folded away. The text fallback shows the title, body and footer alone."""
    text = "\n".join(part for part in (f"✘ {title}", body, footer) if part)
    rows = []
    for line in body.splitlines():
        label, colon, rest = line.strip().partition(":")
        if colon and label in ("expected", "got", "likely cause", "what happened there") or label.startswith("in `"):
            rows.append(f"  <b>{escape(label)}:</b>{escape(rest)}")
        else:
            rows.append(escape(line))
    html = (f'<div style="{FAILURE_STYLE}"><b style="color: #c62828">✘ {escape(title)}</b>\n'
            + "\n".join(rows)
            + (f'\n<span style="color: #555">{escape(footer)}</span>' if footer else "")
            + _hints_html(hints)
            + (f"<details><summary>details</summary>{escape(details)}</details>" if details else "")
            + "</div>")
    show(text, html)


TORCH_DIR = str(Path(torch.__file__).resolve().parent)  # where a frame of torch's own code lives
_KERNEL_MESSAGE = re.compile(r"not implemented for '|Could not run '|not currently implemented|is not implemented for")


def unfinished_exercise(error: BaseException) -> str | None:
    """The function (qualified name) whose `raise NotImplementedError()` stub raised `error`: an exercise
    not written yet. None for any other error, a NotImplementedError from inside torch included
    ('"softmax_lastdim_kernel_impl" not implemented for 'Bool'' is a dtype problem, not a stub)."""
    if not isinstance(error, NotImplementedError) or _KERNEL_MESSAGE.search(str(error)):
        return None
    frames = list(traceback.walk_tb(error.__traceback__))
    if not frames:
        return "an exercise"
    code = frames[-1][0].f_code
    if code.co_filename.startswith(TORCH_DIR):
        return None
    return getattr(code, "co_qualname", code.co_name)


def _carry_on(shell: object) -> None:
    """Mark the running cell as finished without an error, so that "Run all" goes on to the next cell."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    if result is not None:
        result.error_in_exec = None


def _cell_guard(shell: object, kind: type[BaseException], error: BaseException, tb: object,
                tb_offset: int | None = None) -> None:
    """IPython's handler for an exception a cell raised (installed by `guard_cells`)."""
    unfinished = unfinished_exercise(error)
    if unfinished is not None:
        name = unfinished.removesuffix(".forward").removesuffix(".__init__")
        print(f"(skipped: this cell uses {name}, which is not written yet: fill in its cell above, then run "
              "this one again)")
        _carry_on(shell)
        return
    if stop_at_first_failure() or not isinstance(error, Exception):
        shell.showtraceback((kind, error, tb), tb_offset=tb_offset)  # type: ignore[attr-defined]
        return
    lines = traceback.format_exception(kind, error, tb)  # type: ignore[arg-type]
    show_failure(f"this cell stopped: {kind.__name__}", f"{kind.__name__}: {str(error).strip()[:500]}",
                 "If the check cells above are red, fix what they say first; then rerun the cell that failed "
                 "and this one. (Set STOP_AT_FIRST_FAILURE = True in the settings cell to stop here instead.)",
                 details="".join(lines[-6:]))
    _carry_on(shell)


def guard_cells() -> bool:
    """In a notebook (IPython), let every cell that raises carry "Run all" on to the end, as the lesson
    promises: a cell that uses an exercise not written yet prints a one-line note saying which; any other
    error is shown as a red block with its traceback folded, and the next cell runs. When the student
    asked to stop at the first failure, or while grading, errors other than an unfinished exercise stop
    the notebook as usual. Returns whether the guard is installed."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    if getattr(shell, "_transformer_course_guard", False):
        return True
    if shell.custom_exceptions:
        return False  # someone else's handler: leave it
    shell.set_custom_exc((Exception,), _cell_guard)
    shell._transformer_course_guard = True
    return True
