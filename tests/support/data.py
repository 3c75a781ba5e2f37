"""Small learnable datasets in the prepared format, built in memory."""

from __future__ import annotations

import numpy as np

from cifar10_kfp.data.format import PreparedDataset


def make_tiny_dataset(
    n_train: int = 256,
    n_val: int = 64,
    n_test: int = 128,
    num_classes: int = 4,
    image_size: int = 16,
    seed: int = 0,
) -> PreparedDataset:
    """A small *learnable* dataset in the prepared format: each class has its own colour and stripe pattern."""
    rng = np.random.default_rng(seed)

    def split(n):
        labels = np.arange(n, dtype=np.int64) % num_classes
        rng.shuffle(labels)
        images = rng.integers(0, 60, size=(n, 3, image_size, image_size), dtype=np.int64)
        for cls in range(num_classes):
            idx = labels == cls
            images[idx, cls % 3] += 120  # class colour
            stripe = slice(cls * image_size // num_classes, (cls + 1) * image_size // num_classes)
            images[idx, :, stripe, :] += 60  # class stripe position
        return np.clip(images, 0, 255).astype(np.uint8), labels

    train, val, test = split(n_train), split(n_val), split(n_test)
    mean = (train[0].astype(np.float64) / 255).mean(axis=(0, 2, 3)).tolist()
    std = (train[0].astype(np.float64) / 255).std(axis=(0, 2, 3)).tolist()
    return PreparedDataset(
        train_images=train[0], train_labels=train[1],
        val_images=val[0], val_labels=val[1],
        test_images=test[0], test_labels=test[1],
        class_names=[f"class{i}" for i in range(num_classes)], mean=mean, std=std,
        source_digest="0" * 64,
    )  # fmt: skip
