"""Watching a TrainJob against a local Kubernetes API server: the states as they change, the reason of a
failure, and the Warning events of a job that cannot run."""

from __future__ import annotations

import logging

import pytest

from cifar10_kfp.trainjob import (
    TrainJobFailed,
    TrainJobTimedOut,
    build_trainjob,
    load_kubernetes,
    submit_trainjob,
    watch_trainjob,
)
from tests.lib.trainjob.test_manifest import NS, request
from tests.support.k8s_fake_server import TRAINJOBS, K8sFakeServer, condition


def _running():
    return {"jobsStatus": [{"name": "node", "active": 2, "ready": 2}]}


def test_submit_then_watch_streams_to_complete():
    script = [(0.1, _running()), (0.2, {"conditions": [condition("Complete", reason="JobsCompleted")]})]
    with K8sFakeServer(script=script) as k8s:
        api = load_kubernetes(k8s.url)
        manifest = build_trainjob(request())
        submit_trainjob(api, manifest)
        seen = []
        state = watch_trainjob(
            api, NS, manifest["metadata"]["name"], watch_timeout_s=5, on_change=seen.append
        )
    assert state.phase == "Complete"
    assert [s.phase for s in seen] == ["Pending", "Running", "Complete"]
    [create] = k8s.requests_to("POST", TRAINJOBS.format(ns=NS))
    assert create.body == manifest
    watches = [r for r in k8s.requests_to("GET", TRAINJOBS.format(ns=NS)) if r.query.get("watch")]
    assert watches and watches[0].query["fieldSelector"] == f"metadata.name={manifest['metadata']['name']}"


def test_failed_job_raises_with_its_reason():
    failed = {"conditions": [condition("Failed", reason="BackoffLimitExceeded", message="node-1 OOMKilled")]}
    with K8sFakeServer(script=[(0.1, failed)]) as k8s:
        api = load_kubernetes(k8s.url)
        manifest = build_trainjob(request())
        submit_trainjob(api, manifest)
        with pytest.raises(TrainJobFailed, match="BackoffLimitExceeded: node-1 OOMKilled"):
            watch_trainjob(api, NS, manifest["metadata"]["name"], watch_timeout_s=5)


def test_an_unschedulable_job_reports_its_events_and_times_out_naming_them(caplog):
    """No GPU anywhere: the scheduler's FailedScheduling on the job's pod is logged as soon as it is seen,
    and the timeout error carries it; events of other jobs are not reported."""
    manifest = build_trainjob(request())
    name = manifest["metadata"]["name"]
    with K8sFakeServer() as k8s:
        k8s.add_event(NS, "Pod", f"{name}-node-0-1-x7k2p", "FailedScheduling",
                      "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")  # fmt: skip
        k8s.add_event(NS, "Pod", "someone-elses-pod", "FailedScheduling", "not ours")
        k8s.add_event(NS, "Pod", f"{name}-node-0-0-aaaaa", "Scheduled", "assigned", type_="Normal")
        api = load_kubernetes(k8s.url)
        submit_trainjob(api, manifest)
        with caplog.at_level(logging.WARNING), pytest.raises(TrainJobTimedOut) as failure:
            watch_trainjob(api, NS, name, timeout_s=1.5, watch_timeout_s=1, events_every_s=0.2)
    reported = [r.getMessage() for r in caplog.records if "event:" in r.getMessage()]
    assert len(reported) == 1 and "Insufficient nvidia.com/gpu" in reported[0]
    assert "did not finish within 1.5s" in str(failure.value)
    assert "FailedScheduling: 0/3 nodes are available" in str(failure.value)
    [listing] = {
        r.query.get("fieldSelector") for r in k8s.requests_to("GET", f"/api/v1/namespaces/{NS}/events")
    }
    assert listing == "type=Warning"
