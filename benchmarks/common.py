"""What every benchmark shares: sizes, the real data, timing, machine info and the report writers.

A benchmark module exposes ``run(ctx: BenchContext) -> dict`` and returns a *section*::

    {"title": str, "status": "ok" | "skipped" | "error", "reason": str,
     "rows": [row(...), ...],      # the headline numbers, one table row each
     "details": {...},             # every raw number, for results.json
     "notes": [str, ...],          # what was measured, how, and what dominates
     "plots": ["file.png", ...]}   # written into ctx.output_dir

Speed claims are ratios of two things measured side by side in the same run on the same
machine; absolute numbers only mean something on the target hardware (a GPU).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import platform
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ARCHIVE = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"
WORK_DIR = ROOT / "benchmarks" / "_work"  # git-ignored scratch space (decoded caches, temp stores)
SIZES = ("smoke", "quick", "full")  # smoke: plumbing only (tests); quick: minutes; full: `make bench`
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class Skip(Exception):  # noqa: N818 - reads as `raise Skip("why")`
    """Raised by a benchmark that cannot run here (no archive, no GPU); the message says why."""


@dataclass
class BenchContext:
    """Where a benchmark finds its inputs and puts its outputs, and how big it should be."""

    size: str  # one of SIZES
    archive: Path  # the real CIFAR-10 JPEG archive (or a tiny one for --smoke)
    output_dir: Path  # RESULTS.md, results.json and plots go here
    work_dir: Path  # scratch; large intermediates, never committed
    _datasets: dict = field(default_factory=dict, repr=False)

    @property
    def quick(self) -> bool:
        return self.size != "full"

    def pick(self, smoke, quick, full):
        """The value for this run's size."""
        return {"smoke": smoke, "quick": quick, "full": full}[self.size]

    def require_archive(self) -> Path:
        if not self.archive.is_file():
            raise Skip(
                f"real CIFAR-10 archive not found at {self.archive}: put cifar10-jpeg.tar.gz in "
                "../shared/datasets/ (see shared/datasets/README.md) or pass --archive PATH"
            )
        return self.archive

    def dataset(self, max_train: int = 0, max_test: int = 0):
        """The archive decoded to a ``PreparedDataset`` (val split empty), cached for the run."""
        key = (max_train, max_test)
        if key not in self._datasets:
            self._datasets[key] = decode_archive(self.require_archive(), max_train, max_test)
        return self._datasets[key]

    def prepared_file(self, max_train: int = 0, max_test: int = 0, *, min_train: int = 0) -> Path:
        """``dataset(max_train, max_test)`` written as a prepared-dataset file in the work dir.

        ``min_train`` tiles a too-small training split (``--smoke`` archives) up to that many
        images, so batch-sized measurements still have whole batches; never used for numbers.
        """
        from cifar10_kfp.data.format import save_prepared

        dataset = self.dataset(max_train, max_test)
        n = len(dataset.train_labels)
        if n < min_train:
            index = np.resize(np.arange(n), min_train)
            dataset = replace(
                dataset, train_images=dataset.train_images[index], train_labels=dataset.train_labels[index]
            )
        path = self.work_dir / f"prepared-{self.size}-{max_train}-{max_test}-{max(n, min_train)}.safetensors"
        return save_prepared(dataset, path)


# ---------------------------------------------------------------------------- rows and sections


def row(
    measurement: str,
    ours: float | None,
    baseline: float | None = None,
    *,
    unit: str = "",
    ratio: float | None = None,
    ratio_kind: str = "x",
    target: str = "",
    met: bool | None = None,
) -> dict:
    """One headline number: ours vs the baseline measured in the same run, and the target."""
    if ratio is None and ours is not None and baseline:
        ratio = ours / baseline
    return {
        "measurement": measurement,
        "ours": ours,
        "baseline": baseline,
        "unit": unit,
        "ratio": ratio,
        "ratio_kind": ratio_kind,  # "x" (times), "%" (overhead percent) or "" (no ratio)
        "target": target,
        "met": met,
    }


def section(title: str, rows=(), details=None, notes=(), plots=()) -> dict:
    return {
        "title": title,
        "status": "ok",
        "reason": "",
        "rows": list(rows),
        "details": details or {},
        "notes": list(notes),
        "plots": list(plots),
    }


# ---------------------------------------------------------------------------- timing


def best_rate(fn: Callable[[], int], *, repeats: int = 3, warmup: int = 1) -> dict:
    """Run ``fn`` (which returns how many items it processed) and report items/s.

    The best of ``repeats`` is the headline (least disturbed by other processes on a shared
    machine); the median and every run are kept as well.
    """
    for _ in range(warmup):
        fn()
    rates, seconds, count = [], [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        count = fn()
        dt = time.perf_counter() - t0
        seconds.append(dt)
        rates.append(count / dt)
    return {
        "best_per_s": max(rates),
        "median_per_s": statistics.median(rates),
        "items": count,
        "seconds": seconds,
    }


def best_seconds(fn: Callable[[], object], *, repeats: int = 3, warmup: int = 1) -> dict:
    """Wall seconds of ``fn``: best (the headline), median and every run."""
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t0)
    return {"best_s": min(seconds), "median_s": statistics.median(seconds), "seconds": seconds}


# ---------------------------------------------------------------------------- machine


def machine_info() -> dict:
    import torch

    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torchvision

        tv_version = torchvision.__version__
    except ImportError:  # pragma: no cover - a dependency
        tv_version = ""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "platform": platform.platform(),
        "cpu": cpu_model or platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": tv_version,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "git_commit": commit,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------- real data


def decode_archive(archive: Path, max_train: int = 0, max_test: int = 0):
    """Decode the JPEG archive into a ``PreparedDataset`` with all training images in ``train``.

    Uses the data package's ``prepare_dataset`` (the product's own decoder) when it exists, so
    the benchmarks exercise what users run; otherwise decodes here with PIL. ``max_*`` = 0
    means the whole split; otherwise a stratified-enough prefix (the archive is class-ordered,
    so the fallback takes every class's first images).
    """
    try:
        from cifar10_kfp.data.preprocess import prepare_dataset
    except ImportError:
        prepare_dataset = None
    if prepare_dataset is not None:
        dataset, _ = prepare_dataset(
            str(archive),
            val_fraction=0.0,
            max_train_samples=max_train,
            max_test_samples=max_test,
            cache=False,
        )
        return dataset
    return _decode_with_pil(archive, max_train, max_test)


def _decode_with_pil(archive: Path, max_train: int, max_test: int):
    from PIL import Image

    from cifar10_kfp.data.format import PreparedDataset

    members: dict[str, dict[str, list]] = {"train": {}, "test": {}}
    with tarfile.open(archive) as tar:
        for member in tar:
            parts = member.name.split("/")
            if (
                not member.isfile()
                or len(parts) != 4
                or parts[1] not in members
                or not parts[3].endswith(".jpg")
            ):
                continue
            with Image.open(io.BytesIO(tar.extractfile(member).read())) as img:
                members[parts[1]].setdefault(parts[2], []).append(
                    np.asarray(img.convert("RGB")).transpose(2, 0, 1)
                )
    class_names = sorted(members["train"])

    def take(split: str, limit: int):
        per_class = members[split]
        quota = -(-limit // len(class_names)) if limit else None
        images, labels = [], []
        for index, name in enumerate(class_names):
            chosen = per_class.get(name, [])[:quota]
            images.extend(chosen)
            labels.extend([index] * len(chosen))
        images, labels = np.stack(images).astype(np.uint8), np.array(labels, dtype=np.int64)
        if limit:
            images, labels = images[:limit], labels[:limit]
        return images, labels

    train_x, train_y = take("train", max_train)
    test_x, test_y = take("test", max_test)
    scaled = train_x.astype(np.float64) / 255
    return PreparedDataset(
        train_images=train_x, train_labels=train_y,
        val_images=train_x[:0], val_labels=train_y[:0],
        test_images=test_x, test_labels=test_y,
        class_names=class_names,
        mean=scaled.mean(axis=(0, 2, 3)).tolist(), std=scaled.std(axis=(0, 2, 3)).tolist(),
        extra={"decoded_by": "benchmarks/common.py (PIL fallback)"},
    )  # fmt: skip


def write_cifar10_python(dataset, root: Path) -> Path:
    """Write ``dataset`` in the official ``cifar-10-batches-py`` layout under ``root``.

    Exactly the official pickled layout (5 training batches, ``test_batch``, ``batches.meta``;
    each batch a dict with ``batch_label``, ``labels``, ``data`` = uint8 rows of 3072 values,
    R plane then G then B, and ``filenames``), so ``torchvision.datasets.CIFAR10`` and our own
    official-format decoder read it exactly as they read the download from Toronto.
    """
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    n_train = len(dataset.train_labels)
    bounds = np.linspace(0, n_train, 6).astype(int)

    def dump(name: str, images: np.ndarray, labels: np.ndarray, batch_label: str) -> None:
        payload = {
            "batch_label": batch_label,
            "labels": [int(v) for v in labels],
            "data": np.ascontiguousarray(images.reshape(len(images), -1), dtype=np.uint8),
            "filenames": [f"{name}_{i:05d}.png" for i in range(len(labels))],
        }
        with open(folder / name, "wb") as fh:
            pickle.dump(payload, fh, protocol=2)

    for i in range(5):
        lo, hi = bounds[i], bounds[i + 1]
        dump(
            f"data_batch_{i + 1}",
            dataset.train_images[lo:hi],
            dataset.train_labels[lo:hi],
            f"training batch {i + 1} of 5",
        )
    dump("test_batch", dataset.test_images, dataset.test_labels, "testing batch 1 of 1")
    meta = {
        "label_names": list(dataset.class_names),
        "num_cases_per_batch": int(bounds[1] - bounds[0]),
        "num_vis": 3072,
    }
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump(meta, fh, protocol=2)
    return folder


def tar_directory(folder: Path, out: Path) -> Path:
    """``folder`` as a gzip tarball whose single top-level entry is ``folder.name`` (like the download)."""
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return out


def make_jpeg_archive(out: Path, per_class_train: int = 8, per_class_test: int = 4, seed: int = 0) -> Path:
    """A tiny archive in the real archive's layout (``cifar10-jpeg/{train,test}/<class>/NNNN.jpg``).

    Real JPEG files of learnable synthetic images (one colour per class): for ``--smoke`` runs
    that check the plumbing where the 60,000-image archive is absent. Never used for numbers.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for split, count in (("train", per_class_train), ("test", per_class_test)):
            for index, name in enumerate(CIFAR10_CLASSES):
                for i in range(count):
                    pixels = rng.integers(0, 80, size=(32, 32, 3), dtype=np.int64)
                    pixels[..., index % 3] += 40 + 15 * index
                    buffer = io.BytesIO()
                    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
                        buffer, format="JPEG", quality=90
                    )
                    info = tarfile.TarInfo(f"cifar10-jpeg/{split}/{name}/{i:04d}.jpg")
                    info.size = buffer.tell()
                    buffer.seek(0)
                    tar.addfile(info, buffer)
    return out


def scratch_dir(ctx: BenchContext, name: str) -> tempfile.TemporaryDirectory:
    """A temporary directory under the work dir (same filesystem as the caches), removed after use."""
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix=f"{name}-", dir=ctx.work_dir)


# ---------------------------------------------------------------------------- writers


def relative_paths(value, root: Path = ROOT):
    """`value` with every absolute path under the repository's folder written relative to the repository
    (``benchmarks/_work/...``, ``../shared/datasets/...``): a report names no path of one machine."""
    if isinstance(value, dict):
        return {key: relative_paths(item, root) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [relative_paths(item, root) for item in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        # the repository itself first, then its parent (where ../shared lives)
        return value.replace(f"{root}/", "").replace(str(root), ".").replace(f"{root.parent}/", "../")
    return value


def write_json(report: dict, path: Path) -> Path:
    text = json.dumps(report, indent=2, sort_keys=False, default=_json_default)
    path.write_text(json.dumps(relative_paths(json.loads(text)), indent=2) + "\n")
    return path


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def fmt_number(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    magnitude = abs(value)
    if magnitude >= 1000:
        text = f"{value:,.0f}"
    elif magnitude >= 100:
        text = f"{value:.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    elif magnitude >= 1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.3f}"
    return f"{text} {unit}".strip()


def fmt_ratio(row_: dict) -> str:
    ratio = row_.get("ratio")
    if ratio is None:
        return "-"
    kind = row_.get("ratio_kind", "x")
    if kind == "%":
        return f"{ratio:+.1f}%"
    if kind == "x":
        return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.0f}x"
    return fmt_number(ratio)


def render_markdown(report: dict) -> str:
    """RESULTS.md: headline table, machine, per-benchmark notes, exact commands."""
    info = report["machine"]
    lines = [
        "<!-- generated by `make bench` (python -m benchmarks.run), do not edit -->",
        "# Benchmark results",
        "",
        "_Generated by `make bench`, do not edit._ "
        f"Size: **{report['size']}**. Date: {info['date_utc']}. Commit: `{info.get('git_commit') or '?'}`. "
        f"Total wall time: {report['total_wall_s'] / 60:.1f} min.",
        "",
        f"Command: `{report['command']}`",
        "",
    ]
    if report["size"] != "full":
        lines += [
            f"> **These are `{report['size']}` results** (every measurement at a reduced size). "
            "The full CPU suite is `make bench`.",
            "",
        ]
    lines += [
        "Ratios are measured side by side in one run on this machine; absolute numbers only count on the target",
        "GPU hardware. Timings on a shared 2-core machine are noisy: the best of several repeats is reported and",
        "every repeat is in `results.json`.",
        "",
        "| Benchmark | Measurement | Ours | Baseline | Ratio | Target | Met |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, sec in report["benchmarks"].items():
        title = sec.get("title", name)
        if name not in report.get("measured_now", report["benchmarks"]):
            title += f" ({sec.get('size', '?')}, earlier run)"
        if sec["status"] != "ok":
            lines.append(f"| {title} | {sec['status']}: {_cell(sec['reason'])} | | | | | |")
            continue
        for r in sec["rows"]:
            met = {True: "yes", False: "**no**", None: "-"}[r.get("met")]
            lines.append(
                f"| {title} | {_cell(r['measurement'])} | {fmt_number(r['ours'], r['unit'])} | "
                f"{fmt_number(r['baseline'], r['unit'])} | {fmt_ratio(r)} | {_cell(r['target']) or '-'} | {met} |"
            )
    busy = [sec.get("title", name) for name, sec in report["benchmarks"].items() if was_busy(sec, info)]
    if busy:
        lines += [
            "",
            f"**Measured on a busy machine** (1-minute load average above {BUSY_LOAD_FACTOR:g}x the "
            f"{info.get('cpu_count')} cores before or after): {', '.join(busy)}. Other processes took CPU time "
            "from these runs, so their absolute numbers are too low and their ratios noisy; rerun them on an idle "
            "machine with `--only NAME`.",
        ]
    lines += ["", "## Machine", ""]
    lines += [f"- {key}: {value}" for key, value in info.items()]
    for name, sec in report["benchmarks"].items():
        lines += ["", f"## {sec.get('title', name)} (`--only {name}`)", ""]
        if sec["status"] != "ok":
            lines.append(f"**{sec['status']}**: {sec['reason']}")
        if name not in report.get("measured_now", report["benchmarks"]):
            lines.append(f"_Kept from an earlier `{sec.get('size', '?')}` run ({sec.get('date_utc', '?')})._")
        lines += [f"- {note}" for note in sec.get("notes", [])]
        for plot in sec.get("plots", []):
            lines += ["", f"![{plot}]({plot})"]
        if sec.get("wall_s") is not None:
            lines += ["", f"Wall time of this benchmark: {sec['wall_s']:.0f} s; load average before/after: "
                      f"{sec.get('load_before')} / {sec.get('load_after')}."]  # fmt: skip
    lines += ["", "## Commands", ""]
    lines += [f"- `{cmd}`: {what}" for cmd, what in report["commands"]]
    return "\n".join(lines) + "\n"


BUSY_LOAD_FACTOR = 1.5


def was_busy(sec: dict, info: dict) -> bool:
    """True when the machine's load average around a benchmark says others were using the CPUs."""
    if sec.get("status") != "ok":
        return False
    cores = info.get("cpu_count") or 1
    loads = [x[0] for x in (sec.get("load_before"), sec.get("load_after")) if x]
    return bool(loads) and max(loads) > BUSY_LOAD_FACTOR * cores


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")
