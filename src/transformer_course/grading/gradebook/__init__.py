"""nbgrader's gradebook and class folder (`class_folder`) and the course's nbgrader configuration for a
class (`config`). Imports nothing of the grading package but `cells`.

nbgrader's Gradebook runs the `alembic` command of the environment it is installed in, so that
environment's scripts folder is put on PATH when this package is imported (a command started as
`.venv/bin/python -m ...` without an activated environment would not find it).
"""

import os
import sys
from pathlib import Path

_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")
