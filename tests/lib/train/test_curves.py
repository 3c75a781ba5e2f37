"""Training writes TensorBoard curves next to its checkpoints in the real object store, readable by TensorBoard."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cifar10_kfp.storage import ObjectStore
from cifar10_kfp.train.checkpoint import CheckpointManager
from cifar10_kfp.train.config import make_config
from cifar10_kfp.train.curves import SCALARS, tensorboard_uri, training_markdown
from cifar10_kfp.train.engine import train


@pytest.mark.slow
def test_training_curves_land_in_the_object_store_and_load_with_tensorboards_reader(
    tiny_dataset_path, tmp_path, store_env: ObjectStore
):
    checkpoints = store_env.root_uri("checkpoints", "curves-test")
    result = train(
        make_config("seed", {"epochs": 3}), tiny_dataset_path, tmp_path / "out", checkpoint_uri=checkpoints
    )

    uri = tensorboard_uri(checkpoints)
    assert uri.startswith(checkpoints + "/")
    files = store_env.get_dir(uri, tmp_path / "tb")
    assert files and all(p.name.startswith("events.out.tfevents") for p in files)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(SCALARS) <= set(events.Tags()["scalars"])
    for tag, key in SCALARS.items():
        points = events.Scalars(tag)
        assert [p.step for p in points] == [1, 2, 3]
        assert [p.value for p in points] == pytest.approx([row[key] for row in result.history], rel=1e-6)
    # checkpoints are unaffected by the curves beside them
    manager = CheckpointManager(checkpoints, store=store_env)
    assert manager.list_checkpoints() and manager.load_latest()["epoch"] == 3
    assert uri in training_markdown(result.metrics, checkpoints, result.history)


def test_no_checkpoints_means_no_curves():
    assert tensorboard_uri("") == ""
    assert "Training curves" not in training_markdown({"val_acc": 0.5}, "", [])
