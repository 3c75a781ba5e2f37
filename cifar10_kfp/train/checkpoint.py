"""Exact, verified, atomic training checkpoints in the object store (or a local directory).

Layout under a checkpoint prefix (``s3://...`` or a local path)::

    ckpt-epoch00004.pt                 torch.save of the full training state at the end of epoch 4
    ckpt-epoch00004-step00000700.pt    ... after global step 700, inside epoch 5 (4 epochs done)
    latest.json                        {"key": "ckpt-epoch00004-step00000700.pt", "sha256": "...",
                                        "epoch": 4, "step": 700, ...}

A write uploads the checkpoint object first (its sha256 is recorded with it), then replaces the
small ``latest.json`` pointer, then deletes checkpoints beyond the newest ``keep`` (best effort: a failed
deletion is logged and retried by the next save). A reader
follows the pointer, checks the sha256 of the bytes it got against the pointer, and only then
unpickles with ``torch.load(weights_only=True)``: a crash at any moment leaves either the old or
the new checkpoint in force, never a partial one, and a corrupted object is refused.

The state holds everything needed to continue bit-for-bit: model, optimizer, LR schedule, grad
scaler, EMA, epoch and step, RNG states (torch, CUDA, numpy, python) and the data-order state,
plus the training config and the model identity, which must match to resume. A checkpoint
written inside an epoch also holds the position in it and the epoch's running loss sums.

``CheckpointPolicy`` decides when to write: at the end of every N-th epoch, and (for elastic
and preemptible runs) every N optimiser steps and/or every S seconds inside an epoch.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import re
import time
from dataclasses import dataclass

import numpy as np
import torch

from cifar10_kfp.storage import (
    IntegrityError,
    ObjectNotFound,
    ObjectStore,
    StorageError,
    join_uri,
    open_store,
)

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT_VERSION = 1
POINTER_NAME = "latest.json"
_NAME_RE = re.compile(r"^ckpt-epoch(\d{5,})(?:-step(\d{8,}))?\.pt$")


class CheckpointMismatch(ValueError):
    """The checkpoint was written for another model; resuming from it would be wrong."""


def checkpoint_name(epoch: int, step: int | None = None) -> str:
    """``ckpt-epoch00004.pt`` at an epoch's end; ``ckpt-epoch00004-step00000700.pt`` inside the next one."""
    return f"ckpt-epoch{epoch:05d}.pt" if step is None else f"ckpt-epoch{epoch:05d}-step{step:08d}.pt"


def _name_order(name: str) -> tuple[int, int]:
    """Oldest first: by epochs done, an epoch's end before the steps inside the following epoch."""
    match = _NAME_RE.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a checkpoint file name (ckpt-epochNNNNN[-stepNNNNNNNN].pt)")
    return int(match.group(1)), int(match.group(2)) if match.group(2) else -1


@dataclass(frozen=True)
class CheckpointPolicy:
    """When a training run writes checkpoints (rank 0 decides alone: saving needs no collective)."""

    every_epochs: int = 1  # at the end of every N-th epoch, and always after the last; 0 = the last only
    every_steps: int = 0  # also after every N-th global optimiser step; 0 = off
    every_s: float = (
        0.0  # also when this many seconds passed since the last checkpoint (or the start); 0 = off
    )

    def __post_init__(self) -> None:
        for name in ("every_epochs", "every_steps", "every_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"checkpoint interval {name}={getattr(self, name)!r} must be >= 0")

    def interval_due(self, step: int, since_last_s: float) -> bool:
        """The step or time interval has come round (after global step ``step``)."""
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        return by_steps or (self.every_s > 0 and since_last_s >= self.every_s)

    def epoch_end_due(self, epochs_done: int, is_last: bool) -> bool:
        return is_last or (self.every_epochs > 0 and epochs_done % self.every_epochs == 0)


class CheckpointClock:
    """Seconds since the last checkpoint this process wrote or resumed from."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def since_last_s(self) -> float:
        return time.monotonic() - self.last

    def reset(self) -> None:
        self.last = time.monotonic()


# ------------------------------------------------------------------------ RNG states


def capture_rng_state() -> dict:
    """All global RNG states as tensors and plain types, so ``weights_only`` loading accepts them."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    python_version, python_state, python_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": [s for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "python": {"version": int(python_version), "state": list(python_state), "gauss": python_gauss},
    }


def restore_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        cuda_states = state["cuda"][: torch.cuda.device_count()]
        for index, cuda_state in enumerate(cuda_states):
            torch.cuda.set_rng_state(cuda_state, index)
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached"],
        )
    )
    python_state = state["python"]
    random.setstate((python_state["version"], tuple(python_state["state"]), python_state["gauss"]))


# -------------------------------------------------------------------- serialisation


def state_to_bytes(state: dict) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def state_from_bytes(data: bytes, *, where: str = "checkpoint") -> dict:
    """Unpickle with ``weights_only=True`` only: a checkpoint can never run code."""
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure here means the bytes are not a valid checkpoint
        raise IntegrityError(f"{where}: not a loadable checkpoint ({type(exc).__name__}: {exc})") from exc


def check_compatible(saved_identity: dict, identity: dict, where: str) -> None:
    """Refuse a checkpoint written for a different model (architecture, classes, size or config)."""
    if saved_identity != identity:
        differences = {
            key: (saved_identity.get(key), identity.get(key))
            for key in sorted(set(saved_identity) | set(identity))
            if saved_identity.get(key) != identity.get(key)
        }
        details = ", ".join(f"{k}: checkpoint {a!r} vs this run {b!r}" for k, (a, b) in differences.items())
        raise CheckpointMismatch(
            f"refusing to resume from {where}: it was written for a different model ({details}). "
            "Use another --checkpoint-uri (or leave it empty for the per-config default), or delete that prefix."
        )


# ------------------------------------------------------------------------ manager


class CheckpointManager:
    """Save/load checkpoints under one prefix; ``uri`` may be ``s3://...`` or a local directory."""

    def __init__(self, uri: str, *, keep: int = 2, store: ObjectStore | None = None):
        if not uri:
            raise ValueError("checkpoint URI must not be empty")
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.uri = str(uri).rstrip("/")
        self.keep = keep
        self.store = store or open_store()

    @property
    def pointer_uri(self) -> str:
        return join_uri(self.uri, POINTER_NAME)

    def save(self, state: dict, *, epoch: int, step: int, mid_epoch: bool = False) -> str:
        """Write one checkpoint atomically, move the pointer, prune old ones; returns its URI.

        ``epoch`` counts the epochs done; ``mid_epoch`` marks a checkpoint taken after global
        step ``step`` inside the following epoch (its name carries the step).
        """
        state = {"format_version": CHECKPOINT_FORMAT_VERSION, **state, "epoch": epoch, "step": step}
        data = state_to_bytes(state)
        name = checkpoint_name(epoch, step if mid_epoch else None)
        target = join_uri(self.uri, name)
        digest = self.store.put_bytes(data, target)
        pointer = {"key": name, "sha256": digest, "epoch": epoch, "step": step, "size": len(data)}
        self.store.put_bytes(json.dumps(pointer, sort_keys=True).encode(), self.pointer_uri)
        self._prune(keep_name=name)
        log.info(
            "checkpoint: epoch %d step %d -> %s (%d bytes, sha256 %s)",
            epoch,
            step,
            target,
            len(data),
            digest[:12],
        )
        return target

    def read_pointer(self) -> dict | None:
        try:
            raw = self.store.get_bytes(self.pointer_uri)
        except ObjectNotFound:
            return None
        try:
            pointer = json.loads(raw)
            if not _NAME_RE.match(pointer["key"]) or not re.fullmatch(r"[0-9a-f]{64}", pointer["sha256"]):
                raise ValueError("bad key or sha256")
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(
                f"checkpoint pointer {self.pointer_uri} is malformed ({exc}); refusing it"
            ) from exc
        return pointer

    def load_latest(self) -> dict | None:
        """The newest checkpoint's state, verified; None when the prefix holds none."""
        pointer = self.read_pointer()
        if pointer is None:
            return None
        where = join_uri(self.uri, pointer["key"])
        data = self.store.get_bytes(where)
        actual = hashlib.sha256(data).hexdigest()
        if actual != pointer["sha256"]:
            raise IntegrityError(
                f"checkpoint {where} is corrupt: sha256 {actual} does not match {pointer['sha256']} recorded in "
                f"{self.pointer_uri}; refusing to resume from it"
            )
        state = state_from_bytes(data, where=where)
        if state.get("format_version") != CHECKPOINT_FORMAT_VERSION:
            raise IntegrityError(
                f"checkpoint {where} has format {state.get('format_version')!r}, expected {CHECKPOINT_FORMAT_VERSION}"
            )
        return state

    def list_checkpoints(self) -> list[str]:
        """Checkpoint object names under the prefix, oldest first."""
        names = []
        for uri in self.store.list(self.uri + "/"):
            name = uri.rstrip("/").rsplit("/", 1)[-1]
            if _NAME_RE.match(name):
                names.append(name)
        return sorted(names, key=_name_order)

    def _prune(self, keep_name: str) -> None:
        """Delete checkpoints beyond the newest ``keep``, best effort.

        Runs after the new checkpoint and its pointer are stored, so a failure here loses
        nothing: it is logged, training goes on, and the next save prunes again (it lists the
        whole prefix, so anything left behind now is deleted then).
        """
        try:
            names = self.list_checkpoints()
            for name in names[: max(0, len(names) - self.keep)]:
                if name != keep_name:
                    self.store.delete(join_uri(self.uri, name))
        except (StorageError, OSError) as exc:
            log.warning(
                "checkpoint: could not prune old checkpoints under %s (%s: %s); the new checkpoint %s is "
                "stored and in force, the next save prunes again",
                self.uri,
                type(exc).__name__,
                exc,
                keep_name,
            )
