"""Preprocess: exact decoding of both layouts, splits, statistics, odd images, determinism and the cache."""

from __future__ import annotations

import io
import pickle
import tarfile

import numpy as np
import pytest

from cifar10_kfp.data.archives import ArchiveError
from cifar10_kfp.data.format import load_prepared, read_metadata
from cifar10_kfp.data.images import ImageDecodeError, decode_images
from cifar10_kfp.data.preprocess import (
    PrepareParams,
    channel_stats,
    prepare_dataset,
    prepare_to_file,
    split_validation,
    stratified_pick,
)
from tests.support.datagen import (
    CIFAR10_CLASSES,
    encode_image,
    file_digest,
    make_image_folder_archive,
    make_official_archive,
    small_image_folder,
    solid_image,
)


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """A generated official archive and the arrays it holds, in archive order."""
    return make_official_archive(
        tmp_path_factory.mktemp("official") / "cifar-10-python.tar.gz",
        n_per_batch=60,
        seed=3,
        return_arrays=True,
    )


@pytest.fixture
def no_store(monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)


def test_official_format_is_decoded_exactly(official, no_store):
    path, arrays = official
    ds, info = prepare_dataset(path, val_fraction=0.0)
    # R, G, B planes of each 3072-byte row land in channels 0, 1, 2, rows of 32 pixels.
    np.testing.assert_array_equal(ds.train_images, arrays["train"][0])
    np.testing.assert_array_equal(ds.train_labels, arrays["train"][1])
    np.testing.assert_array_equal(ds.test_images, arrays["test"][0])
    np.testing.assert_array_equal(ds.test_labels, arrays["test"][1])
    assert ds.class_names == CIFAR10_CLASSES
    assert ds.train_images.dtype == np.uint8 and ds.train_labels.dtype == np.int64
    assert ds.source_digest == file_digest(path) == info.source_digest
    assert info.metadata["source_format"] == "cifar10-python" and not info.cache_hit


def test_val_split_is_stratified_and_stats_use_the_train_part_only(official, no_store):
    path, arrays = official
    ds, info = prepare_dataset(path, val_fraction=0.2, seed=5)
    assert (len(ds.train_labels), len(ds.val_labels), len(ds.test_labels)) == (240, 60, 60)
    source_counts = np.bincount(arrays["train"][1], minlength=10)
    val_counts = np.bincount(ds.val_labels, minlength=10)
    assert np.all(np.abs(val_counts - 0.2 * source_counts) <= 1)
    # train + val together are exactly the source train split.
    together = np.concatenate([ds.train_images, ds.val_images]).reshape(300, -1)
    source = arrays["train"][0].reshape(300, -1)
    assert sorted(map(bytes, together)) == sorted(map(bytes, source))
    pixels = ds.train_images.astype(np.float64) / 255
    np.testing.assert_allclose(ds.mean, pixels.mean(axis=(0, 2, 3)), atol=1e-12)
    np.testing.assert_allclose(ds.std, pixels.std(axis=(0, 2, 3)), atol=1e-12)
    all_pixels = np.concatenate([ds.train_images, ds.val_images]).astype(np.float64) / 255
    assert not np.allclose(ds.mean, all_pixels.mean(axis=(0, 2, 3)), atol=1e-9)
    assert info.metadata["counts"]["val"] == {c: int(n) for c, n in zip(CIFAR10_CLASSES, val_counts)}


def test_max_samples_give_stratified_subsets(official, no_store):
    path, _ = official
    ds, info = prepare_dataset(
        path, val_fraction=0.1, max_train_samples=100, max_test_samples=30, image_size=16
    )
    assert info.metadata["sizes"] == {"train": 90, "val": 10, "test": 30}
    assert np.all(np.bincount(ds.test_labels, minlength=10) == 3)
    assert np.all(np.bincount(np.concatenate([ds.train_labels, ds.val_labels]), minlength=10) == 10)
    assert ds.train_images.shape[1:] == (3, 16, 16) and info.metadata["image_size"] == 16


def test_same_seed_same_bytes_different_seed_different_split(official, tmp_path, no_store):
    path, _ = official
    outputs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        out = tmp_path / name / "dataset.safetensors"
        prepare_to_file(path, out, seed=seed, max_train_samples=200, val_fraction=0.25)
        outputs[name] = out.read_bytes()
    assert outputs["a"] == outputs["b"]
    a, c = load_prepared(tmp_path / "a"), load_prepared(tmp_path / "c")
    assert not np.array_equal(a.val_images, c.val_images)
    assert sorted(np.bincount(a.val_labels)) == sorted(np.bincount(c.val_labels))  # both stratified


def test_prepared_result_is_cached_and_reused(official, store_env, tmp_path):
    path, _ = official
    digest = file_digest(path)
    first = prepare_to_file(path, tmp_path / "1.safetensors", seed=1, source_digest=digest)
    assert not first.cache_hit
    assert first.cache_uri == store_env.root_uri(
        "prepared", PrepareParams(seed=1).cache_key(digest), "dataset.safetensors"
    )
    assert first.cache_uri.startswith(store_env.root_uri("prepared", digest[:16]))
    # A hit needs only the digest: the archive is not even read (it does not exist here).
    second = prepare_to_file(
        tmp_path / "gone.tar.gz", tmp_path / "2.safetensors", seed=1, source_digest=digest
    )
    assert second.cache_hit and second.cache_uri == first.cache_uri
    assert (tmp_path / "1.safetensors").read_bytes() == (tmp_path / "2.safetensors").read_bytes()
    # Any parameter change is a different key.
    third = prepare_to_file(path, tmp_path / "3.safetensors", seed=2, source_digest=digest)
    assert not third.cache_hit and third.cache_uri != first.cache_uri
    keys = {
        PrepareParams(**{f: v}).cache_key(digest)
        for f, v in [
            ("val_fraction", 0.2),
            ("max_train_samples", 5),
            ("max_test_samples", 5),
            ("image_size", 16),
            ("seed", 0),
        ]
    }
    assert len(keys) == 5 and PrepareParams().cache_key(digest) in keys  # fmt: skip


def test_archive_from_the_object_store_is_verified_against_the_digest(official, store_env, tmp_path):
    path, _ = official
    uri = store_env.root_uri("datasets", "x", "cifar-10-python.tar.gz")
    store_env.put_file(path, uri)
    ds, info = prepare_dataset(uri, cache=False)
    assert ds.source_digest == file_digest(path)
    with pytest.raises(ValueError, match="refusing to parse"):
        prepare_to_file(uri, tmp_path / "o.safetensors", source_digest="f" * 64, cache=False)


def test_pickles_are_parsed_with_a_restricted_unpickler(tmp_path, no_store):
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    evil = pickle.dumps({b"data": Exploit(), b"labels": []}, protocol=2)
    path, _ = make_official_archive(tmp_path / "c.tar.gz", n_per_batch=5, return_arrays=True)
    rebuilt = tmp_path / "evil.tar.gz"
    with tarfile.open(path) as src, tarfile.open(rebuilt, "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read() if member.isfile() else None
            if member.name.endswith("data_batch_3"):
                data, member.size = evil, len(evil)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    with pytest.raises(ValueError, match="data_batch_3.*global posix.system is not allowed"):
        prepare_dataset(rebuilt)
    assert not marker.exists()


def _odd_folder() -> dict[str, bytes]:
    rgba = np.zeros((32, 32, 4), dtype=np.uint8)
    rgba[...] = (10, 20, 30, 128)
    gray = np.full((40, 40), 77, dtype=np.uint8)
    palette = solid_image((200, 0, 0))
    from PIL import Image

    buf = io.BytesIO()
    Image.open(io.BytesIO(palette)).convert("P", palette=Image.Palette.ADAPTIVE).save(buf, format="PNG")
    return {
        "odd/train/b_gray/gray.png": encode_image(gray),
        "odd/train/b_gray/gray.jpg": encode_image(gray, "JPEG"),
        "odd/train/a_rgba/rgba.png": encode_image(rgba),
        "odd/train/a_rgba/big.JPG": solid_image((0, 0, 250), size=(300, 200), fmt="JPEG"),
        "odd/train/c_mixed/tall.png": solid_image((0, 200, 0), size=(12, 50)),
        "odd/train/c_mixed/palette.png": buf.getvalue(),
        "odd/test/a_rgba/small.jpeg": solid_image((250, 250, 250), size=(8, 8), fmt="JPEG"),
        "odd/test/c_mixed/x.png": solid_image((1, 2, 3)),
        "odd/.DS_Store": b"junk",
        "__MACOSX/odd/train/._x.png": b"junk",
    }


def test_odd_images_become_rgb_at_the_requested_size(tmp_path, no_store):
    path = make_image_folder_archive(tmp_path / "odd.zip", _odd_folder())
    ds, info = prepare_dataset(path, val_fraction=0.0, image_size=24)
    assert ds.class_names == ["a_rgba", "b_gray", "c_mixed"]
    assert ds.train_images.shape == (6, 3, 24, 24) and ds.test_images.shape == (2, 3, 24, 24)
    # Sorted by class, then member name: big.JPG, rgba.png, gray.jpg, gray.png, palette.png, tall.png.
    np.testing.assert_array_equal(ds.train_labels, [0, 0, 1, 1, 2, 2])
    pixel = ds.train_images[:, :, 12, 12]
    assert np.all(np.abs(pixel[0] - np.array([0, 0, 250])) <= 4)  # big JPEG, draft-decoded and resized
    assert pixel[1].tolist() == [10, 20, 30]  # RGBA: alpha dropped like torchvision's loader
    assert np.all(np.abs(pixel[2] - 77) <= 2) and pixel[3].tolist() == [77, 77, 77]  # grayscale -> 3 channels
    assert pixel[4].tolist() == [200, 0, 0] and pixel[5].tolist() == [0, 200, 0]  # palette, resized
    assert info.metadata["counts"]["test"] == {"a_rgba": 1, "b_gray": 0, "c_mixed": 1}


@pytest.mark.parametrize("split", ["train", "test"])
def test_empty_class_folder_is_named(tmp_path, no_store, split):
    path = make_image_folder_archive(
        tmp_path / "x.tar.gz", small_image_folder(), dirs=(f"data/{split}/bird",)
    )
    with pytest.raises(ArchiveError, match=f"class folder 'data/{split}/bird/' has no images"):
        prepare_dataset(path)


@pytest.mark.parametrize(
    "bad, content, error, message",
    [
        (
            "data/train/cat/broken.png",
            b"\x89PNG\r\n\x1a\nnot really",
            ImageDecodeError,
            "data/train/cat/broken.png",
        ),
        (
            "data/test/dog/cut.jpg",
            solid_image((9, 9, 9), (64, 64), "JPEG")[:200],
            ImageDecodeError,
            "cut.jpg",
        ),
        (
            "data/train/cat/readme.txt",
            b"hello",
            ArchiveError,
            "'data/train/cat/readme.txt' is not an image: Pillow reads no '.txt' files",
        ),
        (
            "data/train/stray.png",
            solid_image((1, 1, 1)),
            ArchiveError,
            "'data/train/stray.png' is not directly",
        ),
        (
            "data/test/horse/x.png",
            solid_image((1, 1, 1)),
            ArchiveError,
            "'data/test/horse/'.*have no train folder",
        ),
    ],
)
def test_bad_images_and_stray_files_are_named(tmp_path, no_store, bad, content, error, message):
    files = small_image_folder()
    files[bad] = content
    path = make_image_folder_archive(tmp_path / "x.tar.gz", files)
    with pytest.raises(error, match=message):
        prepare_dataset(path)


def test_parallel_decoding_matches_serial():
    rng = np.random.default_rng(0)
    blobs = [encode_image(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)) for _ in range(300)]
    names = [f"img{i}.png" for i in range(len(blobs))]
    serial = decode_images(names, blobs, 8, workers=1)
    parallel = decode_images(names, blobs, 8, workers=2, min_parallel=100)
    np.testing.assert_array_equal(serial, parallel)
    blobs[250] = b"garbage"
    with pytest.raises(ImageDecodeError, match="img250.png"):
        decode_images(names, blobs, 8, workers=2, min_parallel=100)


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("val_fraction", 0.6, "in \\[0, 0.5\\]"),  # the pipeline's rule (params.py), one constant
        ("max_train_samples", -1, ">= 0"),
        ("image_size", 4, "in \\[8,"),
    ],
)
def test_invalid_parameters_name_themselves(field, value, allowed):
    with pytest.raises(ValueError, match=f"invalid {field}={value!r}: must be {allowed}"):
        PrepareParams(**{field: value})


def test_selection_helpers():
    labels = np.repeat(np.arange(3), [50, 30, 20])
    rng = np.random.default_rng(0)
    picked = stratified_pick(labels, 10, rng)
    assert np.bincount(labels[picked]).tolist() == [5, 3, 2] and np.all(np.diff(picked) > 0)
    train, val = split_validation(labels, 0.1, np.random.default_rng(1))
    assert len(val) == 10 and len(np.intersect1d(train, val)) == 0 and len(train) + len(val) == 100
    images = np.random.default_rng(2).integers(0, 256, (7, 3, 5, 5), dtype=np.uint8)
    mean, std = channel_stats(images)
    np.testing.assert_allclose(mean, (images / 255).mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(std, (images / 255).std(axis=(0, 2, 3)))


def test_metadata_describes_the_file(official, tmp_path, no_store):
    path, _ = official
    prepare_to_file(path, tmp_path / "d.safetensors", max_train_samples=50)
    meta = read_metadata(tmp_path / "d.safetensors")
    for key in (
        "counts",
        "class_names",
        "mean",
        "std",
        "image_size",
        "source_digest",
        "format_version",
        "sizes",
    ):
        assert key in meta
    assert meta["preprocess_version"] == 1 and meta["max_train_samples"] == 50 and meta["seed"] == 0


def test_decode_workers_setting(monkeypatch):
    from cifar10_kfp.data.images import default_workers

    monkeypatch.setenv("CIFAR10_KFP_DECODE_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.setenv("CIFAR10_KFP_DECODE_WORKERS", "many")
    with pytest.raises(ValueError, match="CIFAR10_KFP_DECODE_WORKERS='many'"):
        default_workers()
    monkeypatch.delenv("CIFAR10_KFP_DECODE_WORKERS")
    assert 1 <= default_workers() <= min(16, len(__import__("os").sched_getaffinity(0)))


def test_skipping_keeps_the_rest_in_order_and_refuses_a_class_left_empty(tmp_path, no_store):
    from cifar10_kfp.data.images import decode_images_skipping

    rng = np.random.default_rng(0)
    blobs = [encode_image(rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)) for _ in range(300)]
    names = [f"img{i}.png" for i in range(len(blobs))]
    expected = decode_images(names, blobs, 8, workers=1)
    for i in (3, 250):
        blobs[i] = b"garbage"
    for workers in (1, 2):  # in this process, and across worker chunks
        images, kept, skipped = decode_images_skipping(names, blobs, 8, workers=workers, min_parallel=100)
        assert kept == [i for i in range(300) if i not in (3, 250)]
        np.testing.assert_array_equal(images, expected[kept])
        assert [name for name, _ in skipped] == ["img3.png", "img250.png"]
        assert "BytesIO" not in skipped[0][1] and skipped[0][1].startswith("cannot decode image img3.png: ")
    files = small_image_folder(per_class=2)
    files["data/train/cat/000.png"] = files["data/train/cat/001.png"] = b"garbage"
    path = make_image_folder_archive(tmp_path / "x.tar.gz", files)
    with pytest.raises(ValueError, match=r"no decodable train image left in class folder\(s\) \['cat'\]"):
        prepare_dataset(path, val_fraction=0.0, skip_bad_images=True)
