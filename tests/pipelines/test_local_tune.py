"""The ``cifar10-tune`` pipeline end to end with kfp.local (tiny): a real subset of CIFAR-10, the embedded
object store, a small study; the summary holds the study's figures and the final test accuracy."""

from __future__ import annotations

import json

import pytest

from cifar10_kfp.storage import ObjectStore
from cifar10_kfp_pipelines.cli import main
from tests.support.datagen import make_real_subset_archive


@pytest.mark.slow
def test_tune_pipeline_end_to_end(real_archive, store_env: ObjectStore, tmp_path):
    subset = make_real_subset_archive(
        real_archive, tmp_path / "subset.tar.gz", train_per_class=20, test_per_class=10
    )
    params = {"dataset_uri": subset, "preset": "seed", "architecture": "simple_cnn", "epochs": 2, "trial_epochs": 1,
              "num_gpus": 0, "min_accuracy": 0, "model_name": "e2e-tune", "n_trials": 3, "sampler": "random",
              "search_space": '{"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": true}}'}  # fmt: skip
    summary_path = tmp_path / "summary.json"
    args = [arg for key, value in params.items() for arg in ("--param", f"{key}={value}")]
    rc = main(["run-local", "--pipeline", "tune", *args, "--summary-json", str(summary_path),
               "--output-root", str(tmp_path / "runs")])  # fmt: skip
    summary = json.loads(summary_path.read_text())
    assert rc == 0, summary
    assert summary["status"] == "SUCCEEDED" and summary["pipeline"] == "cifar10-tune"
    metrics = summary["metrics"]
    assert metrics["trials_completed"] + metrics["trials_pruned"] == 3 and metrics["trials_completed"] >= 1
    assert 0.0 <= metrics["best_value"] <= 1.0 and 0.0 <= metrics["test_accuracy"] <= 1.0
    best_lr = summary["best_trial"]["lr"]
    assert 0.001 <= best_lr <= 0.1
    # the final model was trained with the best trial's lr, for the full epochs
    [train_dir] = (tmp_path / "runs").glob("tune-*/*/train-model")
    model_json = json.loads((train_dir / "model" / "model.json").read_text())
    config = model_json["extra"]["training_config"]
    assert config["lr"] == pytest.approx(best_lr) and config["epochs"] == 2
    assert summary["artifacts"]["tune_report"] and summary["published"]["uri"]
    journals = [uri for uri in store_env.list(store_env.root_uri("tune")) if uri.endswith("study.journal")]
    assert len(journals) == 1  # the study's state, where a retried task would resume it
