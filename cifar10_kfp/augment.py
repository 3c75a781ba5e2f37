"""Batched, on-device data path: uint8 images in, normalised (and augmented) floats out.

The whole training set lives on the device as one uint8 tensor. Each step gathers a batch of
indices, applies the augmentations to the uint8 batch with a handful of tensor ops (no
per-image Python, no PIL), then converts to float and normalises. Random numbers come from an
explicit ``torch.Generator`` so the data order and augmentations are a pure function of the
seed and the epoch, which is what makes exact resume and DDP/single-process equivalence work.
"""

from __future__ import annotations

import torch


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The CPU generator that decides one epoch's order and augmentations.

    Seeded from (seed, epoch) alone, so a resumed run regenerates the same stream, and every
    DDP rank draws the same numbers for the global batch and then takes its own slice.
    """
    generator = torch.Generator(device="cpu")
    generator.manual_seed((int(seed) * 1_000_003 + int(epoch) * 7_919) % (2**63 - 1))
    return generator


def random_flip_mask(n: int, generator: torch.Generator) -> torch.Tensor:
    """Bool [n]: which images to mirror left-right (probability 1/2)."""
    return torch.rand(n, generator=generator) < 0.5


def random_shifts(n: int, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Int64 [n, 2]: (dy, dx) offsets uniform in [-max_shift, max_shift]."""
    return torch.randint(-max_shift, max_shift + 1, (n, 2), generator=generator)


def _reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    """Mirror out-of-range indices back into [0, size) like reflect padding (no edge repeat)."""
    index = index.abs()
    return torch.where(index >= size, 2 * (size - 1) - index, index)


def flip(images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mirror the images selected by ``mask`` (N x C x H x W, any dtype)."""
    mask = mask.to(images.device).view(-1, 1, 1, 1)
    return torch.where(mask, images.flip(-1), images)


def translate(images: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Shift every image by its own (dy, dx), filling the border by reflection.

    Equivalent to reflect-padding by ``max_shift`` and taking a random crop, but done as one
    gather on the uint8 batch without materialising a padded copy.
    """
    n, _, height, width = images.shape
    shifts = shifts.to(images.device)
    rows = _reflect(torch.arange(height, device=images.device) + shifts[:, :1], height)  # N x H
    cols = _reflect(torch.arange(width, device=images.device) + shifts[:, 1:], width)  # N x W
    batch = torch.arange(n, device=images.device).view(n, 1, 1)
    out = images[batch, :, rows[:, :, None], cols[:, None, :]]  # N x H x W x C
    return out.permute(0, 3, 1, 2)


class Normalizer:
    """uint8 N x 3 x H x W -> float, (x/255 - mean) / std, in the training dtype and memory format."""

    def __init__(self, mean, std, device: torch.device, channels_last: bool = False):
        self.scale = (1.0 / (255.0 * torch.tensor(std, dtype=torch.float32, device=device))).view(1, -1, 1, 1)
        self.shift = (-torch.tensor(mean, dtype=torch.float32, device=device)).view(1, -1, 1, 1)
        self.shift = self.shift / torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.channels_last = channels_last

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = torch.addcmul(self.shift, images.float(), self.scale)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x


def augment_batch(
    images: torch.Tensor, *, flip_mask: torch.Tensor | None, shifts: torch.Tensor | None
) -> torch.Tensor:
    """Apply the (optional) translate and flip to a uint8 batch."""
    if shifts is not None:
        images = translate(images, shifts)
    if flip_mask is not None:
        images = flip(images, flip_mask)
    return images
