"""The run records and the run summary: thin adapters over ``cifar10_kfp.runs``.

KFP does not let an ``ExitHandler`` task read outputs of the tasks it guards, so the body
records what it produced under ``<root>/runs/<run_id>/`` in the object store (``outputs.json``
after evaluation, ``gate.json`` from the gate, ``published.json`` after publishing, a
``failures/`` record from any step that fails), and the exit task, which always runs, decides the
run's status from those records and writes ``summary.json`` next to them and as its output.
"""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from cifar10_kfp_components.image import IMAGE

# The Args lines every record component shares (the KFP UI shows them as input descriptions).
RECORD_ARGS = """\
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
"""


def record_docstring(summary: str, extra_args: str = ""):
    """Give a record component its Google-style docstring: ``summary``, ``extra_args``, then ``RECORD_ARGS``.

    Applied below ``@dsl.component``, so KFP reads the finished docstring.
    """

    def document(func):
        func.__doc__ = (
            f"{summary}\n\n    Args:\n{extra_args}{RECORD_ARGS}\n    Returns:\n"
            "        The URI of the record (``<root>/runs/<run_id>/outputs.json``).\n    "
        )
        return func

    return document


@dsl.component(base_image=IMAGE, install_kfp_package=False)
@record_docstring("Record a run's metrics and artifact locations in the object store.")
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
    args = dict(locals())  # first statement: exactly the parameters
    from cifar10_kfp.runs import record_run_outputs as record

    uri = record(args)
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
    from cifar10_kfp.runs import RunRecords, report_failures, sweep_outputs
    from cifar10_kfp.storage import open_store

    report_failures(bucket, storage_prefix)
    record = sweep_outputs(
        pipeline=pipeline_name, run_id=run_id, params_json=params_json, best_accuracy=best_accuracy,
        archive=archive, dataset=dataset, best_model=best_model,
    )  # fmt: skip
    uri = RunRecords(open_store(bucket or None, storage_prefix or None), run_id).write("outputs.json", record)
    print("recorded", uri)
    return uri


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def record_publication(
    uri: str, version: str, registration: str, run_id: str, bucket: str, storage_prefix: str
) -> str:
    """Record where the gate published the model (and where it is registered).

    Args:
        uri: Where the published model is.
        version: The published version.
        registration: JSON of its Kubeflow Model Registry registration; empty when none.
        run_id: The KFP run id.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.

    Returns:
        The URI of the record (``<root>/runs/<run_id>/published.json``).
    """
    import json

    from cifar10_kfp.runs import RunRecords, report_failures
    from cifar10_kfp.storage import open_store

    report_failures(bucket, storage_prefix)
    records = RunRecords(open_store(bucket or None, storage_prefix or None), run_id)
    record = {"uri": uri, "version": version}
    if registration:
        record["model_registry"] = json.loads(registration)
    record_uri = records.write("published.json", record)
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
    """Write the run summary (status, failed step and error, metrics, where everything is); runs whatever happened.

    Args:
        status: KFP's final status of the guarded tasks; trusted only where final (see cifar10_kfp.runs.summary).
        pipeline_name: Name of the pipeline.
        run_id: The KFP run id.
        checkpoint_uri: The checkpoint location parameter (empty: derived from the run id).
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.
        summary: The summary JSON.
    """
    import json

    from cifar10_kfp.runs import ReportedStatus, verdict_line, write_summary
    from cifar10_kfp.storage import open_store

    result = write_summary(
        lambda: open_store(bucket or None, storage_prefix or None), run_id, ReportedStatus.of(status),
        pipeline=pipeline_name, checkpoint_uri=checkpoint_uri,
    )  # fmt: skip
    with open(summary.path, "w") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
    summary.metadata["status"] = result["status"]
    print(json.dumps(result, indent=2, sort_keys=True))
    print(verdict_line(result))  # last, where a reader of the step's log looks first


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def select_best_model(
    models: Input[list[Model]],
    accuracies: list[float],
    trials: list,
    bucket: str,
    storage_prefix: str,
    best_model: Output[Model],
) -> float:
    """Pick the sweep trial with the highest test accuracy (the first on a tie).

    Args:
        models: The trained model of every trial, in trial order (``dsl.Collected``).
        accuracies: The test accuracy of every trial, in trial order (``dsl.Collected``).
        trials: The trial settings, in trial order.
        bucket: Object-store bucket (for the failure record), empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.
        best_model: A copy of the winning model directory, with the trial in its metadata.

    Returns:
        The winning test accuracy.
    """
    import json
    import shutil

    from cifar10_kfp.runs import report_failures

    report_failures(bucket, storage_prefix)
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
