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
import socket
import subprocess
import sys
import tempfile
import time
import typing
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

# How long a collective (and joining the process group) may wait for a peer. torch's defaults are 10 minutes
# for NCCL and 30 for gloo (torch/distributed/constants.py): a node that vanished mid-step would hold the
# survivors that long before their agents notice and re-rendezvous. Five minutes still covers what rank 0
# does alone while the others wait at a barrier (a checkpoint upload, writing the outputs).
PROCESS_GROUP_TIMEOUT = timedelta(minutes=5)


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
        torch.distributed.init_process_group(
            backend=backend, rank=rank, world_size=world_size, timeout=PROCESS_GROUP_TIMEOUT, **init_kwargs
        )
    return Runtime(device=resolved, rank=rank, world_size=world_size, local_rank=local_rank)


def teardown(runtime: Runtime) -> None:
    if runtime.distributed and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, runtime: Runtime) -> torch.Tensor:
    if runtime.distributed:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor


#: How far the ranks' weight checksums may differ, relative: DDP gives every rank the same averaged gradients, so
#: its weights agree bit for bit on like machines; the margin covers elementwise rounding on unlike CPUs, and a
#: rank that trained on its own gradients is off by far more (orders of magnitude after one step).
REPLICA_TOLERANCE = 1e-6


def check_replicas_agree(module: torch.nn.Module, runtime: Runtime) -> None:
    """Refuse a run whose ranks ended with different weights: their gradients were not synchronised.

    One all-reduce of two float64 numbers (the largest and, negated, the smallest checksum) per run;
    every rank raises the same error, so rank 0 exports nothing.
    """
    if not runtime.distributed:
        return
    with torch.no_grad():
        checksum = torch.stack([p.detach().double().abs().sum() for p in module.parameters()]).sum()
        bounds = torch.stack([checksum, -checksum]).to(runtime.device)
        torch.distributed.all_reduce(bounds, op=torch.distributed.ReduceOp.MAX)
    high, low = bounds[0].item(), -bounds[1].item()
    if high - low > REPLICA_TOLERANCE * max(abs(high), 1e-12):
        raise RuntimeError(
            f"the {runtime.world_size} ranks ended training with different weights (|w| sums from {low!r} to "
            f"{high!r}): their gradients were not synchronised, so no model is exported"
        )


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
    wait_for_host_s: float = 0.0  # a Trainer node other than 0 waits this long for node 0's store (0 = not)

    def __post_init__(self) -> None:
        low, high = self.node_range
        if not 1 <= low <= high:
            raise ValueError(f"nnodes={self.nnodes!r} must be N or MIN:MAX with 1 <= MIN <= MAX")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts={self.max_restarts} must be >= 0")
        if self.wait_for_host_s < 0:
            raise ValueError(f"wait_for_host_s={self.wait_for_host_s} must be >= 0")
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
        if self.trainer_node_rank() is not None and "PET_RDZV_CONF" not in os.environ:
            args.append(f"--rdzv-conf=is_host={'true' if self.trainer_node_rank() == 0 else 'false'}")
        return args

    @staticmethod
    def trainer_node_rank() -> int | None:
        """This pod's node index on a Kubeflow Trainer node (``PET_NODE_RANK``), else None."""
        node_rank = os.environ.get("PET_NODE_RANK", "")
        return int(node_rank) if node_rank.isdigit() else None

    def wait_for_host(self) -> None:
        """On a Trainer node other than 0: wait, at most ``wait_for_host_s``, until node 0's store accepts connections.

        Without it a node whose node 0 is still pulling its image or waiting for a GPU gives up after
        torchrun's 60 s store timeout, and with the pods' ``restartPolicy: OnFailure`` each give-up is a
        container restart counted against the Job's one shared ``backoffLimit`` (kubernetes Job controller,
        restarts of active pods): a slow or lost node 0 then fails the whole TrainJob. Waiting here costs no
        restart. Node 0, and runs outside a Trainer, start at once.
        """
        rank = self.trainer_node_rank()
        if not self.multi_node or not self.wait_for_host_s or rank in (None, 0):
            return
        waited = wait_for_store(self.endpoint, self.wait_for_host_s)
        if waited >= 1:
            print(
                f"node {rank}: node 0's rendezvous store at {self.endpoint} answered after {waited:.0f}s",
                flush=True,
            )


def wait_for_store(endpoint: str, timeout_s: float, poll_s: float = 2.0) -> float:
    """Block until ``HOST:PORT`` accepts a TCP connection; the seconds waited. ``TimeoutError`` past ``timeout_s``.

    A name that does not resolve yet (node 0's pod not yet in the headless service) counts as "not yet".
    """
    host, _, port = endpoint.rpartition(":")
    start = time.monotonic()
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=max(0.5, min(poll_s, 5.0))):
                return time.monotonic() - start
        except OSError as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - start >= timeout_s:
            raise TimeoutError(
                f"node 0's rendezvous store at {endpoint} did not accept connections within {timeout_s:g}s "
                f"({last_error}): is node 0's pod scheduled and running?"
            )
        time.sleep(poll_s)


def launch(nproc: int, spec: dict, rendezvous: Rendezvous | None = None) -> None:
    """Run ``nproc`` training workers under torchrun in a subprocess and wait; raise if it fails.

    ``spec`` is what every worker trains (``cifar10_kfp.train._worker``): ``config`` (a dict),
    ``data``, ``output_dir`` and ``checkpoint_uri``.
    """
    rendezvous = rendezvous or Rendezvous()
    Path(spec["output_dir"]).mkdir(parents=True, exist_ok=True)
    rendezvous.wait_for_host()
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
