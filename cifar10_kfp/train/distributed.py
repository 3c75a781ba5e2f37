"""Multi-process and multi-node training: launch workers with torchrun and set up each rank.

``launch(...)`` starts ``python -m torch.distributed.run`` on the internal worker entry point
(``cifar10_kfp.train._worker``): ``--standalone`` inside one pod, or torchrun's c10d rendezvous across
nodes, elastic with ``--nnodes MIN:MAX`` (``Rendezvous``). torchrun gives each worker RANK /
LOCAL_RANK / WORLD_SIZE; ``setup_runtime`` turns those into a process group (gloo on CPU, nccl
on GPU) and a device. Only rank 0 prints, checkpoints and writes outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import typing
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
        init_kwargs: dict[str, typing.Any] = {"device_id": resolved} if resolved.type == "cuda" else {}
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


@dataclass(frozen=True)
class Rendezvous:
    """How the torchrun agents of one run find each other.

    One node (``nnodes="1"``, no endpoint): ``torchrun --standalone``. Several nodes: torchrun's
    c10d rendezvous on ``endpoint``, the store hosted by the agent on that host (node 0).
    ``nnodes="MIN:MAX"`` is torchrun's elastic mode: training starts once MIN agents have
    joined, keeps going while at least MIN are alive, and an agent that joins later (a node
    that came back, a new pod) makes the others restart their workers at the next rendezvous.
    """

    nnodes: str = "1"  # "N" (fixed) or "MIN:MAX" (elastic), as torchrun's --nnodes
    endpoint: str = ""  # HOST:PORT of the rendezvous store on node 0; empty on one node
    run_id: str = "cifar10-kfp"  # the same on every node of one run, distinct between concurrent runs
    max_restarts: int = 0  # worker-group restarts after a failure (membership changes do not count)

    def __post_init__(self) -> None:
        low, high = self.node_range
        if not 1 <= low <= high:
            raise ValueError(f"nnodes={self.nnodes!r} must be N or MIN:MAX with 1 <= MIN <= MAX")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts={self.max_restarts} must be >= 0")
        if self.endpoint:
            host, _, port = self.endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"rendezvous endpoint {self.endpoint!r} must be HOST:PORT (node 0's address)"
                )
        elif high > 1:
            raise ValueError(
                f"nnodes={self.nnodes!r} spans several nodes: give the rendezvous endpoint HOST:PORT of node 0"
            )
        if not self.run_id or not all(c.isalnum() or c in "-_." for c in self.run_id):
            raise ValueError(f"rendezvous id {self.run_id!r} must be letters, digits, '-', '_' or '.'")

    @property
    def node_range(self) -> tuple[int, int]:
        low, _, high = str(self.nnodes).partition(":")
        try:
            return int(low), int(high or low)
        except ValueError:
            raise ValueError(f"nnodes={self.nnodes!r} must be N or MIN:MAX with 1 <= MIN <= MAX") from None

    @property
    def multi_node(self) -> bool:
        return bool(self.endpoint)

    @property
    def elastic(self) -> bool:
        low, high = self.node_range
        return low < high

    def torchrun_args(self, nproc: int) -> list[str]:
        if not self.multi_node:
            return ["--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={self.max_restarts}"]
        args = [
            f"--nnodes={self.nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id={self.run_id}", f"--max-restarts={self.max_restarts}",
        ]  # fmt: skip
        # On a Kubeflow Trainer node (PET_NODE_RANK is its JobSet completion index) node 0 hosts the
        # store: said explicitly, since torchrun's guess compares the endpoint's DNS name with this
        # pod's addresses, which the headless service may not resolve yet when the pods start.
        node_rank = os.environ.get("PET_NODE_RANK", "")
        if node_rank.isdigit() and "PET_RDZV_CONF" not in os.environ:
            args.append(f"--rdzv-conf=is_host={'true' if node_rank == '0' else 'false'}")
        return args


def launch(nproc: int, spec: dict, rendezvous: Rendezvous | None = None) -> None:
    """Run ``nproc`` training workers under torchrun in a subprocess and wait; raise if it fails.

    ``spec`` is what every worker trains (``cifar10_kfp.train._worker``): ``config`` (a dict),
    ``data``, ``output_dir`` and ``checkpoint_uri``.
    """
    rendezvous = rendezvous or Rendezvous()
    Path(spec["output_dir"]).mkdir(parents=True, exist_ok=True)
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    if rendezvous.multi_node:
        # torch's dynamic rendezvous shares the agent's TCP store with the workers by default and then
        # publishes the workers' MASTER_ADDR once per agent, not once per round: an agent that joins a
        # later round (a node coming back, a scale-up) waits for a key that rank 0 never writes again,
        # and the round times out (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py,
        # next_rendezvous, torch 2.6-2.14). Opting out makes every round publish its own address.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-workers-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        command = [
            sys.executable, "-m", "torch.distributed.run", *rendezvous.torchrun_args(nproc),
            "--module", "cifar10_kfp.train._worker", str(spec_path),
        ]  # fmt: skip
        completed = subprocess.run(command, env=env, check=False)  # noqa: S603 - our own interpreter and module
    if completed.returncode != 0:
        where = f"{rendezvous.nnodes} node(s) x {nproc}" if rendezvous.multi_node else str(nproc)
        raise RuntimeError(
            f"distributed training with {where} processes failed (torchrun exit {completed.returncode})"
        )
