"""Attribute the checks' failure messages to the functions whose words are in them: what each bespoke
reading of `transformer_course.checks` (the eight stage files) buys on the course's yardsticks, and how many
lines it costs.

What it runs (in this process, or in forked children that send their records back):
- the mistake catalog (`quality.mistakes.catalog()`), graded as tests/test_mistakes.py does (the graded part
  of the solution notebook with the mistake applied, up to the grade cell it must fail); *named*: the
  mistake's `cause` occurs (any case) in the message of that cell;
- the held-out mistakes (`HELD_OUT` of `quality.mistakes.<stage>`), whole graded part; *named*: some failing
  message holds one of the phrases of its `cause` (" | "), the rule of scripts/measure_held_out.py;
- a sample of the mechanical mutants drawn as scripts/measure_checks.py draws them (seed 3 leaving out seeds
  0 1 2, six per kind, catalogued edits and equivalent mutants left out; `--mutant-seeds 0 1 2 3` adds those
  samples; seed 3 was tuned on since, so it says what the readings buy, not how well the checks generalise),
  graded in forked children by `quality.measure.run_mutants`; *named*: the rule
  (`quality.measure.names_operation_and_relation`) holds for the message.

How it attributes: while a notebook is graded, a trace function (sys.settrace, 'call' and 'return' events
only, on the code of the traced files) records every non-empty string a function of a traced file returns
(also the `where`/`cause`/`how` strings of a returned Diagnosis, and strings inside a returned tuple, list or
dict), under the module-level function or class method the code belongs to (nested functions and lambdas
count for the function they are written in; an `@on_student_side` experiment, which runs in the student's
process while grading, is recorded by what its wrapper returns here). A failing grade cell's message credits
every function one of whose recorded strings (at least --min-chars characters; or, failing that, a sentence
or line of it of 20 characters or more) occurs in it, whitespace and case folded.

Columns, per stage file and function: lines (end_lineno - lineno + 1 of its `def`), calls (over every
input graded), messages credited (catalog / held-out / mutants), *sole*: named messages in which it is the
only stage-file function credited (the brief's rule: removing it would likely lose the name), *needed*:
named inputs that are no longer named when its words are blanked out of every failing message of that input
(a counterfactual on the text, not a rerun: without the function the engine might say something else), and
*pins*: the catalog entries whose pinned cause phrase disappears from the message when its words are blanked.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python scripts/attribute_readings.py               # everything
    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python scripts/attribute_readings.py --stages 00   # one stage
    ... --inputs catalog held-out                  # no mutants;  --jobs 2: mutants graded at once
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # quality/ lives at the repository root
sys.path.insert(0, str(ROOT / "tests"))  # conftest's helpers: graded_part, read, solution_path

STAGES: dict[str, str] = {
    "00_why_attention": "why_attention", "01_positional_encoding": "positional_encoding",
    "02_attention": "attention", "03_blocks": "blocks", "04_transformer": "model", "05_training": "training",
    "06_decoding": "decoding", "07_fast_and_better_decoding": "fast_decoding",
}
ENGINE = ("differential", "declared", "compare", "crash", "parts", "framework", "runs")
SPLIT = re.compile(r"\n+|(?<=[.;:!?])\s+")


# --- the functions of the traced files ------------------------------------------------------------------------

@dataclass
class Row:
    module: str  # "blocks"
    name: str  # "_reading" or "Class.method"
    first: int  # first line, decorators included (code objects start there)
    last: int
    lines: int  # end_lineno - lineno + 1 of the def
    stage: bool
    literals: list[str] = field(default_factory=list)  # its string constants' long pieces, folded
    experiments: set[str] = field(default_factory=set)  # the experiments (`@on_student_side`) that reach it by name


BACKTICKS = re.compile(r"`[^`]*`")


def _literals(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The string constants written in a function's body (its docstring, `recipe=` arguments and decorators
    left out: a check's title and recipe say nothing about a mistake), cut at `code` spans, pieces of 20
    characters or more, folded."""
    body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) and isinstance(
        node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str) else node.body
    skipped = {id(sub) for statement in body for call in ast.walk(statement) if isinstance(call, ast.Call)
               for keyword in call.keywords if keyword.arg == "recipe" for sub in ast.walk(keyword.value)}
    found = []
    for statement in body:
        for sub in ast.walk(statement):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and id(sub) not in skipped:
                found += [folded for piece in BACKTICKS.split(sub.value) if len(folded := _fold(piece)) >= 20]
    return list(dict.fromkeys(found))


def _rows(module: str, path: Path, stage: bool) -> list[Row]:
    tree = ast.parse(path.read_text())
    rows = []

    def add(node: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> None:
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        rows.append(Row(module, name, first, node.end_lineno, node.end_lineno - node.lineno + 1, stage,
                        _literals(node) if stage else []))

    nodes: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add(node, node.name)
            nodes[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    add(child, f"{node.name}.{child.name}")
                    nodes[f"{node.name}.{child.name}"] = child
    # What runs in the student's process while grading: the experiments, and what they reach by name (a function
    # of the module, or every method of a class of it), statically; the recorder never sees those run.
    methods: dict[str, list[str]] = defaultdict(list)
    for name in nodes:
        if "." in name:
            methods[name.partition(".")[0]].append(name)

    def reached(name: str) -> set[str]:
        names = {sub.id for sub in ast.walk(nodes[name]) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load)}
        return {found for ident in names for found in ([ident] if ident in nodes else methods.get(ident, []))}

    by_name = {row.name: row for row in rows}
    for name, node in nodes.items():
        if any("on_student_side" in ast.unparse(decorator) for decorator in node.decorator_list):
            pending, seen = [name], {name}
            while pending:
                for found in reached(pending.pop()) - seen:
                    seen.add(found)
                    pending.append(found)
            for found in seen:
                by_name[found].experiments.add(name)
    return rows


class Index:
    """Which row a code object belongs to (None: not a traced file, or module/class-body code)."""

    def __init__(self, modules: dict[str, bool]) -> None:
        self.files: dict[str, list[Row]] = {}
        self.rows: list[Row] = []
        for module, stage in modules.items():
            imported = importlib.import_module(f"transformer_course.checks.{module}")
            path = Path(imported.__file__).resolve()
            rows = _rows(module, path, stage)
            self.files[str(path)] = rows
            self.rows.extend(rows)
        boundary = importlib.import_module("transformer_course.checks.boundary")
        self.experiment_wrapper = boundary.on_student_side(lambda: None).__code__  # `run` of on_student_side
        self.cache: dict[Any, Row | None] = {}

    def row(self, code: Any) -> Row | None:
        try:
            return self.cache[code]
        except KeyError:
            pass
        found = None
        rows = self.files.get(os.path.realpath(code.co_filename))
        if rows is not None:
            line = code.co_firstlineno
            inside = [row for row in rows if row.first <= line <= row.last]
            found = min(inside, key=lambda row: row.last - row.first) if inside else None
        self.cache[code] = found
        return found


# --- recording ------------------------------------------------------------------------------------------------

class Recorder:
    """The words traced functions return while a notebook is graded, and how often each row is called."""

    def __init__(self, index: Index, min_chars: int) -> None:
        self.index = index
        self.min_chars = min_chars
        self.words: dict[tuple[str, str], dict[str, None]] = defaultdict(dict)  # row key -> texts, in order
        self.calls: Counter[tuple[str, str]] = Counter()
        self.wrapper = index.experiment_wrapper
        self.locals: dict[tuple[str, str], Callable] = {}

    def reset(self) -> None:
        self.words = defaultdict(dict)
        self.calls = Counter()

    def _strings(self, value: Any, depth: int = 0) -> list[str]:
        if isinstance(value, str):
            return [value]
        if depth > 1:
            return []
        if isinstance(value, tuple | list) and len(value) <= 16:
            return [text for item in value for text in self._strings(item, depth + 1)]
        if isinstance(value, dict) and len(value) <= 16:
            return [text for item in value.values() for text in self._strings(item, depth + 1)]
        if type(value).__name__ == "Diagnosis":
            return [text for attribute in ("where", "cause", "how")
                    if isinstance(text := getattr(value, attribute, None), str)]
        return []

    def record(self, key: tuple[str, str], value: Any) -> None:
        for text in self._strings(value):
            if len(text.strip()) >= self.min_chars:
                self.words[key].setdefault(text, None)

    def _local_for(self, key: tuple[str, str]) -> Callable:
        local = self.locals.get(key)
        if local is None:
            def local(frame: Any, event: str, arg: Any) -> Callable:
                if event == "return" and arg is not None:
                    self.record(key, arg)
                return local

            self.locals[key] = local
        return local

    def _experiment(self, frame: Any, event: str, arg: Any) -> Callable | None:
        if event == "return" and arg is not None:
            function = frame.f_locals.get("function")
            row = self.index.row(function.__code__) if function is not None else None
            if row is not None:
                self.record((row.module, row.name), arg)
        return self._experiment

    def trace(self, frame: Any, event: str, arg: Any) -> Callable | None:
        code = frame.f_code
        if code is self.wrapper:
            function = frame.f_locals.get("function")
            row = self.index.row(function.__code__) if function is not None else None
            if row is None:
                return None
            self.calls[(row.module, row.name)] += 1
            frame.f_trace_lines = False
            return self._experiment
        row = self.index.row(code)
        if row is None:
            return None
        key = (row.module, row.name)
        if code.co_qualname == row.name and not (frame.f_back is not None and frame.f_back.f_code is self.wrapper):
            self.calls[key] += 1
        frame.f_trace_lines = False
        return self._local_for(key)

    def __enter__(self) -> Recorder:
        self.reset()
        sys.settrace(self.trace)
        threading.settrace(self.trace)
        return self

    def __exit__(self, *_: Any) -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]

    def snapshot(self) -> tuple[dict[tuple[str, str], list[str]], Counter]:
        return {key: list(texts) for key, texts in self.words.items()}, Counter(self.calls)


# --- matching words to messages ---------------------------------------------------------------------------------

def _fold(text: str) -> str:
    return " ".join(text.split()).lower()


def fragments(text: str, folded_message: str) -> list[str]:
    """The parts of a recorded text that occur in the message (folded): all of it, or its long sentences."""
    folded = _fold(text)
    if folded in folded_message:
        return [folded]
    return [part for piece in SPLIT.split(text) if len(part := _fold(piece)) >= 20 and part in folded_message]


def blanked(message: str, parts: list[str]) -> str:
    """The message with every occurrence of the (folded) parts replaced by a space, whitespace and case free."""
    for part in sorted(parts, key=len, reverse=True):
        pattern = r"\s+".join(re.escape(word) for word in part.split())
        message = re.sub(pattern, " ", message, flags=re.IGNORECASE)
    return message


@dataclass
class Graded:
    """One input graded: its failing messages and what each credits."""

    kind: str  # catalog, held-out, mutant
    stage: str
    label: str
    failing: dict[str, str]  # grade id -> message
    named: bool  # the input's cause is named (its yardstick's rule)
    named_messages: set[str]  # grade ids whose message names it
    credits: dict[str, dict[tuple[str, str], list[str]]] = field(default_factory=dict)  # id -> row -> parts
    needed: set[tuple[str, str]] = field(default_factory=set)  # stage rows whose blanking un-names the input
    pins: set[tuple[str, str]] = field(default_factory=set)  # catalog: rows whose blanking drops the cause
    literal: set[tuple[str, tuple[str, str]]] = field(default_factory=set)  # (grade id, row) credited by a literal
    error: str = ""


def attribute(graded: Graded, words: dict[tuple[str, str], list[str]], called: Counter, index: Index,
              names: Callable[[dict[str, str]], tuple[bool, set[str]]], cause: str | None = None,
              cause_cell: str | None = None) -> Graded:
    """Credit every failing message's functions: words they returned, or literals of stage-file functions that
    ran while this input was graded (matched outside the message's `code` spans)."""
    stage_rows = {(row.module, row.name) for row in index.rows if row.stage}
    for grade_id, message in graded.failing.items():
        folded = _fold(message)
        prose = _fold(BACKTICKS.sub(" | ", message))
        credited: dict[tuple[str, str], list[str]] = {}
        for key, texts in words.items():
            parts = [part for text in texts for part in fragments(text, folded)]
            if parts:
                credited[key] = list(dict.fromkeys(parts))
        for row in index.rows:
            key = (row.module, row.name)
            if row.literals and (called[key] or any(called[(row.module, e)] for e in row.experiments)):
                parts = [literal for literal in row.literals if literal in prose]
                if parts:
                    graded.literal.add((grade_id, key))
                    credited[key] = list(dict.fromkeys(credited.get(key, []) + parts))
        graded.credits[grade_id] = credited
    if graded.named:
        rows = {key for credited in graded.credits.values() for key in credited if key in stage_rows}
        for key in rows:
            without = {grade_id: blanked(message, graded.credits[grade_id].get(key, []))
                       for grade_id, message in graded.failing.items()}
            if not names(without)[0]:
                graded.needed.add(key)
            if cause is not None and cause_cell in graded.failing:
                if cause.lower() not in without[cause_cell].lower():
                    graded.pins.add(key)
    return graded


# --- grading ------------------------------------------------------------------------------------------------------

def _notebook_inputs(kinds: list[str], stages: list[str]) -> list[tuple[str, Any]]:
    from quality.mistakes import catalog

    items: list[tuple[str, Any]] = []
    if "catalog" in kinds:
        items += [("catalog", mistake) for mistake in catalog()[0] if mistake.assignment in stages]
    if "held-out" in kinds:
        for stage in stages:
            module = importlib.import_module(f"quality.mistakes.{STAGES[stage]}")
            items += [("held-out", mistake) for mistake in getattr(module, "HELD_OUT", ())]
    return items


def grade_mistakes(kinds: list[str], stages: list[str], recorder: Recorder, index: Index,
                   calls: Counter, log: Callable[[str], None]) -> list[Graded]:
    from conftest import graded_part, read, solution_path
    from quality.inprocess import run_grade_cells

    results = []
    for kind, mistake in _notebook_inputs(kinds, stages):
        started = time.monotonic()
        path = solution_path(mistake.assignment)
        notebook = graded_part(mistake.apply(read(path)))
        stop = mistake.fails if kind == "catalog" else None
        try:
            with recorder:
                outcomes = run_grade_cells(notebook, path.parent, stop_after=stop)
        except Exception as error:  # noqa: BLE001  (a run that fails is reported, not fatal)
            results.append(Graded(kind, mistake.assignment, mistake.description, {}, False, set(),
                                  error=f"{type(error).__name__}: {error}"))
            continue
        words, counted = recorder.snapshot()
        calls.update(counted)
        failing = {grade_id: outcome.message for grade_id, outcome in outcomes.items() if not outcome.passed}
        if kind == "catalog":
            def names(messages: dict[str, str], mistake: Any = mistake) -> tuple[bool, set[str]]:
                hit = {g for g, m in messages.items() if g == mistake.fails and mistake.cause.lower() in m.lower()}
                return bool(hit), hit
        else:
            phrases = [phrase.strip().lower() for phrase in mistake.cause.split(" | ")]

            def names(messages: dict[str, str], phrases: list[str] = phrases) -> tuple[bool, set[str]]:
                hit = {g for g, m in messages.items() if any(p in m.lower() for p in phrases)}
                return bool(hit), hit
        named, named_messages = names(failing)
        graded = Graded(kind, mistake.assignment, mistake.description, failing, named, named_messages)
        results.append(attribute(graded, words, counted, index, names, mistake.cause if kind == "catalog" else None,
                                 mistake.fails if kind == "catalog" else None))
        log(f"{kind:8s} {mistake.assignment[:2]} {'named' if named else 'UNNAMED' if failing else 'PASSES':7s} "
            f"{time.monotonic() - started:5.1f} s  {mistake.description}")
    return results


class Recorded(dict):
    """A child's grade-cell outcomes with the words and calls it recorded (pickled back to the parent)."""

    words: dict
    calls: Counter


def grade_mutants(stages: list[str], seeds: list[int], tune_seeds: list[int], per_kind: int, jobs: int,
                  timeout: float, recorder: Recorder, index: Index, calls: Counter,
                  log: Callable[[str], None]) -> list[Graded]:
    import nbformat

    import quality.inprocess as inprocess
    import quality.measure as measure
    from quality.behaviour import equivalent
    from quality.mistakes import is_solution
    from quality.mutations import generate

    original = measure.run_grade_cells
    parent = os.getpid()

    def recorded_grading(*args: Any, **kwargs: Any) -> Recorded:
        if os.getpid() != parent:
            inprocess._SESSIONS.clear()  # the parent's runner zygotes are not this child's: start its own
        with recorder:
            outcomes = original(*args, **kwargs)
        result = Recorded(outcomes)
        result.words, result.calls = recorder.snapshot()
        return result

    measure.run_grade_cells = recorded_grading
    known = measure.catalogued_edits()
    results = []
    try:
        for stage in stages:
            path = ROOT / "solutions" / stage / f"{stage}.ipynb"
            notebook = measure.reduced(nbformat.read(path, as_version=4))
            cells = [cell.source for cell in notebook.cells if is_solution(cell)]
            everything = generate(stage, cells)
            titles = measure.check_titles(stage)
            seen: set[str] = set()
            for seed in seeds:
                left_out = [] if seed in tune_seeds else tune_seeds  # a tuning sample is drawn as it was tuned on
                drawn, _ = measure.drawn_sample(everything, per_kind, seed, left_out, per_kind, known, exclude=seen)
                seen |= {m.identifier for m in drawn}
                started = time.monotonic()
                graded = [m for m in drawn if not equivalent(m)]
                verdicts = measure.run_mutants(graded, {stage: (notebook, path.parent)}, jobs=jobs, timeout=timeout)
                for verdict in verdicts:
                    mutant = verdict.mutant
                    label = f"seed {seed} {mutant.kind} {mutant.function}: {mutant.mutated!r}"
                    if verdict.error:
                        results.append(Graded("mutant", stage, label, {}, False, set(), error=verdict.error))
                        continue
                    outcomes = verdict.outcomes
                    calls.update(getattr(outcomes, "calls", Counter()))
                    failing = {o.grade_id: o.message for o in verdict.failing}

                    def names(messages: dict[str, str], mutant: Any = mutant,
                              titles: list[str] = titles) -> tuple[bool, set[str]]:
                        hit = {g for g, m in messages.items()
                               if measure.names_operation_and_relation(mutant, m, titles)}
                        return bool(hit), hit

                    named, named_messages = names(failing)
                    results.append(attribute(Graded("mutant", stage, label, failing, named, named_messages),
                                             getattr(outcomes, "words", {}), getattr(outcomes, "calls", Counter()),
                                             index, names))
                log(f"mutants  {stage[:2]} seed {seed}: {len(drawn)} drawn, {len(graded)} graded, "
                    f"{sum(r.named for r in results[-len(verdicts):]) if verdicts else 0} named, "
                    f"{time.monotonic() - started:.0f} s")
    finally:
        measure.run_grade_cells = original
    return results


# --- the table ---------------------------------------------------------------------------------------------------

KINDS = ("catalog", "held-out", "mutant")


def show_credits(results: list[Graded], index: Index, path: Path) -> None:
    stage_rows = {(row.module, row.name) for row in index.rows if row.stage}
    lines = ["every input: its failing messages' credits (* named message; row: the matched words)"]
    for graded in results:
        lines.append(f"-- {graded.kind} {graded.stage[:2]} {'named' if graded.named else 'unnamed'}: {graded.label}"
                     + (f"  [{graded.error}]" if graded.error else ""))
        for grade_id, rows in graded.credits.items():
            lines.append(f"   {'*' if grade_id in graded.named_messages else ' '} {grade_id}")
            for key, parts in rows.items():
                mark = "stage " if key in stage_rows else "engine"
                needed = " (needed)" if key in graded.needed else ""
                lines.append(f"       {mark} {key[0]}.{key[1]}{needed}: " + " | ".join(p[:90] for p in parts[:3]))
    path.write_text("\n".join(lines) + "\n")


def report(results: list[Graded], index: Index, calls: Counter, stages: list[str], out: Callable[[str], None],
           top: int) -> None:
    chosen_modules = {STAGES[stage] for stage in stages}
    stage_rows = {(row.module, row.name) for row in index.rows if row.stage}
    credited: dict[tuple[str, str], Counter] = defaultdict(Counter)
    sole: dict[tuple[str, str], Counter] = defaultdict(Counter)
    needed: dict[tuple[str, str], Counter] = defaultdict(Counter)
    pins: dict[tuple[str, str], list[str]] = defaultdict(list)
    literal: Counter = Counter()
    for graded in results:
        literal.update(key for _, key in graded.literal)
        short = graded.kind.split("-")[0][:4]
        for grade_id, rows in graded.credits.items():
            mine = [key for key in rows if key in stage_rows]
            for key in rows:
                credited[key][short] += 1
            if grade_id in graded.named_messages and len(mine) == 1:
                sole[mine[0]][short] += 1
        for key in graded.needed:
            needed[key][short] += 1
        for key in graded.pins:
            pins[key].append(f"{graded.stage[:2]}: {graded.label}")

    out("\n== inputs graded")
    for stage in stages:
        line = []
        for kind in KINDS:
            mine = [g for g in results if g.stage == stage and g.kind == kind]
            if mine:
                failing = sum(bool(g.failing) or bool(g.error) for g in mine)
                line.append(f"{kind} {len(mine)} (rejected {failing}, named {sum(g.named for g in mine)}, "
                            f"messages {sum(len(g.failing) for g in mine)}, errors {sum(bool(g.error) for g in mine)})")
        out(f"{stage}: " + ("; ".join(line) or "nothing"))

    def cells(counter: Counter) -> str:
        return "/".join(str(counter[k]) for k in ("cata", "held", "muta"))

    summary = []
    nothing_rows: list[Row] = []
    for module in STAGES.values():
        if module not in chosen_modules:
            continue
        rows = [row for row in index.rows if row.module == module]
        out(f"\n== {module}.py: {sum(row.lines for row in rows)} lines in {len(rows)} functions "
            "(credited, sole, needed: catalog/held-out/mutants; E experiment, S reached from one)")
        out(f"{'function':44s} {'lines':>5s} {'calls':>7s} {'credited':>12s} {'by lit.':>7s} {'sole':>10s} "
            f"{'needed':>10s}  pins")
        for row in sorted(rows, key=lambda r: r.first):
            key = (row.module, row.name)
            pinned = pins.get(key, [])
            flag = "E" if row.name in row.experiments else "S" if row.experiments else ""
            out(f"{flag:1s} {row.name[:42]:42s} {row.lines:5d} {calls[key]:7d} {cells(credited[key]):>12s} "
                f"{literal[key] or '':>7} {cells(sole[key]):>10s} {cells(needed[key]):>10s}  {len(pinned) or ''}")
            for entry in pinned:
                out(f"{'':70s}pins {entry}")
        never = [r for r in rows if not calls[(r.module, r.name)]]
        remote = [r for r in never if r.experiments]
        nothing = [r for r in rows if not sum(credited[(r.module, r.name)].values())]
        named_any = [r for r in rows if sum(sole[(r.module, r.name)].values())]
        needed_any = [r for r in rows if sum(needed[(r.module, r.name)].values())]
        nothing_rows += nothing
        summary.append((module, sum(r.lines for r in rows), sum(r.lines for r in nothing), sum(r.lines for r in never),
                        sum(r.lines for r in named_any), sum(r.lines for r in needed_any), len(rows),
                        sum(r.lines for r in remote)))
        out(f"   lines credited with nothing: {sum(r.lines for r in nothing)} ({len(nothing)} functions); "
            f"never called here: {sum(r.lines for r in never)} ({len(never)} functions; of them "
            f"{sum(r.lines for r in remote)} lines reached from an experiment, which may run them in the student's "
            f"process); sole namer of a named "
            f"message: {sum(r.lines for r in named_any)}; needed by a named input: {sum(r.lines for r in needed_any)}")

    out("\n== summary (lines)")
    out("(nothing: credited in no message; never: not called in this process (remote: of those, reached from an "
        "experiment); sole: sole namer of at least one named message; needed: its words needed by a named input)")
    out(f"{'stage file':22s} {'functions':>9s} {'lines':>6s} {'nothing':>8s} {'never':>6s} {'remote':>6s} "
        f"{'sole':>6s} {'needed':>7s}")
    for module, lines, nothing, never, named_any, needed_any, count, remote in summary:
        out(f"{module + '.py':22s} {count:9d} {lines:6d} {nothing:8d} {never:6d} {remote:6d} {named_any:6d} "
            f"{needed_any:7d}")
    out(f"{'all':22s} {sum(s[6] for s in summary):9d} {sum(s[1] for s in summary):6d} "
        f"{sum(s[2] for s in summary):8d} {sum(s[3] for s in summary):6d} {sum(s[7] for s in summary):6d} "
        f"{sum(s[4] for s in summary):6d} {sum(s[5] for s in summary):7d}")

    out(f"\n== the {top} largest stage-file functions credited with nothing")
    for row in sorted(nothing_rows, key=lambda r: -r.lines)[:top]:
        where = " (experiment)" if row.name in row.experiments else " (reached from an experiment)" \
            if row.experiments else ""
        out(f"{row.module + '.py':22s} {row.name:44s} {row.lines:5d} lines, {calls[(row.module, row.name)]} calls"
            + where)

    engine = [row for row in index.rows if not row.stage and sum(credited[(row.module, row.name)].values())]
    if engine:
        out("\n== engine functions credited (catalog/held-out/mutants messages)")
        for row in sorted(engine, key=lambda r: -sum(credited[(r.module, r.name)].values())):
            key = (row.module, row.name)
            out(f"{row.module + '.py':18s} {row.name:44s} {row.lines:5d} {calls[key]:7d} {cells(credited[key]):>12s}")

    out("\n== named messages with no stage-file function credited (the engine alone, or words no function returned)")
    for kind in KINDS:
        named = [(g, grade_id) for g in results if g.kind == kind for grade_id in g.named_messages]
        alone = [(g, grade_id) for g, grade_id in named if not any(k in stage_rows for k in g.credits[grade_id])]
        out(f"{kind}: {len(alone)} of {len(named)} named messages")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="*", default=list(STAGES), help="assignments or their numbers (00 03 ...)")
    parser.add_argument("--inputs", nargs="*", default=["catalog", "held-out", "mutants"],
                        choices=["catalog", "held-out", "mutants"])
    parser.add_argument("--mutant-seeds", type=int, nargs="*", default=[3],
                        help="mutant samples graded (default 3, the measured sample, drawn leaving out the tuning "
                             "samples); a tuning seed's sample is drawn as it was (mutants already graded skipped)")
    parser.add_argument("--tune-seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--per-kind", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=2, help="mutants graded at once (forked children)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant")
    parser.add_argument("--min-chars", type=int, default=12, help="shortest recorded string that can be credited")
    parser.add_argument("--top", type=int, default=25, help="largest functions credited with nothing listed")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--show", type=Path, help="write every input's credits, message by message, to this file")
    parser.add_argument("--no-engine", action="store_true", help="trace the stage files only")
    options = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("MULTI30K_DIR", str(ROOT.parent / "shared" / "data" / "multi30k"))
    stages = [stage for stage in STAGES if any(stage.startswith(wanted) for wanted in options.stages)]
    modules = {module: True for module in STAGES.values()}
    if not options.no_engine:
        modules.update({module: False for module in ENGINE})
    index = Index(modules)
    recorder = Recorder(index, options.min_chars)
    lines: list[str] = []

    def out(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    calls: Counter = Counter()
    started = time.monotonic()
    kinds = [kind for kind in options.inputs if kind != "mutants"]
    results = grade_mistakes(kinds, stages, recorder, index, calls, log) if kinds else []
    if "mutants" in options.inputs:
        results += grade_mutants(stages, options.mutant_seeds, options.tune_seeds, options.per_kind, options.jobs,
                                 options.timeout, recorder, index, calls, log)
    out(f"attribution of failing grade-cell messages: stages {' '.join(s[:2] for s in stages)}; inputs "
        f"{', '.join(options.inputs)}; mutant seeds {options.mutant_seeds} (tuning seeds {options.tune_seeds} left "
        f"out, {options.per_kind} per kind); min chars {options.min_chars}; {time.monotonic() - started:.0f} s")
    report(results, index, calls, stages, out, options.top)
    if options.show:
        show_credits(results, index, options.show)
    if options.out:
        options.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
