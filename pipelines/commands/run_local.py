"""``cifar10-kfp run-local``: run a pipeline on this machine with kfp.local (what ``make run`` calls)."""

from __future__ import annotations

import argparse

from cifar10_kfp_pipelines.commands import common
from cifar10_kfp_pipelines.local import DEFAULT_OUTPUT_ROOT

HELP = "run the training, sweep or tune pipeline locally (kfp.local) on an embedded object store, or on MINIO_ENDPOINT"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_pipeline_flag(parser)
    common.add_param_flag(
        parser, "a pipeline parameter, e.g. --param epochs=2 (repeatable; see README for the list)"
    )
    parser.add_argument("--summary-json", default=None, help="also write the run summary to this JSON file")
    parser.add_argument(
        "--output-root", default=str(DEFAULT_OUTPUT_ROOT), help="where kfp.local keeps task outputs"
    )
    parser.add_argument(
        "-v", "--verbose", dest="show_all", action="store_true",
        help="print kfp.local's whole output (executor input and outputs, every task line) instead of one "
        "line per task, the progress lines and the summary; the full logs are in <output-root>/<run>/logs/ either way",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from cifar10_kfp_pipelines.local import format_summary, run_local

    summary = run_local(
        args.pipeline,
        common.parse_key_values(args.param),
        output_root=args.output_root,
        summary_json=args.summary_json,
        verbose=args.show_all or getattr(args, "verbose", False),
    )
    print(format_summary(summary))
    if args.summary_json:
        print(f"summary written to {args.summary_json}")
    return 0 if summary["status"] == "SUCCEEDED" else 1
