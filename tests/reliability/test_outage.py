"""Part 3: the object store goes away during training.

The suite's real SeaweedFS server is stopped (its whole process group killed) once the first
checkpoint is stored, and started again on the same ports and data.

Two runs of the same training command go through one outage together:

* Down for at least ``OUTAGE_S`` (20 s), and until both runs have met it (events, not a clock: on a
  loaded machine an epoch may outlast 20 s), inside a retry budget longer than any outage here:
  training goes on, the checkpoint upload that meets the outage retries until the store is back,
  and the run completes with every epoch, every checkpoint, and weights bitwise equal to the
  uninterrupted run.
* Down past a 3 s retry budget: the run fails with an error that says what failed where and
  that the budget ran out; a re-run after the store returns resumes from the last good checkpoint.

The checkpoint upload is synchronous in the epoch loop (``CheckpointManager.save``), so "training
goes on" means: the epoch in flight finishes, then the loop waits inside the storage retry
budget at the next checkpoint. The test records how many epochs finished while the store was down.
"""

from __future__ import annotations

import time

import pytest

from cifar10_kfp.train.checkpoint import CheckpointManager
from tests.reliability.harness import FIGURES, Proc, scan_for_secret, wait_until
from tests.reliability.training import EPOCHS, RunResult, assert_bitwise_equal, train_argv

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

OUTAGE_S = 20.0  # the least time the store stays down
PATIENT_BUDGET_S = 900  # the patient run's retry budget: longer than the store can stay down below
HANG_S = 600  # the most the store stays down waiting for both runs to meet the outage: a hang guard


def _retried_since(proc: Proc, since: float) -> bool:
    return any("transient failure" in line for t, line in proc.lines if t >= since)


def _pointer_epoch(manager: CheckpointManager) -> int:
    try:
        return (manager.read_pointer() or {}).get("epoch", 0)
    except Exception:  # noqa: BLE001 - the store may be starting; poll again
        return 0


def _epoch_lines(proc: Proc, start: float, end: float) -> list[str]:
    return [line for t, line in proc.lines if start <= t <= end and f"/{EPOCHS} " in line]


def test_store_outage_inside_and_past_the_retry_budget(
    rel_server, rel_env, train_data, reference_run, rel_creds, tmp_path
):
    """Two runs of the same command ride the same outage: one with a budget longer than it, one with 3 s."""
    budget_s = 3
    prefix = f"s3://{rel_server.bucket}/{rel_env['CIFAR10_KFP_PREFIX']}checkpoints"
    patient_uri, impatient_uri = f"{prefix}/patient", f"{prefix}/impatient"
    watch = rel_server.store(CIFAR10_KFP_RETRY_BUDGET_S=1)
    patient_ckpt = CheckpointManager(patient_uri, store=watch)
    impatient_ckpt = CheckpointManager(impatient_uri, store=watch)
    impatient_argv = train_argv(train_data, impatient_uri, tmp_path / "impatient")
    patient = Proc(
        train_argv(train_data, patient_uri, tmp_path / "patient"),
        env={**rel_env, "CIFAR10_KFP_RETRY_BUDGET_S": str(PATIENT_BUDGET_S)},
        log_path=tmp_path / "patient.log",
    )
    impatient = Proc(
        impatient_argv,
        env={**rel_env, "CIFAR10_KFP_RETRY_BUDGET_S": str(budget_s)},
        log_path=tmp_path / "impatient.log",
    )
    rerun = None
    try:
        wait_until(
            lambda: (
                (_pointer_epoch(patient_ckpt) >= 1 and _pointer_epoch(impatient_ckpt) >= 1)
                or not (patient.alive and impatient.alive)
            ),
            120,
            what="the first checkpoint of both runs",
        )
        assert patient.alive and impatient.alive, (
            f"a run ended before the outage:\n{patient.output()[-2000:]}"
        )
        down_at = time.monotonic()  # SeaweedFS answers 5xx from SIGTERM on, then refuses connections
        rel_server.stop()
        wait_until(
            lambda: not patient.alive or (not impatient.alive and _retried_since(patient, down_at)),
            HANG_S,
            interval=0.1,
            what="the impatient run to give up and the patient one to retry an upload, with the store down",
        )
        failed_code = impatient.wait(60) if not impatient.alive else None  # it gave up inside the outage
        failed_at = time.monotonic()
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        up_at = time.monotonic()
        rel_server.start()
        ready_at = time.monotonic()  # start() returns once the store serves writes again
        stored = _pointer_epoch(impatient_ckpt)
        rerun = Proc(impatient_argv, env=rel_env, log_path=tmp_path / "rerun.log")
        code = patient.wait(180)
        rerun_code = rerun.wait(180)
    finally:
        if not rel_server.running:
            rel_server.start()
        for proc in (patient, impatient, rerun):
            if proc is not None:
                proc.kill9()

    # Inside the budget: training went on, the upload retried, nothing was lost.
    output = patient.output()
    assert code == 0, f"training did not survive a {OUTAGE_S:g}s outage ({code}):\n{output[-4000:]}"
    retries = [line for t, line in patient.lines if down_at <= t <= up_at and "transient failure" in line]
    assert retries, f"no retried upload during the outage:\n{output[-4000:]}"
    assert _pointer_epoch(patient_ckpt) == EPOCHS and patient_ckpt.load_latest()["epoch"] == EPOCHS
    result = RunResult.load(tmp_path / "patient")
    assert result.metrics["resumed_from_epoch"] == 0, "the run restarted instead of riding out the outage"
    assert_bitwise_equal(result, reference_run.result, f"run through a {OUTAGE_S:g}s store outage")
    FIGURES.outage_s.append(ready_at - down_at)  # stopped, down 20 s, restarting
    during = _epoch_lines(patient, down_at, up_at)
    FIGURES.notes.append(
        f"outage: {len(during)} epoch(s) finished while the store was down, then the synchronous "
        f"checkpoint upload retried {len(retries)} times until it returned"
    )

    # Past the budget: a clear failure while the store was down, then an exact resume.
    failed_output = impatient.output()
    last_lines = "\n".join(failed_output.strip().splitlines()[-3:])
    assert failed_code is not None, "the impatient run was still running when the store came back"
    assert failed_code != 0, "training reported success although its checkpoints could not be stored"
    assert failed_at < up_at
    clear = (
        f"over the {budget_s}s retry budget" in last_lines
        and rel_server.endpoint in last_lines
        and "checkpoints/impatient/" in last_lines  # the upload, the pointer or the pruning listing
        and "Traceback" not in failed_output
    )
    assert stored >= 1
    assert rerun_code == 0, (
        f"the re-run after the store returned failed ({rerun_code}):\n{rerun.output()[-4000:]}"
    )
    resumed_result = RunResult.load(tmp_path / "impatient")
    resumed = resumed_result.metrics["resumed_from_epoch"] == stored
    FIGURES.budget_exhausted.append({"clear_error": clear, "resumed": resumed})
    assert clear, f"the failure does not say what failed where and why:\n{failed_output[-3000:]}"
    assert resumed, (
        f"re-run resumed from epoch {resumed_result.metrics['resumed_from_epoch']}, the store held {stored}"
    )
    assert_bitwise_equal(
        resumed_result, reference_run.result, "run failed past the retry budget, then re-run"
    )
    assert not scan_for_secret(
        rel_creds, "training logs", [patient.log_path, impatient.log_path, rerun.log_path]
    )
