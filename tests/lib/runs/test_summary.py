"""The run summary tells the truth on every KFP version.

Each case feeds the exit-handler component (``write_run_summary``, through kfp's own ``Executor``, so the
payload is parsed exactly as in a pod) the *exact* ``PipelineTaskFinalStatus`` payload a KFP version
hands it, with the run records that run leaves in the real object store. The payloads, from the KFP
sources (kubeflow/pipelines backend/src/v2/driver/resolve.go, ``TaskFinalStatus`` case, at tags 2.15.0,
2.16.1 and 2.17.0: ``protojson.Marshal`` of ``PipelineTaskFinalStatus{State: <MLMD state of the
exit-handler-1 DAG>, PipelineTaskName, PipelineJobResourceName: {{workflow.name}}, Error: &status.Status{}}``)
and kfp 2.17.3's kfp/local/orchestrator/orchestrator_utils.py. Which state each scenario produces follows
from backend/src/v2/metadata/client.go ``UpdateDAGExecutionsState`` (called only for a launcher's own
parent DAG, and recursive only from 2.17.0, kubeflow/pipelines#13322; #11979, #13321) as explained in
cifar10_kfp/runs/summary.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kfp.dsl.executor import Executor

from cifar10_kfp.data.download import DownloadError
from cifar10_kfp.runs.records import RunRecords
from cifar10_kfp.runs.summary import ReportedStatus, decide_status
from cifar10_kfp_components.summary import write_run_summary

WORKFLOW = "cifar10-training-x7k2p"  # {{workflow.name}}: the pipeline name + Argo's generateName suffix


def backend(state: str) -> dict:
    """The payload of KFP 2.15, 2.16 and 2.17 (the driver code is the same; only ``state`` differs)."""
    return {
        "state": state,
        "pipelineTaskName": "exit-handler-1",
        "pipelineJobResourceName": WORKFLOW,
        "error": {},
    }


LOCAL_SUCCEEDED = {"state": "SUCCEEDED", "pipeline_job_resource_name": "local-pipeline-exit-handler-1",
                   "pipeline_task_name": "exit-handler-1", "error": {}}  # fmt: skip
LOCAL_FAILED = {"state": "FAILED", "pipeline_job_resource_name": "local-pipeline-exit-handler-1",
                "pipeline_task_name": "exit-handler-1", "error": {"code": 1, "message": "Task exit-handler-1 failed."}}  # fmt: skip

OUTPUTS = {"pipeline": "cifar10-training", "parameters": {"epochs": 3}, "metrics": {"test_accuracy": 0.91},
           "artifacts": {"model": "s3://mlpipeline/v2/artifacts/model", "checkpoints": "s3://b/ckpt/"}}  # fmt: skip
DOWNLOAD_ERROR = "download of https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz failed: [Errno 101] Network is unreachable"


def _fail(records: RunRecords, task: str, exc: Exception) -> None:
    try:
        raise exc
    except Exception as raised:  # a real traceback, as in a step
        records.record_failure(task, raised)


def published(records):
    records.write("outputs.json", OUTPUTS)
    records.write("gate.json", {"passed": True, "reason": "first model of this name"})
    records.write("published.json", {"uri": "s3://b/models/m/v1/", "version": "v1"})


def gate_refused(records):
    records.write("outputs.json", OUTPUTS)
    records.write("gate.json", {"passed": False, "reason": "0.9100 is not better than the champion's 0.9300"})


def download_failed(records):
    _fail(records, "download-dataset", DownloadError(DOWNLOAD_ERROR))


def train_failed(records):
    try:
        raise MemoryError("CUDA out of memory")
    except MemoryError as cause:
        _fail(records, "train-model", RuntimeError("training failed at epoch 2"))
        del cause


def train_killed(records):
    """The train pod was OOM-killed: no step could record anything, the launcher never reported."""


# scenario -> (records the run left, {KFP version: payload}, expected status, failed_task, error fragment)
SCENARIOS = {
    "published": (published, {"2.15": backend("RUNNING"), "2.16": backend("RUNNING"), "2.17": backend("COMPLETE"),
                              "kfp.local": LOCAL_SUCCEEDED}, "SUCCEEDED", "", ""),
    "gate refused": (gate_refused, {"2.15": backend("RUNNING"), "2.16": backend("RUNNING"),
                                    "2.17": backend("RUNNING"), "2.17 record-outputs last": backend("COMPLETE"),
                                    "kfp.local": LOCAL_SUCCEEDED}, "SUCCEEDED", "", ""),
    "download failed": (download_failed, {"2.15": backend("FAILED"), "2.16": backend("FAILED"),
                                          "2.17": backend("FAILED"), "kfp.local": LOCAL_FAILED},
                        "FAILED", "download-dataset", f"DownloadError: {DOWNLOAD_ERROR}"),
    "train failed": (train_failed, {"2.15": backend("RUNNING"), "2.16": backend("RUNNING"),
                                    "2.17": backend("FAILED"), "kfp.local": LOCAL_FAILED},
                     "FAILED", "train-model", "RuntimeError: training failed at epoch 2"),
    "train killed": (train_killed, {"2.15": backend("RUNNING"), "2.16": backend("RUNNING"),
                                    "2.17": backend("RUNNING"), "kfp.local": LOCAL_FAILED},
                     "FAILED", "", "no step recorded an error"),
}  # fmt: skip
CASES = [(scenario, version) for scenario, (_, payloads, *_) in SCENARIOS.items() for version in payloads]


def run_exit_handler(payload: dict, run_id: str, tmp_path) -> dict:
    """Run write_run_summary as the KFP executor in a pod would, with ``payload`` as its status input."""
    executor_input = {
        "inputs": {"parameterValues": {"status": payload, "pipeline_name": "cifar10-training", "run_id": run_id,
                                       "checkpoint_uri": "", "bucket": "", "storage_prefix": ""}},
        "outputs": {"artifacts": {"summary": {"artifacts": [{
            "name": "summary", "type": {"schemaTitle": "system.Artifact", "schemaVersion": "0.0.1"},
            "uri": str(tmp_path / "summary"), "metadata": {}}]}},
            "outputFile": str(tmp_path / "executor_output.json")},
    }  # fmt: skip
    Executor(executor_input, write_run_summary.python_func).execute()
    return json.loads((tmp_path / "summary").read_text())


@pytest.mark.parametrize(("scenario", "version"), CASES, ids=[f"{s}-{v}" for s, v in CASES])
def test_the_summary_is_true_for_every_kfp_version(scenario, version, store_env, tmp_path, capsys):
    leave_records, payloads, status, failed_task, error = SCENARIOS[scenario]
    run_id = f"run-{abs(hash((scenario, version)))}"
    leave_records(RunRecords(store_env, run_id))
    summary = run_exit_handler(payloads[version], run_id, tmp_path)
    assert (summary["status"], summary["failed_task"]) == (status, failed_task), summary
    assert error in summary["error"] and (error or summary["error"] == "")
    assert summary["state"] == payloads[version]["state"]
    stored = json.loads(store_env.get_bytes(store_env.root_uri("runs", run_id, "summary.json")))
    assert stored == summary and summary["problems"] == []
    # the step's log ends with the verdict: a reader sees the failing step and its error first
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"run {status}") and failed_task in last and error in last, last
    if status == "SUCCEEDED":
        assert summary["metrics"]["test_accuracy"] == 0.91
        assert (summary["published"] is None) == (scenario == "gate refused")
        assert summary["gate"]["passed"] == (scenario == "published")
    if scenario == "train failed":
        [failure] = summary["failures"]
        assert (
            failure["cause"] == "MemoryError: CUDA out of memory" and Path(__file__).name in failure["where"]
        )
        assert last.endswith("(caused by MemoryError: CUDA out of memory)")


def test_a_failure_retried_successfully_does_not_fail_the_run(store_env):
    """Attempt 1 of train failed and recorded it; the retry succeeded and the run published."""
    records = RunRecords(store_env, "retried")
    train_failed(records)
    published(records)
    verdict = decide_status(ReportedStatus("RUNNING"), *(records.read(n) for n in
                            ("outputs.json", "gate.json", "published.json")), records.failures())  # fmt: skip
    assert verdict.status == "SUCCEEDED"


def test_the_latest_failure_names_the_failing_step(store_env):
    """Train failed once and was retried; then evaluate failed for good: evaluate is the failing step."""
    records = RunRecords(store_env, "two-failures")
    train_failed(records)
    _fail(records, "evaluate-model", ValueError("the model has 0 parameters"))
    verdict = decide_status(ReportedStatus("FAILED"), None, None, None, records.failures())
    assert (verdict.failed_task, verdict.error) == (
        "evaluate-model",
        "ValueError: the model has 0 parameters",
    )


def test_a_gate_that_passed_without_a_recorded_publication_is_a_failure():
    verdict = decide_status(ReportedStatus("RUNNING"), OUTPUTS, {"passed": True}, None, [])
    assert verdict.status == "FAILED" and "the gate passed but no publication was recorded" in verdict.error


def test_without_a_store_a_final_success_is_trusted_and_the_problem_is_said(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIO_ENDPOINT", "127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("CIFAR10_KFP_RETRY_BUDGET_S", "0")
    summary = run_exit_handler(backend("COMPLETE"), "no-store", tmp_path)
    assert summary["status"] == "SUCCEEDED" and "could not be read" in summary["status_basis"]
    assert any("runs/no-store" in problem for problem in summary["problems"])
    running = run_exit_handler(backend("RUNNING"), "no-store", tmp_path)
    assert running["status"] == "FAILED"
