"""A gradebook write refused after a notebook ran is tried again in place, not by grading the notebook again
(`grading/gradebook/retries.py`), against a real SQLite lock held by another connection."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.preprocessors import SaveAutoGrades
from sqlalchemy.exc import OperationalError

from transformer_course.grading.classroom.worker import course_config
from transformer_course.grading.gradebook import retries


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gradebook with one graded cell and one submission (made once: nbgrader migrates a new database)."""
    path = tmp_path_factory.mktemp("template") / "gradebook.db"
    with Gradebook(f"sqlite:///{path}") as gradebook:
        gradebook.update_or_create_assignment("week1")
        gradebook.add_student("ada")
        gradebook.update_or_create_notebook("week1", "week1")
        gradebook.update_or_create_grade_cell("checks", "week1", "week1", max_score=2.0, cell_type="code")
        gradebook.add_submission("week1", "ada")
    return path


@pytest.fixture
def gradebook(template: Path, tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "gradebook.db"
    shutil.copy(template, path)
    return f"sqlite:///{path}?timeout=0.2", path  # a short busy time-out: a held lock refuses a write at once


def _graded_notebook() -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("assert True")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "checks", "points": 2, "solution": False,
                                 "locked": True}
    cell.outputs = []
    return nbformat.v4.new_notebook(cells=[cell])


def _resources(url: str) -> dict:
    return {"nbgrader": {"notebook": "week1", "assignment": "week1", "student": "ada", "db_url": url}}


def _hold_lock(path: Path, seconds: float, held: threading.Event) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("BEGIN EXCLUSIVE")
    held.set()
    time.sleep(seconds)
    connection.execute("COMMIT")
    connection.close()


def _locked_for(path: Path, seconds: float) -> threading.Thread:
    held = threading.Event()
    thread = threading.Thread(target=_hold_lock, args=(path, seconds, held), daemon=True)
    thread.start()
    held.wait(10)
    return thread


def test_the_grades_write_waits_out_another_writers_lock(gradebook: tuple[str, Path]) -> None:
    url, path = gradebook
    holder = _locked_for(path, 1.5)  # longer than the busy time-out, shorter than the attempts' pauses
    retries.RetriedSaveAutoGrades().preprocess(_graded_notebook(), _resources(url))
    holder.join()
    with Gradebook(url) as written:
        assert written.find_grade("checks", "week1", "week1", "ada").auto_score == 2.0


def test_without_the_retries_the_same_lock_fails_the_write(gradebook: tuple[str, Path]) -> None:
    url, path = gradebook
    holder = _locked_for(path, 1.5)
    with pytest.raises(OperationalError, match="database is locked"):
        SaveAutoGrades().preprocess(_graded_notebook(), _resources(url))
    holder.join()


def test_the_course_pipeline_writes_the_gradebook_only_through_the_retried_steps(tmp_path: Path) -> None:
    config = course_config(Path(__file__).resolve().parents[1], tmp_path, "sqlite:///:memory:", timeout=10)
    steps = [step if isinstance(step, str) else step.__name__ for step in config.Autograde.autograde_preprocessors]
    assert "SaveAutoGrades" in steps and "AssignLatePenalties" in steps
    writers = [step for step in config.Autograde.autograde_preprocessors
               if getattr(step, "__name__", step) in retries.REPLACEMENTS]
    assert writers == [retries.RetriedSaveAutoGrades, retries.RetriedAssignLatePenalties]
    own = [step for step in config.Autograde.autograde_preprocessors if getattr(step, "writes_gradebook", False)]
    assert own and all(step.preprocess is not step.__mro__[1].preprocess for step in own)  # the course's, retried


def test_a_write_that_fails_for_another_reason_is_not_tried_again(gradebook: tuple[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    url, _path = gradebook
    calls = []

    def broken(self, *arguments):  # noqa: ANN001, ANN002
        calls.append(1)
        raise OperationalError("SELECT", {}, Exception("no such table: grade"))

    monkeypatch.setattr(Gradebook, "find_grade", broken)
    with pytest.raises(OperationalError, match="no such table"):
        retries.RetriedSaveAutoGrades().preprocess(_graded_notebook(), _resources(url))
    assert len(calls) == 1
