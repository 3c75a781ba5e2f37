"""A real MLflow tracking server (``mlflow server`` from the ``mlflow`` package) on a loopback port.

SQLite store and artifact folder in a directory of the caller's; started in a session of its own, so that
``stop`` ends the server and every worker it forked (uvicorn), and nothing is left when a test ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.torchrun_agents import free_port

START_TIMEOUT_S = 120.0


class MlflowServer:
    """``mlflow server`` on 127.0.0.1; ``uri`` is its tracking URI once ``start`` returned."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = self.root / "mlflow-server.log"

    def start(self) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
            "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
            "--default-artifact-root", str(self.root / "artifacts"),
        ]  # fmt: skip
        # The server's job runner (huey consumers: eight more processes) serves GenAI jobs, not tracking.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.process.returncode}: {self.log.read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"mlflow server not healthy within {START_TIMEOUT_S:.0f} s: {self.log.read_text()[-2000:]}"
        )

    def stop(self) -> None:
        """End the server's whole process group (SIGTERM, then SIGKILL); its port is closed after."""
        if self.process is None:
            return
        process, self.process = self.process, None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _group_alive(process):
                break
            os.killpg(process.pid, sig)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _group_alive(process):
                time.sleep(0.1)
        process.wait()

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)


def _group_alive(process: subprocess.Popen) -> bool:
    """Whether any process of ``process``'s group is left (the leader reaped first, so it is not a zombie)."""
    process.poll()
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True
