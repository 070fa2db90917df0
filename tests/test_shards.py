"""Shards on a cluster scheduler: `--shard slurm|kubernetes|auto` reads the scheduler's own variables,
every task gets its own slice and together they cover the class once; the recipes (Slurm batch script,
Kubernetes Indexed Job and its final scores Job, container image) hold together; scores.csv and report.html
written by several processes at once are always whole; kubernetes-run.sh against a stand-in kubectl (new Jobs
per run, pods that never start, Pod Security "baseline", a missing volume or secret). Mostly cheap: the array
grades for real, as processes and on a local Slurm cluster, in tests/test_postgres.py; here the guide's Slurm
lines run on a local Slurm cluster whose node cannot sandbox (slow: no grading, or one student); the image is
built where a builder and its base image can be had."""

import argparse
import csv
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
GUIDE_CLUSTER = ROOT / "website" / "instructor" / "cluster.md"
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
    assert '--secret-file "$SECRET_FILE"' in task and "--require-data" in task
    for path in CLUSTER.glob("*.s*"):
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, path
    guide = GUIDE_CLUSTER.read_text()  # the instructor's guide, where the README's recipe moved
    assert "autograde/cluster/slurm-scores.sbatch" in guide and "--dependency=afterany:$job" in guide


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
    # one secret for every pod: the Secret hidden-inputs, mounted read-only where SECRET_FILE says
    pod = spec["template"]["spec"]
    [mount] = [item for item in container["volumeMounts"] if environment["SECRET_FILE"].startswith(item["mountPath"])]
    [volume] = [item for item in pod["volumes"] if item["name"] == mount["name"]]
    assert mount["readOnly"] and volume["secret"]["secretName"] == "hidden-inputs"
    assert environment["SECRET_FILE"] == f"{mount['mountPath']}/hidden-inputs.key"
    # what bubblewrap needs inside a pod (website/instructor/cluster.md): namespaces, mounts and an unmasked /proc
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
    assert container["image"] == grading["containers"][0]["image"] and pod["volumes"][0] == grading["volumes"][0]
    assert pod["securityContext"]["runAsUser"] == image_user()
    same = {item["name"]: item for item in grading["containers"][0]["env"]}
    for item in container["env"]:
        assert item == same[item["name"]], item["name"]
    assert {"SUBMISSIONS", "CLASS_DIR", "GRADEBOOK_URL"} <= {item["name"] for item in container["env"]}


FAKE_KUBECTL = r"""#!/usr/bin/env bash
# A stand-in kubectl: logs its calls; a Job's conditions, its pods and events are read from files named by
# the Job's manifest name (grade-class, grade-class-scores), the last line of a sequence repeating.
here=$(dirname "$0")
echo "$*" >> "$here/calls"
base() { echo "$1" | sed -E 's/-[0-9]+$//'; }
next() {  # the next line of a sequence file; the last one stays
    local file="$here/$1"
    [ -e "$file" ] || return 0
    head -n 1 "$file"
    if [ "$(wc -l < "$file")" -gt 1 ]; then tail -n +2 "$file" > "$file.next" && mv "$file.next" "$file"; fi
}
case "$1 $2" in
    "get pvc"|"get secret")
        [ -e "$here/$2-$3" ] && { echo "$2/$3"; exit 0; }
        echo "Error from server (NotFound): $2 \"$3\" not found" >&2; exit 1 ;;
    "create -f")
        n=$(( $(cat "$here/created" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$here/created"
        case "$3" in
            kubernetes-job.yaml) echo "job.batch/grade-class-$n" ;;
            *) echo "job.batch/grade-class-scores-$n" ;;
        esac ;;
    "get job") next "$(base "$3").states" ;;
    "get pods")
        name=${4#job-name=}
        case "$*" in
            *metadata.name*) cat "$here/$(base "$name").pods" 2>/dev/null ;;
            *) next "$(base "$name").phases" ;;
        esac ;;
    "get events") name=${4##*involvedObject.name=}; cat "$here/$(base "$name").events" 2>/dev/null ;;
    "logs job/"*) echo "log of ${2#job/}: error: no student is graded in the gradebook" ;;
    "apply -f") echo "pod/grading-shared-copy created" ;;
    "delete pod"|"wait --for=condition=Ready") ;;
    "exec -i"|"exec grading-shared-copy")  # the copying pod: its /shared is the folder volume/ here
        while [ "$1" != "--" ]; do shift; done
        shift
        command=()
        for word in "$@"; do command+=("${word//\/shared/$here/volume}"); done
        exec "${command[@]}" ;;
esac
exit 0
"""


def fake_kubectl(folder: Path, files: dict[str, list[str]], volume: bool = True, secret: bool = True,
                 class_secret: bool = True) -> Path:
    """A `kubectl` on which kubernetes-run.sh is run: FILES are its answers (see FAKE_KUBECTL)."""
    folder.mkdir(exist_ok=True)
    for name, lines in files.items():
        (folder / name).write_text("".join(line + "\n" for line in lines))
    if volume:
        (folder / "pvc-grading-shared").touch()
    if secret:
        (folder / "secret-gradebook").touch()
    if class_secret:
        (folder / "secret-hidden-inputs").touch()
    script = folder / "kubectl"
    script.write_text(FAKE_KUBECTL)
    script.chmod(0o755)
    return script


def kubernetes_run(kubectl: Path, poll: str = "0", timeout: str = "600", cwd: Path | None = None,
                   **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CLUSTER / "kubernetes-run.sh"), poll], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "KUBECTL": str(kubectl), "START_TIMEOUT": timeout, **environment},
                          timeout=120)


def calls(kubectl: Path) -> list[str]:
    path = kubectl.parent / "calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("ending", ["Complete", "Failed"])
def test_kubernetes_run_creates_the_scores_job_once_after_the_grading_job_ended(tmp_path, ending):
    """kubernetes-run.sh (Kubernetes has no dependency between Jobs): the scores Job is made once, only
    after the grading Job reached a terminal condition, an index that failed for good included (as Slurm's
    afterany). kubectl is a stand-in that plays a Job's conditions; the script is the thing under test."""
    kubectl = fake_kubectl(tmp_path / "bin", {
        "grade-class.states": ["", "SuccessCriteriaMet " if ending == "Complete" else "FailureTarget ", f"{ending} "],
        "grade-class.phases": ["Pending", "Running"], "grade-class-scores.states": ["", "Complete "],
        "grade-class-scores.phases": ["Running"]})
    run = kubernetes_run(kubectl)
    assert run.returncode == 0, run.stderr
    made = [call for call in calls(kubectl) if call.startswith(("create", "apply"))]
    assert made == ["create -f kubernetes-job.yaml -o name", "create -f kubernetes-scores.yaml -o name"]
    log = calls(kubectl)
    gets = [index for index, call in enumerate(log) if call.startswith("get job grade-class-1 ")]
    assert len(gets) == 3 and gets[-1] < log.index("create -f kubernetes-scores.yaml -o name")
    assert f"job/grade-class-1: {ending}" in run.stdout and "job/grade-class-scores-2: Complete" in run.stdout


def test_kubernetes_run_again_grades_with_new_jobs(tmp_path):
    """A second run (next week's downloads) makes new Jobs: the manifests have generateName, and the script
    creates (never applies) them, so no finished Job of last week is found "unchanged" and Complete at once."""
    kubectl = fake_kubectl(tmp_path / "bin", {"grade-class.states": ["Complete "], "grade-class.phases": ["Succeeded"],
                                              "grade-class-scores.states": ["Complete "]})
    first, second = kubernetes_run(kubectl), kubernetes_run(kubectl)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "job/grade-class-1: Complete" in first.stdout and "job/grade-class-3: Complete" in second.stdout
    assert not [call for call in calls(kubectl) if call.startswith("apply")]
    for name in ("kubernetes-job.yaml", "kubernetes-scores.yaml"):
        metadata = yaml.safe_load((CLUSTER / name).read_text())["metadata"]
        assert "name" not in metadata and metadata["generateName"].endswith("-"), name


def test_pods_that_never_start_end_the_run_with_their_reason(tmp_path):
    """Pods Pending for ever (here: the volume's claim is unbound) make the script give up after START_TIMEOUT
    seconds with exit status 1, print each pod's reason, delete the Job and never make the scores Job."""
    reason = ('Unschedulable 0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. '
              'preemption: 0/1 nodes are available')
    kubectl = fake_kubectl(tmp_path / "bin", {"grade-class.states": [""], "grade-class.phases": ["Pending Pending"],
                                              "grade-class.pods": [f"grade-class-1-0-abcde: Pending; {reason}"]})
    run = kubernetes_run(kubectl, poll="0.2", timeout="2")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "no pod of job/grade-class-1 started in 2 s" in run.stderr and reason in run.stderr
    assert "delete job grade-class-1 --ignore-not-found" in calls(kubectl)
    assert "create -f kubernetes-scores.yaml -o name" not in calls(kubectl)


def test_a_namespace_under_pod_security_baseline_is_named_as_the_cause(tmp_path):
    """Under Pod Security "baseline" the Job never makes a pod and never fails: the script reads the Job's
    events after the timeout and points to the namespace of its own (kubernetes-namespace.yaml)."""
    refused = ('FailedCreate: Error creating: pods "grade-class-1-0-x" is forbidden: violates PodSecurity '
               '"baseline:latest": procMount (container "grader" must not set securityContext.procMount to '
               '"Unmasked"), seccompProfile (container "grader" must not set securityContext.seccompProfile.type '
               'to "Unconfined")')
    kubectl = fake_kubectl(tmp_path / "bin", {"grade-class.states": [""], "grade-class.events": [refused]})
    run = kubernetes_run(kubectl, poll="0.2", timeout="1")
    assert run.returncode == 1 and refused in run.stderr and "kubernetes-namespace.yaml" in run.stderr
    namespace = yaml.safe_load((CLUSTER / "kubernetes-namespace.yaml").read_text())
    assert namespace["kind"] == "Namespace"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert namespace["metadata"]["name"] in run.stderr


@pytest.mark.parametrize("missing", ["volume", "secret", "class secret"])
def test_a_missing_volume_or_secret_stops_the_run_before_any_job(tmp_path, missing):
    """The class's secret included: without the Secret hidden-inputs every pod would make a key of its own (ten
    shards on ten different hidden inputs, and a regrade on new ones)."""
    kubectl = fake_kubectl(tmp_path / "bin", {}, volume=missing != "volume", secret=missing != "secret",
                           class_secret=missing != "class secret")
    run = kubernetes_run(kubectl)
    assert run.returncode == 1
    assert {"volume": "kubernetes-volume.yaml", "secret": "create secret generic gradebook",
            "class secret": "create secret generic hidden-inputs --from-file=hidden-inputs.key="}[missing] in run.stderr
    assert not [call for call in calls(kubectl) if call.startswith(("create", "apply"))]


def test_the_weekly_run_copies_the_downloads_in_and_the_results_out(tmp_path):
    """DOWNLOADS (a relative path, as typed) is added to the volume's downloads before the grading Job, the
    earlier weeks' files kept; RESULTS gets scores.csv, report.html and the feedback after the scores Job; the
    copying pod is deleted after each copy."""
    kubectl = fake_kubectl(tmp_path / "bin", {"grade-class.states": ["Complete "], "grade-class.phases": ["Succeeded"],
                                              "grade-class-scores.states": ["Complete "]})
    volume = kubectl.parent / "volume"
    (volume / "downloads" / "week1").mkdir(parents=True)
    (volume / "downloads" / "week1" / "ada.ipynb").write_text("week 1")
    for name, text in (("scores.csv", "student\nada\n"), ("report.html", "<p>report</p>"),
                       ("feedback/ada/01/01.html", "feedback"), ("gradebook.db", "not copied")):
        (volume / "class" / name).parent.mkdir(parents=True, exist_ok=True)
        (volume / "class" / name).write_text(text)
    (tmp_path / "week2" / "blake").mkdir(parents=True)
    (tmp_path / "week2" / "blake" / "01.ipynb").write_text("week 2")
    run = kubernetes_run(kubectl, cwd=tmp_path, DOWNLOADS="week2", RESULTS="results/week2")
    assert run.returncode == 0, run.stderr
    assert (volume / "downloads" / "blake" / "01.ipynb").read_text() == "week 2"
    assert (volume / "downloads" / "week1" / "ada.ipynb").read_text() == "week 1"
    results = tmp_path / "results" / "week2"
    assert sorted(str(path.relative_to(results)) for path in results.rglob("*") if path.is_file()) == [
        "feedback/ada/01/01.html", "report.html", "scores.csv"]
    log = calls(kubectl)
    copy_in = next(index for index, call in enumerate(log) if call.startswith("exec -i grading-shared-copy"))
    copy_out = next(index for index, call in enumerate(log) if call.startswith("exec grading-shared-copy"))
    assert copy_in < log.index("create -f kubernetes-job.yaml -o name") < log.index(
        "create -f kubernetes-scores.yaml -o name") < copy_out
    assert log[-1].startswith("delete pod grading-shared-copy") and log[copy_in + 1].startswith("delete pod")


def test_downloads_that_are_no_folder_stop_the_run_before_any_job(tmp_path):
    kubectl = fake_kubectl(tmp_path / "bin", {})
    run = kubernetes_run(kubectl, DOWNLOADS=str(tmp_path / "nowhere"))
    assert run.returncode == 1 and "is not a folder" in run.stderr
    assert not [call for call in calls(kubectl) if call.startswith(("create", "apply"))]


def test_a_scores_job_that_fails_fails_the_run_with_its_log(tmp_path):
    kubectl = fake_kubectl(tmp_path / "bin", {"grade-class.states": ["Failed "], "grade-class.phases": ["Failed"],
                                              "grade-class-scores.states": ["Failed "],
                                              "grade-class-scores.phases": ["Failed"]})
    run = kubernetes_run(kubectl)
    assert run.returncode == 1 and "no student is graded" in run.stderr, run.stdout + run.stderr


def test_the_shared_volume_is_a_claim_every_pod_mounts():
    """The claim the Jobs mount is made by the recipe (kubernetes-volume.yaml), ReadWriteMany; a pod of its own
    (kubernetes-copy.yaml) copies the downloads onto it and the results off it as the grader's user."""
    [claim] = yaml.safe_load_all((CLUSTER / "kubernetes-volume.yaml").read_text())
    copier = yaml.safe_load((CLUSTER / "kubernetes-copy.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for name in ("kubernetes-job.yaml", "kubernetes-scores.yaml"):
        pod = yaml.safe_load((CLUSTER / name).read_text())["spec"]["template"]["spec"]
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert copier["kind"] == "Pod" and copier["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == \
        claim["metadata"]["name"]
    assert copier["spec"]["securityContext"]["runAsUser"] == image_user()


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

FAILING_BWRAP = """#!/bin/sh
echo "bwrap: No permissions to create new namespace, likely because the kernel does not allow \
non-privileged user namespaces." >&2
exit 1
"""


def multi30k_folder() -> str:
    from conftest import require_multi30k
    from transformer_course.data import multi30k

    require_multi30k()
    return os.environ.get(multi30k.ENVIRONMENT_VARIABLE) or str(multi30k.cache_directory())


@pytest.mark.slow
@pytest.mark.xdist_group("postgres")  # one local Slurm cluster at a time, beside test_postgres.py
def test_on_nodes_that_cannot_sandbox_every_task_fails_and_no_all_pending_scores_csv_is_written(tmp_path):
    """The guide's three Slurm lines, run as written (no PYTHON, no virtualenv on the PATH) on a single-node
    Slurm cluster whose node cannot create namespaces (a `bwrap` that fails as such a kernel makes it fail):
    both tasks fail (exit status 2, bubblewrap's message in their state files), and the scores job fails
    without replacing last week's scores.csv, naming each task and its reason. Before issue 31 the scores job
    completed and wrote a scores.csv in which everyone was pending."""
    from slurm_cluster import SlurmCluster, recipe, recipe_environment, submit
    from slurm_cluster import unavailable as slurm_unavailable

    reason = slurm_unavailable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run this test: {reason}")
        pytest.skip(reason)
    data = multi30k_folder()
    downloads, class_dir, bin_folder = tmp_path / "downloads", tmp_path / "class", tmp_path / "bin"
    (downloads / "ada").mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / "01_positional_encoding" / "01_positional_encoding.ipynb", downloads / "ada")
    class_dir.mkdir()
    (class_dir / "scores.csv").write_text("student,assignment,total\nada,01_positional_encoding,8\n")
    bin_folder.mkdir()
    (bin_folder / "bwrap").write_text(FAILING_BWRAP)
    (bin_folder / "bwrap").chmod(0o755)
    lines = recipe(GUIDE_CLUSTER, {"/shared/downloads": str(downloads), "/shared/class": str(class_dir),
                                   "/shared/multi30k": data,
                                   "/shared/secrets/hidden-inputs.key": str(tmp_path / "secrets" / "class.key"),
                                   "postgresql://grader@dbhost/gradebook": f"sqlite:///{tmp_path}/gradebook.db"})
    with SlurmCluster(cpus=8) as cluster:
        environment = recipe_environment(cluster, ROOT, bin_folder, tmp_path / "%x-%A_%a.log")
        array, scores = submit(lines, environment, ROOT)
        cluster.wait([array, scores], timeout=600)
        logs = {path.name: path.read_text(errors="replace") for path in tmp_path.glob("*.log")}
        assert cluster.state(array) == {"1": "FAILED", "2": "FAILED"}, logs
        assert cluster.state(scores) == {scores: "FAILED"}, logs
    [final] = [text for name, text in logs.items() if name.startswith("grade-class-scores-")]
    for task in (1, 2):
        assert re.search(rf"task slurm-task-{task} failed: exit status 2 on node .*bwrap: No permissions", final), final
    assert "scores.csv would read pending for everyone: it was not written" in final
    assert (class_dir / "scores.csv").read_text() == "student,assignment,total\nada,01_positional_encoding,8\n"
    states = sorted(path.name for path in (class_dir / "cluster-tasks" / f"slurm-{array}").iterdir())
    assert states == ["slurm-task-1.failed", "slurm-task-2.failed"]


def test_a_task_without_the_course_in_its_python_fails_at_once_and_says_so(tmp_path):
    """grade-shard.sh with a PYTHON that cannot import the course (what `python` on a node's PATH is without
    the virtualenv): exit status 1 before grading, the reason in the task's state file."""
    environment = {"PATH": os.environ["PATH"], "PYTHON": "/usr/bin/python3", "SUBMISSIONS": str(tmp_path),
                   "CLASS_DIR": str(tmp_path / "class"), "GRADEBOOK_URL": "sqlite:///unused.db",
                   "SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_JOB_ID": "77"}
    if subprocess.run(["/usr/bin/python3", "-c", "import transformer_course"], capture_output=True).returncode == 0:
        pytest.skip("the system python3 has the course installed")
    run = subprocess.run(["bash", str(CLUSTER / "grade-shard.sh")], env=environment, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1 and "cannot import the course" in run.stderr and "transformer_course" in run.stderr
    failed = (tmp_path / "class" / "cluster-tasks" / "slurm-77" / "slurm-task-3.failed").read_text()
    assert "exit status 1" in failed and "cannot import the course" in failed


def test_a_task_without_the_classs_secret_grades_nobody_and_says_so(tmp_path):
    """Every task must draw from one secret: grade-shard.sh without SECRET_FILE stops before grading (exit status
    1), the reason in its state file for the final step."""
    environment = {"PATH": os.environ["PATH"], "PYTHON": sys.executable, "SUBMISSIONS": str(tmp_path),
                   "CLASS_DIR": str(tmp_path / "class"), "GRADEBOOK_URL": "sqlite:///unused.db",
                   "SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_JOB_ID": "78"}
    run = subprocess.run(["bash", str(CLUSTER / "grade-shard.sh")], env=environment, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1 and "SECRET_FILE is not set" in run.stderr, run.stderr
    failed = (tmp_path / "class" / "cluster-tasks" / "slurm-78" / "slurm-task-3.failed").read_text()
    assert "SECRET_FILE is not set" in failed
    assert not (tmp_path / "class" / "gradebook.db").exists()


def test_the_task_uses_the_courses_virtualenv_without_being_told():
    """No PYTHON: grade-shard.sh takes the course's .venv (what `make setup` makes) and puts its bin folder
    first on the PATH, as activating it would (nbgrader runs its `alembic` from there)."""
    script = (CLUSTER / "grade-shard.sh").read_text()
    assert '"$course/.venv/bin/python"' in script and 'PATH="$(dirname "$PYTHON"):$PATH"' in script
    guide = GUIDE_CLUSTER.read_text()
    assert "MULTI30K_DIR=/shared/multi30k" in guide and "PYTHON=" not in guide.split("### Slurm")[1].split("###")[0]


def test_the_final_step_names_failed_and_lost_tasks_and_writes_no_all_pending_scores(tmp_path):
    """grade-shard.sh --scores-only when nobody is graded in the gradebook: it lists the newest run's tasks that
    failed (with their reason) or never reported an end, leaves the old scores.csv alone and exits with status 3.
    (The same on a real Slurm cluster: test_on_nodes_that_cannot_sandbox_...)"""
    class_dir = tmp_path / "class"
    old, newest = class_dir / "cluster-tasks" / "slurm-10", class_dir / "cluster-tasks" / "slurm-11"
    old.mkdir(parents=True)
    (old / "slurm-task-9.failed").write_text("exit status 1 on node n0: last week's problem\n")
    os.utime(old, (1, 1))
    newest.mkdir()
    (newest / "slurm-task-1.failed").write_text("exit status 2 on node n1: bwrap: Can't mount proc\n")
    (newest / "slurm-task-2.running").write_text("node n2, started 2026-11-28T10:00:00Z\n")
    (class_dir / "scores.csv").write_text("last week's\n")
    environment = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": sys.executable,
                   "SUBMISSIONS": str(tmp_path), "CLASS_DIR": str(class_dir),
                   "GRADEBOOK_URL": f"sqlite:///{tmp_path / 'gradebook.db'}"}
    run = subprocess.run(["bash", str(CLUSTER / "grade-shard.sh"), "--scores-only"], env=environment,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr
    assert "task slurm-task-1 failed: exit status 2 on node n1: bwrap: Can't mount proc" in run.stderr
    assert "task slurm-task-2 never reported an end" in run.stderr and "node n2" in run.stderr
    assert "last week's problem" not in run.stderr  # an older run's task is not this run's
    assert "scores.csv would read pending for everyone: it was not written" in run.stderr
    assert (class_dir / "scores.csv").read_text() == "last week's\n"


@pytest.mark.slow
@pytest.mark.xdist_group("postgres")  # one local Slurm cluster at a time, beside test_postgres.py
def test_when_some_tasks_cannot_sandbox_the_others_scores_are_written_and_the_failed_named(tmp_path):
    """The guide's Slurm lines on a cluster where task 2's node cannot create namespaces and task 1's can: task 1
    grades its slice, task 2 fails with bubblewrap's message, and the scores job (afterany) writes scores.csv
    with task 1's student graded and task 2's pending, and names task 2 and its reason in its log."""
    from slurm_cluster import SlurmCluster, recipe, recipe_environment, submit
    from slurm_cluster import unavailable as slurm_unavailable
    from transformer_course.grading.sandbox.isolation import bubblewrap_problem

    for reason in (slurm_unavailable(), bubblewrap_problem()):
        if reason:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI must run this test: {reason}")
            pytest.skip(reason)
    data = multi30k_folder()
    stage = "01_positional_encoding"
    students = {shard: next(name for name in STUDENTS if in_shard(name, (shard, 2))) for shard in (1, 2)}
    downloads, class_dir, bin_folder = tmp_path / "downloads", tmp_path / "class", tmp_path / "bin"
    for name in students.values():
        (downloads / name).mkdir(parents=True)
        shutil.copy(ROOT / "solutions" / stage / f"{stage}.ipynb", downloads / name)
    bin_folder.mkdir()
    real = shutil.which("bwrap")
    (bin_folder / "bwrap").write_text(  # task 2's node has no user namespaces (the grader starts bwrap with an
        # environment of its own: the task is read from the grader's)
        f"#!/bin/sh\ntr '\\0' '\\n' < /proc/$PPID/environ | grep -qx SLURM_ARRAY_TASK_ID=2 || exec {real} \"$@\"\n"
        + FAILING_BWRAP.split("\n", 1)[1])
    (bin_folder / "bwrap").chmod(0o755)
    lines = recipe(GUIDE_CLUSTER, {"/shared/downloads": str(downloads), "/shared/class": str(class_dir),
                                   "/shared/multi30k": data,
                                   "/shared/secrets/hidden-inputs.key": str(tmp_path / "secrets" / "class.key"),
                                   "postgresql://grader@dbhost/gradebook": f"sqlite:///{tmp_path}/gradebook.db"})
    with SlurmCluster(cpus=8) as cluster:
        environment = recipe_environment(cluster, ROOT, bin_folder, tmp_path / "%x-%A_%a.log",
                                         GRADE_OPTIONS=f"--assignment {stage} --timeout 60")
        array, scores = submit(lines, environment, ROOT)
        cluster.wait([array, scores], timeout=900)
        logs = {path.name: path.read_text(errors="replace") for path in tmp_path.glob("*.log")}
        assert cluster.state(array) == {"1": "COMPLETED", "2": "FAILED"}, logs
        assert cluster.state(scores) == {scores: "COMPLETED"}, logs
    [final] = [text for name, text in logs.items() if name.startswith("grade-class-scores-")]
    assert re.search(r"task slurm-task-2 failed: exit status 2 on node .*bwrap: No permissions", final), final
    assert "slurm-task-1" not in final
    with open(class_dir / "scores.csv", encoding="utf-8-sig") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert rows[students[1]]["status"] == "graded" and float(rows[students[1]]["autograded"]) > 0, rows
    assert rows[students[2]]["status"] == "pending", rows
