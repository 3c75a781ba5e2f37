"""The training engine: ``train_one_epoch``, ``evaluate``, ``train`` and the command line.

Shape follows torchvision's references; the data path follows airbench: the whole dataset sits on
the device as uint8, padded once so that every step's augmented batch is one gather, then
normalised in one batched pass (``cifar10_kfp.augment``). Determinism: the data order and
augmentations come from a generator seeded by (seed, epoch); on CPU a seed gives bitwise-identical
weights, and a run resumed from a checkpoint ends bitwise equal to an uninterrupted one. On
CUDA, ``deterministic=True`` sets ``torch.use_deterministic_algorithms(True)``,
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` and ``cudnn.benchmark=False`` (as close as PyTorch allows; the
``fast`` preset turns it off for speed).

``train(config, data, output_dir)`` writes ``output_dir/model/`` (a model directory loadable with
``cifar10_kfp.models`` alone), ``history.json`` (one dict per epoch) and ``metrics.json``.
With ``nproc > 1`` it launches DDP workers through torchrun (gloo on CPU, nccl on GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cifar10_kfp.augment import Normalizer, TrainBatches
from cifar10_kfp.checkpoint import CheckpointManager, capture_rng_state, check_compatible, restore_rng_state
from cifar10_kfp.config import TrainConfig
from cifar10_kfp.distributed import (
    Runtime,
    all_reduce_sum,
    default_nproc,
    in_torchrun_worker,
    launch,
    setup_runtime,
    teardown,
)
from cifar10_kfp.models import ModelInfo, build_model, save_model

log = logging.getLogger(__name__)

HISTORY_FILE = "history.json"
METRICS_FILE = "metrics.json"
MODEL_SUBDIR = "model"


@dataclass
class TrainResult:
    """What ``train`` produced."""

    model_dir: Path
    history: list[dict]
    metrics: dict
    config: TrainConfig
    checkpoint_uri: str = ""
    output_dir: Path = field(default_factory=Path)


def default_checkpoint_uri(run_id: str, config: TrainConfig, store=None) -> str:
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


# ------------------------------------------------------------------------- pieces


class LinearSchedule:
    """LR multiplier per step: linear warm-up from ``start`` to 1, then linear decay to ``final``.

    A callable object (not a lambda) so ``LambdaLR.state_dict`` stores its plain fields.
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
class DeviceData:
    """One split on the device: uint8 images and int64 labels."""

    images: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def from_numpy(cls, images: np.ndarray, labels: np.ndarray, device: torch.device) -> DeviceData:
        return cls(
            torch.from_numpy(np.ascontiguousarray(images)).to(device), torch.from_numpy(labels).to(device)
        )

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def training_batches(
    images: np.ndarray, labels: np.ndarray, config: TrainConfig, device: torch.device
) -> TrainBatches:
    """The training split on ``device``, laid out for ``config``'s augmentations and memory format."""
    return TrainBatches(
        torch.from_numpy(np.ascontiguousarray(images)).to(device),
        torch.from_numpy(labels).to(device),
        max_shift=config.translate,
        flip=config.flip,
        channels_last=config.channels_last,
    )


def global_batch_size(config: TrainConfig, n_train: int, world_size: int) -> int:
    """The configured batch, capped at the training set and rounded down to a multiple of the ranks."""
    batch = min(config.batch_size, n_train)
    batch -= batch % world_size
    if batch < world_size:
        raise ValueError(f"training split has {n_train} images: too few for {world_size} processes")
    if batch != config.batch_size:
        log.warning(
            "batch_size %d -> %d (training split %d images, %d ranks)",
            config.batch_size,
            batch,
            n_train,
            world_size,
        )
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


# -------------------------------------------------------------------- train / eval


def train_one_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    scaler,
    ema: ModelEMA | None,
    ema_target: nn.Module,
    data: TrainBatches,
    normalizer: Normalizer,
    config: TrainConfig,
    epoch: int,
    step: int,
    batch_size: int,
    runtime: Runtime,
    show_bar: bool = False,
) -> tuple[dict, int]:
    """One pass over the training split; returns (mean loss/acc/images, new global step)."""
    model.train()
    steps = len(data) // batch_size
    local = batch_size // runtime.world_size
    device = runtime.device
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    autocast = autocast_context(config, device)
    ema_active = epoch >= config.ema_start_epoch
    batches = data.epoch(config.seed, epoch, batch_size, runtime.rank, runtime.world_size)
    if show_bar:
        from tqdm import tqdm

        batches = tqdm(batches, total=steps, desc=f"epoch {epoch + 1}", leave=False, dynamic_ncols=True)
    for images, targets in batches:
        inputs = normalizer(images)
        with autocast:
            logits = model(inputs)
            loss = F.cross_entropy(logits, targets, label_smoothing=config.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        step += 1
        if ema is not None:
            ema.update(ema_target, step, ema_active)
        loss_sum += loss.detach().float() * local
        correct += (logits.detach().argmax(dim=1) == targets).sum()
    totals = torch.stack(
        [loss_sum.double(), correct.double(), torch.tensor(float(steps * local), device=device)]
    )
    totals = all_reduce_sum(totals.double(), runtime).tolist()
    return {
        "train_loss": totals[0] / totals[2],
        "train_acc": totals[1] / totals[2],
        "images": int(totals[2]),
    }, step


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: DeviceData,
    normalizer: Normalizer,
    *,
    batch_size: int = 1024,
    tta: bool = False,
    autocast=None,
) -> dict:
    """Mean cross-entropy and accuracy on a split; with ``tta`` the logits of x and flip(x) are averaged."""
    model.eval()
    loss_sum = torch.zeros((), device=data.labels.device, dtype=torch.float64)
    correct = torch.zeros((), device=data.labels.device, dtype=torch.long)
    for lo in range(0, len(data), batch_size):
        inputs = normalizer(data.images[lo : lo + batch_size])
        targets = data.labels[lo : lo + batch_size]
        with autocast or contextlib.nullcontext():
            logits = model(inputs).float()
            if tta:
                logits = (logits + model(inputs.flip(-1)).float()) / 2
        loss_sum += F.cross_entropy(logits, targets, reduction="sum").double()
        correct += (logits.argmax(dim=1) == targets).sum()
    n = max(1, len(data))
    return {"loss": loss_sum.item() / n, "acc": correct.item() / n, "n": len(data)}


# ----------------------------------------------------------------------- progress


class ProgressPrinter:
    """One fixed-column line per epoch (rank 0)."""

    HEADER = (
        f"{'epoch':>9} {'train_loss':>10} {'train_acc':>9} {'val_acc':>8} {'lr':>9} "
        f"{'img/s':>9} {'elapsed':>9} {'eta':>9}"
    )

    def __init__(self, enabled: bool, total_epochs: int, stream=None):
        self.enabled = enabled
        self.total = total_epochs
        self.stream = stream or sys.stdout
        self.printed_header = False

    def line(self, row: dict, eta_s: float) -> str:
        epoch = f"{row['epoch']}/{self.total}"
        return (
            f"{epoch:>9} {row['train_loss']:>10.4f} {100 * row['train_acc']:>8.2f}% {100 * row['val_acc']:>7.2f}% "
            f"{row['lr']:>9.2e} {row['images_per_s']:>9.1f} {row['elapsed_s']:>8.1f}s {eta_s:>8.1f}s"
        )

    def __call__(self, row: dict, eta_s: float) -> None:
        if not self.enabled:
            return
        if not self.printed_header:
            print(self.HEADER, file=self.stream, flush=True)
            self.printed_header = True
        print(self.line(row, eta_s), file=self.stream, flush=True)


# --------------------------------------------------------------------------- train


def _model_identity(config: TrainConfig, num_classes: int, image_size: int) -> dict:
    return {
        "architecture": config.architecture,
        "num_classes": int(num_classes),
        "image_size": int(image_size),
        "model_config": config.model_config(),
    }


def _pick_eval_split(dataset, config: TrainConfig) -> str:
    split = config.eval_split
    if split == "val" and len(dataset.val_labels) == 0:
        log.info("validation split is empty: evaluating on the test split after every epoch")
        split = "test"
    return split


def train(
    config: TrainConfig,
    data_path_or_uri: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    checkpoint_uri: str = "",
    nproc: int = 1,
) -> TrainResult:
    """Train per ``config`` on a prepared dataset; write model/, history.json and metrics.json.

    ``checkpoint_uri`` (``s3://...`` or a local directory) enables checkpoints and resume.
    ``nproc > 1`` runs that many DDP processes under torchrun; 0 means one per visible GPU.
    """
    output_dir = Path(output_dir)
    nproc = default_nproc(nproc)
    if nproc > 1 and not in_torchrun_worker():
        launch(nproc, config.to_dict(), str(data_path_or_uri), output_dir, checkpoint_uri)
        return _read_result(config, output_dir, checkpoint_uri)
    return _train_process(config, str(data_path_or_uri), output_dir, checkpoint_uri)


def _read_result(config: TrainConfig, output_dir: Path, checkpoint_uri: str) -> TrainResult:
    history = json.loads((output_dir / HISTORY_FILE).read_text())
    metrics = json.loads((output_dir / METRICS_FILE).read_text())
    return TrainResult(output_dir / MODEL_SUBDIR, history, metrics, config, checkpoint_uri, output_dir)


def _train_process(config: TrainConfig, data: str, output_dir: Path, checkpoint_uri: str) -> TrainResult:
    from cifar10_kfp.data.format import load_prepared

    wall_start = time.perf_counter()
    runtime = setup_runtime(config.device)
    try:
        device = runtime.device
        configure_determinism(config, device)
        if config.threads and device.type == "cpu":
            torch.set_num_threads(config.threads)
        seed_everything(config.seed)

        dataset = load_prepared(data)
        eval_split = _pick_eval_split(dataset, config)
        train_data = training_batches(dataset.train_images, dataset.train_labels, config, device)
        eval_data = DeviceData.from_numpy(*dataset.split(eval_split), device)
        if len(eval_data) == 0:
            raise ValueError(f"the {eval_split!r} split of {data} is empty: nothing to evaluate on")
        channels_last = config.channels_last
        normalizer = Normalizer(dataset.mean, dataset.std, device, channels_last=channels_last)
        batch_size = global_batch_size(config, len(train_data), runtime.world_size)
        steps_per_epoch = len(train_data) // batch_size
        identity = _model_identity(config, dataset.num_classes, dataset.image_size)

        net = build_model(
            config.architecture, dataset.num_classes, dataset.image_size, **config.model_config()
        )
        if config.whiten and hasattr(net, "init_whitening"):
            # a seeded random sample: prepared splits may be ordered by class
            pick = torch.randperm(len(train_data), generator=torch.Generator().manual_seed(config.seed))
            pick = pick[: config.whiten_samples].sort().values.numpy()
            sample = torch.from_numpy(dataset.train_images[pick])
            net.init_whitening(Normalizer(dataset.mean, dataset.std, torch.device("cpu"))(sample))
        memory_format = torch.channels_last if channels_last else torch.preserve_format
        net = net.to(device=device, memory_format=memory_format)

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

        start_epoch, step, history, resumed_from = 0, 0, [], 0
        manager = CheckpointManager(checkpoint_uri, keep=config.keep_checkpoints) if checkpoint_uri else None
        if manager is not None:
            state = manager.load_latest()
            if state is not None:
                check_compatible(state["model_identity"], identity, manager.uri)
                _warn_config_changes(state["config"], config)
                net.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
                scaler.load_state_dict(state["scaler"])
                if ema is not None and state.get("ema") is not None:
                    ema.load_state_dict(state["ema"])
                restore_rng_state(state["rng"])
                start_epoch, step = int(state["epoch"]), int(state["step"])
                history = list(state.get("history", []))
                resumed_from = start_epoch
                if runtime.is_main:
                    log.info("resuming from %s at epoch %d (step %d)", manager.uri, start_epoch, step)

        train_model: nn.Module = net
        if runtime.distributed:
            device_ids = [device.index] if device.type == "cuda" else None
            train_model = torch.nn.parallel.DistributedDataParallel(net, device_ids=device_ids)
        if config.compile and device.type == "cuda":
            train_model = torch.compile(train_model)
        eval_net = copy.deepcopy(net) if ema is not None else net
        autocast = autocast_context(config, device)

        printer = ProgressPrinter(config.progress and runtime.is_main, config.epochs)
        show_bar = config.progress and runtime.is_main and sys.stdout.isatty()
        train_time = sum(row.get("train_s", 0.0) for row in history)
        elapsed_before = history[-1]["elapsed_s"] if history else 0.0
        cpu_before = history[-1].get("cpu_s", 0.0) if history else 0.0
        session_start, session_cpu_start = time.perf_counter(), time.process_time()
        for epoch in range(start_epoch, config.epochs):
            epoch_start = time.perf_counter()
            stats, step = train_one_epoch(
                train_model, optimizer, scheduler, scaler, ema, net, train_data, normalizer, config,
                epoch, step, batch_size, runtime, show_bar,
            )  # fmt: skip
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            epoch_train_s = time.perf_counter() - epoch_start
            train_time += epoch_train_s
            if ema is not None:
                eval_net.load_state_dict(ema.state)
            result = evaluate(
                eval_net,
                eval_data,
                normalizer,
                batch_size=config.eval_batch_size,
                tta=config.tta,
                autocast=autocast,
            )
            row = {
                "epoch": epoch + 1,
                "train_loss": stats["train_loss"],
                "train_acc": stats["train_acc"],
                "val_loss": result["loss"],
                "val_acc": result["acc"],
                "lr": optimizer.param_groups[0]["lr"],
                "images_per_s": stats["images"] / max(epoch_train_s, 1e-9),
                "train_s": epoch_train_s,
                "elapsed_s": elapsed_before + time.perf_counter() - session_start,
                # process CPU seconds (all threads): on a shared machine, cpu_s / cores is the dedicated-core time
                "cpu_s": cpu_before + time.process_time() - session_cpu_start,
                "step": step,
            }
            history.append(row)
            done = epoch + 1 - start_epoch
            eta = (time.perf_counter() - session_start) / done * (config.epochs - epoch - 1)
            printer(row, eta)
            is_last = epoch + 1 == config.epochs
            periodic = config.checkpoint_every and (epoch + 1) % config.checkpoint_every == 0
            if manager is not None and runtime.is_main and (periodic or is_last):
                manager.save(
                    {
                        "config": config.to_dict(),
                        "model_identity": identity,
                        "model": net.state_dict(),
                        "ema": ema.state_dict() if ema is not None else None,
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "scaler": scaler.state_dict(),
                        "rng": capture_rng_state(),
                        "data_order": {
                            "seed": config.seed,
                            "next_epoch": epoch + 1,
                            "batch_size": batch_size,
                        },
                        "history": history,
                    },
                    epoch=epoch + 1,
                    step=step,
                )
            if runtime.distributed:
                torch.distributed.barrier()

        if ema is not None:
            eval_net.load_state_dict(ema.state)
        final = history[-1] if history else {}
        metrics = {
            "val_acc": final.get("val_acc"),
            "val_loss": final.get("val_loss"),
            "train_loss": final.get("train_loss"),
            "train_acc": final.get("train_acc"),
            "epochs": config.epochs,
            "steps": step,
            "eval_split": eval_split,
            "images_per_s": (sum(r["images_per_s"] * r["train_s"] for r in history) / train_time)
            if train_time
            else 0,
            "train_s": train_time,
            "wall_s": elapsed_before + time.perf_counter() - wall_start,
            "resumed_from_epoch": resumed_from,
            "world_size": runtime.world_size,
            "device": str(device),
            "architecture": config.architecture,
            "num_parameters": sum(p.numel() for p in net.parameters()),
            "preset": config.preset,
        }
        if runtime.is_main:
            info = ModelInfo(
                architecture=config.architecture,
                num_classes=dataset.num_classes,
                image_size=dataset.image_size,
                class_names=list(dataset.class_names),
                mean=[float(x) for x in dataset.mean],
                std=[float(x) for x in dataset.std],
                model_config=config.model_config(),
                extra={
                    "training_config": config.to_dict(),
                    "dataset_digest": dataset.source_digest,
                    "weights": "ema" if ema is not None else "final",
                    "val_acc": metrics["val_acc"],
                    "eval_split": eval_split,
                    "epochs": config.epochs,
                },
            )
            output_dir.mkdir(parents=True, exist_ok=True)
            save_model(eval_net, info, output_dir / MODEL_SUBDIR)
            (output_dir / HISTORY_FILE).write_text(json.dumps(history, indent=2))
            (output_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True))
        return TrainResult(output_dir / MODEL_SUBDIR, history, metrics, config, checkpoint_uri, output_dir)
    finally:
        teardown(runtime)


def _warn_config_changes(saved: dict, config: TrainConfig) -> None:
    current = config.to_dict()
    changed = {
        k: (saved.get(k), v)
        for k, v in current.items()
        if saved.get(k) != v and k not in config.RUNTIME_FIELDS
    }
    if changed:
        log.warning("resuming with a changed training config: %s", changed)


# ----------------------------------------------------------------------- command line


def get_args_parser() -> argparse.ArgumentParser:
    """The internal worker entry torchrun starts (``--worker --config-json``); users run ``cifar10-kfp train``."""
    parser = argparse.ArgumentParser(description="A training worker (internal; use `cifar10-kfp train`).")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config-json", required=True, help="TrainConfig as a JSON file")
    parser.add_argument("--data", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--checkpoint-uri", default="")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = TrainConfig.from_dict(json.loads(Path(args.config_json).read_text()))
    result = train(config, args.data, args.output_dir, checkpoint_uri=args.checkpoint_uri, nproc=1)
    if not args.worker:
        print(json.dumps(result.metrics, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "TrainResult",
    "train",
    "train_one_epoch",
    "evaluate",
    "default_checkpoint_uri",
    "get_args_parser",
    "main",
]
