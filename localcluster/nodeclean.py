"""What a real node leaves behind outside its own directory, removed when it stops.

The shims detach from containerd (so containers survive a containerd restart), the kubelet's pod
cgroups live under /sys/fs/cgroup/*/kubepods, and containerd pins each sandbox's network namespace
under /run/netns. Each is found precisely (by the node's directory, the kubelet's cgroup tree, the
namespaces that appeared while the node ran) and ended by pid or path, never by name.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess

NETNS = pathlib.Path("/run/netns")
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")


def kill_shims(node_dir: pathlib.Path) -> None:
    """SIGKILL the containerd shims whose command line names `node_dir` (their socket's home)."""
    marker = str(node_dir).encode()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and b"containerd-shim" in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), 9)


def clear_pod_cgroups() -> None:
    """End what is left in the kubelet's pod cgroups, then remove them, deepest first."""
    for proc_file in (CGROUP_ROOT / "pids" / "kubepods").rglob("cgroup.procs"):
        for pid in proc_file.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
    for hierarchy in CGROUP_ROOT.iterdir():
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        for directory in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def sandbox_netns() -> set[pathlib.Path]:
    return set(NETNS.glob("cni-*")) if NETNS.is_dir() else set()


def remove_netns(before: set[pathlib.Path]) -> None:
    """Unmount and remove the sandbox network namespaces that were not there at `before`."""
    for netns in sandbox_netns() - before:
        subprocess.run(["umount", str(netns)], capture_output=True)
        with contextlib.suppress(OSError):
            netns.unlink()


def unmount_under(directory: pathlib.Path) -> None:
    """Lazily unmount every mount point under `directory` (overlay rootfs, emptyDir tmpfs ...)."""
    prefix = str(directory) + "/"
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh if line.split()[4].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def remove_paths(paths: list[str]) -> None:
    """Remove the host paths a node made where no flag moves them (unmounting what is under them first)."""
    for path in paths:
        unmount_under(pathlib.Path(path))
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
