"""Decode encoded images (any format Pillow reads) into one uint8 N x 3 x S x S array, in parallel.

Every image becomes RGB (grayscale, palette, RGBA and CMYK convert the way torchvision's
``ImageFolder`` loader does, ``convert("RGB")``, so serving code sees the same pixels) and is
resized to S x S when its size differs (bilinear, antialiased). JPEG decoding uses draft mode,
so big photos are decoded at a reduced scale instead of in full.

This module imports only numpy and Pillow, so worker processes start fast.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from cifar10_kfp.env_settings import env_number
from cifar10_kfp.progress import ProgressMeter

log = logging.getLogger(__name__)

MAX_PIXELS = 64_000_000  # one image above this is rejected rather than decoded (image bombs)
_CHUNK_IMAGES = 4096  # images per worker task: big enough to amortize IPC, small enough to balance
_PARALLEL_MIN = 3000  # below this many images a process pool costs more than it saves


class ImageDecodeError(ValueError):
    """An image could not be decoded; the message names the file."""


def decode_one(name: str, data: bytes, size: int, out: np.ndarray) -> None:
    """Decode one image into ``out`` (uint8 [3, size, size])."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise ImageDecodeError(f"{name}: {width}x{height} pixels is over the {MAX_PIXELS} limit")
            if img.format == "JPEG" and (width > size or height > size):
                img.draft("RGB", (size, size))  # decode at 1/2, 1/4 or 1/8 scale when that still covers size
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
            out[...] = np.asarray(rgb).transpose(2, 0, 1)
    except ImageDecodeError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        # Pillow names the in-memory buffer ("cannot identify image file <_io.BytesIO object at 0x...>");
        # the member name already says which file.
        detail = _BUFFER_REPR.sub("", str(exc)).strip()
        raise ImageDecodeError(f"cannot decode image {name}: {type(exc).__name__}: {detail}") from exc


_BUFFER_REPR = re.compile(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>")


def _decode_chunk(args: tuple[list[str], list[bytes], int, bool]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Decode one chunk; with ``skip``, an undecodable image is listed as ``(index, error)`` instead of raising."""
    names, blobs, size, skip = args
    out = np.empty((len(blobs), 3, size, size), dtype=np.uint8)
    failed = []
    for i, (name, data) in enumerate(zip(names, blobs)):
        try:
            decode_one(name, data, size, out[i])
        except ImageDecodeError as exc:
            if not skip:
                raise
            failed.append((i, str(exc)))
    return out, failed


def _cgroup_cpu_limit() -> int | None:
    """The container's CPU quota (cgroup v2 ``cpu.max`` or v1 ``cfs_quota``), rounded up; None if unlimited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return max(1, -(-int(quota) // int(period)))
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return max(1, -(-quota_us // period_us)) if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def default_workers() -> int:
    """``CIFAR10_KFP_DECODE_WORKERS``, else the CPUs this process may use (affinity and a pod's CPU limit), <= 16."""
    chosen = env_number("CIFAR10_KFP_DECODE_WORKERS", 0, kind=int, allow_zero=True)
    if chosen:
        return chosen
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()  # on Kubernetes the node's CPUs are visible, the pod's limit is not
    if limit is not None:
        cpus = min(cpus, limit)
    return max(1, min(cpus, 16))


def decode_images(
    names: list[str],
    blobs: list[bytes],
    size: int,
    *,
    workers: int | None = None,
    min_parallel: int = _PARALLEL_MIN,
) -> np.ndarray:
    """Decode ``blobs`` (named ``names`` for errors) into uint8 [N, 3, size, size], in input order.

    Uses ``workers`` processes (default ``default_workers()``) when there are at least
    ``min_parallel`` images; fewer are decoded in this process. The first undecodable image
    raises ``ImageDecodeError`` naming it.
    """
    out, _ = _decode_all(names, blobs, size, workers, min_parallel, skip=False)
    return out


def decode_images_skipping(
    names: list[str],
    blobs: list[bytes],
    size: int,
    *,
    workers: int | None = None,
    min_parallel: int = _PARALLEL_MIN,
) -> tuple[np.ndarray, list[int], list[tuple[str, str]]]:
    """``decode_images``, leaving out the images that cannot be decoded.

    Returns the decoded images, the input indices they came from (in order), and one
    ``(name, error)`` per skipped image.
    """
    out, failed = _decode_all(names, blobs, size, workers, min_parallel, skip=True)
    bad = {i for i, _ in failed}
    kept = [i for i in range(len(blobs)) if i not in bad]
    images = out[kept] if bad else out
    return images, kept, [(names[i], error) for i, error in failed]


def _decode_all(names, blobs, size, workers, min_parallel, skip: bool):
    """(uint8 [N, 3, size, size], [(input index, error) of images not decoded]); see ``decode_images``."""
    if len(names) != len(blobs):
        raise ValueError("names and blobs differ in length")
    workers = default_workers() if workers is None else workers
    parallel = workers > 1 and len(blobs) >= min_parallel and _can_start_workers()
    step = min(_CHUNK_IMAGES, -(-len(blobs) // (workers * 2))) if parallel else _CHUNK_IMAGES
    if len(blobs) <= step:
        return _decode_chunk((names, blobs, size, skip))  # small: no meter, no pool
    out = np.empty((len(blobs), 3, size, size), dtype=np.uint8)
    tasks = [(names[i : i + step], blobs[i : i + step], size, skip) for i in range(0, len(blobs), step)]
    with ProgressMeter("decode", len(blobs), unit="img") as meter:
        if parallel:
            try:
                return _decode_in_pool(tasks, workers, out, meter)
            except BrokenProcessPool as exc:  # a worker could not start or was killed (e.g. memory limits)
                log.warning("parallel image decoding failed (%s); decoding in this process instead", exc)
                meter.done = 0
        return _fill(out, map(_decode_chunk, tasks), meter)


def _decode_in_pool(
    tasks: list, workers: int, out: np.ndarray, meter: ProgressMeter
) -> tuple[np.ndarray, list[tuple[int, str]]]:
    import multiprocessing

    # forkserver: no fork of a process that may hold threads (object-store clients, torch) or locks.
    ctx = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        return _fill(out, pool.map(_decode_chunk, tasks), meter)


def _fill(out: np.ndarray, chunks, meter: ProgressMeter) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Copy decoded chunks, in order, into ``out``; collect their failures with indices into ``out``."""
    i = 0
    failed = []
    for chunk, chunk_failed in chunks:
        out[i : i + len(chunk)] = chunk
        failed += [(i + j, error) for j, error in chunk_failed]
        i += len(chunk)
        meter.update(len(chunk))
    return out, failed


def _can_start_workers() -> bool:
    """Worker processes re-import ``__main__``; that fails when it is not a file (stdin, some notebooks)."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    return main_file is None or os.path.isfile(main_file)
