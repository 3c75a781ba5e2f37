"""Model registry and the self-describing model directory.

A model directory holds ``model.safetensors`` (weights) and ``model.json`` (architecture
name, its config, class names, normalization stats, image size). ``load_model`` rebuilds a
ready model from it with this module alone, without any training code.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

MODEL_FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "model.json"

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register(name: str):
    """Decorator: make a model builder available by ``name``."""

    def wrap(builder):
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = builder
        return builder

    return wrap


def available_models() -> list[str]:
    return sorted(_REGISTRY)


def build_model(name: str, num_classes: int, image_size: int = 32, **config) -> nn.Module:
    """Build a registered model. ``config`` holds architecture options (e.g. widths)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}: choose one of {available_models()}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    return _REGISTRY[name](num_classes=num_classes, image_size=image_size, **config)


# --------------------------------------------------------------------------- simple_cnn


def _after_conv_pool(size: int) -> int:
    """Spatial size after a 3x3 valid convolution and a 2x2 max-pool."""
    return (size - 2) // 2


@register("simple_cnn")
class SimpleCNN(nn.Module):
    """The original blog recipe's network, with its flatten-size bug fixed.

    conv 3->32 3x3, ReLU, max-pool; conv 32->64 3x3, ReLU, max-pool; fc 128; fc classes.
    For 32x32 input the flatten size is 64*6*6 = 2304 (the recipe hard-coded 9216); for
    other sizes it is computed.
    """

    def __init__(self, num_classes: int, image_size: int = 32, hidden: int = 128):
        super().__init__()
        spatial = _after_conv_pool(_after_conv_pool(image_size))
        if spatial < 1:
            raise ValueError(f"simple_cnn needs image_size >= 10, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.flatten_size = 64 * spatial * spatial
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(self.flatten_size, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


# ---------------------------------------------------------------------- model directory


@dataclass
class ModelInfo:
    """What ``model.json`` holds: enough to rebuild the model and preprocess its input."""

    architecture: str  # registry name
    num_classes: int
    image_size: int  # square input side in pixels
    class_names: list[str]
    mean: list[float]  # per-channel normalization mean, pixel/255 units
    std: list[float]  # per-channel normalization std, pixel/255 units
    model_config: dict = field(default_factory=dict)  # extra kwargs for build_model
    extra: dict = field(default_factory=dict)  # training config, dataset digest, metrics, ...
    format_version: int = MODEL_FORMAT_VERSION


def save_model(model: nn.Module, info: ModelInfo, directory: str | os.PathLike) -> Path:
    """Write ``model.safetensors`` and ``model.json`` into ``directory``."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in _unwrap(model).state_dict().items()}
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".part")
    os.close(fd)
    try:
        save_file(state, tmp, metadata={"architecture": info.architecture})
        os.replace(tmp, directory / WEIGHTS_FILE)
    finally:
        Path(tmp).unlink(missing_ok=True)
    (directory / INFO_FILE).write_text(json.dumps(asdict(info), indent=2, sort_keys=True))
    return directory


def read_model_info(directory: str | os.PathLike) -> ModelInfo:
    raw = json.loads((Path(directory) / INFO_FILE).read_text())
    if raw.get("format_version") != MODEL_FORMAT_VERSION:
        raise ValueError(f"{directory}: model format {raw.get('format_version')!r}, expected {MODEL_FORMAT_VERSION}")
    return ModelInfo(**raw)


def load_model(directory_or_uri: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[nn.Module, ModelInfo]:
    """Rebuild a model from a model directory (local, or ``s3://`` prefix) in eval mode."""
    from safetensors.torch import load_file

    from cifar10_kfp.storage import is_remote, open_store

    if is_remote(directory_or_uri):
        with tempfile.TemporaryDirectory(prefix="cifar10-kfp-model-") as tmp:
            open_store().get_dir(str(directory_or_uri), tmp)
            return load_model(tmp, device)
    directory = Path(directory_or_uri)
    info = read_model_info(directory)
    model = build_model(info.architecture, info.num_classes, info.image_size, **info.model_config)
    state = load_file(str(directory / WEIGHTS_FILE), device="cpu")
    model.load_state_dict(state, strict=True)
    return model.to(device).eval(), info


def _unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP / torch.compile wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)
