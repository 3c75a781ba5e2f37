"""The study: Optuna trials in this process, one per GPU at a time, its state in the object store.

``run_study(values, data, output_dir, study_uri=...)`` takes a tune pipeline's validated values
(``cifar10_kfp.params.validation.validate_pipeline_params(..., "tune")``): the training settings every trial
starts from, ``search_space``, ``n_trials``, ``timeout_s``, ``sampler``, ``pruner`` and
``trial_epochs``. Each trial's ``TrainConfig`` is ``params.train_config(training, searched)``:
the one pipeline -> config mapping, with the trial's values on top. A trial reports its
validation accuracy after every epoch and the pruner may stop it there.

Retries: the study lives in an Optuna ``JournalStorage`` (a JSON-lines file) that is uploaded to
``<study_uri>/study.journal`` after every trial (an object-store PUT replaces the object whole, and
a local copy is written to a temporary name and renamed). A re-run with the same ``study_uri``
downloads it and goes on: finished trials (complete or pruned) are kept and count toward
``n_trials``; a trial that was in flight is marked failed and re-run with the same values. The
study refuses a journal made with other settings, naming the first that differs.

Concurrency: on a pod with several GPUs, as many trials run at once as there are GPUs (Optuna
threads, ``n_jobs``), each on its own GPU with its own copy of the data; elsewhere trials run one
after another. The dataset file is read once either way.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cifar10_kfp.params import table as params
from cifar10_kfp.params.space import Dimension, parse_search_space
from cifar10_kfp.tune.report import TuneResult

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.storage import ObjectStore
    from cifar10_kfp.train import TrainConfig

log = logging.getLogger(__name__)

STUDY_NAME = "cifar10-tune"
JOURNAL = "study.journal"
_SETTINGS_ATTR = "settings"


def training_with(training: Mapping[str, Any], searched: Mapping[str, Any]) -> dict:
    """Training settings with ``searched`` folded in: a knob by its own name, any other field in ``extra_hparams``.

    ``params.train_config`` of the result equals ``params.train_config(training, searched)``.
    """
    knobs = {knob.name for knob in params.CONFIG_KNOBS}
    out = dict(training)
    extra = json.loads(out.get("extra_hparams") or "{}")
    for name, value in searched.items():
        if name in knobs:
            out[name] = value
        else:
            extra[name] = value
    out["extra_hparams"] = json.dumps(extra, sort_keys=True) if extra else ""
    return out


def trial_config(values: Mapping[str, Any], searched: Mapping[str, Any]) -> TrainConfig:
    """The ``TrainConfig`` of one trial: the pipeline's settings, the searched values, ``trial_epochs``."""
    extra = {"progress": False}
    if values["trial_epochs"]:
        extra["epochs"] = values["trial_epochs"]
    return params.train_config(params.training_settings(values), {**searched, **extra})


def default_study_uri(checkpoint_uri: str, run_id: str, store: ObjectStore | None = None) -> str:
    """``<checkpoint_uri>/tune``, else ``<store root>/tune/<run_id>``: a retried task finds its study."""
    if checkpoint_uri:
        return f"{checkpoint_uri.rstrip('/')}/tune"
    from cifar10_kfp.storage import root_uri

    safe = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in str(run_id)).strip("-.")
    if not safe:
        raise ValueError(f"run_id {run_id!r} has no usable characters; pass a study URI")
    return (store.root_uri if store is not None else root_uri)("tune", safe)


class StudyState:
    """The journal file here and its copy at ``<study_uri>/study.journal``."""

    def __init__(self, study_uri: str, work_dir: Path, store=None):
        from cifar10_kfp.storage import ObjectStore

        self.uri = f"{study_uri.rstrip('/')}/{JOURNAL}"
        self.path = Path(work_dir) / JOURNAL
        self.store = store or ObjectStore()
        self._lock = threading.Lock()  # concurrent trials save the one journal in turn

    def download(self) -> bool:
        """Fetch the saved journal, if any; True when there was one."""
        from cifar10_kfp.storage import ObjectNotFound

        try:
            self.path.write_bytes(self.store.get_bytes(self.uri))
        except ObjectNotFound:
            return False
        return True

    def upload(self) -> None:
        with self._lock:
            self.store.put_bytes(self.path.read_bytes(), self.uri)


def _sampler(name: str, seed: int):
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


def _pruner(name: str, epochs: int):
    import optuna

    if name == "median":  # compare from the first epoch on, once two trials have finished
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(1, epochs))
    return optuna.pruners.NopPruner()


def _settings_key(values: Mapping[str, Any]) -> dict:
    keys = (*params.TRAINING_KEYS, "search_space", "sampler", "pruner", "trial_epochs")
    return {key: values[key] for key in keys}


def open_study(values: Mapping[str, Any], journal: Path, epochs: int):
    """Create or load the study in ``journal``; refuse one made with other settings."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    storage = JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=storage, direction="maximize", load_if_exists=True,
        sampler=_sampler(values["sampler"], values["seed"]), pruner=_pruner(values["pruner"], epochs),
    )  # fmt: skip
    settings = _settings_key(values)
    saved = study.user_attrs.get(_SETTINGS_ATTR)
    if saved is None:
        study.set_user_attr(_SETTINGS_ATTR, settings)
    elif saved != settings:
        differ = next(key for key in settings if saved.get(key) != settings[key])
        raise ValueError(
            f"the saved study was made with {differ}={saved.get(differ)!r}, not {settings[differ]!r}: "
            "use another study location (checkpoint_uri / --study-uri) or the same settings"
        )
    return study


def requeue_interrupted(study) -> int:
    """Mark trials left running by a killed process as failed, and queue their values again."""
    from optuna.trial import TrialState

    interrupted = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for trial in interrupted:
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number})
    return len(interrupted)


def trial_devices(device, concurrent: int | None = None) -> list:
    """One device per trial running at once: each visible GPU when the study runs on CUDA, else ``device`` once.

    ``concurrent`` caps the GPUs used; on a CPU it runs that many trials at once, sharing the cores.
    """
    import torch

    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        count = gpus if concurrent is None else min(concurrent, gpus)
        return [torch.device("cuda", index) for index in range(max(1, count))]
    return [device] * max(1, concurrent or 1)


def make_objective(values: Mapping[str, Any], space: Mapping[str, Dimension], slots: queue.Queue, attempt: str,
                   on_start=lambda: None):  # fmt: skip
    """The function Optuna calls per trial: train, report each epoch's val accuracy, return the last.

    ``slots`` holds one ``(StudyData, Runtime)`` per device; a trial takes one for its length, so
    concurrent trials never share a device. ``on_start()`` runs once the trial's values are drawn
    (the study saves itself, so that a retry knows which trial was in flight and re-runs it with
    the same values).
    """
    import optuna

    from cifar10_kfp.tune.trial import train_trial

    def objective(trial) -> float:
        searched = {name: dim.suggest(trial) for name, dim in space.items()}
        config = trial_config(values, searched)
        trial.set_user_attr("attempt", attempt)
        on_start()
        start = time.perf_counter()

        def report(row: dict) -> None:
            trial.set_user_attr("epochs_run", row["epoch"])
            trial.set_user_attr("train_s", round(time.perf_counter() - start, 3))
            trial.report(row["val_acc"], row["epoch"])
            if trial.should_prune():
                raise optuna.TrialPruned(f"val_acc {row['val_acc']:.4f} after epoch {row['epoch']}")

        data, runtime = slots.get()
        try:
            trial.set_user_attr("device", str(runtime.device))
            history = train_trial(config, data, runtime, report)
        finally:
            slots.put((data, runtime))
        log.info("trial %d: val_acc %.4f %s", trial.number, history[-1]["val_acc"], json.dumps(searched))
        return float(history[-1]["val_acc"])

    return objective


def _device_slots(data: str, device, concurrent: int | None) -> queue.Queue:
    """One ``(StudyData, Runtime)`` per device of ``trial_devices``; the dataset file is read once."""
    from cifar10_kfp.data.format import load_prepared
    from cifar10_kfp.train.distributed import Runtime
    from cifar10_kfp.tune.trial import StudyData

    dataset = load_prepared(data)
    slots: queue.Queue = queue.Queue()
    for each in trial_devices(device, concurrent):
        slots.put((StudyData.on_device(dataset, data, each), Runtime(device=each)))
    return slots


def run_study(values: Mapping[str, Any], data: str, output_dir: str | os.PathLike, *, study_uri: str,
              store: ObjectStore | None = None, concurrent: int | None = None) -> TuneResult:  # fmt: skip
    """Run (or resume) the study on the prepared dataset ``data``; write its outputs to ``output_dir``.

    ``concurrent``: how many trials run at once (default: one per visible GPU when the study runs
    on CUDA, else one).
    """
    import optuna

    from cifar10_kfp.train.distributed import resolve_device
    from cifar10_kfp.tune.report import write_outputs

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    space = parse_search_space(values["search_space"])
    base = trial_config(values, {})
    state = StudyState(study_uri, output_dir, store)
    resumed = state.download()
    study = open_study(values, state.path, base.epochs)
    requeued = requeue_interrupted(study)
    done = _finished(study)
    if resumed:
        log.info("resuming study %s: %d finished trial(s) kept, %d re-queued", state.uri, done, requeued)
    state.upload()
    slots = _device_slots(data, resolve_device(base.device), concurrent)
    objective = make_objective(values, space, slots, uuid.uuid4().hex[:12], on_start=state.upload)
    remaining = values["n_trials"] - done
    if remaining > 0:
        log.info("study: %d trial(s) to run, %d at a time", remaining, slots.qsize())
        study.optimize(
            objective, n_trials=remaining, timeout=values["timeout_s"] or None, n_jobs=slots.qsize(),
            callbacks=[lambda _study, _trial: state.upload()], gc_after_trial=True,
        )  # fmt: skip
    return write_outputs(study, values, output_dir, training_with)


def _finished(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
