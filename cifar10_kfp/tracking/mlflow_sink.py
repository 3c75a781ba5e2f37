"""Metrics to an MLflow run through the MLflow client (``mlflow-skinny``, the ``tracking`` extra).

The run is ``MLFLOW_RUN_ID`` when that is set: KFP 2.17's driver makes one nested run per task and
injects its id with ``MLFLOW_TRACKING_URI`` and ``MLFLOW_EXPERIMENT_ID`` (and, per its auth mode,
``MLFLOW_TRACKING_TOKEN`` or ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``, ``MLFLOW_WORKSPACE``,
``MLFLOW_TRACKING_AUTH``, which the client reads itself). KFP's launcher ends that run after the step,
so a given run is never ended here. Without ``MLFLOW_RUN_ID`` a run is created in
``MLFLOW_EXPERIMENT_ID``, else ``MLFLOW_EXPERIMENT_NAME`` (created if missing), else the default
experiment, and ended here. ``child`` makes a nested run (a tuning trial).

Every call goes through an ``Outbox``: ``mlflow`` itself is imported on its thread, so neither the
import nor a slow or dead server holds up training. MLflow's HTTP client retries 7 times with backoff
and waits 120 s per request by default (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``..._TIMEOUT``); unless
the user set them, a tracking sink lowers them (``CLIENT_DEFAULTS``) so that a dead server costs seconds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cifar10_kfp.tracking.outbox import Outbox

log = logging.getLogger(__name__)

# No retries: urllib3 logs a warning line per retry, and a failed call only stops the live view. And no
# "View run ... at" line on stdout when a run ends: stdout is the commands' (train prints its metrics).
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
CLOSE_TIMEOUT_S = 30.0  # at a run's end, how long the queued calls may still take
PARENT_TAG = "mlflow.parentRunId"
SECRET_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD")
BATCH_LIMIT = 100  # params (and metrics, well under MLflow's 1000) per log-batch call


def display_uri(uri: str) -> str:
    """``uri`` without any user or password in it: what a log line may show."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class _Connection:
    """The tracking URI, its outbox and (made on the outbox's thread) the ``MlflowClient``."""

    def __init__(self, env: Mapping[str, str]):
        self.uri = env["MLFLOW_TRACKING_URI"].strip()
        self.env = env
        for name, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        secrets = tuple(env.get(name, "") for name in SECRET_ENV)
        self.outbox = Outbox(
            f"MLflow tracking at {display_uri(self.uri)}", stop_on_error=True, secrets=secrets
        )
        self._client: Any = None  # an MlflowClient, once made on the outbox's thread

    def client(self):
        if self._client is None:
            try:
                from mlflow.tracking import MlflowClient
            except ImportError as exc:
                raise RuntimeError(
                    f"MLFLOW_TRACKING_URI is set but the MLflow client is not installed ({exc}): "
                    "pip install 'cifar10-kfp[tracking]'"
                ) from None

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def experiment_id(self) -> str:
        given = self.env.get("MLFLOW_EXPERIMENT_ID", "").strip()
        if given:
            return given
        name = self.env.get("MLFLOW_EXPERIMENT_NAME", "").strip()
        if not name:
            return "0"  # MLflow's Default experiment
        found = self.client().get_experiment_by_name(name)
        return found.experiment_id if found is not None else self.client().create_experiment(name)


class MlflowSink:
    """One MLflow run: params once, metrics per epoch (``step=epoch``) and at the end.

    Args:
        env: The environment (``MLFLOW_TRACKING_URI`` must be set in it).
        name: The run's name when one is created ("train", "evaluate", "tune", "trial-3").
        parent: For a nested run: the sink of the parent run (its connection and outbox are shared).
    """

    def __init__(self, env: Mapping[str, str], name: str, parent: MlflowSink | None = None):
        self.connection: _Connection = parent.connection if parent is not None else _Connection(env)
        self.name = name
        self.parent = parent
        self.given_run_id = "" if parent is not None else env.get("MLFLOW_RUN_ID", "").strip()
        self.run_id = ""
        self._submit(self._open)

    def _submit(self, job) -> None:
        self.connection.outbox.submit(job)

    def _open(self) -> None:
        client = self.connection.client()
        if self.given_run_id:
            self.run_id = self.given_run_id
            return
        tags = {"cifar10_kfp.step": self.name}
        if self.parent is not None and self.parent.run_id:
            tags[PARENT_TAG] = self.parent.run_id
        run = client.create_run(self.connection.experiment_id(), tags=tags, run_name=self.name)
        self.run_id = run.info.run_id
        if self.parent is None:
            where = display_uri(self.connection.uri).rstrip("/")
            if where.startswith(("http://", "https://")):  # the run's page in the MLflow UI
                where = f"{where}/#/experiments/{run.info.experiment_id}/runs/{self.run_id}"
            log.info("MLflow: logging to run %s (%s)", self.run_id, where)

    def log_params(self, params: Mapping[str, object]) -> None:
        """Log ``params`` once (values as text; MLflow refuses a changed value of a logged param)."""
        items = sorted((str(k), str(v)) for k, v in params.items())

        def send() -> None:
            from mlflow.entities import Param

            for lo in range(0, len(items), BATCH_LIMIT):
                batch = [Param(k, v) for k, v in items[lo : lo + BATCH_LIMIT]]
                self.connection.client().log_batch(self.run_id, params=batch)

        self._submit(send)

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        """Log scalar ``metrics`` at ``step``, stamped now (not when the outbox gets to them)."""
        stamp = int(time.time() * 1000)
        values = {str(k): float(v) for k, v in metrics.items()}

        def send() -> None:
            from mlflow.entities import Metric

            batch = [Metric(k, v, stamp, step) for k, v in values.items()]
            self.connection.client().log_batch(self.run_id, metrics=batch)

        if values:
            self._submit(send)

    def child(self, name: str) -> MlflowSink:
        """A nested run under this one (created when the outbox gets to it)."""
        return MlflowSink({}, name, parent=self)

    def close(self, status: str = "FINISHED") -> None:
        """End the run if it was created here (``status``: FINISHED, FAILED or KILLED); the root waits for its outbox."""

        def end() -> None:
            if self.run_id and not self.given_run_id:
                self.connection.client().set_terminated(self.run_id, status)

        self._submit(end)
        if self.parent is None:
            self.connection.outbox.close(CLOSE_TIMEOUT_S)
