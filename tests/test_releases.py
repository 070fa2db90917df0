"""Students install, open and download from one pinned release: the git tag 'v' + the package version,
never main. The badges, the setup cell and the checkpoint URL all name it."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tomllib
from importlib import metadata

import pytest

from conftest import ASSIGNMENTS, ROOT, read, student_path
from transformer_course import __version__
from transformer_course.authoring import badge, release_tag, setup_source
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


# --- cutting a release, from the course's repository or a fork --------------------------------------------

def _release_script():
    spec = importlib.util.spec_from_file_location("release_script", ROOT / "scripts" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = _release_script()


def git(folder, *arguments):
    return subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, text=True, check=True,
                          env={"GIT_AUTHOR_NAME": "adopter", "GIT_AUTHOR_EMAIL": "a@example.org",
                               "GIT_COMMITTER_NAME": "adopter", "GIT_COMMITTER_EMAIL": "a@example.org",
                               "HOME": str(folder), "PATH": "/usr/bin:/bin"}).stdout


def rebuild_names(root):
    """What `make notebooks` changes when the repository or the version changes: every notebook's badge and
    setup cell (authoring.badge and authoring.setup_source, which the build writes)."""
    for path in sorted((root / "notebooks").glob("*/*.ipynb")):
        notebook = json.loads(path.read_text(encoding="utf-8"))
        assignment = path.parent.name
        first = "".join(notebook["cells"][0]["source"])
        notebook["cells"][0]["source"] = re.sub(r'<a href="https://colab[^>]*>.*?</a>', badge(root, assignment), first)
        notebook["cells"][1]["source"] = setup_source(root)
        path.write_text(json.dumps(notebook, indent=1), encoding="utf-8")


@pytest.fixture
def fork(tmp_path):
    """A clone of the course as an adopter has it: another origin, and no tags (a fresh clone or a repository
    made from the course may hold none). Only what names the release is copied."""
    root = tmp_path / "fork"
    for part in ("pyproject.toml", "src/transformer_course/__init__.py"):
        (root / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / part, root / part)
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the course as cloned")
    git(root, "remote", "add", "origin", "git@github.com:adopter/transformers-course.git")
    return root


def test_a_fork_is_told_each_step_and_releases_from_its_own_repository(fork):
    found = release.problems(fork, installed=False)
    assert any("this clone's origin is https://github.com/adopter/transformers-course" in p for p in found)
    assert any(f"no tag {TAG}" in p and "make tag" in p for p in found)  # every notebook names it: say so
    with pytest.raises(release.ReleaseError, match="not tagged"):  # never a tag the notebooks do not name
        release.make_tag(fork)

    assert release.main(["repository", "--root", str(fork)]) == 0  # the one place: from this clone's origin
    assert release.repository_of(fork) == "https://github.com/adopter/transformers-course"
    assert 'Repository = "https://github.com/adopter/transformers-course"' in (fork / "pyproject.toml").read_text()
    found = release.problems(fork, installed=False)
    assert any("student notebook(s) name another repository" in p and "make notebooks" in p for p in found)
    rebuild_names(fork)
    assert release.problems(fork, installed=False, untagged=True) == []
    with pytest.raises(release.ReleaseError, match="not committed"):
        release.make_tag(fork)
    git(fork, "commit", "-q", "-am", "our own repository")
    assert release.make_tag(fork) == TAG  # the adopter's tag, in the adopter's repository
    assert release.problems(fork, installed=False) == []
    setup = json.loads((fork / "notebooks/01_positional_encoding/01_positional_encoding.ipynb").read_text())
    assert ('REPOSITORY, RELEASE = "https://github.com/adopter/transformers-course", "v' in
            "".join(setup["cells"][1]["source"]))

    # the next release: a new version, never a moved tag
    (fork / "notebooks" / "note.txt").write_text("changed after the tag")
    git(fork, "add", "-A")
    git(fork, "commit", "-q", "-m", "a change")
    assert any(f"the tag {TAG} is not this checkout" in p for p in release.problems(fork, installed=False))
    assert release.main(["version", "0.9.0", "--root", str(fork)]) == 0
    assert '__version__ = "0.9.0"' in (fork / "src/transformer_course/__init__.py").read_text()
    assert any("name another repository or tag" in p for p in release.problems(fork, installed=False))
    rebuild_names(fork)
    git(fork, "commit", "-q", "-am", "Release v0.9.0")
    assert release.make_tag(fork) == "v0.9.0"
    with pytest.raises(release.ReleaseError, match="exists already"):
        release.make_tag(fork)
    assert release.main(["version", "nine", "--root", str(fork)]) == 2


def test_a_version_bump_reinstalls_the_package_no_loop(tmp_path):
    """`make setup` reinstalls when __version__ changes (its metadata carries the version, and the check above
    compares it), not only when pyproject.toml does: the loop of 'make setup: Nothing to be done' then
    'reinstall: make setup' is gone. Make is run on a copy with the install commands replaced by echo."""
    for part in ("Makefile", "pyproject.toml", "src/transformer_course/__init__.py"):
        (tmp_path / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / part, tmp_path / part)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / ".installed").touch()
    os.utime(tmp_path / ".venv" / ".installed", (2**31, 2**31))  # installed after both files were written

    def setup():
        return subprocess.run(["make", "-n", "setup", "PYTHON=echo"], cwd=tmp_path, capture_output=True,
                              text=True, check=True).stdout

    assert "pip install" not in setup()
    release.set_version(tmp_path, "0.9.0")
    os.utime(tmp_path / "src/transformer_course/__init__.py", (2**31 + 10, 2**31 + 10))
    assert "pip install -q -e" in setup()
    makefile = (ROOT / "Makefile").read_text()
    assert "$(VENV)/.installed: pyproject.toml src/transformer_course/__init__.py" in makefile
    assert "release: setup" in makefile and "scripts/release.py version $(VERSION)" in makefile


# --- a class folder pinned to its releases (grades a small class) ----------------------------------------------

def older_release(folder, version):
    """A checkout of another release of the course, as `git worktree add CLASS/releases/vX vX` makes one: this
    course with __version__ = VERSION and one check that judges differently (stage 1's buffer_shape wants one
    column more), so which release's checks graded a notebook shows in its score."""
    for part in ("src", "solutions", "lessons"):
        shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "autograde").mkdir(parents=True)
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", folder / "autograde")
    shutil.copy(ROOT / "pyproject.toml", folder)
    release.set_version(folder, version)
    checks = folder / "src" / "transformer_course" / "checks" / "positional_encoding.py"
    text = checks.read_text(encoding="utf-8")
    wanted = '        (1, max_seq_length, d_model),\n        cause="build a (max_seq_length, d_model) table'
    assert text.count(wanted) == 1
    checks.write_text(text.replace(wanted, wanted.replace("d_model),\n", "d_model + 1),\n", 1)), encoding="utf-8")


def naming(notebook_path, tag, destination):
    """A student's copy of NOTEBOOK_PATH whose setup cell names release TAG (as a notebook opened from that
    release's badge does)."""
    notebook = json.loads(notebook_path.read_text(encoding="utf-8"))
    text = json.dumps(notebook).replace(f'\\", \\"{TAG}\\"', f'\\", \\"{tag}\\"')
    assert text != json.dumps(notebook)
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(text, encoding="utf-8")


@pytest.mark.slow
def test_each_notebook_is_graded_with_its_own_releases_checks_or_says_why_not(tmp_path):
    import csv
    import sys
    from pathlib import Path

    from conftest import solution_path
    from transformer_course.grading.classroom.batch import BatchGrader
    from transformer_course.grading.classroom.releases import Releases
    from transformer_course.grading.outputs.report import needs
    from transformer_course.grading.sandbox.isolation import bubblewrap_problem

    stage = "01_positional_encoding"
    class_dir, downloads = tmp_path / "class", tmp_path / "downloads"
    older_release(class_dir / "releases" / "v0.0.9", "0.0.9")
    naming(solution_path(stage), "v0.0.9", downloads / "ann" / f"{stage}.ipynb")  # an older release's notebook
    (downloads / "bo").mkdir(parents=True)
    shutil.copy(solution_path(stage), downloads / "bo" / f"{stage}.ipynb")
    naming(solution_path(stage), "v0.0.5", downloads / "cy" / f"{stage}.ipynb")  # a release not available here
    store = Path(sys.prefix) / "course-releases-test"
    grader = BatchGrader(ROOT, class_dir, downloads, jobs=2, assignment_ids=[stage],
                         sandbox=bubblewrap_problem() is None)
    grader.releases = Releases(ROOT, class_dir, store=store)
    try:
        grader.run()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    rows = {row["student"]: row for row in csv.DictReader(open(class_dir / "scores.csv", encoding="utf-8-sig"))}
    ann, bo, cy = rows["ann"], rows["bo"], rows["cy"]
    # the same correct code: the running release's checks give every check its points, v0.0.9's buffer_shape none
    assert float(bo["pe_buffer_shape"]) == 1 and float(ann["pe_buffer_shape"]) == 0
    assert [ann[cell] for cell in ("pe_table_values", "pe_forward", "pe_dropout")] == [
        bo[cell] for cell in ("pe_table_values", "pe_forward", "pe_dropout")]
    assert f"from release v0.0.9 (this class is graded with {TAG}): graded with v0.0.9's checks" in ann["reasons"]
    assert "another release" not in needs(ann) and "release" not in bo["reasons"]
    assert (class_dir / "feedback" / "ann" / stage / f"{stage}.html").is_file()  # its release's feedback, merged
    # not available: graded with this release, and said in the row, the feedback page and the report
    assert float(cy["pe_buffer_shape"]) == 1 and cy["total"] == bo["total"]
    assert "from release v0.0.5, which is not available here (no tag v0.0.5" in cy["reasons"]
    assert "review it" in cy["reasons"] and "another release" in needs(cy)
    feedback = (class_dir / "feedback" / "cy" / stage / f"{stage}.html").read_text(encoding="utf-8")
    assert "This notebook is from release v0.0.5 of the course" in feedback
    report = (class_dir / "report.html").read_text(encoding="utf-8")
    assert "another release" in report.split("id=people")[1].split("</table>")[0]
    assert (class_dir / "release" / ".release").read_text().strip() == TAG  # the class's own release, recorded
    # week 2 (a download of one new student only): the week-1 rows, graded with v0.0.9 or said to be from
    # v0.0.5, keep every field, and nobody of week 1 is graded again
    week2 = tmp_path / "week2"
    (week2 / "dee").mkdir(parents=True)
    own = json.loads(solution_path(stage).read_text(encoding="utf-8"))
    own["metadata"]["student"] = "dee"  # other bytes than bo's file: not the same notebook handed in twice
    (week2 / "dee" / f"{stage}.ipynb").write_text(json.dumps(own), encoding="utf-8")
    grader = BatchGrader(ROOT, class_dir, week2, jobs=2, assignment_ids=[stage], sandbox=bubblewrap_problem() is None)
    grader.releases = Releases(ROOT, class_dir, store=store)
    try:
        graded = grader.run()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    assert set(graded) == {"dee"}
    after = {row["student"]: row for row in csv.DictReader(open(class_dir / "scores.csv", encoding="utf-8-sig"))}
    assert after["ann"] == ann and after["cy"] == cy and after["bo"] == bo
    assert float(after["dee"]["pe_buffer_shape"]) == 1 and after["dee"]["total"] == bo["total"]
