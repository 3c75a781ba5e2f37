"""What a training run reports and leaves behind.

* ``ProgressPrinter``: one fixed-column line per epoch (rank 0);
* ``RunClock``: wall, CPU and training seconds, carried across resumes;
* ``epoch_row``: the per-epoch history row; ``final_metrics``: ``metrics.json``; ``tracked_params``:
  the parameters a tracked run logs;
* ``export_outputs``: ``model/`` (loadable with ``cifar10_kfp.train.models`` alone), ``history.json``
  and ``metrics.json`` in the output directory.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from torch import nn

from cifar10_kfp.train.config import TrainConfig
from cifar10_kfp.train.models import ModelInfo, save_model

HISTORY_FILE = "history.json"
METRICS_FILE = "metrics.json"
MODEL_SUBDIR = "model"


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


class RunClock:
    """Seconds of the whole run, including the sessions before a resume.

    ``elapsed_s`` is wall time, ``cpu_s`` process CPU time (all threads: on a shared machine,
    cpu_s / cores is the dedicated-core time) and ``train_s`` the time inside training epochs.
    A mid-epoch checkpoint stores ``snapshot()`` so that a resumed run keeps counting from there.
    """

    def __init__(self, history: list[dict], saved: dict | None = None, process_start: float | None = None):
        last = history[-1] if history else {}
        saved = saved or {}
        self.elapsed_before = float(saved.get("elapsed_s", last.get("elapsed_s", 0.0)))
        self.cpu_before = float(saved.get("cpu_s", last.get("cpu_s", 0.0)))
        self.train_s = sum(row.get("train_s", 0.0) for row in history)
        self.epoch_train_before = float(saved.get("epoch_train_s", 0.0))  # of the epoch a resume lands in
        self.session_start, self.cpu_start = time.perf_counter(), time.process_time()
        self.process_start = self.session_start if process_start is None else process_start
        self.session_epochs = 0

    def elapsed_s(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.session_start

    def wall_s(self) -> float:
        """Like ``elapsed_s``, but this session counted from the process start (set-up included)."""
        return self.elapsed_before + time.perf_counter() - self.process_start

    def cpu_s(self) -> float:
        return self.cpu_before + time.process_time() - self.cpu_start

    def epoch_done(self, epoch_train_s: float) -> float:
        """Count one finished epoch's training seconds; returns them (with a resumed part)."""
        epoch_train_s += self.epoch_train_before
        self.epoch_train_before = 0.0
        self.train_s += epoch_train_s
        self.session_epochs += 1
        return epoch_train_s

    def eta_s(self, epochs_left: int) -> float:
        per_epoch = (time.perf_counter() - self.session_start) / max(1, self.session_epochs)
        return per_epoch * epochs_left

    def snapshot(self, epoch_train_s: float) -> dict:
        return {
            "elapsed_s": self.elapsed_s(),
            "cpu_s": self.cpu_s(),
            "epoch_train_s": self.epoch_train_before + epoch_train_s,
        }


def epoch_row(epoch: int, stats: dict, result: dict, lr: float, train_s: float, clock: RunClock, step: int,
              world_size: int) -> dict:  # fmt: skip
    """One history row: the epoch's training and evaluation figures, and where the run stands."""
    return {
        "epoch": epoch,
        "train_loss": stats["train_loss"],
        "train_acc": stats["train_acc"],
        "val_loss": result["loss"],
        "val_acc": result["acc"],
        "lr": lr,
        "images_per_s": stats["images"] / max(train_s, 1e-9),
        "train_s": train_s,
        "elapsed_s": clock.elapsed_s(),
        "cpu_s": clock.cpu_s(),
        "step": step,
        "world_size": world_size,  # processes that finished this epoch (elastic runs can change it)
    }


def tracked_params(
    config: TrainConfig, dataset, eval_split: str, batch_size: int, steps_per_epoch: int
) -> dict:
    """What a tracked run (``cifar10_kfp.tracking``) logs once: the config less its run-time knobs, the data.

    The run-time knobs may change when a run resumes, and MLflow refuses a changed param of a run.
    """
    params: dict = {k: v for k, v in config.to_dict().items() if k not in config.RUNTIME_FIELDS}
    params.update(
        dataset_digest=dataset.source_digest, eval_split_used=eval_split, global_batch_size=batch_size,
        steps_per_epoch=steps_per_epoch,
    )  # fmt: skip
    return params


def final_metrics(config: TrainConfig, history: list[dict], clock: RunClock, *, steps: int, eval_split: str,
                  resumed_from_epoch: int, world_size: int, device: str, num_parameters: int) -> dict:  # fmt: skip
    """``metrics.json``: the last epoch's figures and the run's totals."""
    final = history[-1] if history else {}
    train_s = clock.train_s
    return {
        "val_acc": final.get("val_acc"),
        "val_loss": final.get("val_loss"),
        "train_loss": final.get("train_loss"),
        "train_acc": final.get("train_acc"),
        "epochs": config.epochs,
        "steps": steps,
        "eval_split": eval_split,
        "images_per_s": (sum(r["images_per_s"] * r["train_s"] for r in history) / train_s) if train_s else 0,
        "train_s": train_s,
        "wall_s": clock.wall_s(),
        "resumed_from_epoch": resumed_from_epoch,
        "world_size": world_size,
        "device": device,
        "architecture": config.architecture,
        "num_parameters": num_parameters,
        "preset": config.preset,
    }


def export_outputs(output_dir: Path, model: nn.Module, config: TrainConfig, dataset, history: list[dict],
                   metrics: dict, *, weights: str) -> Path:  # fmt: skip
    """Write ``model/``, ``history.json`` and ``metrics.json``; returns the model directory."""
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
            "weights": weights,
            "val_acc": metrics["val_acc"],
            "eval_split": metrics["eval_split"],
            "epochs": config.epochs,
        },
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    save_model(model, info, output_dir / MODEL_SUBDIR)
    (output_dir / HISTORY_FILE).write_text(json.dumps(history, indent=2))
    (output_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return output_dir / MODEL_SUBDIR


def read_outputs(output_dir: Path) -> tuple[list[dict], dict]:
    """The history and metrics a run (e.g. a torchrun worker group) wrote into ``output_dir``."""
    history = json.loads((output_dir / HISTORY_FILE).read_text())
    metrics = json.loads((output_dir / METRICS_FILE).read_text())
    return history, metrics
