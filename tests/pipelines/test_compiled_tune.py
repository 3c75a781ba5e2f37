"""The compiled ``cifar10-tune`` spec: no drift, the DAG (tune -> train with the best values -> evaluate ->
gate/publish, in the summary's ExitHandler), and the tune task under exactly the train step's policy."""

from __future__ import annotations

import pytest

from cifar10_kfp.params.table import TUNE_PARAMS
from cifar10_kfp_pipelines.catalog import COMPILED_DIR
from tests.pipelines import test_compiled as common


@pytest.fixture(scope="module")
def tune() -> tuple[dict, dict]:
    return common._load(COMPILED_DIR / "cifar10-tune.yaml")


def test_committed_spec_matches_the_code(tmp_path, monkeypatch):
    common.test_committed_specs_match_the_code("tune", tmp_path, monkeypatch)


def test_the_tune_task_has_the_train_steps_policy(tune):
    """GPU request, resources, toleration, /dev/shm, object-store secret, retry and caching: all as train's."""
    spec, platform = tune
    tasks = common._tasks(spec)
    tune_task, train_task = tasks["tune-hyperparameters"], tasks["train-model"]
    tune_exec, train_exec = (
        common._executor(spec, "tune-hyperparameters"),
        common._executor(spec, "train-model"),
    )
    assert tune_exec["resources"] == train_exec["resources"]
    assert tune_exec["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    label = {name: spec["components"][tasks[name]["componentRef"]["name"]]["executorLabel"]
             for name in ("tune-hyperparameters", "train-model")}  # fmt: skip
    assert platform[label["tune-hyperparameters"]] == platform[label["train-model"]]
    assert platform[label["tune-hyperparameters"]]["secretAsEnv"][0]["secretName"] == common.SECRET
    assert (
        tune_task["retryPolicy"] == train_task["retryPolicy"]
        and tune_task["retryPolicy"]["maxRetryCount"] == 3
    )
    assert tune_task.get("cachingOptions", {}) == train_task.get("cachingOptions", {}) == {}

    def env(container):
        return {e["name"]: e["value"] for e in container["env"] if e["name"] != "CIFAR10_KFP_TASK"}

    assert env(tune_exec) == env(train_exec)


def test_the_dag_hands_the_best_values_to_training(tune):
    spec, _ = tune
    tasks = common._tasks(spec)
    assert tasks["tune-hyperparameters"]["dependentTasks"] == ["preprocess-dataset", "validate-tune-params"]
    assert tasks["train-model"]["inputs"]["parameters"]["training"] == {
        "taskOutputParameter": {"outputParameterKey": "best_training", "producerTask": "tune-hyperparameters"}
    }
    record = tasks["record-tune-outputs"]["inputs"]
    assert record["artifacts"]["tune_metrics"]["taskOutputArtifact"]["producerTask"] == "tune-hyperparameters"
    assert record["parameters"]["test_accuracy"]["taskOutputParameter"]["producerTask"] == "evaluate-model"
    assert {"gate-model", "publish-model", "record-publication"} <= set(tasks)
    assert (
        spec["root"]["dag"]["tasks"]["write-run-summary"]["triggerPolicy"]["strategy"]
        == "ALL_UPSTREAM_TASKS_COMPLETED"
    )


def test_every_step_gets_the_secret_endpoint_and_run_identity(tune):
    common.test_every_step_gets_the_secret_endpoint_and_run_identity_and_caching_is_per_task(
        "training", tune, None
    )


def test_one_image_and_no_credential(tune):
    spec, _ = tune
    assert {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()} == {
        common.ClusterPolicy().image
    }
    text = (COMPILED_DIR / "cifar10-tune.yaml").read_text()
    assert "minio123" not in text


def test_parameters_and_the_validate_step(tune):
    common.test_parameters_have_types_defaults_and_descriptions("training", TUNE_PARAMS, tune, None)
    spec, _ = tune
    body = common._dags(spec)["comp-exit-handler-1"]
    inputs = body["validate-tune-params"]["inputs"]["parameters"]
    assert {name: arg["componentInputParameter"] for name, arg in inputs.items()} == {
        p.name: f"pipelinechannel--{p.name}" for p in TUNE_PARAMS
    }
    assert {"search_space", "n_trials", "budget_epochs", "timeout_s", "sampler", "pruner", "min_resource",
            "reduction_factor", "trial_epochs"} <= set(inputs)  # fmt: skip
