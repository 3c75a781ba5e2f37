"""``cifar10-kfp store``: run the embedded S3 server in the foreground."""

from __future__ import annotations

import argparse

HELP = "run the embedded SeaweedFS S3 server in the foreground and print the MINIO_* variables to export"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", default=None, help="where the server keeps its data (default: a temp dir)"
    )


def run(args: argparse.Namespace) -> int:
    from cifar10_kfp.storage import serve_forever

    return serve_forever(args.data_dir)
