"""TrainConfig, presets and override parsing."""

from __future__ import annotations

import pytest

from cifar10_kfp.train.config import PRESETS, TrainConfig, field_names, make_config


def test_seed_preset_is_the_blog_recipe():
    config = make_config("seed")
    assert (config.architecture, config.lr, config.momentum, config.batch_size, config.epochs) == (
        "simple_cnn", 0.01, 0.9, 64, 10,
    )  # fmt: skip
    assert not config.flip and config.translate == 0
    assert config.label_smoothing == 0 and config.ema_decay == 0 and config.weight_decay == 0
    assert config.lr_schedule == "constant" and not config.nesterov and not config.tta


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_builds_and_round_trips(preset):
    config = make_config(preset)
    assert config.preset == preset
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_fast_and_cpu_presets_use_the_fast_recipe():
    for name in ("fast", "cpu"):
        config = make_config(name)
        assert config.architecture == "fast_resnet"
        assert config.flip and config.translate > 0 and config.tta
        assert config.label_smoothing > 0 and config.ema_decay > 0 and config.channels_last
    assert make_config("fast").batch_size >= 1024 and make_config("fast").amp


def test_overrides_are_parsed_by_field_type():
    config = make_config(
        "cpu", {"lr": "0.3", "epochs": "3", "flip": "false", "widths": "8,16,32", "eval_split": "test"}
    )
    assert config.lr == 0.3 and config.epochs == 3 and config.flip is False
    assert config.widths == (8, 16, 32) and config.eval_split == "test"
    assert make_config("cpu", {"widths": [4, 8, 8], "tta": 0}).widths == (4, 8, 8)


def test_unknown_key_is_named_with_the_valid_ones():
    with pytest.raises(
        ValueError, match=r"unknown training config key\(s\) \['learning_rat'\].*'label_smoothing'"
    ):
        make_config("seed", {"learning_rat": 0.1})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("epochs", "two", "epochs"),
        ("epochs", 0, "epochs=0 must be >= 1"),
        ("flip", "maybe", "flip"),
        ("lr", -1, "lr=-1.0 must be > 0"),
        ("lr_schedule", "cosine", "lr_schedule"),
        ("label_smoothing", 1.5, "label_smoothing"),
        ("epochs", 2.5, "epochs"),
    ],
)
def test_bad_values_are_refused_naming_the_field(key, value, message):
    with pytest.raises(ValueError, match=message):
        make_config("seed", {key: value})


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'turbo'"):
        make_config("turbo")


def test_widths_only_for_fast_resnet():
    with pytest.raises(ValueError, match="widths"):
        make_config("seed", {"widths": "8,8,8"}).model_config()


def test_config_hash_ignores_runtime_fields_only():
    base = make_config("cpu")
    assert base.config_hash() == make_config("cpu", {"checkpoint_every": 5, "threads": 1}).config_hash()
    assert base.config_hash() != make_config("cpu", {"lr": 0.5}).config_hash()
    assert len(base.config_hash()) == 12


def test_field_names():
    assert set(field_names()) >= {"checkpoint_every", "keep_checkpoints", "ema_decay"}
