"""`make cluster`, `make cluster-full` and `make model-registry` leave nothing behind (issue 34, item 6).

Each command runs as a user starts it (`python -m localcluster`, `python -m localcluster --kfp`,
`python -m localcluster.model_registry`, without make's extra process): a real subprocess in a
process group of its own, with the user's environment but a private TMPDIR, until it prints what
a user pastes into another shell. Then it is stopped: Ctrl-C (SIGINT to its process group, as a
terminal sends it) or SIGTERM, which its own handlers answer, and SIGKILL of the foreground
process, which only the reaper (localcluster/reaper.py) can answer.

Within 30 s nothing it started may be left: no process that was its descendant, carries its
session marker (LOCALCLUSTER_SESSION) or is in one of its process groups; no port those
processes listened on; no mount under its TMPDIR; no mount, loopback address, network namespace,
link, cgroup or path under /run, /var/lib, /var/log, /etc or /opt that appeared while it started;
nothing in the private TMPDIR, no SeaweedFS socket of its ports in /tmp, no kubectl cache of its
API server in ~/.kube.

The real node is one per machine (its bridge, its image store's lock), so this module must run
while no other stack holds them: file order puts it first in tests/cluster, before any session
fixture starts a control plane. A scenario whose stop leaks undoes what it found, so that the
scenarios after it start on a clean machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from localcluster import nodeclean, reaper
from localcluster.node import BRIDGE
from localcluster.prerequisites import missing_for_real_node
from tests.support.paths import ROOT

_LEFT_AFTER_S = 30.0  # the bound: nothing is left this long after the signal
# Below --timeout=900, so that a slow start fails here and is stopped, not killed with pytest.
_READY_TIMEOUT_S = {"cluster": 600.0, "cluster-full": 720.0, "model-registry": 300.0}
_HOST_DIRS = ("/run", "/var/lib", "/var/log", "/etc", "/opt")  # /var/run is /run
_COMMANDS = {
    "cluster": ["-m", "localcluster"],
    "cluster-full": ["-m", "localcluster", "--kfp"],
    "model-registry": ["-m", "localcluster.model_registry"],
}
# What each prints once it is up (localcluster/__main__.py, model_registry.py serve_forever).
_READY_LINE = {
    "cluster": "Press Ctrl-C to stop",
    "cluster-full": "Press Ctrl-C to stop",
    "model-registry": "# files: ",
}
_EXPORTS = {
    "cluster": ("KUBECONFIG",),
    "cluster-full": ("KUBECONFIG", "KF_PIPELINES_ENDPOINT", "MINIO_ENDPOINT"),
    "model-registry": ("MODEL_REGISTRY_URL",),
}


# -- what this machine holds --------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/pid/stat after the command name (state is [0], ppid [1], pgrp [2])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _environ_marker(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if entry.startswith(f"{reaper.MARKER}=".encode()):
                return entry.split(b"=", 1)[1].decode()
    return None


def _listening_inodes() -> dict[str, int]:
    """socket inode -> port, for every TCP socket listening on this machine."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "0A":  # TCP_LISTEN
                    found[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
    return found


def _ports_of(pids: set[int]) -> set[int]:
    listening = _listening_inodes()
    ports = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in listening:
                        ports.add(listening[target[8:-1]])
    return ports


def _ip_json(*args: str) -> list[dict]:
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True)
    return json.loads(out.stdout or "[]") if out.returncode == 0 else []


def _weed_sockets() -> list[Path]:
    """SeaweedFS's unix sockets, in /tmp whatever TMPDIR says: /tmp/seaweedfs-<service>-<port>.sock."""
    return [p for p in Path("/tmp").glob("seaweedfs-*.sock") if p.stem.rpartition("-")[2].isdigit()]


@dataclass(frozen=True)
class HostState:
    """What the machine holds outside the processes: compared before the start and after the stop."""

    mounts: frozenset[str]
    loopback: frozenset[str]
    links: frozenset[str]
    netns: frozenset[str]
    cgroups: frozenset[str]
    host_paths: frozenset[str]

    @classmethod
    def now(cls) -> HostState:
        with open("/proc/self/mountinfo") as fh:
            mounts = frozenset(line.split()[4] for line in fh)
        lo = _ip_json("addr", "show", "dev", "lo")
        return cls(
            mounts=mounts,
            loopback=frozenset(a["local"] for link in lo for a in link.get("addr_info", [])),
            links=frozenset(link["ifname"] for link in _ip_json("link", "show")),
            netns=frozenset(map(str, nodeclean.NETNS.glob("*"))) if nodeclean.NETNS.is_dir() else frozenset(),
            # A kubelet's kubepods tree, or any other cgroup made at the top of a hierarchy.
            cgroups=frozenset(str(d) for d in nodeclean.CGROUP_ROOT.glob("*/*/") if d.is_dir()),
            # What a kubelet, containerd or CNI makes by default outside its configured directories.
            host_paths=frozenset(str(p) for top in _HOST_DIRS for p in Path(top).glob("*")),
        )

    def added_since(self, before: HostState) -> dict[str, list[str]]:
        return {
            name: sorted(getattr(self, name) - getattr(before, name))
            for name in self.__dataclass_fields__
            if getattr(self, name) - getattr(before, name)
        }


# -- one foreground command -------------------------------------------------------------------
@dataclass
class Foreground:
    """A foreground command as a user runs it; what it started, as seen while it was up."""

    name: str
    tmpdir: Path
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    marker: str | None = None
    started: dict[int, str] = field(default_factory=dict)  # pid -> its start time (pid reuse)
    groups: set[int] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)
    added_while_up: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def start(cls, name: str, tmpdir: Path) -> Foreground:
        env = {k: v for k, v in os.environ.items() if k != reaper.MARKER}  # a user's shell has none
        env["TMPDIR"] = str(tmpdir)
        proc = subprocess.Popen(
            [sys.executable, *_COMMANDS[name]],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, as a shell's job control gives it
        )
        return cls(name, tmpdir, proc)

    def wait_ready(self, before: HostState) -> float:
        """Wait for the ready line; record what the command started. Returns the seconds it took."""
        started = time.monotonic()
        lines: queue.Queue[str | None] = queue.Queue()

        def read() -> None:
            for line in self.proc.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        deadline = started + _READY_TIMEOUT_S[self.name]
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(
                    f"{self.name} not ready after {_READY_TIMEOUT_S[self.name]:.0f} s:\n{self.output()}"
                )
            if line is None:
                self.proc.wait()
                pytest.fail(
                    f"{self.name} exited ({self.proc.returncode}) before it was ready:\n{self.output()}"
                )
            self.lines.append(line)
            if line.startswith(_READY_LINE[self.name]):
                break
        ready_in = time.monotonic() - started
        # Its later output (the stop's) is still collected, for a failure's report.
        threading.Thread(
            target=lambda: [self.lines.append(x) for x in iter(lines.get, None)], daemon=True
        ).start()
        for key in _EXPORTS[self.name]:
            assert self.exported(key), f"{self.name} did not print export {key}=...:\n{self.output()}"
        self._record()
        self.added_while_up = HostState.now().added_since(before)
        return ready_in

    def exported(self, key: str) -> str | None:
        for line in self.lines:
            if line.startswith(f"export {key}="):
                return line.split("=", 1)[1]
        return None

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def _record(self) -> None:
        stats = {pid: s for pid in _pids() if (s := _stat(pid))}
        children = [pid for pid, s in stats.items() if int(s[1]) == self.proc.pid]
        self.marker = next(filter(None, map(_environ_marker, children)), None)
        tree = {self.proc.pid}
        grew = True
        while grew:
            more = {pid for pid, s in stats.items() if int(s[1]) in tree} - tree
            tree |= more
            grew = bool(more)
        if self.marker:
            tree |= {pid for pid in stats if _environ_marker(pid) == self.marker}
        self.started = {pid: stats[pid][19] for pid in tree if pid in stats}
        self.groups = {int(stats[pid][2]) for pid in self.started}
        self.ports = _ports_of(set(self.started))

    # -- after the stop --------------------------------------------------------------------
    def processes_left(self) -> list[str]:
        left = []
        for pid in _pids():
            s = _stat(pid)
            if s is None or s[0] == "Z":  # a zombie is dead; only its parent's wait is missing
                continue
            why = []
            if self.started.get(pid) == s[19]:
                why.append("started by it")
            if int(s[2]) in self.groups:
                why.append(f"in its process group {s[2]}")
            if self.marker and _environ_marker(pid) == self.marker:
                why.append("carries its marker")
            if why:
                with contextlib.suppress(OSError):
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
                    left.append(f"{pid} ({', '.join(why)}): {cmd}")
        return left

    def leftovers(self, before: HostState) -> dict[str, list[str]]:
        # The machine-wide state counts where it changed while this command started (another
        # stack on the machine may change it later), and the mounts under its TMPDIR in any case.
        now = HostState.now()
        left = {
            name: kept
            for name, added in now.added_since(before).items()
            if (kept := sorted(set(added) & set(self.added_while_up.get(name, []))))
        }
        if mounts := sorted(m for m in now.mounts if m.startswith(f"{self.tmpdir}/")):
            left["mounts under its TMPDIR"] = mounts
        if processes := self.processes_left():
            left["processes"] = processes
        if ports := self.ports & set(_listening_inodes().values()):
            left["listening ports"] = sorted(map(str, ports))
        if self.tmpdir.exists() and (files := sorted(p.name for p in self.tmpdir.iterdir())):
            left["in its TMPDIR"] = files
        if sockets := [str(p) for p in _weed_sockets() if int(p.stem.rpartition("-")[2]) in self.ports]:
            left["weed sockets in /tmp"] = sockets
        discovery = Path.home() / ".kube" / "cache" / "discovery"
        if caches := [str(discovery / f"127.0.0.1_{port}") for port in sorted(self.ports)
                      if (discovery / f"127.0.0.1_{port}").exists()]:  # fmt: skip
            left["kubectl caches in ~/.kube"] = caches
        return left


def _other_stacks(marker: str | None) -> list[str]:
    """Processes of other harnesses on this machine (another marker): what else may have changed it."""
    return [str(pid) for pid in _pids() if (m := _environ_marker(pid)) and m != marker][:20]


def _undo(fg: Foreground, left: dict[str, list[str]]) -> None:
    """Remove what a leaking stop left, so that the scenarios after this one start clean."""
    for line in left.get("processes", []):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), signal.SIGKILL)
    for point in sorted(
        left.get("mounts", []) + left.get("mounts under its TMPDIR", []), key=len, reverse=True
    ):
        subprocess.run(["umount", "-l", point], capture_output=True)
    for address in left.get("loopback", []):
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], capture_output=True)
    for link in left.get("links", []):
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    with contextlib.suppress(Exception):
        nodeclean.clear_pod_cgroups()
    for netns in left.get("netns", []):
        subprocess.run(["umount", netns], capture_output=True)
        with contextlib.suppress(OSError):
            os.unlink(netns)
    for path in left.get("host_paths", []):
        nodeclean.remove_paths([path])
    for path in left.get("kubectl caches in ~/.kube", []):
        shutil.rmtree(path, ignore_errors=True)
    for path in left.get("weed sockets in /tmp", []):
        with contextlib.suppress(OSError):
            os.unlink(path)
    nodeclean.unmount_under(fg.tmpdir)


@pytest.fixture
def private_tmpdir():
    # Short: a real node's unix sockets live under it (108 bytes at most, node.py), and it is
    # world-writable like /tmp, since mariadbd runs as `mysql` and must enter its directory.
    path = Path(tempfile.mkdtemp(prefix="c10s-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    nodeclean.unmount_under(path)
    shutil.rmtree(path, ignore_errors=True)


def _start_and_stop(name: str, how: signal.Signals, tmpdir: Path, record_timing) -> Foreground:
    before = HostState.now()
    if name == "cluster-full" and BRIDGE in before.links:
        pytest.fail(
            f"a real node is up on this machine (bridge {BRIDGE}): run this module before any other stack"
        )
    fg = Foreground.start(name, tmpdir)
    try:
        ready_in = fg.wait_ready(before)
        record_timing(f"clean stop: make {name} ready ({how.name} run)", ready_in)
        assert fg.marker, f"no child of {name} carries {reaper.MARKER}: is the reaper started?"
        assert fg.ports, f"{name} listened on no port: nothing was started?\n{fg.output()}"
        _check_up(fg)
        signalled = time.monotonic()
        if how == signal.SIGINT:
            os.killpg(fg.proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        else:
            os.kill(fg.proc.pid, how)
        try:
            code = fg.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still running 120 s after {how.name}:\n{fg.output()}")
        exited_in = time.monotonic() - signalled
        if how != signal.SIGKILL:
            assert code == 0, f"{name} exited {code} on {how.name}:\n{fg.output()}"
        # The signal of a SIGKILL is also when the reaper starts; a handled stop is given the same
        # 30 s after the command's own exit, for the reaper to see that exit and have nothing to do.
        deadline = time.monotonic() + _LEFT_AFTER_S
        while (left := fg.leftovers(before)) and time.monotonic() < deadline:
            time.sleep(0.5)
        record_timing(
            f"clean stop: make {name} {how.name} (exit, then all gone)", time.monotonic() - signalled
        )
        if left:
            _undo(fg, left)
            if others := _other_stacks(fg.marker):
                left["(other localcluster stacks ran meanwhile: their processes)"] = others
        assert not left, (
            f"{_LEFT_AFTER_S:.0f} s after {name} exited on {how.name} (in {exited_in:.1f} s), these were left:\n"
            + json.dumps(left, indent=1)
            + f"\n--- its output:\n{fg.output()}"
        )
    finally:
        if fg.proc.poll() is None:  # a failure before the stop: stop it as a user would
            os.killpg(fg.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                fg.proc.wait(timeout=120)
    return fg


def _check_up(fg: Foreground) -> None:
    """What it printed answers: the ready line is not printed before the stack is up."""
    if fg.name == "cluster-full":
        url = f"{fg.exported('KF_PIPELINES_ENDPOINT')}/apis/v2beta1/healthz"
        assert re.search(r"^real node \S+ up", "\n".join(fg.lines), re.M), (
            f"cluster-full started no real node:\n{fg.output()}"
        )
    elif fg.name == "model-registry":
        url = f"{fg.exported('MODEL_REGISTRY_URL')}/readyz/health"
    else:
        return  # the KUBECONFIG's API server: its port is among fg.ports
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        assert resp.status == 200, url


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_make_cluster_stops_clean(how, private_tmpdir, record_timing):
    _start_and_stop("cluster", how, private_tmpdir, record_timing)


@pytest.mark.skipif(missing_for_real_node() is not None, reason=str(missing_for_real_node()))
def test_make_cluster_full_stops_clean_when_killed(private_tmpdir, record_timing):
    fg = _start_and_stop("cluster-full", signal.SIGKILL, private_tmpdir, record_timing)
    # Not vacuous: while it was up, the machine held a real node's bridge and the kubernetes
    # Service's address on loopback (clusterip.py), which the reaper then had to remove.
    assert BRIDGE in fg.added_while_up.get("links", []), fg.added_while_up
    assert fg.added_while_up.get("loopback"), fg.added_while_up


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_make_model_registry_stops_clean(how, private_tmpdir, record_timing):
    _start_and_stop("model-registry", how, private_tmpdir, record_timing)
