"""Checkpoints: full state, atomic pointer, sha256 verification, keep-K, refusing the wrong model."""

from __future__ import annotations

import json
import logging
import random
import secrets

import numpy as np
import pytest
import torch

from cifar10_kfp.storage import IntegrityError, join_uri
from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from cifar10_kfp.train.checkpoint import (
    CheckpointManager,
    CheckpointMismatch,
    capture_rng_state,
    checkpoint_name,
    restore_rng_state,
    state_from_bytes,
    state_to_bytes,
)
from cifar10_kfp.train.config import make_config
from cifar10_kfp.train.engine import train


def _state(value: float = 1.0) -> dict:
    return {"model": {"w": torch.full((3,), value)}, "config": {"lr": 0.1}, "rng": capture_rng_state()}


def test_rng_state_round_trips_through_weights_only_load():
    state = capture_rng_state()
    loaded = state_from_bytes(state_to_bytes({"rng": state}))["rng"]
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(5), np.random.rand(5), random.random()  # move every generator on
    restore_rng_state(loaded)
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1]) and random.random() == expected[2]


def test_weights_only_refuses_pickled_code():
    import io

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(IntegrityError, match="not a loadable checkpoint"):
        buffer = io.BytesIO()
        torch.save({"model": Evil()}, buffer)
        state_from_bytes(buffer.getvalue())


def test_save_moves_pointer_and_keeps_last_k(tmp_path):
    manager = CheckpointManager(str(tmp_path / "ck"), keep=2)
    assert manager.load_latest() is None
    for epoch in (1, 2, 3):
        manager.save(_state(epoch), epoch=epoch, step=10 * epoch)
    assert manager.list_checkpoints() == ["ckpt-epoch00002.pt", "ckpt-epoch00003.pt"]
    pointer = json.loads((tmp_path / "ck" / "latest.json").read_text())
    assert pointer["key"] == "ckpt-epoch00003.pt" and len(pointer["sha256"]) == 64
    state = manager.load_latest()
    assert (
        state["epoch"] == 3
        and state["step"] == 30
        and torch.equal(state["model"]["w"], torch.full((3,), 3.0))
    )


def test_flipped_byte_is_refused_locally(tmp_path):
    manager = CheckpointManager(str(tmp_path / "ck"))
    manager.save(_state(), epoch=1, step=1)
    path = tmp_path / "ck" / "ckpt-epoch00001.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="corrupt: sha256"):
        manager.load_latest()


def test_flipped_byte_is_refused_in_the_object_store(store_env):
    store_env.ensure_bucket()
    uri = store_env.root_uri("checkpoints", "run-x", "abc")
    manager = CheckpointManager(uri, store=store_env)
    manager.save(_state(), epoch=1, step=1)
    assert manager.load_latest()["epoch"] == 1
    key = join_uri(uri, "ckpt-epoch00001.pt")
    data = bytearray(store_env.get_bytes(key))
    data[100] ^= 0xFF
    store_env.put_bytes(bytes(data), key)  # rewritten with a fresh object checksum: only the pointer knows
    with pytest.raises(IntegrityError, match="refusing to resume"):
        manager.load_latest()


def test_malformed_pointer_is_refused(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "latest.json").write_text('{"key": "../../etc/passwd", "sha256": "00"}')
    with pytest.raises(IntegrityError, match="malformed"):
        CheckpointManager(str(tmp_path / "ck")).load_latest()


def test_resume_refuses_a_checkpoint_of_another_architecture(tiny_dataset_path, tmp_path):
    ckpt = str(tmp_path / "ck")
    train(make_config("seed", {"epochs": 1}), tiny_dataset_path, tmp_path / "a", checkpoint_uri=ckpt)
    other = make_config("cpu", {"epochs": 1, "widths": "4,8,8", "whiten_samples": 64})
    with pytest.raises(
        CheckpointMismatch, match="architecture: checkpoint 'simple_cnn' vs this run 'fast_resnet'"
    ):
        train(other, tiny_dataset_path, tmp_path / "b", checkpoint_uri=ckpt)
    wider = make_config("cpu", {"epochs": 1, "widths": "4,8,16", "whiten_samples": 64})
    train(other, tiny_dataset_path, tmp_path / "c", checkpoint_uri=str(tmp_path / "ck2"))
    with pytest.raises(CheckpointMismatch, match="model_config"):
        train(wider, tiny_dataset_path, tmp_path / "d", checkpoint_uri=str(tmp_path / "ck2"))


def test_finished_run_resumes_to_the_same_result_without_training(tiny_dataset_path, tmp_path):
    ckpt = str(tmp_path / "ck")
    config = make_config("seed", {"epochs": 2})
    first = train(config, tiny_dataset_path, tmp_path / "a", checkpoint_uri=ckpt)
    again = train(config, tiny_dataset_path, tmp_path / "b", checkpoint_uri=ckpt)
    assert again.metrics["resumed_from_epoch"] == 2 and again.history == first.history
    assert (tmp_path / "a" / "model" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model" / "model.safetensors"
    ).read_bytes()


def test_checkpoint_holds_the_full_state(tiny_dataset_path, tmp_path):
    ckpt = str(tmp_path / "ck")
    config = make_config("cpu", {"epochs": 1, "widths": "4,8,8", "whiten_samples": 64, "batch_size": 64})
    train(config, tiny_dataset_path, tmp_path / "a", checkpoint_uri=ckpt)
    state = CheckpointManager(ckpt).load_latest()
    assert {
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "ema",
        "rng",
        "data_order",
        "config",
        "epoch",
        "step",
    } <= set(state)
    assert state["config"]["architecture"] == "fast_resnet" and state["epoch"] == 1 and state["step"] == 4
    assert set(state["rng"]) == {"torch", "cuda", "numpy", "python"}
    assert state["optimizer"]["state"], "momentum buffers are saved"
    assert state["ema"] is not None and state["model_identity"]["model_config"]["widths"] == [4, 8, 8]


class _StoreWithAWriteOnlyUser(EmbeddedObjectStore):
    """A real embedded S3 server with a second identity that may read and write objects but not list."""

    limited_access_key = "AKNOLIST" + secrets.token_hex(6).upper()
    limited_secret_key = secrets.token_urlsafe(30)

    def _identities(self) -> dict:
        identities = super()._identities()
        identities["identities"].append(
            {
                "name": "no-listing",
                "credentials": [{"accessKey": self.limited_access_key, "secretKey": self.limited_secret_key}],
                "actions": ["Read", "Write"],
            }
        )
        return identities


@pytest.mark.slow
def test_failed_pruning_is_logged_and_the_next_save_prunes(tmp_path, caplog):
    with _StoreWithAWriteOnlyUser(tmp_path / "s3") as server:
        uri = f"s3://{server.bucket}/prune-test/ck"
        limited = server.store(
            MINIO_ACCESS_KEY=server.limited_access_key,
            MINIO_SECRET_KEY=server.limited_secret_key,
            CIFAR10_KFP_RETRY_BUDGET_S=5,
        )
        manager = CheckpointManager(uri, keep=1, store=limited)
        with caplog.at_level(logging.WARNING, logger="cifar10_kfp.train.checkpoint"):
            for epoch in (1, 2):
                assert manager.save(_state(epoch), epoch=epoch, step=epoch) == join_uri(
                    uri, checkpoint_name(epoch)
                )
        warnings = [r.getMessage() for r in caplog.records if "could not prune" in r.getMessage()]
        assert len(warnings) == 2, caplog.text
        # A user that may write but not list gets AccessDenied (its keys were accepted), not a credentials error.
        assert uri in warnings[-1] and "AccessDeniedError" in warnings[-1] and server.endpoint in warnings[-1]
        assert server.limited_secret_key not in caplog.text and server.secret_key not in caplog.text
        # Nothing was lost: the newest checkpoint is in force and the old one was left in place.
        state = manager.load_latest()
        assert state["epoch"] == 2 and torch.equal(state["model"]["w"], torch.full((3,), 2.0))
        assert limited.exists(join_uri(uri, checkpoint_name(1)))

        # Once listing works again, the next save prunes everything beyond the newest ``keep``.
        full = CheckpointManager(uri, keep=1, store=server.store(CIFAR10_KFP_RETRY_BUDGET_S=5))
        full.save(_state(3), epoch=3, step=3)
        assert full.list_checkpoints() == [checkpoint_name(3)]
