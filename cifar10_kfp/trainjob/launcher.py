"""The multi-node launcher: check the Trainer, submit the TrainJob, watch it, clean up, collect outputs.

``run_trainjob`` is what the pipeline's multi-node train step does, in this order:

1. **Trainer version**: refuse a Trainer older than 2.2 before creating anything, from the
   TrainJob CRD's schema, or (without the right to read CRDs, as in a Kubeflow profile
   namespace) from a server-side dry-run create with strict field validation, which the API
   server refuses with ``unknown field "spec.runtimePatches"`` on an older Trainer.
2. **Submit**, owned by the launcher pod (``KFP_POD_NAME`` / ``KFP_POD_UID``, which the KFP
   2.15-2.17 backend sets on every executor container from the downward API: kubeflow/pipelines
   backend/src/v2/compiler/argocompiler/common.go), so deleting the run's pods deletes the job.
3. **Watch** until Complete or Failed, streaming state changes, and every ``events_every_s``
   the Warning events of the job and everything it made (JobSet, Jobs, pods): an unschedulable
   job (no GPUs, an unknown runtime, a rejected pod) says why within a minute.
4. **Timeout**: past ``timeout_s`` the launcher deletes the job and fails, naming the reason
   and the last warnings. ``activeDeadlineSeconds`` on the job is the backstop if the launcher
   itself dies.
5. **Cancel**: SIGTERM (what Argo sends when a KFP run is terminated) deletes the job, then
   fails the step.
6. **Collect** the outputs the node holding rank 0 uploaded, then delete the finished job
   unless ``keep`` (a failed job is kept for its logs: it holds no GPUs, and a retry replaces it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from cifar10_kfp.trainjob.api import (
    TrainJobFailed,
    TrainJobTimedOut,
    check_trainer_version,
    current_namespace,
    delete_trainjob,
    launcher_pod,
    load_kubernetes,
    submit_trainjob,
)
from cifar10_kfp.trainjob.manifest import (
    MODEL_SUBDIR,
    OUTPUT_FILES,
    JobState,
    TrainJobRequest,
    build_trainjob,
    job_name,
)
from cifar10_kfp.trainjob.watch import watch_trainjob

if TYPE_CHECKING:  # annotations only
    from kubernetes.client import ApiClient

    from cifar10_kfp.storage import ObjectStore
    from cifar10_kfp.train import TrainConfig

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_H = 24.0  # the launcher's timeout unless the pipeline sets trainjob_timeout_h
DEADLINE_MARGIN_S = 600  # activeDeadlineSeconds = the launcher's timeout + this: the launcher acts first


def storage_env(config) -> dict[str, str]:
    """The launcher's own non-secret storage settings, so every node writes where it does, as it does."""
    env = {
        "MINIO_REGION": config.region,
        "CIFAR10_KFP_BUCKET": config.bucket,
        "CIFAR10_KFP_PREFIX": config.prefix,
        "CIFAR10_KFP_NAMESPACE": config.namespace,
        "CIFAR10_KFP_STRICT_CREDENTIALS": "1" if config.strict_credentials else "",
    }
    return {key: value for key, value in env.items() if value}


def request_for_run(config: TrainConfig, *, run_id: str, store: ObjectStore, data_uri: str, checkpoint_uri: str, image: str, num_nodes: int,
                    gpus_per_node: int, min_nodes: int = 0, max_restarts: int = 3, timeout_h: float = DEFAULT_TIMEOUT_H,
                    service_account: str = "", image_pull_secrets: str = "", minio_endpoint: str = "",
                    minio_secure: bool = False) -> TrainJobRequest:  # fmt: skip
    """The TrainJob of one pipeline run's train step: named after the run and config, owned by this pod.

    ``image_pull_secrets`` is a comma-separated list of secret names (a pipeline parameter is a string).
    """
    name = job_name(run_id, config.config_hash())
    return TrainJobRequest(
        name=name, namespace=current_namespace(), image=image, data_uri=data_uri,
        output_uri=store.root_uri("trainjobs", name), checkpoint_uri=checkpoint_uri, config=config.to_dict(),
        num_nodes=num_nodes, gpus_per_node=gpus_per_node, min_nodes=min_nodes, max_restarts=max_restarts,
        minio_endpoint=minio_endpoint, minio_secure=minio_secure, storage_env=storage_env(store.config),
        labels={"pipelines.kubeflow.org/run-id": run_id[:63]},
        active_deadline_s=int(timeout_h * 3600) + DEADLINE_MARGIN_S if timeout_h > 0 else 0,
        service_account=service_account.strip(),
        image_pull_secrets=tuple(s.strip() for s in image_pull_secrets.split(",") if s.strip()),
        owner=launcher_pod(),
    )  # fmt: skip


def collect_outputs(output_uri: str, output_dir: str | os.PathLike, store: ObjectStore | None = None) -> Path:
    """Download what the node holding rank 0 uploaded (model/, history.json, metrics.json)."""
    from cifar10_kfp.storage import ObjectStore, join_uri

    store = store or ObjectStore()
    output_dir = Path(output_dir)
    store.get_dir(join_uri(output_uri, MODEL_SUBDIR), output_dir / MODEL_SUBDIR)
    for name in OUTPUT_FILES:
        store.get_file(join_uri(output_uri, name), output_dir / name)
    return output_dir


@contextlib.contextmanager
def deleted_on_sigterm(api_client, namespace: str, name: str):
    """While inside: SIGTERM (a cancelled KFP run) deletes the job, then fails the step with that reason."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed in the main thread; the ownerReference still holds
        return

    def on_sigterm(signum, frame):
        deleted = delete_trainjob(api_client, namespace, name)
        raise TrainJobFailed(
            f"cancelled (SIGTERM): {'deleted' if deleted else 'there was no'} TrainJob {namespace}/{name}, "
            "so it holds no GPUs"
        )

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_trainjob(
    request: TrainJobRequest,
    output_dir: str | os.PathLike,
    *,
    api_client: ApiClient | None = None,
    store: ObjectStore | None = None,
    timeout_s: float = 0.0,
    keep: bool = False,
    events_every_s: float = 30.0,
) -> JobState:
    """Check the Trainer, submit, watch to the end (or the timeout), collect the outputs, clean up."""
    api_client = api_client or load_kubernetes()
    manifest = build_trainjob(request)
    ns, name = request.namespace, request.name
    found = check_trainer_version(api_client, manifest)
    log.info("Kubeflow Trainer %s: creating TrainJob %s/%s", found, ns, name)
    with deleted_on_sigterm(api_client, ns, name):
        submit_trainjob(api_client, manifest)
        try:
            state = watch_trainjob(api_client, ns, name, timeout_s=timeout_s, events_every_s=events_every_s)
        except TrainJobTimedOut as exc:
            delete_trainjob(api_client, ns, name)
            raise TrainJobTimedOut(
                f"TrainJob {ns}/{name} {exc}: deleted it. Raise the launcher timeout (trainjob_timeout_h) if the "
                "run needs longer, or see the events above for why it did not run"
            ) from None
    collect_outputs(request.output_uri, output_dir, store=store)
    if not keep:
        delete_trainjob(api_client, ns, name)
    return state
