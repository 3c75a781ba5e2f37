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
from tests.k8s_fake_server import TRAINJOBS, K8sFakeServer, condition

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
