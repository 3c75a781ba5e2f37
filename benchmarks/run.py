"""Run the benchmark suite and write ``RESULTS.md``, ``results.json`` and plots.

    python -m benchmarks.run                  # the full CPU suite (`make bench`, ~35-45 min on 2 cores)
    python -m benchmarks.run --quick          # every measurement at a smaller size (`make bench-quick`)
    python -m benchmarks.run --only datapath --only storage
    python -m benchmarks.run --smoke --archive tiny.tar.gz --output-dir /tmp/b   # plumbing only (tests)
    python -m benchmarks.run --list

Each benchmark runs in this process, one after the other, so their ratios come from the same
machine state. A benchmark that cannot run here (no real archive, no GPU) is recorded as
skipped with the reason; one that fails is recorded as an error with the last lines of its
traceback, and the others still run (exit status 1). With ``--only``, the sections already in
``results.json`` for the other benchmarks are kept, each labelled with the size and date it was
measured at, so one benchmark can be re-run without repeating the whole suite.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
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
    render_markdown,
    write_json,
)

GPU_SCRIPT = "benchmarks/gpu_time_to_94.py"
GPU_COMMAND = f"python {GPU_SCRIPT}"


# ------------------------------------------------------------------------- adapters
# Benchmarks written by other parts of the project expose ``run(quick) -> dict`` in their own
# shape; these adapters call them and turn their dict into a section (see common.py).


def _external(module_name: str, **kwargs) -> Callable[[BenchContext], dict]:
    """Call ``module.run`` with ``quick`` (and ``smoke``/``archive``/... when it accepts them)."""

    def call(ctx: BenchContext) -> dict:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                raise Skip(f"{module_name.replace('.', '/')}.py does not exist yet") from None
            raise
        if not hasattr(module, "run"):
            raise Skip(f"{module_name.replace('.', '/')}.py has no run(quick) entry point yet")
        accepted = inspect.signature(module.run).parameters
        offered = {
            "quick": ctx.quick,
            "smoke": ctx.size == "smoke",
            "size": ctx.size,
            "archive": ctx.archive,
            "output_dir": ctx.output_dir,
            "work_dir": ctx.work_dir,
            **kwargs,
        }
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        args = {k: v for k, v in offered.items() if var_kw or k in accepted}
        return module.run(**args)

    return call


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
    """The command the GPU script documents (a line starting with ``Run:`` in its docstring), or the default."""
    try:
        module = importlib.import_module("benchmarks.gpu_time_to_94")
        for line in (module.__doc__ or "").splitlines():
            if line.strip().lower().startswith("run:"):
                return line.split(":", 1)[1].strip().strip("`").strip()
        return getattr(module, "COMMAND", GPU_COMMAND)
    except Exception:  # noqa: BLE001 - importing a GPU script may fail without a GPU stack; fall back
        return GPU_COMMAND


def _from_train_bench(part: str, title: str) -> Callable[[BenchContext], dict]:
    def call(ctx: BenchContext) -> dict:
        raw = _external("benchmarks.bench_train", only=part)(ctx)
        return _as_section(raw, title)

    return call


def _mine(module_name: str, function: str = "run") -> Callable[[BenchContext], dict]:
    def call(ctx: BenchContext) -> dict:
        return getattr(importlib.import_module(module_name), function)(ctx)

    return call


def _preprocess(ctx: BenchContext) -> dict:
    """The data owner's benchmarks/bench_preprocess.py when it exists, else our own measurement."""
    if (ROOT / "benchmarks" / "bench_preprocess.py").is_file():
        return _as_section(_external("benchmarks.bench_preprocess")(ctx), "Preprocess")
    return _mine("benchmarks.bench_datapath", "run_preprocess")(ctx)


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
        _from_train_bench("overhead", "Loop efficiency"),
    ),
    "storage": (
        "Object store",
        "checkpoint and dataset throughput: embedded S3 server vs local disk",
        _mine("benchmarks.bench_storage"),
    ),
    "pipeline": (
        "Pipeline overhead",
        "`run-local` (kfp.local) end to end vs the same steps as library calls in one process",
        _mine("benchmarks.bench_pipeline"),
    ),
    "time_to_accuracy": (
        "CPU time to accuracy",
        "`seed` vs `cpu` preset on the full real dataset: time to the seed's accuracy, accuracy in a budget",
        _from_train_bench("tta", "CPU time to accuracy"),
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
    previous = {}
    if args.only and results_path.is_file():
        previous = json.loads(results_path.read_text()).get("benchmarks", {})

    argv_text = " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    started = time.perf_counter()
    report = {
        "size": size,
        "command": f"python -m benchmarks.run {argv_text}".strip(),
        "machine": machine_info(),
        "archive": str(ctx.archive),
        "benchmarks": {},
    }
    fresh = {}
    for name in names:
        fresh[name] = run_one(name, ctx)
        # write after every benchmark, so a long run that is interrupted still leaves its numbers
        report["benchmarks"] = {
            n: fresh.get(n, previous.get(n)) for n in BENCHMARKS if n in fresh or n in previous
        }
        report["total_wall_s"] = time.perf_counter() - started
        report["commands"] = commands(" --quick" if size == "quick" else "")
        write_json(report, results_path)
        (output_dir / "RESULTS.md").write_text(render_markdown(report))
    print(f"[bench] wrote {output_dir / 'RESULTS.md'} and {results_path}", flush=True)
    return 1 if any(sec["status"] == "error" for sec in fresh.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
