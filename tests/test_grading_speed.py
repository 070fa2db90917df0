"""What makes grading faster must not change what it decides: every grade cell reads as calls of the
checks its module defines; the grading processes skip the slow IRI validator and still validate
notebooks; figures nobody sees are not built while grading; the profile that scripts/benchmark_grading.py
reads is written only when asked for; no grade cell imports a module (what it would import is imported again by
every grade cell, since each one's servant ends with it): the zygote imports and warms up what they meet."""

import ast
import importlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ASSIGNMENTS, DATA_ASSIGNMENTS, read, require_multi30k, solution_path
from quality.inprocess import run_notebook
from transformer_course.grading.cells import checks_module, is_grade_cell
from transformer_course.grading.sandbox import profiling
from transformer_course.grading.sandbox.executor import parse_grade_cell, preload_modules
from transformer_course.grading.sandbox.runner import REPORT_IMPORTS
from transformer_course.grading.sandbox.session import Session


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_grade_cell_reads_as_checks_the_grader_knows(assignment):
    """The grader reads grade cells as data (`parse_grade_cell`, never runs them): every grade cell of the
    course must read, visible part and hidden part, as calls of checks its checks module defines."""
    notebook = read(solution_path(assignment))
    module = importlib.import_module(checks_module(notebook))
    for cell in notebook.cells:
        if is_grade_cell(cell):
            visible, hidden = parse_grade_cell(cell.source)
            assert visible or hidden, cell.source
            for call in (*visible, *hidden):
                assert isinstance(getattr(getattr(module, call.name, None), "check_title", None), str), call


def test_the_profile_is_written_only_when_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv(profiling.ENVIRONMENT_VARIABLE, raising=False)
    with profiling.phase("ordinary cells"):
        pass
    profiling.dump("ada")
    target = tmp_path / "profile.jsonl"
    monkeypatch.setenv(profiling.ENVIRONMENT_VARIABLE, str(target))
    before = time.time()
    with profiling.phase("ordinary cells", lambda: 1.0):
        sum(range(1000))
    after_the_first = time.time()
    with profiling.phase("ordinary cells"):
        pass
    profiling.dump("ada")
    line = json.loads(target.read_text())
    wall, cpu, count, own = line["phases"]["ordinary cells"]
    assert line["student"] == "ada" and count == 2 and wall >= 0 and cpu >= own >= 0
    assert before <= line["first_started"]["ordinary cells"] <= after_the_first  # when the first one began


def _run_python(code: str) -> str:
    """stdout of `code` run by a fresh interpreter of this environment (a clean sys.modules)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_grading_processes_skip_the_slow_iri_validator_and_still_validate_notebooks():
    printed = _run_python(f"""
        import sys, time
        started = time.perf_counter()
        import transformer_course.grading.classroom.worker
        import nbformat
        seconds = time.perf_counter() - started
        notebook = nbformat.read({str(solution_path(ASSIGNMENTS[1]))!r}, as_version=4)
        nbformat.validate(notebook)
        notebook.cells[0]["cell_type"] = "no such type"
        try:
            nbformat.validate(notebook)
            print("invalid notebook accepted")
        except nbformat.ValidationError:
            print("ok", "rfc3987_syntax" in sys.modules and sys.modules["rfc3987_syntax"] is not None, seconds)
    """)
    verdict, slow_module_loaded, _seconds = printed.split()
    assert verdict == "ok" and slow_module_loaded == "False", printed


def test_the_batch_command_and_its_start_up_test_leave_torch_out():
    """The batch command only reads notebooks, starts workers and writes the outputs; importing torch (about 2 s,
    before any student is graded) is for the workers, which judge the checks, and nbgrader (half a second) is
    imported only once the workers have started."""
    printed = _run_python("""
        import sys
        import transformer_course.grading.batch
        nbgrader = "nbgrader" in sys.modules
        from transformer_course.grading.classroom.worker import runner_start_problem
        from transformer_course.checks.boundary import StudentError
        print("torch" in sys.modules, nbgrader)
    """)
    assert printed.strip() == "False False", printed  # nbgrader: imported while the workers start (run())


def test_every_drawing_function_is_skipped_while_grading_and_draws_otherwise(monkeypatch):
    """Under the grader figures go to Agg and are closed unseen: building them is skipped (unseen.py)."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from transformer_course.visualisation import diagrams, positional, unseen

    folder = Path(unseen.__file__).parent
    undecorated = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            drawing = isinstance(node, ast.FunctionDef) and (
                node.name.startswith("plot_") or (path.name == "diagrams.py" and node.name == "show"))
            if not drawing:
                continue
            names = [d.id for d in node.decorator_list if isinstance(d, ast.Name)]
            if "not_drawn_while_grading" not in names:
                undecorated.append(f"{path.name}:{node.name}")
    assert not undecorated, f"drawing functions built even while grading: {undecorated}"

    import torch

    table = torch.randn(20, 8)
    plt.close("all")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    blank = positional.plot_encoding_heatmap(table)
    assert isinstance(blank, Figure) and not blank.axes and not plt.get_fignums()
    assert diagrams.show("transformer") is None and not plt.get_fignums()
    from transformer_course.visualisation.attention_maps import plot_attention_interactive
    unseen_map = plot_attention_interactive(torch.rand(1, 1, 2, 3, 3), ["a", "b", "c"], ["x", "y", "z"], title="t")
    assert isinstance(unseen_map, unseen.Unseen) and unseen_map.show() is None and not plt.get_fignums()
    monkeypatch.delenv("NBGRADER_EXECUTION")
    drawn = positional.plot_encoding_heatmap(table)
    assert drawn.axes and plt.get_fignums()
    plt.close("all")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_grade_cell_imports_a_module(assignment, tmp_path):
    """The reference solution graded as the batch grader grades a notebook (a zygote of its own, preloaded with
    `preload_modules` and warmed up with the parts its checks module names in `WARM_UP`): no servant (a grade
    cell's experiments, a hidden part) imports a module. Otherwise each of them pays the import again (the first
    optimiser step imports some 800 modules, `torch._check` the symbolic-shapes machinery): the warm-up of that
    stage's checks is missing a part."""
    if assignment in DATA_ASSIGNMENTS:
        require_multi30k()
    notebook = read(solution_path(assignment))
    environment = {**os.environ, "NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg", REPORT_IMPORTS: "1"}
    with Session(preload_modules([notebook]), environment=environment) as session:
        session.start()
        graded = run_notebook(notebook, tmp_path, session=session)
        report = [line for line in session.stderr_tail(lines=400).splitlines() if "servant imported" in line]
    errors = [output.get("evalue") for cell in graded.cells for output in cell.get("outputs", [])
              if output.get("output_type") == "error"]
    assert errors == [], errors
    assert report == [], f"{assignment}: a grade cell imports modules: {report[0]}"
