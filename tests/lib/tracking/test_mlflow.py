"""Metrics to a real MLflow tracking server (``mlflow server``, SQLite store, on 127.0.0.1).

The layers: the tracker on its own (a run given as KFP 2.17's driver gives it, a run made here with
nested trials), then ``cifar10-kfp train`` and ``evaluate`` as a user runs them with ``MLFLOW_TRACKING_URI``
set, without it (nothing printed differs, mlflow is never imported), and against a server that was stopped.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import uuid

import pytest

from cifar10_kfp.progress import is_progress_line
from cifar10_kfp.tracking import open_tracker
from cifar10_kfp.train.outputs import ProgressPrinter
from tests.support.cli import cli, user_env
from tests.support.mlflow_server import MlflowServer

ROW = {"train_loss": 1.2, "train_acc": 0.4, "val_loss": 1.1, "val_acc": 0.5, "lr": 0.1, "images_per_s": 900.0}


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def test_the_run_kfp_gives_gets_params_and_epochs_and_is_left_to_kfp_to_end(mlflow_server, tracking_env):
    client = mlflow_server.client()
    experiment = client.create_experiment(f"kfp-{uuid.uuid4().hex[:8]}")
    parent = client.create_run(experiment, run_name="pipeline-run")
    task = client.create_run(
        experiment, run_name="train-model", tags={"mlflow.parentRunId": parent.info.run_id}
    )
    tracking_env.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    tracking_env.setenv("MLFLOW_EXPERIMENT_ID", experiment)
    tracking_env.setenv("MLFLOW_RUN_ID", task.info.run_id)

    tracker = open_tracker("train")
    tracker.start({"lr": 0.1, "dataset_digest": "ab" * 32, "widths": [64, 128]})
    for epoch in (1, 2):
        tracker.epoch({**ROW, "epoch": epoch, "val_acc": 0.25 * epoch}, total_epochs=2)
    tracker.final({"val_acc": 0.5, "wall_s": 3.0, "device": "cpu"})
    tracker.close()

    run = client.get_run(task.info.run_id)
    assert run.info.status == "RUNNING"  # KFP's launcher ends it, with its own final metrics
    assert run.data.params == {"lr": "0.1", "dataset_digest": "ab" * 32, "widths": "[64, 128]"}
    assert _history(client, task.info.run_id, "val/accuracy") == [(1, 0.25), (2, 0.5)]
    assert {k for k in run.data.metrics} == {
        "train/loss", "train/accuracy", "val/loss", "val/accuracy", "lr", "train/images_per_s", "val_acc", "wall_s",
    }  # fmt: skip
    assert _history(client, task.info.run_id, "val_acc") == [(0, 0.5)]
    assert client.search_runs([experiment], "attributes.run_name = 'train'") == []  # no run of its own


def test_without_a_run_id_a_run_is_made_and_ended_with_each_trial_nested(mlflow_server, tracking_env):
    client = mlflow_server.client()
    name = f"tune-{uuid.uuid4().hex[:8]}"
    tracking_env.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    tracking_env.setenv("MLFLOW_EXPERIMENT_NAME", name)

    tracker = open_tracker("tune")
    tracker.start({"n_trials": 2})
    for number, status in ((0, "FINISHED"), (1, "KILLED")):
        trial = tracker.trial(f"trial-{number}", {"lr": 0.1 * (number + 1)})
        trial.epoch({**ROW, "epoch": 1}, total_epochs=2)
        trial.close(status)
    tracker.final({"best_val_acc": 0.5})
    tracker.close()

    experiment = client.get_experiment_by_name(name)
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"tune", "trial-0", "trial-1"}
    assert runs["tune"].info.status == "FINISHED" and runs["tune"].data.params == {"n_trials": "2"}
    assert runs["tune"].data.metrics == {"best_val_acc": 0.5}
    for number, status in ((0, "FINISHED"), (1, "KILLED")):
        trial = runs[f"trial-{number}"]
        assert trial.data.tags["mlflow.parentRunId"] == runs["tune"].info.run_id
        assert trial.info.status == status
        assert trial.data.params == {"lr": str(0.1 * (number + 1))}
        assert _history(client, trial.info.run_id, "val/accuracy") == [(1, 0.5)]


def test_a_server_that_never_answers_costs_one_warning_after_the_request_timeout(tracking_env, caplog):
    pytest.importorskip("mlflow", reason="the dev extra installs mlflow (the tracking client)")
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        tracking_env.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{listener.getsockname()[1]}")
        tracking_env.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
        with caplog.at_level(logging.WARNING):
            tracker = open_tracker("train")
            tracker.start({"lr": 0.1})
            for epoch in (1, 2, 3):
                tracker.epoch({**ROW, "epoch": epoch}, total_epochs=3)
            tracker.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    # mlflow words the timeout differently by path ("ReadTimeoutError" after urllib3's retries, "timeout
    # exception ... Read timed out" on its own retry loop): both name the timeout, which is what a user must see.
    assert "failed" in warnings[0] and "training goes on" in warnings[0]
    assert "timeout" in warnings[0].lower() or "timed out" in warnings[0].lower(), warnings[0]


def _assert_train_output_unchanged(stdout: str, metrics_file) -> None:
    """What ``cifar10-kfp train`` prints: the epoch table, then metrics.json's figures; nothing else."""
    lines = stdout.splitlines()
    assert lines[0] == ProgressPrinter.HEADER
    assert all(is_progress_line(line) for line in lines[1:3]) and lines[1].lstrip().startswith("1/2")
    assert json.loads("\n".join(lines[3:])) == json.loads(metrics_file.read_text())


@pytest.mark.slow
def test_train_and_evaluate_commands_log_each_epoch_and_the_final_metrics(
    mlflow_server, tiny_dataset_path, tmp_path
):
    name = f"local-{uuid.uuid4().hex[:8]}"
    env = user_env(MLFLOW_TRACKING_URI=mlflow_server.uri, MLFLOW_EXPERIMENT_NAME=name)
    out = tmp_path / "out"
    trained = cli(tmp_path, "train", "--data", str(tiny_dataset_path), "--preset", "cpu", "--epochs", "2",
                  "--output-dir", str(out), env=env)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    _assert_train_output_unchanged(trained.stdout, out / "metrics.json")
    assert "WARNING" not in trained.stderr
    evaluated = cli(tmp_path, "evaluate", "--model", str(out / "model"), "--data", str(tiny_dataset_path),
                    "--output-dir", str(tmp_path / "eval"), env=env)  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr

    client = mlflow_server.client()
    experiment = client.get_experiment_by_name(name)
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"train", "evaluate"} and {r.info.status for r in runs.values()} == {"FINISHED"}
    history = json.loads((out / "history.json").read_text())
    run_id = runs["train"].info.run_id
    for key, name in (("train_acc", "train/accuracy"), ("val_acc", "val/accuracy"), ("lr", "lr"),
                      ("train_loss", "train/loss"), ("images_per_s", "train/images_per_s")):  # fmt: skip
        logged = _history(client, run_id, name)
        assert [step for step, _ in logged] == [row["epoch"] for row in history] == [1, 2]
        assert [value for _, value in logged] == pytest.approx([row[key] for row in history])
    params = runs["train"].data.params
    assert params["dataset_digest"] == "0" * 64 and params["epochs"] == "2" and params["preset"] == "cpu"
    assert "progress" not in params  # run-time knobs may change on a resume; MLflow refuses a changed param
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert runs["evaluate"].data.metrics["accuracy"] == pytest.approx(metrics["accuracy"])


@pytest.mark.slow
def test_without_the_variable_train_prints_what_it_printed_and_never_imports_mlflow(
    tiny_dataset_path, tmp_path
):
    out = tmp_path / "out"
    code = (
        "import sys\nfrom cifar10_kfp_pipelines.cli import main\n"
        f"rc = main(['train', '--data', {str(tiny_dataset_path)!r}, '--preset', 'cpu', '--epochs', '2', "
        f"'--output-dir', {str(out)!r}])\n"
        "print('imported:', sorted({m.split('.')[0] for m in sys.modules} & {'mlflow', 'urllib3'}), file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    env = {k: v for k, v in user_env().items() if not k.startswith(("MLFLOW_", "KUBEFLOW_TRAINER_"))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _assert_train_output_unchanged(done.stdout, out / "metrics.json")
    assert "imported: []" in done.stderr
    assert not re.search("mlflow|tracking", done.stderr.replace("imported: []", ""), re.IGNORECASE)


@pytest.mark.slow
def test_a_stopped_server_costs_one_warning_line_and_the_run_succeeds(tiny_dataset_path, tmp_path):
    pytest.importorskip("mlflow", reason="the dev extra installs mlflow (the tracking server)")
    server = MlflowServer(tmp_path / "mlflow").start()
    server.stop()
    out = tmp_path / "out"
    env = user_env(MLFLOW_TRACKING_URI=server.uri, MLFLOW_TRACKING_TOKEN="tok-not-for-logs")
    trained = cli(tmp_path, "train", "--data", str(tiny_dataset_path), "--preset", "cpu", "--epochs", "2",
                  "--output-dir", str(out), env=env)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    _assert_train_output_unchanged(trained.stdout, out / "metrics.json")
    mentions = [line for line in trained.stderr.splitlines() if re.search("mlflow", line, re.IGNORECASE)]
    assert len(mentions) == 1, trained.stderr
    assert " WARNING " in mentions[0] and f"MLflow tracking at {server.uri} failed" in mentions[0]
    assert "training goes on" in mentions[0] and "tok-not-for-logs" not in trained.stderr


@pytest.mark.slow
def test_a_study_logs_each_trained_trial_as_a_nested_run(
    mlflow_server, tracking_env, tiny_dataset_path, tmp_path
):
    from cifar10_kfp.params.validation import validate_pipeline_params
    from cifar10_kfp.tune.study import run_study

    name = f"study-{uuid.uuid4().hex[:8]}"
    tracking_env.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    tracking_env.setenv("MLFLOW_EXPERIMENT_NAME", name)
    values = validate_pipeline_params(
        {"preset": "seed", "batch_size": 64, "sampler": "random", "trial_epochs": 2, "n_trials": 3,
         "search_space": '{"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": true}}'},
        "tune",
    )  # fmt: skip
    result = run_study(values, str(tiny_dataset_path), tmp_path / "out", study_uri=str(tmp_path / "study"))

    client = mlflow_server.client()
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id])
    (study,) = [r for r in runs if r.info.run_name == "tune"]
    assert study.info.status == "FINISHED" and study.data.params["dataset_digest"] == "0" * 64
    assert study.data.metrics["best_val_acc"] == pytest.approx(result.best_value)
    trials = {r.info.run_name: r for r in runs if r.info.run_name != "tune"}
    assert set(trials) == {f"trial-{row['number']}" for row in result.trials}
    for row in result.trials:
        run = trials[f"trial-{row['number']}"]
        assert run.data.tags["mlflow.parentRunId"] == study.info.run_id
        assert run.info.status == {"COMPLETE": "FINISHED", "PRUNED": "KILLED"}[row["state"]]
        assert float(run.data.params["lr"]) == pytest.approx(row["params"]["lr"])
        steps = [step for step, _ in _history(client, run.info.run_id, "val/accuracy")]
        assert steps == list(range(1, row["epochs_run"] + 1))
