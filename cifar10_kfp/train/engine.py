"""The training engine: ``train_one_epoch``, ``evaluate`` and ``train``.

Shape follows torchvision's references; the data path follows airbench: the whole dataset sits on
the device as uint8, padded once so that every step's augmented batch is one gather, then
normalised in one batched pass (``cifar10_kfp.train.augment``). Determinism: the data order and
augmentations come from a generator seeded by (seed, epoch) and drawn for the global batch, of
which each rank trains its share; on CPU a seed gives bitwise-identical weights, and a run
resumed from a checkpoint (at an epoch's end or inside one) ends bitwise equal to an
uninterrupted one. On CUDA, ``deterministic=True`` sets ``torch.use_deterministic_algorithms(True)``,
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` and ``cudnn.benchmark=False`` (as close as PyTorch allows; the
``fast`` preset turns it off for speed).

``train(config, data, output_dir)`` writes ``output_dir/model/`` (a model directory loadable with
``cifar10_kfp.train.models`` alone), ``history.json`` (one dict per epoch) and ``metrics.json``.
With ``nproc > 1`` or a multi-node ``Rendezvous`` it launches workers through torchrun (gloo on
CPU, nccl on GPU); with ``Rendezvous(nnodes="MIN:MAX")`` the run is elastic (docs/multi-node.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:  # annotation only: the data stage is imported where a dataset is loaded
    from cifar10_kfp.data.format import PreparedDataset
    from cifar10_kfp.storage import ObjectStore
    from cifar10_kfp.train.stream import StreamedDataset, StreamedSplit, StreamedTrain

from cifar10_kfp.tracking import Tracker, open_tracker
from cifar10_kfp.train.augment import DeviceData, TrainBatches, training_batches
from cifar10_kfp.train.config import TrainConfig
from cifar10_kfp.train.curves import TrainingCurves
from cifar10_kfp.train.distributed import (
    Rendezvous,
    Runtime,
    all_reduce_sum,
    check_replicas_agree,
    default_nproc,
    in_torchrun_worker,
    launch,
    setup_runtime,
    teardown,
)
from cifar10_kfp.train.inference import Normalize, predict
from cifar10_kfp.train.outputs import (
    METRICS_FILE,
    MODEL_SUBDIR,
    ProgressPrinter,
    RunClock,
    epoch_row,
    export_outputs,
    final_metrics,
    read_outputs,
    tracked_params,
)
from cifar10_kfp.train.state import (
    RunCheckpoints,
    TrainingState,
    build_training_state,
    model_identity,
    wrap_for_training,
)

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What ``train`` produced (on a node of a multi-node run that did not hold rank 0: nothing)."""

    model_dir: Path
    history: list[dict]
    metrics: dict
    config: TrainConfig
    checkpoint_uri: str = ""
    output_dir: Path = field(default_factory=Path)
    wrote_outputs: bool = True  # False on the other nodes of a multi-node run: rank 0's node has them


def default_checkpoint_uri(run_id: str, config: TrainConfig, store: ObjectStore | None = None) -> str:
    """``<store root>/checkpoints/<run_id>/<config hash>``: a retry of the same run and config resumes.

    The root is ``store``'s, else the one configured in the environment.
    """
    from cifar10_kfp.storage import root_uri

    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", str(run_id)).strip("-.")
    if not safe:
        raise ValueError(
            f"run_id {run_id!r} is empty or has no usable characters; pass a run id or a checkpoint URI"
        )
    return (store.root_uri if store is not None else root_uri)("checkpoints", safe, config.config_hash())


# ---------------------------------------------------------------------------- set-up


def global_batch_size(config: TrainConfig, n_train: int, world_size: int) -> int:
    """The configured global batch, capped at the training set; never dependent on the world size.

    Each rank trains its share of it (``augment.rank_share``), so the steps per epoch, the LR
    schedule and the data order are the same for any number of processes.
    """
    batch = min(config.batch_size, n_train)
    if batch < world_size:
        raise ValueError(
            f"a global batch of {batch} images (training split {n_train}) is too small for {world_size} processes"
        )
    if batch != config.batch_size:
        log.warning("batch_size %d -> %d (training split %d images)", config.batch_size, batch, n_train)
    return batch


def autocast_context(config: TrainConfig, device: torch.device):
    """bf16 (or fp16) autocast on CUDA; fp32 elsewhere."""
    if device.type == "cuda" and config.amp:
        return torch.autocast("cuda", dtype=getattr(torch, config.amp_dtype))
    return contextlib.nullcontext()


def configure_determinism(config: TrainConfig, device: torch.device) -> None:
    if device.type == "cuda":
        if config.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = not config.deterministic
        torch.backends.cudnn.deterministic = config.deterministic
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    torch.use_deterministic_algorithms(config.deterministic, warn_only=device.type == "cuda")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class RunData:
    """The dataset of a run, on the device (or streamed to it) and laid out for training and evaluation."""

    dataset: PreparedDataset | StreamedDataset
    train: TrainBatches | StreamedTrain
    eval: DeviceData | StreamedSplit
    eval_split: str
    normalizer: Normalize
    batch_size: int  # global images per step
    steps_per_epoch: int
    stream_layout: dict | None = None  # the streamed path's layout, kept in checkpoints; None in memory


def load_run_data(config: TrainConfig, data: str, runtime: Runtime) -> RunData:
    from cifar10_kfp.train.stream import StreamedDataset, StreamedSplit, StreamedTrain, open_dataset

    device = runtime.device
    path, dataset = open_dataset(config, data)
    eval_split = config.eval_split
    if eval_split == "val" and len(dataset.val_labels) == 0:
        log.info("validation split is empty: evaluating on the test split after every epoch")
        eval_split = "test"
    train_data: TrainBatches | StreamedTrain
    eval_data: DeviceData | StreamedSplit
    if isinstance(dataset, StreamedDataset):
        train_data = StreamedTrain(dataset.index, dataset.store, config, device)
        train_data.check_world(runtime.world_size)  # refused here, before any step, not in the first epoch
        eval_data = StreamedSplit(dataset.index, eval_split, dataset.store, device)
    else:
        train_data = training_batches(dataset.train_images, dataset.train_labels, config, device)
        eval_data = DeviceData.from_numpy(*dataset.split(eval_split), device)
    if len(eval_data) == 0:
        raise ValueError(f"the {eval_split!r} split of {data} is empty: nothing to evaluate on")
    normalizer = Normalize(dataset.mean, dataset.std, device, channels_last=config.channels_last)
    batch_size = global_batch_size(config, len(train_data), runtime.world_size)
    layout = train_data.layout if isinstance(train_data, StreamedTrain) else None
    if runtime.is_main:
        log.info("data path: %s (%s)", path, data)
    return RunData(dataset, train_data, eval_data, eval_split, normalizer, batch_size,
                   train_data.steps(batch_size), layout)  # fmt: skip


# -------------------------------------------------------------------- train / eval


def train_one_epoch(
    state: TrainingState,
    data: TrainBatches | StreamedTrain,
    normalizer: Normalize,
    config: TrainConfig,
    batch_size: int,
    runtime: Runtime,
    *,
    after_step: Callable[[TrainingState], None] | None = None,
    show_bar: bool = False,
) -> dict:
    """Train epoch ``state.epoch`` from step ``state.step_in_epoch`` on; returns its mean loss/acc/images.

    Every rank trains its share of each global batch. With unequal shares (a global batch not
    divisible by the world size) each rank's loss is weighted by its share, so that DDP's gradient
    average is the gradient of the global batch's mean loss, as on one process.
    """
    model = state.net if state.train_model is None else state.train_model
    model.train()
    autocast = autocast_context(config, runtime.device)
    ema_active = state.epoch >= config.ema_start_epoch
    batches = data.epoch(
        config.seed, state.epoch, batch_size, runtime.rank, runtime.world_size, start_step=state.step_in_epoch
    )
    if show_bar:
        from tqdm import tqdm

        steps_left = data.steps(batch_size) - state.step_in_epoch
        batches = tqdm(
            batches, total=steps_left, desc=f"epoch {state.epoch + 1}", leave=False, dynamic_ncols=True
        )
    sums = state.sums
    for images, targets in batches:
        local = len(targets)
        weight = local * runtime.world_size / batch_size
        inputs = normalizer(images)
        with autocast:
            logits = model(inputs)
            loss = F.cross_entropy(logits, targets, label_smoothing=config.label_smoothing)
        state.optimizer.zero_grad(set_to_none=True)
        state.scaler.scale(loss if weight == 1 else loss * weight).backward()
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.scheduler.step()
        state.step += 1
        state.step_in_epoch += 1
        if state.ema is not None:
            state.ema.update(state.net, state.step, ema_active)
        sums.loss += loss.detach().float() * local
        sums.correct += (logits.detach().argmax(dim=1) == targets).sum()
        sums.images += local
        if after_step is not None:
            after_step(state)
    totals = torch.stack(
        [sums.loss.double(), sums.correct.double(), torch.tensor(float(sums.images), device=runtime.device)]
    )
    loss_sum, correct, images = all_reduce_sum(totals.double(), runtime).tolist()
    return {"train_loss": loss_sum / images, "train_acc": correct / images, "images": int(images)}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: DeviceData | StreamedSplit,
    normalizer: Normalize,
    *,
    batch_size: int = 1024,
    tta: bool = False,
    autocast=None,
) -> dict:
    """Mean cross-entropy and accuracy on a split, of ``inference.predict`` (``tta``: flip TTA as served)."""
    model.eval()
    device = normalizer.scale.device
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for images, targets in data.batches(batch_size):
        inputs = normalizer(images)
        with autocast or contextlib.nullcontext():
            logits = predict(model, inputs, tta=tta)
        loss_sum += F.cross_entropy(logits, targets, reduction="sum").double()
        correct += (logits.argmax(dim=1) == targets).sum()
    n = max(1, len(data))
    return {"loss": loss_sum.item() / n, "acc": correct.item() / n, "n": len(data)}


# --------------------------------------------------------------------------- train


def train(
    config: TrainConfig,
    data_path_or_uri: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    checkpoint_uri: str = "",
    nproc: int = 1,
    rendezvous: Rendezvous | None = None,
) -> TrainResult:
    """Train per ``config`` on a prepared dataset; write model/, history.json and metrics.json.

    ``checkpoint_uri`` (``s3://...`` or a local directory) enables checkpoints and resume.
    ``nproc > 1`` runs that many DDP processes under torchrun; 0 means one per visible GPU.
    ``rendezvous`` makes this process one node of a multi-node (or elastic) run: every node
    calls ``train`` with the same arguments, and the node that holds rank 0 at the end writes
    the outputs (``TrainResult.wrote_outputs``).
    """
    output_dir = Path(output_dir)
    nproc = default_nproc(nproc)
    multi_node = rendezvous is not None and rendezvous.multi_node
    if (nproc > 1 or multi_node) and not in_torchrun_worker():
        if multi_node and not checkpoint_uri:
            raise ValueError("a multi-node run needs a checkpoint URI: it is how nodes that rejoin catch up")
        spec = {"config": config.to_dict(), "data": str(data_path_or_uri), "output_dir": str(output_dir),
                "checkpoint_uri": checkpoint_uri}  # fmt: skip
        launch(nproc, spec, rendezvous)
        if multi_node and not (output_dir / METRICS_FILE).exists():
            return TrainResult(output_dir / MODEL_SUBDIR, [], {}, config, checkpoint_uri, output_dir, False)
        history, metrics = read_outputs(output_dir)
        return TrainResult(output_dir / MODEL_SUBDIR, history, metrics, config, checkpoint_uri, output_dir)
    return train_in_this_process(config, str(data_path_or_uri), output_dir, checkpoint_uri)


def train_in_this_process(
    config: TrainConfig, data: str, output_dir: Path, checkpoint_uri: str
) -> TrainResult:
    """The training run of this process: one rank of a torchrun group, or the only process."""
    process_start = time.perf_counter()
    runtime = setup_runtime(config.device)
    tracker = Tracker()  # does nothing: the run's own is opened once its data is loaded
    try:
        configure_determinism(config, runtime.device)
        if config.threads and runtime.device.type == "cpu":
            torch.set_num_threads(config.threads)
        seed_everything(config.seed)
        run = load_run_data(config, data, runtime)
        if runtime.is_main:
            log.info(
                "training on %d process(es) (%s): global batch %d, %d steps per epoch",
                runtime.world_size, runtime.device, run.batch_size, run.steps_per_epoch,
            )  # fmt: skip
        state = build_training_state(config, run.dataset, runtime.device, run.steps_per_epoch)
        identity = model_identity(config, run.dataset.num_classes, run.dataset.image_size)
        checkpoints = RunCheckpoints(
            checkpoint_uri, config, identity, run.batch_size, run.steps_per_epoch, runtime,
            stream_layout=run.stream_layout,
        )  # fmt: skip
        checkpoints.resume(state)
        wrap_for_training(state, config, runtime)
        clock = RunClock(state.history, (state.resumed or {}).get("clock"), process_start)
        tracker = open_tracker("train", progress=True) if runtime.is_main else Tracker()
        tracker.start(
            tracked_params(config, run.dataset, run.eval_split, run.batch_size, run.steps_per_epoch)
        )
        fit(state, run, config, runtime, checkpoints, clock, tracker=tracker)
        check_replicas_agree(state.net, runtime)
        metrics = final_metrics(
            config, state.history, clock, steps=state.step, eval_split=run.eval_split,
            resumed_from_epoch=(state.resumed or {}).get("epoch", 0), world_size=runtime.world_size,
            device=str(runtime.device), num_parameters=sum(p.numel() for p in state.net.parameters()),
        )  # fmt: skip
        tracker.final(metrics)
        model = state.evaluation_model()
        if runtime.is_main:
            weights = "ema" if state.ema is not None else "final"
            export_outputs(output_dir, model, config, run.dataset, state.history, metrics, weights=weights)
        tracker.close("FINISHED")
        return TrainResult(
            output_dir / MODEL_SUBDIR, state.history, metrics, config, checkpoint_uri, output_dir
        )
    finally:
        tracker.close("FAILED")  # a no-op after the close above
        teardown(runtime)


def fit(state: TrainingState, run: RunData, config: TrainConfig, runtime: Runtime, checkpoints: RunCheckpoints,
        clock: RunClock, on_epoch: Callable[[dict], None] | None = None, tracker: Tracker | None = None) -> None:  # fmt: skip
    """The epoch loop: train, evaluate, record, checkpoint, until ``config.epochs`` are done.

    ``on_epoch(row)`` runs after each epoch's history row; an exception it raises (a tuning
    trial's ``optuna.TrialPruned``) ends the loop there. ``tracker`` gets each row next to the
    epoch line (MLflow, TrainJob status; ``cifar10_kfp.tracking``).
    """
    track = tracker or Tracker()
    after_step = track.around_step(checkpoints.after_step, config.epochs * run.steps_per_epoch)
    printer = ProgressPrinter(config.progress and runtime.is_main, config.epochs)
    show_bar = config.progress and runtime.is_main and sys.stdout.isatty()
    autocast = autocast_context(config, runtime.device)
    checkpoints.run_clock = clock
    curves = TrainingCurves(checkpoints.manager.uri if checkpoints.manager else "", enabled=runtime.is_main)
    try:  # the curves are closed (their last copy made) however training ends
        while state.epoch < config.epochs:
            epoch_start = checkpoints.epoch_started = time.perf_counter()
            stats = train_one_epoch(
                state, run.train, run.normalizer, config, run.batch_size, runtime,
                after_step=after_step, show_bar=show_bar,
            )  # fmt: skip
            if runtime.device.type == "cuda":
                torch.cuda.synchronize(runtime.device)
            train_s = clock.epoch_done(time.perf_counter() - epoch_start)
            result = evaluate(
                state.evaluation_model(), run.eval, run.normalizer, batch_size=config.eval_batch_size,
                tta=config.tta, autocast=autocast,
            )  # fmt: skip
            lr = state.optimizer.param_groups[0]["lr"]
            row = epoch_row(
                state.epoch + 1, stats, result, lr, train_s, clock, state.step, runtime.world_size
            )
            state.finish_epoch(row)
            eta_s = clock.eta_s(config.epochs - state.epoch)
            printer(row, eta_s)
            track.epoch(row, config.epochs, eta_s)
            curves.epoch(row)
            checkpoints.at_epoch_end(state)
            if on_epoch is not None:
                on_epoch(row)
    finally:
        curves.close()


__all__ = [
    "TrainResult",
    "train",
    "train_one_epoch",
    "evaluate",
    "default_checkpoint_uri",
]
