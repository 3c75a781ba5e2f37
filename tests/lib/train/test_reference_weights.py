"""The same seed gives the weights and per-epoch trajectory the code made before the #15 redesign.

``tests/support/reference/`` holds the final (EMA) weights and the per-epoch losses and accuracies
of ``REFERENCE_OVERRIDES`` on the tiny dataset, on CPU. The code of commit 0b381bb (before the
parameter, engine and evaluation redesign) made the same weights bit for bit on the same kernels.
Any change that alters what training computes (data order, augmentation, initialisation,
optimiser, schedule, EMA) fails here, on any x86-64 CPU: the comparison's tolerances
(``tests/support/reference_training.py``, with the measurements behind them) absorb the rounding
of the CPU's kernel paths and nothing more. Regenerate only for a deliberate change of the
training semantics, and say so in the commit:
``.venv/bin/python -m tests.support.reference_training --write``.
"""

from __future__ import annotations

import pytest

import cifar10_kfp.train.augment as augment
from tests.support.reference_training import differences, load_reference, train_reference


@pytest.mark.slow
def test_same_seed_gives_the_weights_made_before_the_redesign(tmp_path):
    weights, history = train_reference(tmp_path)
    problems = differences(weights, history, *load_reference())
    assert not problems, "training semantics changed:\n" + "\n".join(problems)


def _other_augmentation_stream(monkeypatch):
    original = augment.epoch_generator
    monkeypatch.setattr(augment, "epoch_generator", lambda seed, epoch: original(seed + 1, epoch))
    return {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda monkeypatch: {"ema_start_epoch": 2}, id="ema-one-epoch-later"),
        pytest.param(_other_augmentation_stream, id="other-augmentation-stream"),
        pytest.param(lambda monkeypatch: {"lr": 0.404}, id="lr-one-percent-higher"),
    ],
)
def test_the_comparison_rejects_a_change_of_training_semantics(tmp_path, monkeypatch, change):
    weights, history = train_reference(tmp_path, **change(monkeypatch))
    assert differences(weights, history, *load_reference()), "the comparison accepted changed semantics"
