"""``cifar10-kfp compile``: write the pipeline specs (YAML) that the KFP UI uploads."""

from __future__ import annotations

import argparse

from cifar10_kfp_pipelines.commands import common

HELP = (
    "compile cifar10-training, cifar10-sweep and cifar10-tune to pipelines/compiled/*.yaml (or --output-dir)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir", default=None, help="where the YAML files go (default: pipelines/compiled)"
    )
    common.add_policy_flags(parser)
    parser.add_argument(
        "--cache", action="append", default=[], metavar="STEP",
        help="also let KFP cache STEP (download and preprocess always are), e.g. --cache train",
    )  # fmt: skip
    parser.add_argument(
        "--sweep-parallelism",
        type=int,
        default=None,
        help="trials the sweep trains at the same time (default 2)",
    )
    parser.add_argument(
        "--pipeline",
        choices=common.PIPELINES,
        action="append",
        default=None,
        help="compile only this one",
    )


def run(args: argparse.Namespace) -> int:
    from cifar10_kfp_pipelines.catalog import COMPILED_DIR, compile_to, compiled_path

    policy = common.policy_from_args(args)
    output_dir = args.output_dir or COMPILED_DIR
    for name in args.pipeline or common.PIPELINES:
        build = {}
        if name == "sweep" and args.sweep_parallelism is not None:
            build["parallelism"] = args.sweep_parallelism
        path = compile_to(name, compiled_path(name, output_dir), policy, **build)
        print(f"wrote {path}  (image {policy.image})")
    common.warn_if_unpublished_image(policy.image)
    return 0
