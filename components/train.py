"""The ``train_model`` component: a thin adapter over ``cifar10_kfp.train.train``.

Checkpoints go to the object store under ``checkpoint_uri/<config hash>``; when that is empty the
prefix is derived from the KFP run id and the config hash, so a retry of the same task finds the
last checkpoint and continues instead of starting over, and two sweep trials never share one. KFP
retries a pod that failed or was OOM-killed, not one that was deleted (preemption, a drained or
lost node): docs/pipelines.md, "Retries". The training settings arrive as one dict and map to
a ``TrainConfig`` through ``cifar10_kfp.params.train_config``, the same mapping as the multi-node
step and the CLI.
"""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from cifar10_kfp_components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train_model(
    dataset: Input[Dataset],
    training: dict,
    num_gpus: int,
    checkpoint_uri: str,
    run_id: str,
    bucket: str,
    storage_prefix: str,
    model: Output[Model],
    metrics: Output[Metrics],
    history: Output[Artifact],
    card: Output[Markdown],
):
    """Train an image classifier on a prepared dataset, resuming from checkpoints.

    Args:
        dataset: The prepared dataset (``dataset.path`` is the safetensors file).
        training: Validated training settings (cifar10_kfp.params.TRAINING_KEYS): validate's output or a trial.
        num_gpus: DDP processes in this pod (one per GPU); 0 or 1 for a single process.
        checkpoint_uri: Checkpoint prefix (``s3://...``), the config hash appended; empty derives it from run_id.
        run_id: The KFP run id (``{{$.pipeline_job_uuid}}``), used for the default checkpoint prefix.
        bucket: Object-store bucket; empty for the configured one.
        storage_prefix: Key prefix in the bucket; empty for the configured one.
        model: Output model directory (weights, architecture, class names, normalisation, image size).
        metrics: Output training metrics.
        history: Output per-epoch history (JSON list).
        card: Markdown: final figures, and where the checkpoints and TensorBoard curves are.
    """
    import os
    import shutil
    import tempfile

    from cifar10_kfp.params import checkpoint_prefix, train_config
    from cifar10_kfp.runs import freeze_heap_before_exit, report_failures, write_metadata_file
    from cifar10_kfp.storage import open_store
    from cifar10_kfp.train import tensorboard_uri, train, training_markdown

    report_failures(bucket, storage_prefix)
    config = train_config(training)
    checkpoint_uri = checkpoint_prefix(checkpoint_uri, run_id, config, open_store(bucket, storage_prefix))

    with tempfile.TemporaryDirectory(prefix="train-model-") as work:
        result = train(config, dataset.path, work, checkpoint_uri=checkpoint_uri, nproc=max(1, num_gpus))
        os.makedirs(model.path, exist_ok=True)
        shutil.copytree(result.model_dir, model.path, dirs_exist_ok=True)
        shutil.copyfile(os.path.join(work, "history.json"), os.path.join(model.path, "history.json"))
        shutil.copyfile(os.path.join(work, "history.json"), history.path)
    with open(card.path, "w") as fh:
        fh.write(training_markdown(result.metrics, checkpoint_uri, result.history))

    model.metadata.update(
        {
            "architecture": config.architecture,
            "preset": config.preset,
            "config_hash": config.config_hash(),
            "checkpoint_uri": checkpoint_uri,
            "tensorboard_uri": tensorboard_uri(checkpoint_uri),
            "val_acc": float(result.metrics["val_acc"]),
            "epochs": config.epochs,
        }
    )
    for name in ("val_acc", "val_loss", "train_loss", "train_acc", "images_per_s", "wall_s"):
        metrics.log_metric(name, float(result.metrics[name]))
    metrics.log_metric("resumed_from_epoch", float(result.metrics["resumed_from_epoch"]))
    write_metadata_file(metrics)  # the KFP UI previews each artifact's object (runs/process.py)
    freeze_heap_before_exit()  # the process ends next: spare its exit a collection over torch's objects
