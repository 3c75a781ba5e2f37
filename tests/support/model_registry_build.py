"""Build the Kubeflow Model Registry server from its Go module, once, into a cache outside the repository.

Which release: Kubeflow's distribution (kubeflow/manifests) ships v0.3.4 in Kubeflow 1.11.0 and
v0.3.8 on its master branch, but the Go module proxy refuses every
``github.com/kubeflow/model-registry`` version after v0.3.0 here ("403 Forbidden ... This module
version is not available"). v0.3.0 is the newest release it serves, the one Kubeflow's manifests
shipped from September 2025, and it has the same ``proxy`` command, ``embedmd`` datastore and
``/api/model_registry/v1alpha3`` REST API as the releases after it up to v0.3.4.

Why a wrapper module: the registry's go.mod replaces its sibling module
``github.com/kubeflow/model-registry/pkg/openapi`` with ``./pkg/openapi``, so
``go install github.com/kubeflow/model-registry@v0.3.0`` is refused. A wrapper that requires the
registry and maps that replace onto the sibling's own release of the same tag builds it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

MODULE = "github.com/kubeflow/model-registry"
VERSION = "v0.3.0"
# The sibling module the registry's go.mod replaces with a directory; tagged with each release.
OPENAPI_MODULE = f"{MODULE}/pkg/openapi"
# The REST API this release serves; the pinned client ``model-registry==0.3.0`` calls it (clients up to
# 0.3.8 do; 0.3.12 calls /api/model_registry/v1, which this server answers with 404).
API_PREFIX = "/api/model_registry/v1alpha3"
CACHE_ROOT = Path(os.environ.get("CIFAR10_KFP_BIN_CACHE", Path.home() / ".cache" / "cifar10-kfp" / "bin"))


def _go_mod(version: str) -> str:
    return (
        "module cifar10kfp.local/model-registry-build\n\ngo 1.24.4\n\n"
        f"require (\n\t{MODULE} {version}\n\t{OPENAPI_MODULE} {version}\n)\n\n"
        f"replace {OPENAPI_MODULE} => {OPENAPI_MODULE} {version}\n"
    )


# go mod tidy keeps a requirement only if a file imports it; a build-tagged file never compiles.
_TOOLS_GO = f"""//go:build tools

package tools

import _ "{MODULE}"
"""


def server_path(version: str = VERSION) -> Path:
    return CACHE_ROOT / f"model-registry-{version}" / "model-registry"


def ensure_server(version: str = VERSION, *, timeout_s: float = 1800) -> Path:
    """The cached server binary, building it first when it is missing (a few minutes on 2 cores)."""
    target = server_path(version)
    if target.is_file() and os.access(target, os.X_OK):
        return target
    go = shutil.which("go")
    if go is None:
        raise FileNotFoundError(f"go is not on PATH: it is needed once to build the model registry {version}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mr-build-") as work:
        Path(work, "go.mod").write_text(_go_mod(version))
        Path(work, "tools.go").write_text(_TOOLS_GO)
        partial = target.with_name(target.name + ".partial")
        for cmd in (
            [go, "mod", "tidy"],
            # -p 2: the machine has two cores shared with other builds.
            [go, "build", "-p", "2", "-trimpath", "-o", str(partial), MODULE],
        ):
            done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                raise RuntimeError(
                    f"{' '.join(cmd[1:3])} for {MODULE}@{version} failed: {done.stderr[-3000:]}"
                )
        partial.replace(target)  # atomic: a reader never sees a half-written binary
    return target


if __name__ == "__main__":
    print(ensure_server())
