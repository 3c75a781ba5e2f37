"""The ``cifar10-kfp`` console script: step commands and pipeline commands.

Step commands (``store``, ``data``, ``train``, ``evaluate``, ``publish``, ``predict``) run the
library directly, without Kubeflow. Pipeline commands (``run-local``, ``compile``, ``submit``,
``schedule``, ``runs``, ``doctor``) drive Kubeflow Pipelines; ``tensorboard`` shows a run's curves.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand name -> module under cifar10_kfp_pipelines.commands. Order is the order of `--help`.
COMMANDS = {
    "store": "store",
    "data": "data",
    "train": "train",
    "tune": "tune",
    "evaluate": "evaluate",
    "publish": "publish",
    "predict": "predict",
    "run-local": "run_local",
    "compile": "compile",
    "submit": "submit",
    "schedule": "schedule",
    "runs": "runs",
    "tensorboard": "tensorboard",
    "doctor": "doctor",
}


def _load(module_name: str):
    try:
        return importlib.import_module(f"cifar10_kfp_pipelines.commands.{module_name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"cifar10_kfp_pipelines.commands.{module_name}":
            return None
        raise


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cifar10-kfp",
        description="Train PyTorch image classifiers on Kubeflow Pipelines, with data in object storage.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = _load(module_name)
        if module is None:
            continue
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        if args.verbose:
            raise
        print(f"cifar10-kfp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
