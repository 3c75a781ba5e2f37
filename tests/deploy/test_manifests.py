"""The plain Kubernetes manifests in deploy/: schema-valid, renderable, secure, and runnable by the real CLI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT

DEPLOY = ROOT / "deploy"
# The oldest Kubernetes minor we support (podFailurePolicy is GA from 1.31) and the newest schema we have.
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
SECRET_NAME = "mlpipeline-minio-artifact"
CREDENTIAL_ENV = re.compile(r"(ACCESS_KEY|SECRET|PASSWORD|TOKEN|CREDENTIAL)", re.IGNORECASE)


JOB_FILE = DEPLOY / "train-job" / "train-job.yaml"
RBAC_FILE = DEPLOY / "rbac" / "rbac.yaml"
SERVING_ACCOUNT_FILE = DEPLOY / "serving" / "service-account.yaml"


def _manifest_files() -> list[Path]:
    files = sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")
    assert files, "deploy/ has no manifests"
    return files


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _all_documents() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in _manifest_files() for doc in _documents(path)]


def _job() -> dict:
    (job,) = [doc for doc in _documents(JOB_FILE) if doc["kind"] == "Job"]
    return job


def _job_config() -> dict[str, str]:
    (config,) = [doc for doc in _documents(JOB_FILE) if doc["kind"] == "ConfigMap"]
    return config["data"]


def _steps(job: dict) -> list[dict]:
    """The pod's containers in the order they run: init containers one by one, then the main one(s)."""
    pod = job["spec"]["template"]["spec"]
    return pod.get("initContainers", []) + pod["containers"]


def _step(job: dict, name: str) -> dict:
    (container,) = [c for c in _steps(job) if c["name"] == name]
    return container


def _pod_specs(doc: dict) -> list[dict]:
    """Every pod spec a workload object creates (Pod, Job, CronJob, Deployment-like templates)."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "Pod":
        return [spec]
    if kind in ("ClusterTrainingRuntime", "TrainingRuntime"):  # a JobSet template of Job templates
        return [
            rjob["template"]["spec"]["template"]["spec"]
            for rjob in spec["template"]["spec"]["replicatedJobs"]
        ]
    if kind == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    if "template" in spec:
        return [spec["template"]["spec"]]
    return []


# --- schema ---


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_openapi_schema(version):
    import kubernetes_validate

    for path, doc in _all_documents():
        if doc["apiVersion"].startswith("trainer.kubeflow.org/"):
            continue  # no schema here: the real API server checks it (tests/cluster/test_manifests_dry_run.py)
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{path.name} {doc['kind']}/{doc['metadata']['name']} is invalid for {version}: {exc}"
            )


def test_schema_validation_catches_a_broken_job():
    import kubernetes_validate

    job = _job()
    job["spec"]["backoffLimit"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)
    job = _job()
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["gpus"] = (
        1  # unknown: strict mode refuses it
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)


def _kustomize(folder: Path) -> list[dict]:
    """``kustomize build`` of a folder, with kustomize built from its Go module (once; cached outside the repo)."""
    from localcluster.gobuild import ensure_binary

    kustomize = ensure_binary("kustomize")  # `make test` builds it first (the `tools` target)
    result = subprocess.run(
        [str(kustomize), "build", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.mark.parametrize(("base", "expected"), [
    ("rbac", [("Role", "cifar10-kfp-trainjobs"), ("RoleBinding", "cifar10-kfp-trainjobs")]),
    ("train-job", [("ConfigMap", "cifar10-kfp-train"), ("Job", "cifar10-kfp-train"),
                   ("ServiceAccount", "cifar10-kfp-train")]),
    ("serving", [("ServiceAccount", "cifar10-kfp-serving")]),
])  # fmt: skip
def test_each_kustomize_base_renders_only_its_own_objects(base, expected):
    """Applying the RBAC never starts the GPU Job; no example Secret is ever rendered (it would overwrite a
    real one with placeholders)."""
    import kubernetes_validate

    rendered = _kustomize(DEPLOY / base)
    assert sorted((doc["kind"], doc["metadata"]["name"]) for doc in rendered) == expected
    for doc in rendered:
        assert doc["metadata"]["namespace"] == "kubeflow"
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "cifar10-kfp"
        kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)
    assert not (DEPLOY / "kustomization.yaml").exists(), (
        "one kustomization for everything would start the Job"
    )


def _granted_service_accounts(binding: dict) -> set[str]:
    """The identities a RoleBinding grants, resolved as the RBAC authorizer does: a ServiceAccount subject
    without a namespace is in the binding's own (kubernetes pkg/registry/rbac/validation/rule.go,
    appliesToUser)."""
    namespace = binding["metadata"]["namespace"]
    return {f"system:serviceaccount:{s.get('namespace') or namespace}:{s['name']}"
            for s in binding["subjects"] if s["kind"] == "ServiceAccount"}  # fmt: skip


def test_a_namespace_overlay_binds_that_namespaces_pipeline_runner():
    standalone = {d["kind"]: d for d in _kustomize(DEPLOY / "rbac")}["RoleBinding"]
    assert "system:serviceaccount:kubeflow:pipeline-runner" in _granted_service_accounts(standalone)
    rendered = _kustomize(DEPLOY / "overlays" / "profile")
    assert {doc["metadata"]["namespace"] for doc in rendered} == {"team-a"}
    binding = {d["kind"]: d for d in rendered}["RoleBinding"]
    granted = _granted_service_accounts(binding)
    assert "system:serviceaccount:team-a:default-editor" in granted  # multi-user KFP's runner
    assert not [g for g in granted if ":kubeflow:" in g], "an overlay must not grant anything in kubeflow"
    assert ("ServiceAccount", "cifar10-kfp-serving") in {(d["kind"], d["metadata"]["name"]) for d in rendered}


def test_the_serving_account_is_the_one_published_models_run_as_and_lists_an_annotated_s3_secret():
    from cifar10_kfp.publish.bundle import DEFAULT_SERVICE_ACCOUNT
    from cifar10_kfp_pipelines.policy import DEFAULT_MINIO_ENDPOINT

    (account,) = _documents(SERVING_ACCOUNT_FILE)
    assert account["metadata"]["name"] == DEFAULT_SERVICE_ACCOUNT
    assert account["automountServiceAccountToken"] is False
    (secret,) = _documents(DEPLOY / "serving" / "s3-secret.example.yaml")
    assert [{"name": secret["metadata"]["name"]}] == account["secrets"]
    # KServe's default key names and the annotations its storage initializer turns into S3_ENDPOINT etc.
    assert set(secret["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    annotations = secret["metadata"]["annotations"]
    assert annotations["serving.kserve.io/s3-endpoint"] == DEFAULT_MINIO_ENDPOINT
    assert annotations["serving.kserve.io/s3-usehttps"] == "0"
    assert annotations["serving.kserve.io/s3-region"] == "us-east-1"


# --- the Job ---


def test_job_retries_resume_and_preemption_is_not_a_failure():
    from cifar10_kfp_pipelines.commands.publish import GATE_REFUSED

    spec = _job()["spec"]
    assert spec["backoffLimit"] >= 1
    assert spec["template"]["spec"]["restartPolicy"] == "Never", (
        "podFailurePolicy requires restartPolicy: Never"
    )
    assert spec["podReplacementPolicy"] == "Failed", "never two pods writing one checkpoint"
    rules = spec["podFailurePolicy"]["rules"]
    conditions = [c for r in rules if r["action"] == "Ignore" for c in r.get("onPodConditions", [])]
    assert {"type": "DisruptionTarget", "status": "True"} in conditions, (
        "preemption must not count as failure"
    )
    fail_job = [r["onExitCodes"] for r in rules if r["action"] == "FailJob"]
    assert fail_job == [{"containerName": "publish", "operator": "In", "values": [GATE_REFUSED]}], (
        "only the gate's refusal ends the Job without retrying; crashes and storage outages are retried"
    )


def _resolve(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, others stay as written."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def _container_env(container: dict, sources: dict[str, str] | None = None) -> dict[str, str]:
    """Name -> value as the kubelet would expand it: envFrom first, then env in order.

    ``sources`` stands in for what the cluster supplies (Secret keys, the Job UID, ConfigMap edits);
    anything it does not name stays a ``<NAME from ...>`` placeholder.
    """
    sources = sources or {}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert source["configMapRef"]["name"] == "cifar10-kfp-train"
        env.update({k: sources.get(k, v) for k, v in _job_config().items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _resolve(item["value"], env)
        else:
            env[item["name"]] = sources.get(
                item["name"], f"<{item['name']} from {next(iter(item['valueFrom']))}>"
            )
    return env


def _parsed_steps() -> dict[str, tuple[dict, object]]:
    """Each step's arguments, expanded as the kubelet does, parsed by the real ``cifar10-kfp`` parser."""
    from cifar10_kfp_pipelines.cli import get_args_parser

    parser = get_args_parser()
    out = {}
    for container in _steps(_job()):
        assert container["command"] == ["cifar10-kfp"], "each step runs the image's console script"
        env = _container_env(container)
        argv = [_resolve(arg, env) for arg in container["args"]]
        unresolved = [arg for arg in argv if re.search(r"\$\([A-Za-z_]", arg)]
        assert not unresolved, (
            f"{container['name']}: args use variables the container does not define: {unresolved}"
        )
        try:
            out[container["name"]] = (env, parser.parse_args(argv))
        except SystemExit as exc:
            pytest.fail(
                f"cifar10-kfp rejects the {container['name']} step's arguments {argv}: exit {exc.code}"
            )
    return out


def test_job_steps_are_real_cli_commands_that_hand_their_files_on():
    steps = _parsed_steps()
    assert [args.command for _, args in steps.values()] == ["data", "train", "publish"]
    (_, data), (train_env, train), (publish_env, publish) = steps.values()
    assert train.data == data.output, "train reads what prepare-data wrote"
    assert train.checkpoint_uri == train_env["CHECKPOINT_URI"]
    assert publish.model == f"{train.output_dir}/model", "publish takes the model directory train wrote"
    assert publish.data == data.output
    assert publish.model_name == _job_config()["MODEL_NAME"]
    assert publish.min_accuracy == float(_job_config()["MIN_ACCURACY"])
    assert data.source == _job_config()["DATASET_URI"]
    # Files pass between steps through volumes both steps mount.
    mounts = {c["name"]: {m["mountPath"] for m in c["volumeMounts"]} for c in _steps(_job())}
    assert "/data" in mounts["prepare-data"] & mounts["train"] & mounts["publish"]
    assert "/outputs" in mounts["train"] & mounts["publish"]


def test_job_checkpoint_uri_is_fixed_for_the_life_of_the_job():
    from cifar10_kfp.storage import parse_uri

    train = _step(_job(), "train")
    env_items = {item["name"]: item for item in train["env"]}
    uri_template = env_items["CHECKPOINT_URI"]["value"]
    # Its only per-pod input is the Job's UID: the same for every retry pod, so each retry resumes.
    for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", uri_template):
        if name in env_items:
            field = env_items[name]["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == "metadata.labels['batch.kubernetes.io/controller-uid']"
        else:
            assert name in _job_config(), f"$({name}) comes from nowhere"
    uri = _container_env(train)["CHECKPOINT_URI"].replace("<JOB_UID from fieldRef>", "0f1e2d3c-uid")
    location = parse_uri(uri)
    assert (location.bucket, location.key) == ("mlpipeline", "cifar10-kfp/checkpoints/job-0f1e2d3c-uid/")


def test_job_uses_one_gpu_with_requests_and_limits():
    pod = _job()["spec"]["template"]["spec"]
    assert str(_step(_job(), "train")["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    gpus = {c["name"]: int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) for c in _steps(_job())}
    # A pod's effective request: the largest init container, or the sum of the main containers.
    init = [gpus[c["name"]] for c in pod["initContainers"]]
    main = [gpus[c["name"]] for c in pod["containers"]]
    assert max(max(init), sum(main)) == 1, f"the pod must hold exactly one GPU: {gpus}"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    for c in _steps(_job()):
        resources = c["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), c["name"]
        assert "memory" in resources["limits"], c["name"]
        if "nvidia.com/gpu" in resources["requests"]:
            assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"], c["name"]


def test_job_image_is_the_versioned_project_image(monkeypatch):
    from cifar10_kfp_components import image

    monkeypatch.delenv("CIFAR10_KFP_IMAGE", raising=False)
    for c in _steps(_job()):
        assert c["image"] == image.image(), "deploy/ must run the image `make image` pushes for this version"


def test_job_reads_the_object_store_the_way_the_pipeline_does():
    from cifar10_kfp_pipelines.policy import DEFAULT_MINIO_ENDPOINT, MINIO_SECRET, MINIO_SECRET_KEYS

    config = _job_config()
    assert config["MINIO_ENDPOINT"] == DEFAULT_MINIO_ENDPOINT == "seaweedfs.kubeflow:9000"
    for container in _steps(_job()):
        env = {item["name"]: item for item in container["env"]}
        for key, variable in MINIO_SECRET_KEYS.items():
            assert "value" not in env[variable], f"{container['name']}: {variable} must come from the Secret"
            assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": MINIO_SECRET, "key": key}
    assert SECRET_NAME == MINIO_SECRET


# --- security ---


def test_every_pod_runs_with_the_restricted_pod_security_fields():
    pods = [(path, doc, pod) for path, doc in _all_documents() for pod in _pod_specs(doc)]
    assert pods, "no pod templates found"
    for path, doc, pod in pods:
        where = f"{path.name} {doc['kind']}/{doc['metadata']['name']}"
        pod_sc = pod.get("securityContext", {})
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert pod_sc.get("runAsNonRoot") is True, where
        assert pod_sc.get("runAsUser", 1) != 0, where
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC"), where
        for volume in pod.get("volumes", []):
            assert "hostPath" not in volume, f"{where}: hostPath volume {volume['name']}"
        for container in pod.get("initContainers", []) + pod["containers"]:
            sc = container.get("securityContext", {})
            what = f"{where} container {container['name']}"
            assert sc.get("allowPrivilegeEscalation") is False, what
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], what
            assert not sc.get("capabilities", {}).get("add"), what
            assert not sc.get("privileged"), what
            assert sc.get("runAsNonRoot", True) is True and sc.get("runAsUser", 1) != 0, what


def test_rbac_grants_trainjobs_and_event_listing_and_nothing_else():
    docs = {
        (doc["kind"], doc["metadata"]["name"]): doc for doc in _documents(RBAC_FILE) + _documents(JOB_FILE)
    }
    assert not [k for k in docs if k[0] in ("ClusterRole", "ClusterRoleBinding")], (
        "namespaced permissions only"
    )
    role = docs[("Role", "cifar10-kfp-trainjobs")]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    expected = {
        ("trainer.kubeflow.org", "trainjobs", v)
        for v in ("create", "get", "list", "watch", "patch", "delete")
    } | {("", "events", "list")}
    assert granted == expected
    assert all("*" not in part for grant in granted for part in grant)
    assert not any("resourceNames" in rule or "nonResourceURLs" in rule for rule in role["rules"])
    binding = docs[("RoleBinding", "cifar10-kfp-trainjobs")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "cifar10-kfp-trainjobs",
    }
    assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [
        ("ServiceAccount", "pipeline-runner"), ("ServiceAccount", "default-editor")
    ]  # fmt: skip
    # The Job's own identity needs no API access at all.
    job_pod = _job()["spec"]["template"]["spec"]
    account = docs[("ServiceAccount", job_pod["serviceAccountName"])]
    assert account["automountServiceAccountToken"] is False
    assert job_pod["automountServiceAccountToken"] is False
    assert job_pod["serviceAccountName"] not in [s["name"] for s in binding["subjects"]]


def test_no_credentials_anywhere_in_deploy():
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        text = path.read_text()
        assert not re.search(r"minio123|AKIA[0-9A-Z]{16}|BEGIN [A-Z ]*PRIVATE KEY", text), path.name
        for doc in yaml.safe_load_all(text) if path.suffix == ".yaml" else []:
            if not doc:
                continue
            if doc.get("kind") == "ConfigMap":
                leaked = [key for key in doc.get("data", {}) if CREDENTIAL_ENV.search(key)]
                assert not leaked, f"{path.name}: credentials {leaked} in a ConfigMap; use the Secret"
            if doc.get("kind") == "Secret":
                assert "data" not in doc, f"{path.name}: base64 data in a committed Secret"
                assert set(doc["stringData"].values()) == {"REPLACE_ME"}, f"{path.name}: placeholders only"
                assert path.name.endswith(".example.yaml")
            for pod in _pod_specs(doc):
                for container in pod.get("initContainers", []) + pod["containers"]:
                    for item in container.get("env", []):
                        if CREDENTIAL_ENV.search(item["name"]):
                            assert "value" not in item, f"{path.name}: {item['name']} has a literal value"
                            assert "secretKeyRef" in item["valueFrom"], f"{path.name}: {item['name']}"


def test_example_secret_has_the_keys_the_job_reads():
    (secret,) = _documents(DEPLOY / "object-store-secret.example.yaml")
    assert secret["metadata"]["name"] == SECRET_NAME
    wanted = {
        item["valueFrom"]["secretKeyRef"]["key"]
        for container in _steps(_job())
        for item in container["env"]
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    assert wanted == set(secret["stringData"])


# --- the Job's steps, run for real (in this process, on the embedded store, with tiny data) ---


@pytest.mark.slow
def test_job_steps_run_in_order_and_a_retried_pod_resumes(
    store_env, real_archive, tmp_path, monkeypatch, capsys
):
    """prepare-data -> train -> publish with the manifest's own arguments, then a 'retry' of the pod.

    Only what a laptop cannot do is changed: the pod's volumes become temporary folders, the dataset is a
    tiny subset of the real archive (so the ConfigMap's MIN_ACCURACY becomes 0), and train appends a
    CPU-sized preset (argparse: the last value wins).
    """
    from cifar10_kfp_pipelines.cli import main
    from tests.support.datagen import make_real_subset_archive

    archive = make_real_subset_archive(
        real_archive, tmp_path / "subset.tar.gz", 20, 6, seed=0
    )  # = the notebook test's
    volumes = {"/data": tmp_path / "data", "/outputs": tmp_path / "outputs"}
    job_uid = "5d6c0f2e-test"
    store_settings = {k: v for k, v in os.environ.items() if k.startswith(("MINIO_", "CIFAR10_KFP_"))}
    laptop = {"train": ["--preset=seed", "--architecture=simple_cnn", "--epochs=1", "--batch-size=32"]}

    def run_step(name: str) -> dict:
        container = _step(_job(), name)
        cluster = {**store_settings, "DATASET_URI": str(archive), "MIN_ACCURACY": "0", "JOB_UID": job_uid}
        env = _container_env(container, cluster)
        argv = [_resolve(arg, env) for arg in container["args"]] + laptop.get(name, [])
        for mount, folder in volumes.items():
            argv = [arg.replace(f"={mount}", f"={folder}") for arg in argv]
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        assert main(argv) == 0, f"step {name} failed: {capsys.readouterr()}"
        return env

    run_step("prepare-data")
    train_env = run_step("train")
    first = json.loads((volumes["/outputs"] / "metrics.json").read_text())
    assert first["resumed_from_epoch"] == 0
    checkpoint_uri = train_env["CHECKPOINT_URI"]
    assert job_uid in checkpoint_uri and store_env.list(checkpoint_uri), (
        "train left no checkpoint to resume from"
    )
    run_step("publish")
    published = [uri for uri in store_env.list(store_env.root_uri("models")) if uri.endswith("model.json")]
    assert published, "publish stored no model"

    # A retried pod starts with empty volumes but the same Job UID: data comes from the cache and
    # training resumes at its last checkpoint instead of starting over.
    shutil.rmtree(volumes["/data"])
    shutil.rmtree(volumes["/outputs"])
    run_step("prepare-data")
    run_step("train")
    resumed = json.loads((volumes["/outputs"] / "metrics.json").read_text())
    assert resumed["resumed_from_epoch"] == first["epochs"] == 1


def test_the_profile_job_overlay_writes_where_that_namespaces_identity_may():
    """Multi-user Kubeflow: a profile's identity writes only below private/<namespace>/ and a few shared
    prefixes (pipelines-profile-controller/sync.py); the overlay's prefix is the pipeline runs' default there."""
    from cifar10_kfp.storage import default_prefix

    overlay = yaml.safe_load((DEPLOY / "overlays" / "profile-train-job" / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../../train-job"]
    (patch,) = yaml.safe_load(overlay["patches"][0]["patch"])
    assert patch["path"] == "/data/CIFAR10_KFP_PREFIX"
    assert (
        patch["value"]
        == default_prefix(overlay["namespace"])
        == f"private/{overlay['namespace']}/cifar10-kfp/"
    )
