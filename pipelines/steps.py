"""What the pipelines share: their interface from ``cifar10_kfp.params`` and the common DAG pieces.

``pipeline_from_params`` makes a kfp pipeline whose parameters (names, types, defaults) and
docstring (the descriptions in the compiled YAML, docs/parameters.md) are generated from the parameter table; the body
receives the parameters as one namespace, ``p.epochs`` etc. kfp reads a pipeline's interface
with ``inspect.signature`` (which honours ``__signature__``) and ``inspect.getdoc``
(kfp/dsl/component_factory.py ``extract_component_interface``), and calls the function with
one channel per parameter, positionally (kfp/dsl/graph_component.py).

The DAG pieces: the run summary in an ``ExitHandler`` around the run, validate -> download ->
preprocess, evaluation, and the gate with its conditional publish.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace

from kfp import dsl

from cifar10_kfp.params import docstring, pipeline_params, signature
from cifar10_kfp_components.data import download_dataset, preprocess_dataset
from cifar10_kfp_components.evaluate import evaluate_model
from cifar10_kfp_components.publish import gate_model, publish_model
from cifar10_kfp_components.summary import record_publication, write_run_summary

RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER  # the run's uuid on a cluster; a random id under kfp.local


def pipeline_from_params(pipeline: str, *, name: str, summary: str) -> Callable:
    """Decorator: ``body(p)`` becomes pipeline ``name`` taking ``pipeline``'s parameters (``cifar10_kfp.params``)."""
    names = [param.name for param in pipeline_params(pipeline)]

    def decorate(body: Callable[[SimpleNamespace], None]):
        def pipeline_func(*channels):
            return body(SimpleNamespace(**dict(zip(names, channels, strict=True))))

        pipeline_func.__name__ = pipeline_func.__qualname__ = body.__name__
        # inspect.signature reads __signature__; typeshed's function type does not declare it.
        pipeline_func.__signature__ = signature(pipeline)  # type: ignore[attr-defined]
        pipeline_func.__doc__ = docstring(pipeline, summary)
        return dsl.pipeline(name=name)(pipeline_func)

    return decorate


def storage(p: SimpleNamespace) -> dict:
    """The object-store location arguments every storage step takes."""
    return {"bucket": p.bucket, "storage_prefix": p.storage_prefix}


@contextlib.contextmanager
def summarised_run(policy, p: SimpleNamespace, pipeline_name: str) -> Iterator[None]:
    """The tasks built inside run in an ``ExitHandler`` whose task writes the run summary whatever happens."""
    summary = write_run_summary(
        pipeline_name=pipeline_name, run_id=RUN_ID, checkpoint_uri=p.checkpoint_uri, **storage(p)
    ).set_display_name("run-summary")
    policy.step(summary, "summary")
    # The name the DAG shows for the group: "run" read as the whole run, not the steps inside it.
    with dsl.ExitHandler(summary, name="pipeline-steps"):
        yield


def validated_data(policy, p: SimpleNamespace, validate_component):
    """validate (every parameter, before anything is scheduled) -> download -> preprocess; the three tasks."""
    validate = validate_component(**vars(p)).set_display_name("validate")
    policy.step(validate, "validate")
    download = download_dataset(
        source_uri=p.dataset_uri,
        checksum=p.dataset_checksum,
        minio_endpoint=policy.minio_endpoint,
        **storage(p),
    )
    download.set_display_name("download").after(validate)
    policy.step(download, "download")
    preprocess = preprocess_dataset(
        archive=download.outputs["archive"], val_fraction=p.val_fraction, max_train_samples=p.max_train_samples,
        max_test_samples=p.max_test_samples, image_size=p.image_size, seed=p.seed,
        skip_bad_images=p.skip_bad_images, minio_endpoint=policy.minio_endpoint, **storage(p),
    ).set_display_name("preprocess")  # fmt: skip
    policy.step(preprocess, "preprocess")
    return validate, download, preprocess


def evaluate(policy, train, dataset):
    """The evaluation task of a train task's model (flip-TTA, as the served model predicts)."""
    evaluation = evaluate_model(
        model=train.outputs["model"], dataset=dataset, history=train.outputs["history"], tta=True
    ).set_display_name("evaluate")
    policy.step(evaluation, "evaluate")
    return evaluation


def gate_and_publish(
    policy, p: SimpleNamespace, *, model, dataset, test_accuracy, test_accuracy_plain=-1.0
) -> None:
    """Publish ``model`` (and record the publication) only if it passes the gate.

    ``test_accuracy_plain``: the single-view accuracy, recorded with a registered version; -1 when
    the pipeline did not measure it.
    """
    gate = gate_model(
        model=model, dataset=dataset, test_accuracy=test_accuracy, min_accuracy=p.min_accuracy,
        model_name=p.model_name, **storage(p),
    ).set_display_name("gate")  # fmt: skip
    policy.step(gate, "gate")
    with dsl.If(gate.outputs["passed"] == True, name="gate-passed"):  # noqa: E712 - a KFP condition, not Python
        publish = publish_model(
            model=model, dataset=dataset, gate_decision=gate.outputs["decision"], test_accuracy=test_accuracy,
            test_accuracy_plain=test_accuracy_plain, model_name=p.model_name, run_id=RUN_ID,
            model_registry_url=p.model_registry_url, image=policy.image, **storage(p),
        ).set_display_name("publish")  # fmt: skip
        policy.step(publish, "publish")
        published = record_publication(
            uri=publish.outputs["uri"], version=publish.outputs["version"],
            registration=publish.outputs["registration"], run_id=RUN_ID, **storage(p),
        ).set_display_name("record-publication")  # fmt: skip
        policy.step(published, "record")
