"""The reaper (localcluster/reaper.py) undoes what a harness started when the harness is SIGKILLed.

A child Python process plays the harness: it starts a server in a session of its own (as every
component is started), a grandchild that left its process group (as containerd's shims do), a
temporary directory and an undo command, then prints READY and sleeps. The test SIGKILLs it: no
handler of the child runs, so whatever is cleaned up was cleaned up by the reaper.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.paths import ROOT

_HARNESS = textwrap.dedent(
    """
    import os, pathlib, subprocess, sys, time
    from localcluster import reaper, procs
    marker = reaper.session_marker()
    server = procs.Process("sleeper", ["sleep", "600"], pathlib.Path(sys.argv[1]) / "logs")
    # A process that left every group the harness knows of: only the environment marker finds it.
    escaped = subprocess.Popen(["sleep", "601"], start_new_session=True)
    tmp = reaper.temporary_dir("reaper-test-", sys.argv[1])
    (tmp / "file").write_text("x")
    flag = pathlib.Path(sys.argv[1]) / "undone"
    reaper.track_command(["touch", str(flag)])
    print("READY", server.popen.pid, escaped.pid, tmp, flag, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead; it waits only for its (new) parent to reap it.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _start_harness(tmp_path: Path) -> tuple[subprocess.Popen, list[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", _HARNESS, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    line = child.stdout.readline().split()
    assert line and line[0] == "READY", line
    return child, line[1:]


def _wait_until(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_a_killed_harness_leaves_no_process_directory_or_change_behind(tmp_path):
    child, (server, escaped, tmp, flag) = _start_harness(tmp_path)
    try:
        assert _alive(int(server)) and _alive(int(escaped)) and Path(tmp, "file").is_file()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    assert _wait_until(lambda: not _alive(int(server)) and not _alive(int(escaped))), "processes left"
    assert _wait_until(lambda: not Path(tmp).exists()), f"{tmp} left behind"
    assert _wait_until(lambda: Path(flag).exists()), "the undo command did not run"


def test_what_the_harness_stopped_itself_is_not_undone_again(tmp_path):
    script = _HARNESS.replace(
        'print("READY"',
        'reaper.untrack("command", ["touch", str(flag)]); server.stop(); reaper.remove_dir(tmp); print("READY"',
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().startswith("READY")
    child.send_signal(signal.SIGKILL)
    child.wait()
    time.sleep(3)
    assert not (tmp_path / "undone").exists(), "an untracked undo command ran"
