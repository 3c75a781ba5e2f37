"""``cifar10-kfp schedule``: create, enable, disable or delete a recurring run."""

from __future__ import annotations

import argparse

HELP = "create a recurring run of a pipeline (cron), or --enable/--disable/--delete one by name"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", required=True, help="KFP API URL, e.g. http://localhost:8080")
    parser.add_argument(
        "--namespace", default="kubeflow", help="KFP namespace (your profile in multi-user mode)"
    )
    parser.add_argument("--experiment", default="cifar10-kfp", help="experiment the runs are filed under")
    parser.add_argument("--pipeline", choices=("training", "sweep"), default="training")
    parser.add_argument(
        "--name", default=None, help="recurring run name (default cifar10-<pipeline>-scheduled)"
    )
    parser.add_argument(
        "--cron", default=None, help='6-field cron (seconds first), e.g. "0 0 3 * * *" = 03:00 daily'
    )
    parser.add_argument(
        "--max-concurrency", type=int, default=1, help="runs allowed at the same time (default 1)"
    )
    parser.add_argument("--no-catchup", action="store_true", help="do not backfill runs missed while paused")
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
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--enable", metavar="NAME", help="enable the recurring run NAME")
    action.add_argument("--disable", metavar="NAME", help="disable (pause) the recurring run NAME")
    action.add_argument("--delete", metavar="NAME", help="delete the recurring run NAME")


def _check_cron(cron: str) -> None:
    fields = cron.split()
    if len(fields) != 6:
        raise ValueError(
            f"--cron {cron!r}: KFP wants 6 fields with seconds first, e.g. '0 0 3 * * *' for 03:00 every day"
        )


def run(args: argparse.Namespace) -> int:
    from cifar10_kfp_pipelines.commands.compile import policy_from_args
    from cifar10_kfp_pipelines.commands.run_local import parse_params
    from cifar10_kfp_pipelines.kfp_client import (
        compile_for_submit,
        ensure_experiment,
        find_recurring_run,
        make_client,
        temp_dir,
        typed_arguments,
    )

    client = make_client(args.host, args.namespace)
    for verb, name in (("enable", args.enable), ("disable", args.disable), ("delete", args.delete)):
        if name:
            job = find_recurring_run(client, name, args.namespace)
            getattr(client, f"{verb}_recurring_run")(job.recurring_run_id)
            print(f"{verb}d recurring run {name!r} ({job.recurring_run_id})")
            return 0
    if not args.cron:
        raise ValueError(
            "--cron is required to create a recurring run (or use --enable/--disable/--delete NAME)"
        )
    _check_cron(args.cron)
    if args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency {args.max_concurrency}: use 1 or more")
    name = args.name or f"cifar10-{args.pipeline}-scheduled"
    try:
        find_recurring_run(client, name, args.namespace)
    except ValueError:
        pass
    else:
        raise ValueError(
            f"a recurring run named {name!r} exists: --delete {name} first, or choose another --name"
        )
    params = typed_arguments(args.pipeline, parse_params(args.param))
    experiment_id = ensure_experiment(client, args.experiment, args.namespace)
    with temp_dir() as tmp:
        package = compile_for_submit(
            args.pipeline, no_cache=args.no_cache, workdir=tmp, policy=policy_from_args(args)
        )
        job = client.create_recurring_run(
            experiment_id=experiment_id,
            job_name=name,
            cron_expression=args.cron,
            max_concurrency=args.max_concurrency,
            no_catchup=args.no_catchup,
            params=params,
            pipeline_package_path=str(package),
            enable_caching=False if args.no_cache else None,
        )
    print(
        f"recurring run {name!r} ({job.recurring_run_id}) created: cron {args.cron!r}, experiment {args.experiment!r}"
    )
    return 0
