"""What this machine must have before a real node can start (node.py); one reason, or None."""

from __future__ import annotations

import os
import pathlib
import shutil


def missing_for_real_node() -> str | None:
    """Why a real node cannot start here (the first missing prerequisite), or None."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, cgroups, a bridge)"
    if shutil.which("gcc") is None:
        return "gcc is missing: the sandbox (pause) image is compiled from the kubernetes module's pause.c"
    if not pathlib.Path("/usr/include/seccomp.h").is_file():
        return "libseccomp-dev is missing: runc is built with seccomp (apt-get install libseccomp-dev)"
    if not pathlib.Path("/bin/busybox").is_file():
        return "busybox-static is missing: the smoke pods' image (apt-get install busybox-static)"
    if shutil.which("debootstrap") is None:
        return "debootstrap is missing: the component image's base (apt-get install debootstrap)"
    return None
