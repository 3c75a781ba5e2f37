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
from typing import Any

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


def build_model(name: str, num_classes: int, image_size: int = 32, **config: Any) -> nn.Module:
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


# ------------------------------------------------------------------------- fast_resnet


class _FrozenScaleBatchNorm(nn.BatchNorm2d):
    """BatchNorm whose scale stays 1: only the shift is learned.

    The layer after it is followed by another normalisation, so a learned scale adds a
    redundant degree of freedom; fixing it makes the weights scale-invariant, which lets a
    large learning rate with weak weight decay stay stable. The running statistics use a
    faster momentum than PyTorch's 0.1 because short runs take few steps per epoch.
    """

    def __init__(self, channels: int, momentum: float = 0.4, eps: float = 1e-5):
        super().__init__(channels, momentum=momentum, eps=eps)
        self.weight.requires_grad_(False)


def _conv3x3(c_in: int, c_out: int) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False)


class _Stage(nn.Module):
    """Widen with a 3x3 conv, halve the resolution, then one residual 3x3 conv block."""

    def __init__(self, c_in: int, c_out: int, bn_momentum: float):
        super().__init__()
        self.widen = _conv3x3(c_in, c_out)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = _FrozenScaleBatchNorm(c_out, bn_momentum)
        self.conv = _conv3x3(c_out, c_out)
        self.norm2 = _FrozenScaleBatchNorm(c_out, bn_momentum)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.pool(self.widen(x))))
        return x + self.act(self.norm2(self.conv(x)))


@register("fast_resnet")
class FastResNet(nn.Module):
    """A small residual network built for time-to-accuracy on 32x32 images.

    Layout: a fixed 2x2 "whitening" convolution whose filters are the eigenvectors of the
    training set's 2x2 patch covariance (scaled to unit variance, each filter used with both
    signs so a ReLU-like nonlinearity keeps all the information), then three stages (conv,
    max-pool, BatchNorm, GELU, plus a residual conv block), global max-pool and a linear head
    whose logits are scaled down so the initial softmax is soft. Works for any image size >= 8.

    ``init_whitening(images)`` must be called once with a sample of normalised training images
    before training; the filters are then stored with the weights like any other parameter.
    """

    def __init__(
        self,
        num_classes: int,
        image_size: int = 32,
        widths: tuple[int, int, int] | list[int] = (64, 256, 256),
        bn_momentum: float = 0.4,
        head_scale: float = 1 / 8,
        whiten_trainable: bool = False,
    ):
        super().__init__()
        if len(widths) != 3 or any(int(w) < 1 for w in widths):
            raise ValueError(f"fast_resnet needs three positive widths, got {widths!r}")
        if image_size < 8:
            raise ValueError(f"fast_resnet needs image_size >= 8, got {image_size}")
        widths = [int(w) for w in widths]
        patch = 2
        stem_out = 2 * 3 * patch * patch  # every eigenvector with both signs
        self.whiten = nn.Conv2d(3, stem_out, kernel_size=patch, padding=0, bias=True)
        self.whiten.weight.requires_grad_(whiten_trainable)
        self.stem_act = nn.GELU()
        self.stages = nn.Sequential(
            _Stage(stem_out, widths[0], bn_momentum),
            _Stage(widths[0], widths[1], bn_momentum),
            _Stage(widths[1], widths[2], bn_momentum),
        )
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.head = nn.Linear(widths[2], num_classes, bias=False)
        self.head_scale = head_scale

    @torch.no_grad()
    def init_whitening(self, images: torch.Tensor, eps: float = 5e-4) -> None:
        """Set the stem filters from the patch covariance of ``images`` (float N x 3 x H x W, normalised)."""
        k = self.whiten.kernel_size[0]
        patches = images.float().unfold(2, k, 1).unfold(3, k, 1)  # N, C, H', W', k, k
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, 3 * k * k).double()
        patches = patches - patches.mean(dim=0)
        cov = patches.T @ patches / len(patches)
        eigenvalues, eigenvectors = torch.linalg.eigh(cov)
        filters = (eigenvectors.T / torch.sqrt(eigenvalues + eps)[:, None]).reshape(-1, 3, k, k)
        weight = torch.cat([filters, -filters]).to(self.whiten.weight)
        self.whiten.weight.copy_(weight)
        assert self.whiten.bias is not None  # built with bias=True
        self.whiten.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem_act(self.whiten(x)))
        return self.head(self.pool(x).flatten(1)) * self.head_scale


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
        raise ValueError(
            f"{directory}: model format {raw.get('format_version')!r}, expected {MODEL_FORMAT_VERSION}"
        )
    return ModelInfo(**raw)


def load_model(
    directory_or_uri: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[nn.Module, ModelInfo]:
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
