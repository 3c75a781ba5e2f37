"""Parts 1 and 2: kill -9 the training process at five points; re-running the same command ends exact.

The points are drawn with a seeded RNG (``RELIABILITY_SEED``, default 7) from three kinds, each
kind at least once, so a run is reproducible:

* ``mid-epoch``: once the process has done a random 15-40% of an epoch's work after the epoch
  began (the previous checkpoint pointer was written, or the resumed checkpoint was fetched). Work
  is process CPU time, measured against the uninterrupted run's per-epoch CPU time: unlike wall
  time, it does not stretch when other work shares the machine;
* ``mid-checkpoint-upload``: when half of the checkpoint object's body has gone through the
  proxy, which slows checkpoint uploads to about a second so the window is wide;
* ``after-checkpoint``: as soon as the store holds the new ``latest.json`` pointer.

After each kill, the same command is run again, as a KFP retry would. The final weights and the
per-epoch losses and accuracies must equal the uninterrupted run's bit for bit. After a kill in
the middle of an upload, ``latest.json`` must still name the previous complete checkpoint, and
that checkpoint must verify and load.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

from cifar10_kfp.train.checkpoint import CheckpointManager, checkpoint_name
from tests.reliability.harness import FIGURES, Proc, S3Proxy, pointer_body_epoch, scan_for_secret, wait_until
from tests.reliability.training import EPOCHS, RunResult, assert_bitwise_equal, train_argv

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

KINDS = ("mid-epoch", "mid-checkpoint-upload", "after-checkpoint")
SEED = int(os.environ.get("RELIABILITY_SEED", "7"))
UPLOAD_WINDOW_S = 0.6  # how long the proxy stretches one checkpoint upload


def choose_kill_points(seed: int, epochs: int, count: int = 5) -> list[tuple[int, str]]:
    """``count`` distinct (epoch, kind) points, every kind at least once, in the order a run meets them.

    Epoch 1 is left out: a kill inside it has no earlier checkpoint to fall back on, which the
    mid-upload property needs, and its start is hidden behind interpreter start-up.
    """
    rng = random.Random(seed)
    candidates = [(epoch, kind) for epoch in range(2, epochs + 1) for kind in KINDS]
    chosen = [rng.choice([c for c in candidates if c[1] == kind]) for kind in KINDS]
    chosen += rng.sample([c for c in candidates if c not in chosen], count - len(chosen))
    return sorted(chosen, key=lambda c: (c[0], KINDS.index(c[1])))


def test_kill_points_are_distinct_cover_every_kind_and_are_reproducible():
    points = choose_kill_points(SEED, EPOCHS)
    assert len(set(points)) == 5 and {kind for _, kind in points} == set(KINDS)
    assert points == choose_kill_points(SEED, EPOCHS)


def _cpu_s(proc: Proc) -> float:
    """CPU seconds (user + system, all threads) the training process has used so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{proc.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class KillAt:
    """Arms the proxy to SIGKILL ``proc`` at one point; remembers what it saw."""

    def __init__(
        self, point, proc: Proc, proxy: S3Proxy, manager: CheckpointManager, epoch_cpu_s: float, rng
    ):
        self.epoch, self.kind = point
        self.proc, self.proxy, self.manager = proc, proxy, manager
        self.work_s = rng.uniform(0.15, 0.4) * epoch_cpu_s  # CPU seconds into the epoch
        self.fired = threading.Event()
        self.boundary: float | None = None
        self.sent_fraction: float | None = None
        proxy.on_progress(self._observe)

    def _kill(self) -> None:
        if not self.fired.is_set():
            self.fired.set()
            self.proc.kill9()

    def _observe(self, event) -> None:
        if self.fired.is_set():
            return
        ckpt, previous = checkpoint_name(self.epoch), checkpoint_name(self.epoch - 1)
        pointer_done = event.method == "PUT" and event.path.endswith("/latest.json") and event.finished
        if self.kind == "mid-checkpoint-upload":
            if event.method == "PUT" and event.path.endswith(ckpt) and event.finished is None:
                if event.sent * 2 >= event.length:
                    self.sent_fraction = event.sent / event.length
                    self._kill()  # from the proxy thread, before the rest of the body is relayed
        elif self.kind == "after-checkpoint":
            if pointer_done and pointer_body_epoch(event) == self.epoch:
                threading.Thread(target=self._kill_once_pointer_is_stored, daemon=True).start()
        elif self.boundary is None:  # mid-epoch: the epoch starts after the previous pointer or resume
            started = (pointer_done and pointer_body_epoch(event) == self.epoch - 1) or (
                event.method == "GET" and event.path.endswith(previous)
            )
            if started:
                self.boundary = time.monotonic()
                threading.Thread(target=self._kill_after_work, args=(_cpu_s(self.proc),), daemon=True).start()

    def _kill_after_work(self, cpu_at_boundary: float) -> None:
        while not self.fired.is_set() and self.proc.alive:
            if _cpu_s(self.proc) - cpu_at_boundary >= self.work_s:
                self._kill()
                return
            time.sleep(0.005)

    def _kill_once_pointer_is_stored(self) -> None:
        wait_until(
            lambda: (self.manager.read_pointer() or {}).get("epoch") == self.epoch, 10, what="the pointer"
        )
        self._kill()


def test_kill9_at_five_points_then_rerun_is_bitwise_identical(
    rel_server, rel_env, train_data, reference_run, rel_creds, tmp_path
):
    points = choose_kill_points(SEED, EPOCHS)
    FIGURES.kill_seed = SEED
    rng = random.Random(SEED + 1)
    proxy = S3Proxy(rel_server.ports["s3"])
    # Only checkpoint bodies are slowed, to about UPLOAD_WINDOW_S each: the mid-upload window.
    proxy.throttle(r"ckpt-epoch\d+\.pt$", reference_run.checkpoint_bytes / UPLOAD_WINDOW_S)
    env = {**rel_env, "MINIO_ENDPOINT": proxy.endpoint}
    checkpoint_uri = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}checkpoints/kill-chain"
    manager = CheckpointManager(checkpoint_uri, store=rel_server.store(CIFAR10_KFP_RETRY_BUDGET_S=5))
    argv = train_argv(train_data, checkpoint_uri, tmp_path / "out")
    records = []
    expected_resume = 0
    try:
        for attempt, point in enumerate(points, start=1):
            epoch, kind = point
            proc = Proc(argv, env=env, log_path=tmp_path / f"attempt{attempt}.log")
            killer = KillAt(point, proc, proxy, manager, reference_run.epoch_cpu_s, rng)
            code = proc.wait(180)
            output = proc.output()
            assert killer.fired.is_set(), (
                f"attempt {attempt}: never reached {kind} of epoch {epoch}:\n{output[-3000:]}"
            )
            assert code == -9, f"attempt {attempt}: exit code {code}, expected death by SIGKILL"
            if expected_resume:
                assert f"at epoch {expected_resume} " in output, (
                    f"attempt {attempt} did not resume:\n{output[-3000:]}"
                )
            pointer = manager.read_pointer() or {}
            stored_epoch = pointer.get("epoch", 0)
            if kind == "mid-epoch":
                late = [
                    e
                    for e in proxy.requests("PUT", checkpoint_name(epoch) + "$")
                    if e.started > killer.boundary
                ]
                assert not late, f"attempt {attempt}: the kill landed after epoch {epoch}'s checkpoint began"
                assert not any(line.lstrip().startswith(f"{epoch}/{EPOCHS} ") for _, line in proc.lines), (
                    f"attempt {attempt}: epoch {epoch} had already finished when the kill landed"
                )
                assert stored_epoch == epoch - 1
            elif kind == "mid-checkpoint-upload":
                # Part 2: `latest` still names the previous complete checkpoint, which verifies and loads.
                assert stored_epoch == epoch - 1, f"a half-uploaded checkpoint moved latest.json: {pointer}"
                state = manager.load_latest()
                assert state is not None and state["epoch"] == epoch - 1
                assert not manager.store.exists(f"{checkpoint_uri}/{checkpoint_name(epoch)}"), (
                    "an interrupted upload left a partial checkpoint object"
                )
            else:
                assert stored_epoch == epoch, f"pointer {pointer} after a kill just after checkpoint {epoch}"
                assert manager.load_latest()["epoch"] == epoch
            records.append({"point": kind, "epoch": epoch, "survived": False})
            FIGURES.kills.append(records[-1])
            expected_resume = stored_epoch
        proxy.on_progress(None)
        final = Proc(argv, env=env, log_path=tmp_path / "final.log")
        code = final.wait(180)
        assert code == 0, f"the re-run after the last kill failed ({code}):\n{final.output()[-4000:]}"
    finally:
        proxy.close()
    result = RunResult.load(tmp_path / "out")
    assert result.metrics["resumed_from_epoch"] == expected_resume
    assert_bitwise_equal(
        result, reference_run.result, "run killed at " + ", ".join(f"{k}@{e}" for e, k in points)
    )
    for record in records:
        record["survived"] = True
    assert not scan_for_secret(rel_creds, "training logs", sorted(tmp_path.glob("*.log")))
