"""Build the landing page and the guides alone, without running any notebook (seconds, not minutes):

    python -m website.guides [--out website/_build/guides]

The instructor's guide (website/instructor/) and the guide for course authors and maintainers
(website/authors/) are built with the site's own Sphinx configuration, with one stand-in page for the
stages, and Sphinx's warnings as errors: a page missing from its guide's table of contents, or a link to a
page or a section that does not exist, stops the build with the reason. `make site` builds them with the
stages; tests/test_guides.py builds them this way."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from website import build

STAND_IN = "# The stages\n\nThe stage pages are built by `make site` (they run every notebook), not here.\n"


def build_guides(out: Path, work: Path) -> subprocess.CompletedProcess:
    """Sphinx's run (its return code and messages) over the site's sources with a stand-in for the stages."""
    source = work / "source"
    build.copy_sources(source)
    (source / "stage_table.md").write_text("(the stage pages are not built here)\n", encoding="utf-8")
    (source / "stages").mkdir(parents=True, exist_ok=True)
    for page in (source / "stages").iterdir():
        if page.name != "not_built.md":
            page.unlink()
    (source / "stages" / "not_built.md").write_text(STAND_IN, encoding="utf-8")
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-d", str(work / "doctrees"),
               str(source), str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(build.ROOT)})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=build.WEBSITE / "_build" / "guides" / "html",
                        help="where the pages are written")
    arguments = parser.parse_args()
    out = arguments.out.resolve()
    result = build_guides(out, out.parent)
    sys.stderr.write(result.stderr)
    if result.returncode == 0:
        print(f"guides built: {out / 'instructor' / 'index.html'}, {out / 'authors' / 'index.html'}")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
