"""``ObjectStore``: put/get for files and bytes, exists, list, stat and delete, on URIs or local paths.

Every step reads and writes through it, so a location can be an ``s3://``/``minio://`` URI, a
``file://`` URI or a plain local path, and the step does not care which. Uploads record the sha256
of their content in object metadata and downloads verify it; downloads land in a temporary file
that is renamed only once verified, so a reader never sees a partial or corrupt file.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cifar10_kfp.storage.config import StorageConfig, check_credentials
from cifar10_kfp.storage.names import (
    IntegrityError,
    ObjectNotFound,
    StorageError,
    validate_bucket,
    validate_key,
)
from cifar10_kfp.storage.retry import call, where
from cifar10_kfp.storage.uri import Location, join_uri, parse_uri

if TYPE_CHECKING:  # annotations only
    from minio import Minio

SHA256_META = "sha256"  # stored as x-amz-meta-sha256
_CHUNK = 8 * 1024 * 1024


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------- store


@dataclass(frozen=True)
class ObjectInfo:
    """What ``stat`` returns."""

    uri: str
    size: int
    sha256: str | None  # recorded at upload; None for objects written by other tools
    last_modified: float | None  # POSIX seconds


def _bucket(loc: Location) -> str:
    """An object location's bucket (local paths are handled before any client call)."""
    assert loc.bucket is not None, loc
    return loc.bucket


class ObjectStore:
    """put/get for files and bytes, exists, list, stat and delete, on URIs or local paths."""

    def __init__(self, config: StorageConfig | None = None):
        self.config = config or StorageConfig.from_env()
        self._client: Minio | None = None

    # -- plumbing ---------------------------------------------------------------------

    @property
    def client(self) -> Minio:
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
        check_credentials(cfg)
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
        return where(self.config, loc)

    def _call(self, what: str, loc: Location, op):
        return call(what, self.config, loc, op)

    def ensure_bucket(self, bucket: str | None = None) -> None:
        """Create the bucket if it does not exist: only for a store we started ourselves.

        It needs bucket-level rights (HEAD and create bucket), which a Kubeflow profile's identity
        does not have; on a cluster the bucket exists and nothing calls this.
        """
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
        if loc.path is not None:  # loc.is_local, spelled so that the type checker narrows loc.path
            _atomic_copy(Path(src), loc.path)
            return digest
        size = os.path.getsize(src)

        def op():
            with open(src, "rb") as fh:
                self.client.put_object(
                    _bucket(loc),
                    loc.key,
                    fh,
                    size,
                    metadata={SHA256_META: digest},
                    part_size=64 * 1024 * 1024,
                )

        self._call("upload", loc, op)
        return digest

    def put_bytes(self, data: bytes, uri: str | os.PathLike) -> str:
        """Upload bytes (or write a local file atomically); returns their sha256."""
        loc = parse_uri(uri)
        digest = hashlib.sha256(data).hexdigest()
        if loc.path is not None:
            _atomic_write(loc.path, data)
            return digest

        def op():
            self.client.put_object(
                _bucket(loc), loc.key, io.BytesIO(data), len(data), metadata={SHA256_META: digest}
            )

        self._call("upload", loc, op)
        return digest

    def delete(self, uri: str | os.PathLike) -> None:
        """Delete an object or a local file; deleting something absent is not an error."""
        loc = parse_uri(uri)
        if loc.path is not None:
            if loc.path.is_dir():
                shutil.rmtree(loc.path)
            else:
                loc.path.unlink(missing_ok=True)
            return
        self._call("delete", loc, lambda: self.client.remove_object(_bucket(loc), loc.key))

    # -- reads ------------------------------------------------------------------------

    def stat(self, uri: str | os.PathLike) -> ObjectInfo:
        loc = parse_uri(uri)
        if loc.path is not None:
            if not loc.path.is_file():
                raise ObjectNotFound(f"stat: no such file {loc.path}")
            st = loc.path.stat()
            return ObjectInfo(str(loc.path), st.st_size, None, st.st_mtime)
        obj = self._call("stat", loc, lambda: self.client.stat_object(_bucket(loc), loc.key))
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
        if loc.path is not None:
            if not loc.path.exists():
                return []
            pattern = "**/*" if recursive else "*"
            return sorted(str(p) for p in loc.path.glob(pattern) if p.is_file())
        prefix = loc.key

        def op():
            objs = self.client.list_objects(_bucket(loc), prefix=prefix, recursive=recursive)
            return sorted(f"s3://{loc.bucket}/{o.object_name}" for o in objs if not o.is_dir)

        return self._call("list", loc, op)

    def get_file(self, uri: str | os.PathLike, dst: str | os.PathLike, *, verify: bool = True) -> str:
        """Download to ``dst`` through a temporary file, verifying the recorded sha256; returns it."""
        loc = parse_uri(uri)
        dst = Path(dst)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if loc.path is not None:
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
        response = self.client.get_object(_bucket(loc), loc.key)
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
        if loc.path is not None:
            if not loc.path.is_file():
                raise ObjectNotFound(f"no such file {loc.path}")
            return loc.path.read_bytes()

        def op():
            response = self.client.get_object(_bucket(loc), loc.key)
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

    def get_range(self, uri: str | os.PathLike, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer at the end): a header, without the whole object.

        Unverified by nature (a digest covers the whole object); the caller checks what it reads.
        """
        loc = parse_uri(uri)
        if loc.path is not None:
            if not loc.path.is_file():
                raise ObjectNotFound(f"no such file {loc.path}")
            with open(loc.path, "rb") as fh:
                fh.seek(offset)
                return fh.read(length)

        def op():
            response = self.client.get_object(_bucket(loc), loc.key, offset=offset, length=length)
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

        return self._call("download", loc, op)

    # -- directories ------------------------------------------------------------------

    # `builtins.list`: inside this class `list` names the method above.
    def put_dir(self, src_dir: str | os.PathLike, uri: str) -> builtins.list[str]:
        """Upload every file below ``src_dir`` to ``uri/<relative path>``; returns the URIs."""
        src_dir = Path(src_dir)
        out = []
        for path in sorted(p for p in src_dir.rglob("*") if p.is_file()):
            target = join_uri(uri, path.relative_to(src_dir).as_posix())
            self.put_file(path, target)
            out.append(target)
        return out

    def get_dir(self, uri: str, dst_dir: str | os.PathLike) -> builtins.list[Path]:
        """Download every object below ``uri`` into ``dst_dir``, keeping relative paths."""
        base = uri.rstrip("/") + "/"
        loc = parse_uri(base, allow_empty_key=True)
        if loc.path is not None:
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
