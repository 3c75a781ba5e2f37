"""Watching a TrainJob: its state changes as they happen, its progress (``.status.trainerStatus``), and the
Warning events of what it made."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from cifar10_kfp.trainjob.api import TrainJobFailed, TrainJobTimedOut, custom_objects
from cifar10_kfp.trainjob.manifest import GROUP, PLURAL, VERSION, JobState, job_state

if TYPE_CHECKING:  # annotations only
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)


class EventReporter:
    """Logs the new Warning events of a job and of everything named after it (JobSet, Jobs, pods)."""

    def __init__(self, api_client: ApiClient, namespace: str, name: str):
        self.api_client, self.namespace, self.name = api_client, namespace, name
        self.seen: dict[str, int] = {}  # event uid -> count already reported
        self.recent: list[str] = []

    def poll(self) -> list[str]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            events = client.CoreV1Api(self.api_client).list_namespaced_event(
                self.namespace, field_selector="type=Warning"
            )
        except ApiException as exc:
            log.warning("cannot list events in %s (HTTP %s): grant `list events` to see why a job waits",
                        self.namespace, exc.status)  # fmt: skip
            return []
        new = []
        for event in sorted(events.items or [], key=_event_time):
            obj = event.involved_object
            if not obj or not (obj.name == self.name or str(obj.name).startswith(f"{self.name}-")):
                continue
            uid, count = event.metadata.uid, event.count or 1
            if self.seen.get(uid) == count:
                continue
            self.seen[uid] = count
            line = f"{obj.kind} {obj.name}: {event.reason}: {event.message}"
            new.append(line)
            log.warning("TrainJob %s/%s event: %s", self.namespace, self.name, line)
        self.recent = (self.recent + new)[-5:]
        return new


def trainer_status_line(obj: dict) -> str:
    """``.status.trainerStatus`` as one line ('' without it): what rank 0 reports with Trainer's ``TrainJobStatus`` gate.

    Example: ``40% eta 95s epoch=4 train_loss=0.8123 val_acc=0.6123`` (docs/tracking.md).
    """
    status = (obj.get("status") or {}).get("trainerStatus") or {}
    parts = []
    if status.get("progressPercentage") is not None:
        parts.append(f"{status['progressPercentage']}%")
    if status.get("estimatedRemainingSeconds") is not None:
        parts.append(f"eta {status['estimatedRemainingSeconds']}s")
    parts += [f"{m.get('name')}={m.get('value')}" for m in status.get("metrics") or [] if isinstance(m, dict)]
    return " ".join(parts)


def _event_time(event) -> float:
    stamp = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
    return stamp.timestamp() if stamp else 0.0


def watch_trainjob(
    api_client: ApiClient,
    namespace: str,
    name: str,
    *,
    timeout_s: float = 0.0,
    watch_timeout_s: int = 60,
    events_every_s: float = 30.0,
    on_change: Callable[[JobState], None] | None = None,
    done: Callable[[], JobState | None] | None = None,
) -> JobState:
    """Stream the TrainJob's state changes until it finishes; raise ``TrainJobFailed`` if it fails or times out.

    Uses a watch (``?watch=true``) re-opened every ``min(watch_timeout_s, events_every_s)``
    seconds from a fresh GET, so no transition is missed across reconnects; between watches the
    new Warning events are reported. Past ``timeout_s`` (0 = none) it raises without deleting:
    ``run_trainjob`` decides what to do with the job. ``done``, asked once per watch window, may end
    the watch with a state of its own (the completion marker of a run whose Job never completes).
    """
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    api = custom_objects(api_client)
    deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
    events = EventReporter(api_client, namespace, name)
    next_events = time.monotonic() + events_every_s
    last: JobState | None = None
    last_progress = ""

    def seen(state: JobState, obj: dict | None = None) -> JobState:
        nonlocal last, last_progress
        if state != last:
            last = state
            log.info("TrainJob %s/%s: %s %s %s", namespace, name, state.phase, state.reason, state.message)
            if on_change:
                on_change(state)
        progress = trainer_status_line(obj or {})
        if progress and progress != last_progress:  # the KFP step's log shows the nodes' progress
            last_progress = progress
            log.info("TrainJob %s/%s progress: %s", namespace, name, progress)
        return state

    while True:
        try:
            obj = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                raise TrainJobFailed(
                    f"TrainJob {namespace}/{name} disappeared (deleted by someone else?)"
                ) from exc
            raise
        if seen(job_state(obj), obj).finished:
            break
        finished = done() if done else None
        if finished is not None:
            seen(finished)
            break
        now = time.monotonic()
        if now >= next_events:
            events.poll()
            next_events = now + events_every_s
        if deadline is not None and now > deadline:
            assert last is not None  # seen() has run above
            warnings = "; ".join(events.recent) or "no warning events"
            raise TrainJobTimedOut(
                f"did not finish within {timeout_s:g}s (last state: {last.phase}; {warnings})"
            )
        window = max(
            1, int(min(watch_timeout_s, events_every_s, (deadline - now) if deadline else watch_timeout_s))
        )
        if _watch_once(watch.Watch(), api, namespace, name, obj, window, seen):
            break
    assert last is not None  # the loop ends only after seen() ran
    if last.phase == "Failed":
        raise TrainJobFailed(
            f"TrainJob {namespace}/{name} failed: {last.reason or 'Failed'}: {last.message or 'no message'}"
        )
    return last


def _watch_once(stream, api, namespace: str, name: str, obj: dict, window: int, seen) -> bool:
    """Follow the job's events for ``window`` seconds; True once it finished."""
    try:
        for event in stream.stream(
            api.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
            field_selector=f"metadata.name={name}", resource_version=(obj.get("metadata") or {}).get("resourceVersion"),
            timeout_seconds=window,
        ):  # fmt: skip
            if event.get("type") == "DELETED":
                raise TrainJobFailed(f"TrainJob {namespace}/{name} was deleted while training")
            if event.get("type") == "ERROR":
                return False  # e.g. 410 Gone: re-GET and re-watch
            if seen(job_state(event["object"]), event["object"]).finished:
                return True
    finally:
        stream.stop()
    return False
