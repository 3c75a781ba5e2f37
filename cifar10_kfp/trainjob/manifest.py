"""The ``TrainJob`` one training run needs (Kubeflow Trainer >= 2.2).

The pipeline's multi-node train step creates a ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``)
on the ``torch-distributed`` runtime with the pipeline's own image (``build_trainjob``); the
launcher (``cifar10_kfp.trainjob.launcher``) submits, watches, cleans it up and collects its
outputs. Every node runs the same command: ``cifar10-kfp train`` with torchrun's c10d
rendezvous on node 0's address, elastic (``--nnodes MIN:MAX``) when ``min_nodes < num_nodes``
(``node_command``); the node holding rank 0 uploads the outputs to the object store.

Names: the Trainer names the JobSet after the TrainJob, and JobSet names each pod
``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>-<5 random>`` (kubernetes-sigs/jobset
``pkg/util/placement/placement.go`` ``GenPodName``; the webhook in ``pkg/webhooks/jobset_webhook.go``
refuses a JobSet whose longest pod name would exceed 63 characters, and Trainer 2.2 only
records a ``TrainJobResourcesCreationFailed`` event for it, never a Failed condition). Job names
here are at most 40 characters, so pods of up to 999 nodes fit.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
KIND = "TrainJob"
DEFAULT_RUNTIME = "torch-distributed"
# Elastic runs (min_nodes < num_nodes) use the project's runtime with a per-node restart budget
# (deploy/trainer-runtime/elastic-runtime.yaml says why the default runtime's shared budget does not fit).
ELASTIC_RUNTIME = "cifar10-kfp-torch-elastic"
# The torch-distributed runtime names its replicated job and trainer container "node"
# (kubeflow/trainer manifests/base/runtimes/torch_distributed.yaml).
RUNTIME_NODE_NAME = "node"
MAX_JOB_NAME = 40
MAX_POD_NAME = 63  # DNS-1035 label: JobSet's webhook refuses longer derived pod names
# runtimePatches[].manager must be a domain-prefixed path ("acme.io/foo": a DNS-1123 subdomain, "/", RFC 3986
# path characters): the Trainer's webhook checks it with apimachinery's validation.IsDomainPrefixedPath
# (kubeflow/trainer pkg/runtime/framework/plugins/jobset/jobset.go Validate, v2.2.0 to v2.3.0), and the
# CRD makes it immutable, at most 253 characters. A bare "cifar10-kfp" is refused.
PATCH_MANAGER = "cifar10-kfp.github.io/launcher"
# Nodes other than 0 wait up to this long for node 0's rendezvous store before starting torchrun
# (cifar10_kfp.train.distributed.Rendezvous.wait_for_host): node 0 may be pulling its image or waiting for a GPU.
RDZV_WAIT_S = 900
NODE_OUTPUT_DIR = "/tmp/cifar10-kfp-train"  # where a node writes its outputs before the upload
MODEL_SUBDIR = "model"
OUTPUT_FILES = ("history.json", "metrics.json")


@dataclass(frozen=True)
class TrainJobRequest:
    """Everything a TrainJob for one training run needs."""

    name: str  # DNS-1035 label of at most MAX_JOB_NAME characters (see job_name)
    namespace: str
    image: str
    data_uri: str  # the prepared dataset in the object store
    output_uri: str  # the node holding rank 0 uploads model/, history.json, metrics.json below this
    checkpoint_uri: str  # required: nodes that (re)join catch up from it
    config: dict  # TrainConfig.to_dict(): every node trains exactly this configuration
    num_nodes: int  # nodes the job asks for (the maximum in elastic mode)
    gpus_per_node: int  # 0 trains on CPU with gloo (useful on clusters without GPUs)
    min_nodes: int = 0  # elastic: training goes on while at least this many nodes are alive; 0 = num_nodes
    max_restarts: int = 3  # torchrun worker-group restarts after a failure (a lost node is one)
    cpu_per_node: str = "4"
    memory_per_node: str = "16Gi"
    runtime: str = ""  # the ClusterTrainingRuntime; empty: ELASTIC_RUNTIME when elastic, else DEFAULT_RUNTIME
    minio_endpoint: str = ""
    minio_secure: bool = False
    minio_secret: str = "mlpipeline-minio-artifact"
    secret_keys: dict = field(
        default_factory=lambda: {"accesskey": "MINIO_ACCESS_KEY", "secretkey": "MINIO_SECRET_KEY"}
    )
    storage_env: dict = field(
        default_factory=dict
    )  # region, bucket, prefix, namespace, strict mode: no secrets
    tracking_env: dict = field(default_factory=dict)  # the launcher's MLflow run, for rank 0: no secrets
    labels: dict = field(default_factory=dict)
    active_deadline_s: int = 0  # the Trainer fails the job after this many seconds; 0 = no deadline
    service_account: str = ""  # the nodes' service account; empty keeps the runtime's (the namespace default)
    image_pull_secrets: tuple[str, ...] = ()  # secrets for pulling the image from a private registry
    owner: dict | None = None  # {"name", "uid"} of the launcher pod: the job is garbage-collected with it

    @property
    def node_range(self) -> tuple[int, int]:
        return (self.min_nodes or self.num_nodes), self.num_nodes

    @property
    def elastic(self) -> bool:
        low, high = self.node_range
        return low < high

    @property
    def runtime_name(self) -> str:
        return self.runtime or (ELASTIC_RUNTIME if self.elastic else DEFAULT_RUNTIME)


def job_name(run_id: str, config_hash: str = "") -> str:
    """A stable TrainJob name for a run and config, at most 40 characters: a retried step finds its job.

    ``cifar10-<up to 20 characters of the run id>-<10 hex of sha256(run id/config hash)>``: the
    readable part helps a person find the job, the digest keeps names of different runs and
    configs apart however their ids start.
    """
    digest = hashlib.sha256(f"{run_id}/{config_hash}".encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]+", "-", str(run_id).lower()).strip("-")[:20].strip("-")
    name = f"cifar10-{stem}-{digest}" if stem else f"cifar10-{digest}"
    assert len(name) <= MAX_JOB_NAME, name
    return name


def longest_pod_name(name: str, num_nodes: int) -> str:
    """The longest pod name JobSet derives for this TrainJob, with the 5-character random suffix.

    The Trainer names the JobSet after the TrainJob (kubeflow/trainer pkg/runtime/framework/plugins/
    jobset/jobset.go) with one ``node`` job whose pods are indexed 0..num_nodes-1; JobSet's
    webhook checks ``GenPodName(jobset, rjob, lastJobIndex, lastPodIndex) + "-abcde"``.
    """
    return f"{name}-{RUNTIME_NODE_NAME}-0-{num_nodes - 1}-abcde"


def check_request(request: TrainJobRequest) -> None:
    """Refuse, naming the value, what the Trainer or JobSet would refuse (or accept and never run)."""
    if request.num_nodes < 1:
        raise ValueError(f"num_nodes={request.num_nodes} is out of range: use 1 or more")
    if not 0 <= request.min_nodes <= request.num_nodes:
        raise ValueError(
            f"min_nodes={request.min_nodes} is out of range: use 0 (= num_nodes) or 1..{request.num_nodes}"
        )
    if request.gpus_per_node < 0:
        raise ValueError(f"gpus_per_node={request.gpus_per_node} is out of range: use 0 or more")
    if request.max_restarts < 0:
        raise ValueError(f"max_restarts={request.max_restarts} is out of range: use 0 or more")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", request.name) or len(request.name) > MAX_JOB_NAME:
        raise ValueError(
            f"TrainJob name {request.name!r} must be a DNS-1035 label of at most {MAX_JOB_NAME} characters"
        )
    pod = longest_pod_name(request.name, request.num_nodes)
    if len(pod) > MAX_POD_NAME:
        raise ValueError(
            f"TrainJob name {request.name!r} makes pod names like {pod!r} longer than {MAX_POD_NAME}"
        )
    if not request.checkpoint_uri:
        raise ValueError("a TrainJob needs a checkpoint URI: nodes that rejoin catch up from it")


# ------------------------------------------------------------------------ the node command


def config_arguments(config: dict) -> list[str]:
    """``--preset P --set key=value ...`` that rebuild ``config`` exactly: the fields that differ from the preset.

    The job's command line then reads like one a person would type, and shows what was changed.
    """
    from cifar10_kfp.train.config import make_config

    preset = config.get("preset", "seed")
    base = make_config(preset).to_dict()
    overrides = {}
    for key, value in config.items():
        if key != "preset" and value != base.get(key):
            overrides[key] = ",".join(str(v) for v in value) if isinstance(value, list) else _as_text(value)
    if make_config(preset, overrides).to_dict() != make_config(preset, config).to_dict():
        raise ValueError(f"training config cannot be carried as --set options: {config}")  # pragma: no cover
    args = ["--preset", preset]
    for key, text in overrides.items():
        args += ["--set", f"{key}={text}"]
    return args


def _as_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def node_command(request: TrainJobRequest) -> list[str]:
    """What every node runs: ``cifar10-kfp train`` as one node of a torchrun c10d rendezvous.

    The Trainer's torch plugin sets ``PET_NNODES=<numNodes>`` and refuses ``PET_*`` in the
    TrainJob's env (kubeflow/trainer pkg/constants ``TorchRunReservedEnvNames``). torchrun takes
    an explicit ``--nnodes`` over ``PET_NNODES``, so ``--nnodes MIN:MAX`` is the maintainers'
    suggested ``PET_NNODES=min:max`` workaround for elastic training (kubeflow/trainer#2903 is
    still open). The rendezvous endpoint is node 0's address and port, which the plugin puts in
    ``PET_MASTER_ADDR`` / ``PET_MASTER_PORT``; the kubelet expands ``$(VAR)`` in the command.
    """
    low, high = request.node_range
    return [
        "python", "-m", "cifar10_kfp_pipelines.cli", "train",
        "--data", request.data_uri, *config_arguments(request.config),
        "--checkpoint-uri", request.checkpoint_uri,
        "--output-dir", NODE_OUTPUT_DIR, "--upload-to", request.output_uri,
        "--nproc", str(max(1, request.gpus_per_node)),
        "--nnodes", f"{low}:{high}" if low < high else str(high),
        "--rdzv-endpoint", "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
        "--rdzv-id", request.name,
        "--max-restarts", str(request.max_restarts),
        "--rdzv-wait-s", str(RDZV_WAIT_S),
    ]  # fmt: skip


# ---------------------------------------------------------------------------- the manifest


def _pod_patch(request: TrainJobRequest) -> dict:
    """The runtime patch every node pod gets (``runtimePatches`` needs Trainer >= 2.2).

    * the restricted pod-security settings (non-root, no privilege escalation or capabilities,
      the default seccomp profile) whatever the runtime says, and the GPU node taint tolerated;
    * no Istio sidecar: in a Kubeflow profile namespace it would intercept the rendezvous and
      NCCL connections between the nodes (Istio honours the label; the annotation is its older form);
    * a memory-backed ``/dev/shm`` with more than one process per node (the container runtime's
      64 MiB default is too small for NCCL and DataLoader shared memory);
    * the service account and image-pull secrets, if given.
    """
    container_security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container: dict = {"name": RUNTIME_NODE_NAME, "securityContext": container_security}
    pod_spec: dict = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if request.gpus_per_node > 1:
        pod_spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
        container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if request.service_account:
        pod_spec["serviceAccountName"] = request.service_account
    if request.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in request.image_pull_secrets]
    no_sidecar = {"sidecar.istio.io/inject": "false"}
    pod = {"metadata": {"labels": dict(no_sidecar), "annotations": dict(no_sidecar)}, "spec": pod_spec}
    job_patch = {"spec": {"template": pod}}
    return {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [{"name": RUNTIME_NODE_NAME, "template": job_patch}]}}
        },
    }


def _env(request: TrainJobRequest) -> list[dict]:
    """Object-store settings; credentials only as references to the secret, never values."""
    env = [
        {"name": env_name, "valueFrom": {"secretKeyRef": {"name": request.minio_secret, "key": key}}}
        for key, env_name in sorted(request.secret_keys.items())
    ]
    return env + [
        {"name": "MINIO_ENDPOINT", "value": request.minio_endpoint},
        {"name": "MINIO_SECURE", "value": "true" if request.minio_secure else "false"},
        *({"name": name, "value": value} for name, value in sorted(request.storage_env.items())),
        *({"name": name, "value": value} for name, value in sorted(request.tracking_env.items())),
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]


def build_trainjob(request: TrainJobRequest) -> dict:
    """The TrainJob manifest, as a plain dict ready for ``CustomObjectsApi``."""
    check_request(request)
    limits = {"cpu": request.cpu_per_node, "memory": request.memory_per_node}
    if request.gpus_per_node > 0:
        limits["nvidia.com/gpu"] = str(request.gpus_per_node)
    trainer = {
        "image": request.image,
        "command": node_command(request),
        "env": _env(request),
        "numNodes": request.num_nodes,
        # One process per GPU; one process per node on CPU (gloo), whose threads use the cores.
        "numProcPerNode": max(1, request.gpus_per_node),
        "resourcesPerNode": {"requests": dict(limits), "limits": limits},
    }
    spec: dict = {
        "runtimeRef": {"apiGroup": GROUP, "kind": "ClusterTrainingRuntime", "name": request.runtime_name},
        "trainer": trainer,
        "runtimePatches": [_pod_patch(request)],
    }
    if request.active_deadline_s > 0:
        spec["activeDeadlineSeconds"] = int(request.active_deadline_s)
    labels = {
        "app.kubernetes.io/name": "cifar10-kfp",
        "app.kubernetes.io/component": "train",
        **request.labels,
    }
    metadata: dict = {"name": request.name, "namespace": request.namespace, "labels": labels}
    if request.owner:
        # No controller / blockOwnerDeletion: those would need rights on the pod's finalizers.
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": request.owner["name"], "uid": request.owner["uid"]}
        ]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": spec}


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


# ------------------------------------------------------------------- the Trainer version


def trainer_version_from_crd(crd: dict) -> str:
    """The Trainer release family a TrainJob CRD belongs to, read from its schema's spec fields.

    From kubeflow/trainer manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml at the tags: 2.0 has
    ``podSpecOverrides``, 2.1 ``podTemplateOverrides``, 2.2 ``runtimePatches`` (and ``activeDeadlineSeconds``),
    and 2.3 added ``terminationGracePeriodSeconds`` to the patchable pod spec. Returns "2.0", "2.1", "2.2",
    ">=2.3" or "unknown" ("2.2" when the schema is pruned below ``runtimePatches``: 2.2 at least).
    """
    versions = {v.get("name"): v for v in (crd.get("spec") or {}).get("versions") or []}
    schema = ((versions.get(VERSION) or {}).get("schema") or {}).get("openAPIV3Schema") or {}
    spec = (schema.get("properties") or {}).get("spec") or {}
    fields = set(spec.get("properties") or {})
    if "runtimePatches" in fields:
        pod_spec = _schema_at(
            spec, "runtimePatches", "[]", "trainingRuntimeSpec", "template", "spec", "replicatedJobs", "[]",
            "template", "spec", "template", "spec",
        )  # fmt: skip
        return ">=2.3" if "terminationGracePeriodSeconds" in (pod_spec.get("properties") or {}) else "2.2"
    if "podTemplateOverrides" in fields:
        return "2.1"
    if "podSpecOverrides" in fields:
        return "2.0"
    return "unknown"


def _schema_at(node: dict, *path: str) -> dict:
    for step in path:
        node = (node.get("items") if step == "[]" else (node.get("properties") or {}).get(step)) or {}
    return node


def new_enough(found: str) -> bool:
    """Whether a ``trainer_version_from_crd`` answer is a Trainer this project runs on (>= 2.2)."""
    return found in ("2.2", ">=2.3")


def too_old_message(found: str) -> str:
    return (
        f"Kubeflow Trainer {found} is installed, but multi-node training needs Trainer >= 2.2: the TrainJob's "
        "spec.runtimePatches (how the nodes get their pod settings) and spec.activeDeadlineSeconds arrived in "
        "2.2. Upgrade Kubeflow Trainer (docs/multi-node.md), or train on one node (num_nodes=1)."
    )
