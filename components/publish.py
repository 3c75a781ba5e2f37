"""The champion/challenger gate and the versioned publish of the model.

``gate_model`` re-evaluates the currently published model of the same name on this run's test
data and passes only a challenger that reaches ``min_accuracy`` and beats it. ``publish_model``
(run by the pipeline only when the gate passed) writes a new, never-overwritten version and
then moves ``latest``. The logic is ``cifar10_kfp.publish``.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Model, Output

from cifar10_kfp_components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def gate_model(
    model: Input[Model],
    dataset: Input[Dataset],
    test_accuracy: float,
    min_accuracy: float,
    model_name: str,
    bucket: str,
    storage_prefix: str,
    decision: Output[Artifact],
) -> NamedTuple("GateOutputs", [("passed", bool), ("champion_accuracy", float)]):
    """Decide whether the challenger may be published.

    Args:
        model: The challenger's model directory (recorded for lineage).
        dataset: The prepared dataset; the champion is evaluated on its test split.
        test_accuracy: The challenger's test accuracy, from the evaluate step.
        min_accuracy: The lowest accuracy that may be published, in [0, 1].
        model_name: The name the model is published under.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Key prefix, empty for the configured one.
        decision: JSON with the decision, the reason and both accuracies.

    Returns:
        passed: Whether to publish.
        champion_accuracy: The published model's accuracy on this test data, -1.0 if none is published.
    """
    import json
    from collections import namedtuple

    from cifar10_kfp.publish import run_gate
    from cifar10_kfp.runs import freeze_heap_before_exit, record_gate_decision, report_failures
    from cifar10_kfp.storage import open_store

    report_failures(bucket, storage_prefix)
    store = open_store(bucket or None, storage_prefix or None)
    result = run_gate(
        test_accuracy, dataset.path, min_accuracy=min_accuracy, model_name=model_name, store=store
    )
    record = {**result.to_dict(), "model_name": model_name, "challenger_uri": model.uri}
    with open(decision.path, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2, sort_keys=True)
    decision.metadata.update({k: v for k, v in record.items() if v is not None})
    record_gate_decision(store, record)  # the run summary tells "not published" from "failed" by it
    champion = -1.0 if result.champion_accuracy is None else result.champion_accuracy
    freeze_heap_before_exit()  # the process ends next: spare its exit a collection over torch's objects
    return namedtuple("GateOutputs", ["passed", "champion_accuracy"])(result.passed, champion)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def publish_model(
    model: Input[Model],
    dataset: Input[Dataset],
    test_accuracy: float,
    model_name: str,
    run_id: str,
    bucket: str,
    storage_prefix: str,
    card: Output[Markdown],
    inference_service: Output[Artifact],
) -> NamedTuple("PublishOutputs", [("uri", str), ("version", str)]):
    """Publish the model as a new version and move ``latest`` to it.

    Args:
        model: The model directory to publish.
        dataset: The prepared dataset it was evaluated on (its digest goes into the model card).
        test_accuracy: The test accuracy, recorded in the model card.
        model_name: The name to publish under: ``<root>/models/<model_name>/<version>/``.
        run_id: The KFP run id, part of the version and recorded in the card.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Key prefix, empty for the configured one.
        card: The model card (Markdown).
        inference_service: A KServe InferenceService manifest (YAML) for the new version.

    Returns:
        uri: The published version's URI.
        version: The version, ``YYYYMMDDTHHMMSSZ-<run id>``.
    """
    from collections import namedtuple

    from cifar10_kfp.publish import dataset_digests
    from cifar10_kfp.publish import publish_model as publish
    from cifar10_kfp.runs import freeze_heap_before_exit, report_failures
    from cifar10_kfp.storage import open_store

    report_failures(bucket, storage_prefix)
    digests = dataset_digests(dataset.path)
    result = publish(
        model.path,
        model_name=model_name,
        metrics={"test_accuracy": test_accuracy},
        dataset_digest=digests["prepared_sha256"],
        params={
            "source_digest": digests["source_digest"],
            "model_uri": model.uri,
            "dataset_uri": dataset.uri,
        },
        run_id=run_id,
        store=open_store(bucket or None, storage_prefix or None),
    )
    with open(card.path, "w", encoding="utf-8") as fh:
        fh.write(result.card_markdown)
    with open(inference_service.path, "w", encoding="utf-8") as fh:
        fh.write(result.inference_service_yaml)
    card.metadata.update({"uri": result.uri, "version": result.version})
    inference_service.metadata.update(
        {
            "storageUri": result.inference_service["spec"]["predictor"]["model"]["storageUri"],
            "version": result.version,
        }
    )
    freeze_heap_before_exit()  # the process ends next: spare its exit a collection over torch's objects
    return namedtuple("PublishOutputs", ["uri", "version"])(result.uri, result.version)
