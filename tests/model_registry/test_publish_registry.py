"""Publish with Kubeflow Model Registry on, against the real registry server and the real object store."""

from __future__ import annotations

import json

import pytest
import yaml

from cifar10_kfp import kubeflow_registry as kr
from cifar10_kfp.config import make_config
from cifar10_kfp.data.format import load_prepared
from cifar10_kfp.models import save_model
from cifar10_kfp.publish import REGISTRY_MANIFEST_FILE, publish_model
from cifar10_kfp.registry import CARD_JSON, PublishError, latest_version, list_versions
from cifar10_kfp.storage import join_uri
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
