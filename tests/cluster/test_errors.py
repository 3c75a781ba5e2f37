"""R4: errors are reported for what they are, by the real API server and the real Trainer webhook. A webhook's
refusal (HTTP 403 "admission webhook ... denied the request") comes back with the webhook's own message, not as
missing RBAC; a real RBAC refusal names the rights; the strict dry run always runs before the real create,
also when the CRD is readable; nothing is created when either refuses."""

from __future__ import annotations

import pytest

from cifar10_kfp.trainjob import ELASTIC_RUNTIME, TrainJobFailed, build_trainjob, run_trainjob
from tests.cluster.helpers import (
    client_for,
    full_request,
    service_account_kubeconfig,
    trainjobs_cleaned,  # noqa: F401 - autouse fixture: frees the GPUs after each test
)


def _recording(api_client) -> list[tuple[str, str, dict]]:
    """Every request the client sends (method, path, query): the wire, as the API server receives it."""
    sent: list[tuple[str, str, dict]] = []
    rest = api_client.rest_client
    original = rest.request

    def request(method, url, query_params=None, **kwargs):
        sent.append((method, url.split("?")[0], dict(query_params or [])))
        return original(method, url, query_params=query_params, **kwargs)

    rest.request = request
    return sent


def _trainjob_posts(sent) -> list[dict]:
    return [query for method, url, query in sent if method == "POST" and url.endswith("/trainjobs")]


def test_a_webhook_refusal_is_reported_with_the_webhooks_message(
    control_plane, trainer_stack, cluster_namespace, tmp_path
):
    """A runtime that does not exist: the Trainer's webhook refuses with HTTP 403; the step says so."""
    namespace = cluster_namespace
    api = client_for(control_plane)
    sent = _recording(api)
    request = full_request(namespace, 2, service_account="", runtime="no-such-runtime")
    with pytest.raises(TrainJobFailed) as refused:
        run_trainjob(request, tmp_path, api_client=api, store=object())
    message = str(refused.value)
    assert message.startswith(f"the cluster refused TrainJob {namespace}/{request.name}: admission webhook")
    assert "denied the request" in message and "no-such-runtime" in message
    assert "must be created before the TrainJob is created" in message  # the Trainer's own words
    assert "not allowed to create" not in message and "grant the pipeline" not in message
    assert _trainjob_posts(sent) == [{"dryRun": "All", "fieldValidation": "Strict"}]  # refused at the dry run
    assert control_plane.kubectl("get", "trainjob", request.name, "-n", namespace).returncode != 0


def test_reserved_torchrun_variables_are_refused_by_the_webhook(
    control_plane, trainer_stack, cluster_namespace, tmp_path
):
    namespace = cluster_namespace
    request = full_request(namespace, 2, service_account="", storage_env={"PET_NNODES": "1:2"})
    with pytest.raises(TrainJobFailed, match=r"admission webhook .* denied the request: .*PET_NNODES"):
        run_trainjob(request, tmp_path, api_client=client_for(control_plane), store=object())


def test_a_missing_elastic_runtime_says_how_to_install_it(
    control_plane, trainer_stack, cluster_namespace, tmp_path
):
    namespace = cluster_namespace
    control_plane.kubectl("delete", "clustertrainingruntime", ELASTIC_RUNTIME, "--ignore-not-found")
    request = full_request(namespace, 3, min_nodes=2, service_account="")
    with pytest.raises(TrainJobFailed, match="kubectl apply --server-side -k deploy/trainer-runtime"):
        run_trainjob(request, tmp_path, api_client=client_for(control_plane), store=object())


def test_missing_rbac_is_reported_as_missing_rbac(control_plane, trainer_stack, cluster_namespace, tmp_path):
    """The pipeline's account without deploy/rbac: the API server's RBAC refusal names the rights to grant."""
    namespace = cluster_namespace
    nobody = client_for(
        control_plane, service_account_kubeconfig(control_plane, namespace, "pipeline-runner")
    )
    with pytest.raises(TrainJobFailed) as refused:
        run_trainjob(
            full_request(namespace, 2, service_account=""), tmp_path, api_client=nobody, store=object()
        )
    message = str(refused.value)
    assert f"not allowed to create TrainJobs in namespace {namespace!r}" in message
    assert "create/get/list/watch/patch/delete on trainjobs.trainer.kubeflow.org" in message
    assert "admission webhook" not in message


def test_the_strict_dry_run_runs_before_the_real_create_even_with_the_crd_readable(
    control_plane, trainer_stack, cluster_namespace, tmp_path
):
    """As admin the CRD is readable: the dry run still runs, first, and the real create follows it."""
    namespace = cluster_namespace
    from cifar10_kfp.trainjob import check_trainer_version, submit_trainjob

    api = client_for(control_plane)
    sent = _recording(api)
    manifest = build_trainjob(full_request(namespace, 1, service_account="", gpus_per_node=0))
    check_trainer_version(api, manifest)
    submit_trainjob(api, manifest)
    crd_read = [i for i, (m, url, _) in enumerate(sent) if m == "GET" and "customresourcedefinitions" in url]
    posts = [(i, q) for i, (m, url, q) in enumerate(sent) if m == "POST" and url.endswith("/trainjobs")]
    assert crd_read and [q for _, q in posts] == [{"dryRun": "All", "fieldValidation": "Strict"}, {}]
    assert crd_read[0] < posts[0][0] < posts[1][0]
