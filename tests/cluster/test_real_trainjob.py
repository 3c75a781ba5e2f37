"""Stage 3.2 of issue 24: a 2-node TrainJob runs through the real Trainer and JobSet as two real pods.

The TrainJob is the one the pipeline's multi-node step creates (cifar10_kfp.trainjob.build_trainjob),
on CPU (gpus_per_node=0, so gloo), small enough for this machine's two cores: 500m and 2Gi per node.
The real Trainer makes the JobSet, the real JobSet controller the headless Service and the Job, the
real Job controller the two indexed pods, and the real node's kubelet runs them in the component
image (trainimage.py). Node 1 finds node 0 by JobSet's DNS name (`<job>-node-0-0.<job>`, in the
torch plugin's PET_MASTER_ADDR) through CoreDNS (clusterdns.py); the two torchrun agents meet in a
c10d rendezvous, train one epoch with gloo, and the node holding rank 0 uploads the model to the
embedded object store, which the pods reach at the node's bridge address (node.expose).

The pods land on the real node through their namespace, as a cluster admin would send a team's pods
to a node pool: the default tolerations (PodTolerationRestriction) tolerate its taint and the node
selector (PodNodeSelector) picks its label; the TrainJob itself says nothing about the node.
"""

from __future__ import annotations

import base64
import json
import re
import time

import pytest

from cifar10_kfp.data.shards import write_shards
from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from cifar10_kfp.train.config import make_config
from cifar10_kfp.trainjob import TrainJobRequest, build_trainjob
from localcluster import gobuild, trainimage, versions
from localcluster.clusterdns import ClusterDns
from localcluster.node import NODE_LABEL, NODE_TOLERATION, RealNode
from localcluster.prerequisites import missing_for_real_node
from tests.cluster.helpers import condition, node_index, pods_of, wait_until

# On the newest Trainer stack only (docs/cluster.md, "Which scenarios run on both stacks"): what these
# real pods prove (the image, gloo between two pods, DNS, a replaced pod resuming) is ours and the node's;
# the Trainer and JobSet controllers' part is the same objects the kwok scenarios check on both stacks.
NEWEST_STACK = list(versions.TRAINER_STACKS)[-1]
pytestmark = [
    pytest.mark.skipif(missing_for_real_node() is not None, reason=str(missing_for_real_node())),
    pytest.mark.parametrize("trainer_stack", [NEWEST_STACK], indirect=True),
]

STORE_PORT = 9000
SECRET = "mlpipeline-minio-artifact"
#: Prepared datasets in the store: a tiny one (one epoch takes seconds) and one that trains long enough
#: for a pod to be killed mid-run.
SHARDED_TINY = "prepared/tiny-shards"
DATASETS = {"tiny": {"n_train": 64, "image_size": 16}, "small": {"n_train": 2048, "image_size": 32}}
_JOB_TIMEOUT_S = 900
# The kill scenario's run: 128 steps an epoch at about 26 ms a step on 2 x 500m (3 epochs took 10 s, over
# before the kill), so 20 epochs train for about a minute after the first checkpoint (step 50).
EPOCHS = 20
STEPS_PER_EPOCH = 128  # the "small" dataset: 2,048 images, batch 16


@pytest.fixture(scope="module")
def node_with_dns(control_plane):
    """The real node, its pods resolving cluster names through CoreDNS, with the component image."""
    from tests.cluster import conftest  # the closing table's timings

    with ClusterDns(control_plane) as dns, RealNode(control_plane, cluster_dns=dns.ip) as node:
        conftest._TIMINGS["cluster DNS (CoreDNS) start"] = dns.started_in_s
        conftest._TIMINGS["real node start (3.2)"] = node.started_in_s
        started = time.monotonic()
        trainimage.ensure_imported(node, gobuild.cache_root() / "images")
        conftest._TIMINGS["component image on the node (3.2)"] = round(time.monotonic() - started, 1)
        yield node


@pytest.fixture(scope="module")
def pod_store(node_with_dns, tmp_path_factory):
    """The embedded object store with the prepared datasets; (store, the endpoint the pods use)."""
    from cifar10_kfp.data.format import save_prepared
    from tests.support.data import make_tiny_dataset

    work = tmp_path_factory.mktemp("real-trainjob")
    with EmbeddedObjectStore(work / "s3") as server:
        for name, size in DATASETS.items():
            local = save_prepared(
                make_tiny_dataset(n_val=16, n_test=16, **size), work / f"{name}.safetensors"
            )
            server.store().put_file(local, f"s3://{server.bucket}/prepared/{name}/dataset.safetensors")
        # The 2-node scenario trains from shards in the store, streamed (issue 39): 64 train images in 4 shards.
        write_shards(
            make_tiny_dataset(n_val=16, n_test=16, **DATASETS["tiny"]), f"s3://{server.bucket}/{SHARDED_TINY}",
            server.store(), shard_samples=16,
        )  # fmt: skip
        endpoint = node_with_dns.expose(int(server.endpoint.rsplit(":", 1)[1]), STORE_PORT)
        yield server, endpoint


def _send_pods_to_the_real_node(cp, namespace: str, store: EmbeddedObjectStore) -> None:
    cp.kubectl_ok(
        "annotate", "--overwrite", "namespace", namespace,
        f"scheduler.alpha.kubernetes.io/defaultTolerations={json.dumps([NODE_TOLERATION])}",
        f"scheduler.alpha.kubernetes.io/node-selector={NODE_LABEL}=true",
    )  # fmt: skip
    data = {k: base64.b64encode(v.encode()).decode() for k, v in
            {"accesskey": store.access_key, "secretkey": store.secret_key}.items()}  # fmt: skip
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": namespace},
              "data": data}  # fmt: skip
    cp.kubectl_ok("apply", "-f", "-", input=json.dumps(secret))


def _request(
    namespace: str, store, endpoint: str, name: str, dataset: str, data_uri: str = "", **config
) -> TrainJobRequest:
    root = f"s3://{store.bucket}"
    settings = {"architecture": "simple_cnn", "epochs": 1, "batch_size": 16, "device": "cpu", "threads": 1}
    return TrainJobRequest(
        name=name, namespace=namespace, image=trainimage.IMAGE,
        data_uri=data_uri or f"{root}/prepared/{dataset}/dataset.safetensors", output_uri=f"{root}/trainjobs/{name}",
        checkpoint_uri=f"{root}/checkpoints/{name}", config=make_config("seed", {**settings, **config}).to_dict(),
        num_nodes=2, gpus_per_node=0, max_restarts=2, cpu_per_node="500m", memory_per_node="2Gi",
        minio_endpoint=endpoint, storage_env={"CIFAR10_KFP_BUCKET": store.bucket},
    )  # fmt: skip


def _finished(cp, node, namespace: str, name: str) -> dict:
    return cp.wait_object(
        "trainjob", namespace, name,
        lambda job: condition(job, "Complete") or condition(job, "Failed"),
        what=f"trainjob {namespace}/{name} finished", timeout_s=_JOB_TIMEOUT_S, interval_s=5,
        also_watch=node._procs(),
    )  # fmt: skip


def _print_logs(cp, namespace: str, name: str) -> None:
    for pod in pods_of(cp, namespace, name):
        logs = cp.kubectl("logs", "-n", namespace, pod["metadata"]["name"], "--tail=40")
        print(f"--- {pod['metadata']['name']} ({pod['status'].get('phase')}):\n{logs.stdout}{logs.stderr}")


def _run(cp, node, request: TrainJobRequest, while_running=None) -> tuple[dict, list[dict]]:
    """Create the TrainJob, call while_running() if given, and wait until it finished; (job, pods)."""
    cp.kubectl_ok("apply", "-f", "-", input=json.dumps(build_trainjob(request)))
    started = time.monotonic()
    try:
        if while_running is not None:
            while_running()
        job = _finished(cp, node, request.namespace, request.name)
        pods = pods_of(cp, request.namespace, request.name)
    finally:
        _print_logs(cp, request.namespace, request.name)
    print(f"TrainJob {request.name} finished in {time.monotonic() - started:.0f} s")
    return job, pods


def _assert_model_written(store, request: TrainJobRequest) -> list[dict]:
    objects = store.store().list(f"{request.output_uri}/")
    assert any(o.endswith(".safetensors") and "/model/" in o for o in objects), objects
    history = json.loads(store.store().get_bytes(f"{request.output_uri}/history.json"))
    assert history and all(epoch["world_size"] == 2 for epoch in history), history
    return history


@pytest.mark.timeout(2400)  # a first run builds and imports the component image
def test_a_two_node_trainjob_completes_on_real_pods_with_a_model(
    control_plane, trainer_stack, node_with_dns, pod_store, cluster_namespace
):
    cp, node, (store, endpoint) = control_plane, node_with_dns, pod_store
    _send_pods_to_the_real_node(cp, cluster_namespace, store)
    request = _request(
        cluster_namespace, store, endpoint, "real-2node", "tiny", data_uri=f"s3://{store.bucket}/{SHARDED_TINY}",
        data_path="stream", stream_partitions=2,
    )  # fmt: skip
    job, pods = _run(cp, node, request)
    assert condition(job, "Complete"), json.dumps(job.get("status"), indent=1)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    assert {p["spec"]["nodeName"] for p in pods} == {node.name}
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
    # Two pods, two addresses of the node's bridge: the rendezvous and gloo went pod to pod.
    assert len({p["status"]["podIP"] for p in pods}) == 2
    assert len(_assert_model_written(store, request)) == 1
    # Both ranks read their own shards from the store, streamed: rank 0 says which path it took.
    logs = "".join(cp.kubectl_ok("logs", "-n", request.namespace, p["metadata"]["name"]).stdout for p in pods)
    assert f"data path: stream (s3://{store.bucket}/{SHARDED_TINY})" in logs, logs[-3000:]


@pytest.mark.timeout(1800)
def test_a_node_pod_killed_mid_run_is_replaced_and_the_run_completes(
    control_plane, trainer_stack, node_with_dns, pod_store, cluster_namespace
):
    """docs/multi-node.md, "What happens when a node is lost", on the fixed-size runtime: node 1's pod is
    deleted after the first checkpoint; the Job controller gives index 1 a new pod, node 0's agent
    restarts its worker group, both meet in a new rendezvous round and resume from the checkpoint."""
    cp, node, (store, endpoint) = control_plane, node_with_dns, pod_store
    _send_pods_to_the_real_node(cp, cluster_namespace, store)
    request = _request(
        cluster_namespace,
        store,
        endpoint,
        "real-2node-kill",
        "small",
        epochs=EPOCHS,
        checkpoint_every_steps=50,
    )
    killed: dict = {}

    def kill_node_1_after_a_checkpoint():
        wait_until("a checkpoint", lambda: store.store().list(f"{request.checkpoint_uri}/"), 600, 1)
        [pod] = [p for p in pods_of(cp, request.namespace, request.name) if node_index(p) == 1]
        killed.update(name=pod["metadata"]["name"], uid=pod["metadata"]["uid"])
        cp.kubectl_ok("delete", "pod", "-n", request.namespace, killed["name"], "--wait=false")

    job, pods = _run(cp, node, request, kill_node_1_after_a_checkpoint)
    assert condition(job, "Complete"), json.dumps(job.get("status"), indent=1)
    index_1 = [p["metadata"]["uid"] for p in pods if node_index(p) == 1]
    # exactly one replacement: one node-1 pod at the end, and not the killed one
    assert len(index_1) == 1 and index_1[0] != killed["uid"], (killed, index_1)
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
    assert _assert_model_written(store, request)[-1]["epoch"] == EPOCHS
    # The new round resumed from a checkpoint (the first is at step 50), not from the start: rank 0's
    # log says where (cifar10_kfp/train/state.py; a new rendezvous round may give rank 0 to either
    # pod), and metrics.json records the epoch it resumed in.
    log = "".join(cp.kubectl_ok("logs", "-n", request.namespace, p["metadata"]["name"]).stdout for p in pods)
    resumed = [int(m) for m in re.findall(r"resuming from \S+ at epoch \d+.*?\(step (\d+)\)", log)]
    assert resumed and all(50 <= step < EPOCHS * STEPS_PER_EPOCH for step in resumed), log[-3000:]
    metrics = json.loads(store.store().get_bytes(f"{request.output_uri}/metrics.json"))
    assert 0 <= metrics["resumed_from_epoch"] < EPOCHS, metrics
