"""Run the benchmark suite and write ``RESULTS.md``, ``results.json`` and plots.

    python -m benchmarks.run                  # the full CPU suite (`make bench`, ~35-45 min on 2 cores)
    python -m benchmarks.run --quick          # every measurement at a smaller size (`make bench-quick`)
    python -m benchmarks.run --only datapath --only storage
    python -m benchmarks.run --smoke --archive tiny.tar.gz --output-dir /tmp/b   # plumbing only (tests)
    python -m benchmarks.run --list

Each benchmark runs in this process, one after the other, so their ratios come from the same
machine state. A benchmark that cannot run here (no real archive, no GPU) is recorded as
skipped with the reason; one that fails is recorded as an error with the last lines of its
traceback, and the others still run (exit status 1). Sections already in ``results.json`` for
benchmarks this run does not (or not yet) measure are kept, each labelled with the size and date
it was measured at, so ``--only`` re-runs one benchmark and an interrupted run still leaves a
whole table; ``results.json`` and ``RESULTS.md`` are rewritten after every benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import (
    DEFAULT_ARCHIVE,
    ROOT,
    SIZES,
    WORK_DIR,
    BenchContext,
    Skip,
    machine_info,
    relative_paths,
    render_markdown,
    row,
    section,
    write_json,
)

GPU_SCRIPT = "benchmarks/gpu_time_to_94.py"
GPU_COMMAND = f"python {GPU_SCRIPT} --archive ../shared/datasets/cifar10-jpeg.tar.gz --runs 5 --json gpu_time_to_94.json"


# ------------------------------------------------------------------------- adapters
# Benchmarks written by other parts of the project (bench_train.py, bench_preprocess.py) return
# dicts in their own shape; these adapters call them and turn the result into a section.


def _as_section(raw: dict, title: str) -> dict:
    """A benchmark that already returns a section is used as is; anything else is kept as details."""
    if isinstance(raw, dict) and "rows" in raw and "status" in raw:
        raw.setdefault("title", title)
        return raw
    return {
        "title": title,
        "status": "ok",
        "reason": "",
        "rows": [],
        "details": raw,
        "notes": [],
        "plots": [],
    }


def bench_gpu(ctx: BenchContext) -> dict:
    """Listed, never run here: the GPU time-to-94% script needs an accelerator."""
    import torch

    exists = (ROOT / GPU_SCRIPT).is_file()
    if not exists:
        raise Skip(f"{GPU_SCRIPT} does not exist yet")
    command = _gpu_command()
    if not torch.cuda.is_available():
        raise Skip(f"needs a CUDA GPU; not run on this machine. On a GPU machine run: `{command}`")
    raise Skip(f"a GPU is present but this suite does not run the GPU script; run it directly: `{command}`")


def _gpu_command() -> str:
    return GPU_COMMAND


def _module(name: str, *needed: str):
    """Import a benchmark module written by another part of the project, or Skip saying what is missing."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise Skip(f"{name.replace('.', '/')}.py does not exist yet") from None
        raise
    missing = [attr for attr in needed if not hasattr(module, attr)]
    if missing:
        raise Skip(f"{name.replace('.', '/')}.py has no {', '.join(missing)} yet")
    return module


def bench_loop(ctx: BenchContext) -> dict:
    """benchmarks/bench_train.py's ``loop_overhead`` for the seed and cpu presets, on the real images."""
    from benchmarks import bench_train as train_bench  # part of the suite: a missing function is an error

    steps, repeats = ctx.pick(smoke=(1, 1), quick=(10, 2), full=(40, 3))
    data = ctx.prepared_file(
        *ctx.pick(smoke=(0, 0), quick=(10_000, 1_000), full=(0, 0)), min_train=256 * steps
    )
    results = [train_bench.loop_overhead(p, data, steps=steps, repeats=repeats) for p in ("seed", "cpu")]
    rows = [
        row(
            f"training loop vs bare forward+backward+step (`{r['preset']}`: {r['architecture']}, batch "
            f"{r['batch_size']})",
            r["loop_images_per_s"],
            r["bare_images_per_s"],
            unit="img/s",
            target=">= 0.90x",
            met=r["loop_images_per_s"] / r["bare_images_per_s"] >= 0.90,
        )
        for r in results
    ]
    notes = [
        "Loop = `engine.train_one_epoch` (epoch permutation, on-device uint8 gather, flip/translate, normalise, "
        "forward, backward, SGD step, LR schedule, EMA, loss/accuracy bookkeeping); bare = forward + backward + "
        "step of the same model, optimizer and loss on one pre-normalised batch.",
        f"{steps} steps per measurement; bare and loop alternate {repeats} times after a warm-up and the medians "
        "are compared, so a load change on the shared machine hits both (benchmarks/bench_train.py).",
    ]
    return section("Loop efficiency", rows, details={"runs": results}, notes=notes)


def bench_time_to_accuracy(ctx: BenchContext) -> dict:
    """benchmarks/bench_train.py's ``time_to_accuracy``: seed vs cpu preset, plus our plot."""
    from benchmarks import bench_train as train_bench  # part of the suite: a missing function is an error

    budget_min = ctx.pick(smoke=1.0, quick=3.0, full=15.0)
    data = ctx.prepared_file(*ctx.pick(smoke=(0, 0), quick=(5_000, 1_000), full=(0, 0)), min_train=64)
    epochs = ctx.pick(smoke={"seed": 1, "cpu": 1}, quick={"seed": 2, "cpu": 2}, full={})
    overrides = {preset: {"epochs": n} for preset, n in epochs.items()}
    work = ctx.work_dir / f"tta-{ctx.size}"
    result = train_bench.time_to_accuracy(data, work, overrides=overrides, cpu_minutes=budget_min)
    summary, runs = result["summary"], result["runs"]
    budget_s = budget_min * 60
    seed_acc = summary["seed_final_test_acc"]
    reach_s = summary["cpu_reaches_seed_acc_wall_s"]
    speedup = summary["seed_wall_s"] / reach_s if reach_s else None
    reach_cpu = summary.get("cpu_reaches_seed_acc_cpu_s")
    cpu_speedup = summary["seed_cpu_s"] / reach_cpu if reach_cpu else None

    def within_budget(history: list[dict]) -> float | None:
        inside = [r["val_acc"] for r in history if r["elapsed_s"] <= budget_s]
        return max(inside) if inside else None

    rows = [
        row(
            f"wall time to the seed recipe's final test accuracy ({seed_acc:.2%})",
            reach_s,
            summary["seed_wall_s"],
            unit="s",
            ratio=speedup,
            target=">= 3x faster",
            met=speedup is not None and speedup >= 3,
        ),
        row(
            "the same in process CPU seconds (robust to other load on the machine)",
            reach_cpu,
            summary["seed_cpu_s"],
            unit="CPU s",
            ratio=cpu_speedup,
            target=">= 3x faster",
            met=cpu_speedup is not None and cpu_speedup >= 3,
        ),
        row(
            f"best test accuracy within a {budget_min:g}-minute budget (`cpu` vs `seed`)",
            within_budget(runs["cpu"]["history"]),
            within_budget(runs["seed"]["history"]),
            unit="",
            ratio_kind="",
            target="report",
        ),
    ]
    plot = plot_time_to_accuracy(runs, seed_acc, budget_s, ctx.output_dir / "time_to_accuracy.png")
    dataset_note = ctx.pick(
        smoke="the --smoke archive (tiny, synthetic)",
        quick="a 5,000/1,000 train/test slice of the real archive, 2 epochs each (quick)",
        full="the full real archive: 50,000 training images, accuracy on the 10,000 test images after every epoch",
    )
    notes = [
        f"Data: {dataset_note}. `seed` = the original recipe (simple_cnn, SGD 0.01, batch 64, "
        f"{runs['seed']['epochs']} epochs); `cpu` = fast_resnet sized for 2 cores ({runs['cpu']['epochs']} epochs). "
        "Both train in this process one after the other (benchmarks/bench_train.py).",
        f"`seed`: {seed_acc:.2%} after {summary['seed_wall_s'] / 60:.1f} min. `cpu`: "
        + (f"reaches it after {reach_s / 60:.1f} min; " if reach_s else "never reaches it; ")
        + f"final {summary['cpu_final_test_acc']:.2%} after {summary['cpu_wall_s'] / 60:.1f} min.",
        "Process CPU seconds / 2 is what the wall time would be on two dedicated cores; the CPU-seconds row "
        "is the one to trust when the machine was shared during the run.",
    ]
    if summary["cpu_wall_s"] > budget_s or summary["seed_wall_s"] > budget_s:
        notes.append(f"A run went past the {budget_min:g}-minute budget; the budget row counts only epochs "
                     "finished inside it.")  # fmt: skip
    return section("CPU time to accuracy", rows, details=result, notes=notes, plots=[plot.name])


def plot_time_to_accuracy(runs: dict, seed_acc: float, budget_s: float, path: Path) -> Path:
    """Test accuracy (after each epoch) vs wall minutes per preset, the seed's final accuracy and the budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for preset, style in (("seed", "o-"), ("cpu", "s-")):
        history = runs[preset]["history"]
        ax.plot([r["elapsed_s"] / 60 for r in history], [r["val_acc"] for r in history], style,
                label=f"{preset} preset", markersize=4)  # fmt: skip
    ax.axhline(seed_acc, color="gray", linestyle="--", linewidth=1, label=f"seed final ({seed_acc:.1%})")
    ax.axvline(budget_s / 60, color="red", linestyle=":", linewidth=1, label=f"{budget_s / 60:g}-min budget")
    ax.set_xlabel("wall time (minutes)")
    ax.set_ylabel("test accuracy")
    ax.set_title("CIFAR-10 test accuracy vs wall time on this CPU")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _preprocess(ctx: BenchContext) -> dict:
    """The data owner's benchmarks/bench_preprocess.py when it exists, else our own measurement."""
    try:
        module = _module("benchmarks.bench_preprocess", "run")
    except Skip:
        return importlib.import_module("benchmarks.bench_datapath").run_preprocess(ctx)
    ctx.require_archive()
    figures = module.run(quick=ctx.quick, archive=ctx.archive, smoke=ctx.size == "smoke")
    if "skipped" in figures:
        raise Skip(figures["skipped"])
    if "rows" in figures:  # already a section (see common.py)
        return _as_section(figures, "Preprocess")
    n = figures["images"]
    rows = [
        row(
            f"JPEG archive -> prepared dataset, {figures['workers']} decode workers vs one process",
            figures["jpeg_parallel_images_per_s"],
            n / figures["jpeg_serial_s"],
            unit="img/s",
            target="report",
        ),
        row(
            "official pickled format -> prepared dataset",
            figures["official_images_per_s"],
            None,
            unit="img/s",
            target="report",
        ),  # fmt: skip
    ]
    notes = [
        f"{n:,} images (train + test) through `prepare_dataset` (cache off), wall time including reading, "
        "hashing and decompressing the archive (benchmarks/bench_preprocess.py).",
        f"CPU seconds: parallel {figures['jpeg_parallel_cpu_s']:.1f}, one process {figures['jpeg_serial_cpu_s']:.1f}; "
        f"official format {figures['official_cpu_s']:.1f}.",
        "The official-format tarball holds the same decoded pixels in the exact `cifar-10-batches-py` layout; "
        f"its batch reshape takes {figures['reshape_vs_memcpy']:.1f}x a plain memory copy of the same bytes.",
    ]
    return section("Preprocess", rows, details=figures, notes=notes)


def _mine(module_name: str, function: str = "run") -> Callable[[BenchContext], dict]:
    def call(ctx: BenchContext) -> dict:
        return getattr(importlib.import_module(module_name), function)(ctx)

    return call


# name -> (title, what it measures, runner). Order = run order: cheap first, the long training run last.
BENCHMARKS: dict[str, tuple[str, str, Callable[[BenchContext], dict]]] = {
    "datapath": (
        "Data path",
        "images/s delivered to the model: our on-device uint8 path vs torchvision CIFAR10 + DataLoader",
        _mine("benchmarks.bench_datapath"),
    ),
    "preprocess": (
        "Preprocess",
        "decode throughput of the JPEG archive and of the official pickled format",
        _preprocess,
    ),
    "loop": (
        "Loop efficiency",
        "training-loop images/s vs bare forward+backward+step of the same model and batch",
        bench_loop,
    ),
    "storage": (
        "Object store",
        "checkpoint and dataset throughput: embedded S3 server vs local disk",
        _mine("benchmarks.bench_storage"),
    ),
    "data_scale": (
        "Data scale",
        "peak RSS, images/s and s/epoch at 1x/4x/16x a base size: streamed shards beside the in-memory path",
        _mine("benchmarks.bench_data_scale"),
    ),
    "attribution": (
        "Attribution maps",
        "seconds for the report's Integrated Gradients grid vs evaluating the test split, on the CPU",
        _mine("benchmarks.bench_attribution"),
    ),
    "pipeline": (
        "Pipeline overhead",
        "`run-local` (kfp.local) end to end vs the same steps as library calls in one process",
        _mine("benchmarks.bench_pipeline"),
    ),
    "kfp_overhead": (
        "KFP overhead",
        "a tiny training run through kfp.local and through the real KFP 2.17.0 backend on the real node (localcluster)",
        _mine("benchmarks.bench_kfp_overhead"),
    ),
    "tune": (
        "Tuning: TPE + ASHA vs the grid",
        "TPE + ASHA vs the grid on one candidate set: epochs to the grid's best (replays over 3 training x 30 sampler seeds)",
        _mine("benchmarks.bench_tune"),
    ),
    "time_to_accuracy": (
        "CPU time to accuracy",
        "`seed` vs `cpu` preset on the full real dataset: time to the seed's accuracy, accuracy in a budget",
        bench_time_to_accuracy,
    ),
    "gpu_time_to_94": (
        "GPU time to 94%",
        f"`fast` preset to 94% test accuracy on one GPU ({GPU_SCRIPT}; needs a GPU)",
        bench_gpu,
    ),
}


# ------------------------------------------------------------------------- driver


def run_one(name: str, ctx: BenchContext) -> dict:
    title, _, runner = BENCHMARKS[name]
    print(f"[bench] {name}: starting ({ctx.size})", flush=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    try:
        sec = _as_section(runner(ctx), title)
    except Skip as exc:
        sec = {"title": title, "status": "skipped", "reason": str(exc), "rows": [], "notes": [], "plots": []}
    except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others' numbers
        tail = "".join(traceback.format_exception(exc)[-3:]).strip().splitlines()[-1]
        sec = {"title": title, "status": "error", "reason": tail, "rows": [], "notes": [], "plots": []}
        sec["traceback"] = traceback.format_exc()
        print(sec["traceback"], file=sys.stderr, flush=True)
    if ctx.size == "smoke":  # smoke sizes check the plumbing; their numbers say nothing about targets
        for r in sec.get("rows", []):
            r["met"] = None
    sec.update(
        size=ctx.size,
        date_utc=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        wall_s=time.perf_counter() - t0,
        load_before=load_before,
        load_after=[round(x, 2) for x in os.getloadavg()],
    )
    print(f"[bench] {name}: {sec['status']} in {sec['wall_s']:.1f}s {sec.get('reason', '')}", flush=True)
    return sec


def commands(size_flag: str) -> list[tuple[str, str]]:
    return [
        ("make bench", "the full CPU suite (python -m benchmarks.run), writes this file"),
        (
            "make bench-quick",
            "every measurement at a reduced size, a few minutes (python -m benchmarks.run --quick)",
        ),
        (
            f"python -m benchmarks.run{size_flag} --only NAME",
            f"one benchmark; NAME in {', '.join(BENCHMARKS)}",
        ),
        (_gpu_command(), "GPU time to 94% (needs a CUDA GPU; not part of the CPU suite)"),
    ]


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--quick", action="store_true", help="every benchmark at a smaller size (a few minutes)"
    )
    group.add_argument(
        "--smoke", action="store_true", help="smallest sizes: checks the plumbing, numbers mean nothing"
    )
    parser.add_argument("--only", action="append", choices=list(BENCHMARKS), metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}")  # fmt: skip
    parser.add_argument("--output-dir", default=str(ROOT / "benchmarks"), help="where RESULTS.md etc. go")
    parser.add_argument("--archive", default=os.environ.get("CIFAR10_KFP_BENCH_ARCHIVE", str(DEFAULT_ARCHIVE)),
                        help="the real CIFAR-10 JPEG archive (default: ../shared/datasets/cifar10-jpeg.tar.gz)")  # fmt: skip
    parser.add_argument(
        "--work-dir", default=str(WORK_DIR), help="scratch space for decoded data and servers"
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.list:
        for name, (_, what, _) in BENCHMARKS.items():
            print(f"{name:18} {what}")
        return 0
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    assert size in SIZES
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    ctx = BenchContext(
        size=size, archive=Path(args.archive), output_dir=output_dir, work_dir=Path(args.work_dir)
    )
    names = args.only or list(BENCHMARKS)
    results_path = output_dir / "results.json"
    # Sections from the last run stay (labelled with their size and date) until this run replaces
    # them: `--only` reruns update one benchmark, and an interrupted run still leaves a whole table.
    previous = {}
    if results_path.is_file():
        try:
            previous = json.loads(results_path.read_text()).get("benchmarks", {})
        except (ValueError, AttributeError):
            previous = {}

    argv_text = " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    started = time.perf_counter()
    report = {
        "size": size,
        "command": f"python -m benchmarks.run {argv_text}".strip(),
        "machine": machine_info(),
        "archive": os.path.relpath(ctx.archive, ROOT),  # relative to the repo: no machine's own paths
        "benchmarks": {},
    }
    fresh = {}
    for name in names:
        fresh[name] = run_one(name, ctx)
        # write after every benchmark, so a long run that is interrupted still leaves its numbers
        report["benchmarks"] = {
            n: fresh.get(n, previous.get(n)) for n in BENCHMARKS if n in fresh or n in previous
        }
        report["measured_now"] = list(fresh)
        report["total_wall_s"] = time.perf_counter() - started
        report["commands"] = commands(" --quick" if size == "quick" else "")
        write_json(report, results_path)
        (output_dir / "RESULTS.md").write_text(render_markdown(relative_paths(report)))
    print(f"[bench] wrote {output_dir / 'RESULTS.md'} and {results_path}", flush=True)
    return 1 if any(sec["status"] == "error" for sec in fresh.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
