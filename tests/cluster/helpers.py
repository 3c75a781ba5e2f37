"""What the project-side tests of the real control plane share: API clients, TrainJob requests, waiting.

The fixtures (`control_plane`, `trainer_stack`, `namespace`) come from tests/cluster/conftest.py and the
harness in localcluster/; nothing here stands in for a cluster component.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cifar10_kfp.train.config import make_config
from cifar10_kfp.trainjob import TrainJobRequest, job_name
from tests.support.paths import ROOT

DEPLOY = ROOT / "deploy"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
NODE_ACCOUNT = "cifar10-nodes"
PULL_SECRETS = ("regcred", "mirror-cred")
CONFIG = make_config("fast", {"epochs": 2}).to_dict()


def client_for(cp, kubeconfig: Path | None = None):
    """A ``kubernetes`` ApiClient for the control plane, as admin or as ``kubeconfig``'s identity."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig or cp.kubeconfig))


def wait_until(what: str, probe: Callable[[], object], timeout_s: float = 60.0, interval_s: float = 0.5):
    """``probe()``'s first truthy value; an AssertionError naming ``what`` and the last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not within {timeout_s:g}s (last: {last!r})")


def kubectl_json(cp, *args: str) -> dict:
    return json.loads(cp.kubectl_ok(*args, "-o", "json").stdout)


def pods_of(cp, namespace: str, job: str) -> list[dict]:
    return kubectl_json(cp, "get", "pods", "-n", namespace, "-l", f"{JOBSET_LABEL}={job}")["items"]


def launcher_pod(cp, namespace: str, name: str = "launcher") -> dict:
    """A real pod to own the TrainJob, as the KFP launcher pod does (``{"name", "uid"}``)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": "registry.example/cifar10-kfp:test",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip
    cp.kubectl_ok("apply", "-f", "-", input=json.dumps(pod))
    created = kubectl_json(cp, "get", "pod", name, "-n", namespace)
    return {"name": name, "uid": created["metadata"]["uid"]}


def node_account(cp, namespace: str) -> str:
    cp.kubectl_ok("create", "serviceaccount", NODE_ACCOUNT, "-n", namespace)
    return NODE_ACCOUNT


def full_request(namespace: str, num_nodes: int, *, tag: str = "run", **overrides) -> TrainJobRequest:
    """A request with every option on: GPUs (and so /dev/shm), a service account, pull secrets, storage
    settings, a deadline, an owner (pass ``owner=launcher_pod(...)``), labels."""
    values = dict(
        name=job_name(f"{tag}-{num_nodes}", "cluster"), namespace=namespace, image="registry.example/cifar10-kfp:test",
        data_uri="s3://mlpipeline/p/prepared/d.safetensors", output_uri=f"s3://mlpipeline/p/trainjobs/{tag}",
        checkpoint_uri=f"s3://mlpipeline/p/checkpoints/{tag}", config=CONFIG, num_nodes=num_nodes, gpus_per_node=2,
        max_restarts=2, cpu_per_node="2", memory_per_node="4Gi", minio_endpoint="seaweedfs.kubeflow:9000",
        storage_env={"CIFAR10_KFP_BUCKET": "mlpipeline", "CIFAR10_KFP_PREFIX": "p/"}, labels={"team": "a"},
        active_deadline_s=3600, service_account=NODE_ACCOUNT, image_pull_secrets=PULL_SECRETS,
    )  # fmt: skip
    values.update(overrides)
    return TrainJobRequest(**values)


def label_restricted(cp, namespace: str) -> None:
    """Enforce the restricted Pod Security Standard in ``namespace`` (PodSecurity admission is on)."""
    cp.kubectl_ok(
        "label", "namespace", namespace, "--overwrite", "pod-security.kubernetes.io/enforce=restricted"
    )


def install_elastic_runtime(cp) -> dict:
    """deploy/trainer-runtime, applied as a cluster admin would (kubectl's own kustomize, server-side)."""
    cp.kubectl_ok("apply", "--server-side", "--force-conflicts", "-k", str(DEPLOY / "trainer-runtime"))
    return kubectl_json(cp, "get", "clustertrainingruntime", "cifar10-kfp-torch-elastic")


def trainjob(cp, namespace: str, name: str) -> dict:
    return kubectl_json(cp, "get", "trainjob", name, "-n", namespace)


def condition(obj: dict, kind: str) -> dict | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def running_pods(cp, namespace: str, job: str, count: int, timeout_s: float = 90) -> list[dict]:
    """Wait until ``count`` pods of the job are Running (kwok's stages), sorted by node index."""

    def probe():
        pods = [p for p in pods_of(cp, namespace, job) if p["status"].get("phase") == "Running"]
        return pods if len(pods) >= count else None

    pods = wait_until(f"{count} Running pods of {namespace}/{job}", probe, timeout_s)
    return sorted(pods, key=node_index)


def node_index(pod: dict) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


def apply_rbac(cp, namespace: str, base: str = "rbac") -> list[dict]:
    """deploy/<base> rendered by kubectl's kustomize and applied into ``namespace`` (as an overlay would)."""
    import yaml

    rendered = cp.kubectl_ok("kustomize", str(DEPLOY / base)).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    cp.kubectl_ok("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return docs


def service_account_kubeconfig(cp, namespace: str, name: str) -> Path:
    """The identity of ServiceAccount ``namespace/name`` (created if missing): a bound token from the
    TokenRequest API, what a pod of that account holds (ControlPlane.service_account_kubeconfig)."""
    return cp.service_account_kubeconfig(namespace, name)


def runtime_with_backoff_limit(cp, name: str, *, backoff_limit: int) -> str:
    """A copy of the Trainer's own torch-distributed runtime (as installed by the harness) with another
    ``backoffLimit``, so a test sees a Job fail at its first pod failure instead of after the kubelet's
    back-off of 6 (10 s, 20 s, ... 320 s)."""
    runtime = kubectl_json(cp, "get", "clustertrainingruntime", "torch-distributed")
    body = {"apiVersion": runtime["apiVersion"], "kind": runtime["kind"], "metadata": {"name": name},
            "spec": runtime["spec"]}  # fmt: skip
    body["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] = backoff_limit
    cp.kubectl_ok("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(body))
    return name


def delete_and_wait(cp, namespace: str, name: str, timeout_s: float = 90) -> None:
    """Delete a TrainJob and wait until its pods are gone, so the GPUs they held are free for the next test."""
    cp.kubectl(
        "delete", "trainjob", name, "-n", namespace, "--ignore-not-found", "--wait=true", timeout=timeout_s
    )
    wait_until(f"the pods of {namespace}/{name} gone", lambda: not pods_of(cp, namespace, name), timeout_s)


@pytest.fixture(autouse=True)
def trainjobs_cleaned(request):
    """After a test that has a namespace: its TrainJobs deleted and their pods gone (GPUs free for the next).

    The namespace is asked for before the test, so it is torn down after this cleanup."""
    if "cluster_namespace" not in request.fixturenames:
        yield
        return
    cp, namespace = request.getfixturevalue("control_plane"), request.getfixturevalue("cluster_namespace")
    yield
    cp.kubectl("delete", "trainjobs", "--all", "-n", namespace, "--wait=true", timeout=120)
    wait_until(f"the pods of {namespace} gone", lambda: not kubectl_json(cp, "get", "pods", "-n", namespace,
               "-l", JOBSET_LABEL)["items"], 90)  # fmt: skip
