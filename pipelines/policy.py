"""Cluster settings applied to pipeline tasks: the one place that decides GPUs, resources,
tolerations, secrets, retries, caching and the image.

Components stay free of cluster decisions; the pipeline modules build their DAGs and hand
each task to a ``ClusterPolicy`` method. ``cifar10-kfp compile`` builds a policy from its flags;
``run-local`` builds one pointed at the local object store.

Two kfp 2.17 details shape this module:

* ``set_accelerator_limit`` accepts a pipeline channel, and the KFP driver resolves it with
  ``resolvePodSpecInputRuntimeParameter``, which reads the value with ``GetStringValue()``. An
  ``int`` pipeline parameter resolves to ``""`` there and the GPU limit is silently dropped,
  so the GPU count is fed from the validate step's *string* output ``gpu_limit``. And it does
  not register that channel as a task input (``set_container_image`` does), so inside a
  ``dsl.If``/``ParallelFor`` the compiler fails with "component_input_parameter ... not found";
  ``gpu_train`` registers it with ``register_pipeline_channels``.
* The KFP API ignores ``enable_caching`` when a run is created from an uploaded pipeline id
  (kubeflow/pipelines#14253), so per-task caching is decided here, at compile time. KFP's cache
  key is the task's inputs, image and command (backend/src/v2/cacheutils/cache.go
  ``GenerateCacheKey``): not its environment, and not ``set_caching_options(cache_key=...)``, which
  the backend never reads. So a cached step that reads or writes our object store (its component
  has a ``bucket`` input) must also take the endpoint as the input ``minio_endpoint``; otherwise a
  pipeline recompiled for another store would reuse results that point into the old one.

Every task also gets ``CIFAR10_KFP_TASK`` (its KFP task name) and ``CIFAR10_KFP_RUN_ID`` (from the
pod label ``pipeline/runid`` that the KFP API server puts on every pod of a run), so that a failing
step records its error where the run summary finds it (``cifar10_kfp.runs.records``), and every
task but the single-node train step gets ``NVIDIA_VISIBLE_DEVICES=void`` (see ``step``).

Every task runs as the image's user, non-root, through ``kfp.kubernetes.set_security_context``, so
its pod is admitted where the ``restricted`` Pod Security Standard is enforced (a hardened profile
namespace). KFP's compiler already drops every capability, forbids privilege escalation and sets the
RuntimeDefault seccomp profile (backend/src/v2/compiler/argocompiler/security_context.go,
``applySecurityContextToExecutorTemplate``), but leaves the user container's ``runAsNonRoot`` unset,
because a user's image may run as root; the 2.16+ driver applies ours (backend/src/v2/driver/k8s.go,
``kubernetesExecutorConfig.GetSecurityContext()``). An older backend drops the field unread (its
driver parses the executor config with ``DiscardUnknown``, backend/src/common/util/json.go).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from cifar10_kfp_components.image import image as default_image

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_MINIO_ENDPOINT = "seaweedfs.kubeflow:9000"  # the artifact store of KFP >= 2.15
MINIO_SECRET = "mlpipeline-minio-artifact"  # exists in every KFP namespace
# secret key -> environment variable read by cifar10_kfp.storage.StorageConfig
MINIO_SECRET_KEYS = {"accesskey": "MINIO_ACCESS_KEY", "secretkey": "MINIO_SECRET_KEY"}

STRICT_CREDENTIALS_ENV = "CIFAR10_KFP_STRICT_CREDENTIALS"  # read by cifar10_kfp.storage.StorageConfig

# Steps whose outputs are a pure function of their inputs: safe to take from the KFP cache.
CACHED_STEPS = frozenset({"download", "preprocess"})
ALL_STEPS = (
    "validate", "download", "preprocess", "train", "evaluate", "gate", "publish", "record", "select", "summary"
)  # fmt: skip
# Steps whose result depends on more than their inputs: the published champion, or this run's records.
NEVER_CACHED = {"gate": "it compares against the currently published model", "publish": "it publishes a new version",
                "record": "it writes this run's records", "summary": "it summarises this run"}  # fmt: skip
STORE_IDENTITY_INPUT = (
    "minio_endpoint"  # with ``bucket``, what makes a cached store step's key name its store
)
TASK_ENV, RUN_ID_ENV = (
    "CIFAR10_KFP_TASK",
    "CIFAR10_KFP_RUN_ID",
)  # = cifar10_kfp.runs.TASK_ENV, RUN_ID_ENV
#: The component image's user (images/train/Dockerfile ``USER 1000:0``); every task runs as it.
IMAGE_UID = 1000
RUN_ID_FIELD_PATH = (
    "metadata.labels['pipeline/runid']"  # KFP's apiserver/template/v2_template.go sets it on pods
)


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$")
_SCALE = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}  # fmt: skip


def _quantity(flag: str, text: str) -> float:
    """The value of Kubernetes quantity ``text`` (``500m``, ``2``, ``4Gi``); ValueError naming ``flag``."""
    match = _QUANTITY.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{flag} {text!r}: not a positive Kubernetes quantity such as 500m, 2, 512Mi or 4Gi")
    return float(match.group(1)) * _SCALE[match.group(2)]


def request_and_limit(flag: str, text: str) -> tuple[str, str]:
    """``REQUEST[:LIMIT]`` of a ``--*-cpu``/``--*-memory`` flag; the limit defaults to the request."""
    request, _, limit = text.partition(":")
    limit = limit or request
    if _quantity(flag, request) > _quantity(flag, limit):
        raise ValueError(f"{flag} {text!r}: the request {request} is above the limit {limit}")
    return request, limit


@dataclass(frozen=True)
class Resources:
    """CPU and memory for a task, as Kubernetes quantities."""

    cpu_request: str
    cpu_limit: str
    memory_request: str
    memory_limit: str

    def with_flags(self, prefix: str, cpu: str | None, memory: str | None) -> Resources:
        """A copy with ``--<prefix>-cpu`` / ``--<prefix>-memory`` (``REQUEST[:LIMIT]``) applied."""
        out = self
        if cpu:
            request, limit = request_and_limit(f"--{prefix}-cpu", cpu)
            out = replace(out, cpu_request=request, cpu_limit=limit)
        if memory:
            request, limit = request_and_limit(f"--{prefix}-memory", memory)
            out = replace(out, memory_request=request, memory_limit=limit)
        return out


@dataclass(frozen=True)
class RetryPolicy:
    """KFP ``set_retry`` arguments (what is and is not retried: ``ClusterPolicy.retry``). A retried
    train step resumes from its last checkpoint, so a retry is cheap."""

    num_retries: int = 3
    backoff_duration: str = "60s"  # first wait: lets a transient cause (an OOM neighbour, an eviction) pass
    backoff_factor: float = 2.0
    backoff_max_duration: str = "1800s"


@dataclass(frozen=True)
class ClusterPolicy:
    """What ``cifar10-kfp compile`` bakes into the pipeline spec."""

    image: str = field(default_factory=default_image)
    minio_endpoint: str = DEFAULT_MINIO_ENDPOINT
    minio_secure: bool = False
    minio_secret: str = MINIO_SECRET
    # Light steps: validation, download, preprocess (decoding 60k JPEGs), evaluation, records.
    step_resources: Resources = Resources("1", "2", "2Gi", "8Gi")
    # Train: feeds the GPU from uint8 tensors already in memory, so a few cores suffice.
    train_resources: Resources = Resources("4", "8", "16Gi", "32Gi")
    train_retry: RetryPolicy = RetryPolicy()
    # Memory-backed /dev/shm of the single-node train pod: NCCL's intra-node transport and PyTorch's
    # inter-process tensors live there, and a container's default /dev/shm is 64 MiB. It counts
    # against the train memory limit.
    train_shm_size: str = "2Gi"
    cached_steps: frozenset[str] = CACHED_STEPS
    # Refuse the well-known minio/minio123 pair on every task (CIFAR10_KFP_STRICT_CREDENTIALS=1)
    # instead of accepting it with a warning, which is what a stock standalone KFP needs.
    strict_credentials: bool = False
    # The user every task's container runs as, non-root (see the module docstring): the image's.
    run_as_user: int = IMAGE_UID

    def with_cached_steps(self, extra: list[str] | tuple[str, ...]) -> ClusterPolicy:
        """A copy that also caches ``extra`` steps (``compile --cache evaluate``)."""
        unknown = sorted(set(extra) - set(ALL_STEPS))
        if unknown:
            raise ValueError(f"--cache {', '.join(unknown)}: not a step; use one of {', '.join(ALL_STEPS)}")
        for step in extra:
            if step in NEVER_CACHED:
                raise ValueError(f"--cache {step}: a cached {step} step would be wrong: {NEVER_CACHED[step]}")
        return replace(self, cached_steps=self.cached_steps | frozenset(extra))

    def with_resources(
        self, *, train_cpu=None, train_memory=None, step_cpu=None, step_memory=None
    ) -> ClusterPolicy:
        """A copy with the ``REQUEST[:LIMIT]`` resource settings that are given (``--train-cpu 1``, ...)."""
        return replace(
            self,
            train_resources=self.train_resources.with_flags("train", train_cpu, train_memory),
            step_resources=self.step_resources.with_flags("step", step_cpu, step_memory),
        )

    @classmethod
    def for_local(cls, minio_endpoint: str, *, minio_secure: bool = False) -> ClusterPolicy:
        """The policy ``run-local`` uses: the same settings, pointed at the local object store.

        kfp.local applies ``set_env_variable`` to its subprocesses (and ignores the Kubernetes
        settings), so the endpoint must be the local one. Retries are off: a genuine failure
        should be reported at once rather than after minutes of backoff.
        """
        return cls(
            minio_endpoint=minio_endpoint, minio_secure=minio_secure, train_retry=RetryPolicy(num_retries=0)
        )

    # -- per-task settings ---------------------------------------------------------------

    def step(self, task, step: str, *, resources: Resources | None = None, gpu: bool = False):
        """Settings every task gets: image, caching, resources, object-store access, run identity, GPU
        isolation, and a non-root user (the module docstring says why).

        ``NVIDIA_VISIBLE_DEVICES=void`` (unless ``gpu``): the image's CUDA base sets it to ``all``, and
        on a node whose container runtime is NVIDIA's, a pod that requests no GPU would otherwise see
        every GPU of the node. ``void`` makes the runtime add none (nvidia-container-toolkit,
        internal/config/image/cuda_image.go ``devicesFromEnvvars``: unset, empty or "void" -> no
        devices). The train step does not get it: kubelet puts a pod's own variables after the
        device plugin's (``GenerateRunContainerOptions`` appends them), so it would hide the GPUs
        the device plugin assigned.
        """
        from kfp import kubernetes

        if step not in ALL_STEPS:
            raise ValueError(f"unknown step {step!r}")
        task.set_container_image(self.image)
        task.set_caching_options(self._cacheable(task, step))
        res = resources or self.step_resources
        task.set_cpu_request(res.cpu_request).set_cpu_limit(res.cpu_limit)
        task.set_memory_request(res.memory_request).set_memory_limit(res.memory_limit)
        self.object_store(task)
        task.set_env_variable(TASK_ENV, task.name)
        kubernetes.use_field_path_as_env(task, RUN_ID_ENV, RUN_ID_FIELD_PATH)
        kubernetes.set_security_context(task, run_as_user=self.run_as_user, run_as_non_root=True)
        if not gpu:
            task.set_env_variable("NVIDIA_VISIBLE_DEVICES", "void")
        return task

    def _cacheable(self, task, step: str) -> bool:
        if step not in self.cached_steps:
            return False
        inputs = task.component_spec.inputs or {}
        if "bucket" in inputs and STORE_IDENTITY_INPUT not in inputs:
            raise ValueError(
                f"--cache {step}: task {task.name} reads or writes the object store but takes no "
                f"{STORE_IDENTITY_INPUT} input, so KFP's cache key would not change with --minio-endpoint and a "
                "recompiled pipeline would reuse results that point into the old store"
            )
        return True

    def object_store(self, task):
        """Credentials from the KFP artifact secret; the endpoint from this policy (no credential in the spec)."""
        from kfp import kubernetes

        kubernetes.use_secret_as_env(
            task, secret_name=self.minio_secret, secret_key_to_env=dict(MINIO_SECRET_KEYS)
        )
        task.set_env_variable("MINIO_ENDPOINT", self.minio_endpoint)
        task.set_env_variable("MINIO_SECURE", "true" if self.minio_secure else "false")
        if self.strict_credentials:
            task.set_env_variable(STRICT_CREDENTIALS_ENV, "1")
        return task

    def gpu_train(self, task, gpu_limit):
        """The single-node train step: GPUs, GPU toleration, memory-backed /dev/shm, big resources, retries.

        ``gpu_limit`` is the validate step's string output (see the module docstring). The GPU
        count is known only at run time, so the toleration and /dev/shm are there even when it
        is 0: such a pod may land on a GPU node, holds no GPU there, and trains on CPU.
        """
        from kfp import kubernetes
        from kfp.dsl.pipeline_channel import PipelineChannel

        self.step(task, "train", resources=self.train_resources, gpu=True)
        task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(gpu_limit)
        if isinstance(gpu_limit, PipelineChannel):
            # set_accelerator_limit does not register its channel (set_container_image does), so inside
            # a dsl.If or ParallelFor the compiler would not route it into the sub-DAG's inputs.
            task.register_pipeline_channels([gpu_limit])
        kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
        kubernetes.empty_dir_mount(
            task, volume_name="dshm", mount_path="/dev/shm", medium="Memory", size_limit=self.train_shm_size
        )
        self.retry(task)
        return task

    def trainer_launcher(self, task):
        """The multi-node train step: a CPU pod that creates and watches a Trainer TrainJob.

        The GPUs are requested by the TrainJob's nodes, not by this pod. A retry re-attaches to
        the TrainJob of the same name, or recreates it and resumes from the checkpoint.
        """
        self.step(task, "train")
        self.retry(task)
        return task

    def retry(self, task):
        """KFP ``set_retry``: an Argo ``retryStrategy`` with a limit and backoff and no ``retryPolicy``.

        Which failures it retries is the cluster's: an install from KFP's manifests merges its Argo
        ``templateDefaults`` policy ``OnError`` in (a deleted pod or a failed init/wait container is
        retried, a raising step is not); a plain Argo's default ``OnFailure`` is the reverse. KFP 2.17's
        SDK cannot set the policy per task. See docs/pipelines.md, "Retries"."""
        r = self.train_retry
        if r.num_retries > 0:
            task.set_retry(
                num_retries=r.num_retries,
                backoff_duration=r.backoff_duration,
                backoff_factor=r.backoff_factor,
                backoff_max_duration=r.backoff_max_duration,
            )
        return task
