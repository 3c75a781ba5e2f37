"""Source trees for the Go binaries the Go module proxy cannot hand over whole.

Two upstream releases reach this machine only partly through the proxy:

- Kubeflow Pipelines 2.17.0 (`github.com/kubeflow/pipelines`): the proxy refuses the module outright
  ("reading https://proxy.golang.org/github.com/kubeflow/pipelines/@v/list: 403 Forbidden /
  This module version is not available", for the tag, its commit and every pseudo-version). Its
  tree comes from a git snapshot of kubeflow/pipelines at the tag (CIFAR10_KFP_KFP_GIT, default the
  snapshot `fetch` leaves under /work/.mirror); the tag must resolve to the pinned commit. Every
  dependency still comes from the proxy, at the versions KFP's own go.mod and go.sum name.
- Argo Workflows v4.0.5 (`github.com/argoproj/argo-workflows/v4`, the release KFP 2.17.0 pins): the
  proxy serves it, but a module zip carries no symbolic links, and upstream's
  workflow/executor/osspecific/signal_linux.go is one (-> signal_darwin.go), so argoexec does not
  compile from the zip ("undefined: Setpgid"). The tree is the module with that link put back.

A tree is extracted once into `<cache>/src/<name>` through a temporary directory renamed into place.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

from tests.support.cluster import gobuild

KFP_TAG = "2.17.0"
KFP_COMMIT = "4a3592cb2dd0a91a4652ab93893ec8beda1f3158"
ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"
ARGO_VERSION = "v4.0.5"
_DEFAULT_KFP_GIT = "/work/.mirror/kubeflow+pipelines/repo"
#: Links the module zip drops, as upstream's tree has them (git ls-tree v4.0.5: mode 120000).
_ARGO_LINKS = {"workflow/executor/osspecific/signal_linux.go": "signal_darwin.go"}


class SourceUnavailable(RuntimeError):
    """The source of a pinned release cannot be had on this machine."""


def _into_place(name: str, fill) -> pathlib.Path:
    target = gobuild.cache_root() / "src" / name
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=target.parent))
    try:
        fill(scratch)
        (scratch / ".complete").write_text("")
        if target.exists():
            shutil.rmtree(target)
        scratch.rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _kfp_fill(out: pathlib.Path) -> None:
    git_dir = os.environ.get("CIFAR10_KFP_KFP_GIT", _DEFAULT_KFP_GIT)
    resolved = subprocess.run(
        ["git", f"--git-dir={git_dir}", "rev-parse", f"{KFP_TAG}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if resolved.returncode != 0:
        raise SourceUnavailable(
            f"Kubeflow Pipelines {KFP_TAG}: the Go module proxy refuses github.com/kubeflow/pipelines "
            f"(403 Forbidden: This module version is not available) and no git snapshot with tag "
            f"{KFP_TAG} is at {git_dir!r} (CIFAR10_KFP_KFP_GIT): {resolved.stderr.strip()}"
        )
    if resolved.stdout.strip() != KFP_COMMIT:
        raise SourceUnavailable(
            f"tag {KFP_TAG} in {git_dir} is {resolved.stdout.strip()}, not the pinned {KFP_COMMIT}"
        )
    archive = subprocess.Popen(["git", f"--git-dir={git_dir}", "archive", KFP_COMMIT], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(out)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SourceUnavailable(f"git archive {KFP_COMMIT} failed in {git_dir}")


def _argo_fill(out: pathlib.Path) -> None:
    module = gobuild.module_dir(ARGO_MODULE, ARGO_VERSION)
    shutil.copytree(module, out, dirs_exist_ok=True, symlinks=True)
    for path in [out, *out.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)  # the module cache is read-only
    for link, target in _ARGO_LINKS.items():
        (out / link).symlink_to(target)


_TREES = {
    f"kfp-{KFP_TAG}": _kfp_fill,
    f"argo-workflows-{ARGO_VERSION}": _argo_fill,
}


def ensure_tree(name: str) -> pathlib.Path:
    """The extracted source tree `name` (a key of _TREES), made on first use."""
    if name not in _TREES:
        raise KeyError(f"unknown source tree {name!r}; known: {', '.join(_TREES)}")
    return _into_place(name, _TREES[name])
