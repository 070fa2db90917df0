"""The Kubernetes recipe (autograde/cluster/kubernetes-run.sh and its manifests) on a real single-node cluster,
where one can start: kind (https://kind.sigs.k8s.io) with a running Docker daemon, and the grading image built
from autograde/cluster/Dockerfile as `course-grader` in that daemon (kind loads it onto its node).

Elsewhere the test is skipped with the reason. On the machines the course is developed on it always is:
neither Debian (bookworm) nor PyPI packages kind, k3s or a kubelet, no Docker daemon runs there, and no
container registry can be reached for kind's node image or the grading image's base; tests/test_shards.py
runs kubernetes-run.sh against a stand-in kubectl instead. This test has therefore never run.

What it does: a kind cluster of one node; the recipe's manifests as the guide tells an instructor to edit
them (the image's name, and here: two indexes of one CPU, a ReadWriteOnce claim, since kind's storage offers
no ReadWriteMany on its one node, and an sqlite gradebook on the shared volume instead of PostgreSQL); the
class's secret made by the course's command and given as the Secret hidden-inputs; Multi30k copied onto the
volume through the recipe's copy pod; then kubernetes-run.sh twice, as two weeks: week 1's downloads (two
students) and week 2's (a third) copied in by DOWNLOADS, the results copied out by RESULTS. Both runs end
with exit status 0, with Jobs of their own, and week 2's scores.csv lists every student graded."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from conftest import ROOT
from quality.examples import student_submissions

CLUSTER = ROOT / "autograde" / "cluster"
IMAGE = os.environ.get("COURSE_GRADER_IMAGE", "course-grader")
STAGE = "01_positional_encoding"


def kind_problem() -> str | None:
    if shutil.which("kind") is None:
        return ("no single-node Kubernetes cluster can start here: kind is not installed (neither Debian bookworm "
                "nor PyPI packages kind, k3s or a kubelet)")
    if shutil.which("docker") is None or subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "kind needs a running Docker daemon, and none runs here"
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        return f"the grading image {IMAGE} is not in Docker (docker build -f autograde/cluster/Dockerfile -t {IMAGE} .)"
    return None


def patched(name: str, folder: Path) -> None:
    """A recipe manifest with the edits an instructor makes (the image) and the test's small class."""
    documents = list(yaml.safe_load_all((CLUSTER / name).read_text()))
    for document in documents:
        if document["kind"] == "PersistentVolumeClaim":
            document["spec"]["accessModes"] = ["ReadWriteOnce"]
            continue
        pod = pod_of(document)
        for container in pod["containers"]:
            container["image"], container["imagePullPolicy"] = IMAGE, "Never"
            if document["kind"] == "Job" and document["spec"].get("completionMode") == "Indexed":
                container["resources"] = {"requests": {"cpu": "1", "memory": "4Gi"},
                                          "limits": {"cpu": "1", "memory": "4Gi"}}
                for item in container["env"]:
                    item.update({"JOB_COMPLETIONS": {"value": "2"}, "JOBS": {"value": "1"},
                                 "MEMORY_GB": {"value": "2"}}.get(item["name"], {}))
                container["env"].append({"name": "GRADE_OPTIONS", "value": f"--assignment {STAGE}"})
        if document["kind"] == "Job" and document["spec"].get("completionMode") == "Indexed":
            document["spec"]["completions"] = document["spec"]["parallelism"] = 2
    (folder / name).write_text(yaml.safe_dump_all(documents))


@pytest.mark.slow
def test_the_kubernetes_recipe_grades_a_class_on_a_kind_cluster(tmp_path):
    problem = kind_problem()
    if problem:
        pytest.skip(problem)
    from conftest import require_multi30k
    from transformer_course.data import multi30k

    require_multi30k()
    data = os.environ.get(multi30k.ENVIRONMENT_VARIABLE) or str(multi30k.cache_directory())
    downloads = tmp_path / "downloads"
    kinds = student_submissions(ROOT, [STAGE])
    for week, name in ((1, "ada"), (1, "blake"), (2, "chen")):
        (downloads / f"week{week}" / name).mkdir(parents=True)
        nbformat.write(kinds[name][STAGE], downloads / f"week{week}" / name / f"{STAGE}.ipynb")
    secret = tmp_path / "keys" / "hidden-inputs.key"
    subprocess.run([sys.executable, "-m", "transformer_course.grading.sandbox.hidden_inputs", "--secret-file",
                    str(secret)], check=True)
    recipe = tmp_path / "cluster"
    recipe.mkdir()
    shutil.copy(CLUSTER / "kubernetes-run.sh", recipe)
    for name in MANIFESTS:
        patched(name, recipe)
    cluster, kubeconfig = f"course-test-{os.getpid()}", tmp_path / "kubeconfig"
    subprocess.run(["kind", "create", "cluster", "--name", cluster, "--kubeconfig", str(kubeconfig), "--wait", "300s"],
                   check=True, timeout=900)
    kubectl = ["kubectl", "--kubeconfig", str(kubeconfig)]
    try:
        subprocess.run(["kind", "load", "docker-image", IMAGE, "--name", cluster], check=True, timeout=900)
        subprocess.run([*kubectl, "apply", "-f", str(recipe / "kubernetes-volume.yaml")], check=True)
        subprocess.run([*kubectl, "apply", "-f", str(recipe / "kubernetes-copy.yaml")], check=True)
        subprocess.run([*kubectl, "wait", "--for=condition=Ready", "pod/grading-shared-copy", "--timeout=10m"],
                       check=True, timeout=700)
        packed = subprocess.run(["tar", "-C", data, "-cf", "-", "."], check=True, capture_output=True).stdout
        subprocess.run([*kubectl, "exec", "-i", "grading-shared-copy", "--", "sh", "-c",
                        "mkdir -p /shared/multi30k && tar -C /shared/multi30k -xf -"], input=packed, check=True)
        subprocess.run([*kubectl, "delete", "pod", "grading-shared-copy"], check=True)
        subprocess.run([*kubectl, "create", "secret", "generic", "gradebook",
                        "--from-literal=url=sqlite:////shared/class/gradebook.db"], check=True)
        subprocess.run([*kubectl, "create", "secret", "generic", "hidden-inputs",
                        f"--from-file=hidden-inputs.key={secret}"], check=True)
        environment = {**os.environ, "KUBECTL": " ".join(kubectl), "START_TIMEOUT": "600"}
        runs = [subprocess.run(["bash", str(recipe / "kubernetes-run.sh"), "5"], capture_output=True, text=True,
                               env={**environment, "DOWNLOADS": str(downloads / f"week{week}"),
                                    "RESULTS": str(tmp_path / "results" / f"week{week}")}, timeout=3600)
                for week in (1, 2)]
        for run in runs:
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        names = [line.split(":")[0] for run in runs for line in run.stdout.splitlines() if line.startswith("job/")]
        assert len(set(names)) == len(names) >= 4, names  # every run made Jobs of its own
        scores = tmp_path / "results" / "week2" / "scores.csv"
        rows = list(csv.DictReader(open(scores, encoding="utf-8-sig")))
        assert sorted(row["student"] for row in rows) == ["ada", "blake", "chen"]
        assert {row["status"] for row in rows} <= {"graded", "skipped"}, rows
    finally:
        subprocess.run(["kind", "delete", "cluster", "--name", cluster, "--kubeconfig", str(kubeconfig)],
                       capture_output=True, timeout=600)


MANIFESTS = ("kubernetes-job.yaml", "kubernetes-scores.yaml", "kubernetes-volume.yaml", "kubernetes-copy.yaml")


def pod_of(document: dict) -> dict:
    return document["spec"]["template"]["spec"] if document["kind"] == "Job" else document["spec"]


def test_the_test_clusters_manifests_keep_the_recipe(tmp_path):
    """The edits made for the kind cluster above change the image, sizes, the claim's access mode and the
    test's grading options only: the security settings, names, volumes and commands are the recipe's."""
    for name in MANIFESTS:
        patched(name, tmp_path)
        ours, theirs = (list(yaml.safe_load_all((folder / name).read_text())) for folder in (tmp_path, CLUSTER))
        for mine, original in zip(ours, theirs, strict=True):
            assert mine["metadata"] == original["metadata"], name
            if mine["kind"] == "PersistentVolumeClaim":
                continue
            pod, recipe = (pod_of(document) for document in (mine, original))
            assert pod["securityContext"] == recipe["securityContext"] and pod["volumes"] == recipe["volumes"]
            assert pod.get("hostUsers") == recipe.get("hostUsers")
            for container, given in zip(pod["containers"], recipe["containers"], strict=True):
                assert container["command"] == given["command"]
                assert container["securityContext"] == given["securityContext"]
                assert container["image"] == IMAGE and container["imagePullPolicy"] == "Never"
