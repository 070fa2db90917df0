"""Writing an output file that other processes, or other machines on a shared folder, may write at the
same moment: the text goes to a temporary file of a name no other writer can pick (in the same folder,
so the rename stays on one file system), then replaces the file in one step. A reader sees the old file
or the new one, never half of either, and of two writers the last one to finish wins whole.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def replace_atomically(path: Path, write: Callable[[IO[str]], None], newline: str | None = None) -> Path:
    """Call WRITE with a text handle on a fresh temporary file beside PATH, then rename it over PATH.

    The temporary name is made by `tempfile.mkstemp` (unique on the folder, whatever the machine or
    process id); on any error it is removed and PATH is left as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline=newline) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    return path


def write_text_atomically(path: Path, text: str) -> Path:
    """PATH holds TEXT (UTF-8), replaced whole (see `replace_atomically`)."""
    return replace_atomically(path, lambda handle: handle.write(text))
