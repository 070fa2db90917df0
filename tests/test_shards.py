"""Shards on a cluster scheduler: `--shard slurm|kubernetes|auto` reads the scheduler's own variables,
every task gets its own slice and together they cover the class once; the recipes (Slurm batch script,
Kubernetes Indexed Job and its final scores Job, container image) hold together; scores.csv and report.html
written by several processes at once are always whole. Cheap: no grading here (the array is run for real,
as processes and on a local Slurm cluster, in tests/test_postgres.py); the image is built where a builder
and its base image can be had."""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from transformer_course.grading.classroom.batch import in_shard, parse_shard, scheduler_shard

CLUSTER = ROOT / "autograde" / "cluster"
STUDENTS = [f"student{number:04d}" for number in range(300)]


def slurm(task: int, first: int, last: int, step: int = 1) -> dict[str, str]:
    count = (last - first) // step + 1
    return {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": str(first), "SLURM_ARRAY_TASK_MAX": str(last),
            "SLURM_ARRAY_TASK_STEP": str(step), "SLURM_ARRAY_TASK_COUNT": str(count), "SLURM_ARRAY_JOB_ID": "77"}


def covers_the_class_once(shards: list[tuple[int, int]]) -> None:
    assert sorted(index for index, _ in shards) == list(range(1, len(shards) + 1))
    for student in STUDENTS:
        assert sum(in_shard(student, shard) for shard in shards) == 1, student


@pytest.mark.parametrize(("first", "last", "step"), [(0, 3, 1), (1, 4, 1), (5, 8, 1), (0, 6, 2), (1, 10, 3)])
def test_a_slurm_array_from_any_first_id_and_step_covers_the_class_once(first, last, step):
    shards = [scheduler_shard("slurm", slurm(task, first, last, step)) for task in range(first, last + 1, step)]
    assert {count for _, count in shards} == {len(shards)}
    covers_the_class_once(shards)


def test_kubernetes_indexes_are_zero_based_and_need_the_completions_count():
    shards = [scheduler_shard("kubernetes", {"JOB_COMPLETION_INDEX": str(i), "JOB_COMPLETIONS": "3"}) for i in range(3)]
    assert shards == [(1, 3), (2, 3), (3, 3)]
    covers_the_class_once(shards)
    with pytest.raises(argparse.ArgumentTypeError, match="JOB_COMPLETIONS"):
        scheduler_shard("kubernetes", {"JOB_COMPLETION_INDEX": "0"})
    with pytest.raises(argparse.ArgumentTypeError, match="not in 0..2"):
        scheduler_shard("kubernetes", {"JOB_COMPLETION_INDEX": "3", "JOB_COMPLETIONS": "3"})


def test_auto_picks_the_scheduler_and_outside_an_array_grades_the_whole_class():
    assert scheduler_shard("auto", slurm(0, 0, 1)) == (1, 2)
    assert scheduler_shard("auto", {"JOB_COMPLETION_INDEX": "1", "JOB_COMPLETIONS": "2"}) == (2, 2)
    assert scheduler_shard("auto", {}) is None


@pytest.mark.parametrize("environment", [
    {**slurm(3, 0, 9), "SLURM_ARRAY_TASK_COUNT": "4"},  # --array=0,3,7,9: not a range
    {key: value for key, value in slurm(1, 1, 4).items() if key != "SLURM_ARRAY_TASK_MIN"},  # no first id
    {**slurm(1, 0, 4, 2)},  # id 1 is not on the step of 0-4:2
    {**slurm(2, 0, 3), "SLURM_ARRAY_TASK_ID": "two"},
])
def test_an_array_the_shards_cannot_cover_is_refused_with_the_reason(environment):
    with pytest.raises(argparse.ArgumentTypeError, match="--shard slurm"):
        scheduler_shard("slurm", environment)


def test_the_command_line_takes_k_of_n_and_scheduler_names(monkeypatch):
    assert parse_shard("2/3") == (2, 3)
    for wrong in ("0/3", "4/3", "half", "1/"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shard(wrong)
    for name, value in slurm(7, 5, 8).items():
        monkeypatch.setenv(name, value)
    assert parse_shard("slurm") == parse_shard("auto") == (3, 4)


def sbatch_options(path):
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", path.read_text(), re.MULTILINE))


def test_the_slurm_scripts_grade_as_an_array_and_write_the_scores_once():
    """The grading script is an array; the final scores step is a script of its own with no array (a
    `--scores-only` run of the array's script would inherit its ten tasks), run after the array ends."""
    grading, final = sbatch_options(CLUSTER / "slurm.sbatch"), sbatch_options(CLUSTER / "slurm-scores.sbatch")
    assert re.fullmatch(r"\d+-\d+", grading["array"]) and "array" not in final
    assert "autograde/cluster/grade-shard.sh" in (CLUSTER / "slurm.sbatch").read_text()
    assert "grade-shard.sh --scores-only" in (CLUSTER / "slurm-scores.sbatch").read_text()
    assert "%A_%a" in grading["output"] and "%j" in final["output"]  # one log per task, one for the final job
    task = (CLUSTER / "grade-shard.sh").read_text()
    assert "--shard auto" in task and "--db-url" in task and "--require-sandbox" in task
    for path in CLUSTER.glob("*.s*"):
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, path
    readme = (ROOT / "README.md").read_text()
    assert "autograde/cluster/slurm-scores.sbatch" in readme and "--dependency=afterany:$job" in readme


def gigabytes(text: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([GM])i?", text).groups()
    return float(number) / (1024 if unit == "M" else 1)


def test_the_recipes_size_memory_for_their_students():
    """JOBS students at MEMORY_GB each, plus 2 GB for the grader, fit the memory each recipe asks for. (The
    reference solutions of all eight stages grade with full points at --memory-gb 2 and at 3.)"""
    task = (CLUSTER / "grade-shard.sh").read_text()
    default = float(re.search(r'--memory-gb "\$\{MEMORY_GB:-([\d.]+)\}"', task).group(1))
    slurm = sbatch_options(CLUSTER / "slurm.sbatch")
    assert int(slurm["cpus-per-task"]) * default + 2 <= gigabytes(slurm["mem"])  # JOBS = the task's CPUs
    container = yaml.safe_load((CLUSTER / "kubernetes-job.yaml").read_text())["spec"]["template"]["spec"][
        "containers"][0]
    environment = {item["name"]: item.get("value") for item in container["env"]}
    assert int(environment["JOBS"]) * float(environment["MEMORY_GB"]) + 2 <= gigabytes(
        container["resources"]["limits"]["memory"])
    assert int(environment["JOBS"]) <= int(container["resources"]["limits"]["cpu"])


def test_the_kubernetes_job_is_indexed_and_says_its_completions_count():
    job = yaml.safe_load((CLUSTER / "kubernetes-job.yaml").read_text())
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    container = spec["template"]["spec"]["containers"][0]
    environment = {item["name"]: item.get("value") for item in container["env"]}
    assert environment["JOB_COMPLETIONS"] == str(spec["completions"])
    assert {"SUBMISSIONS", "CLASS_DIR", "GRADEBOOK_URL"} <= set(environment)
    assert "autograde/cluster/grade-shard.sh" in container["command"]
    # what bubblewrap needs inside a pod (README): namespaces, mounts and an unmasked /proc
    assert container["securityContext"]["procMount"] == "Unmasked"
    assert container["securityContext"]["seccompProfile"]["type"] == "Unconfined"
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == image_user()


def test_the_kubernetes_scores_job_runs_once_with_the_grading_jobs_volume_and_gradebook():
    grading = yaml.safe_load((CLUSTER / "kubernetes-job.yaml").read_text())["spec"]["template"]["spec"]
    job = yaml.safe_load((CLUSTER / "kubernetes-scores.yaml").read_text())
    spec = job["spec"]
    assert job["kind"] == "Job" and "completionMode" not in spec and spec["completions"] == spec["parallelism"] == 1
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][-2:] == ["autograde/cluster/grade-shard.sh", "--scores-only"]
    assert container["image"] == grading["containers"][0]["image"] and pod["volumes"] == grading["volumes"]
    assert pod["securityContext"]["runAsUser"] == image_user()
    same = {item["name"]: item for item in grading["containers"][0]["env"]}
    for item in container["env"]:
        assert item == same[item["name"]], item["name"]
    assert {"SUBMISSIONS", "CLASS_DIR", "GRADEBOOK_URL"} <= {item["name"] for item in container["env"]}


def fake_kubectl(folder, states):
    """A `kubectl` that logs its calls and answers `get job NAME` with the next condition of STATES[NAME]."""
    folder.mkdir()
    for name, sequence in states.items():
        (folder / f"{name}.states").write_text("\n".join(sequence) + "\n")
    script = folder / "kubectl"
    script.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {folder}/calls
if [ "$1" = get ]; then
    file={folder}/$3.states
    head -n 1 "$file"
    tail -n +2 "$file" > "$file.next"; [ -s "$file.next" ] && mv "$file.next" "$file" || rm -f "$file.next"
fi
""")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("ending", ["Complete", "Failed"])
def test_kubernetes_run_applies_the_scores_job_once_after_the_grading_job_ended(tmp_path, ending):
    """kubernetes-run.sh (Kubernetes has no dependency between Jobs): the scores Job is applied once, only
    after the grading Job reached a terminal condition, an index that failed for good included (as Slurm's
    afterany). kubectl is a stand-in that plays a Job's conditions; the script is the thing under test."""
    kubectl = fake_kubectl(tmp_path / "bin", {
        "grade-class": ["", "SuccessCriteriaMet " if ending == "Complete" else "FailureTarget ", f"{ending} "],
        "grade-class-scores": ["", "Complete "]})
    run = subprocess.run(["bash", str(CLUSTER / "kubernetes-run.sh"), "0"], capture_output=True, text=True,
                         env={**os.environ, "KUBECTL": str(kubectl)}, timeout=60)
    assert run.returncode == 0, run.stderr
    calls = (tmp_path / "bin" / "calls").read_text().splitlines()
    applied = [index for index, call in enumerate(calls) if call.startswith("apply")]
    assert [calls[index] for index in applied] == ["apply -f kubernetes-job.yaml", "apply -f kubernetes-scores.yaml"]
    gets = [index for index, call in enumerate(calls) if call.startswith("get job grade-class ")]
    assert len(gets) == 3 and gets[-1] < applied[1]  # the scores Job only after the grading Job's terminal state
    assert f"job/grade-class: {ending}" in run.stdout and "job/grade-class-scores: Complete" in run.stdout


def image_user() -> int:
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    return int(re.search(r"useradd --uid (\d+)", dockerfile).group(1))


def test_the_image_copies_only_what_exists_and_installs_cpu_torch_as_an_unprivileged_user():
    """Read from the Dockerfile (the image itself is built by the next test where a builder can): every file
    it copies is in the repository; torch is the version CI pins, from PyTorch's CPU index (or a folder of
    wheels), and the build fails if a CUDA build or an NVIDIA package got in; the course is installed with
    the grading and PostgreSQL extras, editable (the grader finds the course's folders from the package);
    bubblewrap; and the image runs as an unprivileged user, the one the Kubernetes manifests name."""
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    copies = re.findall(r"^COPY\s+(.+)$", dockerfile, re.MULTILINE)
    assert copies
    for line in copies:
        *sources, _ = line.split()
        for source in sources:
            assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"
    makefile = (ROOT / "Makefile").read_text()
    torch = re.search(r"^TORCH_SPEC \?= (\S+)", makefile, re.MULTILINE).group(1)
    assert f"ARG TORCH_SPEC={torch}" in dockerfile
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in dockerfile
    assert '--index-url $TORCH_INDEX' in dockerfile and "torch.version.cuda is None" in dockerfile
    assert "grep -iE '^(nvidia|cuda|triton)'" in dockerfile
    assert "bubblewrap" in dockerfile and 'pip install --no-cache-dir -e ".[grading,postgres]"' in dockerfile
    assert ".[grading,postgres," in makefile  # CI installs the same extras (and dev)
    for needed in ("lessons/", "solutions/", "notebooks/", "autograde/nbgrader_config.py", "assets/checkpoint/"):
        assert needed in dockerfile, needed
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users and users[-1] not in ("root", "0") and image_user() != 0
    assert dockerfile.index(f"USER {users[-1]}") > dockerfile.rindex("RUN ")  # nothing runs as root after it


def test_the_course_after_cpu_torch_brings_no_cuda_package():
    """The environment the tests run in was made as the image is (the pinned CPU torch first, then the course
    with its extras): nothing in it is a CUDA build or an NVIDIA library."""
    import importlib.metadata

    import torch

    names = sorted({(dist.metadata["Name"] or "").lower() for dist in importlib.metadata.distributions()})
    assert not [name for name in names if name.startswith(("nvidia", "cuda", "triton"))], names
    assert torch.version.cuda is None and {"psycopg", "psycopg2-binary", "nbgrader"} <= set(names)


BUILDERS = [name for name in ("buildah", "podman") if shutil.which(name)]
BASE_IMAGE = re.search(r"^FROM\s+(\S+)", (CLUSTER / "Dockerfile").read_text(), re.MULTILINE).group(1)


@pytest.mark.slow
def test_the_image_builds_and_runs_unprivileged_with_cpu_torch(tmp_path):
    """Built for real where Debian's buildah or podman is (no daemon needed) and the base image can be had;
    skipped with the reason elsewhere. A registry-less machine (like the course's own) says so."""
    if not BUILDERS:
        pytest.skip("no container builder (Debian: apt install buildah, or podman)")
    builder = BUILDERS[0]
    storage = ["--storage-driver", "vfs", "--root", str(tmp_path / "root"), "--runroot", str(tmp_path / "run")]
    pull = subprocess.run([builder, *storage, "pull", BASE_IMAGE], capture_output=True, text=True, timeout=600)
    if pull.returncode != 0:
        pytest.skip(f"{builder} cannot fetch the base image {BASE_IMAGE} here: "
                    f"{(pull.stderr.strip().splitlines() or ['?'])[-1][:200]}")
    build = [builder, *storage, "build" if builder == "podman" else "bud", "--isolation", "chroot", "-f",
             str(CLUSTER / "Dockerfile"), "-t", "course-grader-test", str(ROOT)]
    built = subprocess.run(build, capture_output=True, text=True, timeout=3600)
    assert built.returncode == 0, built.stderr[-3000:]
    probe = ("import os, torch, importlib.metadata as m; assert os.getuid() != 0; assert torch.version.cuda is None; "
             "assert not [d for d in m.distributions() if (d.metadata['Name'] or '').lower().startswith('nvidia')]")
    if builder == "podman":  # the image's own user (USER), as a cluster runs it
        command = [builder, *storage, "run", "--rm", "course-grader-test", "python", "-c", probe]
    else:
        container = subprocess.run([builder, *storage, "from", "course-grader-test"], capture_output=True, text=True,
                                   check=True).stdout.strip()
        command = [builder, *storage, "run", "--isolation", "chroot", "--user", str(image_user()), container, "--",
                   "python", "-c", probe]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]


def test_shards_split_by_a_stable_hash_of_the_student_id():
    """The slice of a student never depends on the machine (Python's hash() would)."""
    expected = int(hashlib.sha256(b"ada").hexdigest(), 16) % 4 + 1
    assert in_shard("ada", (expected, 4)) and not in_shard("ada", (expected % 4 + 1, 4))


def test_spare_cores_split_one_students_notebooks_heaviest_first(tmp_path, monkeypatch):
    from transformer_course.grading.classroom.batch import BatchGrader

    stages = ["01_positional_encoding", "02_attention", "03_blocks", "04_transformer", "05_training", "06_decoding"]
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    one_at_a_time = BatchGrader(ROOT, tmp_path / "class", tmp_path, jobs=1, assignment_ids=stages)
    groups = one_at_a_time.split(stages)
    assert len(groups) == 2 and sorted(a for group in groups for a in group) == stages
    assert not {"05_training", "06_decoding"} <= set(groups[0])  # the two heaviest in different groups
    loads = [sum(one_at_a_time.cost(a) for a in group) for group in groups]
    assert max(loads) - min(loads) <= min(one_at_a_time.cost(a) for a in stages)
    assert BatchGrader(ROOT, tmp_path / "class", tmp_path, jobs=2, assignment_ids=stages).split(stages) == [stages]
    assert one_at_a_time.split(["02_attention"]) == [["02_attention"]]


def test_a_split_the_first_placement_leaves_uneven_is_evened_by_swaps():
    """Heaviest first into the lightest group puts 3+2+2 against 3+2; swapping a 3 for a 2 makes it 6 against 6."""
    from transformer_course.grading.classroom.batch import _balanced

    weight = {"a": 3.0, "b": 3.0, "c": 2.0, "d": 2.0, "e": 2.0}
    groups = _balanced([["a", "c", "e"], ["b", "d"]], weight)
    assert sorted(sum(weight[n] for n in group) for group in groups) == [6.0, 6.0]
    assert sorted(n for group in groups for n in group) == ["a", "b", "c", "d", "e"]


WRITER = """
import sys
from pathlib import Path
from transformer_course.grading.outputs.files import replace_atomically
path, me = Path(sys.argv[1]), sys.argv[2]
for round in range(25):
    replace_atomically(path, lambda handle: [handle.write(f"{me},{round},{line}\\n") for line in range(1000)])
"""


def test_scores_csv_and_the_report_written_by_several_machines_at_once_are_always_whole(tmp_path):
    """Four writers (as four machines sharing the class folder) replace one file 25 times each while it is
    read: every read sees one writer's complete file, never a mix or a half, and no temporary file is left.
    scores.csv (the batch command, answers import) and report.html are written this way."""
    path = tmp_path / "scores.csv"
    path.write_text("start\n")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(number)]) for number in range(4)]
    reads = 0
    while any(writer.poll() is None for writer in writers):
        lines = path.read_text().splitlines()
        if lines != ["start"]:
            assert len(lines) == 1000 and len({line.rsplit(",", 1)[0] for line in lines}) == 1, "a mixed file"
            reads += 1
    assert all(writer.wait() == 0 for writer in writers) and reads > 5
    assert [item.name for item in tmp_path.iterdir()] == ["scores.csv"]
    from transformer_course.grading.classroom import batch
    from transformer_course.grading.outputs import answers, report

    for module in (batch, answers, report):
        source = Path(module.__file__).read_text()
        assert "replace_atomically(" in source or "write_text_atomically(" in source, module.__name__
        assert ".part" not in source and "os.getpid()" not in source, module.__name__


def test_a_submission_still_being_graded_on_another_machine_is_no_zero(tmp_path):
    """nbgrader writes a submission's rows when it starts grading it and the scores at the end of each notebook:
    a machine that writes scores.csv meanwhile (another shard's student, being graded now) must not read 0
    points and call the student graded. Such cells read "not scored yet"; batch.write_csv keeps the student
    pending until every cell is scored."""
    from nbgrader.api import Gradebook

    from transformer_course.grading.outputs import scores

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(url) as gradebook:
        gradebook.add_assignment("01_positional_encoding")
        gradebook.add_notebook("01_positional_encoding", "01_positional_encoding")
        gradebook.add_grade_cell("pe_forward", "01_positional_encoding", "01_positional_encoding", max_score=2,
                                 cell_type="code")
        gradebook.add_student("dana")
        gradebook.add_submission("01_positional_encoding", "dana")
    [row] = scores.score_rows(url)
    assert row["pe_forward"] == scores.NOT_SCORED_YET and row["autograded"] == 0 and row["autograded_max"] == 2
    assert not scores.scored(row)
    with Gradebook(url) as gradebook:
        grade = gradebook.find_grade("pe_forward", "01_positional_encoding", "01_positional_encoding", "dana")
        grade.auto_score = 2
        gradebook.db.commit()
    [row] = scores.score_rows(url)
    assert row["pe_forward"] == 2 and row["autograded"] == 2 and scores.scored(row)
