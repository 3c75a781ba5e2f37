"""One normalisation and one prediction rule: training's validation, evaluate and serving agree."""

from __future__ import annotations

import pytest
import torch

from cifar10_kfp.data.format import load_prepared
from cifar10_kfp.evaluate.evaluation import evaluate_loaded
from cifar10_kfp.publish.serving import Preprocess
from cifar10_kfp.train.augment import DeviceData
from cifar10_kfp.train.engine import evaluate as engine_evaluate
from cifar10_kfp.train.inference import Normalize, predict
from cifar10_kfp.train.models import load_model
from tests.support.models import LOGITS, lookup_case


@pytest.mark.parametrize("channels_last", [False, True])
def test_normalize_is_x_over_255_minus_mean_over_std(channels_last):
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (5, 3, 6, 6), dtype=torch.uint8, generator=generator)
    mean, std = [0.49, 0.48, 0.45], [0.25, 0.24, 0.26]
    out = Normalize(mean, std, "cpu", channels_last=channels_last)(images)
    expected = (images.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_predict_averages_the_logits_of_the_image_and_its_flip():
    model, info, images, _ = lookup_case()
    inputs = Preprocess(info)(torch.from_numpy(images))
    served = predict(model, inputs)
    # image 1 shows id 1 ([0, 1, 0]) and, flipped, id 6 ([5, 0, 0])
    torch.testing.assert_close(served[1], torch.tensor([2.5, 0.5, 0.0]))
    torch.testing.assert_close(predict(model, inputs, tta=False)[1], torch.tensor(LOGITS[1]))


@pytest.mark.parametrize("tta", [True, False])
def test_engine_and_evaluate_give_the_same_accuracy_on_the_same_split(
    trained_model_dir, tiny_dataset_path, tta
):
    model, info = load_model(trained_model_dir, device="cpu")
    dataset = load_prepared(tiny_dataset_path)
    images, labels = dataset.split("test")
    from_evaluate = evaluate_loaded(model, info, images, labels, dataset.class_names, tta=tta, device="cpu")
    split = DeviceData.from_numpy(images, labels, torch.device("cpu"))
    with torch.no_grad():
        from_engine = engine_evaluate(
            model, split, Normalize(info.mean, info.std, "cpu"), batch_size=37, tta=tta
        )
    assert from_engine["n"] == from_evaluate.num_examples == len(labels)
    assert from_engine["acc"] == pytest.approx(from_evaluate.accuracy, abs=1e-9)
    assert from_engine["loss"] == pytest.approx(from_evaluate.loss, rel=1e-5)
