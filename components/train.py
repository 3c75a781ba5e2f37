"""The ``train_model`` component: a thin adapter over ``cifar10_kfp.engine.train``.

Checkpoints go to the object store under ``checkpoint_uri``; when that is empty the prefix is
derived from the KFP run id and the config hash, so a retry of the same task finds the last
checkpoint and continues instead of starting over. KFP retries a pod that failed or was
OOM-killed, not one that was deleted (preemption, a drained or lost node): docs/pipelines.md, "Retries".
"""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from cifar10_kfp_components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train_model(
    dataset: Input[Dataset],
    preset: str,
    architecture: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    extra_hparams: str,
    num_gpus: int,
    checkpoint_every: int,
    checkpoint_uri: str,
    run_id: str,
    bucket: str,
    storage_prefix: str,
    model: Output[Model],
    metrics: Output[Metrics],
    history: Output[Artifact],
):
    """Train an image classifier on a prepared dataset, resuming from checkpoints.

    Args:
        dataset: The prepared dataset (``dataset.path`` is the safetensors file).
        preset: Training preset: ``seed``, ``fast`` or ``cpu``.
        architecture: Model registry name; empty for the preset's.
        epochs: Epochs; 0 for the preset's.
        batch_size: Global batch size, split across GPUs; 0 for the preset's.
        learning_rate: Peak learning rate; 0 for the preset's.
        seed: Random seed (data order, augmentation, initialisation).
        extra_hparams: JSON object of further ``TrainConfig`` overrides, e.g. ``{"label_smoothing": 0.1}``;
            empty for none. Unknown keys fail the step with the list of valid ones.
        num_gpus: DDP processes in this pod (one per GPU); 0 or 1 for a single process.
        checkpoint_every: Checkpoint interval in epochs; 0 for the preset's.
        checkpoint_uri: Checkpoint prefix (``s3://...``); empty to derive it from ``run_id``.
        run_id: The KFP run id (``{{$.pipeline_job_uuid}}``), used for the default checkpoint prefix.
        bucket: Object-store bucket; empty for the configured one.
        storage_prefix: Key prefix in the bucket; empty for the configured one.
        model: Output model directory (weights, architecture, class names, normalisation, image size).
        metrics: Output training metrics.
        history: Output per-epoch history (JSON list).
    """
    import json
    import os
    import shutil
    import tempfile

    from cifar10_kfp.config import make_config
    from cifar10_kfp.engine import default_checkpoint_uri, train
    from cifar10_kfp.process import freeze_heap_before_exit
    from cifar10_kfp.run_records import report_failures

    report_failures(bucket, storage_prefix)
    overrides = json.loads(extra_hparams) if extra_hparams.strip() else {}
    if not isinstance(overrides, dict):
        raise ValueError(f"extra_hparams must be a JSON object, got {extra_hparams!r}")
    for key, value in (
        ("architecture", architecture),
        ("epochs", epochs),
        ("batch_size", batch_size),
        ("lr", learning_rate),
        ("checkpoint_every", checkpoint_every),
    ):
        if value:  # "" / 0 mean the preset's value
            overrides[key] = value
    overrides["seed"] = seed
    config = make_config(preset, overrides)

    if bucket:
        os.environ["CIFAR10_KFP_BUCKET"] = bucket
    if storage_prefix:
        os.environ["CIFAR10_KFP_PREFIX"] = storage_prefix
    if not checkpoint_uri:
        checkpoint_uri = default_checkpoint_uri(run_id, config)

    with tempfile.TemporaryDirectory(prefix="train-model-") as work:
        result = train(config, dataset.path, work, checkpoint_uri=checkpoint_uri, nproc=max(1, num_gpus))
        os.makedirs(model.path, exist_ok=True)
        shutil.copytree(result.model_dir, model.path, dirs_exist_ok=True)
        shutil.copyfile(os.path.join(work, "history.json"), os.path.join(model.path, "history.json"))
        shutil.copyfile(os.path.join(work, "history.json"), history.path)

    model.metadata.update(
        {
            "architecture": config.architecture,
            "preset": config.preset,
            "config_hash": config.config_hash(),
            "checkpoint_uri": checkpoint_uri,
            "val_acc": float(result.metrics["val_acc"]),
            "epochs": config.epochs,
        }
    )
    for name in ("val_acc", "val_loss", "train_loss", "train_acc", "images_per_s", "wall_s"):
        metrics.log_metric(name, float(result.metrics[name]))
    metrics.log_metric("resumed_from_epoch", float(result.metrics["resumed_from_epoch"]))
    freeze_heap_before_exit()  # the process ends next: spare its exit a collection over torch's objects
