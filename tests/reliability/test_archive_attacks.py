"""Part 6: hostile dataset archives are rejected, and the object-store cache is left exactly as it was.

Every archive comes over real HTTP from a local server (the path an untrusted dataset takes),
through the same one-call download + verify + prepare that ``cifar10-kfp data`` runs, against
the suite's real object store. The whole bucket is listed before and after each attempt.
The archive builders are the data tests' own (``tests/support/datagen.py``): each archive is a valid
small image-folder dataset plus one bad member, so the bad member is the only reason to refuse.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pytest

from tests.reliability.harness import FIGURES
from tests.support.datagen import (
    BOMB_TEST_CAP,
    MALICIOUS_BUILDERS,
    REJECTION_REASONS,
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
    """One ``prepare_from_source`` call; (the ArchiveError/ChecksumError that refused it, or None, ...).

    Only the library's own refusals count: any other exception (a network error, a crash) is no
    refusal and propagates, failing the test with its own traceback.
    """
    from cifar10_kfp.data.archives import ArchiveError
    from cifar10_kfp.data.download import ChecksumError
    from cifar10_kfp.data.preprocess import prepare_from_source

    output = tmp_path / "prepared" / "dataset.safetensors"
    before = _bucket_listing(store)
    error = None
    try:
        prepare_from_source(source, checksum, output, store=store)
    except (ArchiveError, ChecksumError) as exc:
        error = exc
    after = _bucket_listing(store)
    if hostile:
        FIGURES.record_rejection(KIND, error is not None and before == after and not output.exists())
    return error, before, after, output


def _landing_zone(tmp_path: Path, monkeypatch) -> Path:
    """Make every place a member could be written relative to lie at least two levels inside tmp_path.

    The working directory and the temporary directories the library makes (``tempfile``) move
    below ``tmp_path``, so ``data/../../evil.txt`` written relative to any of them, or to the
    output directory, lands inside ``tmp_path``, where ``_written_files`` sees it.
    """
    cwd = tmp_path / "cwd" / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    (tmp_path / "tmp" / "t").mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp" / "t"))
    return cwd


def _written_files(tmp_path: Path, archive: Path) -> list[Path]:
    """Every file under tmp_path but the archive itself, and any absolute member's path that exists."""
    found = sorted(p for p in tmp_path.rglob("*") if not p.is_dir() and p != archive)
    return found + [Path(m) for m in ESCAPE_MARKERS if Path(m).exists()]


@pytest.mark.parametrize("case", sorted(MALICIOUS_BUILDERS))
def test_hostile_archive_is_rejected_and_cache_unchanged(case, rel_store, http_server, tmp_path, monkeypatch):
    monkeypatch.setenv("CIFAR10_KFP_MAX_EXTRACT_BYTES", str(BOMB_TEST_CAP))  # the bombs are 2x this
    for marker in ESCAPE_MARKERS:
        Path(marker).unlink(missing_ok=True)
    archive, bad_member = MALICIOUS_BUILDERS[case](tmp_path / f"{case}.tar.gz")
    url = http_server.add_file(f"{case}/{archive.name}", archive)
    _landing_zone(tmp_path, monkeypatch)
    error, before, after, output = _attempt(rel_store, url, "", tmp_path)
    assert error is not None, f"{case}: the archive was accepted"
    assert REJECTION_REASONS[case] in str(error), f"{case}: refused for another reason: {error!r}"
    if bad_member:
        assert bad_member in str(error), f"{case}: the error does not name the bad member: {error}"
    assert after == before, f"{case}: the object store changed: {sorted(set(after) ^ set(before))}"
    assert not output.exists(), f"{case}: a prepared dataset was written"
    written = _written_files(tmp_path, archive)
    assert not written, f"{case}: the refused attempt wrote files: {written}"


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
