"""gate_model and publish_model components: ``.python_func`` on the embedded S3 server, and their specs."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from kfp import dsl

from cifar10_kfp.publish.registry import latest_version
from cifar10_kfp.storage import join_uri
from cifar10_kfp_components.publish import gate_model, publish_model
from tests.support.paths import ROOT


def _gate(model_dir, data, tmp_path, accuracy, min_accuracy=0.5, name="decision.json"):
    decision = dsl.Artifact(uri=str(tmp_path / name))
    out = gate_model.python_func(
        model=dsl.Model(uri=str(model_dir)),
        dataset=dsl.Dataset(uri=str(data)),
        test_accuracy=accuracy,
        min_accuracy=min_accuracy,
        model_name="cifar10-test",
        bucket="",
        storage_prefix="",
        decision=decision,
    )
    return out, decision, json.loads((tmp_path / name).read_text())


def _publish(model_dir, data, tmp_path, run_id):
    card = dsl.Markdown(uri=str(tmp_path / f"card-{run_id}.md"))
    isvc = dsl.Artifact(uri=str(tmp_path / f"isvc-{run_id}.yaml"))
    out = publish_model.python_func(
        model=dsl.Model(uri=str(model_dir)),
        dataset=dsl.Dataset(uri=str(data)),
        gate_decision=dsl.Artifact(uri=str(tmp_path / "decision.json")),
        test_accuracy=0.9,
        test_accuracy_plain=0.875,
        model_name="cifar10-test",
        run_id=run_id,
        bucket="",
        storage_prefix="",
        model_registry_url="",  # off: tests/model_registry runs it against the real registry
        image="ghcr.io/cifar10-kfp/cifar10-kfp:0.1.0",
        card=card,
        inference_service=isvc,
    )
    return out, card, isvc


def test_gate_then_publish_then_gate_again(store_env, trained_model_dir, tiny_dataset_path, tmp_path):  # noqa: F811
    store_env.ensure_bucket()
    first, decision, record = _gate(trained_model_dir, tiny_dataset_path, tmp_path, accuracy=0.9)
    assert first.passed and first.champion_accuracy == -1.0
    assert record["passed"] and record["champion_accuracy"] is None and record["challenger_accuracy"] == 0.9
    assert decision.metadata["passed"] is True

    below, _, record = _gate(trained_model_dir, tiny_dataset_path, tmp_path, accuracy=0.4, name="below.json")
    assert not below.passed and "below min_accuracy" in record["reason"]

    out, card, isvc = _publish(trained_model_dir, tiny_dataset_path, tmp_path, "run-1")
    assert out.uri == store_env.root_uri("models", "cifar10-test", out.version) and out.registration == ""
    assert out.version.endswith("-run1")
    assert latest_version("cifar10-test", store=store_env)["version"] == out.version
    card_text = (tmp_path / "card-run-1.md").read_text()
    assert out.version in card_text and "test_accuracy" in card_text
    manifest = yaml.safe_load((tmp_path / "isvc-run-1.yaml").read_text())
    assert manifest["kind"] == "InferenceService"
    assert manifest["spec"]["predictor"]["model"]["storageUri"] == isvc.metadata["storageUri"]
    assert isvc.metadata["storageUri"].startswith(out.uri)
    card_json = json.loads(store_env.get_bytes(join_uri(out.uri, "model_card.json")))
    from cifar10_kfp.storage import sha256_file

    assert card_json["dataset_digest"] == sha256_file(tiny_dataset_path)
    assert card_json["parameters"]["source_digest"] == "0" * 64
    assert card_json["metrics"] == {"test_accuracy": 0.9, "test_accuracy_plain": 0.875}
    assert "model_registry" not in card_json

    # The same model is now the champion: an equal challenger does not beat it.
    again, _, record = _gate(trained_model_dir, tiny_dataset_path, tmp_path, accuracy=0.5, name="again.json")
    assert not again.passed and again.champion_accuracy > 0.6
    assert record["champion_version"] == out.version and "does not beat" in record["reason"]


def test_publish_components_spec(tmp_path):
    from kfp import compiler

    from cifar10_kfp_components.image import IMAGE

    for component, outputs in (
        (gate_model, {"passed", "champion_accuracy"}),
        (publish_model, {"uri", "version", "registration"}),
    ):
        path = tmp_path / f"{component.name}.yaml"
        compiler.Compiler().compile(component, str(path))
        spec = yaml.safe_load(path.read_text())
        executor = next(iter(spec["deploymentSpec"]["executors"].values()))["container"]
        assert executor["image"] == IMAGE
        assert set(spec["root"]["outputDefinitions"]["parameters"]) == outputs
        assert {"bucket", "storage_prefix", "model_name"} <= set(
            spec["root"]["inputDefinitions"]["parameters"]
        )


def test_a_gate_with_nothing_published_does_not_import_torch(store_env, tiny_dataset_path, tmp_path):
    """Each pipeline task is a fresh process; the first gate of a model name reads one pointer, so it
    must not spend a second importing torch (the champion is only evaluated when there is one)."""
    store_env.ensure_bucket()
    code = f"""
import sys
from kfp import dsl
from cifar10_kfp_components.publish import gate_model
out = gate_model.python_func(
    model=dsl.Model(uri={str(tmp_path / "model")!r}), dataset=dsl.Dataset(uri={str(tiny_dataset_path)!r}),
    test_accuracy=0.9, min_accuracy=0.5, model_name="never-published", bucket="", storage_prefix="",
    decision=dsl.Artifact(uri={str(tmp_path / "decision.json")!r}),
)
assert out.passed and out.champion_accuracy == -1.0, out
assert "torch" not in sys.modules, "the gate imported torch"
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
