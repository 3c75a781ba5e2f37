"""The embedded SeaweedFS server: ready before first use, quietly."""

from __future__ import annotations

import logging

from cifar10_kfp.storage.embedded import EmbeddedObjectStore


def test_a_healthy_start_is_ready_at_once_and_logs_no_warning(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG), EmbeddedObjectStore(tmp_path / "s3") as server:
        store = server.store(CIFAR10_KFP_RETRY_BUDGET_S=0)  # no retry: the first request must succeed
        store.put_bytes(b"first", "s3://mlpipeline/first-use")
        assert store.get_bytes("s3://mlpipeline/first-use") == b"first"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [], warnings
