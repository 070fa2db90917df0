"""Build the course website: every stage's solution notebook, run, as a page (`make site`).

    python -m website.build [--out website/_build/html] [--jobs 2] [--short] [--execute 01 06] [--fresh]
                            [--solutions FOLDER] [--class]

1. Each `solutions/NN_name/NN_name.ipynb` becomes a page notebook (`website.pages.page_from_solution`).
2. Pages whose code has run before with the same course package are taken from the execution cache
   (jupyter-cache, the cache MyST-NB uses, under WORK/cache/<package hash>); the others run in Jupyter
   kernels, `--jobs` at a time, and are cached. A page's markdown is not part of the cache key, so editing
   the prose of a lesson re-runs nothing; editing its code re-runs that page only; editing the course
   package re-runs every page (they all import it).
3. The interactive figures get their local form (`website.pages.finish_outputs`), and Sphinx with MyST-NB
   writes the HTML. Sphinx re-reads only the pages whose file changed.

`--class` builds the class edition (`make site-class`) into website/_build/class/html: the pages are the
student notebooks (`notebooks/`), with no model answer, rubric or solution code of a graded exercise; they run
as a student's "Run all" does (a cell that needs an exercise not written yet says so and the page goes on),
with the class landing page `index-class.md`. See website/instructor/releasing.md, "Which edition".

`--short` runs every page the way the autograder does (TRANSFORMER_COURSE_SHORT_RUN=1: tiny models, a few
batches, a few sentences): the tests use it. `--execute 01 06` runs only those stages; the other pages are
built without outputs (the tests use it too).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from website import pages

ROOT = Path(__file__).resolve().parents[1]
WEBSITE = ROOT / "website"
# the site's own files, copied into the source folder: the landing page, the instructor's and the authors' guides
SOURCES = ("conf.py", "index.md", "instructor", "authors", "_static", "_templates")
PACKAGE = ROOT / "src" / "transformer_course"
NOT_RUN_BY_PAGES = ("grading", "authoring.py")  # parts of the package no notebook imports
SHARED_DATA = ROOT.parent / "shared" / "data" / "multi30k"
CLASS_INDEX = "index-class.md"  # the class edition's landing page, copied as index.md


def package_hash(short: bool, class_edition: bool = False) -> str:
    """What the cached outputs depend on besides the pages' code: the course package's source and the setting."""
    digest = hashlib.sha256((b"short" if short else b"full") + (b" class" if class_edition else b""))
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(NOT_RUN_BY_PAGES):
            continue
        digest.update(relative.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def assignments(solutions: Path) -> list[str]:
    return sorted(path.name for path in solutions.iterdir() if (path / f"{path.name}.ipynb").exists())


def run_notebook(text: str, folder: str, timeout: int) -> tuple[str, float]:
    """Run one page notebook in a fresh kernel (in a worker process); return it with its outputs, and seconds."""
    from nbclient import NotebookClient

    notebook = nbformat.reads(text, as_version=4)
    started = time.perf_counter()
    # record_timing=False: timings in the cells' metadata would change the cache key
    NotebookClient(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": folder}}).execute()
    return nbformat.writes(notebook), time.perf_counter() - started


def kernel_environment(work: Path, short: bool, jobs: int, class_edition: bool = False) -> dict[str, str]:
    """Settings every kernel inherits: the data, a fresh checkpoints folder, no progress widgets, threads."""
    runs = work / "runs"
    shutil.rmtree(runs, ignore_errors=True)  # stage 5 must train, not resume a run of an earlier build
    environment = {
        "TRANSFORMER_COURSE_RUNS": str(runs),
        "TQDM_DISABLE": "1",  # progress bars are widgets in a kernel: nothing a static page can show
        "TRANSFORMER_COURSE_SHORT_RUN": "1" if short else "0",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs))),
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        # a cell that raises stops the page's build (runtime.guard_cells); the class edition's pages are the
        # student notebooks, whose exercises are not written: they run on, as a student's "Run all" does
        "TRANSFORMER_COURSE_STRICT": "0" if class_edition else "1",
    }
    if "MULTI30K_DIR" not in os.environ and SHARED_DATA.is_dir():
        environment["MULTI30K_DIR"] = str(SHARED_DATA)
    return environment


def execute_pages(notebooks: dict[str, nbformat.NotebookNode], run: set[str], work: Path, short: bool, jobs: int,
                  timeout: int, class_edition: bool = False) -> dict[str, float]:
    """Fill in the outputs of the pages in `run`, from the cache or by running them; return seconds per run."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    key = package_hash(short, class_edition)
    caches = work / "cache"
    for old in caches.glob("*") if caches.exists() else ():
        if old.name != key:  # outputs of another version of the package: never shown again
            shutil.rmtree(old)
    cache = get_cache(str(caches / key))
    missing = []
    for assignment in sorted(run):
        try:
            _, merged = cache.merge_match_into_notebook(notebooks[assignment])
        except KeyError:
            missing.append(assignment)
        else:
            notebooks[assignment] = merged
            print(f"  {assignment}: outputs from the cache")
    seconds: dict[str, float] = {}
    if not missing:
        return seconds
    environment = kernel_environment(work, short, jobs, class_edition)
    folder = str(work / "source" / "stages")
    # the longest first, so that two workers finish together: stage 0 and 5 train, 7 decodes the test set
    order = sorted(missing, key=lambda name: (name[:2] not in ("00", "05", "07", "06"), name))
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, initializer=os.environ.update,
                                                initargs=(environment,)) as pool:
        futures = {pool.submit(run_notebook, nbformat.writes(notebooks[name]), folder, timeout): name for name in order}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            text, seconds[name] = future.result()
            executed = nbformat.reads(text, as_version=4)
            cache.cache_notebook_bundle(CacheBundleIn(executed, uri=name), check_validity=False, overwrite=True)
            notebooks[name] = executed
            print(f"  {name}: ran in {seconds[name]:.0f} s")
    return seconds


def solution_code(solutions: Path = ROOT / "solutions", notebooks: Path = ROOT / "notebooks") -> set[str]:
    """The lines of the solution regions (a graded exercise's code) that no student notebook holds, spaces
    collapsed: what the class edition must not show."""
    given = " ".join(" ".join(cell.source.split()) for path in sorted(notebooks.glob("*/*.ipynb"))
                     for cell in nbformat.read(path, 4).cells)
    found = set()
    for path in sorted(solutions.glob("*/*.ipynb")):
        for cell in nbformat.read(path, 4).cells:
            for region in re.findall(r"### BEGIN SOLUTION[^\n]*\n(.*?)### END SOLUTION", cell.source, re.DOTALL):
                found |= {" ".join(line.split()) for line in region.splitlines()}
    return {line for line in found if len(line) >= 24 and not line.startswith("#") and line not in given}


LEFT_OUT = """# {title}

This page of the guide shows code of a graded exercise's solution, so the class edition of the website leaves it
out. It is in the course's repository, `website/{name}`, and on the self-study website.
"""


def _class_page(origin: Path, name: str, solutions: set[str]) -> str:
    """A guide page as the class edition shows it: as written, or the note above when it holds solution code."""
    text = origin.read_text(encoding="utf-8")
    if not any(line in " ".join(text.split()) for line in solutions):
        return text
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), origin.stem)
    return LEFT_OUT.format(title=title, name=name)


def copy_sources(source: Path, class_edition: bool = False) -> None:
    solutions = solution_code() if class_edition else set()
    for name in SOURCES:
        origin = WEBSITE / name
        if origin.is_dir():
            for path in origin.rglob("*"):
                if path.is_file() and class_edition and path.suffix == ".md":
                    relative = path.relative_to(WEBSITE).as_posix()
                    pages.write_if_changed(source / relative, _class_page(path, relative, solutions))
                elif path.is_file():
                    target = source / path.relative_to(WEBSITE)
                    if not target.exists() or target.read_bytes() != path.read_bytes():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(path, target)
            for stale in (source / name).rglob("*"):  # a guide page deleted here is deleted from the site too
                if stale.is_file() and not (origin / stale.relative_to(source / name)).exists():
                    stale.unlink()
        elif origin.exists():
            if name == "index.md" and class_edition:
                origin = WEBSITE / CLASS_INDEX
            pages.write_if_changed(source / name, origin.read_text(encoding="utf-8"))


def build(out: Path, work: Path, jobs: int = 2, short: bool = False, execute: list[str] | None = None,
          fresh: bool = False, timeout: int = 3600, solutions: Path = ROOT / "solutions",
          class_edition: bool = False) -> dict[str, float]:
    """Build the site into `out` from the solution notebooks in `solutions` (with CLASS_EDITION: the student
    notebooks in `solutions`, e.g. notebooks/); return the seconds each page that ran took (none when all came
    from the cache)."""
    if fresh:
        shutil.rmtree(work, ignore_errors=True)
    source = work / "source"
    (source / "stages").mkdir(parents=True, exist_ok=True)
    copy_sources(source, class_edition)
    names = assignments(solutions)
    run = {name for name in names if not execute or name[:2] in execute}
    notebooks = {name: pages.page_from_notebook(nbformat.read(solutions / name / f"{name}.ipynb", 4), name,
                                                class_edition)
                 for name in names}
    started = time.perf_counter()
    seconds = execute_pages(notebooks, run, work, short, jobs, timeout, class_edition)
    if seconds:
        print(f"ran {len(seconds)} page(s) in {time.perf_counter() - started:.0f} s on the clock "
              f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    for name in names:
        text = nbformat.writes(pages.finish_outputs(notebooks[name]))
        pages.write_if_changed(source / "stages" / f"{name}.ipynb", text)
    for stale in (source / "stages").glob("*.ipynb"):
        if stale.stem not in names:
            stale.unlink()
    pages.write_if_changed(source / "stage_table.md",
                           pages.stage_table(notebooks, lambda name: f"stages/{name}.ipynb"))
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going", "-d", str(work / "doctrees"),
               str(source), str(out)]
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="where the site is written (default: website/_build/html, with "
                                                  "--class website/_build/class/html)")
    parser.add_argument("--work", type=Path, help="the Sphinx source folder, the execution cache and Sphinx's own "
                                                  "cache live here (default: website/_build, with --class "
                                                  "website/_build/class)")
    parser.add_argument("--jobs", type=int, default=2, help="pages run at the same time")
    parser.add_argument("--short", action="store_true",
                        help="run the pages as the autograder does (seconds, not minutes)")
    parser.add_argument("--execute", nargs="*", metavar="NN", help="run only these stages (e.g. 01 06)")
    parser.add_argument("--fresh", action="store_true", help="forget the execution cache and Sphinx's cache first")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds a cell may run")
    parser.add_argument("--solutions", type=Path,
                        help="the notebooks to build from (default: solutions/, with --class notebooks/; the tests "
                             "use a changed copy)")
    parser.add_argument("--class", dest="class_edition", action="store_true",
                        help="the class edition: the student notebooks, no model answer, rubric or solution code")
    arguments = parser.parse_args()
    work = arguments.work or WEBSITE / "_build" / ("class" if arguments.class_edition else "")
    out = arguments.out or work / "html"
    solutions = arguments.solutions or ROOT / ("notebooks" if arguments.class_edition else "solutions")
    started = time.perf_counter()
    build(out.resolve(), work.resolve(), arguments.jobs, arguments.short, arguments.execute, arguments.fresh,
          arguments.timeout, solutions.resolve(), arguments.class_edition)
    print(f"site built in {time.perf_counter() - started:.0f} s: {out / 'index.html'} "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
