"""Source trees for the Go binaries the Go module proxy cannot hand over whole.

Two upstream releases reach this machine only partly through the proxy:

- Kubeflow Pipelines 2.17.0 (`github.com/kubeflow/pipelines`): the proxy refuses the module outright
  ("reading https://proxy.golang.org/github.com/kubeflow/pipelines/@v/list: 403 Forbidden /
  This module version is not available", for the tag, its commit and every pseudo-version). Its
  tree comes from the release archive: `CIFAR10_KFP_KFP_SOURCE` when set, else
  `../shared/sources/kubeflow-pipelines-2.17.0.tar.gz` beside the checkout, else GitHub's archive
  of the tag (downloaded once into the cache). Whichever it is, its tar stream must have the
  pinned sha256. Every dependency still comes from the proxy, at the versions KFP's own go.mod and
  go.sum name; the frontend's from the npm registry, at its lock file's versions.
- Argo Workflows v4.0.5 (`github.com/argoproj/argo-workflows/v4`, the release KFP 2.17.0 pins): the
  proxy serves it, but a module zip carries no symbolic links, and upstream's
  workflow/executor/osspecific/signal_linux.go is one (-> signal_darwin.go), so argoexec does not
  compile from the zip ("undefined: Setpgid"). The tree is the module with that link put back.

A tree is extracted once into `<cache>/src/<name>` through a temporary directory renamed into place.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pathlib
import shutil
import tarfile
import urllib.request

from localcluster import gobuild, reaper

KFP_TAG = "2.17.0"
KFP_COMMIT = "4a3592cb2dd0a91a4652ab93893ec8beda1f3158"
ARGO_MODULE = "github.com/argoproj/argo-workflows/v4"
ARGO_VERSION = "v4.0.5"
KFP_ARCHIVE_NAME = f"kubeflow-pipelines-{KFP_TAG}.tar.gz"
KFP_ARCHIVE_URL = f"https://github.com/kubeflow/pipelines/archive/refs/tags/{KFP_TAG}.tar.gz"
#: sha256 of the uncompressed tar stream: `git archive --prefix=pipelines-2.17.0/ 2.17.0`, which is
#: both the file in ../shared/sources (gzip -n -9) and GitHub's archive of the tag (another gzip).
KFP_TAR_SHA256 = "6c24bbc1871e49c60df585ecd23c6bb41f11c799f15fe96edf92dfd7dcccbdab"
_REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Links the module zip drops, as upstream's tree has them (git ls-tree v4.0.5: mode 120000).
_ARGO_LINKS = {"workflow/executor/osspecific/signal_linux.go": "signal_darwin.go"}


class SourceUnavailable(RuntimeError):
    """The source of a pinned release cannot be had on this machine."""


def _into_place(name: str, fill) -> pathlib.Path:
    target = gobuild.cache_root() / "src" / name
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with gobuild.file_lock(target.parent / f".lock-{name}"):  # parallel builds share one tree
        if (target / ".complete").is_file():
            return target
        return _fill_into_place(target, fill)


def _fill_into_place(target: pathlib.Path, fill) -> pathlib.Path:
    name = target.name
    scratch = reaper.temporary_dir(f".tmp-{name}-", str(target.parent))
    try:
        fill(scratch)
        (scratch / ".complete").write_text("")
        if target.exists():
            shutil.rmtree(target)
        scratch.rename(target)
    finally:
        reaper.remove_dir(scratch)
    return target


def kfp_archive_candidates() -> list[pathlib.Path]:
    """Where the pinned KFP source archive may already be, in the order they are tried."""
    named = os.environ.get("CIFAR10_KFP_KFP_SOURCE")
    found = [pathlib.Path(named).expanduser()] if named else []
    found.append(_REPO_ROOT.parent / "shared" / "sources" / KFP_ARCHIVE_NAME)
    found.append(gobuild.cache_root() / "downloads" / KFP_ARCHIVE_NAME)
    return found


def _tar_stream_sha256(archive: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with gzip.open(archive, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_kfp_archive(target: pathlib.Path) -> pathlib.Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    try:
        with urllib.request.urlopen(KFP_ARCHIVE_URL, timeout=60) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise SourceUnavailable(
            kfp_source_missing_message(f"downloading {KFP_ARCHIVE_URL} failed: {exc}")
        ) from exc
    partial.rename(target)
    return target


def kfp_source_missing_message(why: str) -> str:
    """The one line that says what the harness needs to build KFP, and why it has nothing."""
    return (
        f"Kubeflow Pipelines {KFP_TAG} source needed (the Go module proxy refuses github.com/kubeflow/pipelines): "
        f"put {KFP_ARCHIVE_NAME} (tar stream sha256 {KFP_TAR_SHA256}) at ../shared/sources/ or "
        f"CIFAR10_KFP_KFP_SOURCE, or go online for {KFP_ARCHIVE_URL}; {why}"
    )


def kfp_archive(download: bool = True) -> pathlib.Path:
    """A verified copy of the KFP release archive: a local one, else GitHub's (kept in the cache)."""
    candidates = kfp_archive_candidates()
    for path in candidates:
        if path.is_file():
            actual = _tar_stream_sha256(path)
            if actual != KFP_TAR_SHA256:
                raise SourceUnavailable(
                    f"{path}: its tar stream has sha256 {actual}, not the pinned {KFP_TAR_SHA256} "
                    f"(Kubeflow Pipelines {KFP_TAG} at {KFP_COMMIT})"
                )
            return path
    if not download:
        raise SourceUnavailable(
            kfp_source_missing_message(f"none of {', '.join(map(str, candidates))} exists")
        )
    fetched = _download_kfp_archive(candidates[-1])
    actual = _tar_stream_sha256(fetched)
    if actual != KFP_TAR_SHA256:
        fetched.unlink()
        raise SourceUnavailable(
            f"{KFP_ARCHIVE_URL}: its tar stream has sha256 {actual}, not the pinned {KFP_TAR_SHA256}"
        )
    return fetched


def _kfp_fill(out: pathlib.Path) -> None:
    archive = kfp_archive()
    # The archive was verified whole; members are still checked to stay under the tree's prefix.
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(out, filter=_strip_prefix(f"pipelines-{KFP_TAG}/"))


def _strip_prefix(prefix: str):
    def keep(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        if not member.name.startswith(prefix):
            return None  # the pax global header (the commit id), and nothing else, lies outside it
        member = member.replace(name=member.name[len(prefix) :], deep=False)
        if not member.name:
            return None
        return tarfile.data_filter(member, dest)

    return keep


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
