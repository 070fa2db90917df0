"""The course website (website/authors/website.md), built in a smaller setting and opened in a real
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


def look_at(visit: Visit) -> dict:
    """What a reader sees on one page: its errors, requests, buttons, folded answers, pictures and maps."""
    page = visit.page
    seen = {"errors": visit.errors, "outside": visit.outside}
    buttons = page.locator("a.colab-button")
    seen["colab"] = [(buttons.nth(i).text_content(), buttons.nth(i).get_attribute("href"), buttons.nth(i).is_visible())
                     for i in range(buttons.count())]
    folded = page.locator("details.sd-dropdown")
    seen["folded"] = [(folded.nth(i).get_attribute("open"), folded.nth(i).locator(".sd-summary-content").is_visible(),
                       "Model answer" in folded.nth(i).locator(".sd-summary-content").text_content())
                      for i in range(folded.count())]
    if folded.count():
        folded.first.locator("summary").click()
        seen["opens"] = folded.first.locator(".sd-summary-content").is_visible()
    images = page.locator(".cell_output img")
    seen["images"] = []
    for index in range(images.count()):
        images.nth(index).scroll_into_view_if_needed()
        loaded = images.nth(index).evaluate("element => element.complete && element.naturalWidth > 0")
        seen["images"].append((loaded, images.nth(index).evaluate(PIXELS) if loaded else 0))
    maps = page.locator(".course-interactive")
    seen["maps"] = []
    for index in range(maps.count()):
        box = maps.nth(index).locator(".course-plot .main-svg").first.bounding_box() or {"width": 0, "height": 0}
        heatmaps = maps.nth(index).locator(".heatmaplayer image").count()
        seen["maps"].append((box["width"], box["height"], heatmaps,
                             maps.nth(index).locator("img.course-static").count()))
    seen["formulas"] = page.locator("mjx-container svg").count()
    return seen


@pytest.fixture(scope="module")
def pages_seen(site, browser) -> dict[str, dict]:
    """Every page of the site, opened once in Chromium."""
    _, out = site
    seen = {}
    for path in html_pages(out):
        visit = Visit(browser, path)
        try:
            seen[path] = look_at(visit)
        finally:
            visit.close()
    return seen


def test_every_page_loads_offline_without_console_errors(site, pages_seen):
    _, out = site
    assert {f"stages/{name}.html" for name in ASSIGNMENTS} | {"index.html", "search.html"} <= set(pages_seen)
    for path, seen in pages_seen.items():
        assert seen["errors"] == [], (path, seen["errors"])
        assert seen["outside"] == [], (path, seen["outside"])
    for path in out.rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["'](https?:)?//""", text), path


def test_every_figure_area_is_non_blank(pages_seen):
    for name in EXECUTED:
        seen = pages_seen[f"stages/{name}.html"]
        assert len(seen["images"]) >= 3, name
        for index, (loaded, colours) in enumerate(seen["images"]):
            assert loaded and colours > 20, (name, index, "a blank or missing picture")
        for index, (width, height, heatmaps, static_pictures) in enumerate(seen["maps"]):
            assert width > 300 and height > 300 and heatmaps == 1, (name, index)
            assert static_pictures == 0, (name, index, "a static copy left under the interactive map")
    decoding = pages_seen["stages/06_decoding.html"]
    assert len(decoding["maps"]) == 3  # cross-attention, encoder and decoder self-attention
    assert decoding["formulas"] > 5, "MathJax drew no formula"


def test_an_interactive_figure_keeps_its_static_picture_only_as_the_fallback_inside_it():
    output = nbformat.v4.new_output("display_data", {pages.PLOTLY_MIMETYPE: {"data": [], "layout": {}},
                                                     "image/png": "iVBORw0KGgo=", "text/plain": "map"})
    [only] = pages._split_interactive(output)
    html = only["data"]["text/html"]
    assert "image/png" not in only["data"] and html.count("<img") == 1
    assert re.search(r'<div class="course-plot"><img class="course-static" src="data:image/png;base64,', html)


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


def test_colab_buttons_open_the_student_notebook_of_the_release_tag(site, pages_seen):
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    github = repository.removeprefix("https://github.com/")
    for name in ASSIGNMENTS:
        link = f"https://colab.research.google.com/github/{github}/blob/{TAG}/notebooks/{name}/{name}.ipynb"
        assert pages_seen[f"stages/{name}.html"]["colab"] == [("Open in Colab", link, True)], name
    _, out = site
    landing = (out / "index.html").read_text(encoding="utf-8")
    for name in ASSIGNMENTS:
        assert f'href="stages/{name}.html"' in landing, name
    assert f"release of the course ({TAG})" in re.sub(r"<[^>]+>", "", landing)


def test_model_answers_are_folded_away(pages_seen):
    for name in ASSIGNMENTS:
        answers = [cell for cell in nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", 4).cells
                   if pages.is_answer_cell(cell)]
        seen = pages_seen[f"stages/{name}.html"]
        assert len(seen["folded"]) == len(answers) >= 2, name
        assert all(state == (None, False, True) for state in seen["folded"]), (name, seen["folded"])
        assert seen["opens"], name


def test_stage_5_says_it_trains_one_epoch_and_prints_the_recorded_run():
    solution = nbformat.read(ROOT / "solutions" / "05_training" / "05_training.ipynb", 4)
    page = pages.page_from_solution(solution, "05_training")
    sources = [cell.source for cell in page.cells]
    assert sum("EPOCHS = 1  # on the website" in source for source in sources) == 1
    code = [cell.source for cell in page.cells if cell.cell_type == "code"]
    assert not any("EPOCHS = 1 if short_run() else 10" in source for source in code)
    note = next(index for index, source in enumerate(sources) if "one epoch, not ten" in source)
    training = next(index for index, source in enumerate(sources) if "fit(model, train_loader" in source)
    recorded = next(index for index, source in enumerate(sources) if "read_metadata(pretrained_path())" in source)
    assert note < training < recorded
    lesson = (ROOT / "lessons" / "05_training.py").read_text(encoding="utf-8")
    assert "30 minutes to an hour for the 10 epochs" in lesson  # what the note repeats


def test_a_changed_lesson_is_refused_by_the_site_edits_with_a_message():
    solution = nbformat.read(ROOT / "solutions" / "05_training" / "05_training.ipynb", 4)
    for cell in solution.cells:
        cell.source = cell.source.replace("EPOCHS = 1 if short_run() else 10", "EPOCHS = 12")
    with pytest.raises(ValueError, match="update website/pages.py"):
        pages.page_from_solution(solution, "05_training")


def test_a_rebuild_runs_only_the_page_whose_code_changed(site, tmp_path):
    """Stage 6's prose and stage 1's code are edited: only stage 1 runs again, both pages show their edit."""
    work, out = site
    solutions = tmp_path / "solutions"
    shutil.copytree(ROOT / "solutions", solutions)
    edits = {"06_decoding": ("markdown", "\n\nA sentence added to the prose."),
             "01_positional_encoding": ("code", "\nprint('a line added to the code')")}
    for name, (kind, added) in edits.items():
        path = solutions / name / f"{name}.ipynb"
        notebook = nbformat.read(path, 4)
        cell = next(cell for cell in notebook.cells if cell.cell_type == kind and ("## " in cell.source or
                                                                                  "import" in cell.source))
        cell.source += added
        nbformat.write(notebook, path)
    rebuilt = build_site(work, out, "--solutions", str(solutions))
    assert ran(rebuilt) == {"01_positional_encoding"}, rebuilt
    assert "06_decoding: outputs from the cache" in rebuilt
    assert "A sentence added to the prose." in (out / "stages" / "06_decoding.html").read_text()
    assert "a line added to the code" in (out / "stages" / "01_positional_encoding.html").read_text()


# --- the class edition --------------------------------------------------------------------------------


def site_text(out: Path) -> str:
    """Every page of a built site as a reader (or a search engine) gets its text: tags removed, entities
    decoded, spaces collapsed, letter case folded."""
    import html

    inline = re.compile(r"</?(?:span|a|em|strong|code|b|i|kbd|sub|sup)\b[^>]*>")  # code is highlighted token by token
    parts = [html.unescape(re.sub(r"<[^>]+>", " ", inline.sub("", path.read_text(encoding="utf-8"))))
             for path in sorted(out.rglob("*.html")) if "_static" not in path.parts]
    return " ".join(" ".join(parts).split()).casefold()


def student_text() -> str:
    """The text of every student notebook, spaces collapsed and case folded: what a student has anyway."""
    cells = [cell.source for assignment in ASSIGNMENTS
             for cell in nbformat.read(ROOT / "notebooks" / assignment / f"{assignment}.ipynb", 4).cells]
    return " ".join(" ".join(cells).split()).casefold()


def answer_phrases() -> dict[str, list[str]]:
    """{question: runs of six or more plain words of its model answer and rubric in solutions/ that no student
    notebook has}."""
    from transformer_course.grading.outputs.answers import questions

    given, found = " ".join(re.sub(r"[*_]+", "", student_text()).split()), {}  # the questions' words, unemphasised
    for assignment in ASSIGNMENTS:
        for question in questions(nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", 4),
                                  assignment):
            text = " ".join([question.model_answer, *(criterion for _, criterion in question.rubric)])
            text = re.sub(r"\$[^$]*\$|`[^`]*`|\*+|_+", " | ", text)  # math, code and emphasis break a phrase
            runs = [" ".join(run.split()).casefold() for run in re.split(r"[^A-Za-z' ]+", text)]
            found[f"{assignment} {question.grade_id}"] = [run for run in runs if len(run.split()) >= 6
                                                          and run not in given]
    return found


def solution_lines() -> dict[str, list[str]]:
    """{stage: the lines of its solution regions that no student notebook has (the code a student writes)}."""
    given, found = student_text(), {}
    for assignment in ASSIGNMENTS:
        lines = []
        for cell in nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", 4).cells:
            for region in re.findall(r"### BEGIN SOLUTION[^\n]*\n(.*?)### END SOLUTION", cell.source, re.DOTALL):
                lines += [" ".join(line.split()).casefold() for line in region.splitlines()]
        found[assignment] = [line for line in dict.fromkeys(lines)
                             if len(line) >= 24 and not line.startswith("#") and line not in given]
    return found


@pytest.fixture(scope="module")
def class_site(tmp_path_factory):
    """The class edition, built as the test builds the site: stage 1 run, the other pages unrun."""
    work = tmp_path_factory.mktemp("class-site-work")
    command = [sys.executable, "-m", "website.build", "--class", "--short", "--execute", "01", "--work", str(work),
               "--out", str(work / "html")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert ran(result.stdout) == {"01_positional_encoding"}, result.stdout
    return work / "html"


def test_the_class_site_holds_no_model_answer_rubric_or_solution_code(class_site, site):
    phrases, lines = answer_phrases(), solution_lines()
    assert sum(map(len, phrases.values())) > 2 * len(phrases) and sum(map(len, lines.values())) > 50
    text = site_text(class_site)
    leaked_answers = {question: found for question, runs in phrases.items()
                      if (found := [run for run in runs if run in text])}
    leaked_code = {stage: found for stage, code in lines.items() if (found := [line for line in code if line in text])}
    assert not leaked_answers and not leaked_code, (leaked_answers, leaked_code)
    # what it shows instead: every stage's page, its exercise stubs and questions; stage 1 run
    for assignment in ASSIGNMENTS:
        page = (class_site / "stages" / f"{assignment}.html").read_text(encoding="utf-8")
        assert "NotImplementedError" in page and "your instructor grades it" in page, assignment
        assert f"/blob/{TAG}/notebooks/{assignment}/{assignment}.ipynb" in page, assignment  # its Colab button
    assert "cell_output" in (class_site / "stages" / "01_positional_encoding.html").read_text(encoding="utf-8")
    assert "cell_output" not in (class_site / "stages" / "02_attention.html").read_text(encoding="utf-8")  # unrun
    assert "no page here shows a solution or a model answer" in site_text(class_site)
    # the control: the self-study site, built from the solutions, does hold them, and the search finds them
    _, out = site
    self_study = site_text(out)
    assert all(any(run in self_study for run in runs) for runs in phrases.values() if runs)
    assert all(any(line in self_study for line in code) for code in lines.values() if code)


def test_the_publishing_workflow_passes_actionlint_and_builds_the_release_tag(tmp_path):
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as True
    assert triggers["push"]["tags"] == ["v*"]
    assert workflow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}
    steps = workflow["jobs"]["build"]["steps"]
    built = next(step for step in steps if "make site" in step.get("run", ""))
    assert "make site &&" in built["run"] and "make site-class &&" in built["run"]  # the edition: SITE_EDITION
    assert built["env"]["EDITION"] == "${{ vars.SITE_EDITION }}"
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "website/_build/published"
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
