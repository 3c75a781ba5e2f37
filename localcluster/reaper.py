"""A watchdog that cleans up after the harness when its process dies without doing so itself.

The harness stops what it started on a normal exit, on Ctrl-C and on SIGTERM. A process killed with
SIGKILL (or by the OOM killer) runs no handler, and its components (each in its own session, so a
terminal's Ctrl-C reaches only the foreground) would run on, parented to init: etcd, the API server,
a kubelet with its mounts, pods, network namespaces and bridge. So the first component started makes
one reaper: a small Python process in a session of its own, holding the read end of a pipe whose
write end only the harness holds. What the harness starts, it tells the reaper about (`track_*`);
what it stops, it takes back (`untrack`). When the pipe reads EOF, or the reaper's parent changes,
the harness is gone, and the reaper undoes what is still tracked:

1. SIGTERM, then after a grace period SIGKILL, every tracked process group;
2. SIGKILL every process whose environment carries this session's marker (`LOCALCLUSTER_SESSION`,
   set in the harness's environment and so inherited by everything it starts, whatever session or
   process group it moved to: containerd's shims, mariadbd under its own user);
3. for a tracked node: its shims, the kubelet's pod cgroups (what containers still run), the
   mounts under its directory, the network namespaces it made, its bridge, the host paths the
   kubelet made where no flag moves them (nodeclean.py);
4. runs every tracked undo command (an address taken off loopback);
5. unmounts what is under each tracked directory and removes it.

A normal stop untracks as it goes, so at a clean exit the reaper finds nothing left and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

MARKER = "LOCALCLUSTER_SESSION"
_GRACE_S = 3.0
_lock = threading.Lock()
_pipe = None  # the write end, in the harness


def _send(message: dict) -> None:
    global _pipe
    with _lock:
        if _pipe is None:
            _pipe = _start()
        try:
            _pipe.write(json.dumps(message) + "\n")
            _pipe.flush()
        except (BrokenPipeError, ValueError):
            pass  # the reaper died: the harness's own cleanup still runs


def _start():
    # The marker goes into this process's environment first, so every child inherits it.
    os.environ[MARKER] = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "localcluster.reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of the terminal must not end it before the harness
        cwd=pathlib.Path(__file__).resolve().parents[1],
        text=True,
    )
    return proc.stdin


def session_marker() -> str:
    """This harness's marker (started on first use): every process it starts carries it."""
    _send({"op": "hello"})
    return os.environ[MARKER]


def track_group(pgid: int) -> None:
    _send({"op": "track", "kind": "group", "value": pgid})


def track_dir(path: os.PathLike | str) -> None:
    _send({"op": "track", "kind": "dir", "value": str(path)})


def track_node(entry: dict) -> None:
    """A real node: {"dir": its directory, "netns_before": the netns before it, "bridge": its bridge}."""
    _send({"op": "track", "kind": "node", "value": entry})


def track_command(argv: list[str]) -> None:
    """A command that undoes a change outside any directory (an address added to loopback)."""
    _send({"op": "track", "kind": "command", "value": list(argv)})


def temporary_dir(prefix: str, parent: str | None = None) -> pathlib.Path:
    """A new temporary directory the reaper removes if the harness dies; `remove_dir` ends it."""
    import tempfile

    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    track_dir(path)
    return path


def remove_dir(path: os.PathLike | str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    untrack("dir", path)


def untrack(kind: str, value) -> None:
    if _pipe is None:
        return
    _send({"op": "untrack", "kind": kind, "value": str(value) if kind == "dir" else value})


# -- the reaper process ---------------------------------------------------------------------
def _marked_pids(marker: str) -> list[int]:
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def _signal_groups(groups: list[int], sig: int) -> None:
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _groups_alive(groups: list[int]) -> bool:
    alive = False
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, 0)
            alive = True
    return alive


def _clean_node(node: dict) -> None:
    from localcluster import nodeclean

    node_dir = pathlib.Path(node["dir"])
    nodeclean.kill_shims(node_dir)
    nodeclean.clear_pod_cgroups()
    nodeclean.unmount_under(node_dir)
    nodeclean.remove_netns({pathlib.Path(p) for p in node["netns_before"]})
    subprocess.run(["ip", "link", "del", node["bridge"]], capture_output=True)
    nodeclean.remove_paths(node.get("made_paths", []))


def clean_up(tracked: dict[str, list], marker: str | None) -> None:
    """Undo what `tracked` holds (the reaper's work, also usable from a test)."""
    groups = list(tracked.get("group", []))
    _signal_groups(groups, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while _groups_alive(groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_groups(groups, signal.SIGKILL)
    if marker:
        for _ in range(3):  # a process forking as it dies may leave a child: look again
            pids = _marked_pids(marker)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not pids:
                break
            time.sleep(0.2)
    for node in tracked.get("node", []):
        with contextlib.suppress(Exception):
            _clean_node(node)
    for argv in tracked.get("command", []):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(argv, capture_output=True, timeout=30)
    for path in tracked.get("dir", []):
        from localcluster import nodeclean

        nodeclean.unmount_under(pathlib.Path(path))
        shutil.rmtree(path, ignore_errors=True)


def _apply(tracked: dict[str, list], message: dict) -> None:
    kind, value = message.get("kind"), message.get("value")
    if message.get("op") == "track":
        tracked.setdefault(kind, []).append(value)
    elif message.get("op") == "untrack":
        with contextlib.suppress(ValueError):
            tracked.get(kind, []).remove(value)


def serve(parent: int) -> int:
    """Read track/untrack messages until the harness is gone, then clean up what is left."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the harness's end ends the reaper
    marker = os.environ.get(MARKER)
    tracked: dict[str, list] = {}
    buffer = b""
    while True:
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], 1.0)
        if not ready:
            if os.getppid() != parent:
                break  # the harness is gone, though a process it forked still holds the pipe
            continue
        # What the harness wrote before it died is still in the pipe: read it all, up to EOF.
        chunk = os.read(sys.stdin.fileno(), 65536)
        if not chunk:
            break  # EOF: the harness closed its end, by exiting or by dying
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                _apply(tracked, json.loads(line))
    clean_up(tracked, marker)
    return 0


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
