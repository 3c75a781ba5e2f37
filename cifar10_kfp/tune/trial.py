"""One tuning trial: train a ``TrainConfig`` on data that is already on the device, reporting each epoch.

The dataset is read and copied to the device once per study (``StudyData``); each trial lays the
same device tensors out for its own augmentations (``TrainBatches`` over them) and trains with
the engine's own epoch loop (``cifar10_kfp.train.engine.fit``), without checkpoints: a trial is short,
and the study's state, not the trial's weights, is what survives a retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cifar10_kfp.train.augment import DeviceData, TrainBatches
from cifar10_kfp.train.config import TrainConfig
from cifar10_kfp.train.distributed import Runtime
from cifar10_kfp.train.engine import RunData, configure_determinism, fit, global_batch_size, seed_everything
from cifar10_kfp.train.inference import Normalize
from cifar10_kfp.train.outputs import RunClock
from cifar10_kfp.train.state import RunCheckpoints, build_training_state, model_identity, wrap_for_training

if TYPE_CHECKING:  # annotation only
    from cifar10_kfp.data.format import PreparedDataset


@dataclass
class StudyData:
    """The prepared dataset, its training and validation splits on the device, loaded once per study."""

    dataset: PreparedDataset
    train: DeviceData
    eval: DeviceData
    eval_split: str

    @classmethod
    def load(cls, data: str, runtime: Runtime) -> StudyData:
        from cifar10_kfp.data.shards import load_dataset

        return cls.on_device(load_dataset(data), data, runtime.device)

    @classmethod
    def on_device(cls, dataset, data: str, device) -> StudyData:
        """``dataset`` (read from ``data``) with its training and validation splits copied to ``device``.

        Trials are scored on the validation split only; the test split, which gates publication,
        is never read here, and a dataset without a validation split is refused.
        """
        if len(dataset.val_labels) == 0:
            raise ValueError(
                f"{data} has no validation split (prepared with val_fraction=0): tuning scores trials on the "
                "validation split, never on the test split; prepare it again with val_fraction > 0, e.g. 0.1"
            )
        train = DeviceData.from_numpy(dataset.train_images, dataset.train_labels, device)
        evaluation = DeviceData.from_numpy(dataset.val_images, dataset.val_labels, device)
        return cls(dataset, train, evaluation, "val")

    def run_data(self, config: TrainConfig, runtime: Runtime) -> RunData:
        """This trial's view of the device data: its augmentation layout, normaliser and batch."""
        batches = TrainBatches(
            self.train.images, self.train.labels, max_shift=config.translate, flip=config.flip,
            channels_last=config.channels_last,
        )  # fmt: skip
        normalizer = Normalize(
            self.dataset.mean, self.dataset.std, runtime.device, channels_last=config.channels_last
        )
        batch = global_batch_size(config, len(batches), runtime.world_size)
        return RunData(
            self.dataset, batches, self.eval, self.eval_split, normalizer, batch, len(batches) // batch
        )


def train_trial(
    config: TrainConfig, data: StudyData, runtime: Runtime, on_epoch: Callable[[dict], None]
) -> list[dict]:
    """Train ``config`` (its ``epochs``); ``on_epoch(row)`` after every epoch may raise to stop it. The history.

    Each row also has ``trial_s``, the seconds since the trial began: the first row's ``trial_s``
    less its ``train_s`` is the trial's fixed cost (building the model, whitening, the first evaluation).
    """
    start = time.perf_counter()

    def timed(row: dict) -> None:
        row["trial_s"] = round(time.perf_counter() - start, 4)
        on_epoch(row)

    configure_determinism(config, runtime.device)
    seed_everything(config.seed)
    run = data.run_data(config, runtime)
    state = build_training_state(config, run.dataset, runtime.device, run.steps_per_epoch)
    identity = model_identity(config, run.dataset.num_classes, run.dataset.image_size)
    no_checkpoints = RunCheckpoints("", config, identity, run.batch_size, run.steps_per_epoch, runtime)
    wrap_for_training(state, config, runtime)
    fit(state, run, config, runtime, no_checkpoints, RunClock(state.history, None, start), on_epoch=timed)
    return state.history
