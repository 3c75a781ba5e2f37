"""What a training run changes as it goes, and how it is built, saved and restored.

``TrainingState`` holds the model (bare, and as trained: DDP-wrapped and/or compiled), the
optimiser, the LR schedule, the grad scaler, the weight EMA, and the position: epochs done,
optimiser steps done, steps done inside the current epoch and that epoch's running loss sums.
``build_training_state`` makes it for a config; ``checkpoint_payload`` turns it into a
checkpoint's contents and ``restore_training_state`` loads one back; ``RunCheckpoints`` does both
for a run, when its ``CheckpointPolicy`` says so. Resuming from any
checkpoint, also one written in the middle of an epoch, continues bit for bit like an
uninterrupted run on one process: every random draw of the data path is a function of
(seed, epoch) and the global batch, and the global RNG states travel in the checkpoint.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from cifar10_kfp.train.checkpoint import (
    CheckpointClock,
    CheckpointManager,
    CheckpointPolicy,
    capture_rng_state,
    check_compatible,
    restore_rng_state,
)
from cifar10_kfp.train.config import TrainConfig
from cifar10_kfp.train.distributed import Runtime
from cifar10_kfp.train.inference import Normalize
from cifar10_kfp.train.models import build_model

if TYPE_CHECKING:  # annotation only
    from cifar10_kfp.train.outputs import RunClock

log = logging.getLogger(__name__)


class LinearSchedule:
    """LR multiplier per step: linear warm-up from ``start`` to 1, then linear decay to ``final``.

    A callable object (not a lambda) so ``LambdaLR.state_dict`` stores its plain fields. The
    step is the global optimiser step, so the schedule never depends on the number of processes.
    """

    def __init__(self, total_steps: int, warmup_steps: int, start: float, final: float, constant: bool):
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.start = float(start)
        self.final = float(final)
        self.constant = bool(constant)

    def __call__(self, step: int) -> float:
        if self.constant:
            return 1.0
        if step < self.warmup_steps:
            return self.start + (1.0 - self.start) * step / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return 1.0 + (self.final - 1.0) * progress


class ModelEMA:
    """Exponential moving average of the weights and buffers, updated every ``every`` steps."""

    def __init__(self, model: nn.Module, decay: float, every: int):
        self.decay = decay
        self.every = every
        self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: nn.Module, step: int, active: bool) -> None:
        if step % self.every:
            return
        weight = 1.0 - self.decay**self.every
        for key, value in model.state_dict().items():
            if active and value.is_floating_point():
                self.state[key].lerp_(value, weight)
            else:
                self.state[key].copy_(value)

    def state_dict(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.state.items()}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            self.state[key].copy_(value)


@dataclass
class EpochSums:
    """This rank's running training-loss and accuracy sums over the current epoch."""

    loss: torch.Tensor  # float32 scalar: sum over steps of (mean loss x images of the step)
    correct: torch.Tensor  # int64 scalar: correctly classified training images
    images: int = 0  # images these sums cover

    @classmethod
    def zeros(cls, device: torch.device) -> EpochSums:
        return cls(torch.zeros((), device=device), torch.zeros((), device=device, dtype=torch.long))

    def state_dict(self) -> dict:
        return {
            "loss": self.loss.detach().cpu(),
            "correct": self.correct.detach().cpu(),
            "images": self.images,
        }

    @classmethod
    def from_state(cls, state: dict, device: torch.device) -> EpochSums:
        return cls(state["loss"].to(device), state["correct"].to(device), int(state["images"]))


@dataclass
class TrainingState:
    """Model, optimisation state and position of one training run (one per process)."""

    net: nn.Module  # the bare model: what is checkpointed and exported
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    ema: ModelEMA | None
    sums: EpochSums
    train_model: nn.Module | None = None  # net as trained (DDP / torch.compile); set by wrap_for_training
    eval_net: nn.Module | None = None  # what is evaluated: net, or a copy holding the EMA weights
    epoch: int = 0  # epochs completed
    step: int = 0  # optimiser steps completed (global: the same on every rank, for any world size)
    step_in_epoch: int = 0  # steps of epoch ``epoch`` already done (> 0 after a mid-epoch resume)
    history: list[dict] = field(default_factory=list)  # one row per completed epoch
    resumed: dict | None = None  # where this process resumed: epoch, step, step_in_epoch, world_size, clock

    def finish_epoch(self, row: dict) -> None:
        """Record the epoch's row and move to the start of the next epoch."""
        self.history.append(row)
        self.epoch += 1
        self.step_in_epoch = 0
        self.sums = EpochSums.zeros(self.sums.loss.device)

    def evaluation_model(self) -> nn.Module:
        """The model to evaluate and export: the EMA weights when there is an EMA."""
        net = self.eval_net
        assert net is not None, "wrap_for_training sets eval_net"
        if self.ema is not None:
            net.load_state_dict(self.ema.state)
        return net


def model_identity(config: TrainConfig, num_classes: int, image_size: int) -> dict:
    """What a checkpoint must match to be resumed: the architecture and its shape-deciding settings."""
    return {
        "architecture": config.architecture,
        "num_classes": int(num_classes),
        "image_size": int(image_size),
        "model_config": config.model_config(),
    }


def build_model_for(config: TrainConfig, dataset, device: torch.device) -> nn.Module:
    """The freshly initialised model on ``device`` (with the whitening stem set from the data)."""
    net = build_model(config.architecture, dataset.num_classes, dataset.image_size, **config.model_config())
    init_whitening = getattr(net, "init_whitening", None)  # architectures with a whitening stem
    if config.whiten and init_whitening is not None:
        if hasattr(dataset, "train_sample"):  # a streamed dataset: a sample from a few seeded shards
            sample = torch.from_numpy(dataset.train_sample(config.whiten_samples, config.seed))
        else:  # a seeded random sample: prepared splits may be ordered by class
            generator = torch.Generator().manual_seed(config.seed)
            pick = torch.randperm(len(dataset.train_labels), generator=generator)
            rows = pick[: config.whiten_samples].sort().values.numpy()
            sample = torch.from_numpy(dataset.train_images[rows])
        init_whitening(Normalize(dataset.mean, dataset.std, torch.device("cpu"))(sample))
    memory_format = torch.channels_last if config.channels_last else torch.preserve_format
    # Module.to accepts memory_format (torch._C._nn._parse_to); torch's stub overloads omit it.
    return net.to(device=device, memory_format=memory_format)  # type: ignore[call-overload]


def build_training_state(
    config: TrainConfig, dataset, device: torch.device, steps_per_epoch: int
) -> TrainingState:
    """Model, SGD, LR schedule, grad scaler and EMA for ``config``, at the start of training."""
    net = build_model_for(config, dataset, device)
    trainable = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(
        trainable, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov,
        weight_decay=config.weight_decay,
    )  # fmt: skip
    schedule = LinearSchedule(
        total_steps=config.epochs * steps_per_epoch,
        warmup_steps=round(config.warmup_epochs * steps_per_epoch),
        start=config.start_lr_fraction,
        final=config.final_lr_fraction,
        constant=config.lr_schedule == "constant",
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    use_fp16_scaler = device.type == "cuda" and config.amp and config.amp_dtype == "float16"
    scaler = torch.amp.GradScaler(device.type, enabled=use_fp16_scaler)
    ema = ModelEMA(net, config.ema_decay, config.ema_every) if config.ema_decay > 0 else None
    return TrainingState(net, optimizer, scheduler, scaler, ema, EpochSums.zeros(device))


def wrap_for_training(state: TrainingState, config: TrainConfig, runtime: Runtime) -> None:
    """DDP across ranks, ``torch.compile`` on CUDA if asked, and the evaluation copy for the EMA."""
    device = runtime.device
    train_model: nn.Module = state.net
    if runtime.distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        train_model = torch.nn.parallel.DistributedDataParallel(state.net, device_ids=device_ids)
    if config.compile and device.type == "cuda":
        # An OptimizedModule, an nn.Module; torch's stub types torch.compile's result as a plain callable.
        train_model = torch.compile(train_model)  # type: ignore[assignment]
    state.train_model = train_model
    state.eval_net = copy.deepcopy(state.net) if state.ema is not None else state.net


# ---------------------------------------------------------------------------- checkpoints


def checkpoint_payload(
    state: TrainingState, config: TrainConfig, identity: dict, batch_size: int, world_size: int, clock: dict,
    stream_layout: dict | None = None,
) -> dict:  # fmt: skip
    """Everything needed to continue exactly from here (rank 0's view; weights are the same on all ranks)."""
    mid_epoch = state.step_in_epoch > 0
    return {
        "config": config.to_dict(),
        "model_identity": identity,
        "model": state.net.state_dict(),
        "ema": state.ema.state_dict() if state.ema is not None else None,
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "scaler": state.scaler.state_dict(),
        "rng": capture_rng_state(),
        "data_order": {
            "seed": config.seed,
            "next_epoch": state.epoch,
            "batch_size": batch_size,  # global: the position below only means something for this batch
            "step_in_epoch": state.step_in_epoch,
            # the streamed path: the position above is in this stream (stream.StreamedTrain.layout)
            **({"stream": stream_layout} if stream_layout is not None else {}),
        },
        "epoch_sums": state.sums.state_dict() if mid_epoch else None,
        "world_size": world_size,
        "clock": clock,
        "history": state.history,
    }


def restore_training_state(
    state: TrainingState,
    saved: dict,
    config: TrainConfig,
    identity: dict,
    batch_size: int,
    *,
    where: str,
    is_main: bool,
    stream_layout: dict | None = None,
) -> None:
    """Load a verified checkpoint into ``state`` (before ``wrap_for_training``); refuse a different model.

    A mid-epoch checkpoint's loss sums are rank 0's; only rank 0 takes them back, so that the
    epoch's all-reduced sums count every image once whatever the world size is now.
    """
    check_compatible(saved["model_identity"], identity, where)
    warn_config_changes(saved["config"], config)
    order = saved.get("data_order") or {}
    step_in_epoch = int(order.get("step_in_epoch", 0))
    if step_in_epoch and int(order.get("batch_size", batch_size)) != batch_size:
        raise ValueError(
            f"{where} stopped in the middle of an epoch trained with a global batch of {order.get('batch_size')} "
            f"images; this run's global batch is {batch_size}, so its position in the epoch means nothing here. "
            "Resume with the same batch_size, or use another checkpoint URI."
        )
    if step_in_epoch and order.get("stream") != stream_layout:
        raise ValueError(
            f"{where} stopped in the middle of an epoch read as {order.get('stream') or 'in memory'}; this run "
            f"reads {stream_layout or 'in memory'}, so its position in the epoch means nothing here. Resume with "
            "the same dataset, data_path, stream_partitions and shuffle_buffer, or use another checkpoint URI."
        )
    state.net.load_state_dict(saved["model"])
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.scaler.load_state_dict(saved["scaler"])
    if state.ema is not None and saved.get("ema") is not None:
        state.ema.load_state_dict(saved["ema"])
    restore_rng_state(saved["rng"])
    state.epoch, state.step, state.step_in_epoch = int(saved["epoch"]), int(saved["step"]), step_in_epoch
    if step_in_epoch and saved.get("epoch_sums") and is_main:
        state.sums = EpochSums.from_state(saved["epoch_sums"], state.sums.loss.device)
    state.history = list(saved.get("history", []))
    state.resumed = {
        "epoch": state.epoch,
        "step": state.step,
        "step_in_epoch": step_in_epoch,
        "world_size": int(saved.get("world_size", 1)),
        "clock": saved.get("clock"),
    }


def warn_config_changes(saved: dict, config: TrainConfig) -> None:
    current = config.to_dict()
    changed = {
        k: (saved.get(k), v)
        for k, v in current.items()
        if saved.get(k) != v and k not in config.RUNTIME_FIELDS
    }
    if changed:
        log.warning("resuming with a changed training config: %s", changed)


class RunCheckpoints:
    """Resume from and write a run's checkpoints, per ``CheckpointPolicy`` (rank 0 writes)."""

    def __init__(self, uri: str, config: TrainConfig, identity: dict, batch_size: int, steps_per_epoch: int,
                 runtime: Runtime, *, stream_layout: dict | None = None):  # fmt: skip
        self.manager = CheckpointManager(uri, keep=config.keep_checkpoints) if uri else None
        self.policy = CheckpointPolicy(
            config.checkpoint_every, getattr(config, "checkpoint_every_steps", 0),
            getattr(config, "checkpoint_every_s", 0.0),
        )  # fmt: skip
        self.config, self.identity, self.runtime = config, identity, runtime
        self.batch_size, self.steps_per_epoch = batch_size, steps_per_epoch
        self.stream_layout = stream_layout
        self.clock = CheckpointClock()
        self.run_clock: RunClock | None = None  # the run's RunClock, set by the epoch loop
        self.epoch_started = time.perf_counter()

    def resume(self, state: TrainingState) -> None:
        """Load the newest checkpoint under the URI into ``state``, if there is one."""
        if self.manager is None:
            return
        saved = self.manager.load_latest()
        if saved is None:
            return
        restore_training_state(
            state, saved, self.config, self.identity, self.batch_size, where=self.manager.uri,
            is_main=self.runtime.is_main, stream_layout=self.stream_layout,
        )  # fmt: skip
        self.clock.reset()
        if not self.runtime.is_main:
            return
        where = f" + {state.step_in_epoch} steps" if state.step_in_epoch else ""
        log.info("resuming from %s at epoch %d%s (step %d)", self.manager.uri, state.epoch, where, state.step)
        assert state.resumed is not None  # set by restore_training_state
        before = state.resumed["world_size"]
        if before != self.runtime.world_size:
            log.warning(
                "membership change: the checkpoint was written by %d process(es), %d train now; the global "
                "batch (%d), data order and LR schedule go on unchanged from step %d",
                before, self.runtime.world_size, self.batch_size, state.step,
            )  # fmt: skip

    def after_step(self, state: TrainingState) -> None:
        """Inside an epoch: write a checkpoint when the step or time interval has come round."""
        if self.manager is None or not self.runtime.is_main:
            return
        if state.step_in_epoch >= self.steps_per_epoch:
            return  # the epoch's end decides, after the evaluation
        if self.policy.interval_due(state.step, self.clock.since_last_s()):
            self._save(state, mid_epoch=True)

    def at_epoch_end(self, state: TrainingState) -> None:
        """After an epoch's row is recorded: write a checkpoint if the policy says so."""
        if self.manager is not None and self.runtime.is_main:
            is_last = state.epoch == self.config.epochs
            due = self.policy.epoch_end_due(state.epoch, is_last)
            if due or self.policy.interval_due(state.step, self.clock.since_last_s()):
                self._save(state, mid_epoch=False)
        if self.runtime.distributed:
            torch.distributed.barrier()

    def _save(self, state: TrainingState, *, mid_epoch: bool) -> None:
        epoch_train_s = time.perf_counter() - self.epoch_started if mid_epoch else 0.0
        clock: dict = self.run_clock.snapshot(epoch_train_s) if self.run_clock is not None else {}
        payload = checkpoint_payload(
            state,
            self.config,
            self.identity,
            self.batch_size,
            self.runtime.world_size,
            clock,
            self.stream_layout,
        )
        assert self.manager is not None  # _save is called only with a checkpoint URI
        self.manager.save(payload, epoch=state.epoch, step=state.step, mid_epoch=mid_epoch)
        self.clock.reset()
