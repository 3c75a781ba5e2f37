"""Download: real HTTP from a local server, real object store, checksums, the content-addressed cache."""

from __future__ import annotations

import json

import pytest

from cifar10_kfp.data import download
from cifar10_kfp.data.download import (
    ChecksumError,
    DownloadError,
    DownloadLimits,
    fetch_dataset,
    parse_checksum,
    redact_source,
    safe_filename,
)
from cifar10_kfp.storage import ObjectStore
from tests.support.datagen import (
    LocalHTTPServer,
    closed_port_url,
    file_digest,
    make_image_folder_archive,
    make_official_archive,
    small_image_folder,
)

ONE_TRY = DownloadLimits(attempts=1, timeout_s=5)


@pytest.fixture(scope="module")
def official_archive(tmp_path_factory):
    return make_official_archive(
        tmp_path_factory.mktemp("official") / "cifar-10-python.tar.gz", n_per_batch=40
    )


@pytest.fixture
def http():
    with LocalHTTPServer() as server:
        yield server


def _listing(store: ObjectStore) -> list[str]:
    return store.list(store.root_uri() + "/")


def test_official_archive_over_http_with_md5(store_env, http, official_archive):
    url = http.add_file("kriz/cifar-10-python.tar.gz", official_archive)
    md5, sha256 = file_digest(official_archive, "md5"), file_digest(official_archive)
    result = fetch_dataset(url, f"md5:{md5}")

    assert (result.sha256, result.md5, result.size) == (sha256, md5, official_archive.stat().st_size)
    assert (result.format, result.filename, result.cache_hit) == (
        "cifar10-python",
        "cifar-10-python.tar.gz",
        False,
    )
    assert result.cache_uri == store_env.root_uri("datasets", "sha256", sha256, "cifar-10-python.tar.gz")
    info = store_env.stat(result.cache_uri)
    assert (info.size, info.sha256) == (result.size, sha256)
    assert set(result.pointer()) == {"source", "sha256", "size", "format", "filename", "cache_uri"}
    index = json.loads(store_env.get_bytes(store_env.root_uri("datasets", "index", "md5", f"{md5}.json")))
    assert index["cache_uri"] == result.cache_uri and index["format"] == "cifar10-python"
    assert http.fetches("kriz/cifar-10-python.tar.gz") == 1


def test_second_run_with_the_same_checksum_fetches_nothing(store_env, http, official_archive):
    url = http.add_file("cifar-10-python.tar.gz", official_archive)
    md5, sha256 = file_digest(official_archive, "md5"), file_digest(official_archive)
    first = fetch_dataset(url, f"md5:{md5}")
    listing = _listing(store_env)
    second = fetch_dataset(url, f"md5:{md5}")
    by_sha = fetch_dataset(url, f"sha256:{sha256}")
    assert http.fetches("cifar-10-python.tar.gz") == 1, http.requests
    assert second.cache_hit and by_sha.cache_hit
    assert second.pointer() == first.pointer() == by_sha.pointer()
    assert _listing(store_env) == listing

    # Without a checksum there is nothing to look up: it fetches, finds the content already stored.
    third = fetch_dataset(url)
    assert http.fetches("cifar-10-python.tar.gz") == 2
    assert third.cache_hit and third.cache_uri == first.cache_uri
    assert _listing(store_env) == listing


def test_cache_heals_when_the_archive_was_deleted(store_env, http, official_archive):
    url = http.add_file("c.tar.gz", official_archive)
    checksum = f"sha256:{file_digest(official_archive)}"
    first = fetch_dataset(url, checksum)
    store_env.delete(first.cache_uri)
    again = fetch_dataset(url, checksum)
    assert not again.cache_hit and store_env.exists(first.cache_uri)
    assert http.fetches("c.tar.gz") == 2


@pytest.mark.parametrize("algo", ["md5", "sha256"])
def test_wrong_checksum_is_rejected_and_nothing_is_cached(store_env, http, official_archive, algo):
    url = http.add_file("cifar-10-python.tar.gz", official_archive)
    wrong = "0" * (32 if algo == "md5" else 64)
    before = _listing(store_env)
    with pytest.raises(ChecksumError) as err:
        fetch_dataset(url, f"{algo}:{wrong}")
    message = str(err.value)
    assert f"expected {algo}:{wrong}" in message and file_digest(official_archive, algo) in message
    assert "nothing was cached" in message
    assert _listing(store_env) == before


def test_official_url_is_always_checked_against_its_known_md5(store_env, http, official_archive, monkeypatch):
    url = http.add_file("cifar-10-python.tar.gz", official_archive)
    monkeypatch.setitem(download.KNOWN_CHECKSUMS, url, download.DEFAULT_CHECKSUM)
    with pytest.raises(ChecksumError, match="c58f30108f718f92721af3b95e74349a"):
        fetch_dataset(url)
    assert download.KNOWN_CHECKSUMS[download.DEFAULT_URL] == "md5:c58f30108f718f92721af3b95e74349a"


@pytest.mark.parametrize(
    "bad", ["md5", "md5:xyz", "sha1:" + "0" * 40, "sha256:" + "0" * 63, "c58f30108f718f92721af3b95e74349a"]
)
def test_invalid_checksum_names_the_value(bad):
    with pytest.raises(ValueError, match="invalid checksum"):
        parse_checksum(bad)
    assert parse_checksum(" MD5:C58F30108F718F92721AF3B95E74349A ") == (
        "md5",
        "c58f30108f718f92721af3b95e74349a",
    )
    assert parse_checksum("") is None
    assert parse_checksum("AB" * 32) == ("sha256", "ab" * 32)  # bare sha256: the pipelines' parameter form


def test_no_network_says_so_and_how_to_use_a_local_copy(monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    with pytest.raises(DownloadError) as err:
        fetch_dataset(closed_port_url(), limits=ONE_TRY)
    message = str(err.value)
    assert "no network connection" in message
    for hint in ("--source /path/to/cifar-10-python.tar.gz", "s3://", "dataset_uri", "make run DATASET="):
        assert hint in message


def test_http_error_is_not_retried_but_server_errors_are(http, monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch_dataset(http.add_status("gone.tar.gz", 404), limits=DownloadLimits(attempts=3))
    assert http.fetches("gone.tar.gz") == 1
    with pytest.raises(DownloadError, match="HTTP 503"):
        fetch_dataset(http.add_status("busy.tar.gz", 503), limits=DownloadLimits(attempts=2))
    assert http.fetches("busy.tar.gz") == 2


def test_stalled_server_times_out(http, monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    with pytest.raises(DownloadError, match="timed out after 0.5s"):
        fetch_dataset(http.add_stall("slow.tar.gz"), limits=DownloadLimits(attempts=1, timeout_s=0.5))


def test_short_read_is_detected(http, monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    with pytest.raises(DownloadError, match="after 1 attempt"):
        fetch_dataset(http.add_truncated("cut.tar.gz", b"x" * 100, declared=5000), limits=ONE_TRY)


def test_size_cap(store_env, http, official_archive):
    url = http.add_file("big.tar.gz", official_archive)
    before = _listing(store_env)
    with pytest.raises(DownloadError, match="over the 1000-byte cap"):
        fetch_dataset(url, limits=DownloadLimits(max_bytes=1000, attempts=1))
    assert _listing(store_env) == before


def test_object_store_mirror_and_local_sources(store_env, official_archive, tmp_path):
    sha256 = file_digest(official_archive)
    mirror = store_env.root_uri("mirror", "cifar-10-python.tar.gz")
    store_env.put_file(official_archive, mirror)
    from_s3 = fetch_dataset(mirror)
    assert (from_s3.sha256, from_s3.format, from_s3.cache_hit) == (sha256, "cifar10-python", False)
    from_minio = fetch_dataset(mirror.replace("s3://", "minio://"), f"sha256:{sha256}")
    assert from_minio.cache_hit and from_minio.cache_uri == from_s3.cache_uri
    from_file = fetch_dataset(f"file://{official_archive}")
    assert from_file.cache_hit and from_file.local_path == str(official_archive)
    zip_path = make_image_folder_archive(tmp_path / "my images.zip", small_image_folder())
    from_path = fetch_dataset(str(zip_path))
    assert from_path.format == "image-folder" and from_path.filename == "my_images.zip"
    assert store_env.exists(from_path.cache_uri)


def test_without_an_object_store_local_sources_still_work(official_archive, monkeypatch, caplog):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    caplog.set_level("INFO")
    result = fetch_dataset(str(official_archive))
    assert result.cache_uri == "" and not result.cache_hit and result.local_path == str(official_archive)
    assert "no object store configured" in caplog.text


def test_workdir_keeps_a_verified_copy(http, official_archive, tmp_path, monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    result = fetch_dataset(http.add_file("a.tar.gz", official_archive), workdir=tmp_path)
    assert file_digest(result.local_path) == result.sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{result.sha256[:16]}-a.tar.gz"]


def test_missing_local_source_and_bad_scheme(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        fetch_dataset(str(tmp_path / "absent.tar.gz"), cache=False)
    with pytest.raises(ValueError, match="unsupported dataset source 'ftp://x/y'"):
        fetch_dataset("ftp://x/y")
    with pytest.raises(ValueError, match="source is empty"):
        fetch_dataset("  ")


def test_credentials_never_reach_the_result(http, official_archive, monkeypatch):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    url = http.add_file("c.tar.gz", official_archive).replace("http://", "http://user:s3cret@")
    result = fetch_dataset(url + "?X-Amz-Signature=abcdef")
    assert "s3cret" not in json.dumps(result.pointer()) and "abcdef" not in json.dumps(result.pointer())
    assert redact_source("https://u:p@h:8443/a/b.tgz?sig=1") == "https://h:8443/a/b.tgz"
    assert safe_filename("https://h/a/cifar%2010.tar.gz?x=1") == "cifar_10.tar.gz"
    assert safe_filename("https://h/") == "archive"


def test_an_http_download_shows_bytes_rate_and_eta_as_lines_off_a_terminal(
    http, official_archive, monkeypatch, capsys
):
    from cifar10_kfp.progress import INTERVAL_ENV, is_progress_line

    monkeypatch.setenv(INTERVAL_ENV, "0")  # a line per block: the archive is smaller than a real one
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    url = http.add_file("progress/cifar-10-python.tar.gz", official_archive)
    fetch_dataset(url, "")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("download")]
    assert lines and all(is_progress_line(line) for line in lines) and "\r" not in "".join(lines)
    assert "100.0%" in lines[-1] and "/s" in lines[-1] and "eta" in lines[-1]
    done, rest = lines[-1].removeprefix("download").split(" / ")
    assert done.split() == rest.split()[:2]  # bytes done = bytes announced (Content-Length)
