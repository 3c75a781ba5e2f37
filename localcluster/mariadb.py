"""A throwaway MariaDB from Debian's ``mariadb-server`` package, for the harness's real servers.

Used by the Model Registry harness (localcluster/model_registry.py) and the KFP backend
(localcluster/kfp.py), as their upstream manifests deploy MySQL beside them. The instance
lives in a temporary data directory on a free loopback port, runs as the unprivileged ``mysql``
user when we are root, and has no password anywhere: root logs in over the socket only, and each
server gets its own passwordless user that may connect from 127.0.0.1 alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from cifar10_kfp.storage.embedded import stop_process_group
from localcluster import reaper

_PR_SET_PDEATHSIG = 1
_SEARCH = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")


class DatabaseError(RuntimeError):
    """MariaDB could not be started or set up."""


def find_program(*names: str) -> str:
    for name in names:
        found = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *_SEARCH]))
        if found:
            return found
    raise DatabaseError(
        f"{' / '.join(names)} not found: install Debian's MariaDB server "
        "(apt-get install -y --no-install-recommends mariadb-server); .ci/run does this in CI"
    )


def preexec_session() -> None:  # runs in the child between fork and exec
    os.setsid()
    if threading.current_thread() is threading.main_thread():
        # PR_SET_PDEATHSIG fires when the forking *thread* exits: only safe from the main thread.
        # mariadbd --user=mysql loses it when it changes user (the kernel clears it on a credential
        # change): as root, only the reaper stops it after a SIGKILL of the harness.
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _as_mysql_user() -> list[str]:
    """mariadbd refuses to run as root unless told which user to become: the packaged ``mysql``."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("mysql")
    except KeyError as exc:
        raise DatabaseError("running as root but there is no 'mysql' user to run MariaDB as") from exc
    return ["--user=mysql"]


class MariaDB:
    """One mariadbd in `work_dir` on 127.0.0.1:`port`; `create(database, user)` adds a database."""

    def __init__(self, work_dir: Path, port: int, start_timeout_s: float = 90.0):
        self.work_dir, self.port, self.start_timeout_s = work_dir, port, start_timeout_s
        self._proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.work_dir / "mariadb.err"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def _client(self) -> list[str]:
        socket_path = self.work_dir / "mysqld.sock"
        return [find_program("mariadb", "mysql"), "--no-defaults", f"--socket={socket_path}", "-u", "root"]

    def start(self) -> None:
        datadir = self.work_dir / "db"
        as_user = _as_mysql_user()
        if as_user:
            shutil.chown(self.work_dir, user="mysql")
        install = [find_program("mariadb-install-db", "mysql_install_db"), "--no-defaults", f"--datadir={datadir}",
                   "--auth-root-authentication-method=socket", "--skip-test-db", *as_user]  # fmt: skip
        done = subprocess.run(install, capture_output=True, text=True, timeout=120, cwd=self.work_dir)
        if done.returncode != 0:
            raise DatabaseError(f"mariadb-install-db failed ({done.returncode}): {done.stderr[-2000:]}")
        self._proc = subprocess.Popen(
            [find_program("mariadbd", "mysqld"), "--no-defaults", f"--datadir={datadir}", *as_user,
             "--bind-address=127.0.0.1", f"--port={self.port}", f"--socket={self.work_dir / 'mysqld.sock'}",
             f"--pid-file={self.work_dir / 'mysqld.pid'}", f"--log-error={self.log}",
             "--skip-name-resolve", "--innodb-buffer-pool-size=32M", "--skip-log-bin"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            preexec_fn=preexec_session, cwd=self.work_dir,
        )  # fmt: skip
        reaper.track_group(self._proc.pid)
        deadline = time.monotonic() + self.start_timeout_s
        while not self._sql_ok("SELECT 1"):
            if self._proc.poll() is not None:
                raise DatabaseError(f"MariaDB exited with code {self._proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                raise DatabaseError(f"MariaDB was not ready within {self.start_timeout_s:g}s; see {self.log}")
            time.sleep(0.2)

    def create(self, database: str, user: str, *, global_grants: bool = False) -> None:
        """Create `database` and a passwordless `user`@127.0.0.1 that owns it (or every database)."""
        scope = "*.*" if global_grants else f"{database}.*"
        sql = (
            f"CREATE DATABASE {database} CHARACTER SET utf8mb4;"
            f"CREATE USER '{user}'@'127.0.0.1';"
            f"GRANT ALL PRIVILEGES ON {scope} TO '{user}'@'127.0.0.1';"
        )
        done = subprocess.run([*self._client, "-e", sql], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise DatabaseError(f"creating database {database!r} failed: {done.stderr.strip()}")

    def _sql_ok(self, sql: str) -> bool:
        return subprocess.run([*self._client, "-e", sql], capture_output=True, timeout=30).returncode == 0

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        stop_process_group(proc, grace_s=20.0)  # mariadbd shuts down cleanly on SIGTERM in about a second
        if proc is not None:
            reaper.untrack("group", proc.pid)
