"""Fetching over HTTP(S) with a size cap, a timeout, retries and a progress meter, hashing as it streams.

``download`` uses this for ``http(s)://`` sources; the limits come from ``CIFAR10_KFP_*`` variables
(``DownloadLimits.from_env``). A failure is a ``DownloadError`` whose message says why and what to
do instead (``no_network_help``).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse, urlunparse

from cifar10_kfp.data.layout import CIFAR10_CHECKSUM as DEFAULT_CHECKSUM
from cifar10_kfp.data.layout import CIFAR10_URL as DEFAULT_URL
from cifar10_kfp.env_settings import env_number
from cifar10_kfp.progress import ProgressMeter

log = logging.getLogger(__name__)

_CHUNK = 1024 * 1024


class DownloadError(RuntimeError):
    """The archive could not be fetched; the message says why and what to do instead."""


@dataclass(frozen=True)
class DownloadLimits:
    """How much, how long and how often to try. Defaults fit the 163 MB official archive."""

    max_bytes: int = 4 * 1024**3  # refuse archives bigger than this (CIFAR10_KFP_MAX_DOWNLOAD_BYTES)
    timeout_s: float = (
        60.0  # per connect and per read; a stalled server fails (CIFAR10_KFP_DOWNLOAD_TIMEOUT_S)
    )
    deadline_s: float = 3600.0  # the whole download, all attempts (CIFAR10_KFP_DOWNLOAD_DEADLINE_S)
    attempts: int = 3  # transient failures (connection reset, 5xx, short read) are retried

    @classmethod
    def from_env(cls) -> DownloadLimits:
        return cls(
            max_bytes=int(env_number("CIFAR10_KFP_MAX_DOWNLOAD_BYTES", cls.max_bytes)),
            timeout_s=env_number("CIFAR10_KFP_DOWNLOAD_TIMEOUT_S", cls.timeout_s),
            deadline_s=env_number("CIFAR10_KFP_DOWNLOAD_DEADLINE_S", cls.deadline_s),
            attempts=int(env_number("CIFAR10_KFP_DOWNLOAD_ATTEMPTS", cls.attempts)),
        )


def redact_source(source: str) -> str:
    """The source without user:password or query string (presigned URLs carry signatures there)."""
    parsed = urlparse(source)
    if parsed.scheme in ("http", "https"):
        netloc = parsed.hostname or ""
        if parsed.port:
            netloc = f"{netloc}:{parsed.port}"
        return urlunparse((parsed.scheme, netloc, parsed.path, "", "", ""))
    return source


# ------------------------------------------------------------------------ hashing


class Hasher:
    """sha256, md5 and size of a byte stream, fed block by block."""

    def __init__(self):
        self.sha256, self.md5, self.size = hashlib.sha256(), hashlib.md5(usedforsecurity=False), 0

    def update(self, block: bytes) -> None:
        self.sha256.update(block)
        self.md5.update(block)
        self.size += len(block)


def hash_file(path: Path, label: str = "hash") -> Hasher:
    """Hash a local file, with a progress meter (it can be a large archive)."""
    hasher = Hasher()
    with open(path, "rb") as fh, ProgressMeter(label, path.stat().st_size) as meter:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            hasher.update(block)
            meter.update(len(block))
    return hasher


# ------------------------------------------------------------------------- fetchers


def no_network_help(source: str) -> str:
    return (
        "If this machine has no internet access (an air-gapped cluster, a CI runner), download "
        f"{DEFAULT_URL} (md5 {DEFAULT_CHECKSUM.split(':')[1]}) elsewhere and point the dataset at that copy: "
        "`cifar10-kfp data --source /path/to/cifar-10-python.tar.gz` (or file://..., or an object-store mirror "
        "s3://<bucket>/<key>), the pipeline parameter dataset_uri, or `make run DATASET=<path or s3:// URI>`."
    )


class _Transient(Exception):
    pass


def fetch_http_once(url: str, dst: Path, limits: DownloadLimits, deadline: float) -> Hasher:
    from cifar10_kfp import __version__

    headers = {"User-Agent": f"cifar10-kfp/{__version__}"}
    parsed = urlparse(url)
    if parsed.username is not None:  # user:password@host -> basic auth, never part of the request line
        import base64

        token = f"{unquote(parsed.username)}:{unquote(parsed.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
        netloc = (parsed.hostname or "") + (f":{parsed.port}" if parsed.port else "")
        url = urlunparse(parsed._replace(netloc=netloc))
    request = urllib.request.Request(url, headers=headers)
    shown = redact_source(url)
    try:
        response = urllib.request.urlopen(request, timeout=limits.timeout_s)  # noqa: S310 - scheme checked
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code == 429:
            raise _Transient(f"HTTP {exc.code} {exc.reason}") from exc
        raise DownloadError(
            f"cannot download {shown}: the server answered HTTP {exc.code} {exc.reason}. "
            + no_network_help(url)
        ) from exc
    with response:
        declared = response.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > limits.max_bytes:
            raise DownloadError(
                f"cannot download {shown}: it is {int(declared)} bytes, over the {limits.max_bytes}-byte cap "
                "(CIFAR10_KFP_MAX_DOWNLOAD_BYTES)"
            )
        hasher = Hasher()
        total = int(declared) if declared and declared.isdigit() else None
        with open(dst, "wb") as out, ProgressMeter("download", total) as meter:
            while True:
                block = response.read(_CHUNK)
                if not block:
                    break
                hasher.update(block)
                meter.update(len(block))
                if hasher.size > limits.max_bytes:
                    raise DownloadError(
                        f"cannot download {shown}: more than {limits.max_bytes} bytes, the cap "
                        "(CIFAR10_KFP_MAX_DOWNLOAD_BYTES)"
                    )
                if time.monotonic() > deadline:
                    raise DownloadError(
                        f"cannot download {shown}: not finished within {limits.deadline_s:g}s "
                        "(CIFAR10_KFP_DOWNLOAD_DEADLINE_S)"
                    )
                out.write(block)
        if declared and declared.isdigit() and hasher.size != int(declared):
            raise _Transient(f"connection closed after {hasher.size} of {declared} bytes")
    return hasher


def fetch_http(url: str, dst: Path, limits: DownloadLimits) -> Hasher:
    deadline = time.monotonic() + limits.deadline_s
    last: BaseException | None = None
    host = urlparse(url).hostname
    for attempt in range(1, max(1, limits.attempts) + 1):
        try:
            return fetch_http_once(url, dst, limits, deadline)
        except DownloadError:
            raise
        except urllib.error.URLError as exc:
            last = exc.reason if isinstance(exc.reason, BaseException) else exc
            if isinstance(exc.reason, socket.gaierror):
                break  # the name does not resolve: retrying will not help
        except (
            _Transient,
            OSError,
            TimeoutError,
            ConnectionError,
        ) as exc:  # http.client errors are OSError-like
            last = exc
        except Exception as exc:  # noqa: BLE001 - http.client.IncompleteRead, RemoteDisconnected, ...
            last = exc
        if attempt < limits.attempts and time.monotonic() < deadline:
            delay = min(2.0 ** (attempt - 1), max(0.0, deadline - time.monotonic()))
            log.warning(
                "download of %s failed (%s); retry %d in %.0fs", redact_source(url), last, attempt, delay
            )
            time.sleep(delay)
    reason = f"{type(last).__name__}: {last}" if last is not None else "unknown error"
    timed_out = isinstance(last, (TimeoutError, socket.timeout))
    what = f"timed out after {limits.timeout_s:g}s" if timed_out else "no network connection"
    raise DownloadError(
        f"cannot download {redact_source(url)}: {what} to {host} ({reason}) after {attempt} attempt(s). "
        + no_network_help(url)
    )
