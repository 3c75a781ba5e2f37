"""``cifar10-kfp data``: with and without an object store, summary and cache reporting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cifar10_kfp.data.format import load_prepared
from cifar10_kfp_pipelines.cli import main
from tests.support.datagen import LocalHTTPServer, file_digest, make_official_archive
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def official_archive(tmp_path_factory):
    return make_official_archive(
        tmp_path_factory.mktemp("official") / "cifar-10-python.tar.gz", n_per_batch=50
    )


def test_cli_over_http_reports_cache_misses_then_hits(store_env, official_archive, tmp_path, capsys):
    with LocalHTTPServer() as server:
        url = server.add_file("cifar-10-python.tar.gz", official_archive)
        argv = ["data", "--source", url, "--checksum", f"md5:{file_digest(official_archive, 'md5')}"]
        argv += [
            "--val-fraction",
            "0.2",
            "--max-train-samples",
            "100",
            "--max-test-samples",
            "20",
            "--seed",
            "3",
        ]
        assert main([*argv, "--output", str(tmp_path / "a" / "dataset.safetensors")]) == 0
        first = capsys.readouterr().out
        assert main([*argv, "--output", str(tmp_path / "b" / "dataset.safetensors"), "--json"]) == 0
        second = json.loads(capsys.readouterr().out)
        # Another seed: the archive comes from the object store, only the preprocessing runs again.
        assert main([*argv[:-1], "4", "--output", str(tmp_path / "c" / "dataset.safetensors"), "--json"]) == 0
        third = json.loads(capsys.readouterr().out)
        assert server.fetches("cifar-10-python.tar.gz") == 1
    assert third["download_cache_hit"] and not third["prepared_cache_hit"]
    assert third["prepared_cache_uri"] != second["prepared_cache_uri"]
    assert "classes     10: airplane, automobile" in first
    assert "images      train 80, val 20, test 20 (32x32)" in first
    assert "cache       archive miss (fetched and stored); prepared miss (decoded and stored)" in first
    assert "mean        0." in first and "std         0." in first
    assert second["download_cache_hit"] and second["prepared_cache_hit"]
    assert second["sizes"] == {"train": 80, "val": 20, "test": 20}
    a, b = (tmp_path / d / "dataset.safetensors" for d in "ab")
    assert a.read_bytes() == b.read_bytes()


def test_cli_without_an_object_store_on_a_local_file(official_archive, tmp_path, monkeypatch):
    """The console entry point in a fresh process, with no MINIO_* configuration at all."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MINIO_")}
    env["PYTHONPATH"] = str(ROOT)
    out = tmp_path / "d.safetensors"
    proc = subprocess.run(
        [sys.executable, "-m", "cifar10_kfp_pipelines.cli", "data", "--source", f"file://{official_archive}", "--output", str(out)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "cache       off: no object store configured" in proc.stdout
    assert len(load_prepared(out).train_labels) == 225


def test_cli_errors_name_the_bad_value(official_archive, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MINIO_ENDPOINT", raising=False)
    out = str(tmp_path / "x.safetensors")
    assert main(["data", "--source", str(official_archive), "--checksum", "md5:123", "--output", out]) == 2
    assert "invalid checksum 'md5:123'" in capsys.readouterr().err
    assert main(["data", "--source", str(official_archive), "--val-fraction", "1.5", "--output", out]) == 2
    assert "invalid val_fraction=1.5" in capsys.readouterr().err
    assert (
        main(["data", "--source", str(official_archive), "--checksum", "sha256:" + "0" * 64, "--output", out])
        == 2
    )
    assert "checksum mismatch" in capsys.readouterr().err
    assert not Path(out).exists()
