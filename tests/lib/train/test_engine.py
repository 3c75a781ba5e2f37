"""The training engine on tiny learnable data: it learns, it is deterministic, it writes its outputs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from cifar10_kfp.data.format import save_prepared
from cifar10_kfp.train.augment import TrainBatches, epoch_generator, random_shifts
from cifar10_kfp.train.config import make_config
from cifar10_kfp.train.engine import default_checkpoint_uri, train
from cifar10_kfp.train.inference import Normalize
from cifar10_kfp.train.models import load_model
from cifar10_kfp.train.outputs import ProgressPrinter
from cifar10_kfp.train.state import LinearSchedule
from tests.support.data import make_tiny_dataset

TINY_RESNET = {"widths": "8,16,16", "whiten_samples": 128}


@pytest.fixture(scope="module")
def tiny32(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny32") / "dataset.safetensors"
    return save_prepared(make_tiny_dataset(n_train=256, n_val=64, image_size=32, num_classes=4), path)


def _weights(result):
    return load_file(str(result.model_dir / "model.safetensors"))


# ------------------------------------------------------------------------ augmentation


def test_translate_equals_reflect_pad_and_crop():
    images = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    shifts = random_shifts(6, 2, epoch_generator(0, 0))
    batches = TrainBatches(images, torch.zeros(6, dtype=torch.long), max_shift=2, channels_last=True)
    out = batches.gather(batches.window_rows(torch.arange(6), None, shifts))
    padded = torch.nn.functional.pad(images.float(), (2, 2, 2, 2), mode="reflect")
    for i, (dy, dx) in enumerate(shifts.tolist()):
        expected = padded[i, :, 2 + dy : 2 + dy + 8, 2 + dx : 2 + dx + 8]
        assert torch.equal(out[i].float(), expected)
    assert out.dtype == torch.uint8


def test_flip_mirrors_only_selected_images():
    images = torch.arange(2 * 3 * 2 * 4, dtype=torch.uint8).view(2, 3, 2, 4)
    batches = TrainBatches(images, torch.zeros(2, dtype=torch.long), flip=True)
    out = batches.gather(batches.window_rows(torch.arange(2), torch.tensor([True, False]), None))
    assert torch.equal(out[0], images[0].flip(-1)) and torch.equal(out[1], images[1])


def test_normalizer_matches_the_formula():
    images = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8)
    mean, std = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]
    out = Normalize(mean, std, torch.device("cpu"))(images)
    expected = (images.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1
    )
    assert torch.allclose(out, expected, atol=1e-5)


def test_linear_schedule_shape():
    schedule = LinearSchedule(total_steps=100, warmup_steps=10, start=0.1, final=0.0, constant=False)
    assert schedule(0) == pytest.approx(0.1) and schedule(10) == pytest.approx(1.0)
    assert schedule(55) == pytest.approx(0.5) and schedule(100) == pytest.approx(0.0)
    assert LinearSchedule(100, 10, 0.1, 0.0, constant=True)(50) == 1.0


def test_progress_line_has_fixed_columns():
    printer = ProgressPrinter(True, 10)
    row = {"epoch": 3, "train_loss": 1.23456, "train_acc": 0.5, "val_acc": 0.612, "lr": 0.01,
           "images_per_s": 1234.5, "elapsed_s": 12.3}  # fmt: skip
    line = printer.line(row, eta_s=40.0)
    assert len(line) == len(ProgressPrinter.HEADER)
    assert "3/10" in line and "61.20%" in line and "1.00e-02" in line


# ------------------------------------------------------------------------------ training


def test_seed_preset_short_cpu_run_learns_and_writes_outputs(tiny_dataset_path, tmp_path, capsys):
    config = make_config("seed", {"epochs": 3})
    result = train(config, tiny_dataset_path, tmp_path / "out")
    history = result.history
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["val_acc"] >= 0.75  # 4 classes: chance is 0.25
    stdout = capsys.readouterr().out
    assert "train_loss" in stdout and "3/3" in stdout  # the header and one line per epoch

    model, info = load_model(result.model_dir)  # loadable with cifar10_kfp.train.models alone
    assert info.architecture == "simple_cnn" and info.class_names == [f"class{i}" for i in range(4)]
    assert info.image_size == 16 and info.extra["training_config"]["lr"] == 0.01
    saved_history = json.loads((tmp_path / "out" / "history.json").read_text())
    assert {
        "epoch",
        "train_loss",
        "train_acc",
        "val_loss",
        "val_acc",
        "lr",
        "images_per_s",
        "elapsed_s",
    } <= set(saved_history[0])
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["val_acc"] == history[-1]["val_acc"] and metrics["epochs"] == 3
    assert metrics["resumed_from_epoch"] == 0 and metrics["images_per_s"] > 0


@pytest.mark.slow
def test_cpu_recipe_learns_well_above_chance(tiny32, tmp_path):
    config = make_config("cpu", {"epochs": 3, "batch_size": 64, "lr": 0.2, **TINY_RESNET})
    result = train(config, tiny32, tmp_path / "out")
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.metrics["val_acc"] >= 0.6  # chance is 0.25
    model, info = load_model(result.model_dir)
    assert info.model_config["widths"] == [8, 16, 16] and info.extra["weights"] == "ema"


@pytest.mark.slow
def test_same_seed_is_bitwise_identical_and_another_seed_is_not(tiny32, tmp_path):
    config = make_config("cpu", {"epochs": 2, "batch_size": 64, **TINY_RESNET})
    first = _weights(train(config, tiny32, tmp_path / "a"))
    second = _weights(train(config, tiny32, tmp_path / "b"))
    other = _weights(train(make_config("cpu", {"epochs": 2, "batch_size": 64, "seed": 1, **TINY_RESNET}), tiny32,
                           tmp_path / "c"))  # fmt: skip
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_batch_larger_than_the_data_is_capped(tiny_dataset_path, tmp_path):
    result = train(make_config("seed", {"epochs": 1, "batch_size": 4096}), tiny_dataset_path, tmp_path / "o")
    assert result.metrics["steps"] == 1


def test_empty_val_split_falls_back_to_test(tmp_path):
    data = make_tiny_dataset(n_val=0)
    path = save_prepared(data, tmp_path / "d.safetensors")
    result = train(make_config("seed", {"epochs": 1}), path, tmp_path / "o")
    assert result.metrics["eval_split"] == "test"


def test_default_checkpoint_uri_uses_run_id_and_config_hash(monkeypatch):
    monkeypatch.setenv("CIFAR10_KFP_BUCKET", "mlpipeline")
    monkeypatch.setenv("CIFAR10_KFP_PREFIX", "cifar10-kfp/")
    config = make_config("cpu")
    uri = default_checkpoint_uri("run-123", config)
    assert uri == f"s3://mlpipeline/cifar10-kfp/checkpoints/run-123/{config.config_hash()}"
    assert default_checkpoint_uri("a/b c", config).endswith(f"/checkpoints/a-b-c/{config.config_hash()}")
    with pytest.raises(ValueError, match="run_id"):
        default_checkpoint_uri("", config)
