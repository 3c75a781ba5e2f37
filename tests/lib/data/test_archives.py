"""Untrusted archives: every malicious or broken case is rejected, naming the member, and the cache is unchanged."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from cifar10_kfp.data.archives import (
    ArchiveError,
    ArchiveLimits,
    extract_archive,
    iter_archive,
    safe_member_name,
    scan_archive,
)
from cifar10_kfp.data.download import fetch_dataset, verify_archive
from cifar10_kfp.data.layout import CIFAR10_PYTHON, IMAGE_FOLDER
from tests.support.datagen import (
    BOMB_TEST_CAP,
    MALICIOUS_BUILDERS,
    REJECTION_REASONS,
    LocalHTTPServer,
    file_digest,
    make_image_folder_archive,
    make_official_archive,
    small_image_folder,
)

BOMB_LIMITS = ArchiveLimits(max_total_bytes=BOMB_TEST_CAP)
EXPECTED = REJECTION_REASONS


def _files_outside(root, keep, dest):
    """Files under ``root`` other than ``keep`` and those below ``dest``: where an escape would land."""
    return sorted(p for p in root.rglob("*") if not p.is_dir() and p != keep and dest not in p.parents)


@pytest.mark.parametrize("case", sorted(MALICIOUS_BUILDERS))
def test_malicious_archive_is_rejected_naming_the_member(case, tmp_path):
    path, bad_member = MALICIOUS_BUILDERS[case](tmp_path / f"{case}.tar.gz")
    absolute = Path(bad_member) if bad_member and bad_member.startswith("/") else None
    if absolute is not None:
        absolute.unlink(missing_ok=True)  # this suite's own file name: left over from an earlier failure
    # Extraction refuses, and writes nothing: not below dest, and not where a traversal would land
    # (dest/data/../../evil.txt is tmp_path/evil.txt; an absolute member lands at its own path).
    dest = tmp_path / "extract"
    with pytest.raises(ArchiveError) as refused:
        try:
            extract_archive(path, dest, limits=BOMB_LIMITS)
        finally:
            escaped = _files_outside(tmp_path, path, dest) + (
                [absolute] if absolute and absolute.exists() else []
            )
            assert not escaped, f"extracting {case} wrote outside {dest}: {escaped}"
    assert EXPECTED[case] in str(refused.value)
    assert not dest.exists() or not any(dest.rglob("*"))
    # Verification names the archive, the member and the reason.
    with pytest.raises(ArchiveError) as err:
        verify_archive(path, limits=BOMB_LIMITS)
    message = str(err.value)
    assert EXPECTED[case] in message
    assert str(path) in message
    if bad_member:
        assert repr(bad_member) in message


def test_every_builder_is_a_valid_dataset_except_for_its_bad_member(tmp_path):
    """The cases must fail because of the bad member, not because the rest is malformed."""
    good = make_image_folder_archive(tmp_path / "good.tar.gz", small_image_folder())
    assert verify_archive(good, limits=BOMB_LIMITS) == IMAGE_FOLDER
    good_zip = make_image_folder_archive(tmp_path / "good.zip", small_image_folder())
    assert verify_archive(good_zip, limits=BOMB_LIMITS) == IMAGE_FOLDER
    # The bomb passes under a cap that is big enough: the cap is what rejects it.
    path, _ = MALICIOUS_BUILDERS["bomb"](tmp_path / "bomb.tar.gz")
    assert verify_archive(path, limits=ArchiveLimits(max_total_bytes=64 * 1024 * 1024)) == IMAGE_FOLDER


@pytest.mark.parametrize(
    "name",
    ["/etc/passwd", "a/../../b", "..", "C:/windows/x", "a\\..\\..\\b", "\\\\server\\share", "a/\x01b", ""],
)
def test_unsafe_member_names(name):
    with pytest.raises(ArchiveError):
        safe_member_name("x.tar", name)


def test_member_names_are_normalized():
    assert safe_member_name("x.tar", "./a//b/./c.png") == "a/b/c.png"


def test_symlink_inside_the_archive_is_allowed_but_never_followed(tmp_path):
    def add(tar):
        info = tarfile.TarInfo("data/train/cat/alias.png")
        info.type, info.linkname = tarfile.SYMTYPE, "000.png"
        tar.addfile(info)

    path = make_image_folder_archive(tmp_path / "a.tar", small_image_folder(), extra=add)
    kinds = {m.name: m.kind for m in scan_archive(path)}
    assert kinds["data/train/cat/alias.png"] == "symlink"
    written = extract_archive(path, tmp_path / "out")
    assert not any(p.is_symlink() for p in (tmp_path / "out").rglob("*"))
    assert len(written) == len(small_image_folder())


def test_duplicate_members_and_member_count_cap(tmp_path):
    def dup(tar):
        info = tarfile.TarInfo("data/train/cat/000.png")
        info.size = 3
        import io

        tar.addfile(info, io.BytesIO(b"abc"))

    path = make_image_folder_archive(tmp_path / "dup.tar", small_image_folder(), extra=dup)
    with pytest.raises(ArchiveError, match="'data/train/cat/000.png' appears twice"):
        scan_archive(path)
    ok = make_image_folder_archive(tmp_path / "ok.tar", small_image_folder())
    with pytest.raises(ArchiveError, match="more than 5 members"):
        scan_archive(ok, limits=ArchiveLimits(max_members=5))


def test_extract_cap_comes_from_the_environment(tmp_path, monkeypatch):
    path, member = MALICIOUS_BUILDERS["bomb"](tmp_path / "bomb.tar.gz")
    monkeypatch.setenv("CIFAR10_KFP_MAX_EXTRACT_BYTES", str(BOMB_TEST_CAP))
    with pytest.raises(ArchiveError, match="CIFAR10_KFP_MAX_EXTRACT_BYTES"):
        scan_archive(path)


def test_trailing_garbage_after_the_tar_counts_against_the_cap(tmp_path):
    import gzip

    tar_path = make_image_folder_archive(tmp_path / "plain.tar", small_image_folder())
    data = tar_path.read_bytes() + bytes(8 * 1024 * 1024)  # zero padding past the end-of-archive blocks
    path = tmp_path / "padded.tar.gz"
    path.write_bytes(gzip.compress(data))
    with pytest.raises(ArchiveError, match="data after the end of the tar archive"):
        scan_archive(path, limits=BOMB_LIMITS)


def test_not_an_archive(tmp_path):
    path = tmp_path / "x.tar.gz"
    path.write_bytes(b"<html>404 not found</html>" * 40)
    with pytest.raises(ArchiveError, match="not a supported archive"):
        verify_archive(path)


def test_unrecognized_layout_says_what_was_expected(tmp_path):
    path = make_image_folder_archive(tmp_path / "x.tar.gz", {"photos/cat.png": b"x", "notes.txt": b"y"})
    with pytest.raises(
        ArchiveError, match="unrecognized dataset layout.*top-level entries: \\['notes.txt', 'photos'\\]"
    ):
        verify_archive(path)


def test_formats_are_detected_by_content_not_name(tmp_path):
    official = make_official_archive(tmp_path / "download", n_per_batch=10)  # no extension
    assert verify_archive(official) == CIFAR10_PYTHON
    for name in ("a.tar", "a.tgz", "a.zip", "a.tar.bz2"):
        target = tmp_path / name
        if name.endswith(".bz2"):
            with tarfile.open(target, "w:bz2") as tar:
                for member, data in iter_archive(
                    make_image_folder_archive(tmp_path / "src.tar", small_image_folder()),
                    select=lambda n: True,
                ):
                    if data is not None:
                        import io

                        info = tarfile.TarInfo(member.name)
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        else:
            make_image_folder_archive(target, small_image_folder(root="my-images"))
        renamed = target.rename(tmp_path / f"{name}.bin")
        assert verify_archive(renamed) == IMAGE_FOLDER, name


@pytest.mark.parametrize(
    "case",
    ["path-traversal", "symlink-escape", "hard-link", "char-device", "bomb", "corrupt-gzip", "corrupt-zip"],
)
def test_rejected_download_leaves_the_cache_unchanged(case, store_env, tmp_path, monkeypatch):
    """Served over HTTP with a matching checksum: the archive checks out, its content does not."""
    monkeypatch.setenv("CIFAR10_KFP_MAX_EXTRACT_BYTES", str(BOMB_TEST_CAP))
    path, member = MALICIOUS_BUILDERS[case](tmp_path / f"{case}.tar.gz")
    root = store_env.root_uri() + "/"
    store_env.put_bytes(b"unrelated", store_env.root_uri("datasets", "keep.txt"))
    before = store_env.list(root)
    with LocalHTTPServer() as server:
        url = server.add_file(path.name, path)
        with pytest.raises(ArchiveError) as err:
            fetch_dataset(url, f"sha256:{file_digest(path)}")
        assert server.fetches(path.name) == 1
    if member:
        assert repr(member) in str(err.value)
    assert store_env.list(root) == before


def test_extract_archive_writes_only_accepted_files(tmp_path):
    path = make_image_folder_archive(tmp_path / "ok.zip", small_image_folder())
    written = extract_archive(path, tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in written) == sorted(small_image_folder())
    assert all(os.path.getsize(p) > 0 for p in written)


def test_tar_made_with_dot_root_entries_is_accepted(tmp_path):
    """``tar czf x.tgz -C folder .`` writes ``./`` and ``./train/...`` names."""
    folder = tmp_path / "folder"
    for name, data in small_image_folder(root="ds").items():
        target = folder / name.removeprefix("ds/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    path = tmp_path / "x.tgz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder, arcname=".")
    assert tarfile.open(path).getnames()[0] == "."
    assert verify_archive(path) == IMAGE_FOLDER
    assert "train/cat/000.png" in {m.name for m in scan_archive(path)}
