"""The launcher's whole life on the real Trainer, JobSet, Job controllers and garbage collector: submit and
watch, success when the pods succeed (outputs collected, job deleted), the real failure reason when a pod
fails, activeDeadlineSeconds ending in DeadlineExceeded, SIGTERM deleting the job and everything it made, and
a retried launcher re-attaching and taking over the ownerReference (R8) with deploy/rbac's rights only."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from cifar10_kfp.trainjob import (
    TrainJobCancelled,
    TrainJobFailed,
    build_trainjob,
    run_trainjob,
    submit_trainjob,
)
from tests.cluster.helpers import (
    apply_rbac,
    client_for,
    condition,
    full_request,
    kubectl_json,
    launcher_pod,
    node_account,
    pods_of,
    running_pods,
    runtime_with_backoff_limit,
    service_account_kubeconfig,
    trainjob,
    trainjobs_cleaned,  # noqa: F401 - autouse fixture: frees the GPUs after each test
    wait_until,
)


def _gone(cp, *args: str) -> bool:
    return cp.kubectl("get", *args).returncode != 0


def _outputs_of_rank_0(store, tmp_path, output_uri: str) -> None:
    """What the node holding rank 0 uploads, without the completion marker: success comes from the Job."""
    from cifar10_kfp.train.models import ModelInfo, build_model, save_model

    out = tmp_path / "node0"
    info = ModelInfo(architecture="simple_cnn", num_classes=4, image_size=16,
                     class_names=[f"c{i}" for i in range(4)], mean=[0.5] * 3, std=[0.25] * 3)  # fmt: skip
    save_model(build_model("simple_cnn", num_classes=4, image_size=16), info, out / "model")
    (out / "history.json").write_text(json.dumps([{"epoch": 1}]))
    (out / "metrics.json").write_text(json.dumps({"val_acc": 0.5}))
    store.put_dir(out, output_uri)


class _Launcher(threading.Thread):
    """run_trainjob in a thread, as the KFP step runs it, while the test plays the nodes through kwok."""

    def __init__(self, request, output_dir, **kwargs):
        super().__init__(daemon=True)
        self.args, self.kwargs = (request, output_dir), kwargs
        self.state = self.error = None

    def run(self):
        try:
            self.state = run_trainjob(*self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def result(self, timeout_s: float = 120):
        self.join(timeout_s)
        assert not self.is_alive(), "the launcher did not return"
        return self.state, self.error


def test_success_when_the_pods_succeed_collects_and_deletes(control_plane, trainer_stack, cluster_namespace, store_env,
                                                            tmp_path):  # fmt: skip
    namespace = cluster_namespace
    cp = control_plane
    node_account(cp, namespace)
    store_env.ensure_bucket()
    request = full_request(namespace, 2, tag="ok", output_uri=store_env.root_uri("trainjobs", "ok"),
                           owner=launcher_pod(cp, namespace), gpus_per_node=1)  # fmt: skip
    _outputs_of_rank_0(store_env, tmp_path, request.output_uri)
    launcher = _Launcher(request, tmp_path / "collected", api_client=client_for(cp), store=store_env,
                         events_every_s=1)  # fmt: skip
    launcher.start()
    for pod in running_pods(cp, namespace, request.name, 2):
        cp.succeed_pod(namespace, pod["metadata"]["name"])
    state, error = launcher.result()
    assert error is None, error
    assert state.phase == "Complete" and state.reason != "CompletionMarker"  # the Trainer's own condition
    assert (tmp_path / "collected" / "model").is_dir()
    assert _gone(cp, "trainjob", request.name, "-n", namespace)  # deleted once collected
    wait_until("the JobSet collected", lambda: _gone(cp, "jobset", request.name, "-n", namespace))


def test_a_failed_pod_fails_the_step_with_the_real_reason(control_plane, trainer_stack, cluster_namespace, store_env,
                                                          tmp_path):  # fmt: skip
    namespace = cluster_namespace
    cp = control_plane
    node_account(cp, namespace)
    runtime = runtime_with_backoff_limit(cp, f"no-retries-{namespace}", backoff_limit=0)
    request = full_request(namespace, 2, tag="fail", runtime=runtime, gpus_per_node=1)
    launcher = _Launcher(
        request, tmp_path / "c", api_client=client_for(cp), store=store_env, events_every_s=1
    )
    launcher.start()
    pods = running_pods(cp, namespace, request.name, 2)
    cp.fail_pod(namespace, pods[1]["metadata"]["name"], exit_code=3, reason="Error", message="CUDA error")
    _, error = launcher.result()
    assert isinstance(error, TrainJobFailed), error
    failed = condition(trainjob(cp, namespace, request.name), "Failed")
    assert failed, "the Trainer marked the TrainJob Failed"
    assert f"failed: {failed['reason']}: {failed['message']}" in str(error)  # the controllers' words
    job = kubectl_json(cp, "get", "job", f"{request.name}-node-0", "-n", namespace)
    assert condition(job, "Failed")["reason"] == "BackoffLimitExceeded"
    assert not _gone(cp, "trainjob", request.name, "-n", namespace)  # a failed job is kept for its logs
    cp.kubectl("delete", "clustertrainingruntime", runtime, "--wait=false")  # in use until the job goes


def test_active_deadline_ends_in_deadline_exceeded(
    control_plane, trainer_stack, cluster_namespace, store_env, tmp_path
):
    namespace = cluster_namespace
    cp = control_plane
    node_account(cp, namespace)
    request = full_request(namespace, 1, tag="deadline", active_deadline_s=3, gpus_per_node=1)
    launcher = _Launcher(
        request, tmp_path / "c", api_client=client_for(cp), store=store_env, events_every_s=1
    )
    launcher.start()
    _, error = launcher.result(timeout_s=90)
    assert isinstance(error, TrainJobFailed) and "failed: DeadlineExceeded" in str(error), error
    # the Trainer deletes the JobSet of a job past its deadline (pkg/controller/trainjob_controller.go)
    wait_until("the JobSet deleted", lambda: _gone(cp, "jobset", request.name, "-n", namespace))


def test_sigterm_deletes_the_job_and_everything_it_made(control_plane, trainer_stack, cluster_namespace, store_env,
                                                        tmp_path):  # fmt: skip
    namespace = cluster_namespace
    cp = control_plane
    node_account(cp, namespace)
    request = full_request(namespace, 2, tag="cancel", gpus_per_node=1)
    before = signal.getsignal(signal.SIGTERM)

    def cancel_when_running():
        running_pods(cp, namespace, request.name, 2)
        os.kill(os.getpid(), signal.SIGTERM)  # what Argo sends a terminated KFP run's step

    timer = threading.Thread(target=cancel_when_running, daemon=True)
    timer.start()
    with pytest.raises(TrainJobCancelled, match=r"cancelled \(SIGTERM\): deleted TrainJob"):
        run_trainjob(request, tmp_path / "c", api_client=client_for(cp), store=store_env, timeout_s=120,
                     events_every_s=1)  # fmt: skip
    assert signal.getsignal(signal.SIGTERM) is before
    assert _gone(cp, "trainjob", request.name, "-n", namespace)
    wait_until("the JobSet collected", lambda: _gone(cp, "jobset", request.name, "-n", namespace))
    wait_until("the pods gone", lambda: not pods_of(cp, namespace, request.name), timeout_s=90)


def test_a_retried_launcher_reattaches_and_takes_over_the_owner_reference(control_plane, trainer_stack,
                                                                          cluster_namespace):  # fmt: skip
    """R8, as the pipeline's own account with deploy/rbac's Role only: the second attempt's pod becomes the
    owner, so deleting it (the run's pods going) deletes the job through the real garbage collector."""
    namespace = cluster_namespace
    cp = control_plane
    apply_rbac(cp, namespace)
    runner = client_for(cp, service_account_kubeconfig(cp, namespace, "pipeline-runner"))
    first, second = launcher_pod(cp, namespace, "attempt-1"), launcher_pod(cp, namespace, "attempt-2")
    request = full_request(namespace, 2, tag="retry", service_account="", owner=first, gpus_per_node=1)
    created = submit_trainjob(runner, build_trainjob(request))
    attached = submit_trainjob(runner, build_trainjob(full_request(namespace, 2, tag="retry", service_account="",
                                                                   owner=second, gpus_per_node=1)))  # fmt: skip
    assert attached["metadata"]["uid"] == created["metadata"]["uid"]  # the same job, not a second one
    refs = trainjob(cp, namespace, request.name)["metadata"]["ownerReferences"]
    assert [(r["name"], r["uid"]) for r in refs] == [("attempt-2", second["uid"])]
    cp.kubectl_ok("delete", "pod", "attempt-2", "-n", namespace, "--wait=false")
    wait_until("the TrainJob collected with its owner",
               lambda: _gone(cp, "trainjob", request.name, "-n", namespace), timeout_s=90)  # fmt: skip


def test_an_unschedulable_job_times_out_with_the_schedulers_reason_and_is_deleted(control_plane, trainer_stack,
                                                                                  cluster_namespace, store_env, tmp_path):  # fmt: skip
    """No node has 8 GPUs: the real scheduler's FailedScheduling event is in the launcher's timeout error, and
    the launcher deletes the job (the TrainJob's own activeDeadlineSeconds is only the backstop)."""
    namespace = cluster_namespace
    cp = control_plane
    request = full_request(namespace, 2, tag="nogpu", service_account="", gpus_per_node=8)
    with pytest.raises(TrainJobFailed) as timed_out:
        run_trainjob(request, tmp_path / "c", api_client=client_for(cp), store=store_env, timeout_s=20,
                     events_every_s=2)  # fmt: skip
    message = str(timed_out.value)
    assert "did not finish within 20s" in message and "deleted it" in message
    assert "FailedScheduling" in message and "Insufficient nvidia.com/gpu" in message
    assert _gone(cp, "trainjob", request.name, "-n", namespace)
