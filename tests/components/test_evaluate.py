"""The evaluate_model component: ``.python_func`` with real artifact objects, and its compiled spec."""

from __future__ import annotations

import json

import pytest
from kfp import dsl

from cifar10_kfp_components.evaluate import evaluate_model


def _artifacts(tmp_path, model_dir, dataset_path, history_path):
    out = tmp_path / "outputs"
    out.mkdir()
    return dict(
        model=dsl.Model(uri=str(model_dir)),
        dataset=dsl.Dataset(uri=str(dataset_path)),
        history=dsl.Artifact(uri=str(history_path)),
        metrics=dsl.Metrics(uri=str(out / "metrics")),
        classification_metrics=dsl.ClassificationMetrics(uri=str(out / "classification_metrics")),
        report=dsl.HTML(uri=str(out / "report.html")),
        summary=dsl.Markdown(uri=str(out / "summary.md")),
    )


def test_evaluate_component_fills_every_ui_output(trained_model_dir, tiny_dataset_path, tmp_path):  # noqa: F811
    arts = _artifacts(tmp_path, trained_model_dir, tiny_dataset_path, tmp_path / "history.json")
    outputs = evaluate_model.python_func(tta=True, **arts)

    metrics = arts["metrics"].metadata
    assert set(metrics) == {"accuracy", "accuracy_plain", "loss", "macro_f1", "num_examples"}
    assert outputs.test_accuracy == metrics["accuracy"] > 0.6
    matrix = arts["classification_metrics"].metadata["confusionMatrix"]
    names = [c["displayName"] for c in matrix["annotationSpecs"]]
    assert names == ["class0", "class1", "class2", "class3"]
    rows = [row["row"] for row in matrix["rows"]]
    assert len(rows) == 4 and all(len(r) == 4 for r in rows) and sum(map(sum, rows)) == 128
    html = (tmp_path / "outputs" / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and 'alt="train and val loss and accuracy per epoch"' in html
    assert "Evaluation summary" in (tmp_path / "outputs" / "summary.md").read_text()
    # The KFP UI previews each artifact's object; the metrics have one too, with the same figures.
    for name in ("metrics", "classification_metrics"):
        assert json.loads((tmp_path / "outputs" / name).read_text()) == arts[name].metadata


def test_evaluate_component_without_history_still_reports(trained_model_dir, tiny_dataset_path, tmp_path):  # noqa: F811
    import shutil

    alone = shutil.copytree(trained_model_dir, tmp_path / "alone" / "model")  # no history.json next to it
    arts = _artifacts(tmp_path, alone, tiny_dataset_path, tmp_path / "absent-history.json")
    evaluate_model.python_func(tta=False, **arts)
    metrics = arts["metrics"].metadata
    assert metrics["accuracy"] == metrics["accuracy_plain"]  # without TTA the headline is the single view
    assert "No training history was provided." in (tmp_path / "outputs" / "report.html").read_text()


def test_evaluate_component_spec(tmp_path):
    from kfp import compiler

    from cifar10_kfp_components.image import IMAGE

    path = tmp_path / "evaluate.yaml"
    compiler.Compiler().compile(evaluate_model, str(path))
    import yaml

    spec = yaml.safe_load(path.read_text())
    executor = next(iter(spec["deploymentSpec"]["executors"].values()))["container"]
    assert executor["image"] == IMAGE
    assert "pip install" not in json.dumps(
        executor["command"]
    )  # install_kfp_package=False: nothing installed at start
    outputs = spec["root"]["outputDefinitions"]
    assert outputs["artifacts"]["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    assert (
        outputs["artifacts"]["classification_metrics"]["artifactType"]["schemaTitle"]
        == "system.ClassificationMetrics"
    )
    assert outputs["artifacts"]["report"]["artifactType"]["schemaTitle"] == "system.HTML"
    assert outputs["artifacts"]["summary"]["artifactType"]["schemaTitle"] == "system.Markdown"
    assert outputs["parameters"]["test_accuracy"]["parameterType"] == "NUMBER_DOUBLE"
    inputs = spec["root"]["inputDefinitions"]
    assert set(inputs["artifacts"]) == {"model", "dataset", "history"} and set(inputs["parameters"]) == {
        "tta"
    }


@pytest.mark.parametrize("module", ["cifar10_kfp_components.evaluate", "cifar10_kfp_components.publish"])
def test_component_modules_import_only_stdlib_and_kfp_at_top_level(module):
    import ast
    import importlib.util

    source = open(importlib.util.find_spec(module).origin).read()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            assert all(
                n.split(".")[0] in ("typing", "kfp", "cifar10_kfp_components", "__future__") for n in names
            ), names
