"""The champion/challenger gate and versioned, never-overwritten model publishing.

A published version (layout and ``latest`` rules: ``cifar10_kfp.publish.registry``) holds::

    models/<model_name>/<version>/model.safetensors    weights (safetensors, no pickle)
                                 /model.json           ModelInfo: architecture, classes, mean/std, ...
                                 /model.torchscript.pt, /triton/..., /inference_service.yaml
                                                       the serving bundle (``cifar10_kfp.publish.bundle``)
                                 /model_card.md        human-readable card
                                 /model_card.json      machine-readable card; written LAST

The gate compares the headline accuracy (as served, with flip TTA: docs/evaluation.md) of the
challenger and of the published champion on the same test data. Only publishing and comparing
against a published champion import torch: a gate with nothing published yet reads one pointer.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import cifar10_kfp.publish.registration as mr_registration
from cifar10_kfp.publish.bundle import inference_service_manifest, manifest_yaml, serving_name, stage_bundle
from cifar10_kfp.publish.model_card import CARD_MD, build_card, card_markdown
from cifar10_kfp.publish.registry import (
    CARD_JSON,
    LATEST,
    PublishError,
    default_store,
    latest_version,
    make_version,
    models_uri,
    move_latest,
    validate_model_name,
)

if TYPE_CHECKING:  # annotations only
    import torch

    from cifar10_kfp.storage import ObjectStore

log = logging.getLogger(__name__)
REGISTRY_MANIFEST_FILE = (
    "inference_service.model-registry.yaml"  # storageUri model-registry://<name>/<version>
)


# ------------------------------------------------------------------------------ gate


@dataclass
class GateDecision:
    """Whether a challenger may be published, and why."""

    passed: bool
    reason: str
    challenger_accuracy: float
    min_accuracy: float
    champion_accuracy: float | None = None  # None: nothing published yet under this name
    champion_version: str | None = None
    champion_uri: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def gate_decision(
    challenger_accuracy: float,
    *,
    min_accuracy: float,
    champion_accuracy: float | None = None,
    champion_version: str | None = None,
    champion_uri: str | None = None,
) -> GateDecision:
    """Pass only when accuracy >= ``min_accuracy`` and it beats the champion (strictly, if there is one).

    A tie keeps the champion: replacing a model with an equally good one only adds churn.
    """
    if not 0.0 <= min_accuracy <= 1.0:
        raise ValueError(f"min_accuracy must be in [0, 1], got {min_accuracy}")
    reasons = []
    if challenger_accuracy < min_accuracy:
        reasons.append(f"accuracy {challenger_accuracy:.4f} is below min_accuracy {min_accuracy:.4f}")
    if champion_accuracy is not None and not challenger_accuracy > champion_accuracy:
        reasons.append(
            f"accuracy {challenger_accuracy:.4f} does not beat the published champion "
            f"{champion_version or '?'} ({champion_accuracy:.4f}) on the same test data"
        )
    passed = not reasons
    if passed:
        reason = f"accuracy {challenger_accuracy:.4f} >= min_accuracy {min_accuracy:.4f}" + (
            f" and beats the champion {champion_version} ({champion_accuracy:.4f})"
            if champion_accuracy is not None
            else "; no published champion yet"
        )
    else:
        reason = "; ".join(reasons)
    return GateDecision(
        passed=passed,
        reason=reason,
        challenger_accuracy=float(challenger_accuracy),
        min_accuracy=float(min_accuracy),
        champion_accuracy=None if champion_accuracy is None else float(champion_accuracy),
        champion_version=champion_version,
        champion_uri=champion_uri,
    )


def evaluate_champion(model_name: str, data_path_or_uri, *, store=None, root: str | None = None, device=None):
    """Accuracy of the currently published ``model_name`` on the test split: ``(accuracy, pointer)``.

    Returns ``(None, None)`` when nothing is published yet.
    """
    store = default_store(store)
    pointer = latest_version(model_name, store=store, root=root)
    if pointer is None:
        return None, None
    # Imported only now: with no champion the gate needs no torch (a second of import per task).
    from cifar10_kfp.data.shards import load_dataset
    from cifar10_kfp.evaluate.evaluation import evaluate_loaded
    from cifar10_kfp.publish.serving import load_published

    model, preprocess = load_published(pointer["uri"], store=store, device=device or "cpu")
    dataset = load_dataset(data_path_or_uri)
    images, labels = dataset.split("test")
    result = evaluate_loaded(
        model,
        preprocess.info,
        images,
        labels,
        dataset.class_names,
        device=device or "cpu",
        attribution_per_class=0,  # the gate needs the accuracy only
    )
    return result.accuracy, pointer


def run_gate(
    challenger_accuracy: float,
    data_path_or_uri: str | os.PathLike,
    *,
    min_accuracy: float,
    model_name: str,
    store: ObjectStore | None = None,
    root: str | None = None,
    device: torch.device | str | None = None,
) -> GateDecision:
    """Evaluate the published champion on the same test data and decide (see ``gate_decision``).

    A champion built for other classes or image size cannot be compared; the gate then fails
    with that reason (publish under a new ``model_name`` instead).
    """
    validate_model_name(model_name)
    try:
        champion_accuracy, pointer = evaluate_champion(
            model_name, data_path_or_uri, store=store, root=root, device=device
        )
    except ValueError as exc:
        return GateDecision(
            passed=False,
            reason=f"the published {model_name!r} cannot be compared on this dataset: {exc}",
            challenger_accuracy=float(challenger_accuracy),
            min_accuracy=float(min_accuracy),
        )
    decision = gate_decision(
        challenger_accuracy,
        min_accuracy=min_accuracy,
        champion_accuracy=champion_accuracy,
        champion_version=pointer["version"] if pointer else None,
        champion_uri=pointer["uri"] if pointer else None,
    )
    log.info("gate %s: %s", "PASSED" if decision.passed else "FAILED", decision.reason)
    return decision


# ---------------------------------------------------------------------------- publish


def dataset_digests(path: str | os.PathLike) -> dict[str, str]:
    """``prepared_sha256`` (the exact test data) and ``source_digest`` (the source archive) of a prepared file."""
    from cifar10_kfp.data.format import read_metadata
    from cifar10_kfp.storage import sha256_file

    path = Path(path)
    if path.is_dir():
        path = path / "dataset.safetensors"
    return {
        "prepared_sha256": sha256_file(path),
        "source_digest": read_metadata(path).get("source_digest", ""),
    }


@dataclass
class PublishResult:
    """Where a published version lives and what it holds."""

    uri: str  # <root>/models/<model_name>/<version>
    version: str
    model_name: str
    latest_uri: str  # the pointer object
    latest_updated: bool  # False only when a newer version was already latest
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    card: dict = field(default_factory=dict)
    card_markdown: str = ""
    inference_service: dict = field(default_factory=dict)
    inference_service_yaml: str = ""
    registration: dict = field(default_factory=dict)  # kubeflow_registry.Registration.to_dict(); {} when off
    resumed: bool = False  # True: an earlier publish of this run had uploaded the version


@dataclass
class _Version:
    """Where a version being published goes."""

    model_name: str
    version: str
    uri: str  # <root>/models/<model_name>/<version>
    latest_uri: str
    created: str  # ISO time, UTC


def publish_model(
    model_dir: str | os.PathLike,
    *,
    model_name: str,
    metrics: dict,
    dataset_digest: str,
    params: dict | None = None,
    run_id: str = "",
    store: ObjectStore | None = None,
    root: str | None = None,
    now: datetime | None = None,
    service_account: str | None = None,
    model_registry_url: str = "",
    gate: dict | None = None,
    image: str = "",
) -> PublishResult:
    """Publish a model directory as a new version of ``model_name`` and move ``latest`` to it.

    Everything is built and checked locally first (weights load, TorchScript matches eager), then
    uploaded; ``model_card.json`` goes last, then the ``latest`` pointer. Raises ``PublishError``
    if the version exists or any upload fails, leaving ``latest`` as it was.

    With ``model_registry_url`` the complete version is registered in Kubeflow Model Registry
    before ``latest`` moves (``cifar10_kfp.publish.registration``; ``gate`` and ``image`` become custom
    properties). A registry failure raises ``PublishError`` with the version left in the store; a
    re-run with the same ``run_id`` resumes that version rather than publishing another.
    """
    from cifar10_kfp.storage import join_uri
    from cifar10_kfp.train.models import INFO_FILE, WEIGHTS_FILE

    store = default_store(store)
    if model_registry_url:
        resumed = mr_registration.resumable_version(model_name, run_id, store=store, root=root)
        if resumed:
            return _resume(Path(model_dir), model_name, resumed, store, root, model_registry_url, gate, image)
    target = _new_version(model_name, run_id, now, store, root)  # the name is checked before torch loads
    model, info = _load_model_dir(Path(model_dir))
    isvc_name = serving_name(model_name)
    manifest = inference_service_manifest(
        isvc_name, join_uri(target.uri, "triton"), service_account=service_account,
        labels={"version": target.version},
    )  # fmt: skip
    in_registry = model_registry_url and mr_registration.card_section(
        model_registry_url, model_name=model_name, version=target.version, version_uri=target.uri, store=store
    )  # fmt: skip
    card = build_card(
        info, model_name=model_name, version=target.version, uri=target.uri, metrics=metrics,
        dataset_digest=dataset_digest, params={**(info.extra or {}), **(params or {})}, run_id=run_id,
        created=target.created, model_registry=in_registry or None,
    )  # fmt: skip
    markdown = card_markdown(card)
    manifest_text = manifest_yaml(manifest)
    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-publish-") as tmp:
        staging = Path(tmp)
        for name in (WEIGHTS_FILE, INFO_FILE):
            shutil.copyfile(Path(model_dir) / name, staging / name)
        stage_bundle(model, info, staging, isvc_name=isvc_name, manifest_text=manifest_text)
        if in_registry:  # the same InferenceService, deployed through the registry's model-registry:// URI
            registry_manifest = inference_service_manifest(
                isvc_name, in_registry["uri"], service_account=service_account, labels={"version": target.version}
            )  # fmt: skip
            (staging / REGISTRY_MANIFEST_FILE).write_text(manifest_yaml(registry_manifest))
        (staging / CARD_MD).write_text(markdown)
        (staging / CARD_JSON).write_text(json.dumps(card, indent=2, sort_keys=True, default=str))
        files = _upload(store, staging, target)
    result = PublishResult(
        uri=target.uri, version=target.version, model_name=model_name, latest_uri=target.latest_uri,
        latest_updated=False, files=files, card=card, card_markdown=markdown,
        inference_service=manifest, inference_service_yaml=manifest_text,
    )  # fmt: skip
    return _register_and_move_latest(result, store, gate, image)


def _register_and_move_latest(result: PublishResult, store, gate: dict | None, image: str) -> PublishResult:
    """Register the complete version (when the card names a registry), then move ``latest`` to it."""
    card = result.card
    if card.get("model_registry"):
        props = mr_registration.properties(card, gate=gate, image=image)
        result.registration = mr_registration.register(card, props)
    pointer = {
        "model_name": result.model_name, "version": result.version, "uri": result.uri,
        "published_at": card["created"], "kfp_run_id": card["kfp_run_id"], "metrics": card["metrics"],
    }  # fmt: skip
    result.latest_updated = move_latest(store, result.latest_uri, pointer, result.model_name)
    log.info("published %s %s at %s (latest %s)", result.model_name, result.version, result.uri,
             "updated" if result.latest_updated else "kept")  # fmt: skip
    return result


def _resume(
    model_dir: Path, model_name, version, store, root, registry_url: str, gate, image
) -> PublishResult:
    """Finish an earlier publish of this run whose version is complete in the store: register, move latest."""
    import yaml

    from cifar10_kfp.publish.bundle import MANIFEST_FILE
    from cifar10_kfp.storage import join_uri

    base = models_uri(model_name, store=store, root=root)
    uri = join_uri(base, version)
    mr_registration.check_same_weights(store, uri, model_dir)
    card = mr_registration.read_card(store, uri)
    # This run's URL: the card's own entry stays as it was written; only what is registered follows the URL.
    card["model_registry"] = mr_registration.card_section(
        registry_url, model_name=model_name, version=version, version_uri=uri, store=store
    )
    manifest_text = store.get_bytes(join_uri(uri, MANIFEST_FILE)).decode()
    log.info("resuming the publish of %s %s: it is complete in the store", model_name, version)
    result = PublishResult(
        uri=uri, version=version, model_name=model_name, latest_uri=join_uri(base, LATEST), latest_updated=False,
        card=card, card_markdown=card_markdown(card), inference_service=yaml.safe_load(manifest_text),
        inference_service_yaml=manifest_text, resumed=True,
    )  # fmt: skip
    return _register_and_move_latest(result, store, gate, image)


def _load_model_dir(model_dir: Path):
    """The eager model and its ``ModelInfo``; ``PublishError`` when a file is missing."""
    from cifar10_kfp.train.models import INFO_FILE, WEIGHTS_FILE, load_model

    missing = [name for name in (WEIGHTS_FILE, INFO_FILE) if not (model_dir / name).is_file()]
    if missing:
        raise PublishError(f"model directory {model_dir} lacks {', '.join(missing)}: nothing was published")
    return load_model(model_dir, device="cpu")


def _new_version(model_name: str, run_id: str, now: datetime | None, store, root: str | None) -> _Version:
    """A fresh version of ``model_name``; ``PublishError`` if it already has objects."""
    from cifar10_kfp.storage import join_uri

    validate_model_name(model_name)
    created_at = now or datetime.now(timezone.utc)
    version = make_version(run_id, created_at)
    base = models_uri(model_name, store=store, root=root)
    version_uri = join_uri(base, version)
    if store.list(version_uri.rstrip("/") + "/"):
        raise PublishError(f"version {version_uri} already exists; published versions are never overwritten")
    created = created_at.astimezone(timezone.utc).isoformat(timespec="seconds")
    return _Version(model_name, version, version_uri, join_uri(base, LATEST), created)


def _upload(store, staging: Path, target: _Version) -> dict[str, str]:
    """Upload every staged file, ``model_card.json`` last; relative path -> sha256.

    On a failure the partial upload is removed (best effort) and ``PublishError`` raised.
    """
    from cifar10_kfp.storage import StorageError, join_uri

    ordered = sorted((p for p in staging.rglob("*") if p.is_file() and p.name != CARD_JSON), key=str)
    ordered.append(staging / CARD_JSON)
    files: dict[str, str] = {}
    try:
        for path in ordered:
            rel = path.relative_to(staging).as_posix()
            files[rel] = store.put_file(path, join_uri(target.uri, rel))
    except StorageError as exc:
        _remove_partial(store, target.uri, files)
        raise PublishError(
            f"publishing {target.model_name} {target.version} failed after {len(files)} of {len(ordered)} "
            f"files; latest was not changed: {exc}"
        ) from exc
    return files


def _remove_partial(store, version_uri: str, uploaded: dict) -> None:
    """Best effort: delete what a failed publish uploaded (without model_card.json it is incomplete anyway)."""
    from cifar10_kfp.storage import join_uri

    for rel in uploaded:
        try:
            store.delete(join_uri(version_uri, rel))
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the original error
            log.warning("could not remove partial upload %s: %s", rel, exc)
            return
