"""Optional and extra-credit grade cells (`credit="extra"` / `credit="optional"` in a lesson), end to end on a
test-only lesson built in a temporary folder (the course's own points are untouched): the build, the notebook's
summary, the gradebook's score and maximum with nbgrader's `extra_credit`, scores.csv's row, the class report's
cells, the feedback's marks and the LMS files."""

import shutil
from pathlib import Path

import nbformat
import pytest

import transformer_course.grading.gradebook  # noqa: F401  (puts the environment's alembic on PATH for nbgrader)
from transformer_course import authoring
from transformer_course.checks import framework
from transformer_course.grading.cells import credit, credit_line

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = "90_credit"
MOODLE_FILE = f"assignsubmission_file_/{ASSIGNMENT}.ipynb"
LESSON = '''# %% [markdown]
# # A lesson with an optional and an extra-credit check

# %%
from transformer_course.checks import why_attention as check

# %% tests="counted" points=2
assert check.score_shape(AdditiveAttention)

# %% tests="bonus" points=3 credit="extra"
assert check.score_values(AdditiveAttention)

# %% tests="practice" points=0 credit="optional"
assert check.forward_shapes(AdditiveAttention)
'''


def lesson_root(folder: Path, lesson: str = LESSON) -> Path:
    (folder / "lessons").mkdir(parents=True)
    (folder / "lessons" / f"{ASSIGNMENT}.py").write_text(lesson, encoding="utf-8")
    return folder


def test_the_credit_line_reads_back():
    assert credit(credit_line("extra", 3) + "\nassert x") == ("extra", 3.0)
    assert credit(credit_line("extra", 1) + "\nassert x") == ("extra", 1.0)
    assert credit(credit_line("extra", 0.5)) == ("extra", 0.5)
    assert credit(credit_line("optional", 0)) == ("optional", 0.0)
    assert credit("assert check.score_shape(AdditiveAttention)") is None
    assert credit("x = 1\n" + credit_line("extra", 3)) is None  # only a first line counts


def test_the_build_gives_zero_nbgrader_points_and_a_first_line(tmp_path):
    notebook = authoring.build_solution(lesson_root(tmp_path), ASSIGNMENT)
    graded = {cell.metadata.nbgrader["grade_id"]: cell for cell in notebook.cells
              if cell.metadata.get("nbgrader", {}).get("grade")}
    assert graded["counted"].metadata.nbgrader["points"] == 2
    assert credit(graded["counted"].source) is None
    assert graded["bonus"].metadata.nbgrader["points"] == 0  # nbgrader's maximum leaves it out
    assert graded["bonus"].source.splitlines()[0].startswith("# Extra credit: 3 points, added to your score")
    assert graded["practice"].metadata.nbgrader["points"] == 0
    assert graded["practice"].source.splitlines()[0].startswith("# Optional: ")
    table, credits = authoring.grade_table(tmp_path)
    assert table["transformer_course.checks.why_attention"] == [
        ("counted", 2, ("score_shape",)), ("bonus", 3.0, ("score_values",)), ("practice", 0.0, ("forward_shapes",))]
    assert credits == {"transformer_course.checks.why_attention": {"bonus": "extra", "practice": "optional"}}
    assert 'CREDIT: dict[str, dict[str, str]] = {' in authoring.grade_table_source(tmp_path)


@pytest.mark.parametrize("header, problem", [
    ('tests="bonus" points=0 credit="extra"', "needs the points it can add"),
    ('tests="bonus" points=2 credit="optional"', "counts for no points"),
    ('tests="bonus" points=2 credit="bonus"', 'write credit="extra" or credit="optional"'),
    ('solution="bonus" credit="extra"', "grade cell of checks"),
])
def test_a_wrong_marker_is_an_error(tmp_path, header, problem):
    lesson = LESSON.replace('tests="bonus" points=3 credit="extra"', header)
    with pytest.raises(ValueError, match=problem):
        authoring.build_solution(lesson_root(tmp_path, lesson), ASSIGNMENT)


def test_nbgrader_releases_the_cells_with_their_line_and_zero_points(tmp_path):
    """Real `nbgrader generate_assignment`: the release keeps the first line (students read it) and 0 points."""
    root = lesson_root(tmp_path)
    (root / "autograde").mkdir()
    shutil.copy(ROOT / "autograde" / "nbgrader_config.py", root / "autograde")
    authoring.write_solutions(root, root / "solutions")
    authoring.generate_release(root, root / "solutions", root / "notebooks")
    release = nbformat.read(root / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    graded = {cell.metadata.nbgrader["grade_id"]: cell for cell in release.cells
              if cell.metadata.get("nbgrader", {}).get("grade")}
    assert credit(graded["bonus"].source) == ("extra", 3.0) and graded["bonus"].metadata.nbgrader["points"] == 0
    assert credit(graded["practice"].source) == ("optional", 0.0)
    assert credit(graded["counted"].source) is None and graded["counted"].metadata.nbgrader["points"] == 2


def _summary_of(monkeypatch, capsys, cells, credit, latest) -> str:
    """What `framework.summary` prints for stage 0's checks module with these grade cells, credit marks and latest
    outcomes ({check name: True (passed) or False (failed)})."""
    module = "transformer_course.checks.why_attention"
    monkeypatch.setitem(framework.GRADE_CELLS, module, cells)
    monkeypatch.setitem(framework.CREDIT, module, credit)
    outcome = {passed: type("Outcome", (), {"passed": passed, "deferred": False,
                                            "message": "" if passed else "the scores differ"})()
               for passed in (True, False)}
    monkeypatch.setattr(framework, "_LATEST", {(module, name): outcome[passed] for name, passed in latest.items()})
    framework.summary(module)
    return capsys.readouterr().out


def test_the_summary_counts_extra_credit_apart_and_optional_for_nothing(monkeypatch, capsys):
    import transformer_course.checks.why_attention  # noqa: F401  (the summary reads its titles)

    out = _summary_of(monkeypatch, capsys, (
        ("counted", 2, ("score_shape",)), ("bonus", 3.0, ("score_values",)), ("practice", 0.0, ("forward_shapes",)),
        ("bonus_hidden", 1.0, ())), {"bonus": "extra", "practice": "optional", "bonus_hidden": "extra"},
        {"score_shape": True, "score_values": True, "forward_shapes": False})
    assert "(extra credit, +3 points)" in out and "(optional, no points)" in out
    assert "2 of 2 points from the visible checks — all green." in out  # the failing optional check is not counted
    assert ("Extra credit: 3 of 3 points from the visible checks, added to your score and not part of its "
            "maximum.") in out
    assert "Optional checks count for no points." in out
    assert "Hidden extra credit: 1 point more" in out
    assert "Hidden tests" not in out  # the only hidden cell is extra credit


def gradebook_with_the_lesson(folder: Path, bonus_passes: bool):
    """A gradebook holding the built lesson's cells, one student's notebook scored by nbgrader's SaveAutoGrades
    and then SaveExtraCredit: returns (db_url, the autograded notebook)."""
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import SaveAutoGrades, SaveCells

    from transformer_course.grading.sandbox.executor import SaveExtraCredit

    notebook = authoring.build_solution(lesson_root(folder / "course"), ASSIGNMENT)
    db_url = f"sqlite:///{folder / 'gradebook.db'}"
    with Gradebook(db_url) as gradebook:
        gradebook.add_assignment(ASSIGNMENT)
        gradebook.add_student("ada")
    resources = {"nbgrader": {"assignment": ASSIGNMENT, "notebook": ASSIGNMENT, "db_url": db_url, "student": "ada"}}
    SaveCells().preprocess(notebook, resources)
    with Gradebook(db_url) as gradebook:
        gradebook.add_submission(ASSIGNMENT, "ada")
    error = nbformat.v4.new_output("error", ename="CheckFailed", evalue="✘ the scores differ", traceback=[])
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            grade_id = cell.metadata.nbgrader["grade_id"]
            cell.outputs = [error] if grade_id == "practice" or (grade_id == "bonus" and not bonus_passes) else []
    SaveAutoGrades().preprocess(notebook, resources)
    SaveExtraCredit().preprocess(notebook, resources)
    return db_url, notebook


@pytest.mark.parametrize("bonus_passes", [True, False])
def test_the_grader_adds_extra_credit_to_the_score_not_the_maximum(tmp_path, bonus_passes):
    from nbgrader.api import Gradebook

    from transformer_course.grading.outputs.scores import score_rows

    db_url, _ = gradebook_with_the_lesson(tmp_path, bonus_passes)
    with Gradebook(db_url) as gradebook:
        submitted = gradebook.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, "ada")
        assert submitted.max_score == 2  # nbgrader's own maximum: the counted cell only
        assert submitted.score == (5 if bonus_passes else 2)
        bonus = gradebook.find_grade("bonus", ASSIGNMENT, ASSIGNMENT, "ada")
        assert (bonus.auto_score, bonus.extra_credit) == (0, 3 if bonus_passes else 0)
    [row] = score_rows(db_url)
    assert (row["total"], row["max"]) == ((5.0, 2.0) if bonus_passes else (2.0, 2.0))
    assert (row["counted"], row["bonus"], row["practice"]) == (2.0, 3.0 if bonus_passes else 0.0, 0.0)


def test_the_feedback_marks_extra_and_optional_cells(tmp_path):
    from transformer_course.grading.outputs.feedback import mark_credit

    _, notebook = gradebook_with_the_lesson(tmp_path, bonus_passes=True)
    assert mark_credit(notebook) == (3.0, 1)
    marks = {cell.metadata.nbgrader["grade_id"]: cell.metadata.nbgrader for cell in notebook.cells
             if cell.metadata.get("nbgrader", {}).get("grade")}
    assert (marks["bonus"]["credit"], marks["bonus"]["credit_points"], marks["bonus"]["credit_passed"]) == (
        "extra", 3.0, True)
    assert (marks["practice"]["credit"], marks["practice"]["credit_passed"]) == ("optional", False)
    assert "credit" not in marks["counted"]


def test_the_class_report_lists_extra_credit_with_its_points_and_leaves_optional_out(tmp_path):
    from transformer_course.grading.outputs.report import grade_cells, pass_rates

    release = authoring.build_solution(lesson_root(tmp_path / "course"), ASSIGNMENT)
    path = tmp_path / "class" / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(release, path)
    cells = grade_cells(tmp_path / "class", [ASSIGNMENT])[ASSIGNMENT]
    assert [(cell.grade_id, cell.points, cell.extra) for cell in cells] == [("counted", 2.0, False),
                                                                           ("bonus", 3.0, True)]
    rows = [{"assignment": ASSIGNMENT, "status": "graded", "total": "5", "counted": "2", "bonus": "3"},
            {"assignment": ASSIGNMENT, "status": "graded", "total": "2", "counted": "2", "bonus": "0"}]
    rates = {entry["cell"].grade_id: entry["passed"] for entry in pass_rates(rows, {ASSIGNMENT: cells})[ASSIGNMENT]}
    assert rates == {"counted": 2, "bonus": 1}


def test_the_lms_gets_the_score_with_extra_credit_on_the_maximum_without_it(tmp_path):
    """Canvas gets 5 (2 + 3 extra) of points possible 2; Moodle, whose worksheet import skips a grade above the
    maximum, gets 2 of 2; a note lists the grades above the maximum."""
    from test_lms import canvas_import, moodle_import, read, row, write_scores

    from transformer_course.grading.outputs import lms

    write_scores(tmp_path / "canvas", [
        row("ada_12345", "ada", "12345", ASSIGNMENT, "5", "2", f"ada_12345_67890_{ASSIGNMENT}.ipynb"),
        row("bob_444", "bob", "444", ASSIGNMENT, "2", "2", f"bob_444_67891_{ASSIGNMENT}.ipynb")])
    result = lms.export(tmp_path / "canvas", scale_to={ASSIGNMENT: 2.0}, overwrite=True)
    assert any("above the stage's maximum through extra credit" in note and "ada_12345" in note
               for note in result.notes)
    canvas = tmp_path / "canvas" / "lms" / f"canvas_{ASSIGNMENT}.csv"
    table = read(canvas)
    assert table[1][5] == "2"  # Points Possible: the maximum without extra credit
    column = table[0][5]
    assert canvas_import(canvas, {}) == {("12345", column): ("", "5"), ("444", column): ("", "2")}

    write_scores(tmp_path / "moodle", [
        row("ann_101", "Ann Lee", "101", ASSIGNMENT, "5", "2", f"Ann Lee_101_{MOODLE_FILE}"),
        row("bo_102", "Bo Chen", "102", ASSIGNMENT, "1", "2", f"Bo Chen_102_{MOODLE_FILE}")])
    result = lms.export(tmp_path / "moodle", scale_to={ASSIGNMENT: 2.0})
    grades, _ = moodle_import(tmp_path / "moodle" / "lms" / f"moodle_{ASSIGNMENT}.csv", {}, maximum=2)
    assert grades == {"101": 2.0, "102": 1.0}
    assert any("ann_101" in note and "sent as the maximum 2" in note for note in result.notes)


def test_a_cell_of_several_checks_shows_each_checks_own_mark(monkeypatch, capsys):
    """A student whose first check of a two-check cell passes sees it passing beside the one that fails."""
    import transformer_course.checks.why_attention as checks

    out = _summary_of(monkeypatch, capsys, (("pair", 3, ("score_shape", "score_values")),
                                            ("single", 1, ("forward_shapes",))), {},
                      {"score_shape": True, "score_values": False, "forward_shapes": True})
    assert f"✘ {checks.score_shape.check_title} [✔]; {checks.score_values.check_title} [✘]  (3 points)" in out
    assert f"✔ {checks.forward_shapes.check_title}  (1 point)" in out  # one check: no bracket
    assert "1 of 4 points from the visible checks; 1 of 2 graded cells not passing yet." in out
    assert "every one of them passes" in out
