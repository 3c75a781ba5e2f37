"""The compiled pipeline specs (pipelines/compiled/*.yaml): no drift from the code, and the IR says what
the cluster needs: DAG edges, GPUs, toleration, secrets, retry, per-task caching, image, descriptions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cifar10_kfp.params.table import SWEEP_PARAMS, TRAINING_PARAMS
from cifar10_kfp_pipelines.catalog import COMPILED_DIR, compile_to
from cifar10_kfp_pipelines.policy import IMAGE_UID, ClusterPolicy

SECRET = "mlpipeline-minio-artifact"


def _load(path: Path) -> tuple[dict, dict]:
    spec, platform = yaml.safe_load_all(path.read_text())
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


@pytest.fixture(scope="module")
def training() -> tuple[dict, dict]:
    return _load(COMPILED_DIR / "cifar10-training.yaml")


@pytest.fixture(scope="module")
def sweep() -> tuple[dict, dict]:
    return _load(COMPILED_DIR / "cifar10-sweep.yaml")


def _dags(spec: dict) -> dict[str, dict]:
    """Every DAG in the spec by component name ('root' for the pipeline)."""
    out = {"root": spec["root"]["dag"]["tasks"]}
    for name, comp in spec["components"].items():
        if "dag" in comp:
            out[name] = comp["dag"]["tasks"]
    return out


def _tasks(spec: dict) -> dict[str, dict]:
    return {name: task for tasks in _dags(spec).values() for name, task in tasks.items()}


def _executor(spec: dict, task_name: str) -> dict:
    comp = spec["components"][_tasks(spec)[task_name]["componentRef"]["name"]]
    return spec["deploymentSpec"]["executors"][comp["executorLabel"]]["container"]


@pytest.mark.parametrize("name", ["training", "sweep"])
def test_committed_specs_match_the_code(name, tmp_path, monkeypatch):
    """`make compile` output is committed; regenerate it when this fails."""
    monkeypatch.delenv("CIFAR10_KFP_IMAGE", raising=False)
    committed = COMPILED_DIR / f"cifar10-{name}.yaml"
    fresh = compile_to(name, tmp_path / committed.name, ClusterPolicy())
    assert fresh.read_text() == committed.read_text(), (
        f"{committed} is stale: run `make compile` and commit it"
    )


def test_training_dag_edges(training):
    spec, _ = training
    dags = _dags(spec)
    root = dags["root"]
    assert root["write-run-summary"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert root["write-run-summary"]["dependentTasks"] == ["exit-handler-1"]
    body = dags["comp-exit-handler-1"]
    assert "dependentTasks" not in body["validate-training-params"]  # validation runs first
    assert body["download-dataset"]["dependentTasks"] == ["validate-training-params"]
    assert body["preprocess-dataset"]["dependentTasks"] == ["download-dataset"]
    # Two complementary conditions with names the KFP UI's DAG shows (not an If/Else group).
    branches = {body[n]["taskInfo"]["name"]: body[n] for n in body if n.startswith("condition-")}
    assert set(branches) == {"single-node", "multi-node"}
    single, multi = (dags[branches[n]["componentRef"]["name"]] for n in ("single-node", "multi-node"))
    conditions = {n: b["triggerPolicy"]["condition"] for n, b in branches.items()}
    assert conditions == {
        "single-node": "int(inputs.parameter_values['pipelinechannel--num_nodes']) == 1",
        "multi-node": "int(inputs.parameter_values['pipelinechannel--num_nodes']) > 1",
    }
    assert set(single) >= {"train-model", "evaluate-model", "gate-model", "record-run-outputs"}
    assert set(multi) >= {"train-on-trainer", "evaluate-model-2", "gate-model-2", "record-run-outputs-2"}
    assert single["evaluate-model"]["dependentTasks"] == ["train-model"]
    assert single["gate-model"]["dependentTasks"] == ["evaluate-model", "train-model"]
    [gate_branch] = [n for n in single if n.startswith("condition-")]
    assert (
        single[gate_branch]["triggerPolicy"]["condition"]
        == "inputs.parameter_values['pipelinechannel--gate-model-passed'] == true"
    )
    published = dags[single[gate_branch]["componentRef"]["name"]]
    assert published["record-publication"]["dependentTasks"] == ["publish-model"]
    assert published["publish-model"]["inputs"]["artifacts"]["model"]["componentInputArtifact"].endswith(
        "train-model-model"
    )


def test_train_gets_gpus_resources_toleration_and_retry(training):
    spec, platform = training
    container = _executor(spec, "train-model")
    accel = container["resources"]["accelerator"]
    assert accel["resourceType"] == "nvidia.com/gpu"
    # a string task output: the KFP driver reads resource counts with GetStringValue()
    assert (
        accel["resourceCount"]
        == "{{$.inputs.parameters['pipelinechannel--validate-training-params-gpu_limit']}}"
    )
    policy = ClusterPolicy()
    assert container["resources"]["resourceCpuRequest"] == policy.train_resources.cpu_request
    assert container["resources"]["resourceMemoryLimit"] == policy.train_resources.memory_limit
    assert platform["exec-train-model"]["tolerations"] == [
        {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
    ]
    retry = _tasks(spec)["train-model"]["retryPolicy"]
    assert retry == {
        "backoffDuration": "60s",
        "backoffFactor": 2.0,
        "backoffMaxDuration": "1800s",
        "maxRetryCount": 3,
    }
    # the multi-node launcher holds no GPU: the TrainJob's nodes do
    assert "accelerator" not in _executor(spec, "train-on-trainer").get("resources", {})
    assert _tasks(spec)["train-on-trainer"]["retryPolicy"]["maxRetryCount"] == 3


def _container_tasks(spec: dict):
    """(task name, task, executor label) of every task that runs a container."""
    for name, task in _tasks(spec).items():
        if "componentRef" not in task or name.startswith(("condition-", "exit-handler", "for-loop")):
            continue
        label = spec["components"][task["componentRef"]["name"]].get("executorLabel")
        if label is not None:
            yield name, task, label


@pytest.mark.parametrize("which", ["training", "sweep"])
def test_every_step_gets_the_secret_endpoint_and_run_identity_and_caching_is_per_task(which, training, sweep):
    """Every step may record its failure, so every step reaches the store and knows its run and task."""
    spec, platform = {"training": training, "sweep": sweep}[which]
    for name, task, label in _container_tasks(spec):
        env = {e["name"]: e["value"] for e in spec["deploymentSpec"]["executors"][label]["container"]["env"]}
        [secret] = platform[label]["secretAsEnv"]
        assert secret["secretName"] == SECRET
        assert {(k["secretKey"], k["envVar"]) for k in secret["keyToEnv"]} == {
            ("accesskey", "MINIO_ACCESS_KEY"), ("secretkey", "MINIO_SECRET_KEY")
        }  # fmt: skip
        assert env["MINIO_ENDPOINT"] == "seaweedfs.kubeflow:9000", name
        assert env["CIFAR10_KFP_TASK"] == name
        assert platform[label]["fieldPathAsEnv"] == [
            {"fieldPath": "metadata.labels['pipeline/runid']", "name": "CIFAR10_KFP_RUN_ID"}
        ]
        cached = task.get("cachingOptions", {}).get("enableCache", False)
        assert cached == name.startswith(("download-dataset", "preprocess-dataset")), name
        if cached:  # the store is part of the cache key: an input, not only an environment variable
            endpoint = task["inputs"]["parameters"]["minio_endpoint"]["runtimeValue"]["constant"]
            assert endpoint == "seaweedfs.kubeflow:9000"


@pytest.mark.parametrize("which", ["training", "sweep"])
def test_only_the_train_step_may_see_gpus(which, training, sweep):
    """CPU steps: NVIDIA_VISIBLE_DEVICES=void and no GPU toleration; train: GPUs, toleration, /dev/shm in memory."""
    spec, platform = {"training": training, "sweep": sweep}[which]
    for name, _, label in _container_tasks(spec):
        container = spec["deploymentSpec"]["executors"][label]["container"]
        env = {e["name"]: e["value"] for e in container["env"]}
        if name == "train-model":
            assert "NVIDIA_VISIBLE_DEVICES" not in env  # it would override the device plugin's assignment
            assert platform[label]["tolerations"][0]["key"] == "nvidia.com/gpu"
            assert platform[label]["emptyDirMounts"] == [
                {"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": "2Gi", "volumeName": "dshm"}
            ]
            continue
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void", name
        assert "tolerations" not in platform[label] and "accelerator" not in container.get("resources", {}), (
            name
        )


@pytest.mark.parametrize("which", ["training", "sweep"])
def test_every_step_runs_the_one_image_and_no_credential_is_in_the_yaml(which, training, sweep):
    spec, _ = {"training": training, "sweep": sweep}[which]
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {ClusterPolicy().image}
    text = (COMPILED_DIR / f"cifar10-{which}.yaml").read_text()
    assert "minio123" not in text and not re.search(r"AKIA[0-9A-Z]{16}|aws_secret|password", text, re.I)
    for executor in spec["deploymentSpec"]["executors"].values():
        for env in executor["container"].get("env", []):
            assert not re.search(r"KEY|SECRET|TOKEN|PASSWORD", env["name"]), (
                env
            )  # credentials only via secret refs


@pytest.mark.parametrize(("which", "params"), [("training", TRAINING_PARAMS), ("sweep", SWEEP_PARAMS)])
def test_parameters_have_types_defaults_and_descriptions(which, params, training, sweep):
    spec, _ = {"training": training, "sweep": sweep}[which]
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    kinds = {int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", str: "STRING"}
    assert list(inputs) == sorted(p.name for p in params)
    for p in params:
        assert inputs[p.name]["parameterType"] == kinds[p.kind]
        assert inputs[p.name]["defaultValue"] == p.default
        assert " ".join(inputs[p.name]["description"].split()) == p.description


@pytest.mark.parametrize(("which", "params"), [("training", TRAINING_PARAMS), ("sweep", SWEEP_PARAMS)])
def test_validate_takes_every_parameter_and_ships_the_generated_source(which, params, training, sweep):
    """The generated validate component: its inputs are the pipeline's, and the program in the YAML defines them."""
    spec, _ = {"training": training, "sweep": sweep}[which]
    task_name = f"validate-{which}-params"
    body = _dags(spec)["comp-exit-handler-1"]
    inputs = body[task_name]["inputs"]["parameters"]
    assert {name: arg["componentInputParameter"] for name, arg in inputs.items()} == {
        p.name: f"pipelinechannel--{p.name}" for p in params
    }
    component = spec["components"][body[task_name]["componentRef"]["name"]]
    assert list(component["inputDefinitions"]["parameters"]) == sorted(p.name for p in params)
    program = _executor(spec, task_name)["command"][-1]
    signature = "".join(f"    {p.name}: {p.kind.__name__},\n" for p in params)
    assert f"def validate_{which}_params(\n{signature}) -> NamedTuple(" in program
    module = __import__(f"cifar10_kfp_pipelines.{which}", fromlist=["SUMMARY"])
    assert spec["pipelineInfo"] == {"name": f"cifar10-{which}", "description": module.SUMMARY}


def test_train_steps_take_the_validated_training_settings(training, sweep):
    """Both train components get one settings dict: validate's output, or the sweep's loop item."""
    spec, _ = training
    for task_name in ("train-model", "train-on-trainer"):
        arg = _tasks(spec)[task_name]["inputs"]["parameters"]["training"]
        assert arg == {"componentInputParameter": "pipelinechannel--validate-training-params-training"}
    for inputs in (spec["components"]["comp-train-model"], spec["components"]["comp-train-on-trainer"]):
        params = inputs["inputDefinitions"]["parameters"]
        assert params["training"]["parameterType"] == "STRUCT"
        assert not {"preset", "epochs", "lr", "architecture", "learning_rate", "model"} & set(params)
    sweep_spec, _ = sweep
    arg = _tasks(sweep_spec)["train-model"]["inputs"]["parameters"]["training"]
    assert arg == {"componentInputParameter": "pipelinechannel--validate-sweep-params-trials-loop-item"}


def test_sweep_fans_out_collects_and_gates(sweep):
    spec, platform = sweep
    body = _dags(spec)["comp-exit-handler-1"]
    [loop_name] = [n for n in body if n.startswith("for-loop-")]
    loop = body[loop_name]
    assert (
        loop["parameterIterator"]["items"]["inputParameter"]
        == "pipelinechannel--validate-sweep-params-trials"
    )
    assert loop["iteratorPolicy"]["parallelismLimit"] == 2
    assert loop["dependentTasks"] == ["preprocess-dataset", "validate-sweep-params"]
    trial = _dags(spec)[loop["componentRef"]["name"]]
    assert trial["evaluate-model"]["dependentTasks"] == ["train-model"]
    assert platform["exec-train-model"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    select = body["select-best-model"]["inputs"]
    assert select["artifacts"]["models"]["taskOutputArtifact"]["producerTask"] == loop_name
    assert select["parameters"]["accuracies"]["taskOutputParameter"]["producerTask"] == loop_name
    assert body["gate-model"]["dependentTasks"] == ["preprocess-dataset", "select-best-model"]


def test_compile_options_change_image_endpoint_caching_and_parallelism(tmp_path):
    from cifar10_kfp_pipelines.cli import main

    assert main(["compile", "--output-dir", str(tmp_path), "--image", "registry.example/cifar:9",
                 "--minio-endpoint", "minio.storage:9000", "--cache", "evaluate", "--sweep-parallelism", "5"]) == 0  # fmt: skip
    spec, _ = _load(tmp_path / "cifar10-training.yaml")
    assert {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()} == {
        "registry.example/cifar:9"
    }
    assert _tasks(spec)["evaluate-model"]["cachingOptions"]["enableCache"] is True
    assert not _tasks(spec)["publish-model"].get("cachingOptions", {}).get("enableCache", False)
    env = {e["name"]: e["value"] for e in _executor(spec, "train-model")["env"]}
    assert env["MINIO_ENDPOINT"] == "minio.storage:9000"
    # another endpoint is another cache key for every cached step that touches the store
    download_inputs = _tasks(spec)["download-dataset"]["inputs"]["parameters"]
    assert download_inputs["minio_endpoint"]["runtimeValue"]["constant"] == "minio.storage:9000"
    sweep_spec, _ = _load(tmp_path / "cifar10-sweep.yaml")
    [loop] = [t for n, t in _tasks(sweep_spec).items() if n.startswith("for-loop-")]
    assert loop["iteratorPolicy"]["parallelismLimit"] == 5
    assert main(["compile", "--output-dir", str(tmp_path), "--cache", "everything"]) == 2


@pytest.mark.parametrize(("step", "why"), [
    ("train", "takes no minio_endpoint input, so KFP's cache key would not change with --minio-endpoint"),
    ("gate", "it compares against the currently published model"),
    ("record", "it writes this run's records"),
])  # fmt: skip
def test_steps_that_must_not_be_cached_are_refused_with_the_reason(step, why, tmp_path, capsys):
    from cifar10_kfp_pipelines.cli import main

    assert main(["compile", "--output-dir", str(tmp_path), "--cache", step]) == 2
    assert why in capsys.readouterr().err


def test_resource_flags_size_the_train_and_other_steps_for_a_small_node(tmp_path):
    """`--train-cpu 1 --train-memory 3Gi:6Gi` fits the train step on a 2-core CPU node (issue 24)."""
    from cifar10_kfp_pipelines.cli import main

    args = ["--train-cpu", "1", "--train-memory", "3Gi:6Gi", "--step-cpu", "500m:1", "--step-memory", "1Gi"]
    assert main(["compile", "--output-dir", str(tmp_path), "--pipeline", "training", *args]) == 0
    spec, _ = _load(tmp_path / "cifar10-training.yaml")
    train = _executor(spec, "train-model")["resources"]
    assert (train["resourceCpuRequest"], train["resourceCpuLimit"]) == ("1", "1")
    assert (train["resourceMemoryRequest"], train["resourceMemoryLimit"]) == ("3Gi", "6Gi")
    download = _executor(spec, "download-dataset")["resources"]
    assert (download["resourceCpuRequest"], download["resourceCpuLimit"]) == ("500m", "1")
    assert (download["resourceMemoryRequest"], download["resourceMemoryLimit"]) == ("1Gi", "1Gi")


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--train-cpu", "two", "--train-cpu 'two': not a positive Kubernetes quantity"),
    ("--train-memory", "8Gi:4Gi", "--train-memory '8Gi:4Gi': the request 8Gi is above the limit 4Gi"),
    ("--step-cpu", "0", "--step-cpu '0': not a positive Kubernetes quantity"),
])  # fmt: skip
def test_bad_resource_flags_are_refused_naming_the_value(flag, value, why, tmp_path, capsys):
    from cifar10_kfp_pipelines.cli import main

    assert main(["compile", "--output-dir", str(tmp_path), flag, value]) == 2
    assert why in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["training", "sweep", "tune"])
def test_every_task_runs_as_the_images_non_root_user(name):
    """`restricted` Pod Security admits a pod whose user container says runAsNonRoot; KFP's compiler
    hardens the rest (pipelines/policy.py says which file does what). Every container task, the
    exit handler's summary and the TrainJob launcher included, carries it."""
    spec, platform = _load(COMPILED_DIR / f"cifar10-{name}.yaml")
    labels = {label for _, _, label in _container_tasks(spec)}
    labels |= {c["executorLabel"] for c in spec["components"].values() if "executorLabel" in c}
    assert labels and labels == set(spec["deploymentSpec"]["executors"])
    for label in labels:
        context = platform[label]["securityContext"]  # protobuf JSON writes an int64 as a string
        assert (int(context["runAsUser"]), context["runAsNonRoot"]) == (IMAGE_UID, True), label


def test_the_tasks_user_is_the_images_user():
    dockerfile = (COMPILED_DIR.parents[1] / "images" / "train" / "Dockerfile").read_text()
    [user] = re.findall(r"^USER (\S+)$", dockerfile, flags=re.M)
    assert int(user.split(":")[0]) == IMAGE_UID != 0
