"""Evaluation metrics: a hand-computed case, the end-to-end library call and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from cifar10_kfp.evaluate.evaluation import (
    confusion_matrix,
    evaluate_loaded,
    evaluate_model,
    per_class_metrics,
    predict_logits,
)
from cifar10_kfp.evaluate.report import write_outputs
from tests.support.models import FLIPPED_IDS, LABELS, LOGITS, lookup_case


def test_confusion_matrix_and_per_class_metrics_match_hand_computation():
    predictions = [0, 1, 1, 1, 0, 2]
    matrix = confusion_matrix(np.array(LABELS), np.array(predictions), 3)
    assert matrix.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    per_class = per_class_metrics(matrix, ["a", "b", "c"])
    # a: TP 1, predicted 2, actual 2; b: TP 2, predicted 3, actual 2; c: TP 1, predicted 1, actual 2
    assert per_class["a"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2})
    assert per_class["b"] == pytest.approx({"precision": 2 / 3, "recall": 1.0, "f1": 0.8, "support": 2})
    assert per_class["c"] == pytest.approx({"precision": 1.0, "recall": 0.5, "f1": 2 / 3, "support": 2})


def test_zero_division_counts_as_zero_and_bad_labels_are_named():
    per_class = per_class_metrics(confusion_matrix(np.array([0, 0]), np.array([0, 0]), 2), ["x", "y"])
    assert per_class["y"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    with pytest.raises(ValueError, match="predictions outside"):
        confusion_matrix(np.array([0]), np.array([3]), 2)


def _nll(logits, label):
    return -(logits[label] - math.log(sum(math.exp(v) for v in logits)))


def test_evaluate_loaded_matches_hand_computed_accuracy_loss_and_tta():
    model, info, images, labels = lookup_case()
    result = evaluate_loaded(
        model, info, images, labels, info.class_names, tta=True, batch_size=4, device="cpu"
    )
    # As served: the mean of the logits of each image and of its flip. Image 1 is rescued by its
    # flipped view (id 6), every other image looks the same flipped.
    served = [[(a + b) / 2 for a, b in zip(LOGITS[i], LOGITS[j])] for i, j in enumerate(FLIPPED_IDS)]
    assert result.tta and result.accuracy == pytest.approx(5 / 6)
    assert result.accuracy_plain == pytest.approx(4 / 6)
    assert result.loss == pytest.approx(sum(_nll(served[i], LABELS[i]) for i in range(6)) / 6, rel=1e-5)
    assert result.confusion_matrix == [[2, 0, 0], [0, 2, 0], [1, 0, 1]]
    assert result.macro_f1 == pytest.approx((0.8 + 1.0 + 2 / 3) / 3)
    assert [(m["index"], m["true"], m["predicted"]) for m in result.misclassified] == [(4, "c", "a")]
    assert result.misclassified_images.shape == (1, 3, 4, 4)
    assert result.scalars()["accuracy"] == result.accuracy and "accuracy_plain" in result.scalars()

    single = evaluate_loaded(model, info, images, labels, info.class_names, tta=False, device="cpu")
    assert not single.tta and single.accuracy == single.accuracy_plain == pytest.approx(4 / 6)
    assert single.loss == pytest.approx(sum(_nll(LOGITS[i], LABELS[i]) for i in range(6)) / 6, rel=1e-5)
    assert single.confusion_matrix == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert [(m["index"], m["true"], m["predicted"]) for m in single.misclassified] == [
        (1, "a", "b"),
        (4, "c", "a"),
    ]


def test_evaluate_refuses_a_model_for_other_classes_or_sizes():
    model, info, images, labels = lookup_case()
    with pytest.raises(ValueError, match="do not match the dataset classes"):
        evaluate_loaded(model, info, images, labels, ["a", "b", "z"])
    with pytest.raises(ValueError, match="expects 4px images"):
        evaluate_loaded(model, info, np.zeros((6, 3, 8, 8), np.uint8), labels, info.class_names)


def test_predict_logits_normalizes_with_the_given_statistics():
    images = torch.full((3, 3, 2, 2), 51, dtype=torch.uint8)  # 51/255 = 0.2
    logits = predict_logits(
        nn.Flatten(), images, [0.1, 0.2, 0.3], [0.5, 0.5, 0.5], batch_size=2, device="cpu"
    )
    assert logits.shape == (3, 12)
    assert torch.allclose(logits[0].view(3, 4)[:, 0], torch.tensor([0.2, 0.0, -0.2]), atol=1e-6)
    with pytest.raises(ValueError, match="uint8"):
        predict_logits(nn.Flatten(), images.float(), [0] * 3, [1] * 3)


def test_evaluate_model_end_to_end_learns_and_writes_outputs(trained_model_dir, tiny_dataset_path, tmp_path):
    result = evaluate_model(
        trained_model_dir,
        tiny_dataset_path,
        history_path=tmp_path / "history.json",
        params={"run": "r1"},
        device="cpu",
    )
    assert result.accuracy > 0.6  # four learnable classes; chance is 0.25
    assert result.num_examples == 128
    assert len(result.confusion_matrix) == 4 and all(len(row) == 4 for row in result.confusion_matrix)
    assert sum(map(sum, result.confusion_matrix)) == 128
    assert list(result.per_class) == result.class_names == ["class0", "class1", "class2", "class3"]
    assert result.params == {"epochs": 1, "learning_rate": 3e-3, "run": "r1"}
    assert len(result.history) == 3
    assert result.dataset_summary["sizes"] == {"train": 256, "val": 64, "test": 128}

    paths = write_outputs(result, tmp_path / "out")
    metrics = json.loads(paths["metrics"].read_text())
    assert metrics["accuracy"] == pytest.approx(result.accuracy)
    assert metrics["confusion_matrix"] == result.confusion_matrix
    assert "misclassified_images" not in metrics
    assert paths["report"].read_text().startswith("<!DOCTYPE html>")
    assert f"{100 * result.accuracy:.2f}%" in paths["summary"].read_text()


def test_cli_evaluate_writes_the_three_files(trained_model_dir, tiny_dataset_path, tmp_path, capsys):
    from cifar10_kfp_pipelines.cli import main

    out = tmp_path / "cli-out"
    code = main(
        ["evaluate", "--model", str(trained_model_dir), "--data", str(tiny_dataset_path), "--output-dir", str(out),
         "--history", str(tmp_path / "history.json"), "--device", "cpu"]
    )  # fmt: skip
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "report.html", "summary.md"]
    printed = json.loads(capsys.readouterr().out)
    assert printed["accuracy"] == json.loads((out / "metrics.json").read_text())["accuracy"]

    assert main(["evaluate", "--model", str(tmp_path / "nope"), "--data", str(tiny_dataset_path),
                 "--output-dir", str(out)]) == 2  # fmt: skip
    assert "is not a model directory: it has no model.json" in capsys.readouterr().err


def test_evaluate_reads_model_and_data_from_the_object_store(store_env, trained_model_dir, tiny_dataset_path):
    model_uri = store_env.root_uri("test-models", "m1")
    data_uri = store_env.root_uri("test-data", "dataset.safetensors")
    store_env.ensure_bucket()
    store_env.put_dir(trained_model_dir, model_uri)
    store_env.put_file(tiny_dataset_path, data_uri)
    local = evaluate_model(trained_model_dir, tiny_dataset_path, tta=False, device="cpu")
    remote = evaluate_model(model_uri, data_uri, tta=False, device="cpu")
    assert remote.accuracy == local.accuracy and remote.confusion_matrix == local.confusion_matrix


def test_misclassified_examples_are_spread_over_classes():
    from cifar10_kfp.evaluate.evaluation import spread_over_classes

    labels = np.array([0] * 10 + [1] * 3 + [2] * 2)
    wrong = np.arange(15)  # every image wrong, test set sorted by class
    picked = spread_over_classes(wrong, labels, 5)
    assert picked.tolist() == [0, 1, 10, 11, 13]  # two rounds over three classes, cut at five
    assert spread_over_classes(np.array([], dtype=np.int64), labels, 5).tolist() == []
    assert spread_over_classes(wrong, labels, 100).tolist() == list(range(15))
