"""Decode a verified dataset archive once into the prepared-dataset file, and cache the result.

Both layouts end up as uint8 N x 3 x S x S images and int64 labels:

- official CIFAR-10 python batches: a reshape of the ``data`` rows (resized only when
  ``image_size`` is not 32); class names from ``batches.meta``;
- image folders: members are read straight from the compressed stream into memory and
  decoded in parallel (``images``); class names are the sorted train class folders.

Then, deterministically for a given ``seed``: a stratified subset of the source train split
(``max_train_samples``, 0 = all), a stratified validation split taken out of it
(``val_fraction``), a stratified subset of the test split (``max_test_samples``), and the
per-channel mean/std of the train part only (``splits``). The file is cached in the object store at
``<root>/prepared/<digest16>-<params16>/dataset.safetensors``; the key covers the source
sha256, every parameter and both format versions, so identical inputs reuse it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import cifar10_kfp.data.official as official
from cifar10_kfp.data.archives import ArchiveLimits, iter_archive
from cifar10_kfp.data.download import DownloadResult
from cifar10_kfp.data.format import (
    FORMAT_VERSION,
    PreparedDataset,
    load_prepared,
    read_metadata,
    save_prepared,
)
from cifar10_kfp.data.images import decode_images, decode_images_skipping
from cifar10_kfp.data.layout import (
    CIFAR10_PYTHON,
    MAX_VAL_FRACTION,
    OFFICIAL_TRAIN_BATCHES,
    detect_layout,
    index_image_folder,
)
from cifar10_kfp.data.splits import channel_stats, select_indices, split_validation, stratified_pick
from cifar10_kfp.storage import ObjectNotFound, ObjectStore, is_remote, open_store, parse_uri, sha256_file

log = logging.getLogger(__name__)

# Bump when decoding, splitting or statistics change, so cached prepared files are rebuilt.
PREPROCESS_VERSION = 1
MAX_IMAGE_SIZE = 1024


@dataclass(frozen=True)
class PrepareParams:
    """Everything that changes the prepared file besides the source archive."""

    val_fraction: float = 0.1  # share of the (subset) train split held out for validation, stratified
    max_train_samples: int = 0  # stratified subset of the source train split before the val split; 0 = all
    max_test_samples: int = 0  # stratified subset of the test split; 0 = all
    image_size: int = 32  # output images are image_size x image_size
    seed: int = 0  # drives the subsets and the split; same seed, same bytes
    # Leave out image-folder images Pillow cannot decode (named in the metadata's skipped_images)
    # instead of failing on the first one.
    skip_bad_images: bool = False

    def __post_init__(self):
        checks = [
            (
                0.0 <= float(self.val_fraction) <= MAX_VAL_FRACTION,
                "val_fraction",
                f"in [0, {MAX_VAL_FRACTION}]",
            ),
            (int(self.max_train_samples) >= 0, "max_train_samples", ">= 0 (0 means all)"),
            (int(self.max_test_samples) >= 0, "max_test_samples", ">= 0 (0 means all)"),
            (8 <= int(self.image_size) <= MAX_IMAGE_SIZE, "image_size", f"in [8, {MAX_IMAGE_SIZE}]"),
            (0 <= int(self.seed) < 2**63, "seed", "in [0, 2**63)"),
        ]
        for ok, name, allowed in checks:
            if not ok:
                raise ValueError(f"invalid {name}={getattr(self, name)!r}: must be {allowed}")

    def as_dict(self) -> dict:
        return {
            "val_fraction": float(self.val_fraction),
            "max_train_samples": int(self.max_train_samples),
            "max_test_samples": int(self.max_test_samples),
            "image_size": int(self.image_size),
            "seed": int(self.seed),
            "skip_bad_images": bool(self.skip_bad_images),
        }

    def cache_key(self, source_digest: str) -> str:
        """``<digest16>-<hash16>``: the source digest plus a hash of every input of the result."""
        inputs = dict(self.as_dict(), source_sha256=source_digest)
        if not inputs["skip_bad_images"]:
            del inputs["skip_bad_images"]  # the old behaviour: keys cached before this option stay valid
        inputs.update(format_version=FORMAT_VERSION, preprocess_version=PREPROCESS_VERSION)
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
        return f"{source_digest[:16]}-{digest[:16]}"


@dataclass
class PrepareInfo:
    """How the prepared file came about."""

    cache_uri: str  # where the result is cached in the object store ("" without a store)
    cache_hit: bool  # True when the cached result was reused and nothing was decoded
    source_digest: str
    metadata: dict  # the prepared file's metadata (counts, class names, mean, std, ...)
    seconds: float  # wall time of the call


# ------------------------------------------------------------------------ decoding


def _rngs(seed: int) -> dict[str, np.random.Generator]:
    # Independent streams, so changing one limit does not reshuffle the other splits.
    return {name: np.random.default_rng([int(seed), i]) for i, name in enumerate(("train", "val", "test"), 1)}


def _resize_arrays(images: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image

    out = np.empty((len(images), 3, size, size), dtype=np.uint8)
    for i, img in enumerate(images):
        pil = Image.fromarray(np.ascontiguousarray(img.transpose(1, 2, 0)))
        out[i] = np.asarray(pil.resize((size, size), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
    return out


def _load_official(archive: str, files: dict[str, bytes], root: str, params: PrepareParams, rngs):
    def batch(name):
        key = f"{root}/{name}" if root else name
        return official.load_batch(key, files[key])

    meta_name = f"{root}/batches.meta" if root else "batches.meta"
    class_names = official.label_names(meta_name, batch("batches.meta"))
    parts = [official.batch_arrays(n, batch(n)) for n in OFFICIAL_TRAIN_BATCHES]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = official.batch_arrays("test_batch", batch("test_batch"))
    for name, labels in (("train", train_y), ("test", test_y)):
        if len(labels) and (labels.min() < 0 or labels.max() >= len(class_names)):
            raise ValueError(
                f"{archive}: {name} labels outside [0, {len(class_names)}) for {len(class_names)} classes"
            )
    train_idx = select_indices(train_y, params.max_train_samples, rngs["train"])
    test_idx = select_indices(test_y, params.max_test_samples, rngs["test"])
    train_x, train_y, test_x, test_y = (
        train_x[train_idx],
        train_y[train_idx],
        test_x[test_idx],
        test_y[test_idx],
    )
    if params.image_size != official.IMAGE_SHAPE[-1]:
        train_x, test_x = (_resize_arrays(x, params.image_size) for x in (train_x, test_x))
    return class_names, (train_x, train_y), (test_x, test_y)


def _load_image_folder(
    archive: str, members, files: dict[str, bytes], root: str, params: PrepareParams, rngs
):
    index = index_image_folder(archive, members, root)
    out, skipped = [], []
    for split, limit in (("train", params.max_train_samples), ("test", params.max_test_samples)):
        entries = index.files[split]
        labels = np.asarray([label for _, label in entries], dtype=np.int64)
        chosen = select_indices(labels, limit, rngs[split])
        names = [entries[i][0] for i in chosen]
        blobs = [files[n] for n in names]
        if not params.skip_bad_images:
            out.append((decode_images(names, blobs, params.image_size), labels[chosen]))
            continue
        images, kept, failed = decode_images_skipping(names, blobs, params.image_size)
        for name, error in failed:
            log.warning("skipping %s (skip_bad_images): %s", name, error)
        skipped += [{"name": name, "error": error} for name, error in failed]
        kept_labels = labels[np.asarray(chosen, dtype=np.int64)[kept]] if kept else labels[:0]
        empty = [name for i, name in enumerate(index.class_names) if not np.any(kept_labels == i)]
        if split == "train" and empty:  # the split and the model need every class
            raise ValueError(f"{archive}: no decodable train image left in class folder(s) {empty} after skipping "
                             f"{len(failed)} undecodable image(s)")  # fmt: skip
        out.append((images, kept_labels))
    return index.class_names, out[0], out[1], skipped


def build_dataset(
    archive: str | os.PathLike,
    params: PrepareParams,
    source_digest: str,
    *,
    limits: ArchiveLimits | None = None,
) -> tuple[PreparedDataset, str]:
    """Decode a local archive into a PreparedDataset; returns it and the detected source format."""
    archive = str(archive)
    members, files = [], {}
    for member, data in iter_archive(archive, select=lambda _name: True, limits=limits):
        members.append(member)
        if data is not None:
            files[member.name] = data
    layout = detect_layout(archive, members)
    rngs = _rngs(params.seed)
    skipped: list[dict] = []
    if layout.format == CIFAR10_PYTHON:
        class_names, train, test = _load_official(archive, files, layout.root, params, rngs)
    else:
        class_names, train, test, skipped = _load_image_folder(
            archive, members, files, layout.root, params, rngs
        )
    del files
    train_part, val_part = split_validation(train[1], params.val_fraction, rngs["val"])
    mean, std = channel_stats(train[0][train_part])
    dataset = PreparedDataset(
        train_images=train[0][train_part],
        train_labels=train[1][train_part],
        val_images=train[0][val_part],
        val_labels=train[1][val_part],
        test_images=test[0],
        test_labels=test[1],
        class_names=class_names,
        mean=mean,
        std=std,
        source_digest=source_digest,
        extra={
            **params.as_dict(),
            "source_format": layout.format,
            "preprocess_version": PREPROCESS_VERSION,
            **({"skipped_images": skipped} if params.skip_bad_images else {}),
        },  # fmt: skip
    )
    dataset.validate()
    return dataset, layout.format


# --------------------------------------------------------------------------- public


def _localize(archive: str, tmp: Path, store: ObjectStore) -> Path:
    if is_remote(archive):
        local = tmp / "archive"
        store.get_file(archive, local)  # verifies the sha256 recorded at upload
        return local
    path = parse_uri(archive).path
    if path is None or not path.is_file():
        raise FileNotFoundError(f"dataset archive not found: {path}")
    return path


def _archive_digest(
    archive: str, source_digest: str | None, tmp: Path, store: ObjectStore
) -> tuple[str, Path | None]:
    """The archive's sha256 (given, recorded beside it, or computed) and the local copy made to compute it."""
    digest = (source_digest or "").lower() or _recorded_digest(archive, store)
    if digest:
        return digest, None
    local = _localize(archive, tmp, store)
    return sha256_file(local), local


def _verified_local(archive: str, local: Path | None, digest: str, tmp: Path, store: ObjectStore) -> Path:
    """A local copy of the archive whose sha256 is ``digest`` (``local`` when already made and hashed)."""
    if local is not None:
        return local
    local = _localize(archive, tmp, store)
    actual = sha256_file(local)
    if actual != digest:
        raise ValueError(
            f"dataset archive {archive} has sha256 {actual}, expected {digest}; refusing to parse it"
        )
    return local


def _recorded_digest(archive: str, store: ObjectStore) -> str:
    if not is_remote(archive):
        return ""
    try:
        return store.stat(archive).sha256 or ""
    except ObjectNotFound as exc:
        raise FileNotFoundError(f"dataset archive not found in the object store: {archive}") from exc


def prepare_to_file(
    archive_path_or_uri: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    val_fraction: float = 0.1,
    max_train_samples: int = 0,
    max_test_samples: int = 0,
    image_size: int = 32,
    seed: int = 0,
    skip_bad_images: bool = False,
    source_digest: str = "",
    store: ObjectStore | None = None,
    cache: bool = True,
    limits: ArchiveLimits | None = None,
) -> PrepareInfo:
    """Write the prepared dataset for an archive to ``output_path``, reusing the cached result if any.

    ``source_digest`` is the archive's sha256 from the download step: with it, a cache hit
    needs no archive at all, and a miss verifies the archive against it before parsing.
    """
    started = time.monotonic()
    params = PrepareParams(
        val_fraction, max_train_samples, max_test_samples, image_size, seed, skip_bad_images
    )
    archive = str(archive_path_or_uri)
    store = store if store is not None else open_store()
    cache_store = store if cache and store.config.endpoint else None
    if cache and cache_store is None:
        log.info("no object store configured (MINIO_ENDPOINT is unset): the prepared dataset is not cached")
    output_path = Path(output_path)
    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-prepare-") as tmp:
        digest, local = _archive_digest(archive, source_digest, Path(tmp), store)
        cache_uri = ""
        if cache_store is not None:
            cache_uri = cache_store.root_uri("prepared", params.cache_key(digest), "dataset.safetensors")
            if cache_store.exists(cache_uri):
                cache_store.get_file(cache_uri, output_path)
                log.info("prepared dataset reused from %s", cache_uri)
                return PrepareInfo(
                    cache_uri, True, digest, read_metadata(output_path), time.monotonic() - started
                )
        local = _verified_local(archive, local, digest, Path(tmp), store)
        dataset, _ = build_dataset(local, params, digest, limits=limits)
        save_prepared(dataset, output_path)
        if cache_store is not None:
            cache_store.put_file(output_path, cache_uri)
    return PrepareInfo(cache_uri, False, digest, read_metadata(output_path), time.monotonic() - started)


def prepare_dataset(
    archive_path_or_uri: str | os.PathLike,
    *,
    val_fraction: float = 0.1,
    max_train_samples: int = 0,
    max_test_samples: int = 0,
    image_size: int = 32,
    seed: int = 0,
    skip_bad_images: bool = False,
    source_digest: str = "",
    store: ObjectStore | None = None,
    cache: bool = True,
) -> tuple[PreparedDataset, PrepareInfo]:
    """``prepare_to_file`` into a temporary file, returning the loaded PreparedDataset and PrepareInfo."""
    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-prepared-") as tmp:
        out = Path(tmp) / "dataset.safetensors"
        info = prepare_to_file(
            archive_path_or_uri, out, val_fraction=val_fraction, max_train_samples=max_train_samples,
            max_test_samples=max_test_samples, image_size=image_size, seed=seed, skip_bad_images=skip_bad_images,
            source_digest=source_digest, store=store, cache=cache,
        )  # fmt: skip
        return load_prepared(out), info


@dataclass
class PrepareResult:
    download: DownloadResult
    prepare: PrepareInfo

    def summary(self) -> dict:
        meta = self.prepare.metadata
        return {
            "source": self.download.source,
            "format": self.download.format,
            "sha256": self.download.sha256,
            "download_cache_hit": self.download.cache_hit,
            "download_cache_uri": self.download.cache_uri,
            "prepared_cache_hit": self.prepare.cache_hit,
            "prepared_cache_uri": self.prepare.cache_uri,
            "class_names": meta["class_names"],
            "sizes": meta["sizes"],
            "counts": meta["counts"],
            "mean": meta["mean"],
            "std": meta["std"],
            "image_size": meta["image_size"],
            "skipped_images": meta.get("skipped_images", []),
        }


def prepare_from_source(
    source: str,
    checksum: str,
    output_path: str | os.PathLike,
    *,
    val_fraction: float = 0.1,
    max_train_samples: int = 0,
    max_test_samples: int = 0,
    image_size: int = 32,
    seed: int = 0,
    skip_bad_images: bool = False,
    store: ObjectStore | None = None,
    cache: bool = True,
) -> PrepareResult:
    """Download (or find in the cache), verify and prepare in one call: what ``cifar10-kfp data`` does."""
    from cifar10_kfp.data.download import fetch_dataset

    params = PrepareParams(  # fail fast
        val_fraction, max_train_samples, max_test_samples, image_size, seed, skip_bad_images
    )
    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-data-") as tmp:
        download = fetch_dataset(source, checksum, store=store, cache=cache, workdir=tmp)
        info = prepare_to_file(
            download.local_path or download.cache_uri,
            output_path,
            **params.as_dict(),
            source_digest=download.sha256,
            store=store,
            cache=cache,
        )
    return PrepareResult(download, info)


__all__ = [
    "PREPROCESS_VERSION",
    "PrepareInfo",
    "PrepareParams",
    "PrepareResult",
    "build_dataset",
    "channel_stats",
    "prepare_dataset",
    "prepare_from_source",
    "prepare_to_file",
    "split_validation",
    "stratified_pick",
]
