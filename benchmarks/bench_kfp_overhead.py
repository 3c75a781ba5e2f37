"""The pipeline on the real KFP backend: one tiny training run through kfp.local and through KFP 2.17.0.

Measured in one run, on one machine, with the same parameters (TINY) and the real CIFAR-10 archive:

- **kfp.local**: ``cifar10-kfp run-local`` on its embedded object store;
- **real KFP, Argo's polling, no cluster DNS**: ``cifar10-kfp submit`` to the real KFP 2.17.0 API
  server, Argo v4.0.5 and the real node (localcluster), as the harness ran before issue 34: the wait
  container checks the main container every 5 s, the controller requeues a Workflow every 10 s, and the
  pods have no cluster DNS (gRPC's TXT lookups wait on a resolver the pods cannot reach);
- **real KFP, the harness's settings**: CoreDNS for the node's pods and 1 s polling (localcluster/kfp.py
  FAST_POLLING);
- **cached re-run**: the same submission again on that backend: download and preprocess come from
  KFP's cache, train, evaluate and the rest run again.

Each real run is split from the pods' own timestamps (localcluster/timeline.py): pod start, the
driver pods, the launcher inside each step's pod, and our code. Ratios only: a shared 2-core machine.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.bench_pipeline import run_local_command
from benchmarks.common import ROOT, BenchContext, Skip, row, scratch_dir, section

TINY = {"max_train_samples": 600, "max_test_samples": 200, "epochs": 1, "num_gpus": 0, "min_accuracy": 0.0}
# The train step asks for 4 CPUs and 16Gi by default; this node has 2 cores.
SMALL_NODE = ("--train-cpu", "1", "--train-memory", "3Gi:6Gi")
_RUN_ID = re.compile(r"run ([0-9a-f-]{36}) submitted")
_RUN_TIMEOUT_S = 1500
# run-local's line for each finished task: "[train-model] done in 19.5 s" (pipelines/commands/run_local.py)
_TASK_DONE = re.compile(r"^\[([a-z0-9-]+)\] done in ([0-9.]+) s", re.M)


def local_task_seconds(log_text: str) -> dict[str, float]:
    """Seconds of each task of a `cifar10-kfp run-local`, from the lines it prints as each task ends."""
    return {name: float(seconds) for name, seconds in _TASK_DONE.findall(log_text)}


def _cli_env(backend, store) -> dict[str, str]:
    import os

    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MINIO_", "CIFAR10_KFP_", "KF_PIPELINES_"))
    }
    env.update(PYTHONPATH=str(ROOT), KF_PIPELINES_ENDPOINT=backend.endpoint, **store.env())
    return env


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("cifar10-kfp")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "cifar10_kfp_pipelines.cli"]


def _submit_and_wait(cp, backend, store, dataset_uri: str) -> dict:
    """Submit the training pipeline, wait for KFP's final state; wall time from submission to it."""
    import kfp

    from localcluster import timeline
    from localcluster.kfp import NAMESPACE

    params = [
        p
        for key, value in {**TINY, "dataset_uri": dataset_uri}.items()
        for p in ("--param", f"{key}={value}")
    ]
    started = time.monotonic()
    done = subprocess.run(
        [*_cli(), "submit", "--pipeline", "training", *SMALL_NODE, *params],
        cwd=ROOT, env=_cli_env(backend, store), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    found = _RUN_ID.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"cifar10-kfp submit failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    run_id = found.group(1)
    client = kfp.Client(host=backend.endpoint)
    state = "?"
    while time.monotonic() - started < _RUN_TIMEOUT_S:
        state = str(client.get_run(run_id).state)
        if state in ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"):
            break
        time.sleep(2)
    wall_s = time.monotonic() - started
    if state != "SUCCEEDED":
        raise RuntimeError(f"run {run_id} ended {state} after {wall_s:.0f} s")
    rows = timeline.run_timeline(cp, NAMESPACE, run_id)
    return {"run_id": run_id, **timeline.summary(rows, wall_s), "table": timeline.table(rows)}


def _real_backend_runs(cp, store, work: Path, dataset_uri: str, *, tuned: bool, runs: int) -> list[dict]:
    """`runs` submissions, one after another, to a fresh real node and KFP backend."""
    from localcluster.clusterdns import ClusterDns
    from localcluster.kfp import NAMESPACE, KfpBackend
    from localcluster.kfppods import KfpPods
    from localcluster.node import RealNode

    # Workflows of the backend before must not be picked up again by this one's Argo controller.
    for kind in ("scheduledworkflows", "workflows"):
        cp.kubectl("delete", kind, "--all", "-n", NAMESPACE, "--wait=true", timeout=120)
    with contextlib.ExitStack() as stack:
        dns = stack.enter_context(ClusterDns(cp)) if tuned else None
        node = stack.enter_context(RealNode(cp, cluster_dns=dns.ip if dns else None))
        pods = stack.enter_context(KfpPods(cp, node, store, work / ("pods-tuned" if tuned else "pods-plain")))
        backend = stack.enter_context(
            KfpBackend(cp, store, pod_defaults=pods.pod_defaults(), fast_polling=tuned)
        )
        pods.connect(backend)
        return [_submit_and_wait(cp, backend, store, dataset_uri) for _ in range(runs)]


def _kfp_local(archive: Path, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    summary, log = work / "summary.json", work / "local.log"
    command = run_local_command({**TINY, "dataset_uri": str(archive)}, summary, work / "outputs")
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.run(command, cwd=work, stdout=out, stderr=subprocess.STDOUT, timeout=1200)
    wall_s = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError("run-local failed:\n" + "\n".join(log.read_text().splitlines()[-15:]))
    tasks = local_task_seconds(log.read_text(errors="replace"))
    return {"wall": wall_s, "in tasks": sum(tasks.values()), "tasks": tasks}


def measure(ctx: BenchContext) -> dict:
    from cifar10_kfp.storage.embedded import EmbeddedObjectStore
    from localcluster.controlplane import ControlPlane
    from localcluster.kfp import BUCKET
    from localcluster.prerequisites import missing_for_real_node

    missing = missing_for_real_node()
    if missing:
        raise Skip(f"needs the real node: {missing}")
    archive = ctx.require_archive()
    with scratch_dir(ctx, "kfp-overhead") as tmp:
        work = Path(tmp)
        local = _kfp_local(archive, work / "local")
        dataset_uri = f"s3://{BUCKET}/datasets/{archive.name}"
        with ControlPlane() as cp, EmbeddedObjectStore(work / "s3", bucket=BUCKET) as store:
            store.store().put_file(archive, dataset_uri)
            plain = _real_backend_runs(cp, store, work, dataset_uri, tuned=False, runs=1)[0]
            tuned, cached = _real_backend_runs(cp, store, work, dataset_uri, tuned=True, runs=2)
    return {
        "kfp.local": local,
        "real, Argo defaults": plain,
        "real, harness settings": tuned,
        "cached re-run": cached,
    }


def run(ctx: BenchContext) -> dict:
    if ctx.size == "smoke":
        raise Skip("the real backend has no smoke size: run --quick or the full size")
    got = measure(ctx)
    local, plain, tuned, cached = (
        got[k] for k in ("kfp.local", "real, Argo defaults", "real, harness settings", "cached re-run")
    )
    rows = [
        row("real KFP run wall time, harness settings vs Argo's defaults", tuned["wall"], plain["wall"], unit="s",
            target="lower", met=tuned["wall"] < plain["wall"]),
        row("real KFP run wall time vs kfp.local", tuned["wall"], local["wall"], unit="s"),
        row("time in our steps, real KFP vs kfp.local", tuned["in our steps"], local["in tasks"], unit="s"),
        row("cached re-run vs first run (real KFP)", cached["wall"], tuned["wall"], unit="s",
            target="lower", met=cached["wall"] < tuned["wall"]),
    ]  # fmt: skip
    steps = tuned["steps"] or 1
    notes = [
        f"Parameters: {json.dumps(TINY)}, the real CIFAR-10 archive; the train pod gets {' '.join(SMALL_NODE)}.",
        "Split of each real run (s; from the pods' timestamps, localcluster/timeline.py): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items() if isinstance(v, float))
            for name, r in (("Argo defaults", plain), ("harness settings", tuned), ("cached", cached))
        ),
        f"Per step with the harness's settings ({steps} steps): "
        f"{(tuned['wall'] - tuned['in our steps']) / steps:.1f} s of wall time outside our code, "
        f"Argo's defaults {(plain['wall'] - plain['in our steps']) / max(plain['steps'], 1):.1f} s.",
        "kfp.local per task (s): " + ", ".join(f"{k} {v:.1f}" for k, v in local["tasks"].items()),
    ]
    details = {k: {kk: vv for kk, vv in v.items() if kk != "table"} for k, v in got.items()}
    details["tables"] = {k: v["table"] for k, v in got.items() if "table" in v}
    return section("KFP overhead", rows, details=details, notes=notes)
