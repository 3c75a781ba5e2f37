"""The prepared-dataset file: one safetensors file, loadable without pickle.

Tensors: ``{train,val,test}_images`` (uint8, N x 3 x H x W) and ``{train,val,test}_labels``
(int64, N). Everything else is JSON in the safetensors metadata under the key ``cifar10_kfp``:
class names, per-channel mean/std (of the train part, in [0, 1] units), image size, counts
per split and class, the source digest and the format version.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1
METADATA_KEY = "cifar10_kfp"
SPLITS = ("train", "val", "test")


@dataclass
class PreparedDataset:
    """Decoded images and labels for the three splits, plus what later steps need to know."""

    train_images: np.ndarray  # uint8 [N, 3, H, W]
    train_labels: np.ndarray  # int64 [N]
    val_images: np.ndarray  # uint8 [N, 3, H, W]; may have N = 0 when val_fraction is 0
    val_labels: np.ndarray  # int64 [N]
    test_images: np.ndarray  # uint8 [N, 3, H, W]
    test_labels: np.ndarray  # int64 [N]
    class_names: list[str]  # index i is label i; a stable order (sorted for image folders)
    mean: list[float]  # per-channel mean of the train part, pixel/255 units
    std: list[float]  # per-channel std of the train part, pixel/255 units
    source_digest: str = ""  # sha256 of the source archive
    extra: dict = field(default_factory=dict)  # preprocess parameters, source URI, ...

    @property
    def image_size(self) -> int:
        return int(self.train_images.shape[-1])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}: expected one of {SPLITS}")
        return getattr(self, f"{name}_images"), getattr(self, f"{name}_labels")

    def counts(self) -> dict[str, dict[str, int]]:
        """Examples per split and class name."""
        out = {}
        for name in SPLITS:
            _, labels = self.split(name)
            per_class = (
                np.bincount(labels, minlength=self.num_classes) if len(labels) else [0] * self.num_classes
            )
            out[name] = {cls: int(n) for cls, n in zip(self.class_names, per_class)}
        return out

    def metadata(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "class_names": list(self.class_names),
            "mean": [float(x) for x in self.mean],
            "std": [float(x) for x in self.std],
            "image_size": self.image_size,
            "source_digest": self.source_digest,
            "counts": self.counts(),
            "sizes": {name: int(len(self.split(name)[1])) for name in SPLITS},
            **self.extra,
        }

    def validate(self) -> None:
        """Raise ValueError if shapes, dtypes or labels are inconsistent."""
        for name in SPLITS:
            images, labels = self.split(name)
            if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1] != 3:
                raise ValueError(
                    f"{name}_images must be uint8 [N, 3, H, W], got {images.dtype} {images.shape}"
                )
            if labels.dtype != np.int64 or labels.shape != (images.shape[0],):
                raise ValueError(
                    f"{name}_labels must be int64 [{images.shape[0]}], got {labels.dtype} {labels.shape}"
                )
            if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
                raise ValueError(f"{name}_labels outside [0, {self.num_classes})")


def save_prepared(dataset: PreparedDataset, path: str | os.PathLike) -> Path:
    """Write the dataset atomically as one safetensors file."""
    from safetensors.numpy import save_file

    dataset.validate()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name in SPLITS:
        images, labels = dataset.split(name)
        tensors[f"{name}_images"] = np.ascontiguousarray(images)
        tensors[f"{name}_labels"] = np.ascontiguousarray(labels)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={METADATA_KEY: json.dumps(dataset.metadata(), sort_keys=True)})
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def read_metadata(path: str | os.PathLike) -> dict:
    """The JSON metadata of a prepared-dataset file, without reading the tensors."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as fh:
        meta = fh.metadata() or {}
    if METADATA_KEY not in meta:
        raise ValueError(f"{path} is not a cifar10-kfp prepared dataset (no {METADATA_KEY!r} metadata)")
    return json.loads(meta[METADATA_KEY])


def load_prepared(path_or_uri: str | os.PathLike) -> PreparedDataset:
    """Load a prepared dataset file from a local path, a directory holding one, or an s3:// URI.

    ``cifar10_kfp.data.shards.load_dataset`` reads either this or a sharded dataset.
    """
    from safetensors.numpy import load_file

    from cifar10_kfp.storage import is_remote, open_store

    if is_remote(path_or_uri):
        with tempfile.TemporaryDirectory(prefix="cifar10-kfp-data-") as tmp:
            local = Path(tmp) / "dataset.safetensors"
            open_store().get_file(str(path_or_uri), local)
            return load_prepared(local)
    path = Path(path_or_uri)
    if path.is_dir():
        path = path / "dataset.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"prepared dataset not found: {path}")
    meta = read_metadata(path)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: prepared-dataset format version {meta.get('format_version')!r}, expected {FORMAT_VERSION}; "
            "re-run the preprocess step"
        )
    tensors = load_file(str(path))
    known = {"format_version", "class_names", "mean", "std", "image_size", "source_digest", "counts", "sizes"}
    dataset = PreparedDataset(
        **{name: tensors[name] for name in (f"{s}_{kind}" for s in SPLITS for kind in ("images", "labels"))},
        class_names=list(meta["class_names"]),
        mean=list(meta["mean"]),
        std=list(meta["std"]),
        source_digest=meta.get("source_digest", ""),
        extra={k: v for k, v in meta.items() if k not in known},
    )
    dataset.validate()
    return dataset
