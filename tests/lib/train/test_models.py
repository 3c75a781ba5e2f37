"""Model registry additions: simple_cnn at several sizes, fast_resnet, whitening, model directory round trip."""

from __future__ import annotations

import pytest
import torch

from cifar10_kfp.train.models import (
    ModelInfo,
    SimpleCNN,
    available_models,
    build_model,
    load_model,
    save_model,
)


@pytest.mark.parametrize(
    ("size", "flatten"), [(32, 2304), (28, 64 * 5 * 5), (64, 64 * 14 * 14), (16, 64 * 2 * 2)]
)
def test_simple_cnn_flatten_size_follows_image_size(size, flatten):
    model = build_model("simple_cnn", num_classes=7, image_size=size)
    assert isinstance(model, SimpleCNN) and model.flatten_size == flatten
    out = model(torch.zeros(3, 3, size, size))
    assert out.shape == (3, 7)


def test_simple_cnn_refuses_too_small_images():
    with pytest.raises(ValueError, match="image_size >= 10"):
        build_model("simple_cnn", num_classes=10, image_size=8)


@pytest.mark.parametrize("size", [32, 24, 64])
def test_fast_resnet_any_size(size):
    model = build_model("fast_resnet", num_classes=5, image_size=size, widths=[8, 16, 16])
    assert model(torch.randn(2, 3, size, size)).shape == (2, 5)
    assert "fast_resnet" in available_models()


def test_fast_resnet_rejects_bad_widths():
    with pytest.raises(ValueError, match="three positive widths"):
        build_model("fast_resnet", num_classes=5, widths=[8, 16])


def test_whitening_makes_patch_features_decorrelated():
    torch.manual_seed(0)
    # correlated channels: the whitened 2x2-patch features should have (near) identity covariance
    base = torch.randn(64, 1, 16, 16)
    images = torch.cat([base, 0.9 * base + 0.1 * torch.randn_like(base), torch.randn_like(base)], dim=1)
    model = build_model("fast_resnet", num_classes=3, image_size=16, widths=[8, 8, 8])
    model.init_whitening(images, eps=1e-6)
    features = model.whiten(images)[:, :12].permute(0, 2, 3, 1).reshape(-1, 12).double()
    cov = torch.cov(features.T)
    assert torch.allclose(cov, torch.eye(12, dtype=torch.float64), atol=0.05)
    assert not model.whiten.weight.requires_grad  # a fixed layer: its filters are data statistics


def test_fast_resnet_round_trips_through_a_model_directory(tmp_path):
    model = build_model("fast_resnet", num_classes=4, image_size=16, widths=[8, 8, 16]).eval()
    model.init_whitening(torch.randn(32, 3, 16, 16))
    info = ModelInfo(
        architecture="fast_resnet", num_classes=4, image_size=16, class_names=list("abcd"),
        mean=[0.5] * 3, std=[0.25] * 3, model_config={"widths": [8, 8, 16]},
    )  # fmt: skip
    save_model(model, info, tmp_path / "m")
    loaded, loaded_info = load_model(tmp_path / "m")
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(model(x), loaded(x))
    assert loaded_info.class_names == list("abcd")
