"""A kfp.local run of the training pipeline with model_registry_url set publishes and registers the version."""

from __future__ import annotations

import pytest

from cifar10_kfp.publish import kubeflow_registry as kr
from cifar10_kfp.storage import ObjectStore
from cifar10_kfp_pipelines.local import format_summary, run_local
from tests.support.datagen import make_real_subset_archive

FAST = {"preset": "seed", "architecture": "simple_cnn", "epochs": "1", "image_size": "32", "num_gpus": "0",
        "min_accuracy": "0"}  # fmt: skip


@pytest.mark.slow
def test_training_pipeline_registers_the_published_version(
    real_archive, store_env: ObjectStore, registry_server, tmp_path
):
    subset = make_real_subset_archive(
        real_archive, tmp_path / "subset.tar.gz", train_per_class=20, test_per_class=10
    )
    params = {**FAST, "dataset_uri": str(subset), "model_name": "e2e-registry",
              "model_registry_url": registry_server.url}  # fmt: skip
    summary = run_local("training", params, output_root=tmp_path / "runs")
    assert summary["status"] == "SUCCEEDED", summary
    table = format_summary(summary)  # run-local's closing table names the registration
    assert (
        f"model-registry://e2e-registry/{summary['published']['version']} at {registry_server.url}" in table
    )
    published = summary["published"]
    registration = published["model_registry"]  # the run summary shows the registration
    assert registration["registry_uri"] == f"model-registry://e2e-registry/{published['version']}"
    assert registration["url"] == registry_server.url and not registration["already_registered"]
    with kr.connect(registry_server.url) as client:  # the real server lists the version with its properties
        [version] = list(client.get_model_versions("e2e-registry"))
        artifact = client.get_model_artifact("e2e-registry", version.name)
    assert version.name == published["version"] and artifact.uri.split("?")[0] == published["uri"] + "/triton"
    props = version.custom_properties
    metrics = summary["metrics"]
    assert props["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert props["test_accuracy_plain"] == pytest.approx(metrics["accuracy_plain"])
    assert props["run_id"] == summary["run_id"] and props["gate_verdict"] == "passed"
    assert (
        props["dataset_digest"]
        and len(props["config_hash"]) == 12
        and props["image"]
        and props["code_version"]
    )
    assert props["store_uri"] == published["uri"]
