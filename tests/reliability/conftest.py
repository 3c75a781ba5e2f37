"""Fixtures of the reliability suite and the closing figures table.

One real SeaweedFS server serves the whole suite, started with recognisable fake credentials:
access key ``RELTESTAK<random>`` and a secret that is random per session, so every surface the
product writes can be scanned for that exact value. The table of figures (kills survived,
outage seconds survived, inputs tried and rejected, secret hits) is printed at the end of the
session; set ``RELIABILITY_FIGURES_JSON=path`` to also get it as JSON.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from cifar10_kfp.storage import ObjectStore, StorageConfig
from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from tests.reliability.harness import FIGURES, FakeCredentials, product_env


@pytest.fixture(scope="session")
def rel_creds() -> FakeCredentials:
    """Fake credentials that are easy to recognise, with a fresh random secret each session."""
    return FakeCredentials(
        access_key="RELTESTAK" + secrets.token_hex(6).upper(),
        secret_key="RELTESTSECRET" + secrets.token_hex(16),
    )


@pytest.fixture(scope="session")
def rel_server(rel_creds, tmp_path_factory):
    """The suite's own real S3 server: some tests stop and restart it to simulate an outage."""
    server = EmbeddedObjectStore(
        tmp_path_factory.mktemp("rel-s3"), access_key=rel_creds.access_key, secret_key=rel_creds.secret_key
    )
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def rel_env(rel_server, tmp_path) -> dict[str, str]:
    """A complete environment for product processes: the suite's store under a fresh prefix, CPU only.

    The server is restarted first if an earlier test left it stopped, so one failure does not
    cascade into every later test.
    """
    if not rel_server.running:
        rel_server.start()
    return product_env(rel_server, f"rel-{tmp_path.name}/")


@pytest.fixture
def rel_store(rel_env, monkeypatch) -> ObjectStore:
    """``rel_env`` applied to this process too; returns an ObjectStore configured from it."""
    for key in [k for k in os.environ if k.startswith(("MINIO_", "CIFAR10_KFP_"))]:
        monkeypatch.delenv(key)
    for key, value in rel_env.items():
        if key.startswith(("MINIO_", "CIFAR10_KFP_")):
            monkeypatch.setenv(key, value)
    return ObjectStore(StorageConfig.from_env(rel_env))


@pytest.fixture
def figures():
    return FIGURES


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = FIGURES.table_lines()
    if not lines:
        return
    terminalreporter.section("reliability figures")
    for line in lines:
        terminalreporter.write_line(line)
    target = os.environ.get("RELIABILITY_FIGURES_JSON")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(FIGURES.as_dict(), indent=2, sort_keys=True))
        terminalreporter.write_line(f"figures written to {target}")


@pytest.fixture(scope="session")
def train_data(tmp_path_factory) -> Path:
    from tests.reliability.training import make_dataset

    return make_dataset(tmp_path_factory.mktemp("rel-data") / "dataset.safetensors")


@pytest.fixture(scope="session")
def reference_run(rel_server, train_data, tmp_path_factory):
    """The uninterrupted training run every interrupted one must equal, bit for bit."""
    from tests.reliability.harness import S3Proxy
    from tests.reliability.training import run_reference

    base = tmp_path_factory.mktemp("rel-reference")
    env = product_env(rel_server, "rel-reference/")
    proxy = S3Proxy(rel_server.ports["s3"])
    try:
        uri = f"s3://{rel_server.bucket}/rel-reference/checkpoints"
        return run_reference(env, proxy, train_data, uri, base / "out", base / "train.log")
    finally:
        proxy.close()
