"""The one input normalisation and the one prediction rule, shared by training, evaluation and serving.

* ``Normalize``: uint8 ``[N, 3, H, W]`` pixels -> ``(x/255 - mean) / std`` float32, as an
  ``nn.Module`` so that the TorchScript program (``cifar10_kfp.publish.bundle``) embeds it;
* ``predict``: the logits the served model returns. With ``tta`` (flip test-time augmentation,
  what a published model does) they are the mean of the logits of ``x`` and of its horizontal
  flip. The training loop's validation, ``cifar10_kfp.evaluate``, ``cifar10_kfp.publish.serving`` and the
  TorchScript wrapper all call it, so the accuracy printed during training, the one the gate
  compares and the one a client gets are the same computation (docs/evaluation.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

SERVED_TTA = True  # a published model predicts with flip TTA; its headline accuracy is TTA accuracy
MIN_STD = 1.0 / 255.0  # the smallest channel std Normalize divides by (see there)


class Normalize(nn.Module):
    """uint8 N x 3 x H x W -> float32 ``(x/255 - mean) / std``, in the training memory format.

    ``mean``/``std`` are per channel in pixel/255 units (``ModelInfo.mean``/``std``). The
    constants are computed on ``device`` (so the training path does the same arithmetic wherever
    it runs) and held as buffers, so ``.to()`` and TorchScript carry them.
    """

    scale: torch.Tensor  # buffers, declared so that they type as tensors rather than Tensor | Module
    shift: torch.Tensor

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        device: torch.device | str | None = None,
        channels_last: bool = False,
    ):
        super().__init__()
        # A channel constant over the training images has std 0 (a tiny or synthetic dataset): 1/0
        # would turn every input into inf/NaN. One grey level as the floor maps it to 0 instead, and
        # never changes a real dataset's std (CIFAR-10's is about 0.25).
        std_t = torch.tensor(std, dtype=torch.float32, device=device).clamp(min=MIN_STD).view(1, -1, 1, 1)
        self.register_buffer("scale", (1.0 / (255.0 * std_t.view(-1))).view(1, -1, 1, 1))
        self.register_buffer(
            "shift", (-torch.tensor(mean, dtype=torch.float32, device=device)).view(1, -1, 1, 1) / std_t
        )
        self.channels_last = channels_last
        self._expanded: dict = {}

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # Two vectorised passes over a fresh buffer in the training memory format: a plain
        # uint8 -> float copy, then an in-place multiply-add with scale and shift laid out like
        # the batch, so every operand streams contiguously. (One addcmul straight from uint8
        # casts per element, and per-channel constants broadcast over NHWC defeat
        # vectorisation: each measured 2-5x slower on the CPU.) Fresh each call: autograd keeps
        # the previous batch alive for the backward pass.
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        out = torch.empty(
            images.shape, dtype=torch.float32, device=images.device, memory_format=memory_format
        )
        out.copy_(images)
        scale, shift = self._constants(tuple(images.shape[1:]), memory_format)
        return torch.addcmul(shift, out, scale, out=out)

    def _constants(self, image_shape: tuple, memory_format) -> tuple[torch.Tensor, torch.Tensor]:
        """scale and shift expanded to one whole image in ``memory_format`` (cached per shape)."""
        key = (image_shape, memory_format, self.scale.device)
        cached = None if torch.jit.is_tracing() else self._expanded.get(key)
        if cached is None:  # traced: the expansion must be recorded as ops on the buffers, not cached
            cached = tuple(
                t.expand(1, *image_shape).contiguous(memory_format=memory_format)
                for t in (self.scale, self.shift)
            )
            if not torch.jit.is_tracing():
                self._expanded[key] = cached
        return cached


def predict(model: nn.Module, inputs: torch.Tensor, *, tta: bool = SERVED_TTA) -> torch.Tensor:
    """Float32 logits of normalised ``inputs``; with ``tta`` the mean of the logits of x and flip(x).

    Logits, not softmax, are averaged: the mean of two logit vectors is what a single forward
    pass of the flip-averaged model returns, so serving and evaluation agree on the argmax and
    on the loss.
    """
    return predict_with_single_view(model, inputs, tta=tta)[0]


def predict_with_single_view(
    model: nn.Module, inputs: torch.Tensor, *, tta: bool = SERVED_TTA
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(predict(model, inputs, tta=tta), the logits of the unflipped view)`` from the same forward passes.

    Evaluation reports both; the single view is one of TTA's two passes, so it costs nothing extra.
    """
    logits = model(inputs).float()
    if not tta:
        return logits, logits
    return (logits + model(inputs.flip(-1)).float()) / 2, logits
