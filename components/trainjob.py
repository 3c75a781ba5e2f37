"""The multi-node train step: hands training to a Kubeflow Trainer v2 ``TrainJob``.

Same inputs and outputs as ``cifar10_kfp_components.train.train_model`` plus ``num_nodes`` and the
settings the TrainJob's pods need (image, object-store endpoint), so the evaluate and
publish steps downstream cannot tell which one trained the model. The work is in
``cifar10_kfp.trainjob``; this adapter maps parameters and artifacts.
"""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Metrics, Model, Output

from cifar10_kfp_components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def train_on_trainer(
    dataset: Input[Dataset],
    preset: str,
    architecture: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    extra_hparams: str,
    num_gpus: int,
    num_nodes: int,
    checkpoint_every: int,
    checkpoint_uri: str,
    run_id: str,
    bucket: str,
    storage_prefix: str,
    image: str,
    minio_endpoint: str,
    minio_secure: bool,
    model: Output[Model],
    metrics: Output[Metrics],
    history: Output[Artifact],
):
    """Train on ``num_nodes`` nodes with a TrainJob on the ``torch-distributed`` runtime.

    Args:
        dataset: The prepared dataset (read by every node from the object store).
        preset: Training preset name.
        architecture: Model architecture, empty for the preset's.
        epochs: Epochs, 0 for the preset's.
        batch_size: Global batch size, 0 for the preset's.
        learning_rate: Peak learning rate, 0 for the preset's.
        seed: Random seed.
        extra_hparams: JSON object of training-config overrides.
        num_gpus: GPUs per node (0 trains on CPU with gloo).
        num_nodes: Number of nodes.
        checkpoint_every: Checkpoint interval in epochs, 0 for the preset's.
        checkpoint_uri: Checkpoint location, empty to derive it from the run id.
        run_id: The KFP run id (names the TrainJob, so a retry re-attaches).
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.
        image: The image the TrainJob's nodes run (the pipeline's image).
        minio_endpoint: Object-store endpoint for the nodes.
        minio_secure: Whether the object store uses TLS.
        model: The trained model directory.
        metrics: Final training metrics.
        history: Per-epoch history (history.json).
    """
    import json
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from cifar10_kfp.config import make_config
    from cifar10_kfp.engine import default_checkpoint_uri
    from cifar10_kfp.params import training_overrides
    from cifar10_kfp.run_records import report_failures
    from cifar10_kfp.storage import open_store
    from cifar10_kfp.trainjob import TrainJobRequest, current_namespace, job_name, run_trainjob

    report_failures(bucket, storage_prefix)

    # The same mapping as the single-node train step: ""/0 keep the preset's value.
    overrides = training_overrides(
        {"extra_hparams": extra_hparams, "model": architecture, "epochs": epochs, "batch_size": batch_size,
         "learning_rate": learning_rate, "checkpoint_every": checkpoint_every, "seed": seed}
    )  # fmt: skip
    config = make_config(preset, overrides)
    # default_checkpoint_uri reads the root from the environment: point it at this run's bucket/prefix.
    if bucket:
        os.environ["CIFAR10_KFP_BUCKET"] = bucket
    if storage_prefix:
        os.environ["CIFAR10_KFP_PREFIX"] = storage_prefix
    store = open_store()
    checkpoints = checkpoint_uri or default_checkpoint_uri(run_id, config)
    name = job_name(run_id, config.config_hash())
    request = TrainJobRequest(
        name=name,
        namespace=current_namespace(),
        image=image,
        data_uri=dataset.uri,
        output_uri=store.root_uri("trainjobs", name),
        checkpoint_uri=checkpoints,
        config=config.to_dict(),
        num_nodes=num_nodes,
        gpus_per_node=num_gpus,
        minio_endpoint=minio_endpoint,
        minio_secure=minio_secure,
        labels={"pipelines.kubeflow.org/run-id": run_id[:63]},
    )
    with tempfile.TemporaryDirectory() as tmp:
        state = run_trainjob(request, tmp, store=store)
        shutil.copytree(Path(tmp) / "model", model.path, dirs_exist_ok=True)
        shutil.copyfile(Path(tmp) / "history.json", history.path)
        final = json.loads((Path(tmp) / "metrics.json").read_text())
    for key, value in sorted(final.items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, float(value))
    model.metadata["checkpoint_uri"] = checkpoints
    model.metadata["trainjob"] = f"{request.namespace}/{name}"
    model.metadata["num_nodes"] = num_nodes
    print(f"TrainJob {request.namespace}/{name}: {state.phase}")
