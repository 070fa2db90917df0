"""Students install, open and download from one pinned release: the git tag 'v' + the package version,
never main. The badges, the setup cell and the checkpoint URL all name it."""

import re
import tomllib
from importlib import metadata

from conftest import ASSIGNMENTS, ROOT, read, student_path
from transformer_course import __version__
from transformer_course.authoring import release_tag
from transformer_course.reference import checkpoint

TAG = f"v{__version__}"


def test_the_version_lives_in_one_place_and_the_tag_is_derived_from_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "transformer_course.__version__"}
    assert metadata.version("transformer-course") == __version__, "reinstall: make setup"
    assert release_tag(ROOT) == checkpoint.release_tag() == TAG


def test_badges_setup_cells_and_checkpoint_url_name_the_release_tag():
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    github = repository.removeprefix("https://github.com/")
    for assignment in ASSIGNMENTS:
        cells = read(student_path(assignment)).cells
        badge = re.search(r'href="([^"]+)"', cells[0].source).group(1)
        assert badge == (f"https://colab.research.google.com/github/{github}/blob/{TAG}/notebooks/"
                         f"{assignment}/{assignment}.ipynb")
        assert f'REPOSITORY, RELEASE = "{repository}", "{TAG}"' in cells[1].source
        assert "git+{REPOSITORY}@{RELEASE}" in cells[1].source
        text = "\n".join(cell.source for cell in cells)
        assert "/main/" not in text and "@main" not in text, assignment
    assert checkpoint.pretrained_url() == (f"https://raw.githubusercontent.com/{github}/{TAG}/assets/checkpoint/"
                                           f"{checkpoint.PRETRAINED_NAME}")
