"""Estimate each notebook's working time (not a test): the figures quoted in the lesson headers.

    python scripts/working_time.py [--epoch-seconds S] [--decode-seconds D] [--skip-run] [--only NAME ...]

--epoch-seconds and --decode-seconds default to the figures website/authors/measurements.md records (207 s and
31 s, one thread, idle machine); the script says when it used them. They count only for notebooks 5 and 6.

Two students, with the assumptions printed with the result (they are assumptions, not measurements of
students):
- **at ease with PyTorch**: reads the prose outside the folded hints at 150 words a minute (technical
  prose with formulas is read slower than the 200-250 words a minute of ordinary prose) and given code at
  10 lines a minute; per exercise 5 minutes plus 2 per line of reference solution (writing, running the
  checks, fixing), per bug hunt 10 minutes, per prediction 3, per written question 5; 5 minutes of set-up
  (opening the notebook in Colab, the setup cell, saving a copy);
- **new to PyTorch, or stuck**: reads everything, the folded hints included, at 100 words a minute; twice
  the time per exercise, bug hunt, prediction and question (the debugging a failing check asks for), and
  10 minutes of set-up.
Both add the computation:
- running: the notebook executed top to bottom in a fresh kernel on one thread, the long demos on
  their short path, measured as the kernel's CPU time (close to the wall time on one free core, even
  on a machine busy with other work), plus what the short path leaves out, measured separately:
  notebook 5's full training run (EPOCHS epochs of --epoch-seconds, from
  `scripts/benchmark.py --epoch --threads 1`) and notebook 6's BLEU on all 1,000 test sentences
  (--decode-seconds, from `scripts/benchmark.py --threads 1`). The optional notebooks 0 and 7, whose
  long demos (stage 0's two training runs and BLEU by length, stage 7's decoding of the test set with
  and without the cache and with beam search) have no figure of their own, are executed on their full
  path instead, so their measured run time includes them.
The model answers and rubrics of the written questions are not counted (students get an empty answer cell).

Prints one line per notebook, the total and the breakdown. A notebook that raises (for example one that
reads Multi30k where it is not available) stops the script with the cause: timed, it would look short.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from transformer_course.authoring import assignments, bug_edits, repository_root


@dataclass(frozen=True)
class Student:
    """How fast one kind of student works (assumptions, printed with every estimate)."""

    name: str
    words_per_minute: float
    reads_hints: bool
    code_lines_per_minute: float = 10
    minutes_per_exercise: float = 5
    minutes_per_solution_line: float = 2
    minutes_per_bug_hunt: float = 10
    minutes_per_prediction: float = 3
    minutes_per_question: float = 5
    set_up_minutes: float = 5


AT_EASE = Student("at ease with PyTorch", 150, reads_hints=False)
STRUGGLING = Student("new to PyTorch, or stuck", 100, reads_hints=True, minutes_per_exercise=10,
                     minutes_per_solution_line=4, minutes_per_bug_hunt=20, minutes_per_prediction=6,
                     minutes_per_question=10, set_up_minutes=10)
DETAILS = re.compile(r"<details\b.*?</details>", re.DOTALL | re.IGNORECASE)
FULL_RUN_EPOCHS = 10  # notebook 5's EPOCHS outside the short path
# run on their full path: their long demos have no benchmark figure of their own, so the run measures them
FULL_PATH = ("00_why_attention", "07_fast_and_better_decoding")


def solution_lines(source: str) -> int:
    inside, count = False, 0
    for line in source.splitlines():
        if "### BEGIN SOLUTION" in line:
            inside = True
        elif "### END SOLUTION" in line:
            inside = False
        elif inside and line.strip() and not line.strip().startswith("#"):
            count += 1
    return count


def run_seconds(path: Path, short: bool = True) -> float:
    """CPU seconds the notebook's kernel spends running it top to bottom on one thread (the long demos on
    their short path when `short`): on a machine busy with other work this is close to the wall time on
    one core of its own."""
    notebook = nbformat.read(path, as_version=4)
    environment = {"TRANSFORMER_COURSE_SHORT_RUN": "1" if short else "0", "MPLBACKEND": "Agg",
                   "TRANSFORMER_COURSE_STRICT": "1",  # a cell that raises stops the run (runtime.guard_cells)
                   "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    previous = dict(os.environ)
    os.environ.update(environment)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        NotebookClient(notebook, timeout=1800, kernel_name="python3", allow_errors=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    except CellExecutionError as error:  # a notebook that stops early would be timed as a short one
        first = str(error).strip().splitlines()[-1][:300]
        raise SystemExit(f"{path.name} stopped with an error, so its run time cannot be measured: {first}\n"
                         "(a notebook that reads Multi30k needs it: set MULTI30K_DIR or run once online)") from None
    finally:
        os.environ.clear()
        os.environ.update(previous)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the kernel has exited and been waited for
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def estimate(notebook: nbformat.NotebookNode, bug_hunts: set[str], student: Student) -> dict[str, float]:
    """Minutes of reading, exercises (stubs), bug hunts, predictions, written questions and set-up."""
    written = [cell for cell in notebook.cells if cell.get("metadata", {}).get("nbgrader", {}).get("solution")]
    code = [cell for cell in written if cell.cell_type == "code"]  # the others: written questions
    predictions = [cell for cell in code if "def predict_" in cell.source]
    hunts = [cell for cell in code if cell.get("id") in bug_hunts]
    exercises = [cell for cell in code if cell not in predictions and cell not in hunts]
    prose = [cell.source if student.reads_hints else DETAILS.sub("", cell.source) for cell in notebook.cells
             if cell.cell_type == "markdown" and cell not in written]  # answer cells reach students empty
    words = sum(len(re.findall(r"\S+", text)) for text in prose)
    given = sum(len(cell.source.splitlines()) for cell in notebook.cells
                if cell.cell_type == "code" and not cell.get("metadata", {}).get("nbgrader"))
    lines = sum(solution_lines(cell.source) for cell in exercises)
    return {
        "reading": words / student.words_per_minute + given / student.code_lines_per_minute,
        "exercises": student.minutes_per_exercise * len(exercises) + student.minutes_per_solution_line * lines,
        "bug hunts": student.minutes_per_bug_hunt * len(hunts),
        "predictions": student.minutes_per_prediction * len(predictions),
        "questions": student.minutes_per_question * (len(written) - len(code)),
        "set-up": student.set_up_minutes,
        "counts": (len(exercises), lines, len(hunts), len(predictions), len(written) - len(code), words, given),
    }


EPOCH_SECONDS = 207.0  # measurements.md: one epoch of notebook 5, `scripts/benchmark.py --epoch --threads 1`
DECODE_SECONDS = 31.0  # measurements.md: greedy BLEU on the 1,000 test sentences, `scripts/benchmark.py --threads 1`


def _hours(minutes: float) -> str:
    return f"{minutes / 60:.1f} h"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epoch-seconds", type=float, default=None,
                        help=f"one epoch of notebook 5's full run (default {EPOCH_SECONDS:.0f}, measurements.md)")
    parser.add_argument("--decode-seconds", type=float, default=None,
                        help=f"greedy BLEU on 1,000 sentences (default {DECODE_SECONDS:.0f}, measurements.md)")
    parser.add_argument("--skip-run", action="store_true", help="do not execute the notebooks (run time 0)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="just these notebooks (e.g. 00_why_attention; default: all)")
    arguments = parser.parse_args()
    defaulted = [name for name in ("epoch_seconds", "decode_seconds") if getattr(arguments, name) is None]
    arguments.epoch_seconds = EPOCH_SECONDS if arguments.epoch_seconds is None else arguments.epoch_seconds
    arguments.decode_seconds = DECODE_SECONDS if arguments.decode_seconds is None else arguments.decode_seconds
    root = repository_root()
    for assignment in assignments(root):
        if arguments.only and assignment not in arguments.only:
            continue
        path = root / "solutions" / assignment / f"{assignment}.ipynb"
        notebook = nbformat.read(path, as_version=4)
        short = assignment not in FULL_PATH
        started = time.perf_counter()
        running = 0.0 if arguments.skip_run else run_seconds(path, short)
        measured = time.perf_counter() - started
        extra = (FULL_RUN_EPOCHS * arguments.epoch_seconds if assignment.startswith("05")
                 else arguments.decode_seconds if assignment.startswith("06") else 0.0)
        computing = (running + extra) / 60
        print(f"{assignment}: computing {running:.0f} s ({'short' if short else 'full'} path, CPU; wall "
              f"{measured:.0f} s) + {extra / 60:.0f} min of long runs")
        for student in (AT_EASE, STRUGGLING):
            parts = estimate(notebook, set(bug_edits(root, assignment)), student)
            exercises, lines, hunts, predictions, questions, words, given = parts.pop("counts")
            total = sum(parts.values()) + computing
            print(f"  {student.name}: about {_hours(total)} = reading {parts['reading']:.0f} min ({words:,} "
                  f"words, {given} given code lines) + {exercises} exercises {parts['exercises']:.0f} min "
                  f"({lines} solution lines) + {hunts} bug hunts {parts['bug hunts']:.0f} min + {predictions} "
                  f"predictions {parts['predictions']:.0f} min + {questions} written questions "
                  f"{parts['questions']:.0f} min + set-up {parts['set-up']:.0f} min + computing {computing:.0f} min")
    for student in (AT_EASE, STRUGGLING):
        print(f"\nassumptions, {student.name}: {student}")
    print(f"long runs: {FULL_RUN_EPOCHS} x {arguments.epoch_seconds:.0f} s epochs, "
          f"BLEU {arguments.decode_seconds:.0f} s"
          + (f" ({' and '.join('--' + name.replace('_', '-') for name in defaulted)} not given: measurements.md's "
             "figures)" if defaulted else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
