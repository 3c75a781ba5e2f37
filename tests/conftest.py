"""Shared fixtures: a real embedded S3 server, the real CIFAR-10 archive, tiny datasets."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cifar10_kfp.data.format import PreparedDataset
from cifar10_kfp.embedded_store import EmbeddedObjectStore
from cifar10_kfp.storage import ObjectStore

ROOT = Path(__file__).resolve().parents[1]
REAL_ARCHIVE = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"


@pytest.fixture(scope="session")
def embedded_store():
    """One real SeaweedFS S3 server for the whole session (127.0.0.1, free ports, random keys)."""
    server = EmbeddedObjectStore()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def store_env(embedded_store, monkeypatch, tmp_path) -> ObjectStore:
    """Point this test (and subprocesses it starts) at the embedded server, under a fresh prefix.

    Returns an ``ObjectStore`` configured exactly as code under test will configure itself.
    """
    env = embedded_store.env()
    env["CIFAR10_KFP_PREFIX"] = f"test-{tmp_path.name}/"
    env["CIFAR10_KFP_RETRY_BUDGET_S"] = "20"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CIFAR10_KFP_ALLOW_DEV_CREDENTIALS", raising=False)
    return ObjectStore()


@pytest.fixture(scope="session")
def real_archive() -> Path:
    """The real 60,000-image CIFAR-10 JPEG archive from ../shared, or a skip that says why."""
    if not REAL_ARCHIVE.is_file():
        pytest.skip(f"real CIFAR-10 archive not found at {REAL_ARCHIVE} (see shared/datasets/README.md)")
    return REAL_ARCHIVE


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


@pytest.fixture
def tiny_dataset_path(tmp_path) -> Path:
    """A tiny learnable prepared dataset written to disk."""
    from cifar10_kfp.data.format import save_prepared

    return save_prepared(make_tiny_dataset(), tmp_path / "tiny" / "dataset.safetensors")


@pytest.fixture(autouse=True)
def _no_gpu_in_tests(monkeypatch):
    """Tests run on CPU even where a GPU exists, so results are deterministic and comparable."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CIFAR10_KFP_TEST_CUDA", ""))
