"""W1: a TrainJob made by cifar10_kfp.trainjob is admitted by the real Trainer webhook (2.2 and 2.3), for 1, 2
and 4 nodes with every option on, and the real Trainer, JobSet and Job controllers turn it into one JobSet, one
Job and N pods, each with what the node needs: PET_* env, command, resources, tolerations, volumes, service
account, pull secrets, the restricted security settings (the namespace enforces them) and its name."""

from __future__ import annotations

import re

import pytest

from cifar10_kfp.trainjob import (
    MAX_POD_NAME,
    TrainJobFailed,
    build_trainjob,
    check_trainer_version,
    submit_trainjob,
)
from cifar10_kfp.trainjob.api import dry_run_create
from cifar10_kfp.trainjob.manifest import PATCH_MANAGER
from tests.cluster.helpers import (
    JOBSET_LABEL,
    PULL_SECRETS,
    client_for,
    delete_and_wait,
    full_request,
    kubectl_json,
    label_restricted,
    launcher_pod,
    node_account,
    node_index,
    pods_of,
    trainjob,
    trainjobs_cleaned,  # noqa: F401 - autouse fixture: frees the GPUs after each test
    wait_until,
)


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("num_nodes", [1, 2, 4])
def test_a_trainjob_with_every_option_becomes_a_jobset_one_job_and_n_pods(
    control_plane, trainer_stack, cluster_namespace, num_nodes
):
    namespace = cluster_namespace
    cp = control_plane
    label_restricted(cp, namespace)
    account = node_account(cp, namespace)
    owner = launcher_pod(cp, namespace)
    request = full_request(namespace, num_nodes, owner=owner)
    manifest = build_trainjob(request)
    api = client_for(cp)
    found = check_trainer_version(api, manifest)  # the CRD's schema, then the strict dry run
    assert found == ("2.2" if trainer_stack.stack == "2.2" else ">=2.3")
    submit_trainjob(api, manifest)
    name = request.name

    stored = trainjob(cp, namespace, name)
    [patch] = stored["spec"]["runtimePatches"]
    assert patch["manager"] == PATCH_MANAGER and patch.get("time"), "the webhook stamps the patch it admitted"
    assert stored["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]

    jobsets = wait_until("the JobSet", lambda: kubectl_json(cp, "get", "jobsets", "-n", namespace)["items"])
    assert [j["metadata"]["name"] for j in jobsets] == [name]
    jobs = wait_until(
        "the Job",
        lambda: kubectl_json(cp, "get", "jobs", "-n", namespace, "-l", f"{JOBSET_LABEL}={name}")["items"],
    )
    assert [j["metadata"]["name"] for j in jobs] == [f"{name}-node-0"]
    assert (jobs[0]["spec"]["completions"], jobs[0]["spec"]["parallelism"]) == (num_nodes, num_nodes)
    pods = wait_until(
        f"{num_nodes} pods", lambda: (p := pods_of(cp, namespace, name)) and len(p) == num_nodes and p
    )
    assert sorted(node_index(p) for p in pods) == list(range(num_nodes))
    for pod in pods:
        _assert_node_pod(pod, request, manifest, account)
    delete_and_wait(cp, namespace, name)  # its pods hold every GPU of the control plane


def _assert_node_pod(pod: dict, request, manifest: dict, account: str) -> None:
    name, index = request.name, node_index(pod)
    pod_name = pod["metadata"]["name"]
    assert re.fullmatch(rf"{name}-node-0-{index}-[a-z0-9]{{5}}", pod_name) and len(pod_name) <= MAX_POD_NAME
    spec = pod["spec"]
    [container] = [c for c in spec["containers"] if c["name"] == "node"]
    assert container["image"] == request.image
    assert container["command"] == manifest["spec"]["trainer"]["command"]
    env = _env(container)
    assert env["PET_NNODES"] == str(request.num_nodes) and env["PET_NPROC_PER_NODE"] == "2"
    assert env["PET_NODE_RANK"] == {
        "fieldRef": {
            "apiVersion": "v1",
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
        }
    }
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == (f"{name}-node-0-0.{name}", "29500")
    assert env["MINIO_ACCESS_KEY"] == {
        "secretKeyRef": {"name": "mlpipeline-minio-artifact", "key": "accesskey"}
    }
    assert env["CIFAR10_KFP_PREFIX"] == "p/" and env["MINIO_ENDPOINT"] == "seaweedfs.kubeflow:9000"
    limits = {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"}
    assert container["resources"] == {"limits": limits, "requests": limits}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in spec["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert spec["serviceAccountName"] == account
    assert [s["name"] for s in spec["imagePullSecrets"]] == list(PULL_SECRETS)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"


def test_the_old_bare_manager_name_is_refused_by_the_real_webhook(
    control_plane, trainer_stack, cluster_namespace
):
    """What W1 was: "cifar10-kfp" is not a domain-prefixed path; the webhook's own words come back (R4)."""
    namespace = cluster_namespace
    manifest = build_trainjob(full_request(namespace, 2, service_account=""))
    manifest["spec"]["runtimePatches"][0]["manager"] = "cifar10-kfp"
    with pytest.raises(TrainJobFailed) as refused:
        dry_run_create(client_for(control_plane), manifest)
    message = str(refused.value)
    assert "admission webhook" in message and "denied the request" in message
    assert (
        'spec.runtimePatches.manager: Invalid value: "cifar10-kfp": must be a domain-prefixed path' in message
    )
    assert "not allowed to create" not in message  # not reported as RBAC
