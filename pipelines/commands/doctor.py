"""``cifar10-kfp doctor``: check the cluster a user is about to run on, and say how to fix what is missing."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping
from dataclasses import dataclass

API_TIMEOUT_S = 15  # per request: a cluster that does not answer is reported, not waited on forever
HELP = "check the Kubernetes cluster: KFP up, object-store secret and endpoint, GPU nodes, Kubeflow Trainer"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True  # a failed optional check is a warning, not a failure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default="kubeflow", help="where runs execute (your profile namespace)")
    parser.add_argument("--kfp-namespace", default="kubeflow", help="where Kubeflow Pipelines is installed")
    parser.add_argument("--minio-endpoint", default=None,
                        help="object-store host:port the steps use (default seaweedfs.kubeflow:9000)")  # fmt: skip
    parser.add_argument("--num-nodes", type=int, default=1, help="check for Kubeflow Trainer when > 1")
    parser.add_argument("--runner", default=None,
                        help="the service account runs execute as (default: pipeline-runner in the KFP namespace, "
                        "else default-editor): checked for the TrainJob rights when --num-nodes > 1")  # fmt: skip
    parser.add_argument(
        "--kube-api", default=None, help="Kubernetes API URL (default: kubeconfig / in-cluster)"
    )
    parser.add_argument("--host", default=None,
                        help="KFP API URL to check the login against (default: KF_PIPELINES_ENDPOINT; "
                        "without either, that check is skipped)")  # fmt: skip
    parser.add_argument("--token", default=None, help="bearer token (default: KF_PIPELINES_TOKEN)")
    parser.add_argument(
        "--cookies", default=None, help="gateway session cookie(s) (default: KF_PIPELINES_COOKIES)"
    )


def _api_get(api_client, path: str):
    """GET ``path`` from the API server; ``(status, json or None)``."""
    from kubernetes.client.exceptions import ApiException

    try:
        response = api_client.call_api(
            path, "GET", auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
            _request_timeout=API_TIMEOUT_S,
        )  # fmt: skip
        return 200, response
    except ApiException as exc:
        return exc.status, None


def _service_ready(api_client, namespace: str, service: str) -> tuple[bool, str]:
    status, endpoints = _api_get(api_client, f"/api/v1/namespaces/{namespace}/endpoints/{service}")
    if status != 200:
        return False, f"service {namespace}/{service} not found (HTTP {status})"
    ready = [a for s in endpoints.get("subsets") or [] for a in s.get("addresses") or []]
    if not ready:
        return False, f"service {namespace}/{service} has no ready pods"
    return True, f"service {namespace}/{service} has {len(ready)} ready pod(s)"


def check_kfp(api_client, kfp_namespace: str) -> Check:
    ok, detail = _service_ready(api_client, kfp_namespace, "ml-pipeline")
    return Check("Kubeflow Pipelines API", ok, detail,
                 f"install KFP 2.x in {kfp_namespace!r} or pass --kfp-namespace; check "
                 f"`kubectl -n {kfp_namespace} get pods -l app=ml-pipeline`")  # fmt: skip


def check_secret(api_client, namespace: str) -> Check:
    from cifar10_kfp_pipelines.policy import MINIO_SECRET, MINIO_SECRET_KEYS

    status, secret = _api_get(api_client, f"/api/v1/namespaces/{namespace}/secrets/{MINIO_SECRET}")
    fix = (f"create it: kubectl -n {namespace} create secret generic {MINIO_SECRET} "
           "--from-literal=accesskey=... --from-literal=secretkey=... (see deploy/)")  # fmt: skip
    if status == 403:
        return Check("object-store secret", False, f"not allowed to read secret {namespace}/{MINIO_SECRET}",
                     "ask for `get secrets` in the namespace, or check as the pipeline's service account")  # fmt: skip
    if status != 200:
        return Check("object-store secret", False, f"secret {namespace}/{MINIO_SECRET} not found", fix)
    missing = sorted(set(MINIO_SECRET_KEYS) - set(secret.get("data") or {}))
    if missing:  # only the key names are looked at; values are never printed
        return Check(
            "object-store secret", False, f"secret {namespace}/{MINIO_SECRET} lacks key(s) {missing}", fix
        )
    if _holds_well_known_pair(secret["data"]):
        return Check("object-store secret", False,
                     f"secret {namespace}/{MINIO_SECRET} holds standalone KFP's well-known default pair: runs "
                     "work (with a warning) but anyone can guess it",
                     f"rotate it in the object store and in {namespace}/{MINIO_SECRET}; compile with "
                     "--strict-credentials to refuse it", required=False)  # fmt: skip
    return Check(
        "object-store secret", True, f"secret {namespace}/{MINIO_SECRET} has accesskey and secretkey"
    )


def _holds_well_known_pair(data: dict) -> bool:
    """Compared, never printed: is the secret standalone KFP's default pair?"""
    import base64

    from cifar10_kfp.storage import WELL_KNOWN_DEV_CREDENTIALS

    try:
        pair = tuple(base64.b64decode(data[key]).decode() for key in ("accesskey", "secretkey"))
    except (ValueError, UnicodeDecodeError):
        return False
    return pair == WELL_KNOWN_DEV_CREDENTIALS


def check_storage_access(env: Mapping[str, str] | None = None) -> list[Check]:
    """Put, get, list and delete a small object under the real prefix, with this shell's MINIO_* settings."""
    from cifar10_kfp.storage import ObjectStore, StorageConfig, StorageError, probe_access

    config = StorageConfig.from_env(env)
    if not (config.endpoint and config.access_key and config.secret_key):
        return [Check("object-store access", False, "not probed: MINIO_ENDPOINT, MINIO_ACCESS_KEY and "
                      "MINIO_SECRET_KEY are not all set in this shell",
                      "export them (e.g. from a port-forward of the object store and the namespace's "
                      "mlpipeline-minio-artifact secret), or run doctor inside the cluster", required=False)]  # fmt: skip
    where = f"s3://{config.bucket}/{config.prefix} (namespace {config.namespace or 'unknown'})"
    try:
        results = probe_access(ObjectStore(config))
    except StorageError as exc:  # refused before any request, e.g. strict mode and the well-known pair
        return [Check("object-store access", False, str(exc))]
    return [Check(f"object-store {r.operation}", r.ok, r.detail if r.ok else f"{where}: {r.detail}",
                  "use a prefix this identity may write (see the message), or fix the identity's policy")
            for r in results]  # fmt: skip


def check_gpus(api_client) -> Check:
    from cifar10_kfp_pipelines.policy import GPU_RESOURCE

    status, nodes = _api_get(api_client, "/api/v1/nodes")
    if status != 200:
        return Check(
            "GPU nodes", False, f"cannot list nodes (HTTP {status})", "ask for `list nodes` (cluster-scoped)"
        )
    gpu_nodes = {}
    for node in nodes.get("items") or []:
        count = int(str((node.get("status") or {}).get("allocatable", {}).get(GPU_RESOURCE, "0")) or 0)
        if count > 0:
            gpu_nodes[node["metadata"]["name"]] = count
    if not gpu_nodes:
        return Check("GPU nodes", False, f"no node has allocatable {GPU_RESOURCE}",
                     "install the NVIDIA device plugin / GPU operator, or run with num_gpus=0 (CPU)")  # fmt: skip
    listing = ", ".join(f"{name} ({n})" for name, n in sorted(gpu_nodes.items()))
    return Check("GPU nodes", True, f"{len(gpu_nodes)} node(s) with {GPU_RESOURCE}: {listing}")


def check_object_store(api_client, endpoint: str) -> Check:
    """In-cluster names (svc.namespace:port) are checked through the service's endpoints; others by TCP."""
    host, _, port = endpoint.rpartition(":")
    labels = host.split(".")
    fix = f"deploy the object store, or compile with --minio-endpoint pointing at it (now {endpoint!r})"
    if (
        len(labels) >= 2
        and labels[-1] not in ("com", "net", "org", "io")
        and not host.replace(".", "").isdigit()
    ):
        ok, detail = _service_ready(api_client, labels[1], labels[0])
        return Check("object-store endpoint", ok, f"{endpoint}: {detail}", fix)
    try:
        with socket.create_connection((host, int(port or 80)), timeout=3):
            return Check("object-store endpoint", True, f"{endpoint} accepts connections")
    except OSError as exc:
        return Check("object-store endpoint", False, f"{endpoint} does not answer: {exc}", fix)


def check_trainer(api_client, num_nodes: int) -> Check:
    """Kubeflow Trainer >= 2.2 (read from the TrainJob CRD's schema) and its torch-distributed runtime."""
    from cifar10_kfp.trainjob import (
        DEFAULT_RUNTIME,
        GROUP,
        PLURAL,
        VERSION,
        new_enough,
        read_trainer_crd,
        too_old_message,
        trainer_version_from_crd,
    )

    if num_nodes <= 1:
        return Check(
            "Kubeflow Trainer",
            True,
            "not needed for num_nodes=1 (pass --num-nodes 2 to check)",
            required=False,
        )
    status, crd = read_trainer_crd(api_client)
    if status == 403:
        return Check("Kubeflow Trainer", False, f"not allowed to read CRD {PLURAL}.{GROUP}: cannot tell its version",
                     "run doctor with `get customresourcedefinitions` (cluster-scoped); the launcher checks "
                     "again with a dry run before it creates a TrainJob")  # fmt: skip
    if status != 200:
        return Check("Kubeflow Trainer", False, f"CRD {PLURAL}.{GROUP} not found (HTTP {status})",
                     "install Kubeflow Trainer >= 2.2 (see docs/multi-node.md), or use num_nodes=1")  # fmt: skip
    found = trainer_version_from_crd(crd or {})
    if not new_enough(found):
        return Check("Kubeflow Trainer", False, too_old_message(found),
                     "upgrade Kubeflow Trainer to 2.2 or later (docs/multi-node.md)")  # fmt: skip
    status, _ = _api_get(api_client, f"/apis/{GROUP}/{VERSION}/clustertrainingruntimes/{DEFAULT_RUNTIME}")
    if status != 200:
        return Check("Kubeflow Trainer", False, f"ClusterTrainingRuntime {DEFAULT_RUNTIME!r} not found",
                     "install the Trainer's default runtimes (kubectl apply --server-side -k .../runtimes)")  # fmt: skip
    return Check(
        "Kubeflow Trainer",
        True,
        f"Trainer {found} (read from the TrainJob CRD: it has runtimePatches) and runtime {DEFAULT_RUNTIME!r}",
    )


def check_elastic_runtime(api_client, num_nodes: int) -> Check:
    """The project's runtime for elastic runs (deploy/trainer-runtime): only elastic runs need it."""
    from cifar10_kfp.trainjob import ELASTIC_RUNTIME, GROUP, VERSION

    name = "elastic runtime"
    if num_nodes <= 1:
        return Check(name, True, "not needed for num_nodes=1", required=False)
    status, _ = _api_get(api_client, f"/apis/{GROUP}/{VERSION}/clustertrainingruntimes/{ELASTIC_RUNTIME}")
    if status == 200:
        return Check(name, True, f"ClusterTrainingRuntime {ELASTIC_RUNTIME!r} is installed", required=False)
    return Check(name, False, f"ClusterTrainingRuntime {ELASTIC_RUNTIME!r} not found (HTTP {status}): "
                 "elastic runs (min_nodes < num_nodes) would be refused; fixed-size runs work",
                 "kubectl apply --server-side -k deploy/trainer-runtime (cluster admin)", required=False)  # fmt: skip


TRAINJOB_VERBS = ("create", "get", "list", "watch", "patch", "delete")


def check_trainjob_rbac(api_client, namespace: str, runner: str, num_nodes: int) -> Check:
    """Whether the runner may do what the launcher does, asked of the API server (SubjectAccessReview)."""
    from cifar10_kfp.trainjob import GROUP, PLURAL

    name = "TrainJob permissions"
    if num_nodes <= 1:
        return Check(name, True, "not needed for num_nodes=1", required=False)
    user = f"system:serviceaccount:{namespace}:{runner}"
    wanted = [(GROUP, PLURAL, verb) for verb in TRAINJOB_VERBS] + [("", "events", "list")]
    missing = []
    for group, resource, verb in wanted:
        allowed = _subject_may(api_client, user, namespace, group, resource, verb)
        if allowed is None:
            return Check(name, False, f"not allowed to ask what {namespace}/{runner} may do (SubjectAccessReview)",
                         "run doctor as a cluster admin to check the runner's rights", required=False)  # fmt: skip
        if not allowed:
            missing.append(f"{verb} {resource}")
    if missing:
        return Check(name, False, f"service account {namespace}/{runner} may not {', '.join(missing)} in namespace "
                     f"{namespace!r}: multi-node runs there would fail",
                     "kubectl apply -k deploy/rbac (standalone KFP), or a copy of deploy/overlays/profile with your "
                     "namespace (multi-user Kubeflow)")  # fmt: skip
    return Check(name, True, f"service account {namespace}/{runner} may {'/'.join(TRAINJOB_VERBS)} trainjobs "
                 "and list events")  # fmt: skip


def check_kfp_login(login, namespace: str) -> Check:
    """Ask the KFP API itself: its mode (healthz's multi_user) and whether this login may list runs in
    `namespace`, as the API server decides it (in multi-user mode: TokenReview and SubjectAccessReview)."""
    import json
    import urllib.error
    import urllib.request

    from cifar10_kfp_pipelines.kfp_client import explained_api_errors, make_client

    name = "KFP login"
    headers = {"Authorization": f"Bearer {login.token}"} if login.token else {}
    if login.cookies:  # through the gateway, even healthz needs the session
        headers["Cookie"] = login.cookies
    request = urllib.request.Request(f"{login.host}/apis/v2beta1/healthz", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as resp:  # noqa: S310 (the user's KFP URL)
            health = json.loads(resp.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Check(name, False, f"{login.host}/apis/v2beta1/healthz did not answer ({exc})",
                     "check --host / KF_PIPELINES_ENDPOINT and the port-forward to the KFP API")  # fmt: skip
    mode = "multi-user" if health.get("multi_user") else "single-user"
    version = health.get("tag_name") or "unknown version"
    try:
        client = make_client(login, namespace)
        with explained_api_errors(login, namespace=namespace):
            client.list_runs(namespace=namespace, page_size=1)
    except RuntimeError as refused:
        return Check(name, False, f"KFP {version}, {mode} mode: {refused}", "")
    who = f"the {login.method}" if login.method != "none" else "no credentials"
    rights = f"{who} may list runs in namespace {namespace!r}"
    return Check(name, True, f"KFP {version}, {mode} mode at {login.host}: {rights}")


def _subject_may(api_client, user: str, namespace: str, group: str, resource: str, verb: str) -> bool | None:
    """The API server's answer for one verb; None when this caller may not ask."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=groups, resource_attributes=client.V1ResourceAttributes(
            namespace=namespace, group=group, resource=resource, verb=verb)))  # fmt: skip
    try:
        answer = client.AuthorizationV1Api(api_client).create_subject_access_review(review)
    except ApiException as exc:
        if exc.status in (403, 404):  # this caller may not ask (or the API is not served): say "cannot check"
            return None
        raise
    return bool(answer.status.allowed)


def diagnose(api_client, args: argparse.Namespace) -> list[Check]:
    from cifar10_kfp_pipelines.policy import DEFAULT_MINIO_ENDPOINT

    return [
        check_kfp(api_client, args.kfp_namespace),
        check_secret(api_client, args.namespace),
        check_gpus(api_client),
        check_object_store(api_client, args.minio_endpoint or DEFAULT_MINIO_ENDPOINT),
        check_trainer(api_client, args.num_nodes),
        check_elastic_runtime(api_client, args.num_nodes),
        check_trainjob_rbac(api_client, args.namespace, _runner(args), args.num_nodes),
        *check_storage_access(),
        *_kfp_login_checks(args),
    ]


def _kfp_login_checks(args: argparse.Namespace) -> list[Check]:
    from cifar10_kfp_pipelines.kfp_client import Login

    try:
        login = Login.resolve(host=getattr(args, "host", None), token=getattr(args, "token", None),
                              cookies=getattr(args, "cookies", None))  # fmt: skip
    except ValueError:  # no host given or configured: nothing to ask
        return []
    return [check_kfp_login(login, args.namespace)]


def _runner(args: argparse.Namespace) -> str:
    if getattr(args, "runner", None):
        return args.runner
    return "pipeline-runner" if args.namespace == args.kfp_namespace else "default-editor"


def format_report(checks: list[Check]) -> str:
    lines = []
    for check in checks:
        mark = "OK  " if check.ok else ("FAIL" if check.required else "WARN")
        lines.append(f"[{mark}] {check.name}: {check.detail}")
        if not check.ok and check.fix:
            lines.append(f"       fix: {check.fix}")
    failed = [c for c in checks if not c.ok and c.required]
    lines.append("all checks passed" if not failed else f"{len(failed)} check(s) failed")
    return "\n".join(lines)


K8S_UNREACHABLE_CHECK = (
    "check your kubeconfig's current context (`kubectl config current-context`, `kubectl cluster-info`): "
    "the cluster, or the tunnel or port-forward to it, must be up; or pass --kube-api URL"
)


def run(args: argparse.Namespace) -> int:
    from urllib3.exceptions import HTTPError

    from cifar10_kfp.trainjob import load_kubernetes
    from cifar10_kfp_pipelines.kfp_client import quiet_retries, unreachable_reason

    try:
        api_client = load_kubernetes(args.kube_api or "")
    except Exception as exc:  # noqa: BLE001 - no kubeconfig and not in a pod: say so plainly
        cause = exc.__cause__ or exc
        print(f"[FAIL] Kubernetes API: no cluster is configured: no usable kubeconfig ({cause}) and not "
              "running in a pod\n       fix: point KUBECONFIG (or ~/.kube/config) at your cluster's "
              "kubeconfig, or pass --kube-api URL")  # fmt: skip
        return 1
    try:
        with quiet_retries():
            checks = diagnose(api_client, args)
    except HTTPError as exc:  # the first request got no HTTP answer at all: nothing else can be checked
        print(f"[FAIL] Kubernetes API: {api_client.configuration.host} {unreachable_reason(exc)}\n"
              f"       fix: {K8S_UNREACHABLE_CHECK}")  # fmt: skip
        return 1
    print(format_report(checks))
    return 0 if all(c.ok or not c.required for c in checks) else 1
