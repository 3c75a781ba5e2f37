"""The run-record layout (cifar10_kfp/runs/records.py) on the real object store, and a failing step process
recording its own error the way a component does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from cifar10_kfp.runs.records import (
    RunRecords,
    describe_exception,
    read_summary,
    report_failures,
    require_endpoint,
    sweep_outputs,
    training_outputs,
)
from cifar10_kfp.storage import StorageError
from tests.support.paths import ROOT

STEP = """
from cifar10_kfp.data.download import DownloadError
from cifar10_kfp.runs.records import report_failures

print("hook installed:", report_failures("", ""))
raise DownloadError("download of https://example.invalid/c.tar.gz failed: no network; download it elsewhere and point DATASET at it")
"""


def _run_step(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", STEP], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_a_failing_step_records_its_task_and_error_then_fails_as_before(store_env):
    env = {**os.environ, "CIFAR10_KFP_RUN_ID": "run-42", "CIFAR10_KFP_TASK": "download-dataset"}
    done = _run_step(env)
    assert done.returncode == 1
    assert "hook installed: True" in done.stdout
    assert "Traceback" in done.stderr and "DownloadError: download of" in done.stderr  # the usual traceback
    assert "recorded this failure for the run summary" in done.stderr
    [failure] = RunRecords(store_env, "run-42").failures()
    assert failure["task"] == "download-dataset"
    assert failure["error"] == (
        "DownloadError: download of https://example.invalid/c.tar.gz failed: no network; "
        "download it elsewhere and point DATASET at it"
    )
    assert failure["where"].startswith("<string>:")


def test_outside_a_run_nothing_is_recorded(store_env):
    env = {k: v for k, v in os.environ.items() if k not in ("CIFAR10_KFP_RUN_ID", "CIFAR10_KFP_TASK")}
    done = _run_step(env)
    assert done.returncode == 1 and "hook installed: False" in done.stdout
    assert report_failures(env={}) is False


def test_a_store_that_cannot_take_the_record_never_hides_the_steps_error(store_env):
    env = {**os.environ, "CIFAR10_KFP_RUN_ID": "r", "CIFAR10_KFP_TASK": "t", "MINIO_ENDPOINT": "127.0.0.1:9",
           "CIFAR10_KFP_RETRY_BUDGET_S": "0"}  # fmt: skip
    done = _run_step(env)
    assert done.returncode == 1 and "DownloadError: download of" in done.stderr
    assert "could not record this failure" in done.stderr


def test_describe_exception_borrows_the_message_of_a_silent_exception():
    try:
        try:
            raise ConnectionResetError("peer reset the connection")
        except ConnectionResetError as exc:
            raise TimeoutError() from exc
    except TimeoutError as exc:
        assert describe_exception(exc) == "TimeoutError: peer reset the connection"
    assert describe_exception(KeyError("epochs")) == "KeyError: 'epochs'"


def test_records_round_trip_and_a_missing_one_is_none(store_env):
    records = RunRecords(store_env, "run-7")
    assert records.read("outputs.json") is None and records.failures() == []
    uri = records.write("published.json", {"uri": "s3://b/m/v1", "version": "v1"})
    assert uri == store_env.root_uri("runs", "run-7", "published.json")
    assert records.read("published.json") == {"uri": "s3://b/m/v1", "version": "v1"}
    records.write("summary.json", {"status": "SUCCEEDED"})
    assert read_summary(store_env, "run-7") == {"status": "SUCCEEDED"}
    assert read_summary(store_env, "no-such-run") is None


def _artifact(uri: str, **metadata) -> SimpleNamespace:
    return SimpleNamespace(uri=uri, metadata=metadata)


def test_training_and_sweep_outputs_name_every_artifact():
    archive = _artifact("s3://kfp/archive", cache_uri="s3://b/p/datasets/sha256/ab/c.tar.gz")
    dataset = _artifact("s3://kfp/dataset", cache_uri="s3://b/p/prepared/ab")
    record = training_outputs(
        pipeline="cifar10-training", run_id="r1", params_json=json.dumps({"epochs": 2}), test_accuracy=0.8,
        archive=archive, dataset=dataset, model=_artifact("s3://kfp/model", checkpoint_uri="s3://b/p/ckpt/"),
        train_metrics=_artifact("s3://kfp/tm", loss=0.3, val_acc=0.7, done=True), history=_artifact("s3://kfp/h"),
        eval_metrics=_artifact("s3://kfp/em", accuracy_tta=0.81), report=_artifact("s3://kfp/report"),
    )  # fmt: skip
    assert record["metrics"] == {
        "train_loss": 0.3,
        "val_acc": 0.7,
        "accuracy_tta": 0.81,
        "test_accuracy": 0.8,
    }
    assert record["artifacts"]["dataset_archive"] == "s3://b/p/datasets/sha256/ab/c.tar.gz"
    assert record["artifacts"]["checkpoints"] == "s3://b/p/ckpt/" and record["parameters"] == {"epochs": 2}
    best = _artifact("s3://kfp/best", trial_index=1, trial='{"lr": 0.1}', sweep_accuracies=[0.5, 0.6])
    sweep = sweep_outputs(pipeline="cifar10-sweep", run_id="r2", params_json="{}", best_accuracy=0.6,
                          archive=archive, dataset=dataset, best_model=best)  # fmt: skip
    assert sweep["metrics"] == {"test_accuracy": 0.6, "best_trial": 1, "trial_accuracies": [0.5, 0.6]}
    assert sweep["best_trial"] == {"lr": 0.1}


def test_require_endpoint_names_both_stores(store_env):
    endpoint = store_env.config.endpoint
    assert require_endpoint(store_env, f"http://{endpoint}/") is store_env
    with pytest.raises(
        StorageError,
        match=f"compiled for the object store 'seaweedfs.kubeflow:9000' but MINIO_ENDPOINT is '{endpoint}'",
    ):
        require_endpoint(store_env, "seaweedfs.kubeflow:9000")
