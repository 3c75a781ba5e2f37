"""Multi-node training through Kubeflow Trainer v2: the TrainJob manifest (validated with the typed models
of kubeflow-trainer-api) and the submit/watch/collect logic against a local Kubernetes API server."""

from __future__ import annotations

import json

import pytest
from kubeflow_trainer_api import models as trainer_models

from cifar10_kfp.trainjob import (
    TrainJobFailed,
    TrainJobRequest,
    build_trainjob,
    job_name,
    job_state,
    load_kubernetes,
    run_trainjob,
    submit_trainjob,
    watch_trainjob,
)
from tests.support.k8s_fake_server import TRAINJOBS, K8sFakeServer, condition

NS = "team-a"


def _request(**overrides) -> TrainJobRequest:
    values = dict(
        name=job_name("run-1234", "abc"), namespace=NS, image="ghcr.io/cifar10-kfp/cifar10-kfp:0.1.0",
        data_uri="minio://mlpipeline/v2/artifacts/run/preprocess/dataset", output_uri="s3://mlpipeline/p/trainjobs/x",
        checkpoint_uri="s3://mlpipeline/p/checkpoints/run-1234/abc", config={"preset": "fast", "epochs": 3},
        num_nodes=2, gpus_per_node=4, minio_endpoint="seaweedfs.kubeflow:9000",
    )  # fmt: skip
    values.update(overrides)
    return TrainJobRequest(**values)


def test_manifest_is_a_valid_trainjob_by_the_typed_models():
    manifest = build_trainjob(_request())
    job = trainer_models.TrainerV1alpha1TrainJob.from_dict(manifest)
    assert job.api_version == "trainer.kubeflow.org/v1alpha1" and job.kind == "TrainJob"
    assert job.spec.runtime_ref.name == "torch-distributed"
    trainer = job.spec.trainer
    assert trainer.num_nodes == 2 and trainer.num_proc_per_node == 4
    assert trainer.image == "ghcr.io/cifar10-kfp/cifar10-kfp:0.1.0"
    assert trainer.command[:4] == ["python", "-m", "cifar10_kfp.trainjob", "node"]
    assert json.loads(trainer.command[trainer.command.index("--config") + 1]) == {
        "epochs": 3,
        "preset": "fast",
    }
    assert trainer.resources_per_node.limits["nvidia.com/gpu"].actual_instance == "4"
    # credentials come from the secret by reference; no value is in the manifest
    secret_refs = {e.name: e.value_from.secret_key_ref for e in trainer.env if e.value_from}
    assert {k: (r.name, r.key) for k, r in secret_refs.items()} == {
        "MINIO_ACCESS_KEY": ("mlpipeline-minio-artifact", "accesskey"),
        "MINIO_SECRET_KEY": ("mlpipeline-minio-artifact", "secretkey"),
    }
    assert job.to_dict()["spec"]["trainer"]["numNodes"] == 2  # round-trips with the API's field names
    # every node pod runs under the restricted pod-security settings, whatever the runtime says
    (patch,) = job.spec.runtime_patches
    (node,) = patch.training_runtime_spec.template.spec.replicated_jobs
    pod = node.template.spec.template.spec
    assert node.name == "node" and pod.security_context.run_as_non_root is True
    assert pod.security_context.seccomp_profile.type == "RuntimeDefault"
    (container,) = pod.containers
    assert container.name == "node" and container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]


def test_cpu_manifest_requests_no_gpu_and_one_process_per_node():
    trainer = trainer_models.TrainerV1alpha1TrainJob.from_dict(
        build_trainjob(_request(gpus_per_node=0))
    ).spec.trainer
    assert "nvidia.com/gpu" not in trainer.resources_per_node.limits and trainer.num_proc_per_node == 1


def test_job_names_are_stable_valid_dns_labels():
    name = job_name("A_Run/with:odd chars" * 5, "h1")
    assert name == job_name("A_Run/with:odd chars" * 5, "h1") and name != job_name("other", "h1")
    assert len(name) <= 63 and name[0].isalpha() and all(c.isalnum() or c == "-" for c in name)
    with pytest.raises(ValueError, match="num_nodes=0"):
        build_trainjob(_request(num_nodes=0))


def test_job_state_reads_conditions():
    assert job_state({}).phase == "Pending"
    assert job_state({"status": {"jobsStatus": [{"name": "node", "active": 2}]}}).phase == "Running"
    failed = job_state(
        {"status": {"conditions": [condition("Failed", reason="DeadlineExceeded", message="too slow")]}}
    )
    assert (failed.phase, failed.reason, failed.message) == ("Failed", "DeadlineExceeded", "too slow")
    assert job_state({"status": {"conditions": [condition("Complete", status="False")]}}).phase == "Pending"


def _running():
    return {"jobsStatus": [{"name": "node", "active": 2, "ready": 2}]}


def test_submit_then_watch_streams_to_complete():
    script = [(0.1, _running()), (0.2, {"conditions": [condition("Complete", reason="JobsCompleted")]})]
    with K8sFakeServer(script=script) as k8s:
        api = load_kubernetes(k8s.url)
        manifest = build_trainjob(_request())
        submit_trainjob(api, manifest)
        seen = []
        state = watch_trainjob(
            api, NS, manifest["metadata"]["name"], watch_timeout_s=5, on_change=seen.append
        )
    assert state.phase == "Complete"
    assert [s.phase for s in seen] == ["Pending", "Running", "Complete"]
    [create] = k8s.requests_to("POST", TRAINJOBS.format(ns=NS))
    assert create.body == manifest
    watches = [r for r in k8s.requests_to("GET", TRAINJOBS.format(ns=NS)) if r.query.get("watch")]
    assert watches and watches[0].query["fieldSelector"] == f"metadata.name={manifest['metadata']['name']}"


def test_failed_job_raises_with_its_reason():
    script = [
        (
            0.1,
            {"conditions": [condition("Failed", reason="BackoffLimitExceeded", message="node-1 OOMKilled")]},
        )
    ]
    with K8sFakeServer(script=script) as k8s:
        api = load_kubernetes(k8s.url)
        manifest = build_trainjob(_request())
        submit_trainjob(api, manifest)
        with pytest.raises(TrainJobFailed, match="BackoffLimitExceeded: node-1 OOMKilled"):
            watch_trainjob(api, NS, manifest["metadata"]["name"], watch_timeout_s=5)


def test_retry_reattaches_to_a_running_job_and_replaces_a_failed_one():
    with K8sFakeServer() as k8s:
        api = load_kubernetes(k8s.url)
        manifest = build_trainjob(_request())
        submit_trainjob(api, manifest)
        submit_trainjob(api, manifest)  # a retried step: same name, still running -> re-attach
        assert len(k8s.requests_to("DELETE", TRAINJOBS.format(ns=NS))) == 0
        k8s.set_status(
            NS, manifest["metadata"]["name"], {"conditions": [condition("Failed", reason="Evicted")]}
        )
        submit_trainjob(api, manifest)  # failed before -> delete and create again (resumes from checkpoint)
        assert len(k8s.requests_to("DELETE", TRAINJOBS.format(ns=NS))) == 1
        assert len(k8s.requests_to("POST", TRAINJOBS.format(ns=NS))) == 4
        assert job_state(k8s.trainjobs[(NS, manifest["metadata"]["name"])]).phase == "Pending"


def test_missing_trainer_or_rbac_gives_an_actionable_error():
    with K8sFakeServer(trainer_installed=False) as k8s:
        with pytest.raises(TrainJobFailed, match="install Kubeflow Trainer v2"):
            submit_trainjob(load_kubernetes(k8s.url), build_trainjob(_request()))
    with K8sFakeServer(forbidden=("/apis/trainer.kubeflow.org",)) as k8s:
        with pytest.raises(TrainJobFailed, match="create/get/list/watch/delete on trainjobs"):
            submit_trainjob(load_kubernetes(k8s.url), build_trainjob(_request()))


def test_run_trainjob_collects_the_model_that_node_0_uploaded(store_env, tmp_path):
    """The launcher's whole path: submit, watch to Complete, download model/, history.json, metrics.json."""
    from cifar10_kfp.models import ModelInfo, build_model, load_model, save_model

    store_env.ensure_bucket()
    output_uri = store_env.root_uri("trainjobs", "job-1")
    node_out = tmp_path / "node0"
    model = build_model("simple_cnn", num_classes=4, image_size=16)
    info = ModelInfo(architecture="simple_cnn", num_classes=4, image_size=16,
                     class_names=[f"c{i}" for i in range(4)], mean=[0.5] * 3, std=[0.25] * 3)  # fmt: skip
    save_model(model, info, node_out / "model")
    (node_out / "history.json").write_text(json.dumps([{"epoch": 1, "val_acc": 0.5}]))
    (node_out / "metrics.json").write_text(json.dumps({"val_acc": 0.5}))
    store_env.put_dir(node_out, output_uri)  # what `python -m cifar10_kfp.trainjob node` does on node 0
    with K8sFakeServer(script=[(0.1, {"conditions": [condition("Complete")]})]) as k8s:
        state = run_trainjob(_request(output_uri=output_uri), tmp_path / "collected", api_client=load_kubernetes(k8s.url),
                             store=store_env)  # fmt: skip
    assert state.phase == "Complete"
    loaded, loaded_info = load_model(tmp_path / "collected" / "model")
    assert loaded_info.architecture == "simple_cnn"
    assert json.loads((tmp_path / "collected" / "metrics.json").read_text()) == {"val_acc": 0.5}


def _run_nodes_for_real(server: K8sFakeServer, ns: str, name: str, manifest: dict) -> None:
    """A stand-in for the Trainer controller + kubelet: run every node's command as a local process
    with the env the pod would get (secret refs resolved from this test's store env, PET_* rendezvous)."""
    import os
    import socket
    import subprocess
    import sys

    trainer = manifest["spec"]["trainer"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ)
    for item in trainer["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        env[item["name"]] = os.environ[item["name"]] if ref else item["value"]
    env["MINIO_ENDPOINT"] = os.environ[
        "MINIO_ENDPOINT"
    ]  # the store this test runs against, not the cluster's
    command = [
        sys.executable if trainer["command"][0] == "python" else trainer["command"][0],
        *trainer["command"][1:],
    ]
    server.set_status(ns, name, {"jobsStatus": [{"name": "node", "active": trainer["numNodes"]}]})
    procs = [
        subprocess.Popen(
            command,
            env={
                **env,
                "PET_NNODES": str(trainer["numNodes"]),
                "PET_NODE_RANK": str(rank),
                "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
                "PET_MASTER_ADDR": "127.0.0.1",
                "PET_MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            },
        )  # fmt: skip
        for rank in range(trainer["numNodes"])
    ]
    codes = [p.wait(timeout=300) for p in procs]
    if any(codes):
        server.set_status(
            ns,
            name,
            {"conditions": [condition("Failed", reason="NodeFailed", message=f"exit codes {codes}")]},
        )
    else:
        server.set_status(ns, name, {"conditions": [condition("Complete", reason="JobsCompleted")]})


@pytest.mark.slow
def test_train_on_trainer_component_trains_on_two_nodes(store_env, tmp_path, monkeypatch):
    """The multi-node train step end to end: the component creates the TrainJob through the Kubernetes API
    (kubeconfig -> local API server), two real torchrun nodes train with gloo from the object store, node 0
    uploads, and the component fills its Model/Metrics/history outputs."""
    from kfp import dsl

    from cifar10_kfp.data.format import save_prepared
    from cifar10_kfp.models import load_model
    from cifar10_kfp_components.trainjob import train_on_trainer
    from tests.support.data import make_tiny_dataset

    store_env.ensure_bucket()
    local = save_prepared(
        make_tiny_dataset(n_train=64, n_val=16, n_test=16, image_size=16), tmp_path / "d.safetensors"
    )
    data_uri = store_env.root_uri("prepared", "tiny", "dataset.safetensors")
    store_env.put_file(local, data_uri)
    with K8sFakeServer(controller=_run_nodes_for_real) as k8s:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml_config(k8s.url))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        out = tmp_path / "out"
        train_on_trainer.python_func(
            dataset=dsl.Dataset(uri=data_uri),
            training={"preset": "seed", "architecture": "simple_cnn", "epochs": 1, "batch_size": 16, "lr": 0.0,
                      "seed": 0, "extra_hparams": '{"device": "cpu"}', "checkpoint_every": 0},
            num_gpus=0, num_nodes=2, checkpoint_uri="", run_id="run-42", bucket="", storage_prefix="",
            image="registry.example/cifar10-kfp:test", minio_endpoint="ignored:9000", minio_secure=False,
            model=dsl.Model(uri=str(out / "model")), metrics=dsl.Metrics(uri=str(out / "metrics")),
            history=dsl.Artifact(uri=str(out / "history")),
        )  # fmt: skip
    [create] = k8s.requests_to("POST", TRAINJOBS.format(ns="kubeflow"))
    assert create.body["spec"]["trainer"]["numNodes"] == 2
    assert create.body["spec"]["trainer"]["image"] == "registry.example/cifar10-kfp:test"
    _, info = load_model(out / "model")
    assert info.architecture == "simple_cnn" and info.num_classes == 4
    history = json.loads((out / "history").read_text())
    assert len(history) == 1 and history[0]["epoch"] == 1
    assert store_env.list(store_env.root_uri("checkpoints", "run-42")), "no checkpoint written"


def yaml_config(server: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    })  # fmt: skip
