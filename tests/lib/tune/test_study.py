"""The study on a tiny dataset: it completes, prunes, hands its best to training, and survives kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cifar10_kfp.data.format import save_prepared
from cifar10_kfp.params.table import train_config
from cifar10_kfp.params.validation import validate_pipeline_params
from cifar10_kfp.tune.study import run_study, trial_config
from tests.support.data import make_tiny_dataset

# lr over seven decades: the low end cannot learn anything in a few epochs (a deliberately bad range)
WIDE_LR = '{"lr": {"type": "float", "low": 1e-7, "high": 0.1, "log": true}}'


def _values(**more):
    settings = {"preset": "seed", "batch_size": 32, "search_space": WIDE_LR, "sampler": "random",
                "trial_epochs": 3, "n_trials": 6, **more}  # fmt: skip
    return validate_pipeline_params(settings, "tune")


@pytest.mark.slow
def test_a_tiny_study_completes_prunes_and_reports(tmp_path, tiny_dataset_path):
    result = run_study(_values(), str(tiny_dataset_path), tmp_path / "out", study_uri=str(tmp_path / "study"))
    metrics = result.metrics
    assert metrics["trials_completed"] + metrics["trials_pruned"] == 6
    assert metrics["trials_pruned"] >= 1 and metrics["trials_completed"] >= 1
    # a pruned trial stopped early: fewer epochs in all than 6 full trials
    assert metrics["trial_epochs_total"] < 6 * 3
    completed = [row for row in result.trials if row["state"] == "COMPLETE"]
    assert result.best_value == max(row["value"] for row in completed) == metrics["best_value"]
    assert result.best_params == next(r["params"] for r in completed if r["value"] == result.best_value)
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<script" not in page
    trials_table = page[page.index("<h2>Trials</h2>") :]
    assert trials_table.count("<tr>") == 1 + 6  # header + one row per trial
    assert "Rungs: where trials stopped" in page
    assert all(
        row["fixed_s"] > 0 for row in result.trials if row["epochs_run"]
    )  # build, whitening, first eval
    assert json.loads((tmp_path / "out" / "best_params.json").read_text()) == result.best_params
    assert (tmp_path / "study" / "study.journal").is_file()


@pytest.mark.slow
def test_trials_run_at_once_one_per_device_slot_and_the_study_still_counts_them(tmp_path, tiny_dataset_path):
    """On a pod with several GPUs trials run concurrently, one a GPU; here two CPU slots play the GPUs."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from cifar10_kfp.tune.study import STUDY_NAME

    values = _values(pruner="none", n_trials=4, trial_epochs=2)
    result = run_study(values, str(tiny_dataset_path), tmp_path / "out", study_uri=str(tmp_path / "study"),
                       concurrent=2)  # fmt: skip
    assert result.metrics["trials_completed"] == 4 and {row["device"] for row in result.trials} == {"cpu"}
    storage = JournalStorage(
        log_storage=JournalFileBackend(file_path=str(tmp_path / "study" / "study.journal"))
    )
    trials = optuna.load_study(study_name=STUDY_NAME, storage=storage).get_trials()
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials)
    overlapping = sum(later_start < end for (_, end), (later_start, _) in zip(spans, spans[1:]))
    assert overlapping >= 1, spans  # at least one trial started before the one before it ended


def test_the_best_params_reach_the_train_step_settings():
    values = _values(search_space='{"lr": {"type": "float", "low": 0.01, "high": 0.1}, '
                                  '"label_smoothing": {"type": "float", "low": 0.0, "high": 0.2}}')  # fmt: skip
    from cifar10_kfp.params.table import training_settings
    from cifar10_kfp.tune.study import training_with

    best = {"lr": 0.042, "label_smoothing": 0.13}
    config = train_config(training_with(training_settings(values), best))  # what the train step builds
    assert (config.lr, config.label_smoothing, config.batch_size, config.epochs) == (0.042, 0.13, 32, 10)
    assert trial_config(values, best).epochs == 3  # trials are shorter; the final training is not


def _journal_trials(store, uri: str, work: Path) -> list:
    """The trials in the study's saved journal (read with Optuna itself)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from cifar10_kfp.storage import ObjectNotFound

    try:
        data = store.get_bytes(uri)
    except ObjectNotFound:
        return []
    path = work / f"journal-{time.monotonic_ns()}"
    path.write_bytes(data)
    storage = JournalStorage(log_storage=JournalFileBackend(file_path=str(path)))
    return optuna.load_study(study_name="cifar10-tune", storage=storage).get_trials(deepcopy=False)


def _tune_command(data: Path, study_uri: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "cifar10_kfp_pipelines.cli", "tune", "--data", str(data), "--preset", "seed",
            "--batch-size", "32", "--search-space", '{"lr": {"type": "float", "low": 0.001, "high": 0.1, "log": true}}',
            "--n-trials", "6", "--pruner", "none", "--trial-epochs", "4", "--study-uri", study_uri,
            "--output-dir", str(out)]  # fmt: skip


@pytest.mark.slow
def test_kill_9_mid_study_then_rerun_reuses_the_finished_trials(tmp_path, store_env):
    """The tune task's retry: kill -9 while a trial trains, run again, finished trials kept, the one in flight re-run."""
    data = save_prepared(make_tiny_dataset(n_train=1024), tmp_path / "data" / "dataset.safetensors")
    study_uri = store_env.root_uri("tune", "kill-test")
    journal_uri = f"{study_uri}/study.journal"
    first = subprocess.Popen(_tune_command(data, study_uri, tmp_path / "first"), env=os.environ.copy(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    deadline = time.monotonic() + 240
    while True:  # wait until 2 trials are finished and a third is in flight, as the store has it
        trials = _journal_trials(store_env, journal_uri, tmp_path)
        states = [t.state.name for t in trials]
        if states.count("COMPLETE") >= 2 and "RUNNING" in states:
            break
        assert first.poll() is None, first.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, f"the study did not get going: {states}"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    trials = _journal_trials(store_env, journal_uri, tmp_path)  # what the store held at the kill
    kept = {t.number: (t.params, t.value) for t in trials if t.state.name == "COMPLETE"}
    in_flight = [t for t in trials if t.state.name == "RUNNING"]
    assert len(kept) >= 2 and len(in_flight) == 1

    second = subprocess.run(_tune_command(data, study_uri, tmp_path / "second"), env=os.environ.copy(),
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    rows = json.loads((tmp_path / "second" / "trials.json").read_text())
    finished = [r for r in rows if r["state"] in ("COMPLETE", "PRUNED")]
    assert len(finished) == 6  # n_trials in all, the kept ones counted
    first_attempt = {r["attempt"] for r in rows if r["number"] in kept}
    assert len(first_attempt) == 1
    reused = [r for r in finished if r["attempt"] in first_attempt]
    assert len(reused) == len(kept)  # not trained again
    assert {r["number"]: (r["params"], r["value"]) for r in reused} == kept
    rerun = [r for r in rows if r["rerun_of"] == in_flight[0].number]
    assert len(rerun) == 1 and rerun[0]["state"] == "COMPLETE" and rerun[0]["params"] == in_flight[0].params
    assert f"{len(kept)} finished trial(s) kept, 1 re-queued" in second.stderr


@pytest.mark.slow
def test_a_live_study_makes_exactly_the_decisions_of_its_replay(tmp_path, tiny_dataset_path):
    """The benchmark's premise: trials read from a learning-curve table (each configuration trained once, in
    full, by the live trial function) give the live study's trials, values, pruning and costs exactly."""
    from cifar10_kfp.data.format import load_prepared
    from cifar10_kfp.params.space import parse_search_space
    from cifar10_kfp.tune.replay import candidates, learning_curves, replay_study

    space = {"lr": {"type": "categorical", "choices": [0.0005, 0.005, 0.02, 0.05]},
             "label_smoothing": {"type": "categorical", "choices": [0.0, 0.2]}}  # fmt: skip
    values = _values(search_space=json.dumps(space), sampler="tpe", pruner="asha", reduction_factor=2,
                     trial_epochs=3, n_trials=1000, seed=3)  # fmt: skip
    live = run_study(
        values, str(tiny_dataset_path), tmp_path / "out", study_uri=str(tmp_path / "study")
    ).trials
    configs = candidates(parse_search_space(values["search_space"]))
    table = learning_curves(values, load_prepared(str(tiny_dataset_path)), configs)
    replayed = replay_study(values, table)

    def decisions(rows):
        return [
            (r["number"], r["params"], r["state"], r["value"], r["epochs_run"], r["same_as"]) for r in rows
        ]

    assert decisions(live) == decisions(replayed)
    assert {r["state"] for r in live} == {"COMPLETE", "PRUNED"}  # pruning decisions were compared too
    assert (
        len({json.dumps(r["params"], sort_keys=True) for r in live}) == len(configs) == 8
    )  # all, then the end
