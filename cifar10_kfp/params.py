"""Validation rules for the pipeline parameters, as one pure function.

``validate_pipeline_params(params)`` is what the pipelines' first step runs (so bad values fail
in seconds, before any GPU pod is scheduled), what ``run-local`` runs before it starts anything,
and what the property-based tests fuzz. It never touches the network, the object store or kfp.

Every error is a ``ValueError`` whose message starts with the parameter name and states the
allowed range, e.g. ``epochs=-1 is out of range: use 0 (the preset's default) or 1..10000``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The presets and models named in the contract; the live lists come from cifar10_kfp.config and
# cifar10_kfp.models when those import (they pull in torch, so they are loaded on first use).
CONTRACT_PRESETS = ("seed", "fast", "cpu")
DEFAULT_DATASET_URI = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
DATASET_SCHEMES = ("http", "https", "s3", "minio", "file")
MAX_GPUS_PER_NODE = 16  # the largest GPU node shapes in common clouds
MAX_NODES = 64  # beyond this, the Trainer's rendezvous and our object-store checkpointing need tuning
MAX_SWEEP_TRIALS = 64
MAX_PARALLELISM = 32
_SHA256 = re.compile(r"^(sha256:)?[0-9a-fA-F]{64}$")
_MD5 = re.compile(r"^md5:[0-9a-fA-F]{32}$")
_MODEL_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")

# Keys one sweep trial may set: the training knobs of the training pipeline.
TRIAL_KEYS = ("preset", "model", "epochs", "batch_size", "learning_rate", "seed", "extra_hparams")


@dataclass(frozen=True)
class Param:
    """One pipeline parameter: its type, default, and the rule for its values."""

    name: str
    kind: type  # int, float or str: the KFP parameter type
    default: Any
    description: str  # what the KFP UI shows (kept equal to the pipeline docstrings by a test)
    check: Callable[[Any], str | None] | None = None  # returns the allowed-range text when bad


def _int_range(lo: int, hi: int, zero_means_default: bool = False) -> Callable[[int], str | None]:
    def check(value: int) -> str | None:
        if zero_means_default and value == 0:
            return None
        if lo <= value <= hi:
            return None
        return f"use 0 (the preset's default) or {lo}..{hi}" if zero_means_default else f"use {lo}..{hi}"

    return check


def _float_range(lo: float, hi: float, *, lo_open: bool = False, zero_means_default: bool = False):
    def check(value: float) -> str | None:
        if zero_means_default and value == 0:
            return None
        ok = (lo < value if lo_open else lo <= value) and value <= hi
        if ok:
            return None
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        return (
            f"use 0 (the preset's default) or a value in {interval}"
            if zero_means_default
            else f"use {interval}"
        )

    return check


def _check_dataset_uri(value: str) -> str | None:
    if not value.strip():
        return "must not be empty: use an http(s)://, s3://, minio://, file:// URI or a local path"
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme and scheme not in DATASET_SCHEMES:
        return f"unsupported scheme {scheme!r}: use one of {', '.join(s + '://' for s in DATASET_SCHEMES)} or a local path"
    if any(ord(ch) < 32 for ch in value):
        return "must not contain control characters"
    return None


def _check_checksum(value: str) -> str | None:
    if value == "" or _SHA256.match(value) or _MD5.match(value):
        return None
    return "use '' (no check), sha256:<64 hex digits> (the prefix is optional) or md5:<32 hex digits>"


def _check_uri_or_empty(value: str) -> str | None:
    if value == "":
        return None
    from cifar10_kfp.storage import InvalidNameError, parse_uri

    try:
        parse_uri(value)
    except InvalidNameError as exc:
        return f"use '' (derived from the run id) or an s3://bucket/key URI: {exc}"
    return None


def _check_bucket(value: str) -> str | None:
    if value == "":
        return None
    from cifar10_kfp.storage import InvalidNameError, validate_bucket

    try:
        validate_bucket(value)
    except InvalidNameError as exc:
        return f"use '' (CIFAR10_KFP_BUCKET, default mlpipeline) or a valid S3 bucket name: {exc}"
    return None


def _check_prefix(value: str) -> str | None:
    if value == "":
        return None
    from cifar10_kfp.storage import InvalidNameError, validate_key

    try:
        validate_key(value.strip("/") or "x")
    except InvalidNameError as exc:
        return f"use '' (CIFAR10_KFP_PREFIX, default cifar10-kfp/) or a valid object key prefix: {exc}"
    return None


def _check_model_name(value: str) -> str | None:
    if _MODEL_NAME.match(value):
        return None
    return "use 1-63 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit"


def available_presets() -> tuple[str, ...]:
    """The training presets: ``cifar10_kfp.config.PRESETS`` when it imports, else the contract's names."""
    try:
        from cifar10_kfp.config import PRESETS
    except ImportError:
        return CONTRACT_PRESETS
    return tuple(PRESETS)


def available_models() -> tuple[str, ...]:
    """The registered model architectures (``cifar10_kfp.models``)."""
    from cifar10_kfp import models

    return tuple(models.available_models())


def _check_preset(value: str) -> str | None:
    presets = available_presets()
    return None if value in presets else f"use one of {', '.join(presets)}"


def _check_model(value: str) -> str | None:
    if value == "":
        return None
    names = available_models()
    return None if value in names else f"use '' (the preset's model) or one of {', '.join(names)}"


def _check_extra_hparams(value: str) -> str | None:
    if value.strip() in ("", "{}"):
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        return (
            f"must be a JSON object of training-config overrides, e.g. '{{\"weight_decay\": 5e-4}}' ({exc})"
        )
    if not isinstance(parsed, dict):
        return f"must be a JSON object of training-config overrides, got a JSON {type(parsed).__name__}"
    return None


# ------------------------------------------------------------------------------- parameters

_P = Param
TRAINING_PARAMS: tuple[Param, ...] = (
    _P("dataset_uri", str, DEFAULT_DATASET_URI,
       "Where the dataset archive is: http(s)://, s3://, minio://, file:// or a path. CIFAR-10 python or "
       "JPEG image-folder tar.gz.", _check_dataset_uri),
    _P("dataset_checksum", str, "",
       "Expected checksum of the archive: sha256:<64 hex> (prefix optional) or md5:<32 hex>; empty skips the check.", _check_checksum),
    _P("val_fraction", float, 0.1,
       "Fraction of the training split held out for validation, in [0, 0.5].", _float_range(0.0, 0.5)),
    _P("max_train_samples", int, 0,
       "Use at most this many training images, stratified by class; 0 uses all.", _int_range(0, 10_000_000, True)),
    _P("max_test_samples", int, 0,
       "Use at most this many test images, stratified by class; 0 uses all.", _int_range(0, 10_000_000, True)),
    _P("image_size", int, 32,
       "Side in pixels the images are resized to, 8..512 (32 is CIFAR-10's native size).", _int_range(8, 512)),
    _P("preset", str, "fast",
       "Training preset: seed (baseline), fast (GPU speed run) or cpu (small, for CPU-only runs).", _check_preset),
    _P("model", str, "",
       "Model architecture, e.g. simple_cnn or fast_resnet; empty uses the preset's.", _check_model),
    _P("epochs", int, 0, "Training epochs, 1..10000; 0 uses the preset's.", _int_range(1, 10_000, True)),
    _P("batch_size", int, 0, "Images per step (per process), 1..65536; 0 uses the preset's.",
       _int_range(1, 65_536, True)),
    _P("learning_rate", float, 0.0, "Peak learning rate, in (0, 10]; 0 uses the preset's.",
       _float_range(0.0, 10.0, lo_open=True, zero_means_default=True)),
    _P("seed", int, 0, "Random seed for data order, augmentation and initialisation, 0..2147483647.",
       _int_range(0, 2**31 - 1)),
    _P("extra_hparams", str, "",
       "JSON object of further training-config overrides, e.g. {\"weight_decay\": 0.0005}; empty for none.",
       _check_extra_hparams),
    _P("num_gpus", int, 1, f"GPUs per node for training, 0..{MAX_GPUS_PER_NODE} (0 trains on CPU).",
       _int_range(0, MAX_GPUS_PER_NODE)),
    _P("num_nodes", int, 1,
       f"Nodes to train on, 1..{MAX_NODES}; more than 1 hands training to a Kubeflow Trainer TrainJob.",
       _int_range(1, MAX_NODES)),
    _P("checkpoint_every", int, 0, "Save a resumable checkpoint every N epochs, 1..10000; 0 uses the preset's.",
       _int_range(1, 10_000, True)),
    _P("checkpoint_uri", str, "",
       "Where checkpoints go (s3://bucket/key); empty derives it from the run id, so a retry resumes.",
       _check_uri_or_empty),
    _P("min_accuracy", float, 0.5,
       "Publish only if test accuracy is at least this, in [0, 1], and not worse than the published champion.",
       _float_range(0.0, 1.0)),
    _P("model_name", str, "cifar10-classifier",
       "Name the model is published under (models/<name>/<version>).", _check_model_name),
    _P("bucket", str, "", "Object-store bucket; empty uses CIFAR10_KFP_BUCKET (default mlpipeline).", _check_bucket),
    _P("storage_prefix", str, "",
       "Key prefix for everything the pipeline writes; empty uses CIFAR10_KFP_PREFIX (default cifar10-kfp/).",
       _check_prefix),
)  # fmt: skip


def _check_sweep_sets(value: str) -> str | None:
    # The deep per-trial checks run in _validate_trials; this only rejects what is not a list of objects.
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        return f'must be a JSON list of objects, e.g. \'[{{"learning_rate": 0.1}}, {{"learning_rate": 0.2}}]\' ({exc})'
    if not isinstance(parsed, list) or not all(isinstance(item, dict) for item in parsed):
        return "must be a JSON list of objects, one per trial"
    if not 1 <= len(parsed) <= MAX_SWEEP_TRIALS:
        return f"must hold 1..{MAX_SWEEP_TRIALS} trials, got {len(parsed)}"
    return None


DEFAULT_SWEEP_SETS = '[{"learning_rate": 0.05}, {"learning_rate": 0.1}, {"learning_rate": 0.2}]'
_SWEEP_ONLY: tuple[Param, ...] = (
    _P("hparam_sets", str, DEFAULT_SWEEP_SETS,
       "JSON list of trials; each object may set " + ", ".join(TRIAL_KEYS) + " over the pipeline's values.",
       _check_sweep_sets),
)  # fmt: skip
# The sweep trains every trial on one node: Trainer jobs per trial would multiply cluster demand.
SWEEP_PARAMS: tuple[Param, ...] = tuple(p for p in TRAINING_PARAMS if p.name != "num_nodes") + _SWEEP_ONLY

# Settings fixed when the pipeline is compiled, not run-time parameters: kfp 2.17's
# dsl.ParallelFor takes `parallelism` as a Python int (IR iterator_policy.parallelism_limit).
BUILD_PARAMS: dict[str, tuple[Param, ...]] = {
    "training": (),
    "sweep": (
        _P("parallelism", int, 2, f"Trials trained at the same time, 1..{MAX_PARALLELISM} (set at compile time).",
           _int_range(1, MAX_PARALLELISM)),
    ),
}  # fmt: skip


def validate_build_params(params: Mapping[str, Any], pipeline: str = "training") -> dict[str, Any]:
    """Check the compile-time settings of a pipeline (e.g. the sweep's ``parallelism``); defaults filled."""
    specs = {p.name: p for p in BUILD_PARAMS[pipeline]}
    unknown = sorted(set(params) - set(specs))
    if unknown:
        raise ValueError(f"unknown build setting(s) {', '.join(unknown)} for the {pipeline} pipeline")
    values = {name: spec.default for name, spec in specs.items()}
    for name, raw in params.items():
        value = _coerce(specs[name], raw)
        problem = specs[name].check(value) if specs[name].check else None
        if problem:
            raise ValueError(f"{name}={value!r} is out of range: {problem}")
        values[name] = value
    return values


PIPELINE_PARAMS = {"training": TRAINING_PARAMS, "sweep": SWEEP_PARAMS}


def defaults(pipeline: str = "training") -> dict[str, Any]:
    """The default value of every parameter of a pipeline."""
    return {p.name: p.default for p in _specs(pipeline)}


def _specs(pipeline: str) -> tuple[Param, ...]:
    try:
        return PIPELINE_PARAMS[pipeline]
    except KeyError:
        raise ValueError(f"pipeline={pipeline!r}: use one of {', '.join(PIPELINE_PARAMS)}") from None


# ------------------------------------------------------------------------------- coercion


def _coerce(param: Param, value: Any) -> Any:
    """Convert ``value`` to the parameter's type, accepting the string forms a command line gives."""
    name, kind = param.name, param.kind
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{name}={value!r} has the wrong type: expected a string")
        return value
    if isinstance(value, bool):
        raise ValueError(
            f"{name}={value!r} has the wrong type: expected {'an integer' if kind is int else 'a number'}"
        )
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
            return int(value)
        raise ValueError(f"{name}={value!r} has the wrong type: expected an integer")
    # float
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} has the wrong type: expected a number") from None
    else:
        raise ValueError(f"{name}={value!r} has the wrong type: expected a number")
    if not math.isfinite(number):
        raise ValueError(f"{name}={value!r} is not a finite number")
    return number


def coerce_params(params: Mapping[str, Any], pipeline: str = "training") -> dict[str, Any]:
    """Type-convert known parameters (``"3"`` -> 3 for an int) without range checks; unknown names fail."""
    specs = {p.name: p for p in _specs(pipeline)}
    unknown = sorted(set(params) - set(specs))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)} for the {pipeline} pipeline: use {', '.join(specs)}"
        )
    return {name: _coerce(specs[name], value) for name, value in params.items()}


# ------------------------------------------------------------------------------ validation


def validate_pipeline_params(params: Mapping[str, Any], pipeline: str = "training") -> dict[str, Any]:
    """Check pipeline parameters and return them complete, typed and normalised.

    Missing parameters take their defaults. Raises ``ValueError`` for an unknown name, a wrong
    type or a value out of range; the message names the parameter and the allowed values.
    """
    if not isinstance(params, Mapping):
        raise ValueError(f"parameters must be a mapping of name to value, got {type(params).__name__}")
    values = {**defaults(pipeline), **coerce_params(params, pipeline)}
    for param in _specs(pipeline):
        value = values[param.name]
        problem = param.check(value) if param.check else None
        if problem:
            raise ValueError(f"{param.name}={value!r} is out of range: {problem}")
    values["dataset_checksum"] = values["dataset_checksum"].lower().removeprefix("sha256:")
    values["extra_hparams"] = _normalise_json_object(values["extra_hparams"])
    _check_training_config(values, where="")
    if pipeline == "sweep":
        values["hparam_sets"] = json.dumps(_validate_trials(values), sort_keys=True)
    return values


def _normalise_json_object(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True) if text.strip() not in ("", "{}") else ""


def training_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainConfig overrides the train step derives from pipeline values (as components/train.py does).

    ``extra_hparams`` first, then every non-default knob; ``""``/``0`` keep the preset's value.
    """
    overrides = json.loads(values["extra_hparams"]) if str(values.get("extra_hparams", "")).strip() else {}
    for key, name in (("architecture", "model"), ("epochs", "epochs"), ("batch_size", "batch_size"),
                      ("lr", "learning_rate"), ("checkpoint_every", "checkpoint_every")):  # fmt: skip
        if values.get(name):
            overrides[key] = values[name]
    overrides["seed"] = values.get("seed", 0)
    return overrides


def _check_training_config(values: Mapping[str, Any], where: str) -> None:
    """Build the training config the train step will build, so bad combinations fail now, not on a GPU."""
    try:
        from cifar10_kfp.config import make_config
    except ImportError:
        return  # the training library is not installed here; the train step checks again
    trial = {key: values[key] for key in TRIAL_KEYS} | {"checkpoint_every": values.get("checkpoint_every", 0)}
    try:
        make_config(values["preset"], training_overrides(trial)).model_config()  # model_config checks widths
    except (ValueError, TypeError) as exc:
        shown = {k: trial[k] for k in ("preset", "model", "extra_hparams") if trial[k]}
        raise ValueError(f"{where}training settings {shown} are not a valid combination: {exc}") from None


def _validate_trials(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each sweep trial = the pipeline's training values overridden by the trial's own keys."""
    specs = {p.name: p for p in TRAINING_PARAMS}
    trials = []
    for index, trial in enumerate(json.loads(values["hparam_sets"])):
        where = f"hparam_sets[{index}]."
        unknown = sorted(set(trial) - set(TRIAL_KEYS))
        if unknown:
            raise ValueError(
                f"{where}{unknown[0]} is not a trial setting: each trial may set {', '.join(TRIAL_KEYS)}"
            )
        merged = {key: values[key] for key in TRIAL_KEYS}
        for key, raw in trial.items():
            param = specs[key]
            if key == "extra_hparams" and isinstance(raw, dict):
                raw = json.dumps(raw)
            try:
                value = _coerce(param, raw)
            except ValueError as exc:
                raise ValueError(f"{where}{exc}") from None
            problem = param.check(value) if param.check else None
            if problem:
                raise ValueError(f"{where}{key}={value!r} is out of range: {problem}")
            merged[key] = value
        merged["extra_hparams"] = _normalise_json_object(merged["extra_hparams"])
        _check_training_config(merged, where=where)
        trials.append(merged)
    seen: dict[str, int] = {}
    for index, trial in enumerate(trials):
        key = json.dumps(trial, sort_keys=True)
        if key in seen:
            raise ValueError(
                f"hparam_sets[{index}] repeats hparam_sets[{seen[key]}]: trials must differ, or they would share "
                "a checkpoint location and waste a GPU"
            )
        seen[key] = index
    return trials


def gpu_limit_for_pod(num_gpus: int, num_nodes: int) -> str:
    """GPUs the single-node train pod requests, as a string (see pipelines/policy.py for why a string)."""
    return str(num_gpus if num_nodes == 1 else 0)
