"""Two DDP processes on CPU (real gloo through torchrun) train like one process at the same global batch."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from cifar10_kfp.config import make_config
from cifar10_kfp.engine import train


@pytest.mark.slow
def test_two_process_gloo_run_matches_single_process(tiny_dataset_path, tmp_path):
    # simple_cnn has no BatchNorm, so the only differences are float summation orders: the two runs must
    # agree closely, not just "both learn". Same global batch (64): 32 per rank.
    config = make_config("seed", {"epochs": 2, "batch_size": 64, "lr": 0.05, "threads": 1})
    single = train(config, tiny_dataset_path, tmp_path / "one")
    double = train(config, tiny_dataset_path, tmp_path / "two", nproc=2, checkpoint_uri=str(tmp_path / "ck"))

    assert double.metrics["world_size"] == 2 and single.metrics["world_size"] == 1
    assert double.metrics["steps"] == single.metrics["steps"] == 2 * (256 // 64)
    assert double.history[-1]["train_loss"] < double.history[0]["train_loss"]
    assert double.history[-1]["train_loss"] == pytest.approx(single.history[-1]["train_loss"], rel=1e-3)
    assert double.metrics["val_acc"] == pytest.approx(single.metrics["val_acc"], abs=0.05)
    one = load_file(str(single.model_dir / "model.safetensors"))
    two = load_file(str(double.model_dir / "model.safetensors"))
    for name in one:
        assert torch.allclose(one[name], two[name], rtol=1e-3, atol=1e-4), name
    # only rank 0 wrote outputs and checkpoints, once per epoch
    assert json.loads((tmp_path / "ck" / "latest.json").read_text())["epoch"] == 2
    assert sorted(p.name for p in (tmp_path / "ck").glob("*.pt")) == [
        "ckpt-epoch00001.pt",
        "ckpt-epoch00002.pt",
    ]
