"""Grading a notebook with the checks of the release it came from (website/instructor/releasing.md).

Every student notebook names its release in its setup cell (`REPOSITORY, RELEASE = "...", "v0.1.0"`), and a
notebook opened before a new release keeps installing, and being checked by, its own. The batch command grades
with the release of the checkout it runs from; a notebook of another release is graded with that release's
checks when that release is *available*:

- a checkout of it at CLASS/releases/<tag>/ (e.g. `git worktree add CLASS/releases/v0.1.0 v0.1.0`), or
- the tag in the course's own git repository (the one the batch command runs from), which is unpacked (`git
  archive`) into <virtual environment>/course-releases/<tag>/course.

Its environment (`environment`) is a virtual environment beside the course's own, whose site-packages (and
Jupyter's share/ and etc/ folders) are the course's own as hard links (no copy; the sandbox shows a notebook's
runner only its own environment's site-packages) with that release's `transformer_course` in place of this
one's. Its notebooks are registered in a gradebook of its own (CLASS/releases/<tag>/class/) and graded there
by that release's own grading process (worker), in the same sandbox as every notebook; the scores, the
autograded notebook and the feedback page then join the class's gradebook and folders (`merge`), when the
release's graded cells (ids and points) are those of the class's release: scores.csv, the answer sheets and
the LMS files see one class. Otherwise, or when the release is not available, the notebook is graded with
this checkout's checks, and its row, its feedback page and the class report say so.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

from transformer_course.grading.gradebook.class_folder import file_lock
from transformer_course.grading.intake.submissions import notebook_release  # noqa: F401  (re-exported)

_OWN = re.compile(r"^(__editable__\.transformer_course.*|transformer_course.*\.(dist-info|egg-link|pth)|"
                  r"transformer_course)$")
_REGISTER = ("import sys; from pathlib import Path; "
             "from transformer_course.grading.gradebook.class_folder import Classroom; "
             "Classroom(Path(sys.argv[1]), Path(sys.argv[2])).prepare(sys.argv[3:])")


@dataclass(frozen=True)
class Environment:
    """A release ready to grade with: its checkout, its Python, its gradebook's folder."""

    tag: str
    course: Path
    python: Path
    class_dir: Path

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.class_dir / 'gradebook.db'}"


_locked = file_lock


class Releases:
    """The releases other than the running one that this class's notebooks come from."""

    def __init__(self, course: Path, class_dir: Path, store: Path | None = None) -> None:
        self.course, self.class_dir = course, class_dir
        self.store = store or Path(sys.prefix) / "course-releases"  # beside the course's site-packages (hard links)
        self.ready: dict[str, Environment | str] = {}  # tag -> its environment, or why there is none

    def checkout(self, tag: str) -> tuple[Path | None, str]:
        """(the release's checkout, "") or (None, why there is none)."""
        given = self.class_dir / "releases" / tag
        if (given / "src" / "transformer_course" / "__init__.py").is_file():
            return given, ""
        unpacked = self.store / tag / "course"
        if (unpacked / ".complete").is_file():
            return unpacked, ""
        verify = subprocess.run(["git", "-C", str(self.course), "rev-parse", "-q", "--verify",
                                 f"refs/tags/{tag}^{{commit}}"], capture_output=True, text=True, check=False)
        if verify.returncode != 0:
            return None, (f"no tag {tag} in the course's repository {self.course} and no checkout at "
                          f"{given}")
        archive = subprocess.run(["git", "-C", str(self.course), "archive", "--format=tar", tag],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            return None, f"git archive {tag} failed: {archive.stderr.decode(errors='replace').strip()[:200]}"
        temporary = Path(tempfile.mkdtemp(prefix=f".{tag}-", dir=self.store))
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as bundle:
            bundle.extractall(temporary, filter="data")
        (temporary / ".complete").write_text(tag, encoding="utf-8")
        shutil.rmtree(unpacked, ignore_errors=True)
        unpacked.parent.mkdir(parents=True, exist_ok=True)
        temporary.rename(unpacked)
        return unpacked, ""

    def python(self, tag: str, course: Path) -> tuple[Path | None, str]:
        """(the Python of a virtual environment with this machine's packages and the release's transformer_course,
        made once) or (None, why it cannot be made)."""
        venv = self.store / tag / "venv"
        marker = venv / ".complete"
        python = venv / "bin" / "python"
        if marker.is_file() and marker.read_text(encoding="utf-8") == str(course) and python.exists():
            return python, ""
        shutil.rmtree(venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        made = subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                              check=False)
        if made.returncode != 0:
            return None, f"a virtual environment for {tag} could not be made: {made.stderr.strip()[:200]}"
        target = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        try:
            for shared in ("share", "etc"):  # Jupyter's data and configuration (nbconvert's templates) live there
                if (Path(sys.prefix) / shared).is_dir():
                    shutil.copytree(Path(sys.prefix) / shared, venv / shared, copy_function=os.link, symlinks=True,
                                    dirs_exist_ok=True)
            for folder in site.getsitepackages():
                for entry in sorted(Path(folder).iterdir()):
                    if _OWN.match(entry.name) or (target / entry.name).exists():
                        continue
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.copytree(entry, target / entry.name, copy_function=os.link, symlinks=True)
                    else:
                        shutil.copy2(entry, target / entry.name, follow_symlinks=False) if entry.is_symlink() \
                            else os.link(entry, target / entry.name)
        except OSError as error:
            shutil.rmtree(venv, ignore_errors=True)
            return None, (f"its environment needs hard links to this one's packages ({error.strerror}): keep "
                          f"{self.store} on the file system of {sys.prefix}")
        (target / "transformer_course_release.pth").write_text(str(course / "src") + "\n", encoding="utf-8")
        marker.write_text(str(course), encoding="utf-8")
        return python, ""

    def environment(self, tag: str, assignment_ids: list[str]) -> Environment | str:
        """The release ready to grade with (its gradebook registered), or why it is not available."""
        if tag in self.ready:
            return self.ready[tag]
        with _locked(self.store / f".{tag}.lock"):
            course, why = self.checkout(tag)
            python, why = self.python(tag, course) if course is not None else (None, why)
            if python is None or course is None:
                self.ready[tag] = why
                return why
            environment = Environment(tag, course, python, self.class_dir / "releases" / tag / "class")
            stamp = environment.class_dir / "release" / ".registered"
            wanted = json.dumps(sorted(assignment_ids))
            if not stamp.is_file() or stamp.read_text(encoding="utf-8") != wanted:
                registered = subprocess.run([str(python), "-c", _REGISTER, str(course), str(environment.class_dir),
                                             *assignment_ids], capture_output=True, text=True, check=False,
                                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
                if registered.returncode != 0:
                    why = (f"its notebooks could not be registered: "
                           f"{' | '.join(registered.stderr.strip().splitlines()[-2:])[:300]}")
                    self.ready[tag] = why
                    return why
                stamp.write_text(wanted, encoding="utf-8")
        self.ready[tag] = environment
        return environment


def graded_cells(notebook: nbformat.NotebookNode) -> dict[str, tuple[float, bool]]:
    """{grade id: (points, graded by hand)} of a release notebook."""
    cells = {}
    for cell in notebook.cells:
        nbgrader = cell.get("metadata", {}).get("nbgrader", {})
        if nbgrader.get("grade") and nbgrader.get("grade_id"):
            cells[nbgrader["grade_id"]] = (float(nbgrader.get("points", 0)), bool(nbgrader.get("solution")))
    return cells


def differences(ours: nbformat.NotebookNode, theirs: nbformat.NotebookNode) -> list[str]:
    """How the graded cells of two releases of a notebook differ ([] when their ids and points are the same)."""
    mine, other = graded_cells(ours), graded_cells(theirs)
    found = [f"{grade_id} only in the class's" for grade_id in sorted(set(mine) - set(other))]
    found += [f"{grade_id} only in the notebook's" for grade_id in sorted(set(other) - set(mine))]
    found += [f"{grade_id} is worth {other[grade_id][0]:g} points, not {mine[grade_id][0]:g}"
              for grade_id in sorted(set(mine) & set(other)) if mine[grade_id] != other[grade_id]]
    return found


def merge(environment: Environment, class_dir: Path, db_url: str, student: str, assignment: str) -> None:
    """Copy one notebook's grading in the release's gradebook into the class's: every grade and comment, the
    autograded notebook and the feedback page (the release's graded cells are the class's: `differences`)."""
    from nbgrader.api import Gradebook

    with Gradebook(environment.db_url) as theirs, Gradebook(db_url) as ours:
        source = theirs.find_submission(assignment, student)
        ours.update_or_create_student(student)
        try:
            ours.find_submission(assignment, student)
        except Exception:  # noqa: BLE001  (nbgrader's MissingEntry)
            ours.add_submission(assignment, student)
        target = ours.find_submission(assignment, student)
        target.timestamp = source.timestamp
        for notebook in source.notebooks:
            for grade in notebook.grades:
                mine = ours.find_grade(grade.name, notebook.name, assignment, student)
                mine.auto_score, mine.needs_manual_grade = grade.auto_score, grade.needs_manual_grade
                mine.extra_credit = grade.extra_credit  # an extra-credit cell's points (SaveExtraCredit)
                if mine.manual_score is not None and grade.auto_score is None:
                    mine.needs_manual_grade = True  # graded by hand before: review, as nbgrader's autograde does
            for comment in notebook.comments:
                ours.find_comment(comment.name, notebook.name, assignment, student).auto_comment = comment.auto_comment
        ours.db.commit()
    for folder in ("autograded", "feedback"):
        origin = environment.class_dir / folder / student / assignment
        if origin.is_dir():
            destination = class_dir / folder / student / assignment
            shutil.rmtree(destination, ignore_errors=True)
            shutil.copytree(origin, destination)
    stylesheet = environment.class_dir / "feedback" / "feedback.css"
    if stylesheet.is_file() and not (class_dir / "feedback" / "feedback.css").is_file():
        shutil.copy2(stylesheet, class_dir / "feedback" / "feedback.css")


def note_cell(tag: str, running: str) -> nbformat.NotebookNode:
    """The cell put at the top of a notebook graded with another release's checks than its own: its feedback
    page says so to the student."""
    return nbformat.v4.new_markdown_cell(
        f"**Note from the grader.** This notebook is from release {tag} of the course. That release could not "
        f"be used for grading, so it was graded with the checks of release {running}, which may differ from the "
        "checks your notebook ran. Your instructor has been told.")
