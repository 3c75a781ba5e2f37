"""Gate, versioned publishing, latest pointer, TorchScript parity and the KServe manifest, on a real S3 server."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone

import pytest
import torch
import yaml

from cifar10_kfp.data.format import load_prepared
from cifar10_kfp.publish.bundle import TORCHSCRIPT_FILE
from cifar10_kfp.publish.registry import CARD_JSON, PublishError, latest_version, list_versions, make_version
from cifar10_kfp.publish.release import gate_decision, publish_model, run_gate
from cifar10_kfp.publish.serving import load_published
from cifar10_kfp.storage import ObjectStore, join_uri
from cifar10_kfp.train.inference import predict
from cifar10_kfp.train.models import ModelInfo, build_model, save_model
from tests.support.models import train_tiny_model

T0 = datetime(2026, 12, 2, 17, 15, 0, tzinfo=timezone.utc)


@pytest.fixture
def dataset(tiny_dataset_path):
    return load_prepared(tiny_dataset_path)


@pytest.fixture
def good_model_dir(tmp_path, dataset):
    model, info = train_tiny_model(dataset)
    return save_model(model, info, tmp_path / "good")


@pytest.fixture
def weak_model_dir(tmp_path, dataset):
    torch.manual_seed(1)
    model = build_model("simple_cnn", dataset.num_classes, dataset.image_size)
    info = ModelInfo(
        "simple_cnn", dataset.num_classes, dataset.image_size, dataset.class_names, dataset.mean, dataset.std
    )
    return save_model(model, info, tmp_path / "weak")


def _publish(model_dir, store, *, now=T0, run_id="run-a", accuracy=0.5, **kw):
    return publish_model(
        model_dir,
        model_name="tiny",
        metrics={"test_accuracy": accuracy},
        dataset_digest="d" * 64,
        params={"epochs": 1},
        run_id=run_id,
        store=store,
        now=now,
        **kw,
    )


# ------------------------------------------------------------------------------ gate


def test_gate_decision_rules():
    assert gate_decision(0.7, min_accuracy=0.5).passed  # first publish: no champion
    low = gate_decision(0.4, min_accuracy=0.5)
    assert not low.passed and "below min_accuracy 0.5000" in low.reason
    worse = gate_decision(0.7, min_accuracy=0.5, champion_accuracy=0.8, champion_version="v1")
    assert not worse.passed and "does not beat the published champion v1 (0.8000)" in worse.reason
    assert not gate_decision(0.8, min_accuracy=0.5, champion_accuracy=0.8).passed  # a tie keeps the champion
    better = gate_decision(0.9, min_accuracy=0.5, champion_accuracy=0.8, champion_version="v1")
    assert better.passed and better.champion_accuracy == 0.8 and better.challenger_accuracy == 0.9
    with pytest.raises(ValueError, match="min_accuracy must be in"):
        gate_decision(0.9, min_accuracy=90)


def test_gate_compares_against_the_published_champion_on_the_same_data(
    store_env, good_model_dir, weak_model_dir, tiny_dataset_path
):
    from cifar10_kfp.evaluate.evaluation import evaluate_model

    store_env.ensure_bucket()
    good = evaluate_model(good_model_dir, tiny_dataset_path, tta=False, device="cpu").accuracy
    weak = evaluate_model(weak_model_dir, tiny_dataset_path, tta=False, device="cpu").accuracy
    assert good > weak

    first = run_gate(weak, tiny_dataset_path, min_accuracy=0.0, model_name="tiny", store=store_env)
    assert first.passed and first.champion_accuracy is None
    _publish(weak_model_dir, store_env, accuracy=weak)

    better = run_gate(good, tiny_dataset_path, min_accuracy=0.0, model_name="tiny", store=store_env)
    assert better.passed and better.champion_accuracy == pytest.approx(weak)
    published = _publish(good_model_dir, store_env, now=T0 + timedelta(minutes=1), accuracy=good)
    assert better.champion_version != published.version

    worse = run_gate(weak, tiny_dataset_path, min_accuracy=0.0, model_name="tiny", store=store_env)
    assert not worse.passed
    assert worse.champion_accuracy == pytest.approx(good)  # the champion was re-evaluated on this data
    assert worse.champion_version == published.version
    too_low = run_gate(weak, tiny_dataset_path, min_accuracy=0.9, model_name="tiny", store=store_env)
    assert not too_low.passed and "below min_accuracy 0.9000" in too_low.reason


# --------------------------------------------------------------------------- publish


def test_two_publishes_give_two_versions_and_latest_on_the_newer(store_env, good_model_dir):
    store_env.ensure_bucket()
    assert latest_version("tiny", store=store_env) is None
    first = _publish(good_model_dir, store_env, run_id="run-a")
    second = _publish(good_model_dir, store_env, now=T0 + timedelta(seconds=1), run_id="run-b")
    assert first.version == "20261202T171500Z-runa" and second.version == "20261202T171501Z-runb"
    assert list_versions("tiny", store=store_env) == [first.version, second.version]
    pointer = latest_version("tiny", store=store_env)
    assert pointer["version"] == second.version and pointer["uri"] == second.uri
    assert second.uri == store_env.root_uri("models", "tiny", second.version)

    names = {uri[len(second.uri) + 1 :] for uri in store_env.list(second.uri + "/")}
    assert {"model.safetensors", "model.json", TORCHSCRIPT_FILE, "model_card.md", CARD_JSON,
            "inference_service.yaml", "triton/tiny/config.pbtxt", "triton/tiny/1/model.pt"} == names  # fmt: skip
    card = json.loads(store_env.get_bytes(join_uri(second.uri, CARD_JSON)))
    import cifar10_kfp

    assert card["dataset_digest"] == "d" * 64 and card["metrics"] == {"test_accuracy": 0.5}
    assert card["parameters"] == {"epochs": 1} and card["kfp_run_id"] == "run-b"
    assert card["code_version"] == cifar10_kfp.__version__ and card["created"] == "2026-12-02T17:15:01+00:00"
    assert "d" * 64 in store_env.get_bytes(join_uri(second.uri, "model_card.md")).decode()

    # An older version published late never moves latest backwards.
    late = _publish(good_model_dir, store_env, now=T0 - timedelta(days=1), run_id="run-c")
    assert not late.latest_updated and latest_version("tiny", store=store_env)["version"] == second.version


def test_a_version_is_never_overwritten(store_env, good_model_dir):
    store_env.ensure_bucket()
    _publish(good_model_dir, store_env)
    with pytest.raises(PublishError, match="already exists"):
        _publish(good_model_dir, store_env)


class _CredentialsRevokedAfter(ObjectStore):
    """A real store whose credentials are swapped for wrong ones after ``n`` uploads (a key rotated mid-publish)."""

    def __init__(self, n: int):
        super().__init__()
        self.uploads_left = n

    def put_file(self, src, uri, **kw):
        if self.uploads_left == 0:
            self.config = dataclasses.replace(self.config, secret_key="revoked-" + "x" * 16)
            self._client = None
        self.uploads_left -= 1
        return super().put_file(src, uri, **kw)


def test_a_failed_publish_leaves_latest_untouched(store_env, good_model_dir, tmp_path):
    store_env.ensure_bucket()
    before = _publish(good_model_dir, store_env)
    pointer_before = latest_version("tiny", store=store_env)

    with pytest.raises(PublishError, match="failed after 3 of 8 files; latest was not changed") as exc:
        _publish(good_model_dir, _CredentialsRevokedAfter(3), now=T0 + timedelta(hours=1), run_id="run-z")
    assert "refused the credentials" in str(exc.value.__cause__)
    assert latest_version("tiny", store=store_env) == pointer_before
    assert list_versions("tiny", store=store_env) == [before.version]  # the partial one is not a version

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.json").write_text((good_model_dir / "model.json").read_text())
    with pytest.raises(PublishError, match="lacks model.safetensors"):
        _publish(broken, store_env, now=T0 + timedelta(hours=2))
    assert latest_version("tiny", store=store_env) == pointer_before


def test_invalid_model_name_is_refused(good_model_dir, tmp_path):
    with pytest.raises(ValueError, match="invalid model_name 'Tiny_Model'"):
        publish_model(
            good_model_dir, model_name="Tiny_Model", metrics={}, dataset_digest="", root=str(tmp_path)
        )
    assert make_version("KFP run/42", T0) == "20261202T171500Z-kfprun42"


def test_torchscript_takes_raw_uint8_and_matches_eager(store_env, good_model_dir, dataset, tmp_path):
    store_env.ensure_bucket()
    published = _publish(good_model_dir, store_env)
    local = tmp_path / "scripted.pt"
    store_env.get_file(join_uri(published.uri, TORCHSCRIPT_FILE), local)
    scripted = torch.jit.load(str(local))  # our own artifact, just verified by sha256
    model, preprocess = load_published(published.uri, store=store_env)
    raw = torch.from_numpy(dataset.test_images[:64])
    with torch.no_grad():
        eager = predict(model, preprocess(raw))  # as served: flip TTA
        out = scripted(raw)
    assert out.shape == (64, dataset.num_classes)
    torch.testing.assert_close(out, eager, atol=1e-4, rtol=1e-4)
    assert torch.equal(out.argmax(1), eager.argmax(1))


def test_inference_service_manifest_structure(store_env, good_model_dir):
    store_env.ensure_bucket()
    published = _publish(good_model_dir, store_env, service_account="models-reader")
    text = store_env.get_bytes(join_uri(published.uri, "inference_service.yaml")).decode()
    manifest = yaml.safe_load(text)
    assert manifest == published.inference_service
    assert manifest["apiVersion"] == "serving.kserve.io/v1beta1" and manifest["kind"] == "InferenceService"
    assert manifest["metadata"]["name"] == "tiny"
    predictor = manifest["spec"]["predictor"]
    assert predictor["serviceAccountName"] == "models-reader"
    model = predictor["model"]
    assert model["modelFormat"] == {"name": "pytorch"} and model["protocolVersion"] == "v2"
    assert model["storageUri"] == published.uri + "/triton" and model["storageUri"].startswith("s3://")
    assert store_env.exists(join_uri(model["storageUri"], "tiny", "config.pbtxt"))
    config = store_env.get_bytes(join_uri(model["storageUri"], "tiny", "config.pbtxt")).decode()
    assert 'platform: "pytorch_libtorch"' in config and "TYPE_UINT8" in config and "dims: [ 4 ]" in config
    lowered = text.lower()
    for secret_word in ("secret", "access_key", "password", store_env.config.secret_key.lower()):
        assert secret_word not in lowered


def test_cli_publish_gates_and_publishes(
    store_env, good_model_dir, weak_model_dir, tiny_dataset_path, tmp_path, capsys
):
    from cifar10_kfp_pipelines.cli import main

    store_env.ensure_bucket()
    common = ["--data", str(tiny_dataset_path), "--model-name", "cli-model", "--device", "cpu"]
    out = tmp_path / "publish-out"
    assert (
        main(["publish", "--model", str(weak_model_dir), *common, "--run-id", "r1", "--output-dir", str(out)])
        == 0
    )
    first = json.loads(capsys.readouterr().out)
    assert first["published"] and first["uri"] == store_env.root_uri("models", "cli-model", first["version"])
    assert sorted(p.name for p in out.iterdir()) == ["gate.json", "inference_service.yaml", "model_card.md"]

    assert (
        main(["publish", "--model", str(good_model_dir), *common, "--run-id", "r2", "--min-accuracy", "0.5"])
        == 0
    )
    second = json.loads(capsys.readouterr().out)
    assert latest_version("cli-model", store=store_env)["version"] == second["version"] != first["version"]

    assert (
        main(["publish", "--model", str(weak_model_dir), *common, "--run-id", "r3"]) == 3
    )  # gate keeps the champion
    refused = json.loads(capsys.readouterr().out)
    assert not refused["published"] and refused["champion_version"] == second["version"]
    assert latest_version("cli-model", store=store_env)["version"] == second["version"]


def test_gate_fails_clearly_when_the_champion_cannot_be_compared(store_env, good_model_dir, tmp_path):
    from cifar10_kfp.data.format import save_prepared
    from tests.support.data import make_tiny_dataset

    store_env.ensure_bucket()
    _publish(good_model_dir, store_env)  # a 4-class champion
    other = save_prepared(make_tiny_dataset(num_classes=3), tmp_path / "three" / "dataset.safetensors")
    decision = run_gate(0.99, other, min_accuracy=0.0, model_name="tiny", store=store_env)
    assert not decision.passed
    assert "cannot be compared on this dataset" in decision.reason and "do not match" in decision.reason
