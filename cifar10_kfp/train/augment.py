"""Everything that holds data on the device: uint8 images in, normalised (and augmented) floats out.

* ``TrainBatches`` (built by ``training_batches``): the training split on the device as uint8,
  padded once so that each augmented batch (random translate + flip) is a single gather of
  precomputed windows;
* ``DeviceData``: an evaluation split on the device, as it is.

The normalisation to float is ``cifar10_kfp.train.inference.Normalize``, shared with evaluation and serving.

No per-image Python, no PIL. Random numbers come from an explicit ``torch.Generator`` seeded by
(seed, epoch), so the data order and augmentations are a pure function of the seed, the epoch and
the global batch: never of the number of processes. That is what makes exact resume (also in
the middle of an epoch), DDP/single-process equivalence and elastic training work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from cifar10_kfp.train.config import TrainConfig


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


class TrainBatches:
    """The training split on the device, laid out so that every augmented batch is one gather.

    A translate (reflect-pad by ``max_shift``, then crop) and a flip only choose *which*
    H x W window of a padded image the model sees: mirroring the padded image and cropping at
    (dy, -dx) is the same as cropping at (dy, dx) and mirroring. So the split is reflect-padded
    once per run, with a mirrored copy beside it when flipping, and an overlapping
    ``as_strided`` view holds every possible window as one row. A batch is then
    ``index_select`` of its window rows: one pass that writes each output byte once, with no
    padded, shifted or flipped intermediates and no per-image Python, on the CPU and on CUDA.

    The order and augmentations of an epoch are drawn from ``epoch_generator(seed, epoch)``
    in a fixed sequence (permutation, flips, shifts), so they are a pure function of the seed
    and the epoch: exact resume and DDP/single-process equivalence rest on that. The windows
    are stored NHWC when ``channels_last`` (batches come out channels_last, as oneDNN and
    tensor-core convs want them), NCHW otherwise.

    Memory: the padded split, twice with ``flip``: 2 x 1.27 x the uint8 split for CIFAR-10.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        *,
        max_shift: int = 0,
        flip: bool = False,
        channels_last: bool = False,
    ):
        n, _, height, width = images.shape
        if not 0 <= max_shift < min(height, width):
            raise ValueError(
                f"translate={max_shift} does not fit reflection in {height}x{width} images "
                f"(needs 0 <= translate < {min(height, width)})"
            )
        self.labels, self.max_shift, self.flip = labels, max_shift, flip
        self.channels_last = channels_last
        self._n, self._windows, self._offsets = n, *self._build_windows(images)

    def __len__(self) -> int:
        return self._n

    def steps(self, batch_size: int) -> int:
        """Steps in an epoch of global batches of ``batch_size`` (the last partial one dropped)."""
        return self._n // batch_size

    def _build_windows(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """The padded (and mirrored) split, and the overlapping view with one row per window."""
        n, channels, height, width = images.shape
        pad = self.max_shift
        padded = _reflect_pad(images, pad)
        if self.channels_last:
            padded = padded.permute(0, 2, 3, 1)  # N x Hp x Wp x C
        copies = 2 if self.flip else 1
        store = images.new_empty((copies * n, *padded.shape[1:]))
        store[:n] = padded
        if self.flip:
            store[n:] = store[:n].flip(2 if self.channels_last else 3)
        image_stride = store.stride(0)
        if self.channels_last:  # row m of the view starts at element m (a pixel's first channel)
            shape, strides = (height, width, channels), (store.stride(1), store.stride(2), 1)
            row_step, col_step = store.stride(1), store.stride(2)
        else:
            shape, strides = (channels, height, width), (store.stride(1), store.stride(2), 1)
            row_step, col_step = store.stride(2), 1
        last_element = sum((size - 1) * stride for size, stride in zip(shape, strides))
        windows = store.as_strided((store.numel() - last_element, *shape), (1, *strides))
        return windows, (image_stride, row_step, col_step)

    def window_rows(self, index: torch.Tensor, flips: torch.Tensor | None, shifts: torch.Tensor | None):
        """The ``_windows`` row of image ``index[i]`` shifted by ``shifts[i]``, mirrored if ``flips[i]``."""
        pad = self.max_shift
        image_stride, row_step, col_step = self._offsets
        dy = dx = torch.full_like(index, pad)
        if shifts is not None:
            if shifts.numel() and int(shifts.abs().max()) > pad:
                raise ValueError(f"shifts up to {int(shifts.abs().max())} pixels exceed translate={pad}")
            dy, dx = shifts[:, 0] + pad, shifts[:, 1] + pad
        image = index
        if flips is not None:
            if not self.flip:
                raise ValueError("flips were drawn but the batches were built with flip=False")
            image = index + flips.long() * self._n
            dx = torch.where(flips, 2 * pad - dx, dx)  # the mirrored copy's window for (dy, dx)
        return image * image_stride + dy * row_step + dx * col_step

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """uint8 N x C x H x W batch of the given window rows (channels_last when built so)."""
        out = self._windows.index_select(0, rows)
        return out.permute(0, 3, 1, 2) if self.channels_last else out

    def epoch_plan(
        self, seed: int, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One epoch's window rows and labels for ``rank``, in step order (its share of every step).

        ``batch_size`` is global: the epoch's draws are made for the global batch, each step's
        slice is split into ``world_size`` near-equal parts (``rank_share``), and rank r takes
        the r-th, so the ranks together see exactly the single-process batches whatever the
        world size. The last partial batch is dropped.
        """
        generator = epoch_generator(seed, epoch)
        steps = len(self) // batch_size
        lo, hi = rank_share(batch_size, rank, world_size)
        order = torch.randperm(len(self), generator=generator)[: steps * batch_size]
        flips = random_flip_mask(len(order), generator) if self.flip else None
        shifts = random_shifts(len(order), self.max_shift, generator) if self.max_shift else None

        def mine(values: torch.Tensor | None) -> torch.Tensor | None:  # this rank's rows, in step order
            if values is None:
                return None
            tail = values.shape[1:]
            return values.view(steps, batch_size, *tail)[:, lo:hi].reshape(-1, *tail)

        index = mine(order)
        assert index is not None  # order is never None
        device = self.labels.device
        rows = self.window_rows(index, mine(flips), mine(shifts)).to(device)
        return rows, self.labels.index_select(0, index.to(device))

    def epoch(
        self, seed: int, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1, start_step: int = 0
    ):
        """Yield one epoch of (uint8 images, labels) for ``rank``, from step ``start_step`` on.

        An epoch has ``len // batch_size`` steps; ``start_step`` skips the ones a mid-epoch
        checkpoint already covers (the draws are the whole epoch's either way).
        """
        # The whole epoch's window rows and labels at once: per step only two slices remain.
        rows, labels = self.epoch_plan(seed, epoch, batch_size, rank, world_size)
        lo, hi = rank_share(batch_size, rank, world_size)
        local = hi - lo
        for i in range(start_step, len(self) // batch_size):
            step = slice(i * local, (i + 1) * local)
            yield self.gather(rows[step]), labels[step]


def rank_share(batch_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """The [lo, hi) part of a global batch that ``rank`` of ``world_size`` trains on.

    Near-equal parts, the first ``batch_size % world_size`` ranks taking one image more (as
    ``torch.tensor_split``): any world size up to the batch works, which elastic training
    needs, and an even split is the plain ``batch_size // world_size`` per rank.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} processes")
    if batch_size < world_size:
        raise ValueError(f"a global batch of {batch_size} images is too small for {world_size} processes")
    base, extra = divmod(batch_size, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


@dataclass
class DeviceData:
    """One split on the device as it is (no augmentation): uint8 images and int64 labels."""

    images: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def from_numpy(cls, images: np.ndarray, labels: np.ndarray, device: torch.device) -> DeviceData:
        return cls(
            torch.from_numpy(np.ascontiguousarray(images)).to(device), torch.from_numpy(labels).to(device)
        )

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batches(self, batch_size: int):
        """(images, labels) slices of ``batch_size``, in order (as ``stream.StreamedSplit.batches``)."""
        for lo in range(0, len(self), batch_size):
            yield self.images[lo : lo + batch_size], self.labels[lo : lo + batch_size]


def training_batches(
    images: np.ndarray, labels: np.ndarray, config: TrainConfig, device: torch.device
) -> TrainBatches:
    """The training split on ``device``, laid out for ``config``'s augmentations and memory format."""
    split = DeviceData.from_numpy(images, labels, device)
    return TrainBatches(
        split.images,
        split.labels,
        max_shift=config.translate,
        flip=config.flip,
        channels_last=config.channels_last,
    )
