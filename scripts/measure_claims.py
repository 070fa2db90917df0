"""Read every cause the checks claim against the mutant that provoked it (issue 41): correct, vague or FALSE.

For every stage, up to --per-kind mutants of every kind (quality.mutations, drawn with --seed) are graded as a
student's notebook would be (`run_grade_cells`, one forked process per mutant, grading stopping after the
mutated exercise's grade cells), and every `likely cause:` of every failing cell is judged against the edit
the mutant planted (`quality.claims`). A mutant counts as *false* when any of its claims is, else *correct*
when one of them quotes the changed line, else *vague* (no cause, or one without a line). Prints the counts per
stage and every false claim.

    python scripts/measure_claims.py --jobs 2                     # seed 11, one mutant per kind and stage
    python scripts/measure_claims.py --stages 03 05 --per-kind 2 --show
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # quality/ lives at the repository root
from quality.claims import judge_outcomes  # noqa: E402
from quality.measure import reduced, run_mutants  # noqa: E402
from quality.mistakes import is_solution  # noqa: E402
from quality.mutations import STAGE_MODULES, generate, sample  # noqa: E402
from transformer_course.authoring import repository_root  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def mutant_verdict(claims: list) -> str:
    verdicts = {claim.verdict for claim in claims}
    return "false" if "false" in verdicts else "correct" if "correct" in verdicts else "vague"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="*", default=list(STAGE_MODULES), help="assignments or their numbers")
    parser.add_argument("--per-kind", type=int, default=1, help="mutants drawn per kind and stage (default 1)")
    parser.add_argument("--seed", type=int, default=11, help="the seed of the sample (default 11)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants graded at once")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant")
    parser.add_argument("--show", action="store_true", help="print every claim, not only the false ones")
    parser.add_argument("--save", type=Path, help="pickle the graded mutants (mutant, outcomes) to this file")
    options = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("MULTI30K_DIR", str(ROOT.parent / "shared" / "data" / "multi30k"))
    stages = [stage for stage in STAGE_MODULES if any(stage.startswith(wanted) for wanted in options.stages)]
    print(f"seed {options.seed}, up to {options.per_kind} mutant(s) per kind and stage", flush=True)
    totals: Counter = Counter()
    rows, saved = [], []
    for stage in stages:
        import nbformat

        path = repository_root() / "solutions" / stage / f"{stage}.ipynb"
        notebook = reduced(nbformat.read(path, as_version=4))
        mutants = sample(generate(stage, [cell.source for cell in notebook.cells if is_solution(cell)]),
                         options.per_kind, options.seed)
        start = time.monotonic()
        verdicts = run_mutants(mutants, {stage: (notebook, path.parent)}, jobs=options.jobs,
                               timeout=options.timeout, focused=True)
        counted: Counter = Counter()
        saved += [(verdict.mutant, verdict.outcomes, verdict.error) for verdict in verdicts]
        if options.save:
            options.save.write_bytes(pickle.dumps(saved))
        for verdict in verdicts:
            claims = judge_outcomes(verdict.mutant, verdict.outcomes)
            counted[mutant_verdict(claims) if verdict.rejected else "passes"] += 1
            counted["claims"] += len(claims)
            counted["false claims"] += sum(claim.verdict == "false" for claim in claims)
            for claim in claims:
                if claim.verdict == "false" or options.show:
                    print(f"  {claim.verdict.upper():7s} {verdict.mutant.identifier}\n          [{claim.grade_id}] "
                          f"{claim.text[:600]}\n          ({claim.why})", flush=True)
        totals.update(counted)
        rows.append((stage, len(mutants), counted, time.monotonic() - start))
        print(f"{stage}: {len(mutants)} mutants in {rows[-1][3]:.0f} s: {dict(counted)}", flush=True)
    print("\n| stage | mutants | correct | vague | false | passes every check | claims read | false claims |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for stage, count, counted, _ in rows + [("all", sum(row[1] for row in rows), totals, 0)]:
        print(f"| {stage} | {count} | {counted['correct']} | {counted['vague']} | {counted['false']} | "
              f"{counted['passes']} | {counted['claims']} | {counted['false claims']} |")
    return 1 if totals["false"] else 0


if __name__ == "__main__":
    sys.exit(main())
