"""The multi-node train step end to end on the real control plane: the component creates the TrainJob, the
real Trainer, JobSet and Job controllers make the node pods, and each pod's own container (its command and env
as the API server stored them, `$(VAR)` expanded as the kubelet does, the completion index from its
annotation) runs as a local process: two real torchrun nodes with c10d rendezvous and gloo against the embedded
S3 store. kwok then reports each pod's exit as its container's. The component fills Model/Metrics/history."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import pytest

from tests.cluster.helpers import (
    launcher_pod,
    running_pods,
    trainjobs_cleaned,  # noqa: F401 - autouse fixture: frees the GPUs after each test
    wait_until,
)
from tests.support.torchrun_agents import free_port


def expand_like_the_kubelet(arg: str, env: dict[str, str]) -> str:
    """``$(VAR)`` in a container's command is replaced by the container's variable when it is defined;
    ``$$`` escapes (kubernetes/kubernetes third_party/forked/golang/expansion, as the kubelet applies it)."""

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, arg)


def test_the_kubelet_stand_in_expands_like_the_kubelet():
    env = {"PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500"}
    assert expand_like_the_kubelet("$(PET_MASTER_ADDR):$(PET_MASTER_PORT)", env) == "job-node-0-0.job:29500"
    assert expand_like_the_kubelet("$(UNSET)-$$(PET_MASTER_PORT)", env) == "$(UNSET)-$(PET_MASTER_PORT)"


def _container_env(pod: dict, port: int) -> dict[str, str]:
    """The env the kubelet would give the pod's `node` container; secrets from this test's store env, node 0's
    headless-service name as 127.0.0.1 (one machine), the store the test runs, not the cluster's."""
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    env = dict(os.environ)
    for item in container.get("env", []):
        source = item.get("valueFrom") or {}
        if "secretKeyRef" in source:
            env[item["name"]] = os.environ[item["name"]]
        elif "fieldRef" in source:
            env[item["name"]] = _field(pod, source["fieldRef"]["fieldPath"])
        else:
            env[item["name"]] = item.get("value", "")
    env.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               MINIO_ENDPOINT=os.environ["MINIO_ENDPOINT"])  # fmt: skip
    return env


def _field(pod: dict, path: str) -> str:
    """A downward-API field of the pod: ``metadata.annotations['k']``, ``metadata.labels['k']`` or a dotted path."""
    keyed = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
    if keyed:
        return pod["metadata"].get(keyed.group(1), {}).get(keyed.group(2), "")
    value = pod
    for part in path.split("."):
        value = (value or {}).get(part)
    return str(value or "")


def _run_node(cp, namespace: str, pod: dict, port: int, codes: dict) -> None:
    codes[pod["metadata"]["name"]] = "not started"
    env = _container_env(pod, port)
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
    command = [expand_like_the_kubelet(arg, env) for arg in container["command"]]
    command[0] = sys.executable if command[0] == "python" else command[0]
    command[command.index("--output-dir") + 1] += f"-{env['PET_NODE_RANK']}"  # one machine, two "pods"
    code = subprocess.run(command, env=env, timeout=300).returncode
    codes[pod["metadata"]["name"]] = code
    if code == 0:
        cp.succeed_pod(namespace, pod["metadata"]["name"])
    else:
        cp.fail_pod(namespace, pod["metadata"]["name"], exit_code=code)


@pytest.mark.slow
def test_train_on_trainer_trains_on_two_real_nodes(control_plane, trainer_stack, cluster_namespace, store_env, tmp_path,
                                                   monkeypatch):  # fmt: skip
    namespace = cluster_namespace
    from kfp import dsl

    from cifar10_kfp.data.format import save_prepared
    from cifar10_kfp.train.models import load_model
    from cifar10_kfp_components.trainjob import train_on_trainer
    from tests.support.data import make_tiny_dataset

    cp = control_plane
    store_env.ensure_bucket()
    local = save_prepared(
        make_tiny_dataset(n_train=64, n_val=16, n_test=16, image_size=16), tmp_path / "d.st"
    )
    data_uri = store_env.root_uri("prepared", "tiny", "dataset.safetensors")
    store_env.put_file(local, data_uri)
    owner = launcher_pod(cp, namespace)
    monkeypatch.setenv("KFP_POD_NAME", owner["name"])
    monkeypatch.setenv("KFP_POD_UID", owner["uid"])
    monkeypatch.setenv("KUBECONFIG", str(cp.kubeconfig))
    monkeypatch.setenv("CIFAR10_KFP_NAMESPACE", namespace)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    out, failure = tmp_path / "out", []

    def step():
        try:
            train_on_trainer.python_func(
                dataset=dsl.Dataset(uri=data_uri),
                training={"preset": "seed", "architecture": "simple_cnn", "epochs": 1, "batch_size": 16, "lr": 0.05,
                          "seed": 0, "extra_hparams": '{"device": "cpu"}', "checkpoint_every": 0},
                num_gpus=0, num_nodes=2, min_nodes=0, max_restarts=1, trainjob_timeout_h=0.5, keep_trainjob=0,
                service_account="", image_pull_secrets="", checkpoint_uri="", run_id="run-42", bucket="",
                storage_prefix="", image="registry.example/cifar10-kfp:test", minio_endpoint="ignored:9000",
                minio_secure=False, model=dsl.Model(uri=str(out / "model")),
                metrics=dsl.Metrics(uri=str(out / "metrics")), history=dsl.Artifact(uri=str(out / "history")),
            )  # fmt: skip
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            failure.append(exc)

    launcher = threading.Thread(target=step, daemon=True)
    launcher.start()
    job = wait_until("the TrainJob", lambda: json.loads(cp.kubectl_ok("get", "trainjobs", "-n", namespace, "-o",
                                                                      "json").stdout)["items"])[0]  # fmt: skip
    name = job["metadata"]["name"]
    assert job["metadata"]["ownerReferences"][0]["uid"] == owner["uid"]
    pods = running_pods(cp, namespace, name, 2)
    port, codes = free_port(), {}
    nodes = [threading.Thread(target=_run_node, args=(cp, namespace, p, port, codes)) for p in pods]
    for node in nodes:
        node.start()
    for node in nodes:
        node.join(330)
    launcher.join(120)
    assert not launcher.is_alive() and not failure, failure
    # Both nodes exit 0 only if their weights agree after training (engine.check_replicas_agree): at lr 0.05 a
    # run whose gradients were not all-reduced across the two pods ends with different weights and fails.
    assert sorted(codes.values()) == [0, 0], codes
    _, info = load_model(out / "model")
    assert info.architecture == "simple_cnn" and info.num_classes == 4
    history = json.loads((out / "history").read_text())
    assert len(history) == 1 and history[0]["epoch"] == 1 and history[0]["world_size"] == 2
    assert store_env.list(store_env.root_uri("checkpoints", "run-42")), "no checkpoint written"
    wait_until("the TrainJob deleted once collected",
               lambda: cp.kubectl("get", "trainjob", name, "-n", namespace).returncode != 0)  # fmt: skip
