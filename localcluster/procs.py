"""Child processes of the harness: each in its own process group, logged to a file, always reaped.

Every component runs in a new session (its own process group), so stopping it signals the whole
group: nothing a component forks outlives the harness. Waits are readiness checks polled against a
deadline, never fixed sleeps; a process that exits while being waited on fails at once with the
tail of its log.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from localcluster import reaper

_LIVE: list[Process] = []


def child_env() -> dict[str, str]:
    """The environment for components: no proxy, so webhook calls to 127.0.0.1 go direct."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Process:
    def __init__(
        self,
        name: str,
        argv: list[str],
        log_dir: pathlib.Path,
        cwd: pathlib.Path | None = None,
        env: dict[str, str] | None = None,
    ):
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**child_env(), **(env or {})},
            start_new_session=True,
        )
        reaper.track_group(self.popen.pid)
        _LIVE.append(self)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise RuntimeError(
                f"{self.name} exited with status {code}; last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after grace_s; idempotent."""
        if self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # Kill whatever is left of the group (the leader may have exited before its children).
        _signal_group(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()
        reaper.untrack("group", self.popen.pid)
        if self in _LIVE:
            _LIVE.remove(self)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _stop_all() -> None:
    # The last line of defence: an interpreter exit (a test run stopped by Ctrl-C included) still
    # stops every component this process started, newest first.
    for proc in reversed(list(_LIVE)):
        proc.stop(grace_s=3.0)


def wait_for(
    what: str, check: Callable[[], bool], timeout_s: float, procs: list[Process] = (), interval_s: float = 0.2
) -> None:
    """Poll check() until it is true; fail after timeout_s, or at once when one of procs exits."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        for proc in procs:
            proc.check_alive()
        try:
            if check():
                return
            last_error = None
        except Exception as exc:  # noqa: BLE001 - the last error is reported when the wait fails
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            logs = "".join(f"\n--- {p.log_path}:\n{p.log_tail(15)}" for p in procs)
            raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s{detail}{logs}")
        time.sleep(interval_s)


def https_ok(url: str, context: ssl.SSLContext, expect: bytes = b"ok") -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as resp:
            return resp.status == 200 and resp.read().strip() == expect
    except (urllib.error.URLError, OSError):
        return False


def insecure_context() -> ssl.SSLContext:
    """For health endpoints serving self-signed certificates (kcm, scheduler): only 'ok' is read."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
