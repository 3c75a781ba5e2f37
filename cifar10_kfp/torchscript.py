"""The TorchScript program a published version ships: raw uint8 pixels in, logits out.

Kept apart from ``cifar10_kfp.publish`` so that the gate, which only reads the ``latest``
pointer when nothing is published yet, does not pay for importing torch (about a second in
every pipeline task that does).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
from torch import nn

from cifar10_kfp.publish import PublishError

TORCHSCRIPT_ATOL = 1e-4  # max |scripted - eager| logit difference accepted before publishing


class RawImageClassifier(nn.Module):
    """Wraps a classifier so it takes raw uint8 ``[N, 3, H, W]`` pixels and normalizes inside."""

    def __init__(self, model: nn.Module, mean: list[float], std: list[float]):
        super().__init__()
        self.model = model
        # pixel units (0..255), so the forward pass is one subtract and one divide
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model((images.to(torch.float32) - self.mean) / self.std)


def export_torchscript(model: nn.Module, info, path: str | os.PathLike) -> Path:
    """Trace ``RawImageClassifier(model)`` on CPU, save it, and check it against the eager model."""
    wrapped = RawImageClassifier(model.cpu().eval(), info.mean, info.std).eval()
    generator = torch.Generator().manual_seed(0)
    example = torch.randint(
        0, 256, (4, 3, info.image_size, info.image_size), dtype=torch.uint8, generator=generator
    )
    with warnings.catch_warnings():
        # TorchScript is deprecated in favour of torch.export, but it is what Triton's libtorch
        # backend (KServe's PyTorch runtime) loads.
        warnings.simplefilter("ignore", FutureWarning)
        with torch.no_grad():
            # check_trace=False: the check below replaces trace's own re-run check, with another
            # batch size and fresh inputs; trace's check also imports torch.distributed.tensor
            # (~0.4 s of every publish task).
            traced = torch.jit.trace(wrapped, example, check_trace=False)
            check = torch.randint(
                0, 256, (3, 3, info.image_size, info.image_size), dtype=torch.uint8, generator=generator
            )
            diff = (traced(check) - wrapped(check)).abs().max().item()
        if diff > TORCHSCRIPT_ATOL:
            raise PublishError(
                f"TorchScript output differs from the eager model by {diff:g} (> {TORCHSCRIPT_ATOL})"
            )
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.jit.save(traced, str(path))
    return path
