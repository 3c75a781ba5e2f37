"""Shared fixtures: a real embedded S3 server, a real MLflow server, the real CIFAR-10 archive, tiny datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cifar10_kfp.storage import ObjectStore
from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from tests.support.data import make_tiny_dataset
from tests.support.models import write_trained_model_dir
from tests.support.paths import REAL_ARCHIVE


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
    for name in ("CIFAR10_KFP_STRICT_CREDENTIALS", "CIFAR10_KFP_NAMESPACE", "MINIO_REGION"):
        monkeypatch.delenv(name, raising=False)
    return ObjectStore()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real MLflow tracking server (``mlflow server``, SQLite) on 127.0.0.1 for the session; all its
    processes are ended at the end."""
    pytest.importorskip("mlflow", reason="the dev extra installs mlflow (the tracking server)")
    from tests.support.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def real_archive() -> Path:
    """The real 60,000-image CIFAR-10 JPEG archive from ../shared, or a skip that says why."""
    if not REAL_ARCHIVE.is_file():
        pytest.skip(f"real CIFAR-10 archive not found at {REAL_ARCHIVE} (see shared/datasets/README.md)")
    return REAL_ARCHIVE


@pytest.fixture
def tiny_dataset_path(tmp_path) -> Path:
    """A tiny learnable prepared dataset written to disk."""
    from cifar10_kfp.data.format import save_prepared

    return save_prepared(make_tiny_dataset(), tmp_path / "tiny" / "dataset.safetensors")


@pytest.fixture(autouse=True)
def _no_gpu_in_tests(monkeypatch):
    """Tests run on CPU even where a GPU exists, so results are deterministic and comparable."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CIFAR10_KFP_TEST_CUDA", ""))


@pytest.fixture
def trained_model_dir(tmp_path, tiny_dataset_path) -> Path:
    """A simple_cnn trained a few steps on the tiny dataset, saved as a model directory with a history."""
    return write_trained_model_dir(tiny_dataset_path, tmp_path)


# ------------------------------------------------------------------ no skips in CI
# A skip in CI hides a test that never ran: a missing tool or input there is a failure. Locally a
# skip stays a skip (with its reason in the -ra summary), so a partial checkout can still test.
_SKIPPED: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPPED.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("CI", "").lower() in ("true", "1") and _SKIPPED and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("CI", "").lower() in ("true", "1") and _SKIPPED:
        terminalreporter.section("skipped tests fail the run in CI (CI=true)", red=True)
        for line in _SKIPPED:
            terminalreporter.line(line, red=True)
