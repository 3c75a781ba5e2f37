"""Object store: checkpoint and dataset throughput on the embedded S3 server vs the local disk.

Checkpoints go through the product's own ``CheckpointManager`` on both sides, with the state
the engine writes for the ``fast`` preset (the GPU recipe a cluster run checkpoints): the
fast_resnet weights, SGD momentum buffers after a real step, the EMA copy, the LR schedule,
the RNG states, config and history.

- save + upload: ``torch.save`` to bytes, sha256, upload, then move the ``latest.json``
  pointer and prune old checkpoints;
- download + verify + load: read the pointer, download, check the sha256 against it,
  ``torch.load(weights_only=True)``, ``load_state_dict`` into a fresh model.

The local side is the same manager on a local directory (atomic write + rename). The
prepared dataset file is moved with ``ObjectStore.put_file``/``get_file`` (sha256 recorded,
verified on the way back) against the same calls on local paths (a copy).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.common import BenchContext, best_seconds, row, scratch_dir, section

MB = 1024 * 1024


def realistic_training_state(preset: str = "fast"):
    """(model factory, state dict) exactly shaped like the engine's checkpoint for ``preset``."""
    import torch.nn.functional as F

    from cifar10_kfp.train.checkpoint import capture_rng_state
    from cifar10_kfp.train.config import make_config
    from cifar10_kfp.train.models import build_model
    from cifar10_kfp.train.state import ModelEMA

    config = make_config(preset, {})
    torch.manual_seed(0)

    def new_model():
        return build_model(config.architecture, 10, 32, **config.model_config())

    net = new_model()
    optimizer = torch.optim.SGD(
        [p for p in net.parameters() if p.requires_grad], lr=config.lr, momentum=config.momentum,
        nesterov=config.nesterov, weight_decay=config.weight_decay,
    )  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    F.cross_entropy(net(images), labels).backward()  # fills the momentum buffers, as after step 1
    optimizer.step()
    scheduler.step()
    ema = ModelEMA(net, config.ema_decay or 0.9, config.ema_every)
    history = [{"epoch": e, "train_loss": 1.0, "val_acc": 0.5, "elapsed_s": float(e)} for e in range(1, 11)]
    state = {
        "config": config.to_dict(),
        "model_identity": {"architecture": config.architecture, "num_classes": 10, "image_size": 32},
        "model": net.state_dict(),
        "ema": ema.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": torch.amp.GradScaler("cpu", enabled=False).state_dict(),
        "rng": capture_rng_state(),
        "data_order": {"seed": config.seed, "next_epoch": 1, "batch_size": config.batch_size},
        "history": history,
    }
    return new_model, state


def checkpoint_round_trip(manager, state: dict, new_model, repeats: int) -> dict:
    from cifar10_kfp.train.checkpoint import state_to_bytes

    size = len(state_to_bytes({"format_version": 1, **state, "epoch": 1, "step": 1}))
    epoch = [0]

    def save():
        epoch[0] += 1
        manager.save(state, epoch=epoch[0], step=epoch[0])

    def load():
        loaded = manager.load_latest()
        new_model().load_state_dict(loaded["model"])

    saved = best_seconds(save, repeats=repeats, warmup=1)
    loaded = best_seconds(load, repeats=repeats, warmup=1)
    return {
        "bytes": size,
        "save": saved,
        "load": loaded,
        "save_mb_per_s": size / MB / saved["best_s"],
        "load_mb_per_s": size / MB / loaded["best_s"],
    }


def file_round_trip(store, source: Path, target_uri: str, back: Path, repeats: int) -> dict:
    size = source.stat().st_size
    put = best_seconds(lambda: store.put_file(source, target_uri), repeats=repeats, warmup=1)
    get = best_seconds(lambda: store.get_file(target_uri, back), repeats=repeats, warmup=1)
    return {
        "bytes": size,
        "put": put,
        "get": get,
        "put_mb_per_s": size / MB / put["best_s"],
        "get_mb_per_s": size / MB / get["best_s"],
    }


def run(ctx: BenchContext) -> dict:
    from cifar10_kfp.data.format import save_prepared
    from cifar10_kfp.storage import ObjectStore, StorageConfig
    from cifar10_kfp.storage.embedded import EmbeddedObjectStore
    from cifar10_kfp.train.checkpoint import CheckpointManager

    repeats = ctx.pick(smoke=1, quick=3, full=5)
    file_repeats = ctx.pick(smoke=1, quick=2, full=3)  # the full dataset file is ~185 MB per transfer
    new_model, state = realistic_training_state("fast")
    dataset = ctx.dataset(max_train=ctx.pick(smoke=0, quick=10_000, full=0), max_test=ctx.pick(0, 1_000, 0))

    with scratch_dir(ctx, "storage") as tmp:
        tmp = Path(tmp)
        data_file = save_prepared(dataset, tmp / "dataset.safetensors")
        local_store = ObjectStore(StorageConfig.from_env({}))  # no endpoint: local paths only
        local_ckpt = checkpoint_round_trip(
            CheckpointManager(str(tmp / "ckpt-local"), keep=2, store=local_store), state, new_model, repeats
        )
        local_file = file_round_trip(
            local_store, data_file, str(tmp / "copy" / "d.safetensors"), tmp / "b1", file_repeats
        )

        t0 = time.perf_counter()
        server = EmbeddedObjectStore(tmp / "s3", start_timeout_s=120)
        with server:
            start_s = time.perf_counter() - t0
            store = server.store(CIFAR10_KFP_PREFIX="bench/")
            s3_ckpt = checkpoint_round_trip(
                CheckpointManager(store.root_uri("checkpoints", "bench"), keep=2, store=store),
                state,
                new_model,
                repeats,
            )
            s3_file = file_round_trip(
                store, data_file, store.root_uri("prepared", "d.safetensors"), tmp / "b2", file_repeats
            )

    mb = s3_ckpt["bytes"] / MB
    rows = [
        row(
            f"checkpoint save + upload ({mb:.1f} MB, `fast` preset state)",
            s3_ckpt["save_mb_per_s"],
            local_ckpt["save_mb_per_s"],
            unit="MB/s",
            target="report (vs local disk)",
        ),
        row(
            "checkpoint download + verify + load",
            s3_ckpt["load_mb_per_s"],
            local_ckpt["load_mb_per_s"],
            unit="MB/s",
            target="report (vs local disk)",
        ),
        row(
            f"prepared dataset upload ({s3_file['bytes'] / MB:.1f} MB, sha256 recorded)",
            s3_file["put_mb_per_s"],
            local_file["put_mb_per_s"],
            unit="MB/s",
            target="report (vs local disk)",
        ),
        row(
            "prepared dataset download + verify",
            s3_file["get_mb_per_s"],
            local_file["get_mb_per_s"],
            unit="MB/s",
            target="report (vs local disk)",
        ),
    ]
    notes = [
        "Ours = the embedded SeaweedFS S3 server on 127.0.0.1 through the product's `ObjectStore`/"
        "`CheckpointManager`; baseline = the same calls on a local directory. Ratio < 1 means the object store "
        "is slower than the local disk.",
        f"Checkpoint: {mb:.1f} MB per save (weights + momentum + EMA + RNG + history); save = serialise + sha256 + "
        f"upload + pointer + prune; load = pointer + download + sha256 check + `torch.load(weights_only=True)` + "
        f"`load_state_dict`. Best of {repeats} after a warm-up.",
        f"Per checkpoint on the object store: save {s3_ckpt['save']['best_s'] * 1000:.0f} ms, load "
        f"{s3_ckpt['load']['best_s'] * 1000:.0f} ms (local disk: {local_ckpt['save']['best_s'] * 1000:.0f} / "
        f"{local_ckpt['load']['best_s'] * 1000:.0f} ms). Saves run synchronously in the training process, so a "
        "run pays the save time once per checkpoint (`checkpoint_every` epochs).",
        f"Embedded server start-up (process start to first successful write): {start_s:.1f} s.",
    ]
    details = {
        "checkpoint": {"object_store": s3_ckpt, "local_disk": local_ckpt},
        "dataset_file": {"object_store": s3_file, "local_disk": local_file},
        "embedded_server_start_s": start_s,
    }
    return section("Object store", rows, details=details, notes=notes)
