"""Elastic and restart behaviour as the real JobSet and Job controllers run it.

* W2: an elastic run that ends with fewer than num_nodes nodes does not hang: the Indexed Job waits for the
  missing index, but rank 0's completion marker (written after its outputs, as ``cifar10-kfp train
  --upload-to`` writes it) makes the launcher collect the model and delete the TrainJob, leftover pods included.
* W3/R1: deploy/trainer-runtime is admitted by the real webhooks; elastic requests use it; the Job it makes
  has a per-node restart budget, no in-place restarts, and disruptions that do not count; every node's
  command waits for node 0 (``--rdzv-wait-s``).
* R5/R6/R3: what happens when one node's pod fails, measured on the real controllers, for both runtimes.
"""

from __future__ import annotations

import json
import time

from cifar10_kfp.trainjob import (
    ELASTIC_RUNTIME,
    build_trainjob,
    submit_trainjob,
    upload_outputs,
)
from localcluster import kwok_stages
from tests.cluster.helpers import (
    client_for,
    condition,
    full_request,
    install_elastic_runtime,
    kubectl_json,
    node_index,
    pods_of,
    running_pods,
    trainjob,
    trainjobs_cleaned,  # noqa: F401 - autouse fixture: frees the GPUs after each test
    wait_until,
)
from tests.cluster.test_launcher_life import _gone, _Launcher, _outputs_of_rank_0


def _job(cp, namespace: str, name: str) -> dict:
    return kubectl_json(cp, "get", "job", f"{name}-node-0", "-n", namespace)


def test_the_elastic_runtime_is_admitted_and_gives_each_node_its_own_budget(
    control_plane, trainer_stack, cluster_namespace
):
    namespace = cluster_namespace
    cp = control_plane
    runtime = install_elastic_runtime(cp)
    assert runtime["metadata"]["name"] == ELASTIC_RUNTIME
    request = full_request(namespace, 3, min_nodes=2, tag="elastic", service_account="", gpus_per_node=1)
    manifest = build_trainjob(request)
    assert manifest["spec"]["runtimeRef"]["name"] == ELASTIC_RUNTIME
    submit_trainjob(client_for(cp), manifest)
    job = wait_until("the Job", lambda: cp.kubectl("get", "job", f"{request.name}-node-0", "-n", namespace)
                     .returncode == 0 and _job(cp, namespace, request.name))  # fmt: skip
    spec = job["spec"]
    assert spec["backoffLimitPerIndex"] == 6 and spec["completionMode"] == "Indexed"
    assert spec["podFailurePolicy"]["rules"][0] == {
        "action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]
    }  # fmt: skip
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    for pod in running_pods(cp, namespace, request.name, 3):
        command = pod["spec"]["containers"][0]["command"]
        assert (
            command[command.index("--rdzv-wait-s") + 1] == "900"
            and command[command.index("--nnodes") + 1] == "2:3"
        )


def test_w2_a_run_that_ends_short_finishes_by_its_completion_marker(control_plane, trainer_stack, cluster_namespace,
                                                                    store_env, tmp_path):  # fmt: skip
    namespace = cluster_namespace
    cp = control_plane
    install_elastic_runtime(cp)
    store_env.ensure_bucket()
    request = full_request(namespace, 3, min_nodes=2, tag="short", service_account="", gpus_per_node=1,
                           output_uri=store_env.root_uri("trainjobs", "short"))  # fmt: skip
    launcher = _Launcher(request, tmp_path / "collected", api_client=client_for(cp), store=store_env,
                         events_every_s=1)  # fmt: skip
    launcher.start()
    pods = running_pods(cp, namespace, request.name, 3)
    for pod in pods[:2]:  # nodes 0 and 1 finish; node 2 never does (it came too late, or lost its GPU)
        cp.succeed_pod(namespace, pod["metadata"]["name"])
    wait_until(
        "2 of 3 indexes succeeded", lambda: _job(cp, namespace, request.name)["status"].get("succeeded") == 2
    )
    time.sleep(3)
    assert not condition(trainjob(cp, namespace, request.name), "Complete"), (
        "the Job alone would wait for node 2"
    )
    assert launcher.is_alive()
    _outputs_of_rank_0(store_env, tmp_path, request.output_uri)  # rank 0's upload ...
    upload_outputs(tmp_path / "node0", request.output_uri, store_env, world_size=2)  # ... then its marker
    state, error = launcher.result(timeout_s=60)
    assert error is None, error
    assert (state.phase, state.reason) == ("Complete", "CompletionMarker") and "world size 2" in state.message
    assert (tmp_path / "collected" / "model").is_dir()
    assert _gone(cp, "trainjob", request.name, "-n", namespace)
    wait_until(
        "node 2's pod gone with the job", lambda: not pods_of(cp, namespace, request.name), timeout_s=90
    )


def _replacement(cp, namespace, name, index, old_uid):
    def probe():
        return [p for p in pods_of(cp, namespace, name)
                if node_index(p) == index and p["metadata"]["uid"] != old_uid and not p["metadata"].get("deletionTimestamp")]  # fmt: skip

    return wait_until(f"a new pod for node {index}", probe, timeout_s=90)[0]


def test_a_failed_pod_is_replaced_and_counted(control_plane, trainer_stack, cluster_namespace):
    """R5/R6: on `torch-distributed` (restartPolicy OnFailure) a pod the kubelet reports Failed (a lost node;
    kwok reports every container failure so) gets a new pod for the same index, counted in the Job's one
    shared budget; the TrainJob goes on."""
    namespace = cluster_namespace
    cp = control_plane
    request = full_request(namespace, 2, tag="replace", service_account="", gpus_per_node=1)
    submit_trainjob(client_for(cp), build_trainjob(request))
    pods = running_pods(cp, namespace, request.name, 2)
    assert pods[0]["spec"]["restartPolicy"] == "OnFailure"  # JobSet's webhook default
    assert (
        _job(cp, namespace, request.name)["spec"]["backoffLimit"] == 6
    )  # the Job default, shared by all nodes
    started = time.monotonic()
    cp.fail_pod(namespace, pods[1]["metadata"]["name"], exit_code=1)
    new = _replacement(cp, namespace, request.name, 1, pods[1]["metadata"]["uid"])
    replaced_after = time.monotonic() - started
    assert new["metadata"]["name"] != pods[1]["metadata"]["name"]  # a new pod, not a restart in place
    assert _job(cp, namespace, request.name)["status"].get("failed") == 1
    assert not condition(trainjob(cp, namespace, request.name), "Failed")
    print(
        f"measured: torch-distributed, node 1 failed -> new pod after {replaced_after:.1f}s, job.status.failed=1"
    )


def test_in_place_restarts_of_all_nodes_share_one_budget(control_plane, trainer_stack, cluster_namespace):
    """R3/W3: with restartPolicy OnFailure the Job controller sums the restart counts of every active pod's
    containers (pastBackoffLimitOnFailure): 3 restarts on node 0 and 3 on node 1 end the Job, though no node
    failed 6 times. The restart counts are written as a kubelet reports them (pod status)."""
    namespace = cluster_namespace
    cp = control_plane
    request = full_request(namespace, 2, tag="budget", service_account="", gpus_per_node=1)
    submit_trainjob(client_for(cp), build_trainjob(request))
    for pod in running_pods(cp, namespace, request.name, 2):
        status = pod["status"]
        status["containerStatuses"][0]["restartCount"] = 3
        cp.kubectl_ok("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status",
                      "--type=merge", "-p", json.dumps({"status": {"containerStatuses": status["containerStatuses"]}}))  # fmt: skip
    failed = wait_until("the Job failed", lambda: condition(_job(cp, namespace, request.name), "Failed"), 60)
    assert failed["reason"] == "BackoffLimitExceeded"
    tj = wait_until(
        "the TrainJob failed", lambda: condition(trainjob(cp, namespace, request.name), "Failed"), 60
    )
    print(
        f"measured: torch-distributed, 3+3 in-place restarts -> Job {failed['reason']}, TrainJob {tj['reason']}"
    )


def test_on_the_elastic_runtime_a_failure_counts_for_its_node_only(
    control_plane, trainer_stack, cluster_namespace
):
    """W3: restartPolicy Never and backoffLimitPerIndex: node 1's failure gives node 1 a new pod and uses one of
    node 1's 6, none of node 0's; node 0's own pod is untouched."""
    namespace = cluster_namespace
    cp = control_plane
    install_elastic_runtime(cp)
    request = full_request(namespace, 2, min_nodes=1, tag="perindex", service_account="", gpus_per_node=1)
    submit_trainjob(client_for(cp), build_trainjob(request))
    pods = running_pods(cp, namespace, request.name, 2)
    cp.fail_pod(namespace, pods[1]["metadata"]["name"], exit_code=1)
    _replacement(cp, namespace, request.name, 1, pods[1]["metadata"]["uid"])
    job = wait_until(
        "the failure counted", lambda: (j := _job(cp, namespace, request.name))["status"].get("failed") and j
    )
    assert job["status"]["failed"] == 1 and not condition(job, "Failed")
    same_node_0 = [p for p in pods_of(cp, namespace, request.name) if node_index(p) == 0]
    assert [p["metadata"]["uid"] for p in same_node_0] == [pods[0]["metadata"]["uid"]]
    assert not condition(trainjob(cp, namespace, request.name), "Failed")


def test_an_evicted_node_does_not_count_on_the_elastic_runtime(
    control_plane, trainer_stack, cluster_namespace
):
    """A drain or preemption (the Eviction API sets the DisruptionTarget condition) is ignored by the Job's
    podFailurePolicy: once the pod is terminal the node gets a new pod and nothing is counted. The kubelet's
    part, the evicted container killed and the pod marked Failed, is written into pod status as a kubelet
    reports it (kwok leaves an evicted pod Running until it is removed)."""
    namespace = cluster_namespace
    cp = control_plane
    install_elastic_runtime(cp)
    request = full_request(namespace, 2, min_nodes=1, tag="evict", service_account="", gpus_per_node=1)
    submit_trainjob(client_for(cp), build_trainjob(request))
    pods = running_pods(cp, namespace, request.name, 2)
    victim = pods[1]["metadata"]["name"]
    # kwok removes a deleted pod after 1 s (kwok_stages.py); this one stays while its status is written.
    cp.kubectl_ok("annotate", "pod", victim, "-n", namespace, f"{kwok_stages.DELETE_DELAY_ANNOTATION}=15s")
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim, "namespace": namespace},
    }
    cp.kubectl_ok("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{victim}/eviction", "-f", "-",
                  input=json.dumps(eviction))  # fmt: skip
    evicted = wait_until("the DisruptionTarget condition", lambda: (p := _pod(cp, namespace, victim)) and any(
        c["type"] == "DisruptionTarget" and c["status"] == "True" for c in p["status"].get("conditions", [])) and p)  # fmt: skip
    statuses = evicted["status"]["containerStatuses"]
    for status in statuses:
        status["state"] = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": status["state"].get(
            "running", {}).get("startedAt"), "finishedAt": evicted["metadata"]["deletionTimestamp"]}}  # fmt: skip
        status["ready"] = False
    patch = {"status": {"phase": "Failed", "containerStatuses": statuses}}
    cp.kubectl_ok(
        "patch",
        "pod",
        victim,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(patch),
    )
    _replacement(cp, namespace, request.name, 1, pods[1]["metadata"]["uid"])
    time.sleep(2)
    assert not _job(cp, namespace, request.name)["status"].get("failed")


def _pod(cp, namespace: str, name: str) -> dict | None:
    proc = cp.kubectl("get", "pod", name, "-n", namespace, "-o", "json")
    return json.loads(proc.stdout) if proc.returncode == 0 else None
