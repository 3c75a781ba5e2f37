"""The real KFP 2.17.0 backend turns our compiled pipelines into Argo Workflows (issue 24, stages 3.3-3.4).

`cifar10-kfp submit` and `schedule` talk to the real KFP API server (localcluster/kfp.py),
which compiles our IR into an Argo Workflow with its own argocompiler (backend/src/v2/compiler/
argocompiler) and creates it on the real control plane, where the real Argo workflow controller
picks it up. The assertions read that Workflow object: the place where GPU requests, tolerations,
secrets, volumes, retries and caching either land or get lost (kubeflow/pipelines#11374).

In KFP v2 the per-step Kubernetes settings travel in the Workflow as the driver's inputs (the
workflow parameters `kubernetes-comp-<component>` and `implementations-<hash>`, the tasks' `task`
JSON and the retry executor's `retry-*` arguments); the driver turns them into each pod's
podSpecPatch at run time. The pods themselves run on kwok nodes here, which never start containers:
whether a step's pod really runs is the real-node tests' business.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from cifar10_kfp.storage.embedded import EmbeddedObjectStore
from localcluster import kfp as kfp_harness
from tests.support.cli import command, user_env
from tests.support.paths import ROOT

_RUN_ID = re.compile(r"run ([0-9a-f-]{36}) submitted")
_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def kfp_backend(control_plane, tmp_path_factory):
    from tests.cluster import conftest  # the closing table's timings

    with EmbeddedObjectStore(tmp_path_factory.mktemp("kfp-s3"), bucket=kfp_harness.BUCKET) as store:
        with kfp_harness.KfpBackend(control_plane, store) as backend:
            conftest._TIMINGS["KFP backend start"] = backend.started_in_s
            yield backend


def _cli(backend, *args: str) -> subprocess.CompletedProcess:
    env = user_env(KF_PIPELINES_ENDPOINT=backend.endpoint)
    done = subprocess.run(command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"cifar10-kfp {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _submit(backend, pipeline: str, *params: str) -> str:
    done = _cli(backend, "submit", "--pipeline", pipeline, *(p for kv in params for p in ("--param", kv)))
    match = _RUN_ID.search(done.stdout)
    assert match, f"no run id in: {done.stdout}"
    return match.group(1)


def _workflow_of_run(cp, run_id: str) -> dict:
    found: dict = {}

    def made() -> bool:
        listing = cp.kubectl(
            "get", "workflows", "-n", kfp_harness.NAMESPACE, "-l", f"pipeline/runid={run_id}", "-o", "json"
        )
        items = json.loads(listing.stdout or "{}").get("items", [])
        if items:
            found["workflow"] = items[0]
        return bool(items)

    cp.wait_for(f"the Argo Workflow of run {run_id}", made, timeout_s=_TIMEOUT_S)
    return found["workflow"]


def _driver_inputs(workflow: dict) -> dict[str, dict]:
    """task name -> its container driver's inputs, each workflow parameter resolved and JSON-decoded."""
    params = {p["name"]: p.get("value", "") for p in workflow["spec"]["arguments"]["parameters"]}

    def resolve(value: str):
        ref = re.fullmatch(r"\{\{workflow\.parameters\.([^}]+)\}\}", value)
        raw = params[ref.group(1)] if ref else value
        try:
            return json.loads(raw)
        except (TypeError, ValueError):
            return raw

    drivers: dict[str, dict] = {}
    for template in workflow["spec"]["templates"]:
        for task in (template.get("dag") or {}).get("tasks", []):
            args = {p["name"]: p.get("value", "") for p in task.get("arguments", {}).get("parameters", [])}
            if task["template"] == "system-container-driver":
                drivers[args["task-name"]] = {name: resolve(value) for name, value in args.items()}
    return drivers


def _executor_tasks(workflow: dict) -> dict[str, dict]:
    """task name -> its executor task (the step that runs our container), by the driver's task name."""
    tasks = {}
    for template in workflow["spec"]["templates"]:
        for task in (template.get("dag") or {}).get("tasks", []):
            if task["template"].endswith("system-container-executor"):
                tasks[task["name"]] = task
    return tasks


def _secret_env(k8s_config: dict) -> set[str]:
    return {kv["envVar"] for s in k8s_config.get("secretAsEnv", []) for kv in s["keyToEnv"]}


def test_submit_makes_a_workflow_the_argo_controller_runs(kfp_backend, control_plane):
    run_id = _submit(
        kfp_backend, "training", "max_train_samples=1000", "max_test_samples=200", "epochs=1", "num_gpus=0"
    )
    workflow = _workflow_of_run(control_plane, run_id)
    assert workflow["spec"]["serviceAccountName"] == "pipeline-runner"

    def controller_took_it() -> bool:
        got = control_plane.kubectl(
            "get", "workflow", "-n", kfp_harness.NAMESPACE, workflow["metadata"]["name"], "-o", "json"
        )
        return json.loads(got.stdout).get("status", {}).get("phase") in (
            "Running",
            "Failed",
            "Succeeded",
            "Error",
        )

    control_plane.wait_for(
        "the Argo controller to start the Workflow", controller_took_it, timeout_s=_TIMEOUT_S
    )
    # The persistence agent reports the Workflow's state back into the KFP run: the API server alone
    # leaves a new run PENDING (backend/src/apiserver/resource/resource_manager.go, CreateRun sets
    # `run.State = model.RuntimeStatePending`); RUNNING comes from the Workflow the agent read.
    seen: list[dict] = []

    def reported_running() -> bool:
        rows = json.loads(_cli(kfp_backend, "runs", "--json").stdout)
        seen[:] = [row for row in rows if row["run_id"] == run_id]
        return bool(seen) and seen[0]["state"] == "RUNNING"

    control_plane.wait_for(
        "the persistence agent to report the run RUNNING", reported_running, timeout_s=_TIMEOUT_S
    )
    assert seen, f"run {run_id} is not listed"


def test_training_workflow_keeps_gpu_secrets_retries_and_caching(kfp_backend, control_plane):
    workflow = _workflow_of_run(control_plane, _submit(kfp_backend, "training"))
    drivers = _driver_inputs(workflow)
    steps = {name for name in drivers if name not in ("write-run-summary",)}
    assert {"download-dataset", "preprocess-dataset", "train-model", "train-on-trainer"} <= steps

    # The secret-backed object-store credentials reach every step, the exit handler included.
    for name, inputs in drivers.items():
        assert {"MINIO_ACCESS_KEY", "MINIO_SECRET_KEY"} <= _secret_env(inputs["kubernetes-config"]), name

    # GPU request, GPU toleration and the /dev/shm volume: on the training step only.
    for name, inputs in drivers.items():
        k8s, container = inputs["kubernetes-config"], inputs["container"]
        accelerator = container.get("resources", {}).get("accelerator", {})
        tolerates_gpu = any(t.get("key") == "nvidia.com/gpu" for t in k8s.get("tolerations", []))
        shm = [v for v in k8s.get("emptyDirMounts", []) if v.get("mountPath") == "/dev/shm"]
        on_train = name == "train-model"
        assert bool(accelerator) == on_train, (name, accelerator)
        assert tolerates_gpu == on_train, (name, k8s.get("tolerations"))
        assert bool(shm) == on_train, (name, k8s.get("emptyDirMounts"))
    assert drivers["train-model"]["container"]["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"

    # Retries: the training steps run under Argo's retry executor with our retry count.
    executors = _executor_tasks(workflow)
    retried = {
        name for name, task in executors.items() if task["template"] == "retry-system-container-executor"
    }
    assert retried == {"train-model", "train-on-trainer"}
    for name in retried:
        args = {p["name"]: p["value"] for p in executors[name]["arguments"]["parameters"]}
        assert int(args["retry-max-count"]) >= 1, args

    # Caching where it should be (download, preprocess) and nowhere else.
    cached = {
        name
        for name, inputs in drivers.items()
        if inputs["task"].get("cachingOptions", {}).get("enableCache")
    }
    assert cached == {"download-dataset", "preprocess-dataset"}


def test_no_cache_submission_caches_nothing(kfp_backend, control_plane):
    done = _cli(kfp_backend, "submit", "--pipeline", "training", "--no-cache")
    workflow = _workflow_of_run(control_plane, _RUN_ID.search(done.stdout).group(1))
    drivers = _driver_inputs(workflow)
    assert not [n for n, i in drivers.items() if i["task"].get("cachingOptions", {}).get("enableCache")]


@pytest.mark.parametrize("pipeline", ["sweep", "tune"])
def test_other_pipelines_keep_secrets_on_every_step(kfp_backend, control_plane, pipeline):
    workflow = _workflow_of_run(control_plane, _submit(kfp_backend, pipeline))
    drivers = _driver_inputs(workflow)
    assert drivers
    for name, inputs in drivers.items():
        assert {"MINIO_ACCESS_KEY", "MINIO_SECRET_KEY"} <= _secret_env(inputs["kubernetes-config"]), name


def test_schedule_fires_runs_on_schedule(kfp_backend, control_plane):
    # Every 10 s; the real scheduled-workflow controller makes a Workflow per firing. Two may run at
    # once: on kwok nodes no step's pod ever finishes, and with the default of one the controller
    # holds every later firing ("nothing to submit") until the first run ends.
    _cli(
        kfp_backend,
        "schedule",
        "--name",
        "every-10s",
        "--cron",
        "*/10 * * * * *",
        "--no-catchup",
        "--max-concurrency",
        "2",
    )
    swf = yaml.safe_load(
        control_plane.kubectl_ok(
            "get", "scheduledworkflows", "-n", kfp_harness.NAMESPACE, "-o", "yaml"
        ).stdout
    )
    assert [s["spec"]["trigger"]["cronSchedule"]["cron"] for s in swf["items"]] == ["*/10 * * * * *"]
    names: set[str] = set()

    def fired_twice() -> bool:
        got = control_plane.kubectl(
            "get",
            "workflows",
            "-n",
            kfp_harness.NAMESPACE,
            "-l",
            "scheduledworkflows.kubeflow.org/isOwnedByScheduledWorkflow=true",
            "-o",
            "json",
        )
        names.update(item["metadata"]["name"] for item in json.loads(got.stdout or "{}").get("items", []))
        return len(names) >= 2

    control_plane.wait_for("two firings of the recurring run", fired_twice, timeout_s=60)
    _cli(kfp_backend, "schedule", "--disable", "every-10s")
