"""Tuning: TPE + successive halving (ASHA) vs the grid, a fair and repeatable comparison on CPU.

The rules, fixed before anything is measured:

1. One candidate set on both sides: lr in ``LRS`` x label_smoothing in ``SMOOTHINGS``, as
   categoricals. If the best candidate (mean over training seeds) has an end lr, the set is
   widened by one lr past that end (at most ``MAX_WIDENINGS`` times) before anything is reported.
2. A learning-curve table: every candidate trained for E epochs by the product's own trial
   function (``tune.replay.learning_curves`` over ``tune.trial.train_trial``) on each training
   seed, scored on a validation split carved from the archive's training images. The test split
   is sealed: any read of it raises, so the table cannot have used it.
3. Replays through the product's own objective, sampler and pruner (``tune.replay.replay_study``),
   ``SAMPLER_SEEDS`` sampler seeds per training seed for each method in ``METHODS``. CPU training
   is bitwise deterministic for a seed, so a replay is what the live study would do.
4. A live check: one live study (``tune.study.run_study``, TPE + ASHA) must reproduce its replay
   exactly: the same trials, values, pruning decisions and epochs.
5. The metric r: epochs spent until the first *completed* trial reaches the target, divided by the
   full grid's epochs. Two targets, per training seed: the grid's exact best, and the grid's best
   minus one binomial standard error (sqrt(p(1-p)/n_val)). A miss is r = inf and stays in every
   statistic. Reported: per-seed values, median, IQR, P(r <= 0.4), and the seconds ratio from the
   live run. The goal: TPE + ASHA's median r against best - 1 SE <= 0.4.

Sizes: ``full`` is the measurement; ``quick`` (a quarter of the training: 24 min here under load) checks the
whole procedure, but with 1,000 training images an epoch is 3 steps, the first epochs' accuracies
tie near chance and no pruner can rank them, so its r's say nothing about the methods.

Every method uses the product's defaults (ASHA: min_resource 1, reduction_factor 3; TPE: 5
random start-up trials, multivariate), with n_trials high enough that the study ends by itself
when every candidate is finished. Wall seconds on a shared machine are noisy; epochs are not.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.common import BenchContext, row, scratch_dir, section

LRS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
SMOOTHINGS = (0.0, 0.2)
MAX_WIDENINGS = 1
GOAL_R = 0.4
# (label, sampler, pruner): the product's settings; "tpe + median" is the previous default
METHODS = (
    ("TPE + ASHA", "tpe", "asha"),
    ("shuffled grid + ASHA", "grid", "asha"),
    ("random + ASHA", "random", "asha"),
    ("TPE + median", "tpe", "median"),
    ("plain grid", "grid", "none"),
)
TARGETS = ("grid best - 1 SE", "grid best")


class _Sealed:
    """Stands in for the test split: reading it in any way fails the benchmark."""

    def __init__(self, name: str):
        self._name = name

    def _refuse(self, *_args, **_kwargs):
        raise AssertionError(f"the tuning benchmark read the test split ({self._name})")

    __len__ = __getitem__ = __array__ = __iter__ = _refuse

    def __getattr__(self, attr):
        self._refuse()


def split_data(ctx: BenchContext, n_train: int, n_val: int):
    """``n_train`` training and ``n_val`` validation images from the archive's *training* split; test sealed."""
    full = ctx.dataset(n_train + n_val, 10)
    available = len(full.train_labels)  # a --smoke archive has fewer
    n_val = min(n_val, available // 3)
    n_train = min(n_train, available - n_val)
    order = np.random.default_rng(0).permutation(available)
    train, val = order[:n_train], order[n_train : n_train + n_val]
    images, labels = full.train_images, full.train_labels
    return replace(full, train_images=images[train], train_labels=labels[train], val_images=images[val],
                   val_labels=labels[val], test_images=_Sealed("test_images"),
                   test_labels=_Sealed("test_labels"))  # fmt: skip


def space_of(lrs) -> dict:
    return {"lr": {"type": "categorical", "choices": list(lrs)},
            "label_smoothing": {"type": "categorical", "choices": list(SMOOTHINGS)}}  # fmt: skip


def study_values(lrs, epochs: int, seed: int, sampler: str = "tpe", pruner: str = "asha") -> dict:
    from cifar10_kfp.params.validation import validate_pipeline_params

    return validate_pipeline_params({"preset": "cpu", "trial_epochs": epochs, "search_space": json.dumps(space_of(lrs)),
                                     "n_trials": 1000, "sampler": sampler, "pruner": pruner, "seed": seed,
                                     "extra_hparams": '{"device": "cpu"}'}, "tune")  # fmt: skip


def curve_tables(data, seeds, epochs: int) -> tuple[dict, list[float]]:
    """{seed: table} over the candidate set, widened past an end lr that holds the best; (tables, lrs)."""
    from cifar10_kfp.params.space import parse_search_space
    from cifar10_kfp.tune.replay import candidates, learning_curves

    lrs, tables, done = list(LRS), {seed: {} for seed in seeds}, set()
    for widening in range(MAX_WIDENINGS + 1):
        configs = [c for c in candidates(parse_search_space(space_of(lrs))) if c["lr"] not in done]
        for seed in seeds:
            start = time.perf_counter()
            tables[seed].update(learning_curves(study_values(lrs, epochs, seed), data, configs, name="bench"))
            print(f"[bench] tune: seed {seed}: {len(configs)} candidates x {epochs} epochs in "
                  f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
        done |= {c["lr"] for c in configs}
        best_lr = json.loads(_best_key(tables))["lr"]
        if widening == MAX_WIDENINGS or min(lrs) < best_lr < max(lrs):
            break
        lrs = sorted({*lrs, best_lr * 2 if best_lr == max(lrs) else best_lr / 2})
    return tables, lrs


def _best_key(tables: dict) -> str:
    """The candidate with the best final validation accuracy averaged over the training seeds."""
    keys = next(iter(tables.values())).keys()
    return max(keys, key=lambda k: np.mean([table[k][-1]["val_acc"] for table in tables.values()]))


def targets(table: dict, n_val: int) -> dict[str, float]:
    best = max(rows[-1]["val_acc"] for rows in table.values())
    return {"grid best": best, "grid best - 1 SE": best - float(np.sqrt(best * (1 - best) / n_val))}


def replay_rs(lrs, table: dict, epochs: int, seed: int, sampler_seeds, n_val: int) -> dict:
    """{method: {target: [r per sampler seed]}} for one training seed's table."""
    from cifar10_kfp.tune.replay import epochs_to_target, replay_study, stop_at_target

    goal, grid_epochs = targets(table, n_val), len(table) * epochs
    out = {}
    for label, sampler, pruner in METHODS:
        values = study_values(lrs, epochs, seed, sampler, pruner)
        out[label] = {name: [] for name in TARGETS}
        for sampler_seed in sampler_seeds:
            # stopping at the higher target changes nothing before it, so both r's come from one replay
            rows = replay_study(
                values, table, sampler_seed=sampler_seed, callbacks=[stop_at_target(goal["grid best"])]
            )
            for name in TARGETS:
                out[label][name].append(epochs_to_target(rows, goal[name]) / grid_epochs)
    return out


def summarise(rs) -> dict:
    """Median, IQR and P(r <= GOAL_R) over the r's; a miss (inf) is kept, never dropped."""
    values = np.asarray(rs, dtype=float)
    # quartiles as order statistics: interpolating towards an inf would give nan
    q1, q3 = (float(np.quantile(values, q, method="inverted_cdf")) for q in (0.25, 0.75))
    return {"n": len(values), "median": float(np.median(values)), "q1": q1, "q3": q3,
            "p_r_le_goal": float(np.mean(values <= GOAL_R)), "misses": int(np.sum(np.isinf(values)))}  # fmt: skip


def live_check(data, lrs, table: dict, epochs: int, seed: int, n_val: int, tmp: Path) -> dict:
    """One live TPE + ASHA study; it must equal its replay. Its seconds to each target vs the grid's seconds."""
    from cifar10_kfp.data.format import save_prepared
    from cifar10_kfp.tune.replay import replay_study
    from cifar10_kfp.tune.study import run_study

    # the file carries an empty test split: the live study has no test images to read
    no_test = replace(data, test_images=np.zeros((0, *data.train_images.shape[1:]), np.uint8),
                      test_labels=np.zeros(0, np.int64))  # fmt: skip
    path = save_prepared(no_test, tmp / "bench.safetensors")
    values = study_values(lrs, epochs, seed)
    start = time.perf_counter()
    live = run_study(values, str(path), tmp / "out", study_uri=str(tmp / "study")).trials
    wall_s = time.perf_counter() - start
    replayed = replay_study(values, table)
    keys = ("number", "params", "state", "value", "epochs_run", "same_as")
    same = [{k: r[k] for k in keys} for r in live] == [{k: r[k] for k in keys} for r in replayed]
    grid_s = sum(rows[-1]["trial_s"] for rows in table.values())
    seconds = {}
    for name, target in targets(table, n_val).items():
        spent = 0.0
        seconds[name] = None
        for r in live:
            spent += float(r["train_s"])
            if r["state"] == "COMPLETE" and r["value"] >= target:
                seconds[name] = spent
                break
    return {"same_as_replay": same, "trials": live, "grid_s": grid_s, "wall_s": wall_s, "seconds_to": seconds,
            "epochs": sum(int(r["epochs_run"]) for r in live)}  # fmt: skip


def run(ctx: BenchContext) -> dict:
    n_train, n_val, epochs, seeds, n_sampler = ctx.pick(
        smoke=(200, 100, 2, (0,), 3), quick=(1000, 500, 3, (0, 1, 2), 30), full=(3000, 2000, 4, (0, 1, 2), 30)
    )
    start = time.perf_counter()
    data = split_data(ctx, n_train, n_val)
    n_val = len(data.val_labels)
    tables, lrs = curve_tables(data, seeds, epochs)
    table_s = time.perf_counter() - start
    replay_start = time.perf_counter()
    per_seed = {seed: replay_rs(lrs, tables[seed], epochs, seed, range(n_sampler), n_val) for seed in seeds}
    replay_s = time.perf_counter() - replay_start
    with scratch_dir(ctx, "tune") as tmp:
        live = live_check(data, lrs, tables[seeds[0]], epochs, seeds[0], n_val, Path(tmp))
    timing = {
        "table_s": table_s,
        "replay_s": replay_s,
        "live_s": live["wall_s"],
        "total_s": time.perf_counter() - start,
    }
    report = _report(per_seed, tables, lrs, live, timing, len(data.train_labels), n_val, epochs, n_sampler)
    if ctx.size == "smoke":  # the plumbing only: its numbers claim nothing
        for each in report["rows"]:
            each["met"] = None
    return report


def _report(per_seed, tables, lrs, live, timing, n_train, n_val, epochs, n_sampler) -> dict:
    seeds = list(per_seed)
    pooled = {label: {name: [r for seed in seeds for r in per_seed[seed][label][name]] for name in TARGETS}
              for label, _, _ in METHODS}  # fmt: skip
    stats = {label: {name: summarise(pooled[label][name]) for name in TARGETS} for label in pooled}
    goal = stats["TPE + ASHA"]["grid best - 1 SE"]
    rows = []
    for label in pooled:
        for name in TARGETS:
            s = stats[label][name]
            is_goal = label == "TPE + ASHA" and name == "grid best - 1 SE"
            rows.append(row(f"{label}: median r to {name} (IQR {_r(s['q1'])}-{_r(s['q3'])}, "
                            f"P(r<={GOAL_R}) {s['p_r_le_goal']:.2f}, misses {s['misses']}/{s['n']})",
                            s["median"], None, ratio_kind="", target=f"<= {GOAL_R}" if is_goal else "report",
                            met=(s["median"] <= GOAL_R) if is_goal else None))  # fmt: skip
    grid_s = live["grid_s"]
    for name in TARGETS:
        took = live["seconds_to"][name]
        rows.append(row(f"live TPE + ASHA study: seconds to {name} vs the grid's seconds", took, grid_s, unit="s",
                        target="report"))  # fmt: skip
    rows.append(row("live study reproduces its replay (trials, values, pruning, epochs)", float(live["same_as_replay"]),
                    None, ratio_kind="", target="exactly", met=live["same_as_replay"]))  # fmt: skip
    notes = _notes(tables, lrs, live, timing, n_train, n_val, epochs, n_sampler, goal)
    for name in TARGETS:  # the per-seed values behind the headline (every method's are in results.json)
        per = "; ".join(f"training seed {seed}: " + " ".join(_r(r) for r in sorted(per_seed[seed]["TPE + ASHA"][name]))
                        for seed in seeds)  # fmt: skip
        notes.append(f"TPE + ASHA, r to {name}, per sampler seed (sorted): {per}.")
    for label in pooled:
        medians = ", ".join(
            f"{_r(float(np.median(per_seed[seed][label]['grid best - 1 SE'])))}" for seed in seeds
        )
        notes.append(f"{label}: median r to grid best - 1 SE per training seed {seeds}: {medians}.")
    details = {
        "per_seed_r": {str(seed): per_seed[seed] for seed in seeds},
        "stats": stats,
        "final_val_acc": {
            str(seed): {k: rows_[-1]["val_acc"] for k, rows_ in tables[seed].items()} for seed in seeds
        },
        "targets": {str(seed): targets(tables[seed], n_val) for seed in seeds},
        "live_trials": live["trials"],
        "timing_s": timing,
    }
    return section("Tuning: TPE + ASHA vs the grid", rows, details=details, notes=notes)


def _r(value: float) -> str:
    return "inf" if np.isinf(value) else f"{value:.2f}"


def _notes(tables, lrs, live, timing, n_train, n_val, epochs, n_sampler, goal) -> list[str]:
    seeds = list(tables)
    best = {seed: max(tables[seed], key=lambda k: tables[seed][k][-1]["val_acc"]) for seed in seeds}
    grid_epochs = len(next(iter(tables.values()))) * epochs
    met = goal["median"] <= GOAL_R
    return [
        f"Data: {n_train:,} training / {n_val:,} validation images from the real archive's training split (the "
        f"test split sealed: never read); `cpu` preset, {epochs} epochs a trial; candidates lr {lrs} x "
        f"label_smoothing {list(SMOOTHINGS)} ({len(next(iter(tables.values())))} configurations, {grid_epochs} "
        f"epochs for the full grid); training seeds {seeds}, {n_sampler} sampler seeds each.",
        "Best per training seed: " + "; ".join(
            f"seed {s}: {best[s]} at {tables[s][best[s]][-1]['val_acc']:.4f}" for s in seeds) + ".",
        f"Goal (TPE + ASHA, median r to the grid best - 1 SE <= {GOAL_R}): "
        + ("met" if met else "NOT met") + f", median r {_r(goal['median'])} over {goal['n']} studies "
        f"({goal['misses']} misses kept as inf).",
        f"Live check: one TPE + ASHA study (training seed {seeds[0]}, sampler seed {seeds[0]}) "
        + ("reproduced its replay exactly" if live["same_as_replay"] else "DID NOT reproduce its replay")
        + f": {len(live['trials'])} trials ({sum(r['state'] == 'PRUNED' for r in live['trials'])} pruned, "
        f"{sum(r['same_as'] is not None for r in live['trials'])} repeats at no cost), {live['epochs']} epochs "
        f"in all, {live['wall_s']:.0f} s.",
        f"Wall time: learning-curve table {timing['table_s']:.0f} s, replays {timing['replay_s']:.0f} s, live "
        f"study {timing['live_s']:.0f} s, total {timing['total_s']:.0f} s (a shared machine: seconds are noisy, "
        "epochs are not).",
    ]  # fmt: skip
