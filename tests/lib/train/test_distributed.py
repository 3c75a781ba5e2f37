"""Multi-process and multi-node training with real torchrun and gloo on this machine.

* DDP inside one "pod" (``torchrun --standalone``) trains like one process at the same global batch,
  also when the batch does not divide evenly among the processes;
* ``Rendezvous``: the torchrun options of one node of a multi-node or elastic run;
* elastic training with real torchrun agents on 127.0.0.1, each running ``cifar10-kfp train ...
  --nnodes MIN:MAX`` against the embedded S3 store: a second agent joins a running one (scale-up),
  and a 2-agent run follows the 1-process run's data order and losses (invariance). The node-loss
  case (scale-down) is in tests/reliability/test_node_loss.py.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cifar10_kfp.train.config import make_config
from cifar10_kfp.train.distributed import Rendezvous, Runtime, check_replicas_agree
from cifar10_kfp.train.engine import train


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 3])
def test_multi_process_gloo_run_matches_single_process(tiny_dataset_path, tmp_path, nproc):
    # simple_cnn has no BatchNorm, so the only differences are float summation orders: the runs must
    # agree closely, not just "both learn". Same global batch (64): 32 per rank, or 22/21/21 for three
    # ranks, whose losses are weighted by their shares so that the gradient is the global batch's.
    config = make_config("seed", {"epochs": 2, "batch_size": 64, "lr": 0.05, "threads": 1})
    single = train(config, tiny_dataset_path, tmp_path / "one")
    multi = train(
        config, tiny_dataset_path, tmp_path / "multi", nproc=nproc, checkpoint_uri=str(tmp_path / "ck")
    )

    assert multi.metrics["world_size"] == nproc and single.metrics["world_size"] == 1
    assert multi.metrics["steps"] == single.metrics["steps"] == 2 * (256 // 64)
    assert multi.history[-1]["train_loss"] < multi.history[0]["train_loss"]
    assert multi.history[-1]["train_loss"] == pytest.approx(single.history[-1]["train_loss"], rel=1e-3)
    assert multi.metrics["val_acc"] == pytest.approx(single.metrics["val_acc"], abs=0.05)
    one = load_file(str(single.model_dir / "model.safetensors"))
    two = load_file(str(multi.model_dir / "model.safetensors"))
    for name in one:
        assert torch.allclose(one[name], two[name], rtol=1e-3, atol=1e-4), name
    # only rank 0 wrote outputs and checkpoints, once per epoch
    assert json.loads((tmp_path / "ck" / "latest.json").read_text())["epoch"] == 2
    assert sorted(p.name for p in (tmp_path / "ck").glob("*.pt")) == [
        "ckpt-epoch00001.pt",
        "ckpt-epoch00002.pt",
    ]


# ------------------------------------------------------------------------------ rendezvous


def test_one_node_runs_standalone_and_several_use_the_c10d_rendezvous(monkeypatch):
    monkeypatch.delenv("PET_NODE_RANK", raising=False)
    assert Rendezvous().torchrun_args(2) == ["--standalone", "--nproc-per-node=2", "--max-restarts=0"]
    elastic = Rendezvous("1:4", "node-0.job:29500", "job-a", max_restarts=3)
    assert elastic.elastic and elastic.multi_node and elastic.node_range == (1, 4)
    assert elastic.torchrun_args(1) == [
        "--nnodes=1:4", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=node-0.job:29500",
        "--rdzv-id=job-a", "--max-restarts=3",
    ]  # fmt: skip
    assert not Rendezvous("2", "node-0.job:29500").elastic


def test_on_a_trainer_node_node_0_hosts_the_rendezvous_store(monkeypatch):
    """PET_NODE_RANK (the JobSet completion index) decides who hosts the store, not a DNS comparison."""
    monkeypatch.delenv("PET_RDZV_CONF", raising=False)
    monkeypatch.setenv("PET_NODE_RANK", "0")
    assert Rendezvous("1:2", "h:1").torchrun_args(1)[-1] == "--rdzv-conf=is_host=true"
    monkeypatch.setenv("PET_NODE_RANK", "1")
    assert Rendezvous("1:2", "h:1").torchrun_args(1)[-1] == "--rdzv-conf=is_host=false"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nnodes": "0"}, "nnodes='0' must be N or MIN:MAX"),
        ({"nnodes": "3:2", "endpoint": "h:1"}, "nnodes='3:2' must be N or MIN:MAX"),
        ({"nnodes": "two"}, "nnodes='two' must be N or MIN:MAX"),
        ({"nnodes": "1:2"}, "give the rendezvous endpoint HOST:PORT"),
        ({"nnodes": "2", "endpoint": "node-0"}, "endpoint 'node-0' must be HOST:PORT"),
        ({"nnodes": "2", "endpoint": "h:99999"}, "endpoint 'h:99999' must be HOST:PORT"),
        ({"max_restarts": -1}, "max_restarts=-1 must be >= 0"),
        ({"nnodes": "2", "endpoint": "h:1", "run_id": "a b"}, "rendezvous id 'a b'"),
    ],
)
def test_bad_rendezvous_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Rendezvous(**kwargs)


def test_a_multi_node_run_without_checkpoints_is_refused(tiny_dataset_path, tmp_path):
    with pytest.raises(ValueError, match="multi-node run needs a checkpoint URI"):
        train(make_config("seed"), tiny_dataset_path, tmp_path, rendezvous=Rendezvous("1:2", "127.0.0.1:1"))


# --------------------------------------------------------------------- elastic agents


def _upload_dataset(store, tmp_path: Path, n_train: int) -> str:
    from cifar10_kfp.data.format import save_prepared
    from tests.support.data import make_tiny_dataset

    local = save_prepared(make_tiny_dataset(n_train=n_train, n_val=64, n_test=64), tmp_path / "d.safetensors")
    uri = store.root_uri("prepared", "elastic", "dataset.safetensors")
    store.put_file(local, uri)
    return uri


def _outputs(*dirs: Path) -> Path:
    """The one output directory the node holding rank 0 wrote."""
    written = [d for d in dirs if (d / "metrics.json").exists()]
    assert len(written) == 1, f"expected exactly one node's outputs, found {written}"
    return written[0]


@pytest.mark.slow
def test_scale_up_a_second_agent_joins_and_training_goes_on_at_world_size_2(store_env, tmp_path):
    """One agent trains alone (--nnodes 1:2); a second one joins after its first checkpoint; both restart
    their workers at the next rendezvous and go on with world size 2 from the latest checkpoint.

    The first agent's second checkpoint upload is held in a proxy until the second agent has joined, so
    the lone agent cannot finish before the newcomer's interpreter has started, however busy the machine;
    the restarted workers resume from the first one.
    """
    from tests.reliability.harness import S3Proxy
    from tests.support.torchrun_agents import Agent, free_port, node_env, train_args, wait_for_listener

    store_env.ensure_bucket()
    data = _upload_dataset(store_env, tmp_path, n_train=512)
    ckpt = store_env.root_uri("checkpoints", "scale-up")
    proxy = S3Proxy(int(store_env.config.endpoint.rsplit(":", 1)[1]))
    held, released = threading.Event(), threading.Event()
    uploads: list[str] = []

    def gate(event) -> None:
        """Hold the lone agent's second checkpoint upload until a new worker group reads the pointer."""
        if event.method == "PUT" and re.search(r"/ckpt-epoch\d+-step\d+\.pt$", event.path):
            if event.path not in uploads:
                uploads.append(event.path)
            if len(uploads) >= 2 and event.path == uploads[1]:
                held.set()
                released.wait(240)
        elif event.method == "GET" and event.path.endswith("/latest.json") and held.is_set():
            released.set()  # the restarted workers (world size 2) are resuming

    proxy.on_progress(gate)
    port, env = free_port(), node_env({"MINIO_ENDPOINT": proxy.endpoint})
    args = {"nnodes": "1:2", "port": port, "rdzv_id": "scale-up", "epochs": 3, "steps_every": 4}
    first = Agent("a", train_args(data, ckpt, tmp_path / "a", **args), env, tmp_path / "a.log")
    second = None
    try:
        wait_for_listener(port)
        _wait(held.is_set, "the lone agent's second checkpoint upload")
        second = Agent("b", train_args(data, ckpt, tmp_path / "b", **args), env, tmp_path / "b.log")
        codes = first.wait(300), second.wait(300)
    finally:
        released.set()
        for agent in (first, second):
            if agent is not None:
                agent.stop()
        proxy.close()
    assert codes == (0, 0), first.output()[-3000:] + second.output()[-3000:]
    out = _outputs(tmp_path / "a", tmp_path / "b")
    history = json.loads((out / "history.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    logs = first.output() + second.output()
    resumed = [
        int(s) for s in re.findall(r"resuming from \S+ at epoch \d+ \+ \d+ steps \(step (\d+)\)", logs)
    ]
    assert resumed and resumed[0] == 4, "world size 2 did not resume from the lone agent's first checkpoint"
    assert "membership change: the checkpoint was written by 1 process(es), 2 train now" in logs
    assert [row["world_size"] for row in history] == [2, 2, 2] and metrics["world_size"] == 2
    assert metrics["steps"] == 3 * 16 and metrics["val_acc"] >= 0.75  # 4 classes: chance is 0.25


@pytest.mark.slow
def test_two_agents_follow_the_one_process_data_order_and_losses(store_env, tmp_path):
    """Invariance: 2 agents (--nnodes 2) and 1 process, same seed and global batch (32 = 16 + 16).

    The data order is the same by construction (test_augment: each rank's share of the same draws); the
    losses agree within float reduction order: relative 1e-4 per epoch (simple_cnn has no BatchNorm, whose
    per-rank statistics would differ), and the weights within rtol 1e-3.
    """
    from tests.support.torchrun_agents import Agent, free_port, node_env, train_args

    store_env.ensure_bucket()
    data = _upload_dataset(store_env, tmp_path, n_train=256)
    port, env = free_port(), node_env({})
    args = {"nnodes": "2", "port": port, "rdzv_id": "invariance", "epochs": 2, "steps_every": 0}
    ckpt = store_env.root_uri("checkpoints", "invariance")
    # both at once: with a fixed --nnodes 2 it does not matter which one binds the store's port first
    agents = [
        Agent(n, train_args(data, ckpt, tmp_path / n, **args), env, tmp_path / f"{n}.log") for n in "ab"
    ]
    try:
        codes = [agent.wait(300) for agent in agents]
    finally:
        for agent in agents:
            agent.stop()
    assert codes == [0, 0], agents[0].output()[-3000:] + agents[1].output()[-3000:]
    out = _outputs(tmp_path / "a", tmp_path / "b")
    two = json.loads((out / "history.json").read_text())

    config = make_config("seed", {"epochs": 2, "batch_size": 32, "lr": 0.05, "threads": 1, "device": "cpu"})
    one = train(config, data, tmp_path / "one")
    assert [r["world_size"] for r in two] == [2, 2] and [r["step"] for r in two] == [
        r["step"] for r in one.history
    ]
    for got, want in zip(two, one.history):
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-4)
        assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-4)
    weights_two = load_file(str(out / "model" / "model.safetensors"))
    weights_one = load_file(str(one.model_dir / "model.safetensors"))
    for name, tensor in weights_one.items():
        assert torch.allclose(tensor, weights_two[name], rtol=1e-3, atol=1e-5), name


def _wait(predicate, what: str, timeout_s: float = 240) -> None:
    from tests.reliability.harness import wait_until

    wait_until(predicate, timeout_s, interval=0.05, what=what)


def test_a_trainer_node_other_than_0_waits_for_node_0s_store_with_a_bound(monkeypatch):
    """W3/R1: nodes other than 0 wait (bounded) until node 0's store accepts connections; node 0 does not."""
    import socket
    import time

    from cifar10_kfp.train.distributed import Rendezvous
    from tests.support.torchrun_agents import free_port

    port = free_port()
    rendezvous = Rendezvous("2", f"127.0.0.1:{port}", "w", 0, wait_for_host_s=1.0)
    monkeypatch.setenv("PET_NODE_RANK", "0")
    rendezvous.wait_for_host()  # node 0 hosts the store: no wait, nothing listens yet
    monkeypatch.setenv("PET_NODE_RANK", "1")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{port} did not accept connections within 1s"):
        rendezvous.wait_for_host()
    assert 1.0 <= time.monotonic() - started < 10
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        rendezvous.wait_for_host()  # returns as soon as the store answers


def _replica_check_rank(rank: int, port: int, perturb: bool, results) -> None:
    """One rank of a 2-rank gloo group: a seeded linear layer, rank 1's optionally changed."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        layer = torch.nn.Linear(8, 4)
        if perturb and rank == 1:
            with torch.no_grad():
                layer.weight[0, 0] += 0.01  # what one unsynchronised step does, and less
        try:
            check_replicas_agree(layer, Runtime(device=torch.device("cpu"), rank=rank, world_size=2))
            results[rank] = "agree"
        except RuntimeError as exc:
            results[rank] = str(exc)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("perturb", [False, True])
def test_ranks_whose_weights_differ_are_refused_on_every_rank(perturb):
    import torch.multiprocessing as mp

    from tests.support.torchrun_agents import free_port

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_replica_check_rank, args=(free_port(), perturb, results), nprocs=2, join=True)
        got = dict(results)
    if not perturb:
        assert got == {0: "agree", 1: "agree"}
    else:
        assert all("ranks ended training with different weights" in got[r] for r in (0, 1)), got
