"""Pipeline ``cifar10-tune``: an Optuna study in one task, its best values trained, evaluated and gated.

validate (the search space too, and that there is a validation split) -> download -> preprocess ->
tune (the study: trials one after another in one pod, stopped early by successive halving (asha,
the default), the median or hyperband rule, within an epoch budget, its state in the object store
after every trial) -> train with the best values for the full epochs -> evaluate -> record -> gate ->
publish, inside the same ``ExitHandler`` summary as ``cifar10-training``; the summary's metrics
hold best_value, trials_completed, trials_pruned and the final test_accuracy.

The tune task gets the train step's cluster policy (``ClusterPolicy.gpu_train``): its GPU, GPU
toleration, /dev/shm, object-store secret, retries and caching. A retried tune task resumes its
study. The parameters, their defaults and their descriptions (docs/parameters.md) come from
``cifar10_kfp.params.TUNE_PARAMS``.
"""

from cifar10_kfp_components.train import train_model
from cifar10_kfp_components.tune import record_tune_outputs, tune_hyperparameters
from cifar10_kfp_components.validate import validate_tune_params
from cifar10_kfp_pipelines import steps
from cifar10_kfp_pipelines.kfp_compat import quick_task_settings
from cifar10_kfp_pipelines.policy import ClusterPolicy

PIPELINE_NAME = "cifar10-tune"
SUMMARY = (
    "Search hyperparameters with an Optuna study (TPE, random or grid sampling, successive-halving pruning) in one task, "
    "train the best configuration, evaluate it, and publish it if it beats the gate."
)


@quick_task_settings()
def build_tune_pipeline(policy: ClusterPolicy | None = None):
    """The ``cifar10-tune`` pipeline with ``policy``'s cluster settings baked in."""
    policy = policy or ClusterPolicy()

    @steps.pipeline_from_params("tune", name=PIPELINE_NAME, summary=SUMMARY)
    def cifar10_tune(p):
        with steps.summarised_run(policy, p, PIPELINE_NAME):
            validate, download, preprocess = steps.validated_data(policy, p, validate_tune_params)
            dataset = preprocess.outputs["dataset"]
            where = dict(checkpoint_uri=p.checkpoint_uri, run_id=steps.RUN_ID, **steps.storage(p))
            tune = tune_hyperparameters(
                dataset=dataset, params_json=validate.outputs["params_json"], **where
            ).set_display_name("tune")
            policy.gpu_train(tune, gpu_limit=validate.outputs["gpu_limit"])  # the train step's policy
            train = train_model(
                dataset=dataset, training=tune.outputs["best_training"], num_gpus=p.num_gpus, **where
            ).set_display_name("train")
            policy.gpu_train(train, gpu_limit=validate.outputs["gpu_limit"])
            evaluation = steps.evaluate(policy, train, dataset)
            test_accuracy = evaluation.outputs["test_accuracy"]
            record = record_tune_outputs(
                archive=download.outputs["archive"], dataset=dataset, model=train.outputs["model"],
                tune_metrics=tune.outputs["metrics"], tune_report=tune.outputs["report"],
                best_params=tune.outputs["best_params"], train_metrics=train.outputs["metrics"],
                history=train.outputs["history"], eval_metrics=evaluation.outputs["metrics"],
                report=evaluation.outputs["report"], test_accuracy=test_accuracy,
                params_json=validate.outputs["params_json"], pipeline_name=PIPELINE_NAME, run_id=steps.RUN_ID,
                **steps.storage(p),
            ).set_display_name("record-outputs")  # fmt: skip
            policy.step(record, "record")
            steps.gate_and_publish(
                policy, p, model=train.outputs["model"], dataset=dataset, test_accuracy=test_accuracy,
                test_accuracy_plain=evaluation.outputs["test_accuracy_plain"],
            )  # fmt: skip

    return cifar10_tune


tune_pipeline = build_tune_pipeline()
