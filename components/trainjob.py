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
    training: dict,
    num_gpus: int,
    num_nodes: int,
    min_nodes: int,
    max_restarts: int,
    trainjob_timeout_h: float,
    keep_trainjob: int,
    service_account: str,
    image_pull_secrets: str,
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
        training: Validated training settings (cifar10_kfp.params.TRAINING_KEYS): validate's output.
        num_gpus: GPUs per node (0 trains on CPU with gloo).
        num_nodes: Number of nodes (the most, in elastic mode).
        min_nodes: Elastic: keep training while at least this many nodes are alive; 0 means num_nodes.
        max_restarts: torchrun's worker-group restarts after a failure such as a lost node.
        trainjob_timeout_h: Hours before the launcher deletes the TrainJob and fails the step.
        keep_trainjob: 1 keeps the finished TrainJob; 0 deletes it once its outputs are collected.
        service_account: The node pods' service account; empty keeps the runtime's.
        image_pull_secrets: Comma-separated image-pull secrets for the node pods; empty for none.
        checkpoint_uri: Checkpoint prefix, the config hash appended; empty derives it from the run id.
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
    import shutil
    import tempfile
    from pathlib import Path

    from cifar10_kfp.params import checkpoint_prefix, train_config
    from cifar10_kfp.runs import report_failures, write_metadata_file
    from cifar10_kfp.storage import open_store
    from cifar10_kfp.trainjob import request_for_run, run_trainjob

    report_failures(bucket, storage_prefix)
    config = train_config(training)  # the same mapping as the single-node train step
    store = open_store(bucket, storage_prefix)
    checkpoints = checkpoint_prefix(checkpoint_uri, run_id, config, store)
    request = request_for_run(
        config, run_id=run_id, store=store, data_uri=dataset.uri, checkpoint_uri=checkpoints, image=image,
        num_nodes=num_nodes, gpus_per_node=num_gpus, min_nodes=min_nodes, max_restarts=max_restarts,
        timeout_h=trainjob_timeout_h, service_account=service_account, image_pull_secrets=image_pull_secrets,
        minio_endpoint=minio_endpoint, minio_secure=minio_secure,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        state = run_trainjob(
            request, tmp, store=store, timeout_s=trainjob_timeout_h * 3600, keep=bool(keep_trainjob)
        )
        shutil.copytree(Path(tmp) / "model", model.path, dirs_exist_ok=True)
        shutil.copyfile(Path(tmp) / "history.json", history.path)
        final = json.loads((Path(tmp) / "metrics.json").read_text())
    for key, value in sorted(final.items()):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.log_metric(key, float(value))
    write_metadata_file(metrics)  # the KFP UI previews each artifact's object (runs/process.py)
    model.metadata.update(
        checkpoint_uri=checkpoints, trainjob=f"{request.namespace}/{request.name}", num_nodes=num_nodes
    )
    print(f"TrainJob {request.namespace}/{request.name}: {state.phase}")
