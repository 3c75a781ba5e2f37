"""Both pipelines end to end with kfp.local on a stratified subset of the real CIFAR-10 archive, against
the embedded object store (the training run also against a real MLflow server); bad parameters stop at the
validate step before any training."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from cifar10_kfp.storage import ObjectStore
from cifar10_kfp_pipelines.cli import main
from cifar10_kfp_pipelines.local import run_local
from tests.support.datagen import make_real_subset_archive
from tests.support.paths import ROOT

FAST = {
    "preset": "seed",
    "architecture": "simple_cnn",
    "epochs": "1",
    "image_size": "32",
    "num_gpus": "0",
    "min_accuracy": "0",
}


@pytest.fixture
def subset(real_archive, tmp_path):
    return make_real_subset_archive(
        real_archive, tmp_path / "subset.tar.gz", train_per_class=20, test_per_class=10
    )


def _params(**values) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--param", f"{key}={value}")]


@pytest.mark.slow
def test_training_pipeline_end_to_end(
    subset, store_env: ObjectStore, mlflow_server, tmp_path, monkeypatch, capsys
):
    # `MLFLOW_TRACKING_URI=... make run`: kfp.local's task processes inherit it, so the train step logs each
    # epoch to a run of its own and evaluate its final metrics to another (docs/tracking.md)
    experiment_name = f"run-local-{tmp_path.name}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", experiment_name)
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "KUBEFLOW_TRAINER_SERVER_URL"):
        monkeypatch.delenv(name, raising=False)
    summary_path = tmp_path / "summary.json"
    rc = main(["run-local", *_params(dataset_uri=subset, model_name="e2e-training", **FAST),
               "--summary-json", str(summary_path), "--output-root", str(tmp_path / "runs")])  # fmt: skip
    out = capsys.readouterr().out
    summary = json.loads(summary_path.read_text())
    assert rc == 0, summary
    assert summary["status"] == "SUCCEEDED" and summary["pipeline"] == "cifar10-training"
    assert summary["parameters"]["epochs"] == 1 and summary["parameters"]["dataset_uri"] == str(subset)
    metrics = summary["metrics"]
    assert (
        0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["num_examples"] == 100
    )  # 10 classes x 10 test images
    assert metrics["test_accuracy"] == metrics["accuracy"]  # one headline: as served, flip TTA
    published = summary["published"]
    assert published["uri"].startswith(store_env.root_uri("models", "e2e-training")) and published["version"]
    assert store_env.list(published["uri"])  # the published model is really in the store
    artifacts = summary["artifacts"]
    assert artifacts["dataset_archive"].startswith(store_env.root_uri("datasets", "sha256"))
    assert store_env.exists(artifacts["dataset_archive"]) and os.path.isdir(artifacts["model"])
    assert store_env.list(artifacts["checkpoints"]), "training wrote no checkpoint"
    assert os.path.isfile(artifacts["report"]) and open(artifacts["report"]).read().lstrip().startswith("<")
    # the exit handler also left the summary next to the run's records in the object store
    stored = json.loads(store_env.get_bytes(store_env.root_uri("runs", summary["run_id"], "summary.json")))
    assert stored["status"] == "SUCCEEDED" and stored["published"] == published
    assert stored["gate"]["passed"] is True and stored["failed_task"] == "" and stored["failures"] == []
    assert "test_accuracy" in out and "published" in out  # the final table
    # quiet by default (issue 16): task lines, the epoch table and the summary; the rest in per-task logs
    lines = out.splitlines()
    assert len(lines) < 80 and lines[-1] == f"summary written to {summary_path}", out
    assert "[train-model] started" in lines and any(
        line.startswith("[train-model] done in ") for line in lines
    )
    assert any(line.strip().startswith("1/1 ") for line in lines)  # the epoch line
    assert "executor_input" not in out.lower() and "Executing task" not in out
    assert "mlflow" not in out.lower()  # tracking adds nothing to the console
    logs = tmp_path / "runs" / os.path.basename(summary["local_root"]) / "logs"
    assert summary["logs"] == str(logs) and any(line.split() == ["logs", str(logs)] for line in lines)
    assert "Got executor_input" in (logs / "train-model.log").read_text()  # everything else is kept there
    assert summary["artifacts"]["tensorboard"].startswith(artifacts["checkpoints"])
    assert store_env.list(summary["artifacts"]["tensorboard"]), "training wrote no TensorBoard curves"
    # the run appears in the local comparison, and its curves can be fetched for tensorboard
    assert main(["runs", "--local", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["run_id"] == summary["run_id"] and rows[0]["state"] == "SUCCEEDED"
    assert rows[0]["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert (
        main(["tensorboard", "--run", summary["run_id"], "--logdir", str(tmp_path / "tb"), "--no-serve"]) == 0
    )
    assert list((tmp_path / "tb").glob("events.out.tfevents*"))
    client = mlflow_server.client()
    experiment = client.get_experiment_by_name(experiment_name)
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"train", "evaluate"} and {r.info.status for r in runs.values()} == {"FINISHED"}
    history = json.loads(open(os.path.join(artifacts["model"], "history.json")).read())
    logged = client.get_metric_history(runs["train"].info.run_id, "val/accuracy")
    assert [(m.step, m.value) for m in logged] == [(1, pytest.approx(history[0]["val_acc"]))]
    assert runs["train"].data.params["epochs"] == "1" and runs["train"].data.params["dataset_digest"]
    assert runs["evaluate"].data.metrics["accuracy"] == pytest.approx(metrics["accuracy"])


@pytest.mark.slow
def test_sweep_pipeline_end_to_end(real_archive, store_env: ObjectStore, tmp_path):
    archive = make_real_subset_archive(
        real_archive, tmp_path / "small.tar.gz", train_per_class=10, test_per_class=5
    )
    trials = [{"lr": 0.01}, {"lr": 0.05, "seed": 1}]
    params = {k: v for k, v in FAST.items()} | {"dataset_uri": str(archive), "hparam_sets": json.dumps(trials),
                                                "model_name": "e2e-sweep", "parallelism": 2}  # fmt: skip
    summary = run_local("sweep", params, output_root=tmp_path / "runs")
    assert summary["status"] == "SUCCEEDED", summary
    accuracies = summary["metrics"]["trial_accuracies"]
    assert len(accuracies) == 2 and all(0.0 <= a <= 1.0 for a in accuracies)
    best = summary["metrics"]["best_trial"]
    assert (
        summary["metrics"]["test_accuracy"]
        == pytest.approx(max(accuracies))
        == pytest.approx(accuracies[best])
    )
    assert summary["best_trial"]["lr"] == trials[best]["lr"]
    assert summary["parameters"]["parallelism"] == 2
    assert summary["published"]["uri"].startswith(store_env.root_uri("models", "e2e-sweep"))
    iterations = sorted(p.parent.name for p in (tmp_path / "runs").rglob("for-loop-*/train-model"))
    assert len(iterations) == 2  # one training per trial, the dataset prepared once
    assert len(list((tmp_path / "runs").rglob("preprocess-dataset"))) == 1


@pytest.mark.slow
def test_bad_parameters_fail_at_the_validate_step_and_nothing_trains(tmp_path, monkeypatch, subset):
    """No MINIO_ENDPOINT: run_local starts the embedded store itself, and stops it even though the run fails."""
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    before = {k: v for k, v in os.environ.items() if k.startswith("MINIO_")}
    summary = run_local("training", {"dataset_uri": str(subset), "num_gpus": 99, "epochs": -2},
                        output_root=tmp_path / "runs", validate_first=False)  # fmt: skip
    assert summary["status"] == "FAILED"
    assert summary["failed_task"] == "validate-training-params"  # recorded by the step itself
    assert summary["error"].startswith("ValueError: epochs=-2 is out of range")
    run_dirs = list((tmp_path / "runs").rglob("*"))
    assert not [p for p in run_dirs if p.name in ("train-model", "train-on-trainer", "download-dataset")]
    assert [p for p in run_dirs if p.name == "write-run-summary"], "the exit handler must still run"
    assert {k: v for k, v in os.environ.items() if k.startswith("MINIO_")} == before  # env restored


@pytest.mark.slow
def test_a_failed_download_is_named_with_its_error_in_the_summary(store_env, tmp_path):
    """The step records its own failure; the exit handler's summary (local and in the store) carries it."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/cifar-10-python.tar.gz"
    summary = run_local("training", {**FAST, "dataset_uri": url}, output_root=tmp_path / "runs")
    assert summary["status"] == "FAILED" and summary["failed_task"] == "download-dataset"
    assert summary["error"].startswith("DownloadError: ") and url in summary["error"]
    stored = json.loads(store_env.get_bytes(store_env.root_uri("runs", summary["run_id"], "summary.json")))
    assert (stored["failed_task"], stored["error"]) == (summary["failed_task"], summary["error"])
    assert stored["state"] == "FAILED" and stored["failures"][0]["task"] == "download-dataset"


@pytest.mark.slow
def test_a_missing_dataset_ends_the_output_with_the_step_its_error_and_its_log(store_env, tmp_path, capsys):
    missing = tmp_path / "no-such-archive.tar.gz"
    summary_path = tmp_path / "last-summary.json"
    rc = main(["run-local", *_params(dataset_uri=missing, **FAST), "--summary-json", str(summary_path),
               "--output-root", str(tmp_path / "runs")])  # fmt: skip
    assert rc == 1
    out = capsys.readouterr().out
    last = "\n".join(out.splitlines()[-10:])
    error = f"FileNotFoundError: dataset source '{missing}': no such file {missing}"
    assert "download-dataset" in last and error in last, out
    summary = json.loads(summary_path.read_text())
    assert (summary["failed_task"], summary["error"]) == ("download-dataset", error)
    log = summary["failed_task_log"]
    assert log in last and log.endswith("logs/download-dataset.log")
    assert "Traceback (most recent call last)" in open(log).read()  # the full story is in the log
    assert len(out.splitlines()) < 30 and "Traceback" not in out


def test_run_local_rejects_bad_parameters_before_starting_anything(tmp_path, capsys):
    rc = main(["run-local", "--param", "epochs=-1", "--output-root", str(tmp_path)])
    assert rc == 2
    assert "epochs=-1 is out of range: use 0 (the preset's default) or 1..10000" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    assert main(["run-local", "--param", "epochs"]) == 2


def test_local_defaults_fill_in_only_what_the_caller_left_out():
    from cifar10_kfp_pipelines.local import cuda_available, local_defaults

    chosen = {"preset": "fast", "num_gpus": 2}
    assert local_defaults(chosen) == chosen
    if not cuda_available():
        assert local_defaults({"epochs": 1}) == {"epochs": 1, "preset": "cpu", "num_gpus": 0}


def test_cuda_available_agrees_with_torch():
    import torch

    from cifar10_kfp_pipelines.local import cuda_available

    assert cuda_available() == torch.cuda.is_available()


@pytest.mark.parametrize("chosen", [{"preset": "cpu", "num_gpus": 0}, {}], ids=["given", "defaulted"])
def test_run_local_builds_the_pipeline_without_importing_torch(chosen):
    """run-local's own process needs no torch: importing it would add a second to every run (and slow
    the build); the tasks import it in their own processes. Only a default on a machine with a GPU
    driver asks torch about CUDA."""
    from cifar10_kfp_pipelines.local import GPU_DEVICE_GLOBS

    if not chosen and any(glob.glob(pattern) for pattern in GPU_DEVICE_GLOBS):
        pytest.skip("a GPU driver is present: torch decides the default preset")
    code = f"""
import sys
from cifar10_kfp_pipelines.catalog import build
from cifar10_kfp_pipelines.local import _resolve_params, local_defaults
from cifar10_kfp_pipelines.policy import ClusterPolicy
_resolve_params("training", local_defaults({{"dataset_uri": "/data.tar.gz", **{chosen!r}}}))
build("training", ClusterPolicy.for_local("127.0.0.1:9000"))
assert "torch" not in sys.modules, "run-local imported torch"
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("in_task", [True, False])
def test_the_heap_is_frozen_before_exit_only_in_a_kfp_task_process(in_task):
    code = """
import gc
from cifar10_kfp.runs.process import freeze_heap_before_exit
frozen = freeze_heap_before_exit()
assert frozen == (gc.get_freeze_count() > 0), (frozen, gc.get_freeze_count())
print(frozen)
"""
    env = {k: v for k, v in os.environ.items() if k != "_KFP_RUNTIME"}
    if in_task:
        env["_KFP_RUNTIME"] = "true"  # what the compiled component command sets
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(in_task)
