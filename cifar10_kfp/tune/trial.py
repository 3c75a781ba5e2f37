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
        from cifar10_kfp.data.format import load_prepared

        return cls.on_device(load_prepared(data), data, runtime.device)

    @classmethod
    def on_device(cls, dataset, data: str, device) -> StudyData:
        """``dataset`` (read from ``data``) with its training and scoring splits copied to ``device``."""
        eval_split = "val" if len(dataset.val_labels) else "test"
        train = DeviceData.from_numpy(dataset.train_images, dataset.train_labels, device)
        eval_images, eval_labels = dataset.split(eval_split)
        evaluation = DeviceData.from_numpy(eval_images, eval_labels, device)
        if len(evaluation) == 0:
            raise ValueError(
                f"the {eval_split!r} split of {data} is empty: trials have nothing to be scored on"
            )
        return cls(dataset, train, evaluation, eval_split)

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
    """Train ``config`` (its ``epochs``); ``on_epoch(row)`` after every epoch may raise to stop it. The history."""
    start = time.perf_counter()
    configure_determinism(config, runtime.device)
    seed_everything(config.seed)
    run = data.run_data(config, runtime)
    state = build_training_state(config, run.dataset, runtime.device, run.steps_per_epoch)
    identity = model_identity(config, run.dataset.num_classes, run.dataset.image_size)
    no_checkpoints = RunCheckpoints("", config, identity, run.batch_size, run.steps_per_epoch, runtime)
    wrap_for_training(state, config, runtime)
    fit(state, run, config, runtime, no_checkpoints, RunClock(state.history, None, start), on_epoch=on_epoch)
    return state.history
