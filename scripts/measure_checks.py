"""Measure the grade cells on mistakes nobody wrote for them: mechanical mutants of the reference
solutions (quality.mutations), run through the real grade cells.

For every stage: up to --per-kind mutants of every kind, drawn with --seed from all mutants the
generator makes, leaving out the ones drawn with the --tune-seed seeds (the sets the checks were tuned on), so
the figures are for mutants nobody looked at while writing the checks. Mutants that behave exactly
like the reference on random inputs (grading.behaviour) are equivalent: listed, not counted.

Reported per stage: the share of mutants rejected (at least one grade cell fails), the share whose
failure message names the place of the mutation or what it changes (any failing cell, and the first
failing cell), the mutants that pass, and the rejected ones whose messages do not name it.

    python scripts/measure_checks.py                      # all eight stages, seed 5, leaving out seeds 0 to 4
    python scripts/measure_checks.py --stages 01 02 --seed 0 --tune-seed --show   # a tuning set itself
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

import nbformat
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # quality/ lives at the repository root
from quality.behaviour import equivalent  # noqa: E402
from quality.measure import catalogued_edits, check_titles, drawn_sample, reduced, run_mutants  # noqa: E402
from quality.mistakes import catalog, is_solution  # noqa: E402
from quality.mutations import KINDS, STAGE_MODULES, generate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="*", default=list(STAGE_MODULES), help="assignments or their numbers")
    parser.add_argument("--per-kind", type=int, default=6, help="mutants drawn per kind and stage (default 6)")
    parser.add_argument("--seed", type=int, default=5, help="the seed of the measured sample (default 5)")
    parser.add_argument("--tune-seed", type=int, nargs="*", default=[0, 1, 2, 3, 4],
                        help="the seeds of earlier samples, left out of the measured one (none: nothing left "
                             "out; default 0 to 4: tuned on, or measured in earlier rounds)")
    parser.add_argument("--tune-per-kind", type=int, default=6, help="the size of the tuning sample per kind (6)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1)), help="mutants graded at once")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant before it counts as stuck")
    parser.add_argument("--show", action="store_true", help="print every failing message, not only the unnamed")
    parser.add_argument("--alternatives", action="store_true", help="also grade the catalog's correct alternatives")
    options = parser.parse_args()
    torch.set_num_threads(1)  # the children inherit it: one thread per graded mutant
    os.environ.setdefault("MULTI30K_DIR", str(ROOT.parent / "shared" / "data" / "multi30k"))
    stages = [stage for stage in STAGE_MODULES if any(stage.startswith(wanted) for wanted in options.stages)]
    print(f"measured sample: seed {options.seed}, up to {options.per_kind} mutants per kind and stage"
          + (f", leaving out the tuning samples (seeds {', '.join(map(str, options.tune_seed))}, "
             f"{options.tune_per_kind} per kind)" if options.tune_seed else ""))
    rows = []
    totals = Counter()
    known = catalogued_edits()
    for stage in stages:
        path = ROOT / "solutions" / stage / f"{stage}.ipynb"
        notebook = reduced(nbformat.read(path, as_version=4))
        cells = [cell.source for cell in notebook.cells if is_solution(cell)]
        everything = generate(stage, cells)
        drawn, catalogued = drawn_sample(everything, options.per_kind, options.seed, options.tune_seed,
                                         options.tune_per_kind, known)  # catalogued: written against, left out
        started = time.monotonic()
        equivalents = [mutant for mutant in drawn if equivalent(mutant)]
        graded = [mutant for mutant in drawn if mutant not in equivalents]
        verdicts = run_mutants(graded, {stage: (notebook, path.parent)}, jobs=options.jobs, timeout=options.timeout)
        titles = check_titles(stage)
        rejected = [v for v in verdicts if v.rejected]
        named = [v for v in rejected if v.named_by_the_rule(titles)]
        placed = [v for v in rejected if v.named(titles)]
        kinds = Counter(m.kind for m in graded)
        rows.append((stage, len(everything), len(drawn) + len(catalogued), len(catalogued), len(equivalents),
                     len(graded), len(rejected), len(named), len(placed), time.monotonic() - started))
        totals.update(graded=len(graded), rejected=len(rejected), named=len(named), placed=len(placed))
        print(f"\n== {stage}: {len(everything)} mutants in all; {len(drawn)} drawn "
              f"({', '.join(f'{kind} {kinds[kind]}' for kind in KINDS if kinds[kind])}); "
              f"{len(equivalents)} equivalent")
        for mutant in equivalents:
            print(f"   equivalent  {mutant.function}: {mutant.line!r} -> {mutant.mutated!r}")
        for verdict in verdicts:
            mutant = verdict.mutant
            place = f"{mutant.kind:16s} {mutant.function}: {mutant.mutated!r}"
            if not verdict.rejected:
                print(f"   PASSES      {place}")
            elif not verdict.named_by_the_rule(titles):
                first = verdict.error or (verdict.failing[0].grade_id + ": " + verdict.failing[0].message)
                print(f"   not named   {place}\n               {_short(first)}")
            elif options.show:
                print(f"   named       {place}\n               "
                      f"{_short(verdict.failing[0].grade_id + ': ' + verdict.failing[0].message)}")
    if options.alternatives:
        _, alternatives = catalog()
        from quality.inprocess import run_grade_cells

        for alternative in alternatives:
            if alternative.assignment not in stages:
                continue
            path = ROOT / "solutions" / alternative.assignment / f"{alternative.assignment}.ipynb"
            outcomes = run_grade_cells(alternative.apply(nbformat.read(path, as_version=4)), path.parent)
            failed = [grade_id for grade_id, outcome in outcomes.items() if not outcome.passed]
            totals.update(alternatives=1, accepted=not failed)
            print(f"   alternative {'accepted' if not failed else 'REJECTED by ' + ', '.join(failed)}: "
                  f"{alternative.description}")

    def share(part: int, whole: int) -> str:
        return f"{100 * part / whole:5.1f} %" if whole else "    –  "

    print("\n| stage | mutants (all) | drawn | in the catalog (left out) | equivalent | measured | rejected "
          "| named: operation and relation (the rule) | place named | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for stage, total, drawn, known_, same, graded, rejected, named, placed, seconds in rows:
        print(f"| {stage} | {total} | {drawn} | {known_} | {same} | {graded} | {share(rejected, graded)} | "
              f"{share(named, graded)} | {share(placed, graded)} | {seconds:.0f} |")
    print(f"| all | | | | | {totals['graded']} | {share(totals['rejected'], totals['graded'])} | "
          f"{share(totals['named'], totals['graded'])} | {share(totals['placed'], totals['graded'])} | |")
    if options.alternatives:
        print(f"\ncorrect alternatives accepted: {totals['accepted']} of {totals['alternatives']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
