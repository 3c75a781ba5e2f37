"""The one-gather training batches give exactly the bytes of the straightforward implementations.

The references below are the original implementations (one 4-tensor gather for translate,
``torch.where`` over a fully mirrored copy for flip, float + addcmul + layout copy for the
normaliser). Training determinism, exact resume and DDP equivalence depend on the fast path
producing the same values from the same random draws, so every comparison is ``torch.equal``.
"""

from __future__ import annotations

import pytest
import torch

from cifar10_kfp.train.augment import (
    TrainBatches,
    epoch_generator,
    random_flip_mask,
    random_shifts,
    rank_share,
)
from cifar10_kfp.train.inference import Normalize


def reference_reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    index = index.abs()
    return torch.where(index >= size, 2 * (size - 1) - index, index)


def reference_translate(images: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    n, _, height, width = images.shape
    rows = reference_reflect(torch.arange(height) + shifts[:, :1], height)
    cols = reference_reflect(torch.arange(width) + shifts[:, 1:], width)
    batch = torch.arange(n).view(n, 1, 1)
    return images[batch, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def reference_flip(images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.view(-1, 1, 1, 1), images.flip(-1), images)


def reference_normalise(images, mean, std, channels_last: bool) -> torch.Tensor:
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    scale = 1.0 / (255.0 * std_t)
    shift = -torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1) / std_t
    x = torch.addcmul(shift, images.float(), scale)
    return x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def _batch(n: int, height: int, width: int, seed: int, channels: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, height, width), dtype=torch.uint8, generator=generator)


SIZES = [(1, 32, 32), (7, 32, 32), (256, 32, 32), (33, 8, 8), (5, 5, 9), (6, 12, 4), (3, 2, 2)]


def _augmented(images, *, shifts=None, flips=None, channels_last=False, index=None):
    """The batch TrainBatches gathers for these draws (all images, in order, unless ``index``)."""
    max_shift = int(shifts.abs().max()) if shifts is not None and shifts.numel() else 0
    batches = TrainBatches(
        images,
        torch.zeros(len(images), dtype=torch.long),
        max_shift=max_shift,
        flip=flips is not None,
        channels_last=channels_last,
    )
    index = torch.arange(len(images)) if index is None else index
    return batches.gather(batches.window_rows(index, flips, shifts))


def _reference(images, *, shifts=None, flips=None, index=None):
    out = images if index is None else images[index]
    if shifts is not None:
        out = reference_translate(out, shifts)
    if flips is not None:
        out = reference_flip(out, flips)
    return out


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("n,height,width", SIZES)
@pytest.mark.parametrize("max_shift", [0, 1, 2, 4])
def test_translate_is_bit_identical_to_the_reference(n, height, width, max_shift, channels_last):
    max_shift = min(max_shift, min(height, width) - 1)  # reflection needs a shift below the size
    images = _batch(n, height, width, seed=n * 100 + max_shift)
    for seed in range(3):
        shifts = random_shifts(n, max_shift, epoch_generator(seed, max_shift))
        out = _augmented(images, shifts=shifts, channels_last=channels_last)
        assert out.dtype == torch.uint8 and out.shape == images.shape
        assert out.is_contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format
        )
        assert torch.equal(out, reference_translate(images, shifts))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("height,width,shift", [(32, 32, 4), (8, 8, 7), (5, 9, 4)])
def test_translate_extreme_and_mixed_shifts(height, width, shift, channels_last):
    """Every corner of the shift range, zero, and rows where only one axis moves, in one batch."""
    values = [-shift, -1, 0, 1, shift]
    shifts = torch.tensor([(dy, dx) for dy in values for dx in values])
    images = _batch(len(shifts), height, width, seed=shift)
    out = _augmented(images, shifts=shifts, channels_last=channels_last)
    assert torch.equal(out, reference_translate(images, shifts))
    flips = torch.arange(len(shifts)) % 2 == 0
    out = _augmented(images, shifts=shifts, flips=flips, channels_last=channels_last)
    assert torch.equal(out, _reference(images, shifts=shifts, flips=flips))


def test_gather_leaves_its_input_alone_and_handles_other_channel_counts():
    images = _batch(9, 16, 16, seed=1, channels=1)
    before = images.clone()
    shifts = random_shifts(9, 3, epoch_generator(1, 1))
    flips = random_flip_mask(9, epoch_generator(1, 2))
    for channels_last in (False, True):
        out = _augmented(images, shifts=shifts, flips=flips, channels_last=channels_last)
        assert torch.equal(out, _reference(images, shifts=shifts, flips=flips))
    assert torch.equal(images, before)


def test_translate_that_reflection_cannot_fill_is_refused_by_name():
    images = _batch(2, 4, 4, seed=0)
    with pytest.raises(ValueError, match="translate=4 does not fit reflection in 4x4 images"):
        TrainBatches(images, torch.zeros(2, dtype=torch.long), max_shift=4)
    batches = TrainBatches(images, torch.zeros(2, dtype=torch.long), max_shift=1)
    with pytest.raises(ValueError, match="shifts up to 2 pixels exceed translate=1"):
        batches.window_rows(torch.arange(2), None, torch.tensor([[0, 2], [0, 0]]))
    with pytest.raises(ValueError, match="flip=False"):
        batches.window_rows(torch.arange(2), torch.tensor([True, False]), None)


@pytest.mark.parametrize("n", [1, 2, 17, 256])
def test_flip_is_bit_identical_to_the_reference(n):
    images = _batch(n, 32, 32, seed=n)
    for seed in range(3):
        mask = random_flip_mask(n, epoch_generator(seed, n))
        assert torch.equal(_augmented(images, flips=mask), reference_flip(images, mask))
    for mask in (torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)):
        assert torch.equal(_augmented(images, flips=mask, channels_last=True), reference_flip(images, mask))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(
    "use_flip,use_translate", [(True, True), (True, False), (False, True), (False, False)]
)
def test_epoch_batches_are_the_reference_augmentations_of_the_epoch_draws(
    use_flip, use_translate, channels_last
):
    """An epoch: permutation, then flips, then shifts from the epoch's generator; last partial batch dropped."""
    images, labels = _batch(70, 8, 8, seed=3), torch.arange(70) * 3
    batches = TrainBatches(
        images, labels, max_shift=2 if use_translate else 0, flip=use_flip, channels_last=channels_last
    )
    generator = epoch_generator(5, 2)
    order = torch.randperm(70, generator=generator)[:64]
    flips = random_flip_mask(64, generator) if use_flip else None
    shifts = random_shifts(64, 2, generator) if use_translate else None
    got = list(batches.epoch(seed=5, epoch=2, batch_size=16))
    assert len(got) == 4
    for i, (batch, batch_labels) in enumerate(got):
        rows = slice(16 * i, 16 * (i + 1))
        expected = _reference(
            images,
            index=order[rows],
            flips=flips[rows] if flips is not None else None,
            shifts=shifts[rows] if shifts is not None else None,
        )
        assert torch.equal(batch, expected) and torch.equal(batch_labels, labels[order[rows]])


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 12])
def test_each_rank_gets_its_share_of_the_single_process_batch(world_size):
    """Rank r's part of step i is the r-th slice of the single-process step i, for any world size.

    The data order is the same whatever the number of processes (elastic training relies on it):
    12 images per step split 12 = 6+6 = 4+4+4 = 3+3+2+2+2 = 1 x 12, in rank order.
    """
    images, labels = _batch(50, 8, 8, seed=9), torch.arange(50)
    batches = TrainBatches(images, labels, max_shift=2, flip=True, channels_last=True)
    single = list(batches.epoch(seed=1, epoch=3, batch_size=12))
    per_rank = [
        list(batches.epoch(seed=1, epoch=3, batch_size=12, rank=r, world_size=world_size))
        for r in range(world_size)
    ]
    for step, (whole, whole_labels) in enumerate(single):
        assert torch.equal(torch.cat([per_rank[r][step][0] for r in range(world_size)]), whole)
        assert torch.equal(torch.cat([per_rank[r][step][1] for r in range(world_size)]), whole_labels)
    assert [len(per_rank[r][0][1]) for r in range(world_size)] == [
        rank_share(12, r, world_size)[1] - rank_share(12, r, world_size)[0] for r in range(world_size)
    ]


def test_an_epoch_can_start_in_its_middle():
    """A mid-epoch resume skips the steps done: the rest are exactly the uninterrupted epoch's."""
    images, labels = _batch(50, 8, 8, seed=4), torch.arange(50)
    batches = TrainBatches(images, labels, max_shift=1, flip=True)
    whole = list(batches.epoch(seed=2, epoch=1, batch_size=8, rank=1, world_size=2))
    rest = list(batches.epoch(seed=2, epoch=1, batch_size=8, rank=1, world_size=2, start_step=4))
    assert len(rest) == len(whole) - 4
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(whole[4:], rest))


def test_rank_shares_cover_the_batch_and_refuse_impossible_worlds():
    for batch, world in [(12, 5), (7, 7), (64, 3), (1, 1)]:
        shares = [rank_share(batch, r, world) for r in range(world)]
        assert shares[0][0] == 0 and shares[-1][1] == batch
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
        assert max(h - lo for lo, h in shares) - min(h - lo for lo, h in shares) <= 1
    with pytest.raises(ValueError, match="global batch of 3 images is too small for 4 processes"):
        rank_share(3, 0, 4)
    with pytest.raises(ValueError, match="rank 2 is outside a world of 2"):
        rank_share(8, 2, 2)


def test_random_draws_are_unchanged():
    """Same calls, same generator consumption: the data order and augmentation streams stay the same."""
    generator = epoch_generator(0, 0)
    order, mask = torch.randperm(10, generator=generator), random_flip_mask(10, generator)
    shifts = random_shifts(10, 2, generator)
    reference = epoch_generator(0, 0)
    assert torch.equal(order, torch.randperm(10, generator=reference))
    assert torch.equal(mask, torch.rand(10, generator=reference) < 0.5)
    assert torch.equal(shifts, torch.randint(-2, 3, (10, 2), generator=reference))


@pytest.mark.parametrize("channels_last", [False, True])
def test_normalizer_is_bit_identical_to_the_reference(channels_last):
    mean, std = [0.4914, 0.4822, 0.4465], [0.247, 0.2435, 0.2616]
    normalizer = Normalize(mean, std, torch.device("cpu"), channels_last=channels_last)
    images = _batch(50, 32, 32, seed=4)
    shifts = random_shifts(50, 2, epoch_generator(0, 1))
    nhwc = _augmented(images, shifts=shifts, channels_last=True)  # what TrainBatches hands over
    for batch in (images, reference_translate(images, shifts), nhwc, images[:, :, 3:19, 5:13]):
        out = normalizer(batch)
        assert out.dtype == torch.float32
        expected = reference_normalise(batch, mean, std, channels_last)
        assert torch.equal(out, expected) and out.stride() == expected.stride()  # values and layout
