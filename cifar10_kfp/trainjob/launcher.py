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
   Rank 0 writes a completion marker after its outputs (``outputs.DONE_MARKER``); the launcher looks
   for it while watching and takes it as success even when the job does not complete: an elastic run
   that ended with fewer than ``num_nodes`` nodes leaves its Indexed Job waiting for the missing index.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from cifar10_kfp.trainjob.api import (
    TrainJobCancelled,
    TrainJobFailed,
    TrainJobTimedOut,
    check_trainer_version,
    current_namespace,
    delete_trainjob,
    launcher_pod,
    load_kubernetes,
    submit_trainjob,
)
from cifar10_kfp.trainjob.manifest import JobState, TrainJobRequest, build_trainjob, job_name
from cifar10_kfp.trainjob.outputs import DONE_MARKER, collect_outputs, read_marker
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


# What KFP 2.17's MLflow integration gives the launcher pod and rank 0 needs to log to the same run. Only
# values without secrets: MLFLOW_TRACKING_TOKEN and _PASSWORD come from a Secret whose key names the
# admin chose, and a value would put the credential into the TrainJob object (docs/tracking.md).
TRACKING_ENV = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_ID",
    "MLFLOW_RUN_ID",
    "MLFLOW_WORKSPACE",
    "MLFLOW_TRACKING_AUTH",
)


def tracking_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher's MLflow variables for the nodes; none when the tracking URI itself holds a password."""
    env = os.environ if env is None else env
    found = {name: env[name].strip() for name in TRACKING_ENV if env.get(name, "").strip()}
    if "@" in urlsplit(found.get("MLFLOW_TRACKING_URI", "")).netloc:
        log.warning(
            "MLFLOW_TRACKING_URI holds credentials: not passed to the TrainJob's nodes, so they do not log to MLflow"
        )
        return {}
    return found


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
        tracking_env=tracking_env(),
        labels={"pipelines.kubeflow.org/run-id": run_id[:63]},
        active_deadline_s=int(timeout_h * 3600) + DEADLINE_MARGIN_S if timeout_h > 0 else 0,
        service_account=service_account.strip(),
        image_pull_secrets=tuple(s.strip() for s in image_pull_secrets.split(",") if s.strip()),
        owner=launcher_pod(),
    )  # fmt: skip


@contextlib.contextmanager
def deleted_on_sigterm(api_client, namespace: str, name: str):
    """While inside: SIGTERM (a cancelled KFP run) deletes the job, then fails the step with that reason."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed in the main thread; the ownerReference still holds
        return

    def on_sigterm(signum, frame):
        deleted = delete_trainjob(api_client, namespace, name)
        raise TrainJobCancelled(
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
    from cifar10_kfp.storage import ObjectStore

    api_client = api_client or load_kubernetes()
    store = store or ObjectStore()
    manifest = build_trainjob(request)
    ns, name = request.namespace, request.name
    found = check_trainer_version(api_client, manifest)
    log.info("Kubeflow Trainer %s: creating TrainJob %s/%s", found, ns, name)
    with deleted_on_sigterm(api_client, ns, name):
        submit_trainjob(api_client, manifest)
        state = _watch_to_the_end(api_client, request, store, timeout_s, events_every_s)
    collect_outputs(request.output_uri, output_dir, store=store)
    # A run finished by its marker may leave pods behind (Pending, or waiting for a node 0 that is done):
    # the job goes even with ``keep``, so that they hold no GPUs.
    if not keep or state.reason == MARKER_REASON:
        delete_trainjob(api_client, ns, name)
    return state


MARKER_REASON = "CompletionMarker"


def _watch_to_the_end(api_client, request: TrainJobRequest, store, timeout_s: float, events_every_s: float):
    """The job's final state: Complete, or the completion marker rank 0 wrote (also if the job then failed)."""
    ns, name = request.namespace, request.name

    def finished_by_marker() -> JobState | None:
        try:
            marker = read_marker(request.output_uri, store)
        except TrainJobFailed:
            raise  # SIGTERM's handler raises wherever the launcher is, this read included
        except Exception as exc:  # noqa: BLE001 - the store may blink; the job's own state still counts
            log.warning("cannot read the completion marker of TrainJob %s/%s: %s", ns, name, exc)
            return None
        if marker is None:
            return None
        return JobState("Complete", MARKER_REASON,
                        f"rank 0 wrote {DONE_MARKER} after its outputs (world size {marker.get('world_size')})")  # fmt: skip

    try:
        return watch_trainjob(api_client, ns, name, timeout_s=timeout_s, events_every_s=events_every_s,
                              done=finished_by_marker)  # fmt: skip
    except TrainJobCancelled:
        raise
    except TrainJobTimedOut as exc:
        delete_trainjob(api_client, ns, name)
        raise TrainJobTimedOut(
            f"TrainJob {ns}/{name} {exc}: deleted it. Raise the launcher timeout (trainjob_timeout_h) if the "
            "run needs longer, or see the events above for why it did not run"
        ) from None
    except TrainJobFailed:
        # An elastic run whose Job failed after rank 0 finished (a node used up its own restarts) succeeded.
        state = finished_by_marker()
        if state is None:
            raise
        log.info("TrainJob %s/%s failed after rank 0 finished: %s", ns, name, state.message)
        return state
