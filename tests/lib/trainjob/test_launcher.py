"""The launcher's parts that need no Kubernetes API: the request of a pipeline run, and the completion marker
in the real (embedded) object store. Its life against the real Trainer, JobSet and Job controllers is tested in
tests/cluster/test_launcher_life.py and tests/cluster/test_elastic.py."""

from __future__ import annotations

import json


def test_the_completion_marker_is_written_after_the_outputs_and_read_back(store_env, tmp_path):
    from cifar10_kfp.trainjob import DONE_MARKER, read_marker, upload_outputs

    store_env.ensure_bucket()
    uri = store_env.root_uri("trainjobs", "job-1")
    assert read_marker(uri, store_env) is None
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.safetensors").write_bytes(b"w")
    (tmp_path / "metrics.json").write_text(json.dumps({"val_acc": 0.5}))
    upload_outputs(tmp_path, uri, store_env, world_size=3)
    marker = read_marker(uri, store_env)
    assert marker["complete"] is True and marker["world_size"] == 3
    listed = store_env.list(uri)
    assert any(u.endswith(f"job-1/{DONE_MARKER}") for u in listed)
    assert any(u.endswith("model/weights.safetensors") for u in listed)


def test_a_runs_request_is_named_owned_and_deadlined_from_the_pipelines_values(store_env, monkeypatch):
    from cifar10_kfp.train.config import make_config
    from cifar10_kfp.trainjob import job_name, request_for_run

    monkeypatch.setenv("KFP_POD_NAME", "training-x-system-container-impl-7")
    monkeypatch.setenv("KFP_POD_UID", "uid-7")
    config = make_config("cpu")
    job = request_for_run(
        config, run_id="run-7", store=store_env, data_uri="s3://b/d", checkpoint_uri="s3://b/c", image="img",
        num_nodes=4, gpus_per_node=2, min_nodes=2, max_restarts=5, timeout_h=2.0, service_account=" sa ",
        image_pull_secrets="regcred, mirror,,",
    )  # fmt: skip
    assert job.name == job_name("run-7", config.config_hash()) and job.output_uri.endswith(
        f"/trainjobs/{job.name}"
    )
    assert job.active_deadline_s == 2 * 3600 + 600  # the launcher's timeout acts first
    assert job.image_pull_secrets == ("regcred", "mirror") and job.service_account == "sa"
    assert job.owner == {"name": "training-x-system-container-impl-7", "uid": "uid-7"}
    assert (job.min_nodes, job.num_nodes, job.max_restarts, job.elastic) == (2, 4, 5, True)


def test_the_launchers_mlflow_run_reaches_the_nodes_without_any_secret(store_env, monkeypatch):
    from cifar10_kfp.train.config import make_config
    from cifar10_kfp.trainjob import build_trainjob, request_for_run

    injected = {  # what KFP 2.17's driver sets on the launcher's container (bearer mode)
        "MLFLOW_TRACKING_URI": "https://mlflow.example.com", "MLFLOW_EXPERIMENT_ID": "7",
        "MLFLOW_RUN_ID": "r-123", "MLFLOW_WORKSPACE": "team-a", "MLFLOW_TRACKING_TOKEN": "tok-secret",
    }  # fmt: skip
    for name, value in injected.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_AUTH", raising=False)
    job = request_for_run(make_config("cpu"), run_id="run-8", store=store_env, data_uri="s3://b/d",
                          checkpoint_uri="s3://b/c", image="img", num_nodes=2, gpus_per_node=0)  # fmt: skip
    env = build_trainjob(job)["spec"]["trainer"]["env"]
    passed = {e["name"]: e.get("value") for e in env if e["name"].startswith("MLFLOW_")}
    assert passed == {k: v for k, v in injected.items() if k != "MLFLOW_TRACKING_TOKEN"}
    assert "tok-secret" not in str(build_trainjob(job))

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://alice:pw@mlflow.example.com")
    job = request_for_run(make_config("cpu"), run_id="run-8", store=store_env, data_uri="s3://b/d",
                          checkpoint_uri="s3://b/c", image="img", num_nodes=2, gpus_per_node=0)  # fmt: skip
    assert job.tracking_env == {} and "pw@" not in str(build_trainjob(job))
