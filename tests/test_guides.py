"""The instructor's and the authors' guides on the course website (website/instructor/, website/authors/),
and the README that points to them (issue 31).

The guide pages are built with the site's own Sphinx configuration, without the stage pages (which need every
notebook run: tests/test_site.py builds those): a build with warnings as errors fails on a guide page missing
from the site's table of contents, a link to a page or a section that does not exist, and markup Sphinx cannot
read. Then the README: at most 300 lines, and every link of it to a guide page names a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT

WEBSITE = ROOT / "website"
GUIDES = ("instructor", "authors")
README = ROOT / "README.md"


def guide_pages(guide: str) -> list[Path]:
    return sorted((WEBSITE / guide).glob("*.md"))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The landing page and both guides, built as `make site` builds them, with one stand-in for the stages
    (`python -m website.guides`)."""
    from website.guides import build_guides

    work = tmp_path_factory.mktemp("guides")
    result = build_guides(work / "html", work)
    assert result.returncode == 0, result.stderr[-5000:]
    return work / "html"


def test_the_guides_build_without_a_warning(built):
    """Every guide page is in a table of contents, and every link between pages and to a section resolves
    (Sphinx, warnings as errors); each page is written."""
    for guide in GUIDES:
        for page in guide_pages(guide):
            assert (built / guide / f"{page.stem}.html").exists(), page


def test_each_guide_lists_every_page_of_its_folder():
    """A page added to website/authors/ (the authors' guide to adding an exercise, to come) or to
    website/instructor/ must be listed in its guide's table of contents, in index.md."""
    for guide in GUIDES:
        index = (WEBSITE / guide / "index.md").read_text(encoding="utf-8")
        [toctree] = re.findall(r"```\{toctree\}\n(.*?)```", index, re.DOTALL)
        listed = {line.strip() for line in toctree.splitlines() if line.strip() and not line.startswith(":")}
        assert listed == {page.stem for page in guide_pages(guide)} - {"index"}, guide
    landing = (WEBSITE / "index.md").read_text(encoding="utf-8")
    assert "instructor/index" in landing and "authors/index" in landing


def test_the_instructors_guide_covers_the_week():
    """The pages issue 31 asked for: releasing, grading, written answers, the LMS, the report, the cluster,
    the threat model, and grading from macOS or Windows."""
    names = {page.stem for page in guide_pages("instructor")}
    assert {"releasing", "grading", "written-answers", "lms", "report", "cluster", "threat-model",
            "macos-windows"} <= names


def readme_links() -> list[str]:
    text = README.read_text(encoding="utf-8")
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move the detail to a guide page"


def test_every_readme_link_to_a_guide_page_resolves():
    """Links to website/... name files that exist (on GitHub they open the page's source), and the README
    links to both guides and to every page of the instructor's guide."""
    local = [link.split("#")[0] for link in readme_links() if not re.match(r"[a-z]+:", link)]
    assert local
    for link in local:
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
    guides = {link for link in local if link.startswith("website/")}
    assert {"website/instructor/index.md", "website/authors/index.md"} <= guides
    for page in guide_pages("instructor"):
        assert page.relative_to(ROOT).as_posix() in guides, page.name


def test_a_guide_page_deleted_here_leaves_the_site(tmp_path):
    """`make site` copies the guides into its source folder on every build: a page deleted (or renamed) in
    website/instructor/ or website/authors/ must not stay there, built from its old copy."""
    from website import build

    source = tmp_path / "source"
    build.copy_sources(source)
    (source / "instructor" / "an-old-page.md").write_text("# Gone\n", encoding="utf-8")
    build.copy_sources(source)
    assert not (source / "instructor" / "an-old-page.md").exists()
    assert (source / "instructor" / "grading.md").read_bytes() == (WEBSITE / "instructor" / "grading.md").read_bytes()


def test_a_link_to_a_missing_section_or_an_unlisted_page_fails_the_guides(tmp_path, monkeypatch):
    """The build above has teeth: with a link to a section that does not exist, and a page no table of
    contents lists, `python -m website.guides` fails and names both."""
    import shutil

    from website import build
    from website.guides import build_guides

    copy = tmp_path / "website"
    shutil.copytree(WEBSITE, copy, ignore=shutil.ignore_patterns("_build"))
    with open(copy / "authors" / "data.md", "a", encoding="utf-8") as page:
        page.write("\nSee [the grading speed](../instructor/grading.md#no-such-section).\n")
    (copy / "authors" / "an-unlisted-page.md").write_text("# A page nobody listed\n", encoding="utf-8")
    monkeypatch.setattr(build, "WEBSITE", copy)
    result = build_guides(tmp_path / "html", tmp_path / "work")
    assert result.returncode != 0
    assert "no-such-section" in result.stderr and "an-unlisted-page" in result.stderr, result.stderr
