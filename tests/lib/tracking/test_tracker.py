"""The tracker's pieces that need no server: the no-variable path, the outbox's one warning, payload rules."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from datetime import datetime, timezone

from cifar10_kfp.tracking.mlflow_sink import display_uri
from cifar10_kfp.tracking.outbox import Outbox, one_line
from cifar10_kfp.tracking.tracker import numeric
from cifar10_kfp.tracking.trainer_status import status_body
from tests.support.cli import user_env
from tests.support.status_server import body_problem


def test_without_variables_the_tracker_does_nothing_and_imports_nothing():
    code = (
        "import sys, threading\n"
        "from cifar10_kfp.tracking import open_tracker\n"
        "t = open_tracker('train', progress=True)\n"
        "t.start({'lr': 0.1}); t.epoch({'epoch': 1, 'val_acc': 0.5}, 2); t.step(1, 2); t.final({'val_acc': 0.5})\n"
        "t.trial('trial-0', {}).close(); t.close()\n"
        "print(t.enabled, sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'urllib3', 'ssl')),"
        " threading.active_count())\n"
    )
    env = {k: v for k, v in user_env().items() if not k.startswith(("MLFLOW_", "KUBEFLOW_TRAINER_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "[]", "1"]
    assert out.stderr == ""


def test_numeric_keeps_finite_numbers_only():
    values = {"a": 1, "b": 0.5, "c": True, "d": "x", "e": float("nan"), "f": float("inf"), "g": None}
    assert numeric(values) == {"a": 1.0, "b": 0.5}


def test_display_uri_drops_user_and_password():
    assert (
        display_uri("https://alice:s3cret@mlflow.example.com:8443/mlflow")
        == "https://mlflow.example.com:8443/mlflow"
    )
    assert display_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_one_line_masks_secrets_and_stays_short():
    text = one_line(RuntimeError("token abc123 refused\nsecond line"), secrets=("abc123", ""))
    assert text == "RuntimeError: token *** refused second line"
    assert len(one_line(ValueError("x" * 1000))) == 300


def test_status_body_is_what_trainer_accepts():
    now = datetime(2026, 12, 7, 14, 0, 0, tzinfo=timezone.utc)
    body = status_body(140.7, -3.2, {"val_acc": 0.61234567, "epoch": 3, "long": "v" * 100}, now=now)
    assert body == {
        "trainerStatus": {
            "progressPercentage": 100,
            "estimatedRemainingSeconds": 0,
            "lastUpdatedTime": "2026-12-07T14:00:00Z",
            "metrics": [
                {"name": "val_acc", "value": "0.612346"},
                {"name": "epoch", "value": "3"},
                {"name": "long", "value": "v" * 64},
            ],
        }
    }
    assert body_problem(body) == ""
    assert "estimatedRemainingSeconds" not in status_body(50, None, {})["trainerStatus"]
    assert body_problem(status_body(37.9, 12.6, {})) == ""


def test_outbox_warns_once_and_stops_after_the_first_failure(caplog):
    sent: list[int] = []

    def fail() -> None:
        raise ConnectionRefusedError("connection refused by 127.0.0.1:9, token=tok-123")

    outbox = Outbox("MLflow tracking at http://127.0.0.1:9", stop_on_error=True, secrets=("tok-123",))
    with caplog.at_level(logging.WARNING, logger="cifar10_kfp.tracking"):
        outbox.submit(lambda: sent.append(1))
        outbox.submit(fail)
        outbox.submit(fail)
        outbox.submit(lambda: sent.append(2))
        assert outbox.close(timeout_s=30)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "MLflow tracking at http://127.0.0.1:9 failed" in warnings[0] and "training goes on" in warnings[0]
    assert "tok-123" not in warnings[0]
    assert sent == [1]


def test_outbox_that_keeps_going_still_sends_after_a_failure(caplog):
    sent: list[int] = []
    outbox = Outbox("status", stop_on_error=False)
    with caplog.at_level(logging.WARNING, logger="cifar10_kfp.tracking"):
        for n in range(4):
            outbox.submit(lambda n=n: sent.append(n) if n in (0, 3) else 1 / 0)
        assert outbox.close(timeout_s=30)
    assert sent == [0, 3]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_outbox_close_waits_a_bounded_time_for_a_hanging_call(caplog):
    release = threading.Event()
    outbox = Outbox("MLflow tracking at http://hanging", stop_on_error=True)
    outbox.submit(lambda: release.wait(60))
    with caplog.at_level(logging.WARNING, logger="cifar10_kfp.tracking"):
        assert outbox.close(timeout_s=0.2) is False
    release.set()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "did not answer within 0.2 s" in warning
