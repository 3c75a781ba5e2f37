"""The model registry's layout: versions, the ``latest`` pointer and the name rules.

Layout under the store root (``root_uri()``, default ``s3://mlpipeline/cifar10-kfp/``)::

    models/<model_name>/<version>/...          one published version (files: ``cifar10_kfp.publish.bundle``)
                                 /model_card.json   written LAST: its presence marks a complete version
    models/<model_name>/latest                 JSON pointer {version, uri, ...}

``<version>`` is ``YYYYMMDDTHHMMSSZ-<run id>``: it sorts by time and is unique per run. A
version that already has objects is never written again. ``latest`` is one small object,
replaced by a single PUT (atomic on S3) only after every file of the version is uploaded,
and it never moves to an older version.

No torch here: the gate with nothing published yet, and parameter checks, only read names
and one pointer.
"""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.storage import ObjectStore

log = logging.getLogger(__name__)

LATEST = "latest"
CARD_JSON = "model_card.json"  # written last: marks a complete version
MODEL_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")  # the one rule; param_checks asks it


class PublishError(RuntimeError):
    """Publishing failed; ``latest`` was not changed."""


def validate_model_name(model_name: str) -> str:
    """A model name: 1-63 lowercase letters, digits, '.', '_' or '-' (the pipeline parameter's rule)."""
    if not isinstance(model_name, str) or not MODEL_NAME_RE.match(model_name):
        raise ValueError(
            f"invalid model_name {model_name!r}: use 1-63 lowercase letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit"
        )
    return model_name


def make_version(run_id: str = "", now: datetime | None = None) -> str:
    """``YYYYMMDDTHHMMSSZ-<run id>``: sorts by UTC time; the run-id part keeps concurrent runs apart."""
    now = now or datetime.now(timezone.utc)
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    suffix = re.sub(r"[^a-z0-9]", "", (run_id or "").lower())[:12] or os.urandom(4).hex()
    return f"{stamp}-{suffix}"


def default_store(store=None):
    """``store``, or the configured ``ObjectStore``."""
    from cifar10_kfp.storage import ObjectStore

    return store if store is not None else ObjectStore()


def models_uri(model_name: str, *, store=None, root: str | None = None) -> str:
    """``<root>/models/<model_name>``: where every version and the pointer of a name live."""
    from cifar10_kfp.storage import join_uri

    base = root if root is not None else default_store(store).root_uri()
    return join_uri(base, "models", validate_model_name(model_name))


def latest_version(
    model_name: str, *, store: ObjectStore | None = None, root: str | None = None
) -> dict | None:
    """The ``latest`` pointer of ``model_name`` (``{version, uri, ...}``) or None if never published."""
    from cifar10_kfp.storage import ObjectNotFound, join_uri

    store = default_store(store)
    try:
        raw = store.get_bytes(join_uri(models_uri(model_name, store=store, root=root), LATEST))
    except ObjectNotFound:
        return None
    pointer = json.loads(raw)
    if not isinstance(pointer, dict) or "uri" not in pointer or "version" not in pointer:
        raise PublishError(f"the latest pointer of {model_name!r} is malformed: {raw[:200]!r}")
    return pointer


def list_versions(model_name: str, *, store=None, root: str | None = None) -> list[str]:
    """Complete versions (those with ``model_card.json``), oldest first."""
    store = default_store(store)
    base = models_uri(model_name, store=store, root=root).rstrip("/") + "/"
    versions = set()
    for uri in store.list(base):
        rel = uri[len(base) :] if uri.startswith(base) else str(Path(uri).relative_to(Path(base)))
        parts = rel.split("/")
        if len(parts) == 2 and parts[1] == CARD_JSON:
            versions.add(parts[0])
    return sorted(versions)


def move_latest(store, latest_uri: str, pointer: dict, model_name: str) -> bool:
    """One PUT of the pointer, unless a newer version is already latest (latest never goes back)."""
    from cifar10_kfp.storage import ObjectNotFound

    try:
        current = json.loads(store.get_bytes(latest_uri))
    except ObjectNotFound:
        current = None
    # Compare the timestamps only: within one second the later write wins, whatever the run ids.
    if current and str(current.get("version", "")).split("-")[0] > pointer["version"].split("-")[0]:
        log.warning("latest of %s stays at the newer %s", model_name, current["version"])
        return False
    store.put_bytes(json.dumps(pointer, indent=2, sort_keys=True).encode(), latest_uri)
    return True


def resolve_published(
    uri_or_model_name: str, *, store: ObjectStore | None = None, model_registry_url: str | None = None
) -> str:
    """The version URI (or local directory) behind a version URI, a ``latest`` URI, a model name, or a
    ``model-registry://<name>[/<version>]`` URI (Kubeflow Model Registry at ``model_registry_url``,
    default ``MODEL_REGISTRY_URL``)."""
    from cifar10_kfp.storage import is_remote
    from cifar10_kfp.train.models import INFO_FILE

    target = str(uri_or_model_name)
    if target.startswith("model-registry://"):
        from cifar10_kfp.publish.kubeflow_registry import resolve_registry_uri

        return resolve_registry_uri(target, url=model_registry_url)
    store = default_store(store)
    if is_remote(target):
        target = target.rstrip("/")
        if target.endswith("/" + LATEST):
            return _pointer_uri(store.get_bytes(target), target)
        return target
    local = Path(target.removeprefix("file://"))
    if local.is_file():  # a local copy of a latest pointer
        return _pointer_uri(local.read_bytes(), target)
    if local.is_dir():
        if not (local / INFO_FILE).is_file():
            raise FileNotFoundError(f"{local} is not a model directory (no {INFO_FILE})")
        return str(local)
    validate_model_name(target)  # neither a URI nor a path: must be a model name
    pointer = latest_version(target, store=store)
    if pointer is None:
        raise FileNotFoundError(f"no published model named {target!r} under {store.root_uri('models')}")
    return pointer["uri"]


def _pointer_uri(raw: bytes, where: str) -> str:
    try:
        return json.loads(raw)["uri"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{where} is not a latest pointer (a JSON object with 'uri')") from exc
