"""`cifar10-kfp doctor` against the real API server: the Trainer version read from the real CRDs (2.2, 2.3),
the GPU nodes kwok registered, the object-store secret, and, in plain words, a missing runtime and missing
RBAC (asked of the real authorizer), each with the command that fixes it."""

from __future__ import annotations

import json

import pytest

from cifar10_kfp_pipelines.cli import main
from tests.cluster.helpers import (
    apply_rbac,
    install_elastic_runtime,
    kubectl_json,
    trainjobs_cleaned,  # noqa: F401 - autouse fixture: frees the GPUs after each test
)


@pytest.fixture
def doctor(control_plane, monkeypatch, capsys):
    """Run the real CLI with the control plane's admin kubeconfig; returns (exit code, output)."""
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def run(*args: str) -> tuple[int, str]:
        rc = main(["doctor", *args])
        return rc, capsys.readouterr().out

    return run


def _line(out: str, name: str) -> str:
    [line] = [ln for ln in out.splitlines() if f"] {name}:" in ln]
    return line


def test_doctor_reads_the_trainer_version_and_finds_the_gpu_nodes(
    control_plane, trainer_stack, cluster_namespace, doctor
):
    namespace = cluster_namespace
    install_elastic_runtime(control_plane)
    apply_rbac(control_plane, namespace)
    control_plane.kubectl_ok("create", "secret", "generic", "mlpipeline-minio-artifact", "-n", namespace,
                             "--from-literal=accesskey=a-key-id", "--from-literal=secretkey=a-secret-key")  # fmt: skip
    rc, out = doctor("--namespace", namespace, "--num-nodes", "2")
    expected = "2.2" if trainer_stack.stack == "2.2" else ">=2.3"
    assert _line(out, "Kubeflow Trainer").startswith(f"[OK  ] Kubeflow Trainer: Trainer {expected} ")
    nodes = kubectl_json(control_plane, "get", "nodes")["items"]
    gpu = sorted(
        n["metadata"]["name"] for n in nodes if int(n["status"]["allocatable"].get("nvidia.com/gpu", "0"))
    )
    assert gpu and _line(out, "GPU nodes") == (
        f"[OK  ] GPU nodes: {len(gpu)} node(s) with nvidia.com/gpu: " + ", ".join(f"{n} (2)" for n in gpu)
    )
    assert _line(out, "object-store secret").startswith("[OK  ]")
    assert _line(out, "elastic runtime").startswith("[OK  ]")
    assert _line(out, "TrainJob permissions") == (
        f"[OK  ] TrainJob permissions: service account {namespace}/default-editor may "
        "create/get/list/watch/patch/delete trainjobs and list events"
    )
    assert "a-secret-key" not in out
    assert (
        rc == 1 and "[FAIL] Kubeflow Pipelines API" in out
    )  # no KFP on this control plane: said, not hidden


def test_doctor_says_a_runtime_is_missing(control_plane, trainer_stack, cluster_namespace, doctor):
    namespace = cluster_namespace
    cp = control_plane
    saved = kubectl_json(cp, "get", "clustertrainingruntime", "torch-distributed")
    cp.kubectl_ok("delete", "clustertrainingruntime", "torch-distributed", "cifar10-kfp-torch-elastic",
                  "--ignore-not-found")  # fmt: skip
    try:
        rc, out = doctor("--namespace", namespace, "--num-nodes", "2")
    finally:
        body = {k: saved[k] for k in ("apiVersion", "kind", "spec")} | {"metadata": {"name": "torch-distributed",
                                                                                      "labels": saved["metadata"].get("labels", {})}}  # fmt: skip
        cp.kubectl_ok("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(body))
    assert rc == 1
    assert (
        _line(out, "Kubeflow Trainer")
        == "[FAIL] Kubeflow Trainer: ClusterTrainingRuntime 'torch-distributed' not found"
    )
    assert "fix: install the Trainer's default runtimes" in out
    assert _line(out, "elastic runtime").startswith(
        "[WARN] elastic runtime: ClusterTrainingRuntime 'cifar10-kfp-torch-elastic' not found"
    )
    assert "fix: kubectl apply --server-side -k deploy/trainer-runtime" in out


def test_doctor_says_the_runner_lacks_the_trainjob_rights(
    control_plane, trainer_stack, cluster_namespace, doctor
):
    namespace = cluster_namespace
    rc, out = doctor("--namespace", namespace, "--num-nodes", "2")
    assert rc == 1
    assert _line(out, "TrainJob permissions") == (
        f"[FAIL] TrainJob permissions: service account {namespace}/default-editor may not create trainjobs, "
        f"get trainjobs, list trainjobs, watch trainjobs, patch trainjobs, delete trainjobs, list events in "
        f"namespace '{namespace}': multi-node runs there would fail"
    )
    assert "fix: kubectl apply -k deploy/rbac (standalone KFP), or a copy of deploy/overlays/profile" in out
    rc, out = doctor("--namespace", namespace, "--num-nodes", "2", "--runner", "pipeline-runner")
    assert "service account " + namespace + "/pipeline-runner may not create trainjobs" in out
