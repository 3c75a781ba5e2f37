"""``Tracker``: what a training, evaluation or tuning run reports live, to the sinks its environment names.

``open_tracker(name)`` looks at the environment once: ``MLFLOW_TRACKING_URI`` adds an MLflow run
(``mlflow_sink``), ``KUBEFLOW_TRAINER_SERVER_URL`` (for a training run) the TrainJob's status
(``trainer_status``). With neither it returns a tracker that does nothing and imports nothing, so a run
without them behaves and prints exactly as before. The sinks send from threads of their own; no method
here raises because of a sink.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a sink's module is imported when its variable is set
    from cifar10_kfp.tracking.mlflow_sink import MlflowSink
    from cifar10_kfp.tracking.trainer_status import TrainerStatusSink

log = logging.getLogger(__name__)

# history row key -> MLflow metric name: mostly the TensorBoard tags (train.curves.SCALARS); never the name
# of a final metric (val_acc, images_per_s, ...), which this run and KFP's launcher log at step 0.
EPOCH_METRICS = {
    "train_loss": "train/loss",
    "train_acc": "train/accuracy",
    "val_loss": "val/loss",
    "val_acc": "val/accuracy",
    "lr": "lr",
    "images_per_s": "train/images_per_s",
}
STATUS_METRICS = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "images_per_s")


def numeric(values: Mapping[str, object]) -> dict[str, float]:
    """The finite int and float values of ``values`` (no bools), as floats."""
    out = {}
    for key, value in values.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[key] = float(value)
    return out


class Tracker:
    """Reports a run to an MLflow run and/or a TrainJob status; a no-op with neither.

    Args:
        mlflow: The MLflow run's sink, or None.
        status: The TrainJob status sink, or None.
    """

    def __init__(self, mlflow: MlflowSink | None = None, status: TrainerStatusSink | None = None):
        self.mlflow = mlflow
        self.status = status
        self.closed = False

    @property
    def enabled(self) -> bool:
        return self.mlflow is not None or self.status is not None

    def around_step(self, hook: Callable[[Any], None], total_steps: int) -> Callable[[Any], None]:
        """``hook`` (called with the training state after each step), plus ``step`` when a sink uses it.

        Only the TrainJob status shows progress inside an epoch; without it ``hook`` itself comes back,
        so an untracked run's step loop is what it was.
        """
        if self.status is None:
            return hook

        def hook_and_step(state: Any) -> None:
            hook(state)
            self.step(state.step, total_steps)

        return hook_and_step

    def start(self, params: Mapping[str, object]) -> None:
        """The run's parameters (config, dataset digest), logged once."""
        if self.mlflow is not None:
            self.mlflow.log_params(params)

    def epoch(self, row: Mapping[str, object], total_epochs: int, eta_s: float | None = None) -> None:
        """One finished epoch's history row (``train.outputs.epoch_row``), with ``step=epoch``."""
        values = numeric(row)
        epoch = int(values.get("epoch", 0))
        if self.mlflow is not None:
            mapped = {name: values[key] for key, name in EPOCH_METRICS.items() if key in values}
            self.mlflow.log_metrics(mapped, step=epoch)
        if self.status is not None:
            self.status.update_metrics(
                {k: values[k] if k != "epoch" else epoch for k in STATUS_METRICS if k in values}
            )
            self.status.progress(epoch / max(1, total_epochs), eta_s)

    def step(self, done: int, total: int) -> None:
        """``done`` of ``total`` optimiser steps are done (throttled by the sink)."""
        if self.status is not None and total > 0:
            self.status.progress(done / total)

    def final(self, metrics: Mapping[str, object]) -> None:
        """The run's final scalar metrics (its ``metrics.json``), at step 0."""
        if self.mlflow is not None:
            self.mlflow.log_metrics(numeric(metrics))

    def trial(self, name: str, params: Mapping[str, object]) -> Tracker:
        """A nested MLflow run for one tuning trial (a no-op tracker without MLflow)."""
        if self.mlflow is None:
            return Tracker()
        child = Tracker(self.mlflow.child(name))
        child.start(params)
        return child

    def close(self, status: str = "FINISHED") -> None:
        """End the run (``status``: FINISHED, FAILED or KILLED) and flush, waiting a bounded time; once."""
        if self.closed:
            return
        self.closed = True
        for sink in (self.status, self.mlflow):
            if sink is not None:
                sink.close(status)


def open_tracker(name: str, *, progress: bool = False, env: Mapping[str, str] | None = None) -> Tracker:
    """The tracker of a run called ``name`` ("train", "evaluate", "tune"), from the environment.

    Args:
        name: The run's name, used when an MLflow run is created here.
        progress: Also report to a TrainJob's status server when ``KUBEFLOW_TRAINER_SERVER_URL`` is set.
        env: The environment to read (``os.environ`` by default).

    Returns:
        A ``Tracker``; one that does nothing (and imported nothing) when no variable is set.
    """
    env = os.environ if env is None else env
    mlflow: MlflowSink | None = None
    status: TrainerStatusSink | None = None
    if env.get("MLFLOW_TRACKING_URI", "").strip():
        from cifar10_kfp.tracking.mlflow_sink import MlflowSink

        mlflow = MlflowSink(env, name)
    if progress and env.get("KUBEFLOW_TRAINER_SERVER_URL", "").strip():
        from cifar10_kfp.tracking.trainer_status import TrainerStatusSink

        status = TrainerStatusSink(env)
    return Tracker(mlflow, status)
