"""Loading published models and ``cifar10-kfp predict`` on real CIFAR-10 JPEGs."""

from __future__ import annotations

import json
import re
import tarfile
from datetime import datetime, timezone

import pytest
import torch
from PIL import Image

from cifar10_kfp.publish.release import publish_model
from cifar10_kfp.publish.serving import Preprocess, load_published
from cifar10_kfp.train.models import ModelInfo, build_model, save_model

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


@pytest.fixture(scope="module")
def real_images(tmp_path_factory, real_archive):
    """The first test image of each of the first three classes in the real archive."""
    out = tmp_path_factory.mktemp("real-images")
    found = {}
    with tarfile.open(real_archive, "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if (
                not member.isfile()
                or not member.name.endswith(".jpg")
                or len(parts) != 4
                or parts[2] in found
            ):
                continue
            target = out / f"{parts[2]}-{parts[3]}"
            target.write_bytes(tar.extractfile(member).read())  # regular file, name not used as a path
            found[parts[2]] = target
            if len(found) == 3:
                break
    assert len(found) == 3
    return list(found.values())


@pytest.fixture
def published_tiny(store_env, tmp_path):
    """An untrained 10-class 32px simple_cnn published to the embedded store (accuracy is irrelevant here)."""
    torch.manual_seed(0)
    model = build_model("simple_cnn", 10, 32)
    info = ModelInfo("simple_cnn", 10, 32, CIFAR10_CLASSES, [0.49, 0.48, 0.45], [0.25, 0.24, 0.26])
    save_model(model, info, tmp_path / "model")
    store_env.ensure_bucket()
    result = publish_model(
        tmp_path / "model",
        model_name="cifar10-tiny",
        metrics={"test_accuracy": 0.1},
        dataset_digest="",
        run_id="serve",
        store=store_env,
        now=datetime(2026, 12, 2, 17, 0, tzinfo=timezone.utc),
    )
    return result, model


def test_load_published_by_version_latest_and_name_gives_the_same_model(published_tiny, store_env):
    result, original = published_tiny
    x = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    reference = None
    for target in (result.uri, result.latest_uri, "cifar10-tiny"):
        model, preprocess = load_published(target, store=store_env)
        assert preprocess.class_names == CIFAR10_CLASSES and not model.training
        with torch.no_grad():
            out = model(preprocess(x))
        reference = out if reference is None else reference
        torch.testing.assert_close(out, reference)
    with torch.no_grad():
        torch.testing.assert_close(reference, original(preprocess(x)))
    with pytest.raises(FileNotFoundError, match="no published model named 'other'"):
        load_published("other", store=store_env)


def test_preprocess_resizes_converts_to_rgb_and_normalizes(tmp_path):
    info = ModelInfo("simple_cnn", 2, 32, ["a", "b"], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    gray = tmp_path / "gray.png"
    Image.new("L", (50, 40), color=255).save(gray)
    batch = Preprocess(info)([gray])
    assert batch.shape == (1, 3, 32, 32) and batch.dtype == torch.float32
    assert torch.allclose(batch, torch.ones_like(batch))  # white -> (1 - 0.5) / 0.5
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot read image .*bad.jpg"):
        Preprocess(info)([tmp_path / "bad.jpg"])


def test_cli_predict_on_real_images(published_tiny, real_images, capsys):
    from cifar10_kfp_pipelines.cli import main

    result, _ = published_tiny
    images = [str(p) for p in real_images]
    assert main(["predict", "--model", result.uri, *images, "--top-k", "10", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["image"] for row in rows] == images
    for row in rows:
        probs = [item["probability"] for item in row["top_k"]]
        assert len(probs) == 10 and sorted(probs, reverse=True) == probs
        assert sum(probs) == pytest.approx(1.0, abs=1e-5)
        assert sorted(item["class"] for item in row["top_k"]) == sorted(CIFAR10_CLASSES)

    assert main(["predict", "--model", result.latest_uri, images[0], "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == images[0] and len(lines) == 4
    for rank, line in enumerate(lines[1:], 1):
        match = re.fullmatch(rf"  {rank}\. (\w+) +(0\.\d{{4}}|1\.0000)", line)
        assert match and match.group(1) in CIFAR10_CLASSES
