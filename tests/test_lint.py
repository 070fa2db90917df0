"""ruff-clean sources (the package, lessons, tests, configuration)."""

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    result = subprocess.run([ruff, "check", "src", "lessons", "tests", "autograde"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
