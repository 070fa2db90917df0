"""What the grading build costs one notebook: making it in the grader (`build.grading_build`) and, in a fresh
process that has imported torch (as the zygote has), installing it and importing the stage's checks module and
the reference package from memory; beside it, importing the same modules from their files. Last, how many lines
of the checks modules that define checks or experiments the student side keeps (website/instructor/threat-model.md).

    python scripts/measure_grading_build.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from transformer_course.grading.sandbox import build

CHILD = """
import json, sys, time
import torch, IPython.core.interactiveshell, matplotlib.pyplot  # what the zygote imports
mode, checks = sys.argv[1], sys.argv[2]
entries = sys.stdin.read()
started = time.perf_counter()
if mode == "build":
    from transformer_course.grading.sandbox import build
    build.install({name: tuple(entry) for name, entry in json.loads(entries).items()})
__import__(checks)
import transformer_course.reference
print(time.perf_counter() - started)
"""


def main() -> None:
    for checks, _ in build.stages():
        started = time.perf_counter()
        made = build.grading_build(checks)
        making = time.perf_counter() - started
        data = json.dumps(made)
        seconds = {}
        for mode in ("build", "files"):
            runs = [float(subprocess.run([sys.executable, "-c", CHILD, mode, checks], input=data, text=True,
                                         capture_output=True, check=True).stdout) for _ in range(3)]
            seconds[mode] = sorted(runs)[1]
        print(f"{checks.rsplit('.', 1)[1]:20} make {making:.3f} s ({len(data) / 1024:.0f} KiB)  "
              f"import from the build {seconds['build']:.3f} s  from the files {seconds['files']:.3f} s")

    kept_lines()


def kept_lines() -> None:
    """Lines of each checks module with checks or experiments that the student side keeps (its statements'
    lines, decorators and blank lines between statements left out), and in all."""
    modules, kept = build._checks_modules(), build.kept_statements()
    total_kept = total = 0
    for name, module in modules.items():
        if kept[name] is None:
            continue
        lines = len(module.text.splitlines())
        keeps = sum(module.tree.body[i].end_lineno - module.tree.body[i].lineno + 1 for i in kept[name])
        total_kept, total = total_kept + keeps, total + lines
        print(f"{name.rsplit('.', 1)[1]:20} the student side keeps {keeps:5} of {lines:5} lines")
    print(f"{'in all':20} the student side keeps {total_kept:5} of {total:5} lines")


if __name__ == "__main__":
    main()
