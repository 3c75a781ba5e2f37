"""The run summary: decided from what the run recorded, with KFP's reported state used only where it is trustworthy.

What the exit handler is told (``dsl.PipelineTaskFinalStatus``), read from the KFP sources
(kubeflow/pipelines, backend/src/v2/driver/resolve.go, ``TaskFinalStatus`` case, tags 2.15.0, 2.16.0,
2.16.1, 2.17.0): ``state`` is the MLMD state of the ``exit-handler-1`` DAG execution
(``RUNNING``, ``COMPLETE``, ``FAILED``, ...; success is ``COMPLETE``, never ``SUCCEEDED``),
``pipelineTaskName`` is always ``exit-handler-1``, and ``error`` is always ``{}`` ("TODO:
Implement fields Message and Code"). A DAG's state is updated only by the launcher of a task
directly inside it (backend/src/v2/component/launcher_v2.go, ``UpdateDAGExecutionsState``):

* KFP 2.15 and 2.16 never propagate the state of a nested DAG (``dsl.If``/``Else``,
  ``ParallelFor``) to its parent (kubeflow/pipelines#11979, #13321). Our training step sits in
  such a branch, so the exit handler sees ``RUNNING`` after a successful run, and also after a
  failure inside a branch; only a failure of a step directly in the body (validate, download,
  preprocess) shows as ``FAILED``.
* KFP 2.17 propagates it (kubeflow/pipelines#13322): success is ``COMPLETE``, a recorded failure
  ``FAILED``. A gate that did not pass leaves its ``dsl.If`` branch unexecuted (``CANCELED``), which
  no launcher re-counts, so the state is ``COMPLETE`` or still ``RUNNING`` depending on which step
  finished last.
* On every version, a step whose pod is killed (out of memory, evicted, node lost) never reaches
  its launcher's bookkeeping, so its DAG stays ``RUNNING``.
* kfp.local reports ``SUCCEEDED`` or ``FAILED`` (with ``error.message`` "Task exit-handler-1 failed."),
  under the keys ``pipeline_task_name``/``pipeline_job_resource_name``
  (kfp/local/orchestrator/orchestrator_utils.py, kfp 2.17.3).

So ``decide_status`` trusts a final ``FAILED`` and otherwise the records: a run succeeded when its
outputs were recorded, the gate recorded its decision, and a passed gate's publication was
recorded; ``COMPLETE``/``SUCCEEDED`` vouch for success when the records cannot be read.
``RUNNING`` decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cifar10_kfp.runs.records import FAILURES, GATE, OUTPUTS, PUBLISHED, SUMMARY, RunRecords
from cifar10_kfp.storage import ObjectStore, StorageError

SUCCEEDED, FAILED = "SUCCEEDED", "FAILED"
FINAL_SUCCESS_STATES = frozenset({"COMPLETE", "SUCCEEDED"})  # KFP backend (MLMD), kfp.local
FINAL_FAILURE_STATES = frozenset({"FAILED", "CANCELED", "CANCELLED"})


@dataclass(frozen=True)
class ReportedStatus:
    """What KFP told the exit handler (the fields of ``dsl.PipelineTaskFinalStatus``)."""

    state: str = ""
    task: str = ""
    error: str = ""

    @classmethod
    def of(cls, final_status: object) -> ReportedStatus:
        """From a ``dsl.PipelineTaskFinalStatus`` (or anything with its attributes)."""
        return cls(
            state=str(getattr(final_status, "state", "") or "").upper(),
            task=str(getattr(final_status, "pipeline_task_name", "") or ""),
            error=str(getattr(final_status, "error_message", "") or ""),
        )


@dataclass(frozen=True)
class Verdict:
    status: str  # SUCCEEDED or FAILED
    failed_task: str  # the KFP task that failed, "" when unknown or none
    error: str  # its error message, or why the run counts as failed
    basis: str  # how the status was decided, in words


def decide_status(
    reported: ReportedStatus,
    outputs: dict | None,
    gate: dict | None,
    published: dict | None,
    failures: list[dict],
    records_readable: bool = True,
) -> Verdict:
    """The run's status from its records and KFP's reported state (see the module docstring)."""
    gate_passed = bool(gate and gate.get("passed"))
    complete = outputs is not None and gate is not None and (published is not None or not gate_passed)
    if reported.state in FINAL_FAILURE_STATES:
        return _failed(reported, failures, f"KFP reported {reported.state}")
    if complete:
        return Verdict(
            SUCCEEDED, "", "", "recorded outputs, gate decision" + (" and publication" * gate_passed)
        )
    if reported.state in FINAL_SUCCESS_STATES and not records_readable:
        return Verdict(SUCCEEDED, "", "", f"KFP reported {reported.state}; the run records could not be read")
    if reported.state in FINAL_SUCCESS_STATES:
        missing = [n for n, r in ((OUTPUTS, outputs), (GATE, gate)) if r is None] or [PUBLISHED]
        return Verdict(
            SUCCEEDED, "", "", f"KFP reported {reported.state}; no {', '.join(missing)} was recorded"
        )
    return _failed(reported, failures, _missing_step(outputs, gate, gate_passed, reported))


def _missing_step(outputs, gate, gate_passed, reported: ReportedStatus) -> str:
    state = f"KFP reported {reported.state or 'no state'}"
    if outputs is None:
        return f"the run ended before its outputs were recorded ({state})"
    if gate is None:
        return f"the gate recorded no decision ({state})"
    return f"the gate passed but no publication was recorded ({state})" if gate_passed else state


def _failed(reported: ReportedStatus, failures: list[dict], basis: str) -> Verdict:
    if failures:
        last = failures[-1]  # the latest: earlier ones may have been retried successfully
        return Verdict(FAILED, str(last.get("task", "")), str(last.get("error", "")), basis)
    error = reported.error if reported.error and reported.task not in reported.error else ""
    unknown = (
        "no step recorded an error: a step's pod was probably killed (out of memory, evicted, node lost) "
        "or never started (image pull, scheduling); the KFP UI shows each step's pod and logs"
    )
    return Verdict(FAILED, "", f"{basis}; {error or unknown}", basis)


def build_summary(
    records: RunRecords | _Unreadable, reported: ReportedStatus, *, pipeline: str, checkpoint_uri: str = ""
) -> dict:
    """The summary of ``records``' run; storage problems are listed in ``problems``, never raised."""
    summary: dict[str, Any] = {"pipeline": pipeline, "run_id": records.run_id, "state": reported.state, "parameters": {},
               "metrics": {}, "gate": None, "published": None, "artifacts": {}, "failures": [], "problems": []}  # fmt: skip
    outputs = gate = published = None
    failures: list[dict] = []
    readable = True
    try:
        outputs, gate, published = (records.read(name) for name in (OUTPUTS, GATE, PUBLISHED))
        failures = records.failures()
    except (StorageError, ValueError) as exc:
        readable = False
        summary["problems"].append(f"reading the run records under {records.uri()}: {exc}")
    for key in ("parameters", "metrics", "artifacts", "best_trial"):
        if outputs and key in outputs:
            summary[key] = outputs[key]
    summary.update(gate=gate, published=published, failures=failures)
    verdict = decide_status(reported, outputs, gate, published, failures, readable)
    summary.update(status=verdict.status, failed_task=verdict.failed_task, error=verdict.error,
                   status_basis=verdict.basis)  # fmt: skip
    # (_Unreadable records are never readable: the isinstance only tells the type checker so)
    if readable and isinstance(records, RunRecords) and not summary["artifacts"].get("checkpoints"):
        summary["artifacts"]["checkpoints"] = _leftover_checkpoints(
            records, checkpoint_uri, summary["problems"]
        )
    return summary


def _leftover_checkpoints(records: RunRecords, checkpoint_uri: str, problems: list[str]) -> str:
    """Where training left checkpoints before the run failed (for a resume), or ""."""
    root = checkpoint_uri or records.store.root_uri("checkpoints", records.run_id)
    if not root.startswith(("s3://", "minio://")):
        return ""
    try:
        return root if records.store.list(root) else ""
    except StorageError as exc:
        problems.append(f"listing checkpoints under {root}: {exc}")
        return ""


def write_summary(
    open_store: Callable[[], ObjectStore],
    run_id: str,
    reported: ReportedStatus,
    *,
    pipeline: str,
    checkpoint_uri: str = "",
) -> dict:
    """Build the summary and store it as ``summary.json``; ``open_store()`` gives the run's store.

    Whatever fails with the store, a summary is returned (its ``problems`` say what failed), so the
    exit handler always has one to show.
    """
    try:
        store: ObjectStore = open_store()
    except (StorageError, ValueError) as exc:
        summary = build_summary(_Unreadable(run_id), reported, pipeline=pipeline)
        summary["problems"].insert(0, f"object store: {exc}")
        return summary
    records = RunRecords(store, run_id)
    summary = build_summary(records, reported, pipeline=pipeline, checkpoint_uri=checkpoint_uri)
    try:
        summary["summary_uri"] = records.uri(SUMMARY)
        records.write(SUMMARY, summary)
    except StorageError as exc:
        summary.pop("summary_uri")
        summary["problems"].append(f"writing {records.uri(SUMMARY)}: {exc}")
    return summary


def verdict_line(summary: dict) -> str:
    """One line for the end of the exit handler's log: the status, and for a failure its step, error and cause."""
    if summary.get("status") == SUCCEEDED:
        return f"run SUCCEEDED ({summary.get('status_basis', '')})"
    error = summary.get("error") or "unknown error"
    cause = recorded_cause(summary)
    more = f" (caused by {cause})" if cause else ""
    return f"run FAILED at step {summary.get('failed_task') or '?'}: {error}{more}"


def recorded_cause(summary: dict) -> str:
    """The innermost exception of the failure the summary reports, when its error does not already say it."""
    failures = summary.get("failures") or []
    cause = str(failures[-1].get("cause", "")) if failures else ""
    return cause if cause and cause not in (summary.get("error") or "") else ""


def unpublished_reason(summary: dict) -> str:
    """Why the run published no model, in words ("" when it published one).

    The gate's own reason when it kept the model back (accuracy below ``min_accuracy``, not better
    than the champion, a champion of another image size or classes); else the failure that stopped
    the run before publishing. One rule for run-local's table and ``runs``.
    """
    if summary.get("published"):
        return ""
    gate = summary.get("gate") or {}
    if gate and not gate.get("passed"):
        return f"the gate kept it back: {gate.get('reason') or 'no reason recorded'}"
    if summary.get("status") == FAILED:
        return f"the run failed at step {summary.get('failed_task') or '?'}"
    return "no gate decision was recorded"


class _Unreadable:
    """Stands in for ``RunRecords`` when no store could be opened: every read fails."""

    def __init__(self, run_id: str):
        self.run_id = run_id

    def uri(self, *parts: str) -> str:
        return "/".join(("runs", self.run_id, *parts))

    def read(self, name: str):
        raise StorageError("no object store")

    def failures(self):
        raise StorageError("no object store")


__all__ = [
    "FAILURES",
    "ReportedStatus",
    "Verdict",
    "build_summary",
    "decide_status",
    "recorded_cause",
    "unpublished_reason",
    "verdict_line",
    "write_summary",
]
