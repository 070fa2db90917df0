"""The watch for the reference solution (`grading.sandbox.watch`), on its own: probes are put into the reference's
exercise functions without changing what they compute or where their lines are; a probe reports the notebook's
own code running the reference, and not the course's code doing so; code made while the notebook runs is
recognised by its fingerprint, with or without the probe; the fingerprint of the reference is the same before and
after probing. Each case runs in a fresh Python process, since probing changes the reference's functions."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PREAMBLE = """
    import inspect, sys, threading, types
    import torch
    from transformer_course.grading.sandbox import fingerprint, watch
    from transformer_course.reference import positional_encoding
    Reference = positional_encoding.PositionalEncoding
    original = Reference.__init__.__code__
    original_digest = fingerprint.digest(original)
    exercises = fingerprint.exercise_code(["PositionalEncoding"])
    known = watch.Known(exercises)
    watcher = watch.Watcher(known, direct=True)
    watch.GUARD.watcher = watcher
    sys.addaudithook(watch.GUARD.hook)
    def notebook(source):  # code as a cell compiles it: not from an installed library
        namespace = {"Reference": Reference, "torch": torch}
        exec(compile(textwrap.dedent(source), "<cell>", "exec"), namespace)
        return namespace
    import textwrap
"""


def _run(body: str) -> str:
    script = textwrap.dedent(PREAMBLE) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_probe_changes_neither_the_values_nor_the_lines_nor_the_fingerprint():
    printed = _run("""
        probed = Reference.__init__.__code__
        assert probed is not original and id(probed) in known.probed
        assert any(isinstance(constant, watch.Probe) for constant in probed.co_consts)
        assert probed.co_firstlineno == original.co_firstlineno and probed.co_filename == original.co_filename
        assert fingerprint.digest(probed) == original_digest
        lines = lambda code: sorted({line for _, _, line in code.co_lines() if line is not None})
        assert lines(probed) == lines(original), (lines(probed), lines(original))
        table = Reference(8, 5, 0.0).pe
        assert torch.allclose(table[0, 1, 0::2], torch.sin(torch.tensor(1.0) / 10000 ** (torch.arange(0, 8, 2) / 8)))
        print("ok")
    """)
    assert printed.strip() == "ok"


def test_a_probe_reports_the_notebooks_code_running_the_reference_and_not_the_courses():
    printed = _run("""
        watcher.take()
        from transformer_course.reference.model import Encoder  # the course's own code builds the reference
        Encoder(11, 8, 2, 1, 16, 10, 0.0)
        assert [note for note in watcher.take() if note["kind"] == "runs"] == [], "the course's code was reported"
        notebook("table = Reference(8, 5, 0.0).pe")
        kinds = {(note["kind"], note["reference"]) for note in watcher.take()}
        assert ("runs", "PositionalEncoding.__init__") in kinds, kinds
        started = notebook('''
            import threading
            def later():
                Reference(8, 5, 0.0)
            worker = threading.Thread(target=later)
            worker.start()
            worker.join()
        ''')
        assert any(note["kind"] == "runs" for note in watcher.take()), "a thread of the notebook went unseen"
        print("ok")
    """)
    assert printed.strip() == "ok"


def test_copies_are_recognised_however_they_are_made():
    printed = _run("""
        routes = {
            "exec of the source": "exec(inspect.getsource(Reference))",
            "a function made from its code": (
                "types.FunctionType(Reference.__init__.__code__.replace(), {}, None, None, (types.CellType(0),))"),
            "its code given to another function": (
                "class Mine(torch.nn.Module):\\n"
                "    def __init__(self, d_model, max_seq_length, dropout):\\n"
                "        super().__init__()\\n"
                "Mine.__init__.__code__ = Reference.__init__.__code__.replace()"),
        }
        for route, source in routes.items():
            watcher.take()
            namespace = {"Reference": Reference, "torch": torch, "inspect": inspect, "types": types,
                         "nn": torch.nn, "math": __import__("math")}
            exec(compile(source, "<cell>", "exec"), namespace)
            kinds = {note["kind"] for note in watcher.take()}
            assert "copy" in kinds, (route, kinds)
        watcher.take()
        exec(compile("Reference.__init__.__code__ = Reference.__init__.__code__.replace()", "<cell>", "exec"),
             {"Reference": Reference})
        assert "trace" in {note["kind"] for note in watcher.take()}, "the probe's removal went unnoticed"
        print("ok")
    """)
    assert printed.strip() == "ok"


def test_honest_code_leaves_no_note():
    printed = _run("""
        watcher.take()
        notebook('''
            import math
            class PositionalEncoding(torch.nn.Module):
                def __init__(self, d_model, max_seq_length, dropout):
                    super().__init__()
                    position = torch.arange(max_seq_length).unsqueeze(1)
                    frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
                    table = torch.zeros(max_seq_length, d_model)
                    table[:, 0::2] = torch.sin(position * frequency)
                    table[:, 1::2] = torch.cos(position * frequency)
                    self.register_buffer("pe", table.unsqueeze(0))
                    self.dropout = torch.nn.Dropout(dropout)
                def forward(self, x):
                    return self.dropout(x + self.pe[:, : x.size(1)])
            PositionalEncoding(8, 5, 0.1)(torch.zeros(1, 5, 8))
            exec("total = sum(range(10))")
        ''')
        assert watcher.take() == []
        print("ok")
    """)
    assert printed.strip() == "ok"


def test_every_exercise_function_of_every_stage_gets_its_probe():
    """A function left without a probe would run unseen; every stage's exercises (as the grader finds them in
    the released notebooks) must all be probed."""
    printed = _run("""
        import importlib, nbformat
        from pathlib import Path
        from transformer_course.authoring import assignments, repository_root
        from transformer_course.grading.cells import reference_modules
        from transformer_course.grading.sandbox.executor import exercise_names
        root = repository_root()
        names = []
        for assignment in assignments(root):
            notebook = nbformat.read(root / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
            names += exercise_names(notebook)
            for module in reference_modules(exercise_names(notebook)):
                importlib.import_module(module)
        everything = fingerprint.exercise_code(names)
        found = watch.Known(everything)
        unprobed = [label for function, label in everything.functions if id(function.__code__) not in found.probed]
        assert everything.functions and not unprobed, unprobed
        print(len(everything.functions))
    """)
    assert int(printed.strip()) >= 20, printed  # 28 exercise functions over the eight stages on 2026-11-25
