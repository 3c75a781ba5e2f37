"""The sweep's trials: each an object of training settings over the pipeline's values, validated as one.

Split out of ``cifar10_kfp.params`` (which calls ``validate_trials`` when it validates the sweep)
to keep that module to its table and the mapping.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cifar10_kfp import params


def validate_trials(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each sweep trial = the pipeline's training settings overridden by the trial's own keys."""
    specs = {p.name: p for p in params.TRAINING_PARAMS}
    trials = []
    for index, trial in enumerate(json.loads(values["hparam_sets"])):
        where = f"hparam_sets[{index}]."
        unknown = sorted(set(trial) - set(params.TRAINING_KEYS))
        if unknown:
            raise ValueError(
                f"{where}{unknown[0]} is not a trial setting: each trial may set {', '.join(params.TRAINING_KEYS)}"
            )
        merged = params.training_settings(values)
        for key, raw in trial.items():
            if key == "extra_hparams" and isinstance(raw, dict):
                raw = json.dumps(raw)
            try:
                merged[key] = params._coerce(specs[key], raw)
            except ValueError as exc:
                raise ValueError(f"{where}{exc}") from None
            params._check(specs[key], merged[key], where)
        merged["extra_hparams"] = params._normalise_json_object(merged["extra_hparams"])
        params._check_training_config(merged, where=where)
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
