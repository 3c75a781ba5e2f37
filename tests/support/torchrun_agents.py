"""Real torchrun agents on 127.0.0.1, each one a "node" running ``cifar10-kfp train ... --nnodes MIN:MAX``.

Every agent runs the same command, as every pod of a TrainJob does; the first one to bind the
rendezvous port hosts the c10d store (torchrun's own rule for an endpoint on this machine), so
tests start it first and wait for its port. A node that dies takes all of its processes with it:
``Agent.kill_node`` SIGKILLs the agent and every process below it, which a process-group kill
would not do, because torchrun starts its workers in sessions of their own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.paths import ROOT

# Short rendezvous waits for a test on one machine: a lone agent starts after 1 s instead of 30 s, and a
# dead agent's heartbeat expires after 3 x 1 s (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py).
TEST_RDZV_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_listener(port: int, timeout_s: float = 120) -> None:
    """Block until something accepts connections on 127.0.0.1:``port`` (the rendezvous store is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:g}s")


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (children of children included)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def node_env(overrides: dict[str, str]) -> dict[str, str]:
    """What an agent gets: this test's environment (its object store), one thread, CPU only, short
    rendezvous waits, and ``overrides`` (e.g. an S3 proxy's ``MINIO_ENDPOINT``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
    env.update({"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1",
                "PET_RDZV_CONF": TEST_RDZV_CONF, "PYTHONPATH": str(ROOT)})  # fmt: skip
    env.update(overrides)
    return env


class Agent:
    """One ``cifar10-kfp train`` node: its own session, output captured to ``log_path``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path):
        self.name, self.log_path = name, Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.killed = False
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "cifar10_kfp_pipelines.cli", "train", *argv], env=env, cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill_node(self) -> list[int]:
        """SIGKILL the agent and all of its processes at once, as when the node running it is lost."""
        self.killed = True
        victims = [self.popen.pid, *descendants(self.popen.pid)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return victims

    def wait(self, timeout_s: float) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_node()
            self.popen.wait()
            raise AssertionError(
                f"agent {self.name} did not finish in {timeout_s:g}s:\n{self.output()[-4000:]}"
            ) from None
        finally:
            self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Clean-up for a failed test: nothing of this agent may outlive it."""
        if self.alive or descendants(self.popen.pid):
            self.kill_node()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
        if not self._log.closed:
            self._log.close()


def train_args(data_uri: str, checkpoint_uri: str, output_dir: Path, *, nnodes: str, port: int, rdzv_id: str,
               epochs: int, steps_every: int, extra: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
    """``cifar10-kfp train`` arguments for one node of a small elastic run (simple_cnn, gloo, one thread)."""
    return [
        "--data", data_uri, "--preset", "seed", "--epochs", str(epochs), "--batch-size", "32", "--lr", "0.05",
        "--checkpoint-uri", checkpoint_uri, "--output-dir", str(output_dir),
        "--set", "threads=1", "--set", "device=cpu", "--set", f"checkpoint_every_steps={steps_every}",
        "--set", "keep_checkpoints=3",
        "--nnodes", nnodes, "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id, "--max-restarts", "3",
        *extra,
    ]  # fmt: skip
