"""Search spaces: refused before anything starts, naming the field; only TrainConfig fields."""

from __future__ import annotations

import json

import pytest

from cifar10_kfp.params.space import parse_search_space
from cifar10_kfp.params.validation import validate_pipeline_params


def _tune(space, **more):
    return validate_pipeline_params({"search_space": json.dumps(space), **more}, "tune")


@pytest.mark.parametrize(
    ("space", "named"),
    [
        ({"no_such_field": {"type": "float", "low": 0.1, "high": 1}}, "search_space.no_such_field"),
        ({"epochs": {"type": "int", "low": 1, "high": 5}}, "search_space.epochs"),
        ({"device": {"type": "categorical", "choices": ["cpu"]}}, "search_space.device"),
        ({"lr": {"type": "float", "low": 0.0, "high": 1.0}}, "search_space.lr: 0.0"),
        ({"lr": {"type": "float", "low": 1.0, "high": 0.5}}, "search_space.lr: low=1.0 must be below"),
        ({"lr": {"type": "float", "low": 0.1, "high": 1.0, "log": "yes"}}, "search_space.lr: log"),
        ({"momentum": {"type": "float", "low": 0.5, "high": 1.5}}, "search_space.momentum: 1.5"),
        ({"batch_size": {"type": "float", "low": 1, "high": 2}}, "search_space.batch_size: type 'float'"),
        ({"batch_size": {"type": "int", "low": 0, "high": 64}}, "search_space.batch_size: 0"),
        (
            {"lr_schedule": {"type": "categorical", "choices": ["linear", "cosine"]}},
            "search_space.lr_schedule",
        ),
        ({"lr": {"type": "uniform", "low": 0.1, "high": 1}}, "search_space.lr: expected an object"),
        ({"lr": {"type": "float", "low": 0.1}}, "search_space.lr: a range needs both"),
        ({"lr": {"type": "categorical", "choices": []}}, "search_space.lr: choices"),
        ({"lr": {"type": "float", "low": 0.1, "high": 1, "step": 2}}, "search_space.lr: unknown key"),
    ],
)
def test_a_bad_search_space_is_refused_naming_the_field(space, named):
    with pytest.raises(ValueError) as caught:
        _tune(space)
    assert str(caught.value).startswith(named), caught.value


def test_the_trial_length_is_checked_with_the_space():
    # the cpu preset warms up for 1 epoch: trials of 1 epoch are fine, and a warm-up searched past them is not
    space = {"warmup_epochs": {"type": "float", "low": 0.0, "high": 2.0}}
    with pytest.raises(ValueError, match=r"^search_space.warmup_epochs: 2.0"):
        _tune(space, preset="cpu", trial_epochs=1)
    assert _tune(space, preset="cpu", trial_epochs=3)["trial_epochs"] == 3


def test_a_valid_space_is_normalised():
    values = _tune({"batch_size": {"type": "categorical", "choices": [64, 128]},
                    "lr": {"type": "float", "low": 0.01, "high": 1, "log": True}})  # fmt: skip
    assert json.loads(values["search_space"]) == {
        "batch_size": {"type": "categorical", "choices": [64, 128]},
        "lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True},
    }
    assert set(parse_search_space(values["search_space"])) == {"batch_size", "lr"}


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("sampler", "cmaes", "tpe, random, grid"),
        ("pruner", "wilcoxon", "asha, median, hyperband, none"),
        ("n_trials", 0, "1..1000"),
        ("reduction_factor", 1, "2..10"),
        ("min_resource", 0, "1..10000"),
        ("budget_epochs", -1, "0..10000000"),
    ],
)
def test_study_settings_are_checked(name, value, allowed):
    with pytest.raises(ValueError, match=rf"^{name}={value!r} is out of range: use .*{allowed}"):
        validate_pipeline_params({name: value}, "tune")


def test_the_cli_refuses_a_bad_space_before_reading_the_data(tmp_path, capsys):
    from cifar10_kfp_pipelines.cli import main

    code = main(["tune", "--data", str(tmp_path / "missing.safetensors"), "--search-space",
                 '{"lr": {"type": "float", "low": -1, "high": 1}}', "--study-uri", str(tmp_path / "s"),
                 "--output-dir", str(tmp_path / "o")])  # fmt: skip
    assert code == 2
    assert "search_space.lr: -1.0 is not a valid value" in capsys.readouterr().err
    assert not (tmp_path / "s").exists() and not (tmp_path / "o").exists()


def test_trials_shorter_than_a_chosen_warm_up_are_refused():
    with pytest.raises(ValueError, match=r"^trial_epochs=1 does not fit .*warmup_epochs=3.0"):
        validate_pipeline_params(
            {"extra_hparams": '{"warmup_epochs": 3}', "epochs": 5, "trial_epochs": 1}, "tune"
        )


def test_the_grid_sampler_needs_a_discrete_space():
    with pytest.raises(
        ValueError, match=r"^sampler='grid' needs a discrete search space, but search_space.lr is"
    ):
        _tune({"lr": {"type": "float", "low": 0.01, "high": 1}}, sampler="grid")
    values = _tune({"lr": {"type": "categorical", "choices": [0.1, 0.2]}, "batch_size": {"type": "int", "low": 2,
                    "high": 4}}, sampler="grid")  # fmt: skip
    assert values["sampler"] == "grid" and values["pruner"] == "asha"  # successive halving is the default


@pytest.mark.parametrize("val_fraction", [0, 0.0, "0"])
def test_tuning_without_a_validation_split_is_refused_naming_val_fraction(val_fraction):
    """Trials scored on the test split would choose values on the split that gates publication."""
    with pytest.raises(
        ValueError, match=r"^val_fraction=0.0 leaves no validation split .*use val_fraction > 0"
    ):
        validate_pipeline_params({"val_fraction": val_fraction}, "tune")
    assert validate_pipeline_params({"val_fraction": 0}, "training")["val_fraction"] == 0  # training may


def test_the_cli_refuses_a_dataset_without_a_validation_split_before_the_study_exists(tmp_path, capsys):
    from dataclasses import replace

    import numpy as np

    from cifar10_kfp.data.format import save_prepared
    from cifar10_kfp_pipelines.cli import main
    from tests.support.data import make_tiny_dataset

    tiny = make_tiny_dataset(n_train=64)
    no_val = replace(tiny, val_images=tiny.val_images[:0], val_labels=np.zeros(0, dtype=np.int64))
    data = save_prepared(no_val, tmp_path / "data" / "dataset.safetensors")
    code = main(
        ["tune", "--data", str(data), "--study-uri", str(tmp_path / "s"), "--output-dir", str(tmp_path / "o")]
    )
    assert code != 0
    assert "no validation split (prepared with val_fraction=0)" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # no study was made
