"""The study: Optuna trials in this process, one per GPU at a time, its state in the object store.

``run_study(values, data, output_dir, study_uri=...)`` takes a tune pipeline's validated values
(``cifar10_kfp.params.validation.validate_pipeline_params(..., "tune")``): the training settings every trial
starts from, ``search_space``, ``n_trials``, ``budget_epochs``, ``timeout_s``, ``sampler``,
``pruner`` (with ``min_resource`` and ``reduction_factor``) and ``trial_epochs``. Each trial's
``TrainConfig`` is ``params.train_config(training, searched)``: the one pipeline -> config
mapping, with the trial's values on top. What a trial does and when the study stops (pruning,
repeated configurations, the epoch budget, a finished discrete space) is ``tune.objective``,
which the benchmark's replay (``tune.replay``) shares.

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
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cifar10_kfp.params import table as params
from cifar10_kfp.params.space import parse_search_space
from cifar10_kfp.tracking import open_tracker
from cifar10_kfp.tune.objective import device_trainer, make_objective, optimize, trial_config
from cifar10_kfp.tune.report import TuneResult

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.storage import ObjectStore

__all__ = ["run_study", "trial_config", "training_with", "create_study", "make_sampler", "make_pruner"]

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


def make_sampler(name: str, seed: int):
    """The sampler ``name`` (``params.SAMPLERS``) seeded with ``seed``."""
    import optuna

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":  # every configuration once, in a seeded random order; it stops the study when done
        with warnings.catch_warnings():  # Optuna marks it experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.BruteForceSampler(seed=seed)
    # multivariate: lr and label_smoothing interact; said outright, not left to Optuna's default
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5, multivariate=True)


def make_pruner(values: Mapping[str, Any], epochs: int):
    """The pruner ``values["pruner"]`` (``params.PRUNERS``) for trials of ``epochs`` epochs."""
    import optuna

    name = values["pruner"]
    if name == "asha":  # rungs at min_resource * reduction_factor**k epochs; 1 in reduction_factor goes on
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=values["min_resource"],
            reduction_factor=values["reduction_factor"],
            min_early_stopping_rate=0,
        )
    if name == "median":  # compare from the first epoch on, once two trials have finished
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(
            min_resource=values["min_resource"],
            max_resource=max(1, epochs),
            reduction_factor=values["reduction_factor"],
        )
    return optuna.pruners.NopPruner()


def _settings_key(values: Mapping[str, Any]) -> dict:
    keys = (*params.TRAINING_KEYS, "search_space", "sampler", "pruner", "min_resource", "reduction_factor",
            "trial_epochs")  # fmt: skip
    return {key: values[key] for key in keys}


def create_study(values: Mapping[str, Any], storage, epochs: int, *, sampler_seed: int | None = None):
    """The study with the pipeline's sampler and pruner in ``storage`` (created, or loaded when it exists).

    The sampler's seed is the training ``seed`` unless ``sampler_seed`` says otherwise (a replay).
    """
    import optuna

    seed = values["seed"] if sampler_seed is None else sampler_seed
    return optuna.create_study(
        study_name=STUDY_NAME, storage=storage, direction="maximize", load_if_exists=True,
        sampler=make_sampler(values["sampler"], seed), pruner=make_pruner(values, epochs),
    )  # fmt: skip


def open_study(values: Mapping[str, Any], journal: Path, epochs: int):
    """Create or load the study in ``journal``; refuse one made with other settings."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    study = create_study(
        values, JournalStorage(log_storage=JournalFileBackend(file_path=str(journal))), epochs
    )
    settings = _settings_key(values)
    saved = study.user_attrs.get(_SETTINGS_ATTR)
    if saved is None:
        study.set_user_attr(key=_SETTINGS_ATTR, value=settings)
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
        study._storage.set_trial_state_values(trial_id=trial._trial_id, state=TrialState.FAIL)
        study.enqueue_trial(params=trial.params, user_attrs={"rerun_of": trial.number})
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


def _device_slots(data: str, device, concurrent: int | None) -> queue.Queue:
    """One ``(StudyData, Runtime)`` per device of ``trial_devices``; the dataset file is read once."""
    from cifar10_kfp.data.shards import load_dataset
    from cifar10_kfp.train.distributed import Runtime
    from cifar10_kfp.tune.trial import StudyData

    dataset = load_dataset(data)
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
    # the data first: a dataset without a validation split is refused before the study exists
    slots = _device_slots(data, resolve_device(base.device), concurrent)
    state = StudyState(study_uri, output_dir, store)
    resumed = state.download()
    study = open_study(values, state.path, base.epochs)
    requeued = requeue_interrupted(study)
    if resumed:
        log.info(
            "resuming study %s: %d finished trial(s) kept, %d re-queued",
            state.uri,
            _finished(study),
            requeued,
        )
    state.upload()
    tracker = open_tracker("tune")
    tracker.start({"dataset_digest": slots.queue[0][0].dataset.source_digest, **_settings_key(values)})
    objective = make_objective(
        values, space, device_trainer(slots), uuid.uuid4().hex[:12], on_start=state.upload, tracker=tracker
    )
    try:
        optimize(study, objective, values, space, n_jobs=slots.qsize(), gc_after_trial=True,
                 callbacks=[lambda _study, _trial: state.upload()])  # fmt: skip
        result = write_outputs(study, values, output_dir, training_with)
    except BaseException:
        tracker.close("FAILED")
        raise
    tracker.final({"best_val_acc": result.best_value, **result.metrics})
    tracker.close()
    return result


def _finished(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
