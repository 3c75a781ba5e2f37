"""Pipeline ``cifar10-sweep``: one dataset, many trainings in parallel, the best one published.

validate (expands the JSON list of trials) -> download -> preprocess, once -> ``ParallelFor``
over the trials (``parallelism`` at a time, fixed at compile time): train + evaluate -> ``dsl.Collected`` models and
accuracies -> select the best -> the same gate and publish as ``cifar10-training``. An
``ExitHandler`` writes the run summary. Trials train on one node each.
"""

from kfp import dsl

from cifar10_kfp.params import validate_build_params
from cifar10_kfp_components.data import download_dataset, preprocess_dataset
from cifar10_kfp_components.evaluate import evaluate_model
from cifar10_kfp_components.publish import gate_model, publish_model
from cifar10_kfp_components.summary import (
    record_publication,
    record_sweep_outputs,
    select_best_model,
    write_run_summary,
)
from cifar10_kfp_components.train import train_model
from cifar10_kfp_components.validate import validate_sweep_params
from cifar10_kfp_pipelines.kfp_compat import quick_task_settings
from cifar10_kfp_pipelines.policy import ClusterPolicy

PIPELINE_NAME = "cifar10-sweep"
RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER
DEFAULT_PARALLELISM = 2  # trials at once; `compile --sweep-parallelism` or run-local's parallelism=N


@quick_task_settings()
def build_sweep_pipeline(policy: ClusterPolicy | None = None, parallelism: int = DEFAULT_PARALLELISM):
    """The ``cifar10-sweep`` pipeline with ``policy``'s cluster settings and trial ``parallelism`` baked in."""
    policy = policy or ClusterPolicy()
    parallelism = validate_build_params({"parallelism": parallelism}, "sweep")["parallelism"]

    @dsl.pipeline(name=PIPELINE_NAME)
    def cifar10_sweep(
        dataset_uri: str = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        dataset_checksum: str = "",
        val_fraction: float = 0.1,
        max_train_samples: int = 0,
        max_test_samples: int = 0,
        image_size: int = 32,
        preset: str = "fast",
        model: str = "",
        epochs: int = 0,
        batch_size: int = 0,
        learning_rate: float = 0.0,
        seed: int = 0,
        extra_hparams: str = "",
        num_gpus: int = 1,
        checkpoint_every: int = 0,
        checkpoint_uri: str = "",
        min_accuracy: float = 0.5,
        model_name: str = "cifar10-classifier",
        bucket: str = "",
        storage_prefix: str = "",
        hparam_sets: str = '[{"learning_rate": 0.05}, {"learning_rate": 0.1}, {"learning_rate": 0.2}]',
    ):
        """Train one model per hyperparameter set in parallel on the same data, and publish the best if it beats the gate.

        Args:
            dataset_uri: Where the dataset archive is: http(s)://, s3://, minio://, file:// or a path. CIFAR-10 python or JPEG image-folder tar.gz.
            dataset_checksum: Expected checksum of the archive: sha256:<64 hex> (prefix optional) or md5:<32 hex>; empty skips the check.
            val_fraction: Fraction of the training split held out for validation, in [0, 0.5].
            max_train_samples: Use at most this many training images, stratified by class; 0 uses all.
            max_test_samples: Use at most this many test images, stratified by class; 0 uses all.
            image_size: Side in pixels the images are resized to, 8..512 (32 is CIFAR-10's native size).
            preset: Training preset: seed (baseline), fast (GPU speed run) or cpu (small, for CPU-only runs).
            model: Model architecture, e.g. simple_cnn or fast_resnet; empty uses the preset's.
            epochs: Training epochs, 1..10000; 0 uses the preset's.
            batch_size: Images per step (per process), 1..65536; 0 uses the preset's.
            learning_rate: Peak learning rate, in (0, 10]; 0 uses the preset's.
            seed: Random seed for data order, augmentation and initialisation, 0..2147483647.
            extra_hparams: JSON object of further training-config overrides, e.g. {"weight_decay": 0.0005}; empty for none.
            num_gpus: GPUs per node for training, 0..16 (0 trains on CPU).
            checkpoint_every: Save a resumable checkpoint every N epochs, 1..10000; 0 uses the preset's.
            checkpoint_uri: Where checkpoints go (s3://bucket/key); empty derives it from the run id, so a retry resumes.
            min_accuracy: Publish only if test accuracy is at least this, in [0, 1], and not worse than the published champion.
            model_name: Name the model is published under (models/<name>/<version>).
            bucket: Object-store bucket; empty uses CIFAR10_KFP_BUCKET (default mlpipeline).
            storage_prefix: Key prefix for everything the pipeline writes; empty uses CIFAR10_KFP_PREFIX (default cifar10-kfp/).
            hparam_sets: JSON list of trials; each object may set preset, model, epochs, batch_size, learning_rate, seed, extra_hparams over the pipeline's values.
        """  # noqa: E501 - the KFP UI shows each line as it is
        storage = {"bucket": bucket, "storage_prefix": storage_prefix}
        summary = write_run_summary(
            pipeline_name=PIPELINE_NAME, run_id=RUN_ID, checkpoint_uri=checkpoint_uri, **storage
        ).set_display_name("run-summary")
        policy.step(summary, "summary")
        with dsl.ExitHandler(summary, name="run"):
            validate = validate_sweep_params(
                dataset_uri=dataset_uri, dataset_checksum=dataset_checksum, val_fraction=val_fraction,
                max_train_samples=max_train_samples, max_test_samples=max_test_samples, image_size=image_size,
                preset=preset, model=model, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                seed=seed, extra_hparams=extra_hparams, num_gpus=num_gpus, checkpoint_every=checkpoint_every,
                checkpoint_uri=checkpoint_uri, min_accuracy=min_accuracy, model_name=model_name,
                hparam_sets=hparam_sets, **storage,
            ).set_display_name("validate")  # fmt: skip
            policy.step(validate, "validate")
            download = download_dataset(
                source_uri=dataset_uri,
                checksum=dataset_checksum,
                minio_endpoint=policy.minio_endpoint,
                **storage,
            )
            download.set_display_name("download").after(validate)
            policy.step(download, "download")
            preprocess = preprocess_dataset(
                archive=download.outputs["archive"], val_fraction=val_fraction,
                max_train_samples=max_train_samples, max_test_samples=max_test_samples, image_size=image_size,
                seed=seed, minio_endpoint=policy.minio_endpoint, **storage,
            ).set_display_name("preprocess")  # fmt: skip
            policy.step(preprocess, "preprocess")
            dataset = preprocess.outputs["dataset"]
            # kfp 2.17's ParallelFor takes parallelism as a Python int, so it is fixed at compile time.
            with dsl.ParallelFor(items=validate.outputs["trials"], parallelism=parallelism,
                                 name="trials") as trial:  # fmt: skip
                train = train_model(
                    dataset=dataset, preset=trial.preset, architecture=trial.model, epochs=trial.epochs,
                    batch_size=trial.batch_size, learning_rate=trial.learning_rate, seed=trial.seed,
                    extra_hparams=trial.extra_hparams, num_gpus=num_gpus, checkpoint_every=checkpoint_every,
                    checkpoint_uri=checkpoint_uri, run_id=RUN_ID, **storage,
                ).set_display_name("train")  # fmt: skip
                policy.gpu_train(train, gpu_limit=validate.outputs["gpu_limit"])
                evaluation = evaluate_model(
                    model=train.outputs["model"], dataset=dataset, history=train.outputs["history"], tta=True
                ).set_display_name("evaluate")
                policy.step(evaluation, "evaluate")
            best = select_best_model(
                models=dsl.Collected(train.outputs["model"]),
                accuracies=dsl.Collected(evaluation.outputs["test_accuracy"]),
                trials=validate.outputs["trials"],
                **storage,
            ).set_display_name("select-best")
            policy.step(best, "select")
            record = record_sweep_outputs(
                archive=download.outputs["archive"], dataset=dataset, best_model=best.outputs["best_model"],
                best_accuracy=best.outputs["Output"], params_json=validate.outputs["params_json"],
                pipeline_name=PIPELINE_NAME, run_id=RUN_ID, **storage,
            ).set_display_name("record-outputs")  # fmt: skip
            policy.step(record, "record")
            gate = gate_model(
                model=best.outputs["best_model"], dataset=dataset, test_accuracy=best.outputs["Output"],
                min_accuracy=min_accuracy, model_name=model_name, **storage,
            ).set_display_name("gate")  # fmt: skip
            policy.step(gate, "gate")
            with dsl.If(gate.outputs["passed"] == True, name="gate-passed"):  # noqa: E712 - a KFP condition
                publish = publish_model(
                    model=best.outputs["best_model"], dataset=dataset, test_accuracy=best.outputs["Output"],
                    model_name=model_name, run_id=RUN_ID, **storage,
                ).set_display_name("publish")  # fmt: skip
                policy.step(publish, "publish")
                published = record_publication(
                    uri=publish.outputs["uri"], version=publish.outputs["version"], run_id=RUN_ID, **storage
                ).set_display_name("record-publication")
                policy.step(published, "record")

    return cifar10_sweep


sweep_pipeline = build_sweep_pipeline()
