"""What a pipeline run records about itself in the object store, and the run summary built from it.

KFP does not let an exit-handler task read the outputs of the tasks it guards, and the status it
hands that task is not reliable on every KFP version (see ``decide_status``). So the steps of a
run record what they produced, and the summary is decided from those records. Under
``<root>/runs/<run id>/``:

==================================  ====================================================
``outputs.json``                    parameters, metrics, artifact locations (after evaluation)
``gate.json``                       the gate's decision: passed or not, and why
``published.json``                  where the gate published the model
``failures/<utc>-<task>-<pid>.json``  a failing step's task name and the message of its error
``summary.json``                    the summary the exit handler wrote
==================================  ====================================================

Steps that take no ``run_id`` input (download and preprocess: a run id would change their KFP
cache key) learn it from ``CIFAR10_KFP_RUN_ID``, and every step its KFP task name from
``CIFAR10_KFP_TASK``; ``ClusterPolicy`` sets both on every task (``report_failures``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cifar10_kfp.storage import ObjectNotFound, ObjectStore, StorageError
from cifar10_kfp.train.curves import tensorboard_uri

RUN_ID_ENV = "CIFAR10_KFP_RUN_ID"
TASK_ENV = "CIFAR10_KFP_TASK"
OUTPUTS, GATE, PUBLISHED, SUMMARY, FAILURES = (
    "outputs.json",
    "gate.json",
    "published.json",
    "summary.json",
    "failures",
)


class ArtifactLike(Protocol):
    """A KFP artifact as far as records go: where it is, and its metadata."""

    uri: str
    metadata: dict


@dataclass(frozen=True)
class RunRecords:
    """The records of one run, in one store."""

    store: ObjectStore
    run_id: str

    def uri(self, *parts: str) -> str:
        return self.store.root_uri("runs", self.run_id, *parts)

    def write(self, name: str, record: dict) -> str:
        uri = self.uri(name)
        self.store.put_bytes(json.dumps(record, indent=2, sort_keys=True).encode(), uri)
        return uri

    def read(self, name: str) -> dict | None:
        """The record ``name``, or None when the step that writes it did not (yet) run."""
        try:
            return json.loads(self.store.get_bytes(self.uri(name)))
        except ObjectNotFound:
            return None

    def record_failure(self, task: str, exc: BaseException) -> str:
        """Record that ``task`` failed with ``exc``; one object per failure, so retries and trials never collide."""
        now = time.time()
        stamp = (
            time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
        )  # sorts by time
        record = {"task": task, "time": stamp, **describe_failure(exc)}
        return self.write(f"{FAILURES}/{stamp}-{task}-{os.getpid()}.json", record)

    def failures(self) -> list[dict]:
        """The recorded failures, oldest first."""
        uris = sorted(u for u in self.store.list(self.uri(FAILURES)) if u.endswith(".json"))
        return [json.loads(self.store.get_bytes(uri)) for uri in uris]


def current_run_records(store: ObjectStore, env: Mapping[str, str] | None = None) -> RunRecords | None:
    """The records of the run this process is a step of (``CIFAR10_KFP_RUN_ID``), None outside a run."""
    run_id = (os.environ if env is None else env).get(RUN_ID_ENV)
    return RunRecords(store, run_id) if run_id else None


def record_gate_decision(store: ObjectStore, decision: dict) -> str | None:
    """Record the gate's decision for the run summary (nothing outside a pipeline run)."""
    records = current_run_records(store)
    return records.write(GATE, decision) if records else None


def require_endpoint(store: ObjectStore, compiled_for: str) -> ObjectStore:
    """``store``, after checking that it is the object store the step was compiled for.

    A cached step takes the endpoint as an input so that KFP's cache key names the store its
    results live in; that only holds if the step really talks to that store. A mismatch (e.g. a
    PodDefault that injects another ``MINIO_ENDPOINT``) is an error naming both.
    """
    wanted = compiled_for.split("://", 1)[-1].rstrip("/")
    if wanted and store.config.endpoint != wanted:
        raise StorageError(
            f"this step was compiled for the object store {wanted!r} but MINIO_ENDPOINT is "
            f"{store.config.endpoint or 'unset'!r}: recompile with --minio-endpoint {store.config.endpoint or 'HOST:PORT'}"
        )
    return store


# ------------------------------------------------------------------------------------ failures


def describe_exception(exc: BaseException) -> str:
    """``"<Type>: <message>"``; a message-less exception borrows the message of what caused it."""
    message, cause = str(exc).strip(), exc
    while not message:
        earlier = cause.__cause__ or cause.__context__
        if earlier is None:
            break
        cause, message = earlier, str(earlier).strip()
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def describe_failure(exc: BaseException) -> dict[str, str]:
    """``error`` (the exception that ended the step, as raised), its innermost ``cause`` and ``where`` it was raised."""
    innermost = exc
    while (nxt := innermost.__cause__ or innermost.__context__) is not None and nxt is not innermost:
        innermost = nxt
    frames = traceback.extract_tb(exc.__traceback__)
    out = {"error": describe_exception(exc)}
    if innermost is not exc:
        out["cause"] = describe_exception(innermost)
    if frames:
        last = frames[-1]
        out["where"] = f"{last.filename}:{last.lineno} in {last.name}"
    return out


def report_failures(bucket: str = "", storage_prefix: str = "", env: Mapping[str, str] | None = None) -> bool:
    """Make an uncaught exception of this step process recorded for the run summary, then raised as usual.

    Called first in a component body. Outside a pipeline run (no ``CIFAR10_KFP_RUN_ID`` or
    ``CIFAR10_KFP_TASK``, e.g. a unit test calling the component's function) it does nothing and
    returns False. The traceback is printed first; a failure to record is reported on stderr and
    never hides the step's own error.
    """
    env = os.environ if env is None else env
    run_id, task = env.get(RUN_ID_ENV), env.get(TASK_ENV)
    if not run_id or not task:
        return False
    previous = sys.excepthook

    def record_then_exit(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        try:
            from cifar10_kfp.storage import open_store

            uri = RunRecords(open_store(bucket or None, storage_prefix or None), run_id).record_failure(
                task, exc
            )
            print(f"cifar10-kfp: recorded this failure for the run summary: {uri}", file=sys.stderr)
        except Exception as problem:  # never mask the step's error with the recorder's
            print(
                f"cifar10-kfp: could not record this failure: {describe_exception(problem)}", file=sys.stderr
            )

    sys.excepthook = record_then_exit
    return True


# ------------------------------------------------------------------------------------ outputs


def _scalars(metadata: dict) -> dict[str, float]:
    return {
        k: v for k, v in dict(metadata).items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _dataset_locations(archive: ArtifactLike, dataset: ArtifactLike) -> dict[str, str]:
    return {
        "dataset_archive": archive.metadata.get("cache_uri") or archive.uri,
        "dataset": dataset.uri,
        "prepared_dataset_cache": dataset.metadata.get("cache_uri", ""),
    }


def training_outputs(
    *, pipeline: str, run_id: str, params_json: str, test_accuracy: float, archive: ArtifactLike,
    dataset: ArtifactLike, model: ArtifactLike, train_metrics: ArtifactLike, history: ArtifactLike,
    eval_metrics: ArtifactLike, report: ArtifactLike,
) -> dict[str, Any]:  # fmt: skip
    """The ``outputs.json`` record of a training run: metrics of both steps, and where every artifact is."""
    metrics = {f"train_{k}" if not k.startswith(("train_", "val_")) else k: v
               for k, v in _scalars(train_metrics.metadata).items()}  # fmt: skip
    metrics.update(_scalars(eval_metrics.metadata))
    metrics["test_accuracy"] = float(test_accuracy)
    checkpoints = model.metadata.get("checkpoint_uri") or train_metrics.metadata.get("checkpoint_uri", "")
    artifacts = {**_dataset_locations(archive, dataset), "model": model.uri, "checkpoints": checkpoints,
                 "tensorboard": model.metadata.get("tensorboard_uri") or tensorboard_uri(checkpoints),
                 "history": history.uri, "metrics": eval_metrics.uri, "report": report.uri}  # fmt: skip
    return {"pipeline": pipeline, "run_id": run_id, "parameters": json.loads(params_json), "metrics": metrics,
            "artifacts": artifacts}  # fmt: skip


def sweep_outputs(
    *, pipeline: str, run_id: str, params_json: str, best_accuracy: float, archive: ArtifactLike,
    dataset: ArtifactLike, best_model: ArtifactLike,
) -> dict[str, Any]:  # fmt: skip
    """The ``outputs.json`` record of a sweep: the winner, every trial's accuracy, and where things are."""
    meta = dict(best_model.metadata)
    metrics = {"test_accuracy": float(best_accuracy), "best_trial": int(meta.get("trial_index", -1)),
               "trial_accuracies": meta.get("sweep_accuracies", [])}  # fmt: skip
    artifacts = {**_dataset_locations(archive, dataset), "model": best_model.uri,
                 "checkpoints": meta.get("checkpoint_uri", "")}  # fmt: skip
    return {"pipeline": pipeline, "run_id": run_id, "parameters": json.loads(params_json), "metrics": metrics,
            "best_trial": json.loads(meta.get("trial", "{}")), "artifacts": artifacts}  # fmt: skip


def read_summary(store: ObjectStore, run_id: str) -> dict | None:
    """The summary a run's exit handler wrote, or None when there is none (or it cannot be read)."""
    try:
        return RunRecords(store, run_id).read(SUMMARY)
    except (StorageError, ValueError):
        return None


def recent_summaries(store: ObjectStore, limit: int = 20) -> list[tuple[float, dict]]:
    """``(written at, summary)`` of the runs whose exit handler wrote a summary in ``store``, newest first.

    Local runs have no runs API to ask: their summaries in the object store are their history.
    """
    uris = [u for u in store.list(store.root_uri("runs")) if u.endswith(f"/{SUMMARY}")]
    found = []
    for uri in uris:
        try:
            info = store.stat(uri)
            found.append((info.last_modified or 0.0, json.loads(store.get_bytes(uri))))
        except (StorageError, ValueError):
            continue  # one unreadable summary must not hide the others
    return sorted(found, key=lambda pair: pair[0], reverse=True)[:limit]


def tune_figures(
    record: dict, *, tune_metrics: ArtifactLike, tune_report: ArtifactLike, best_params: dict
) -> dict:
    """A tuned run's ``outputs.json``: the training record plus the study's figures, report and best values."""
    out = {**record, "metrics": {**record["metrics"], **_scalars(tune_metrics.metadata)},
           "artifacts": {**record["artifacts"], "tune_report": tune_report.uri, "tune_metrics": tune_metrics.uri}}  # fmt: skip
    out["best_trial"] = dict(best_params)
    return out


def record_run_outputs(args: Mapping[str, Any]) -> str:
    """What a record component does with its arguments (its ``locals()``): write ``outputs.json``; its URI.

    The arguments of ``training_outputs`` plus ``pipeline_name``, ``bucket`` and ``storage_prefix``;
    a tuned run's also carry ``tune_metrics``, ``tune_report`` and ``best_params``.
    """
    from cifar10_kfp.storage import open_store

    args = dict(args)
    bucket, prefix = args.pop("bucket"), args.pop("storage_prefix")
    report_failures(bucket, prefix)
    tune = {key: args.pop(key) for key in ("tune_metrics", "tune_report", "best_params") if key in args}
    record = training_outputs(pipeline=args.pop("pipeline_name"), **args)
    if tune:
        record = tune_figures(record, **tune)
    return RunRecords(open_store(bucket or None, prefix or None), args["run_id"]).write(OUTPUTS, record)
