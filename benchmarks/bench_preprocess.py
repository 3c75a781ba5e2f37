"""Preprocess speed: the real JPEG archive (parallel vs one process) and the official pickled format.

Run alone: ``.venv/bin/python -m benchmarks.bench_preprocess [--quick]``. Ratios are measured
side by side in one run: parallel decode vs the same decode in one process, and the official
format's reshape vs a plain memory copy of the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARCHIVE = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextmanager
def _workers(value: str | None):
    old = os.environ.get("CIFAR10_KFP_DECODE_WORKERS")
    if value is not None:
        os.environ["CIFAR10_KFP_DECODE_WORKERS"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CIFAR10_KFP_DECODE_WORKERS", None)
        else:
            os.environ["CIFAR10_KFP_DECODE_WORKERS"] = old


def _timed_prepare(archive: Path, max_train: int, max_test: int) -> tuple[float, float, object]:
    from cifar10_kfp.data.preprocess import prepare_dataset

    wall, cpu = time.perf_counter(), _cpu_s()
    dataset, _ = prepare_dataset(
        str(archive), val_fraction=0.0, max_train_samples=max_train, max_test_samples=max_test, cache=False
    )
    return time.perf_counter() - wall, _cpu_s() - cpu, dataset


def _official_archive(dataset, folder: Path) -> Path:
    """The decoded pixels written in the exact official layout (``benchmarks.common.write_cifar10_python``)."""
    from benchmarks.common import tar_directory, write_cifar10_python

    return tar_directory(write_cifar10_python(dataset, folder), folder / "cifar-10-python.tar.gz")


def run(quick: bool = False, archive: Path | None = None, smoke: bool = False) -> dict:
    """A benchmark-suite section: rows (img/s, parallel vs serial) and every measured figure in ``details``."""
    import numpy as np

    from cifar10_kfp.data import official

    archive = Path(archive or DEFAULT_ARCHIVE)
    if not archive.is_file():
        from benchmarks.common import Skip

        raise Skip(f"real CIFAR-10 archive not found at {archive}")
    max_train, max_test = (2000, 500) if smoke else (10000, 2000) if quick else (0, 0)
    parallel_s, parallel_cpu, dataset = _timed_prepare(archive, max_train, max_test)
    with _workers("1"):
        serial_s, serial_cpu, _ = _timed_prepare(archive, max_train, max_test)
    n = len(dataset.train_labels) + len(dataset.test_labels)
    figures = {
        "images": n,
        "jpeg_parallel_s": parallel_s,
        "jpeg_parallel_cpu_s": parallel_cpu,
        "jpeg_parallel_images_per_s": n / parallel_s,
        "jpeg_serial_s": serial_s,
        "jpeg_serial_cpu_s": serial_cpu,
        "parallel_speedup": serial_s / parallel_s,
        "workers": __import__("cifar10_kfp.data.images", fromlist=["x"]).default_workers(),
    }
    with tempfile.TemporaryDirectory(prefix="bench-preprocess-") as tmp:
        official_archive = _official_archive(dataset, Path(tmp))
        official_s, official_cpu, again = _timed_prepare(official_archive, 0, 0)
        assert np.array_equal(again.train_images, dataset.train_images)
    rows = dataset.train_images.reshape(len(dataset.train_images), -1)
    start = time.perf_counter()
    shaped = official.batch_arrays("bench", {"data": rows, "labels": dataset.train_labels.tolist()})[0]
    reshape_s = time.perf_counter() - start
    start = time.perf_counter()
    copied = rows.copy()
    copy_s = time.perf_counter() - start
    assert shaped.shape[0] == copied.shape[0]
    figures.update(
        official_s=official_s,
        official_cpu_s=official_cpu,
        official_images_per_s=n / official_s,
        official_reshape_s=reshape_s,
        memcpy_s=copy_s,
        reshape_vs_memcpy=reshape_s / copy_s if copy_s else None,
    )
    return _section(figures, archive)


def _section(figures: dict, archive: Path) -> dict:
    """The benchmark-suite section (see benchmarks/common.py): headline rows plus every raw figure."""
    from benchmarks.common import row, section

    n, workers = figures["images"], figures["workers"]
    rows = [
        row(
            f"JPEG archive -> uint8 arrays, {workers} worker processes vs 1",
            figures["jpeg_parallel_images_per_s"],
            n / figures["jpeg_serial_s"],
            unit="img/s",
            target="report",
        ),
        row("official pickled format -> uint8 arrays", figures["official_images_per_s"], None, unit="img/s"),
    ]
    notes = [
        f"`prepare_dataset` on {archive.name} ({n:,} images, cache off), wall time including gunzip and tar "
        f"parsing: {figures['jpeg_parallel_s']:.1f} s with {workers} workers ({figures['jpeg_parallel_cpu_s']:.1f} "
        f"CPU-s), {figures['jpeg_serial_s']:.1f} s in one process.",
        f"Official format: the same pixels in the exact cifar-10-batches-py layout, {figures['official_s']:.1f} s; "
        f"the reshape itself takes {figures['official_reshape_s'] * 1e3:.2f} ms (a view) vs "
        f"{figures['memcpy_s'] * 1e3:.1f} ms to copy the same bytes: gunzip and unpickling dominate.",
    ]
    return section("Preprocess", rows, details=figures, notes=notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="10,000 train + 2,000 test images instead of all"
    )
    parser.add_argument("--archive", type=Path, default=None, help="the real CIFAR-10 JPEG archive")
    args = parser.parse_args()
    print(json.dumps(run(quick=args.quick, archive=args.archive), indent=2))


if __name__ == "__main__":
    main()
