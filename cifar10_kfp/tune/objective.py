"""What one trial does, and when a study stops: the rules the live study and its replay share.

``make_objective(values, space, train, ...)`` is the function Optuna calls per trial; ``train``
trains a ``TrainConfig`` and calls ``on_epoch(row)`` after each epoch (``device_trainer`` for the
live study; ``cifar10_kfp.tune.replay`` reads the rows from a table of learning curves instead).
So a replay goes through exactly the sampler, pruner and rules a live study goes through:

- a trial reports its validation accuracy after every epoch, and the pruner may stop it there,
  except after its last epoch: a fully trained trial is complete, never pruned at full cost;
- in a discrete space a configuration already finished is not trained again: the trial takes
  the recorded result (value, intermediate values, complete or pruned) at no cost;
- ``stop_rules`` ends the study once the trials have spent ``budget_epochs`` epochs, or, in a
  discrete space, once every configuration has been finished.

Each trial records ``epochs_run``, ``train_s`` (seconds since it began) and ``fixed_s`` (its
fixed cost: building the model, whitening, the first evaluation; see ``trial.train_trial``).
"""

from __future__ import annotations

import json
import logging
import queue
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from cifar10_kfp.params import table as params
from cifar10_kfp.params.space import Dimension, candidate_count
from cifar10_kfp.tracking import Tracker

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.train import TrainConfig

log = logging.getLogger(__name__)

Trainer = Callable[[Any, Callable[[dict], None]], list]  # (TrainConfig, on_epoch) -> history rows


def trial_config(values: Mapping[str, Any], searched: Mapping[str, Any]) -> TrainConfig:
    """The ``TrainConfig`` of one trial: the pipeline's settings, the searched values, ``trial_epochs``."""
    extra = {"progress": False}
    if values["trial_epochs"]:
        extra["epochs"] = values["trial_epochs"]
    return params.train_config(params.training_settings(values), {**searched, **extra})


def device_trainer(slots: queue.Queue) -> Trainer:
    """Train on a device slot: ``slots`` holds one ``(StudyData, Runtime)`` per device, one trial each at a time."""
    from cifar10_kfp.tune.trial import train_trial

    def train(config, on_epoch: Callable[[dict], None]) -> list:
        data, runtime = slots.get()
        try:
            return train_trial(
                config, data, runtime, lambda row: on_epoch({**row, "device": str(runtime.device)})
            )
        finally:
            slots.put((data, runtime))

    return train


def finished_twin(study, number: int, searched: Mapping[str, Any]):
    """The first finished (complete or pruned) trial before ``number`` with these values, else None."""
    from optuna.trial import TrialState

    for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if other.number < number and other.params == dict(searched):
            return other
    return None


def _repeat(trial, twin) -> float:
    """Take ``twin``'s recorded result: its intermediate values, then its value or its pruning; no epochs."""
    import optuna
    from optuna.trial import TrialState

    trial.set_user_attr(key="same_as", value=twin.number)
    for key in ("epochs_run", "train_s", "fixed_s"):
        trial.set_user_attr(key=key, value=0)
    for step, value in sorted(twin.intermediate_values.items()):
        trial.report(value=value, step=step)
    if twin.state == TrialState.COMPLETE:
        return float(twin.value)
    raise optuna.TrialPruned(f"the same values as trial {twin.number}, pruned after epoch {twin.last_step}")


def make_objective(values: Mapping[str, Any], space: Mapping[str, Dimension], train: Trainer, attempt: str,
                   on_start: Callable[[], None] = lambda: None, tracker: Tracker | None = None):  # fmt: skip
    """The function Optuna calls per trial: train, report each epoch's val accuracy, return the last.

    ``on_start()`` runs once the trial's values are drawn and it is about to train (the live
    study saves itself, so that a retry knows which trial was in flight and re-runs it with the
    same values). ``tracker`` (the study's) gets each trained trial as a nested run, its epochs
    with ``step=epoch``.
    """
    import optuna

    discrete = candidate_count(space) is not None

    def objective(trial) -> float:
        searched = {name: dim.suggest(trial) for name, dim in space.items()}
        trial.set_user_attr(key="attempt", value=attempt)
        twin = finished_twin(trial.study, trial.number, searched) if discrete else None
        if twin is not None:
            return _repeat(trial, twin)
        config = trial_config(values, searched)
        on_start()
        tracked = (tracker or Tracker()).trial(f"trial-{trial.number}", searched)

        def report(row: dict) -> None:
            tracked.epoch(row, config.epochs)
            epoch = row["epoch"]
            trial.set_user_attr(key="epochs_run", value=epoch)
            trial.set_user_attr(key="train_s", value=round(float(row.get("trial_s", 0.0)), 3))
            if epoch == 1:
                trial.set_user_attr(
                    key="fixed_s", value=round(float(row.get("trial_s", 0.0) - row["train_s"]), 3)
                )
                if "device" in row:
                    trial.set_user_attr(key="device", value=row["device"])
            trial.report(value=row["val_acc"], step=epoch)
            # never after the last epoch: the trial has cost all its epochs and has its final value
            if epoch < config.epochs and trial.should_prune():
                raise optuna.TrialPruned(f"val_acc {row['val_acc']:.4f} after epoch {epoch}")

        status = "FAILED"
        try:
            history = train(config, report)
            status = "FINISHED"
        except optuna.TrialPruned:
            status = "KILLED"  # MLflow's word for a run stopped before its end
            raise
        finally:
            tracked.close(status)
        log.info("trial %d: val_acc %.4f %s", trial.number, history[-1]["val_acc"], json.dumps(searched))
        return float(history[-1]["val_acc"])

    return objective


def epochs_spent(study) -> int:
    return sum(int(trial.user_attrs.get("epochs_run", 0)) for trial in study.get_trials(deepcopy=False))


def why_stop(study, values: Mapping[str, Any], space: Mapping[str, Dimension]) -> str:
    """Why the study should start no more trials ('' when it should go on): its budget, or every candidate done."""
    from optuna.trial import TrialState

    budget = values["budget_epochs"]
    if budget and epochs_spent(study) >= budget:
        return f"the trials have spent {epochs_spent(study)} epochs, budget_epochs={budget}"
    candidates = candidate_count(space)
    if candidates is not None:
        finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        tried = {json.dumps(trial.params, sort_keys=True) for trial in finished}
        if len(tried) >= candidates:
            return f"all {candidates} configurations of the search space are finished"
    return ""


def stop_rules(values: Mapping[str, Any], space: Mapping[str, Dimension]) -> Callable:
    """The study callback that stops it when ``why_stop`` says so."""

    def callback(study, _trial) -> None:
        reason = why_stop(study, values, space)
        if reason:
            log.info("study: no more trials: %s", reason)
            study.stop()

    return callback


def optimize(study, objective, values: Mapping[str, Any], space: Mapping[str, Dimension], *, n_jobs: int = 1,
             callbacks=(), gc_after_trial: bool = False) -> None:  # fmt: skip
    """Run trials until ``n_trials`` are finished (those already in the study count), a stop rule, or the timeout."""
    from optuna.trial import TrialState

    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    remaining = values["n_trials"] - done
    reason = why_stop(study, values, space)
    if remaining <= 0 or reason:
        log.info(
            "study: no trials to run (%s)", reason or f"{done} of n_trials={values['n_trials']} finished"
        )
        return
    log.info("study: up to %d trial(s) to run, %d at a time", remaining, n_jobs)
    study.optimize(
        func=objective, n_trials=remaining, timeout=values["timeout_s"] or None, n_jobs=n_jobs,
        callbacks=[stop_rules(values, space), *callbacks], gc_after_trial=gc_after_trial,
    )  # fmt: skip
