"""Storage errors and the S3 naming rules every bucket and key we touch must follow."""

from __future__ import annotations

import re

S3_SCHEMES = ("s3", "minio")
MAX_KEY_BYTES = 1024


class StorageError(RuntimeError):
    """An object-store operation failed; the message names endpoint, bucket and key."""


class ObjectNotFound(StorageError, FileNotFoundError):
    """The object or file does not exist."""


class IntegrityError(StorageError):
    """Downloaded content does not match the sha256 recorded at upload."""


class CredentialsError(StorageError):
    """The object store refused the credentials, or none (or only forbidden ones) were configured."""


class AccessDeniedError(CredentialsError):
    """The credentials are valid but may not touch this bucket or key (a Kubeflow profile's policy)."""


class InvalidNameError(ValueError):
    """A bucket name or object key breaks the S3 naming rules."""


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
