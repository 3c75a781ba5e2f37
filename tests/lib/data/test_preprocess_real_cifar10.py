"""The real CIFAR-10 JPEG archive from ../shared: a stratified subset always, the whole archive in the slow suite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cifar10_kfp.data.download import fetch_dataset
from cifar10_kfp.data.preprocess import prepare_dataset
from tests.support.datagen import CIFAR10_CLASSES, file_digest, make_real_subset_archive

# Published in shared/datasets/README.md for the train split of this archive.
README_MEAN = [0.4913, 0.4821, 0.4465]
README_STD = [0.2452, 0.2428, 0.2606]


def test_real_subset_end_to_end(real_archive, store_env, tmp_path):
    subset = make_real_subset_archive(real_archive, tmp_path / "cifar10-subset.tar.gz", 30, 10, seed=0)
    download = fetch_dataset(str(subset), f"sha256:{file_digest(subset)}")
    assert download.format == "image-folder" and store_env.exists(download.cache_uri)
    ds, info = prepare_dataset(download.cache_uri, val_fraction=0.1, seed=0, source_digest=download.sha256)
    assert ds.class_names == CIFAR10_CLASSES
    assert info.metadata["sizes"] == {"train": 270, "val": 30, "test": 100}
    assert np.all(np.bincount(ds.val_labels, minlength=10) == 3)
    assert np.all(np.bincount(ds.test_labels, minlength=10) == 10)
    assert ds.train_images.shape[1:] == (3, 32, 32) and ds.train_images.std() > 30  # real, varied pixels
    np.testing.assert_allclose(ds.mean, README_MEAN, atol=0.04)
    np.testing.assert_allclose(ds.std, README_STD, atol=0.03)
    again, info2 = prepare_dataset(
        download.cache_uri, val_fraction=0.1, seed=0, source_digest=download.sha256
    )
    assert info2.cache_hit and np.array_equal(again.train_images, ds.train_images)


def test_real_subset_helper_is_stratified_and_cached(real_archive, tmp_path, monkeypatch):
    import tarfile

    opened = []  # every tarfile.open of the real archive: a cache hit reads it no more
    real_open = tarfile.open
    monkeypatch.setattr(
        tarfile, "open", lambda name=None, *a, **k: opened.append(name) or real_open(name, *a, **k)
    )

    def reads_of_the_real_archive():
        return sum(1 for name in opened if name is not None and Path(name) == real_archive)

    # Same arguments as above: built once per process (here, or by the test above), then copied.
    a = make_real_subset_archive(real_archive, tmp_path / "a.tar.gz", 30, 10, seed=0)
    reads_after_first = reads_of_the_real_archive()
    assert reads_after_first <= 1
    b = make_real_subset_archive(real_archive, tmp_path / "b.tar.gz", 30, 10, seed=0)
    assert reads_of_the_real_archive() == reads_after_first, "the second call read the real archive again"
    assert a.read_bytes() == b.read_bytes() and a != b
    with tarfile.open(a) as tar:
        names = tar.getnames()
    assert len(names) == len(set(names)) == 400
    assert sum("/train/cat/" in n for n in names) == 30 and sum("/test/ship/" in n for n in names) == 10


@pytest.mark.slow
def test_whole_real_archive_matches_the_published_statistics(real_archive, monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    ds, info = prepare_dataset(real_archive, val_fraction=0.0, cache=False)
    assert info.metadata["sizes"] == {"train": 50000, "val": 0, "test": 10000}
    assert set(info.metadata["counts"]["train"].values()) == {5000}
    np.testing.assert_allclose(ds.mean, README_MEAN, atol=6e-4)
    np.testing.assert_allclose(ds.std, README_STD, atol=6e-4)
