"""Node loss in elastic training: one of two torchrun agents is SIGKILLed with all its processes.

Two real agents on 127.0.0.1 run the same ``cifar10-kfp train ... --nnodes 1:2`` command against the
suite's S3 store, checkpointing every ``INTERVAL_STEPS`` global steps. Once both train together
(world size 2) and a checkpoint lands, the agent that does not host the rendezvous store is killed
at once, workers included, as when its node disappears. The survivor's worker fails on the lost
peer, its agent re-rendezvouses alone (torchrun's ``--max-restarts``) and trains on from the newest
checkpoint with world size 1. Figure: ``node losses survived (elastic)  k/k, progress lost <= interval``
(the resumed step is the newest checkpoint at the kill, so at most one interval of steps is redone).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.reliability.harness import FIGURES, S3Proxy, scan_for_secret, wait_until
from tests.support.torchrun_agents import Agent, free_port, node_env, train_args, wait_for_listener

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

INTERVAL_STEPS = 4
EPOCHS = 4  # 512 images / 32 per step = 16 steps per epoch


def test_elastic_run_survives_the_loss_of_a_node(rel_server, rel_env, rel_store, rel_creds, tmp_path):
    from cifar10_kfp.data.format import save_prepared
    from tests.support.data import make_tiny_dataset

    rel_store.ensure_bucket()
    data = rel_store.root_uri("prepared", "node-loss", "dataset.safetensors")
    local_data = save_prepared(make_tiny_dataset(n_train=512), tmp_path / "d.safetensors")
    rel_store.put_file(local_data, data)
    checkpoints = rel_store.root_uri("checkpoints", "node-loss")
    record = {
        "survived": False,
        "interval_steps": INTERVAL_STEPS,
        "pointer_step_at_kill": None,
        "resumed_step": None,
    }
    FIGURES.node_losses.append(record)

    proxy = S3Proxy(rel_server.ports["s3"])
    port, env = free_port(), node_env({**rel_env, "MINIO_ENDPOINT": proxy.endpoint})
    args = {
        "nnodes": "1:2",
        "port": port,
        "rdzv_id": "node-loss",
        "epochs": EPOCHS,
        "steps_every": INTERVAL_STEPS,
    }
    host = Agent("host", train_args(data, checkpoints, tmp_path / "host", **args), env, tmp_path / "host.log")
    lost = None
    try:
        wait_for_listener(port)  # the first agent hosts the rendezvous store; the other one is lost
        lost = Agent(
            "lost", train_args(data, checkpoints, tmp_path / "lost", **args), env, tmp_path / "lost.log"
        )
        together = re.compile(r"training on 2 process\(es\)")

        def kill_after_a_checkpoint_of_the_pair(event) -> None:
            pointer_stored = event.method == "PUT" and event.path.endswith("/latest.json") and event.finished
            if pointer_stored and not lost.killed and together.search(host.output() + lost.output()):
                record["pointer_step_at_kill"] = json.loads(event.body)["step"]
                lost.kill_node()

        proxy.on_progress(kill_after_a_checkpoint_of_the_pair)
        wait_until(
            lambda: lost.killed, 240, interval=0.1, what="a checkpoint written by both agents together"
        )
        code = host.wait(300)
    finally:
        for agent in (host, lost):
            if agent is not None:
                agent.stop()
        proxy.close()
    output = host.output()
    assert code == 0, f"the surviving agent failed ({code}):\n{output[-4000:]}"
    resumed = [
        int(s) for s in re.findall(r"resuming from \S+ at epoch \d+(?: \+ \d+ steps)? \(step (\d+)\)", output)
    ]
    assert resumed, f"the survivor did not resume from a checkpoint:\n{output[-4000:]}"
    record["resumed_step"] = resumed[-1]
    killed_at = record["pointer_step_at_kill"]
    assert resumed[-1] >= record["pointer_step_at_kill"], (
        "resumed from an older checkpoint than the newest one"
    )
    assert "membership change: the checkpoint was written by 2 process(es), 1 train now" in output
    history = json.loads((tmp_path / "host" / "history.json").read_text())
    metrics = json.loads((tmp_path / "host" / "metrics.json").read_text())
    assert history[-1]["world_size"] == 1 and metrics["world_size"] == 1
    assert metrics["steps"] == EPOCHS * 16 and metrics["val_acc"] >= 0.75  # 4 classes: chance is 0.25
    _assert_follows_the_one_process_run(history, tmp_path / "host", local_data, tmp_path / "one", killed_at)
    record["survived"] = True
    assert not scan_for_secret(rel_creds, "elastic training logs", sorted(tmp_path.glob("*.log")))


def _assert_follows_the_one_process_run(history, survivor_dir, data, reference_dir, killed_at: int) -> None:
    """The README's claim: after the loss, the same global batch, data order and schedule.

    The reference is one process training the same command's config from scratch. The same schedule:
    the same steps and learning rate in every epoch. The same global batch and data order: the same
    evaluation losses after every epoch, before and after the loss, and the same final weights, within
    the float reduction order of two processes against one (``test_distributed``'s invariance test).
    The killed epoch's training loss is left out: its running sums before the checkpoint are rank 0's.
    """
    import torch
    from safetensors.torch import load_file

    from cifar10_kfp.train.config import make_config
    from cifar10_kfp.train.engine import train

    config = make_config(
        "seed", {"epochs": EPOCHS, "batch_size": 32, "lr": 0.05, "threads": 1, "device": "cpu"}
    )
    one = train(config, data, reference_dir)
    assert [(r["epoch"], r["step"], r["lr"]) for r in history] == [
        (r["epoch"], r["step"], r["lr"]) for r in one.history
    ], "the schedule after the loss is not the one-process run's"
    killed_epoch = killed_at // 16 + 1
    for got, want in zip(history, one.history):
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-4), f"epoch {got['epoch']}"
        if got["epoch"] != killed_epoch:
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-4), f"epoch {got['epoch']}"
    survivor = load_file(str(survivor_dir / "model" / "model.safetensors"))
    for name, tensor in load_file(str(one.model_dir / "model.safetensors")).items():
        assert torch.allclose(tensor, survivor[name], rtol=1e-3, atol=1e-5), name
