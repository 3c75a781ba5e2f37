"""submit / schedule / runs with the real kfp.Client against a local KFP v2beta1 server; doctor against a
local Kubernetes API server. Requests are recorded and asserted on."""

from __future__ import annotations

import json

import pytest

from cifar10_kfp_pipelines.cli import main
from tests.support.kfp_fake_server import KfpFakeServer


@pytest.fixture
def kfp_server():
    with KfpFakeServer() as server:
        yield server


def _pipeline_spec(body: dict) -> dict:
    """The PipelineSpec inside a create-run body (kfp wraps it with the platform spec when there is one)."""
    return body["pipeline_spec"].get("pipeline_spec", body["pipeline_spec"])


def _task_caching(spec: dict) -> dict[str, bool]:
    """task name -> enableCache, over every DAG in the spec."""
    spec = spec.get("pipeline_spec", spec)
    out = {}
    for component in [spec["root"], *spec["components"].values()]:
        for name, task in (component.get("dag") or {}).get("tasks", {}).items():
            out[name] = task.get("cachingOptions", {}).get("enableCache", False)
    return out


def test_submit_creates_experiment_and_run_with_typed_params_and_prints_url(kfp_server, capsys):
    rc = main(["submit", "--host", kfp_server.url, "--experiment", "nightly", "--param", "epochs=3",
               "--param", "lr=0.2", "--param", "preset=seed"])  # fmt: skip
    assert rc == 0
    [create_exp] = kfp_server.requests("POST", "/experiments")
    assert create_exp.body["display_name"] == "nightly"
    [create_run] = kfp_server.requests("POST", "/runs")
    body = create_run.body
    assert (
        body["experiment_id"]
        == kfp_server.state.experiments[next(iter(kfp_server.state.experiments))]["experiment_id"]
    )
    assert body["runtime_config"]["parameters"] == {"epochs": 3, "lr": 0.2, "preset": "seed"}
    spec = _pipeline_spec(body)
    assert spec["pipelineInfo"]["name"] == "cifar10-training"
    secrets = json.dumps(body["pipeline_spec"]["platform_spec"])
    assert "mlpipeline-minio-artifact" in secrets
    caching = _task_caching(spec)
    assert caching["download-dataset"] and caching["preprocess-dataset"] and not caching["train-model"]
    run_id = next(iter(kfp_server.state.runs))
    assert f"{kfp_server.url}/#/runs/details/{run_id}" in capsys.readouterr().out


def test_submit_no_cache_turns_caching_off_in_the_spec_itself(kfp_server):
    assert main(["submit", "--host", kfp_server.url, "--no-cache", "--image", "registry.example/c:2"]) == 0
    [create_run] = kfp_server.requests("POST", "/runs")
    assert not any(_task_caching(create_run.body["pipeline_spec"]).values())
    executors = _pipeline_spec(create_run.body)["deploymentSpec"]["executors"].values()
    assert {e["container"]["image"] for e in executors} == {"registry.example/c:2"}


def test_submit_reuses_an_existing_experiment(kfp_server):
    main(["submit", "--host", kfp_server.url, "--experiment", "e1"])
    main(["submit", "--host", kfp_server.url, "--experiment", "e1"])
    assert len(kfp_server.requests("POST", "/experiments")) == 1
    assert len(kfp_server.state.runs) == 2
    lookups = [r for r in kfp_server.requests("GET", "/experiments") if "filter" in r.query]
    assert lookups and "e1" in json.dumps(json.loads(lookups[0].query["filter"]))


def test_submit_rejects_bad_params_before_any_request(kfp_server, capsys):
    assert main(["submit", "--host", kfp_server.url, "--param", "num_gpus=99"]) == 2
    assert "num_gpus=99" in capsys.readouterr().err
    assert kfp_server.state.requests == []


def test_schedule_create_disable_enable_delete(kfp_server, capsys):
    rc = main(["schedule", "--host", kfp_server.url, "--cron", "0 0 3 * * *", "--name", "nightly",
               "--max-concurrency", "2", "--no-catchup", "--param", "epochs=5"])  # fmt: skip
    assert rc == 0
    [create] = kfp_server.requests("POST", "/recurringruns")
    body = create.body
    assert body["display_name"] == "nightly"
    assert body["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"
    assert int(body["max_concurrency"]) == 2 and body["no_catchup"] is True
    assert body["runtime_config"]["parameters"] == {"epochs": 5}
    assert _pipeline_spec(body)["pipelineInfo"]["name"] == "cifar10-training"
    job_id = next(iter(kfp_server.state.recurring_runs))

    assert main(["schedule", "--host", kfp_server.url, "--disable", "nightly"]) == 0
    assert kfp_server.state.recurring_runs[job_id]["status"] == "DISABLED"
    assert main(["schedule", "--host", kfp_server.url, "--enable", "nightly"]) == 0
    assert kfp_server.state.recurring_runs[job_id]["status"] == "ENABLED"
    assert [r.path for r in kfp_server.requests("POST", f"/recurringruns/{job_id}")] == [
        f"/apis/v2beta1/recurringruns/{job_id}:disable",
        f"/apis/v2beta1/recurringruns/{job_id}:enable",
    ]
    assert main(["schedule", "--host", kfp_server.url, "--delete", "nightly"]) == 0
    assert kfp_server.state.recurring_runs == {}
    assert main(["schedule", "--host", kfp_server.url, "--disable", "nightly"]) == 2
    assert "no recurring run named 'nightly'" in capsys.readouterr().err


def test_schedule_refuses_a_duplicate_name_and_a_5_field_cron(kfp_server, capsys):
    assert main(["schedule", "--host", kfp_server.url, "--cron", "0 0 3 * * *", "--name", "n"]) == 0
    assert main(["schedule", "--host", kfp_server.url, "--cron", "0 0 3 * * *", "--name", "n"]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["schedule", "--host", kfp_server.url, "--cron", "0 3 * * *", "--name", "m"]) == 2
    assert "6 fields" in capsys.readouterr().err
    assert len(kfp_server.state.recurring_runs) == 1


def test_runs_lists_newest_first_with_metrics_from_the_run_summaries(kfp_server, store_env, capsys):
    old = kfp_server.add_run("older run", state="FAILED")
    new = kfp_server.add_run("newer run")
    store_env.ensure_bucket()
    summary = {"status": "SUCCEEDED", "metrics": {"test_accuracy": 0.8123, "val_acc": 0.8}, "published": {"uri": "s3://x", "version": "v7"}}  # fmt: skip
    store_env.put_bytes(
        json.dumps(summary).encode(), store_env.root_uri("runs", new["run_id"], "summary.json")
    )
    assert main(["runs", "--host", kfp_server.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["created", "state", "test_acc"]
    assert "newer run" in lines[1] and "0.8123" in lines[1] and "v7" in lines[1]
    assert "older run" in lines[2] and "FAILED" in lines[2]
    [listing] = kfp_server.requests("GET", "/runs")
    assert listing.query["sort_by"] == "created_at desc"
    assert old["run_id"] in lines[2]


# doctor: tests/cluster/test_doctor.py runs it against the real API server, Trainer and authorizer.
