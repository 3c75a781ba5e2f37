"""Stage 3.1 of the real cluster: `kubectl apply -k deploy/train-job` runs for real.

The committed Job (prepare-data -> train -> publish in one pod) runs on the real node, in the
component image built here from images/train/Dockerfile's steps (trainimage.py) and imported under
the name the YAML uses, against the embedded object store on this machine. The overlay changes
only what this machine forces:
- the dataset: the real CIFAR-10 archive in the store (no internet), 1,000 train images, 1 epoch;
- MINIO_ENDPOINT: the store as the node's pods reach it (there is no seaweedfs.kubeflow Service);
- CPU requests: the node has two cores, the Job asks four for train;
- a nodeSelector for the real node (the kwok GPU nodes would otherwise be chosen);
- MIN_ACCURACY 0: a one-epoch model must still be published for the test to see a model.
The one-GPU requests stay: the node advertises one nvidia.com/gpu as an extended resource (no
device plugin; train then runs on CPU, as cifar10_kfp.distributed.resolve_device does without CUDA).
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import time

import pytest

from cifar10_kfp.embedded_store import EmbeddedObjectStore
from tests.support.cluster import gobuild, procs, trainimage
from tests.support.cluster.node import NODE_LABEL

REPO = pathlib.Path(__file__).resolve().parents[2]
DATASET = REPO.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
NAMESPACE = "kubeflow"  # deploy/train-job's kustomization sets it
STORE_PORT = 9000
JOB = "cifar10-kfp-train"
_JOB_TIMEOUT_S = float(os.environ.get("CIFAR10_KFP_REAL_JOB_TIMEOUT_S", "1500"))

pytestmark = pytest.mark.skipif(not DATASET.is_file(), reason=f"{DATASET} is missing")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with EmbeddedObjectStore(tmp_path_factory.mktemp("s3")) as server:
        server.store().put_file(DATASET, f"s3://{server.bucket}/datasets/cifar10-jpeg.tar.gz")
        yield server


@pytest.fixture(scope="module")
def train_image(real_node):
    from tests.cluster import conftest

    started = time.monotonic()
    archive = trainimage.build_archive(gobuild.cache_root() / "images")
    conftest._TIMINGS["component image build (or cache hit)"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    real_node.import_image(archive)
    conftest._TIMINGS["component image import"] = round(time.monotonic() - started, 1)
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
    found: dict = {}

    def done() -> bool:
        proc = cp.kubectl("get", "job", JOB, "-n", NAMESPACE, "-o", "json")
        if proc.returncode != 0:
            return False
        found.update(json.loads(proc.stdout))
        return any(
            c["type"] in ("Complete", "Failed") and c["status"] == "True"
            for c in found.get("status", {}).get("conditions", [])
        )

    # Polled every few seconds (a run takes minutes); fails at once if the kubelet or containerd dies.
    procs.wait_for(f"job {NAMESPACE}/{JOB} finished", done, _JOB_TIMEOUT_S, cp._procs() + node._procs(), 5)
    return found


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
    finally:
        for container in ("prepare-data", "train", "publish"):
            logs = cp.kubectl("logs", "-n", NAMESPACE, f"job/{JOB}", "-c", container, "--tail=30")
            print(f"--- {container}:\n{logs.stdout}{logs.stderr}")
    conditions = {c["type"]: c for c in job["status"]["conditions"]}
    assert "Complete" in conditions, json.dumps(job["status"], indent=1)
    assert job["status"]["succeeded"] == 1
    pods = json.loads(
        cp.kubectl_ok("get", "pods", "-n", NAMESPACE, "-l", f"job-name={JOB}", "-o", "json").stdout
    )
    assert {p["spec"]["nodeName"] for p in pods["items"]} == {real_node.name}
    # The publish step wrote a model version and its pointer into the object store on this machine.
    objects = store.store().list(f"s3://{store.bucket}/cifar10-kfp/models/cifar10-classifier/")
    assert any(o.endswith("/model.safetensors") for o in objects), objects
    assert any(o.endswith("/latest") for o in objects), objects
