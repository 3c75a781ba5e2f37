"""ML Metadata's gRPC server for the harness: upstream's C++ MetadataStore, served from its PyPI wheel.

KFP 2.17.0's driver and launcher record executions and artifacts in ML Metadata over gRPC
(`metadata-grpc-service.kubeflow:8080`). Upstream's server image cannot be built here, so
mlmd_server.py serves the same service from the `ml-metadata` wheel's C++ store (see its
docstring). That wheel needs Python 3.11 and protobuf<5, which the project's venv does not have,
so it runs in its own venv, cached outside the repo like the Go binaries (gobuild.py):
`<cache>/venv/ml-metadata-<version>/`, built into a temporary directory renamed into place under a
file lock, with venv.json recording the pins it was built from and how long the build took.

This module never imports ml_metadata; it only starts processes in that venv.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from localcluster import gobuild, procs

MLMD_VERSION = "1.17.1"
# The full closure of ml-metadata 1.17.1, pinned exactly (protobuf<5, absl-py<2, attrs<24 are its
# own bounds), so the venv is the same on every machine.
PINS = (
    f"ml-metadata=={MLMD_VERSION}",
    "grpcio==1.85.3",
    "protobuf==4.25.9",
    "absl-py==1.4.0",
    "attrs==23.2.0",
    "six==1.17.0",
    "typing_extensions==4.16.0",
)
PYTHON = "python3.11"  # the wheel is cp311 only
SERVER_SCRIPT = pathlib.Path(__file__).resolve().parent / "mlmd_server.py"
_INSTALL_TIMEOUT_S = 900


def venv_dir() -> pathlib.Path:
    """Where the ml-metadata venv lives (built or not)."""
    return gobuild.cache_root() / "venv" / f"ml-metadata-{MLMD_VERSION}"


def venv_python() -> pathlib.Path:
    """The interpreter of the ml-metadata venv (built or not)."""
    return venv_dir() / "bin" / "python"


def _stamp(target: pathlib.Path) -> dict | None:
    try:
        return json.loads((target / "venv.json").read_text())
    except (OSError, ValueError):
        return None


def _is_current(target: pathlib.Path) -> bool:
    stamp = _stamp(target)
    return (target / "bin" / "python").exists() and stamp is not None and stamp.get("pins") == list(PINS)


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(argv)}):\n{(proc.stdout + proc.stderr)[-4000:]}")


def _build_into(tmp: pathlib.Path) -> None:
    python = shutil.which(PYTHON)
    if python is None:
        raise RuntimeError(f"{PYTHON} is not on PATH; the ml-metadata {MLMD_VERSION} wheel is cp311 only")
    _run([python, "-m", "venv", str(tmp)], f"{PYTHON} -m venv")
    # `python -m pip`, never bin/pip: the venv is renamed after this, and bin/pip's shebang names
    # the temporary path (bin/python finds its venv from its own location, so it survives).
    pip = [str(tmp / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-input"]
    _run([*pip, *PINS], f"installing ml-metadata {MLMD_VERSION}")
    _run(
        [str(tmp / "bin" / "python"), "-c", "import ml_metadata.metadata_store.metadata_store"],
        "import check",
    )


def ensure_mlmd_venv() -> pathlib.Path:
    """The ml-metadata venv's directory, built first when missing or built from other pins."""
    target = venv_dir()
    if _is_current(target):
        return target
    with gobuild.file_lock(target.parent / f".lock-{target.name}"):
        if _is_current(target):
            return target  # another process built it while this one waited
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
        try:
            print(f"mlmd: building the ml-metadata {MLMD_VERSION} venv ...", file=sys.stderr, flush=True)
            started = time.monotonic()
            _build_into(tmp)
            seconds = round(time.monotonic() - started, 1)
            (tmp / "venv.json").write_text(
                json.dumps({"pins": list(PINS), "build_seconds": seconds}, indent=1)
            )
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"mlmd: building the venv took {seconds:.0f} s", file=sys.stderr, flush=True)
    return target


def build_seconds() -> float | None:
    """How long building the cached ml-metadata venv took (None when it is not built)."""
    stamp = _stamp(venv_dir())
    return None if stamp is None else stamp.get("build_seconds")


def probe(address: str, timeout_s: float = 5.0) -> bool:
    """Whether a real gRPC call (GetArtifactTypes, by ml_metadata's own client) to address succeeds."""
    argv = [
        str(venv_python()),
        str(SERVER_SCRIPT),
        "probe",
        "--address",
        address,
        "--timeout",
        str(timeout_s),
    ]
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout_s + 30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


class MlmdServer:
    """mlmd_server.py on host:port with an SQLite database at db_path; a context manager.

    Args:
        host: The address to listen on (127.0.0.1 for the harness).
        port: The TCP port to listen on.
        db_path: The SQLite file; created with MLMD's schema when missing, reused when present.
        log_dir: Where `mlmd.log` goes (default: next to db_path).
        ready_timeout_s: How long to wait for the first successful call.
    """

    def __init__(
        self,
        host: str,
        port: int,
        db_path: pathlib.Path,
        log_dir: pathlib.Path | None = None,
        ready_timeout_s: float = 60.0,
    ):
        self.host = host
        self.port = port
        self.db_path = pathlib.Path(db_path)
        self.log_dir = pathlib.Path(log_dir) if log_dir else self.db_path.parent
        self.ready_timeout_s = ready_timeout_s
        self.process: procs.Process | None = None
        self._log_start = 0

    @property
    def address(self) -> str:
        """`host:port`, as a gRPC target."""
        return f"{self.host}:{self.port}"

    def start(self) -> MlmdServer:
        """Start the server and wait until it answers a real call; raise with its log if it dies."""
        python = ensure_mlmd_venv() / "bin" / "python"
        argv = [str(python), str(SERVER_SCRIPT), "serve", "--host", self.host, "--port", str(self.port)]
        log = self.log_dir / "mlmd.log"
        # The log is appended to across restarts: only what this run writes counts as its readiness.
        self._log_start = log.stat().st_size if log.exists() else 0
        self.process = procs.Process("mlmd", [*argv, "--db", str(self.db_path)], self.log_dir)
        try:
            procs.wait_for(
                f"ML Metadata on {self.address}",
                lambda: self._listening() and probe(self.address),
                self.ready_timeout_s,
                [self.process],
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _listening(self) -> bool:
        # The server logs this line once it holds the port (it refuses to share one): only then is
        # an answer on the port its own, not that of another server already there.
        with open(self.process.log_path, "rb") as fh:
            fh.seek(self._log_start)
            return f"on {self.address} (sqlite".encode() in fh.read()

    def stop(self) -> None:
        """SIGTERM the server (it finishes calls in flight); idempotent."""
        if self.process is not None:
            self.process.stop()

    def __enter__(self) -> MlmdServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
