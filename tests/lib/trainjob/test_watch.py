"""The launcher's line for a TrainJob's ``.status.trainerStatus`` (the watch itself runs in tests/cluster)."""

from __future__ import annotations

from datetime import datetime, timezone

from cifar10_kfp.tracking.trainer_status import status_body
from cifar10_kfp.trainjob.watch import trainer_status_line


def test_what_rank_0_posts_is_one_line_in_the_launchers_log():
    # Trainer's status server stores the posted trainerStatus as is (pkg/statusserver toApplyConfig)
    body = status_body(40.2, 95.4, {"epoch": 4, "train_loss": 0.81234, "val_acc": 0.6123},
                       now=datetime(2026, 12, 7, tzinfo=timezone.utc))  # fmt: skip
    trainjob = {"metadata": {"name": "job"}, "status": {"conditions": [], **body}}
    assert trainer_status_line(trainjob) == "40% eta 95s epoch=4 train_loss=0.81234 val_acc=0.6123"


def test_no_trainer_status_is_no_line():
    assert trainer_status_line({"status": {"conditions": []}}) == ""
    assert trainer_status_line({}) == ""
    assert (
        trainer_status_line({"status": {"trainerStatus": {"lastUpdatedTime": "2026-12-07T00:00:00Z"}}}) == ""
    )
