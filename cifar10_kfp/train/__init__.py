"""Training: a ``TrainConfig`` and a prepared dataset in, a model directory and its history out.

Modules: ``config`` (the typed configuration and its presets), ``models`` (architectures and the
self-describing model directory), ``inference`` (the one normalisation and prediction rule),
``augment`` (data on the device), ``engine`` (``train``), ``state`` and ``checkpoint`` (what a run
changes, saved exactly and resumed bit for bit), ``outputs`` (what a run leaves behind),
``curves`` (TensorBoard event files), ``distributed`` and ``_worker`` (torchrun, one or many nodes).

The API below loads on first use: importing this package (or ``config``) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cifar10_kfp import lazy_exports

if TYPE_CHECKING:
    from cifar10_kfp.train.config import PRESET_NAMES, PRESETS, TrainConfig, make_config
    from cifar10_kfp.train.curves import tensorboard_uri, training_markdown
    from cifar10_kfp.train.distributed import Rendezvous
    from cifar10_kfp.train.engine import TrainResult, default_checkpoint_uri, train
    from cifar10_kfp.train.inference import SERVED_TTA, Normalize, predict
    from cifar10_kfp.train.models import ModelInfo, available_models, build_model, load_model, save_model

__all__ = [
    "PRESETS", "PRESET_NAMES", "SERVED_TTA", "ModelInfo", "Normalize", "Rendezvous", "TrainConfig", "TrainResult",
    "available_models", "build_model", "default_checkpoint_uri", "load_model", "make_config", "predict",
    "save_model", "tensorboard_uri", "train", "training_markdown",
]  # fmt: skip
__getattr__, __dir__ = lazy_exports(__name__, __file__)
