"""Where the course lives and nbgrader's configuration for one class.

`ROOT` is the course repository (its lessons, solutions/, notebooks/ and autograde/); `nbgrader_config`
is the course's autograde/nbgrader_config.py pointed at one class folder and gradebook. Whoever renders pages
from it makes them inert first (`outputs.inert.configure`: student text sanitised after rendering): the
gradebook folder imports nothing of the others.
"""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parents[4]


def default_db_url(class_dir: Path) -> str:
    """The class folder's own sqlite gradebook."""
    return f"sqlite:///{class_dir.resolve() / 'gradebook.db'}"


def nbgrader_config(course: Path, class_dir: Path, db_url: str) -> Config:
    """The course's nbgrader_config.py with this class's folders and gradebook (pass it through
    `outputs.inert.configure` before rendering a page from it)."""
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course / "autograde")).load_config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.db_url = db_url
    config.CourseDirectory.release_directory = str(class_dir / "release")
    config.CourseDirectory.submitted_directory = str(class_dir / "submitted")
    config.CourseDirectory.autograded_directory = str(class_dir / "autograded")
    config.CourseDirectory.feedback_directory = str(class_dir / "feedback")
    return config
