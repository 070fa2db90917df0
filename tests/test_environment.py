"""environment.yml and pyproject.toml declare the same dependencies; torch stays a lower bound."""

import tomllib

import yaml

from conftest import ROOT


def pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements |= set(extra)
    return requirements


def environment_requirements() -> set[str]:
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(item["pip"] for item in environment["dependencies"] if isinstance(item, dict))
    return {requirement for requirement in pip if not requirement.startswith("-e")}


def test_environment_yml_matches_pyproject():
    assert environment_requirements() == pyproject_requirements()


def test_torch_is_a_lower_bound_so_colab_is_never_downgraded():
    torch = [r for r in pyproject_requirements() if r.startswith("torch")]
    assert torch == ["torch>=2.3"]


def test_torchtext_is_neither_a_dependency_nor_imported():
    """torchtext's last release fails to load with current torch; the course has its own Vocab."""
    assert not any("torchtext" in requirement for requirement in pyproject_requirements() | environment_requirements())
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "lessons").glob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        text = path.read_text()
        assert "import torchtext" not in text and "from torchtext" not in text, path
