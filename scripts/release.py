"""Cut a release of the course from this checkout (a fork of the course included): see
website/instructor/releasing.md. `make release VERSION=0.2.0`, `make tag` and `make release-check` run it.

    python scripts/release.py version 0.2.0      set __version__ (the one place the version lives)
    python scripts/release.py repository [URL]   set [project.urls] Repository in pyproject.toml (the one place the
                                                 repository address lives); without URL: this clone's `origin`
    python scripts/release.py check [--untagged] [--remote]
                                                 what stands between this checkout and a release students can use
    python scripts/release.py tag                make the tag v<version> here (then push it: git push origin TAG)

Every student notebook names one repository and one tag (its badge, its setup cell's `pip install ...@TAG`, the
checkpoint's URL), all built from pyproject.toml's Repository and `__version__`. So a release is: those two
set, the notebooks rebuilt from them, the package reinstalled (its metadata carries both: the checkpoint's URL
is read from it), the tag made in the repository the notebooks name, and pushed there. `check` names each step
that is missing, with the command that does it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.compile(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?")  # what the tag v<version> is made of
GITHUB = re.compile(r"https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_VERSION_LINE = re.compile(r'^__version__ = "[^"]*"$', re.MULTILINE)
_REPOSITORY_LINE = re.compile(r'^(Repository = )"[^"]*"$', re.MULTILINE)
_SETUP = re.compile(r'REPOSITORY, RELEASE = "(?P<repository>[^"]*)", "(?P<tag>[^"]*)"')


class ReleaseError(ValueError):
    """What is asked cannot be done as asked; the message says why and what to do."""


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def version_of(root: Path) -> str:
    found = re.search(r'^__version__ = "([^"]*)"$', _read(root / "src" / "transformer_course" / "__init__.py"),
                      re.MULTILINE)
    if not found:
        raise ReleaseError("src/transformer_course/__init__.py has no line `__version__ = \"...\"`")
    return found[1]


def repository_of(root: Path) -> str:
    found = re.search(r'^\[project\.urls\][^\[]*?^Repository = "([^"]*)"$', _read(root / "pyproject.toml"),
                      re.MULTILINE | re.DOTALL)
    if not found:
        raise ReleaseError("pyproject.toml has no `Repository = \"...\"` under [project.urls]")
    return found[1]


def set_version(root: Path, version: str) -> None:
    """Set `__version__` (the tag students install is "v" + it)."""
    if not VERSION.fullmatch(version):
        raise ReleaseError(f"{version!r} is not a version such as 0.2.0 (or 0.2.0rc1): the tag will be 'v' + it")
    path = root / "src" / "transformer_course" / "__init__.py"
    version_of(root)
    path.write_text(_VERSION_LINE.sub(f'__version__ = "{version}"', _read(path), count=1), encoding="utf-8")


def github_url(url: str) -> str:
    """URL as the notebooks name a repository: https://github.com/OWNER/NAME (from an https or ssh remote)."""
    url = url.strip()
    ssh = re.fullmatch(r"(?:ssh://)?git@github\.com[:/](?P<path>[^\s]+?)(?:\.git)?/?", url)
    if ssh:
        url = f"https://github.com/{ssh['path']}"
    url = re.sub(r"\.git/?$", "", url.rstrip("/"))
    if not GITHUB.fullmatch(url):
        raise ReleaseError(f"{url!r} is not a GitHub repository (https://github.com/OWNER/NAME): the notebooks' "
                           "Open-in-Colab badges and the checkpoint's download need one")
    return url


def set_repository(root: Path, url: str) -> str:
    """Set [project.urls] Repository, the one place the repository address lives; returns it as written."""
    url = github_url(url)
    repository_of(root)
    path = root / "pyproject.toml"
    path.write_text(_REPOSITORY_LINE.sub(lambda match: f'{match[1]}"{url}"', _read(path), count=1),
                    encoding="utf-8")
    return url


def _git(root: Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *arguments], capture_output=True, text=True, check=False)


def origin(root: Path) -> str | None:
    """This clone's `origin`, as a GitHub URL (None when it has none, or it is not on GitHub)."""
    done = _git(root, "remote", "get-url", "origin")
    if done.returncode != 0:
        return None
    try:
        return github_url(done.stdout)
    except ReleaseError:
        return None


def notebook_names(root: Path) -> dict[str, tuple[str, str]]:
    """{student notebook: (repository, tag)} as its setup cell names them."""
    found = {}
    for path in sorted((root / "notebooks").glob("*/*.ipynb")):
        cells = json.loads(_read(path)).get("cells", [])
        text = "\n".join("".join(cell.get("source", "")) for cell in cells[:3])
        match = _SETUP.search(text)
        found[path.parent.name] = (match["repository"], match["tag"]) if match else ("", "")
    return found


def problems(root: Path, *, untagged: bool = False, remote: bool = False, installed: bool = True) -> list[str]:
    """What stands between this checkout and a release students can use, each with the command that fixes it.
    UNTAGGED: the tag is not made yet (allowed while releasing); REMOTE: ask `origin` whether it has the tag;
    INSTALLED: compare the installed package's metadata with the checkout (the checkpoint's URL is read from it)."""
    found = []
    version, repository = version_of(root), repository_of(root)
    tag = f"v{version}"
    clone = origin(root)
    if clone is not None and clone.lower() != repository.lower():
        found.append(f"the notebooks install from {repository} (pyproject.toml, [project.urls] Repository), but this "
                     f"clone's origin is {clone}: a fork sets its own address there (python scripts/release.py "
                     "repository), then rebuilds the notebooks (make notebooks)")
    stale = sorted(name for name, named in notebook_names(root).items() if named != (repository, tag))
    if stale:
        found.append(f"{len(stale)} student notebook(s) name another repository or tag than {repository} {tag} "
                     f"({', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}): make notebooks")
    if installed:
        try:
            meta = metadata.metadata("transformer-course")
            urls = {entry.partition(", ")[0].lower(): entry.partition(", ")[2] for entry in
                    meta.get_all("Project-URL") or []}
            if meta["Version"] != version or urls.get("repository") != repository:
                found.append(f"the installed course package is {meta['Version']} from {urls.get('repository')}, "
                             f"the checkout {version} from {repository}: make setup (it reinstalls when "
                             "pyproject.toml or src/transformer_course/__init__.py changed)")
        except metadata.PackageNotFoundError:
            found.append("the course package is not installed: make setup")
    has_tag = _git(root, "rev-parse", "-q", "--verify", f"refs/tags/{tag}").returncode == 0
    if not has_tag and not untagged:
        found.append(f"this clone has no tag {tag}, which every notebook installs from (a fresh clone or a fork "
                     "may hold no tags): commit, then make tag, then git push origin " + tag)
    if has_tag:
        differ = _git(root, "diff", "--quiet", tag, "--", "notebooks", "src", "pyproject.toml").returncode
        if differ:
            found.append(f"the tag {tag} is not this checkout: its notebooks or package differ from the working "
                         "tree. A tag is never moved (students' notebooks install from it): release a new "
                         "version, make release VERSION=...")
        if remote:
            listed = _git(root, "ls-remote", "--tags", "origin", f"refs/tags/{tag}")
            if listed.returncode != 0:
                found.append(f"could not ask origin whether it has {tag} ({listed.stderr.strip()[:200]})")
            elif not listed.stdout.strip():
                found.append(f"origin has no tag {tag} yet: git push origin {tag}")
    return found


def make_tag(root: Path) -> str:
    """Make the annotated tag v<version> at HEAD, after checking that HEAD is what the notebooks name."""
    tag = f"v{version_of(root)}"
    if _git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise ReleaseError(f"the working tree has changes that are not committed: commit them, then make {tag}")
    if _git(root, "rev-parse", "-q", "--verify", f"refs/tags/{tag}").returncode == 0:
        raise ReleaseError(f"the tag {tag} exists already; a tag is never moved: release a new version")
    blocking = problems(root, untagged=True, installed=False)
    if blocking:
        raise ReleaseError("not tagged:\n  " + "\n  ".join(blocking))
    done = _git(root, "tag", "-a", tag, "-m", f"Release {tag}")
    if done.returncode != 0:
        raise ReleaseError(f"git tag failed: {done.stderr.strip()}")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["version", "repository", "check", "tag"])
    parser.add_argument("value", nargs="?", help="version: the new version; repository: the address (default: "
                                                 "this clone's origin)")
    parser.add_argument("--untagged", action="store_true", help="check: the tag is not made yet (while releasing)")
    parser.add_argument("--remote", action="store_true", help="check: ask origin whether it has the tag")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    root = arguments.root.resolve()
    try:
        if arguments.command == "version":
            if not arguments.value:
                raise ReleaseError("give the new version: make release VERSION=0.2.0")
            set_version(root, arguments.value)
            print(f"__version__ = {arguments.value!r}: the notebooks will name the tag v{arguments.value}")
        elif arguments.command == "repository":
            url = arguments.value or origin(root)
            if not url:
                raise ReleaseError("this clone has no GitHub origin: give the address, "
                                   "python scripts/release.py repository https://github.com/OWNER/NAME")
            print(f"[project.urls] Repository = {set_repository(root, url)!r}: now make notebooks (and make setup)")
        elif arguments.command == "tag":
            tag = make_tag(root)
            print(f"made the tag {tag}; push it where the notebooks install from: git push origin {tag}")
        else:
            found = problems(root, untagged=arguments.untagged, remote=arguments.remote)
            for problem in found:
                print(f"- {problem}")
            tag = f"v{version_of(root)}"
            if not found:
                print(f"ready: the notebooks name {repository_of(root)} {tag}"
                      + ("" if arguments.untagged else ", and the tag is here"))
            if arguments.untagged and not found:
                print(f"next: make test; git commit -am 'Release {tag}'; make tag; git push origin HEAD {tag}")
            return 1 if found else 0
    except ReleaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
