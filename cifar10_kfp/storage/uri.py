"""Locations: ``s3://``/``minio://`` URIs (KFP's pipeline-root scheme), ``file://`` URIs and local paths."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from cifar10_kfp.storage.names import S3_SCHEMES, InvalidNameError, validate_bucket, validate_key


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
        if self.path is not None:
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
