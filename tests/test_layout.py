"""The package's layout: layers that import only downward, grading folders that import one way, no
import circle, and the course's own quality tools outside the package students install.

Imports are read from the source (every `import` and `from ... import`, also those inside functions),
so nothing here depends on what happens to be imported at run time.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "src" / "transformer_course"

# Layers of the package, lowest first: a module may import its own layer and the ones before it.
LAYERS = ["runtime", "data", "reference", "visualisation", "checks", "grading"]
# Folders of the grading package and what each may import of the others ("cells" is open to all).
GRADING_FOLDERS = {
    "intake": set(),
    "sandbox": set(),
    "gradebook": set(),
    "outputs": {"gradebook", "intake"},
    "classroom": {"intake", "sandbox", "gradebook", "outputs"},
}


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT / "src").with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module named by an import statement of this file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from pkg import module`
    return found


def _package_modules() -> dict[str, set[str]]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        modules[_module_name(path)] = {name for name in _imports(path) if name.startswith("transformer_course")}
    known = set(modules)
    return {name: {imported for imported in imports if imported in known and imported != name}
            for name, imports in modules.items()}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_layers_import_only_downward() -> None:
    upward = []
    for module, imports in _package_modules().items():
        layer = _layer(module)
        if layer is None:
            continue
        for imported in imports:
            other = _layer(imported)
            if other is not None and LAYERS.index(other) > LAYERS.index(layer):
                upward.append(f"{module} imports {imported}")
    assert not upward, upward


def _grading_folder(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["transformer_course", "grading"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in GRADING_FOLDERS else f"<{parts[2]}>"


def test_grading_folders_import_one_way() -> None:
    wrong = []
    for module, imports in _package_modules().items():
        folder = _grading_folder(module)
        if folder is None:
            continue
        for imported in imports:
            other = _grading_folder(imported)
            if other is None or other == folder or other == "<cells>":
                continue
            allowed = GRADING_FOLDERS.get(folder)
            if folder.startswith("<"):  # the command-line shims at grading/ may import their own module only
                if not module.endswith(f".{imported.rpartition('.')[2]}"):
                    wrong.append(f"{module} imports {imported}")
                continue
            if allowed is None or other not in allowed:
                wrong.append(f"{module} ({folder}/) imports {imported} ({other}/)")
    assert not wrong, wrong


def test_every_grading_module_lives_in_a_role_folder() -> None:
    loose = sorted(path.name for path in (PACKAGE / "grading").glob("*.py"))
    assert loose == ["__init__.py", "answers.py", "batch.py", "cells.py", "lms.py", "report.py"], loose
    for shim in ("answers", "batch", "lms", "report"):  # command-line entry points, two lines of code
        code = [line for line in (PACKAGE / "grading" / f"{shim}.py").read_text().splitlines()
                if line.strip() and not line.startswith(("#", '"""', "import", "from"))]
        assert len(code) <= 2, (shim, code)
    for folder in GRADING_FOLDERS:
        docstring = ast.get_docstring(ast.parse((PACKAGE / "grading" / folder / "__init__.py").read_text()))
        assert docstring and "import" in docstring.lower(), f"grading/{folder}: its purpose and its imports"


def test_no_import_circle() -> None:
    graph = _package_modules()
    state: dict[str, int] = {}
    circles = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == 1:
                circles.append(" -> ".join([*stack[stack.index(imported):], imported]))
            elif imported not in state:
                visit(imported, [*stack, imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    # A package's __init__ importing its own modules, which import the package, is not a circle of code.
    circles = [circle for circle in circles
               if not all(part == circle.split(" -> ")[0] or part.startswith(circle.split(" -> ")[0] + ".")
                          for part in circle.split(" -> "))]
    assert not circles, circles


def test_quality_tools_are_not_shipped() -> None:
    """The mistake catalog, mutations and example classes live in quality/, which the wheel leaves out,
    and nothing in the package imports them."""
    assert not (PACKAGE / "grading" / "mistakes").exists()
    for name in ("mutations", "behaviour", "measure", "examples", "demo", "inprocess", "execution"):
        assert not (PACKAGE / "grading" / f"{name}.py").exists(), name
        assert (ROOT / "quality" / f"{name}.py").exists(), name
    users = [str(path.relative_to(ROOT)) for path in PACKAGE.rglob("*.py")
             if any(name == "quality" or name.startswith("quality.") for name in _imports(path))]
    assert not users, users
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert settings["include"] == ["transformer_course", "transformer_course.*"]
    assert not (ROOT / "src" / "quality").exists()
