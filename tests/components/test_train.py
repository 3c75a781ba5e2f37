"""The train_model component through .python_func with real KFP artifacts and the embedded object store."""

from __future__ import annotations

import json

import pytest
from kfp import dsl

from cifar10_kfp.train.checkpoint import CheckpointManager
from cifar10_kfp.train.config import make_config
from cifar10_kfp.train.engine import default_checkpoint_uri
from cifar10_kfp.train.models import load_model
from cifar10_kfp_components.train import train_model


def _artifacts(tmp_path, dataset_path):
    dataset = dsl.Dataset(name="dataset", uri=str(dataset_path))
    dataset.path = str(dataset_path)
    outputs = {}
    kinds = (
        ("model", dsl.Model),
        ("metrics", dsl.Metrics),
        ("history", dsl.Artifact),
        ("card", dsl.Markdown),
    )
    for name, cls in kinds:
        art = cls(name=name, uri=f"file://{tmp_path / name}")
        art.path = str(tmp_path / name)
        outputs[name] = art
    return dataset, outputs


def _params(checkpoint_uri="", **training):
    settings = dict(
        preset="seed", architecture="", epochs=2, batch_size=0, lr=0.0, seed=0,
        extra_hparams='{"label_smoothing": 0.05}', checkpoint_every=0,
    )  # fmt: skip
    settings.update(training)
    return dict(training=settings, num_gpus=0, checkpoint_uri=checkpoint_uri, run_id="run-abc", bucket="",
                storage_prefix="")  # fmt: skip


def test_component_trains_checkpoints_to_the_store_and_a_retry_resumes(
    store_env, tiny_dataset_path, tmp_path
):
    store_env.ensure_bucket()
    dataset, out = _artifacts(tmp_path / "first", tiny_dataset_path)
    train_model.python_func(dataset=dataset, **_params(), **out)

    model, info = load_model(out["model"].path)
    assert info.architecture == "simple_cnn" and info.extra["training_config"]["label_smoothing"] == 0.05
    history = json.loads(open(out["history"].path).read())
    assert len(history) == 2 and json.loads(open(f"{out['model'].path}/history.json").read()) == history
    assert out["metrics"].metadata["val_acc"] == history[-1]["val_acc"]
    assert out["metrics"].metadata["resumed_from_epoch"] == 0

    config = make_config("seed", {"epochs": 2, "label_smoothing": 0.05, "seed": 0})
    expected_uri = default_checkpoint_uri("run-abc", config)
    assert out["model"].metadata["checkpoint_uri"] == expected_uri
    assert expected_uri.startswith(store_env.root_uri("checkpoints", "run-abc"))
    assert CheckpointManager(expected_uri, store=store_env).read_pointer()["epoch"] == 2
    # the curves sit next to the checkpoints, and the Markdown card says where
    assert out["model"].metadata["tensorboard_uri"] == expected_uri + "/tensorboard"
    assert (
        store_env.list(expected_uri + "/tensorboard")
        and expected_uri + "/tensorboard" in open(out["card"].path).read()
    )

    # a KFP retry of the same task (same run id, same parameters) finds the checkpoint and does not retrain
    dataset, again = _artifacts(tmp_path / "retry", tiny_dataset_path)
    train_model.python_func(dataset=dataset, **_params(), **again)
    assert again["metrics"].metadata["resumed_from_epoch"] == 2
    assert json.loads(open(again["history"].path).read()) == history


def test_component_rejects_unknown_extra_hparams(store_env, tiny_dataset_path, tmp_path):
    dataset, out = _artifacts(tmp_path, tiny_dataset_path)
    with pytest.raises(ValueError, match=r"unknown training config key\(s\) \['dropout'\]"):
        train_model.python_func(dataset=dataset, **_params(extra_hparams='{"dropout": 0.5}'), **out)
    with pytest.raises(ValueError, match="JSON object"):
        train_model.python_func(dataset=dataset, **_params(extra_hparams="[1]"), **out)


def test_trials_sharing_an_explicit_checkpoint_uri_never_resume_from_each_other(
    store_env, tiny_dataset_path, tmp_path
):
    """#13: sweep trials get the same checkpoint_uri; each checkpoints under its own config hash."""
    store_env.ensure_bucket()
    shared = store_env.root_uri("my-checkpoints")
    seen = {}
    for lr in (0.01, 0.02):
        dataset, out = _artifacts(tmp_path / f"lr{lr}", tiny_dataset_path)
        train_model.python_func(dataset=dataset, **_params(checkpoint_uri=shared, epochs=1, lr=lr), **out)
        config = make_config("seed", {"epochs": 1, "lr": lr, "label_smoothing": 0.05, "seed": 0})
        assert out["model"].metadata["checkpoint_uri"] == f"{shared}/{config.config_hash()}"
        assert out["metrics"].metadata["resumed_from_epoch"] == 0  # the other trial's checkpoint is not taken
        seen[lr] = out["model"].metadata["checkpoint_uri"]
    assert seen[0.01] != seen[0.02]
    dataset, again = _artifacts(tmp_path / "retry", tiny_dataset_path)
    train_model.python_func(
        dataset=dataset, **_params(checkpoint_uri=shared + "/", epochs=1, lr=0.02), **again
    )
    assert again["metrics"].metadata["resumed_from_epoch"] == 1  # a retry of a trial resumes its own


def test_the_runs_storage_prefix_is_passed_to_the_store_not_through_the_environment(
    store_env, tiny_dataset_path, tmp_path
):
    import os

    store_env.ensure_bucket()
    prefix = f"{store_env.config.prefix.strip('/')}-team/"
    before = {k: os.environ.get(k) for k in ("CIFAR10_KFP_BUCKET", "CIFAR10_KFP_PREFIX")}
    dataset, out = _artifacts(tmp_path, tiny_dataset_path)
    params = _params(epochs=1) | {"storage_prefix": prefix}
    train_model.python_func(dataset=dataset, **params, **out)
    expected_root = f"s3://{store_env.config.bucket}/{prefix}checkpoints/run-abc/"
    assert out["model"].metadata["checkpoint_uri"].startswith(expected_root)
    assert {k: os.environ.get(k) for k in before} == before  # the task's environment is left alone
