"""The multi-node train step end to end: the component creates the TrainJob through the Kubernetes API
(kubeconfig -> a local API server), two real nodes run the job's command with torchrun's c10d rendezvous
and gloo against the embedded S3 store, the node holding rank 0 uploads, and the component fills its
Model/Metrics/history outputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.k8s_fake_server import TRAINJOBS, K8sFakeServer, condition
from tests.support.torchrun_agents import free_port


def expand_like_the_kubelet(arg: str, env: dict[str, str]) -> str:
    """``$(VAR)`` in a container's command is replaced by the container's variable when it is defined;
    ``$$`` escapes (kubernetes/kubernetes third_party/forked/golang/expansion, as the kubelet applies it)."""

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, arg)


def run_nodes_for_real(server: K8sFakeServer, ns: str, name: str, manifest: dict) -> None:
    """A stand-in for the Trainer controller, JobSet and the kubelet: every node's command runs as a local
    process with the env the pod would get (secret refs resolved from this test's store env) plus the
    PET_* variables the Trainer's torch plugin injects (kubeflow/trainer pkg/runtime/framework/plugins/
    torch/torch.go: PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK from the completion index,
    PET_MASTER_ADDR=<job>-node-0-0.<job>, here 127.0.0.1, and PET_MASTER_PORT)."""
    trainer = manifest["spec"]["trainer"]
    port = free_port()
    base = dict(os.environ)
    for item in trainer["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        base[item["name"]] = os.environ[item["name"]] if ref else item["value"]
    base["MINIO_ENDPOINT"] = os.environ[
        "MINIO_ENDPOINT"
    ]  # the store this test runs against, not the cluster's
    base["OMP_NUM_THREADS"] = "1"
    server.set_status(ns, name, {"jobsStatus": [{"name": "node", "active": trainer["numNodes"]}]})
    procs = []
    for rank in range(trainer["numNodes"]):
        env = {**base, "PET_NNODES": str(trainer["numNodes"]), "PET_NODE_RANK": str(rank),
               "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]), "PET_MASTER_ADDR": "127.0.0.1",
               "PET_MASTER_PORT": str(port)}  # fmt: skip
        command = [expand_like_the_kubelet(arg, env) for arg in trainer["command"]]
        command[0] = sys.executable if command[0] == "python" else command[0]
        command[command.index("--output-dir") + 1] += f"-node{rank}"  # one machine, two "pods"
        procs.append(subprocess.Popen(command, env=env))
    codes = [p.wait(timeout=300) for p in procs]
    if any(codes):
        failed = {"conditions": [condition("Failed", reason="NodeFailed", message=f"exit codes {codes}")]}
        server.set_status(ns, name, failed)
    else:
        server.set_status(ns, name, {"conditions": [condition("Complete", reason="JobsCompleted")]})


def test_the_kubelet_stand_in_expands_like_the_kubelet():
    env = {"PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500"}
    assert expand_like_the_kubelet("$(PET_MASTER_ADDR):$(PET_MASTER_PORT)", env) == "job-node-0-0.job:29500"
    assert expand_like_the_kubelet("$(UNSET)-$$(PET_MASTER_PORT)", env) == "$(UNSET)-$(PET_MASTER_PORT)"


@pytest.mark.slow
def test_train_on_trainer_component_trains_on_two_nodes(store_env, tmp_path, monkeypatch):
    from kfp import dsl

    from cifar10_kfp.data.format import save_prepared
    from cifar10_kfp.train.models import load_model
    from cifar10_kfp_components.trainjob import train_on_trainer
    from tests.support.data import make_tiny_dataset

    store_env.ensure_bucket()
    local = save_prepared(
        make_tiny_dataset(n_train=64, n_val=16, n_test=16, image_size=16), tmp_path / "d.safetensors"
    )
    data_uri = store_env.root_uri("prepared", "tiny", "dataset.safetensors")
    store_env.put_file(local, data_uri)
    monkeypatch.setenv("KFP_POD_NAME", "training-abc-system-container-impl-1")
    monkeypatch.setenv("KFP_POD_UID", "uid-launcher")
    with K8sFakeServer(controller=run_nodes_for_real) as k8s:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml_config(k8s.url))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        out = tmp_path / "out"
        train_on_trainer.python_func(
            dataset=dsl.Dataset(uri=data_uri),
            training={"preset": "seed", "architecture": "simple_cnn", "epochs": 1, "batch_size": 16, "lr": 0.0,
                      "seed": 0, "extra_hparams": '{"device": "cpu"}', "checkpoint_every": 0},
            num_gpus=0, num_nodes=2, min_nodes=0, max_restarts=1, trainjob_timeout_h=0.5, keep_trainjob=0,
            service_account="", image_pull_secrets="", checkpoint_uri="", run_id="run-42", bucket="",
            storage_prefix="",
            image="registry.example/cifar10-kfp:test", minio_endpoint="ignored:9000", minio_secure=False,
            model=dsl.Model(uri=str(out / "model")), metrics=dsl.Metrics(uri=str(out / "metrics")),
            history=dsl.Artifact(uri=str(out / "history")),
        )  # fmt: skip
    [create] = k8s.requests_to("POST", TRAINJOBS.format(ns="kubeflow"))
    assert create.body["spec"]["trainer"]["numNodes"] == 2
    assert create.body["spec"]["trainer"]["image"] == "registry.example/cifar10-kfp:test"
    assert create.body["metadata"]["ownerReferences"][0]["uid"] == "uid-launcher"
    assert create.body["spec"]["activeDeadlineSeconds"] == 1800 + 600  # the launcher's timeout + its margin
    assert len(k8s.requests_to("DELETE", TRAINJOBS.format(ns="kubeflow"))) == 1  # deleted once collected
    _, info = load_model(out / "model")
    assert info.architecture == "simple_cnn" and info.num_classes == 4
    history = json.loads((out / "history").read_text())
    assert len(history) == 1 and history[0]["epoch"] == 1 and history[0]["world_size"] == 2
    assert store_env.list(store_env.root_uri("checkpoints", "run-42")), "no checkpoint written"


def yaml_config(server: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    })  # fmt: skip
