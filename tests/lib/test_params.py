"""The pipeline parameter rules (cifar10_kfp.params): defaults, types, ranges, messages, sweep trials."""

from __future__ import annotations

import inspect
import json

import pytest

from cifar10_kfp.params import (
    SWEEP_PARAMS,
    TRAINING_PARAMS,
    coerce_params,
    defaults,
    validate_build_params,
    validate_pipeline_params,
)


def test_defaults_are_valid_and_complete():
    values = validate_pipeline_params({})
    assert values == defaults() | {"extra_hparams": ""}
    assert set(values) == {p.name for p in TRAINING_PARAMS}
    sweep = validate_pipeline_params({}, "sweep")
    assert len(json.loads(sweep["hparam_sets"])) == 3


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("epochs", -1, "epochs=-1 is out of range: use 0 (the preset's default) or 1..10000"),
        ("epochs", 10_001, "epochs=10001 is out of range"),
        ("val_fraction", 0.9, "val_fraction=0.9 is out of range: use [0, 0.5]"),
        (
            "learning_rate",
            -0.1,
            "learning_rate=-0.1 is out of range: use 0 (the preset's default) or a value in (0, 10]",
        ),
        ("num_gpus", 17, "num_gpus=17 is out of range: use 0..16"),
        ("num_nodes", 0, "num_nodes=0 is out of range: use 1..64"),
        ("min_accuracy", 1.5, "min_accuracy=1.5 is out of range: use [0, 1]"),
        ("image_size", 4, "image_size=4 is out of range: use 8..512"),
        ("preset", "turbo", "preset='turbo' is out of range: use one of seed, fast, cpu"),
        ("model", "vgg99", "model='vgg99' is out of range: use '' (the preset's model) or one of"),
        (
            "dataset_uri",
            "ftp://x/y.tgz",
            "dataset_uri='ftp://x/y.tgz' is out of range: unsupported scheme 'ftp'",
        ),
        ("dataset_uri", "", "dataset_uri='' is out of range: must not be empty"),
        ("dataset_checksum", "abc", "dataset_checksum='abc' is out of range: use '' (no check), sha256:"),
        ("dataset_checksum", "md5:" + "a" * 31, "dataset_checksum='md5:aaaa"),
        ("extra_hparams", "[1]", "extra_hparams='[1]' is out of range: must be a JSON object"),
        ("extra_hparams", "{bad", "extra_hparams='{bad' is out of range: must be a JSON object"),
        ("bucket", "Bad_Bucket", "bucket='Bad_Bucket' is out of range"),
        ("storage_prefix", "../up", "storage_prefix='../up' is out of range"),
        ("checkpoint_uri", "gs://b/k", "checkpoint_uri='gs://b/k' is out of range"),
        ("model_name", "My Model", "model_name='My Model' is out of range"),
        ("seed", 2**31, "seed=2147483648 is out of range: use 0..2147483647"),
    ],
)
def test_bad_values_name_the_parameter_and_the_allowed_range(name, value, expected):
    with pytest.raises(ValueError) as err:
        validate_pipeline_params({name: value})
    assert str(err.value).startswith(expected)


def test_types_are_checked_and_command_line_strings_converted():
    assert validate_pipeline_params({"epochs": "3", "learning_rate": "0.5"})["epochs"] == 3
    for bad in (
        {"epochs": True},
        {"epochs": 2.5},
        {"epochs": "two"},
        {"learning_rate": "nan"},
        {"preset": 1},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            validate_pipeline_params(bad)
    with pytest.raises(ValueError, match="unknown parameter.*epochz"):
        coerce_params({"epochz": 1})


def test_training_settings_are_checked_as_the_train_step_will_build_them():
    with pytest.raises(ValueError, match="unknown training config key.*nope"):
        validate_pipeline_params({"extra_hparams": '{"nope": 1}'})
    with pytest.raises(ValueError, match=r"momentum=1.5 must be in \[0, 1\)"):
        validate_pipeline_params({"extra_hparams": '{"momentum": 1.5}'})
    validate_pipeline_params(
        {"preset": "cpu", "model": "simple_cnn", "epochs": 1}
    )  # a documented-valid combination
    values = validate_pipeline_params(
        {"extra_hparams": ' {"weight_decay": 0.001} ', "dataset_checksum": "sha256:" + "AB" * 32}
    )
    assert values["extra_hparams"] == '{"weight_decay": 0.001}' and values["dataset_checksum"] == "ab" * 32


def test_sweep_trials_are_expanded_and_checked():
    values = validate_pipeline_params({"hparam_sets": '[{"learning_rate": 0.1}, {"epochs": 2, "extra_hparams": {"flip": true}}]',
                                       "epochs": 5}, "sweep")  # fmt: skip
    trials = json.loads(values["hparam_sets"])
    assert [t["epochs"] for t in trials] == [5, 2] and trials[0]["learning_rate"] == 0.1
    assert json.loads(trials[1]["extra_hparams"]) == {"flip": True}
    cases = {
        '[{"num_gpus": 2}]': "hparam_sets[0].num_gpus is not a trial setting",
        '[{"epochs": -3}]': "hparam_sets[0].epochs=-3 is out of range",
        '[{"epochs": 2}, {"epochs": 2}]': "hparam_sets[1] repeats hparam_sets[0]",
        "[]": "must hold 1..64 trials",
        '{"epochs": 2}': "must be a JSON list of objects",
    }
    for sets, message in cases.items():
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            validate_pipeline_params({"hparam_sets": sets}, "sweep")
    assert validate_build_params({"parallelism": "4"}, "sweep") == {"parallelism": 4}
    with pytest.raises(ValueError, match="parallelism=0 is out of range: use 1..32"):
        validate_build_params({"parallelism": 0}, "sweep")


@pytest.mark.parametrize(("module", "attr", "specs"), [
    ("cifar10_kfp_pipelines.training", "training_pipeline", TRAINING_PARAMS),
    ("cifar10_kfp_pipelines.sweep", "sweep_pipeline", SWEEP_PARAMS),
])  # fmt: skip
def test_pipeline_signatures_match_the_rules(module, attr, specs):
    """Names, types, defaults and UI descriptions of the pipelines equal the rules' (one source of truth)."""
    import importlib

    pipeline = getattr(importlib.import_module(module), attr)
    signature = inspect.signature(pipeline.pipeline_func)
    assert list(signature.parameters) == [p.name for p in specs]
    doc = pipeline.pipeline_func.__doc__
    for spec in specs:
        param = signature.parameters[spec.name]
        assert param.annotation is spec.kind and param.default == spec.default, spec.name
        assert f"{spec.name}: {spec.description}" in doc, spec.name
