"""A real node (kubelet + containerd + runc + CNI bridge) joins the real control plane and runs pods.

Unlike the kwok nodes, nothing here is simulated: the kubelet registers itself with a node client
certificate (NodeRestriction applies), containerd pulls nothing (images are imported from OCI
archives built here), runc starts real processes in cgroups, and the exit code and logs a test reads
come from those processes.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import time

import pytest

from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from localcluster import gobuild, images, trainimage, versions
from localcluster.clusterdns import ClusterDns
from localcluster.node import NODE_LABEL, NODE_TOLERATION, RealNode
from localcluster.prerequisites import missing_for_real_node

pytestmark = pytest.mark.skipif(missing_for_real_node() is not None, reason=str(missing_for_real_node()))


# Module scope: the node leaves the control plane after these tests, so the kwok-based tests that
# follow see only kwok nodes.
@pytest.fixture(scope="module")
def real_node(control_plane):
    from tests.cluster import conftest  # the closing table's timings

    with ClusterDns(control_plane) as dns, RealNode(control_plane, cluster_dns=dns.ip) as node:
        conftest._TIMINGS["cluster DNS (CoreDNS) start"] = dns.started_in_s
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
            "tolerations": [NODE_TOLERATION],
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


def _run_pod(cp, namespace: str, pod: dict, phase: str | tuple[str, ...]) -> dict:
    """Apply the pod and wait until its phase is `phase` (or one of them); returns the pod."""
    cp.kubectl_ok("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    phases = (phase,) if isinstance(phase, str) else phase
    return cp.wait_object(
        "pod", namespace, pod["metadata"]["name"], lambda got: got.get("status", {}).get("phase") in phases,
        what=f"pod {namespace}/{pod['metadata']['name']} phase in {phases}", timeout_s=120,
    )  # fmt: skip


def test_real_node_registers_with_pinned_versions(control_plane, real_node):
    node = json.loads(control_plane.kubectl_ok("get", "node", real_node.name, "-o", "json").stdout)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == versions.KUBERNETES
    # The CRI reports the release without its "v" (as on any containerd node).
    assert info["containerRuntimeVersion"] == f"containerd://{versions.CONTAINERD.lstrip('v')}"
    assert node["metadata"]["labels"][NODE_LABEL] == "true"
    assert {"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
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


def test_the_image_store_keeps_nothing_that_only_an_earlier_run_holds(real_node, tmp_path):
    """containerd's root is cached across runs (node.py), so what a run leaves there stays: CI's
    disk filled up ("no space left on device" unpacking the component image) with an old 6 GB build
    that only the CRI plugin's ID name still held, and a 5 GB ingest of a killed import that only a
    lease held. Both are made here as containerd makes them, and the node's collection drops them."""
    layer = tmp_path / "layer" / "old-build"
    layer.mkdir(parents=True)
    (layer / "payload").write_bytes(os.urandom(1 << 20))
    old = images.OciImage("localhost/cifar10-kfp-garbage:1", [layer.parent], {"Cmd": ["/bin/true"]})
    real_node.import_image(old)
    image_id = json.loads(old.manifest_bytes)["config"]["digest"]
    real_node.ctr("images", "tag", old.name, image_id)  # the CRI plugin names an image it ran so
    real_node.ctr("images", "rm", old.name)  # a rebuild takes the name
    (lease,) = real_node.ctr("leases", "create").stdout.split()  # as a killed import leaves one
    (layer_digest,) = [one["digest"] for one in old.layers]  # one layer: its chain ID is its digest
    assert layer_digest in real_node.ctr("snapshots", "ls").stdout

    dropped = real_node.collect_garbage()

    assert image_id in dropped and f"lease {lease}" in dropped, dropped
    assert image_id not in real_node.ctr("images", "ls", "-q").stdout.split()
    assert lease not in real_node.ctr("leases", "ls", "-q").stdout.split()
    assert layer_digest not in real_node.ctr("snapshots", "ls").stdout  # the old layer is gone from disk
    # What a named image holds stays; the pods of the tests after this one run from it.
    assert real_node.has_image(*images.archive_ref(images.busybox_archive(gobuild.cache_root() / "images")))


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


def test_pods_resolve_a_headless_service_name(control_plane, real_node, cluster_namespace):
    """What stage 3.2 (a 2-node TrainJob on real pods) needs first: JobSet's pods find each other by
    the DNS names of a headless Service. The node's pods get CoreDNS (clusterdns.py) as their
    nameserver; without it a pod has the host's resolv.conf, its lookups fail, and so does the pod
    (its exit code is the lookup's)."""
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "peers"},
        "spec": {"clusterIP": "None", "selector": {"app": "peers"}, "ports": [{"port": 29400}]},
    }  # fmt: skip
    control_plane.kubectl_ok("apply", "-n", cluster_namespace, "-f", "-", input=json.dumps(service))
    name = f"peers.{cluster_namespace}.svc.cluster.local"
    # The pod is its own Service's endpoint: the EndpointSlice (and so CoreDNS) may name it a moment
    # after its container starts, so the lookup is tried for up to 20 s.
    script = f"ok=1; for i in $(seq 20); do if nslookup {name}; then ok=0; break; fi; sleep 1; done; exit $ok"
    pod = _pod("resolver", real_node, script)
    pod["metadata"]["labels"] = {"app": "peers"}
    got = _run_pod(control_plane, cluster_namespace, pod, ("Succeeded", "Failed"))
    answer = control_plane.kubectl_ok("logs", "-n", cluster_namespace, "resolver").stdout.strip()
    assert got["status"]["phase"] == "Succeeded", (
        f"a pod on the real node cannot resolve {name}: " + " | ".join(answer.splitlines()[-6:])
    )
    # busybox's nslookup printed the record: the Service's name and an address (the pod's own)
    assert name in answer and "Address" in answer.split(name, 1)[1], answer


# -- stage 3.1: the standalone Job -------------------------------------------------------
#
# Stage 3.1 of the real cluster: `kubectl apply -k deploy/train-job` runs for real.
#
# The committed Job (prepare-data -> train -> publish in one pod) runs on the real node, in the
# component image built here from images/train/Dockerfile's steps (trainimage.py) and imported under
# the name the YAML uses, against the embedded object store on this machine. The overlay changes
# only what this machine forces:
# - the dataset: the real CIFAR-10 archive in the store (no internet), 1,000 train images, 1 epoch;
# - MINIO_ENDPOINT: the store as the node's pods reach it (there is no seaweedfs.kubeflow Service);
# - CPU requests: the node has two cores, the Job asks four for train;
# - a nodeSelector for the real node (the kwok GPU nodes would otherwise be chosen);
# - MIN_ACCURACY 0: a one-epoch model must still be published for the test to see a model.
# The one-GPU requests stay: the node advertises one nvidia.com/gpu as an extended resource (no
# device plugin; train then runs on CPU, as cifar10_kfp.train.distributed.resolve_device does without CUDA).

REPO = pathlib.Path(__file__).resolve().parents[2]
DATASET = REPO.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
NAMESPACE = "kubeflow"  # deploy/train-job's kustomization sets it
STORE_PORT = 9000
JOB = "cifar10-kfp-train"
_JOB_TIMEOUT_S = float(os.environ.get("CIFAR10_KFP_REAL_JOB_TIMEOUT_S", "1500"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with EmbeddedObjectStore(tmp_path_factory.mktemp("s3")) as server:
        server.store().put_file(DATASET, f"s3://{server.bucket}/datasets/cifar10-jpeg.tar.gz")
        yield server


@pytest.fixture(scope="module")
def train_image(real_node):
    from tests.cluster import conftest

    started = time.monotonic()
    imported = trainimage.ensure_imported(real_node, gobuild.cache_root() / "images")
    label = "component image build + import" if imported else "component image (already imported)"
    conftest._TIMINGS[label] = round(time.monotonic() - started, 1)
    return trainimage.IMAGE


def _overlay(directory: pathlib.Path, endpoint: str) -> pathlib.Path:
    cpu = [
        {"op": "replace", "path": f"/spec/template/spec/{kind}/0/resources/requests/cpu", "value": "500m"}
        for kind in ("initContainers", "containers")
    ]
    cpu.append(
        {"op": "replace", "path": "/spec/template/spec/initContainers/1/resources/requests/cpu", "value": "1"}
    )
    job_patch = [
        *cpu,
        {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {NODE_LABEL: "true"}},
        {"op": "add", "path": "/spec/template/spec/tolerations/-", "value": NODE_TOLERATION},
        {
            "op": "add",
            "path": "/spec/template/spec/initContainers/0/args/-",
            "value": "--max-train-samples=1000",
        },
        {
            "op": "add",
            "path": "/spec/template/spec/initContainers/0/args/-",
            "value": "--max-test-samples=500",
        },
        {"op": "add", "path": "/spec/template/spec/initContainers/1/args/-", "value": "--epochs=1"},
        {"op": "add", "path": "/spec/template/spec/initContainers/1/args/-", "value": "--batch-size=200"},
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "deploy" / "train-job", directory)],
        "patches": [
            {"target": {"kind": "Job", "name": JOB}, "patch": json.dumps(job_patch)},
            {
                "target": {"kind": "ConfigMap", "name": JOB},
                "patch": json.dumps(
                    [
                        {
                            "op": "replace",
                            "path": "/data/DATASET_URI",
                            "value": "s3://mlpipeline/datasets/cifar10-jpeg.tar.gz",
                        },
                        {"op": "replace", "path": "/data/MINIO_ENDPOINT", "value": endpoint},
                        {"op": "replace", "path": "/data/MIN_ACCURACY", "value": "0"},
                    ]
                ),
            },
        ],
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(json.dumps(kustomization, indent=1))
    return directory


def _secret(store: EmbeddedObjectStore) -> dict:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "mlpipeline-minio-artifact", "namespace": NAMESPACE},
        "data": {"accesskey": b64(store.access_key), "secretkey": b64(store.secret_key)},
    }


def _job_finished(cp, node) -> dict:
    def finished(job: dict) -> bool:
        return any(
            c["type"] in ("Complete", "Failed") and c["status"] == "True"
            for c in job.get("status", {}).get("conditions", [])
        )

    # Polled every few seconds (a run takes minutes); fails at once if the kubelet or containerd dies.
    return cp.wait_object(
        "job", NAMESPACE, JOB, finished, what=f"job {NAMESPACE}/{JOB} finished",
        timeout_s=_JOB_TIMEOUT_S, interval_s=5, also_watch=node._procs(),
    )  # fmt: skip


@pytest.mark.timeout(2400)  # the component image may be built here (minutes)
def test_the_component_image_imports_its_modules_from_hash_checked_bytecode(
    control_plane, real_node, train_image, cluster_namespace
):
    """Layers carry no mtimes, so bytecode checked by mtime is stale in the image and a pod's python
    (uid 1000, which cannot write it back) compiles torch, kfp and the library at every start:
    the image carries bytecode checked by source hash (flags 0b11 in the .pyc header, PEP 552)."""
    probe = (
        "import importlib.util, torch, torchvision, kfp, cifar10_kfp.train\n"
        "for module in (torch, torchvision, kfp, cifar10_kfp.train):\n"
        "    with open(importlib.util.cache_from_source(module.__file__), 'rb') as pyc:\n"
        "        print(module.__name__, int.from_bytes(pyc.read(8)[4:8], 'little'))\n"
    )
    pod = _pod("bytecode", real_node, "", runAsUser=1000, runAsNonRoot=True)
    pod["spec"]["containers"][0].update(image=train_image, command=["python", "-c", probe])
    _run_pod(control_plane, cluster_namespace, pod, "Succeeded")
    logs = control_plane.kubectl_ok("logs", "-n", cluster_namespace, "bytecode").stdout.split()
    assert dict(zip(logs[::2], logs[1::2])) == {
        name: "3" for name in ("torch", "torchvision", "kfp", "cifar10_kfp.train")
    }, logs


@pytest.mark.timeout(2400)  # first run: the component image is built (~4 min) and imported
@pytest.mark.skipif(not DATASET.is_file(), reason="the CIFAR-10 archive of ../shared is missing")
def test_standalone_train_job_completes_on_the_real_node(
    control_plane, real_node, train_image, store, tmp_path
):
    cp = control_plane
    real_node.advertise_extended_resource("nvidia.com/gpu", 1)
    endpoint = real_node.expose(int(store.endpoint.rsplit(":", 1)[1]), STORE_PORT)
    if cp.kubectl("get", "namespace", NAMESPACE).returncode != 0:
        cp.create_namespace(NAMESPACE)
    cp.kubectl_ok("apply", "-f", "-", input=json.dumps(_secret(store)))
    overlay = _overlay(tmp_path / "overlay", endpoint)
    cp.kubectl_ok("apply", "-k", str(overlay))
    try:
        job = _job_finished(cp, real_node)
        pods = json.loads(
            cp.kubectl_ok("get", "pods", "-n", NAMESPACE, "-l", f"job-name={JOB}", "-o", "json").stdout
        )
    finally:
        for container in ("prepare-data", "train", "publish"):
            logs = cp.kubectl("logs", "-n", NAMESPACE, f"job/{JOB}", "-c", container, "--tail=30")
            print(f"--- {container}:\n{logs.stdout}{logs.stderr}")
        # The control plane is shared with later tests (deploy/ dry runs use the same names).
        cp.kubectl("delete", "-k", str(overlay), "--wait=false")
        cp.kubectl("delete", "secret", "mlpipeline-minio-artifact", "-n", NAMESPACE, "--wait=false")
    conditions = {c["type"]: c for c in job["status"]["conditions"]}
    assert "Complete" in conditions, json.dumps(job["status"], indent=1)
    assert job["status"]["succeeded"] == 1
    assert {p["spec"]["nodeName"] for p in pods["items"]} == {real_node.name}
    # The publish step wrote a model version and its pointer into the object store on this machine.
    objects = store.store().list(f"s3://{store.bucket}/cifar10-kfp/models/cifar10-classifier/")
    assert any(o.endswith("/model.safetensors") for o in objects), objects
    assert any(o.endswith("/latest") for o in objects), objects
