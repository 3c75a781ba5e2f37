"""The same seed gives bitwise-identical weights to those the code made before the #15 redesign.

``tests/support/reference/cpu_tiny_seed3.safetensors`` holds the final (EMA) weights that the
training engine wrote for ``REFERENCE_OVERRIDES`` on the tiny dataset, on CPU, at commit 0b381bb
(before the parameter, engine and evaluation redesign). Any change that alters what training
computes (data order, augmentation, initialisation, optimiser, schedule, EMA) fails here.
Regenerate only for a deliberate change of the training semantics, and say so in the commit.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from cifar10_kfp.data.format import save_prepared
from cifar10_kfp.train.config import make_config
from cifar10_kfp.train.engine import train
from tests.support.data import make_tiny_dataset
from tests.support.paths import ROOT

REFERENCE = ROOT / "tests" / "support" / "reference" / "cpu_tiny_seed3.safetensors"
# cpu preset: fast_resnet with whitening, label smoothing, EMA, flip + translate, linear warm-up/decay.
REFERENCE_OVERRIDES = {
    "epochs": 2,
    "batch_size": 64,
    "widths": "8,16,16",
    "whiten_samples": 64,
    "ema_start_epoch": 1,
    "seed": 3,
    "threads": 1,
}


def train_reference(tmp_path):
    data = save_prepared(make_tiny_dataset(), tmp_path / "data" / "dataset.safetensors")
    result = train(make_config("cpu", REFERENCE_OVERRIDES), data, tmp_path / "out")
    return load_file(str(result.model_dir / "model.safetensors"))


@pytest.mark.slow
def test_same_seed_gives_the_weights_made_before_the_redesign(tmp_path):
    weights = train_reference(tmp_path)
    reference = load_file(str(REFERENCE))
    assert sorted(weights) == sorted(reference)
    differing = [name for name in reference if not torch.equal(weights[name], reference[name])]
    assert not differing, f"weights differ from the reference in {differing}"
