"""The streamed data path: training and evaluation read shards from the object store as they go.

Used when a dataset does not fit the memory budget (or ``data_path="stream"``); the in-memory path
(``augment.TrainBatches``) is unchanged. The shards are checked before training starts
(``data.shards.open_shards``) and each shard's bytes again as it is read.

Order, all of it a function of the seed, the epoch and the global step, never of the world size:

* the train shards are dealt round-robin into ``stream_partitions`` fixed partitions P;
* each epoch, each partition's shards are permuted (seeded by seed, epoch, partition) and taken
  in windows of ``ceil(shuffle_buffer / shard size)`` shards; a window's samples are permuted
  (seeded by seed, epoch, partition, window). That is a shuffle buffer whose content at any point
  follows from the position alone, so a resume reads one window and skips into it;
* every global step takes ``rank_share(batch, p, P)`` samples from partition p, in partition order,
  and draws the flips and shifts of the whole global batch from a generator seeded by
  (seed, epoch, step); rank r of W reads partitions [r P/W, (r+1) P/W) only, so ranks read
  disjoint shards and together train exactly the single-process batch.

An epoch has ``min over p of (samples in p) // (p's share of a batch)`` steps; the rest is dropped.
The position in the stream is (epoch, step in epoch), which the checkpoint holds already, with the
stream's layout (``StreamedTrain.layout``) beside it: a mid-epoch resume needs the same layout.
A world size W that does not divide P is refused before training, naming both; one that does is
handled (an elastic restart from 2 to 1 or 4 ranks with P = 4 goes on exactly).

Read-ahead: a thread reads, checks and decodes the next window of every partition this rank reads
while the current one trains. Memory: two windows per partition read, plus one step's batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from cifar10_kfp.data.shards import ShardEntry, ShardIndex, is_shard_set, load_all, open_shards, read_shard
from cifar10_kfp.storage import ObjectStore
from cifar10_kfp.train.augment import TrainBatches, random_flip_mask, random_shifts, rank_share
from cifar10_kfp.train.config import TrainConfig

if TYPE_CHECKING:
    from cifar10_kfp.data.format import PreparedDataset

log = logging.getLogger(__name__)


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng([int(k) for k in key])


class _PartitionReader:
    """One partition's samples for one epoch, from sample ``start`` on, with the next window read ahead."""

    def __init__(
        self, stream: StreamedTrain, seed: int, epoch: int, part: int, start: int, pool: ThreadPoolExecutor
    ):
        shards = stream.partitions[part]
        order = _rng(seed, epoch, part, 0).permutation(len(shards))
        size = stream.window
        self.windows = [[shards[i] for i in order[k : k + size]] for k in range(0, len(shards), size)]
        self.key, self.stream, self.pool = (seed, epoch, part), stream, pool
        self.window, offset = 0, start
        while offset >= self._samples(self.window):  # skip whole windows without reading them
            offset -= self._samples(self.window)
            self.window += 1
        self.ahead: Future | None = None
        self.images, self.labels = self._read(self.window)
        self.pos = offset
        self._prefetch()

    def _samples(self, window: int) -> int:
        return sum(e.samples for e in self.windows[window]) if window < len(self.windows) else 1 << 62

    def _read(self, window: int) -> tuple[np.ndarray, np.ndarray]:
        """The window's samples in their shuffled order, written once: a window and one shard in memory."""
        shards: list[ShardEntry] = self.windows[window]
        total = sum(e.samples for e in shards)
        perm = _rng(*self.key, 1, window).permutation(total)
        where = np.empty_like(perm)
        where[perm] = np.arange(total)  # sample i of the window goes to position where[i]
        size = self.stream.index.image_size
        images, labels = np.empty((total, 3, size, size), dtype=np.uint8), np.empty(total, dtype=np.int64)
        offset = 0
        for entry in shards:
            shard_images, shard_labels = read_shard(self.stream.index, entry, self.stream.store)
            rows = where[offset : offset + len(shard_labels)]
            images[rows], labels[rows] = shard_images, shard_labels
            offset += len(shard_labels)
        return images, labels

    def _prefetch(self) -> None:
        nxt = self.window + 1
        self.ahead = self.pool.submit(self._read, nxt) if nxt < len(self.windows) else None

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        images, labels = [], []
        while n:
            if self.pos == len(self.labels):
                if self.ahead is None:
                    raise RuntimeError(
                        f"partition {self.key[2]} ran out of samples: steps per epoch miscounted"
                    )
                self.images, self.labels = self.ahead.result()
                self.window, self.pos = self.window + 1, 0
                self._prefetch()
            k = min(n, len(self.labels) - self.pos)
            images.append(self.images[self.pos : self.pos + k])
            labels.append(self.labels[self.pos : self.pos + k])
            self.pos, n = self.pos + k, n - k
        return np.concatenate(images), np.concatenate(labels)


class StreamedTrain:
    """The training split streamed from shards; ``epoch`` yields what ``TrainBatches.epoch`` does."""

    def __init__(self, index: ShardIndex, store: ObjectStore, config: TrainConfig, device: torch.device):
        entries = index.shards["train"]
        parts = config.stream_partitions
        if parts > len(entries):
            raise ValueError(f"stream_partitions={parts} is more than the {len(entries)} train shards of "
                             f"{index.uri}: a partition would be empty")  # fmt: skip
        self.index, self.store, self.device = index, store, device
        self.partitions = [entries[p::parts] for p in range(parts)]
        self.window = max(1, -(-config.shuffle_buffer // max(e.samples for e in entries)))
        self.max_shift, self.flip, self.channels_last = config.translate, config.flip, config.channels_last

    def __len__(self) -> int:
        return self.index.size("train")

    @property
    def layout(self) -> dict:
        """What a mid-epoch position depends on besides seed, epoch and batch (checked on resume)."""
        return {
            "index_sha256": self.index.digest,
            "partitions": len(self.partitions),
            "window_shards": self.window,
        }

    def check_world(self, world_size: int) -> None:
        parts = len(self.partitions)
        if parts % world_size:
            raise ValueError(
                f"stream_partitions={parts} cannot be split evenly over {world_size} processes: each rank reads "
                f"whole partitions. Run with a world size that divides {parts}, or set stream_partitions to a "
                f"multiple of {world_size} (a new value changes the data order, so start a new checkpoint URI)"
            )

    def my_partitions(self, rank: int, world_size: int) -> range:
        self.check_world(world_size)
        per = len(self.partitions) // world_size
        return range(rank * per, (rank + 1) * per)

    def steps(self, batch_size: int) -> int:
        parts = len(self.partitions)
        if batch_size < parts:
            raise ValueError(f"a global batch of {batch_size} is smaller than stream_partitions={parts}")
        shares = [hi - lo for lo, hi in (rank_share(batch_size, p, parts) for p in range(parts))]
        return min(sum(e.samples for e in shards) // q for shards, q in zip(self.partitions, shares))

    def epoch(self, seed: int, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
              start_step: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
        mine = self.my_partitions(rank, world_size)
        parts = len(self.partitions)
        bounds = [rank_share(batch_size, p, parts) for p in range(parts)]
        lo, hi = bounds[mine[0]][0], bounds[mine[-1]][1]  # this rank's part of every global batch
        pool = ThreadPoolExecutor(
            max_workers=min(len(mine), os.cpu_count() or 1), thread_name_prefix="read-ahead"
        )
        try:
            readers = [
                _PartitionReader(self, seed, epoch, p, start_step * (bounds[p][1] - bounds[p][0]), pool)
                for p in mine
            ]
            for step in range(start_step, self.steps(batch_size)):
                taken = [r.take(bounds[p][1] - bounds[p][0]) for r, p in zip(readers, mine)]
                images = torch.from_numpy(np.concatenate([t[0] for t in taken])).to(self.device)
                labels = torch.from_numpy(np.concatenate([t[1] for t in taken])).to(self.device)
                yield self._augment(images, labels, seed, epoch, step, batch_size, lo, hi), labels
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _augment(self, images: torch.Tensor, labels: torch.Tensor, seed: int, epoch: int, step: int,
                 batch_size: int, lo: int, hi: int) -> torch.Tensor:  # fmt: skip
        """Flip and translate as the in-memory path does, batched, with draws made for the global batch."""
        if not (self.flip or self.max_shift):
            return images.contiguous(memory_format=torch.channels_last) if self.channels_last else images
        key = np.random.SeedSequence([int(seed), int(epoch), int(step), 2]).generate_state(
            1, dtype=np.uint64
        )[0]
        generator = torch.Generator().manual_seed(int(key) % (2**63 - 1))
        flips = random_flip_mask(batch_size, generator)[lo:hi] if self.flip else None
        shifts = random_shifts(batch_size, self.max_shift, generator)[lo:hi] if self.max_shift else None
        batch = TrainBatches(
            images, labels, max_shift=self.max_shift, flip=self.flip, channels_last=self.channels_last
        )
        index = torch.arange(len(labels))
        return batch.gather(batch.window_rows(index, flips, shifts).to(images.device))


class StreamedSplit:
    """An evaluation split read shard by shard, the next shard read ahead; ``batches`` as DeviceData's."""

    def __init__(self, index: ShardIndex, split: str, store: ObjectStore, device: torch.device):
        self.index, self.split, self.store, self.device = index, split, store, device

    def __len__(self) -> int:
        return self.index.size(self.split)

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        entries = self.index.shards[self.split]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-ahead") as pool:
            ahead = [pool.submit(read_shard, self.index, e, self.store) for e in entries[:1]]
            for i in range(len(entries)):
                if i + 1 < len(entries):
                    ahead.append(pool.submit(read_shard, self.index, entries[i + 1], self.store))
                images, labels = ahead.pop(0).result()
                for lo in range(0, len(labels), batch_size):
                    yield (torch.from_numpy(images[lo : lo + batch_size]).to(self.device),
                           torch.from_numpy(labels[lo : lo + batch_size]).to(self.device))  # fmt: skip


class StreamedDataset:
    """What training needs to know of a sharded dataset it streams: the metadata, and a whitening sample."""

    def __init__(self, index: ShardIndex, store: ObjectStore):
        self.index, self.store = index, store
        self.class_names, self.num_classes, self.image_size = (
            index.class_names,
            index.num_classes,
            index.image_size,
        )
        self.mean, self.std, self.source_digest = index.mean, index.std, index.source_digest
        self.val_labels = np.zeros(index.size("val"), dtype=np.int64)  # only its length is asked for

    def train_sample(self, n: int, seed: int) -> np.ndarray:
        """About ``n`` train images from seeded shards: whitening needs a sample, not the split."""
        entries = self.index.shards["train"]
        parts, have = [], 0
        for i in _rng(seed, 3).permutation(len(entries)):
            images, _ = read_shard(self.index, entries[i], self.store)
            parts.append(images)
            have += len(images)
            if have >= n:
                break
        images = np.concatenate(parts)
        return images[np.sort(_rng(seed, 4).permutation(len(images))[:n])]


# ------------------------------------------------------------------------ choosing the path


def memory_budget_bytes(config: TrainConfig) -> int:
    if config.memory_budget_gb > 0:
        return int(config.memory_budget_gb * 2**30)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:  # a container's limit, when it is lower than the machine's
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        total = min(total, int(limit)) if limit.isdigit() else total
    except OSError:
        pass
    return total // 2


def memory_need_bytes(index: ShardIndex, config: TrainConfig) -> int:
    """What the in-memory path holds: every split decoded, plus the padded (and mirrored) train copy."""
    size = index.image_size
    padded = ((size + 2 * config.translate) / size) ** 2
    return int(index.decoded_bytes() + index.decoded_bytes("train") * padded * (2 if config.flip else 1))


def choose_path(index: ShardIndex, config: TrainConfig) -> str:
    if config.data_path != "auto":
        return config.data_path
    need, budget = memory_need_bytes(index, config), memory_budget_bytes(config)
    path = "memory" if need <= budget else "stream"
    log.info("data_path=auto: the in-memory path needs %.2f GB of a %.2f GB budget: %s", need / 2**30,
             budget / 2**30, "in memory" if path == "memory" else "streaming from the shards")  # fmt: skip
    return path


def open_sharded(data: str, config: TrainConfig, store: ObjectStore):
    """``("memory", PreparedDataset)`` or ``("stream", StreamedDataset)`` for a sharded dataset."""
    index = open_shards(data, store)
    if choose_path(index, config) == "memory":
        return "memory", load_all(index, store)
    return "stream", StreamedDataset(index, store)


def open_dataset(config: TrainConfig, data: str) -> tuple[str, PreparedDataset | StreamedDataset]:
    """The data path (``memory`` or ``stream``) and the dataset; see TrainConfig.data_path."""
    from cifar10_kfp.data.format import load_prepared
    from cifar10_kfp.storage import open_store

    store = open_store()
    if is_shard_set(data, store):
        return open_sharded(data, config, store)
    if config.data_path == "stream":
        raise ValueError(
            f"data_path='stream' needs a sharded dataset (a prefix holding index.json, written by "
            f"prepare_to_shards); {data} is a single prepared file. Set data_path to 'memory' or 'auto'"
        )
    return "memory", load_prepared(data)
