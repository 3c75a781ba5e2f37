"""Tuning: an Optuna study (TPE + median pruning) vs the grid sweep, at the same compute budget, on CPU.

Both search the same space on the same subset with the same trial length and seed:

- grid: every point of a learning-rate x label-smoothing grid trained for the full trial length,
  as the ``cifar10-sweep`` pipeline trains one configuration per hparam set;
- Optuna: ``cifar10_kfp.tune.study.run_study`` (what the ``cifar10-tune`` pipeline's tune step
  runs) over the same ranges, with as many trials as the grid has points, so its budget can
  never exceed the grid's; pruning ends unpromising trials after an epoch.

Both score a configuration by its validation accuracy after the last epoch (a validation split
carved from the training images; the test split is not used), train in this process one after
the other on the same device data, and count compute as epochs trained and as seconds. The
goal: Optuna's best >= the grid's best with <= half the grid's compute. Reported whether or not.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.common import BenchContext, row, scratch_dir, section

LRS = (0.1, 0.2, 0.4, 0.8)
SMOOTHINGS = (0.0, 0.2)
SPACE = {"lr": {"type": "float", "low": min(LRS), "high": max(LRS), "log": True},
         "label_smoothing": {"type": "float", "low": min(SMOOTHINGS), "high": max(SMOOTHINGS)}}  # fmt: skip


def _subset(ctx: BenchContext, n_train: int, n_val: int, where: Path):
    """``n_train`` training and ``n_val`` validation images from the archive's training split, shuffled."""
    from cifar10_kfp.data.format import save_prepared

    full = ctx.dataset(n_train + n_val, 100)
    order = np.random.default_rng(0).permutation(len(full.train_labels))
    train, val = order[:n_train], order[n_train : n_train + n_val]
    images, labels = full.train_images, full.train_labels
    data = replace(full, train_images=images[train], train_labels=labels[train], val_images=images[val],
                   val_labels=labels[val])  # fmt: skip
    return save_prepared(data, where / f"subset-{n_train}-{n_val}.safetensors")


def run_grid(values: dict, data_path) -> list[dict]:
    """Every grid point trained for the trial length; one row each (val_acc, epochs, seconds)."""
    from cifar10_kfp.train.distributed import setup_runtime
    from cifar10_kfp.tune.study import trial_config
    from cifar10_kfp.tune.trial import StudyData, train_trial

    runtime = setup_runtime(trial_config(values, {}).device)
    data = StudyData.load(str(data_path), runtime)
    rows = []
    for lr, smoothing in itertools.product(LRS, SMOOTHINGS):
        point = {"lr": lr, "label_smoothing": smoothing}
        start = time.perf_counter()
        history = train_trial(trial_config(values, point), data, runtime, lambda row: None)
        rows.append({"params": point, "value": history[-1]["val_acc"], "epochs_run": len(history),
                     "train_s": time.perf_counter() - start})  # fmt: skip
    return rows


def reached(trials: list[dict], target: float) -> tuple[float | None, float | None]:
    """(epochs, seconds) Optuna had spent, in trial order, when a completed trial first scored >= ``target``."""
    epochs = seconds = 0.0
    for trial in sorted(trials, key=lambda t: t["number"]):
        epochs, seconds = epochs + trial["epochs_run"], seconds + trial["train_s"]
        if trial["state"] == "COMPLETE" and trial["value"] >= target:
            return epochs, seconds
    return None, None


def run(ctx: BenchContext) -> dict:
    n_train, n_val, epochs = ctx.pick(smoke=(200, 100, 1), quick=(1500, 500, 3), full=(8000, 2000, 5))
    with scratch_dir(ctx, "tune") as tmp:
        grid, study, values = _search(ctx, n_train, n_val, epochs, Path(tmp))
    return _report(grid, study, values, n_train, n_val, epochs)


def _search(ctx: BenchContext, n_train: int, n_val: int, epochs: int, tmp: Path):
    """The grid, then the study, on the same subset; (grid rows, TuneResult, the study's values)."""
    from cifar10_kfp.params.validation import validate_pipeline_params
    from cifar10_kfp.tune.study import run_study

    data = _subset(ctx, n_train, n_val, tmp)
    values = validate_pipeline_params({"preset": "cpu", "trial_epochs": epochs, "search_space": json.dumps(SPACE),
                                       "n_trials": len(LRS) * len(SMOOTHINGS), "sampler": "tpe",
                                       "pruner": "median", "extra_hparams": '{"device": "cpu"}'}, "tune")  # fmt: skip
    grid = run_grid(values, data)
    study = run_study(values, str(data), tmp / "out", study_uri=str(tmp / "state"))
    return grid, study, values


def _report(grid: list[dict], study, values: dict, n_train: int, n_val: int, epochs: int) -> dict:
    grid_best = max(r["value"] for r in grid)
    grid_epochs, grid_s = sum(r["epochs_run"] for r in grid), sum(r["train_s"] for r in grid)
    optuna_epochs, optuna_s = study.metrics["trial_epochs_total"], study.metrics["trial_seconds_total"]
    reach_epochs, reach_s = reached(study.trials, grid_best)
    met = reach_epochs is not None and reach_epochs <= grid_epochs / 2
    rows = [
        row("best validation accuracy (Optuna vs grid)", study.best_value, grid_best, ratio_kind="",
            target=">= grid", met=study.best_value >= grid_best),
        row("compute used by the whole search, epochs", optuna_epochs, grid_epochs, unit="epochs", target="report"),
        row("compute used by the whole search, seconds", optuna_s, grid_s, unit="s", target="report"),
        row("compute until Optuna first matched the grid's best, epochs", reach_epochs, grid_epochs,
            unit="epochs", target="<= 0.5x", met=met),
        row("the same in seconds", reach_s, grid_s, unit="s", target="<= 0.5x",
            met=reach_s is not None and reach_s <= grid_s / 2),
    ]  # fmt: skip
    notes = [
        f"Data: {n_train:,} training / {n_val:,} validation images from the real archive's training split; "
        f"`cpu` preset, {epochs} epochs per trial, seed 0. Space: lr in [{min(LRS)}, {max(LRS)}] (log) x "
        f"label_smoothing in [{min(SMOOTHINGS)}, {max(SMOOTHINGS)}]; grid = {len(LRS)} x {len(SMOOTHINGS)} points "
        f"{list(LRS)} x {list(SMOOTHINGS)}; Optuna = {values['n_trials']} trials (TPE, 5 random startup trials, "
        f"median pruning after 2 trials). Best: Optuna {json.dumps(study.best_params)}, grid "
        f"{json.dumps(max(grid, key=lambda r: r['value'])['params'])}.",
        f"Optuna pruned {study.metrics['trials_pruned']} of {values['n_trials']} trials. "
        + ("It never matched the grid's best." if reach_epochs is None else
           f"It matched the grid's best after {reach_epochs:g} of the grid's {grid_epochs} epochs."),
    ]  # fmt: skip
    details = {"grid": grid, "optuna": study.trials, "optuna_metrics": study.metrics}
    return section("Tuning: Optuna vs grid", rows, details=details, notes=notes)
