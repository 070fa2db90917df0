"""The grader empties a sandbox's writable folders from outside (`grading/sandbox/scratch.py`): between a student's
hidden parts, and after each grade cell's checks. The folders hold whatever the student's code left, so each test
leaves there what a hostile student would: links to the grader's files, trees too deep to walk by path, folders
made unreadable, more entries than the grader removes."""

from __future__ import annotations

import os
import stat
import time

import pytest

from transformer_course.grading.sandbox import scratch


@pytest.fixture
def folder(tmp_path):
    made = tmp_path / "scratch"
    made.mkdir()
    descriptor = os.open(made, os.O_RDONLY | os.O_DIRECTORY)
    yield made, [("/tmp", descriptor)]
    os.close(descriptor)
    for root, folders, _ in os.walk(tmp_path):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o700)


def test_emptying_never_follows_a_link_out(folder, tmp_path):
    made, folders = folder
    outside = tmp_path / "grader"
    outside.mkdir()
    (outside / "gradebook.db").write_text("keep")
    (made / "to_grader").symlink_to(outside)
    (made / "to_file").symlink_to(outside / "gradebook.db")
    (made / "to_root").symlink_to("/")
    scratch.empty(folders)
    assert os.listdir(made) == []
    assert (outside / "gradebook.db").read_text() == "keep"


def test_emptying_removes_deep_trees_and_folders_made_unreadable(folder):
    made, folders = folder
    deep = made
    for _ in range(3 * scratch.MAX_DEPTH + 5):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "leaf").write_text("x")
    locked = made / "locked" / "inner"
    locked.mkdir(parents=True)
    (locked / "file").write_text("x")
    locked.chmod(0)
    locked.parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    scratch.empty(folders)
    assert os.listdir(made) == []


def test_emptying_keeps_the_way_to_the_working_folder(folder):
    made, folders = folder
    (made / "work" / "notebook").mkdir(parents=True)
    (made / "work" / "notebook" / "note").write_text("x")
    (made / "work" / "other").write_text("x")
    (made / "note").write_text("x")
    scratch.empty(folders, {"/tmp": ["work", "notebook"]})
    assert os.listdir(made) == ["work"] and os.listdir(made / "work") == ["notebook"]
    assert os.listdir(made / "work" / "notebook") == []


def test_a_flood_of_entries_is_refused_not_walked_for_ever(folder):
    made, folders = folder
    for number in range(50):
        (made / f"f{number}").write_text("")
    with pytest.raises(scratch.TooMuch):
        scratch.empty(folders, limit=20)
    assert scratch.inventory(folders, limit=20) is None
    for number in range(600):
        (made / f"g{number}").write_text("")
    with pytest.raises(scratch.TooMuch):  # the notebook's deadline has passed: the caller ends the sandbox instead
        scratch.empty(folders, deadline=time.monotonic() - 1)


def test_restore_removes_what_is_new_or_changed_and_keeps_the_rest(folder):
    made, folders = folder
    (made / "kept").write_text("before")
    (made / "changed").write_text("before")
    (made / "cache").mkdir()
    (made / "cache" / "kept").write_text("before")
    kept = scratch.inventory(folders)
    (made / "changed").write_text("after, longer")
    (made / "new").write_text("x")
    (made / "cache" / "new").mkdir()
    scratch.restore(folders, kept)
    assert sorted(os.listdir(made)) == ["cache", "kept"] and os.listdir(made / "cache") == ["kept"]
