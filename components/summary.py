"""The run summary: small steps that record where a run's outputs are, and the exit-handler task.

KFP does not let an ``ExitHandler`` task read outputs of the tasks it guards, so the body
records what it produced under ``<root>/runs/<run_id>/`` in the object store
(``outputs.json`` after evaluation, ``published.json`` after publishing), and the exit task,
which always runs, reads those records and writes ``summary.json`` next to them and as its
own output artifact.
"""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from cifar10_kfp_components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def record_run_outputs(
    archive: Input[Artifact],
    dataset: Input[Dataset],
    model: Input[Model],
    train_metrics: Input[Metrics],
    history: Input[Artifact],
    eval_metrics: Input[Metrics],
    report: Input[HTML],
    test_accuracy: float,
    params_json: str,
    pipeline_name: str,
    run_id: str,
    bucket: str,
    storage_prefix: str,
) -> str:
    """Record a run's metrics and artifact locations in the object store.

    Args:
        archive: The downloaded dataset pointer (download step).
        dataset: The prepared dataset.
        model: The trained model directory.
        train_metrics: Training metrics (final scalars).
        history: Per-epoch training history.
        eval_metrics: Test-set metrics (evaluate step).
        report: The HTML evaluation report.
        test_accuracy: Test accuracy of the model.
        params_json: The validated pipeline parameters as JSON.
        pipeline_name: Name of the pipeline.
        run_id: The KFP run id.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.

    Returns:
        The URI of the record (``<root>/runs/<run_id>/outputs.json``).
    """
    import json

    from cifar10_kfp.storage import open_store

    def scalars(metadata):
        return {
            k: v for k, v in dict(metadata).items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    store = open_store(bucket or None, storage_prefix or None)
    train = scalars(train_metrics.metadata)
    metrics = {f"train_{k}" if not k.startswith(("train_", "val_")) else k: v for k, v in train.items()}
    metrics.update(scalars(eval_metrics.metadata))
    metrics["test_accuracy"] = float(test_accuracy)
    record = {
        "pipeline": pipeline_name,
        "run_id": run_id,
        "parameters": json.loads(params_json),
        "metrics": metrics,
        "artifacts": {
            "dataset_archive": archive.metadata.get("cache_uri") or archive.uri,
            "dataset": dataset.uri,
            "prepared_dataset_cache": dataset.metadata.get("cache_uri", ""),
            "model": model.uri,
            "checkpoints": model.metadata.get("checkpoint_uri")
            or train_metrics.metadata.get("checkpoint_uri", ""),
            "history": history.uri,
            "metrics": eval_metrics.uri,
            "report": report.uri,
        },
    }
    uri = store.root_uri("runs", run_id, "outputs.json")
    store.put_bytes(json.dumps(record, indent=2, sort_keys=True).encode(), uri)
    print("recorded", uri)
    return uri


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def record_sweep_outputs(
    archive: Input[Artifact],
    dataset: Input[Dataset],
    best_model: Input[Model],
    best_accuracy: float,
    params_json: str,
    pipeline_name: str,
    run_id: str,
    bucket: str,
    storage_prefix: str,
) -> str:
    """Record a sweep's winner, every trial's accuracy, and artifact locations in the object store.

    Args:
        archive: The downloaded dataset pointer (download step).
        dataset: The prepared dataset.
        best_model: The winning model (with the trial in its metadata).
        best_accuracy: The winning test accuracy.
        params_json: The validated pipeline parameters as JSON.
        pipeline_name: Name of the pipeline.
        run_id: The KFP run id.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.

    Returns:
        The URI of the record (``<root>/runs/<run_id>/outputs.json``).
    """
    import json

    from cifar10_kfp.storage import open_store

    store = open_store(bucket or None, storage_prefix or None)
    meta = dict(best_model.metadata)
    record = {
        "pipeline": pipeline_name,
        "run_id": run_id,
        "parameters": json.loads(params_json),
        "metrics": {
            "test_accuracy": float(best_accuracy),
            "best_trial": int(meta.get("trial_index", -1)),
            "trial_accuracies": meta.get("sweep_accuracies", []),
        },
        "best_trial": json.loads(meta.get("trial", "{}")),
        "artifacts": {
            "dataset_archive": archive.metadata.get("cache_uri") or archive.uri,
            "dataset": dataset.uri,
            "prepared_dataset_cache": dataset.metadata.get("cache_uri", ""),
            "model": best_model.uri,
            "checkpoints": meta.get("checkpoint_uri", ""),
        },
    }
    uri = store.root_uri("runs", run_id, "outputs.json")
    store.put_bytes(json.dumps(record, indent=2, sort_keys=True).encode(), uri)
    print("recorded", uri)
    return uri


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def record_publication(uri: str, version: str, run_id: str, bucket: str, storage_prefix: str) -> str:
    """Record where the gate published the model.

    Args:
        uri: Where the published model is.
        version: The published version.
        run_id: The KFP run id.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.

    Returns:
        The URI of the record (``<root>/runs/<run_id>/published.json``).
    """
    import json

    from cifar10_kfp.storage import open_store

    store = open_store(bucket or None, storage_prefix or None)
    record_uri = store.root_uri("runs", run_id, "published.json")
    store.put_bytes(json.dumps({"uri": uri, "version": version}, sort_keys=True).encode(), record_uri)
    print("recorded", record_uri)
    return record_uri


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def write_run_summary(
    status: dsl.PipelineTaskFinalStatus,
    pipeline_name: str,
    run_id: str,
    checkpoint_uri: str,
    bucket: str,
    storage_prefix: str,
    summary: Output[Artifact],
):
    """Write the run summary (status, metrics, where everything is); runs whatever happened.

    Args:
        status: Final status of the guarded tasks (set by KFP).
        pipeline_name: Name of the pipeline.
        run_id: The KFP run id.
        checkpoint_uri: The checkpoint location parameter (empty: derived from the run id).
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.
        summary: The summary JSON.
    """
    import json

    from cifar10_kfp.storage import ObjectNotFound, StorageError, open_store

    state = str(status.state or "").upper()
    result = {
        "status": "SUCCEEDED" if state in ("SUCCEEDED", "SUCCESS", "COMPLETE", "COMPLETED") else "FAILED",
        "state": state,
        "error": status.error_message or "",
        "failed_task": status.pipeline_task_name if state not in ("SUCCEEDED",) else "",
        "pipeline": pipeline_name,
        "run_id": run_id,
        "parameters": {},
        "metrics": {},
        "published": None,
        "artifacts": {},
    }
    problems = []
    try:
        store = open_store(bucket or None, storage_prefix or None)
        run_root = store.root_uri("runs", run_id)
        for name in ("outputs.json", "published.json"):
            try:
                record = json.loads(store.get_bytes(f"{run_root}/{name}"))
            except ObjectNotFound:
                continue  # that step did not run (failed earlier, or the gate said no)
            if name == "published.json":
                result["published"] = record
            else:
                for key in ("parameters", "metrics", "artifacts", "best_trial"):
                    if key in record:
                        result[key] = record[key]
        if not result["artifacts"].get("checkpoints"):
            # Training failed before the record: point at what the checkpointer left, for a resume.
            root = checkpoint_uri or store.root_uri("checkpoints", run_id)
            found = store.list(root) if root.startswith(("s3://", "minio://")) else []
            result["artifacts"]["checkpoints"] = root if found else ""
        result["summary_uri"] = f"{run_root}/summary.json"
        store.put_bytes(json.dumps(result, indent=2, sort_keys=True).encode(), result["summary_uri"])
    except StorageError as exc:  # the summary must still be written as the task output
        problems.append(f"object store: {exc}")
    result["problems"] = problems
    with open(summary.path, "w") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
    summary.metadata["status"] = result["status"]
    print(json.dumps(result, indent=2, sort_keys=True))


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def select_best_model(
    models: Input[list[Model]],
    accuracies: list[float],
    trials: list,
    best_model: Output[Model],
) -> float:
    """Pick the sweep trial with the highest test accuracy (the first on a tie).

    Args:
        models: The trained model of every trial, in trial order (``dsl.Collected``).
        accuracies: The test accuracy of every trial, in trial order (``dsl.Collected``).
        trials: The trial settings, in trial order.
        best_model: A copy of the winning model directory, with the trial in its metadata.

    Returns:
        The winning test accuracy.
    """
    import json
    import shutil

    if not models or len(models) != len(accuracies):
        raise ValueError(
            f"got {len(models)} models and {len(accuracies)} accuracies: every trial must report both"
        )
    best = max(range(len(accuracies)), key=lambda i: (accuracies[i], -i))
    for i, acc in enumerate(accuracies):
        print(
            f"trial {i}: test_accuracy={acc:.4f} {json.dumps(trials[i], sort_keys=True)}{'  <- best' if i == best else ''}"
        )
    shutil.copytree(models[best].path, best_model.path, dirs_exist_ok=True)
    best_model.metadata.update(dict(models[best].metadata))
    best_model.metadata["trial_index"] = best
    best_model.metadata["trial"] = json.dumps(trials[best], sort_keys=True)
    best_model.metadata["test_accuracy"] = float(accuracies[best])
    best_model.metadata["sweep_accuracies"] = [float(a) for a in accuracies]
    return float(accuracies[best])
