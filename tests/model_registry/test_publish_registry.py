"""Publish with Kubeflow Model Registry on, against the real registry server and the real object store."""

from __future__ import annotations

import json

import pytest
import yaml

from cifar10_kfp.data.format import load_prepared
from cifar10_kfp.publish import kubeflow_registry as kr
from cifar10_kfp.publish.registry import CARD_JSON, PublishError, latest_version, list_versions
from cifar10_kfp.publish.release import REGISTRY_MANIFEST_FILE, publish_model
from cifar10_kfp.storage import join_uri
from cifar10_kfp.train.config import make_config
from cifar10_kfp.train.models import save_model
from cifar10_kfp_pipelines.cli import main
from tests.support.models import train_tiny_model

CONFIG = make_config("seed", {"architecture": "simple_cnn", "epochs": 1})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_dataset_module):
    model, info = train_tiny_model(load_prepared(tiny_dataset_module))
    info.extra = {"training_config": CONFIG.to_dict()}  # as the training engine records it
    return save_model(model, info, tmp_path_factory.mktemp("model") / "good")


@pytest.fixture(scope="module")
def tiny_dataset_module(tmp_path_factory):
    from cifar10_kfp.data.format import save_prepared
    from tests.support.data import make_tiny_dataset

    return save_prepared(make_tiny_dataset(), tmp_path_factory.mktemp("tiny") / "dataset.safetensors")


GATE = {"verdict": "passed", "reason": "accuracy 0.9000 >= min_accuracy 0.0000; no published champion yet"}


def _publish(model_dir, store, url, name, run_id="run-a"):
    return publish_model(
        model_dir, model_name=name, metrics={"test_accuracy": 0.9, "test_accuracy_plain": 0.875},
        dataset_digest="d" * 64, run_id=run_id, store=store, model_registry_url=url, gate=GATE,
        image="ghcr.io/cifar10-kfp/cifar10-kfp:0.1.0",
    )  # fmt: skip


def _registered(url, name):
    with kr.connect(url) as client:
        if client.get_registered_model(name) is None:
            return []
        return [(v, client.get_model_artifact(name, v.name)) for v in client.get_model_versions(name)]


def test_publish_registers_the_version_with_its_properties(store_env, registry_server, model_dir):
    result = _publish(model_dir, store_env, registry_server.url, "reg-props")
    [(version, artifact)] = _registered(registry_server.url, "reg-props")
    assert version.name == result.version and not result.registration["already_registered"]
    props = version.custom_properties
    assert props["test_accuracy"] == 0.9 and props["test_accuracy_plain"] == 0.875
    assert props["dataset_digest"] == "d" * 64 and props["run_id"] == "run-a"
    assert props["gate_verdict"] == "passed" and props["gate_reason"] == GATE["reason"]
    assert props["image"] == "ghcr.io/cifar10-kfp/cifar10-kfp:0.1.0" and props["code_version"]
    assert props["config_hash"] == CONFIG.config_hash() and props["store_uri"] == result.uri
    cfg = store_env.config
    assert (
        artifact.uri
        == f"{join_uri(result.uri, 'triton')}?endpoint=http://{cfg.endpoint}&defaultRegion={cfg.region}"
    )
    assert (artifact.model_format_name, artifact.model_format_version) == ("pytorch", "1")
    # the model card names the registration, and the version also has a manifest deploying through it
    card = json.loads(store_env.get_bytes(join_uri(result.uri, CARD_JSON)))
    assert card["model_registry"]["uri"] == f"model-registry://reg-props/{result.version}"
    assert card["model_registry"]["url"] == registry_server.url
    assert f"model-registry://reg-props/{result.version}" in result.card_markdown
    manifest = yaml.safe_load(store_env.get_bytes(join_uri(result.uri, REGISTRY_MANIFEST_FILE)))
    assert (
        manifest["spec"]["predictor"]["model"]["storageUri"] == f"model-registry://reg-props/{result.version}"
    )
    assert latest_version("reg-props", store=store_env)["version"] == result.version


def test_registry_down_fails_publish_keeps_version_and_latest_then_rerun_registers_once(
    store_env, own_registry_server, model_dir
):
    server = own_registry_server
    server.stop_server()
    with pytest.raises(
        PublishError, match="is complete in the store .* registering it failed.*latest was not moved"
    ):
        _publish(model_dir, store_env, server.url, "reg-down", run_id="run-down")
    [left] = list_versions("reg-down", store=store_env)  # complete in the store...
    assert latest_version("reg-down", store=store_env) is None  # ...but latest did not move
    server.start_server()
    resumed = _publish(model_dir, store_env, server.url, "reg-down", run_id="run-down")
    assert resumed.resumed and resumed.version == left and resumed.latest_updated
    assert list_versions("reg-down", store=store_env) == [left]  # no second version in the store
    again = _publish(model_dir, store_env, server.url, "reg-down", run_id="run-down")
    assert again.registration["already_registered"] and again.version == left
    assert [v.name for v, _ in _registered(server.url, "reg-down")] == [left]  # registered once
    assert latest_version("reg-down", store=store_env)["version"] == left


def test_a_rerun_with_other_weights_is_refused(
    store_env, registry_server, model_dir, tmp_path, tiny_dataset_module
):
    first = _publish(model_dir, store_env, registry_server.url, "reg-weights", run_id="run-w")
    model, info = train_tiny_model(load_prepared(tiny_dataset_module), steps=5)
    other = save_model(model, info, tmp_path / "other")
    with pytest.raises(PublishError, match="other weights"):
        _publish(other, store_env, registry_server.url, "reg-weights", run_id="run-w")
    assert list_versions("reg-weights", store=store_env) == [first.version]


def test_cli_gate_refusal_registers_nothing(
    store_env, registry_server, model_dir, tiny_dataset_module, capsys
):
    args = ["publish", "--model", str(model_dir), "--data", str(tiny_dataset_module), "--model-name", "reg-gate",
            "--device", "cpu", "--model-registry", registry_server.url]  # fmt: skip
    assert main([*args, "--run-id", "champion"]) == 0
    champion = json.loads(capsys.readouterr().out)
    assert champion["model_registry_uri"] == f"model-registry://reg-gate/{champion['version']}"
    # the same model again does not beat the champion (a tie keeps it): the gate refuses
    assert main([*args, "--run-id", "challenger"]) == 3
    assert not json.loads(capsys.readouterr().out)["published"]
    assert [v.name for v, _ in _registered(registry_server.url, "reg-gate")] == [champion["version"]]
    assert list_versions("reg-gate", store=store_env) == [champion["version"]]


def _image_files(dataset_path, tmp_path, n=3) -> list[str]:
    from PIL import Image

    images, _ = load_prepared(dataset_path).split("test")
    paths = []
    for i in range(n):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(images[i].transpose(1, 2, 0)).save(path)
        paths.append(str(path))
    return paths


def test_predict_by_registry_uri_classifies_as_the_version_does(
    store_env, registry_server, model_dir, tiny_dataset_module, tmp_path, capsys, monkeypatch
):
    first = _publish(model_dir, store_env, registry_server.url, "reg-predict", run_id="run-p1")
    images = _image_files(tiny_dataset_module, tmp_path)
    assert main(["predict", "--model", first.uri, "--json", *images]) == 0
    by_store = capsys.readouterr().out
    assert len(by_store.splitlines()) == 3
    for uri in (f"model-registry://reg-predict/{first.version}", "model-registry://reg-predict"):
        assert (
            main(["predict", "--model", uri, "--model-registry", registry_server.url, "--json", *images]) == 0
        )
        assert capsys.readouterr().out == by_store
    monkeypatch.setenv(kr.URL_ENV, registry_server.url)  # the URL from the environment
    assert main(["predict", "--model", "model-registry://reg-predict", "--json", *images]) == 0
    assert capsys.readouterr().out == by_store
    assert main(["predict", "--model", "model-registry://reg-predict/nope", *images]) == 2
    assert "has no version 'nope'" in capsys.readouterr().err


def test_secret_scan_over_what_registration_adds(
    store_env, registry_server, model_dir, tiny_dataset_module, tmp_path, capfd, monkeypatch
):
    """A registry token in the environment reaches no output, store object, registry record or server log."""
    token = "mrtok-" + "c0ffee5eed1234abcd"
    monkeypatch.setenv(kr.TOKEN_ENV, token)
    out_dir = tmp_path / "out"
    args = ["-v", "publish", "--model", str(model_dir), "--data", str(tiny_dataset_module), "--model-name",
            "reg-secret", "--device", "cpu", "--model-registry", registry_server.url, "--run-id", "sec",
            "--output-dir", str(out_dir)]  # fmt: skip
    assert main(args) == 0
    images = _image_files(tiny_dataset_module, tmp_path, n=1)
    assert main(["-v", "predict", "--model", "model-registry://reg-secret", "--model-registry",
                 registry_server.url, *images]) == 0  # fmt: skip
    registry_server.stop_server()  # the failure path's messages too
    assert main([*args[1:-4], "--run-id", "sec2", "--skip-gate"]) == 2  # without -v: the error line
    registry_server.start_server()
    captured = capfd.readouterr()
    texts = {
        "stdout": captured.out,
        "stderr": captured.err,
        "server log": registry_server.server_log.read_text(),
    }
    for path in out_dir.iterdir():
        texts[path.name] = path.read_text()
    for uri in store_env.list(store_env.root_uri("models", "reg-secret") + "/"):
        if not uri.endswith((".pt", ".safetensors")):
            texts[uri] = store_env.get_bytes(uri).decode()
    for version, artifact in _registered(registry_server.url, "reg-secret"):
        texts[f"registry {version.name}"] = json.dumps(
            [version.custom_properties, artifact.uri, version.description]
        )
    assert (
        "model-registry://reg-secret/" in texts["model_card.md"]
        and "registering it failed" in texts["stderr"]
    )
    leaks = [where for where, text in texts.items() if token in text]
    assert leaks == [], f"the registry token appears in {leaks}"
