"""Shards on a cluster scheduler: `--shard slurm|kubernetes|auto` reads the scheduler's own variables,
every task gets its own slice and together they cover the class once; the recipes (Slurm batch script,
Kubernetes Indexed Job, container image) hold together. Cheap: no grading here (the array is run for
real, as processes, in tests/test_postgres.py)."""

import argparse
import hashlib
import re
import subprocess

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


def test_the_slurm_script_runs_the_shared_task_command_as_an_array():
    script = (CLUSTER / "slurm.sbatch").read_text()
    assert re.search(r"^#SBATCH --array=\d+-\d+", script, re.MULTILINE)
    assert "autograde/cluster/grade-shard.sh" in script and "--scores-only" in script
    task = (CLUSTER / "grade-shard.sh").read_text()
    assert "--shard auto" in task and "--db-url" in task and "--require-sandbox" in task
    for path in (CLUSTER / "slurm.sbatch", CLUSTER / "grade-shard.sh"):
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, path


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


def test_the_image_copies_only_what_exists_and_installs_as_ci_does():
    """No Docker engine runs here, so the image is checked by reading its Dockerfile: every file it
    copies is in the repository, it installs bubblewrap, the torch that CI pins and the course with
    the grading and PostgreSQL extras, editable (the grader finds the course's folders from the package)."""
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
    assert "bubblewrap" in dockerfile and 'pip install --no-cache-dir -e ".[grading,postgres]"' in dockerfile
    assert ".[grading,postgres," in makefile  # CI installs the same extras (and dev)
    for needed in ("lessons/", "solutions/", "notebooks/", "autograde/nbgrader_config.py", "assets/checkpoint/"):
        assert needed in dockerfile, needed


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
    assert BatchGrader(ROOT, tmp_path / "class", tmp_path, jobs=2, assignment_ids=stages).split(stages) == [stages]
    assert one_at_a_time.split(["02_attention"]) == [["02_attention"]]
