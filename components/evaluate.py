"""Evaluate the trained model on the test split and show it in the KFP UI.

Outputs: scalar ``Metrics``, a ``ClassificationMetrics`` confusion matrix, a self-contained
``HTML`` report (curves, heatmap, misclassified images, per-class table, parameters) and a
short ``Markdown`` summary. The logic is ``cifar10_kfp.evaluate``.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output

from cifar10_kfp_components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate_model(
    model: Input[Model],
    dataset: Input[Dataset],
    history: Input[Artifact],
    tta: bool,
    metrics: Output[Metrics],
    classification_metrics: Output[ClassificationMetrics],
    report: Output[HTML],
    summary: Output[Markdown],
) -> NamedTuple("EvalOutputs", [("test_accuracy", float), ("test_accuracy_plain", float)]):  # type: ignore[valid-type]  # KFP's output idiom, evaluated in the pod
    """Evaluate a model on the test split of a prepared dataset.

    Args:
        model: Model directory (``model.safetensors`` + ``model.json``).
        dataset: Prepared dataset file (``dataset.safetensors``).
        history: The training history (``history.json``) for the loss and accuracy curves.
        tta: Evaluate as the published model serves: the mean of the logits of each image and of
            its horizontal flip (true in the pipelines). False measures a single forward pass.
        metrics: Scalar metrics: accuracy (the headline, as served), accuracy_plain (single view),
            loss, macro_f1, num_examples.
        classification_metrics: The confusion matrix with the class names.
        report: The self-contained HTML report.
        summary: A short Markdown summary.

    Returns:
        test_accuracy: The headline top-1 accuracy, as served (what the publish gate uses).
        test_accuracy_plain: Top-1 accuracy of a single forward pass (recorded with a registered version).
    """
    import os
    from collections import namedtuple

    from cifar10_kfp.evaluate import evaluate_model as evaluate
    from cifar10_kfp.evaluate import render_html, render_markdown
    from cifar10_kfp.runs import freeze_heap_before_exit, report_failures, write_metadata_file

    report_failures()  # into the configured bucket and prefix: this step takes neither as input
    history_path = history.path if history.path and os.path.isfile(history.path) else None
    result = evaluate(
        model.path,
        dataset.path,
        tta=tta,
        history_path=history_path,
        params={"model_uri": model.uri, "dataset_uri": dataset.uri, "tta": tta},
    )
    for name, value in result.scalars().items():
        metrics.log_metric(name, value)
    classification_metrics.log_confusion_matrix(result.class_names, result.confusion_matrix)
    write_metadata_file(metrics)  # the KFP UI previews each artifact's object (runs/process.py)
    write_metadata_file(classification_metrics)
    with open(report.path, "w", encoding="utf-8") as fh:
        fh.write(render_html(result))
    with open(summary.path, "w", encoding="utf-8") as fh:
        fh.write(render_markdown(result))
    freeze_heap_before_exit()  # the process ends next: spare its exit a collection over torch's objects
    EvalOutputs = namedtuple("EvalOutputs", ["test_accuracy", "test_accuracy_plain"])
    return EvalOutputs(result.accuracy, result.accuracy_plain)
