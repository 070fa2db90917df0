"""Build the course notebooks from their one source.

    lessons/NN_name.py           jupytext percent format: prose, given code, tests (edit these)
      + src/transformer_course/reference/*.py   the solution code, spliced in by `#| include`
      -> solutions/NN_name/NN_name.ipynb         nbgrader source notebooks (built, committed)
      -> notebooks/NN_name/NN_name.ipynb         student release, by `nbgrader generate_assignment`

Markers a lesson may use:
    `#| include module.path:Name`   one per line in a code cell; replaced by that definition's source
    `#| setup`                      the Colab/local setup code (repository URL from pyproject.toml,
                                    the release tag from the package version)
    `#| settings`                   the student's settings cell (stop at the first failing check or not)
    `<!-- colab-badge -->`          in markdown: the Open-in-Colab badge of the student notebook (same tag)
    `<!-- keep-and-hand-in -->`     in markdown: how to keep your work in Colab and how to hand it in
    `#| bug: FIND => REPLACE`       in a solution cell: a bug hunt. The solution notebook holds the correct
                                    code (its solution markers around what the student must repair); the
                                    student's notebook holds that code without the markers and with FIND
                                    (which must occur once) replaced by REPLACE: the broken version the
                                    student debugs. Several `#| bug:` lines plant several edits; `\n` in
                                    FIND or REPLACE stands for a line break (a bug that adds a line).
Cell headers carry nbgrader roles in short form:
    `# %% solution="id"`            student writes code here (BEGIN/END SOLUTION inside)
    `# %% tests="id" points=2`      a locked grade cell
    `# %% tests="id" points=2 credit="extra"`   extra credit: its points add to the score, not to the maximum
    `# %% tests="id" points=0 credit="optional"`   counts for no points (both: 0 nbgrader points and a first
                                    line saying what the cell is worth, `grading.cells.credit_line`)
    `# %% readonly="id"`            a locked cell students may not edit (setup)
    `# %% [markdown] answer="id" points=2`
                                    a written answer graded by hand (nbgrader's "manually graded
                                    answer"). Its text is the model answer and the rubric, written
                                    as `**Model answer.** ...` then `**Rubric.**` and one
                                    `- N point(s): ...` line per criterion (they add up to the
                                    points); students get an empty answer cell instead. Put the
                                    question itself in the markdown cell just above it. A new stage
                                    adds questions the same way: a question cell, then an answer cell.

The build also writes `src/transformer_course/checks/_grade_cells.py`: every grade cell's id, points
and the checks it calls, which the notebooks' summary cell reads. A grade cell holding hidden tests
gets a first comment line saying so, outside the hidden region, so students see it.

Usage: python -m transformer_course.authoring build | check   (run from the repository root)
"""

from __future__ import annotations

import argparse
import ast
import filecmp
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import jupytext
import nbformat

from transformer_course.grading.cells import credit as credit_of
from transformer_course.grading.cells import credit_line

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def repository_root(start: Path | None = None) -> Path:
    """The checkout that holds lessons/ and autograde/nbgrader_config.py."""
    for folder in [(start or Path.cwd()).resolve(), *(start or Path.cwd()).resolve().parents]:
        if (folder / "autograde" / "nbgrader_config.py").exists() and (folder / "lessons").is_dir():
            return folder
    raise SystemExit("Run this from inside the course repository (no lessons/ and autograde/ found).")


def repository_url(root: Path) -> str:
    with open(root / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]["urls"]["Repository"]


def package_version(root: Path) -> str:
    """`__version__` of the package in this checkout (pyproject.toml reads its version from there)."""
    tree = ast.parse((root / "src" / "transformer_course" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise ValueError("src/transformer_course/__init__.py defines no __version__")


def release_tag(root: Path) -> str:
    """The git tag students' notebooks install from and link to: 'v' + the package version."""
    return f"v{package_version(root)}"


def assignments(root: Path) -> list[str]:
    """Assignment ids, one per lesson file: '01_positional_encoding', ..."""
    return sorted(path.stem for path in (root / "lessons").glob("[0-9][0-9]_*.py"))


def definition_source(target: str) -> str:
    """Source text of a top-level function or class, given as 'package.module:Name'."""
    module_name, _, name = target.partition(":")
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"#| include {target}: module {module_name} not found")
    text = Path(spec.origin).read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = text.splitlines()
            last = node.end_lineno or first
            # Indented comments right after the body (`### END SOLUTION` after a final return) belong to it.
            while last < len(lines) and lines[last].startswith((" ", "\t")) and lines[last].strip().startswith("#"):
                last += 1
            return "\n".join(lines[first - 1 : last])
    raise ValueError(f"#| include {target}: no top-level definition {name} in {module_name}")


def setup_source(root: Path) -> str:
    return SETUP_TEMPLATE.replace("{repository}", repository_url(root)).replace("{tag}", release_tag(root))


def badge(root: Path, assignment: str) -> str:
    github = repository_url(root).removeprefix("https://github.com/")
    link = (f"https://colab.research.google.com/github/{github}/blob/{release_tag(root)}"
            f"/notebooks/{assignment}/{assignment}.ipynb")
    image = "https://colab.research.google.com/assets/colab-badge.svg"
    return f'<a href="{link}" target="_parent"><img src="{image}" alt="Open In Colab"/></a>'


SETUP_TEMPLATE = '''\
# Setup: run this cell first. In Colab it installs the course package, release {tag} (about a
# minute); where the package is already installed (your own machine, the grader) it installs nothing.
import importlib.util
import subprocess
import sys

REPOSITORY, RELEASE = "{repository}", "{tag}"
if importlib.util.find_spec("transformer_course") is None:
    print("Installing the course package", RELEASE, "from", REPOSITORY)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"transformer-course @ git+{REPOSITORY}@{RELEASE}"],
                   check=True)

from transformer_course import __version__  # noqa: E402
from transformer_course.runtime import configure, pick_device  # noqa: E402

if f"v{__version__}" != RELEASE:
    print(f"Note: this notebook is from release {RELEASE}, the installed course package is v{__version__}.")
device = pick_device()'''

SETTINGS_TEMPLATE = '''\
# Your settings: change a value, then run this cell again.
# STOP_AT_FIRST_FAILURE = False: a failing check or a cell that crashes shows a red ✘ message and "Run all"
#   carries on to the end, where the last cell lists every check (a cell that uses an exercise you have
#   not written yet says "skipped"). True: the first failing check or crash stops the notebook there.
STOP_AT_FIRST_FAILURE = False
configure(stop_at_first_failure=STOP_AT_FIRST_FAILURE)'''

KEEP_AND_HAND_IN = '''\
**Keeping and handing in your work.** In Colab, your changes live only in this browser session until
you save a copy: *File → Save a copy in Drive* (then keep working in that copy; Colab saves it as you
go). To hand in, *File → Download → Download .ipynb* and submit that file as your instructor asks.
On your own machine, save the notebook (Ctrl/Cmd + S) and hand in the `.ipynb` file.'''

# the visible first line of every grade cell that holds hidden tests (the region itself is removed
# from the student notebooks)
HIDDEN_TESTS_LINE = "# Hidden tests: they run when your notebook is graded (the same properties, other sizes)."

def _nbgrader_metadata(metadata: dict) -> dict | None:
    base = {"schema_version": 3, "task": False}
    if "solution" in metadata:
        return {**base, "grade": False, "solution": True, "locked": False, "grade_id": metadata.pop("solution")}
    # graded cells: "tests" run the checks (locked), an "answer" is written and graded by hand
    for role, what, written in (("tests", "grade cell", False), ("answer", "answer cell", True)):
        if role in metadata:
            points = metadata.pop("points", None)
            if points is None:
                raise ValueError(f"{what} {metadata[role]} has no points")
            return {**base, "grade": True, "solution": written, "locked": not written, "points": points,
                    "grade_id": metadata.pop(role)}
    if "readonly" in metadata:
        return {**base, "grade": False, "solution": False, "locked": True, "grade_id": metadata.pop("readonly")}
    return None


def _credit(assignment: str, credit: object, nbgrader: dict | None) -> str:
    """A grade cell marked `credit="extra"` or `credit="optional"`: its nbgrader points become 0 (nbgrader's
    maximum leaves it out) and the returned line, put first in its source, says what it is worth
    (`grading.cells.credit` reads it back)."""
    if not nbgrader or not nbgrader["grade"] or nbgrader["solution"]:
        raise ValueError(f"{assignment}: credit={credit!r} marks a grade cell of checks (tests=...) only")
    where = f"{assignment}: grade cell {nbgrader['grade_id']}"
    if credit not in ("extra", "optional"):
        raise ValueError(f'{where}: credit={credit!r}; write credit="extra" or credit="optional"')
    points = float(nbgrader["points"])
    if credit == "extra" and points <= 0:
        raise ValueError(f'{where}: credit="extra" needs the points it can add (points=2)')
    if credit == "optional" and points != 0:
        raise ValueError(f'{where}: an optional cell counts for no points; write points=0')
    nbgrader["points"] = 0
    return credit_line(str(credit), points)


BUG = re.compile(r"^#\| bug: (?P<find>.+?) => (?P<replace>.*)$")
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def bug_edits(root: Path, assignment: str) -> dict[str, list[tuple[str, str]]]:
    """{bug-hunt cell id: [(find, replace), ...]} from the lesson's `#| bug:` lines."""
    lesson = jupytext.read(root / "lessons" / f"{assignment}.py", fmt="py:percent")
    edits: dict[str, list[tuple[str, str]]] = {}
    for cell in lesson.cells:
        found = [BUG.match(line.strip()) for line in cell.source.splitlines()]
        found = [match for match in found if match]
        if not found:
            continue
        if "solution" not in cell.metadata:
            raise ValueError(f"{assignment}: `#| bug:` outside a solution cell")
        edits[cell.metadata["solution"]] = [(match["find"].replace("\\n", "\n"), match["replace"].replace("\\n", "\n"))
                                            for match in found]  # `\n` in either stands for a line break
    return edits


def broken_version(source: str, edits: list[tuple[str, str]], where: str) -> str:
    """A bug hunt's student version: the solution cell's code without its markers, with the bugs planted."""
    code = "\n".join(line for line in source.splitlines() if line.strip() not in SOLUTION_MARKERS)
    for find, replace in edits:
        if code.count(find) != 1:
            raise ValueError(f"{where}: `#| bug: {find} => ...`: the text must occur exactly once in the cell")
        code = code.replace(find, replace)
    return code


def plant_bugs(root: Path, assignment: str, source: Path, release: Path) -> None:
    """After nbgrader: give each bug-hunt cell of the release its broken version (and nbgrader's checksum)."""
    edits = bug_edits(root, assignment)
    if not edits:
        return
    from nbgrader.utils import compute_checksum

    path = release / assignment / f"{assignment}.ipynb"
    solution = nbformat.read(source / assignment / f"{assignment}.ipynb", as_version=4)
    released = nbformat.read(path, as_version=4)
    correct = {cell.id: cell.source for cell in solution.cells}
    for cell in released.cells:
        if cell.id in edits:
            cell.source = broken_version(correct[cell.id], edits[cell.id], f"{assignment}: {cell.id}")
            cell.metadata.nbgrader["checksum"] = compute_checksum(cell)
    nbformat.write(released, path)


def _expand(source: str, root: Path, assignment: str) -> str:
    lines = []
    for line in source.splitlines():
        stripped = line.strip()
        if BUG.match(stripped):
            continue
        if stripped.startswith("#| include "):
            lines.append(definition_source(stripped.removeprefix("#| include ").strip()))
        elif stripped == "#| setup":
            lines.append(setup_source(root))
        elif stripped == "#| settings":
            lines.append(SETTINGS_TEMPLATE)
        elif stripped == "<!-- keep-and-hand-in -->":
            lines.append(KEEP_AND_HAND_IN)
        elif stripped == "<!-- colab-badge -->":
            lines.append(badge(root, assignment))
        else:
            lines.append(line)
    return "\n".join(lines)


def cell_id(assignment: str, cell_type: str, source: str, taken: set[str]) -> str:
    """A cell's id, derived from its content, not its place: `03-` and 8 hex digits of the SHA-1 of its type
    and source (a graded cell's id is its grade_id instead). Inserting, moving or removing a cell leaves every
    other cell's id as it was, so a release mid-term changes the ids of the cells it changed only. Two cells
    with the same content get `-2`, `-3`... in their order."""
    digest = hashlib.sha1(f"{cell_type}\n{source}".encode()).hexdigest()[:8]
    base = f"{assignment[:2]}-{digest}"
    return next(candidate for n in range(1, len(taken) + 2)
                if (candidate := base if n == 1 else f"{base}-{n}") not in taken)


def build_solution(root: Path, assignment: str) -> nbformat.NotebookNode:
    """Read lessons/<assignment>.py and return the nbgrader source notebook."""
    lesson = jupytext.read(root / "lessons" / f"{assignment}.py", fmt="py:percent")
    notebook = nbformat.v4.new_notebook()
    notebook.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    seen_ids: set[str] = set()
    for cell in lesson.cells:
        metadata = dict(cell.metadata)
        credit = metadata.pop("credit", None)
        nbgrader = _nbgrader_metadata(metadata)
        source = _expand(cell.source, root, assignment)
        if nbgrader and "answer" in cell.metadata and cell.cell_type != "markdown":
            raise ValueError(f"{assignment}: answer cell {nbgrader['grade_id']} must be a markdown cell")
        if nbgrader and nbgrader["grade"] and "### BEGIN HIDDEN TESTS" in source:
            source = f"{HIDDEN_TESTS_LINE}\n{source}"
        if credit is not None:
            source = f"{_credit(assignment, credit, nbgrader)}\n{source}"
        if cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(source)
        else:
            new = nbformat.v4.new_code_cell(source)
        new.id = nbgrader["grade_id"] if nbgrader else cell_id(assignment, cell.cell_type, source, seen_ids)
        if new.id in seen_ids:
            raise ValueError(f"{assignment}: duplicate cell id {new.id}")
        seen_ids.add(new.id)
        if nbgrader:
            new.metadata["nbgrader"] = nbgrader
        notebook.cells.append(new)
    nbformat.validate(notebook)
    return notebook


GRADE_TABLE = Path("src") / "transformer_course" / "checks" / "_grade_cells.py"
_CHECKS_IMPORT = re.compile(r"^from transformer_course\.checks import (\w+) as check$", re.MULTILINE)


def grade_table(root: Path) -> tuple[dict[str, list[tuple[str, float, tuple[str, ...] | None]]],
                                     dict[str, dict[str, str]]]:
    """{checks module: [(grade_id, points, visible checks the cell calls; () for hidden tests, None for a
    written answer graded by hand)]} and {checks module: {grade_id: "extra" or "optional"}} for the cells marked
    `credit=` (an extra-credit cell's points are those it can add; an optional cell's are 0)."""
    table: dict[str, list[tuple[str, float, tuple[str, ...] | None]]] = {}
    credits: dict[str, dict[str, str]] = {}
    for assignment in assignments(root):
        notebook = build_solution(root, assignment)
        code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
        found = _CHECKS_IMPORT.findall(code)
        if len(found) != 1:
            raise ValueError(f"{assignment}: expected one `from transformer_course.checks import X as check`")
        rows = []
        for cell in notebook.cells:
            nbgrader = cell.metadata.get("nbgrader", {})
            if not nbgrader.get("grade"):
                continue
            hidden = "### BEGIN HIDDEN TESTS" in cell.source
            names = () if hidden else tuple(dict.fromkeys(re.findall(r"\bcheck\.(\w+)\(", cell.source)))
            if cell.cell_type == "markdown":  # a written answer
                names = None
            marked = credit_of(cell.source)
            rows.append((nbgrader["grade_id"], marked[1] if marked else nbgrader["points"], names))
            if marked:
                credits.setdefault(f"transformer_course.checks.{found[0]}", {})[nbgrader["grade_id"]] = marked[0]
        table[f"transformer_course.checks.{found[0]}"] = rows
    return table, credits


def grade_table_source(root: Path) -> str:
    lines = ['"""Written by `python -m transformer_course.authoring build` (make notebooks): do not edit.',
             "",
             "Every grade cell of every lesson, per checks module: (grade_id, points, the checks it calls);",
             "an empty tuple of checks marks a cell of hidden tests, None a written answer graded by hand.",
             'The notebooks\' summary cell reads it."""',
             "",
             "GRADE_CELLS: dict[str, tuple[tuple[str, float, tuple[str, ...] | None], ...]] = {"]
    table, credits = grade_table(root)
    for module, rows in table.items():
        lines.append(f"    {module!r}: (")
        lines += [f"        ({grade_id!r}, {points!r}, {names!r})," for grade_id, points, names in rows]
        lines.append("    ),")
    lines.append("}")
    lines += ["",
              "# the grade cells a lesson marks credit=\"extra\" (their points add to the score, not to the maximum)",
              "# or credit=\"optional\" (they count for nothing), per checks module",
              f"CREDIT: dict[str, dict[str, str]] = {credits!r}"]
    return "\n".join(lines) + "\n"


def write_solutions(root: Path, destination: Path, only: list[str] | None = None) -> None:
    for assignment in only or assignments(root):
        folder = destination / assignment
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(build_solution(root, assignment), folder / f"{assignment}.ipynb")


def generate_release(root: Path, source: Path, release: Path, only: list[str] | None = None) -> None:
    """Run real `nbgrader generate_assignment` for every assignment, source -> release."""
    for assignment in only or assignments(root):
        run_nbgrader(
            root,
            ["generate_assignment", assignment, "--no-db", "--force",
             f"--CourseDirectory.source_directory={source}", f"--CourseDirectory.release_directory={release}"],
        )
        plant_bugs(root, assignment, source, release)


def run_nbgrader(root: Path, arguments: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    """nbgrader with the course configuration (it is read from the working directory, autograde/)."""
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [sys.executable, "-m", "nbgrader", *arguments], cwd=root / "autograde", env=environment,
        capture_output=True, text=True, **kwargs,
    )
    if result.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(arguments)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def build(root: Path, only: list[str] | None = None) -> None:
    """Rebuild solutions/ and notebooks/ (all assignments, or just those named)."""
    for assignment in only or assignments(root):
        for folder in ("solutions", "notebooks"):
            shutil.rmtree(root / folder / assignment, ignore_errors=True)
    write_solutions(root, root / "solutions", only)
    generate_release(root, root / "solutions", root / "notebooks", only)
    (root / GRADE_TABLE).write_text(grade_table_source(root), encoding="utf-8")


# folders that running a notebook creates beside it (git ignores them too); never part of a build
RUN_ARTIFACTS = frozenset({"checkpoints", ".ipynb_checkpoints", "__pycache__"})


def differences(expected: Path, actual: Path) -> list[str]:
    """Relative paths that differ, or exist on one side only, between two trees of notebooks."""
    def files(folder: Path) -> set[str]:
        if not folder.exists():
            return set()
        return {str(p.relative_to(folder)) for p in folder.rglob("*")
                if p.is_file() and not RUN_ARTIFACTS & set(p.relative_to(folder).parts)}

    expected_files, actual_files = files(expected), files(actual)
    different = sorted(expected_files ^ actual_files)
    for name in sorted(expected_files & actual_files):
        if not filecmp.cmp(expected / name, actual / name, shallow=False):
            different.append(name)
    return different


def check(root: Path, only: list[str] | None = None) -> list[str]:
    """Rebuild into a temporary folder; return the committed files that are not what the build gives (of the
    assignments `only`, when given)."""
    with tempfile.TemporaryDirectory() as temporary:
        solutions, notebooks = Path(temporary) / "solutions", Path(temporary) / "notebooks"
        write_solutions(root, solutions, only)
        generate_release(root, solutions, notebooks, only)
        stale = []
        for folder, built in (("solutions", solutions), ("notebooks", notebooks)):
            for assignment in only or [None]:
                part = assignment or ""  # the whole folder when no assignment is named
                stale += [f"{folder}/{Path(part, name)}" for name in differences(built / part, root / folder / part)]
    table = root / GRADE_TABLE
    if not table.exists() or table.read_text(encoding="utf-8") != grade_table_source(root):
        stale.append(str(GRADE_TABLE))
    return stale


def named_assignments(root: Path, names: list[str]) -> list[str]:
    """Assignments by name or by stage number (`03` or `3` -> `03_blocks`); an unknown one is an error."""
    known = assignments(root)
    found = []
    for name in names:
        matches = [a for a in known if a == name or (name.isdigit() and a.split("_", 1)[0] == f"{int(name):02d}")]
        if len(matches) != 1:
            raise SystemExit(f"no assignment {name!r}; the assignments are {', '.join(known)}")
        found += matches
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "check"])
    parser.add_argument("--only", nargs="*", help="just these assignments, by name or stage number: 02_attention, 03")
    arguments = parser.parse_args(argv)
    root = repository_root()
    only = named_assignments(root, arguments.only) if arguments.only else None
    if arguments.command == "build":
        build(root, only)
        print(f"built {', '.join(only or assignments(root))} into solutions/ and notebooks/")
        return 0
    stale = check(root, only)
    for name in stale:
        print(f"stale: {name}")
    print("notebooks are current" if not stale else "run: python -m transformer_course.authoring build")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
