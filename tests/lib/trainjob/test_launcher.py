"""The whole launch against a local Kubernetes API server and the embedded S3 store: version check first,
outputs collected, the job deleted after success (unless kept), on the launcher's timeout, and on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from cifar10_kfp.trainjob import (
    TrainerTooOld,
    TrainJobFailed,
    TrainJobTimedOut,
    load_kubernetes,
    run_trainjob,
)
from tests.lib.trainjob.test_manifest import NS, request
from tests.support.k8s_fake_server import TRAINJOBS, K8sFakeServer, condition


def _node_0_uploaded(store, tmp_path, output_uri: str) -> None:
    """What the node holding rank 0 leaves in the object store (cifar10-kfp train --upload-to)."""
    from cifar10_kfp.train.models import ModelInfo, build_model, save_model

    node_out = tmp_path / "node0"
    info = ModelInfo(architecture="simple_cnn", num_classes=4, image_size=16,
                     class_names=[f"c{i}" for i in range(4)], mean=[0.5] * 3, std=[0.25] * 3)  # fmt: skip
    save_model(build_model("simple_cnn", num_classes=4, image_size=16), info, node_out / "model")
    (node_out / "history.json").write_text(json.dumps([{"epoch": 1, "val_acc": 0.5}]))
    (node_out / "metrics.json").write_text(json.dumps({"val_acc": 0.5}))
    store.put_dir(node_out, output_uri)


@pytest.mark.parametrize("keep", [False, True])
def test_run_trainjob_collects_the_outputs_then_deletes_the_job_unless_kept(store_env, tmp_path, keep):
    from cifar10_kfp.train.models import load_model

    store_env.ensure_bucket()
    output_uri = store_env.root_uri("trainjobs", "job-1")
    _node_0_uploaded(store_env, tmp_path, output_uri)
    with K8sFakeServer(script=[(0.1, {"conditions": [condition("Complete")]})]) as k8s:
        state = run_trainjob(request(output_uri=output_uri), tmp_path / "collected", api_client=load_kubernetes(k8s.url),
                             store=store_env, keep=keep)  # fmt: skip
    assert state.phase == "Complete"
    _, info = load_model(tmp_path / "collected" / "model")
    assert info.architecture == "simple_cnn"
    assert json.loads((tmp_path / "collected" / "metrics.json").read_text()) == {"val_acc": 0.5}
    deletions = k8s.requests_to("DELETE", TRAINJOBS.format(ns=NS))
    assert len(deletions) == (0 if keep else 1) and bool(k8s.trainjobs) is keep
    if not keep:
        assert deletions[0].path.endswith("/" + request().name)


def test_the_version_check_comes_before_anything_is_created(tmp_path):
    with K8sFakeServer(trainer_version="2.1") as k8s:
        with pytest.raises(TrainerTooOld):
            run_trainjob(request(), tmp_path, api_client=load_kubernetes(k8s.url))
    assert not k8s.requests_to("POST", TRAINJOBS.format(ns=NS))


def test_the_launcher_timeout_deletes_the_job_and_fails_naming_the_reason(tmp_path):
    with K8sFakeServer(script=[(0.1, {"jobsStatus": [{"name": "node", "active": 1}]})]) as k8s:
        k8s.add_event(NS, "Pod", f"{request().name}-node-0-1-q2w3e", "FailedScheduling",
                      "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")  # fmt: skip
        with pytest.raises(TrainJobTimedOut) as failure:
            run_trainjob(request(active_deadline_s=600), tmp_path, api_client=load_kubernetes(k8s.url),
                         timeout_s=1.5, events_every_s=0.3)  # fmt: skip
        [create] = k8s.requests_to("POST", TRAINJOBS.format(ns=NS))
    message = str(failure.value)
    assert (
        "did not finish within 1.5s" in message and "deleted it" in message and "launcher timeout" in message
    )
    assert "Insufficient nvidia.com/gpu" in message
    assert create.body["spec"]["activeDeadlineSeconds"] == 600  # the Trainer's backstop if the launcher dies
    assert len(k8s.requests_to("DELETE", TRAINJOBS.format(ns=NS))) == 1 and not k8s.trainjobs


def test_sigterm_deletes_the_job_and_fails_the_step(tmp_path):
    """A cancelled KFP run: Argo sends SIGTERM to the step's processes; the TrainJob must not keep its GPUs.

    The signal goes to this (pytest's) process, so it is sent only once the launcher's handler is
    installed and the job was created: never on a clock, which on a loaded machine could fire
    before the handler and kill the whole session. If that moment never comes, no signal is sent and
    the launcher's own timeout fails the test.
    """
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM)
    with K8sFakeServer(script=[(0.1, {"jobsStatus": [{"name": "node", "active": 2}]})]) as k8s:
        done = threading.Event()

        def cancel_once_the_job_is_watched():
            while not done.wait(0.02):
                handled = signal.getsignal(signal.SIGTERM) not in (before, signal.SIG_DFL)
                if handled and k8s.requests_to("POST", TRAINJOBS.format(ns=NS)):
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        canceller = threading.Thread(target=cancel_once_the_job_is_watched, daemon=True)
        canceller.start()
        try:
            with pytest.raises(TrainJobFailed, match=r"cancelled \(SIGTERM\): deleted TrainJob"):
                run_trainjob(request(), tmp_path, api_client=load_kubernetes(k8s.url), timeout_s=60)
        finally:
            done.set()
            canceller.join()
        assert len(k8s.requests_to("POST", TRAINJOBS.format(ns=NS))) == 1
        assert len(k8s.requests_to("DELETE", TRAINJOBS.format(ns=NS))) == 1 and not k8s.trainjobs
    assert signal.getsignal(signal.SIGTERM) is before  # the handler lives only while the job does


def test_a_runs_request_is_named_owned_and_deadlined_from_the_pipelines_values(store_env, monkeypatch):
    from cifar10_kfp.train.config import make_config
    from cifar10_kfp.trainjob import job_name, request_for_run

    monkeypatch.setenv("KFP_POD_NAME", "training-x-system-container-impl-7")
    monkeypatch.setenv("KFP_POD_UID", "uid-7")
    config = make_config("cpu")
    job = request_for_run(
        config, run_id="run-7", store=store_env, data_uri="s3://b/d", checkpoint_uri="s3://b/c", image="img",
        num_nodes=4, gpus_per_node=2, min_nodes=2, max_restarts=5, timeout_h=2.0, service_account=" sa ",
        image_pull_secrets="regcred, mirror,,",
    )  # fmt: skip
    assert job.name == job_name("run-7", config.config_hash()) and job.output_uri.endswith(
        f"/trainjobs/{job.name}"
    )
    assert job.active_deadline_s == 2 * 3600 + 600  # the launcher's timeout acts first
    assert job.image_pull_secrets == ("regcred", "mirror") and job.service_account == "sa"
    assert job.owner == {"name": "training-x-system-container-impl-7", "uid": "uid-7"}
    assert (job.min_nodes, job.num_nodes, job.max_restarts, job.elastic) == (2, 4, 5, True)
