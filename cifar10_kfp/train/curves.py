"""Training curves as TensorBoard event files, next to the run's checkpoints, visible while it trains.

The training process (rank 0) writes one scalar of each per epoch with
``torch.utils.tensorboard.SummaryWriter``: ``train/loss``, ``train/accuracy``, ``val/loss``,
``val/accuracy``, ``lr`` and ``images_per_s``, with the epoch as the step. The writer writes to a
local directory; after every epoch the event files are copied to ``<checkpoint URI>/tensorboard/``
(``tensorboard_uri``), so the curves of a live run are in the object store within an epoch. A
Kubeflow TensorBoard, or ``tensorboard --logdir s3://<bucket>/<prefix>/checkpoints/<run>/tensorboard``
(with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``S3_ENDPOINT`` set from the MINIO_* settings),
shows them; ``cifar10-kfp tensorboard --run RUN`` downloads them and starts one locally. A resumed
run adds a new event file beside the first (TensorBoard merges them).

A failure to copy is logged and training goes on: the curves are a view, not a result.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from cifar10_kfp.storage import ObjectStore, StorageError, is_remote, join_uri, open_store

log = logging.getLogger(__name__)

SUBDIR = "tensorboard"
SCALARS = {  # tag -> history row key
    "train/loss": "train_loss",
    "train/accuracy": "train_acc",
    "val/loss": "val_loss",
    "val/accuracy": "val_acc",
    "lr": "lr",
    "images_per_s": "images_per_s",
}


def tensorboard_uri(checkpoint_uri: str) -> str:
    """Where the event files of the run checkpointing to ``checkpoint_uri`` go ("" without checkpoints)."""
    return join_uri(checkpoint_uri, SUBDIR) if checkpoint_uri else ""


class TrainingCurves:
    """Per-epoch scalars to event files under ``tensorboard_uri(checkpoint_uri)``; a no-op when not ``enabled``."""

    def __init__(self, checkpoint_uri: str, enabled: bool = True, store: ObjectStore | None = None):
        self.uri = tensorboard_uri(checkpoint_uri) if enabled else ""
        self.writer = None
        self._tmp: Path | None = None
        if not self.uri:
            return
        from torch.utils.tensorboard import SummaryWriter

        if is_remote(self.uri):
            self.store: ObjectStore | None = store or open_store()
            self._tmp = Path(tempfile.mkdtemp(prefix="cifar10-kfp-tb-"))
            local_dir = self._tmp
        else:
            self.store, local_dir = None, Path(self.uri)
        self.writer = SummaryWriter(log_dir=str(local_dir))

    def epoch(self, row: dict) -> None:
        """Add one epoch's scalars (a history row of ``training_outputs.epoch_row``) and publish them."""
        if self.writer is None:
            return
        for tag, key in SCALARS.items():
            value = row.get(key)
            if isinstance(value, (int, float)):
                self.writer.add_scalar(tag, float(value), global_step=int(row["epoch"]))
        self.writer.flush()
        self._mirror()

    def _mirror(self) -> None:
        if self.store is None or self._tmp is None:
            return
        try:
            for path in sorted(self._tmp.iterdir()):
                if path.is_file():
                    self.store.put_file(path, join_uri(self.uri, path.name))
        except (StorageError, OSError) as exc:
            log.warning("training curves: could not copy them to %s (%s); training goes on", self.uri, exc)

    def close(self) -> None:
        if self.writer is None:
            return
        self.writer.close()
        self._mirror()
        self.writer = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def training_markdown(metrics: dict, checkpoint_uri: str, history: list[dict]) -> str:
    """The train step's Markdown artifact: the final figures and where the curves and checkpoints are."""
    lines = ["# Training", "", "| metric | value |", "|---|---|"]
    for name in ("val_acc", "val_loss", "train_acc", "train_loss", "images_per_s", "wall_s"):
        if isinstance(metrics.get(name), (int, float)):
            lines.append(f"| {name} | {metrics[name]:.4g} |")
    lines += ["", f"Epochs: {len(history)}. Checkpoints: `{checkpoint_uri or 'none'}`.", ""]
    uri = tensorboard_uri(checkpoint_uri)
    if uri:
        lines += [
            f"Training curves (TensorBoard event files): `{uri}`",
            "",
            f"View them with `cifar10-kfp tensorboard --uri {uri}`, a Kubeflow TensorBoard on that "
            f"location, or `tensorboard --logdir {uri}` with S3_ENDPOINT and AWS credentials set.",
        ]
    return "\n".join(lines) + "\n"
