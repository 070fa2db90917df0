"""The architecture diagrams draw, save reproducibly, and the committed SVGs are what the script writes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from transformer_course.visualisation import diagrams  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "diagrams"


@pytest.mark.parametrize("name", diagrams.NAMES)
def test_each_diagram_draws_a_figure(name: str) -> None:
    figure = diagrams.draw(name)
    try:
        assert isinstance(figure, Figure)
        assert figure.get_size_inches()[0] <= 10, "diagrams must fit a notebook"
        assert figure.axes[0].texts, "a diagram without labels"
    finally:
        plt.close(figure)


def test_unknown_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown diagram"):
        diagrams.draw("decoder")


def test_save_all_is_byte_identical_across_runs(tmp_path: Path) -> None:
    first = diagrams.save_all(tmp_path / "first")
    second = diagrams.save_all(tmp_path / "second")
    assert [path.name for path in first] == [f"{name}.svg" for name in diagrams.NAMES]
    for one, other in zip(first, second, strict=True):
        assert one.read_bytes() == other.read_bytes(), f"{one.name} differs between two runs"
    assert not plt.get_fignums(), "save_all left figures open"


def _writer_version(svg: Path) -> str:
    """The matplotlib version recorded in an SVG's Creator metadata."""
    found = re.search(r"Matplotlib v([^,<]+)", svg.read_text(encoding="utf-8"))
    assert found, f"{svg} has no Matplotlib version in its metadata"
    return found.group(1)


def test_committed_svgs_are_regenerated_by_the_script(tmp_path: Path) -> None:
    committed = sorted(path.name for path in ASSETS.glob("*.svg"))
    assert committed == sorted(f"{name}.svg" for name in diagrams.NAMES)
    versions = {_writer_version(ASSETS / name) for name in committed}
    if versions != {matplotlib.__version__}:
        pytest.skip(f"assets written by matplotlib {versions}, installed {matplotlib.__version__}: "
                    "regenerate with `python -m transformer_course.visualisation.diagrams assets/diagrams`")
    for path in diagrams.save_all(tmp_path):
        assert path.read_bytes() == (ASSETS / path.name).read_bytes(), (
            f"assets/diagrams/{path.name} is stale: run "
            "`python -m transformer_course.visualisation.diagrams assets/diagrams`")


def test_main_writes_every_diagram(tmp_path: Path) -> None:
    diagrams.main([str(tmp_path)])
    assert sorted(path.stem for path in tmp_path.glob("*.svg")) == sorted(diagrams.NAMES)


def test_diagrams_import_nothing_above_the_visualisation_layer() -> None:
    tree = ast.parse(Path(diagrams.__file__).read_text(encoding="utf-8"))
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    for module in imported:
        if module.startswith("transformer_course"):
            assert module.split(".")[1] in {"runtime", "reference", "visualisation"}, module
