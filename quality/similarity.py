"""Calibrate the near-copies list of the class report (`transformer_course.grading.outputs.similarity`) on honest
work, and measure its false alarms.

    python -m quality.similarity            print every cell's measurements and the false-alarm rates
    python -m quality.similarity --write    also write the calibration the grader reads

A flag is a promise: a pair listed as near-copies must not be honest work. Short exercises are similar by nature,
so every exercise cell and written answer gets its own threshold, measured here on:

- honest work: the honest class's three styles (`quality.honest`: code in the annotated, tutorial and prose
  styles, and their written answers, `quality.honest.written`), and the mistake catalog's correct alternatives
  (`quality.mistakes`) that rewrite the reference's code of their cell: an alternative is written as an edit of the
  reference, and one that keeps more than half of the reference's lines, or whose text is 0.8 the same or more
  (difflib's ratio, comments and layout left out), is the reference with a few changes, so it is measured, and
  reported, as a partial copy, not as honest work;
- copies: the reference pasted with its comments removed, the names it binds renamed and its layout changed
  (`paste`), each honest answer pasted the same way by a classmate, and the model answers pasted verbatim.

A cell's threshold is the highest similarity honest work reaches on it (to the reference or to another honest
answer) plus `MARGIN`, at least `FLOOR` (0.8 for code: held out, honest code of a short exercise reached 0.72 of
the reference where the other styles stayed under 0.45; 0.6 for written answers, where honest answers stay
under 0.35). A cell is *too short to tell* when that threshold would pass `CEILING`
(honest work comes as close as a copy), or when its reference, normalised and without the release's code, covers
fewer than `MIN_CHARACTERS` characters: the report says so instead of listing anyone.

The false-alarm rate is measured twice: on the calibration's own honest pairs (none reaches a threshold, by
construction), and held out, each style's pairs against thresholds calibrated without that style. The example
class of stage 2 (`quality.examples`) is checked too: its blank notebooks must not be listed, its copies of the
reference must be.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import io
import itertools
import json
import keyword
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from quality.honest import STAGES, STYLES, student_notebook
from quality.honest.written import WRITTEN
from quality.mistakes import catalog
from transformer_course.grading.outputs import similarity

ROOT = Path(__file__).resolve().parent.parent
MARGIN = 0.15  # above the highest honest similarity
FLOOR = {"code": 0.8, "written": 0.6}  # no threshold lower than this (honest code of a short exercise reaches 0.72)
CEILING = 0.95  # a threshold above this cannot tell honest work from a copy
MIN_CHARACTERS = similarity.MIN_CHARACTERS  # a reference under four k-grams (release left out) is too short
HALF = 0.5  # an alternative that keeps more than this share of the reference's lines is a partial copy ...
NEAR = 0.8  # ... and so is one whose text is at least this close to the reference's (difflib's ratio)


def paste(source: str, released: str = "") -> str:
    """SOURCE as a student who pastes it and hides that would hand it in: comments removed, every name the code
    binds that the release does not (its locals, helpers, loop variables) renamed, blank lines added."""
    given = _bound(released)
    renamed = {name: f"my_{index}_{name[::-1]}" for index, name in enumerate(sorted(_bound(source) - given))}
    out, previous = [], None
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source
    for token in tokens:
        if token.type == tokenize.COMMENT:
            token = token._replace(string="")
        elif (token.type == tokenize.NAME and token.string in renamed and not keyword.iskeyword(token.string)
              and not (previous is not None and previous.string == ".")):
            token = token._replace(string=renamed[token.string])
        out.append(token)
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token
    text = tokenize.untokenize(out)
    return "\n\n".join(line.rstrip() for line in text.splitlines() if line.strip())


def _bound(source: str) -> set[str]:
    import ast
    import textwrap

    try:
        return similarity._bound(ast.parse(textwrap.dedent(source)))
    except SyntaxError:
        return set()


def _notebook(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


@dataclass
class Cell:
    """What one exercise cell or written answer is measured on."""

    stage: str
    grade_id: str
    written: bool
    reference: str  # normalised
    boilerplate: str  # normalised
    honest: dict[str, str] = field(default_factory=dict)  # {author: normalised}
    partial: dict[str, str] = field(default_factory=dict)  # alternatives that keep most of the reference
    copies: list[tuple[str, str, str]] = field(default_factory=list)  # (what, normalised copy, normalised original)


def cells() -> list[Cell]:
    """Every exercise cell and written answer of the course with its honest work and copies."""
    _, alternatives = catalog()
    found = []
    for stage in STAGES:
        solution = _notebook(ROOT / "solutions" / stage / f"{stage}.ipynb")
        released = _notebook(ROOT / "notebooks" / stage / f"{stage}.ipynb")
        given = similarity.compared_cells(released)
        solved = similarity.compared_cells(solution)
        references = similarity.reference_cells(solution)
        boilerplate = similarity.boilerplate_cells(released)
        honest_notebooks = {style: student_notebook(style, stage, released) for style in STYLES}
        for grade_id, cell in given.items():
            written = cell.cell_type == "markdown"
            entry = Cell(stage, grade_id, written, references[grade_id], boilerplate[grade_id])
            if written:
                for style in STYLES:
                    text = WRITTEN[style].get(grade_id, "")
                    if text:
                        entry.honest[style] = similarity.normalise_text(text)
                        entry.copies.append((f"{style}'s answer handed in by a classmate",
                                             similarity.normalise_text(text), entry.honest[style]))
                model = similarity.model_answer(solved[grade_id].source)
                entry.copies.append(("the model answer pasted", similarity.normalise_text(model), entry.reference))
            else:
                for style, notebook in honest_notebooks.items():
                    source = similarity.compared_cells(notebook)[grade_id].source
                    text = similarity.normalise_code(source)
                    if text != boilerplate[grade_id]:
                        entry.honest[style] = text
                        entry.copies.append((f"{style}'s code pasted by a classmate, renamed",
                                             similarity.normalise_code(paste(source, cell.source)), text))
                reference_source = similarity._SOLUTION_MARKERS.sub("", solved[grade_id].source)
                entry.copies.append(("the reference pasted, comments removed, locals renamed",
                                     similarity.normalise_code(paste(reference_source, cell.source)), entry.reference))
                reference_lines = similarity.region_lines(cell.source, solved[grade_id].source)
                for number, alternative in enumerate(a for a in alternatives if a.assignment == stage):
                    edited = alternative.apply(copy.deepcopy(solution))
                    source = similarity.compared_cells(edited)[grade_id].source
                    if source == solved[grade_id].source:
                        continue
                    name = f"alternative {number}: {alternative.description}"
                    target = entry.partial if _derived(reference_lines, similarity.region_lines(
                        cell.source, source)) else entry.honest
                    target[name] = similarity.normalise_code(source)
            found.append(entry)
    return found


def _derived(reference: list[str], alternative: list[str]) -> bool:
    """Whether an alternative's code of a cell is the reference's with a few changes: it keeps more than half of
    the reference's lines unchanged, or its text is at least `NEAR` the same (difflib's ratio, comments and
    layout left out)."""
    def code(line: str) -> str:
        return " ".join(line.split("#")[0].split())

    ours = {code(line) for line in reference if code(line)}
    kept = len(ours & {code(line) for line in alternative}) / max(1, len(ours))
    ratio = difflib.SequenceMatcher(None, _text(reference), _text(alternative), autojunk=False).ratio()
    return kept > HALF or ratio >= NEAR


def _text(lines: list[str]) -> str:
    """The lines' code without comments and indentation, one space between words: what is compared."""
    return " ".join(" ".join(line.split("#")[0].split()) for line in lines if line.split("#")[0].strip())


@dataclass
class Measured:
    cell: Cell
    size: int  # characters of the reference the fingerprints cover
    honest: list[tuple[str, str, float]]  # (first, second, similarity): honest vs reference and honest vs honest
    partial: list[tuple[str, float]]  # (alternative, similarity to the reference)
    copies: list[tuple[str, float]]  # (what, similarity to its original)

    def highest(self, leave_out: str = "") -> float:
        return max((score for first, second, score in self.honest if leave_out not in (first, second)), default=0.0)

    def threshold(self, leave_out: str = "") -> tuple[float | None, str]:
        if self.size < MIN_CHARACTERS:
            return None, (f"the reference is {self.size} characters once normalised (the release's code left out), "
                          f"under {MIN_CHARACTERS}")
        highest = self.highest(leave_out)
        at = round(max(FLOOR["written" if self.cell.written else "code"], highest + MARGIN), 2)
        if at > CEILING:
            pair = max((item for item in self.honest if leave_out not in item[:2]), key=lambda item: item[2])
            return None, (f"honest work comes as close as a copy: {pair[0]} and {pair[1]} are {highest:.2f} similar")
        return at, f"honest work reaches {highest:.2f}"


def measure(cell: Cell) -> Measured:
    common = similarity.boilerplate_hashes(cell.boilerplate)

    def score(first: str, second: str) -> float:
        return similarity.similarity(similarity.fingerprint(first, common), similarity.fingerprint(second, common))

    reference = similarity.fingerprint(cell.reference, common)
    authors = {"the reference": cell.reference, **cell.honest}
    honest = [(first, second, round(score(authors[first], authors[second]), 3))
              for first, second in itertools.combinations(authors, 2)]
    return Measured(cell, similarity.size(reference), honest,
                    [(name, round(score(text, cell.reference), 3)) for name, text in cell.partial.items()],
                    [(what, round(score(text, original), 3)) for what, text, original in cell.copies])


def example_class(thresholds: dict[tuple[str, str], similarity.Threshold]) -> dict[str, object]:
    """The example class of stage 2 compared as the grader compares it: who is listed."""
    import tempfile

    from quality.examples import write_example_class
    from transformer_course.grading.intake.submissions import Release, discover, load

    stage = "02_attention"
    released = _notebook(ROOT / "notebooks" / stage / f"{stage}.ipynb")
    solution = _notebook(ROOT / "solutions" / stage / f"{stage}.ipynb")
    with tempfile.TemporaryDirectory() as folder:
        downloads = Path(folder) / "downloads"
        write_example_class(ROOT, downloads, stage, Path(folder) / "class", downloads)
        release = Release(ROOT / "notebooks", [stage])
        submissions: dict[tuple[str, str], dict[str, str]] = {}
        for found in discover(downloads):
            loaded = load(release, found)
            if loaded.notebook is None:
                continue
            who = str(found.relative).split("/")[0].split("_")[0]
            for grade_id, text in similarity.normalised_cells(loaded.notebook, released).items():
                submissions.setdefault((stage, grade_id), {})[who] = text
    references = {(stage, grade_id): text for grade_id, text in similarity.reference_cells(solution).items()}
    boilerplate = {(stage, grade_id): text for grade_id, text in similarity.boilerplate_cells(released).items()}
    written = {(stage, grade_id) for grade_id, cell in similarity.compared_cells(released).items()
               if cell.cell_type == "markdown"}
    findings = similarity.compare(submissions, {key: references[key] for key in submissions}, boilerplate,
                                  thresholds, written)
    listed = sorted({student for group in findings.groups for student in group.students})
    return {"listed": listed, "groups": [[group.grade_id, group.members] for group in findings.groups]}


def calibrate() -> dict:
    measured = [measure(cell) for cell in cells()]
    table: dict[str, dict[str, dict]] = {}
    thresholds = {}
    for item in measured:
        at, why = item.threshold()
        thresholds[item.cell.stage, item.cell.grade_id] = similarity.Threshold(at, why)
        table.setdefault(item.cell.stage, {})[item.cell.grade_id] = {
            "threshold": at, "why": why, "written": item.cell.written, "reference_characters": item.size,
            "honest_highest": round(item.highest(), 3), "honest_pairs": len(item.honest),
            "copies_lowest": round(min((score for _, score in item.copies), default=1.0), 3),
            "partial_copies": {name: score for name, score in item.partial}}
    rates = false_alarms(measured)
    return {"about": "near-copy thresholds per exercise cell and written answer, measured on honest work by "
                     "`python -m quality.similarity --write`; read by grading/outputs/similarity.py",
            "parameters": {"k": similarity.K, "window": similarity.WINDOW, "normaliser": similarity.NORMALISER,
                           "margin": MARGIN, "floor": FLOOR, "ceiling": CEILING, "min_characters": MIN_CHARACTERS},
            "measured": {**rates, "example_class": example_class(thresholds)},
            "cells": table}


def false_alarms(measured: list[Measured]) -> dict[str, object]:
    """Honest pairs listed / honest pairs compared, on the cells that can tell: with the calibration's thresholds,
    and held out (each style against thresholds measured without it); copies listed / copies made."""
    told = [item for item in measured if item.threshold()[0] is not None]
    own = sum(score >= item.threshold()[0] for item in told for _, _, score in item.honest)
    pairs = sum(len(item.honest) for item in told)
    held, held_pairs, held_told, held_told_pairs, examples = 0, 0, 0, 0, []
    for style in STYLES:
        for item in measured:
            at, _ = item.threshold(leave_out=style)
            if at is None:
                continue
            scores = [(first, second, score) for first, second, score in item.honest if style in (first, second)]
            listed = [pair for pair in scores if pair[2] >= at]
            held_pairs += len(scores)
            held += len(listed)
            if item.threshold()[0] is not None:
                held_told_pairs += len(scores)
                held_told += len(listed)
            examples += [f"{item.cell.stage} {item.cell.grade_id}: {first} ~ {second} {score:.2f} >= {at:.2f} "
                         f"(calibrated without {style})" for first, second, score in listed]
    copies = [(item, score) for item in told for _, score in item.copies]
    caught = sum(score >= item.threshold()[0] for item, score in copies)
    partial = [(item, score) for item in told for _, score in item.partial]
    return {"cells": len(measured), "cells_that_can_tell": len(told),
            "cells_too_short": [f"{item.cell.stage} {item.cell.grade_id}" for item in measured
                                if item.threshold()[0] is None],
            "honest_pairs_listed": [own, pairs],
            "honest_pairs_listed_held_out": [held, held_pairs],
            "honest_pairs_listed_held_out_on_cells_that_can_tell": [held_told, held_told_pairs],
            "held_out_listed": examples,
            "copies_listed": [caught, len(copies)],
            "partial_copies_listed": [sum(score >= item.threshold()[0] for item, score in partial), len(partial)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write {similarity.CALIBRATION.relative_to(ROOT)}")
    arguments = parser.parse_args(argv)
    result = calibrate()
    for stage, cells_ in result["cells"].items():
        for grade_id, entry in cells_.items():
            shown = "too short to tell" if entry["threshold"] is None else f"threshold {entry['threshold']:.2f}"
            print(f"{stage} {grade_id}: {shown} ({entry['why']}; copies at least {entry['copies_lowest']:.2f})")
    print(json.dumps(result["measured"], indent=1))
    if arguments.write:
        similarity.CALIBRATION.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {similarity.CALIBRATION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
