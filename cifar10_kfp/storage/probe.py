"""Probe what the configured identity may do under the configured prefix: put, get, list, delete.

``cifar10-kfp doctor`` reports each result, so a Kubeflow profile whose policy does not cover the
prefix in use is found before a run fails on it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cifar10_kfp.storage.names import StorageError
from cifar10_kfp.storage.store import ObjectStore


@dataclass(frozen=True)
class ProbeResult:
    operation: str  # put | get | list | delete
    ok: bool
    detail: str


def probe_access(store: ObjectStore) -> list[ProbeResult]:
    """Put, get, list and delete one small object below ``store``'s root; every step is tried and reported."""
    payload = secrets.token_bytes(16)
    uri = store.root_uri(".doctor", f"probe-{secrets.token_hex(6)}")
    steps = [
        ("put", lambda: store.put_bytes(payload, uri)),
        ("get", lambda: _check_equal(store.get_bytes(uri), payload)),
        ("list", lambda: _check_listed(store.list(store.root_uri(".doctor") + "/"), uri)),
        ("delete", lambda: store.delete(uri)),
    ]
    results = []
    for operation, step in steps:
        try:
            step()
            results.append(ProbeResult(operation, True, f"{operation} {uri}"))
        except StorageError as exc:
            results.append(ProbeResult(operation, False, str(exc)))
    return results


def _check_equal(got: bytes, expected: bytes) -> None:
    if got != expected:
        raise StorageError(f"get returned {len(got)} bytes that differ from the {len(expected)} put")


def _check_listed(listing: list[str], uri: str) -> None:
    if uri not in listing:
        raise StorageError(f"list did not show the object just put ({uri})")
