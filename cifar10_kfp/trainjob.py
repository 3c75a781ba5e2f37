"""Multi-node training through Kubeflow Trainer v2: build, submit, watch and collect a ``TrainJob``.

The pipeline's train step calls ``run_trainjob`` when ``num_nodes > 1``. It creates a
``TrainJob`` (``trainer.kubeflow.org/v1alpha1``) on the ``torch-distributed`` runtime with the
pipeline's own image; every node runs ``python -m cifar10_kfp.trainjob node``, which starts
``torchrun`` on the engine's worker entry point (torchrun reads the ``PET_*`` rendezvous
variables the Trainer injects) and, on node 0, uploads the outputs to the object store. The
launcher streams the job's conditions, raises with the job's own reason when it fails, and
downloads ``model/``, ``history.json`` and ``metrics.json``.

Uses the ``kubernetes`` client only (no kfp). RBAC: ``trainjobs`` create/get/list/watch/delete
in the run's namespace (see docs/multi-node.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
KIND = "TrainJob"
DEFAULT_RUNTIME = "torch-distributed"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
OUTPUT_FILES = ("history.json", "metrics.json")
MODEL_SUBDIR = "model"


class TrainJobFailed(RuntimeError):
    """The TrainJob reached ``Failed`` (the message carries its reason), or could not be watched."""


@dataclass(frozen=True)
class TrainJobRequest:
    """Everything a TrainJob for one training run needs."""

    name: str  # DNS-1035 label, <= 63 characters (see job_name)
    namespace: str
    image: str
    data_uri: str  # the prepared dataset in the object store
    output_uri: str  # node 0 uploads model/, history.json, metrics.json below this
    checkpoint_uri: str
    config: dict  # TrainConfig.to_dict(): every node trains exactly this configuration
    num_nodes: int
    gpus_per_node: int  # 0 trains on CPU with gloo (useful on clusters without GPUs)
    cpu_per_node: str = "4"
    memory_per_node: str = "16Gi"
    runtime: str = DEFAULT_RUNTIME
    minio_endpoint: str = ""
    minio_secure: bool = False
    minio_secret: str = "mlpipeline-minio-artifact"
    secret_keys: dict = field(
        default_factory=lambda: {"accesskey": "MINIO_ACCESS_KEY", "secretkey": "MINIO_SECRET_KEY"}
    )
    labels: dict = field(default_factory=dict)
    active_deadline_s: int = 0  # 0 = no deadline


def job_name(run_id: str, config_hash: str = "") -> str:
    """A stable, valid TrainJob name for a run: a retry of the same task finds the same job."""
    digest = hashlib.sha256(f"{run_id}/{config_hash}".encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]+", "-", str(run_id).lower()).strip("-")[:40].strip("-")
    return f"cifar10-{stem}-{digest}" if stem else f"cifar10-{digest}"


def node_command(request: TrainJobRequest) -> list[str]:
    """The command every TrainJob node runs."""
    return [
        "python", "-m", "cifar10_kfp.trainjob", "node",
        "--data", request.data_uri,
        "--output-uri", request.output_uri,
        "--checkpoint-uri", request.checkpoint_uri,
        "--config", json.dumps(request.config, sort_keys=True),
    ]  # fmt: skip


# The torch-distributed runtime names its replicated job and trainer container "node".
RUNTIME_NODE_NAME = "node"


def _restricted_pod_patch() -> dict:
    """A runtime patch giving every node pod the restricted pod-security settings.

    The runtime's template comes from the cluster admin; the patch makes our pods non-root,
    without privilege escalation or capabilities, under the default seccomp profile, whatever
    the runtime says, and tolerates GPU node taints.
    """
    pod_security = {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
    container_security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod_spec = {
        "securityContext": pod_security,
        "containers": [{"name": RUNTIME_NODE_NAME, "securityContext": container_security}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    job_patch = {"spec": {"template": {"spec": pod_spec}}}
    return {
        "manager": "cifar10-kfp",
        "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [{"name": RUNTIME_NODE_NAME, "template": job_patch}]}}
        },
    }


def build_trainjob(request: TrainJobRequest) -> dict:
    """The TrainJob manifest, as a plain dict ready for ``CustomObjectsApi``."""
    if request.num_nodes < 1:
        raise ValueError(f"num_nodes={request.num_nodes} is out of range: use 1 or more")
    if request.gpus_per_node < 0:
        raise ValueError(f"gpus_per_node={request.gpus_per_node} is out of range: use 0 or more")
    env = [
        {"name": env_name, "valueFrom": {"secretKeyRef": {"name": request.minio_secret, "key": key}}}
        for key, env_name in sorted(request.secret_keys.items())
    ]
    env += [
        {"name": "MINIO_ENDPOINT", "value": request.minio_endpoint},
        {"name": "MINIO_SECURE", "value": "true" if request.minio_secure else "false"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    limits = {"cpu": request.cpu_per_node, "memory": request.memory_per_node}
    if request.gpus_per_node > 0:
        limits["nvidia.com/gpu"] = str(request.gpus_per_node)
    trainer = {
        "image": request.image,
        "command": node_command(request),
        "env": env,
        "numNodes": request.num_nodes,
        # One process per GPU; one process per node on CPU (gloo), whose threads use the cores.
        "numProcPerNode": max(1, request.gpus_per_node),
        "resourcesPerNode": {"requests": dict(limits), "limits": limits},
    }
    spec: dict = {
        "runtimeRef": {"apiGroup": GROUP, "kind": "ClusterTrainingRuntime", "name": request.runtime}
    }
    spec["trainer"] = trainer
    spec["runtimePatches"] = [_restricted_pod_patch()]
    if request.active_deadline_s > 0:
        spec["activeDeadlineSeconds"] = int(request.active_deadline_s)
    labels = {
        "app.kubernetes.io/name": "cifar10-kfp",
        "app.kubernetes.io/component": "train",
        **request.labels,
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": request.name, "namespace": request.namespace, "labels": labels},
        "spec": spec,
    }


# ------------------------------------------------------------------------------- status


@dataclass(frozen=True)
class JobState:
    """The TrainJob's outcome so far, read from its conditions."""

    phase: str  # "Pending", "Running", "Complete", "Failed", "Suspended"
    reason: str = ""
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.phase in ("Complete", "Failed")


def job_state(obj: dict) -> JobState:
    """Reduce a TrainJob's ``status.conditions`` to one state."""
    conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}

    def true(kind: str) -> dict | None:
        cond = conditions.get(kind)
        return cond if cond and str(cond.get("status")) == "True" else None

    for phase in ("Failed", "Complete", "Suspended"):
        cond = true(phase)
        if cond:
            return JobState(phase, cond.get("reason", ""), cond.get("message", ""))
    jobs = (obj.get("status") or {}).get("jobsStatus") or []
    if any((j.get("active") or 0) > 0 for j in jobs):
        return JobState("Running")
    return JobState("Pending")


# ----------------------------------------------------------------------------- the API


def load_kubernetes(host: str = ""):
    """A ``kubernetes`` ApiClient: in-cluster config in a pod, else kubeconfig, or ``host`` when given."""
    from kubernetes import client, config

    if host:
        configuration = client.Configuration()
        configuration.host = host
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            # KUBECONFIG is read now, not when the kubernetes package was imported.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
        except config.ConfigException as exc:
            raise TrainJobFailed(
                f"no Kubernetes API to create a TrainJob with ({exc}): multi-node training (num_nodes > 1) "
                "runs on a cluster with Kubeflow Trainer; use num_nodes=1 locally"
            ) from exc
    return client.ApiClient()


def current_namespace(default: str = "kubeflow") -> str:
    """The pod's namespace (the KFP profile namespace in multi-user mode)."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or default
    except OSError:
        return default


def submit_trainjob(api_client, manifest: dict) -> dict:
    """Create the TrainJob; if one of that name exists (a retried step), re-attach to it.

    A job of that name that already *failed* is deleted and recreated: the new one resumes
    from the run's checkpoint.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    try:
        created = api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
        log.info("created TrainJob %s/%s", ns, name)
        return created
    except ApiException as exc:
        if exc.status == 404:
            raise TrainJobFailed(
                f"the TrainJob API ({GROUP}/{VERSION}) is not served in this cluster: install Kubeflow Trainer v2 "
                "(see docs/multi-node.md), or set num_nodes=1"
            ) from exc
        if exc.status == 403:
            raise TrainJobFailed(
                f"not allowed to create TrainJobs in namespace {ns!r}: grant the pipeline's service account "
                "create/get/list/watch/delete on trainjobs.trainer.kubeflow.org (see docs/multi-node.md)"
            ) from exc
        if exc.status != 409:
            raise TrainJobFailed(
                f"creating TrainJob {ns}/{name} failed: HTTP {exc.status} {exc.reason}"
            ) from exc
    existing = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    if job_state(existing).phase != "Failed":
        log.info("TrainJob %s/%s exists (a retried step): watching it", ns, name)
        return existing
    log.info("TrainJob %s/%s failed before: deleting it and starting again from the checkpoint", ns, name)
    api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    _wait_deleted(api, ns, name)
    return api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)


def _wait_deleted(api, ns: str, name: str, timeout_s: float = 120.0) -> None:
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(1.0)
    raise TrainJobFailed(f"TrainJob {ns}/{name} was not deleted within {timeout_s:g}s")


def watch_trainjob(
    api_client,
    namespace: str,
    name: str,
    *,
    timeout_s: float = 0.0,
    watch_timeout_s: int = 60,
    on_change: Callable[[JobState], None] | None = None,
) -> JobState:
    """Stream the TrainJob's state changes until it completes; raise ``TrainJobFailed`` if it fails.

    Uses a watch (``?watch=true``) that is re-opened every ``watch_timeout_s`` seconds; each
    re-open starts from a fresh GET, so no transition is missed across reconnects.
    """
    from kubernetes import client, watch
    from kubernetes.client.exceptions import ApiException

    api = client.CustomObjectsApi(api_client)
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    last: JobState | None = None

    def seen(state: JobState) -> JobState:
        nonlocal last
        if state != last:
            last = state
            log.info("TrainJob %s/%s: %s %s %s", namespace, name, state.phase, state.reason, state.message)
            if on_change:
                on_change(state)
        return state

    while True:
        try:
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                raise TrainJobFailed(
                    f"TrainJob {namespace}/{name} disappeared (deleted by someone else?)"
                ) from exc
            raise
        state = seen(job_state(obj))
        if state.finished:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise TrainJobFailed(
                f"TrainJob {namespace}/{name} did not finish within {timeout_s:g}s (last: {state})"
            )
        stream = watch.Watch()
        try:
            for event in stream.stream(
                api.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                field_selector=f"metadata.name={name}",
                resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
                timeout_seconds=watch_timeout_s,
            ):
                if event.get("type") == "DELETED":
                    raise TrainJobFailed(f"TrainJob {namespace}/{name} was deleted while training")
                if event.get("type") == "ERROR":
                    break  # e.g. 410 Gone: re-GET and re-watch
                state = seen(job_state(event["object"]))
                if state.finished:
                    stream.stop()
                    break
        finally:
            stream.stop()
        if last is not None and last.finished:
            break
    if last.phase == "Failed":
        raise TrainJobFailed(
            f"TrainJob {namespace}/{name} failed: {last.reason or 'Failed'}: {last.message or 'no message'}"
        )
    return last


def collect_outputs(output_uri: str, output_dir: str | os.PathLike, store=None) -> Path:
    """Download what node 0 uploaded (model/, history.json, metrics.json) into ``output_dir``."""
    from cifar10_kfp.storage import ObjectStore, join_uri

    store = store or ObjectStore()
    output_dir = Path(output_dir)
    store.get_dir(join_uri(output_uri, MODEL_SUBDIR), output_dir / MODEL_SUBDIR)
    for name in OUTPUT_FILES:
        store.get_file(join_uri(output_uri, name), output_dir / name)
    return output_dir


def run_trainjob(
    request: TrainJobRequest,
    output_dir: str | os.PathLike,
    *,
    api_client=None,
    store=None,
    timeout_s: float = 0.0,
) -> JobState:
    """Submit, watch to the end, and collect the outputs into ``output_dir``."""
    api_client = api_client or load_kubernetes()
    manifest = build_trainjob(request)
    submit_trainjob(api_client, manifest)
    state = watch_trainjob(api_client, request.namespace, request.name, timeout_s=timeout_s)
    collect_outputs(request.output_uri, output_dir, store=store)
    return state


# --------------------------------------------------------------------- the node command


def node_main(argv: list[str] | None = None) -> int:
    """What each TrainJob node runs: torchrun over the engine worker, then node 0 uploads outputs."""
    parser = argparse.ArgumentParser(prog="python -m cifar10_kfp.trainjob node")
    parser.add_argument("--data", required=True)
    parser.add_argument("--output-uri", required=True)
    parser.add_argument("--checkpoint-uri", default="")
    parser.add_argument("--config", required=True, help="TrainConfig as JSON")
    args = parser.parse_args(argv)
    from cifar10_kfp.storage import ObjectStore

    with tempfile.TemporaryDirectory(prefix="cifar10-kfp-node-") as tmp:
        config_path = Path(tmp) / "config.json"
        config_path.write_text(args.config)
        output_dir = Path(tmp) / "out"
        # torchrun takes --nnodes, --nproc-per-node, --node-rank and the rendezvous from the PET_*
        # variables the Trainer's torch plugin sets on every node.
        command = [
            sys.executable, "-m", "torch.distributed.run", "--module", "cifar10_kfp.engine", "--worker",
            "--config-json", str(config_path), "--data", args.data, "--output-dir", str(output_dir),
            "--checkpoint-uri", args.checkpoint_uri,
        ]  # fmt: skip
        completed = subprocess.run(command, check=False)  # noqa: S603 - our interpreter and module
        if completed.returncode != 0:
            print(f"torchrun exited with {completed.returncode}", file=sys.stderr)
            return completed.returncode
        if os.environ.get("PET_NODE_RANK", "0") == "0":  # global rank 0 lives on node 0 and wrote the outputs
            ObjectStore().put_dir(output_dir, args.output_uri)
            print(f"uploaded outputs to {args.output_uri}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "node":
        print(
            "usage: python -m cifar10_kfp.trainjob node --data URI --output-uri URI --config JSON",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO)
    return node_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
