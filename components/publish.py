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
) -> NamedTuple("GateOutputs", [("passed", bool), ("champion_accuracy", float)]):  # type: ignore[valid-type]  # KFP's output idiom, evaluated in the pod
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
    GateOutputs = namedtuple("GateOutputs", ["passed", "champion_accuracy"])
    return GateOutputs(result.passed, champion)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def publish_model(
    model: Input[Model],
    dataset: Input[Dataset],
    gate_decision: Input[Artifact],
    test_accuracy: float,
    test_accuracy_plain: float,
    model_name: str,
    run_id: str,
    bucket: str,
    storage_prefix: str,
    model_registry_url: str,
    image: str,
    card: Output[Markdown],
    inference_service: Output[Artifact],
) -> NamedTuple("PublishOutputs", [("uri", str), ("version", str), ("registration", str)]):  # type: ignore[valid-type]  # KFP's output idiom, evaluated in the pod
    """Publish the model as a new version, register it in Kubeflow Model Registry if asked, and move ``latest``.

    Args:
        model: The model directory to publish.
        dataset: The prepared dataset it was evaluated on (its digest goes into the model card).
        gate_decision: The gate's decision (JSON), recorded with a registered version.
        test_accuracy: The test accuracy (as served, flip TTA), recorded in the model card.
        test_accuracy_plain: The single-view test accuracy; negative when not measured (the sweep).
        model_name: The name to publish under: ``<root>/models/<model_name>/<version>/``.
        run_id: The KFP run id, part of the version and recorded in the card.
        bucket: Object-store bucket, empty for the configured one.
        storage_prefix: Key prefix, empty for the configured one.
        model_registry_url: Kubeflow Model Registry to register the version in; empty for none.
        image: The image the pipeline's steps run in, recorded with a registered version.
        card: The model card (Markdown).
        inference_service: A KServe InferenceService manifest (YAML) for the new version.

    Returns:
        uri: The published version's URI.
        version: The version, ``YYYYMMDDTHHMMSSZ-<run id>``.
        registration: JSON of where the version is registered; empty when no registry was given.
    """
    import json
    from collections import namedtuple

    from cifar10_kfp.publish import dataset_digests
    from cifar10_kfp.publish import publish_model as publish
    from cifar10_kfp.runs import freeze_heap_before_exit, report_failures
    from cifar10_kfp.storage import open_store

    report_failures(bucket, storage_prefix)
    digests = dataset_digests(dataset.path)
    with open(gate_decision.path, encoding="utf-8") as fh:
        decision = json.load(fh)
    metrics = {"test_accuracy": test_accuracy}
    if test_accuracy_plain >= 0:
        metrics["test_accuracy_plain"] = test_accuracy_plain
    result = publish(
        model.path,
        model_name=model_name,
        metrics=metrics,
        dataset_digest=digests["prepared_sha256"],
        params={
            "source_digest": digests["source_digest"],
            "model_uri": model.uri,
            "dataset_uri": dataset.uri,
        },
        run_id=run_id,
        store=open_store(bucket or None, storage_prefix or None),
        model_registry_url=model_registry_url,
        gate={
            "verdict": "passed" if decision.get("passed") else "failed",
            "reason": decision.get("reason", ""),
        },
        image=image,
    )
    with open(card.path, "w", encoding="utf-8") as fh:
        fh.write(result.card_markdown)
    with open(inference_service.path, "w", encoding="utf-8") as fh:
        fh.write(result.inference_service_yaml)
    card.metadata.update({"uri": result.uri, "version": result.version})
    if result.registration:
        card.metadata["model_registry_uri"] = result.registration["registry_uri"]
    inference_service.metadata.update(
        {
            "storageUri": result.inference_service["spec"]["predictor"]["model"]["storageUri"],
            "version": result.version,
        }
    )
    freeze_heap_before_exit()  # the process ends next: spare its exit a collection over torch's objects
    registration = json.dumps(result.registration, sort_keys=True) if result.registration else ""
    PublishOutputs = namedtuple("PublishOutputs", ["uri", "version", "registration"])
    return PublishOutputs(result.uri, result.version, registration)
