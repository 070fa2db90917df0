"""Near-copies shown to the instructor (issue 39): per exercise and written answer, the submissions of the term that
are near-copies of the reference solution or of each other are listed in the class report, both students of a pair
named, with names, comments and layout set aside; honest work is not listed, and exercises too short to tell honest
work from a copy are said to be so.

The round trip (issue 39, item 8) grades, with the real batch command, a class of stage 2 in which one student pasted
the reference with its comments removed and its locals renamed, two hand in the same written answers, and three
honest students wrote everything themselves in three styles (`quality.honest`)."""

import json
import re

import nbformat
import pytest

from conftest import ROOT, solution_path, student_path
from quality import similarity as calibration
from quality.honest import STYLES, student_notebook
from quality.honest.written import WRITTEN
from transformer_course.grading.outputs import similarity

STAGE = "02_attention"


def test_the_committed_calibration_is_what_honest_work_measures_now():
    """The thresholds the grader reads are those `python -m quality.similarity --write` measures on the course as it
    is: a changed exercise, reference or honest answer is calibrated again (the test says how)."""
    committed = json.loads(similarity.CALIBRATION.read_text(encoding="utf-8"))
    assert committed == json.loads(json.dumps(calibration.calibrate())), (
        "the near-copy calibration is stale: run `python -m quality.similarity --write` and commit it")


def test_on_the_calibration_no_honest_pair_is_listed_and_every_paste_is():
    measured = calibration.calibrate()["measured"]
    listed, pairs = measured["honest_pairs_listed"]
    assert listed == 0 and pairs > 100
    held, trials = measured["honest_pairs_listed_held_out_on_cells_that_can_tell"]
    assert held == 0 and trials > 100, measured["held_out_listed"]
    caught, copies = measured["copies_listed"]
    assert caught == copies > 100
    assert measured["example_class"]["listed"] == ["ada", "chen", "dana", "eve", "gus", "hana"]  # the solution
    # handed in (ada, dana, eve, gus, hana) or with one bug (chen); blake, mallory and ADA handed in the blank notebook


def test_a_pasted_reference_normalises_to_the_reference():
    solution = nbformat.read(solution_path(STAGE), as_version=4)
    released = nbformat.read(student_path(STAGE), as_version=4)
    given = similarity.compared_cells(released)
    for grade_id, cell in similarity.compared_cells(solution).items():
        if cell.cell_type != "code":
            continue
        source = similarity._SOLUTION_MARKERS.sub("", cell.source)
        pasted = calibration.paste(source, given[grade_id].source)
        assert "#" not in pasted.replace("'#'", "") and pasted != source
        assert similarity.normalise_code(pasted) == similarity.normalise_code(source), grade_id


def test_a_pair_names_both_students_and_short_cells_are_said_to_be_too_short():
    thresholds = {("s", "long"): similarity.Threshold(0.8), ("s", "short"): similarity.Threshold(None, "too short")}
    code = "\n".join(f"total_{n} = torch.softmax(scores_{n} / math.sqrt(d_k), dim=-1) @ values_{n}" for n in range(4))
    renamed = code.replace("total_", "out_").replace("values_", "vals_")
    found = similarity.compare({("s", "long"): {"ann": similarity.normalise_code(code),
                                                "bob": similarity.normalise_code(renamed),
                                                "cyd": similarity.normalise_code("y = model(x).argmax(-1)")},
                                ("s", "short"): {"ann": "v = 1", "bob": "v = 1"}},
                               {}, {}, thresholds)
    assert [(group.grade_id, group.members) for group in found.groups] == [("long", ["ann", "bob"])]
    assert found.too_short == {("s", "short"): "too short"}


# --- the round trip: the real batch command, the class report ----------------------------------------------------

def _with_answers(notebook, answers):
    for cell in notebook.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.cell_type == "markdown" and grade_id in answers:
            cell.source = answers[grade_id]
    return notebook


def _pasted(released, solution):
    """The release with every exercise cell holding the reference, pasted with its comments removed and the names it
    binds renamed: what a student who installed the course package (or read the website) could hand in."""
    notebook = nbformat.from_dict(json.loads(json.dumps(released)))
    solved = similarity.compared_cells(solution)
    for grade_id, cell in similarity.compared_cells(notebook).items():
        if cell.cell_type == "code":
            cell.source = calibration.paste(similarity._SOLUTION_MARKERS.sub("", solved[grade_id].source), cell.source)
    return notebook


@pytest.mark.slow
def test_a_pasted_reference_and_shared_written_answers_are_listed_and_honest_work_is_not(tmp_path):
    from transformer_course.grading.classroom.batch import BatchGrader
    from transformer_course.grading.sandbox.isolation import bubblewrap_problem

    if bubblewrap_problem():
        pytest.skip(f"no sandbox here: {bubblewrap_problem()}")
    released = nbformat.read(student_path(STAGE), as_version=4)
    solution = nbformat.read(solution_path(STAGE), as_version=4)
    downloads, class_dir = tmp_path / "downloads", tmp_path / "class"
    shared = WRITTEN["annotated"]  # tutorial hands in annotated's written answers
    for style in STYLES:
        answers = shared if style in ("annotated", "tutorial") else WRITTEN[style]
        path = downloads / style / f"{STAGE}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(_with_answers(student_notebook(style, STAGE, released), answers), path)
    (downloads / "paula").mkdir()
    nbformat.write(_pasted(released, solution), downloads / "paula" / f"{STAGE}.ipynb")
    BatchGrader(ROOT, class_dir, downloads, jobs=2, timeout=60, assignment_ids=[STAGE]).run()

    with open(class_dir / "scores.csv", encoding="utf-8-sig") as handle:
        import csv
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert float(rows["paula"]["autograded"]) == float(rows["paula"]["autograded_max"])  # the paste scores full marks
    assert all("flagged for review" not in row["reasons"] for row in rows.values())  # a list, not a flag or a score

    found = json.loads((class_dir / "similarity.json").read_text())
    groups = {(group["grade_id"], tuple(group["members"])) for group in found["groups"]}
    thresholds = similarity.calibration()
    told = [grade_id for (stage, grade_id), threshold in thresholds.items() if stage == STAGE and threshold.at]
    code = [grade_id for grade_id in told if not grade_id.startswith("attn_q_")]
    written = [grade_id for grade_id in told if grade_id.startswith("attn_q_")]
    assert code and written
    expected = {(grade_id, (similarity.REFERENCE, "paula")) for grade_id in code}
    expected |= {(grade_id, ("annotated", "tutorial")) for grade_id in written}
    assert groups == expected, groups ^ expected
    too_short = {item["grade_id"] for item in found["too_short"]}
    assert too_short == {grade_id for (stage, grade_id), threshold in thresholds.items()
                         if stage == STAGE and threshold.at is None}

    page = (class_dir / "report.html").read_text(encoding="utf-8")
    table = re.search(r"<table class=sortable id=copies>.*?</table>", page, re.DOTALL).group(0)
    for grade_id in code:
        assert re.search(rf"{grade_id} \(exercise\)</td><td[^>]*>the reference solution, <a [^>]*>paula</a>", table)
    for grade_id in written:
        assert re.search(rf"{grade_id} \(written answer\)</td><td[^>]*><a [^>]*>annotated</a>.*?<a [^>]*>tutorial</a>",
                         table)
    assert "prose" not in table
    assert "too short to tell" in page and 'data-key=\'students: near-copies\'><b>3</b>' in page
