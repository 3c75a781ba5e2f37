"""A real Kubeflow Model Registry server with its own MariaDB, on 127.0.0.1, for tests and ``make model-registry``.

The server is the Go program from the ``github.com/kubeflow/model-registry`` module, built once
and cached outside the repository (``localcluster/gobuild.py``, pinned in ``versions.py``). It runs in its
``embedmd`` mode, as Kubeflow's manifests deploy it, against a MariaDB from Debian's
``mariadb-server`` package: a throwaway instance in a temporary data directory on a free port,
run as the unprivileged ``mysql`` user when we are root. No password anywhere: the database
listens on loopback only and lives as long as the harness.

Each process gets its own session (process group) and is told to die with its parent; mariadbd
forgets that when it becomes ``mysql`` (a change of user clears the parent-death signal), so a
killed harness leaves no server behind because the reaper (reaper.py) stops what it tracked.
``stop_server()``/``start_server()`` take the registry
down and bring it back on the same port and database (the outage tests).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from cifar10_kfp.storage.embedded import (
    free_ports,
    stop_on_sigterm,
    stop_process_group,
    wait_in_foreground,
)
from localcluster import reaper
from localcluster.gobuild import ensure_binary
from localcluster.mariadb import MariaDB, preexec_session

# The REST API the pinned server serves; the pinned client ``model-registry==0.3.0`` calls it (clients up to
# 0.3.8 do; 0.3.12 calls /api/model_registry/v1, which this server answers with 404).
API_PREFIX = "/api/model_registry/v1alpha3"

DATABASE = "model_registry"
DB_USER = "model_registry"


class RegistryHarnessError(RuntimeError):
    """The database or the registry server could not be started."""


class ModelRegistryServer:
    """MariaDB + the Model Registry REST server. Use as a context manager, or ``start()``/``close()``."""

    def __init__(self, *, start_timeout_s: float = 90.0, binary: str | None = None):
        self.start_timeout_s = start_timeout_s
        self._binary = binary
        self.work_dir = reaper.temporary_dir("cifar10-kfp-mr-")
        self.db_port, self.port = free_ports(2)
        self._db = MariaDB(self.work_dir, self.db_port, start_timeout_s)
        self._server: subprocess.Popen | None = None
        self._logs: list = []

    # -- public -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_log(self) -> Path:
        return self.work_dir / "model-registry.log"

    @property
    def db_log(self) -> Path:
        return self._db.log

    @property
    def server_running(self) -> bool:
        return self._server is not None and self._server.poll() is None

    def start(self) -> ModelRegistryServer:
        binary = self._binary or str(ensure_binary("model-registry"))
        try:
            self._db.start()
            self._db.create(DATABASE, DB_USER)
            self._binary = binary
            self.start_server()
        except BaseException:
            self.close()
            raise
        return self

    def start_server(self) -> None:
        """Start (or restart) the registry server on the same port and database."""
        if self.server_running:
            return
        log = open(self.server_log, "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        dsn = f"{DB_USER}@tcp(127.0.0.1:{self.db_port})/{DATABASE}?charset=utf8mb4"
        self._server = subprocess.Popen(
            [self._binary, "proxy", "--hostname=127.0.0.1", f"--port={self.port}",
             "--datastore-type=embedmd", "--embedmd-database-type=mysql", f"--embedmd-database-dsn={dsn}",
             "--logtostderr=true"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=preexec_session, cwd=self.work_dir,
        )  # fmt: skip
        reaper.track_group(self._server.pid)
        self._wait_server()

    def stop_server(self) -> None:
        """Take the registry server down (the database stays): clients then get connection refused."""
        proc, self._server = self._server, None
        stop_process_group(proc, grace_s=5.0)
        if proc is not None:
            reaper.untrack("group", proc.pid)

    def close(self) -> None:
        """Stop the server and the database and remove their files; idempotent."""
        self.stop_server()
        self._db.stop()
        for log in self._logs:
            log.close()
        self._logs.clear()
        reaper.remove_dir(self.work_dir)

    def __enter__(self) -> ModelRegistryServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------

    def _healthy(self) -> bool:
        # /readyz/health answers 200 only once the database is connected, migrated and the API is routed.
        try:
            with urllib.request.urlopen(f"{self.url}/readyz/health", timeout=2) as resp:  # noqa: S310 - loopback
                if resp.status != 200:
                    return False
            with urllib.request.urlopen(f"{self.url}{API_PREFIX}/registered_models", timeout=2) as resp:  # noqa: S310
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _wait_server(self) -> None:
        self._wait(self._healthy, self._server, "the model registry server", self.server_log)

    def _wait(self, ready, proc: subprocess.Popen, what: str, log: Path) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RegistryHarnessError(
                    f"{what} exited with code {proc.returncode} during start; see {log}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise RegistryHarnessError(f"{what} was not ready within {self.start_timeout_s:g}s; see {log}")


def serve_forever() -> int:
    """``make model-registry``: run the registry and its database in the foreground until Ctrl-C."""
    stop_requested = stop_on_sigterm()  # before the start, so a SIGTERM during it still stops cleanly
    reaper.session_marker()  # whatever starts from here on is undone if this process is killed
    with ModelRegistryServer() as server:
        print("# Kubeflow Model Registry is up (its MariaDB too). In another shell, run:")
        print(f"export MODEL_REGISTRY_URL={server.url}")
        print(f"# files: {server.work_dir}   log: {server.server_log}   Ctrl-C stops both.", flush=True)
        asked_to_stop = wait_in_foreground(lambda: server.server_running, stop_requested)
        if not server.server_running and not asked_to_stop:
            print(f"the registry server exited; see {server.server_log}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(serve_forever())
