"""The Kubernetes side of a TrainJob: the client, the Trainer version check, create and delete.

Uses the ``kubernetes`` client only (no kfp). RBAC in the run's namespace: ``trainjobs``
create/get/list/watch/delete and ``events`` list (docs/multi-node.md).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from cifar10_kfp.trainjob.manifest import (
    GROUP,
    PLURAL,
    VERSION,
    job_state,
    too_old_message,
    trainer_version_from_crd,
)

if TYPE_CHECKING:  # annotations only
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PLURAL}.{GROUP}"


class TrainJobFailed(RuntimeError):
    """The TrainJob failed, timed out, was cancelled, or could not be created or watched; the message says which."""


class TrainerTooOld(TrainJobFailed):
    """The cluster's Kubeflow Trainer predates 2.2 (no ``runtimePatches``)."""


class TrainJobTimedOut(TrainJobFailed):
    """The job did not finish within the launcher's timeout."""


def load_kubernetes(host: str = "") -> ApiClient:
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
    """The run's namespace (the KFP profile namespace in multi-user mode), as storage detects it."""
    from cifar10_kfp.storage import detect_namespace

    return detect_namespace() or default


def launcher_pod() -> dict | None:
    """``{"name", "uid"}`` of the KFP pod this runs in (KFP_POD_NAME / KFP_POD_UID), or None outside KFP."""
    name, uid = os.environ.get("KFP_POD_NAME", ""), os.environ.get("KFP_POD_UID", "")
    return {"name": name, "uid": uid} if name and uid else None


def _api_message(exc) -> str:
    """The API server's own explanation from an ``ApiException`` body (a ``Status``), else its reason."""
    import json

    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def custom_objects(api_client):
    from kubernetes import client

    return client.CustomObjectsApi(api_client)


# -------------------------------------------------------------------- the Trainer version


def read_trainer_crd(api_client: ApiClient) -> tuple[int, dict | None]:
    """``(HTTP status, CRD)`` of the TrainJob CustomResourceDefinition."""
    from kubernetes.client.exceptions import ApiException

    try:
        crd = api_client.call_api(
            CRD_PATH,
            "GET",
            auth_settings=["BearerToken"],
            response_type="object",
            _return_http_data_only=True,
        )
        return 200, crd
    except ApiException as exc:
        return exc.status, None


def check_trainer_version(api_client: ApiClient, manifest: dict) -> str:
    """Refuse a Trainer older than 2.2 before anything is created; returns what was found.

    Reads the CRD's schema when allowed; otherwise asks the API server to validate the manifest
    strictly in a dry run (``dryRun=All``, ``fieldValidation=Strict``), which creates nothing.
    """
    from kubernetes.client.exceptions import ApiException

    status, crd = read_trainer_crd(api_client)
    if status == 200:
        found = trainer_version_from_crd(crd or {})
        if found != ">=2.2":
            raise TrainerTooOld(too_old_message(found))
        return found
    if status == 404:
        raise _not_installed()
    ns = manifest["metadata"]["namespace"]
    try:
        custom_objects(api_client).create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, manifest, dry_run="All", field_validation="Strict"
        )
    except ApiException as exc:
        message = _api_message(exc)
        if exc.status == 400 and "unknown field" in message:
            raise TrainerTooOld(
                f"{too_old_message('older than 2.2')} (the API server said: {message})"
            ) from exc
        raise _create_error(exc, ns, manifest["metadata"]["name"]) from exc
    return ">=2.2"


def _not_installed() -> TrainJobFailed:
    return TrainJobFailed(
        f"the TrainJob API ({GROUP}/{VERSION}) is not served in this cluster: install Kubeflow Trainer >= 2.2 "
        "(see docs/multi-node.md), or set num_nodes=1"
    )


def _create_error(exc, ns: str, name: str) -> TrainJobFailed:
    if exc.status == 404:
        return _not_installed()
    if exc.status == 403:
        return TrainJobFailed(
            f"not allowed to create TrainJobs in namespace {ns!r}: grant the pipeline's service account "
            "create/get/list/watch/delete on trainjobs.trainer.kubeflow.org and list on events "
            f"(see docs/multi-node.md); the API server said: {_api_message(exc)}"
        )
    return TrainJobFailed(f"creating TrainJob {ns}/{name} failed: HTTP {exc.status}: {_api_message(exc)}")


# ------------------------------------------------------------------------ create / delete


def submit_trainjob(api_client: ApiClient, manifest: dict) -> dict:
    """Create the TrainJob; if one of that name exists (a retried step), re-attach to it.

    A job of that name that already *failed* is deleted and recreated: the new one resumes
    from the run's checkpoint.
    """
    from kubernetes.client.exceptions import ApiException

    api = custom_objects(api_client)
    ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    try:
        created = api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
        log.info("created TrainJob %s/%s", ns, name)
        return created
    except ApiException as exc:
        if exc.status != 409:
            raise _create_error(exc, ns, name) from exc
    existing = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    if job_state(existing).phase != "Failed":
        log.info("TrainJob %s/%s exists (a retried step): watching it", ns, name)
        return existing
    log.info("TrainJob %s/%s failed before: deleting it and starting again from the checkpoint", ns, name)
    delete_trainjob(api_client, ns, name)
    _wait_deleted(api, ns, name)
    return api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)


def delete_trainjob(api_client: ApiClient, ns: str, name: str) -> bool:
    """Delete the job and, through the garbage collector, its JobSet and pods; False if it was gone."""
    from kubernetes.client.exceptions import ApiException

    try:
        custom_objects(api_client).delete_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, name, propagation_policy="Background"
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    log.info("deleted TrainJob %s/%s", ns, name)
    return True


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
