"""Tracking: live metrics of a run, where users look: an MLflow run and a Kubeflow TrainJob's status.

Modules: ``tracker`` (``open_tracker``: the sinks the environment names, or none), ``mlflow_sink``
(an MLflow run: the one KFP 2.17's MLflow integration injects as ``MLFLOW_RUN_ID``, or one made here),
``trainer_status`` (progress, ETA and metrics POSTed to Kubeflow Trainer's status server),
``outbox`` (the background thread that sends, so that no tracking server can slow or fail training).

The first stage: it imports no other. Without the variables nothing is imported or changed
(docs/tracking.md). The API below loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports

if TYPE_CHECKING:
    from cifar10_kfp.tracking.tracker import EPOCH_METRICS, Tracker, open_tracker

__all__ = ["EPOCH_METRICS", "Tracker", "open_tracker"]
__getattr__, __dir__ = lazy_exports(__name__, __file__)
