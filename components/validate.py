"""The first step of both pipelines: check every parameter in seconds, before any GPU pod.

The rules live in ``cifar10_kfp.params.validate_pipeline_params``; this adapter only calls
them and hands the next steps what they need in the form KFP needs.
"""

from typing import NamedTuple

from kfp import dsl

from cifar10_kfp_components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def validate_training_params(
    dataset_uri: str,
    dataset_checksum: str,
    val_fraction: float,
    max_train_samples: int,
    max_test_samples: int,
    image_size: int,
    preset: str,
    model: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    extra_hparams: str,
    num_gpus: int,
    num_nodes: int,
    checkpoint_every: int,
    checkpoint_uri: str,
    min_accuracy: float,
    model_name: str,
    bucket: str,
    storage_prefix: str,
) -> NamedTuple("ValidatedTraining", [("gpu_limit", str), ("params_json", str)]):
    """Validate the training pipeline's parameters.

    Args:
        dataset_uri: Where the dataset archive is.
        dataset_checksum: Expected checksum of the archive (sha256 or md5:HEX), or empty.
        val_fraction: Validation fraction of the training split.
        max_train_samples: Training-image cap, 0 for all.
        max_test_samples: Test-image cap, 0 for all.
        image_size: Image side in pixels.
        preset: Training preset name.
        model: Architecture name, empty for the preset's.
        epochs: Epochs, 0 for the preset's.
        batch_size: Batch size, 0 for the preset's.
        learning_rate: Peak learning rate, 0 for the preset's.
        seed: Random seed.
        extra_hparams: JSON object of training-config overrides.
        num_gpus: GPUs per node.
        num_nodes: Nodes to train on.
        checkpoint_every: Checkpoint interval in epochs, 0 for the preset's.
        checkpoint_uri: Checkpoint location, empty to derive it from the run id.
        min_accuracy: Publishing threshold.
        model_name: Published model name.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.

    Returns:
        gpu_limit: GPUs for the train pod, as a string (the KFP driver reads resource counts as strings).
        params_json: The validated, normalised parameters as JSON.

    Raises:
        ValueError: naming the first bad parameter and its allowed range.
    """
    params = dict(locals())  # first statement: exactly the parameters
    import json

    from cifar10_kfp.run_records import report_failures

    report_failures(bucket, storage_prefix)  # a refusal is recorded for the run summary

    from cifar10_kfp.params import gpu_limit_for_pod, validate_pipeline_params

    values = validate_pipeline_params(params, "training")
    print("parameters are valid:", json.dumps(values, sort_keys=True))
    return (  # in the order of the declared outputs
        gpu_limit_for_pod(values["num_gpus"], values["num_nodes"]),
        json.dumps(values, sort_keys=True),
    )


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def validate_sweep_params(
    dataset_uri: str,
    dataset_checksum: str,
    val_fraction: float,
    max_train_samples: int,
    max_test_samples: int,
    image_size: int,
    preset: str,
    model: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    extra_hparams: str,
    num_gpus: int,
    checkpoint_every: int,
    checkpoint_uri: str,
    min_accuracy: float,
    model_name: str,
    bucket: str,
    storage_prefix: str,
    hparam_sets: str,
) -> NamedTuple("ValidatedSweep", [("gpu_limit", str), ("trials", list), ("params_json", str)]):
    """Validate the sweep pipeline's parameters and expand the trials.

    Args:
        dataset_uri: Where the dataset archive is.
        dataset_checksum: Expected checksum of the archive (sha256 or md5:HEX), or empty.
        val_fraction: Validation fraction of the training split.
        max_train_samples: Training-image cap, 0 for all.
        max_test_samples: Test-image cap, 0 for all.
        image_size: Image side in pixels.
        preset: Training preset every trial starts from.
        model: Architecture name, empty for the preset's.
        epochs: Epochs, 0 for the preset's.
        batch_size: Batch size, 0 for the preset's.
        learning_rate: Peak learning rate, 0 for the preset's.
        seed: Random seed.
        extra_hparams: JSON object of training-config overrides.
        num_gpus: GPUs per trial.
        checkpoint_every: Checkpoint interval in epochs, 0 for the preset's.
        checkpoint_uri: Checkpoint location, empty to derive it from the run id.
        min_accuracy: Publishing threshold.
        model_name: Published model name.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Object-store key prefix, empty for the configured one.
        hparam_sets: JSON list of trial overrides.

    Returns:
        gpu_limit: GPUs for each train pod, as a string.
        trials: One complete dict of training settings per trial, for ``dsl.ParallelFor``.
        params_json: The validated, normalised parameters as JSON.

    Raises:
        ValueError: naming the first bad parameter (or trial field) and its allowed range.
    """
    params = dict(locals())  # first statement: exactly the parameters
    import json

    from cifar10_kfp.run_records import report_failures

    report_failures(bucket, storage_prefix)  # a refusal is recorded for the run summary

    from cifar10_kfp.params import validate_pipeline_params

    values = validate_pipeline_params(params, "sweep")
    trials = json.loads(values["hparam_sets"])
    print(f"parameters are valid; {len(trials)} trials:", json.dumps(trials, sort_keys=True))
    return str(values["num_gpus"]), trials, json.dumps(values, sort_keys=True)  # the declared outputs' order
