"""The serving bundle: the raw-image TorchScript program and the KServe manifest."""

from __future__ import annotations

import torch

from cifar10_kfp.publish.bundle import export_torchscript, inference_service_manifest, serving_name
from cifar10_kfp.publish.serving import Preprocess
from cifar10_kfp.train.inference import predict
from cifar10_kfp.train.models import ModelInfo, build_model


def test_torchscript_takes_raw_pixels_and_returns_the_served_flip_tta_logits(tmp_path):
    torch.manual_seed(0)
    model = build_model("simple_cnn", 3, 12).eval()
    info = ModelInfo("simple_cnn", 3, 12, ["a", "b", "c"], [0.4, 0.5, 0.6], [0.2, 0.25, 0.3])
    path = export_torchscript(model, info, tmp_path / "model.pt")
    scripted = torch.jit.load(str(path))  # our own artifact, written just now
    raw = torch.randint(0, 256, (6, 3, 12, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = scripted(raw)
        inputs = Preprocess(info)(raw)
        served, single = predict(model, inputs), predict(model, inputs, tta=False)
    torch.testing.assert_close(out, served, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, single, atol=1e-4)  # the flip is inside the program


def test_serving_name_and_manifest_without_credentials():
    assert serving_name("cifar10_resnet.v2") == "cifar10-resnet-v2"
    assert serving_name("9lives") == "m-9lives"
    manifest = inference_service_manifest("cifar10", "s3://b/p/models/cifar10/v1/triton", namespace="ml")
    assert manifest["metadata"]["namespace"] == "ml"
    assert manifest["spec"]["predictor"]["serviceAccountName"] == "cifar10-kfp-serving"
    assert manifest["spec"]["predictor"]["model"]["storageUri"] == "s3://b/p/models/cifar10/v1/triton"
