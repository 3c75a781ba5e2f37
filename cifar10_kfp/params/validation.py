"""Validating a pipeline's values as a whole: each value against its row, then the combinations.

``validate_pipeline_params(params)`` is what the pipelines' first step runs (so bad values fail
in seconds, before any GPU pod is scheduled), what ``run-local`` runs before it starts anything,
and what the property-based tests fuzz. It never touches the network, the object store or kfp.
Every error is a ``ValueError`` whose message starts with the parameter name and states the
allowed range, e.g. ``epochs=-1 is out of range: use 0 (the preset's default) or 1..10000``.

The table itself (names, types, defaults, rules) is ``cifar10_kfp.params``; this module reads it
and never the other way round.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cifar10_kfp.params.table import (
    BUILD_PARAMS,
    TRAINING_KEYS,
    TRAINING_PARAMS,
    _check,
    _coerce,
    coerce_params,
    defaults,
    pipeline_params,
    train_config,
    training_settings,
)


def validate_build_params(params: Mapping[str, Any], pipeline: str = "training") -> dict[str, Any]:
    """Check the compile-time settings of a pipeline (e.g. the sweep's ``parallelism``); defaults filled."""
    specs = {p.name: p for p in BUILD_PARAMS[pipeline]}
    unknown = sorted(set(params) - set(specs))
    if unknown:
        raise ValueError(f"unknown build setting(s) {', '.join(unknown)} for the {pipeline} pipeline")
    values = {name: spec.default for name, spec in specs.items()}
    for name, raw in params.items():
        values[name] = _coerce(specs[name], raw)
        _check(specs[name], values[name])
    return values


def validate_pipeline_params(params: Mapping[str, Any], pipeline: str = "training") -> dict[str, Any]:
    """Check pipeline parameters and return them complete, typed and normalised.

    Missing parameters take their defaults. Raises ``ValueError`` for an unknown name, a wrong
    type or a value out of range; the message names the parameter and the allowed values.
    """
    if not isinstance(params, Mapping):
        raise ValueError(f"parameters must be a mapping of name to value, got {type(params).__name__}")
    values = {**defaults(pipeline), **coerce_params(params, pipeline)}
    for param in pipeline_params(pipeline):
        _check(param, values[param.name])
    values["dataset_checksum"] = values["dataset_checksum"].lower().removeprefix("sha256:")
    values["extra_hparams"] = _normalise_json_object(values["extra_hparams"])
    _check_training_config(training_settings(values), where="")
    if pipeline == "training" and values["min_nodes"] > values["num_nodes"]:
        raise ValueError(
            f"min_nodes={values['min_nodes']} is out of range: use 0 (= num_nodes) or 1..{values['num_nodes']} "
            f"(num_nodes={values['num_nodes']})"
        )
    if pipeline == "sweep":
        values["hparam_sets"] = json.dumps(validate_trials(values), sort_keys=True)
    if pipeline == "tune":
        values["search_space"] = _validate_study(values)
    return values


def _normalise_json_object(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True) if text.strip() not in ("", "{}") else ""


def _validate_study(values: Mapping[str, Any]) -> str:
    """The tune pipeline's combinations; the normalised search space.

    Trials are scored on the validation split: without one the study would pick its values on
    the test split, the one that later gates publication, so ``val_fraction=0`` is refused.
    """
    from cifar10_kfp.params.space import candidate_count, parse_search_space

    if values["val_fraction"] <= 0:
        raise ValueError(
            f"val_fraction={values['val_fraction']!r} leaves no validation split to score tuning trials on "
            "(the test split gates publication and must not choose the values): use val_fraction > 0, e.g. 0.1"
        )
    text = _validate_search_space(values)
    if values["sampler"] == "grid" and candidate_count(parse_search_space(text)) is None:
        ranges = [name for name, spec in json.loads(text).items() if spec["type"] == "float"]
        raise ValueError(
            f"sampler='grid' needs a discrete search space, but search_space.{ranges[0]} is a float range: "
            'give it {"type": "categorical", "choices": [...]}, or use sampler tpe or random'
        )
    return text


def _validate_search_space(values: Mapping[str, Any]) -> str:
    """The normalised search space; each range's ends and each choice must make a valid training config."""
    from cifar10_kfp.params.space import parse_search_space, space_json

    base, length = (
        training_settings(values),
        {"epochs": values["trial_epochs"]} if values["trial_epochs"] else {},
    )
    try:
        train_config(base, length)
    except ValueError as exc:
        raise ValueError(
            f"trial_epochs={values['trial_epochs']} does not fit the training settings: {exc}"
        ) from None
    check = lambda overrides: train_config(base, {**overrides, **length})  # noqa: E731
    return space_json(parse_search_space(values["search_space"], check=check))


def _check_training_config(training: Mapping[str, Any], where: str) -> None:
    """Build the training config the train step will build, so bad combinations fail now, not on a GPU."""
    try:
        train_config(training).model_config()  # model_config checks widths against the architecture
    except (ValueError, TypeError) as exc:
        shown = {k: training[k] for k in ("preset", "architecture", "extra_hparams") if training[k]}
        raise ValueError(f"{where}training settings {shown} are not a valid combination: {exc}") from None


def validate_trials(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each sweep trial = the pipeline's training settings overridden by the trial's own keys."""
    specs = {p.name: p for p in TRAINING_PARAMS}
    trials = []
    for index, trial in enumerate(json.loads(values["hparam_sets"])):
        where = f"hparam_sets[{index}]."
        unknown = sorted(set(trial) - set(TRAINING_KEYS))
        if unknown:
            raise ValueError(
                f"{where}{unknown[0]} is not a trial setting: each trial may set {', '.join(TRAINING_KEYS)}"
            )
        merged = training_settings(values)
        for key, raw in trial.items():
            if key == "extra_hparams" and isinstance(raw, dict):
                raw = json.dumps(raw)
            try:
                merged[key] = _coerce(specs[key], raw)
            except ValueError as exc:
                raise ValueError(f"{where}{exc}") from None
            _check(specs[key], merged[key], where)
        merged["extra_hparams"] = _normalise_json_object(merged["extra_hparams"])
        _check_training_config(merged, where=where)
        trials.append(merged)
    seen: dict[str, int] = {}
    for index, trial in enumerate(trials):
        key = json.dumps(trial, sort_keys=True)
        if key in seen:
            raise ValueError(
                f"hparam_sets[{index}] repeats hparam_sets[{seen[key]}]: trials must differ, or they would "
                "train the same model twice and waste a GPU"
            )
        seen[key] = index
    return trials


def gpu_limit_for_pod(num_gpus: int, num_nodes: int) -> str:
    """GPUs the single-node train pod requests, as a string (see pipelines/policy.py for why a string)."""
    return str(num_gpus if num_nodes == 1 else 0)


def validated_outputs(params: Mapping[str, Any], pipeline: str) -> tuple[str, Any, str]:
    """What a pipeline's validate step returns: ``(gpu_limit, training settings or trials, params JSON)``.

    For ``training`` the middle item is the train step's settings dict; for ``sweep`` the list
    of trials, one settings dict each, for ``dsl.ParallelFor``.
    """
    values = validate_pipeline_params(params, pipeline)
    gpu_limit = gpu_limit_for_pod(values["num_gpus"], values.get("num_nodes", 1))
    training = json.loads(values["hparam_sets"]) if pipeline == "sweep" else training_settings(values)
    return gpu_limit, training, json.dumps(values, sort_keys=True)
