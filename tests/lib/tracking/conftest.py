"""A real MLflow tracking server for the tracking tests, one per session, stopped (all its processes) at the end."""

from __future__ import annotations

import pytest

from tests.support.mlflow_server import MlflowServer


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    pytest.importorskip("mlflow", reason="the dev extra installs mlflow (the tracking server)")
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tracking_env(monkeypatch):
    """No MLflow or Trainer variable from the outer environment reaches a test unless it sets one."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                 "KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_SERVER_TOKEN"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return monkeypatch
