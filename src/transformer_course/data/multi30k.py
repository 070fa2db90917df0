"""Multi30k task 1 (German–English image descriptions): download, verify, cache, read.

Files come from github.com/multi30k/dataset (branch master, data/task1/raw/<split>.<lang>.gz) and are
checked against the sha256 sums below. Where they are looked for, first match wins:
1. the `directory` argument; 2. the MULTI30K_DIR environment variable; 3. the user cache
(`$XDG_CACHE_HOME/transformer_course/multi30k`, default `~/.cache/...`), downloaded into on first use.
A download is written to a temporary file and moved into place only once its checksum matches, so
no half file is ever left behind.
"""

from __future__ import annotations

import gzip
import os
import urllib.error
from pathlib import Path

from transformer_course.data.download import download_atomically, sha256_of

BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
SPLITS = ("train", "val", "test_2016_flickr")
LANGUAGES = ("de", "en")
SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}
ENVIRONMENT_VARIABLE = "MULTI30K_DIR"


class DataUnavailable(RuntimeError):
    """The data is neither on disk nor downloadable; the message says what to do."""


class ChecksumMismatch(RuntimeError):
    """A file's sha256 is not the published one; the message names the file."""


def cache_directory() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "transformer_course" / "multi30k"


def _verify(path: Path, name: str) -> None:
    actual = sha256_of(path)
    if actual != SHA256[name]:
        raise ChecksumMismatch(
            f"{path} is not the published Multi30k file {name}: sha256 {actual}, expected {SHA256[name]}. "
            "It is corrupt or truncated: delete it and run again (a cached copy is downloaded anew)."
        )


def _download(name: str, destination: Path, base_url: str, timeout: float) -> None:
    """Fetch base_url/name into destination atomically, or raise DataUnavailable/ChecksumMismatch."""
    url = f"{base_url}/{name}"
    try:
        download_atomically(url, destination, lambda path: _verify(path, name), timeout)
    except (urllib.error.URLError, OSError, TimeoutError) as error:
        raise DataUnavailable(
            f"Could not download {url} ({error}). Connect to the internet and run again, or download the six "
            f"files {', '.join(SHA256)} from {base_url}/ into a folder and pass it as `directory=` or set "
            f"{ENVIRONMENT_VARIABLE}=/that/folder."
        ) from error


def file_path(split: str, language: str, directory: str | Path | None = None, *,
              base_url: str = BASE_URL, timeout: float = 30.0) -> Path:
    """Path of a verified `<split>.<language>.gz`, downloading it into the cache if needed."""
    if split not in SPLITS or language not in LANGUAGES:
        raise ValueError(f"unknown Multi30k file {split}.{language}: splits {SPLITS}, languages {LANGUAGES}")
    name = f"{split}.{language}.gz"
    folder = directory or os.environ.get(ENVIRONMENT_VARIABLE)
    if folder:
        path = Path(folder) / name
        if not path.exists():
            raise DataUnavailable(f"{path} does not exist: the folder given for Multi30k lacks {name}.")
        _verify(path, name)
        return path
    path = cache_directory() / name
    if path.exists():
        _verify(path, name)
        return path
    _download(name, path, base_url, timeout)
    return path


def read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def load_pairs(split: str, directory: str | Path | None = None, **kwargs: object) -> list[tuple[str, str]]:
    """(German, English) sentence pairs of one split: train 29,000, val 1,014, test_2016_flickr 1,000."""
    german = read_lines(file_path(split, "de", directory, **kwargs))
    english = read_lines(file_path(split, "en", directory, **kwargs))
    if len(german) != len(english):
        raise ChecksumMismatch(f"{split}: {len(german)} German lines but {len(english)} English lines")
    return list(zip(german, english, strict=True))
