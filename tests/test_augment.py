"""The fast batched augmentations give exactly the bytes of the straightforward implementations.

The references below are the original implementations (one 4-tensor gather for translate,
``torch.where`` over a fully mirrored copy for flip, float + addcmul + layout copy for the
normaliser). Training determinism, exact resume and DDP equivalence depend on the fast ones
producing the same values from the same random draws, so every comparison is ``torch.equal``.
"""

from __future__ import annotations

import pytest
import torch

from cifar10_kfp.augment import (
    Normalizer,
    augment_batch,
    epoch_generator,
    flip,
    random_flip_mask,
    random_shifts,
    translate,
)


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
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _batch(n: int, height: int, width: int, seed: int, channels: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, channels, height, width), dtype=torch.uint8, generator=generator)


SIZES = [(1, 32, 32), (7, 32, 32), (256, 32, 32), (33, 8, 8), (5, 5, 9), (6, 12, 4), (3, 2, 2)]


@pytest.mark.parametrize("n,height,width", SIZES)
@pytest.mark.parametrize("max_shift", [0, 1, 2, 4])
def test_translate_is_bit_identical_to_the_reference(n, height, width, max_shift):
    max_shift = min(max_shift, min(height, width) - 1)  # reflection needs a shift below the size
    images = _batch(n, height, width, seed=n * 100 + max_shift)
    for seed in range(3):
        shifts = random_shifts(n, max_shift, epoch_generator(seed, max_shift))
        out = translate(images, shifts)
        assert out.dtype == torch.uint8 and out.shape == images.shape
        assert torch.equal(out, reference_translate(images, shifts))


@pytest.mark.parametrize("height,width,shift", [(32, 32, 4), (8, 8, 7), (5, 9, 4)])
def test_translate_extreme_and_mixed_shifts(height, width, shift):
    """Every corner of the shift range, zero, and rows where only one axis moves, in one batch."""
    values = [-shift, -1, 0, 1, shift]
    shifts = torch.tensor([(dy, dx) for dy in values for dx in values])
    images = _batch(len(shifts), height, width, seed=shift)
    assert torch.equal(translate(images, shifts), reference_translate(images, shifts))
    zero = torch.zeros(len(shifts), 2, dtype=torch.int64)
    assert torch.equal(translate(images, zero), images)


def test_translate_leaves_its_input_alone_and_handles_other_channel_counts():
    images = _batch(9, 16, 16, seed=1, channels=1)
    before = images.clone()
    shifts = random_shifts(9, 3, epoch_generator(1, 1))
    assert torch.equal(translate(images, shifts), reference_translate(images, shifts))
    assert torch.equal(images, before)


def test_translate_refuses_a_shift_that_reflection_cannot_fill():
    images = _batch(2, 4, 4, seed=0)
    with pytest.raises(ValueError, match="shifts up to 4 pixels"):
        translate(images, torch.tensor([[0, 4], [0, 0]]))


@pytest.mark.parametrize("n", [1, 2, 17, 256])
def test_flip_is_bit_identical_to_the_reference_and_leaves_its_input(n):
    images = _batch(n, 32, 32, seed=n)
    before = images.clone()
    for seed in range(3):
        mask = random_flip_mask(n, epoch_generator(seed, n))
        assert torch.equal(flip(images, mask), reference_flip(images, mask))
    for mask in (torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)):
        assert torch.equal(flip(images, mask), reference_flip(images, mask))
    assert torch.equal(images, before)


@pytest.mark.parametrize(
    "use_flip,use_translate", [(True, True), (True, False), (False, True), (False, False)]
)
def test_augment_batch_is_bit_identical_to_the_reference(use_flip, use_translate):
    images = _batch(64, 32, 32, seed=3)
    before = images.clone()
    generator = epoch_generator(5, 2)
    mask = random_flip_mask(64, generator) if use_flip else None
    shifts = random_shifts(64, 2, generator) if use_translate else None
    expected = images
    if shifts is not None:
        expected = reference_translate(expected, shifts)
    if mask is not None:
        expected = reference_flip(expected, mask)
    assert torch.equal(augment_batch(images, flip_mask=mask, shifts=shifts), expected)
    assert torch.equal(images, before)


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
    normalizer = Normalizer(mean, std, torch.device("cpu"), channels_last=channels_last)
    images = _batch(50, 32, 32, seed=4)
    for batch in (images, reference_translate(images, random_shifts(50, 2, epoch_generator(0, 1)))):
        out = normalizer(batch)
        assert out.dtype == torch.float32
        expected = reference_normalise(batch, mean, std, channels_last)
        assert torch.equal(out, expected) and out.stride() == expected.stride()  # values and layout
