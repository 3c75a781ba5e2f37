"""Attribution maps: which images, where the maps point, and the report section."""

from __future__ import annotations

import base64
import io

import numpy as np
import torch
from PIL import Image
from torch import nn

from cifar10_kfp.data.format import load_prepared
from cifar10_kfp.evaluate.attribution import (
    grid_positions,
    integrated_gradients,
    pick_examples,
    plot_attribution_grid,
)
from cifar10_kfp.evaluate.evaluation import evaluate_loaded
from cifar10_kfp.evaluate.report import render_html
from cifar10_kfp.train.models import ModelInfo, load_model
from tests.support.models import lookup_case


def test_pick_examples_takes_correct_then_wrong_per_class_in_test_order():
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2])
    predictions = np.array([0, 1, 0, 0, 1, 0, 2, 2])
    assert pick_examples(labels, predictions, per_class=2).tolist() == [0, 2, 1, 4, 5, 6, 7]
    assert pick_examples(labels, predictions, per_class=1).tolist() == [0, 1, 4, 5, 7]


class OnePixel(nn.Module):
    """Class 1's logit is the normalised value of pixel (channel 0, row 2, column 1): nothing else matters."""

    def forward(self, x):
        return torch.stack([torch.zeros_like(x[:, 0, 2, 1]), x[:, 0, 2, 1]], dim=1)


def test_integrated_gradients_point_at_the_pixel_the_model_reads():
    info = ModelInfo("one_pixel", 2, 4, ["a", "b"], [0.5, 0.5, 0.5], [0.25, 0.25, 0.25])
    images = np.random.default_rng(0).integers(0, 256, (3, 3, 4, 4), dtype=np.uint8)
    images[:, 0, 2, 1] = 250  # far from the baseline (the mean colour, 127.5)
    maps = integrated_gradients(OnePixel(), info, images, np.ones(3, np.int64), n_steps=8, tta=False)
    assert maps.shape == (3, 4, 4)
    for heat in maps:
        assert heat[2, 1] == 1.0 and np.count_nonzero(heat) == 1
    # with flip TTA the served logit also reads the mirrored pixel (row 2, column 2)
    served = integrated_gradients(OnePixel(), info, images, np.ones(3, np.int64), n_steps=8, tta=True)
    assert all(np.flatnonzero(heat).tolist() == [9, 10] for heat in served)


def test_evaluated_model_gets_a_grid_with_labels_and_a_rendered_section(trained_model_dir, tiny_dataset_path):
    model, info = load_model(trained_model_dir, device="cpu")
    dataset = load_prepared(tiny_dataset_path)
    images, labels = dataset.split("test")
    result = evaluate_loaded(model, info, images, labels, dataset.class_names, device="cpu")
    grid = result.attribution
    assert grid is not None and not result.attribution_note
    assert len(grid.indices) == len(grid.maps) == len(grid.images) > 0
    for index, true, heat in zip(grid.indices, grid.true, grid.maps):
        assert true == dataset.class_names[labels[index]]
        assert heat.shape == images.shape[2:] and 0.0 <= heat.min() and heat.max() <= 1.0 and heat.max() > 0
    matrix = np.array(result.confusion_matrix)  # the served predictions: up to 2 right and 2 wrong per class
    right, wrong = np.diag(matrix), matrix.sum(axis=1) - np.diag(matrix)
    assert sum(grid.correct) == np.minimum(right, 2).sum() > 0
    assert len(grid.indices) - sum(grid.correct) == np.minimum(wrong, 2).sum()
    per_class = {}
    for (row, column), ok in zip(grid_positions(grid), grid.correct):
        assert (column < grid.per_class) == ok
        per_class.setdefault(row, []).append(column)
    assert all(len(set(columns)) == len(columns) <= 2 * grid.per_class for columns in per_class.values())

    png = Image.open(io.BytesIO(plot_attribution_grid(grid)))
    png.load()
    assert png.width > 100 and png.height > 100
    page = render_html(result)
    section = page.split('<h2 id="attribution">', 1)[1].split("<h2", 1)[0]
    assert "Integrated Gradients" in section and section.count("<img ") == 1
    encoded = section.split('src="data:image/png;base64,', 1)[1].split('"', 1)[0]
    assert Image.open(io.BytesIO(base64.b64decode(encoded))).size == png.size
    assert f"true {grid.true[0]}, predicted {grid.predicted[0]}" in section


def test_a_model_captum_cannot_differentiate_gets_a_note_not_an_error():
    model, info, images, labels = lookup_case()  # logits looked up by index: no gradient
    result = evaluate_loaded(model, info, images, labels, info.class_names, device="cpu")
    assert result.attribution is None and "could not be computed" in result.attribution_note
    assert "could not be computed" in render_html(result)
    none = evaluate_loaded(model, info, images, labels, info.class_names, attribution_per_class=0)
    assert none.attribution is None and none.attribution_note == "attribution maps were not requested"
