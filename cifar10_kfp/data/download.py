"""Fetch a dataset archive once, verify it, and keep it in the object store under its content address.

Sources: ``http(s)://`` (streamed, with a size cap, a timeout and retries), ``s3://`` or
``minio://`` (a mirror in the object store), ``file://`` or a local path. The archive is
hashed while it streams (sha256 always, md5 too), checked against the ``algo:hex`` checksum
when one is given, scanned member by member as untrusted input (``archives``) and its
layout detected (``layout``). Only then is it stored at
``<root>/datasets/sha256/<digest>/<filename>``, with small index entries at
``<root>/datasets/index/<md5|sha256>/<hex>.json``: the next run with the same checksum finds
the archive through the index and fetches nothing. Nothing unverified reaches the store.
HTTP fetching (limits, retries, the progress meter) is in ``http_fetch``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from cifar10_kfp.data.archives import ArchiveLimits, scan_archive
from cifar10_kfp.data.http_fetch import (
    DownloadError,
    DownloadLimits,
    fetch_http,
    hash_file,
    redact_source,
)
from cifar10_kfp.data.layout import (
    CIFAR10_CHECKSUM,
    CIFAR10_URL,
    IMAGE_FOLDER,
    detect_layout,
    index_image_folder,
)
from cifar10_kfp.storage import (
    ObjectNotFound,
    ObjectStore,
    is_remote,
    open_store,
    parse_uri,
)

log = logging.getLogger(__name__)

DEFAULT_URL, DEFAULT_CHECKSUM = CIFAR10_URL, CIFAR10_CHECKSUM
# Checksums we know for well-known URLs, applied when the caller gives none.
KNOWN_CHECKSUMS = {DEFAULT_URL: DEFAULT_CHECKSUM}
_HEX_LENGTHS = {"md5": 32, "sha256": 64}


class ChecksumError(ValueError):
    """The fetched archive does not match the expected checksum."""


@dataclass
class DownloadResult:
    """What ``fetch_dataset`` found out; ``pointer()`` is the download step's output."""

    source: str  # the source as given, with any credentials or query string removed
    sha256: str
    size: int  # bytes
    format: str  # "cifar10-python" or "image-folder"
    filename: str
    cache_uri: str  # where the verified archive lives in the object store ("" without a store)
    cache_hit: bool  # True when the archive was already in the store
    md5: str = ""
    local_path: str = ""  # a verified local copy, when one exists after the call ("" otherwise)

    def pointer(self) -> dict:
        keys = ("source", "sha256", "size", "format", "filename", "cache_uri")
        return {k: getattr(self, k) for k in keys}


def parse_checksum(checksum: str) -> tuple[str, str] | None:
    """``"md5:HEX"``, ``"sha256:HEX"`` or a bare 64-digit sha256 -> ``(algo, hex)``; ``""`` -> None; else ValueError."""
    checksum = (checksum or "").strip()
    if not checksum:
        return None
    algo, sep, hexdigest = checksum.partition(":")
    if not sep and len(checksum) == _HEX_LENGTHS["sha256"]:
        # A bare sha256, the form of the pipelines' dataset_checksum parameter (validation strips "sha256:").
        algo, sep, hexdigest = "sha256", ":", checksum
    algo, hexdigest = algo.strip().lower(), hexdigest.strip().lower()
    if not sep or algo not in _HEX_LENGTHS:
        raise ValueError(
            f"invalid checksum {checksum!r}: expected md5:<32 hex digits> or sha256:<64 hex digits>"
        )
    if len(hexdigest) != _HEX_LENGTHS[algo] or not re.fullmatch(r"[0-9a-f]+", hexdigest):
        raise ValueError(f"invalid checksum {checksum!r}: {algo} needs {_HEX_LENGTHS[algo]} hex digits")
    return algo, hexdigest


def safe_filename(source: str) -> str:
    """The archive's file name from the source, reduced to characters safe in an object key."""
    path = urlparse(source).path if "://" in source else source
    name = unquote(path.rstrip("/").rsplit("/", 1)[-1])
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")
    return name[:200] or "archive"


def _source_kind(source: str) -> str:
    scheme = urlparse(source).scheme.lower()
    if scheme in ("http", "https"):
        return "http"
    if is_remote(source):
        return "s3"
    if scheme == "file" or not scheme or len(scheme) == 1:
        return "local"
    raise ValueError(
        f"unsupported dataset source {source!r}: use https://, http://, s3://, minio://, file:// or a path"
    )


def _usable_store(store: ObjectStore | None) -> ObjectStore | None:
    store = store if store is not None else open_store()
    return store if store.config.endpoint else None


def _fetch(source: str, kind: str, workdir: Path, limits: DownloadLimits, store: ObjectStore | None):
    """Fetch into ``workdir`` (or use a local file in place); returns ``(path, hasher, is_copy)``."""
    if kind == "local":
        path = parse_uri(source).path
        if path is None:  # a local source always parses to a path
            raise FileNotFoundError(f"dataset source {source!r}: no such file")
        if path.is_dir():
            folder = path if path.name else path.resolve()  # "." has no name of its own
            raise ValueError(
                f"dataset source {source!r} is a folder; folders are not supported, only archives (.tar, "
                f".tar.gz, .tgz, .zip). Pack it, with train/ and test/ inside: "
                f"tar czf {folder.name}.tar.gz -C {folder.parent} {folder.name}"
            )
        if not path.is_file():
            raise FileNotFoundError(f"dataset source {source!r}: no such file {path}")
        size = path.stat().st_size
        if size > limits.max_bytes:
            raise DownloadError(
                f"dataset source {path} is {size} bytes, over the {limits.max_bytes}-byte cap"
            )
        return path, hash_file(path), False
    dst = workdir / safe_filename(source)
    if kind == "http":
        return dst, fetch_http(source, dst, limits), True
    reader = store if store is not None else open_store()
    info = reader.stat(source)
    if info.size > limits.max_bytes:
        raise DownloadError(
            f"dataset source {source} is {info.size} bytes, over the {limits.max_bytes}-byte cap"
        )
    reader.get_file(source, dst)  # verifies the sha256 recorded at upload, when there is one
    return dst, hash_file(dst), True


# ------------------------------------------------------------------------- the cache


def _index_uri(store: ObjectStore, algo: str, hexdigest: str) -> str:
    return store.root_uri("datasets", "index", algo, f"{hexdigest}.json")


def _lookup(store: ObjectStore, algo: str, hexdigest: str) -> dict | None:
    """The manifest of a cached archive with this checksum, if the archive is really there."""
    try:
        manifest = json.loads(store.get_bytes(_index_uri(store, algo, hexdigest)))
        info = store.stat(manifest["cache_uri"])
    except ObjectNotFound:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring an unreadable cache index entry for %s:%s (%s)", algo, hexdigest, exc)
        return None
    if info.sha256 != manifest.get("sha256") or info.size != manifest.get("size"):
        log.warning("cache entry %s does not match its index; fetching again", manifest.get("cache_uri"))
        return None
    return manifest


def _store_verified(store: ObjectStore, path: Path, manifest: dict) -> bool:
    """Upload a verified archive to its content address and index it; True if it was already there."""
    cache_uri = manifest["cache_uri"]
    try:
        present = store.stat(cache_uri).sha256 == manifest["sha256"]
    except ObjectNotFound:
        present = False
    if not present:
        store.put_file(path, cache_uri, sha256=manifest["sha256"])
    body = json.dumps(manifest, sort_keys=True, indent=1).encode()
    for algo in ("sha256", "md5"):
        store.put_bytes(body, _index_uri(store, algo, manifest[algo]))
    return present


# --------------------------------------------------------------------------- public


def verify_archive(path: str | os.PathLike, *, limits: ArchiveLimits | None = None) -> str:
    """Scan an archive as untrusted input and return its dataset format; ArchiveError names a bad member."""
    members = scan_archive(path, limits=limits)
    layout = detect_layout(str(path), members)
    if layout.format == IMAGE_FOLDER:
        index_image_folder(str(path), members, layout.root)  # empty class folders, stray files
    return layout.format


def _cached_result(cache_store: ObjectStore, expected: tuple[str, str], shown: str) -> DownloadResult | None:
    """The archive's result when the store already holds a verified copy with that digest, else None."""
    manifest = _lookup(cache_store, *expected)
    if manifest is None:
        return None
    log.info("dataset %s found in the object store at %s; nothing fetched", shown, manifest["cache_uri"])
    return result_from_pointer({**manifest, "source": shown})


def _verified_digests(hasher, expected: tuple[str, str] | None, shown: str) -> dict[str, str]:
    """``{"sha256", "md5"}`` of the fetched bytes; ``ChecksumError`` when the expected one differs."""
    digests = {"sha256": hasher.sha256.hexdigest(), "md5": hasher.md5.hexdigest()}
    if expected is not None and digests[expected[0]] != expected[1]:
        raise ChecksumError(
            f"checksum mismatch for {shown}: expected {expected[0]}:{expected[1]}, got "
            f"{expected[0]}:{digests[expected[0]]} ({hasher.size} bytes, sha256 {digests['sha256']}). "
            "The file is corrupt, incomplete or not the expected dataset; nothing was cached."
        )
    return digests


def _kept_copy(path: Path, is_copy: bool, workdir, name: str) -> str:
    """The local path reported: a local source itself, a fetched copy moved into ``workdir``, or ''."""
    if not is_copy:
        return str(path)
    if workdir is None:
        return ""  # the temporary copy is deleted with its directory
    kept = Path(workdir) / name
    shutil.move(str(path), kept)
    return str(kept)


def fetch_dataset(
    source: str,
    checksum: str = "",
    *,
    store: ObjectStore | None = None,
    cache: bool = True,
    workdir: str | os.PathLike | None = None,
    limits: DownloadLimits | None = None,
    archive_limits: ArchiveLimits | None = None,
) -> DownloadResult:
    """Fetch, verify and cache a dataset archive; see the module docstring.

    Args:
        source: http(s)://, s3://, minio://, file:// URI or a local path.
        checksum: ``md5:HEX`` or ``sha256:HEX``; empty means none (the official URL gets its known md5).
        store: the object store (default: configured from the environment). Without
            ``MINIO_ENDPOINT`` nothing is cached and ``cache_uri`` is empty.
        cache: look up and store the archive in the object store.
        workdir: keep the fetched copy here and report it as ``local_path``; by default it is
            deleted (a local source is always reported as its own ``local_path``).
    """
    source = (source or "").strip()
    if not source:
        raise ValueError(
            f"the dataset source is empty: give a URL, s3:// URI or path (default {DEFAULT_URL})"
        )
    kind = _source_kind(source)
    checksum = (checksum or "").strip() or KNOWN_CHECKSUMS.get(source, "")
    expected = parse_checksum(checksum)
    limits = limits or DownloadLimits.from_env()
    shown = redact_source(source)
    cache_store = _usable_store(store) if cache else None
    if cache and cache_store is None:
        log.info("no object store configured (MINIO_ENDPOINT is unset): the archive is not cached")

    if cache_store is not None and expected is not None:
        cached = _cached_result(cache_store, expected, shown)
        if cached is not None:
            return cached
    if expected is None:
        log.info("no checksum given for %s: fetching it to learn its digest", shown)

    tmpdir = Path(tempfile.mkdtemp(prefix="cifar10-kfp-download-", dir=workdir))
    try:
        path, hasher, is_copy = _fetch(source, kind, tmpdir, limits, store)
        digests = _verified_digests(hasher, expected, shown)
        fmt = verify_archive(path, limits=archive_limits)
        filename = safe_filename(source)
        cache_uri = (
            cache_store.root_uri("datasets", "sha256", digests["sha256"], filename)
            if cache_store is not None
            else ""
        )
        manifest = {"sha256": digests["sha256"], "md5": digests["md5"], "size": hasher.size}
        manifest.update(format=fmt, filename=filename, cache_uri=cache_uri)
        hit = _store_verified(cache_store, path, manifest) if cache_store is not None else False
        local_path = _kept_copy(path, is_copy, workdir, f"{digests['sha256'][:16]}-{filename}")
        log.info("dataset %s: %s, %d bytes, sha256 %s", shown, fmt, hasher.size, digests["sha256"])
        return DownloadResult(source=shown, size=hasher.size, format=fmt, filename=filename, cache_uri=cache_uri,
                              cache_hit=hit, local_path=local_path, **digests)  # fmt: skip
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def result_from_pointer(pointer: dict) -> DownloadResult:
    """Rebuild a DownloadResult from ``pointer()`` JSON (the download step's artifact)."""
    fields = set(DownloadResult.__dataclass_fields__) - {"cache_hit"}
    return DownloadResult(**{k: v for k, v in pointer.items() if k in fields}, cache_hit=True)


__all__ = [
    "DEFAULT_CHECKSUM",
    "DEFAULT_URL",
    "ChecksumError",
    "DownloadError",
    "DownloadLimits",
    "DownloadResult",
    "fetch_dataset",
    "parse_checksum",
    "redact_source",
    "verify_archive",
]
