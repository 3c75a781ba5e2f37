"""``cifar10-kfp train``: train a classifier on a prepared dataset, locally, with checkpoints."""

from __future__ import annotations

import argparse

HELP = (
    "train a model on a prepared dataset (presets seed/fast/cpu; --set key=value overrides any config field)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cifar10_kfp.config import add_train_arguments

    add_train_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import json

    from cifar10_kfp.config import config_from_args
    from cifar10_kfp.engine import train

    config = config_from_args(args)
    result = train(config, args.data, args.output_dir, checkpoint_uri=args.checkpoint_uri, nproc=args.nproc)
    print(json.dumps(result.metrics, indent=2, sort_keys=True))
    return 0
