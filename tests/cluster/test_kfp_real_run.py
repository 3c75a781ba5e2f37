"""A KFP run that really runs: the real KFP 2.17.0 backend, Argo v4.0.5 and real pods (issue 24, 3.3).

`cifar10-kfp submit` uploads the committed `cifar10-training` pipeline to the real KFP API server.
The real Argo controller runs the Workflow that the API server made, and every step's pods (Argo's
init and wait containers, KFP's driver, the launcher and our component image) run on the real node
(kubelet, containerd, runc). The driver and launcher record into ML Metadata (the upstream C++ store,
mlmd.py) and the steps write to the embedded object store, which the pods reach as
`seaweedfs.kubeflow:9000`, as the compiled pipeline says (kfppods.py tells how).

The run is the issue's tiny configuration: 1,000 training images, 1 epoch, num_gpus=0.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import time
import types

import pytest

from cifar10_kfp.runs import read_summary
from cifar10_kfp_components.image import image as component_image
from cifar10_kfp_pipelines.policy import IMAGE_UID
from localcluster import kfp as kfp_harness
from localcluster.prerequisites import missing_for_real_node
from tests.cluster.kfp_stack import DATASET, DATASET_URI
from tests.support import notebook
from tests.support.cli import command, user_env
from tests.support.paths import ROOT

TINY = (
    "max_train_samples=1000",
    "max_test_samples=500",
    "epochs=1",
    "num_gpus=0",
    f"dataset_uri={DATASET_URI}",
)
# The train step asks for 4 CPUs and 16Gi by default; this node has 2 cores (a user's small CPU pool too).
SMALL_NODE = ("--train-cpu", "1", "--train-memory", "3Gi:6Gi")
_RUN_ID = re.compile(r"run ([0-9a-f-]{36}) submitted")
_RUN_TIMEOUT_S = 1500
SCHEDULE = "tiny-every-30s"

pytestmark = [
    pytest.mark.skipif(missing_for_real_node() is not None, reason=str(missing_for_real_node())),
    pytest.mark.skipif(not DATASET.is_file(), reason="the CIFAR-10 archive of ../shared is missing"),
]


@pytest.fixture(scope="module")
def kfp_on_node(kfp_stack):
    """The KFP backend whose runs' pods run on a real node; yields (backend, store, node).

    The stack is the session's (conftest.py `kfp_stack`, tests/cluster/kfp_stack.py), which
    test_kfp_ui.py shares: one node start and image import for both modules."""
    yield kfp_stack.backend, kfp_stack.store, kfp_stack.node


@pytest.fixture(scope="module")
def runs_in_flight(kfp_on_node, tmp_path_factory):
    """The module's three real runs, started together so their waits overlap (issue 34: pay once).

    A CLI run, a recurring run's schedule and the notebook's cluster path (in a thread: nbclient's
    kernel gets its own environment) all start here; each scenario then waits for its own. On 2
    cores the runs share the node: most of a run's wall time is hand-overs (pod start, drivers,
    Argo), which overlap, and the steps' CPU requests let the scheduler queue what does not fit.
    """
    backend, store, _ = kfp_on_node
    work = tmp_path_factory.mktemp("real-runs")
    done = _submit(backend, store, "submit", "--pipeline", "training")
    inflight = types.SimpleNamespace(run_id=_RUN_ID.search(done.stdout).group(1), started=time.monotonic())
    # Every 30 s, one run at a time: later firings wait while the first run is going.
    _submit(backend, store, "schedule", "--name", SCHEDULE, "--cron", "*/30 * * * * *", "--no-catchup",
            "--max-concurrency", "1")  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        inflight.notebook = pool.submit(
            notebook.execute, _notebook_values(work / "nb-out"), work / "executed.ipynb",
            cell_timeout_s=_RUN_TIMEOUT_S + 200, env=_notebook_env(backend, store),
        )  # fmt: skip
        try:
            yield inflight
        finally:
            _cli(backend, store, "schedule", "--disable", SCHEDULE)  # the pool's exit waits for the notebook


def _submit(backend, store, *args: str) -> subprocess.CompletedProcess:
    """`cifar10-kfp submit|schedule ...` of the tiny run, sized for this node."""
    return _cli(backend, store, *args, *SMALL_NODE, *(p for kv in TINY for p in ("--param", kv)))


def _notebook_values(output_dir) -> dict:
    return {
        "DATASET_URI": DATASET_URI, "PRESET": "seed", "ARCHITECTURE": "simple_cnn", "EPOCHS": 1,
        "MAX_TRAIN_SAMPLES": 1000, "MAX_TEST_SAMPLES": 500, "RUNS": [{"lr": 0.01, "seed": 0}],
        "MIN_ACCURACY": 0.0, "MODEL_NAME": "nb-on-the-cluster", "N_EXAMPLES": 6, "NUM_GPUS": 0,
        "TRAIN_CPU": "1", "TRAIN_MEMORY": "3Gi:6Gi", "RUN_TIMEOUT_S": _RUN_TIMEOUT_S,
        "OUTPUT_DIR": str(output_dir),
    }  # fmt: skip


def _notebook_env(backend, store) -> dict:
    """The kernel's environment as a user's with KFP_HOST exported: no other store or KFP setting,
    no in-cluster marker; the store's keys as the user exports them (the notebook holds none)."""
    dropped = ("MINIO_", "CIFAR10_KFP_", "KFP_HOST", "KF_PIPELINES", "KUBERNETES_SERVICE_HOST", "MPLBACKEND")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    env.update(store.env(), KFP_HOST=backend.endpoint)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return env


def _cli(backend, store, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = user_env(KF_PIPELINES_ENDPOINT=backend.endpoint, **store.env())
    done = subprocess.run(command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"cifar10-kfp {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _run_row(backend, store, run_id: str) -> dict | None:
    rows = json.loads(_cli(backend, store, "runs", "--json", "--limit", "50").stdout)
    return next((row for row in rows if row["run_id"] == run_id), None)


def _pod_logs(cp, pod: str) -> list[str]:
    lines = []
    for container in ("main", "wait", "init"):
        logs = cp.kubectl("logs", "-n", kfp_harness.NAMESPACE, pod, "-c", container, "--tail=12")
        if logs.stdout.strip():
            lines.append(f"    [{container}] " + logs.stdout.strip().replace("\n", "\n    "))
    return lines


def _failed_pods(cp, workflow: str) -> list[str]:
    """The workflow's pods that ended Failed, with their last log lines (Argo names pods, not node IDs)."""
    got = cp.kubectl(
        "get", "pods", "-n", kfp_harness.NAMESPACE, "-l", f"workflows.argoproj.io/workflow={workflow}", "-o", "json"
    )  # fmt: skip
    failed = [
        p for p in json.loads(got.stdout or "{}").get("items", []) if p["status"].get("phase") == "Failed"
    ]
    lines = []
    for pod in failed[:4]:  # the first few say why; a retried node repeats the same refusal
        lines.append(f"  pod {pod['metadata']['name']}: Failed")
        lines.extend(_pod_logs(cp, pod["metadata"]["name"]))
    return lines


def _controller_lines(backend, workflow: str) -> list[str]:
    """The Argo controller's warnings and errors about the workflow: why a node was marked Error."""
    log = backend.dir / "logs" / "workflow-controller.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    hits = [ln for ln in text.splitlines() if workflow in ln and re.search(r"level=(warn|error)|Error", ln)]
    return [f"  [workflow-controller] {ln[:400]}" for ln in hits[-15:]]


def _diagnose(cp, backend, run_id: str) -> str:
    """The Workflow's unfinished nodes, its failed pods' last log lines and the controller's errors."""
    listing = cp.kubectl(
        "get", "workflows", "-n", kfp_harness.NAMESPACE, "-l", f"pipeline/runid={run_id}", "-o", "json"
    )
    lines = []
    for wf in json.loads(listing.stdout or "{}").get("items", []):
        name, status = wf["metadata"]["name"], wf.get("status", {})
        lines.append(f"workflow {name}: {status.get('phase')} {status.get('message', '')}")
        for node in status.get("nodes", {}).values():
            if node.get("phase") not in ("Succeeded", "Skipped", "Omitted"):
                lines.append(
                    f"  {node.get('type')} {node.get('displayName')}: {node.get('phase')} {node.get('message', '')}"
                )
        lines += _failed_pods(cp, name) + _controller_lines(backend, name)
    return "\n".join(lines)


def _wait_for_run(cp, backend, store, run_id: str, timeout_s: float = _RUN_TIMEOUT_S) -> dict:
    deadline = time.monotonic() + timeout_s
    row = None
    while time.monotonic() < deadline:
        row = _run_row(backend, store, run_id)
        if row and row["state"] in ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"):
            break
        time.sleep(10)
    assert row is not None and row["state"] == "SUCCEEDED", (
        f"run {run_id}: {row}\n{_diagnose(cp, backend, run_id)}"
    )
    return row


def _record_timeline(cp, run_id: str, wall_s: float, what: str) -> None:
    from localcluster import timeline
    from tests.cluster import conftest

    rows = timeline.run_timeline(cp, kfp_harness.NAMESPACE, run_id)
    print(f"\n{what} {run_id}:\n{timeline.table(rows)}")
    for part, seconds in timeline.summary(rows, wall_s).items():
        conftest._TIMINGS[f"{what}: {part}"] = seconds


@pytest.mark.timeout(3000)  # a cold machine builds and imports the component image first
def test_a_training_run_succeeds_on_real_pods(control_plane, kfp_on_node, runs_in_flight):
    backend, store, node = kfp_on_node
    run_id = runs_in_flight.run_id
    row = _wait_for_run(control_plane, backend, store, run_id)
    _record_timeline(control_plane, run_id, time.monotonic() - runs_in_flight.started, "training run")

    # Every pod of the run ran on the real node, and each step's container really exited 0.
    pods = json.loads(
        control_plane.kubectl_ok(
            "get", "pods", "-n", kfp_harness.NAMESPACE, "-l", f"pipeline/runid={run_id}", "-o", "json"
        ).stdout
    )["items"]
    assert pods and {p["spec"]["nodeName"] for p in pods} == {node.name}
    # ... in a namespace that enforces `restricted`, which admits them because each of our steps runs
    # as the image's non-root user (pipelines/policy.py), applied by the real 2.17 driver.
    labels = json.loads(
        control_plane.kubectl_ok("get", "namespace", kfp_harness.NAMESPACE, "-o", "json").stdout
    )
    assert labels["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    ours = [c for p in pods for c in p["spec"]["containers"] if c["image"] == component_image()]
    assert ours and all(
        (c["securityContext"].get("runAsUser"), c["securityContext"].get("runAsNonRoot")) == (IMAGE_UID, True)
        for c in ours
    ), [c.get("securityContext") for c in ours]
    # `cifar10-kfp runs` shows the run with its metrics, read from the summary the run wrote.
    summary = read_summary(store.store(), run_id)
    assert summary is not None and summary["status"] == "SUCCEEDED", summary
    assert row["test_accuracy"] == summary["metrics"]["test_accuracy"]
    assert 0.0 <= row["test_accuracy"] <= 1.0


@pytest.mark.timeout(1800)
def test_the_notebooks_cluster_path_submits_a_run_that_succeeds(kfp_on_node, runs_in_flight):
    """notebooks/experiments.ipynb with KFP_HOST set: it submits through kfp.Client, waits, and reads
    the run's results back from the store (issue 24, 3.3)."""
    backend, store, _ = kfp_on_node
    _, result = runs_in_flight.notebook.result(timeout=_RUN_TIMEOUT_S + 300)

    assert result["mode"] == "cluster"
    assert result["statuses"] == ["SUCCEEDED"], result["errors"]
    run_id = result["runs"]["run_id"][0]
    row = _run_row(backend, store, run_id)  # a real KFP run, and KFP says it succeeded
    assert row is not None and row["state"] == "SUCCEEDED", row
    assert result["runs"]["test_accuracy"][0] == row["test_accuracy"]
    assert result["shown"].startswith("published model 'nb-on-the-cluster'"), "MIN_ACCURACY=0 must publish"
    assert result["per_class_shape"] == [10, 1] and result["n_predicted"] == 6


def _fired_run_ids(cp) -> list[str]:
    got = cp.kubectl(
        "get", "workflows", "-n", kfp_harness.NAMESPACE,
        "-l", "scheduledworkflows.kubeflow.org/isOwnedByScheduledWorkflow=true", "-o", "json",
    )  # fmt: skip
    items = json.loads(got.stdout or "{}").get("items", [])
    return [
        item["metadata"]["labels"]["pipeline/runid"]
        for item in items
        if "pipeline/runid" in item["metadata"]["labels"]
    ]


@pytest.mark.timeout(2400)
def test_a_recurring_run_fires_on_schedule_and_its_run_succeeds(control_plane, kfp_on_node, runs_in_flight):
    backend, store, _ = kfp_on_node
    fired: list[str] = []
    control_plane.wait_for(
        "the first firing of the recurring run",
        lambda: bool(fired.extend(_fired_run_ids(control_plane)) or fired),
        timeout_s=120,
    )
    _cli(backend, store, "schedule", "--disable", SCHEDULE)  # one firing shows it; more would load the node
    row = _wait_for_run(control_plane, backend, store, fired[0])
    assert row["test_accuracy"] is not None
