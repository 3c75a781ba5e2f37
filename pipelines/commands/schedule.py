"""``cifar10-kfp schedule``: create, enable, disable or delete a recurring run."""

from __future__ import annotations

import argparse

from cifar10_kfp_pipelines.commands import common

HELP = "create a recurring run of a pipeline (cron), or --enable/--disable/--delete one by name"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_connection_flags(parser)
    parser.add_argument("--experiment", default="cifar10-kfp", help="experiment the runs are filed under")
    common.add_pipeline_flag(parser)
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
    common.add_param_flag(parser)
    common.add_policy_flags(parser)
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
    from cifar10_kfp_pipelines.kfp_client import explained_api_errors, make_client

    toggle = [(verb, name) for verb, name in (("enable", args.enable), ("disable", args.disable),
                                              ("delete", args.delete)) if name]  # fmt: skip
    params: dict = {}  # set below unless toggling, which needs none
    if not toggle:  # check everything local before the first request
        if not args.cron:
            raise ValueError(
                "--cron is required to create a recurring run (or use --enable/--disable/--delete NAME)"
            )
        _check_cron(args.cron)
        if args.max_concurrency < 1:
            raise ValueError(f"--max-concurrency {args.max_concurrency}: use 1 or more")
        from cifar10_kfp_pipelines.kfp_client import typed_arguments

        params = typed_arguments(args.pipeline, common.parse_key_values(args.param))
    login = common.login_from_args(args)
    client = make_client(login, args.namespace)
    with explained_api_errors(login, namespace=args.namespace):
        if toggle:
            return _toggle(client, *toggle[0], args.namespace)
        return _create(client, args, params)


def _toggle(client, verb: str, name: str, namespace: str) -> int:
    from cifar10_kfp_pipelines.kfp_client import find_recurring_run

    job = find_recurring_run(client, name, namespace)
    getattr(client, f"{verb}_recurring_run")(job.recurring_run_id)
    print(f"{verb}d recurring run {name!r} ({job.recurring_run_id})")
    return 0


def _create(client, args: argparse.Namespace, params: dict) -> int:
    from cifar10_kfp_pipelines.kfp_client import (
        compile_for_submit,
        ensure_experiment,
        find_recurring_run,
        temp_dir,
    )

    name = args.name or f"cifar10-{args.pipeline}-scheduled"
    try:
        find_recurring_run(client, name, args.namespace)
    except ValueError:
        pass
    else:
        raise ValueError(
            f"a recurring run named {name!r} exists: --delete {name} first, or choose another --name"
        )
    policy = common.policy_from_args(args)
    common.warn_if_unpublished_image(policy.image)
    experiment_id = ensure_experiment(client, args.experiment, args.namespace)
    with temp_dir() as tmp:
        package = compile_for_submit(args.pipeline, no_cache=args.no_cache, workdir=tmp, policy=policy)
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
