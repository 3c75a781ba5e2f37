"""The streamed data path on the real object store: order, rank partitioning, exact resume, path choice."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

import cifar10_kfp.train.stream as stream
from cifar10_kfp.data.format import save_prepared
from cifar10_kfp.data.shards import ShardError, open_shards, write_shards
from cifar10_kfp.train.config import make_config
from cifar10_kfp.train.engine import train
from cifar10_kfp.train.state import RunCheckpoints
from tests.support.data import make_tiny_dataset

AUGMENT = {"flip": True, "translate": 2, "channels_last": True}


@pytest.fixture
def sharded(store_env) -> str:
    """512 train images in 8 shards of 64, in the object store; returns the prefix."""
    dataset = make_tiny_dataset(n_train=512, n_val=64, n_test=64, image_size=16)
    uri = store_env.root_uri("shards", "tiny")
    write_shards(dataset, uri, store_env, shard_samples=64)
    return uri


def _streamed(store, uri: str, **overrides) -> stream.StreamedTrain:
    config = make_config("seed", {"data_path": "stream", **overrides})
    return stream.StreamedTrain(open_shards(uri, store), store, config, torch.device("cpu"))


def _epoch(data, world_size: int, rank: int, start_step: int = 0, epoch: int = 1):
    return list(data.epoch(7, epoch, 32, rank, world_size, start_step=start_step))


def test_ranks_read_disjoint_shards_and_together_train_the_one_process_batches(
    store_env, sharded, monkeypatch
):
    data = _streamed(store_env, sharded, stream_partitions=4, shuffle_buffer=100, **AUGMENT)
    read: dict[int, set[str]] = {}
    real_read = stream.read_shard
    rank = {"now": 0}
    monkeypatch.setattr(stream, "read_shard", lambda i, e, s: read.setdefault(rank["now"], set()).add(e.name)
                        or real_read(i, e, s))  # fmt: skip
    one = _epoch(data, 1, 0)
    read.clear()
    parts = []
    for r in (0, 1):
        rank["now"] = r
        parts.append(_epoch(data, 2, r))
    assert read[0].isdisjoint(read[1]) and len(read[0] | read[1]) == 8
    assert len(one) == len(parts[0]) == 16
    for step, (images, labels) in enumerate(one):
        assert torch.equal(torch.cat([parts[0][step][0], parts[1][step][0]]), images)
        assert torch.equal(torch.cat([parts[0][step][1], parts[1][step][1]]), labels)
    assert one[0][0].is_contiguous(memory_format=torch.channels_last)


def test_an_epoch_sees_every_image_once_in_a_new_order_each_epoch(store_env, sharded):
    data = _streamed(store_env, sharded, shuffle_buffer=128)
    first, second = _epoch(data, 1, 0, epoch=0), _epoch(data, 1, 0, epoch=1)
    labels = torch.cat([b[1] for b in first])
    assert len(labels) == 512 and sorted(labels.tolist()) == sorted(
        make_tiny_dataset(n_train=512).train_labels.tolist()
    )
    rows = {bytes(img.numpy().tobytes()) for b in first for img in b[0]}
    assert len(rows) == 512
    assert not torch.equal(labels, torch.cat([b[1] for b in second]))
    assert [torch.equal(a[0], b[0]) for a, b in zip(first, _epoch(data, 1, 0, epoch=0))] == [True] * 16


def test_starting_mid_epoch_gives_the_rest_of_that_epoch_exactly(store_env, sharded):
    data = _streamed(store_env, sharded, stream_partitions=2, shuffle_buffer=150, **AUGMENT)
    whole = _epoch(data, 2, 1)
    rest = _epoch(data, 2, 1, start_step=11)
    assert len(rest) == 5
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(whole[11:], rest))


def test_a_world_size_that_does_not_divide_the_partitions_is_refused_by_name(store_env, sharded):
    data = _streamed(store_env, sharded, stream_partitions=2)
    with pytest.raises(ValueError, match="stream_partitions=2 cannot be split evenly over 3 processes"):
        _epoch(data, 3, 0)
    with pytest.raises(ValueError, match="stream_partitions=9 is more than the 8 train shards"):
        _streamed(store_env, sharded, stream_partitions=9)


def test_auto_picks_memory_within_the_budget_and_streams_beyond_it(store_env, sharded, tmp_path):
    path, dataset = stream.open_dataset(make_config("seed"), sharded)
    assert path == "memory" and len(dataset.train_labels) == 512
    path, dataset = stream.open_dataset(make_config("seed", {"memory_budget_gb": 1e-4}), sharded)
    assert path == "stream" and isinstance(dataset, stream.StreamedDataset)
    forced = make_config("seed", {"data_path": "memory", "memory_budget_gb": 1e-4})
    assert stream.open_dataset(forced, sharded)[0] == "memory"
    single = save_prepared(make_tiny_dataset(), tmp_path / "d.safetensors")
    with pytest.raises(ValueError, match="data_path='stream' needs a sharded dataset.*d.safetensors"):
        stream.open_dataset(make_config("seed", {"data_path": "stream"}), str(single))
    with pytest.raises(ValueError, match="data_path='disk'"):
        make_config("seed", {"data_path": "disk"})


def test_training_refuses_a_missing_shard_by_name_before_any_step(store_env, sharded, tmp_path):
    store_env.delete(f"{sharded}/train-00005.safetensors")
    config = make_config("seed", {"epochs": 1, "batch_size": 32, "data_path": "stream"})
    with pytest.raises(ShardError, match="train-00005.safetensors listed in index.json is missing"):
        train(config, sharded, tmp_path / "out")
    assert not (tmp_path / "out").exists()


class _Stop(Exception):
    pass


@pytest.mark.slow
def test_a_run_stopped_mid_epoch_resumes_bitwise_equal_to_an_unstopped_one(
    store_env, sharded, tmp_path, monkeypatch
):
    config = make_config("cpu", {
        "epochs": 2, "batch_size": 32, "widths": "8,8,16", "whiten_samples": 64, "threads": 1, "progress": False,
        "data_path": "stream", "stream_partitions": 2, "shuffle_buffer": 100, "checkpoint_every_steps": 5,
    })  # fmt: skip
    reference = train(config, sharded, tmp_path / "ref", checkpoint_uri=store_env.root_uri("ck", "ref"))
    real_after_step = RunCheckpoints.after_step

    def stop_at_23(self, state):
        real_after_step(self, state)
        if state.step == 23:  # 16 steps an epoch: the checkpoint of step 20 is inside epoch 2
            raise _Stop

    ckpt = store_env.root_uri("ck", "run")
    monkeypatch.setattr(RunCheckpoints, "after_step", stop_at_23)
    with pytest.raises(_Stop):
        train(config, sharded, tmp_path / "run", checkpoint_uri=ckpt)
    monkeypatch.setattr(RunCheckpoints, "after_step", real_after_step)
    resumed = train(config, sharded, tmp_path / "run", checkpoint_uri=ckpt)
    assert (
        resumed.metrics["resumed_from_epoch"] == 1
        and resumed.metrics["steps"] == reference.metrics["steps"] == 32
    )
    one = load_file(str(reference.model_dir / "model.safetensors"))
    two = load_file(str(resumed.model_dir / "model.safetensors"))
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert resumed.history[-1]["train_loss"] == reference.history[-1]["train_loss"]


@pytest.mark.slow
def test_two_gloo_processes_stream_like_one(sharded, tmp_path):
    # simple_cnn has no BatchNorm: two ranks, each on its own streams, must agree with one process closely
    config = make_config("seed", {"epochs": 2, "batch_size": 32, "lr": 0.05, "threads": 1, "data_path": "stream",
                                  "stream_partitions": 2, "shuffle_buffer": 64})  # fmt: skip
    single = train(config, sharded, tmp_path / "one")
    multi = train(config, sharded, tmp_path / "two", nproc=2, checkpoint_uri=str(tmp_path / "ck"))
    assert multi.metrics["world_size"] == 2 and multi.metrics["steps"] == single.metrics["steps"] == 32
    assert multi.history[-1]["train_loss"] == pytest.approx(single.history[-1]["train_loss"], rel=1e-3)
    one = load_file(str(single.model_dir / "model.safetensors"))
    two = load_file(str(multi.model_dir / "model.safetensors"))
    assert all(torch.allclose(one[k], two[k], rtol=1e-3, atol=1e-4) for k in one)
