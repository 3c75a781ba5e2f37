"""A real node (kubelet + containerd + runc + CNI bridge) joins the real control plane and runs pods.

Unlike the kwok nodes, nothing here is simulated: the kubelet registers itself with a node client
certificate (NodeRestriction applies), containerd pulls nothing (images are imported from OCI
archives built here), runc starts real processes in cgroups, and the exit code and logs a test reads
come from those processes.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.cluster import gobuild, images, versions
from tests.support.cluster.node import NODE_LABEL, RealNode

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed for the pause image")


@pytest.fixture(scope="session")
def real_node(control_plane):
    from tests.cluster import conftest  # the closing table's timings

    with RealNode(control_plane) as node:
        conftest._TIMINGS["real node start"] = node.started_in_s
        node.import_image(images.busybox_archive(gobuild.cache_root() / "images"))
        yield node


def _pod(name: str, node: RealNode, script: str, **security) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {NODE_LABEL: "true"},
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": images.BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",  # there is no registry: the image must be on the node
                    "command": ["/bin/sh", "-c", script],
                    "securityContext": security,
                }
            ],
        },
    }


def _run_pod(cp, namespace: str, pod: dict, phase: str) -> dict:
    cp.kubectl_ok("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    return cp.wait_pod_phase(namespace, pod["metadata"]["name"], phase, timeout_s=120)


def test_real_node_registers_with_pinned_versions(control_plane, real_node):
    node = json.loads(control_plane.kubectl_ok("get", "node", real_node.name, "-o", "json").stdout)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == versions.KUBERNETES
    # The CRI reports the release without its "v" (as on any containerd node).
    assert info["containerRuntimeVersion"] == f"containerd://{versions.CONTAINERD.lstrip('v')}"
    assert node["metadata"]["labels"][NODE_LABEL] == "true"
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True", node["status"]["conditions"]
    # Capacity is the machine's, measured by the kubelet (kwok nodes declare theirs).
    assert int(node["status"]["capacity"]["cpu"]) >= 1
    assert "nvidia.com/gpu" not in node["status"]["capacity"]


def test_pod_runs_to_succeeded_on_the_real_node(control_plane, real_node, cluster_namespace):
    script = "id -u; cat /proc/1/cgroup | head -3; echo real-node-says-hello"
    pod = _run_pod(
        control_plane,
        cluster_namespace,
        _pod("hello", real_node, script, runAsUser=1000, runAsNonRoot=True),
        "Succeeded",
    )
    assert pod["spec"]["nodeName"] == real_node.name
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["imageID"]  # containerd resolved the imported image
    assert pod["status"]["podIP"].startswith("10.88.")  # an address from the CNI bridge
    logs = control_plane.kubectl_ok("logs", "-n", cluster_namespace, "hello").stdout.split("\n")
    assert logs[0] == "1000"  # the process really ran as the requested user
    assert "real-node-says-hello" in logs


def test_failing_container_fails_the_pod_with_its_exit_code(control_plane, real_node, cluster_namespace):
    pod = _run_pod(control_plane, cluster_namespace, _pod("fails", real_node, "exit 7"), "Failed")
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 7


def test_pod_reaches_the_host_through_the_bridge(control_plane, real_node, cluster_namespace):
    # The path a pod takes to the object store on this machine: the bridge's gateway address.
    pod = _run_pod(
        control_plane,
        cluster_namespace,
        _pod("route", real_node, f"ip route; ping -c 1 -W 5 {real_node.host_ip}"),
        "Succeeded",
    )
    logs = control_plane.kubectl_ok("logs", "-n", cluster_namespace, "route").stdout
    assert f"default via {real_node.host_ip}" in logs, logs
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
