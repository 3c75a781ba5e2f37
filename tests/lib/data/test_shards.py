"""The sharded dataset on the real object store: round trip, streamed preprocess, every bad shard refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

import cifar10_kfp.data.preprocess_shards as preprocess_shards
from cifar10_kfp.data.archives import ArchiveError
from cifar10_kfp.data.images import ImageDecodeError
from cifar10_kfp.data.preprocess import PrepareParams, build_dataset
from cifar10_kfp.data.shards import ShardError, load_all, load_dataset, open_shards, read_shard, write_shards
from cifar10_kfp.storage import join_uri, sha256_file
from tests.support.data import make_tiny_dataset
from tests.support.datagen import encode_image, make_image_folder_archive, make_traversal_archive


def _rows(images: np.ndarray) -> list[bytes]:
    return sorted(img.tobytes() for img in images)


def _folder_archive(path, *, per_class: int = 14, bad_at: int | None = None):
    """An image-folder archive of 3 classes of random PNGs; ``bad_at``: the n-th train image is garbage."""
    rng = np.random.default_rng(0)
    files, n = {}, 0
    for split, count in (("train", per_class), ("test", 4)):
        for cls in ("ant", "bee", "cow"):
            for i in range(count):
                pixels = rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)
                data = b"not an image" if split == "train" and n == bad_at else encode_image(pixels)
                files[f"data/{split}/{cls}/{i:03d}.png"] = data
                n += split == "train"
    return make_image_folder_archive(path, files)


def test_shards_round_trip_and_the_index_describes_them(store_env):
    dataset = make_tiny_dataset(n_train=100, n_val=20, n_test=30)
    uri = store_env.root_uri("shards", "rt")
    index = write_shards(dataset, uri, store_env, shard_samples=32)
    assert [e.samples for e in index.shards["train"]] == [32, 32, 32, 4]
    opened = open_shards(join_uri(uri, "index.json"), store_env)
    assert opened.digest == index.digest and opened.metadata["sizes"] == {"train": 100, "val": 20, "test": 30}
    assert opened.metadata["counts"] == dataset.counts()
    back = load_all(opened, store_env)
    # evaluate and tune read a sharded dataset, or a single file, through load_dataset
    assert np.array_equal(load_dataset(uri).train_images, dataset.train_images)
    for split in ("train", "val", "test"):
        assert np.array_equal(back.split(split)[0], dataset.split(split)[0])
        assert np.array_equal(back.split(split)[1], dataset.split(split)[1])


def _damage(kind: str, store, uri: str, name: str) -> None:
    target = join_uri(uri, name)
    if kind == "missing":
        store.delete(target)
    elif kind == "truncated":
        store.put_bytes(store.get_bytes(target)[:-100], target)
    elif kind == "digest":  # another valid shard of the same shape under the same name
        other = write_shards(
            make_tiny_dataset(n_train=100, seed=7), join_uri(uri, "other"), store, shard_samples=32
        )
        store.put_bytes(store.get_bytes(join_uri(other.uri, name)), target)
    elif kind == "overclaim":  # the index says the shard holds more than it does
        raw = json.loads(store.get_bytes(join_uri(uri, "index.json")))
        entry = next(e for e in raw["shards"]["train"] if e["name"] == name)
        entry["samples"] += 5
        raw["metadata"]["sizes"]["train"] += 5
        store.put_bytes(json.dumps(raw).encode(), join_uri(uri, "index.json"))


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing", "is missing"),
        ("truncated", "truncated"),
        ("digest", "sha256"),
        ("overclaim", "index claims"),
    ],
)
def test_a_bad_shard_is_refused_by_name_before_any_data_is_used(store_env, kind, message):
    uri = store_env.root_uri("shards", kind)
    write_shards(make_tiny_dataset(n_train=100), uri, store_env, shard_samples=32)
    _damage(kind, store_env, uri, "train-00002.safetensors")
    with pytest.raises(ShardError, match=f"train-00002.safetensors.*{message}|{message}.*train-00002"):
        open_shards(uri, store_env)


def test_a_shard_swapped_after_the_index_was_checked_is_refused_when_read(store_env):
    uri = store_env.root_uri("shards", "swap")
    index = write_shards(make_tiny_dataset(n_train=100), uri, store_env, shard_samples=32)
    _damage("digest", store_env, uri, "train-00001.safetensors")
    with pytest.raises(ShardError, match="train-00001.safetensors has sha256"):
        read_shard(index, index.shards["train"][1], store_env)


def test_an_index_whose_sizes_disagree_with_its_shards_is_refused(store_env):
    uri = store_env.root_uri("shards", "sizes")
    write_shards(make_tiny_dataset(n_train=100), uri, store_env, shard_samples=32)
    raw = json.loads(store_env.get_bytes(join_uri(uri, "index.json")))
    raw["metadata"]["sizes"]["train"] = 1000
    store_env.put_bytes(json.dumps(raw).encode(), join_uri(uri, "index.json"))
    with pytest.raises(ShardError, match="claims 1000 train samples"):
        open_shards(uri, store_env)


def test_streamed_preprocess_matches_the_in_memory_one_and_is_cached(store_env, tmp_path, monkeypatch):
    monkeypatch.setattr(preprocess_shards, "DECODE_CHUNK", 10)  # several chunks in flight, several shards
    archive = _folder_archive(tmp_path / "a.tar.gz")
    params = PrepareParams(val_fraction=0.2, max_train_samples=36, image_size=16, seed=3)
    digest = sha256_file(archive)
    info = preprocess_shards.prepare_to_shards(archive, params=params, store=store_env, shard_samples=8)
    assert not info.cache_hit and info.uri.startswith(
        store_env.root_uri("prepared", params.cache_key(digest))
    )
    expected, _ = build_dataset(archive, params, digest)
    got = load_all(open_shards(info.uri, store_env), store_env)
    for split in ("train", "val", "test"):  # same images and labels, in archive order rather than index order
        images, labels = got.split(split)
        want_images, want_labels = expected.split(split)
        assert _rows(images) == _rows(want_images)
        assert sorted(labels.tolist()) == sorted(want_labels.tolist())
    assert got.mean == pytest.approx(expected.mean, abs=1e-12) and got.std == pytest.approx(
        expected.std, abs=1e-12
    )
    assert got.counts() == expected.counts() and info.metadata["sizes"] == {"train": 29, "val": 7, "test": 12}
    again = preprocess_shards.prepare_to_shards(
        tmp_path / "gone.tar.gz", params=params, store=store_env, shard_samples=8, source_digest=digest
    )  # a hit needs no archive
    assert again.cache_hit and again.uri == info.uri


def test_a_failed_preprocess_leaves_nothing_in_the_store(store_env, tmp_path, monkeypatch):
    monkeypatch.setattr(preprocess_shards, "DECODE_CHUNK", 4)
    archive = _folder_archive(tmp_path / "bad.tar.gz", bad_at=30)  # after several shards were uploaded
    uploaded = []
    real_put = store_env.put_file
    monkeypatch.setattr(store_env, "put_file", lambda *a, **k: uploaded.append(a[1]) or real_put(*a, **k))
    with pytest.raises(ImageDecodeError, match="data/train/.*png"):
        preprocess_shards.prepare_to_shards(
            archive, params=PrepareParams(val_fraction=0.0, image_size=16), store=store_env, shard_samples=4
        )
    assert len(uploaded) >= 2, "the failure came before any shard was uploaded: the test proves nothing"
    assert store_env.list(store_env.root_uri("prepared") + "/") == []


def test_a_hostile_archive_is_refused_and_writes_nothing(store_env, tmp_path):
    archive, bad = make_traversal_archive(tmp_path / "t.tar")
    with pytest.raises(ArchiveError, match=bad.replace(".", r"\.")):
        preprocess_shards.prepare_to_shards(archive, store=store_env, shard_samples=4)
    assert store_env.list(store_env.root_uri("prepared") + "/") == []
