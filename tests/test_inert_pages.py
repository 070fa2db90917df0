"""No student HTML runs anywhere an instructor looks (issue 19): a written answer, an instructor's comment,
a rich output and a student's name carrying `<img onerror>`, `<script>`, `<svg onload>` and a
`javascript:` link, opened in the real headless Chromium (tests/browser.py) on every page the course
writes or serves: the feedback page, the formgrader's grading page, the answer pages and the class report.
Each would mark the page if it ran; none may. A control page with the same text and no defences shows that
the browser runs such script, so the test can fail. Honest markdown and math in the same answer still read
well.

Issue 29: line rules on the markdown missed a link whose destination starts on the next line, so student text
is now sanitised after rendering (nh3, `inert.py`). `HOSTILE` lists that and the other known ways past a
sanitiser (split and reference-style links, entity-encoded schemes, `data:` pages, SVG and MathML parser
tricks, `srcdoc` frames); the fast tests below render them through every path the course has (nbconvert's
templates with the course's preprocessor and filters, each of the two alone, the formgrader's template, the
answer pages) and click every link in Chromium. The formgrader runs behind the Content-Security-Policy that
`answers.write_formgrader_config` writes, started with the README's command (`jupyter lab --config=...`).

The hostile text is put where a hostile student's would land (the autograded notebook nbgrader keeps, the
gradebook's comment, scores.csv's name column) in a copy of the example class graded once per session
(conftest), so nothing is graded again here: a few seconds, plus a Jupyter server for the formgrader."""

import contextlib
import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

from browser import Browser
from conftest import EXAMPLE_ASSIGNMENT, ROOT
from transformer_course.grading.outputs import answers
from transformer_course.grading.outputs.report import write_report

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("example_class")]  # one worker: shared fixtures
MARK = "document.documentElement.setAttribute('data-ran', '{}')"
PAYLOAD = (f"<img src=x onerror=\"{MARK.format('img')}\"> <script>{MARK.format('script')}</script> "
           f"<svg onload=\"{MARK.format('svg')}\"></svg> [click me](javascript:{MARK.format('link')})\n\n"
           f"[split](\njavascript:{MARK.format('split')})\n\n[indented](\n  javascript:{MARK.format('indented')})\n\n"
           f"[encoded](jav&#x61;script:{MARK.format('encoded')})\n\n[reference][r]\n\n[r]:\n  "
           f"javascript:{MARK.format('reference')}\n")
HONEST = "The **variance** of $q \\cdot k$ grows like $\\sqrt{d_k}$, so a < b:\n\n- first\n- second\n\n"
STUDENT, QUESTION, COMMENTED = "ada", "attn_q_scale", "attn_q_mask"
RAN = "document.documentElement.getAttribute('data-ran')"
JAVASCRIPT_LINKS = "[...document.links].filter(a => a.protocol === 'javascript:').length"


@pytest.fixture(scope="module")
def hostile_class(graded_example_class, tmp_path_factory):
    from nbgrader.api import Gradebook

    class_dir = tmp_path_factory.mktemp("inert") / "class"
    shutil.copytree(graded_example_class[0].class_dir, class_dir, ignore=shutil.ignore_patterns("submitted"))
    path = class_dir / "autograded" / STUDENT / EXAMPLE_ASSIGNMENT / f"{EXAMPLE_ASSIGNMENT}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    answer = next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == QUESTION)
    answer.source = HONEST + PAYLOAD
    code = next(c for c in notebook.cells if c.cell_type == "code" and not c.metadata.get("nbgrader", {}).get("grade"))
    code.outputs.append(nbformat.v4.new_output("display_data", data={
        "text/html": PAYLOAD, "application/javascript": MARK.format("output"), "text/plain": "a display"}))
    nbformat.write(notebook, path)
    with Gradebook(f"sqlite:///{class_dir / 'gradebook.db'}") as gradebook:
        comment = gradebook.find_comment(COMMENTED, EXAMPLE_ASSIGNMENT, EXAMPLE_ASSIGNMENT, STUDENT)
        comment.manual_comment = "Instructor: " + PAYLOAD
        gradebook.db.commit()
    with open(class_dir / "scores.csv", newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        if row["student"] == STUDENT:
            row["name"] = PAYLOAD
            row["reasons"] = f"{row['reasons']}; likely cause: {PAYLOAD}"
    with open(class_dir / "scores.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert answers.regenerate_feedback(ROOT, class_dir, [(STUDENT, EXAMPLE_ASSIGNMENT)]) == []
    answers.export(class_dir, ROOT)
    write_report(class_dir)
    answers.write_formgrader_config(class_dir, ROOT)
    return class_dir


def test_the_browser_runs_the_payload_where_nothing_stops_it(tmp_path):
    """The control: the same text in a page with no policy and no escaping runs, so each check below can fail."""
    page = tmp_path / "control.html"
    link = f"<a href=\"javascript:{MARK.format('link')}\">click me</a>"  # what the markdown link would render as
    page.write_text(f"<!DOCTYPE html><html><body>{PAYLOAD} {link}</body></html>", encoding="utf-8")
    with Browser(tmp_path / "profile") as browser:
        browser.open(page.as_uri())
        assert browser.evaluate(RAN) in ("img", "script", "svg")
        assert browser.evaluate(JAVASCRIPT_LINKS) == 1


def test_the_feedback_page_runs_nothing_and_reads_well(hostile_class, tmp_path):
    page = hostile_class / "feedback" / STUDENT / EXAMPLE_ASSIGNMENT / f"{EXAMPLE_ASSIGNMENT}.html"
    source = page.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in source
    assert not re.search(r"<script|<[^>]*\bsrc=[\"']?(https?:)?//", source, re.I)
    with Browser(tmp_path / "profile") as browser:
        browser.open(page.as_uri())
        assert browser.evaluate(RAN) is None
        assert browser.evaluate(JAVASCRIPT_LINKS) == 0
        text = browser.evaluate("document.body.innerText")
        assert "<img src=x onerror=" in text and "Instructor: <img src=x" in text  # shown as text
        assert "a < b" in text and "$" not in text  # comparisons as written; math typeset (MathML), no raw $
        assert browser.evaluate("[...document.querySelectorAll('math msqrt')].some(e => e.textContent === 'dk')")
        assert browser.evaluate(MATHML_ONLY) == []  # the MathML is the course's: no link, style or HTML inside
        assert browser.evaluate("[...document.querySelectorAll('strong')].some(e => e.textContent === 'variance')")
        assert browser.evaluate("[...document.querySelectorAll('li')].some(e => e.textContent === 'second')")


def test_the_answer_pages_and_the_report_run_nothing(hostile_class, tmp_path):
    folder = hostile_class / "answers"
    pages = [folder / "index.html", folder / EXAMPLE_ASSIGNMENT / f"{QUESTION}.html",
             folder / EXAMPLE_ASSIGNMENT / f"{COMMENTED}.html", hostile_class / "report.html"]
    with Browser(tmp_path / "profile") as browser:
        for page in pages:
            browser.open(page.as_uri())
            assert browser.evaluate(RAN) is None, page
            assert browser.evaluate(JAVASCRIPT_LINKS) == 0, page
        assert "<img src=x onerror=" in browser.evaluate("document.body.innerText")  # the report shows the name
        assert browser.evaluate("document.documentElement.dataset.sortable") == "on"  # its own script did run


@contextlib.contextmanager
def formgrader_with_policy(class_dir):
    """JupyterLab started in the class folder with the README's command (`jupyter lab
    --config=jupyter_server_config.py`); yields (call, headers): the REST call of `formgrader` and a function
    returning a page's response headers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = "formgrader-policy-test"
    environment = {**os.environ, "JUPYTER_CONFIG_DIR": str(class_dir / ".jupyter"),
                   "JUPYTER_RUNTIME_DIR": str(class_dir / ".jupyter" / "runtime")}
    server = subprocess.Popen([sys.executable, "-m", "jupyter", "lab", f"--config={answers.SERVER_CONFIG}",
                               "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
                               "--allow-root"], cwd=class_dir, env=environment, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)

    def call(path):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read().decode()

    def headers(path):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.headers

    call.url = lambda path: f"http://127.0.0.1:{port}{path}{'&' if '?' in path else '?'}token={token}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                call("/api/status")
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the Jupyter server did not start"
                time.sleep(0.5)
        yield call, headers
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_the_formgraders_grading_page_runs_nothing(hostile_class, tmp_path):
    """nbgrader's formgrader renders the autograded notebook into the instructor's logged-in page: the answer,
    its outputs and the comments must be inert (its own scripts run there, inline ones included, so its policy
    must allow inline script: the sanitiser is the defence, the policy forbids everything from elsewhere).
    The server is started as README says, and every page it serves carries the policy."""
    with formgrader_with_policy(hostile_class) as (call, headers):
        listed = json.loads(call(f"/formgrader/api/submitted_notebooks/{EXAMPLE_ASSIGNMENT}/{EXAMPLE_ASSIGNMENT}"))
        submission = next(entry for entry in listed if entry["student"] == STUDENT)
        page = f"/formgrader/submissions/{submission['id']}/?index=0"
        for path in (page, "/formgrader", "/lab", "/api/status"):  # the REST API adds default-src 'none'
            assert headers(path)["Content-Security-Policy"].startswith(answers.FORMGRADER_POLICY), path
        with Browser(tmp_path / "profile") as browser:
            browser.open(call.url(page), settle=2)
            assert "formgrader" in browser.evaluate("document.body.innerHTML").lower()
            assert browser.evaluate("typeof jQuery === 'function' && typeof submission_id === 'string'")  # its own
            assert "<img src=x onerror=" in browser.evaluate("document.body.innerText")  # the answer, as text
            assert browser.evaluate(RAN) is None
            assert browser.evaluate(JAVASCRIPT_LINKS) == 0
            assert browser.evaluate(RISKY_ELEMENTS) == []
            ran = _click_every_link(browser, call.url(page))
            assert browser.evaluate(RAN) is None and ran == []
            browser.open(call.url("/lab"), settle=5)  # JupyterLab itself works under the policy
            assert browser.evaluate("document.querySelector('#jp-main-dock-panel, .jp-LabShell') !== null")


# --- issue 29: every known way past a sanitiser, through every path that renders student text -------------

# void(...): a javascript: address whose value is a string replaces the document (and its window) by it
PWN = "void(window.__pwned=1,document.title='pwned')"
HOSTILE = [
    f"[split](\njavascript:{PWN})",
    f"[indented](\n  javascript:{PWN})",
    f"[tab](\n\tjavascript:{PWN})",
    f"[angle](<\njavascript:{PWN}>)",
    f"[reference][r]\n\n[r]:\n  javascript:{PWN}",
    f"[ref2][s]\n\n[s]: <\njavascript:{PWN}>",
    f"[encoded](jav&#x61;script:{PWN})",
    f"[encoded2](&#106;avascript&#58;{PWN})",
    f"[upper](JaVaScRiPt:{PWN})",
    "[page](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    f"<a href=\"javascript:{PWN}\">raw link</a>",
    f"<a href=\"jav&#x61;script:{PWN}\">raw encoded</a>",
    "<a href=\"data:text/html,<script>parent.__pwned=1</script>\">raw data</a>",
    f"<svg onload=\"{PWN}\"></svg>",
    f"<svg><script>{PWN}</script></svg>",
    f"<svg><a xlink:href=\"javascript:{PWN}\"><text y=20>svg link</text></a></svg>",
    f"<math><mtext><table><mglyph><style><img src=x onerror=\"{PWN}\">",
    f"<math><mi xlink:href=\"javascript:{PWN}\">math link</mi></math>",
    f"<img src=x onerror=\"{PWN}\">",
    "<iframe srcdoc=\"<script>parent.__pwned=1;parent.document.title='pwned'</script>\"></iframe>",
    f"<details open ontoggle=\"{PWN}\">x</details>",
    f"<form action=\"javascript:{PWN}\"><button>send</button></form>",
    f"<p style=\"background:url(javascript:{PWN})\">styled</p>",
    f"<object data=\"javascript:{PWN}\"></object><embed src=\"javascript:{PWN}\">",
    f"<base href=\"javascript:{PWN}//\"><a href=\"x\">based</a>",
    f"<noscript><p title=\"</noscript><img src=x onerror={PWN}>\"></noscript>",
    f"![img](x\" onerror=\"{PWN})",
    f"$x$ <img src=x onerror=\"{PWN}\"> $$\\href{{javascript:{PWN}}}{{y}}$$",
]
# Within every <math> of the page, anything but MathML presentation elements with layout attributes (the
# feedback pages' formulas, written by `mathml`): a link, a style, an event handler, HTML, SVG, an address.
MATHML_ONLY = (
    "[...document.querySelectorAll('math')].flatMap(m => [m, ...m.querySelectorAll('*')]).filter(e => "
    "e.namespaceURI !== 'http://www.w3.org/1998/Math/MathML' || ['maction', 'mglyph', 'semantics', "
    "'annotation-xml', 'annotation'].includes(e.localName) || [...e.attributes].some(a => !['alttext', 'display', "
    "'mathvariant', 'stretchy', 'fence', 'separator', 'lspace', 'rspace', 'accent', 'accentunder', "
    "'movablelimits', 'symmetric', 'minsize', 'maxsize', 'largeop', 'linethickness', 'columnalign', 'rowalign', "
    "'columnspacing', 'rowspacing', 'columnlines', 'rowlines', 'frame', 'width', 'height', 'depth', 'voffset', "
    "'scriptlevel', 'displaystyle', 'form', 'notation'].includes(a.name) || "
    "(a.name !== 'alttext' && /url|javascript|[(:]/i.test(a.value))))"  # alttext: the TeX, as text
    ".map(e => e.outerHTML.slice(0, 120))")
# In what the page rendered from a notebook (markdown, outputs): any element that could run, fetch or frame
# something, except a link to the web, mail or this page, an image (a PNG, or an SVG in an <img>, which
# runs no script) or one without an address, and a formula that MATHML_ONLY finds clean.
RISKY_ELEMENTS = (
    "[...document.querySelectorAll('.rendered_html, .jp-RenderedHTMLCommon, .output_subarea, "
    ".jp-OutputArea-output')].flatMap(e => [...e.querySelectorAll('a, area, img, iframe, frame, svg, math, object, "
    "embed, form, base, script, link, meta, [style], [srcdoc], [formaction]')]).filter(e => !("
    "(e.tagName === 'A' && /^(https?:|mailto:|#|$)/.test(e.getAttribute('href') || '')) || "
    "(e.tagName === 'IMG' && /^(data:image\\/(png|jpeg|svg\\+xml);|https?:|$)/.test(e.getAttribute('src') || '')) || "
    "(e.localName === 'math' && !e.querySelector('a, [href], [style], [src]') && "
    "[...e.querySelectorAll('*')].every(n => n.namespaceURI === 'http://www.w3.org/1998/Math/MathML'))"
    ")).map(e => e.outerHTML.slice(0, 120))")
HONEST_MARKDOWN = ("The **variance** of $q \\cdot k$ grows like $\\sqrt{d_k}$, so a < b:\n\n- first\n- second\n\n"
                   "| head | dim |\n|---|---|\n| 8 | 64 |\n\n```python\nscores = q @ k.T\n```\n\n"
                   "`inline code` and [a paper](https://arxiv.org/abs/1706.03762)\n")
PWNED = "window.__pwned === undefined && document.title !== 'pwned' ? 'clean' : 'pwned'"


def _hostile_notebook() -> nbformat.NotebookNode:
    """A notebook with each payload as a markdown cell, a raw cell, an nbgrader comment and rich outputs."""
    cells = [nbformat.v4.new_markdown_cell(HONEST_MARKDOWN)]
    cells += [nbformat.v4.new_markdown_cell(text) for text in HOSTILE]
    raw = nbformat.v4.new_raw_cell("\n\n".join(HOSTILE))
    raw.metadata["raw_mimetype"] = "text/markdown"  # the template would render it through markdown2html
    answer = nbformat.v4.new_markdown_cell("\n\n".join(HOSTILE), metadata={"nbgrader": {
        "solution": True, "grade": True, "grade_id": "answer", "points": 1, "comment": "\n\n".join(HOSTILE)}})
    code = nbformat.v4.new_code_cell("x = 1", outputs=[
        nbformat.v4.new_output("display_data", data={"text/html": "".join(HOSTILE), "text/plain": "html"}),
        nbformat.v4.new_output("display_data", data={"text/markdown": "\n\n".join(HOSTILE), "text/plain": "md"}),
        nbformat.v4.new_output("display_data", data={"image/svg+xml": HOSTILE[14], "text/plain": "svg"}),
        nbformat.v4.new_output("display_data", data={"application/javascript": PWN, "text/plain": "js"}),
        nbformat.v4.new_output("display_data", data={"text/html": HOSTILE[19]},
                               metadata={"text/html": {"isolated": True}}),
        nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="}, metadata={
            "image/png": {"width": f"1 onload=\"{PWN}\""}})])
    return nbformat.v4.new_notebook(cells=[*cells, raw, answer, code])


def _exporters():
    """{name: a function rendering a notebook to a page} for every way the course renders one."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config import Config

    from transformer_course.grading.outputs import feedback, inert

    def exporter(config, cls=HTMLExporter):
        resources = {"base_url": "", "index": 0, "total": 1, "assignment_id": "a", "notebook_id": "n",
                     "submission_id": "s", "student": "ada", "notebook_path": "n.ipynb"}  # as the formgrader's
        return lambda nb: cls(config=config).from_notebook_node(nb, resources=resources)[0]

    formgrade = inert.configure(Config())
    formgrade.HTMLExporter.template_name = "formgrade"
    formgrade.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    filters_only = Config()  # markdown (cells, comments, outputs) and HTML outputs, sanitised after rendering
    filters_only.HTMLExporter.filters = inert.FILTERS
    filters_only.HTMLExporter.sanitize_html = True
    preprocessor_only = Config()  # nbconvert's own filters: the preprocessor's HTML must stay inert through them
    preprocessor_only.HTMLExporter.preprocessors = [inert.InertNotebook]
    return {"course": exporter(inert.configure(Config())),
            "feedback exporter": exporter(inert.configure(Config()), feedback.SafeFeedbackExporter),
            "formgrader template": exporter(formgrade),
            "filters only": exporter(filters_only),
            "preprocessor only": exporter(preprocessor_only),
            "preprocessor only, classic": exporter(Config({**preprocessor_only, "HTMLExporter": {
                **preprocessor_only.HTMLExporter, "template_name": "classic"}}))}


def _click_every_link(browser: Browser, url: str) -> list[str]:
    """Open URL, check nothing ran, then click each link of the page in turn on a fresh load; returns what
    ran (an empty list when nothing did)."""
    browser.open(url)
    ran = [] if browser.evaluate(PWNED) == "clean" else [f"{url}: on load"]
    for index in range(int(browser.evaluate("document.links.length"))):
        browser.open(url, settle=0.05)
        href = browser.evaluate(f"document.links[{index}].getAttribute('href')")
        browser.evaluate(f"document.links[{index}].click()")
        time.sleep(0.2)
        with contextlib.suppress(AssertionError):  # a link to the web leaves the page: nothing of ours ran there
            if browser.evaluate(PWNED) != "clean":
                ran.append(f"{url}: link {href}")
    return ran


def test_the_control_page_runs_the_hostile_markdown(tmp_path):
    """nbconvert as it comes renders the split link (and raw HTML) so that it runs: the tests below can fail."""
    from nbconvert.exporters import HTMLExporter

    page = tmp_path / "control.html"
    page.write_text(HTMLExporter().from_notebook_node(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell(HOSTILE[0])]))[0], encoding="utf-8")
    with Browser(tmp_path / "profile") as browser:
        assert _click_every_link(browser, page.as_uri()) != []


# the paths a page of the course is rendered by run in every suite; each part alone (`pytest -m extended`)
@pytest.mark.parametrize("path", ["course", "formgrader template",
                                  *(pytest.param(part, marks=pytest.mark.extended) for part in (
                                      "feedback exporter", "filters only", "preprocessor only",
                                      "preprocessor only, classic"))])
def test_no_hostile_markdown_runs_through_any_renderer(path, tmp_path):
    """Every payload, as a markdown cell, raw cell, comment and output, rendered the way PATH renders it:
    nothing runs on load or on clicking any link, no element that could run or fetch is left, and the honest
    markdown (emphasis, list, table, code, a web link, math as written) still shows."""
    page = tmp_path / "page.html"
    notebook = _hostile_notebook()
    if path == "filters only":  # filters see no javascript output (the template writes it as a script): only
        notebook.cells[-1].outputs = [o for o in notebook.cells[-1].outputs  # the preprocessor removes those
                                      if "application/javascript" not in o.get("data", {})]
    page.write_text(_exporters()[path](notebook), encoding="utf-8")
    with Browser(tmp_path / "profile") as browser:
        assert _click_every_link(browser, page.as_uri()) == []
        browser.open(page.as_uri())
        assert browser.evaluate("document.querySelectorAll('.rendered_html, .jp-RenderedHTMLCommon').length") > 5
        assert browser.evaluate(RISKY_ELEMENTS) == []
        assert browser.evaluate("[...document.querySelectorAll('script')].filter(s => !s.src && "
                                "/__pwned/.test(s.textContent)).length") == 0
        text = browser.evaluate("document.body.innerText")
        assert "a < b" in text
        if path == "feedback exporter":  # the feedback page typesets math as MathML, the course's own
            assert "$\\sqrt{d_k}$" not in text and browser.evaluate(MATHML_ONLY) == []
            assert browser.evaluate("[...document.querySelectorAll('math msqrt')].some(e => e.textContent === 'dk')")
        else:  # elsewhere it reads as written
            assert "$\\sqrt{d_k}$" in text
        for honest in ("strong", "li", "td", "code"):
            assert browser.evaluate(f"document.querySelectorAll('{honest}').length") > 0, honest
        assert browser.evaluate("[...document.links].some(a => a.href === 'https://arxiv.org/abs/1706.03762')")


def test_the_answer_pages_show_hostile_answers_as_text(tmp_path):
    """The answer pages (question and model answer rendered, students' answers and comments as text) run
    nothing whatever the answer or the question's markdown holds."""
    question = answers.Question("02_attention", "q", 1, 2.0, "\n\n".join(HOSTILE), HONEST_MARKDOWN,
                                ((1.0, HOSTILE[0]), (1.0, HOSTILE[4])))
    sheet = answers.Sheet(question, [answers.Answer(f"s{number}", text, "", text, None, False, text)
                                     for number, text in enumerate(HOSTILE)])
    page = tmp_path / "q.html"
    page.write_text(answers._question_page(sheet), encoding="utf-8")
    assert f"content=\"{answers.ANSWER_PAGE_POLICY}\"" in page.read_text(encoding="utf-8")
    with Browser(tmp_path / "profile") as browser:
        assert _click_every_link(browser, page.as_uri()) == []
        assert HOSTILE[0].split("\n")[1] in browser.evaluate("document.body.innerText")  # the answer, as text


def test_the_formgrader_config_is_loaded_with_its_policy(tmp_path):
    """The two files the batch writes are read by traitlets as Jupyter and nbgrader read them: the server's
    headers carry the policy, and nbgrader's HTML exporter gets the sanitising filters and preprocessor."""
    from traitlets.config.loader import PyFileConfigLoader

    from transformer_course.grading.outputs import inert

    answers.write_formgrader_config(tmp_path, ROOT)
    server = PyFileConfigLoader(answers.SERVER_CONFIG, path=str(tmp_path)).load_config()
    assert server.ServerApp.tornado_settings["headers"]["Content-Security-Policy"] == answers.FORMGRADER_POLICY
    assert "'unsafe-eval'" not in answers.FORMGRADER_POLICY and "object-src 'none'" in answers.FORMGRADER_POLICY
    nbgrader = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    assert nbgrader.HTMLExporter.filters["markdown2html"] is inert.markdown2html
    assert inert.InertNotebook in nbgrader.HTMLExporter.preprocessors
    assert f"--config={answers.SERVER_CONFIG}" in answers.formgrader_command(tmp_path)
