"""Part 6: hostile dataset archives are rejected, and the object-store cache is left exactly as it was.

Every archive comes over real HTTP from a local server (the path an untrusted dataset takes),
through the same one-call download + verify + prepare that ``cifar10-kfp data`` runs, against
the suite's real object store. The whole bucket is listed before and after each attempt.
The archive builders are the data tests' own (``tests/support/datagen.py``): each archive is a valid
small image-folder dataset plus one bad member, so the bad member is the only reason to refuse.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.reliability.harness import FIGURES
from tests.support.datagen import (
    BOMB_TEST_CAP,
    MALICIOUS_BUILDERS,
    LocalHTTPServer,
    make_image_folder_archive,
    small_image_folder,
)

pytestmark = pytest.mark.reliability

KIND = "hostile archives"
ESCAPE_MARKERS = ("/tmp/cifar10-kfp-evil.txt", "/tmp/cifar10-kfp-evil.tx")


@pytest.fixture(scope="module")
def http_server():
    with LocalHTTPServer() as server:
        yield server


def _bucket_listing(store) -> list[tuple[str, int]]:
    uris = store.list(f"s3://{store.config.bucket}/")
    return [(uri, store.stat(uri).size) for uri in uris]


def _attempt(store, source: str, checksum: str, tmp_path: Path, *, hostile: bool = True):
    from cifar10_kfp.data.preprocess import prepare_from_source

    output = tmp_path / "prepared" / "dataset.safetensors"
    before = _bucket_listing(store)
    error = None
    try:
        prepare_from_source(source, checksum, output, store=store)
    except (ValueError, RuntimeError, OSError) as exc:  # ArchiveError/ChecksumError are ValueErrors
        error = exc
    after = _bucket_listing(store)
    if hostile:
        FIGURES.record_rejection(KIND, error is not None and before == after and not output.exists())
    return error, before, after, output


@pytest.mark.parametrize("case", sorted(MALICIOUS_BUILDERS))
def test_hostile_archive_is_rejected_and_cache_unchanged(case, rel_store, http_server, tmp_path, monkeypatch):
    monkeypatch.setenv("CIFAR10_KFP_MAX_EXTRACT_BYTES", str(BOMB_TEST_CAP))  # the bombs are 2x this
    for marker in ESCAPE_MARKERS:
        Path(marker).unlink(missing_ok=True)
    archive, bad_member = MALICIOUS_BUILDERS[case](tmp_path / f"{case}.tar.gz")
    url = http_server.add_file(f"{case}/{archive.name}", archive)
    error, before, after, output = _attempt(rel_store, url, "", tmp_path)
    assert error is not None, f"{case}: the archive was accepted"
    if bad_member:
        assert bad_member in str(error), f"{case}: the error does not name the bad member: {error}"
    assert after == before, f"{case}: the object store changed: {sorted(set(after) ^ set(before))}"
    assert not output.exists(), f"{case}: a prepared dataset was written"
    for marker in ESCAPE_MARKERS:
        assert not Path(marker).exists(), f"{case}: a member escaped to {marker}"


@pytest.mark.parametrize("algo", ["sha256", "md5"])
def test_wrong_checksum_is_rejected_and_cache_unchanged(algo, rel_store, http_server, tmp_path):
    archive = make_image_folder_archive(tmp_path / "good.tar.gz", small_image_folder())
    wrong = getattr(hashlib, algo)(archive.read_bytes() + b"tampered").hexdigest()
    url = http_server.add_file(f"checksum-{algo}/good.tar.gz", archive)
    error, before, after, output = _attempt(rel_store, url, f"{algo}:{wrong}", tmp_path)
    assert error is not None, "an archive with the wrong checksum was accepted"
    assert wrong in str(error) and "mismatch" in str(error), f"unclear error: {error}"
    assert after == before and not output.exists()


def test_the_same_good_archive_is_accepted_and_cached(rel_store, http_server, tmp_path):
    """The control: without the bad member, the same path succeeds and stores the archive."""
    archive = make_image_folder_archive(tmp_path / "good.tar.gz", small_image_folder())
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    url = http_server.add_file("control/good.tar.gz", archive)
    error, before, after, output = _attempt(rel_store, url, f"sha256:{digest}", tmp_path, hostile=False)
    assert error is None, f"a valid archive was refused: {error}"
    FIGURES.input(KIND).accepted_valid += 1
    assert output.exists()
    assert any(digest in uri for uri, _ in after if uri not in dict(before)), (
        "the valid archive was not cached"
    )
