"""The train_model component through .python_func with real KFP artifacts and the embedded object store;
the ``cifar10-kfp train`` command line."""

from __future__ import annotations

import json

import pytest
from kfp import dsl

from cifar10_kfp.checkpoint import CheckpointManager
from cifar10_kfp.config import make_config
from cifar10_kfp.engine import default_checkpoint_uri
from cifar10_kfp.models import load_model
from cifar10_kfp_components.train import train_model
from cifar10_kfp_pipelines.cli import main as cli_main


def _artifacts(tmp_path, dataset_path):
    dataset = dsl.Dataset(name="dataset", uri=str(dataset_path))
    dataset.path = str(dataset_path)
    outputs = {}
    for name, cls in (("model", dsl.Model), ("metrics", dsl.Metrics), ("history", dsl.Artifact)):
        art = cls(name=name, uri=f"file://{tmp_path / name}")
        art.path = str(tmp_path / name)
        outputs[name] = art
    return dataset, outputs


def _params(**kw):
    params = dict(
        preset="seed", architecture="", epochs=2, batch_size=0, learning_rate=0.0, seed=0,
        extra_hparams='{"label_smoothing": 0.05}', num_gpus=0, checkpoint_every=0, checkpoint_uri="",
        run_id="run-abc", bucket="", storage_prefix="",
    )  # fmt: skip
    params.update(kw)
    return params


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


def test_cli_train_seconds_long_cpu_mode(tiny_dataset_path, tmp_path, capsys):
    code = cli_main(
        ["train", "--data", str(tiny_dataset_path), "--preset", "seed", "--epochs", "1", "--batch-size", "32",
         "--set", "label_smoothing=0.1", "--output-dir", str(tmp_path / "o"), "--checkpoint-uri", str(tmp_path / "ck")]
    )  # fmt: skip
    assert code == 0
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and metrics["steps"] == 256 // 32
    stdout = capsys.readouterr().out
    assert "1/1" in stdout  # the per-epoch progress line
    assert json.loads(stdout[stdout.index("\n{") + 1 :]) == metrics  # metrics.json echoed for scripts
    assert (tmp_path / "ck" / "latest.json").is_file()


def test_cli_unknown_set_key_is_a_clear_error(tiny_dataset_path, tmp_path, capsys):
    code = cli_main(
        [
            "train",
            "--data",
            str(tiny_dataset_path),
            "--output-dir",
            str(tmp_path / "o"),
            "--set",
            "lr_warmup=3",
        ]
    )
    assert code == 2
    assert "unknown training config key(s) ['lr_warmup']" in capsys.readouterr().err
