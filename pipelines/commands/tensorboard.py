"""``cifar10-kfp tensorboard``: a run's training curves, downloaded from the object store, in a local TensorBoard."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from cifar10_kfp_pipelines.commands import common

HELP = (
    "download a run's TensorBoard event files from the object store and start tensorboard on them "
    "(default: the newest run that has some)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run", default=None, help="the run id (see `cifar10-kfp runs [--local]`); default the newest"
    )
    parser.add_argument(
        "--uri", default=None, help="an event-file location (s3://.../tensorboard) instead of a run"
    )
    parser.add_argument(
        "--logdir",
        default=None,
        help="where to put the event files (default local_outputs/tensorboard/<run>)",
    )
    common.add_local_store_flag(parser, "without MINIO_ENDPOINT")
    parser.add_argument("--port", type=int, default=6006, help="tensorboard's port (default 6006)")
    parser.add_argument(
        "--no-serve", "--print-only", dest="serve", action="store_false",
        help="download and print the local directory, do not start tensorboard",
    )  # fmt: skip


def find_curves(store, run: str | None) -> tuple[str, str]:
    """``(run id, event-file URI)`` of ``run``, or of the newest run whose summary names curves."""
    from cifar10_kfp.runs import read_summary, recent_summaries

    if run:
        summary = read_summary(store, run)
        if summary is None:
            raise ValueError(
                f"--run {run!r}: no run summary at {store.root_uri('runs', run, 'summary.json')}"
            )
        uri = (summary.get("artifacts") or {}).get("tensorboard", "")
        if not uri:
            raise ValueError(f"--run {run!r}: its summary names no training curves (did training start?)")
        return run, uri
    for _, summary in recent_summaries(store, limit=50):
        uri = (summary.get("artifacts") or {}).get("tensorboard", "")
        if uri:
            return str(summary.get("run_id", "run")), uri
    raise ValueError(
        f"no run summary under {store.root_uri('runs')} names training curves: pass --run or --uri"
    )


def download_curves(args: argparse.Namespace) -> Path:
    """Fetch the event files into the log directory; returns it."""
    from cifar10_kfp.storage import ObjectStore
    from cifar10_kfp_pipelines.local import DEFAULT_OUTPUT_ROOT, object_store_env

    missing = common.missing_local_store(args.data_dir)
    if missing:
        raise ValueError(missing)
    with object_store_env(args.data_dir):
        store = ObjectStore()
        run, uri = ("uri", args.uri) if args.uri else find_curves(store, args.run)
        logdir = Path(args.logdir or DEFAULT_OUTPUT_ROOT / "tensorboard" / run)
        files = store.get_dir(uri, logdir)
    if not files:
        raise ValueError(f"no event files under {uri}")
    print(f"{len(files)} event file(s) from {uri} in {logdir}")
    return logdir


def run(args: argparse.Namespace) -> int:
    logdir = download_curves(args)
    if not args.serve:
        return 0
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(args.port)]
    print(f"starting tensorboard on http://localhost:{args.port} (Ctrl-C stops it)")
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0
