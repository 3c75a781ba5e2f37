"""Pipeline ``cifar10-sweep``: one dataset, many trainings in parallel, the best one published.

validate (expands the JSON list of trials) -> download -> preprocess, once -> ``ParallelFor``
over the trials (``parallelism`` at a time, fixed at compile time): train + evaluate -> ``dsl.Collected`` models and
accuracies -> select the best -> the same gate and publish as ``cifar10-training``. An
``ExitHandler`` writes the run summary. Trials train on one node each; each trial checkpoints
under its own config hash, so trials never resume from each other.

The parameters, their defaults and their descriptions (docs/parameters.md) come from
``cifar10_kfp.params.SWEEP_PARAMS``.
"""

from kfp import dsl

from cifar10_kfp.params import validate_build_params
from cifar10_kfp_components.summary import record_sweep_outputs, select_best_model
from cifar10_kfp_components.train import train_model
from cifar10_kfp_components.validate import validate_sweep_params
from cifar10_kfp_pipelines import steps
from cifar10_kfp_pipelines.kfp_compat import quick_task_settings
from cifar10_kfp_pipelines.policy import ClusterPolicy

PIPELINE_NAME = "cifar10-sweep"
SUMMARY = (
    "Train one model per hyperparameter set in parallel on the same data, and publish the best if it beats "
    "the gate."
)
DEFAULT_PARALLELISM = 2  # trials at once; `compile --sweep-parallelism` or run-local's parallelism=N


@quick_task_settings()
def build_sweep_pipeline(policy: ClusterPolicy | None = None, parallelism: int = DEFAULT_PARALLELISM):
    """The ``cifar10-sweep`` pipeline with ``policy``'s cluster settings and trial ``parallelism`` baked in."""
    policy = policy or ClusterPolicy()
    parallelism = validate_build_params({"parallelism": parallelism}, "sweep")["parallelism"]

    @steps.pipeline_from_params("sweep", name=PIPELINE_NAME, summary=SUMMARY)
    def cifar10_sweep(p):
        with steps.summarised_run(policy, p, PIPELINE_NAME):
            validate, download, preprocess = steps.validated_data(policy, p, validate_sweep_params)
            dataset = preprocess.outputs["dataset"]
            # kfp 2.17's ParallelFor takes parallelism as a Python int, so it is fixed at compile time.
            with dsl.ParallelFor(items=validate.outputs["trials"], parallelism=parallelism,
                                 name="trials") as trial:  # fmt: skip
                train = train_model(
                    dataset=dataset, training=trial, num_gpus=p.num_gpus, checkpoint_uri=p.checkpoint_uri,
                    run_id=steps.RUN_ID, **steps.storage(p),
                ).set_display_name("train")  # fmt: skip
                policy.gpu_train(train, gpu_limit=validate.outputs["gpu_limit"])
                evaluation = steps.evaluate(policy, train, dataset)
            best = select_best_model(
                models=dsl.Collected(train.outputs["model"]),
                accuracies=dsl.Collected(evaluation.outputs["test_accuracy"]),
                trials=validate.outputs["trials"],
                **steps.storage(p),
            ).set_display_name("select-best")
            policy.step(best, "select")
            record = record_sweep_outputs(
                archive=download.outputs["archive"], dataset=dataset, best_model=best.outputs["best_model"],
                best_accuracy=best.outputs["Output"], params_json=validate.outputs["params_json"],
                pipeline_name=PIPELINE_NAME, run_id=steps.RUN_ID, **steps.storage(p),
            ).set_display_name("record-outputs")  # fmt: skip
            policy.step(record, "record")
            steps.gate_and_publish(
                policy,
                p,
                model=best.outputs["best_model"],
                dataset=dataset,
                test_accuracy=best.outputs["Output"],
            )

    return cifar10_sweep


sweep_pipeline = build_sweep_pipeline()
