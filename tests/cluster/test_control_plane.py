"""Smoke tests of the real control-plane harness: each asserts something a broken harness gets wrong.

The API server reports the pinned release, RBAC refuses an unbound user, NodeRestriction and
PodSecurity refuse what they must, kwok's nodes are Ready with their GPUs, a pod runs, succeeds or
fails as the test says, and the real Trainer webhooks of both stacks admit the upstream
TrainJob example and refuse a non-domain-prefixed `runtimePatches[].manager`.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from localcluster import gobuild, versions


def _pod(name: str, gpus: int = 0) -> dict:
    container = {"name": "main", "image": "registry.invalid/none:1", "command": ["true"]}
    spec: dict = {"containers": [container], "restartPolicy": "Never"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _create(cp, namespace: str, obj: dict):
    return cp.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj))


def test_api_server_reports_the_pinned_release(control_plane):
    info = json.loads(control_plane.kubectl_ok("version", "-o", "json").stdout)
    assert info["serverVersion"]["gitVersion"] == versions.KUBERNETES
    assert info["clientVersion"]["gitVersion"] == versions.KUBERNETES


def test_rbac_refuses_an_unbound_user_and_allows_a_bound_one(control_plane, cluster_namespace):
    alice = control_plane.kubeconfig_for("alice", ["team-a"])
    refused = control_plane.kubectl("get", "pods", "-n", cluster_namespace, kubeconfig=alice)
    assert refused.returncode != 0
    assert 'User "alice" cannot list resource "pods"' in refused.stderr
    control_plane.kubectl_ok(
        "create", "rolebinding", "alice-view", "--clusterrole=view", "--group=team-a", "-n", cluster_namespace
    )
    control_plane.wait_for(
        "alice may list pods",
        lambda: (
            control_plane.kubectl("get", "pods", "-n", cluster_namespace, kubeconfig=alice).returncode == 0
        ),
    )
    # ... and still nothing elsewhere.
    assert control_plane.kubectl("get", "pods", "-n", "default", kubeconfig=alice).returncode != 0


def test_node_authorizer_and_node_restriction_keep_a_node_to_itself(control_plane):
    node0 = control_plane.kubeconfig_for("system:node:kwok-cpu-0", ["system:nodes"])

    def label(node: str, key: str):
        patch = json.dumps({"metadata": {"labels": {key: "yes"}}})
        return control_plane.kubectl("patch", "node", node, "-p", patch, kubeconfig=node0)

    # The Node authorizer: a node reads and writes only its own Node object.
    other = label("kwok-cpu-1", "stolen")
    assert other.returncode != 0
    assert "node 'kwok-cpu-0' cannot read 'kwok-cpu-1', only its own Node object" in other.stderr
    own = label("kwok-cpu-0", "example.com/pool")
    assert own.returncode == 0, own.stderr
    # NodeRestriction admission: not even its own node may take a node-restriction.kubernetes.io/ label.
    protected = label("kwok-cpu-0", "node-restriction.kubernetes.io/pool")
    assert protected.returncode != 0
    assert "is not allowed to modify labels: node-restriction.kubernetes.io/pool" in protected.stderr


def test_pod_security_restricted_refuses_a_privileged_pod(control_plane):
    name = control_plane.create_namespace(
        "restricted-smoke", {"pod-security.kubernetes.io/enforce": "restricted"}
    )
    try:
        pod = _pod("privileged")
        pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        refused = _create(control_plane, name, pod)
        assert refused.returncode != 0
        assert 'violates PodSecurity "restricted:latest"' in refused.stderr
    finally:
        control_plane.kubectl("delete", "namespace", name, "--wait=false")


def test_kwok_nodes_are_ready_and_gpu_nodes_have_gpus(control_plane):
    nodes = json.loads(control_plane.kubectl_ok("get", "nodes", "-o", "json").stdout)["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert set(control_plane.node_names) <= set(by_name)
    for node in by_name.values():
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
    gpus = {name: n["status"]["allocatable"].get("nvidia.com/gpu") for name, n in by_name.items()}
    assert [g for name, g in gpus.items() if name.startswith("kwok-gpu-")] == [
        str(control_plane.gpus_per_node)
    ] * control_plane.gpu_nodes
    assert all(g is None for name, g in gpus.items() if name.startswith("kwok-cpu-"))


def test_a_pod_runs_then_succeeds_or_fails_on_demand(control_plane, cluster_namespace):
    cp, ns = control_plane, cluster_namespace
    for name in ("ok", "bad"):
        assert _create(cp, ns, _pod(name)).returncode == 0
    for name in ("ok", "bad"):
        running = cp.wait_pod_phase(ns, name, "Running")
        assert running["spec"]["nodeName"].startswith("kwok-cpu-"), (
            "the GPU taint keeps plain pods off GPU nodes"
        )
    cp.succeed_pod(ns, "ok")
    cp.fail_pod(ns, "bad", exit_code=3, reason="Error", message="boom")
    ok = cp.wait_pod_phase(ns, "ok", "Succeeded")
    bad = cp.wait_pod_phase(ns, "bad", "Failed")
    assert ok["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    terminated = bad["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (3, "Error", "boom")


def test_the_scheduler_places_a_gpu_pod_on_a_gpu_node(control_plane, cluster_namespace):
    assert _create(control_plane, cluster_namespace, _pod("gpu", gpus=1)).returncode == 0
    pod = control_plane.wait_pod_phase(cluster_namespace, "gpu", "Running")
    assert pod["spec"]["nodeName"].startswith("kwok-gpu-")


# -- the real Trainer and JobSet ---------------------------------------------------------------


def _example(name: str) -> dict:
    # The upstream examples live in Trainer v2.3.0's module (v2.2.x ships none); both stacks get them.
    root = gobuild.module_dir(versions.TRAINER_MODULE, versions.TRAINER_STACKS["2.3"].trainer)
    return yaml.safe_load((root / "examples" / "yaml" / name).read_text())


def _trainjob_pods(cp, ns: str, name: str) -> list[dict]:
    out = cp.kubectl_ok("get", "pods", "-n", ns, "-l", f"jobset.sigs.k8s.io/jobset-name={name}", "-o", "json")
    return json.loads(out.stdout)["items"]


def _condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def test_trainer_admits_the_upstream_trainjob_and_runs_it_to_completion(
    control_plane, trainer_stack, cluster_namespace
):
    cp, ns = control_plane, cluster_namespace
    job = _example("01-multi-node.yaml")
    job["spec"]["trainer"]["numNodes"] = 2
    created = _create(cp, ns, job)
    assert created.returncode == 0, created.stderr
    name = job["metadata"]["name"]
    cp.wait_for(
        "2 pods Running",
        lambda: [p["status"].get("phase") for p in _trainjob_pods(cp, ns, name)] == ["Running"] * 2,
        120,
    )
    jobset = json.loads(cp.kubectl_ok("get", "jobset", name, "-n", ns, "-o", "json").stdout)
    # JobSet's own webhook defaulted the Job template (pkg/webhooks/jobset_webhook.go).
    job_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["completionMode"] == "Indexed"
    for pod in _trainjob_pods(cp, ns, name):
        cp.succeed_pod(ns, pod["metadata"]["name"])

    def complete() -> bool:
        tj = json.loads(cp.kubectl_ok("get", "trainjob", name, "-n", ns, "-o", "json").stdout)
        cond = _condition(tj, "Complete")
        return bool(cond and cond["status"] == "True")

    cp.wait_for(f"TrainJob {name} Complete (Trainer {trainer_stack.version})", complete, 120)


@pytest.mark.parametrize(
    "manager, admitted",
    [("example.io/platform-team", True), ("cifar10-kfp", False)],
    ids=["domain-prefixed", "bare-name"],
)
def test_trainer_webhook_checks_the_runtime_patch_manager(
    control_plane, trainer_stack, cluster_namespace, manager, admitted
):
    job = copy.deepcopy(_example("02-runtime-patches.yaml"))
    job["spec"]["runtimePatches"][0]["manager"] = manager
    result = control_plane.kubectl(
        "create", "--dry-run=server", "-n", cluster_namespace, "-f", "-", input=json.dumps(job)
    )
    if admitted:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode != 0
    # The message is the Trainer's own (pkg/runtime/framework/plugins/jobset/jobset.go Validate,
    # apimachinery validation.IsDomainPrefixedPath), returned by its validating webhook.
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in result.stderr
    assert (
        'spec.runtimePatches.manager: Invalid value: "cifar10-kfp": '
        'must be a domain-prefixed path (such as "acme.io/foo")'
    ) in result.stderr
