"""Build the course notebooks from their one source.

    lessons/NN_name.py           jupytext percent format: prose, given code, tests (edit these)
      + src/transformer_course/reference/*.py   the solution code, spliced in by `#| include`
      -> solutions/NN_name/NN_name.ipynb         nbgrader source notebooks (built, committed)
      -> notebooks/NN_name/NN_name.ipynb         student release, by `nbgrader generate_assignment`

Markers a lesson may use:
    `#| include module.path:Name`   one per line in a code cell; replaced by that definition's source
    `#| setup`                      the Colab/local setup code (repository URL from pyproject.toml)
    `<!-- colab-badge -->`          in markdown: the Open-in-Colab badge of the student notebook
Cell headers carry nbgrader roles in short form:
    `# %% solution="id"`            student writes code here (BEGIN/END SOLUTION inside)
    `# %% tests="id" points=2`      a locked grade cell
    `# %% readonly="id"`            a locked cell students may not edit (setup)
    `# %% [markdown] answer="id" points=2`
                                    a written answer graded by hand (nbgrader's "manually graded
                                    answer"). Its text is the model answer and the rubric, written
                                    as `**Model answer.** ...` then `**Rubric.**` and one
                                    `- N point(s): ...` line per criterion (they add up to the
                                    points); students get an empty answer cell instead. Put the
                                    question itself in the markdown cell just above it. A new stage
                                    adds questions the same way: a question cell, then an answer cell.

Usage: python -m transformer_course.authoring build | check   (run from the repository root)
"""

from __future__ import annotations

import argparse
import ast
import filecmp
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import jupytext
import nbformat

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
    return SETUP_TEMPLATE.replace("{repository}", repository_url(root))


def badge(root: Path, assignment: str) -> str:
    github = repository_url(root).removeprefix("https://github.com/")
    link = f"https://colab.research.google.com/github/{github}/blob/main/notebooks/{assignment}/{assignment}.ipynb"
    image = "https://colab.research.google.com/assets/colab-badge.svg"
    return f'<a href="{link}" target="_parent"><img src="{image}" alt="Open In Colab"/></a>'


SETUP_TEMPLATE = '''\
# Setup: run this cell first. In Colab it installs the course package (about a minute);
# where the package is already installed (your own machine, nbgrader) it installs nothing.
import importlib.util
import subprocess
import sys

REPOSITORY = "{repository}"
if importlib.util.find_spec("transformer_course") is None:
    print("Installing the course package from", REPOSITORY)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"transformer-course @ git+{REPOSITORY}"],
                   check=True)

from transformer_course.runtime import pick_device, skip_until_implemented  # noqa: E402

device = pick_device()'''


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


def _expand(source: str, root: Path, assignment: str) -> str:
    lines = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#| include "):
            lines.append(definition_source(stripped.removeprefix("#| include ").strip()))
        elif stripped == "#| setup":
            lines.append(setup_source(root))
        elif stripped == "<!-- colab-badge -->":
            lines.append(badge(root, assignment))
        else:
            lines.append(line)
    return "\n".join(lines)


def build_solution(root: Path, assignment: str) -> nbformat.NotebookNode:
    """Read lessons/<assignment>.py and return the nbgrader source notebook."""
    lesson = jupytext.read(root / "lessons" / f"{assignment}.py", fmt="py:percent")
    notebook = nbformat.v4.new_notebook()
    notebook.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    seen_ids: set[str] = set()
    for index, cell in enumerate(lesson.cells):
        metadata = dict(cell.metadata)
        nbgrader = _nbgrader_metadata(metadata)
        source = _expand(cell.source, root, assignment)
        if nbgrader and "answer" in cell.metadata and cell.cell_type != "markdown":
            raise ValueError(f"{assignment}: answer cell {nbgrader['grade_id']} must be a markdown cell")
        if cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(source)
        else:
            new = nbformat.v4.new_code_cell(source)
        new.id = nbgrader["grade_id"] if nbgrader else f"{assignment[:2]}-cell-{index:03d}"
        if new.id in seen_ids:
            raise ValueError(f"{assignment}: duplicate cell id {new.id}")
        seen_ids.add(new.id)
        if nbgrader:
            new.metadata["nbgrader"] = nbgrader
        notebook.cells.append(new)
    nbformat.validate(notebook)
    return notebook


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


def check(root: Path) -> list[str]:
    """Rebuild into a temporary folder; return the committed files that are not what the build gives."""
    with tempfile.TemporaryDirectory() as temporary:
        solutions, notebooks = Path(temporary) / "solutions", Path(temporary) / "notebooks"
        write_solutions(root, solutions)
        stale = [f"solutions/{name}" for name in differences(solutions, root / "solutions")]
        generate_release(root, solutions, notebooks)
        stale += [f"notebooks/{name}" for name in differences(notebooks, root / "notebooks")]
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "check"])
    parser.add_argument("--only", nargs="*", help="build just these assignments, e.g. 02_attention")
    arguments = parser.parse_args(argv)
    root = repository_root()
    if arguments.command == "build":
        build(root, arguments.only)
        print(f"built {', '.join(arguments.only or assignments(root))} into solutions/ and notebooks/")
        return 0
    stale = check(root)
    for name in stale:
        print(f"stale: {name}")
    print("notebooks are current" if not stale else "run: python -m transformer_course.authoring build")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
