"""Where the time of a real KFP run goes, read from what the real servers recorded.

For every pod of the run's Workflow (Argo's driver pods and each step's executor pod) the pod's
own timestamps say when it was created, scheduled, when its containers started and ended; the
executor's `main` container log, read with the kubelet's per-line timestamps, says when the
launcher handed over to our Python code (its first line) and when it started uploading the
outputs (`Executing uploadOutputArtifacts`, backend/src/v2/component/launcher_v2.go). So each
step splits into:

- pod start: created -> the first container running (scheduling, sandbox, Argo's init container);
- driver: the step's driver pod (`system-container-driver`), which resolves inputs and caching;
- launcher: the main container's start -> our code's first line, plus its last stretch after
  the upload began (artifact upload, ML Metadata record);
- in the step: our code's first line -> the upload's start (the Python process: imports included).

Timestamps of the pod status have one-second resolution; log timestamps are exact.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

_UPLOAD_MARK = "Executing uploadOutputArtifacts"


def _ts(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    text = text.rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc)


def _seconds(start: dt.datetime | None, end: dt.datetime | None) -> float:
    return 0.0 if start is None or end is None else max(0.0, (end - start).total_seconds())


@dataclasses.dataclass
class PodTimes:
    """One pod of the run, with the split of its time."""

    node: str  # the Workflow node's display name
    kind: str  # "driver", "executor" or "other"
    created: dt.datetime
    pod_start_s: float
    total_s: float
    launcher_s: float = 0.0
    in_step_s: float = 0.0


def _container_times(status: dict, name: str) -> tuple[dt.datetime | None, dt.datetime | None]:
    for group in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(group) or []:
            if container["name"] == name:
                state = container.get("state", {}).get("terminated") or container.get("lastState", {}).get(
                    "terminated"
                )
                if state:
                    return _ts(state.get("startedAt")), _ts(state.get("finishedAt"))
    return None, None


def _log_marks(log: str) -> tuple[dt.datetime | None, dt.datetime | None, dt.datetime | None]:
    """(first line, the first line of our code, the upload's start) of a main container log."""
    lines = [line.split(" ", 1) for line in log.splitlines() if " " in line]
    if not lines:
        return None, None, None
    first = _ts(lines[0][0])
    # The launcher logs in glog's format ("I1207 ..."); the first line in another form is ours.
    ours = next((_ts(t) for t, text in lines if text[:1] not in "IWEF" or not text[1:5].isdigit()), None)
    upload = next((_ts(t) for t, text in lines if _UPLOAD_MARK in text), None)
    return first, ours, upload


def pod_times(pod: dict, main_log: str) -> PodTimes:
    meta, status = pod["metadata"], pod.get("status", {})
    annotations = meta.get("annotations", {})
    node = annotations.get("workflows.argoproj.io/node-name", meta["name"]).rsplit(".", 1)[-1]
    template = meta.get("labels", {}).get("workflows.argoproj.io/template", "") or meta["name"]
    kind = "driver" if "driver" in template else "executor" if "impl" in template else "other"
    created = _ts(meta["creationTimestamp"])
    init_start, _ = _container_times(status, "init")
    main_start, main_end = _container_times(status, "main")
    times = PodTimes(
        node=node,
        kind=kind,
        created=created,
        pod_start_s=_seconds(created, init_start or main_start),
        total_s=_seconds(created, main_end),
    )
    if kind == "executor":
        first, ours, upload = _log_marks(main_log)
        start = first or main_start
        times.launcher_s = _seconds(start, ours or upload) + _seconds(upload, main_end)
        times.in_step_s = _seconds(ours, upload)
    return times


def run_timeline(cp, namespace: str, run_id: str) -> list[PodTimes]:
    """Every pod of the run, oldest first, with its main container's timestamped log read."""
    listing = cp.kubectl_ok(
        "get", "pods", "-n", namespace, "-l", f"pipeline/runid={run_id}", "-o", "json"
    ).stdout
    rows = []
    for pod in json.loads(listing)["items"]:
        log = cp.kubectl("logs", "-n", namespace, pod["metadata"]["name"], "-c", "main", "--timestamps")
        rows.append(pod_times(pod, log.stdout if log.returncode == 0 else ""))
    return sorted(rows, key=lambda r: r.created)


def summary(rows: list[PodTimes], wall_s: float) -> dict[str, float]:
    """The run's wall time split into the parts that docs/cluster.md tabulates (seconds)."""
    executors = [r for r in rows if r.kind == "executor"]
    return {
        "wall": wall_s,
        "pods": len(rows),
        "steps": len(executors),
        "pod start (all pods)": sum(r.pod_start_s for r in rows),
        "drivers (whole pods)": sum(r.total_s for r in rows if r.kind == "driver"),
        "launcher (executor pods)": sum(r.launcher_s for r in executors),
        "in our steps": sum(r.in_step_s for r in executors),
    }


def table(rows: list[PodTimes]) -> str:
    lines = [f"{'node':34} {'kind':9} {'start':>6} {'total':>7} {'launch':>7} {'in step':>8}"]
    for r in rows:
        lines.append(
            f"{r.node[:34]:34} {r.kind:9} {r.pod_start_s:6.1f} {r.total_s:7.1f} {r.launcher_s:7.1f} {r.in_step_s:8.1f}"
        )
    return "\n".join(lines)
