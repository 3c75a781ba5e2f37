"""Pipeline ``cifar10-training``: validate -> download -> preprocess -> train -> evaluate -> gated publish.

An ``ExitHandler`` task writes the run summary whatever happens. Training runs on one node
(``train_model``, GPUs on the pod) or, when ``num_nodes > 1``, through a Kubeflow Trainer
``TrainJob`` (``train_on_trainer``). The two are ``dsl.If``/``dsl.Else`` branches that each
run evaluate/gate/publish themselves: a ``dsl.OneOf`` over the two models would join them, but
kfp.local 2.17 cannot run ``OneOf`` over artifacts ("Expected 1 artifact in
ArtifactSelectorSpec"), and the same compiled DAG must run locally.

Cluster settings come from ``cifar10_kfp_pipelines.policy.ClusterPolicy``; ``build_training_pipeline(policy)``
returns the pipeline compiled with it, ``training_pipeline`` is the default one.
"""

from kfp import dsl

from cifar10_kfp_components.data import download_dataset, preprocess_dataset
from cifar10_kfp_components.evaluate import evaluate_model
from cifar10_kfp_components.publish import gate_model, publish_model
from cifar10_kfp_components.summary import record_publication, record_run_outputs, write_run_summary
from cifar10_kfp_components.train import train_model
from cifar10_kfp_components.trainjob import train_on_trainer
from cifar10_kfp_components.validate import validate_training_params
from cifar10_kfp_pipelines.kfp_compat import quick_task_settings
from cifar10_kfp_pipelines.policy import ClusterPolicy

PIPELINE_NAME = "cifar10-training"
RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER  # the run's uuid on a cluster; a random id under kfp.local


def evaluate_and_publish(policy, *, train, archive, dataset, params_json, min_accuracy, model_name, bucket,
                         storage_prefix, pipeline_name):  # fmt: skip
    """Evaluate ``train``'s model, record the run, and publish it if the gate passes."""
    storage = {"bucket": bucket, "storage_prefix": storage_prefix}
    evaluation = evaluate_model(
        model=train.outputs["model"], dataset=dataset, history=train.outputs["history"], tta=True
    ).set_display_name("evaluate")
    policy.step(evaluation, "evaluate")
    test_accuracy = evaluation.outputs["test_accuracy"]
    record = record_run_outputs(
        archive=archive, dataset=dataset, model=train.outputs["model"], train_metrics=train.outputs["metrics"],
        history=train.outputs["history"], eval_metrics=evaluation.outputs["metrics"],
        report=evaluation.outputs["report"], test_accuracy=test_accuracy, params_json=params_json,
        pipeline_name=pipeline_name, run_id=RUN_ID, **storage,
    ).set_display_name("record-outputs")  # fmt: skip
    policy.step(record, "record")
    gate = gate_model(
        model=train.outputs["model"], dataset=dataset, test_accuracy=test_accuracy, min_accuracy=min_accuracy,
        model_name=model_name, **storage,
    ).set_display_name("gate")  # fmt: skip
    policy.step(gate, "gate")
    with dsl.If(gate.outputs["passed"] == True, name="gate-passed"):  # noqa: E712 - a KFP condition, not Python
        publish = publish_model(
            model=train.outputs["model"], dataset=dataset, test_accuracy=test_accuracy, model_name=model_name,
            run_id=RUN_ID, **storage,
        ).set_display_name("publish")  # fmt: skip
        policy.step(publish, "publish")
        published = record_publication(
            uri=publish.outputs["uri"], version=publish.outputs["version"], run_id=RUN_ID, **storage
        ).set_display_name("record-publication")
        policy.step(published, "record")


@quick_task_settings()
def build_training_pipeline(policy: ClusterPolicy | None = None):
    """The ``cifar10-training`` pipeline with ``policy``'s cluster settings baked in."""
    policy = policy or ClusterPolicy()

    @dsl.pipeline(name=PIPELINE_NAME)
    def cifar10_training(
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
        num_nodes: int = 1,
        checkpoint_every: int = 0,
        checkpoint_uri: str = "",
        min_accuracy: float = 0.5,
        model_name: str = "cifar10-classifier",
        bucket: str = "",
        storage_prefix: str = "",
    ):
        """Train a PyTorch image classifier on CIFAR-10 (or any image-folder archive), evaluate it, and publish it if it beats the gate.

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
            num_nodes: Nodes to train on, 1..64; more than 1 hands training to a Kubeflow Trainer TrainJob.
            checkpoint_every: Save a resumable checkpoint every N epochs, 1..10000; 0 uses the preset's.
            checkpoint_uri: Where checkpoints go (s3://bucket/key); empty derives it from the run id, so a retry resumes.
            min_accuracy: Publish only if test accuracy is at least this, in [0, 1], and not worse than the published champion.
            model_name: Name the model is published under (models/<name>/<version>).
            bucket: Object-store bucket; empty uses CIFAR10_KFP_BUCKET (default mlpipeline).
            storage_prefix: Key prefix for everything the pipeline writes; empty uses CIFAR10_KFP_PREFIX (default cifar10-kfp/).
        """  # noqa: E501 - the KFP UI shows each line as it is
        storage = {"bucket": bucket, "storage_prefix": storage_prefix}
        summary = write_run_summary(
            pipeline_name=PIPELINE_NAME, run_id=RUN_ID, checkpoint_uri=checkpoint_uri, **storage
        ).set_display_name("run-summary")
        policy.step(summary, "summary")
        with dsl.ExitHandler(summary, name="run"):
            validate = validate_training_params(
                dataset_uri=dataset_uri, dataset_checksum=dataset_checksum, val_fraction=val_fraction,
                max_train_samples=max_train_samples, max_test_samples=max_test_samples, image_size=image_size,
                preset=preset, model=model, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                seed=seed, extra_hparams=extra_hparams, num_gpus=num_gpus, num_nodes=num_nodes,
                checkpoint_every=checkpoint_every, checkpoint_uri=checkpoint_uri, min_accuracy=min_accuracy,
                model_name=model_name, **storage,
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
            common = dict(
                dataset=preprocess.outputs["dataset"], preset=preset, architecture=model, epochs=epochs,
                batch_size=batch_size, learning_rate=learning_rate, seed=seed, extra_hparams=extra_hparams,
                num_gpus=num_gpus, checkpoint_every=checkpoint_every, checkpoint_uri=checkpoint_uri, run_id=RUN_ID,
                **storage,
            )  # fmt: skip
            downstream = dict(
                archive=download.outputs["archive"], dataset=preprocess.outputs["dataset"],
                params_json=validate.outputs["params_json"], min_accuracy=min_accuracy, model_name=model_name,
                pipeline_name=PIPELINE_NAME, **storage,
            )  # fmt: skip
            with dsl.If(num_nodes == 1, name="single-node"):
                train = train_model(**common).set_display_name("train")
                policy.gpu_train(train, gpu_limit=validate.outputs["gpu_limit"])
                evaluate_and_publish(policy, train=train, **downstream)
            with dsl.Else(name="multi-node"):
                train = train_on_trainer(
                    num_nodes=num_nodes, image=policy.image, minio_endpoint=policy.minio_endpoint,
                    minio_secure=policy.minio_secure, **common,
                ).set_display_name("train-trainjob")  # fmt: skip
                policy.trainer_launcher(train)
                evaluate_and_publish(policy, train=train, **downstream)

    return cifar10_training


training_pipeline = build_training_pipeline()
