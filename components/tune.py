"""The ``cifar10-tune`` pipeline's own steps: the Optuna study, and the record of a tuned run.

``tune_hyperparameters`` is a thin adapter over ``cifar10_kfp.tune.run_study``: the study
runs its trials one after another in this pod (on its GPU when it has one), and keeps its state
under ``<checkpoint_uri>/tune`` or, when that is empty, ``<root>/tune/<run id>``, so that KFP's retry
of this task resumes the study instead of starting over. Its ``best_training`` output is the
train step's settings dict with the best trial's values in it.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from cifar10_kfp_components.image import IMAGE
from cifar10_kfp_components.summary import record_docstring


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def tune_hyperparameters(
    dataset: Input[Dataset],
    params_json: str,
    checkpoint_uri: str,
    run_id: str,
    bucket: str,
    storage_prefix: str,
    metrics: Output[Metrics],
    report: Output[HTML],
    trials: Output[Artifact],
) -> NamedTuple("Tuned", [("best_training", dict), ("best_params", dict), ("best_value", float)]):  # type: ignore[valid-type]  # KFP's output idiom, evaluated in the pod
    """Search hyperparameters with an Optuna study (sampler, pruner, trials: the pipeline's parameters).

    Args:
        dataset: The prepared dataset; trials train on its train split and are scored on its validation split.
        params_json: The validated pipeline parameters (validate's output): search space, study and training settings.
        checkpoint_uri: The checkpoint location parameter; the study is kept under it, or under the run id if empty.
        run_id: The KFP run id (``{{$.pipeline_job_uuid}}``): a retry of this task resumes the study.
        bucket: Object-store bucket; empty for the configured one.
        storage_prefix: Key prefix in the bucket; empty for the configured one.
        metrics: best_value, trials_completed, trials_pruned, trials_failed, trials_repeated and the compute the
            trials used (epochs, seconds, fixed seconds).
        report: HTML report: the rungs (which trials stopped after which epoch), optimisation history, parameter
            importances, intermediate values, one row per trial.
        trials: Every trial as JSON (state, value, values, epochs run, seconds, fixed seconds, same_as).

    Returns:
        best_training: The train step's settings with the best trial's values.
        best_params: The best trial's values.
        best_value: The best trial's validation accuracy.
    """
    import json
    import shutil
    import tempfile
    from collections import namedtuple

    from cifar10_kfp.runs import report_failures
    from cifar10_kfp.storage import open_store
    from cifar10_kfp.tune import default_study_uri, run_study

    report_failures(bucket, storage_prefix)
    store = open_store(bucket or None, storage_prefix or None)
    study_uri = default_study_uri(checkpoint_uri, run_id, store)
    with tempfile.TemporaryDirectory(prefix="tune-") as work:
        result = run_study(json.loads(params_json), dataset.path, work, study_uri=study_uri, store=store)
        shutil.copyfile(f"{work}/report.html", report.path)
        shutil.copyfile(f"{work}/trials.json", trials.path)
    for name, value in result.metrics.items():
        metrics.log_metric(name, float(value))
    metrics.metadata["best_params"] = json.dumps(result.best_params, sort_keys=True)
    metrics.metadata["study_uri"] = study_uri
    Tuned = namedtuple("Tuned", ["best_training", "best_params", "best_value"])
    return Tuned(result.best_training, result.best_params, result.best_value)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
@record_docstring(
    "Record a tuned run: the study's figures, the final model's metrics, and where everything is.",
    "        tune_metrics: The study's metrics (tune step).\n"
    "        tune_report: The study's HTML report.\n"
    "        best_params: The best trial's values.\n",
)
def record_tune_outputs(
    archive: Input[Artifact],
    dataset: Input[Dataset],
    model: Input[Model],
    tune_metrics: Input[Metrics],
    tune_report: Input[HTML],
    best_params: dict,
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
