"""TrainJob progress to a real HTTPS status server (``tests.support.status_server``: TLS with a certificate
made for the test, the bearer token checked, the body checked as Trainer v2.3.0's API checks it)."""

from __future__ import annotations

import logging

import pytest

from cifar10_kfp.tracking import open_tracker
from cifar10_kfp.tracking.trainer_status import TrainerStatusSink
from tests.support.status_server import StatusServer


@pytest.fixture
def status_server(tmp_path):
    with StatusServer(tmp_path / "status") as server:
        yield server


def _statuses(server: StatusServer) -> list[dict]:
    return [body["trainerStatus"] for body in server.received]


def _metrics(status: dict) -> dict[str, str]:
    return {m["name"]: m["value"] for m in status.get("metrics", [])}


def test_every_update_reaches_the_server_when_the_interval_is_zero(status_server):
    sink = TrainerStatusSink({**status_server.env(), "CIFAR10_KFP_PROGRESS_INTERVAL_S": "0"})
    sink.progress(0.25)
    sink.update_metrics({"epoch": 1, "val_acc": 0.5})
    sink.progress(0.5, eta_s=30.4)
    sink.close()
    assert status_server.refused == []
    first, second, last = _statuses(status_server)
    assert first["progressPercentage"] == 25 and "estimatedRemainingSeconds" not in first
    assert (second["progressPercentage"], second["estimatedRemainingSeconds"]) == (50, 30)
    assert _metrics(second) == {"epoch": "1", "val_acc": "0.5"}
    assert (last["progressPercentage"], last["estimatedRemainingSeconds"]) == (100, 0)
    assert _metrics(last) == {"epoch": "1", "val_acc": "0.5"}


def test_updates_are_throttled_but_the_final_100_percent_is_always_sent(status_server):
    sink = TrainerStatusSink({**status_server.env(), "CIFAR10_KFP_PROGRESS_INTERVAL_S": "3600"})
    for step in range(1, 50):
        sink.progress(step / 50)
    sink.close()
    assert [s["progressPercentage"] for s in _statuses(status_server)] == [2, 100]


def test_a_failed_run_sends_its_last_progress_not_100(status_server):
    sink = TrainerStatusSink({**status_server.env(), "CIFAR10_KFP_PROGRESS_INTERVAL_S": "3600"})
    sink.progress(0.1)
    sink.progress(0.3)
    sink.close("FAILED")
    assert [s["progressPercentage"] for s in _statuses(status_server)] == [10, 30]


def test_a_refused_token_is_one_warning_without_the_token_and_later_updates_are_still_tried(
    status_server, tmp_path, caplog
):
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token-xyz")
    env = {
        **status_server.env(),
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(wrong),
        "CIFAR10_KFP_PROGRESS_INTERVAL_S": "0",
    }
    with caplog.at_level(logging.WARNING, logger="cifar10_kfp.tracking"):
        sink = TrainerStatusSink(env)
        sink.progress(0.5)
        sink.close()
    assert [code for code, _ in status_server.refused] == [403, 403]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"HTTP 403 from {status_server.url}: Forbidden" in warning
    assert "not-the-token-xyz" not in caplog.text


def test_a_wrong_ca_file_is_named_in_the_warning(status_server, tmp_path, caplog):
    other = StatusServer(tmp_path / "other")  # another self-signed CA: it does not sign this server
    env = {**status_server.env(), "KUBEFLOW_TRAINER_SERVER_CA_CERT": str(other.ca_file)}
    with caplog.at_level(logging.WARNING, logger="cifar10_kfp.tracking"):
        sink = TrainerStatusSink(env)
        sink.close()
    other.httpd.server_close()
    assert status_server.received == []
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "CERTIFICATE_VERIFY_FAILED" in warning


@pytest.mark.slow
def test_training_reports_rising_progress_to_100_and_its_metrics(
    status_server, tiny_dataset_path, tmp_path, monkeypatch
):
    from cifar10_kfp.train import make_config, train

    for name, value in {**status_server.env(), "CIFAR10_KFP_PROGRESS_INTERVAL_S": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = train(make_config("cpu", {"epochs": 3, "progress": False}), tiny_dataset_path, tmp_path / "out")
    assert status_server.refused == []
    statuses = _statuses(status_server)
    percents = [s["progressPercentage"] for s in statuses]
    assert percents == sorted(percents) and percents[-1] == 100 and len(set(percents)) >= 3
    last = statuses[-1]
    assert last["estimatedRemainingSeconds"] == 0
    final_row = result.history[-1]
    assert _metrics(last)["epoch"] == "3"
    assert float(_metrics(last)["val_acc"]) == pytest.approx(final_row["val_acc"], rel=1e-5)
    assert set(_metrics(last)) == {
        "epoch",
        "train_loss",
        "train_acc",
        "val_loss",
        "val_acc",
        "lr",
        "images_per_s",
    }


def test_open_tracker_reports_status_only_for_training(status_server, monkeypatch):
    for name, value in status_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert not open_tracker("evaluate").enabled
    tracker = open_tracker("train", progress=True)
    assert tracker.enabled
    tracker.close()
    assert _statuses(status_server)[-1]["progressPercentage"] == 100
