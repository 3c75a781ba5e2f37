"""Use a published model: load it with its preprocessing and predict image files.

``load_published`` rebuilds the eager model from ``model.safetensors`` + ``model.json``, so loading
never executes code from the store (the TorchScript file is for serving runtimes, see
``cifar10_kfp.publish.bundle``). Predictions are ``cifar10_kfp.train.inference.predict``'s (flip TTA), the same
computation as the TorchScript program and the evaluation. It accepts (``registry.resolve_published``):

- a published version URI: ``s3://bucket/prefix/models/<name>/<version>``;
- a ``latest`` pointer URI: ``s3://bucket/prefix/models/<name>/latest``;
- a bare model name (``cifar10``): the ``latest`` of that name under the configured root;
- a local directory holding a model (or a published version) for offline use;
- ``model-registry://<name>[/<version>]``: a version registered in Kubeflow Model Registry
  (``cifar10_kfp.publish.kubeflow_registry``; without a version, the newest), read from the store.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from cifar10_kfp.publish.registry import resolve_published
from cifar10_kfp.train.inference import Normalize, predict
from cifar10_kfp.train.models import ModelInfo

if TYPE_CHECKING:  # annotations only
    from cifar10_kfp.storage import ObjectStore


@dataclass
class Preprocess:
    """Turns images into the model's normalized float input. ``info`` is the model's ``ModelInfo``."""

    info: ModelInfo

    @property
    def class_names(self) -> list[str]:
        return list(self.info.class_names)

    def load_image(self, path: str | os.PathLike) -> torch.Tensor:
        """Decode an image file (any PIL format) to RGB uint8 ``[3, S, S]`` at the model's size."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as opened:
                img = opened.convert("RGB")
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
        return Normalize(self.info.mean, self.info.std)(images)


def load_published(
    uri_or_model_name: str,
    *,
    store: ObjectStore | None = None,
    device: str | torch.device = "cpu",
    model_registry_url: str | None = None,
) -> tuple[nn.Module, Preprocess]:
    """A ready (eval-mode) model and its ``Preprocess`` for a published version, ``latest``, name or registry URI."""
    from cifar10_kfp.storage import ObjectStore, is_remote, join_uri
    from cifar10_kfp.train.models import INFO_FILE, WEIGHTS_FILE, load_model

    store = store or ObjectStore()
    version_uri = resolve_published(uri_or_model_name, store=store, model_registry_url=model_registry_url)
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
    probs = predict(model, preprocess(list(paths)).to(device)).softmax(dim=1).cpu()
    k = min(top_k, probs.shape[1])
    values, indices = probs.topk(k, dim=1)
    names = preprocess.class_names
    return [[(names[int(i)], float(v)) for v, i in zip(vs, ix)] for vs, ix in zip(values, indices)]
