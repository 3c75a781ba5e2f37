"""One object-store call: transient failures retried with backoff inside a budget, the rest explained."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from cifar10_kfp.storage.config import StorageConfig, profile_writable_prefixes
from cifar10_kfp.storage.names import AccessDeniedError, CredentialsError, ObjectNotFound, StorageError
from cifar10_kfp.storage.uri import Location

log = logging.getLogger("cifar10_kfp.storage")

T = TypeVar("T")

_TRANSIENT_S3_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "ServerError"}
_NOT_FOUND_CODES = ("NoSuchKey", "NoSuchBucket", "NoSuchObject")
_BAD_KEY_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch")


def is_transient(exc: BaseException) -> bool:
    from minio.error import S3Error, ServerError
    from urllib3.exceptions import HTTPError as Urllib3Error

    if isinstance(exc, ServerError):
        return exc.status_code >= 500
    if isinstance(exc, S3Error):
        return exc.code in _TRANSIENT_S3_CODES
    return isinstance(exc, (Urllib3Error, ConnectionError, TimeoutError))


def backoff_delays(budget_s: float, first: float = 0.25, cap: float = 5.0) -> Iterator[float]:
    """Exponential backoff with jitter, never sleeping past the budget."""
    deadline = time.monotonic() + budget_s
    delay = first
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        yield min(left, delay * (0.5 + random.random() / 2))
        delay = min(cap, delay * 2)


def where(cfg: StorageConfig, loc: Location) -> str:
    return f"endpoint {cfg.endpoint!r}, bucket {loc.bucket!r}, key {loc.key!r}"


def access_denied_message(what: str, cfg: StorageConfig, loc: Location) -> str:
    """Name what was refused and where a Kubeflow profile may write; the keys themselves were accepted."""
    allowed = ", ".join(profile_writable_prefixes(cfg.bucket, cfg.namespace))
    return (
        f"{what}: access denied at {where(cfg, loc)} (prefix in use {cfg.prefix!r}, namespace "
        f"{cfg.namespace or 'unknown'!r}). The credentials were accepted but may not touch this key. "
        f"In multi-user Kubeflow a profile's identity may only read and write below {allowed}: leave "
        "storage_prefix empty (the default follows the namespace: private/<namespace>/cifar10-kfp/), or set "
        "CIFAR10_KFP_NAMESPACE / storage_prefix to a place below one of those"
    )


def explain_s3_error(what: str, exc, cfg: StorageConfig, loc: Location) -> StorageError | None:
    """The error to raise for an S3 error response, or None when it is transient and worth another try."""
    if exc.code in _NOT_FOUND_CODES:
        return ObjectNotFound(f"{what}: not found ({exc.code}) at {where(cfg, loc)}")
    if exc.code == "AccessDenied":
        return AccessDeniedError(access_denied_message(what, cfg, loc))
    if exc.code in _BAD_KEY_CODES:
        return CredentialsError(
            f"{what}: the object store refused the credentials ({exc.code}) at {where(cfg, loc)}; "
            "check MINIO_ACCESS_KEY and MINIO_SECRET_KEY"
        )
    if not is_transient(exc):
        return StorageError(f"{what} failed ({exc.code}: {exc.message}) at {where(cfg, loc)}")
    return None


def call(what: str, cfg: StorageConfig, loc: Location, op: Callable[[], T]) -> T:
    """Run ``op``, retrying transient failures within ``cfg.retry_budget_s``; translate errors."""
    attempts = 0
    delays = backoff_delays(cfg.retry_budget_s)
    while True:
        attempts += 1
        try:
            return op()
        except Exception as exc:  # noqa: BLE001 - classified right below
            if _is_s3_error(exc):
                error = explain_s3_error(what, exc, cfg, loc)
                if error is not None:
                    raise error from exc
            elif isinstance(exc, StorageError) or not is_transient(exc):
                raise
            last = exc
        delay = next(delays, None)
        if delay is None:
            raise StorageError(
                f"{what} failed after {attempts} attempts over the {cfg.retry_budget_s:g}s retry "
                f"budget at {where(cfg, loc)}: {type(last).__name__}: {last}"
            ) from last
        log.warning("%s: transient failure (%s), retrying in %.1fs", what, type(last).__name__, delay)
        time.sleep(delay)


def _is_s3_error(exc: BaseException) -> bool:
    from minio.error import S3Error

    return isinstance(exc, S3Error)
