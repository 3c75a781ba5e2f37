"""The kwok Stages the harness runs: kwok's own stage files, read from the kwok Go module.

kwok plays the kubelet of every node: the Stage resources decide how node and pod status move.
The set mirrors what kwokctl installs by default (sigs.k8s.io/kwok pkg/kwokctl/runtime/cluster.go,
getDefaultNodeStages/getDefaultPodStages: node-initialize, node-heartbeat-with-lease, and pod stages),
taken from kustomize/stage/ in the module:

- node/fast/node-initialize.yaml, node/heartbeat-with-lease/node-heartbeat-with-lease.yaml;
- pod/general/{pod-create, pod-init-container-running, pod-init-container-completed, pod-ready,
  pod-delete}.yaml: a scheduled pod goes Pending -> Running/Ready and is removed when deleted;
- pod/chaos/pod-container-running-failed.yaml: a Running pod labelled
  `pod-container-running-failed.stage.kwok.x-k8s.io=true` fails; its annotations
  `pod-container-running-failed.stage.kwok.x-k8s.io/{exit-code,reason,message,container-name}`
  choose the terminated state (ControlPlane.fail_pod sets them);
- pod-delete removes a deleted pod 1 s after its deletion, not at a random moment of its grace period
  (upstream's `jitterDurationFrom: .metadata.deletionTimestamp`: up to 30 s per pod), as a real kubelet
  does once the containers exit on SIGTERM, which ours do. A test that needs a pod to linger while
  deleted sets the stage's own annotation `pod-delete.stage.kwok.x-k8s.io/delay` (a duration) on it
  first. Each TrainJob scenario's clean-up waited out those grace periods (15-28 s each, issue 34);
- pod/general/pod-complete.yaml, keyed on a label instead of "owned by a Job": a Running pod
  labelled `SUCCEED_LABEL=succeeded` succeeds (ControlPlane.succeed_pod). Upstream completes
  every Job pod 1-6 s after it is Ready; the harness makes that a test's decision instead, so a
  test can hold a pod Running, fail it, or let it succeed. `auto_complete=True` adds the
  upstream pod-complete stage as it is.

A real kubelet restarts a failed container in place when restartPolicy is OnFailure/Always; kwok's
failed stage sets the pod's phase to Failed whatever the policy (a limit of the kwok model).
"""

from __future__ import annotations

import copy
import pathlib

import yaml

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # kwok manages nodes with this annotation = "fake"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SUCCEED_LABEL = "cluster.cifar10-kfp.test/outcome"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
FAIL_ANNOTATION_PREFIX = "pod-container-running-failed.stage.kwok.x-k8s.io/"

_NODE_STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml")
_POD_STAGES = (
    "pod/general/pod-create.yaml",
    "pod/general/pod-init-container-running.yaml",
    "pod/general/pod-init-container-completed.yaml",
    "pod/general/pod-ready.yaml",
    "pod/general/pod-delete.yaml",
    "pod/chaos/pod-container-running-failed.yaml",
)


def _load(stage_root: pathlib.Path, rel: str) -> dict:
    path = stage_root / rel
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("kind") != "Stage":
        raise ValueError(f"{path} is not a kwok Stage")
    return doc


def _succeed_on_label(pod_complete: dict) -> dict:
    stage = copy.deepcopy(pod_complete)
    stage["metadata"]["name"] = "cifar10-kfp-pod-succeed-on-label"
    exprs = [e for e in stage["spec"]["selector"]["matchExpressions"] if "ownerReferences" not in e["key"]]
    if len(exprs) != len(stage["spec"]["selector"]["matchExpressions"]) - 1:
        raise ValueError("kwok's pod-complete stage no longer selects on the Job ownerReference; re-read it")
    exprs.append({"key": f'.metadata.labels["{SUCCEED_LABEL}"]', "operator": "In", "values": ["succeeded"]})
    stage["spec"]["selector"]["matchExpressions"] = exprs
    # kwok picks among matching stages at random by weight: this one wins over the slow
    # pod-complete when both match (auto_complete=True), as the chaos stage does with its 10000.
    stage["spec"]["weight"] = 10000
    stage["spec"].pop("weightFrom", None)
    stage["spec"]["delay"] = {"durationMilliseconds": 200}
    return stage


#: The annotation whose duration holds a deleted pod before kwok removes it (pod-delete's durationFrom).
DELETE_DELAY_ANNOTATION = "pod-delete.stage.kwok.x-k8s.io/delay"


def _prompt_delete(stage: dict) -> dict:
    """pod-delete without the jitter up to the grace period's end (the module docstring says why)."""
    delay = stage["spec"]["delay"]
    if (
        delay.get("durationFrom", {}).get("expressionFrom")
        != f'.metadata.annotations["{DELETE_DELAY_ANNOTATION}"]'
    ):
        raise ValueError("kwok's pod-delete stage no longer reads its delay annotation; re-read it")
    delay.pop("jitterDurationFrom", None)
    return stage


def stages(kwok_module_dir: pathlib.Path, auto_complete: bool = False) -> list[dict]:
    root = kwok_module_dir / "kustomize" / "stage"
    docs = [_load(root, rel) for rel in _NODE_STAGES + _POD_STAGES]
    docs = [_prompt_delete(d) if d["metadata"]["name"] == "pod-delete" else d for d in docs]
    pod_complete = _load(root, "pod/general/pod-complete.yaml")
    docs.append(_succeed_on_label(pod_complete))
    if auto_complete:
        docs.append(pod_complete)
    return docs


def write_config(
    path: pathlib.Path, kwok_module_dir: pathlib.Path, auto_complete: bool = False
) -> pathlib.Path:
    path.write_text(yaml.safe_dump_all(stages(kwok_module_dir, auto_complete), sort_keys=False))
    return path


def node_manifest(name: str, gpus: int) -> dict:
    """A Node for kwok to manage; with gpus, nvidia.com/gpu capacity and the usual GPU taint."""
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "200Gi"}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    spec: dict = {}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
        labels["nvidia.com/gpu.present"] = "true"
        spec["taints"] = [GPU_TAINT]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
        "spec": spec,
        # kwok's node-initialize stage keeps a node's own capacity and allocatable.
        "status": {"capacity": capacity, "allocatable": capacity},
    }
