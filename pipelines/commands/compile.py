"""``cifar10-kfp compile``: write the pipeline specs (YAML) that the KFP UI uploads."""

from __future__ import annotations

import argparse

HELP = "compile cifar10-training and cifar10-sweep to pipelines/compiled/*.yaml (or --output-dir)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir", default=None, help="where the YAML files go (default: pipelines/compiled)"
    )
    parser.add_argument(
        "--image",
        default=None,
        help="container image for every step (default: components/image.py's reference)",
    )
    parser.add_argument(
        "--minio-endpoint",
        default=None,
        help="object-store host:port the steps use (default seaweedfs.kubeflow:9000)",
    )
    parser.add_argument("--minio-secure", action="store_true", help="the object store speaks TLS")
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
        choices=("training", "sweep"),
        action="append",
        default=None,
        help="compile only this one",
    )


def policy_from_args(args: argparse.Namespace):
    """The default ClusterPolicy with the --image/--minio-endpoint/--minio-secure/--cache options a
    command has (compile has all four; submit and schedule the first two)."""
    from dataclasses import replace

    from cifar10_kfp_pipelines.policy import ClusterPolicy

    policy = ClusterPolicy()
    if args.image:
        policy = replace(policy, image=args.image)
    if args.minio_endpoint:
        policy = replace(policy, minio_endpoint=args.minio_endpoint)
    if getattr(args, "minio_secure", False):
        policy = replace(policy, minio_secure=True)
    if getattr(args, "cache", None):
        policy = policy.with_cached_steps(args.cache)
    return policy


def run(args: argparse.Namespace) -> int:
    from cifar10_kfp_pipelines.catalog import COMPILED_DIR, compile_to, compiled_path

    policy = policy_from_args(args)
    output_dir = args.output_dir or COMPILED_DIR
    for name in args.pipeline or ("training", "sweep"):
        build = {}
        if name == "sweep" and args.sweep_parallelism is not None:
            build["parallelism"] = args.sweep_parallelism
        path = compile_to(name, compiled_path(name, output_dir), policy, **build)
        print(f"wrote {path}  (image {policy.image})")
    return 0
