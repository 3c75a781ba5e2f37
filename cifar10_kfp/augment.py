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
    """Mirror the images selected by ``mask`` (N x C x H x W, any dtype); ``images`` is left as is."""
    if images.device.type == "cpu":
        return _flip_selected_(images.clone(), mask)
    # On CUDA one fused kernel, and no host sync (selecting the images by index would need one).
    mask = mask.to(images.device).view(-1, 1, 1, 1)
    return torch.where(mask, images.flip(-1), images)


def _flip_selected_(images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mirror the selected images of a CPU batch in place: only they are read, reversed and written.

    Half the work of mirroring the whole batch and then choosing per image with ``torch.where``.
    """
    selected = mask.to(images.device).nonzero().squeeze(1)
    return images.index_copy_(0, selected, images.index_select(0, selected).flip(-1))


def translate(images: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Shift every image by its own (dy, dx), filling the border by reflection.

    Equivalent to reflect-padding by ``max_shift`` and taking a random crop. On the CPU that
    is what it does: reflect-pad the uint8 batch with slice copies, then take every image's
    crop with one index over the padded batch's windows (``unfold``). On CUDA it is one gather
    kernel with no padded copy, which needs no host sync to learn the padding size.
    """
    shifts = shifts.to(images.device)
    if images.device.type == "cpu":
        return _translate_padded(images, shifts)
    return _translate_gather(images, shifts)


def _translate_padded(images: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    n, _, height, width = images.shape
    pad = int(shifts.abs().max()) if n else 0
    if pad >= min(height, width):
        raise ValueError(f"shifts up to {pad} pixels do not fit reflection in {height}x{width} images")
    padded = _reflect_pad(images, pad)
    windows = padded.unfold(2, height, 1).unfold(3, width, 1)  # N x C x (2p+1) x (2p+1) x H x W, a view
    return windows[torch.arange(n), :, shifts[:, 0] + pad, shifts[:, 1] + pad]


def _reflect_pad(images: torch.Tensor, pad: int) -> torch.Tensor:
    """``F.pad(images, (pad,) * 4, mode="reflect")`` for uint8 too: one copy plus 4 * pad row/column copies."""
    n, c, height, width = images.shape
    if pad == 0:
        return images
    out = images.new_empty(n, c, height + 2 * pad, width + 2 * pad)
    out[:, :, pad : pad + height, pad : pad + width] = images
    inner = slice(pad, pad + width)
    for k in range(1, pad + 1):  # rows first, then columns over the full height (fills the corners)
        out[:, :, pad - k, inner] = images[:, :, k]
        out[:, :, pad + height - 1 + k, inner] = images[:, :, height - 1 - k]
    for k in range(1, pad + 1):
        out[:, :, :, pad - k] = out[:, :, :, pad + k]
        out[:, :, :, pad + width - 1 + k] = out[:, :, :, pad + width - 1 - k]
    return out


def _translate_gather(images: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    n, _, height, width = images.shape
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
        # One fused pass: uint8 is read, converted, scaled and shifted, and written straight into
        # a fresh buffer in the training memory format (no float or layout intermediate). Fresh
        # each call: autograd keeps the previous batch alive for the backward pass. Without
        # channels_last the output keeps the input's layout, as the unfused version did.
        memory_format = torch.channels_last if self.channels_last else torch.preserve_format
        out = torch.empty_like(images, dtype=torch.float32, memory_format=memory_format)
        return torch.addcmul(self.shift, images, self.scale, out=out)


def augment_batch(
    images: torch.Tensor, *, flip_mask: torch.Tensor | None, shifts: torch.Tensor | None
) -> torch.Tensor:
    """Apply the (optional) translate and flip to a uint8 batch."""
    if shifts is not None:
        images = translate(images, shifts)
    if flip_mask is not None:
        # On the CPU translate returned a fresh batch, so it can be mirrored in place.
        owned = shifts is not None and images.device.type == "cpu"
        images = _flip_selected_(images, flip_mask) if owned else flip(images, flip_mask)
    return images
