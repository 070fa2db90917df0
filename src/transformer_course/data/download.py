"""Verified, atomic downloads: a file appears at its destination whole and checked, or not at all."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_atomically(url: str, destination: Path, verify: Callable[[Path], None], timeout: float) -> None:
    """Stream url into a temporary file beside destination, let `verify` refuse it by raising, then move it
    into place (atomic on one file system). The temporary file never outlives the call; network errors
    (urllib.error.URLError, OSError, TimeoutError) propagate for the caller to explain."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{destination.name}.", suffix=".part", dir=destination.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle, urllib.request.urlopen(url, timeout=timeout) as response:
            while block := response.read(1 << 20):
                handle.write(block)
        verify(Path(temporary))
        os.replace(temporary, destination)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
