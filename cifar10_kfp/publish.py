"""The champion/challenger gate and versioned, never-overwritten model publishing.

Layout under the store root (``root_uri()``, default ``s3://mlpipeline/cifar10-kfp/``)::

    models/<model_name>/<version>/model.safetensors        weights (safetensors, no pickle)
                                 /model.json               ModelInfo: architecture, classes, mean/std, ...
                                 /model.torchscript.pt     TorchScript, RAW uint8 input (see below)
                                 /triton/<name>/config.pbtxt, /triton/<name>/1/model.pt   Triton repository
                                 /inference_service.yaml   KServe InferenceService for this version
                                 /model_card.md            human-readable card
                                 /model_card.json          machine-readable card; written LAST, so its
                                                           presence marks a complete version
    models/<model_name>/latest                             JSON pointer {version, uri, ...}

``<version>`` is ``YYYYMMDDTHHMMSSZ-<run id>``: it sorts by time and is unique per run. A
version that already has objects is never written again. ``latest`` is one small object,
replaced by a single PUT (atomic on S3) only after every file of the version is uploaded,
and it never moves to an older version. A failed publish leaves ``latest`` untouched.

The TorchScript program takes **raw uint8 images** ``[N, 3, H, W]`` (0..255, RGB) and
returns **logits** ``[N, num_classes]``: the normalization with the model's mean/std happens
inside, so a serving client sends pixels and never needs the statistics (``cifar10_kfp.torchscript``).

Only publishing and comparing against a published champion import torch: a gate with nothing
published yet reads one pointer and decides.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger(__name__)

TORCHSCRIPT_FILE = "model.torchscript.pt"
CARD_MD = "model_card.md"
CARD_JSON = "model_card.json"  # written last: marks a complete version
MANIFEST_FILE = "inference_service.yaml"
LATEST = "latest"

_MODEL_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")  # the one rule; params asks it too


class PublishError(RuntimeError):
    """Publishing failed; ``latest`` was not changed."""


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
    store = _store(store)
    pointer = latest_version(model_name, store=store, root=root)
    if pointer is None:
        return None, None
    # Imported only now: with no champion the gate needs no torch (a second of import per task).
    from cifar10_kfp.data.format import load_prepared
    from cifar10_kfp.evaluate import evaluate_loaded
    from cifar10_kfp.serving import load_published

    model, preprocess = load_published(pointer["uri"], store=store, device=device or "cpu")
    dataset = load_prepared(data_path_or_uri)
    images, labels = dataset.split("test")
    result = evaluate_loaded(
        model, preprocess.info, images, labels, dataset.class_names, tta=False, device=device or "cpu"
    )
    return result.accuracy, pointer


def run_gate(
    challenger_accuracy: float,
    data_path_or_uri,
    *,
    min_accuracy: float,
    model_name: str,
    store=None,
    root: str | None = None,
    device=None,
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


# ---------------------------------------------------------------------------- naming


def validate_model_name(model_name: str) -> str:
    """A model name: 1-63 lowercase letters, digits, '.', '_' or '-' (the pipeline parameter's rule)."""
    if not isinstance(model_name, str) or not _MODEL_NAME_RE.match(model_name):
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


def models_uri(model_name: str, *, store=None, root: str | None = None) -> str:
    from cifar10_kfp.storage import join_uri

    base = root if root is not None else _store(store).root_uri()
    return join_uri(base, "models", validate_model_name(model_name))


def latest_version(model_name: str, *, store=None, root: str | None = None) -> dict | None:
    """The ``latest`` pointer of ``model_name`` (``{version, uri, ...}``) or None if never published."""
    from cifar10_kfp.storage import ObjectNotFound, join_uri

    store = _store(store)
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
    store = _store(store)
    base = models_uri(model_name, store=store, root=root).rstrip("/") + "/"
    versions = set()
    for uri in store.list(base):
        rel = uri[len(base) :] if uri.startswith(base) else str(Path(uri).relative_to(Path(base)))
        parts = rel.split("/")
        if len(parts) == 2 and parts[1] == CARD_JSON:
            versions.add(parts[0])
    return sorted(versions)


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


def _store(store):
    from cifar10_kfp.storage import ObjectStore

    return store if store is not None else ObjectStore()


def triton_config(name: str, info, max_batch_size: int = 256) -> str:
    """``config.pbtxt`` for Triton's libtorch backend: uint8 [3, H, W] in, float32 logits out."""
    return (
        f'name: "{name}"\n'
        'platform: "pytorch_libtorch"\n'
        f"max_batch_size: {max_batch_size}\n"
        f'input [ {{ name: "INPUT__0" data_type: TYPE_UINT8 dims: [ 3, {info.image_size}, {info.image_size} ] }} ]\n'
        f'output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {info.num_classes} ] }} ]\n'
    )


# --------------------------------------------------------------------------- publish


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


def build_card(info, *, model_name, version, uri, metrics, dataset_digest, params, run_id, created) -> dict:
    import cifar10_kfp

    return {
        "model_name": model_name,
        "version": version,
        "uri": uri,
        "created": created,
        "kfp_run_id": run_id,
        "code_version": cifar10_kfp.__version__,
        "architecture": info.architecture,
        "model_config": info.model_config,
        "class_names": info.class_names,
        "image_size": info.image_size,
        "normalization": {"mean": info.mean, "std": info.std, "units": "pixel/255"},
        "dataset_digest": dataset_digest,
        "metrics": metrics,
        "parameters": params,
        "files": {
            "weights": "model.safetensors",
            "model_info": "model.json",
            "torchscript": TORCHSCRIPT_FILE,
            "torchscript_input": "uint8 [N, 3, H, W] RGB pixels 0..255; normalization is inside",
            "torchscript_output": "float32 logits [N, num_classes]",
        },
    }


def card_markdown(card: dict) -> str:
    from cifar10_kfp.report import md_escape

    def rows(mapping):
        return [f"| {md_escape(k)} | {md_escape(json.dumps(v, default=str) if isinstance(v, (dict, list)) else v)} |"
                for k, v in sorted(mapping.items())]  # fmt: skip

    lines = [
        f"# Model card: {md_escape(card['model_name'])} {md_escape(card['version'])}",
        "",
        f"- URI: `{md_escape(card['uri'])}`",
        f"- Created: {md_escape(card['created'])}; KFP run: `{md_escape(card['kfp_run_id'] or '-')}`; "
        f"code version: {md_escape(card['code_version'])}",
        f"- Architecture: `{md_escape(card['architecture'])}`, {len(card['class_names'])} classes, "
        f"{card['image_size']}x{card['image_size']} RGB input",
        f"- Dataset digest: `{md_escape(card['dataset_digest'] or '-')}`",
        f"- Classes: {md_escape(', '.join(card['class_names']))}",
        "",
        "## Metrics (test split)",
        "",
        "| metric | value |",
        "|---|---|",
        *rows(card["metrics"]),
        "",
        "## Parameters",
        "",
        "| name | value |",
        "|---|---|",
        *rows(card["parameters"]),
        "",
        "## Use",
        "",
        f"- `{TORCHSCRIPT_FILE}`: TorchScript; input uint8 `[N, 3, H, W]` RGB pixels (0..255), normalization "
        "inside; output float32 logits `[N, num_classes]`.",
        "- Python: `model, preprocess = cifar10_kfp.serving.load_published(URI)`; "
        "CLI: `cifar10-kfp predict --model URI image.jpg`.",
        f"- KServe: `kubectl apply -f {MANIFEST_FILE}` (Triton runtime, v2 protocol).",
        "",
    ]
    return "\n".join(lines)


def publish_model(
    model_dir: str | os.PathLike,
    *,
    model_name: str,
    metrics: dict,
    dataset_digest: str,
    params: dict | None = None,
    run_id: str = "",
    store=None,
    root: str | None = None,
    now: datetime | None = None,
    service_account: str | None = None,
) -> PublishResult:
    """Publish a model directory as a new version of ``model_name`` and move ``latest`` to it.

    Everything is built and checked locally first (weights load, TorchScript matches eager), then
    uploaded; ``model_card.json`` goes last, then the ``latest`` pointer. Raises ``PublishError``
    if the version exists or any upload fails, leaving ``latest`` as it was.
    """
    from cifar10_kfp.models import INFO_FILE, WEIGHTS_FILE, load_model
    from cifar10_kfp.serving import inference_service_manifest, manifest_yaml, serving_name
    from cifar10_kfp.storage import StorageError, join_uri
    from cifar10_kfp.torchscript import export_torchscript

    validate_model_name(model_name)
    store = _store(store)
    model_dir = Path(model_dir)
    missing = [name for name in (WEIGHTS_FILE, INFO_FILE) if not (model_dir / name).is_file()]
    if missing:
        raise PublishError(f"model directory {model_dir} lacks {', '.join(missing)}: nothing was published")
    model, info = load_model(model_dir, device="cpu")

    created_at = now or datetime.now(timezone.utc)
    version = make_version(run_id, created_at)
    base = models_uri(model_name, store=store, root=root)
    version_uri = join_uri(base, version)
    latest_uri = join_uri(base, LATEST)
    if store.list(version_uri.rstrip("/") + "/"):
        raise PublishError(f"version {version_uri} already exists; published versions are never overwritten")

    isvc_name = serving_name(model_name)
    manifest = inference_service_manifest(
        isvc_name,
        join_uri(version_uri, "triton"),
        service_account=service_account,
        labels={"version": version},
    )
    card = build_card(
        info,
        model_name=model_name,
        version=version,
        uri=version_uri,
        metrics=metrics,
        dataset_digest=dataset_digest,
        params={**(info.extra or {}), **(params or {})},
        run_id=run_id,
        created=created_at.astimezone(timezone.utc).isoformat(timespec="seconds"),
    )
    markdown = card_markdown(card)
    manifest_text = manifest_yaml(manifest)

    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-publish-") as tmp:
        staging = Path(tmp)
        shutil.copyfile(model_dir / WEIGHTS_FILE, staging / WEIGHTS_FILE)
        shutil.copyfile(model_dir / INFO_FILE, staging / INFO_FILE)
        export_torchscript(model, info, staging / TORCHSCRIPT_FILE)
        triton_dir = staging / "triton" / isvc_name
        (triton_dir / "1").mkdir(parents=True)
        shutil.copyfile(staging / TORCHSCRIPT_FILE, triton_dir / "1" / "model.pt")
        (triton_dir / "config.pbtxt").write_text(triton_config(isvc_name, info))
        (staging / MANIFEST_FILE).write_text(manifest_text)
        (staging / CARD_MD).write_text(markdown)
        (staging / CARD_JSON).write_text(json.dumps(card, indent=2, sort_keys=True, default=str))

        ordered = sorted((p for p in staging.rglob("*") if p.is_file() and p.name != CARD_JSON), key=str)
        ordered.append(staging / CARD_JSON)
        files = {}
        try:
            for path in ordered:
                rel = path.relative_to(staging).as_posix()
                files[rel] = store.put_file(path, join_uri(version_uri, rel))
        except StorageError as exc:
            _remove_partial(store, version_uri, files)
            raise PublishError(
                f"publishing {model_name} {version} failed after {len(files)} of {len(ordered)} files; "
                f"latest was not changed: {exc}"
            ) from exc

    pointer = {
        "model_name": model_name,
        "version": version,
        "uri": version_uri,
        "published_at": card["created"],
        "kfp_run_id": run_id,
        "metrics": metrics,
    }
    latest_updated = _move_latest(store, latest_uri, pointer, model_name)
    log.info(
        "published %s %s at %s (latest %s)",
        model_name,
        version,
        version_uri,
        "updated" if latest_updated else "kept",
    )
    return PublishResult(
        uri=version_uri,
        version=version,
        model_name=model_name,
        latest_uri=latest_uri,
        latest_updated=latest_updated,
        files=files,
        card=card,
        card_markdown=markdown,
        inference_service=manifest,
        inference_service_yaml=manifest_text,
    )


def _move_latest(store, latest_uri: str, pointer: dict, model_name: str) -> bool:
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


def _remove_partial(store, version_uri: str, uploaded: dict) -> None:
    """Best effort: delete what a failed publish uploaded (without model_card.json it is incomplete anyway)."""
    from cifar10_kfp.storage import join_uri

    for rel in uploaded:
        try:
            store.delete(join_uri(version_uri, rel))
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the original error
            log.warning("could not remove partial upload %s: %s", rel, exc)
            return
