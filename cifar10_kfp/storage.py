"""One small storage API over S3-compatible object stores and the local filesystem.

Every step reads and writes through ``ObjectStore``, so a location can be an
``s3://bucket/key`` or ``minio://bucket/key`` URI (KFP's pipeline-root scheme), a
``file://`` URI or a plain local path, and the step does not care which.

Object-store uploads record the sha256 of their content in object metadata and
downloads verify it; downloads land in a temporary file that is renamed only once
verified, so a reader never sees a partial or corrupt file. Transient failures are
retried with exponential backoff inside a time budget.

Configuration comes from the environment (on a cluster, the ``MINIO_*`` names are
fed from the ``mlpipeline-minio-artifact`` secret):

=============================  ===============================================
``MINIO_ENDPOINT``             ``host:port`` (KFP >= 2.15: ``seaweedfs.kubeflow:9000``)
``MINIO_ACCESS_KEY``           access key
``MINIO_SECRET_KEY``           secret key
``MINIO_SECURE``               ``true`` for TLS (default ``false``)
``MINIO_REGION``               optional region
``CIFAR10_KFP_BUCKET``         default bucket (default ``mlpipeline``)
``CIFAR10_KFP_PREFIX``         prefix for everything we write (default ``cifar10-kfp/``)
``CIFAR10_KFP_RETRY_BUDGET_S`` seconds to keep retrying transient failures (default 60)
``CIFAR10_KFP_ALLOW_DEV_CREDENTIALS``  ``1`` allows the well-known ``minio``/``minio123`` pair
=============================  ===============================================
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

log = logging.getLogger(__name__)

T = TypeVar("T")

SHA256_META = "sha256"  # stored as x-amz-meta-sha256
S3_SCHEMES = ("s3", "minio")
DEFAULT_BUCKET = "mlpipeline"  # exists on every Kubeflow Pipelines install
DEFAULT_PREFIX = "cifar10-kfp/"
DEFAULT_RETRY_BUDGET_S = 60.0
MAX_KEY_BYTES = 1024
# The pair every MinIO tutorial and the KFP quick-start manifests ship with. Anyone can guess it.
WELL_KNOWN_DEV_CREDENTIALS = ("minio", "minio123")
_CHUNK = 8 * 1024 * 1024


class StorageError(RuntimeError):
    """An object-store operation failed; the message names endpoint, bucket and key."""


class ObjectNotFound(StorageError, FileNotFoundError):
    """The object or file does not exist."""


class IntegrityError(StorageError):
    """Downloaded content does not match the sha256 recorded at upload."""


class CredentialsError(StorageError):
    """The object store refused the credentials, or none were configured."""


class InvalidNameError(ValueError):
    """A bucket name or object key breaks the S3 naming rules."""


# ---------------------------------------------------------------------------- names

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP_RE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


def validate_bucket(bucket: str) -> str:
    """Check ``bucket`` against the S3 bucket naming rules and return it."""
    if not isinstance(bucket, str) or not _BUCKET_RE.match(bucket):
        raise InvalidNameError(
            f"invalid bucket name {bucket!r}: use 3-63 lowercase letters, digits, '.' or '-', "
            "starting and ending with a letter or digit"
        )
    if ".." in bucket or ".-" in bucket or "-." in bucket:
        raise InvalidNameError(f"invalid bucket name {bucket!r}: adjacent '.'/'-' characters are not allowed")
    if _IP_RE.match(bucket):
        raise InvalidNameError(f"invalid bucket name {bucket!r}: must not look like an IP address")
    if bucket.startswith("xn--") or bucket.endswith("-s3alias"):
        raise InvalidNameError(f"invalid bucket name {bucket!r}: reserved prefix or suffix")
    return bucket


def validate_key(key: str, *, allow_empty: bool = False) -> str:
    """Check an object key: no leading '/', no '..' segment, no control characters, <= 1024 bytes."""
    if not isinstance(key, str):
        raise InvalidNameError(f"invalid object key {key!r}: must be a string")
    if not key:
        if allow_empty:
            return key
        raise InvalidNameError("invalid object key '': must not be empty")
    if key.startswith("/"):
        raise InvalidNameError(f"invalid object key {key!r}: must not start with '/'")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidNameError(
            f"invalid object key {key[:60]!r}...: {len(key.encode('utf-8'))} bytes, the limit is {MAX_KEY_BYTES}"
        )
    if any(ord(ch) < 32 or 127 <= ord(ch) <= 159 for ch in key):  # C0, DEL and C1 (Unicode Cc)
        raise InvalidNameError(f"invalid object key {key!r}: contains a control character")
    if any(part in ("..", ".") for part in key.split("/")):
        raise InvalidNameError(f"invalid object key {key!r}: must not contain a '.' or '..' segment")
    return key


# ----------------------------------------------------------------------------- URIs


@dataclass(frozen=True)
class Location:
    """A parsed location: an object (``bucket`` + ``key``) or a local ``path``."""

    bucket: str | None = None
    key: str = ""
    path: Path | None = None

    @property
    def is_local(self) -> bool:
        return self.path is not None

    @property
    def uri(self) -> str:
        return str(self.path) if self.is_local else f"s3://{self.bucket}/{self.key}"

    def child(self, name: str) -> Location:
        """The location ``name`` below this one (``name`` may contain '/')."""
        if self.is_local:
            return Location(path=self.path / name)
        key = f"{self.key.rstrip('/')}/{name}" if self.key else name
        return Location(bucket=self.bucket, key=validate_key(key))


def is_remote(uri: str | os.PathLike) -> bool:
    """True for ``s3://`` and ``minio://`` URIs."""
    return isinstance(uri, str) and urlparse(uri).scheme in S3_SCHEMES


def parse_uri(uri: str | os.PathLike, *, allow_empty_key: bool = False) -> Location:
    """Parse an ``s3://``/``minio://``/``file://`` URI or a local path; validate names."""
    if isinstance(uri, os.PathLike):
        return Location(path=Path(uri))
    if not isinstance(uri, str) or not uri:
        raise InvalidNameError(f"invalid location {uri!r}: expected a URI or a path")
    parsed = urlparse(uri)
    if parsed.scheme in S3_SCHEMES:
        bucket = validate_bucket(parsed.netloc)
        raw_key = uri.split("://", 1)[1][len(parsed.netloc) :]
        key = raw_key[1:] if raw_key.startswith("/") else raw_key
        return Location(bucket=bucket, key=validate_key(key, allow_empty=allow_empty_key))
    if parsed.scheme == "file":
        return Location(path=Path(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # a one-letter scheme is a Windows drive
        raise InvalidNameError(f"unsupported location {uri!r}: use s3://, minio://, file:// or a local path")
    return Location(path=Path(uri))


def join_uri(base: str, *parts: str) -> str:
    """Join URI or path parts with single slashes: ``join_uri('s3://b/p/', 'x')`` -> ``s3://b/p/x``."""
    out = base.rstrip("/")
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}"
    return out


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------- config


def _env_flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class StorageConfig:
    """Where the object store is and how to talk to it. Built from the environment."""

    endpoint: str = ""  # host:port, no scheme; empty means "no object store configured"
    access_key: str = field(default="", repr=False)
    secret_key: str = field(default="", repr=False)
    secure: bool = False  # TLS
    region: str | None = None
    bucket: str = DEFAULT_BUCKET  # default bucket for keys we derive ourselves
    prefix: str = DEFAULT_PREFIX  # everything we write goes below this prefix
    retry_budget_s: float = DEFAULT_RETRY_BUDGET_S  # total seconds spent retrying one operation
    allow_dev_credentials: bool = False  # accept WELL_KNOWN_DEV_CREDENTIALS, for local development only

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> StorageConfig:
        env = os.environ if env is None else env
        endpoint = env.get("MINIO_ENDPOINT", "").strip()
        secure = _env_flag(env.get("MINIO_SECURE"))
        if endpoint.startswith(("http://", "https://")):
            secure = endpoint.startswith("https://")
            endpoint = endpoint.split("://", 1)[1]
        prefix = env.get("CIFAR10_KFP_PREFIX", DEFAULT_PREFIX).strip("/")
        return cls(
            endpoint=endpoint.rstrip("/"),
            access_key=env.get("MINIO_ACCESS_KEY", ""),
            secret_key=env.get("MINIO_SECRET_KEY", ""),
            secure=secure,
            region=env.get("MINIO_REGION") or None,
            bucket=validate_bucket(env.get("CIFAR10_KFP_BUCKET", DEFAULT_BUCKET)),
            prefix=f"{prefix}/" if prefix else "",
            retry_budget_s=float(env.get("CIFAR10_KFP_RETRY_BUDGET_S", DEFAULT_RETRY_BUDGET_S)),
            allow_dev_credentials=_env_flag(env.get("CIFAR10_KFP_ALLOW_DEV_CREDENTIALS")),
        )

    def root_uri(self, *parts: str) -> str:
        """``s3://<bucket>/<prefix>/<parts...>``: the place for everything this project writes."""
        return join_uri(f"s3://{self.bucket}/{self.prefix}", *parts)


def root_uri(*parts: str) -> str:
    """The project's root URI under the configured bucket and prefix, joined with ``parts``."""
    return StorageConfig.from_env().root_uri(*parts)


# --------------------------------------------------------------------------- retries

_TRANSIENT_S3_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "ServerError"}


def _is_transient(exc: BaseException) -> bool:
    from minio.error import S3Error, ServerError
    from urllib3.exceptions import HTTPError as Urllib3Error

    if isinstance(exc, ServerError):
        return exc.status_code >= 500
    if isinstance(exc, S3Error):
        return exc.code in _TRANSIENT_S3_CODES
    return isinstance(exc, (Urllib3Error, ConnectionError, TimeoutError))


def _backoff_delays(budget_s: float, first: float = 0.25, cap: float = 5.0) -> Iterator[float]:
    """Exponential backoff with jitter, never sleeping past the budget."""
    deadline = time.monotonic() + budget_s
    delay = first
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        yield min(left, delay * (0.5 + random.random() / 2))
        delay = min(cap, delay * 2)


# ---------------------------------------------------------------------------- store


@dataclass(frozen=True)
class ObjectInfo:
    """What ``stat`` returns."""

    uri: str
    size: int
    sha256: str | None  # recorded at upload; None for objects written by other tools
    last_modified: float | None  # POSIX seconds


class ObjectStore:
    """put/get for files and bytes, exists, list, stat and delete, on URIs or local paths."""

    def __init__(self, config: StorageConfig | None = None):
        self.config = config or StorageConfig.from_env()
        self._client = None

    # -- plumbing ---------------------------------------------------------------------

    @property
    def client(self):
        """The ``minio.Minio`` client, created on first use so local-only work needs no config."""
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def _make_client(self):
        import urllib3
        from minio import Minio

        cfg = self.config
        if not cfg.endpoint:
            raise StorageError(
                "no object store configured: set MINIO_ENDPOINT, MINIO_ACCESS_KEY and MINIO_SECRET_KEY, "
                "or start one with `cifar10-kfp store`"
            )
        if not cfg.access_key or not cfg.secret_key:
            raise CredentialsError(f"MINIO_ACCESS_KEY and MINIO_SECRET_KEY must be set for {cfg.endpoint}")
        if (cfg.access_key, cfg.secret_key) == WELL_KNOWN_DEV_CREDENTIALS and not cfg.allow_dev_credentials:
            raise CredentialsError(
                "refusing the well-known default credentials for the object store at "
                f"{cfg.endpoint}: rotate them, or set CIFAR10_KFP_ALLOW_DEV_CREDENTIALS=1 for local development"
            )
        # Our own retry loop owns the budget, so urllib3 makes a single attempt with short timeouts.
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=5, read=60),
            retries=urllib3.Retry(total=0, connect=0, read=0, redirect=2, raise_on_status=False),
            maxsize=8,
        )
        return Minio(
            cfg.endpoint,
            access_key=cfg.access_key,
            secret_key=cfg.secret_key,
            secure=cfg.secure,
            region=cfg.region,
            http_client=http,
        )

    def _where(self, loc: Location) -> str:
        return f"endpoint {self.config.endpoint!r}, bucket {loc.bucket!r}, key {loc.key!r}"

    def _call(self, what: str, loc: Location, op: Callable[[], T]) -> T:
        """Run ``op``, retrying transient failures within the budget; translate errors."""
        from minio.error import S3Error

        attempts = 0
        delays = _backoff_delays(self.config.retry_budget_s)
        while True:
            attempts += 1
            try:
                return op()
            except S3Error as exc:
                if exc.code in ("NoSuchKey", "NoSuchBucket", "NoSuchObject"):
                    raise ObjectNotFound(f"{what}: not found ({exc.code}) at {self._where(loc)}") from exc
                if exc.code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                    raise CredentialsError(
                        f"{what}: the object store refused the credentials ({exc.code}) at {self._where(loc)}; "
                        "check MINIO_ACCESS_KEY and MINIO_SECRET_KEY"
                    ) from exc
                if not _is_transient(exc):
                    raise StorageError(
                        f"{what} failed ({exc.code}: {exc.message}) at {self._where(loc)}"
                    ) from exc
                last = exc
            except Exception as exc:  # noqa: BLE001 - classified right below
                if isinstance(exc, StorageError) or not _is_transient(exc):
                    raise
                last = exc
            delay = next(delays, None)
            if delay is None:
                raise StorageError(
                    f"{what} failed after {attempts} attempts over the {self.config.retry_budget_s:g}s retry "
                    f"budget at {self._where(loc)}: {type(last).__name__}: {last}"
                ) from last
            log.warning("%s: transient failure (%s), retrying in %.1fs", what, type(last).__name__, delay)
            time.sleep(delay)

    def ensure_bucket(self, bucket: str | None = None) -> None:
        """Create the bucket if it does not exist (embedded stores and fresh test servers)."""
        bucket = validate_bucket(bucket or self.config.bucket)
        loc = Location(bucket=bucket)

        def op():
            if not self.client.bucket_exists(bucket):
                self.client.make_bucket(bucket)

        self._call("ensure bucket", loc, op)

    def root_uri(self, *parts: str) -> str:
        return self.config.root_uri(*parts)

    # -- writes -----------------------------------------------------------------------

    def put_file(self, src: str | os.PathLike, uri: str | os.PathLike, *, sha256: str | None = None) -> str:
        """Upload (or copy) a file; returns its sha256."""
        loc = parse_uri(uri)
        digest = sha256 or sha256_file(src)
        if loc.is_local:
            _atomic_copy(Path(src), loc.path)
            return digest
        size = os.path.getsize(src)

        def op():
            with open(src, "rb") as fh:
                self.client.put_object(
                    loc.bucket, loc.key, fh, size, metadata={SHA256_META: digest}, part_size=64 * 1024 * 1024
                )

        self._call("upload", loc, op)
        return digest

    def put_bytes(self, data: bytes, uri: str | os.PathLike) -> str:
        """Upload bytes (or write a local file atomically); returns their sha256."""
        loc = parse_uri(uri)
        digest = hashlib.sha256(data).hexdigest()
        if loc.is_local:
            _atomic_write(loc.path, data)
            return digest

        def op():
            self.client.put_object(
                loc.bucket, loc.key, io.BytesIO(data), len(data), metadata={SHA256_META: digest}
            )

        self._call("upload", loc, op)
        return digest

    def delete(self, uri: str | os.PathLike) -> None:
        """Delete an object or a local file; deleting something absent is not an error."""
        loc = parse_uri(uri)
        if loc.is_local:
            if loc.path.is_dir():
                shutil.rmtree(loc.path)
            else:
                loc.path.unlink(missing_ok=True)
            return
        self._call("delete", loc, lambda: self.client.remove_object(loc.bucket, loc.key))

    # -- reads ------------------------------------------------------------------------

    def stat(self, uri: str | os.PathLike) -> ObjectInfo:
        loc = parse_uri(uri)
        if loc.is_local:
            if not loc.path.is_file():
                raise ObjectNotFound(f"stat: no such file {loc.path}")
            st = loc.path.stat()
            return ObjectInfo(str(loc.path), st.st_size, None, st.st_mtime)
        obj = self._call("stat", loc, lambda: self.client.stat_object(loc.bucket, loc.key))
        meta = {k.lower(): v for k, v in (obj.metadata or {}).items()}
        sha = meta.get(f"x-amz-meta-{SHA256_META}")
        modified = obj.last_modified.timestamp() if obj.last_modified else None
        return ObjectInfo(loc.uri, int(obj.size or 0), sha, modified)

    def exists(self, uri: str | os.PathLike) -> bool:
        try:
            self.stat(uri)
        except ObjectNotFound:
            return False
        return True

    def list(self, prefix_uri: str | os.PathLike, *, recursive: bool = True) -> list[str]:
        """URIs of the objects (or files) below a prefix, sorted."""
        loc = parse_uri(prefix_uri, allow_empty_key=True)
        if loc.is_local:
            if not loc.path.exists():
                return []
            pattern = "**/*" if recursive else "*"
            return sorted(str(p) for p in loc.path.glob(pattern) if p.is_file())
        prefix = loc.key

        def op():
            objs = self.client.list_objects(loc.bucket, prefix=prefix, recursive=recursive)
            return sorted(f"s3://{loc.bucket}/{o.object_name}" for o in objs if not o.is_dir)

        return self._call("list", loc, op)

    def get_file(self, uri: str | os.PathLike, dst: str | os.PathLike, *, verify: bool = True) -> str:
        """Download to ``dst`` through a temporary file, verifying the recorded sha256; returns it."""
        loc = parse_uri(uri)
        dst = Path(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if loc.is_local:
            if not loc.path.is_file():
                raise ObjectNotFound(f"no such file {loc.path}")
            if loc.path.resolve() != dst.resolve():
                _atomic_copy(loc.path, dst)
            return sha256_file(dst)
        fd, tmp_name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".part")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            expected, actual = self._call("download", loc, lambda: self._download_to(loc, tmp))
            if verify and expected and expected != actual:
                raise IntegrityError(
                    f"download: sha256 mismatch at {self._where(loc)}: recorded {expected}, got {actual}; "
                    "the object is corrupt or was modified without updating its checksum"
                )
            os.replace(tmp, dst)
            return actual
        finally:
            tmp.unlink(missing_ok=True)

    def _download_to(self, loc: Location, tmp: Path) -> tuple[str | None, str]:
        response = self.client.get_object(loc.bucket, loc.key)
        try:
            headers = {k.lower(): v for k, v in response.headers.items()}
            expected = headers.get(f"x-amz-meta-{SHA256_META}")
            digest = hashlib.sha256()
            with open(tmp, "wb") as out:
                for block in response.stream(_CHUNK):
                    digest.update(block)
                    out.write(block)
        finally:
            response.close()
            response.release_conn()
        return expected, digest.hexdigest()

    def get_bytes(self, uri: str | os.PathLike, *, verify: bool = True) -> bytes:
        """Read a whole (small) object or file, verifying the recorded sha256."""
        loc = parse_uri(uri)
        if loc.is_local:
            if not loc.path.is_file():
                raise ObjectNotFound(f"no such file {loc.path}")
            return loc.path.read_bytes()

        def op():
            response = self.client.get_object(loc.bucket, loc.key)
            try:
                headers = {k.lower(): v for k, v in response.headers.items()}
                return headers.get(f"x-amz-meta-{SHA256_META}"), response.read()
            finally:
                response.close()
                response.release_conn()

        expected, data = self._call("download", loc, op)
        actual = hashlib.sha256(data).hexdigest()
        if verify and expected and expected != actual:
            raise IntegrityError(
                f"download: sha256 mismatch at {self._where(loc)}: recorded {expected}, got {actual}"
            )
        return data

    # -- directories ------------------------------------------------------------------

    def put_dir(self, src_dir: str | os.PathLike, uri: str) -> list[str]:
        """Upload every file below ``src_dir`` to ``uri/<relative path>``; returns the URIs."""
        src_dir = Path(src_dir)
        out = []
        for path in sorted(p for p in src_dir.rglob("*") if p.is_file()):
            target = join_uri(uri, path.relative_to(src_dir).as_posix())
            self.put_file(path, target)
            out.append(target)
        return out

    def get_dir(self, uri: str, dst_dir: str | os.PathLike) -> list[Path]:
        """Download every object below ``uri`` into ``dst_dir``, keeping relative paths."""
        base = uri.rstrip("/") + "/"
        loc = parse_uri(base, allow_empty_key=True)
        if loc.is_local:
            shutil.copytree(loc.path, dst_dir, dirs_exist_ok=True)
            return sorted(p for p in Path(dst_dir).rglob("*") if p.is_file())
        out = []
        for obj_uri in self.list(base):
            rel = obj_uri[len(f"s3://{loc.bucket}/{loc.key}") :]
            validate_key(rel)  # a key from the server must not climb out of dst_dir either
            target = Path(dst_dir) / rel
            self.get_file(obj_uri, target)
            out.append(target)
        return out


def _atomic_write(dst: Path, data: bytes) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, dst)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _atomic_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".part")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        Path(tmp).unlink(missing_ok=True)


def open_store(bucket: str | None = None, prefix: str | None = None) -> ObjectStore:
    """An ``ObjectStore`` configured from the environment.

    ``bucket`` and ``prefix`` (pipeline parameters) override ``CIFAR10_KFP_BUCKET`` and
    ``CIFAR10_KFP_PREFIX`` when given and non-empty.
    """
    env = dict(os.environ)
    if bucket:
        env["CIFAR10_KFP_BUCKET"] = bucket
    if prefix:
        env["CIFAR10_KFP_PREFIX"] = prefix
    return ObjectStore(StorageConfig.from_env(env))
