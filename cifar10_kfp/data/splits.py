"""Which images a prepared dataset keeps, and its normalisation statistics: stratified and seeded.

``preprocess`` uses these: a stratified subset of a split (``select_indices``), a stratified
validation hold-out (``split_validation``) and exact per-channel mean/std (``channel_stats``).
"""

from __future__ import annotations

import numpy as np


def _allocate(counts: np.ndarray, total: int) -> np.ndarray:
    """Split ``total`` over classes proportionally to ``counts`` (largest remainder), each <= its count."""
    if total >= counts.sum():
        return counts.copy()
    exact = counts * (total / counts.sum())
    quota = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - quota), kind="stable")
    quota[order[: total - int(quota.sum())]] += 1
    return np.minimum(quota, counts)


def stratified_pick(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a stratified random subset of ``n`` labels (all of them if n >= len)."""
    num_classes = int(labels.max()) + 1 if len(labels) else 0
    counts = np.bincount(labels, minlength=num_classes)
    quota = _allocate(counts, n)
    picked = [rng.permutation(np.flatnonzero(labels == c))[: quota[c]] for c in range(num_classes)]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


def select_indices(labels: np.ndarray, limit: int, rng: np.random.Generator) -> np.ndarray:
    return (
        np.arange(len(labels)) if limit <= 0 or limit >= len(labels) else stratified_pick(labels, limit, rng)
    )


def split_validation(labels: np.ndarray, fraction: float, rng: np.random.Generator):
    """``(train_indices, val_indices)``: a stratified, seeded hold-out of ``fraction`` of the labels."""
    n_val = int(round(fraction * len(labels)))
    val = stratified_pick(labels, n_val, rng) if n_val > 0 else np.zeros(0, dtype=np.int64)
    keep = np.ones(len(labels), dtype=bool)
    keep[val] = False
    return np.flatnonzero(keep), val


class ChannelHistogram:
    """Per-channel 256-bin pixel histograms, added batch by batch: exact mean/std without the whole split."""

    def __init__(self, channels: int = 3):
        self.hist = np.zeros((channels, 256), dtype=np.int64)

    def add(self, images: np.ndarray) -> None:
        for c in range(self.hist.shape[0]):
            self.hist[c] += np.bincount(np.ascontiguousarray(images[:, c]).reshape(-1), minlength=256)

    def stats(self) -> tuple[list[float], list[float]]:
        """Mean and std in pixel/255 units; zeros for an empty split."""
        if self.hist[0].sum() == 0:
            return [0.0] * len(self.hist), [0.0] * len(self.hist)
        values = np.arange(256, dtype=np.float64) / 255.0
        means, stds = [], []
        for hist in self.hist.astype(np.float64):
            n = hist.sum()
            mean = float((hist * values).sum() / n)
            var = float((hist * (values - mean) ** 2).sum() / n)
            means.append(mean)
            stds.append(var**0.5)
        return means, stds


def channel_stats(images: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and std in pixel/255 units, exact, from 256-bin histograms (no float copy)."""
    if len(images) == 0:
        return [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    hist = ChannelHistogram(images.shape[1])
    hist.add(images)
    return hist.stats()
