"""The tracking tests start from an environment without MLflow or Trainer variables (``mlflow_server``: tests/conftest.py)."""

from __future__ import annotations

import pytest

from cifar10_kfp.tracking.mlflow_sink import CLIENT_DEFAULTS


@pytest.fixture
def tracking_env(monkeypatch):
    """No MLflow or Trainer variable from the outer environment reaches a test unless it sets one."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                 "KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT", "KUBEFLOW_TRAINER_SERVER_TOKEN"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    # a tracked run sets these when unset (os.environ.setdefault); set here, they are undone after the test
    for name, value in CLIENT_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    return monkeypatch
