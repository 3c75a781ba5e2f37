"""Creating and deleting TrainJobs, and the Trainer-version floor, against a local Kubernetes API server
(tests/support/k8s_fake_server.py: the TrainJob CRD schemas of Trainer 2.0-2.2, strict field validation
and dry runs as kube-apiserver does them)."""

from __future__ import annotations

import pytest

from cifar10_kfp.trainjob import (
    TrainerTooOld,
    TrainJobFailed,
    build_trainjob,
    check_trainer_version,
    job_state,
    launcher_pod,
    load_kubernetes,
    submit_trainjob,
)
from tests.lib.trainjob.test_manifest import NS, request
from tests.support.k8s_fake_server import TRAINJOBS, K8sFakeServer, condition


def test_retry_reattaches_to_a_running_job_and_replaces_a_failed_one():
    with K8sFakeServer() as k8s:
        api = load_kubernetes(k8s.url)
        manifest = build_trainjob(request())
        submit_trainjob(api, manifest)
        submit_trainjob(api, manifest)  # a retried step: same name, still running -> re-attach
        assert len(k8s.requests_to("DELETE", TRAINJOBS.format(ns=NS))) == 0
        k8s.set_status(
            NS, manifest["metadata"]["name"], {"conditions": [condition("Failed", reason="Evicted")]}
        )
        submit_trainjob(api, manifest)  # failed before -> delete and create again (resumes from checkpoint)
        assert len(k8s.requests_to("DELETE", TRAINJOBS.format(ns=NS))) == 1
        assert len(k8s.requests_to("POST", TRAINJOBS.format(ns=NS))) == 4
        assert job_state(k8s.trainjobs[(NS, manifest["metadata"]["name"])]).phase == "Pending"


def test_missing_trainer_or_rbac_gives_an_actionable_error():
    with K8sFakeServer(trainer_installed=False) as k8s:
        with pytest.raises(TrainJobFailed, match="install Kubeflow Trainer >= 2.2"):
            submit_trainjob(load_kubernetes(k8s.url), build_trainjob(request()))
        with pytest.raises(TrainJobFailed, match="install Kubeflow Trainer >= 2.2"):
            check_trainer_version(load_kubernetes(k8s.url), build_trainjob(request()))
    with K8sFakeServer(forbidden=("/apis/trainer.kubeflow.org",)) as k8s:
        with pytest.raises(
            TrainJobFailed, match="create/get/list/watch/patch/delete on trainjobs.* list on events"
        ):
            submit_trainjob(load_kubernetes(k8s.url), build_trainjob(request()))


@pytest.mark.parametrize("old", ["2.0", "2.1"])
def test_a_trainer_older_than_2_2_is_refused_from_its_crd_before_anything_is_created(old):
    with K8sFakeServer(trainer_version=old) as k8s:
        with pytest.raises(TrainerTooOld, match=f"Kubeflow Trainer {old} is installed.*needs Trainer >= 2.2"):
            check_trainer_version(load_kubernetes(k8s.url), build_trainjob(request()))
    assert not k8s.requests_to("POST", TRAINJOBS.format(ns=NS))


def test_without_the_right_to_read_crds_a_strict_dry_run_tells_the_version():
    """In a Kubeflow profile namespace the pipeline's account cannot read CRDs: a server-side dry run with
    fieldValidation=Strict is refused by an older Trainer's schema and creates nothing on any."""
    forbidden = ("/apis/apiextensions.k8s.io",)
    with K8sFakeServer(trainer_version="2.1", forbidden=forbidden) as k8s:
        with pytest.raises(
            TrainerTooOld,
            match='unknown field "spec.activeDeadlineSeconds", unknown field "spec.runtimePatches"',
        ):
            check_trainer_version(load_kubernetes(k8s.url), build_trainjob(request(active_deadline_s=60)))
        [dry] = k8s.requests_to("POST", TRAINJOBS.format(ns=NS))
        assert dry.query == {"dryRun": "All", "fieldValidation": "Strict"} and not k8s.trainjobs
    with K8sFakeServer(trainer_version="2.2", forbidden=forbidden) as k8s:
        assert check_trainer_version(load_kubernetes(k8s.url), build_trainjob(request())) in ("2.2", ">=2.2")
        assert not k8s.trainjobs


def test_an_api_refusal_is_reported_with_the_servers_message():
    """e.g. the Trainer's webhook rejecting a job: the step fails with the server's words, not just 'HTTP 422'."""
    from kubernetes.client.exceptions import ApiException

    from cifar10_kfp.trainjob.api import _create_error

    exc = ApiException(status=422, reason="Unprocessable Entity")
    exc.body = (
        '{"kind": "Status", "message": "admission webhook denied the request: spec.trainer.env: Invalid"}'
    )
    assert "admission webhook denied the request" in str(_create_error(exc, NS, "job"))


def test_the_launcher_pod_comes_from_kfps_downward_api_variables(monkeypatch):
    monkeypatch.delenv("KFP_POD_NAME", raising=False)
    monkeypatch.delenv("KFP_POD_UID", raising=False)
    assert launcher_pod() is None
    monkeypatch.setenv("KFP_POD_NAME", "training-run-x-system-container-impl-123")
    monkeypatch.setenv("KFP_POD_UID", "0b6c3c52-0000-4000-8000-000000000001")
    assert launcher_pod() == {"name": "training-run-x-system-container-impl-123",
                              "uid": "0b6c3c52-0000-4000-8000-000000000001"}  # fmt: skip
