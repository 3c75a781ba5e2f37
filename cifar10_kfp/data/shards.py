"""The sharded prepared dataset: many small safetensors files and one index, in the object store.

Layout under a prefix (``s3://...`` or a local directory)::

    train-00000.safetensors    uint8 ``images`` [n, 3, S, S] and int64 ``labels`` [n]
    ...
    val-00000.safetensors, test-00000.safetensors, ...
    index.json                 format version, the dataset's metadata (class names, train-only
                               mean/std, counts, ...) and, per split, each shard's name, sample
                               count, size in bytes and sha256

``index.json`` is written last and is the commit mark: a prefix without it holds no dataset, so
a preprocess that failed (or was killed) never leaves a usable half. ``ShardWriter`` deletes what
it uploaded when it fails; a kill leaves orphans that the next run overwrites (names are
deterministic) and that no reader ever opens.

``open_shards`` refuses, naming the shard, before anything trains on it: a missing shard, one of
another size (truncated), one whose recorded sha256 differs from the index, and one whose header
holds fewer (or more) samples than the index claims. ``read_shard`` checks the bytes it got
against the index's sha256 again, so a shard swapped after the check is refused too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cifar10_kfp.data.format import SPLITS, PreparedDataset
from cifar10_kfp.storage import IntegrityError, ObjectNotFound, ObjectStore, join_uri

log = logging.getLogger(__name__)

SHARD_FORMAT_VERSION = 1
INDEX_NAME = "index.json"
DEFAULT_SHARD_SAMPLES = 1024  # 3 MB at 32 px, 28 MB at 96 px: small enough to read ahead, big enough per GET
_MAX_HEADER = 1 << 20  # a safetensors header of two tensors is ~200 bytes; anything near this is hostile


class ShardError(IntegrityError):
    """A shard (or the index) is missing, truncated, altered or inconsistent; the message names it."""


@dataclass(frozen=True)
class ShardEntry:
    name: str  # object name under the prefix, e.g. train-00003.safetensors
    samples: int
    bytes: int
    sha256: str


@dataclass
class ShardIndex:
    """What ``index.json`` says, plus where it was read from."""

    uri: str  # the prefix holding the shards and index.json
    metadata: dict  # the prepared-dataset metadata (format.PreparedDataset.metadata())
    shards: dict[str, list[ShardEntry]] = field(default_factory=dict)
    digest: str = ""  # sha256 of index.json: identifies this exact dataset in checkpoints

    @property
    def class_names(self) -> list[str]:
        return list(self.metadata["class_names"])

    @property
    def num_classes(self) -> int:
        return len(self.metadata["class_names"])

    @property
    def image_size(self) -> int:
        return int(self.metadata["image_size"])

    @property
    def mean(self) -> list[float]:
        return list(self.metadata["mean"])

    @property
    def std(self) -> list[float]:
        return list(self.metadata["std"])

    @property
    def source_digest(self) -> str:
        return str(self.metadata.get("source_digest", ""))

    def size(self, split: str) -> int:
        return sum(e.samples for e in self.shards.get(split, []))

    def decoded_bytes(self, split: str | None = None) -> int:
        """Bytes of the uint8 images of a split (all splits when None), as they would sit in memory."""
        per_image = 3 * self.image_size**2
        return per_image * sum(self.size(s) for s in ([split] if split else SPLITS))

    def to_json(self) -> bytes:
        body = {
            "format_version": SHARD_FORMAT_VERSION,
            "metadata": self.metadata,
            "shards": {s: [asdict(e) for e in self.shards.get(s, [])] for s in SPLITS},
        }
        return json.dumps(body, sort_keys=True, indent=1).encode()


def _parse_index(uri: str, raw: bytes) -> ShardIndex:
    where = join_uri(uri, INDEX_NAME)
    try:
        body = json.loads(raw)
        if body.get("format_version") != SHARD_FORMAT_VERSION:
            raise ValueError(
                f"format_version {body.get('format_version')!r}, expected {SHARD_FORMAT_VERSION}"
            )
        shards = {s: [ShardEntry(**e) for e in body["shards"].get(s, [])] for s in SPLITS}
        metadata = body["metadata"]
        for key in ("class_names", "mean", "std", "image_size", "sizes"):
            if key not in metadata:
                raise ValueError(f"no {key!r} in its metadata")
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(f"shard index {where} is malformed ({exc}); re-run the preprocess step") from exc
    index = ShardIndex(uri, metadata, shards, hashlib.sha256(raw).hexdigest())
    for split in SPLITS:
        claimed = int(metadata["sizes"].get(split, 0))
        if claimed != index.size(split):
            raise ShardError(
                f"shard index {where} claims {claimed} {split} samples but its {split} shards list "
                f"{index.size(split)}; refusing it"
            )
    return index


# ---------------------------------------------------------------------------- reading


def _header(data: bytes, name: str) -> dict:
    if len(data) < 8:
        raise ShardError(f"shard {name} is truncated: {len(data)} bytes, not even a safetensors header")
    (length,) = struct.unpack("<Q", data[:8])
    if length > _MAX_HEADER or len(data) < 8 + length:
        raise ShardError(f"shard {name} is truncated or not a safetensors file (header length {length})")
    try:
        return json.loads(data[8 : 8 + length])
    except ValueError as exc:
        raise ShardError(f"shard {name} has an unreadable safetensors header ({exc})") from exc


def _check_header(header: dict, entry: ShardEntry, image_size: int) -> None:
    images, labels = header.get("images", {}), header.get("labels", {})
    want = [entry.samples, 3, image_size, image_size]
    if images.get("dtype") != "U8" or images.get("shape") != want:
        raise ShardError(
            f"shard {entry.name} holds images {images.get('dtype')} {images.get('shape')}, but the index "
            f"claims U8 {want}; refusing it"
        )
    if labels.get("dtype") != "I64" or labels.get("shape") != [entry.samples]:
        raise ShardError(
            f"shard {entry.name} holds labels {labels.get('shape')}, but the index claims {entry.samples} samples"
        )


def open_shards(uri: str, store: ObjectStore) -> ShardIndex:
    """Read ``index.json`` under ``uri`` and check every shard it names, without reading their data."""
    uri = str(uri).rstrip("/")
    if uri.endswith("/" + INDEX_NAME) or uri == INDEX_NAME:
        uri = uri[: -len(INDEX_NAME)].rstrip("/")
    try:
        raw = store.get_bytes(join_uri(uri, INDEX_NAME))
    except ObjectNotFound as exc:
        raise FileNotFoundError(
            f"no sharded dataset at {uri}: {INDEX_NAME} is missing (a preprocess that did not finish writes none)"
        ) from exc
    index = _parse_index(uri, raw)
    for split in SPLITS:
        for entry in index.shards[split]:
            where = join_uri(uri, entry.name)
            try:
                info = store.stat(where)
            except ObjectNotFound as exc:
                raise ShardError(f"shard {entry.name} listed in {INDEX_NAME} is missing at {where}") from exc
            if info.size != entry.bytes:
                raise ShardError(f"shard {entry.name} is truncated or altered: {info.size} bytes, "
                                 f"the index says {entry.bytes}")  # fmt: skip
            if info.sha256 and info.sha256 != entry.sha256:
                raise ShardError(f"shard {entry.name} has sha256 {info.sha256}, the index says {entry.sha256}; "
                                 "refusing it")  # fmt: skip
            _check_header(
                _header(store.get_range(where, 0, 8 + _MAX_HEADER), entry.name), entry, index.image_size
            )
    return index


def read_shard(index: ShardIndex, entry: ShardEntry, store: ObjectStore) -> tuple[np.ndarray, np.ndarray]:
    """One shard's (images, labels), after checking its bytes against the index."""
    from safetensors.numpy import load

    data = store.get_bytes(join_uri(index.uri, entry.name))
    actual = hashlib.sha256(data).hexdigest()
    if actual != entry.sha256:
        raise ShardError(
            f"shard {entry.name} has sha256 {actual}, the index says {entry.sha256}; refusing it"
        )
    _check_header(_header(data, entry.name), entry, index.image_size)
    tensors = load(data)
    labels = tensors["labels"]
    if len(labels) and (labels.min() < 0 or labels.max() >= index.num_classes):
        raise ShardError(f"shard {entry.name} has labels outside [0, {index.num_classes})")
    return tensors["images"], labels


def load_all(index: ShardIndex, store: ObjectStore) -> PreparedDataset:
    """The whole sharded dataset in memory, as the single-file path has it (for data that fits)."""
    arrays = {}
    empty = np.zeros((0, 3, index.image_size, index.image_size), dtype=np.uint8)
    for split in SPLITS:
        parts = [read_shard(index, e, store) for e in index.shards[split]]
        arrays[f"{split}_images"] = np.concatenate([p[0] for p in parts]) if parts else empty
        arrays[f"{split}_labels"] = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    known = {"format_version", "class_names", "mean", "std", "image_size", "source_digest", "counts", "sizes"}
    dataset = PreparedDataset(
        **arrays, class_names=index.class_names, mean=index.mean, std=index.std,
        source_digest=index.source_digest, extra={k: v for k, v in index.metadata.items() if k not in known},
    )  # fmt: skip
    dataset.validate()
    return dataset


def load_dataset(path_or_uri) -> PreparedDataset:
    """A prepared dataset, whole, of either kind: a sharded one (a prefix holding index.json, each shard
    checked) or one file (``format.load_prepared``). Evaluation and tuning read this; training can also
    stream a sharded one (``cifar10_kfp.train.stream``)."""
    from cifar10_kfp.data.format import load_prepared
    from cifar10_kfp.storage import open_store

    store = open_store()
    if is_shard_set(str(path_or_uri), store):
        return load_all(open_shards(str(path_or_uri), store), store)
    return load_prepared(path_or_uri)


def is_shard_set(data: str, store: ObjectStore) -> bool:
    """Whether ``data`` names a sharded dataset (its prefix or its index.json) rather than one file."""
    text = str(data).rstrip("/")
    if text.endswith(INDEX_NAME):
        return True
    if text.endswith(".safetensors"):
        return False
    if Path(text).is_dir():
        return (Path(text) / INDEX_NAME).is_file()
    return "://" in text and store.exists(join_uri(text, INDEX_NAME))


# ---------------------------------------------------------------------------- writing


class ShardWriter:
    """Write splits as shards of ``shard_samples`` images under ``uri`` as they come; index last.

    Holds at most one unfinished shard per split. Used as a context manager: if the block raises,
    every object written so far is deleted, so the prefix holds nothing rather than a half.
    """

    def __init__(
        self, uri: str, store: ObjectStore, image_size: int, shard_samples: int = DEFAULT_SHARD_SAMPLES
    ):
        if shard_samples < 1:
            raise ValueError(f"invalid shard_samples={shard_samples!r}: must be >= 1")
        self.uri, self.store, self.image_size, self.shard_samples = (
            str(uri).rstrip("/"),
            store,
            image_size,
            shard_samples,
        )
        self.entries: dict[str, list[ShardEntry]] = {s: [] for s in SPLITS}
        self._pending: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {s: [] for s in SPLITS}
        self._written: list[str] = []
        self._labels: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}  # per-class counts for the index
        self._tmp = tempfile.TemporaryDirectory(prefix="cifar10-kfp-shards-")

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if exc is not None:
            self.abort()
        self._tmp.cleanup()

    def add(self, split: str, images: np.ndarray, labels: np.ndarray) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}: expected one of {SPLITS}")
        if images.shape[1:] != (3, self.image_size, self.image_size) or images.dtype != np.uint8:
            raise ValueError(f"shard images must be uint8 [N, 3, {self.image_size}, {self.image_size}], "
                             f"got {images.dtype} {images.shape}")  # fmt: skip
        self._pending[split].append((images, labels.astype(np.int64, copy=False)))
        self._labels[split].append(np.bincount(labels, minlength=1))
        while sum(len(p[1]) for p in self._pending[split]) >= self.shard_samples:
            self._flush(split, self.shard_samples)

    def _flush(self, split: str, n: int) -> None:
        from safetensors.numpy import save_file

        images = np.concatenate([p[0] for p in self._pending[split]])
        labels = np.concatenate([p[1] for p in self._pending[split]])
        self._pending[split] = [(images[n:], labels[n:])] if len(labels) > n else []
        name = f"{split}-{len(self.entries[split]):05d}.safetensors"
        local = Path(self._tmp.name) / name
        save_file(
            {"images": np.ascontiguousarray(images[:n]), "labels": np.ascontiguousarray(labels[:n])},
            str(local),
        )
        target = join_uri(self.uri, name)
        self._written.append(target)  # before the upload: a failed upload may still have left an object
        digest = self.store.put_file(local, target)
        self.entries[split].append(ShardEntry(name, int(min(n, len(labels))), local.stat().st_size, digest))
        local.unlink()

    def finish(self, metadata: dict) -> ShardIndex:
        """Write the last partial shards, then the index (the commit mark); returns the index.

        ``metadata`` needs ``class_names``; the writer fills in ``sizes`` and ``counts`` from what it wrote.
        """
        for split in SPLITS:
            left = sum(len(p[1]) for p in self._pending[split])
            if left:
                self._flush(split, left)
        names = list(metadata["class_names"])
        metadata = dict(metadata, sizes={s: sum(e.samples for e in self.entries[s]) for s in SPLITS})
        metadata["counts"] = {}
        for split in SPLITS:
            total = np.zeros(len(names), dtype=np.int64)
            for part in self._labels[split]:
                total[: len(part)] += part[: len(names)]
            metadata["counts"][split] = {cls: int(n) for cls, n in zip(names, total)}
        index = ShardIndex(self.uri, metadata, self.entries)
        raw = index.to_json()
        _parse_index(self.uri, raw)  # the sizes in the metadata must agree with the shards written
        self._written.append(join_uri(self.uri, INDEX_NAME))
        self.store.put_bytes(raw, join_uri(self.uri, INDEX_NAME))
        index.digest = hashlib.sha256(raw).hexdigest()
        return index

    def abort(self) -> None:
        """Delete everything this writer uploaded (best effort: a failure is logged, not raised)."""
        for target in reversed(self._written):  # the index first, if it got that far
            try:
                self.store.delete(target)
            except Exception as exc:  # noqa: BLE001 - cleanup must not mask the failure that caused it
                log.warning("could not delete %s after a failed preprocess: %s", target, exc)
        self._written.clear()


def write_shards(
    dataset: PreparedDataset, uri: str, store: ObjectStore, *, shard_samples: int = DEFAULT_SHARD_SAMPLES
) -> ShardIndex:
    """An in-memory PreparedDataset written as shards under ``uri`` (small datasets, tests)."""
    dataset.validate()
    with ShardWriter(uri, store, dataset.image_size, shard_samples) as writer:
        for split in SPLITS:
            images, labels = dataset.split(split)
            if len(labels):
                writer.add(split, images, labels)
        return writer.finish(dataset.metadata())


__all__ = [
    "DEFAULT_SHARD_SAMPLES",
    "INDEX_NAME",
    "SHARD_FORMAT_VERSION",
    "ShardEntry",
    "ShardError",
    "ShardIndex",
    "ShardWriter",
    "is_shard_set",
    "load_all",
    "load_dataset",
    "open_shards",
    "read_shard",
    "write_shards",
]
