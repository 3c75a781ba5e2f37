"""The same seed gives the weights and per-epoch trajectory the code made before the #15 redesign.

``tests/support/reference/`` holds the final (EMA) weights and the per-epoch losses, accuracies,
learning rates and step counts of ``REFERENCE_OVERRIDES`` on the tiny dataset, on CPU. The code of
commit 0b381bb (before the parameter, engine and evaluation redesign) made the same weights bit for
bit on the same kernels. Any change that alters what training computes (data order, augmentation,
whitening, initialisation, optimiser, schedule, EMA) fails here, on any x86-64 CPU: the
comparison's tolerances (``tests/support/reference_training.py``, with the measurements behind
them) absorb the rounding of the CPU's kernel paths and nothing more. Regenerate only for a
deliberate change of the training semantics, and say so in the commit:
``.venv/bin/python -m tests.support.reference_training --write``.
"""

from __future__ import annotations

import copy
import math

import pytest

import cifar10_kfp.train.augment as augment
from tests.support.reference_training import (
    TRAINED,
    WEIGHTS_REL_TOLERANCE,
    compare,
    differences,
    fixed_tensor_names,
    load_reference,
    relative_l2,
    train_reference,
)


@pytest.mark.slow
def test_same_seed_gives_the_weights_made_before_the_redesign(tmp_path):
    weights, history = train_reference(tmp_path)
    problems = differences(weights, history, *load_reference())
    assert not problems, "training semantics changed:\n" + "\n".join(problems)


def _other_augmentation_stream(monkeypatch):
    original = augment.epoch_generator
    monkeypatch.setattr(augment, "epoch_generator", lambda seed, epoch: original(seed + 1, epoch))
    return {}


# Each change, the checks it must fail, and the margin: the distance must exceed margin x tolerance
# (0: any difference, for the exact checks). The ratios measured on an AMD EPYC are in brackets
# (the table in tests/support/reference_training.py); every margin leaves 2x or more of slack
# below them, and every tolerance has a check here that fails once it is loosened by 2.5x
# (trained weights), 2.2x (losses), 3.8x (accuracies in images) or 78x (the whitening stem).
REJECTIONS = [
    pytest.param(
        lambda monkeypatch: {"lr": 0.404},
        {TRAINED: 2, "epoch 2 train_loss": 4, "epoch 1 lr": 0, "epoch 2 lr": 0},  # [4.9, 8.6, exact]
        id="lr-one-percent-higher",
    ),
    pytest.param(
        _other_augmentation_stream,
        {TRAINED: 20, "epoch 2 train_loss": 20, "epoch 2 train_acc images": 5},  # [56, 43, 19]
        id="other-augmentation-stream",
    ),
    pytest.param(
        lambda monkeypatch: {"ema_start_epoch": 2},
        {TRAINED: 200, "epoch 2 val_loss": 1000, "epoch 2 val_acc images": 4},  # [545, 2285, 16]
        id="ema-one-epoch-later",
    ),
    pytest.param(
        lambda monkeypatch: {"whiten_samples": 63},
        {"whiten.weight": 100, TRAINED: 10, "epoch 2 train_loss": 3},  # [7800, 25, 6.4]
        id="whitening-from-one-sample-fewer",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("change, margins", REJECTIONS)
def test_the_comparison_rejects_a_change_of_training_semantics(tmp_path, monkeypatch, change, margins):
    weights, history = train_reference(tmp_path, **change(monkeypatch))
    checks = {check.name: check for check in compare(weights, history, *load_reference())}
    for name, margin in margins.items():
        assert name in checks, f"the comparison does not compare {name}"
        check = checks[name]
        assert check.distance > margin * check.tolerance, (
            f"{name} is {check.distance:.3g} from the reference, not more than {margin} x its "
            f"tolerance {check.tolerance:.3g}: the comparison would accept a change of training semantics"
        )


def test_the_frozen_tensors_are_the_whitening_stem_and_the_batchnorm_scales():
    reference, _ = load_reference()
    fixed = fixed_tensor_names()
    assert fixed == {"whiten.weight"} | {f"stages.{i}.norm{j}.weight" for i in range(3) for j in (1, 2)}
    assert all(reference[name].eq(1).all() for name in fixed - {"whiten.weight"})


def test_a_change_of_the_trained_tensors_is_not_diluted_by_the_frozen_ones():
    reference, ref_history = load_reference()
    fixed = fixed_tensor_names()
    weights = {n: t if n in fixed or not t.is_floating_point() else t * 1.002 for n, t in reference.items()}
    floats = [n for n in reference if reference[n].is_floating_point()]
    # relative to all the weights, as the comparison once measured, the change is within tolerance
    assert relative_l2(floats, weights, reference) < WEIGHTS_REL_TOLERANCE
    assert [c.name for c in compare(weights, ref_history, reference, ref_history) if c.failed] == [TRAINED]


def test_each_frozen_tensor_is_compared_alone():
    reference, ref_history = load_reference()
    weights = {**reference, "stages.2.norm2.weight": reference["stages.2.norm2.weight"] * 1.0001}
    failed = [c.name for c in compare(weights, ref_history, reference, ref_history) if c.failed]
    assert failed == ["stages.2.norm2.weight"]


def test_lr_step_and_batch_counts_are_compared_exactly():
    reference, ref_history = load_reference()
    assert not [c for c in compare(reference, ref_history, reference, ref_history) if c.distance]
    history = copy.deepcopy(ref_history)
    history[0]["lr"] = math.nextafter(history[0]["lr"], 1.0)
    history[1]["step"] += 1
    weights = {
        **reference,
        "stages.0.norm1.num_batches_tracked": reference["stages.0.norm1.num_batches_tracked"] + 1,
    }
    failed = [c.name for c in compare(weights, history, reference, ref_history) if c.failed]
    assert failed == ["stages.0.norm1.num_batches_tracked", "epoch 1 lr", "epoch 2 step"]
