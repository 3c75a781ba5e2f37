"""Hyperparameter tuning: one Optuna study in one process (the ``cifar10-tune`` pipeline's tune step).

Modules: ``space`` (the search space: parsing and validation, no torch, no optuna at import),
``trial`` (one trial's training on data already on the device, with a per-epoch report),
``study`` (the study: sampler, pruner, state in the object store after every trial, resume),
``report`` (the HTML report with Optuna's matplotlib plots and a table of the trials).

This package's ``__init__`` imports nothing, so ``cifar10_kfp.params`` can use ``space`` cheaply.
"""
