"""``cifar10-kfp run-local``: run a pipeline on this machine with kfp.local (what ``make run`` calls)."""

from __future__ import annotations

import argparse

HELP = (
    "run the training or sweep pipeline locally (kfp.local) on an embedded object store, or on MINIO_ENDPOINT"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", choices=("training", "sweep"), default="training")
    parser.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE",
        help="a pipeline parameter, e.g. --param epochs=2 (repeatable; see `compile` output for the list)",
    )  # fmt: skip
    parser.add_argument("--summary-json", default=None, help="also write the run summary to this JSON file")
    parser.add_argument("--output-root", default="local_outputs", help="where kfp.local keeps task outputs")


def parse_params(items: list[str]) -> dict[str, str]:
    """``["a=1", "b=x=y"]`` -> ``{"a": "1", "b": "x=y"}``; a missing '=' is an error naming the item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--param {item!r}: expected KEY=VALUE")
        out[key.strip()] = value
    return out


def run(args: argparse.Namespace) -> int:
    from cifar10_kfp_pipelines.local import format_summary, run_local

    summary = run_local(
        args.pipeline, parse_params(args.param), output_root=args.output_root, summary_json=args.summary_json
    )
    print(format_summary(summary))
    if args.summary_json:
        print(f"summary written to {args.summary_json}")
    return 0 if summary["status"] == "SUCCEEDED" else 1
