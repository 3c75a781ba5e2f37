"""Replays on synthetic learning-curve tables: the product's objective, sampler and pruner, no training.

Cost accounting, the final-epoch rule, repeated configurations at no cost, the epoch budget, the
end of a discrete space, ties with the target and misses: each asserted on a table built so
that the rule decides the outcome.
"""

from __future__ import annotations

import json
import math

import pytest

from cifar10_kfp.params.space import parse_search_space
from cifar10_kfp.params.validation import validate_pipeline_params
from cifar10_kfp.tune.replay import candidates, config_key, epochs_to_target, replay_study, stop_at_target


def _values(space: dict, epochs: int, **more) -> dict:
    settings = {"preset": "cpu", "trial_epochs": epochs, "search_space": json.dumps(space), "n_trials": 1000,
                "extra_hparams": '{"device": "cpu"}', **more}  # fmt: skip
    return validate_pipeline_params(settings, "tune")


def _table(curves: dict[float, list[float]]) -> dict:
    """lr -> val accuracy per epoch, as history rows (1 s an epoch, 0.5 s fixed cost)."""
    return {
        config_key({"lr": lr}): [
            {"epoch": e, "val_acc": acc, "val_loss": 1.0, "train_s": 1.0, "trial_s": 0.5 + e}
            for e, acc in enumerate(accs, 1)
        ]
        for lr, accs in curves.items()
    }


def _lr_space(lrs) -> dict:
    return {"lr": {"type": "categorical", "choices": list(lrs)}}


def test_a_trial_is_never_pruned_after_its_last_epoch():
    """ASHA (min_resource 1, factor 3) has its second rung at epoch 3, the last. A and B tie at rung 0
    (a tie goes on); were B checked after epoch 3 when A ran first, it would lose to A there."""
    curves = {0.1: [0.60, 0.60, 0.90], 0.2: [0.60, 0.60, 0.55]}
    orders = set()
    for seed in range(6):
        rows = replay_study(_values(_lr_space(curves), 3, sampler="grid", pruner="asha"), _table(curves),
                            sampler_seed=seed)  # fmt: skip
        assert [(r["state"], r["epochs_run"]) for r in rows] == [("COMPLETE", 3)] * 2, rows
        assert sorted(r["value"] for r in rows) == [0.55, 0.90]
        orders.add(rows[0]["params"]["lr"])
    assert orders == {0.1, 0.2}  # A first (where the old rule pruned B at full cost) and B first


def test_asha_stops_the_losers_at_the_first_rung_and_the_cost_counts_their_epochs():
    # six lrs; the first-epoch accuracy orders them as their final does
    curves = {
        lr: [0.1 * i + 0.01 * e for e in range(1, 6)] for i, lr in enumerate((0.05, 0.1, 0.2, 0.4, 0.8, 1.6))
    }
    values = _values(_lr_space(curves), 5, sampler="grid", pruner="asha", reduction_factor=3)
    rows = replay_study(values, _table(curves), sampler_seed=0)
    assert len(rows) == 6 and all(r["same_as"] is None for r in rows)  # every lr once, then the study ended
    for row in rows:
        assert row["epochs_run"] in (1, 3, 5) and (row["state"] == "COMPLETE") == (row["epochs_run"] == 5)
        assert (
            row["fixed_s"] == 0.5 and row["train_s"] == 0.5 + row["epochs_run"]
        )  # seconds beside the epochs
    best = max(accs[-1] for accs in curves.values())
    spent = sum(
        r["epochs_run"] for r in rows[: next(i for i, r in enumerate(rows) if r["value"] == best) + 1]
    )
    assert epochs_to_target(rows, best) == spent < 6 * 5
    assert sum(r["state"] == "PRUNED" for r in rows) >= 2


def test_a_repeated_configuration_takes_the_recorded_result_at_no_cost_and_the_space_ends_the_study():
    curves = {0.1: [0.3, 0.4, 0.5], 0.2: [0.5, 0.6, 0.7], 0.4: [0.2, 0.2, 0.2]}
    values = _values(_lr_space(curves), 3, sampler="random", pruner="asha")
    repeats = 0
    for seed in range(6):
        rows = replay_study(values, _table(curves), sampler_seed=seed)
        by_number = {r["number"]: r for r in rows}
        for row in rows:
            if row["same_as"] is not None:
                repeats += 1
                twin = by_number[row["same_as"]]
                assert row["params"] == twin["params"] and twin["same_as"] is None
                assert (row["state"], row["value"], row["epochs_run"]) == (twin["state"], twin["value"], 0)
        trained = [r for r in rows if r["same_as"] is None]
        assert sorted(r["params"]["lr"] for r in trained) == sorted(curves)  # each trained once...
        assert rows[-1]["same_as"] is None  # ...and the study ended with the last new one
    assert repeats >= 3  # random draws repeat in a 3-configuration space


def test_the_epoch_budget_stops_the_study_once_reached():
    curves = {lr: [0.5, 0.5, 0.5] for lr in (0.1, 0.2, 0.4, 0.8)}
    rows = replay_study(_values(_lr_space(curves), 3, sampler="grid", pruner="none", budget_epochs=7),
                        _table(curves))  # fmt: skip
    assert [r["epochs_run"] for r in rows] == [3, 3, 3]  # 6 < 7 after two trials, 9 >= 7 after three


def test_ties_with_the_target_reach_it_pruned_trials_and_misses_do_not():
    rows = [
        {"number": 0, "state": "PRUNED", "value": 0.9, "epochs_run": 1},  # above the target, but partial
        {"number": 1, "state": "COMPLETE", "value": 0.7329, "epochs_run": 5},
        {"number": 2, "state": "COMPLETE", "value": 0.733, "epochs_run": 5},  # == target: reached
        {"number": 3, "state": "COMPLETE", "value": 0.9, "epochs_run": 0},
    ]
    assert epochs_to_target(rows, 0.733) == 11
    assert epochs_to_target(list(reversed(rows)), 0.733) == 11  # trial order, not list order
    assert epochs_to_target(rows[:2], 0.733) == math.inf  # a miss is inf, not dropped


def test_the_replay_stops_at_the_target_without_changing_what_came_before():
    curves = {lr: [0.1 * i, 0.1 * i + 0.05] for i, lr in enumerate((0.1, 0.2, 0.4, 0.8))}
    values = _values(_lr_space(curves), 2, sampler="grid", pruner="none")
    full = replay_study(values, _table(curves), sampler_seed=3)
    target = full[1]["value"]
    stopped = replay_study(values, _table(curves), sampler_seed=3, callbacks=[stop_at_target(target)])
    first = next(i for i, r in enumerate(full) if r["value"] >= target)
    assert stopped == full[: first + 1]


def test_a_table_without_the_drawn_configuration_fails_naming_it():
    values = _values(_lr_space([0.1, 0.2]), 2, sampler="grid", pruner="none")
    with pytest.raises(KeyError, match=r'no row for \{"lr": 0.2\}'):
        replay_study(values, _table({0.1: [0.5, 0.6]}), sampler_seed=1)


def test_candidates_cover_a_discrete_space_and_refuse_a_range():
    space = parse_search_space({"lr": {"type": "categorical", "choices": [0.1, 0.2]},
                                "batch_size": {"type": "int", "low": 2, "high": 4}})  # fmt: skip
    assert len(candidates(space)) == 6 and {"lr": 0.2, "batch_size": 4} in candidates(space)
    with pytest.raises(ValueError, match="search_space.lr is a float range"):
        candidates(parse_search_space({"lr": {"type": "float", "low": 0.1, "high": 1}}))
