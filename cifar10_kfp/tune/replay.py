"""A study replayed from a table of learning curves, through the product's own objective, sampler and pruner.

A learning-curve table holds, for each configuration of a discrete search space, the history
rows ``train_trial`` produced when that configuration trained for the trial length (validation
accuracy per epoch, seconds). CPU training is bitwise deterministic for a seed, and a trial's
first k epochs do not depend on whether it is stopped after epoch k, so a study whose trials
read their rows from the table instead of training makes exactly the decisions the live study
makes: the same values drawn, the same reports, the same pruning. ``replay_study`` is that
study: ``create_study`` (sampler and pruner), ``make_objective`` and ``optimize`` of the live
path, with ``table_trainer`` in place of ``device_trainer``. It runs in milliseconds, so a
benchmark can draw dozens of sampler seeds from one table.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cifar10_kfp.params.space import Dimension, parse_search_space
from cifar10_kfp.tune.objective import Trainer, make_objective, optimize, trial_config
from cifar10_kfp.tune.report import trial_rows

Table = Mapping[str, Sequence[Mapping[str, Any]]]  # config_key -> history rows, epoch 1..E


def config_key(searched: Mapping[str, Any]) -> str:
    """One configuration as a table key: numbers as floats (a choice ``0`` and the config's ``0.0`` are one)."""
    as_number = lambda v: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v  # noqa: E731
    return json.dumps({name: as_number(value) for name, value in searched.items()}, sort_keys=True)


def candidates(space: Mapping[str, Dimension]) -> list[dict]:
    """Every configuration of a discrete space (choices and int ranges), in a fixed order."""
    import itertools

    values: list[list] = []
    for dim in space.values():
        if dim.size() is None:
            raise ValueError(f"search_space.{dim.name} is a float range: a table needs a discrete space")
        if dim.kind == "categorical":
            values.append(list(dim.choices))
        else:  # an int range: size() checked both ends are set
            values.append(list(range(int(dim.low or 0), int(dim.high or 0) + 1)))
    return [dict(zip(space, combo)) for combo in itertools.product(*values)]


def table_trainer(table: Table, names: Iterable[str]) -> Trainer:
    """A trainer that reads a configuration's history rows from ``table`` instead of training."""
    names = tuple(names)

    def train(config, on_epoch: Callable[[dict], None]) -> list:
        key = config_key({name: getattr(config, name) for name in names})
        if key not in table:
            raise KeyError(f"the learning-curve table has no row for {key}")
        rows = table[key]
        if len(rows) != config.epochs:
            raise ValueError(f"the table has {len(rows)} epochs for {key}; the trials train {config.epochs}")
        history = []
        for row in rows:
            history.append(dict(row))
            on_epoch(dict(row))  # may raise optuna.TrialPruned, as in a live trial
        return history

    return train


def learning_curves(values: Mapping[str, Any], dataset, configs: Sequence[Mapping[str, Any]], *,
                    name: str = "dataset", on_row: Callable[[dict, dict], None] = lambda searched, row: None) -> dict:  # fmt: skip
    """The learning-curve table: each of ``configs`` trained for the trial length by the live trial function.

    ``dataset`` is a ``PreparedDataset`` (its validation split scores the trials, as in the live
    study); the device is the trials' own (``values``' training settings). ``on_row(searched, row)``
    sees each epoch's row as it comes (progress).
    """
    from cifar10_kfp.train.distributed import Runtime, resolve_device
    from cifar10_kfp.tune.trial import StudyData, train_trial

    device = resolve_device(trial_config(values, {}).device)
    data, runtime = StudyData.on_device(dataset, name, device), Runtime(device=device)
    table = {}
    for searched in configs:
        each_row = functools.partial(on_row, dict(searched))
        history = train_trial(trial_config(values, searched), data, runtime, each_row)
        table[config_key(searched)] = [_table_row(row) for row in history]
    return table


def _table_row(row: Mapping[str, Any]) -> dict:
    """What a replayed trial needs of a history row: the epoch, its val accuracy and its seconds."""
    return {key: row[key] for key in ("epoch", "val_acc", "val_loss", "train_s", "trial_s")}


def replay_study(values: Mapping[str, Any], table: Table, *, sampler_seed: int | None = None,
                 callbacks: Sequence[Callable] = ()) -> list[dict]:  # fmt: skip
    """The study ``values`` describe, replayed from ``table``; one ``report.trial_rows`` row per trial.

    ``sampler_seed`` replaces the sampler's seed (the live study seeds it with ``values["seed"]``);
    ``callbacks`` are extra study callbacks (a benchmark stops once it has what it measures).
    """
    import optuna

    from cifar10_kfp.tune.study import create_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = parse_search_space(values["search_space"])
    epochs = trial_config(values, {}).epochs
    study = create_study(values, optuna.storages.InMemoryStorage(), epochs, sampler_seed=sampler_seed)
    objective = make_objective(values, space, table_trainer(table, space), attempt="replay")
    optimize(study, objective, values, space, callbacks=callbacks)
    return trial_rows(study)


def epochs_to_target(rows: Sequence[Mapping[str, Any]], target: float) -> float:
    """Epochs the trials had spent, in trial order, when a *completed* trial first scored >= ``target``; inf if never.

    A pruned trial never counts as reaching it (its value is a partial one), and a miss is inf,
    not dropped: it stays in any median taken over seeds.
    """
    spent = 0
    for row in sorted(rows, key=lambda r: r["number"]):
        spent += int(row["epochs_run"])
        if row["state"] == "COMPLETE" and row["value"] is not None and row["value"] >= target:
            return float(spent)
    return float("inf")


def stop_at_target(target: float) -> Callable:
    """A study callback that stops once a completed trial reaches ``target`` (what follows changes no r)."""
    from optuna.trial import TrialState

    def callback(study, trial) -> None:
        if trial.state == TrialState.COMPLETE and trial.value >= target:
            study.stop()

    return callback


__all__ = [
    "candidates",
    "config_key",
    "epochs_to_target",
    "learning_curves",
    "replay_study",
    "stop_at_target",
    "table_trainer",
]
