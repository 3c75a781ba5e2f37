"""Publishing into Kubeflow Model Registry: what a version is registered with, and resuming a publish.

``cifar10_kfp.publish.release.publish_model`` calls this between "every file of the version is in the
store" and "``latest`` moves": a registry that is down or refuses fails the publish with the
version left complete in the store and ``latest`` where it was. A re-run of the same run (same
run id) finds that version (``resumable_version``) instead of uploading another, registers it,
and moves ``latest``. The registry calls themselves are ``cifar10_kfp.publish.kubeflow_registry``.
"""

from __future__ import annotations

import logging
import os

from cifar10_kfp.publish.kubeflow_registry import (
    ModelRegistryError,
    artifact_uri,
    register_version,
    registry_url,
)
from cifar10_kfp.publish.registry import CARD_JSON, PublishError, list_versions, make_version

log = logging.getLogger(__name__)


def card_section(url: str, *, model_name: str, version: str, version_uri: str, store) -> dict:
    """The card's ``model_registry`` entry: where this version is registered and under which artifact."""
    cfg = store.config
    return {
        "url": registry_url(url),
        "registered_model": model_name,
        "version": version,
        "uri": f"model-registry://{model_name}/{version}",
        "artifact_uri": artifact_uri(
            version_uri, endpoint=cfg.endpoint, secure=cfg.secure, region=cfg.region
        ),
    }


def config_hash(card: dict) -> str:
    """The hash (``TrainConfig.config_hash``) of the training configuration the card records, or ''."""
    from cifar10_kfp.train.config import TrainConfig

    values = (card.get("parameters") or {}).get("training_config")
    return TrainConfig.from_dict(values).config_hash() if isinstance(values, dict) else ""


def properties(card: dict, *, gate: dict | None, image: str) -> dict:
    """The version's custom properties in the registry: accuracies, provenance, gate verdict, image, code."""
    metrics = card.get("metrics") or {}
    gate = gate or {}
    values = {
        "test_accuracy": metrics.get("test_accuracy"),
        "test_accuracy_plain": metrics.get("test_accuracy_plain"),
        "dataset_digest": card.get("dataset_digest") or "",
        "run_id": card.get("kfp_run_id") or "",
        "config_hash": config_hash(card),
        "gate_verdict": gate.get("verdict") or ("passed" if gate.get("passed") else "not run"),
        "gate_reason": gate.get("reason") or "",
        "image": image or "",
        "code_version": card.get("code_version") or "",
        "store_uri": card.get("uri") or "",
    }
    return {k: float(v) if k.startswith("test_") else v for k, v in values.items() if v is not None}


def resumable_version(model_name: str, run_id: str, *, store, root: str | None) -> str | None:
    """The complete version an earlier publish of this run left in the store, if any (newest first).

    Only a run id names a run: without one every publish is new. The suffix rule is
    ``registry.make_version``'s, so a version made from this run id matches.
    """
    if not run_id:
        return None
    suffix = make_version(run_id).split("-", 1)[1]
    mine = [v for v in list_versions(model_name, store=store, root=root) if v.split("-", 1)[-1] == suffix]
    return mine[-1] if mine else None


def check_same_weights(store, version_uri: str, model_dir) -> None:
    """``PublishError`` unless the stored version holds exactly the weights being published."""
    from cifar10_kfp.storage import join_uri, sha256_file
    from cifar10_kfp.train.models import WEIGHTS_FILE

    local = sha256_file(os.path.join(model_dir, WEIGHTS_FILE))
    stored = _sha256_bytes(store.get_bytes(join_uri(version_uri, WEIGHTS_FILE)))
    if local != stored:
        raise PublishError(
            f"{version_uri} was published by this run with other weights ({stored[:12]} != {local[:12]}); "
            "a published version is never overwritten: publish under a new run id"
        )


def read_card(store, version_uri: str) -> dict:
    import json

    from cifar10_kfp.storage import join_uri

    return json.loads(store.get_bytes(join_uri(version_uri, CARD_JSON)))


def register(card: dict, props: dict) -> dict:
    """Register the version the card describes; ``PublishError`` (saying how to resume) when the registry fails."""
    section = card["model_registry"]
    try:
        done = register_version(
            section["url"], model_name=card["model_name"], version=card["version"],
            artifact=section["artifact_uri"], properties=props,
            description=f"cifar10-kfp {card.get('architecture', '')} model, published at {card['uri']}",
        )  # fmt: skip
    except (ModelRegistryError, ValueError) as exc:
        run_hint = card["version"].split("-", 1)[1]
        raise PublishError(
            f"{card['model_name']} {card['version']} is complete in the store at {card['uri']}, but registering "
            f"it failed: {exc}. latest was not moved. Re-running this run's publish (run id {run_hint!r}) "
            "registers this version and then moves latest."
        ) from exc
    return done.to_dict()


def _sha256_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
