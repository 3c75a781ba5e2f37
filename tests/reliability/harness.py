"""Machinery for the reliability suite: figures, a secret scanner, process control and an S3 proxy.

Nothing here mocks the product. The processes are the real ``cifar10-kfp`` console script,
the object store is the real embedded SeaweedFS server, and the proxy is a plain TCP relay
that only *reads* the HTTP request heads passing through it, so a test can act at an exact
moment of the protocol (half of a checkpoint body sent, a pointer written) and can slow one
kind of upload down to widen the window it wants to hit.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------ figures


@dataclass
class InputFigure:
    """How many hostile or invalid inputs of one kind were tried, and how many were rejected."""

    tried: int = 0
    rejected: int = 0
    accepted_valid: int = 0  # valid inputs that had to pass (fuzzing checks both directions)


@dataclass
class Figures:
    """What the suite measured; printed as the closing table by ``pytest_terminal_summary``."""

    kills: list[dict] = field(default_factory=list)  # {"point", "epoch", "survived"}
    kill_seed: int | None = None
    outage_s: list[float] = field(default_factory=list)  # seconds the store was down while a run survived
    # {"survived", "interval_steps", "pointer_step_at_kill", "resumed_step"}: elastic runs that lost a node
    node_losses: list[dict] = field(default_factory=list)
    budget_exhausted: list[dict] = field(default_factory=list)  # {"clear_error", "resumed"}
    inputs: dict[str, InputFigure] = field(default_factory=dict)
    secret_surfaces: dict[str, dict] = field(default_factory=dict)  # label -> {"files", "bytes", "hits"}
    notes: list[str] = field(default_factory=list)

    def input(self, kind: str) -> InputFigure:
        return self.inputs.setdefault(kind, InputFigure())

    def record_rejection(self, kind: str, rejected: bool) -> None:
        figure = self.input(kind)
        figure.tried += 1
        figure.rejected += int(rejected)

    @property
    def secret_hits(self) -> int:
        return sum(s["hits"] for s in self.secret_surfaces.values())

    def as_dict(self) -> dict:
        return {
            "kills_survived": sum(1 for k in self.kills if k["survived"]),
            "kills": self.kills,
            "kill_seed": self.kill_seed,
            "outage_seconds_survived": round(sum(self.outage_s), 1),
            "node_losses_survived": sum(1 for n in self.node_losses if n["survived"]),
            "node_losses": self.node_losses,
            "budget_exhausted": self.budget_exhausted,
            "inputs": {k: vars(v) for k, v in sorted(self.inputs.items())},
            "inputs_tried": sum(v.tried for v in self.inputs.values()),
            "inputs_rejected": sum(v.rejected for v in self.inputs.values()),
            "secret_hits": self.secret_hits,
            "secret_surfaces": self.secret_surfaces,
            "notes": self.notes,
        }

    def table_lines(self) -> list[str]:
        d = self.as_dict()
        lines = []
        if self.kills:
            points = ", ".join(
                f"{k['point']}@e{k['epoch']}{'' if k['survived'] else ' (LOST)'}" for k in self.kills
            )
            lines.append(
                f"kills survived (kill -9, bitwise-exact resume)  {d['kills_survived']}/{len(self.kills)}"
            )
            lines.append(f"    seed {self.kill_seed}: {points}")
        if self.node_losses:
            intervals = sorted({n["interval_steps"] for n in self.node_losses})
            within = all(n["resumed_step"] >= n["pointer_step_at_kill"] for n in self.node_losses)
            lines.append(
                f"node losses survived (elastic)                 {d['node_losses_survived']}/{len(self.node_losses)}, "
                f"progress lost {'<=' if within else 'MORE THAN'} interval "
                f"({'/'.join(map(str, intervals))} steps)"
            )
        if self.outage_s or self.budget_exhausted:
            lines.append(
                f"outage seconds survived                        {d['outage_seconds_survived']:.1f} s"
            )
        for item in self.budget_exhausted:
            lines.append(
                "    store down past the retry budget: clear error "
                f"{'yes' if item['clear_error'] else 'NO'}, resumed after return {'yes' if item['resumed'] else 'NO'}"
            )
        if self.inputs:
            lines.append(
                f"inputs tried / rejected                        {d['inputs_tried']} / {d['inputs_rejected']}"
            )
            for kind, fig in sorted(self.inputs.items()):
                extra = f"  (+{fig.accepted_valid} valid accepted)" if fig.accepted_valid else ""
                lines.append(f"    {kind:<42} {fig.tried} / {fig.rejected}{extra}")
        if self.secret_surfaces:
            scanned = sum(s["bytes"] for s in self.secret_surfaces.values())
            files = sum(s["files"] for s in self.secret_surfaces.values())
            lines.append(
                f"secret hits                                    {self.secret_hits}"
                f"  ({len(self.secret_surfaces)} surfaces, {files} items, {scanned / 1e6:.1f} MB scanned)"
            )
            for label, s in sorted(self.secret_surfaces.items()):
                lines.append(f"    {label:<42} {s['hits']} hits in {s['files']} items")
        lines.extend(f"note: {n}" for n in self.notes)
        return lines


FIGURES = Figures()

# ------------------------------------------------------------------------ secret scan


@dataclass(frozen=True)
class FakeCredentials:
    """Recognisable fake credentials, with a secret that is random per test session."""

    access_key: str
    secret_key: str

    def needles(self) -> list[bytes]:
        """Byte patterns whose presence anywhere means the secret leaked (plain and base64)."""
        raw = self.secret_key.encode()
        out = [raw, base64.b64encode(raw).rstrip(b"=")]
        # base64 of the secret inside a longer value starts at one of three alignments.
        for pad in (b"x", b"xx"):
            encoded = base64.b64encode(pad + raw)
            out.append(encoded[4 : len(encoded) - 4])
        return [n for n in out if len(n) >= 16]


def scan_for_secret(
    creds: FakeCredentials, label: str, sources: Iterable[str | os.PathLike | bytes]
) -> list[str]:
    """Search files, directories (recursively) and byte strings for the secret; record and return hits.

    Each hit is described as ``"<file or source>: ...context..."`` without the secret itself.
    """
    needles = creds.needles()
    hits: list[str] = []
    files = scanned = 0

    def check(name: str, data: bytes) -> None:
        nonlocal files, scanned
        files += 1
        scanned += len(data)
        for needle in needles:
            start = data.find(needle)
            while start != -1:
                context = data[max(0, start - 40) : start].decode("utf-8", "replace")
                hits.append(f"{name}: ...{context}<SECRET>")
                start = data.find(needle, start + 1)

    for source in sources:
        if isinstance(source, bytes):
            check("<bytes>", source)
            continue
        path = Path(source)
        if path.is_dir():
            for child in sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
                check(str(child), child.read_bytes())
        elif path.is_file():
            check(str(path), path.read_bytes())
    surface = FIGURES.secret_surfaces.setdefault(label, {"files": 0, "bytes": 0, "hits": 0})
    surface["files"] += files
    surface["bytes"] += scanned
    surface["hits"] += len(hits)
    return hits


# ---------------------------------------------------------------------- processes


def product_env(server, prefix: str) -> dict[str, str]:
    """The environment a product process gets: ``server``'s MINIO_* settings, ``prefix``, CPU only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINIO_", "CIFAR10_KFP_"))}
    env.update(server.env())
    env.update(
        {
            "CIFAR10_KFP_PREFIX": prefix,
            "CIFAR10_KFP_RETRY_BUDGET_S": "20",
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def cli_command(*args: str) -> list[str]:
    """The ``cifar10-kfp`` console script of this interpreter's environment, with ``args``."""
    script = Path(sys.executable).with_name("cifar10-kfp")
    if script.is_file():
        return [str(script), *args]
    return [sys.executable, "-m", "cifar10_kfp_pipelines.cli", *args]


class Proc:
    """A product process in its own process group; stdout and stderr captured to one log file.

    Every output line is also kept with the monotonic time it arrived, so a test can tell what
    the process printed while, say, the object store was down.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str], log_path: Path, cwd: Path | None = None):
        self.argv = argv
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.lines: list[tuple[float, str]] = []
        self.started = time.monotonic()
        self.killed_at: float | None = None
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd or ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group we can kill as a whole, like a preempted pod
        )
        self._reader = threading.Thread(target=self._read, name=f"proc-{self.popen.pid}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log_path, "ab") as log:
            for raw in iter(self.popen.stdout.readline, b""):
                log.write(raw)
                log.flush()
                self.lines.append((time.monotonic(), raw.decode("utf-8", "replace").rstrip("\n")))
        self.popen.stdout.close()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group, at once and without warning."""
        if self.killed_at is None:
            self.killed_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> int:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            self.popen.wait()
            self._reader.join(5)
            raise AssertionError(
                f"{' '.join(self.argv)} did not finish within {timeout:g}s; output:\n{self.output()[-4000:]}"
            ) from None
        self._reader.join(10)
        return code

    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)


class CommandLineSampler:
    """Samples the command lines of every process in some sessions (a process tree started by ``Proc``).

    A secret passed as an argument is readable by any local user in ``/proc/<pid>/cmdline``;
    credentials must travel in the environment or in files, so the samples are scanned too.
    """

    def __init__(self, session_ids: list[int], interval_s: float = 0.25):
        self.session_ids = set(session_ids)
        self.interval_s = interval_s
        self.samples: dict[int, bytes] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cmdline-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    stat = (entry / "stat").read_text()
                    session = int(stat.rsplit(")", 1)[1].split()[3])  # field 6: session id
                    if session in self.session_ids:
                        self.samples[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                except (OSError, ValueError, IndexError):
                    continue
            self._stop.wait(self.interval_s)

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(5)
        return list(self.samples.values())


def run_cli(args: list[str], *, env: dict[str, str], log_path: Path, timeout: float = 300) -> tuple[int, str]:
    """Run ``cifar10-kfp args`` to completion; returns (exit code, combined output)."""
    proc = Proc(cli_command(*args), env=env, log_path=log_path)
    code = proc.wait(timeout)
    return code, proc.output()


# ------------------------------------------------------------------ fake endpoint


class ConnectionCounter:
    """A listening socket on 127.0.0.1 that accepts and counts connections, then hangs up."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.count = 0
        self._stop = False
        threading.Thread(target=self._loop, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _loop(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()

    def close(self):
        self._stop = True
        self.sock.close()


# ----------------------------------------------------------------------- S3 proxy


@dataclass
class RequestEvent:
    """One HTTP request seen by the proxy; ``progress`` is called as its body goes through."""

    method: str
    path: str
    length: int
    started: float
    sent: int = 0
    finished: float | None = None  # when the whole body was forwarded
    body: bytes = b""  # captured for small bodies (pointers, metadata), for assertions


class S3Proxy:
    """A TCP relay to the object store that parses request heads, can throttle and can trigger.

    ``throttle(pattern, bytes_per_s)`` slows the bodies of requests whose path matches.
    ``on_progress(callback)`` calls ``callback(event)`` after each forwarded piece of a body and
    once more when it is complete; a callback may kill the client at that exact point.
    Responses are relayed untouched. Requests are sent by the minio client as plain HTTP/1.1
    with a Content-Length (the store is on 127.0.0.1 without TLS), which is all this parses.
    """

    CHUNK = 16 * 1024
    CAPTURE_LIMIT = 64 * 1024

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.events: list[RequestEvent] = []
        self._callbacks: list[Callable[[RequestEvent], None]] = []
        self._throttle: tuple[re.Pattern, float] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept_loop, name="s3proxy-accept", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def throttle(self, pattern: str | None, bytes_per_s: float = 0.0) -> None:
        self._throttle = (re.compile(pattern), bytes_per_s) if pattern else None

    def on_progress(self, callback: Callable[[RequestEvent], None] | None) -> None:
        with self._lock:
            self._callbacks = [callback] if callback else []

    def requests(self, method: str | None = None, pattern: str | None = None) -> list[RequestEvent]:
        with self._lock:
            events = list(self.events)
        return [
            e
            for e in events
            if (method is None or e.method == method) and (pattern is None or re.search(pattern, e.path))
        ]

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    # -- internals --------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="s3proxy-conn", daemon=True).start()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.update(socks)

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()  # store down: the client sees a reset, as it would without the proxy
            return
        self._track(client, upstream)
        threading.Thread(target=self._pipe, args=(upstream, client), name="s3proxy-down", daemon=True).start()
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = client.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0") or 0)
                if "chunked" in headers.get("transfer-encoding", ""):
                    raise RuntimeError("S3Proxy does not relay chunked request bodies")
                event = RequestEvent(method, path, length, time.monotonic())
                with self._lock:
                    self.events.append(event)
                upstream.sendall(head + b"\r\n\r\n")
                buffer = self._forward_body(client, upstream, event, buffer)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def _forward_body(
        self, client: socket.socket, upstream: socket.socket, event: RequestEvent, buffer: bytes
    ) -> bytes:
        throttle = self._throttle
        rate = throttle[1] if throttle and throttle[0].search(event.path) else 0.0
        remaining = event.length
        while remaining > 0:
            if not buffer:
                buffer = client.recv(min(65536, remaining))
                if not buffer:
                    raise OSError("client closed mid-body")
            piece, buffer = buffer[: min(self.CHUNK, remaining)], buffer[min(self.CHUNK, remaining) :]
            upstream.sendall(piece)
            remaining -= len(piece)
            event.sent += len(piece)
            if len(event.body) < self.CAPTURE_LIMIT:
                event.body += piece[: self.CAPTURE_LIMIT - len(event.body)]
            if remaining == 0:
                event.finished = time.monotonic()
            self._notify(event)
            if rate and remaining:
                time.sleep(len(piece) / rate)
        if event.length == 0:
            event.finished = time.monotonic()
            self._notify(event)
        return buffer

    def _notify(self, event: RequestEvent) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback(event)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


def pointer_body_epoch(event: RequestEvent) -> int | None:
    """The epoch a ``latest.json`` checkpoint pointer upload names, from its captured body."""
    try:
        return int(json.loads(event.body)["epoch"])
    except (ValueError, KeyError, TypeError):
        return None


def wait_until(
    predicate: Callable[[], object], timeout: float, interval: float = 0.02, what: str = "condition"
):
    """Poll ``predicate`` until it returns something truthy; returns it, or fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
