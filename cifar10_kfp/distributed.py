"""Single-pod multi-process training: launch DDP workers with torchrun and set up each rank.

``launch(...)`` starts ``python -m torch.distributed.run --standalone --nproc-per-node N`` on the
engine's worker entry point. torchrun gives each worker RANK / LOCAL_RANK / WORLD_SIZE and a
rendezvous; ``setup_runtime`` turns those into a process group (gloo on CPU, nccl on GPU) and a
device. Only rank 0 prints, checkpoints and writes outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Runtime:
    """Where this process runs and which rank it is."""

    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def in_torchrun_worker() -> bool:
    """True inside a worker started by torchrun (or any launcher that sets WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def resolve_device(requested: str, local_rank: int = 0) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {requested!r} requested but CUDA is not available")
        return torch.device(requested if ":" in requested else f"cuda:{local_rank}")
    return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")


def setup_runtime(device: str = "auto") -> Runtime:
    """Resolve the device; inside torchrun also join the process group."""
    if not in_torchrun_worker():
        return Runtime(device=resolve_device(device))
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    resolved = resolve_device(device, local_rank)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    if not torch.distributed.is_initialized():
        backend = "nccl" if resolved.type == "cuda" else "gloo"
        init_kwargs = {"device_id": resolved} if resolved.type == "cuda" else {}
        torch.distributed.init_process_group(backend=backend, rank=rank, world_size=world_size, **init_kwargs)
    return Runtime(device=resolved, rank=rank, world_size=world_size, local_rank=local_rank)


def teardown(runtime: Runtime) -> None:
    if runtime.distributed and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    if runtime.distributed:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor


def default_nproc(requested: int) -> int:
    """``requested`` processes; 0 means one per visible GPU (one on a CPU-only machine)."""
    if requested < 0:
        raise ValueError(f"nproc must be >= 0, got {requested}")
    if requested == 0:
        return max(1, torch.cuda.device_count())
    return requested


def launch(
    nproc: int, config_dict: dict, data: str, output_dir: str | os.PathLike, checkpoint_uri: str
) -> None:
    """Run ``nproc`` engine workers under torchrun in a subprocess and wait; raise if any fails."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-ddp-") as tmp:
        config_path = Path(tmp) / "config.json"
        config_path.write_text(json.dumps(config_dict))
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--module", "cifar10_kfp.engine", "--worker",
            "--config-json", str(config_path), "--data", str(data), "--output-dir", str(output_dir),
            "--checkpoint-uri", checkpoint_uri,
        ]  # fmt: skip
        completed = subprocess.run(command, env=env, check=False)  # noqa: S603 - our own interpreter and module
    if completed.returncode != 0:
        raise RuntimeError(
            f"distributed training with {nproc} processes failed (torchrun exit {completed.returncode})"
        )
