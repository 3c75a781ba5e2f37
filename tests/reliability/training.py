"""The training run the fault-injection tests interrupt, and how its results are compared.

One small but non-trivial configuration: simple_cnn on 16x16 images with flip + translate
augmentation, a linear warm-up/decay schedule, label smoothing and a weight EMA, so an exact
resume has to restore the model, optimizer momentum, schedule, EMA, RNG streams and history.
Runs are the real ``cifar10-kfp train`` command on CPU in deterministic mode, one thread.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from tests.reliability.harness import Proc, S3Proxy, cli_command, pointer_body_epoch

EPOCHS = 5
TRAIN_SETTINGS = {
    "threads": "1",  # the same thread count every run: float reductions depend on it
    "flip": "true",
    "translate": "2",
    "lr_schedule": "linear",
    "warmup_epochs": "1",
    "label_smoothing": "0.1",
    "ema_decay": "0.9",
    "ema_every": "2",
    "checkpoint_every": "1",
    "keep_checkpoints": "2",
}
# Per-epoch fields that must match bit for bit; the rest (train_s, elapsed_s, images_per_s) are timings.
EXACT_HISTORY_FIELDS = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "step")


def make_dataset(path: Path) -> Path:
    from cifar10_kfp.data.format import save_prepared
    from tests.support.data import make_tiny_dataset

    # 4096 images make an epoch last about a second on one thread: wide enough to land inside.
    dataset = make_tiny_dataset(n_train=4096, n_val=256, n_test=128, num_classes=4, image_size=16, seed=1)
    return save_prepared(dataset, path)


def train_argv(data: Path, checkpoint_uri: str, output_dir: Path, epochs: int = EPOCHS) -> list[str]:
    args = [
        "train",
        "--data",
        str(data),
        "--preset",
        "seed",
        "--epochs",
        str(epochs),
        "--checkpoint-uri",
        checkpoint_uri,
        "--output-dir",
        str(output_dir),
    ]
    for key, value in TRAIN_SETTINGS.items():
        args += ["--set", f"{key}={value}"]
    return cli_command(*args)


@dataclass
class RunResult:
    output_dir: Path
    history: list[dict]
    metrics: dict
    weights: dict  # name -> tensor

    @classmethod
    def load(cls, output_dir: Path) -> RunResult:
        from safetensors.torch import load_file

        return cls(
            output_dir,
            json.loads((output_dir / "history.json").read_text()),
            json.loads((output_dir / "metrics.json").read_text()),
            load_file(str(output_dir / "model" / "model.safetensors")),
        )


def assert_bitwise_equal(run: RunResult, reference: RunResult, what: str) -> None:
    """Same per-epoch losses/accuracies (exact float equality) and the same weights, bit for bit."""
    assert len(run.history) == len(reference.history), f"{what}: {len(run.history)} epochs in history"
    for got, want in zip(run.history, reference.history):
        for key in EXACT_HISTORY_FIELDS:
            assert got[key] == want[key], f"{what}: epoch {want['epoch']} {key} {got[key]!r} != {want[key]!r}"
    assert sorted(run.weights) == sorted(reference.weights), f"{what}: different tensor names"
    for name, tensor in reference.weights.items():
        other = run.weights[name]
        assert other.dtype == tensor.dtype and other.shape == tensor.shape, f"{what}: {name} dtype/shape"
        same_bits = (
            other.contiguous()
            .view(-1)
            .view(dtype=_int_view(tensor))
            .equal(tensor.contiguous().view(-1).view(dtype=_int_view(tensor)))
        )
        assert same_bits, f"{what}: weights {name} differ from the uninterrupted run"


def _int_view(tensor):
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]


@dataclass
class Reference:
    """The uninterrupted run: its results, and how long an epoch and a checkpoint take."""

    result: RunResult
    epoch_s: float  # median wall time between consecutive checkpoint pointers
    epoch_cpu_s: float  # median process CPU seconds per epoch (training, evaluation, checkpoint)
    checkpoint_bytes: int
    output: str
    checkpoint_uri: str  # its checkpoints (the last ``keep_checkpoints``), e.g. to tamper with copies


def run_reference(
    env: dict, proxy: S3Proxy, data: Path, checkpoint_uri: str, output_dir: Path, log: Path
) -> Reference:
    proc = Proc(
        train_argv(data, checkpoint_uri, output_dir),
        env={**env, "MINIO_ENDPOINT": proxy.endpoint},
        log_path=log,
    )
    code = proc.wait(300)
    assert code == 0, f"the uninterrupted reference run failed ({code}):\n{proc.output()[-4000:]}"
    pointers = [e for e in proxy.requests("PUT", r"/latest\.json$") if pointer_body_epoch(e)]
    times = [e.finished for e in pointers]
    assert len(times) == EPOCHS, f"expected {EPOCHS} checkpoint pointers, saw {len(times)}"
    epoch_s = statistics.median(b - a for a, b in zip(times, times[1:]))
    size = max(e.length for e in proxy.requests("PUT", r"ckpt-epoch\d+\.pt$"))
    result = RunResult.load(output_dir)
    cpu = [row["cpu_s"] for row in result.history]  # cumulative: the run's CPU time at each epoch's end
    epoch_cpu_s = statistics.median(b - a for a, b in zip(cpu, cpu[1:]))
    return Reference(result, epoch_s, epoch_cpu_s, size, proc.output(), checkpoint_uri)
