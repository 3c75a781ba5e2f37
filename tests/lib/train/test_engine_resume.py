"""Kill -9 in the middle of training, run the same command again: it resumes and ends bitwise equal."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cifar10_kfp.data.format import save_prepared
from tests.support.data import make_tiny_dataset
from tests.support.paths import ROOT

EPOCHS = 5


def _command(data: Path, out: Path, ckpt: str) -> list[str]:
    return [
        sys.executable, "-m", "cifar10_kfp_pipelines.cli", "train", "--data", str(data), "--preset", "cpu",
        "--epochs", str(EPOCHS), "--batch-size", "32", "--checkpoint-uri", ckpt, "--output-dir", str(out),
        "--set", "widths=8,8,16", "--set", "whiten_samples=64", "--set", "checkpoint_every=1",
        "--set", "keep_checkpoints=2", "--set", "threads=1",
    ]  # fmt: skip


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _pointer_epoch(ckpt: Path) -> int:
    try:
        return json.loads((ckpt / "latest.json").read_text())["epoch"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


@pytest.mark.slow
def test_kill_9_then_rerun_resumes_and_matches_an_uninterrupted_run(tmp_path):
    data = save_prepared(make_tiny_dataset(n_train=256, n_val=64, image_size=16), tmp_path / "d.safetensors")

    reference = subprocess.run(
        _command(data, tmp_path / "ref", str(tmp_path / "ref-ck")), env=_env(), cwd=ROOT, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-2000:]

    ckpt = tmp_path / "ck"
    victim = subprocess.Popen(
        _command(data, tmp_path / "run", str(ckpt)), env=_env(), cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while _pointer_epoch(ckpt) < 2 and victim.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        victim.send_signal(signal.SIGKILL)
    finally:
        victim.wait(timeout=30)
    killed_at = _pointer_epoch(ckpt)
    assert victim.returncode == -signal.SIGKILL
    assert 2 <= killed_at < EPOCHS, f"the run was not interrupted mid-training (pointer at epoch {killed_at})"
    assert not (tmp_path / "run" / "metrics.json").exists()

    resumed = subprocess.run(
        _command(data, tmp_path / "run", str(ckpt)), env=_env(), cwd=ROOT, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] >= killed_at

    expected = load_file(str(tmp_path / "ref" / "model" / "model.safetensors"))
    actual = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    assert expected.keys() == actual.keys()
    different = [k for k in expected if not torch.equal(expected[k], actual[k])]
    assert not different, f"weights differ after resume: {different}"
    ref_history = json.loads((tmp_path / "ref" / "history.json").read_text())
    run_history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [r["val_acc"] for r in ref_history] == [r["val_acc"] for r in run_history]
    assert [r["train_loss"] for r in ref_history] == [r["train_loss"] for r in run_history]
    assert sorted(p.name for p in ckpt.iterdir() if p.suffix == ".pt") == [
        f"ckpt-epoch{EPOCHS - 1:05d}.pt", f"ckpt-epoch{EPOCHS:05d}.pt",
    ]  # fmt: skip


@pytest.mark.slow
def test_resume_from_a_mid_epoch_checkpoint_is_bitwise_exact(tmp_path):
    """A checkpoint written inside an epoch (every N steps) resumes exactly: same weights and history.

    The uninterrupted run keeps all its checkpoints; then the pointer is moved back to one written in
    the middle of epoch 2, the outputs are removed, and the same run again resumes from there.
    """
    from cifar10_kfp.train.checkpoint import CheckpointManager
    from cifar10_kfp.train.config import make_config
    from cifar10_kfp.train.engine import train

    data = save_prepared(make_tiny_dataset(n_train=256, n_val=64, image_size=16), tmp_path / "d.safetensors")
    # cpu preset: EMA, flip + translate, linear schedule; 256 / 32 = 8 steps per epoch, a checkpoint every 3
    config = make_config("cpu", {"epochs": 3, "batch_size": 32, "widths": "8,8,16", "whiten_samples": 64,
                                 "threads": 1, "checkpoint_every_steps": 3, "keep_checkpoints": 100})  # fmt: skip
    ckpt = tmp_path / "ck"
    reference = train(config, data, tmp_path / "ref", checkpoint_uri=str(ckpt))
    manager = CheckpointManager(str(ckpt), keep=100)
    names = manager.list_checkpoints()
    assert "ckpt-epoch00001-step00000012.pt" in names and "ckpt-epoch00001.pt" in names
    assert names.index("ckpt-epoch00001.pt") < names.index("ckpt-epoch00001-step00000012.pt")

    mid = manager.store.get_bytes(str(ckpt / "ckpt-epoch00001-step00000012.pt"))
    pointer = {"key": "ckpt-epoch00001-step00000012.pt", "sha256": hashlib.sha256(mid).hexdigest(), "epoch": 1,
               "step": 12, "size": len(mid)}  # fmt: skip
    (ckpt / "latest.json").write_text(json.dumps(pointer))
    resumed = train(config, data, tmp_path / "run", checkpoint_uri=str(ckpt))

    assert (
        resumed.metrics["resumed_from_epoch"] == 1 and resumed.metrics["steps"] == reference.metrics["steps"]
    )
    for key in ("train_loss", "train_acc", "val_loss", "val_acc", "lr", "step"):
        assert [r[key] for r in resumed.history] == [r[key] for r in reference.history], key
    expected = load_file(str(tmp_path / "ref" / "model" / "model.safetensors"))
    actual = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    assert [k for k in expected if not torch.equal(expected[k], actual[k])] == []
