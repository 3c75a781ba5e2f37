"""``cifar10-kfp submit``: compile a pipeline and start a run on a Kubeflow Pipelines cluster."""

from __future__ import annotations

import argparse

HELP = "start a run of the training (or sweep) pipeline on a KFP cluster and print its URL"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="KFP API URL, e.g. http://localhost:8080")
    parser.add_argument(
        "--namespace", default="kubeflow", help="KFP namespace (your profile in multi-user mode)"
    )
    parser.add_argument("--experiment", default="cifar10-kfp", help="experiment to file the run under")
    parser.add_argument("--pipeline", choices=("training", "sweep"), default="training")
    parser.add_argument("--run-name", default=None, help="display name of the run")
    parser.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="a pipeline parameter"
    )
    parser.add_argument(
        "--image", default=None, help="container image for every step (default: components/image.py's)"
    )
    parser.add_argument(
        "--minio-endpoint", default=None, help="object-store host:port (default seaweedfs.kubeflow:9000)"
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="run every step, even download and preprocess"
    )


def run(args: argparse.Namespace) -> int:
    import time

    from cifar10_kfp_pipelines.commands.compile import policy_from_args
    from cifar10_kfp_pipelines.commands.run_local import parse_params
    from cifar10_kfp_pipelines.kfp_client import (
        compile_for_submit,
        make_client,
        run_url,
        temp_dir,
        typed_arguments,
    )

    arguments = typed_arguments(args.pipeline, parse_params(args.param))
    client = make_client(args.host, args.namespace)
    with temp_dir() as tmp:
        package = compile_for_submit(
            args.pipeline, no_cache=args.no_cache, workdir=tmp, policy=policy_from_args(args)
        )
        result = client.create_run_from_pipeline_package(
            str(package),
            arguments=arguments,
            run_name=args.run_name or f"cifar10-{args.pipeline} {time.strftime('%Y-%m-%d %H:%M:%S')}",
            experiment_name=args.experiment,
            namespace=args.namespace,
            enable_caching=False if args.no_cache else None,
        )
    print(f"run {result.run_id} submitted: {run_url(args.host, result.run_id)}")
    return 0
