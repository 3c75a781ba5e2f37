"""``cifar10-kfp submit``: compile a pipeline and start a run on a Kubeflow Pipelines cluster."""

from __future__ import annotations

import argparse

from cifar10_kfp_pipelines.commands import common

HELP = "start a run of the training, sweep or tune pipeline on a KFP cluster and print its URL"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_connection_flags(parser)
    parser.add_argument("--experiment", default="cifar10-kfp", help="experiment to file the run under")
    common.add_pipeline_flag(parser)
    parser.add_argument("--run-name", default=None, help="display name of the run")
    common.add_param_flag(parser)
    common.add_policy_flags(parser)
    parser.add_argument(
        "--no-cache", action="store_true", help="run every step, even download and preprocess"
    )


def run(args: argparse.Namespace) -> int:
    import time

    from cifar10_kfp_pipelines.kfp_client import (
        compile_for_submit,
        explained_api_errors,
        make_client,
        run_url,
        temp_dir,
        typed_arguments,
    )

    arguments = typed_arguments(args.pipeline, common.parse_key_values(args.param))
    login = common.login_from_args(args)
    policy = common.policy_from_args(args)
    common.warn_if_unpublished_image(policy.image)
    client = make_client(login, args.namespace)
    with temp_dir() as tmp, explained_api_errors(login, namespace=args.namespace):
        package = compile_for_submit(args.pipeline, no_cache=args.no_cache, workdir=tmp, policy=policy)
        result = client.create_run_from_pipeline_package(
            str(package),
            arguments=arguments,
            run_name=args.run_name or f"cifar10-{args.pipeline} {time.strftime('%Y-%m-%d %H:%M:%S')}",
            experiment_name=args.experiment,
            namespace=args.namespace,
            enable_caching=False if args.no_cache else None,
        )
    print(f"run {result.run_id} submitted: {run_url(login.host, result.run_id)}")
    return 0
