"""Grade one student: real nbgrader autograde and generate_feedback, in a process of its own.

The batch grader starts one of these per student (so a crash stays with that student) and reads
the JSON it prints last. nbgrader is driven through its Python API, so its start-up cost is paid
once per student, not once per command. Each student's kernels run in the sandbox described in
`transformer_course.grading.sandbox`.

    python -m transformer_course.grading.worker --course ROOT --class-dir DIR --student NAME \
        --assignment 01_positional_encoding --assignment 02_attention [--db-url URL] [--no-sandbox]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nbgrader.converters import Autograde
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from transformer_course.data.multi30k import ENVIRONMENT_VARIABLE as MULTI30K_DIR
from transformer_course.grading.resilient import with_resilient_execution
from transformer_course.grading.sandbox import ENVIRONMENT_VARIABLE, Policy, install_kernelspec


def course_config(course: Path, class_dir: Path, db_url: str, timeout: int) -> Config:
    """The course's nbgrader_config.py with this class's folders and gradebook."""
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course / "autograde")).load_config()
    config.CourseDirectory.root = str(course)
    config.CourseDirectory.db_url = db_url
    config.CourseDirectory.release_directory = str(class_dir / "release")
    config.CourseDirectory.submitted_directory = str(class_dir / "submitted")
    config.CourseDirectory.autograded_directory = str(class_dir / "autograded")
    config.CourseDirectory.feedback_directory = str(class_dir / "feedback")
    config.Execute.timeout = timeout
    # a kernel that dies costs one cell, not the notebook; huge outputs are cut
    pipeline = config.Autograde.get("autograde_preprocessors") or Autograde.class_traits()[
        "autograde_preprocessors"].default()
    config.Autograde.autograde_preprocessors = with_resilient_execution(list(pipeline))
    return config


def sandbox_policy(course: Path, class_dir: Path, student: str, hide: list[str], memory_gb: float,
                   isolate: bool, data_folder: str | None) -> Policy:
    hidden = [str(class_dir), str(course / "solutions"), str(course / "autograde"), *hide]
    own = class_dir / "autograded" / student
    own.mkdir(parents=True, exist_ok=True)
    # the kernel reads the course package, its checkpoint and the data, wherever they lie (even under /tmp)
    visible = [str(course), *([data_folder] if data_folder else [])]
    return Policy(hide=hidden, writable=[str(own)], visible=visible, memory_bytes=int(memory_gb * 2**30),
                  isolate=isolate)


def kernel_start_problem(course: Path, class_dir: Path, hide: list[str], memory_gb: float,
                         isolate: bool, environment: dict[str, str]) -> str | None:
    """None when a kernel can start under this class's sandbox and import the checks, else stderr's tail.

    Run once before a batch: a sandbox that hides the Python environment (or a memory limit too low
    for torch) would otherwise fail every student, one by one."""
    policy = sandbox_policy(course, class_dir, ".preflight", hide, memory_gb, isolate,
                            environment.get(MULTI30K_DIR))
    command = [sys.executable, "-m", "transformer_course.grading.sandbox", "--", sys.executable, "-c",
               "import ipykernel, transformer_course.checks.framework"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                                env={**environment, ENVIRONMENT_VARIABLE: policy.to_environment()})
    finally:
        shutil.rmtree(policy.writable[0], ignore_errors=True)
    if result.returncode == 0:
        return None
    return " | ".join(result.stderr.strip().splitlines()[-3:]) or f"exit status {result.returncode}"


def grade(arguments: argparse.Namespace) -> dict[str, object]:
    course, class_dir = arguments.course.resolve(), arguments.class_dir.resolve()
    db_url = arguments.db_url or f"sqlite:///{class_dir / 'gradebook.db'}"
    config = course_config(course, class_dir, db_url, arguments.timeout)
    # Kernels talk over Unix sockets in a short private folder (socket paths are limited to 108 bytes).
    runtime = Path(tempfile.mkdtemp(prefix="course-kernel-"))
    config.KernelManager.transport = "ipc"
    config.KernelManager.connection_file = str(runtime / "kernel.json")
    os.environ["JUPYTER_PATH"] = str(install_kernelspec(class_dir / ".kernelspec" / arguments.student))
    policy = sandbox_policy(course, class_dir, arguments.student, arguments.hide, arguments.memory_gb,
                            not arguments.no_sandbox, os.environ.get(MULTI30K_DIR))
    os.environ[ENVIRONMENT_VARIABLE] = policy.to_environment()
    os.environ.setdefault("MPLBACKEND", "Agg")

    from nbgrader.apps import NbGraderAPI  # imported late: it is slow and reads the environment

    api = NbGraderAPI(config=config)
    report: dict[str, object] = {}
    try:
        for assignment in arguments.assignment:
            started = time.perf_counter()
            result = api.autograde(assignment, arguments.student, force=True, create=True)
            if result["success"]:
                result = api.generate_feedback(assignment, arguments.student, force=True)
            report[assignment] = {"success": bool(result["success"]),
                                  "error": "" if result["success"] else _last_lines(result),
                                  "seconds": round(time.perf_counter() - started, 1)}
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    return report


def _last_lines(result: dict[str, str]) -> str:
    text = "\n".join(part for part in (result.get("error"), result.get("log")) if part)
    return "\n".join(text.strip().splitlines()[-8:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--course", type=Path, required=True)
    parser.add_argument("--class-dir", type=Path, required=True)
    parser.add_argument("--student", required=True)
    parser.add_argument("--assignment", action="append", required=True)
    parser.add_argument("--db-url")
    parser.add_argument("--timeout", type=int, default=120, help="seconds a cell may run")
    parser.add_argument("--memory-gb", type=float, default=6.0, help="address space a kernel may use")
    parser.add_argument("--hide", action="append", default=[], help="another folder the kernel must not see")
    parser.add_argument("--no-sandbox", action="store_true")
    arguments = parser.parse_args(argv)
    report = grade(arguments)
    sys.stdout.write("\n" + json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
