"""Hyperparameter tuning: one Optuna study in one process (the ``cifar10-tune`` pipeline's tune step).

Modules: ``trial`` (one trial's training on data already on the device, with a per-epoch report),
``objective`` (what a trial does, and when a study stops: pruning never after the last epoch, a
repeated configuration at no cost, the epoch budget, a finished discrete space),
``study`` (the study: sampler, pruner, state in the object store after every trial, resume),
``replay`` (a study replayed from a table of learning curves through the same objective, sampler and pruner),
``report`` (the HTML report with Optuna's matplotlib plots and a table of the trials). The search
space is a parameter: ``cifar10_kfp.params.space``.

The API below loads on first use: importing this package does not import torch or optuna.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports

if TYPE_CHECKING:
    from cifar10_kfp.tune.study import default_study_uri, run_study, trial_config

__all__ = ["default_study_uri", "run_study", "trial_config"]
__getattr__, __dir__ = lazy_exports(__name__, __file__)
