"""The class report's hand-built SVG plots (grading/outputs/svg_plots.py), without a browser: a student's
text is drawn as written and stays inert, every entry gets its bar and its value beside it, long labels
are cut with their full text kept as a tooltip, and every plot fits on a screen.
(tests/test_class_report.py looks at the same plots in a real browser.)"""

import xml.etree.ElementTree as ElementTree

import pytest

from transformer_course.grading.outputs import svg_plots
from transformer_course.grading.outputs.report import (
    COLOURS,
    CauseGroup,
    GradeCell,
    StageSummary,
    causes_plot,
    distribution_plot,
    pass_rate_plot,
)

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<script>alert(1)</script>\"onload=\"alert(2)<a href='//x.io'>$x^2$ &amp;"  # under 70 characters


def _parse(svg: str) -> ElementTree.Element:
    """The SVG as XML: it must be well formed (everything escaped)."""
    return ElementTree.fromstring(svg)


def _fits_on_a_screen(root: ElementTree.Element) -> None:
    width, height = float(root.get("width")), float(root.get("height"))
    assert 0 < width <= svg_plots.MAX_WIDTH and 0 < height <= svg_plots.MAX_HEIGHT, (width, height)
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}"


def _bars(root: ElementTree.Element) -> list[ElementTree.Element]:
    return [element for element in root.iter(f"{SVG}rect") if element.get("class") == "bar"]


def _texts(root: ElementTree.Element) -> list[str]:
    return [element.text or "" for element in root.iter(f"{SVG}text")]


def _group(exercise: str, words: str, cell: str, student: str) -> CauseGroup:
    return CauseGroup(exercise, words, words, {cell}, {(student, "01")}, {(student, "01"): words})


def test_a_hostile_label_is_text_and_nothing_else():
    svg = causes_plot([_group("pe", HOSTILE, "pe_values", "ada"), _group("pe", "a second cause", "pe_forward", "bo")])
    root = _parse(svg)
    label = f"pe: {HOSTILE}"  # the exercise, then what went wrong
    titles = [element.text or "" for element in root.iter(f"{SVG}title")]
    assert f"{label}: 1" in titles  # whole in its tooltip (with its count): as written, no mathtext, nothing dropped
    assert any(text.startswith(label[:60]) for text in _texts(root))  # on the bar, cut with "…" if too long
    assert [element.tag for element in root.iter()] == [f"{SVG}{tag}" for tag in [
        "svg", "title", "text", *["line", "text"] * 2, "line", "text",
        *["g", "title", "text", "rect", "text"] * 2]], "an element came from the label"
    attributes = {name for element in root.iter() for name in element.attrib}
    assert not {name for name in attributes if name.startswith("on") or "href" in name or name == "src"}, attributes
    assert "<script" not in svg and "<a " not in svg and "$x^2$" in svg


def test_every_entry_has_a_bar_and_its_percentage_beside_it():
    cells = [GradeCell("01", f"check_{index}", 2.0, False, f"check number {index}") for index in range(30)]
    entries = [{"cell": cell, "students": 4, "passed": index % 5, "mean": 1.0, "waiting": 0}
               for index, cell in enumerate(cells)]
    entries.append({"cell": GradeCell("01", "written", 3.0, True, "written answer"), "students": 4, "passed": 0,
                    "mean": 1.5, "waiting": 2})
    root = _parse(pass_rate_plot("01", entries))
    _fits_on_a_screen(root)
    bars = _bars(root)
    assert len(bars) == 30 and {bar.get("fill") for bar in bars} == {COLOURS["pass_rate"]}  # the written one: none
    widths = [float(bar.get("width")) for bar in bars]
    assert widths[0] == 0 and widths[4] == pytest.approx(max(widths)) and widths[2] == pytest.approx(widths[4] / 2)
    texts = _texts(root)
    for index in range(30):
        assert f"check_{index}" in texts
    assert texts.count("100%") == 6 and texts.count("25%") == 6 and texts.count("0%") == 6
    assert "01: pass rate of every check" in texts and "students with full points on the check (%)" in texts
    assert root.get("role") == "img" and root.get("aria-label") == "01: pass rate of every check"
    assert root.find(f"{SVG}title").text == "01: pass rate of every check"


def test_a_long_label_is_cut_and_the_left_margin_holds_the_longest():
    long = "the attention weights are normalised over the queries instead of the keys, " * 3
    root = _parse(svg_plots.bar_chart("causes", [long, "short"], [3, 1], "#000000", "students", ["3", "1"]))
    _fits_on_a_screen(root)
    label = next(text for text in root.iter(f"{SVG}text") if (text.text or "").startswith("the attention"))
    assert label.text.endswith("…") and len(label.text) == svg_plots.LABEL_CHARACTERS
    assert long + ": 3" in [title.text for title in root.iter(f"{SVG}title")]  # the full text as a tooltip
    # the right-aligned label ends at the left of the bars, and the margin leaves room for its estimated width
    bar_left = float(_bars(root)[0].get("x"))
    assert label.get("text-anchor") == "end" and float(label.get("x")) < bar_left
    assert float(label.get("x")) - svg_plots.text_width(label.text, float(label.get("font-size"))) >= 0


def test_the_histograms_count_every_total_in_its_bin():
    stages = {name: StageSummary(name, len(totals), 20.0, totals, totals, [0.0] * len(totals), 0)
              for name, totals in [("00_why_attention", [0.0, 1.0, 19.0, 20.0, 20.0]), ("01_positional", [10.0]),
                                   *[(f"0{index}_stage", [5.0]) for index in range(2, 12)]]}
    root = _parse(distribution_plot(stages))
    _fits_on_a_screen(root)
    bars = _bars(root)
    assert len(bars) == 12 * 10 and {bar.get("fill") for bar in bars} == {COLOURS["distribution"]}
    heights = [float(bar.get("height")) for bar in bars[:10]]  # the first stage: 0 %, 5 %, 95 %, 100 %, 100 %
    assert heights[0] > 0 and heights[0] * 3 == pytest.approx(heights[9] * 2) and heights[1:9] == [0.0] * 8
    assert svg_plots.histogram_counts([0, 9.99, 10, 99, 100], list(range(0, 101, 10))) == [2, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    texts = _texts(root)
    assert "00_why_attention (5 notebooks)" in texts and texts.count("total, % of the maximum") == 12


@pytest.mark.parametrize("maximum", [0, 1, 3, 7, 10, 31, 100, 1234])
def test_axis_ticks_are_round_and_reach_the_maximum(maximum):
    ticks = svg_plots.axis_ticks(maximum)
    assert ticks[0] == 0 and ticks[-1] >= maximum and len(ticks) <= 7
    step = ticks[1] - ticks[0]
    assert step >= 1 and f"{step:g}".lstrip("0")[0] in "125"
