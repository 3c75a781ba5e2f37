"""Preprocess straight into shards in the object store, in bounded memory, whatever the dataset's size.

Same inputs, same choices as ``preprocess`` (the stratified subsets, the stratified validation
split, the train-only mean/std, every refusal of a hostile archive), made without the whole dataset
in memory:

1. a first pass over the archive checks every member (``iter_archive``: traversal, links,
   devices, bombs, corruption) and keeps only the member names;
2. the subsets and the split are decided from the names' class labels alone;
3. a second pass reads the chosen members one by one, decodes them in chunks in a pool of
   worker processes kept for the whole run (reading goes on while they decode), adds the train
   images to per-channel histograms (exact mean/std) and hands each chunk to a ``ShardWriter``,
   which uploads a shard as soon as it is full.

Peak memory: the chunks in flight (2 per worker), one unfinished shard per split, and the member
names. The index is written last; on any failure the writer deletes what it uploaded.

The official CIFAR-10 python layout is fixed at 60,000 32 px images (180 MB), so it is decoded in
memory as before (``preprocess.build_dataset``) and then written as shards.

The result is cached like the single file, under
``<root>/prepared/<digest16>-<params16>/shards-v<format>-<shard_samples>/``; a prefix whose
``index.json`` exists is complete, and is reused without opening the archive.

One difference from the single-file path, with ``skip_bad_images``: the validation split is drawn
before decoding, so an undecodable image leaves its split one image short instead of being
replaced.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cifar10_kfp.data.archives import ArchiveLimits, iter_archive
from cifar10_kfp.data.format import FORMAT_VERSION, SPLITS
from cifar10_kfp.data.images import _can_start_workers, _decode_chunk, default_workers
from cifar10_kfp.data.layout import CIFAR10_PYTHON, detect_layout, index_image_folder
from cifar10_kfp.data.preprocess import (
    PREPROCESS_VERSION,
    PrepareParams,
    _archive_digest,
    _rngs,
    _verified_local,
    build_dataset,
)
from cifar10_kfp.data.shards import (
    DEFAULT_SHARD_SAMPLES,
    INDEX_NAME,
    SHARD_FORMAT_VERSION,
    ShardIndex,
    ShardWriter,
    open_shards,
    write_shards,
)
from cifar10_kfp.data.splits import ChannelHistogram, select_indices, split_validation
from cifar10_kfp.storage import ObjectStore, join_uri, open_store

log = logging.getLogger(__name__)

DECODE_CHUNK = 256  # images per decode task: large enough to amortise the pickling, small for memory


@dataclass
class ShardPrepareInfo:
    uri: str  # the prefix holding index.json and the shards
    cache_hit: bool
    source_digest: str
    metadata: dict
    seconds: float


def _plan(
    archive: str, members, root: str, params: PrepareParams
) -> tuple[list[str], dict[str, tuple[str, int]]]:
    """Class names, and for every chosen member name its (output split, label)."""
    index = index_image_folder(archive, members, root)
    rngs = _rngs(params.seed)
    plan: dict[str, tuple[str, int]] = {}
    for split, limit in (("train", params.max_train_samples), ("test", params.max_test_samples)):
        entries = index.files[split]
        labels = np.asarray([label for _, label in entries], dtype=np.int64)
        chosen = select_indices(labels, limit, rngs[split])
        if split == "train":
            train_part, val_part = split_validation(labels[chosen], params.val_fraction, rngs["val"])
            for out, part in (("train", train_part), ("val", val_part)):
                plan.update({entries[chosen[i]][0]: (out, int(labels[chosen[i]])) for i in part})
        else:
            plan.update({entries[i][0]: ("test", int(labels[i])) for i in chosen})
    return index.class_names, plan


class _Decoder:
    """Decode chunks in worker processes kept for the run, results in submission order."""

    def __init__(self, size: int, skip: bool):
        self.size, self.skip = size, skip
        workers = default_workers()
        self.pool = None
        if workers > 1 and _can_start_workers():
            import multiprocessing

            # forkserver, as images.decode_images: never fork a process that holds threads or locks
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))
        self.depth = 2 * max(1, workers)
        self.pending: deque[tuple[list[str], list[tuple[str, int]], Future | tuple]] = deque()

    def submit(self, names: list[str], targets: list[tuple[str, int]], blobs: list[bytes]):
        task = (names, blobs, self.size, self.skip)
        result = self.pool.submit(_decode_chunk, task) if self.pool else _decode_chunk(task)
        self.pending.append((names, targets, result))
        while len(self.pending) > self.depth:
            yield self._pop()

    def drain(self):
        while self.pending:
            yield self._pop()

    def _pop(self):
        names, targets, result = self.pending.popleft()
        images, failed = result.result() if isinstance(result, Future) else result
        return names, targets, images, failed

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _stream_image_folder(archive: str, members, root: str, params: PrepareParams, writer: ShardWriter,
                         limits: ArchiveLimits | None) -> tuple[list[str], ChannelHistogram, list[dict]]:  # fmt: skip
    class_names, plan = _plan(archive, members, root, params)
    hist, skipped = ChannelHistogram(), []
    kept_train = np.zeros(len(class_names), dtype=np.int64)
    decoder = _Decoder(params.image_size, params.skip_bad_images)

    def consume(done) -> None:
        names, targets, images, failed = done
        bad = {i for i, _ in failed}
        for name, error in ((names[i], e) for i, e in failed):
            log.warning("skipping %s (skip_bad_images): %s", name, error)
            skipped.append({"name": name, "error": error})
        kept = [t for i, t in enumerate(targets) if i not in bad]
        for split in SPLITS:
            rows = [j for j, (s, _) in enumerate(kept) if s == split]
            if rows:
                labels = np.asarray([kept[j][1] for j in rows], dtype=np.int64)
                writer.add(split, images[rows], labels)
                if split == "train":
                    hist.add(images[rows])
                    np.add(kept_train, np.bincount(labels, minlength=len(class_names)), out=kept_train)

    try:
        names: list[str] = []
        targets: list[tuple[str, int]] = []
        blobs: list[bytes] = []
        for member, data in iter_archive(archive, select=lambda name: name in plan, limits=limits):
            if data is None:
                continue
            names.append(member.name)
            targets.append(plan[member.name])
            blobs.append(data)
            if len(blobs) == DECODE_CHUNK:
                for done in decoder.submit(names, targets, blobs):
                    consume(done)
                names, targets, blobs = [], [], []
        if blobs:
            for done in decoder.submit(names, targets, blobs):
                consume(done)
        for done in decoder.drain():
            consume(done)
    finally:
        decoder.close()
    empty = [name for i, name in enumerate(class_names) if kept_train[i] == 0 and params.skip_bad_images]
    if empty:  # the model needs every class
        raise ValueError(f"{archive}: no decodable train image left in class folder(s) {empty} after skipping "
                         f"{len(skipped)} undecodable image(s)")  # fmt: skip
    return class_names, hist, skipped


def build_shards(archive: str | os.PathLike, params: PrepareParams, source_digest: str, uri: str,
                 store: ObjectStore, *, shard_samples: int = DEFAULT_SHARD_SAMPLES,
                 limits: ArchiveLimits | None = None) -> ShardIndex:  # fmt: skip
    """Decode a local archive into shards under ``uri``; nothing is left there if it fails."""
    archive = str(archive)
    members = [member for member, _ in iter_archive(archive, select=lambda _name: False, limits=limits)]
    layout = detect_layout(archive, members)
    extra = {**params.as_dict(), "source_format": layout.format, "preprocess_version": PREPROCESS_VERSION}
    if layout.format == CIFAR10_PYTHON:  # fixed-size; see the module docstring
        dataset, _ = build_dataset(archive, params, source_digest, limits=limits)
        return write_shards(dataset, uri, store, shard_samples=shard_samples)
    with ShardWriter(uri, store, params.image_size, shard_samples) as writer:
        class_names, hist, skipped = _stream_image_folder(
            archive, members, layout.root, params, writer, limits
        )
        mean, std = hist.stats()
        metadata = {
            "format_version": FORMAT_VERSION, "class_names": class_names, "mean": mean, "std": std,
            "image_size": params.image_size, "source_digest": source_digest,
            **extra, **({"skipped_images": skipped} if params.skip_bad_images else {}),
        }  # fmt: skip
        return writer.finish(metadata)


def shards_cache_uri(store: ObjectStore, params: PrepareParams, digest: str, shard_samples: int) -> str:
    return store.root_uri(
        "prepared", params.cache_key(digest), f"shards-v{SHARD_FORMAT_VERSION}-{shard_samples}"
    )


def prepare_to_shards(
    archive_path_or_uri: str | os.PathLike,
    *,
    params: PrepareParams | None = None,
    source_digest: str = "",
    store: ObjectStore | None = None,
    shard_samples: int = DEFAULT_SHARD_SAMPLES,
    limits: ArchiveLimits | None = None,
) -> ShardPrepareInfo:
    """Shards for an archive in the object store (the content-addressed cache), reused when complete.

    ``source_digest`` is the archive's sha256 from the download step: with it, a cache hit needs no
    archive at all, and a miss verifies the archive against it before parsing.
    """
    started = time.monotonic()
    params = params or PrepareParams()
    archive = str(archive_path_or_uri)
    store = store if store is not None else open_store()
    if not store.config.endpoint:
        raise ValueError(
            "a sharded dataset lives in the object store: set MINIO_ENDPOINT (or use prepare_to_file)"
        )
    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-prepare-") as tmp:
        digest, local = _archive_digest(archive, source_digest, Path(tmp), store)
        uri = shards_cache_uri(store, params, digest, shard_samples)
        if store.exists(join_uri(uri, INDEX_NAME)):
            index = open_shards(uri, store)
            log.info("sharded dataset reused from %s", uri)
            return ShardPrepareInfo(uri, True, digest, index.metadata, time.monotonic() - started)
        local = _verified_local(archive, local, digest, Path(tmp), store)
        index = build_shards(local, params, digest, uri, store, shard_samples=shard_samples, limits=limits)
    return ShardPrepareInfo(uri, False, digest, index.metadata, time.monotonic() - started)


__all__ = ["ShardPrepareInfo", "build_shards", "prepare_to_shards", "shards_cache_uri"]
