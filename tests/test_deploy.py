"""The plain Kubernetes manifests in deploy/: schema-valid, renderable, secure, and runnable by the real CLI."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# The oldest Kubernetes minor we support (podFailurePolicy is GA from 1.31) and the newest schema we have.
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
SECRET_NAME = "mlpipeline-minio-artifact"
CREDENTIAL_ENV = re.compile(r"(ACCESS_KEY|SECRET|PASSWORD|TOKEN|CREDENTIAL)", re.IGNORECASE)


def _manifest_files() -> list[Path]:
    files = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert files, "deploy/ has no manifests"
    return files


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _all_documents() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in _manifest_files() for doc in _documents(path)]


def _job() -> dict:
    (job,) = [doc for doc in _documents(DEPLOY / "train-job.yaml") if doc["kind"] == "Job"]
    return job


def _train_container(job: dict) -> dict:
    (container,) = [c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "train"]
    return container


def _pod_specs(doc: dict) -> list[dict]:
    """Every pod spec a workload object creates (Pod, Job, CronJob, Deployment-like templates)."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind == "Pod":
        return [spec]
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
    job["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1  # unknown field: strict mode refuses it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)


def _kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        probe = subprocess.run(["kubectl", "kustomize", "--help"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["kubectl", "kustomize"]
    return None


def test_kustomize_build_renders_the_manifests():
    command = _kustomize_command()
    if command is None:
        pytest.skip(
            "neither kustomize nor kubectl (which embeds it) is installed; Debian has no kustomize package"
        )
    result = subprocess.run([*command, str(DEPLOY)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    kinds = sorted((doc["kind"], doc["metadata"]["name"]) for doc in rendered)
    assert kinds == [
        ("Job", "cifar10-kfp-train"),
        ("Role", "cifar10-kfp-trainjobs"),
        ("RoleBinding", "cifar10-kfp-trainjobs"),
        ("ServiceAccount", "cifar10-kfp-train"),
    ], "the example Secret must never be rendered: it would overwrite a real one with placeholders"
    import kubernetes_validate

    for doc in rendered:
        assert doc["metadata"]["namespace"] == "kubeflow"
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "cifar10-kfp"
        kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)


# --- the Job ---


def test_job_retries_resume_and_preemption_is_not_a_failure():
    spec = _job()["spec"]
    assert spec["backoffLimit"] >= 1
    assert spec["template"]["spec"]["restartPolicy"] == "Never", (
        "podFailurePolicy requires restartPolicy: Never"
    )
    rules = spec["podFailurePolicy"]["rules"]
    ignore = [r for r in rules if r["action"] == "Ignore"]
    conditions = [c for r in ignore for c in r["onPodConditions"]]
    assert {"type": "DisruptionTarget", "status": "True"} in conditions, "preemption must not count as failure"
    assert all(r["action"] in ("Ignore", "FailJob", "FailIndex", "Count") for r in rules)


def _resolve(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, others stay as written."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def _container_env(container: dict) -> dict[str, str]:
    """Name -> value as the kubelet would expand it (valueFrom entries become placeholders)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _resolve(item["value"], env)
        else:
            env[item["name"]] = f"<{item['name']} from {next(iter(item['valueFrom']))}>"
    return env


def test_job_runs_the_real_cli_train_command():
    from pipelines.cli import get_args_parser

    container = _train_container(_job())
    assert container["command"] == ["cifar10-kfp"], "the image's console script"
    env = _container_env(container)
    argv = [_resolve(arg, env) for arg in container["args"]]
    unresolved = [arg for arg in argv if re.search(r"\$\([A-Za-z_]", arg)]
    assert not unresolved, f"args reference variables the container does not define: {unresolved}"
    parser = get_args_parser()
    if "train" not in parser._subparsers._group_actions[0].choices:  # noqa: SLF001
        pytest.skip("the train subcommand (pipelines/commands/train.py) is not in this checkout yet")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"cifar10-kfp rejects the Job's arguments {argv}: exit {exc.code}")
    assert args.command == "train"
    assert getattr(args, "checkpoint_uri", None) == env["CHECKPOINT_URI"]


def test_job_checkpoint_uri_is_fixed_for_the_life_of_the_job():
    container = _train_container(_job())
    env_items = {item["name"]: item for item in container["env"]}
    uri = env_items["CHECKPOINT_URI"]["value"]
    assert uri.startswith("s3://")
    # The only variable part is the Job's UID: the same for every retry pod, so each retry resumes.
    for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", uri):
        field = env_items[name]["valueFrom"]["fieldRef"]["fieldPath"]
        assert field == "metadata.labels['batch.kubernetes.io/controller-uid']"
    assert "--checkpoint-uri=$(CHECKPOINT_URI)" in container["args"]


def test_job_uses_one_gpu_with_requests_and_limits():
    pod = _job()["spec"]["template"]["spec"]
    container = _train_container(_job())
    resources = container["resources"]
    assert str(resources["limits"]["nvidia.com/gpu"]) == "1"
    assert str(resources["requests"].get("nvidia.com/gpu", "1")) == "1"
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    for c in pod.get("initContainers", []) + pod["containers"]:
        assert {"requests", "limits"} <= set(c["resources"]), f"container {c['name']} has no requests/limits"


def test_job_image_is_the_versioned_project_image(monkeypatch):
    from components import image

    monkeypatch.delenv("CIFAR10_KFP_IMAGE", raising=False)
    pod = _job()["spec"]["template"]["spec"]
    for c in pod.get("initContainers", []) + pod["containers"]:
        assert c["image"] == image.image(), "deploy/ must run the image `make image` pushes for this version"


def test_job_takes_object_store_credentials_from_the_secret():
    env = {item["name"]: item for item in _train_container(_job())["env"]}
    assert env["MINIO_ENDPOINT"]["value"] == "seaweedfs.kubeflow:9000"
    for name, key in (("MINIO_ACCESS_KEY", "accesskey"), ("MINIO_SECRET_KEY", "secretkey")):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": SECRET_NAME, "key": key}


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


def test_rbac_grants_trainjobs_and_nothing_else():
    docs = {(doc["kind"], doc["metadata"]["name"]): doc for doc in _documents(DEPLOY / "rbac.yaml")}
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
        ("trainer.kubeflow.org", "trainjobs", v) for v in ("create", "get", "list", "watch", "delete")
    }
    expected.add(("trainer.kubeflow.org", "trainjobs/status", "get"))
    assert granted == expected
    assert all("*" not in part for grant in granted for part in grant)
    assert not any("resourceNames" in rule or "nonResourceURLs" in rule for rule in role["rules"])
    binding = docs[("RoleBinding", "cifar10-kfp-trainjobs")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "cifar10-kfp-trainjobs",
    }
    assert [s["kind"] for s in binding["subjects"]] == ["ServiceAccount"]
    # The Job's own identity needs no API access at all.
    job_pod = _job()["spec"]["template"]["spec"]
    account = docs[("ServiceAccount", job_pod["serviceAccountName"])]
    assert account["automountServiceAccountToken"] is False
    assert job_pod["automountServiceAccountToken"] is False
    assert job_pod["serviceAccountName"] not in [s["name"] for s in binding["subjects"]]


def test_no_credentials_anywhere_in_deploy():
    for path in sorted(DEPLOY.iterdir()):
        text = path.read_text()
        assert not re.search(r"minio123|AKIA[0-9A-Z]{16}|BEGIN [A-Z ]*PRIVATE KEY", text), path.name
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
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
        for item in _train_container(_job())["env"]
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    assert wanted == set(secret["stringData"])
