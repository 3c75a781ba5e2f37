"""Use a published model: load it with its preprocessing, predict image files, serve it with KServe.

``load_published`` rebuilds the eager model from ``model.safetensors`` + ``model.json``, so loading
never executes code from the store (the TorchScript file is for serving runtimes). It accepts:

- a published version URI: ``s3://bucket/prefix/models/<name>/<version>``;
- a ``latest`` pointer URI: ``s3://bucket/prefix/models/<name>/latest``;
- a bare model name (``cifar10``): the ``latest`` of that name under the configured root;
- a local directory holding a model (or a published version) for offline use.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

DEFAULT_SERVICE_ACCOUNT = (
    "cifar10-kfp-serving"  # must carry the S3 endpoint/credential annotations KServe reads
)
KSERVE_API_VERSION = "serving.kserve.io/v1beta1"


@dataclass
class Preprocess:
    """Turns images into the model's normalized float input. ``info`` is the model's ``ModelInfo``."""

    info: object

    @property
    def class_names(self) -> list[str]:
        return list(self.info.class_names)

    def load_image(self, path: str | os.PathLike) -> torch.Tensor:
        """Decode an image file (any PIL format) to RGB uint8 ``[3, S, S]`` at the model's size."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
                size = self.info.image_size
                if img.size != (size, size):
                    img = img.resize((size, size), Image.Resampling.BILINEAR)
                array = np.asarray(img, dtype=np.uint8)
        except (UnidentifiedImageError, OSError) as exc:
            raise ValueError(f"cannot read image {path}: {exc}") from exc
        return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()

    def __call__(self, images) -> torch.Tensor:
        """uint8 ``[N, 3, S, S]`` (or ``[3, S, S]``), or a list of image paths -> normalized float ``[N, 3, S, S]``."""
        if isinstance(images, (list, tuple)) and images and isinstance(images[0], (str, os.PathLike)):
            images = torch.stack([self.load_image(p) for p in images])
        images = torch.as_tensor(images)
        if images.ndim == 3:
            images = images.unsqueeze(0)
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected uint8 [N, 3, H, W] images, got {images.dtype} {tuple(images.shape)}")
        mean = torch.tensor(self.info.mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(self.info.std, dtype=torch.float32).view(1, 3, 1, 1)
        return (images.float() / 255 - mean) / std


def resolve_published(uri_or_model_name: str, *, store=None) -> str:
    """The version URI (or local directory) behind a version URI, a ``latest`` URI or a model name."""
    from cifar10_kfp.models import INFO_FILE
    from cifar10_kfp.publish import LATEST, latest_version, validate_model_name
    from cifar10_kfp.storage import ObjectStore, is_remote

    store = store or ObjectStore()
    target = str(uri_or_model_name)
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


def load_published(
    uri_or_model_name: str, *, store=None, device: str | torch.device = "cpu"
) -> tuple[nn.Module, Preprocess]:
    """A ready (eval-mode) model and its ``Preprocess`` for a published version, ``latest`` or name."""
    from cifar10_kfp.models import INFO_FILE, WEIGHTS_FILE, load_model
    from cifar10_kfp.storage import ObjectStore, is_remote, join_uri

    store = store or ObjectStore()
    version_uri = resolve_published(uri_or_model_name, store=store)
    if not is_remote(version_uri):
        model, info = load_model(version_uri, device=device)
        return model, Preprocess(info)
    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-published-") as tmp:
        for name in (WEIGHTS_FILE, INFO_FILE):  # only what the eager model needs, verified by sha256
            store.get_file(join_uri(version_uri, name), Path(tmp) / name)
        model, info = load_model(tmp, device=device)
    return model, Preprocess(info)


@torch.no_grad()
def predict_files(
    model: nn.Module, preprocess: Preprocess, paths: list, top_k: int = 3
) -> list[list[tuple[str, float]]]:
    """Top-k ``(class name, probability)`` per image file, most likely first."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    device = next(model.parameters()).device
    probs = model(preprocess(list(paths)).to(device)).float().softmax(dim=1).cpu()
    k = min(top_k, probs.shape[1])
    values, indices = probs.topk(k, dim=1)
    names = preprocess.class_names
    return [[(names[int(i)], float(v)) for v, i in zip(vs, ix)] for vs, ix in zip(values, indices)]


# ---------------------------------------------------------------------------- KServe


def serving_name(model_name: str) -> str:
    """A KServe-safe InferenceService name (DNS-1035 label, short enough for generated service names)."""
    name = re.sub(r"[^a-z0-9-]+", "-", model_name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"m-{name}".rstrip("-")
    return name[:40].rstrip("-")


def inference_service_manifest(
    name: str,
    storage_uri: str,
    *,
    service_account: str | None = None,
    namespace: str | None = None,
    labels: dict | None = None,
) -> dict:
    """A KServe ``InferenceService`` serving the TorchScript program with the Triton runtime (v2 protocol).

    ``storage_uri`` points at a Triton model repository (``<version>/triton``). No credentials: KServe
    reads the S3 endpoint and keys from the secret attached to ``service_account``.
    """
    if not storage_uri:
        raise ValueError("storage_uri must not be empty")
    metadata = {
        "name": serving_name(name),
        "labels": {
            "app.kubernetes.io/part-of": "cifar10-kfp",
            **{k: str(v) for k, v in (labels or {}).items()},
        },
        "annotations": {"serving.kserve.io/deploymentMode": "RawDeployment"},
    }
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": KSERVE_API_VERSION,
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {
            "predictor": {
                "serviceAccountName": service_account or DEFAULT_SERVICE_ACCOUNT,
                "model": {
                    "modelFormat": {"name": "pytorch"},
                    "runtime": "kserve-tritonserver",
                    "protocolVersion": "v2",
                    "storageUri": storage_uri.replace("minio://", "s3://", 1),
                    "resources": {
                        "requests": {"cpu": "1", "memory": "2Gi"},
                        "limits": {"cpu": "2", "memory": "4Gi"},
                    },
                },
            }
        },
    }


def manifest_yaml(manifest: dict) -> str:
    """YAML text for a manifest (PyYAML ships with kfp); JSON, which is valid YAML, without it."""
    try:
        import yaml
    except ImportError:  # pragma: no cover - kfp depends on PyYAML
        return json.dumps(manifest, indent=2) + "\n"
    return yaml.safe_dump(manifest, sort_keys=False)
