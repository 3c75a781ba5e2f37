"""Progress of a TrainJob in its ``.status.trainerStatus`` (Kubeflow Trainer KEP-2779, gate ``TrainJobStatus``).

With the gate on, Trainer (v2.2+) gives each node's containers ``KUBEFLOW_TRAINER_SERVER_URL`` (the
status endpoint of this TrainJob on the controller's status server, HTTPS), ``KUBEFLOW_TRAINER_SERVER_CA_CERT``
(the CA file that signs it) and ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (the file of a projected service-account
token, which the kubelet rotates: it is read again for every request). Rank 0 POSTs::

    {"trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 95,
                       "metrics": [{"name": "val_acc", "value": "0.6123"}],
                       "lastUpdatedTime": "2026-12-07T14:00:00Z"}}

with ``Authorization: Bearer <token>``, as the Kubeflow SDK's ``update_trainjob_status`` does
(Trainer's ``pkg/statusserver``: percentage and seconds are int32, metric names and values strings of at
most 64 characters, at most 256 metrics). Updates are sent at most every ``CIFAR10_KFP_PROGRESS_INTERVAL_S``
seconds (5 by default, like the SDK's throttle); unlike the SDK, the final update (100%) is always sent.
Nothing here can fail training: a refused update is one warning line, and later updates are still tried.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from cifar10_kfp.progress import interval_s
from cifar10_kfp.tracking.outbox import Outbox

URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
CA_CERT_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
REQUEST_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 10.0
MAX_METRICS = 256
MAX_TEXT = 64  # Trainer's limit on a metric's name and value


def status_body(
    percent: float, eta_s: float | None, metrics: Mapping[str, object], now: datetime | None = None
) -> dict:
    """The request body: ``percent`` clamped to 0..100 and ``eta_s`` to >= 0, both whole; metrics as text."""
    status: dict = {
        "progressPercentage": max(0, min(100, int(percent))),
        "lastUpdatedTime": (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if eta_s is not None:
        status["estimatedRemainingSeconds"] = max(0, int(round(eta_s)))
    items = [
        {
            "name": str(name)[:MAX_TEXT],
            "value": (f"{value:.6g}" if isinstance(value, float) else str(value))[:MAX_TEXT],
        }
        for name, value in metrics.items()
    ]
    if items:
        status["metrics"] = items[:MAX_METRICS]
    return {"trainerStatus": status}


def post_status(
    url: str, ca_file: str, token_file: str, body: dict, timeout_s: float = REQUEST_TIMEOUT_S
) -> None:
    """POST ``body`` to the status server; raises ``RuntimeError`` naming what went wrong (never the token)."""
    if not url.startswith("https://"):
        raise RuntimeError(f"{URL_ENV}={url!r} is not an https:// URL")
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        raise RuntimeError(f"cannot read the token file {TOKEN_ENV}={token_file!r}: {exc.strerror}") from None
    try:
        context = ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise RuntimeError(f"cannot load the CA file {CA_CERT_ENV}={ca_file!r}: {exc}") from None
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read(500).decode("utf-8", "replace")
        try:
            detail = json.loads(detail).get("message", detail)
        except (ValueError, AttributeError):
            pass
        raise RuntimeError(f"HTTP {exc.code} from {url}: {detail}") from None


class TrainerStatusSink:
    """Progress, ETA and the latest metrics to a TrainJob's status, throttled; the last one always sent.

    Args:
        env: The environment (``KUBEFLOW_TRAINER_SERVER_URL`` must be set in it).
    """

    def __init__(self, env: Mapping[str, str]):
        self.url = env[URL_ENV].strip()
        self.ca_file = env.get(CA_CERT_ENV, "").strip()
        self.token_file = env.get(TOKEN_ENV, "").strip()
        self.interval = interval_s(env)
        self.outbox = Outbox(f"TrainJob status updates to {self.url}", stop_on_error=False)
        self.metrics: dict[str, object] = {}
        self.percent: float = 0.0
        self.eta_s: float | None = None
        self._last_sent = float("-inf")
        self._pending = False
        self._started: tuple[float, float] | None = None  # (monotonic time, fraction) of the first update

    def progress(self, fraction: float, eta_s: float | None = None) -> None:
        """Training is ``fraction`` (0..1) done; ``eta_s`` defaults to the rate since the first update."""
        now = time.monotonic()
        if self._started is None:
            self._started = (now, fraction)
        if eta_s is None:
            t0, f0 = self._started
            eta_s = (now - t0) * (1 - fraction) / (fraction - f0) if fraction > f0 else None
        self.percent, self.eta_s = 100 * fraction, eta_s
        self._pending = True
        if now - self._last_sent >= self.interval:
            self._send(now)

    def update_metrics(self, metrics: Mapping[str, object]) -> None:
        """Replace the metrics that the next update carries."""
        self.metrics = dict(metrics)
        self._pending = True

    def close(self, status: str = "FINISHED") -> None:
        """Send the last update (100% with ETA 0 when ``status`` is FINISHED) and wait a bounded time for it."""
        if status == "FINISHED":
            self.percent, self.eta_s, self._pending = 100.0, 0.0, True
        if self._pending:
            self._send(time.monotonic())
        self.outbox.close(CLOSE_TIMEOUT_S)

    def _send(self, now: float) -> None:
        body = status_body(self.percent, self.eta_s, self.metrics)
        self._last_sent, self._pending = now, False
        self.outbox.submit(lambda: post_status(self.url, self.ca_file, self.token_file, body))
