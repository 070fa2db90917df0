"""The course website (README, "The course as a website"), built in a smaller setting and opened in a real
headless Chromium.

The smaller setting: every page is built, stages 1 and 6 are run the way the autograder runs them
(`python -m website.build --short --execute 01 06`: tiny models, a few sentences), the other pages show their
code without outputs. Stage 6 has the interactive attention maps, matplotlib figures and formulas; stage 1
the sinusoid figures. The build runs once per module, then every page is opened in Chromium, served from a
local HTTP server, with every request outside it refused and recorded."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml

from conftest import ASSIGNMENTS, IN_CI, ROOT, require_multi30k
from transformer_course import __version__
from website import pages

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("site")]
CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))),
                None)
WORKFLOW = ROOT / ".github" / "workflows" / "site.yml"
TAG = f"v{__version__}"
EXECUTED = ("01_positional_encoding", "06_decoding")


def needs(tool: str | None, why: str) -> None:
    """Skip with one line when a tool is missing, except in CI (.ci/run and make setup install them)."""
    if tool is None:
        if IN_CI:
            pytest.fail(f"missing in CI: {why}")
        pytest.skip(why)


def build_site(work: Path, out: Path, *options: str) -> str:
    command = [sys.executable, "-m", "website.build", "--short", "--execute", "01", "06", "--work", str(work),
               "--out", str(out), *options]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def ran(stdout: str) -> set[str]:
    """The pages a build ran (the others came from the execution cache or were not to be run)."""
    return set(re.findall(r"^  (\S+): ran in", stdout, flags=re.MULTILINE))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    require_multi30k()  # stage 6 translates test sentences
    work = tmp_path_factory.mktemp("site-work")
    out = work / "html"
    first = build_site(work, out)
    assert ran(first) == set(EXECUTED), first
    return work, out


@pytest.fixture(scope="module")
def browser(site):
    needs(CHROMIUM, "no Chromium here (Debian: apt install chromium; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        needs(None, "Playwright is not installed: make setup installs it (the site extra)")
    _, out = site

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *arguments):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield chromium, base
        chromium.close()
    server.shutdown()


class Visit:
    """A page opened in a fresh browser context: console errors, page errors and any request leaving the site."""

    def __init__(self, browser, path: str):
        chromium, self.base = browser
        self.context = chromium.new_context(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda message: message.type == "error" and self.errors.append(message.text))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(self.base + path, wait_until="load")
        self.page.wait_for_load_state("networkidle")

    def _route(self, route):
        if route.request.url.startswith((self.base, "data:", "blob:")):
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()

    def close(self):
        self.context.close()


def html_pages(out: Path) -> list[str]:
    return sorted(path.relative_to(out).as_posix() for path in out.rglob("*.html") if "_static" not in path.parts)


def test_every_page_loads_offline_without_console_errors(site, browser):
    _, out = site
    paths = html_pages(out)
    assert {f"stages/{name}.html" for name in ASSIGNMENTS} | {"index.html", "search.html"} <= set(paths)
    for path in paths:
        visit = Visit(browser, path)
        try:
            assert visit.errors == [], (path, visit.errors)
            assert visit.outside == [], (path, visit.outside)
        finally:
            visit.close()
    for path in out.rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["'](https?:)?//""", text), path


PIXELS = """(element) => {  // how many distinct colours the element's image has (1: blank)
    const canvas = document.createElement("canvas");
    canvas.width = element.naturalWidth; canvas.height = element.naturalHeight;
    const context = canvas.getContext("2d");
    context.drawImage(element, 0, 0);
    const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
    const colours = new Set();
    for (let i = 0; i < data.length; i += 4 * 7) colours.add(data[i] << 16 | data[i + 1] << 8 | data[i + 2]);
    return colours.size;
}"""


def test_every_figure_area_is_non_blank(site, browser):
    for name in EXECUTED:
        visit = Visit(browser, f"stages/{name}.html")
        try:
            images = visit.page.locator(".cell_output img")
            assert images.count() >= 3, name
            for index in range(images.count()):
                image = images.nth(index)
                image.scroll_into_view_if_needed()
                assert image.evaluate("element => element.complete && element.naturalWidth > 0"), (name, index)
                assert image.evaluate(PIXELS) > 20, (name, index, "a blank picture")
            maps = visit.page.locator(".course-interactive")
            for index in range(maps.count()):
                drawn = maps.nth(index).locator(".course-plot .main-svg").first
                box = drawn.bounding_box()
                assert box and box["width"] > 300 and box["height"] > 300, (name, index)
                assert maps.nth(index).locator("image, .heatmaplayer").count() > 0, (name, index, "no heatmap")
            formulas = visit.page.locator("mjx-container svg")
            if name == "06_decoding":
                assert maps.count() == 3  # cross-attention, encoder and decoder self-attention
                assert formulas.count() > 5, "MathJax drew no formula"
        finally:
            visit.close()


def test_the_slider_changes_the_heatmap(site, browser):
    visit = Visit(browser, "stages/06_decoding.html")
    try:
        figure = visit.page.locator(".course-interactive").first
        figure.scroll_into_view_if_needed()
        heatmap = figure.locator(".heatmaplayer image").first
        label = figure.locator("text.slider-label").first  # "showing: layer 2 · mean of heads"
        picture = "element => element.getAttribute('xlink:href') || element.getAttribute('href')"
        before_picture, before_label = heatmap.evaluate(picture), label.text_content()
        rail = figure.locator(".slider-rail-touch-rect").first.bounding_box()
        visit.page.mouse.click(rail["x"] + 4, rail["y"] + rail["height"] / 2)  # the slider's first step
        visit.page.wait_for_timeout(300)
        after_picture, after_label = heatmap.evaluate(picture), label.text_content()
        assert "layer 2" in before_label and "layer 0" in after_label, (before_label, after_label)
        assert before_picture.startswith("data:image/png") and after_picture != before_picture, "the map did not change"
        assert visit.errors == []
    finally:
        visit.close()


def test_search_finds_positional_encoding(site, browser):
    visit = Visit(browser, "index.html")
    try:
        visit.page.locator("button.search-button-field:visible").first.click()  # opens the search box
        box = visit.page.locator("form.bd-search input[name=q]:visible")
        box.fill("positional encoding")
        box.press("Enter")
        visit.page.wait_for_url("**/search.html?q=*")
        results = visit.page.locator("#search-results li a")
        results.first.wait_for(timeout=20000)
        found = [results.nth(i).get_attribute("href") for i in range(results.count())]
        assert any("stages/01_positional_encoding.html" in link for link in found), found
        assert visit.errors == [] and visit.outside == []
    finally:
        visit.close()


def test_colab_buttons_open_the_student_notebook_of_the_release_tag(site, browser):
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    github = repository.removeprefix("https://github.com/")
    _, out = site
    for name in ASSIGNMENTS:
        visit = Visit(browser, f"stages/{name}.html")
        try:
            buttons = visit.page.locator("a.colab-button")
            assert buttons.count() == 1 and buttons.first.is_visible(), name
            assert buttons.first.text_content() == "Open in Colab"
            assert buttons.first.get_attribute("href") == (
                f"https://colab.research.google.com/github/{github}/blob/{TAG}/notebooks/{name}/{name}.ipynb")
        finally:
            visit.close()
    landing = (out / "index.html").read_text(encoding="utf-8")
    for name in ASSIGNMENTS:
        assert f'href="stages/{name}.html"' in landing, name
    assert TAG in landing


def test_model_answers_are_folded_away(site, browser):
    for name in ASSIGNMENTS:
        answers = [cell for cell in nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", 4).cells
                   if pages.is_answer_cell(cell)]
        visit = Visit(browser, f"stages/{name}.html")
        try:
            folded = visit.page.locator("details.sd-dropdown")
            assert folded.count() == len(answers) >= 2, name
            for index in range(folded.count()):
                dropdown = folded.nth(index)
                assert dropdown.get_attribute("open") is None
                body = dropdown.locator(".sd-summary-content")
                assert "Model answer" in body.text_content() and not body.is_visible()
            folded.first.locator("summary").click()
            assert folded.first.locator(".sd-summary-content").is_visible()
        finally:
            visit.close()


def test_stage_5_says_it_trains_one_epoch_and_prints_the_recorded_run():
    solution = nbformat.read(ROOT / "solutions" / "05_training" / "05_training.ipynb", 4)
    page = pages.page_from_solution(solution, "05_training")
    sources = [cell.source for cell in page.cells]
    assert sum("EPOCHS = 1  # on the website" in source for source in sources) == 1
    code = [cell.source for cell in page.cells if cell.cell_type == "code"]
    assert not any("EPOCHS = 1 if short_run() else 10" in source for source in code)
    note = next(index for index, source in enumerate(sources) if "one epoch, not ten" in source)
    training = next(index for index, source in enumerate(sources) if "train_epoch(model, train_loader" in source)
    recorded = next(index for index, source in enumerate(sources) if "read_metadata(pretrained_path())" in source)
    assert note < training < recorded
    lesson = (ROOT / "lessons" / "05_training.py").read_text(encoding="utf-8")
    assert "17 to 35 minutes for the 10 epochs" in lesson  # what the note repeats


def test_a_changed_lesson_is_refused_by_the_site_edits_with_a_message():
    solution = nbformat.read(ROOT / "solutions" / "05_training" / "05_training.ipynb", 4)
    for cell in solution.cells:
        cell.source = cell.source.replace("EPOCHS = 1 if short_run() else 10", "EPOCHS = 12")
    with pytest.raises(ValueError, match="update website/pages.py"):
        pages.page_from_solution(solution, "05_training")


def test_a_rebuild_runs_only_the_page_whose_code_changed(site, tmp_path):
    work, out = site
    unchanged = build_site(work, out)
    assert ran(unchanged) == set(), unchanged
    solutions = tmp_path / "solutions"
    shutil.copytree(ROOT / "solutions", solutions)
    path = solutions / "01_positional_encoding" / "01_positional_encoding.ipynb"
    notebook = nbformat.read(path, 4)
    prose = next(cell for cell in notebook.cells if cell.cell_type == "markdown" and "## " in cell.source)
    prose.source += "\n\nA sentence added to the prose."
    nbformat.write(notebook, path)
    prose_only = build_site(work, out, "--solutions", str(solutions))
    assert ran(prose_only) == set(), prose_only
    assert "A sentence added to the prose." in (out / "stages" / "01_positional_encoding.html").read_text()
    code = next(cell for cell in notebook.cells if cell.cell_type == "code" and "import" in cell.source)
    code.source += "\nprint('a line added to the code')"
    nbformat.write(notebook, path)
    code_changed = build_site(work, out, "--solutions", str(solutions))
    assert ran(code_changed) == {"01_positional_encoding"}, code_changed
    assert "a line added to the code" in (out / "stages" / "01_positional_encoding.html").read_text()


def test_the_publishing_workflow_passes_actionlint_and_builds_the_release_tag(tmp_path):
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert triggers["push"]["tags"] == ["v*"]
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    steps = workflow["jobs"]["build"]["steps"]
    assert any(step.get("run") == "make site" for step in steps)
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "website/_build/html"
    assert workflow["jobs"]["deploy"]["steps"][0]["uses"].startswith("actions/deploy-pages@")
    tag_check = next(step for step in steps if "GITHUB_REF_NAME" in step.get("run", ""))
    assert "src/transformer_course/__init__.py" in tag_check["run"]
    actionlint = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    needs(actionlint, "actionlint is not installed: make setup installs it (the site extra)")
    checked = subprocess.run([actionlint, "-no-color", str(WORKFLOW)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / ".github" / "workflows" / "site.yml"  # the negative control: actionlint does catch errors
    broken.parent.mkdir(parents=True)
    broken.write_text(WORKFLOW.read_text().replace("needs: build", "needs: biuld"))
    caught = subprocess.run([actionlint, "-no-color", str(broken)], capture_output=True, text=True, timeout=60)
    assert caught.returncode != 0 and "biuld" in caught.stdout, caught.stdout


def test_the_website_code_is_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    result = subprocess.run([ruff, "check", "website"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "NO_COLOR": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
