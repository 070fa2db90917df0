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


def test_torchtext_is_not_used():
    for path in [ROOT / "pyproject.toml", ROOT / "environment.yml", *(ROOT / "src").rglob("*.py")]:
        assert "torchtext" not in path.read_text(), path
