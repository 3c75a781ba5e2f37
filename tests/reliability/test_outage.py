"""Part 3: the object store goes away during training.

The suite's real SeaweedFS server is stopped (its whole process group killed) once the first
checkpoint is stored, and started again on the same ports and data.

* Down for ``OUTAGE_S`` (20 s) inside the retry budget: training goes on, the checkpoint upload
  that meets the outage retries until the store is back, and the run completes with every epoch,
  every checkpoint, and weights bitwise equal to the uninterrupted run.
* Down past a short retry budget: the run fails with an error that says what failed where and
  that the budget ran out; a re-run after the store returns resumes from the last good checkpoint.

The checkpoint upload is synchronous in the epoch loop (``CheckpointManager.save``), so "training
goes on" means: the epoch in flight finishes, then the loop waits inside the storage retry
budget at the next checkpoint. The test records how many epochs finished while the store was down.
"""

from __future__ import annotations

import time

import pytest

from cifar10_kfp.checkpoint import CheckpointManager
from tests.reliability.harness import FIGURES, Proc, scan_for_secret, wait_until
from tests.reliability.training import EPOCHS, RunResult, assert_bitwise_equal, train_argv

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

OUTAGE_S = 20.0


def _pointer_epoch(manager: CheckpointManager) -> int:
    try:
        return (manager.read_pointer() or {}).get("epoch", 0)
    except Exception:  # noqa: BLE001 - the store may be starting; poll again
        return 0


def _epoch_lines(proc: Proc, start: float, end: float) -> list[str]:
    return [line for t, line in proc.lines if start <= t <= end and f"/{EPOCHS} " in line]


def test_store_down_20s_during_training_run_completes_with_nothing_lost(
    rel_server, rel_env, train_data, reference_run, rel_creds, tmp_path
):
    env = {**rel_env, "CIFAR10_KFP_RETRY_BUDGET_S": "60"}
    checkpoint_uri = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}checkpoints/outage"
    manager = CheckpointManager(checkpoint_uri, store=rel_server.store(CIFAR10_KFP_RETRY_BUDGET_S=1))
    proc = Proc(
        train_argv(train_data, checkpoint_uri, tmp_path / "out"), env=env, log_path=tmp_path / "train.log"
    )
    try:
        wait_until(lambda: _pointer_epoch(manager) >= 1 or not proc.alive, 120, what="the first checkpoint")
        assert proc.alive, f"training ended before the outage:\n{proc.output()[-3000:]}"
        down_at = time.monotonic()  # SeaweedFS answers 5xx from SIGTERM on, then refuses connections
        rel_server.stop()
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        up_at = time.monotonic()
        rel_server.start()
        code = proc.wait(180)
    finally:
        if not rel_server.running:
            rel_server.start()
        proc.kill9()
    output = proc.output()
    assert code == 0, f"training did not survive a {OUTAGE_S:g}s outage ({code}):\n{output[-4000:]}"
    retries = [line for t, line in proc.lines if down_at <= t <= up_at + 10 and "transient failure" in line]
    assert retries, f"no retried upload during the outage:\n{output[-4000:]}"
    # Nothing lost: every epoch, the final checkpoint, and the exact result of the uninterrupted run.
    assert _pointer_epoch(manager) == EPOCHS
    assert manager.load_latest()["epoch"] == EPOCHS
    result = RunResult.load(tmp_path / "out")
    assert result.metrics["resumed_from_epoch"] == 0, "the run restarted instead of riding out the outage"
    assert_bitwise_equal(result, reference_run.result, f"run through a {OUTAGE_S:g}s store outage")
    during = _epoch_lines(proc, down_at, up_at)
    FIGURES.outage_s.append(up_at - down_at)
    FIGURES.notes.append(
        f"outage: {len(during)} epoch(s) finished while the store was down, then the synchronous "
        f"checkpoint upload retried {len(retries)} times until it returned"
    )
    assert not scan_for_secret(rel_creds, "training logs", [proc.log_path])


def test_store_down_past_retry_budget_fails_clearly_and_rerun_resumes(
    rel_server, rel_env, train_data, reference_run, rel_creds, tmp_path
):
    budget_s = 3
    checkpoint_uri = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}checkpoints/budget"
    manager = CheckpointManager(checkpoint_uri, store=rel_server.store(CIFAR10_KFP_RETRY_BUDGET_S=1))
    argv = train_argv(train_data, checkpoint_uri, tmp_path / "out")
    short = {**rel_env, "CIFAR10_KFP_RETRY_BUDGET_S": str(budget_s)}
    proc = Proc(argv, env=short, log_path=tmp_path / "failing.log")
    try:
        wait_until(lambda: _pointer_epoch(manager) >= 1 or not proc.alive, 120, what="the first checkpoint")
        assert proc.alive, f"training ended before the outage:\n{proc.output()[-3000:]}"
        rel_server.stop()
        code = proc.wait(120)
    finally:
        proc.kill9()
        rel_server.start()
    output = proc.output()
    assert code != 0, "training reported success although its checkpoints could not be stored"
    last_lines = "\n".join(output.strip().splitlines()[-3:])
    clear = (
        f"over the {budget_s}s retry budget" in last_lines
        and rel_server.endpoint in last_lines
        and "ckpt-epoch" in last_lines
        and "Traceback" not in output
    )
    assert clear, f"the failure does not say what failed where and why:\n{output[-3000:]}"
    stored = _pointer_epoch(manager)
    assert stored >= 1
    rerun = Proc(argv, env=rel_env, log_path=tmp_path / "rerun.log")
    code = rerun.wait(180)
    assert code == 0, f"the re-run after the store returned failed ({code}):\n{rerun.output()[-4000:]}"
    result = RunResult.load(tmp_path / "out")
    resumed = result.metrics["resumed_from_epoch"] == stored
    FIGURES.budget_exhausted.append({"clear_error": clear, "resumed": resumed})
    assert resumed, (
        f"re-run resumed from epoch {result.metrics['resumed_from_epoch']}, the store held {stored}"
    )
    assert_bitwise_equal(result, reference_run.result, "run failed past the retry budget, then re-run")
    assert not scan_for_secret(rel_creds, "training logs", [proc.log_path, rerun.log_path])
