"""The pipeline parameter rules (cifar10_kfp.params): defaults, types, ranges, messages, sweep trials."""

from __future__ import annotations

import inspect
import json

import pytest

from cifar10_kfp.params.table import SWEEP_PARAMS, TRAINING_PARAMS, coerce_params, defaults
from cifar10_kfp.params.validation import validate_build_params, validate_pipeline_params


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
        ("val_fraction", 0.9, "val_fraction=0.9 is out of range: use a value in [0, 0.5]"),
        (
            "lr",
            -0.1,
            "lr=-0.1 is out of range: use 0 (the preset's default) or a value in (0, 10]",
        ),
        ("num_gpus", 17, "num_gpus=17 is out of range: use 0..16"),
        ("num_nodes", 0, "num_nodes=0 is out of range: use 1..64"),
        ("min_accuracy", 1.5, "min_accuracy=1.5 is out of range: use a value in [0, 1]"),
        ("image_size", 4, "image_size=4 is out of range: use 8..512"),
        ("preset", "turbo", "preset='turbo' is out of range: use one of seed, fast, cpu"),
        (
            "architecture",
            "vgg99",
            "architecture='vgg99' is out of range: use '' (the preset's default) or one of fast_resnet, simple_cnn",
        ),
        (
            "dataset_uri",
            "ftp://x/y.tgz",
            "dataset_uri='ftp://x/y.tgz' is out of range: unsupported scheme 'ftp'",
        ),
        ("dataset_uri", "", "dataset_uri='' is out of range: must not be empty"),
        ("dataset_checksum", "abc", "dataset_checksum='abc' is out of range: use '' (no check), sha256:"),
        ("dataset_checksum", "md5:" + "a" * 31, "dataset_checksum='md5:aaaa"),
        (
            "extra_hparams",
            "[1]",
            "extra_hparams='[1]' is not a JSON object: it must be one of training-config",
        ),
        (
            "extra_hparams",
            "{bad",
            "extra_hparams='{bad' is not valid JSON (Expecting property name enclosed in "
            "double quotes: line 1 column 2 (char 1)): it must be a JSON object",
        ),
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
    assert validate_pipeline_params({"epochs": "3", "lr": "0.5"})["epochs"] == 3
    for bad in (
        {"epochs": True},
        {"epochs": 2.5},
        {"epochs": "two"},
        {"lr": "nan"},
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
        {"preset": "cpu", "architecture": "simple_cnn", "epochs": 1}
    )  # a documented-valid combination
    values = validate_pipeline_params(
        {"extra_hparams": ' {"weight_decay": 0.001} ', "dataset_checksum": "sha256:" + "AB" * 32}
    )
    assert values["extra_hparams"] == '{"weight_decay": 0.001}' and values["dataset_checksum"] == "ab" * 32


def test_sweep_trials_are_expanded_and_checked():
    values = validate_pipeline_params({"hparam_sets": '[{"lr": 0.1}, {"epochs": 2, "extra_hparams": {"flip": true}}]',
                                       "epochs": 5}, "sweep")  # fmt: skip
    trials = json.loads(values["hparam_sets"])
    assert [t["epochs"] for t in trials] == [5, 2] and trials[0]["lr"] == 0.1
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


def test_each_knob_has_its_train_config_fields_name():
    """One name per knob: the pipeline parameter, the TrainConfig field and the CLI flag."""
    from cifar10_kfp.params.table import CONFIG_KNOBS, TRAINING_KEYS
    from cifar10_kfp.train.config import field_names

    assert {p.name for p in CONFIG_KNOBS} <= set(field_names())
    assert set(TRAINING_KEYS) == {p.name for p in CONFIG_KNOBS} | {"preset", "extra_hparams"}
    assert {"model", "learning_rate"}.isdisjoint(p.name for p in SWEEP_PARAMS + TRAINING_PARAMS)


def test_one_mapping_from_training_settings_to_the_config():
    from cifar10_kfp.params.table import train_config, training_overrides
    from cifar10_kfp.train.config import make_config

    settings = {"preset": "cpu", "architecture": "", "epochs": 3, "batch_size": 0, "lr": 0.0, "seed": 0,
                "extra_hparams": '{"lr": 0.3, "epochs": 9}', "checkpoint_every": 0}  # fmt: skip
    # extra_hparams first, then each knob that is set; ''/0 keep the preset's value, seed 0 is a seed
    assert training_overrides(settings) == {"lr": 0.3, "epochs": 3, "seed": 0}
    assert train_config(settings).to_dict() == make_config("cpu", {"lr": 0.3, "epochs": 3}).to_dict()
    assert training_overrides({"preset": "seed", "extra_hparams": {"seed": 4}}) == {"seed": 4}
    with pytest.raises(ValueError, match="extra_hparams must be a JSON object"):
        training_overrides({"preset": "seed", "extra_hparams": "[1]"})


def test_batch_size_is_global_in_the_ui_text():
    [batch] = [p for p in TRAINING_PARAMS if p.name == "batch_size"]
    assert "GLOBAL" in batch.description and "per process" not in batch.description


def test_checkpoint_prefix_always_carries_the_config_hash():
    from cifar10_kfp.params.table import checkpoint_prefix
    from cifar10_kfp.train.config import make_config

    a, b = make_config("seed", {"lr": 0.1}), make_config("seed", {"lr": 0.2})
    assert checkpoint_prefix("s3://b/ck/", "run", a) == f"s3://b/ck/{a.config_hash()}"
    assert checkpoint_prefix("s3://b/ck", "run", a) != checkpoint_prefix("s3://b/ck", "run", b)
    assert checkpoint_prefix("", "run-1", a).endswith(f"/checkpoints/run-1/{a.config_hash()}")


def test_the_parameter_table_imports_nothing_heavy():
    """Components and pipelines import cifar10_kfp.params at module level: it must stay stdlib-only."""
    import subprocess
    import sys

    code = (
        "import sys, cifar10_kfp.params; print(sorted({'torch', 'numpy', 'kfp', 'minio'} & set(sys.modules)))"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        == "[]\n"
    )


def test_one_cifar10_url():
    from cifar10_kfp.data import CIFAR10_URL
    from cifar10_kfp.data.download import DEFAULT_URL

    assert defaults()["dataset_uri"] == CIFAR10_URL == DEFAULT_URL


def test_the_committed_parameter_reference_is_generated_from_the_table():
    """docs/parameters.md is what a person reads beside the KFP UI's run form (which shows no descriptions)."""
    from cifar10_kfp.params import reference
    from tests.support.paths import ROOT

    committed = (ROOT / "docs" / "parameters.md").read_text()
    assert committed == reference.markdown(), (
        "docs/parameters.md is stale: python -m cifar10_kfp.params.reference > docs/parameters.md"
    )
    for param in reference.pipeline_params("training"):
        assert f"| `{param.name}` |" in committed
