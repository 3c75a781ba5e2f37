"""Data scale: peak memory and speed of preprocess and training as the dataset grows 1x, 4x, 16x.

Image-folder archives of 1x, 4x and 16x a base number of train images are made from the real
CIFAR-10 JPEGs (``../shared/datasets``; the images are the real ones, resized to ``image_size`` by
preprocess). Each goes through the streamed preprocess into shards in a real SeaweedFS store
(``data.preprocess_shards``), beside the single-file preprocess (``prepare_to_file``), then two
epochs of training (``seed`` preset, simple_cnn) with ``data_path="memory"`` and with
``data_path="stream"`` on the same shards. Every measurement runs in a fresh process, whose peak
resident memory after its imports (sampled from /proc every 20 ms) is reported, so that one run's
memory cannot hide in another's.

    python -m benchmarks.run --quick --only data_scale      # what RESULTS.md records
    python -m benchmarks.bench_data_scale --base 500 --image-size 96   # one size table, printed

Targets (issue 39): the streamed path's peak memory stays flat as the data grows (16x within 1.25x
of 1x), its time per epoch grows linearly (16x within 0.8-1.25 of 16 times 1x) and its images per
second are at least 0.90x the in-memory path's; both timings in CPU seconds of the training epochs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from benchmarks.common import ROOT, BenchContext, row, scratch_dir, section

SCALES = (1, 4, 16)
TEST_IMAGES = 200
SHARD_SAMPLES = 512
# What is known of the memory figures (issue 39's flatness target is not met yet); kept until it is.
MEMORY_NOTE = (
    "Memory is not flat yet: the streamed run's peak grows with the data about as much as the in-memory run's "
    "at these sizes. The data it holds is bounded (two shuffle windows of 2048 images, 56 MB each at 96 px, plus "
    "one shard, and 1x is smaller than one window), so most of the growth is elsewhere. Diagnostic runs at 16x "
    "(same machine, same shards): peak 1,520 MB as is, 1,340 MB with MALLOC_MMAP_THRESHOLD_=1048576, so part of it "
    "is glibc keeping freed shard-sized buffers in its heap. Fixing the threshold in-process (mallopt, tried and "
    "reverted) kept the lower peak but cost about 30% of the streamed path's images per CPU second, as torch's "
    "large activation buffers were then mmapped afresh every step; the rest of the growth has not been traced."
)


def make_scaled_archive(source: Path, out: Path, n_train: int, n_test: int = TEST_IMAGES) -> Path:
    """An image-folder tar.gz of the first ``n_train`` train JPEGs (classes interleaved) of the real archive."""
    picked: dict[str, dict[str, list[tuple[str, bytes]]]] = {"train": {}, "test": {}}
    with tarfile.open(source) as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) != 4 or parts[1] not in picked:
                continue
            per_class = picked[parts[1]].setdefault(parts[2], [])
            limit = -(-(n_train if parts[1] == "train" else n_test) // 10)
            if len(per_class) < limit:
                fh = tar.extractfile(member)
                assert fh is not None
                per_class.append((member.name, fh.read()))
    with tarfile.open(out, "w:gz", compresslevel=1) as tar:
        for split, limit in (("train", n_train), ("test", n_test)):
            rows = [item for group in zip(*picked[split].values()) for item in group][:limit]
            for name, data in rows:
                info = tarfile.TarInfo("data/" + "/".join(name.split("/")[1:]))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out


# ------------------------------------------------------------------------- one measurement


class _RssSampler:
    """The process's resident memory every 20 ms, from /proc: its peak after the imports, and where it started.

    ``ru_maxrss`` alone is dominated by the transient peak of importing torch (its CUDA libraries are mapped
    and partly released), which hides what the data adds; this measures from after the imports on.
    """

    def __init__(self) -> None:
        import threading

        self.start_mb = self.peak_mb = self._now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _now() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_mb = max(self.peak_mb, self._now())

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, self._now())
        return {"peak_rss_mb": self.peak_mb, "rss_after_imports_mb": self.start_mb}


def _count_epoch_cpu() -> list[float]:
    """Process CPU seconds (all threads: torch's and the read-ahead's) of each training epoch, as they end.

    Wall time on a shared machine follows the other load; CPU time per epoch follows the work.
    """
    import cifar10_kfp.train.engine as engine

    seconds: list[float] = []
    real = engine.train_one_epoch

    def timed(*args, **kwargs):
        started = time.process_time()
        try:
            return real(*args, **kwargs)
        finally:
            seconds.append(time.process_time() - started)

    engine.train_one_epoch = timed  # type: ignore[assignment]
    return seconds


def _worker(spec: dict) -> dict:
    """Runs in its own process: one preprocess or one training run; returns its figures."""
    import torch  # noqa: F401 - imported before the sampler starts, as training imports it anyway

    from cifar10_kfp.data.preprocess import PrepareParams, prepare_to_file
    from cifar10_kfp.data.preprocess_shards import prepare_to_shards
    from cifar10_kfp.storage import open_store
    from cifar10_kfp.train.engine import train

    store = open_store()
    sampler = _RssSampler()
    params = PrepareParams(val_fraction=0.05, image_size=spec.get("image_size", 32))
    started = time.perf_counter()
    out: dict = {}
    if spec["what"] == "preprocess_stream":
        info = prepare_to_shards(spec["archive"], params=params, store=store, shard_samples=SHARD_SAMPLES)
        out = {"uri": info.uri, "train": info.metadata["sizes"]["train"]}
    elif spec["what"] == "preprocess_file":
        prepare_to_file(spec["archive"], spec["output"], **params.as_dict(), store=store, cache=False)
    else:
        from cifar10_kfp.train.config import make_config

        config = make_config("seed", {"epochs": 2, "progress": False, "data_path": spec["path"],
                                      "shuffle_buffer": 2048, "eval_split": "val"})  # fmt: skip
        cpu_s = _count_epoch_cpu()
        result = train(config, spec["uri"], spec["output"])
        rows = result.history
        out = {"s_per_epoch": [r["train_s"] for r in rows], "images_per_s": [r["images_per_s"] for r in rows],
               "cpu_s_per_epoch": cpu_s, "images": [round(r["images_per_s"] * r["train_s"]) for r in rows]}  # fmt: skip
    out["seconds"] = time.perf_counter() - started
    out.update(sampler.stop(), ru_maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def _measure(spec: dict, env: dict) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_data_scale", "--worker", json.dumps(spec)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{spec['what']} failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_sizes(archive: Path, work: Path, base: int, image_size: int) -> list[dict]:
    from cifar10_kfp.storage.embedded import EmbeddedObjectStore

    server = EmbeddedObjectStore()
    server.start()
    try:
        env = {
            **os.environ,
            **server.env(),
            "CIFAR10_KFP_PREFIX": "bench-data-scale/",
            "PYTHONPATH": str(ROOT),
        }
        results = []
        for scale in SCALES:
            src = make_scaled_archive(archive, work / f"x{scale}.tar.gz", base * scale)
            common = {"archive": str(src), "image_size": image_size}
            stream_prep = _measure({**common, "what": "preprocess_stream"}, env)
            file_prep = _measure(
                {**common, "what": "preprocess_file", "output": str(work / f"x{scale}.st")}, env
            )
            trained = {
                path: _measure(
                    {
                        "what": "train",
                        "path": path,
                        "uri": stream_prep["uri"],
                        "output": str(work / f"out-{path}-{scale}"),
                    },
                    env,
                )  # fmt: skip
                for path in ("memory", "stream")
            }
            results.append({"scale": scale, "train_images": stream_prep["train"], "image_size": image_size,
                            "preprocess_stream": stream_prep, "preprocess_file": file_prep, **trained})  # fmt: skip
            for item in (stream_prep,):
                item.pop("uri", None)  # an address in a store that is gone after the run
    finally:
        server.close()
    return results


# ------------------------------------------------------------------------- the section


def _per_cpu_s(run: dict) -> float:
    return max(n / s for n, s in zip(run["images"], run["cpu_s_per_epoch"]))


def _rows(results: list[dict]) -> list[dict]:
    rows = []
    for r in results:
        label = f"{r['scale']}x ({r['train_images']} train images, {r['image_size']} px)"
        mem, st = r["memory"], r["stream"]
        rows.append(row(f"{label}: preprocess peak RSS, streamed vs single file", r["preprocess_stream"]["peak_rss_mb"],
                        r["preprocess_file"]["peak_rss_mb"], unit="MB"))  # fmt: skip
        rows.append(row(f"{label}: training peak RSS, streamed vs in memory", st["peak_rss_mb"], mem["peak_rss_mb"],
                        unit="MB"))  # fmt: skip
        rows.append(row(f"{label}: s/epoch (wall), streamed vs in memory", min(st["s_per_epoch"]),
                        min(mem["s_per_epoch"]), unit="s"))  # fmt: skip
        rows.append(row(f"{label}: training images/s (wall), streamed vs in memory", max(st["images_per_s"]),
                        max(mem["images_per_s"]), unit="img/s"))  # fmt: skip
        ratio = _per_cpu_s(st) / _per_cpu_s(mem)
        rows.append(row(f"{label}: training images per CPU second, streamed vs in memory", _per_cpu_s(st),
                        _per_cpu_s(mem), unit="img/CPU s", target=">= 0.90x", met=ratio >= 0.90))  # fmt: skip
    first, last = results[0], results[-1]
    growth = last["scale"] / first["scale"]
    flat = last["stream"]["peak_rss_mb"] / first["stream"]["peak_rss_mb"]
    rows.append(row(f"streamed training peak RSS, {last['scale']}x vs {first['scale']}x", last["stream"]["peak_rss_mb"],
                    first["stream"]["peak_rss_mb"], unit="MB", target="<= 1.25x (flat)", met=flat <= 1.25))  # fmt: skip
    one, big = min(first["stream"]["cpu_s_per_epoch"]), min(last["stream"]["cpu_s_per_epoch"])
    rows.append(row(f"streamed CPU s/epoch, {last['scale']}x vs {growth:g} x the {first['scale']}x one", big,
                    growth * one, unit="CPU s", target="0.8-1.25x (linear)",
                    met=0.8 <= big / (growth * one) <= 1.25))  # fmt: skip
    rows.append(
        row(
            f"streamed wall s/epoch, {last['scale']}x vs {growth:g} x the {first['scale']}x one",
            min(last["stream"]["s_per_epoch"]),
            growth * min(first["stream"]["s_per_epoch"]),
            unit="s",
        )
    )
    return rows


def verdict(rows: list[dict]) -> str:
    """One line saying which targets this run met and which it did not."""
    met = [r["measurement"] for r in rows if r["met"] is True]
    missed = [
        f"{r['measurement']} ({r['ratio']:.2f}x, target {r['target']})" for r in rows if r["met"] is False
    ]
    return (f"Targets met: {len(met)} of {len(met) + len(missed)}. Not met: {'; '.join(missed) or 'none'}. "
            "A miss on a machine marked busy below may be the load; rerun on an idle machine before concluding.")  # fmt: skip


def run(ctx: BenchContext) -> dict:
    archive = ctx.require_archive()
    base = ctx.pick(smoke=40, quick=300, full=2000)
    image_size = ctx.pick(smoke=16, quick=96, full=96)
    with scratch_dir(ctx, "data-scale") as tmp:
        results = measure_sizes(archive, Path(tmp), base, image_size)
    notes = [
        f"Archives of {', '.join(f'{s}x' for s in SCALES)} {base} real CIFAR-10 train JPEGs (+{TEST_IMAGES} test), "
        f"preprocessed at {image_size} px into shards of {SHARD_SAMPLES} in an embedded SeaweedFS, and into one file.",
        "Training: `seed` preset (simple_cnn, batch 64), 2 epochs, data_path memory vs stream on the same shards; "
        "s/epoch and images/s are the faster of the two epochs; each run in a fresh process. The targets use CPU "
        "seconds inside the training epochs (all threads, the read-ahead's included), which follow the work and "
        "not the other load on this shared machine; wall figures are reported beside them.",
        "At this size every dataset fits in memory (the largest decodes to well under the machine's memory), so "
        "these numbers show the streamed path's cost and how each path grows, not a dataset larger than memory.",
        "Peak RSS is the measuring process's own, sampled from /proc every 20 ms after torch and our modules are "
        "imported (ru_maxrss alone is the import's transient peak, the same for every size); the decode workers of "
        "either preprocess are other processes and are not counted.",
    ]
    notes.append(MEMORY_NOTE)
    rows = _rows(results)
    if ctx.size == "smoke":  # plumbing only: a smoke size claims no target
        rows = [dict(r, met=None) for r in rows]
    notes.append(verdict(rows))
    return section("Data scale", rows, details={"runs": results, "base": base, "image_size": image_size},
                   notes=notes)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--archive", default=str(ROOT.parent / "shared" / "datasets" / "cifar10-jpeg.tar.gz"))
    parser.add_argument("--base", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=96)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    work = ROOT / "benchmarks" / "_work" / "data-scale"
    work.mkdir(parents=True, exist_ok=True)
    for r in _rows(measure_sizes(Path(args.archive), work, args.base, args.image_size)):
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
