"""Run the ``cifar10-kfp`` console script as a user does: a fresh process, in a given folder, with no
object store, cluster or KFP login configured (issue 26: every command tested the way a user meets it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT

SCRIPT = Path(sys.executable).with_name("cifar10-kfp")
_CONFIGURED = ("MINIO_", "CIFAR10_KFP_", "KF_PIPELINES_", "KUBERNETES_SERVICE_")


def user_env(**extra: str) -> dict[str, str]:
    """This environment without an object store, a cluster or a KFP login configured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CONFIGURED)}
    env["PYTHONPATH"] = str(ROOT)
    return {**env, **extra}


def command(*args: str) -> list[str]:
    """The console script (or, where it is not installed next to this Python, the module) with ``args``."""
    base = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "cifar10_kfp_pipelines.cli"]
    return [*base, *args]


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 180):
    """Run ``cifar10-kfp *args`` in ``cwd``; the ``CompletedProcess`` with text output."""
    return subprocess.run(
        command(*args), cwd=cwd, env=env or user_env(), capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
